"""`duplexcadence-bench serve-capacity`: sessions a Ray Serve deployment keeps on time, per replica count.

  duplexcadence-bench serve-capacity [--replicas 1,2] [--tail step-audio2] [--backbone synthetic]
                                     [--size auto] [--mode graphs] [--sessions-per-replica 32]
                                     [--window 6] [--seconds 30] [--max-sessions 64] [--json OUT]

Starts a local Ray (every GPU of this machine), then for each replica count deploys
``duplexcadence serve``'s application (one replica per GPU, sessions placed by headroom, the
token checked) and drives it the way clients would: each session is a WebSocket client
(:class:`~engine.serve.client.RemoteRunner`) fed one frame a second in real time with its own
speech-like input and phase (:class:`engine.host.drive.PacedLoad`). Sessions are added step by
step; after each step a window is measured. The ramp ends at the first window with a missed
second or when the cluster refuses a session (its replicas' admission says there is no headroom
left); the largest clean count is then held for ``--seconds`` to confirm 0 misses. The report gives
each replica count's confirmed sessions and the ratio to one replica.

A second is missed when the server's record says so (its frame's arrival at the replica to done,
over 1 s) or when it has not come back to the client 1.2 s after the window closed.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from engine.bench.capacity import session_inputs
from engine.bench.report import Bars, Figure, markdown, say, write_all
from engine import cuda_queues, registry
from engine.core.toggles import MODES, Toggles
from engine.cli.validate import OneLineParser
from engine.host.drive import PacedLoad, Window
from engine.serve.client import RemoteRunner
from engine.session import SessionConfig
from engine.stats import table

TOKEN = "serve-capacity-bench-" + os.urandom(8).hex()


class _Paced:
    """A RemoteRunner as PacedLoad drives it (``submit(frame, arrival=)``: the server times arrival)."""

    def __init__(self, runner: RemoteRunner):
        self.runner = runner

    def submit(self, frame, arrival: Optional[float] = None) -> None:
        self.runner.submit(frame)

    def __getattr__(self, name):
        return getattr(self.runner, name)


class RemoteHost:
    """PacedLoad's host over a serving cluster: each ``open`` is a new WebSocket session."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def open(self, cfg: SessionConfig, force: bool = False) -> _Paced:
        return _Paced(RemoteRunner(cfg, self.url, self.token, connect_timeout=60.0))


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="duplexcadence-bench serve-capacity", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", default="1,2", help="replica counts to measure, comma-separated (default 1,2)")
    p.add_argument("--tail", default=registry.default_tail(), choices=registry.tail_names())
    p.add_argument("--backbone", default=registry.default_backbone(), choices=registry.backbone_names())
    p.add_argument("--size", default="auto", choices=["auto", "released", "tiny"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--mode", default="graphs", choices=list(MODES))
    p.add_argument("--sessions-per-replica", type=int, default=32, help="each replica's session limit")
    p.add_argument("--max-sessions", type=int, default=64, help="stop the ramp here")
    p.add_argument("--window", type=float, default=6.0, help="seconds measured after each ramp step")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds the final count is held")
    p.add_argument("--cpus-per-replica", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    cuda_queues.add_option(p, "each replica's")
    p.add_argument("--json", help="write the results here")
    return p


def _line(label: str, w: Window, seconds: float) -> str:
    return (f"{label}: {w.sessions} session(s), {seconds:g} s: latency p50 {w.p50_ms:.0f} / p99 {w.p99_ms:.0f} / "
            f"max {w.max_ms:.0f} ms, {w.misses} missed of {w.seconds}")


def _grow(load: PacedLoad, cfg: SessionConfig, inputs, n: int) -> Optional[str]:
    """Add sessions up to ``n``; the refusal message if the cluster refuses one (None: all in)."""
    while len(load.sessions) < n:
        try:
            load.add(cfg, inputs[len(load.sessions)])
        except RuntimeError as e:
            return str(e)
    return None


def measure(url: str, cfg: SessionConfig, a: argparse.Namespace, label: str) -> Dict[str, object]:
    """Ramp and confirm one deployment; see the module docstring."""
    inputs = session_inputs(a.max_sessions + 1, a.seed)
    load = PacedLoad(RemoteHost(url, TOKEN))
    ramp: List[Dict[str, object]] = []
    clean, refusal, n, ended = 0, None, 1, "reached --max-sessions"
    try:
        while n <= a.max_sessions:
            refusal = _grow(load, cfg, inputs, n)
            if refusal is not None:
                say(f"{label}: the cluster refused session {len(load.sessions) + 1}: {refusal}")
                ended = "the cluster refused a session"
                break
            load.settle(10.0)
            w = load.measure(a.window)
            ramp.append(dict(w.to_dict(), window_s=a.window))
            say(_line(label, w, a.window))
            if w.misses:
                ended = f"a second missed at {n} session{'s' if n != 1 else ''}"
                break
            clean = n
            free = 0.9 * 1000.0 / max(w.p99_ms, 1.0)             # step by what the p99 leaves free
            n = min(a.max_sessions, max(n + 1, min(int(n * free), n + max(1, n // 2))))
            if clean == a.max_sessions:
                break
        while len(load.sessions) > clean:
            load.remove_last()
        conf = None
        if clean:
            load.settle(10.0)
            say(f"{label}: confirming {clean} session(s) over {a.seconds:g} s ...")
            conf = load.measure(a.seconds)
            say(_line(label, conf, a.seconds))
        replicas = sorted({getattr(d.runner.session, "replica", "") for d in load.sessions
                           if d.runner.session is not None})
        per_replica = {r: sum(1 for d in load.sessions if d.runner.session is not None
                              and d.runner.session.replica == r) for r in replicas}
        errors = load.errors()
    finally:
        load.close()
    return {"sessions": clean if conf is not None and conf.misses == 0 else 0, "ramp_clean": clean,
            "refusal": refusal, "ramp_ended": ended, "ramp": ramp, "confirmation": None if conf is None else conf.to_dict(),
            "confirmed": conf is not None and conf.misses == 0, "sessions_per_replica": per_replica,
            "errors": errors}


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        counts = [int(x) for x in a.replicas.split(",") if x.strip()]
        if not counts or min(counts) < 1:
            raise ValueError
    except ValueError:
        print(f"duplexcadence-bench serve-capacity: error: --replicas {a.replicas!r} is not a list of counts >= 1",
              file=sys.stderr)
        return 2
    problem = cuda_queues.option_problem(a.cuda_connections)
    if problem:
        print(f"duplexcadence-bench serve-capacity: error: {problem}", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
        from ray import serve
    except ImportError:
        print("duplexcadence-bench serve-capacity: error: Ray Serve is not installed: pip install "
              "'duplexcadence[serve]'", file=sys.stderr)
        return 2
    from engine.serve.deployment import ServeSpec, build_app
    t = Toggles.from_mode(a.mode)
    cfg = SessionConfig(tail=a.tail, backbone=a.backbone, size=a.size, device=a.device, seed=a.seed,
                        demand_sized=t.demand_sized, graph_replay=t.graph_replay)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    gpus = float(ray.cluster_resources().get("GPU", 0))
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    doc: Dict[str, object] = {"command": " ".join(["duplexcadence-bench", "serve-capacity"] + list(argv or sys.argv[2:])),
                              "gpus": gpus, "config": {k: v for k, v in vars(cfg).items()},
                              "cuda_connections": a.cuda_connections, "replicas": {}}
    try:
        for r in counts:
            use_gpu = gpus >= r and a.device != "cpu"
            spec = ServeSpec(config={k: v for k, v in vars(cfg).items()}, token=TOKEN,
                             max_sessions=a.sessions_per_replica, replicas=r,
                             gpus_per_replica=1.0 if use_gpu else 0.0, cpus_per_replica=a.cpus_per_replica,
                             drain_timeout_s=10.0, stats_period_s=1.0, cuda_connections=a.cuda_connections)
            t0 = time.perf_counter()
            serve.run(build_app(spec), name="duplexcadence", route_prefix="/")
            label = f"{r} replica{'s' if r > 1 else ''} ({'GPU' if use_gpu else 'CPU'})"
            out = measure(f"ws://127.0.0.1:{port}", cfg, a, label)
            out["wall_s"] = time.perf_counter() - t0
            doc["replicas"][str(r)] = out
            say(f"{label}: {out['sessions']} session(s) at 0 misses; per replica {out['sessions_per_replica']}")
            serve.delete("duplexcadence")
    finally:
        serve.shutdown()
        ray.shutdown()
    one = doc["replicas"].get("1", {}).get("sessions", 0)
    doc["ratio_to_one_replica"] = {k: (v["sessions"] / one if one else None) for k, v in doc["replicas"].items()}
    print(report_table(doc, wrap=True))
    if a.json:
        md = markdown("Sessions a Ray Serve deployment keeps at 0 misses", doc["command"],
                      [("", report_table(doc, wrap=False))],
                      ["each session is a WebSocket client fed one frame a second in real time; latency is the "
                       "server's frame arrival to done (confirmation window)"])
        for path in write_all(Path(a.json), doc, md, figure(doc)):
            say(f"wrote {path}")
    return 0


def report_table(doc: Dict[str, object], wrap: bool) -> str:
    """One row per replica count: sessions held at 0 misses, the ratio to one replica, latency, split."""
    rows = []
    for r, v in doc["replicas"].items():
        conf = v.get("confirmation") or {}
        ratio = doc["ratio_to_one_replica"].get(r)
        rows.append([r, v["sessions"], "-" if ratio is None else f"{ratio:.2f}x", conf.get("p50_ms", 0.0),
                     conf.get("p99_ms", 0.0), " / ".join(str(n) for n in v["sessions_per_replica"].values()),
                     v["ramp_ended"]])
    return table(rows, ["replicas", "sessions at 0 misses", "vs 1 replica", "p50 ms", "p99 ms", "per replica",
                        "ramp ended"], max_widths=[None, None, None, None, None, 16, 24], header_width=12, wrap=wrap)


def figure(doc: Dict[str, object]) -> Figure:
    labels = [f"{r} replica{'s' if r != '1' else ''}" for r in doc["replicas"]]
    held = [float(v["sessions"]) for v in doc["replicas"].values()]
    p99 = [float((v.get("confirmation") or {}).get("p99_ms", 0.0)) for v in doc["replicas"].values()]
    return Figure([Bars("Sessions at 0 misses", "sessions", labels, {"sessions": held}),
                   Bars("Latency p99 (confirmation)", "ms", labels, {"p99": p99}, hline=(1000.0, "deadline"))])


if __name__ == "__main__":
    sys.exit(main())
