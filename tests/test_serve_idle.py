"""A server's session is held by frames that flow, not by an open socket: a client that says hello and then sends
nothing is closed after the stated time with a reason the client prints, a slow server's own backlog never counts
against its client, and a full replica gives the slot of a quiet session to the client that asks."""
from __future__ import annotations

import asyncio
import json
import queue
import threading
import time

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("websockets")

from engine.serve import protocol as P  # noqa: E402
from engine.serve import pump  # noqa: E402
from engine.session import LiveResult  # noqa: E402
from fake_websocket import FakeWs  # noqa: E402
from test_serve_client_untrusted import TOKEN, fake, record  # noqa: E402,F401 (a fixture)

pytestmark = pytest.mark.timeout(120)


class EchoRunner:
    """A hosted runner's interface: each frame comes back as a result after ``work_s`` (on a thread)."""

    input_rate = P.RATE

    def __init__(self, work_s: float = 0.0):
        self.work_s = work_s
        self.results: "queue.Queue" = queue.Queue()
        self.running = True
        self.submitted = 0

    def submit(self, frame) -> None:
        k, self.submitted = self.submitted, self.submitted + 1
        threading.Thread(target=self._answer, args=(k, np.asarray(frame)), daemon=True).start()

    def _answer(self, k: int, frame) -> None:
        time.sleep(self.work_s)
        self.results.put(LiveResult(record(k), frame, True, ""))

    def backlog(self) -> int:
        return 0

    def stop(self, timeout: float = 5.0, drain: bool = False) -> None:
        self.running = False


def frame_msg(value: float = 0.01) -> dict:
    return {"type": "websocket.receive", "bytes": P.pack_frame(np.full(P.RATE, value, np.float32))}


def serve(ws: FakeWs, runner, idle_s: float, monkeypatch, conn_box=None) -> float:
    """Run one session over ``ws`` with the quiet limit at ``idle_s``; returns how long it lasted."""
    monkeypatch.setattr(pump, "CLIENT_IDLE_S", idle_s)

    async def go():
        conn = pump.Connection(ws, runner, asyncio.Event())
        if conn_box is not None:
            conn_box.append(conn)
        await conn.run()
    t0 = time.monotonic()
    asyncio.run(go())
    return time.monotonic() - t0


def closing(ws: FakeWs) -> dict:
    assert ws.closed is not None
    return json.loads([m for m in ws.sent if isinstance(m, str)][-1])


def test_a_client_that_says_nothing_after_hello_is_closed_with_a_reason(monkeypatch):
    ws = FakeWs([])                                         # ready was sent; the client never sends a frame
    took = serve(ws, EchoRunner(), 0.6, monkeypatch)
    msg = closing(ws)
    assert ws.closed[0] == P.CLOSE_IDLE and msg["code"] == P.CLOSE_IDLE and 0.5 < took < 5
    assert "no audio from the client for 0.6 s" in msg["message"] and "\n" not in msg["message"]
    assert ws.closed[1] and len(ws.closed[1].encode()) <= 123


def test_a_slow_server_s_own_backlog_never_counts_against_its_client(monkeypatch):
    """Two frames, each answered after 1 s with the quiet limit at 0.6 s: the client waits for results it is owed,
    so the session lives until 0.6 s after the last result, not 0.6 s after the last frame."""
    ws = FakeWs([frame_msg(), frame_msg()])
    took = serve(ws, EchoRunner(work_s=1.0), 0.6, monkeypatch)
    assert sum(isinstance(m, bytes) for m in ws.sent) == 2
    assert ws.closed[0] == P.CLOSE_IDLE and took >= 1.6


def test_a_full_replica_takes_the_slot_of_a_quiet_session(monkeypatch):
    monkeypatch.setattr(pump, "CLIENT_IDLE_S", 30.0)
    slots = pump.Slots()

    async def go():
        quiet_ws, busy_ws = FakeWs([]), FakeWs([frame_msg()])
        quiet = pump.Connection(quiet_ws, EchoRunner(), asyncio.Event())
        busy = pump.Connection(busy_ws, EchoRunner(), asyncio.Event())
        slots.live |= {quiet, busy}

        async def live(conn):
            await conn.run()
            slots.live.discard(conn)
            conn.released.set()
        tasks = [asyncio.ensure_future(live(c)) for c in (quiet, busy)]
        await asyncio.sleep(0.3)
        assert slots.quietest(at_least=10.0) is None                 # nobody quiet that long yet
        quiet.heard -= 10.0                                          # as if its client had said nothing for 10 s
        assert slots.quietest() is quiet
        t0 = time.monotonic()
        assert await slots.take_quiet(wait_s=5.0) and time.monotonic() - t0 < 3
        assert quiet not in slots.live and busy in slots.live and not busy.evicted.is_set()
        busy.evicted.set()
        await asyncio.gather(*tasks)
        return quiet_ws
    ws = asyncio.run(go())
    msg = closing(ws)
    assert msg["code"] == P.CLOSE_IDLE and "another client needed the slot" in msg["message"]
    assert not asyncio.run(pump.Slots().take_quiet())                # nothing to take: the caller refuses


def test_the_client_prints_the_reason_the_server_closed_a_quiet_session(fake):
    """What the pump sends a quiet client reaches the user as one line (the client's LiveError)."""
    from engine.serve.client import RemoteRunner
    from engine.session import LiveError, SessionConfig
    reason = "the server closed the session: no audio from the client for 20 s (a live session sends one " \
             "second of audio every second); the 0 seconds sent before are kept"

    def bad(ws, k):
        ws.send(P.encode("error", message=reason, code=P.CLOSE_IDLE))
        ws.close(P.CLOSE_IDLE, reason[:120])
    srv = fake(bad, good=0)
    r = RemoteRunner(SessionConfig(), srv.url, TOKEN)
    r.start()
    assert r.ready.wait(20) and r.session is not None
    got = r.results.get(timeout=20)
    assert isinstance(got, LiveError) and reason in got.message and "\n" not in got.message
    r.stop(timeout=5)
