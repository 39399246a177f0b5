"""Serving on a local Ray Serve (CPU, tiny model): remote == embedded bit for bit, the token is checked
before any model work, a wrong model or a full replica is refused in words, `run --engine` writes
what the embedded run writes (speech.npy included), and a replica killed mid-session costs the client nothing it had.

One Ray per module (started here at its smallest: 2 CPUs, no dashboard), one replica."""
from __future__ import annotations

import os
import socket

import numpy as np
import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("websockets")

from engine.audio import frames_of, load_mono  # noqa: E402
from engine.serve import protocol as P  # noqa: E402
from engine.serve.client import RemoteRunner, ServerLost  # noqa: E402
from engine.session import DuplexSession, LiveError, LiveResult, SecondRecord, SessionConfig  # noqa: E402
from engine.core.toggles import Toggles  # noqa: E402
from runner_results import collect  # noqa: E402

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
    # address="local": a Ray of its own, never one found running on the machine (another test's cluster)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
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


FLIPS = {2: False, 4: True}          # demand-sized state off at second 2, on again at second 4


def embedded(frames, seed, flips=None):
    s = DuplexSession(SessionConfig(seed=seed, **MODEL))
    s.start()
    outs = []
    for k, f in enumerate(frames):
        if flips and k in flips:
            s.set_toggles(s.asked_toggles().merged(demand_sized=flips[k]))
        outs.append(s.process(f)[0])
    s.close()
    return outs, s.records


def same_record(a: SecondRecord, b: SecondRecord) -> None:
    da, db = ({k: v for k, v in vars(r).items() if k not in TIMING} for r in (a, b))
    assert da == db


def test_remote_session_equals_embedded(server, frames, one_torch_thread):
    """Bit for bit, with the toggles flipped mid-session from the client (each flip sent before its second)."""
    seed = int(np.random.default_rng().integers(0, 1000))
    outs, records = embedded(frames, seed, FLIPS)
    assert any(r.decision == "speak" for r in records) and any(o.any() for o in outs)
    assert [r.demand_sized for r in records] == [True, True, False, False, True, True]
    runner = RemoteRunner(SessionConfig(tail="step-audio2", seed=seed), server, TOKEN)
    runner.start()
    assert runner.ready.wait(120)
    assert runner.session is not None, runner.results.get_nowait().message
    assert runner.session.info["size"] == "tiny" and runner.session.info["synthetic"]
    got = []
    for k, f in enumerate(frames[:-1]):
        if k in FLIPS:
            runner.set_toggles(Toggles(demand_sized=FLIPS[k], graph_replay=True))
        runner.submit(f)
        got += collect(runner, 1)
    runner.submit(frames[-1])
    runner.stop(timeout=30.0, drain=True)                 # the last second still comes back
    got += collect(runner, 1, timeout=10.0)
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


def test_wrong_model_and_full_replica_refused_in_words(server, frames):
    wrong = RemoteRunner(SessionConfig(tail="mimi"), server, TOKEN)
    wrong.start()
    assert wrong.ready.wait(60) and wrong.session is None
    msg = wrong.results.get(timeout=5).message
    assert "refused the session" in msg and "serves step-audio2 + synthetic" in msg and "'mimi'" in msg
    first = RemoteRunner(SessionConfig(), server, TOKEN)          # the replica's only slot
    first.start()
    assert first.ready.wait(120) and first.session is not None
    second = RemoteRunner(SessionConfig(), server, TOKEN)
    second.start()
    assert second.ready.wait(60) and second.session is None
    msg = second.results.get(timeout=5).message
    assert "the cluster is full" in msg and "1 of 1 sessions" in msg
    first.submit(frames[0])
    assert isinstance(collect(first, 1)[0], LiveResult)
    first.stop(timeout=30.0)
    assert not first.running and first.lost is None


def test_run_engine_cli_writes_what_embedded_writes(server, speech_wav, tmp_path, monkeypatch, one_torch_thread):
    from engine.cli.run import main as run_main
    from engine.wavio import read_wav
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.delenv("DUPLEXCADENCE_TOKEN", raising=False)
    common = ["--input", str(speech_wav), "--seconds", "4", "--seed", "3", "--quiet"]
    assert run_main(common + ["--output", str(tmp_path / "emb.wav"), "--log", str(tmp_path / "emb"),
                              "--size", "tiny", "--device", "cpu"]) == 0
    assert run_main(common + ["--output", str(tmp_path / "rem.wav"), "--log", str(tmp_path / "rem"),
                              "--engine", server, "--token-file", str(token_file)]) == 0
    a, b = read_wav(tmp_path / "emb.wav")[0], read_wav(tmp_path / "rem.wav")[0]
    assert a.shape == b.shape and np.array_equal(a, b)
    for name in ("session.csv", "session.jsonl", "session.trace.json", "session_output.wav", "summary.json"):
        assert (tmp_path / "rem" / name).is_file()
    # what the tail produced each second, before levelling or queueing: the server sends it, bit for bit
    emb, rem = np.load(tmp_path / "emb" / "speech.npy"), np.load(tmp_path / "rem" / "speech.npy")
    assert emb.size and rem.dtype == np.float32 and np.array_equal(rem, emb)
    assert len((tmp_path / "rem" / "session.jsonl").read_text().splitlines()) == 4
    # no token: one line, exit 2, nothing written
    assert run_main(common + ["--output", str(tmp_path / "x.wav"), "--log", str(tmp_path / "x"),
                              "--engine", server]) == 2
    assert not (tmp_path / "x.wav").exists() and not (tmp_path / "x").exists()


def test_replica_killed_mid_session_keeps_every_second(server, frames):
    """Last in this module: the replica dies (Serve starts a new one for later clients)."""
    import ray
    runner = RemoteRunner(SessionConfig(seed=5), server, TOKEN)
    runner.start()
    assert runner.ready.wait(120) and runner.session is not None
    for f in frames[:3]:
        runner.submit(f)
    got = collect(runner, 3)
    assert [type(g) for g in got] == [LiveResult] * 3
    ray.kill(ray.get_actor(runner.session.actor, namespace="serve"), no_restart=False)
    for f in frames[3:]:
        runner.submit(f)
    rest = collect(runner, len(frames) - 3, timeout=60.0)
    lost = [g for g in rest if isinstance(g, LiveError)]
    assert len(lost) == 1 and isinstance(lost[0], ServerLost) and rest[-1] is lost[0]
    assert lost[0] is runner.lost and lost[0].seconds == 3 + len(rest) - 1
    assert "went away after" in lost[0].message and "kept" in lost[0].message
    kept = got + rest[:-1]
    assert runner.session.records == [g.record for g in kept]        # every second that arrived is kept
    outs, records = embedded(frames[: len(kept)], 5)
    assert all(np.array_equal(g.audio, o) for g, o in zip(kept, outs))
    assert not runner.running
    runner.stop(timeout=5.0)                                           # stopping a lost session is harmless
