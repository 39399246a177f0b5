"""`duplexcadence serve`: host live sessions on Ray Serve for remote clients (the app, `run --engine`).

  duplexcadence serve [--host 127.0.0.1] [--port 8765] [--token-file F] [--address RAY_ADDRESS]
                      [--replicas N | --autoscale [--max-replicas M]] [--sessions-per-replica K]
                      [--model ...] [--backbone ...] [--checkpoint ...] [--size ...] [--device ...] [--mode ...]

Starts a local Ray when no --address is given (or joins the cluster at RAY_ADDRESS). One replica
per GPU of the cluster hosts up to K sessions; clients connect to ws://HOST:PORT/session with
``Authorization: Bearer TOKEN`` (the token from --token-file or $DUPLEXCADENCE_TOKEN; required).
Listening beyond localhost: put TLS in front (see the README). Ctrl-C drains: no new sessions,
live ones run to their end; a second Ctrl-C stops at once.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

from engine.cli.run import MODES, make_config
from engine.cli.validate import OneLineParser
from engine.models import registry

from engine.serve.auth import ENV, TokenError, read_token

PROG = "duplexcadence serve"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: localhost only)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--token-file", help=f"file whose first line is the token (default: ${ENV})")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    n = p.add_mutually_exclusive_group()
    n.add_argument("--replicas", type=int, help="fixed replica count (default: one per GPU; 1 without GPUs)")
    n.add_argument("--autoscale", action="store_true", help="scale replicas with the number of live sessions")
    p.add_argument("--max-replicas", type=int, help="autoscaling ceiling (default: the GPUs of the cluster)")
    p.add_argument("--sessions-per-replica", type=int, default=None,
                   help="live sessions one replica hosts at most; below it the engine host admits by measured "
                        "headroom (default: 32 on a GPU, 2 on a CPU)")
    p.add_argument("--drain-timeout", type=float, default=3600.0,
                   help="seconds a replica being scaled down or stopped waits for its live sessions (default 3600)")
    p.add_argument("--cpus-per-replica", type=float, default=1.0)
    p.add_argument("--model", default="step-audio2", choices=registry.tail_names(), help="decoder tail (SPEAK)")
    p.add_argument("--backbone", default="synthetic", choices=["synthetic", "moshi", "minicpm-o-4.5"],
                   help="LISTEN + THINK")
    p.add_argument("--checkpoint", help="decoder tail weights on the serving machines (folder or .safetensors)")
    p.add_argument("--backbone-checkpoint", help="Moshi weights folder on the serving machines")
    p.add_argument("--size", default="auto", choices=["auto", "released", "tiny"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--mode", default="graphs", choices=list(MODES),
                   help="default engine toggles of a session (a client may choose its own)")
    p.add_argument("--cpu-threads", type=int, default=0, help="torch threads per CPU session (0: auto)")
    p.add_argument("--seed", type=int, default=0, help="default seed of a session (a client may choose its own)")
    return p


def _fail(message: str, code: int = 2) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return code


def _check_args(a: argparse.Namespace) -> Optional[str]:
    if not 1 <= a.port <= 65535:
        return f"--port must be from 1 to 65535, got {a.port}"
    for name in ("replicas", "max_replicas", "sessions_per_replica"):
        v = getattr(a, name)
        if v is not None and v < 1:
            return f"--{name.replace('_', '-')} must be at least 1, got {v}"
    if a.max_replicas is not None and not a.autoscale:
        return "--max-replicas goes with --autoscale"
    if a.drain_timeout < 0 or a.cpu_threads < 0 or a.cpus_per_replica < 0:
        return "--drain-timeout, --cpu-threads and --cpus-per-replica cannot be negative"
    return None


def model_config(a: argparse.Namespace) -> dict:
    """The served model's SessionConfig fields, checked here; size/device stay as asked (a replica
    resolves ``auto`` on its own machine)."""
    resolved = make_config(a)
    fields = {k: v for k, v in vars(resolved).items()}
    fields.update(size=a.size, device=a.device, cpu_threads=a.cpu_threads)
    return fields


def plan(a: argparse.Namespace, gpus: float):
    """The :class:`ServeSpec` for the cluster's ``gpus`` (ValueError when it cannot be served)."""
    from engine.serve.deployment import ServeSpec
    use_gpu = a.device != "cpu" and gpus >= 1
    if a.device == "cuda" and gpus < 1:
        raise ValueError("--device cuda was asked for, but the Ray cluster has no GPU")
    if use_gpu and a.replicas and a.replicas > gpus:
        raise ValueError(f"{a.replicas} replicas need {a.replicas} GPUs (one each); the cluster has {gpus:g}")
    default = int(gpus) if use_gpu else 1
    sessions = a.sessions_per_replica or (32 if use_gpu else 2)
    spec = ServeSpec(config=model_config(a), token="", max_sessions=sessions,
                     replicas=a.replicas or (1 if a.autoscale else default), autoscale=a.autoscale,
                     max_replicas=a.max_replicas or default, gpus_per_replica=1.0 if use_gpu else 0.0,
                     cpus_per_replica=a.cpus_per_replica, drain_timeout_s=a.drain_timeout)
    if use_gpu:
        spec.config["device"] = "cuda" if a.device == "auto" else a.device
    return spec


