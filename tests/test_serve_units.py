"""Serving without a cluster: the wire format keeps every bit, tokens, placement ranking, what a client
may ask of a served model, the serve command's argument errors, and a client with nowhere to go."""
from __future__ import annotations

import dataclasses
import socket

import numpy as np
import pytest

from engine.serve import auth
from engine.serve import protocol as P
from engine.serve.client import RemoteRunner
from engine.session import LiveError, LiveResult, SecondRecord, SessionConfig


def random_record(rng) -> SecondRecord:
    vals = {}
    for f in dataclasses.fields(SecondRecord):
        if f.type in ("float", float):
            vals[f.name] = float(rng.standard_normal() * 1e3) + 0.1 + 0.2      # floats without short decimals
        elif f.type in ("int", int):
            vals[f.name] = int(rng.integers(0, 2**40))
        elif f.type in ("bool", bool):
            vals[f.name] = bool(rng.integers(0, 2))
        else:
            vals[f.name] = str(rng.choice(["listen", "speak", "héllo \"text\"", ""]))
    return SecondRecord(**vals)


def test_result_travels_bit_for_bit():
    rng = np.random.default_rng()
    for _ in range(20):
        rec = random_record(rng)
        audio = rng.standard_normal(24000).astype(np.float32)
        audio[::997] = np.float32(np.finfo(np.float32).tiny)                  # denormal-adjacent values too
        res = LiveResult(rec, audio, bool(rng.integers(0, 2)), "cannot keep up" if rng.integers(0, 2) else "")
        back = P.unpack_result(P.pack_result(res))
        assert back.record == rec and back.keeps_up == res.keeps_up and back.notice == res.notice
        assert back.audio.dtype == np.float32 and np.array_equal(back.audio.view(np.uint32), audio.view(np.uint32))
    frame = rng.standard_normal(24000).astype(np.float32)
    assert np.array_equal(P.unpack_frame(P.pack_frame(frame)), frame)


def test_protocol_errors_say_what_is_wrong():
    with pytest.raises(P.ProtocolError, match="96000 bytes"):
        P.unpack_frame(b"\0" * 100)
    with pytest.raises(P.ProtocolError, match="first message must be a hello"):
        P.read_hello(P.encode("stop"))
    with pytest.raises(P.ProtocolError, match="protocol 7 is not supported"):
        P.read_hello('{"type": "hello", "protocol": 7, "config": {}}')
    with pytest.raises(P.ProtocolError, match="cannot set checkpoint"):
        P.read_hello('{"type": "hello", "protocol": 1, "config": {"checkpoint": "/etc"}}')
    with pytest.raises(P.ProtocolError, match="not JSON"):
        P.decode("{nope")
    with pytest.raises(P.ProtocolError, match="header cannot be read"):
        P.unpack_result(b"\x05\0\0\0hello")
    cfg = P.read_hello(P.hello({"tail": "mimi", "seed": 3, "checkpoint": "/x"}))
    assert cfg == {"tail": "mimi", "seed": 3}
    from engine.serve.client import client_config
    asked = client_config(SessionConfig(graph_replay=False), leave=("graph_replay",))
    assert "graph_replay" not in asked and asked["demand_sized"] is True and asked["tail"] == "step-audio2"


@pytest.mark.parametrize("url, want", [
    ("ws://h:8765", ("ws://h:8765/session", "h:8765")),
    ("ws://h:8765/", ("ws://h:8765/session", "h:8765")),
    ("wss://h.example/dc/", ("wss://h.example/dc/session", "h.example:443")),
    ("http://127.0.0.1:9/session", ("ws://127.0.0.1:9/session", "127.0.0.1:9")),
])
def test_session_url(url, want):
    assert P.session_url(url) == want


@pytest.mark.parametrize("url", ["", "h:8765", "ftp://h", "ws://", "ws://h:99999"])
def test_session_url_refuses_what_is_not_an_address(url):
    with pytest.raises(ValueError, match="engine URL"):
        P.session_url(url)


def test_tokens(tmp_path):
    f = tmp_path / "token"
    f.write_text("  abcdefghijklmnopqrstuvwxyz\nsecond line\n")
    assert auth.read_token(str(f)) == "abcdefghijklmnopqrstuvwxyz"
    assert auth.read_token(None, {auth.ENV: "0123456789abcdef"}) == "0123456789abcdef"
    with pytest.raises(auth.TokenError, match="no token"):
        auth.read_token(None, {})
    with pytest.raises(auth.TokenError, match="cannot read the token file"):
        auth.read_token(str(tmp_path / "missing"))
    with pytest.raises(auth.TokenError, match="at least 16"):
        auth.read_token(None, {auth.ENV: "short"})
    assert auth.read_token(None, {auth.ENV: "short"}, role="client") == "short"
    t = "0123456789abcdef-x"
    assert auth.check(t, auth.auth_headers(t)) is None
    assert auth.check(t, {"authorization": "bearer " + t}) is None
    assert "no token" in auth.check(t, {})
    assert "no token" in auth.check(t, {"Authorization": "Basic xyz"})
    assert "wrong token" in auth.check(t, auth.auth_headers(t + "y"))


