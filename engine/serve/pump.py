"""One WebSocket session on a replica, bounded: frames in, results out, and every way it ends.

A client with the token still cannot fill or hold the replica:

* **hello deadline**: a connection that has not said hello within :data:`HELLO_TIMEOUT_S` is
  refused; each connection waits on its own (a replica takes far more connections than sessions,
  see ``deployment.REFUSAL_SLACK``), so connections that never say hello hold no one else up;
* **a client that goes quiet**: a session whose client sends no frame for :data:`CLIENT_IDLE_S` while the
  server owes it no result is closed (:data:`protocol.CLOSE_IDLE`, the reason in words), so a slot is held by
  frames that flow, not by an open socket; and when the replica is full, a session quiet for
  :data:`EVICT_IDLE_S` already gives its slot to the client that asks (:class:`Slots`);
* **frames ahead**: at most :data:`protocol.MAX_AHEAD` seconds may wait unprocessed. Serve's
  replica pulls every message off the connection as it arrives (not reading does not slow the
  client), so the bound is enforced by counting: the client keeps to it (the remote client waits
  for results before it sends further, its back-pressure), and a frame beyond it ends the session
  with one clear message (:data:`protocol.CLOSE_TOO_FAST`);
* **message sizes**: a frame is exactly one second of audio, a control message at most
  :data:`protocol.MAX_TEXT_BYTES`;
* **drain**: when the server drains, the grace period's end (``cut``) closes the session with a
  message; the client keeps every second it received;
* **memory**: when a session ends, what it allocated goes back to the system (:func:`give_back`).
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import queue
import time
from typing import Optional

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from engine.session import LiveError, LiveResult

from . import protocol as P

HELLO_TIMEOUT_S = 15.0
IDLE_CHECK_S = 0.25            # a session's sender looks at its runner this often even without results
#: a live client sends one second of audio every second: this long without a frame (while the server owes it
#: no result) ends its session; a full replica takes the slot of one quiet for EVICT_IDLE_S
CLIENT_IDLE_S = 20.0
EVICT_IDLE_S = 5.0


class ResultsQueue(queue.Queue):
    """A runner's results queue that wakes the session's sender on the event loop at every put: no
    polling, so dozens of sessions on a replica cost its loop nothing between their seconds."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self.loop = loop
        self.ready = asyncio.Event()

    def put(self, item, block: bool = True, timeout: Optional[float] = None) -> None:
        super().put(item, block, timeout)
        try:
            self.loop.call_soon_threadsafe(self.ready.set)
        except RuntimeError:                   # the loop is closed: the replica is going away
            pass