def main(argv: Optional[List[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    problem = _check_args(a)
    if problem:
        return _fail(problem)
    try:
        token = read_token(a.token_file, role="server")
        model_config(a)
    except (TokenError, ValueError, ImportError) as e:
        return _fail(str(e))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")   # no network beyond the cluster
    try:
        import ray
        from ray import serve
    except ImportError:
        return _fail("Ray Serve is not installed: pip install 'duplexcadence[serve]'")
    import logging
    logging.getLogger("ray.serve").setLevel(logging.WARNING)   # our own lines say what runs where
    from engine.serve.deployment import build_app
    try:
        ray.init(address=a.address, include_dashboard=False, log_to_driver=False, logging_level="WARNING",
                 configure_logging=True)
    except Exception as e:  # noqa: BLE001 - a wrong address, a Ray that will not start
        return _fail(f"cannot start or join Ray{' at ' + a.address if a.address else ''}: {str(e).splitlines()[0]}", 1)
    try:
        spec = plan(a, float(ray.cluster_resources().get("GPU", 0)))
        spec.token = token
        # the proxy runs on the head only: clients connect to the address given here, replicas anywhere
        serve.start(proxy_location="HeadOnly", http_options={"host": a.host, "port": a.port})
        serve.run(build_app(spec), name="duplexcadence", route_prefix="/", blocking=False)
    except Exception as e:  # noqa: BLE001 - port in use, not enough GPUs for the replicas, ...
        ray.shutdown()
        return _fail(str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__, 1)
    _announce(a, spec)
    return _wait(serve, ray)


def _announce(a: argparse.Namespace, spec) -> None:
    where = "GPU" if spec.gpus_per_replica else "CPU"
    scale = (f"autoscaling 1..{spec.max_replicas} replicas" if spec.autoscale
             else f"{spec.replicas} replica{'s' if spec.replicas != 1 else ''}")
    print(f"serving {a.model} + {a.backbone} on ws://{a.host}:{a.port}/session — {scale} ({where}), "
          f"up to {spec.max_sessions} session{'s' if spec.max_sessions != 1 else ''} each; "
          f"token from {a.token_file or '$' + ENV}", flush=True)
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"NOTE: listening on {a.host}: put TLS in front (a reverse proxy, see the README); the token "
              "travels in every handshake", file=sys.stderr, flush=True)
    print("Ctrl-C drains (live sessions run to their end); a second Ctrl-C stops at once", flush=True)


def _wait(serve, ray) -> int:
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    print("draining: no new sessions; waiting for live sessions to end (Ctrl-C again to stop now)", flush=True)
    try:
        serve.shutdown()
    except KeyboardInterrupt:
        print("stopping now: live sessions are cut off", flush=True)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
