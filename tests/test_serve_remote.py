"""Serving on a local Ray Serve (CPU, tiny model): remote == embedded bit for bit, the token is checked
before any model work, a wrong model or a full replica is refused in words, `run --engine` writes
what the embedded run writes, and a replica killed mid-session costs the client nothing it had.

One Ray per module (started here at its smallest: 2 CPUs, no dashboard), one replica."""
from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("websockets")

from engine.audio import frames_of, load_mono  # noqa: E402
from engine.serve import protocol as P  # noqa: E402
from engine.serve.client import RemoteRunner, ServerLost  # noqa: E402
from engine.session import DuplexSession, LiveError, LiveResult, SecondRecord, SessionConfig  # noqa: E402

TOKEN = "t" * 8 + "-test-token-0123456789"
TIMING = {"wall_start", "listen_ms", "think_ms", "speak_ms", "total_ms", "late_ms", "missed", "queue_wait_ms",
          "backlog", "alloc_bytes", "reserved_bytes", "peak_bytes"}
MODEL = dict(tail="step-audio2", backbone="synthetic", size="tiny", device="cpu", cpu_threads=1)

pytestmark = pytest.mark.timeout(600)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray
    from ray import serve

    from engine.serve.deployment import ServeSpec, build_app
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        spec = ServeSpec(config=dict(MODEL), token=TOKEN, max_sessions=1, replicas=1, cpus_per_replica=0.5,
                         drain_timeout_s=5.0)
        serve.run(build_app(spec), name="duplexcadence", route_prefix="/")
        yield f"ws://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def frames(speech_wav):
    """Seconds of speech with turns and pauses (the synthetic policy answers), plus fresh noise."""
    x = frames_of(load_mono(speech_wav))[:6]
    rng = np.random.default_rng()
    return [(f + rng.standard_normal(f.size).astype(np.float32) * 1e-3).astype(np.float32) for f in x]


def embedded(frames, seed):
    s = DuplexSession(SessionConfig(seed=seed, **MODEL))
    s.start()
    outs = [s.process(f)[0] for f in frames]
    s.close()
    return outs, s.records


def collect(runner, n, timeout=120.0):
    got, t0 = [], time.time()
    while len(got) < n and time.time() - t0 < timeout:
        try:
            got.append(runner.results.get(timeout=0.5))
        except Exception:  # queue.Empty
            continue
        if isinstance(got[-1], LiveError):
            break
    return got


def same_record(a: SecondRecord, b: SecondRecord) -> None:
    da, db = ({k: v for k, v in vars(r).items() if k not in TIMING} for r in (a, b))
    assert da == db


def test_remote_session_equals_embedded(server, frames, one_torch_thread):
    seed = int(np.random.default_rng().integers(0, 1000))
    outs, records = embedded(frames, seed)
    assert any(r.decision == "speak" for r in records) and any(o.any() for o in outs)
    runner = RemoteRunner(SessionConfig(tail="step-audio2", seed=seed), server, TOKEN)
    runner.start()
    assert runner.ready.wait(120)
    assert runner.session is not None, runner.results.get_nowait().message
    assert runner.session.info["size"] == "tiny" and runner.session.info["synthetic"]
    for f in frames:
        runner.submit(f)
    got = collect(runner, len(frames))
    runner.stop(timeout=30.0, drain=True)
    assert [type(g) for g in got] == [LiveResult] * len(frames)
    for g, out, rec in zip(got, outs, records):
        assert g.audio.dtype == np.float32 and np.array_equal(g.audio, out)     # bit for bit
        same_record(g.record, rec)
    assert runner.session.records == [g.record for g in got]
    assert not runner.running and runner.lost is None


@pytest.mark.parametrize("token", [None, "wrong-token-wrong-token"])
def test_token_refused_before_any_model_work(server, token):
    from websockets.exceptions import ConnectionClosed
    opened = replica_stats()["opened"]
    from websockets.sync.client import connect
    url, _ = P.session_url(server)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with connect(url, additional_headers=headers, open_timeout=60) as ws:
        msg = P.decode(ws.recv(timeout=60))
        assert msg["type"] == "refused" and ("no token" if token is None else "wrong token") in msg["message"]
        with pytest.raises(ConnectionClosed) as e:
            ws.recv(timeout=30)
        assert e.value.rcvd.code == P.CLOSE_UNAUTHORIZED
    runner = RemoteRunner(SessionConfig(), server, token or "x")
    runner.start()
    assert runner.ready.wait(60) and runner.session is None and not runner.running
    err = runner.results.get(timeout=5)
    assert isinstance(err, LiveError) and "refused the session" in err.message and "token" in err.message
    # nothing was built: the replica opened no session for either attempt
    assert replica_stats()["opened"] == opened and replica_stats()["sessions"] == 0


def replica_stats():
    """The replica's own counters, read through Ray (not through the endpoint under test)."""
    import ray
    from ray import serve
    status = serve.status().applications["duplexcadence"].deployments["DuplexSessions"]
    assert status.status == "HEALTHY"
    actors = [a for a in ray.util.list_named_actors(all_namespaces=True) if "DuplexSessions" in a["name"]]
    actor = ray.get_actor(actors[0]["name"], namespace=actors[0]["namespace"])
    return ray.get(actor.record_routing_stats.remote())
