"""The remote client treats the server as untrusted: small fake servers on 127.0.0.1 that stall, send NaN
audio, a huge message, malformed or deeply nested JSON, results out of order or a 'ready' without info.
Each case ends with ONE line (a LiveError) in bounded time, and every second received before stays kept;
`duplexcadence run --engine` against a stalling server exits 1 with one line and writes what it got.

No Ray: the fake servers are the websockets package's own (sync) server, one thread each."""
from __future__ import annotations

import json
import resource
import threading
import time

import numpy as np
import pytest

pytest.importorskip("websockets")

from websockets.sync.server import serve  # noqa: E402

from engine.serve import client as C  # noqa: E402
from engine.serve import protocol as P  # noqa: E402
from engine.serve.client import RemoteRunner, ServerLost  # noqa: E402
from engine.session import LiveError, LiveResult, SessionConfig  # noqa: E402
from engine.session.records import SecondRecord  # noqa: E402
from runner_results import collect  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TOKEN = "fake-server-token-0123456789"
HANG = "(no ready: hang)"
INFO = {"tail_title": "Fake tail", "backbone_title": "Fake backbone", "device": "cpu", "size": "tiny",
        "tail": "step-audio2", "backbone": "synthetic", "synthetic": True}


def record(index: int) -> SecondRecord:
    return SecondRecord(index=index, wall_start=time.time(), listen_ms=1.0, think_ms=1.0, speak_ms=1.0,
                        total_ms=3.0, deadline_ms=1000.0, late_ms=0.0, missed=False, queue_wait_ms=0.0,
                        decision="listen", tokens=0, state_bytes=0, alloc_bytes=0, reserved_bytes=0, peak_bytes=0,
                        demand_sized=True, graph_replay=False, tail="step-audio2", backbone="synthetic",
                        input_rms=0.1, output_rms=0.0)


def result(index: int, audio=None) -> bytes:
    if audio is None:
        audio = (np.random.default_rng().standard_normal(P.RATE) * 0.01).astype(np.float32)
    return P.pack_result(LiveResult(record(index), audio, True, ""))


class FakeServer:
    """A session server on 127.0.0.1 that answers ``good`` seconds properly, then does ``bad(ws, k)``."""

    def __init__(self, bad, good: int = 1, ready: str = None):
        self.bad, self.good = bad, good
        self.ready = ready if ready is not None else P.encode("ready", info=INFO, replica="r", node="n", actor="a")
        self.server = serve(self._session, "127.0.0.1", 0, max_size=2 ** 20)
        self.url = f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.release = threading.Event()

    def _session(self, ws) -> None:
        try:
            ws.recv(timeout=10)                            # the hello
            if self.ready == HANG:
                self.release.wait(30)
                return
            ws.send(self.ready)
            for k in range(self.good):
                ws.recv(timeout=10)
                ws.send(result(k))
            self.bad(ws, self.good)
        except Exception:  # noqa: BLE001 - the client hung up: that is the point
            pass

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture
def fake():
    made = []

    def make(bad, good: int = 1, ready: str = None) -> FakeServer:
        made.append(FakeServer(bad, good, ready))
        return made[-1]
    yield make
    for s in made:
        s.close()


def session(url: str, frames: int = 3, **kw):
    """Open a session, send ``frames`` seconds, and collect what comes back (ends at the first LiveError)."""
    r = RemoteRunner(SessionConfig(), url, TOKEN, second_timeout=kw.pop("second_timeout", 2.0), **kw)
    r.start()
    assert r.ready.wait(20)
    if r.session is None:
        return r, [r.results.get(timeout=5)]
    rng = np.random.default_rng()
    for _ in range(frames):
        r.submit((rng.standard_normal(P.RATE) * 0.05).astype(np.float32))
    got = collect(r, frames, timeout=30)
    return r, got


