"""`duplexcadence serve`: host live sessions on Ray Serve for remote clients (the app, `run --engine`).

  duplexcadence serve [--host 127.0.0.1] [--port 8765] [--token-file F] [--address RAY_ADDRESS]
                      [--replicas N | --autoscale [--max-replicas M]] [--sessions-per-replica K] [--drain-seconds S]
                      [--model ...] [--backbone ...] [--checkpoint ...] [--size ...] [--device ...] [--mode ...]
                      [--cuda-connections N]

Starts a local Ray when no --address is given (or joins the cluster at RAY_ADDRESS). One replica
per GPU of the cluster hosts up to K sessions; clients connect to ws://HOST:PORT/session with
``Authorization: Bearer TOKEN`` (the token from --token-file or $DUPLEXCADENCE_TOKEN; required).
Listening beyond localhost: put TLS in front (see the README). A local Ray is locked down: every
one of its ports listens on 127.0.0.1 only and its token authentication is on (engine/serve/lockdown.py);
only the session endpoint listens on --host. Ctrl-C or SIGTERM drains: no new sessions, live ones
run on for up to --drain-seconds, then are closed with a message; a second signal stops at once.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from engine.cli.run import MODES, make_config
from engine.cli.validate import OneLineParser
from engine import cuda_queues, registry

from engine.serve import drain, lockdown
from engine.serve.auth import ENV, TokenError, read_token

PROG = "duplexcadence serve"
DRAIN_SECONDS = 300.0


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
    p.add_argument("--drain-seconds", type=float, default=DRAIN_SECONDS,
                   help="at Ctrl-C or SIGTERM, how long live sessions may run on before they are closed "
                        f"(default {DRAIN_SECONDS:g})")
    p.add_argument("--cpus-per-replica", type=float, default=1.0)
    p.add_argument("--model", default=registry.default_tail(), choices=registry.tail_names(),
                   help="decoder tail (SPEAK)")
    p.add_argument("--backbone", default=registry.default_backbone(), choices=registry.backbone_names(),
                   help="LISTEN + THINK")
    p.add_argument("--checkpoint", help="decoder tail weights on the serving machines (folder or .safetensors)")
    p.add_argument("--backbone-checkpoint", help="the backbone's weights folder on the serving machines ("
                                                 + registry.folder_hints() + ")")
    p.add_argument("--size", default="auto", choices=["auto", "released", "tiny"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--mode", default="graphs", choices=list(MODES),
                   help="default engine toggles of a session (a client may choose its own)")
    p.add_argument("--cpu-threads", type=int, default=0, help="torch threads per CPU session (0: auto)")
    p.add_argument("--seed", type=int, default=0, help="default seed of a session (a client may choose its own)")
    cuda_queues.add_option(p, "each replica's")
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
    if not 0 <= a.drain_seconds <= 86400:
        return f"--drain-seconds must be from 0 to 86400, got {a.drain_seconds:g}"
    return cuda_queues.option_problem(a.cuda_connections) or lockdown.check_host(a.host, a.port)


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
                     cpus_per_replica=a.cpus_per_replica, drain_timeout_s=a.drain_timeout,
                     cuda_connections=a.cuda_connections)
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
    lockdown.lock_environment(local=not a.address)      # before Ray is imported: it reads these at import
    if not a.address:                                   # the local Ray goes when serve goes, even by kill -9
        from engine.serve import reaper
        reaper.start(reaper.mark_environment())
    try:
        import ray
        from ray import serve
    except ImportError:
        return _fail("Ray Serve is not installed: pip install 'duplexcadence[serve]'")
    if not lockdown.ray_version_ok(ray.__version__):
        return _fail(f"Ray {ray.__version__} is too old: its token authentication is needed (Ray >= "
                     f"{'.'.join(map(str, lockdown.MIN_RAY))}): pip install -U 'duplexcadence[serve]'")
    import logging
    logging.getLogger("ray.serve").setLevel(logging.WARNING)   # our own lines say what runs where
    from engine.serve.deployment import build_app
    try:
        ray.init(**lockdown.init_options(a.address))
    except Exception as e:  # noqa: BLE001 - a wrong address, a Ray that will not start
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        hint = f" — {lockdown.join_hint(a.address)}" if a.address and "token" in first.lower() else ""
        return _fail(f"cannot start or join Ray{' at ' + a.address if a.address else ''}: {first}{hint}", 1)
    try:
        spec = plan(a, float(ray.cluster_resources().get("GPU", 0)))
        spec.token = token
        drain.publish(None)                              # a drain left by an earlier server does not count
        # the proxy runs on the head only: clients connect to the address given here, replicas anywhere
        serve.start(proxy_location="HeadOnly", http_options={"host": a.host, "port": a.port})
        serve.run(build_app(spec), name="duplexcadence", route_prefix="/", blocking=False)
    except Exception as e:  # noqa: BLE001 - port in use, not enough GPUs for the replicas, ...
        ray.shutdown()
        return _fail(str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__, 1)
    with drain.DrainSignals() as signals:
        _announce(a, spec)
        return _wait(serve, ray, signals, a.drain_seconds)


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
    print(f"Ctrl-C or SIGTERM drains (live sessions run on for up to {a.drain_seconds:g} s); a second one stops "
          "at once", flush=True)


def _wait(serve, ray, signals: drain.DrainSignals, grace_s: float) -> int:
    """Serve until a signal, drain, then stop Serve and Ray (a second signal: at once)."""
    signals.wait()
    say = (lambda line: print(line, flush=True))
    try:
        if drain.drain(signals, grace_s, drain.replica_sessions, say):
            _stop_serve(serve, signals)
    finally:
        ray.shutdown()
    return 0


def _stop_serve(serve, signals: drain.DrainSignals) -> None:
    """Serve's own shutdown, unless a second signal comes first (the sessions are closed by now)."""
    import threading
    t = threading.Thread(target=serve.shutdown, name="serve-shutdown", daemon=True)
    t.start()
    while t.is_alive() and not signals.now.is_set():
        t.join(0.5)


if __name__ == "__main__":
    sys.exit(main())
