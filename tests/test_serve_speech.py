"""Each second's tail output over the wire, so that `run --engine ... --log DIR` writes speech.npy as an embedded
run does: the hello's ask, the result's speech payload and the message limit that holds it, the server's side
(a hosted session's speech equals an embedded one's, bit for bit), a client that trusts none of it (NaN, a wrong
length, a count out of bounds, speech it did not ask for or that comes and goes: one line, every second kept),
and peers that predate it (a hello and a result without speech are what they always were).

The same check through a real Serve deployment and the CLI is test_serve_remote.py's
test_run_engine_cli_writes_what_embedded_writes (speech.npy equal to the embedded run's).

No Ray here: the fake servers are the websockets package's own (test_serve_client_untrusted.FakeServer)."""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

pytest.importorskip("websockets")

from engine.serve import client as C  # noqa: E402
from engine.serve import protocol as P  # noqa: E402
from engine.serve.client import RemoteRunner  # noqa: E402
from engine.session import LiveResult, SessionConfig  # noqa: E402
from fake_websocket import FakeWs  # noqa: E402
from runner_results import collect  # noqa: E402
from test_serve_client_untrusted import TOKEN, FakeServer, fake, one_line_lost, record  # noqa: E402,F401 (a fixture)

pytestmark = pytest.mark.timeout(300)
MODEL = dict(tail="step-audio2", backbone="synthetic", size="tiny", device="cpu", cpu_threads=1)


def noise(n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.1).astype(np.float32)


def with_speech(index: int, speech) -> bytes:
    """A proper result of second ``index`` that carries ``speech``."""
    return P.pack_result(LiveResult(record(index), noise(P.RATE, index), True, "", speech), speech=True)


# -- the protocol ------------------------------------------------------------------------------------------

def test_the_hello_asks_for_speech_only_when_told():
    old = P.hello({"tail": "mimi"})
    assert json.loads(old) == {"type": "hello", "protocol": 1, "config": {"tail": "mimi"}}   # as it always was
    assert not P.hello_asks_speech(old) and P.read_hello(old) == {"tail": "mimi"}
    new = P.hello({"tail": "mimi"}, speech=True)
    assert P.hello_asks_speech(new) and P.read_hello(new) == {"tail": "mimi"}
    with pytest.raises(P.ProtocolError, match="speech must be true, false or null"):
        P.read_hello('{"type": "hello", "protocol": 1, "config": {}, "speech": "yes"}')


def test_a_result_carries_the_speech_bit_for_bit():
    audio = noise(P.RATE, 1)
    plain = P.pack_result(LiveResult(record(0), audio, True, "", noise(30000, 2)))
    head = int.from_bytes(plain[:4], "little")
    assert len(plain) == 4 + head + P.FRAME_BYTES and "speech" not in json.loads(plain[4:4 + head])
    assert P.unpack_result(plain).speech is None                        # not asked: the old layout, no speech
    for said in (noise(30000, 2), np.zeros(0, np.float32), noise(P.MAX_SPEECH_SAMPLES, 3)):
        back = P.unpack_result(P.pack_result(LiveResult(record(0), audio, True, "", said), speech=True))
        assert back.speech.dtype == np.float32 and np.array_equal(back.speech, said)
        assert np.array_equal(back.audio, audio)
    none = P.unpack_result(P.pack_result(LiveResult(record(0), audio, True, ""), speech=True))
    assert none.speech is not None and none.speech.size == 0           # asked, none made: an empty one


def test_the_message_limit_holds_the_longest_result_and_no_more_speech():
    """The limit was 158 KiB (header + one second of audio); with up to MAX_SPEECH_SECONDS of tail output it is
    raised deliberately: the longest result fits, a longer tail output is refused on the server, in words."""
    assert P.MAX_SERVER_MESSAGE == 4 + P.MAX_HEADER_BYTES + P.FRAME_BYTES + 4 * P.MAX_SPEECH_SAMPLES
    assert P.MAX_SPEECH_SAMPLES == 4 * P.RATE and P.MAX_SERVER_MESSAGE < 600 * 1024
    res = LiveResult(record(0), noise(P.RATE, 1), True, "x" * 1000, noise(P.MAX_SPEECH_SAMPLES, 2))
    data = P.pack_result(res, speech=True)
    head = int.from_bytes(data[:4], "little")
    assert len(data) - head + P.MAX_HEADER_BYTES <= P.MAX_SERVER_MESSAGE   # even with the largest header
    one_second = P.pack_result(LiveResult(record(0), noise(P.RATE, 1), True, "", noise(P.RATE, 2)), speech=True)
    assert len(one_second) > 4 + P.MAX_HEADER_BYTES + P.FRAME_BYTES      # over the old limit with 1 s of speech
    over = LiveResult(record(7), noise(P.RATE, 1), True, "", noise(P.MAX_SPEECH_SAMPLES + 1, 2))
    words = r"second 7's tail output is 96001 samples \(4.00 s\); a result carries at most 96000 \(4 s\)"
    with pytest.raises(P.ProtocolError, match=words):
        P.pack_result(over, speech=True)