def test_rank_by_headroom():
    router = pytest.importorskip("engine.serve.router")
    full = {"sessions": 2, "max_sessions": 2, "headroom_ms": 800.0, "ms_per_session": 50.0}
    light = {"sessions": 1, "max_sessions": 2, "headroom_ms": 700.0, "ms_per_session": 100.0}
    heavy = {"sessions": 1, "max_sessions": 2, "headroom_ms": 300.0, "ms_per_session": 100.0}
    fresh = {}
    assert router.rank_by_headroom([("full", full, 2), ("heavy", heavy, 1), ("light", light, 1)]) == \
        ["light", "heavy", "full"]
    assert router.rank_by_headroom([("light", light, 1), ("fresh", fresh, 0)])[0] == "fresh"
    other = {"sessions": 0, "max_sessions": 4, "headroom_ms": 600.0, "ms_per_session": 100.0}
    assert router.rank_by_headroom([("light", light, 2), ("other", other, 0)])[0] == "other"   # light: at its limit
    roomy = dict(light, max_sessions=4)
    assert router.rank_by_headroom([("roomy", roomy, 1), ("other", other, 0)])[0] == "roomy"  # 700 > 600
    # two sessions placed on it since its last report: 700 - 2 x 100 = 500 < 600
    assert router.rank_by_headroom([("roomy", roomy, 3), ("other", other, 0)])[0] == "other"
    assert router.expected_headroom(light, 3) == (500.0, 3)
    # a replica that has not reported yet is no better than the best that did, and pays for what it got
    reported = {"sessions": 0, "max_sessions": 2, "headroom_ms": 900.0, "ms_per_session": 450.0}
    assert router.rank_by_headroom([("silent", {}, 1), ("reported", reported, 0)])[0] == "reported"
    assert router.rank_by_headroom([("silent", {}, 0), ("reported", dict(reported, sessions=1), 1)])[0] == "silent"
    assert router.rank_by_headroom([("a", {}, 1), ("b", {}, 0)])[0] == "b"          # nobody reported yet


def test_what_a_client_may_ask_of_a_served_model():
    from engine.serve.hosting import ModelMismatch, SessionHost
    host = SessionHost(SessionConfig(tail="mimi", size="tiny", device="cpu"), max_sessions=2)
    cfg = host.config_for({"tail": "mimi", "size": "auto", "seed": 9, "graph_replay": False})
    assert (cfg.tail, cfg.size, cfg.device, cfg.seed, cfg.graph_replay) == ("mimi", "tiny", "cpu", 9, False)
    with pytest.raises(ModelMismatch, match="serves mimi \\+ synthetic .* asked for tail 'step-audio2'"):
        host.config_for({"tail": "step-audio2"})
    with pytest.raises(ModelMismatch, match="asked for size 'released'"):
        host.config_for({"size": "released"})
    with pytest.raises(ValueError, match="seed must be an integer"):
        host.config_for({"seed": "7"})
    with pytest.raises(ValueError, match="demand_sized must be true or false"):
        host.config_for({"demand_sized": 1})
    for seed in (2 ** 64, 2 ** 63, -1):                 # refused in words (the replica answers 4400), not overflowed
        with pytest.raises(ValueError, match=f"seed {seed} is out of range: a seed is an integer from 0 to 2\\*\\*63-1"):
            host.config_for({"seed": seed})
    assert host.config_for({"seed": 2 ** 63 - 1}).seed == 2 ** 63 - 1
    s = host.stats()
    assert s["sessions"] == 0 and s["max_sessions"] == 2 and s["headroom_ms"] > 0
    host.close_all()


def run_cli(argv, capsys):
    from app.main import main
    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("argv, words", [
    (["--port", "0"], "--port must be from 1 to 65535"),
    (["--replicas", "0"], "--replicas must be at least 1"),
    (["--max-replicas", "2"], "--max-replicas goes with --autoscale"),
    (["--cuda-connections", "0"], "--cuda-connections: the CUDA work queue count must be a whole number from 1"),
    ([], "no token"),
    (["--token-file", "/nonexistent/t"], "cannot read the token file"),
    (["--checkpoint", "/nonexistent/ckpt"], "does not exist"),
])
def test_serve_refuses_bad_arguments_in_one_line(argv, words, capsys, monkeypatch):
    monkeypatch.delenv(auth.ENV, raising=False)
    if "--checkpoint" in argv:
        monkeypatch.setenv(auth.ENV, "0123456789abcdef0123")
    code, err = run_cli(["serve"] + argv, capsys)
    assert code == 2 and len(err) == 1 and words in err[0] and err[0].startswith("duplexcadence serve: error:")