def one_line_lost(r: RemoteRunner, got: list, kept: int, words: str) -> str:
    """The session ended with one ServerLost line naming ``words``; the ``kept`` good seconds are kept."""
    assert [type(g) for g in got] == [LiveResult] * kept + [ServerLost], got
    msg = got[-1].message
    assert "\n" not in msg and words in msg and f"the {kept} second" in msg and "kept" in msg, msg
    assert [rec.index for rec in r.session.records] == list(range(kept))
    r.stop(timeout=5)
    assert not r.running
    return msg


def test_a_server_that_stalls_mid_session_is_left_after_the_deadline(fake):
    srv = fake(lambda ws, k: srv.release.wait(30), good=2)       # reads on, answers nothing more
    t0 = time.monotonic()
    r, got = session(srv.url, frames=4, second_timeout=1.5)
    msg = one_line_lost(r, got, 2, "stopped answering")
    assert "no result for 1.5 s" in msg and time.monotonic() - t0 < 15


def test_a_server_that_never_gets_ready_is_left_after_the_ready_deadline(fake):
    srv = fake(lambda ws, k: None, good=0, ready=HANG)
    t0 = time.monotonic()
    r, got = session(srv.url, ready_timeout=1.0)
    assert r.session is None and isinstance(got[0], LiveError) and "did not start the session within 1 s" in \
        got[0].message and time.monotonic() - t0 < 10


@pytest.mark.parametrize("case,words", [
    ("nan", "NaN or infinite"),
    ("short", "one second of 24 kHz float32"),
    ("header", "header claims"),
    ("json", "not JSON"),
    ("nested", "not JSON"),
    ("long", "over the limit of"),
    ("index", "came where second 1"),
    ("field", "record field listen_ms"),
])
def test_bad_results_end_the_session_in_one_line_and_keep_what_came(fake, case, words):
    def bad(ws, k):
        ws.recv(timeout=10)
        audio = np.full(P.RATE, np.nan, np.float32)
        if case == "nan":
            ws.send(result(k, audio))
        elif case == "short":
            ws.send(result(k)[:-400])
        elif case == "header":
            ws.send(b"\xff\xff\xff\x7f" + b"{}" + bytes(P.FRAME_BYTES))
        elif case == "json":
            ws.send("{this is not json")
        elif case == "nested":
            ws.send("[" * 8000 + "]" * 8000)                # within the size cap: too deep to parse
        elif case == "long":
            ws.send(" " * 70000)
        elif case == "index":
            ws.send(result(k + 5))
        elif case == "field":
            data = result(k)
            n = int.from_bytes(data[:4], "little")
            head = json.loads(data[4:4 + n])
            head["record"]["listen_ms"] = "fast"
            body = json.dumps(head).encode()
            ws.send(len(body).to_bytes(4, "little") + body + data[4 + n:])
        srv.release.wait(30)
    srv = fake(bad)
    r, got = session(srv.url)
    one_line_lost(r, got, 1, words)


def test_a_huge_message_is_refused_before_it_is_read_whole(fake):
    """A 1 GB message would have been read whole (max_size=None); the client's size cap closes the
    connection after its header (1009), so memory stays where it was."""
    def bad(ws, k):
        ws.recv(timeout=10)
        chunk = bytes(4 << 20)
        try:
            ws.send((chunk for _ in range(256)))           # fragments: 1 GiB announced piece by piece
        except Exception:  # noqa: BLE001 - the client has closed
            pass
    srv = fake(bad)
    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r, got = session(srv.url)
    msg = one_line_lost(r, got, 1, f"over this client's limit of {P.MAX_SERVER_MESSAGE} bytes")
    assert "went away" in msg
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak0) < 200 * 1024   # KiB: < 200 MB