# -- the server's side ------------------------------------------------------------------------------------

def serve_one(runner, messages, speech: bool) -> FakeWs:
    from engine.serve.pump import Connection
    ws = FakeWs(messages)

    async def go():
        await Connection(ws, runner, asyncio.Event(), speech).run()
    asyncio.run(go())
    return ws


def test_a_hosted_session_sends_the_speech_an_embedded_one_makes(speech_wav, one_torch_thread):
    """The replica's path (SessionHost's runner, the pump's Connection) for a hello that asks: each result's
    speech is the embedded session's ``last_speech`` of that second, bit for bit; without the ask, none."""
    pytest.importorskip("starlette")
    from engine.audio import frames_of, load_mono
    from engine.serve.hosting import SessionHost
    from engine.session import DuplexSession
    frames = frames_of(load_mono(speech_wav))[:4]
    s = DuplexSession(SessionConfig(seed=11, **MODEL))
    s.start()
    want = []
    for f in frames:
        s.process(f)
        want.append(s.last_speech.copy())
    s.close()
    assert any(w.size for w in want), "the synthetic policy answers the speech"
    host = SessionHost(SessionConfig(**MODEL), max_sessions=1)
    try:
        cfg = host.config_for(P.read_hello(P.hello({"seed": 11}, speech=True)))
        for speech in (True, False):
            runner = host.admit(cfg)
            assert runner.ready.wait(120) and runner.session is not None
            ws = serve_one(runner, [{"type": "websocket.receive", "bytes": P.pack_frame(f)} for f in frames]
                           + [{"type": "websocket.receive", "text": P.encode("stop", drain=True)}], speech)
            host.release(runner, timeout=60.0)
            got = [P.unpack_result(m) for m in ws.sent if isinstance(m, bytes)]
            assert [g.record.index for g in got] == [0, 1, 2, 3] and ws.closed[0] == P.CLOSE_NORMAL
            if speech:
                assert all(np.array_equal(g.speech, w) for g, w in zip(got, want))
            else:
                assert all(g.speech is None for g in got)
    finally:
        host.close_all()


def test_a_tail_output_over_the_bound_ends_the_session_in_words():
    """The server does not send what the client would refuse: one error message, then a close."""
    import queue

    class Runner:
        running = False

        def __init__(self):
            self.results = queue.Queue()

    runner = Runner()
    runner.results.put(LiveResult(record(0), noise(P.RATE, 1), True, "", noise(P.MAX_SPEECH_SAMPLES + 1, 2)))
    ws = serve_one(runner, [], speech=True)
    assert ws.closed[0] == 1011 and not any(isinstance(m, bytes) for m in ws.sent)
    message = json.loads(ws.sent[-1])["message"]
    assert "second 0's tail output is 96001 samples (4.00 s); a result carries at most 96000 (4 s)" in message


# -- the client: nothing it receives is trusted ------------------------------------------------------------

def speech_session(url: str, frames: int = 3):
    r = RemoteRunner(SessionConfig(), url, TOKEN, second_timeout=2.0, speech=True)
    r.start()
    assert r.ready.wait(20) and r.session is not None
    for k in range(frames):
        r.submit(noise(P.RATE, 100 + k))
    return r, collect(r, frames, timeout=30)


class HelloKept(FakeServer):
    """A fake server that keeps the client's hello, then does ``bad(ws, 0)``."""

    def _session(self, ws) -> None:
        try:
            self.hello = ws.recv(timeout=10)
            ws.send(self.ready)
            self.bad(ws, 0)
        except Exception:  # noqa: BLE001 - the client hung up
            pass


def test_a_client_that_asks_gets_every_second_s_speech():
    said = [noise(24000, 1), np.zeros(0, np.float32), noise(31000, 2)]

    def serve_three(ws, k):
        for j in range(3):
            ws.recv(timeout=10)
            ws.send(with_speech(j, said[j]))
        srv.release.wait(30)
    srv = HelloKept(serve_three, good=0)
    try:
        r, got = speech_session(srv.url)
        assert [type(g) for g in got] == [LiveResult] * 3 and P.hello_asks_speech(srv.hello)
        assert all(np.array_equal(g.speech, s) for g, s in zip(got, said))
        r.stop(timeout=5)
    finally:
        srv.close()