def test_serve_plan_one_replica_per_gpu():
    from engine.cli.serve import build_parser, plan
    a = build_parser().parse_args(["--size", "tiny"])
    spec = plan(a, 2.0)
    assert (spec.replicas, spec.gpus_per_replica, spec.config["device"], spec.max_sessions) == (2, 1.0, "cuda", 32)
    spec = plan(a, 0.0)
    assert (spec.replicas, spec.gpus_per_replica, spec.max_sessions) == (1, 0.0, 2)
    with pytest.raises(ValueError, match="3 replicas need 3 GPUs"):
        plan(build_parser().parse_args(["--replicas", "3"]), 2.0)
    with pytest.raises(ValueError, match="no GPU"):
        plan(build_parser().parse_args(["--device", "cuda"]), 0.0)
    spec = plan(build_parser().parse_args(["--autoscale"]), 4.0)
    assert spec.autoscale and spec.replicas == 1 and spec.max_replicas == 4
    assert spec.cuda_connections is None
    assert plan(build_parser().parse_args(["--cuda-connections", "32"]), 1.0).cuda_connections == 32


def test_client_with_no_server_says_so():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                       # closed again: nothing listens there
    r = RemoteRunner(SessionConfig(), f"ws://127.0.0.1:{port}", "token", connect_timeout=5)
    r.start()
    assert r.ready.wait(30) and r.session is None and not r.running
    err = r.results.get(timeout=5)
    assert isinstance(err, LiveError) and f"cannot reach the engine server at 127.0.0.1:{port}" in err.message
    assert "connection refused" in err.message
    with pytest.raises(ValueError, match="engine URL"):
        RemoteRunner(SessionConfig(), "127.0.0.1:8765", "token")


def test_run_engine_refuses_local_checkpoints(capsys, tmp_path, speech_wav):
    code, err = run_cli(["run", "--input", str(speech_wav), "--output", str(tmp_path / "o.wav"), "--log",
                         str(tmp_path / "log"), "--engine", "ws://127.0.0.1:9", "--checkpoint", str(tmp_path)],
                        capsys)
    assert code == 2 and len(err) == 1 and "name the server's weights" in err[0]
    assert not (tmp_path / "o.wav").exists()


def test_serve_defaults_overridden_for_live_sessions():
    """Serve counts every open WebSocket toward max_ongoing_requests (default 5) and gives a stopping
    replica 20 s (graceful_shutdown_timeout_s); live sessions need the limit above the session count
    and a drain as long as a conversation. Autoscaling follows open sessions."""
    pytest.importorskip("ray.serve")
    from engine.serve.deployment import REFUSAL_SLACK, ServeSpec, deployment_options
    from engine.serve.router import HeadroomRouter
    spec = ServeSpec(config={}, token="x" * 16, max_sessions=12, replicas=2, gpus_per_replica=1.0,
                     drain_timeout_s=1800.0)
    o = deployment_options(spec)
    assert o["max_ongoing_requests"] == 12 + REFUSAL_SLACK > 5
    assert o["graceful_shutdown_timeout_s"] == 1800.0 > 20
    assert o["num_replicas"] == 2 and o["ray_actor_options"]["num_gpus"] == 1.0
    assert o["request_router_config"].request_router_class in (HeadroomRouter, "engine.serve.router.HeadroomRouter") \
        or "HeadroomRouter" in str(o["request_router_config"].request_router_class)
    auto = deployment_options(ServeSpec(config={}, token="x" * 16, max_sessions=8, replicas=1, autoscale=True,
                                        max_replicas=4))
    assert "num_replicas" not in auto
    a = auto["autoscaling_config"]
    assert (a["min_replicas"], a["max_replicas"], a["target_ongoing_requests"]) == (1, 4, 6.0)


def test_a_replica_sets_its_process_switch_interval():
    """A replica's sessions' threads take turns under the GIL; 1 ms turns kept 4 whole MiniCPM-o sessions on an
    H200 where the default 5 ms kept 3. The spec carries it (None keeps the interpreter's); a bad value is refused."""
    import sys
    pytest.importorskip("ray.serve")
    from engine.serve.deployment import ServeSpec
    before = sys.getswitchinterval()
    try:
        ServeSpec(config={}, token="x" * 16).apply_switch_interval()
        assert sys.getswitchinterval() == pytest.approx(0.001)
        sys.setswitchinterval(0.005)
        ServeSpec(config={}, token="x" * 16, switch_interval_ms=None).apply_switch_interval()
        assert sys.getswitchinterval() == pytest.approx(0.005)
        with pytest.raises(ValueError, match="switch_interval_ms"):
            ServeSpec(config={}, token="x" * 16, switch_interval_ms=0.0).apply_switch_interval()
    finally:
        sys.setswitchinterval(before)
