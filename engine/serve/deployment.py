"""The Ray Serve deployment: a FastAPI ingress whose WebSocket endpoint is one live session.

Each replica owns one GPU (``num_gpus=1``; on a CPU-only cluster, CPUs) and a
:class:`~engine.serve.hosting.SessionHost`. A WebSocket connection stays on the replica that took
it for its whole life, so the connection is the session's affinity; :class:`HeadroomRouter`
places new connections on the replica with the most deadline headroom.

Serve's defaults that matter here, and what we set instead:
  * ``max_ongoing_requests`` (default 5) counts every open WebSocket. We set it to the session
    limit plus :data:`REFUSAL_SLACK`, so a full replica still takes a connection to *refuse* it
    with a message instead of leaving the client queued without a word.
  * ``graceful_shutdown_timeout_s`` (default 20 s) is how long a replica being scaled down waits
    for its open requests. We set it to the drain timeout (default an hour): scale-down stops
    placing sessions on the replica and waits for its live sessions to end.
  * autoscaling: Serve scales on ongoing requests per replica, which here are the open sessions.
"""
import asyncio
import logging
import queue
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional

import ray
from fastapi import FastAPI, WebSocket
from ray import serve
from starlette.websockets import WebSocketDisconnect, WebSocketState

from engine.host import HostFull
from engine.session import LiveError, LiveResult, SessionConfig

from . import auth
from . import protocol as P
from .hosting import ModelMismatch, SessionHost

log = logging.getLogger("engine.serve")

REFUSAL_SLACK = 2              # connections beyond the session limit that are taken only to refuse them
HELLO_TIMEOUT_S = 30.0
BUILD_TIMEOUT_S = 900.0        # building released weights on a busy GPU can take minutes
IDLE_CHECK_S = 0.25            # a session's sender looks at its runner this often even without results


@dataclass
class ServeSpec:
    """What ``duplexcadence serve`` deploys (plain data: it travels to every replica)."""

    config: Dict[str, Any]                 # SessionConfig fields of the served model
    token: str
    max_sessions: int = 32                 # per replica (below it the engine host admits by headroom)
    replicas: Optional[int] = None         # None: one per GPU (1 without GPUs)
    autoscale: bool = False
    max_replicas: Optional[int] = None     # autoscaling ceiling (default: the GPUs of the cluster)
    gpus_per_replica: float = 0.0          # 1 when the cluster has GPUs and the model runs on CUDA
    cpus_per_replica: float = 1.0
    drain_timeout_s: float = 3600.0
    stats_period_s: float = 1.0
    autoscaling: Dict[str, Any] = field(default_factory=dict)   # Serve autoscaling_config overrides (delays)

    def session_config(self) -> SessionConfig:
        return SessionConfig(**self.config)


# The helpers come before the class: Serve serializes the class when it is decorated, with the
# module globals that exist at that moment.


async def _receive(ws: WebSocket, runner, stopping: asyncio.Event, drain: list, sender: asyncio.Task) -> None:
    """Frames and control messages from the client until it stops or leaves."""
    while not sender.done():
        recv = asyncio.ensure_future(ws.receive())
        done, _ = await asyncio.wait({recv, sender}, return_when=asyncio.FIRST_COMPLETED)
        if recv not in done:
            recv.cancel()
            return
        msg = recv.result()
        if msg["type"] == "websocket.disconnect":
            return
        try:
            if msg.get("bytes") is not None:
                runner.submit(P.unpack_frame(msg["bytes"]))
                continue
            ctl = P.decode(msg.get("text") or "")
            if ctl["type"] == "toggles":
                runner.set_toggles(demand_sized=ctl.get("demand_sized"), graph_replay=ctl.get("graph_replay"))
            elif ctl["type"] == "stop":
                drain[0] = bool(ctl.get("drain", False))
                stopping.set()
                await asyncio.to_thread(runner.stop, 3600.0 if drain[0] else 30.0, drain[0])
                await sender
                return
            else:
                raise P.ProtocolError(f"unknown message type {ctl['type']!r}")
        except ValueError as e:               # ProtocolError or a bad frame: the session ends
            await _send_close(ws, P.encode("error", message=f"the server stopped the session: {e}"),
                              P.CLOSE_BAD_REQUEST)
            return


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


async def _send_results(ws: WebSocket, runner, stopping: asyncio.Event) -> None:
    """Each finished second to the client as soon as it is there; ``end`` after a stop."""
    sent = 0
    wake: Optional[asyncio.Event] = getattr(runner.results, "ready", None)
    while True:
        item = _get(runner.results)
        if item is None:
            if not runner.running and (stopping.is_set() or runner.results.empty()):
                item = _get(runner.results)
                if item is None:
                    if stopping.is_set():
                        await _send_close(ws, P.encode("end", seconds=sent), P.CLOSE_NORMAL)
                    else:
                        await _send_close(ws, P.encode("error", message="the session stopped"), 1011)
                    return
            else:
                await _wait(wake, IDLE_CHECK_S)
                continue
        if isinstance(item, LiveResult):
            await ws.send_bytes(P.pack_result(item))
            sent += 1
        elif isinstance(item, LiveError):
            await _send_close(ws, P.encode("error", message=item.message), 1011)
            return


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


async def _send_close(ws: WebSocket, text: str, code: int) -> None:
    """``text`` (a JSON message), then a close with ``code`` and a short reason."""
    if ws.application_state == WebSocketState.CONNECTED:
        reason = str(P.decode(text).get("message", ""))
        reason = reason.encode("utf-8")[:120].decode("utf-8", "ignore")   # a close reason holds 123 bytes
        try:
            await ws.send_text(text)
            await ws.close(code=code, reason=reason)
        except (RuntimeError, WebSocketDisconnect, OSError):
            pass