@pytest.mark.parametrize("case,words", [
    ("nan", "speech holds NaN or infinite"),
    ("inf", "speech holds NaN or infinite"),
    ("short", "1000 speech samples are"),
    ("long", "1000 speech samples are"),
    ("over", "speech count is 96001, not a number of samples from 0 to 96000 (4 s)"),
    ("negative", "speech count is -1,"),
    ("text", "speech count is '10',"),
    ("true", "speech count is True,"),
    ("gone", "lacks the tail's speech and the earlier ones had it"),
])
def test_a_bad_speech_payload_ends_the_session_in_one_line_and_keeps_what_came(fake, case, words):
    def bad(ws, k):
        ws.recv(timeout=10)
        ws.send(with_speech(0, noise(1000, 1)))
        ws.recv(timeout=10)
        said = noise(1000, 2)
        if case in ("nan", "inf"):
            said[500] = np.nan if case == "nan" else np.inf
        data = with_speech(1, said)
        n = int.from_bytes(data[:4], "little")
        head, body = json.loads(data[4:4 + n]), data[4 + n:]
        if case == "short":
            body = body[:-4]
        elif case == "long":
            body = body + bytes(4)
        elif case in ("over", "negative", "text", "true"):
            head["speech"] = {"over": P.MAX_SPEECH_SAMPLES + 1, "negative": -1, "text": "10", "true": True}[case]
        elif case == "gone":
            head.pop("speech")
            body = body[:P.FRAME_BYTES]
        raw = json.dumps(head).encode()
        ws.send(len(raw).to_bytes(4, "little") + raw + body)
        srv.release.wait(30)
    srv = fake(bad, good=0)
    r, got = speech_session(srv.url)
    one_line_lost(r, got, 1, words)
    assert got[0].speech.size == 1000


def test_speech_the_client_did_not_ask_for_is_refused(fake):
    def bad(ws, k):
        ws.recv(timeout=10)
        ws.send(with_speech(k, noise(100, 1)))
        srv.release.wait(30)
    srv = fake(bad, good=1)                                  # second 0 plain, then one with speech
    r = RemoteRunner(SessionConfig(), srv.url, TOKEN, second_timeout=2.0)
    r.start()
    assert r.ready.wait(20)
    for k in range(3):
        r.submit(noise(P.RATE, k))
    got = collect(r, 3, timeout=30)
    one_line_lost(r, got, 1, "carries speech this client did not ask for")


def test_run_engine_writes_speech_npy_and_keeps_it_when_the_server_turns_bad(fake, tmp_path, monkeypatch,
                                                                             speech_wav, capsys):
    """`run --engine` asks for speech; the journal writes what came, a NaN in second 2's speech ends the run
    with one line (exit 1), and speech.npy holds seconds 0 and 1 exactly."""
    from engine.cli.run import main as run_main
    said = [noise(24000, 1), noise(12345, 2)]

    def bad(ws, k):
        for j, s in enumerate(said):
            ws.recv(timeout=10)
            ws.send(with_speech(j, s))
        ws.recv(timeout=10)
        ws.send(with_speech(2, np.full(10, np.nan, np.float32)))
        srv.release.wait(30)
    srv = fake(bad, good=0)
    monkeypatch.setattr(C, "SECOND_TIMEOUT_S", 5.0)
    (tmp_path / "token").write_text(TOKEN + "\n")
    monkeypatch.delenv("DUPLEXCADENCE_TOKEN", raising=False)
    t0 = time.monotonic()
    code = run_main(["--input", str(speech_wav), "--seconds", "4", "--quiet", "--output", str(tmp_path / "o.wav"),
                     "--log", str(tmp_path / "log"), "--engine", srv.url, "--token-file", str(tmp_path / "token")])
    assert code == 1 and time.monotonic() - t0 < 60
    err = [line for line in capsys.readouterr().err.splitlines() if "speech" in line]
    assert len(err) == 1 and "a result's speech holds NaN or infinite samples" in err[0] and "kept" in err[0], err
    assert len((tmp_path / "log" / "session.jsonl").read_text().splitlines()) == 2
    speech = np.load(tmp_path / "log" / "speech.npy")
    assert speech.dtype == np.float32 and np.array_equal(speech, np.concatenate(said))
