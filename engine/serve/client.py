"""The remote engine: a session on a ``duplexcadence serve`` server, with the live runner's interface.

:class:`RemoteRunner` is a drop-in for :class:`engine.session.LiveRunner` (``start``, ``submit``,
``results`` queue of :class:`LiveResult` / :class:`LiveError`, ``set_toggles``, ``backlog``,
``running``, ``ready``, ``session.info``, ``stop(drain=)``), so the app's controller and
``duplexcadence run --engine ws://HOST:PORT`` use it exactly like the embedded engine. The server
runs the same :class:`~engine.session.DuplexSession`; records and audio arrive bit for bit.

Nothing here needs Ray: the client is the ``websockets`` package only. If the server goes away
mid-session the results queue gets one :class:`ServerLost` (a LiveError) and everything received
before stays with the caller.
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from engine.core.toggles import requested
from engine.session import LiveError, LiveResult, SessionConfig
from engine.session.records import SecondRecord
from engine.session.session import check_frame

from . import auth
from . import protocol as P

log = logging.getLogger("engine.serve.client")

_STOP = object()


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
    named in ``leave`` are left to the server's defaults."""
    return {k: getattr(cfg, k) for k in P.CLIENT_FIELDS if k not in leave}


class RemoteRunner:
    """A live session on a remote server, used like :class:`engine.session.LiveRunner`."""

    def __init__(self, cfg: SessionConfig, url: str, token: str, connect_timeout: float = 15.0,
                 leave: Sequence[str] = ()):
        """``leave``: config fields the server decides (e.g. ``graph_replay`` from a client without CUDA,
        whose own switch for it is greyed out)."""
        self.cfg = cfg
        self.leave = tuple(leave)
        self.url, self.where = P.session_url(url)
        self.token = token
        self.connect_timeout = float(connect_timeout)
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
        data = P.pack_frame(check_frame(frame))
        with self._lock:
            self._submitted += 1
        self._out.put(data)

    def set_toggles(self, demand_sized: Optional[bool] = None, graph_replay: Optional[bool] = None) -> None:
        """Applied by the server at its next second boundary."""
        self._out.put(P.encode("toggles", **requested(demand_sized, graph_replay)))

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
                               open_timeout=self.connect_timeout, close_timeout=5, max_size=None,
                               ping_interval=20, ping_timeout=60).__enter__()   # (websockets >= 17 wants it)
        except InvalidStatus as e:
            status = e.response.status_code
            raise _Refused(f"the engine server at {self.where} refused the connection (HTTP {status}"
                           f"{': no session endpoint there' if status == 404 else ''})") from None
        try:
            self._ws.send(P.hello(client_config(self.cfg, self.leave)))
        except ConnectionClosed:
            pass                                 # refused at once: the reason is still there to read
        try:
            first = P.decode(self._ws.recv(timeout=None))
        except ConnectionClosed as e:
            raise _Refused(f"the engine server at {self.where} closed the connection before the session "
                           f"started ({_close_text(e)})") from None
        if first["type"] == "refused":
            raise _Refused(f"the engine server at {self.where} refused the session: {first.get('message')}")
        if first["type"] == "error":
            raise _Refused(f"cannot start the session on {self.where}: {first.get('message')}")
        if first["type"] != "ready":
            raise _Refused(f"the engine server at {self.where} answered {first['type']!r} instead of 'ready'")
        self.session = RemoteSession(first.get("info") or {}, str(first.get("replica", "")),
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
            try:
                self._ws.send(item)
            except (ConnectionClosed, OSError, RuntimeError):
                return                           # the receiver reports what happened

    def _receive_loop(self) -> None:
        from websockets.exceptions import ConnectionClosed
        while True:
            try:
                msg = self._ws.recv()
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
                self._ended = True
                self.results.put(LiveError(f"the engine server at {self.where} sent what this client cannot "
                                           f"read ({e}); client and server must be the same version"))
                return
            if ctl["type"] == "end":
                self._ended = True
            elif ctl["type"] == "error":
                self._ended = True
                self.results.put(LiveError(f"the engine server stopped the session: {ctl.get('message')}"))

    def _on_result(self, res: LiveResult) -> None:
        with self._lock:
            self._received += 1
        self.session.records.append(res.record)
        self.results.put(res)

    def _lose(self, detail: str) -> None:
        n = len(self.session.records) if self.session is not None else 0
        kept = f"the {n} second{'s' if n != 1 else ''} received so far {'are' if n != 1 else 'is'} kept"
        self.lost = ServerLost(f"the engine server at {self.where} went away after {n} s of this session "
                               f"({detail}); {kept} — reconnect to start a new session", seconds=n)
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


def _close_text(e) -> str:
    """Why a connection closed, in words (the server's reason when it gave one)."""
    rcvd = getattr(e, "rcvd", None)
    if rcvd is None:
        return "the connection dropped without a close message"
    reason = f": {rcvd.reason}" if rcvd.reason else ""
    return f"closed with code {rcvd.code}{reason}"


def _why(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is `duplexcadence serve` running there?)"
    if isinstance(e, TimeoutError):
        return "no answer in time"
    text = str(e) or type(e).__name__
    return text.splitlines()[0]