def test_a_ready_without_info_or_an_unreadable_first_answer_is_refused(fake):
    for ready, words in ((P.encode("ready", info=[1, 2]), "without the session's info"),
                         (P.encode("ready", info={"tail_title": 3}), "without the session's info"),
                         ("[" * 9000, "cannot read"),
                         (P.encode("refused", message="x" * 5000 + "\x1b[2J"), "refused the session")):
        srv = fake(lambda ws, k: None, good=0, ready=ready)
        r, got = session(srv.url)
        assert r.session is None and len(got) == 1 and isinstance(got[0], LiveError)
        msg = got[0].message
        assert words in msg and "\n" not in msg and "\x1b" not in msg and len(msg) < 600, msg


def test_the_client_keeps_to_its_send_window(fake):
    """Back-pressure: with results withheld, at most SEND_AHEAD frames go on the wire."""
    seen = []

    def bad(ws, k):
        end = time.monotonic() + 3
        while time.monotonic() < end:
            try:
                seen.append(len(ws.recv(timeout=0.2)))
            except TimeoutError:
                continue
    srv = fake(bad, good=0)
    r = RemoteRunner(SessionConfig(), srv.url, TOKEN, second_timeout=30)
    r.start()
    assert r.ready.wait(20) and r.session is not None
    for _ in range(C.SEND_AHEAD + 10):
        r.submit(np.zeros(P.RATE, np.float32) + 0.01)
    time.sleep(3.5)
    assert seen.count(P.FRAME_BYTES) == C.SEND_AHEAD
    r.stop(timeout=3)


def _run_engine_against(srv, tmp_path, monkeypatch, wav):
    """``duplexcadence run --engine`` (4 s, 1.5 s a second's deadline) against ``srv``: (exit code, wall s,
    samples written, seconds logged)."""
    from engine.cli.run import main as run_main
    from engine.wavio import read_wav
    monkeypatch.setattr(C, "SECOND_TIMEOUT_S", 1.5)
    (tmp_path / "token").write_text(TOKEN + "\n")
    monkeypatch.delenv("DUPLEXCADENCE_TOKEN", raising=False)
    t0 = time.monotonic()
    code = run_main(["--input", str(wav), "--seconds", "4", "--quiet", "--output", str(tmp_path / "o.wav"),
                     "--log", str(tmp_path / "log"), "--engine", srv.url, "--token-file", str(tmp_path / "token")])
    wall = time.monotonic() - t0
    return (code, wall, read_wav(tmp_path / "o.wav")[0].size,
            len((tmp_path / "log" / "session.jsonl").read_text().splitlines()))


def test_run_engine_against_a_stalling_server_writes_what_came(fake, tmp_path, monkeypatch, speech_wav):
    srv = fake(lambda ws, k: srv.release.wait(30), good=2)
    code, wall, samples, logged = _run_engine_against(srv, tmp_path, monkeypatch, speech_wav)
    assert code == 1 and wall < 30
    assert samples == 2 * P.RATE                                  # the two seconds that came back
    assert logged == 2


def _chatter(ws, k, every: float = 0.1, seconds: float = 30.0) -> None:
    """Read on and answer nothing but chatter: a text message every ``every`` s (no result ever)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ws.send(json.dumps({"type": "noise"}))
        try:
            ws.recv(timeout=every)
        except TimeoutError:
            pass


@pytest.mark.parametrize("good", [0, 1])
def test_a_server_that_keeps_talking_without_answering_is_left_at_the_second_s_deadline(fake, good):
    """Chatter is no answer: only a second's result meets its deadline, so a server that sends {"type": "noise"}
    every 0.1 s (from the start, or after one good result) is left once the deadline passes."""
    srv = fake(_chatter, good=good)
    t0 = time.monotonic()
    r, got = session(srv.url, frames=3, second_timeout=1.5)
    msg = one_line_lost(r, got, good, "stopped answering")
    assert "no result for 1.5 s" in msg and time.monotonic() - t0 < 10


def test_run_engine_against_a_chattering_server_writes_what_came(fake, tmp_path, monkeypatch, speech_wav):
    code, wall, samples, logged = _run_engine_against(fake(_chatter, good=1), tmp_path, monkeypatch, speech_wav)
    assert code == 1 and wall < 30
    assert samples == P.RATE and logged == 1
