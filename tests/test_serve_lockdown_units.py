"""The server's lock-down pieces without starting Ray: --host checked before anything starts, the RAY_
environment a local Ray gets (loopback node, token auth, a fresh token), the version floor, the drain's
signal handling, and the protocol's size and type bounds on what a server sends."""
from __future__ import annotations

import os
import signal
import socket

import numpy as np
import pytest

from engine.serve import drain, lockdown
from engine.serve import protocol as P


def test_host_checked_before_ray_starts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        assert "another program listens there: choose another --port" in lockdown.check_host("127.0.0.1", busy)
    assert "is not an IP address or a host name" in lockdown.check_host("not a host!", 8765)
    assert "is not an IP address or a host name" in lockdown.check_host("host_with_underscore", 8765)
    assert "does not resolve" in lockdown.check_host("999.1.1.1", 8765)
    assert "cannot listen on 192.0.2.254" in lockdown.check_host("192.0.2.254", 8765)   # not this machine's
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert lockdown.check_host("127.0.0.1", free) is None
    assert lockdown.check_host("localhost", free) is None


def test_local_ray_environment_is_loopback_with_a_fresh_token():
    env = {"RAY_ADDRESS": "10.0.0.1:6379", "RAY_AUTH_TOKEN_PATH": "/x", "RAY_AUTH_MODE": "disabled"}
    lockdown.lock_environment(local=True, environ=env)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    assert len(env["RAY_AUTH_TOKEN"]) == 64 and "RAY_ADDRESS" not in env and "RAY_AUTH_TOKEN_PATH" not in env
    again = {}
    lockdown.lock_environment(local=True, environ=again)
    assert again["RAY_AUTH_TOKEN"] != env["RAY_AUTH_TOKEN"]                 # one token per server
    joined = {"RAY_AUTH_TOKEN_PATH": "/cluster/token"}
    lockdown.lock_environment(local=False, environ=joined)
    assert joined == {"RAY_AUTH_TOKEN_PATH": "/cluster/token", "RAY_AUTH_MODE": "token",
                      "RAY_USAGE_STATS_ENABLED": "0"}
    opts = lockdown.init_options(None)
    assert opts["address"] == "local" and opts["_node_ip_address"] == "127.0.0.1" and not opts["include_dashboard"]
    assert lockdown.init_options("10.0.0.1:6379")["address"] == "10.0.0.1:6379"
    assert "_node_ip_address" not in lockdown.init_options("10.0.0.1:6379")


def test_ray_version_floor():
    assert lockdown.ray_version_ok("2.60.0") and lockdown.ray_version_ok("2.61.1rc1")
    assert lockdown.ray_version_ok("3.0.0")
    assert not lockdown.ray_version_ok("2.52.1") and not lockdown.ray_version_ok("nightly")


def test_first_signal_drains_second_stops_now():
    before = signal.getsignal(signal.SIGTERM)
    with drain.DrainSignals() as sig:
        os.kill(os.getpid(), signal.SIGTERM)
        assert sig.event.wait(5) and sig.signum == signal.SIGTERM and not sig.now.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        assert sig.now.wait(5)
    assert signal.getsignal(signal.SIGTERM) is before


def test_results_are_checked_before_use():
    from engine.session import LiveResult
    from engine.session.records import SecondRecord
    fields = dict(index=0, wall_start=1.0, listen_ms=1.0, think_ms=1.0, speak_ms=1.0, total_ms=3.0, deadline_ms=1000.0,
                  late_ms=0.0, missed=False, queue_wait_ms=0.0, decision="listen", tokens=0, state_bytes=0,
                  alloc_bytes=0, reserved_bytes=0, peak_bytes=0, demand_sized=True, graph_replay=False,
                  tail="mimi", backbone="synthetic", input_rms=0.1, output_rms=0.0)
    audio = np.random.default_rng().standard_normal(P.RATE).astype(np.float32)
    good = P.unpack_result(P.pack_result(LiveResult(SecondRecord(**fields), audio, True, "")))
    assert np.array_equal(good.audio, audio) and good.record == SecondRecord(**fields)
    for change, words in ((dict(index="0"), "field index"), (dict(missed=1), "field missed"),
                          (dict(total_ms=float("inf")), "field total_ms"), (dict(tokens=True), "field tokens")):
        data = P.pack_result(LiveResult(SecondRecord(**{**fields, **change}), audio, True, ""))
        with pytest.raises(P.ProtocolError, match=words):
            P.unpack_result(data)
    with pytest.raises(P.ProtocolError, match="NaN or infinite"):
        P.unpack_result(P.pack_result(LiveResult(SecondRecord(**fields), audio * np.inf, True, "")))
    with pytest.raises(P.ProtocolError, match="not JSON"):
        P.decode("[" * 8000 + "]" * 8000)
    with pytest.raises(P.ProtocolError, match="over the limit"):
        P.decode(" " * (P.MAX_TEXT_BYTES + 1))
    with pytest.raises(P.ProtocolError, match="demand_sized must be"):
        P.flag({"demand_sized": "yes"}, "demand_sized")