async def _refuse(ws: WebSocket, code: int, message: str) -> None:
    log.info("refused a session: %s", message)
    await _send_close(ws, P.encode("refused", message=message, code=code), code)


api = FastAPI(title="DuplexCadence", docs_url=None, redoc_url=None, openapi_url=None)


# (no ``from __future__ import annotations`` here: FastAPI reads the endpoint's ``WebSocket`` annotation
# at run time, and Serve's class ingress rebuilds the endpoint where a string annotation cannot resolve)
@serve.deployment(name="DuplexSessions")
@serve.ingress(api)
class SessionReplica:
    """One replica: a session host on its GPU and the WebSocket endpoint that feeds it."""

    def __init__(self, spec: Dict[str, Any]):
        self.spec = ServeSpec(**spec)
        self.token = self.spec.token
        self.host = SessionHost(self.spec.session_config(), self.spec.max_sessions)
        ctx = serve.get_replica_context()
        self.replica = ctx.replica_id.unique_id
        self.node = ray.get_runtime_context().get_node_id()
        self.actor = ray.get_runtime_context().get_actor_name() or ""

    # -- Serve hooks ------------------------------------------------------------------------
    def record_routing_stats(self) -> Dict[str, Any]:
        """Sessions and deadline headroom, for :class:`engine.serve.router.HeadroomRouter`."""
        return self.host.stats()

    def check_health(self) -> None:
        """Healthy while the host answers (the engine runs on worker threads, not this loop)."""
        self.host.stats()

    def __del__(self):
        host = getattr(self, "host", None)
        if host is not None:
            host.close_all()

    # -- the session endpoint ---------------------------------------------------------------
    @api.websocket(P.PATH)
    async def session(self, ws: WebSocket) -> None:
        refusal = auth.check(self.token, ws.headers)      # before anything else: no model work
        await ws.accept()
        if refusal:
            await _refuse(ws, P.CLOSE_UNAUTHORIZED, refusal)
            return
        try:
            asked = P.read_hello(await asyncio.wait_for(ws.receive_text(), HELLO_TIMEOUT_S))
            cfg = self.host.config_for(asked)
        except asyncio.TimeoutError:
            await _refuse(ws, P.CLOSE_BAD_REQUEST, f"no hello within {HELLO_TIMEOUT_S:.0f} s")
            return
        except ModelMismatch as e:
            await _refuse(ws, P.CLOSE_CONFLICT, str(e))
            return
        except (ValueError, KeyError, TypeError) as e:
            await _refuse(ws, P.CLOSE_BAD_REQUEST, str(e))
            return
        except WebSocketDisconnect:
            return
        try:
            runner = await asyncio.to_thread(self.host.admit, cfg, ResultsQueue(asyncio.get_running_loop()))
        except HostFull as e:
            await _refuse(ws, P.CLOSE_FULL, f"the cluster is full: {e} (on the replica with the most headroom) — "
                                            "try again later or add a GPU replica")
            return
        drain = [False]
        try:
            await self._run(ws, runner, drain)
        finally:
            await asyncio.to_thread(self.host.release, runner, drain[0])

    async def _run(self, ws: WebSocket, runner, drain: list) -> None:
        built = await asyncio.to_thread(runner.ready.wait, BUILD_TIMEOUT_S)
        if not built or runner.session is None:
            item = _get(runner.results)
            message = item.message if isinstance(item, LiveError) else "the session was not built in time"
            await _send_close(ws, P.encode("error", message=message), 1011)
            return
        await ws.send_text(P.encode("ready", info=dict(runner.session.info), replica=self.replica,
                                    node=self.node, actor=self.actor))
        stopping = asyncio.Event()
        sender = asyncio.create_task(_send_results(ws, runner, stopping))
        try:
            await _receive(ws, runner, stopping, drain, sender)
        finally:
            if not sender.done():
                if not stopping.is_set():          # the client left: nothing more to send
                    sender.cancel()
                try:
                    await sender
                except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the socket may be gone
                    pass


def deployment_options(spec: ServeSpec) -> Dict[str, Any]:
    """The Serve deployment options for ``spec`` (see the module docstring for why each)."""
    from ray.serve.config import RequestRouterConfig

    from .router import HeadroomRouter
    opts: Dict[str, Any] = dict(
        max_ongoing_requests=spec.max_sessions + REFUSAL_SLACK,
        graceful_shutdown_timeout_s=float(spec.drain_timeout_s),
        graceful_shutdown_wait_loop_s=1.0,
        ray_actor_options={"num_gpus": spec.gpus_per_replica, "num_cpus": spec.cpus_per_replica},
        request_router_config=RequestRouterConfig(request_router_class=HeadroomRouter,
                                                  request_routing_stats_period_s=spec.stats_period_s,
                                                  request_routing_stats_timeout_s=max(5.0, spec.stats_period_s)),
    )
    if spec.autoscale:
        opts["autoscaling_config"] = {
            "min_replicas": 1, "initial_replicas": spec.replicas or 1,
            "max_replicas": max(1, spec.max_replicas or spec.replicas or 1),
            # ongoing requests are open sessions: scale up before replicas are full
            "target_ongoing_requests": max(1.0, 0.75 * spec.max_sessions),
            "upscale_delay_s": 5.0, "downscale_delay_s": 120.0,
            **spec.autoscaling,
        }
    else:
        opts["num_replicas"] = spec.replicas or 1
    return opts


def build_app(spec: ServeSpec):
    """The Serve application for ``spec``."""
    return SessionReplica.options(**deployment_options(spec)).bind(asdict(spec))
