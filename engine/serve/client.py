"""The remote engine: a session on a ``duplexcadence serve`` server, with the live runner's interface.

:class:`RemoteRunner` is a drop-in for :class:`engine.session.LiveRunner` (``start``, ``submit``,
``results`` queue of :class:`LiveResult` / :class:`LiveError`, ``set_toggles``, ``backlog``,
``running``, ``ready``, ``session.info``, ``stop(drain=)``), so the app's controller and
``duplexcadence run --engine ws://HOST:PORT`` use it exactly like the embedded engine. The server
runs the same :class:`~engine.session.DuplexSession`; records and audio arrive bit for bit.

Nothing here needs Ray: the client is the ``websockets`` package only. If the server goes away
mid-session the results queue gets one :class:`ServerLost` (a LiveError) and everything received
before stays with the caller.

The server is not trusted: a message is at most :data:`protocol.MAX_SERVER_MESSAGE` bytes (larger
ones close the connection before they are read whole), every result is checked before use (header,
record, the next index in order, exactly one second of finite float32 audio), the session must be
ready within ``ready_timeout`` and each second sent must come back within ``second_timeout``. A runner
built with ``speech`` asks for each second's tail output too (``LiveResult.speech``, checked like the audio:
finite float32, at most :data:`protocol.MAX_SPEECH_SAMPLES`); every result then has it, or none does (a server
that predates the ask sends none), and a runner that did not ask takes none. A
server that breaks any of these ends the session with one :class:`ServerLost` line; every second
received before is kept. The client also keeps its own side of the bound: at most
:data:`SEND_AHEAD` seconds are sent ahead of the results (back-pressure; the rest wait here).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from engine import system_prompt
from engine.core.toggles import Toggles
from engine.session import LiveError, LiveResult, SessionConfig
from engine.session.records import SecondRecord
from engine.session.input_rate import default_input_rate
from engine.session.session import check_frame

from . import auth
from . import protocol as P

log = logging.getLogger("engine.serve.client")

_STOP = object()
#: seconds sent whose results have not come back, at most (the server refuses beyond protocol.MAX_AHEAD)
SEND_AHEAD = P.MAX_AHEAD // 2
#: longest wait for one second's result while seconds are outstanding, and for the session to be ready
SECOND_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 960.0
POLL_S = 0.25


@dataclass
class ServerLost(LiveError):
    """The server went away mid-session (``seconds``: how many finished seconds arrived before)."""

    seconds: int = 0


class RemoteSession:
    """What the caller reads of a remote session: its ``info`` and the ``records`` received."""

    def __init__(self, info: Dict[str, Any], replica: str = "", node: str = "", actor: str = ""):
        self.info = dict(info)
        self.replica, self.node, self.actor = replica, node, actor
        self.records: List[SecondRecord] = []

    def close(self) -> None:
        """Nothing to release here: the server owns the models."""


def client_config(cfg: SessionConfig, leave: Sequence[str] = ()) -> Dict[str, Any]:
    """The fields of ``cfg`` a client asks the server for (the server owns weights and paths); those
    named in ``leave`` are left to the server's defaults, and so are the system prompt when ``cfg`` has none
    and the input rate of a backbone that takes only 24 kHz (a server that predates them then still serves
    the session; a MiniCPM-o server may default to 16 kHz, so its clients always say theirs)."""
    only_24k = cfg.input_rate == P.RATE and default_input_rate(cfg.backbone) == P.RATE
    leave = tuple(leave) + (("system_prompt",) if cfg.system_prompt is None else ()) \
        + (("input_rate",) if only_24k else ())
    return {k: getattr(cfg, k) for k in P.CLIENT_FIELDS if k not in leave}


class RemoteRunner:
    """A live session on a remote server, used like :class:`engine.session.LiveRunner`."""

    def __init__(self, cfg: SessionConfig, url: str, token: str, connect_timeout: float = 15.0,
                 leave: Sequence[str] = (), second_timeout: Optional[float] = None,
                 ready_timeout: Optional[float] = None, speech: bool = False):
        """``leave``: config fields the server decides (e.g. ``graph_replay`` from a client without CUDA,
        whose own switch for it is greyed out). ``second_timeout`` / ``ready_timeout``: the deadlines
        (default :data:`SECOND_TIMEOUT_S` / :data:`READY_TIMEOUT_S`). ``speech``: ask for each second's
        tail output (what ``run --log`` writes as speech.npy). A system prompt the server would
        refuse is a ValueError here, before anything is sent."""
        if cfg.system_prompt is not None:
            system_prompt.check(cfg.system_prompt)
        self.cfg = cfg
        self.leave = tuple(leave)
        self.speech = bool(speech)
        self._with_speech: Optional[bool] = None      # whether this server's results carry it (from the first)
        self.url, self.where = P.session_url(url)
        self.token = token
        self.connect_timeout = float(connect_timeout)
        self.second_timeout = float(SECOND_TIMEOUT_S if second_timeout is None else second_timeout)
        self.ready_timeout = float(READY_TIMEOUT_S if ready_timeout is None else ready_timeout)
        self.results: "queue.Queue" = queue.Queue()
        self.session: Optional[RemoteSession] = None
        self.ready = threading.Event()
        self.lost: Optional[ServerLost] = None
        self._out: "queue.Queue" = queue.Queue()
        self._ws = None
        self._thread: Optional[threading.Thread] = None
        self._running = False
        self._stopping = False
        self._ended = False
        self._lock = threading.Lock()
        self._submitted = 0
        self._received = 0
        self._sent = 0                         # frames on the wire (the send loop's count)
        self._room = threading.Condition(self._lock)
        self._waiting_since: Optional[float] = None   # when the oldest outstanding second was sent

    # -- caller side (never blocks on the network) --------------------------------------------------
    def start(self) -> None:
        """Connect and build the session in a worker thread; returns at once."""
        if self._thread is not None:
            raise RuntimeError("this runner was already started")
        self._running = True
        self._thread = threading.Thread(target=self._run, name="remote-session", daemon=True)
        self._thread.start()

    def submit(self, frame) -> None:
        """Queue one second of mono 24 kHz float32 audio for the server (never blocks)."""
        data = P.pack_frame(check_frame(frame, self.cfg.input_rate))
        with self._lock:
            self._submitted += 1
        self._out.put(data)

    def set_toggles(self, toggles: Toggles) -> None:
        """Applied by the server at its next second boundary."""
        self._out.put(P.encode("toggles", demand_sized=toggles.demand_sized, graph_replay=toggles.graph_replay))

    def backlog(self) -> int:
        """Seconds submitted whose result has not arrived yet."""
        with self._lock:
            return self._submitted - self._received

    @property
    def running(self) -> bool:
        return self._running

    def stop(self, timeout: float = 5.0, drain: bool = False) -> None:
        """Ask the server to finish (with ``drain``: every second sent) and wait for its answer."""
        self._stopping = True
        self._out.put(P.encode("stop", drain=bool(drain)))
        if self._thread is None:
            return
        self._thread.join(timeout)
        if self._thread.is_alive():          # no answer in time: hang up
            self._hang_up()
            self._thread.join(2.0)

    # -- worker ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._connect()
        except _Refused as e:
            self._fail(LiveError(str(e)))
            return
        except Exception as e:  # noqa: BLE001 - any failure is one message for the caller
            self._fail(LiveError(f"cannot reach the engine server at {self.where}: {_why(e)}"))
            return
        sender = threading.Thread(target=self._send_loop, name="remote-session-send", daemon=True)
        sender.start()
        try:
            self._receive_loop()
        finally:
            self._out.put(_STOP)
            self._hang_up()
            self._running = False

    def _connect(self) -> None:
        from websockets.exceptions import ConnectionClosed, InvalidStatus
        from websockets.sync.client import connect
        try:
            self._ws = connect(self.url, additional_headers=auth.auth_headers(self.token),
                               open_timeout=self.connect_timeout, close_timeout=5, max_size=P.MAX_SERVER_MESSAGE,
                               max_queue=4, ping_interval=20, ping_timeout=60).__enter__()  # (websockets >= 17)
        except InvalidStatus as e:
            status = e.response.status_code
            raise _Refused(f"the engine server at {self.where} refused the connection (HTTP {status}"
                           f"{': no session endpoint there' if status == 404 else ''})") from None
        try:
            self._ws.send(P.hello(client_config(self.cfg, self.leave), speech=self.speech))
        except ConnectionClosed:
            pass                                 # refused at once: the reason is still there to read
        try:
            first = P.decode(self._ws.recv(timeout=self.ready_timeout))
        except ConnectionClosed as e:
            raise _Refused(f"the engine server at {self.where} closed the connection before the session "
                           f"started ({_close_text(e)})") from None
        except TimeoutError:
            raise _Refused(f"the engine server at {self.where} did not start the session within "
                           f"{self.ready_timeout:g} s; nothing was sent") from None
        except P.ProtocolError as e:
            raise _Refused(f"the engine server at {self.where} answered with what this client cannot read ({e}); "
                           "client and server must be the same version") from None
        if first["type"] == "refused":
            raise _Refused(f"the engine server at {self.where} refused the session: {_text(first.get('message'))}")
        if first["type"] == "error":
            raise _Refused(f"cannot start the session on {self.where}: {_text(first.get('message'))}")
        if first["type"] != "ready":
            raise _Refused(f"the engine server at {self.where} answered {_text(first['type'], 40)!r} "
                           "instead of 'ready'")
        if not _info_ok(first.get("info")):
            raise _Refused(f"the engine server at {self.where} sent a 'ready' without the session's info "
                           "(tail, backbone, device, size); client and server must be the same version")
        self.session = RemoteSession(first["info"], str(first.get("replica", "")),
                                     str(first.get("node", "")), str(first.get("actor", "")))
        self.ready.set()

    def _fail(self, err: LiveError) -> None:
        self.results.put(err)
        self._running = False
        self.ready.set()
        self._hang_up()

    def _send_loop(self) -> None:
        from websockets.exceptions import ConnectionClosed
        while True:
            item = self._out.get()
            if item is _STOP:
                return
            if isinstance(item, bytes) and not self._wait_for_room():
                return
            try:
                self._ws.send(item)
            except (ConnectionClosed, OSError, RuntimeError, TypeError):
                return                           # the receiver reports what happened

    def _wait_for_room(self) -> bool:
        """Back-pressure: at most :data:`SEND_AHEAD` seconds on the wire without their result; then
        count this one as sent (False when the session has ended meanwhile)."""
        with self._room:
            while self._sent - self._received >= SEND_AHEAD and self._running:
                self._room.wait(POLL_S)
            if not self._running:
                return False
            if self._sent == self._received:
                self._waiting_since = time.monotonic()
            self._sent += 1
            return True

    def _receive_loop(self) -> None:
        """Every message until the session ends. The deadline of the oldest second waiting for its result is
        looked at before every read, whatever arrived (a server that keeps talking without answering is left)."""
        from websockets.exceptions import ConnectionClosed
        while True:
            stalled = self._stalled()
            if stalled:
                self._lose(stalled, kind="stopped answering")
                return
            try:
                msg = self._ws.recv(timeout=self._read_timeout())
            except TimeoutError:
                oversized = _refused_oversized(self._ws)
                if oversized:                    # this client is closing (1009): say so, not "stalled"
                    self._lose(oversized)
                    return
                continue
            except ConnectionClosed as e:
                if not self._ended:
                    self._lose(_close_text(e))
                return
            try:
                if isinstance(msg, bytes):
                    self._on_result(P.unpack_result(msg))
                    continue
                ctl = P.decode(msg)
            except P.ProtocolError as e:
                self._lose(f"{e}", kind="sent what this client cannot use")
                return
            if ctl["type"] == "end":
                self._ended = True
            elif ctl["type"] == "error":
                self._ended = True
                n = len(self.session.records)
                self.results.put(LiveError(f"the engine server stopped the session: {_text(ctl.get('message'))} "
                                           f"({_kept(n)})"))

    def _due(self) -> Optional[float]:
        """The deadline (``time.monotonic()``) of the oldest second sent whose result has not come: its
        ``second_timeout`` counts from when it was sent or, when seconds before it were outstanding, from the
        result before it; only its own result moves it on. None while no second is outstanding."""
        with self._lock:
            since = self._waiting_since if self._sent > self._received else None
        return None if since is None else since + self.second_timeout

    def _read_timeout(self) -> float:
        due = self._due()
        return POLL_S if due is None else min(POLL_S, max(0.01, due - time.monotonic()))

    def _stalled(self) -> Optional[str]:
        """Why the session counts as stalled (a second outstanding past its deadline), or None."""
        due = self._due()
        if due is not None and time.monotonic() > due:
            return f"no result for {self.second_timeout:g} s while seconds were waiting for one"
        return None

    def _on_result(self, res: LiveResult) -> None:
        self._check_speech(res)
        with self._room:
            if res.record.index != self._received or self._received >= self._sent:
                due = "was due" if self._received < self._sent else "was not sent yet"
                raise P.ProtocolError(f"a result for second {res.record.index} came where second "
                                      f"{self._received} {due}")
            self._received += 1
            self._waiting_since = time.monotonic()
            self._room.notify_all()
        self.session.records.append(res.record)
        self.results.put(res)

    def _check_speech(self, res: LiveResult) -> None:
        """A result carries the tail's output only when this runner asked for it, and as the first one did
        (so a journal's speech.npy never skips a second)."""
        has = res.speech is not None
        if has and not self.speech:
            raise P.ProtocolError(f"the result for second {res.record.index} carries speech this client did not "
                                  "ask for")
        if self._with_speech is None:
            self._with_speech = has
        elif has != self._with_speech:
            raise P.ProtocolError(f"the result for second {res.record.index} "
                                  f"{'carries' if has else 'lacks'} the tail's speech and the earlier ones "
                                  f"{'did not' if has else 'had it'}")

    def _lose(self, detail: str, kind: str = "went away") -> None:
        n = len(self.session.records) if self.session is not None else 0
        self._ended = True
        self.lost = ServerLost(f"the engine server at {self.where} {kind} after {n} s of this session "
                               f"({_text(detail)}); {_kept(n)} — reconnect to start a new session", seconds=n)
        log.warning(self.lost.message)
        self.results.put(self.lost)

    def _hang_up(self) -> None:
        ws = self._ws
        if ws is not None:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 - already gone
                pass


class _Refused(Exception):
    """The session could not start (the text is the whole message for the user)."""


def _refused_oversized(ws) -> Optional[str]:
    """Why this client is closing the connection, when it refused a message over its size limit (its close frame,
    1009, is sent while the server, still pushing the message, has not answered it: until then ``recv`` only times
    out, and the watchdog would call the server stalled), else None."""
    sent = getattr(getattr(ws, "protocol", None), "close_sent", None)
    return _OVERSIZED if sent is not None and sent.code == 1009 else None


_OVERSIZED = f"it sent a message over this client's limit of {P.MAX_SERVER_MESSAGE} bytes"


def _close_text(e) -> str:
    """Why a connection closed, in words (the server's reason when it gave one)."""
    rcvd, sent = getattr(e, "rcvd", None), getattr(e, "sent", None)
    if sent is not None and sent.code == 1009:
        return _OVERSIZED
    if rcvd is None:
        return "the connection dropped without a close message"
    reason = f": {_text(rcvd.reason)}" if rcvd.reason else ""
    return f"closed with code {rcvd.code}{reason}"


def _info_ok(info) -> bool:
    """Whether a 'ready' message's info has what a caller prints, of the right types."""
    if not isinstance(info, dict):
        return False
    named = all(isinstance(info.get(k), str) for k in ("tail_title", "backbone_title", "device", "size"))
    paths = info.get("fast_paths") or []
    return named and isinstance(paths, list) and all(isinstance(x, str) for x in paths)


def _kept(n: int) -> str:
    return f"the {n} second{'s' if n != 1 else ''} received so far {'are' if n != 1 else 'is'} kept"


def _text(value, limit: int = 300) -> str:
    """A server's text, as one printable line of bounded length."""
    text = " ".join(str(value).split())
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[:limit] + "…"


def _why(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is `duplexcadence serve` running there?)"
    if isinstance(e, TimeoutError):
        return "no answer in time"
    text = str(e) or type(e).__name__
    return text.splitlines()[0]