class Connection:
    """A live session's two directions over one WebSocket (``run`` until it ends)."""

    def __init__(self, ws: WebSocket, runner, cut: asyncio.Event, speech: bool = False):
        self.ws = ws
        self.runner = runner
        self.speech = speech                  # the hello asked for each second's tail output with its result
        self.cut = cut                        # set when the drain's grace period has ended
        self.stopping = asyncio.Event()       # the client asked to stop (or the server ends it)
        self.drain = False                    # the client's stop asked for every queued second
        self.sent = 0
        self.frames = 0                       # frames received (results owed: frames - sent)
        self.heard = time.monotonic()         # when the client last sent a frame or the server a result
        self.evicted = asyncio.Event()        # set to take this session's slot for another client
        self.released = asyncio.Event()       # set once its runner has left the host (the slot is free)

    def quiet_for(self) -> float:
        """Seconds since the client last sent a frame or was sent a result (0 while a result is owed)."""
        return 0.0 if self.frames > self.sent else time.monotonic() - self.heard

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_results())
        try:
            await self._receive(sender)
        finally:
            if not sender.done():
                if not self.stopping.is_set():          # the client left: nothing more to send
                    sender.cancel()
                try:
                    await sender
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the socket may be gone
                    pass

    # -- client -> server ---------------------------------------------------------------------------
    async def _receive(self, sender: asyncio.Task) -> None:
        cutter = asyncio.ensure_future(self.cut.wait())
        evict = asyncio.ensure_future(self.evicted.wait())
        recv = None
        try:
            while not sender.done():
                recv = recv or asyncio.ensure_future(self.ws.receive())
                done, _ = await asyncio.wait({recv, sender, cutter, evict}, return_when=asyncio.FIRST_COMPLETED,
                                             timeout=max(0.05, CLIENT_IDLE_S - self.quiet_for()))
                if not done:
                    if self.quiet_for() >= CLIENT_IDLE_S:
                        await self._end(sender, P.CLOSE_IDLE, self._quiet_reason(CLIENT_IDLE_S))
                        return
                    continue
                if recv not in done:
                    if not sender.done() and (cutter in done or evict in done):
                        await self._end(sender, *self._cut_reason(cutter in done))
                    return
                msg, recv = recv.result(), None
                if msg["type"] == "websocket.disconnect":
                    return
                if not await self._handle(msg, sender):
                    return
        finally:
            for task in (cutter, evict, recv):
                if task is not None and not task.done():
                    task.cancel()

    def _quiet_reason(self, seconds: float) -> str:
        return (f"the server closed the session: no audio from the client for {seconds:g} s (a live session sends "
                f"one second of audio every second); the {self.sent} seconds sent before are kept")

    def _cut_reason(self, cut: bool) -> tuple:
        if cut:
            return P.CLOSE_SHUTDOWN, ("the server is shutting down: its drain grace period ended; the "
                                      f"{self.sent} seconds sent before are kept")
        return P.CLOSE_IDLE, self._quiet_reason(round(self.quiet_for(), 1)) + \
            " (another client needed the slot)"

    async def _handle(self, msg: dict, sender: asyncio.Task) -> bool:
        """One client message; False when the session has ended."""
        try:
            data = msg.get("bytes")
            if data is not None:
                frame = P.unpack_frame(data, self.runner.input_rate)
                if self.runner.backlog() >= P.MAX_AHEAD:
                    await self._end(sender, P.CLOSE_TOO_FAST, (
                        f"the client sent more than {P.MAX_AHEAD} seconds of audio ahead of the session (the "
                        "server holds at most that many unprocessed): send at the audio's pace or wait for results"))
                    return False
                self.runner.submit(frame)
                self.frames += 1
                self.heard = time.monotonic()
                return True
            ctl = P.decode(msg.get("text") or "")
            if ctl["type"] == "toggles":
                # a toggle the message leaves out (null) stays as last asked
                self.runner.set_toggles(self.runner.asked_toggles().merged(P.flag(ctl, "demand_sized"),
                                                                           P.flag(ctl, "graph_replay")))
            elif ctl["type"] == "stop":
                self.drain = ctl.get("drain") is True       # anything but true: no drain
                self.stopping.set()
                await asyncio.to_thread(self.runner.stop, 3600.0 if self.drain else 30.0, self.drain)
                await sender
                return False
            else:
                raise P.ProtocolError(f"unknown message type {ctl['type']!r}")
        except ValueError as e:               # ProtocolError or a bad frame: the session ends
            await self._end(sender, P.CLOSE_BAD_REQUEST, f"the server stopped the session: {e}")
            return False
        return True

    async def _end(self, sender: asyncio.Task, code: int, message: str) -> None:
        """The server ends the session: the second in progress finishes, then ``message`` and a close."""
        sender.cancel()
        try:
            await sender
        except (asyncio.CancelledError, Exception):  # noqa: BLE001
            pass
        await asyncio.to_thread(self.runner.stop, 30.0, False)
        await send_close(self.ws, P.encode("error", message=message, code=code), code)

    # -- server -> client ---------------------------------------------------------------------------
    async def _send_results(self) -> None:
        """Each finished second to the client as soon as it is there; ``end`` after a stop."""
        runner, ws = self.runner, self.ws
        wake: Optional[asyncio.Event] = getattr(runner.results, "ready", None)
        while True:
            item = _get(runner.results)
            if item is None:
                if not runner.running and (self.stopping.is_set() or runner.results.empty()):
                    item = _get(runner.results)
                    if item is None:
                        if self.stopping.is_set():
                            await send_close(ws, P.encode("end", seconds=self.sent), P.CLOSE_NORMAL)
                        else:
                            await send_close(ws, P.encode("error", message="the session stopped"), 1011)
                        return
                else:
                    await _wait(wake, IDLE_CHECK_S)
                    continue
            if isinstance(item, LiveResult):
                try:
                    data = P.pack_result(item, self.speech)
                except P.ProtocolError as e:          # a tail output over the wire's bound: said, not sent
                    await send_close(ws, P.encode("error", message=str(e)), 1011)
                    return
                await ws.send_bytes(data)
                self.sent += 1
                self.heard = time.monotonic()
            elif isinstance(item, LiveError):
                await send_close(ws, P.encode("error", message=item.message), 1011)
                return


class Slots:
    """The live sessions of one replica, for :meth:`take_quiet`: when the replica is full, the slot of a session
    whose client has sent nothing for :data:`EVICT_IDLE_S` goes to the client that asks."""

    def __init__(self):
        self.live: "set[Connection]" = set()

    def quietest(self, at_least: float = EVICT_IDLE_S) -> Optional[Connection]:
        """The session quiet the longest, if it has been for ``at_least`` seconds (else None)."""
        quiet = [(c.quiet_for(), id(c), c) for c in self.live if not c.evicted.is_set()]
        best = max(quiet, default=None, key=lambda t: t[:2])
        return best[2] if best is not None and best[0] >= at_least else None

    async def take_quiet(self, wait_s: float = 10.0) -> bool:
        """End the quietest session (see :meth:`quietest`) and wait until its slot is free; False when no
        session is quiet enough or its slot did not come free in ``wait_s``."""
        victim = self.quietest()
        if victim is None:
            return False
        victim.evicted.set()
        try:
            await asyncio.wait_for(victim.released.wait(), wait_s)
        except asyncio.TimeoutError:
            return False
        return True


async def _wait(wake: Optional[asyncio.Event], timeout: float) -> None:
    """Until the next result is put (or ``timeout``: the runner may have stopped without one)."""
    if wake is None:
        await asyncio.sleep(0.004)
        return
    try:
        await asyncio.wait_for(wake.wait(), timeout)
    except asyncio.TimeoutError:
        pass
    wake.clear()


def _get(q: "queue.Queue"):
    try:
        return q.get_nowait()
    except queue.Empty:
        return None


async def send_close(ws: WebSocket, text: str, code: int) -> None:
    """``text`` (a JSON message), then a close with ``code`` and a short reason."""
    if ws.application_state == WebSocketState.CONNECTED:
        reason = str(P.decode(text).get("message", ""))
        reason = reason.encode("utf-8")[:120].decode("utf-8", "ignore")   # a close reason holds 123 bytes
        try:
            await ws.send_text(text)
            await ws.close(code=code, reason=reason)
        except (RuntimeError, WebSocketDisconnect, OSError):
            pass


async def receive_hello(ws: WebSocket) -> str:
    """The first message's text, within :data:`HELLO_TIMEOUT_S` (asyncio.TimeoutError otherwise);
    ProtocolError when it is not a text message of a sane size."""
    msg = await asyncio.wait_for(ws.receive(), HELLO_TIMEOUT_S)
    if msg["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(msg.get("code", 1000))
    text = msg.get("text")
    if text is None:
        raise P.ProtocolError("the first message must be a text hello")
    return text


# Why a replica's memory grew with every session (and how it is given back). Each session runs on
# its own worker thread; glibc gives a new thread a malloc arena of its own (up to 8 per core), and
# the pages a finished session freed stay in its arena: the RSS rose by tens of MB per session
# until every arena had been used. A replica therefore keeps to ARENAS arenas (the sessions' threads
# share them, so what one session freed serves the next), and each session's end returns the
# arenas' free pages to the system (malloc_trim).
ARENAS = 2
_M_ARENA_MAX = -8                  # mallopt parameter (glibc malloc.h)


def limit_arenas(n: int = ARENAS) -> bool:
    """Keep this process to ``n`` malloc arenas from now on (glibc; False where there is none)."""
    libc = _libc()
    fn = getattr(libc, "mallopt", None) if libc is not None else None
    return bool(fn is not None and fn(_M_ARENA_MAX, int(n)) == 1)


def give_back() -> None:
    """Return a finished session's memory to the system: collect the cycles its objects made, then
    hand the allocator's free pages back (glibc ``malloc_trim``; a no-op elsewhere)."""
    gc.collect()
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim(0)


_LIBC: list = []


def _libc():
    if not _LIBC:
        try:
            _LIBC.append(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"))
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]
