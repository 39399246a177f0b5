"""The Ray Serve deployment: a FastAPI ingress whose WebSocket endpoint is one live session.

Each replica owns one GPU (``num_gpus=1``; on a CPU-only cluster, CPUs) and a
:class:`~engine.serve.hosting.SessionHost`. A WebSocket connection stays on the replica that took
it for its whole life, so the connection is the session's affinity; :class:`HeadroomRouter`
places new connections on the replica with the most deadline headroom.

Serve's defaults that matter here, and what we set instead:
  * ``max_ongoing_requests`` (default 5) counts every open WebSocket, also one that has not said
    hello yet. We set it to the session limit plus :data:`REFUSAL_SLACK` (64), so connections that
    never say hello (each refused after ``pump.HELLO_TIMEOUT_S``) do not keep other clients queued,
    and a full replica still takes a connection to *refuse* it with a message.
  * ``graceful_shutdown_timeout_s`` (default 20 s) is how long a replica being scaled down waits
    for its open requests. We set it to the drain timeout (default an hour): scale-down stops
    placing sessions on the replica and waits for its live sessions to end.
  * autoscaling: Serve scales on ongoing requests per replica, which here are the open sessions.
"""
import asyncio
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Optional

import ray
from fastapi import FastAPI, WebSocket
from ray import serve
from starlette.websockets import WebSocketDisconnect

from engine import cuda_queues
from engine.host import HostFull
from engine.session import LiveError, SessionConfig

from . import auth, drain, lockdown
from . import protocol as P
from .hosting import ModelMismatch, SessionHost
from .pump import (HELLO_TIMEOUT_S, Connection, ResultsQueue, Slots, give_back, limit_arenas, receive_hello,
                   send_close)

log = logging.getLogger("engine.serve")

REFUSAL_SLACK = 64             # connections beyond the session limit: still saying hello, or taken to be refused
BUILD_TIMEOUT_S = 900.0        # building released weights on a busy GPU can take minutes
DRAIN_POLL_S = 0.5             # how often a replica looks whether the server drains


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
    #: the replica process's thread switch interval (ms): the scheduler's thread shares the interpreter with the
    #: sessions' network threads, and shorter turns hand it back sooner (on the H200 whole MiniCPM-o sessions held
    #: 4 at 1 ms where Python's default 5 ms held 3); None keeps the interpreter's
    switch_interval_ms: Optional[float] = 1.0
    #: the replica process's CUDA work queues (CUDA_DEVICE_MAX_CONNECTIONS, engine/cuda_queues.py), set before
    #: its first CUDA call; None keeps the environment's (else the driver's 8)
    cuda_connections: Optional[int] = None

    def session_config(self) -> SessionConfig:
        return SessionConfig(**self.config)

    def apply_switch_interval(self) -> None:
        """Set the replica process's thread switch interval (the replica owns its process)."""
        if self.switch_interval_ms is not None:
            if not 0.01 <= float(self.switch_interval_ms) <= 1000:
                raise ValueError(f"switch_interval_ms must be between 0.01 and 1000, not {self.switch_interval_ms}")
            sys.setswitchinterval(float(self.switch_interval_ms) / 1e3)


async def _refuse(ws: WebSocket, code: int, message: str) -> None:
    log.info("refused a session: %s", message)
    await send_close(ws, P.encode("refused", message=message, code=code), code)


api = FastAPI(title="DuplexCadence", docs_url=None, redoc_url=None, openapi_url=None)


# (no ``from __future__ import annotations`` here: FastAPI reads the endpoint's ``WebSocket`` annotation
# at run time, and Serve's class ingress rebuilds the endpoint where a string annotation cannot resolve)
@serve.deployment(name="DuplexSessions")
@serve.ingress(api)
class SessionReplica:
    """One replica: a session host on its GPU and the WebSocket endpoint that feeds it."""

    def __init__(self, spec: Dict[str, Any]):
        limit_arenas()                         # before any session's thread allocates (see pump.ARENAS)
        lockdown.bind_replica_grpc_to_node()   # before Serve starts the replica's own gRPC server
        self.spec = ServeSpec(**spec)
        self.spec.apply_switch_interval()
        cuda_queues.request(self.spec.cuda_connections)     # before the host's first CUDA call
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

    # -- draining --------------------------------------------------------------------------
    def _drain_state(self) -> asyncio.Event:
        """The event set when the server's drain grace period has ended (its watcher starts with the
        first connection, on this replica's event loop)."""
        if getattr(self, "_cut", None) is None:
            self._cut = asyncio.Event()
            self._drain_until: Optional[float] = None
            self._watcher = asyncio.get_running_loop().create_task(self._watch_drain())
        return self._cut

    async def _watch_drain(self) -> None:
        while not self._cut.is_set():
            until = await asyncio.to_thread(drain.deadline)
            self._drain_until = until
            if until is not None and time.time() >= until:
                self._cut.set()
                return
            await asyncio.sleep(DRAIN_POLL_S)

    async def _draining(self) -> bool:
        self._drain_state()
        if self._drain_until is None:              # a drain that began since the last look counts too
            self._drain_until = await asyncio.to_thread(drain.deadline)
        return self._drain_until is not None

    # -- the session endpoint ---------------------------------------------------------------
    @api.websocket(P.PATH)
    async def session(self, ws: WebSocket) -> None:
        refusal = auth.check(self.token, ws.headers)      # before anything else: no model work
        await ws.accept()
        if refusal:
            await _refuse(ws, P.CLOSE_UNAUTHORIZED, refusal)
            return
        if await self._draining():
            await _refuse(ws, P.CLOSE_SHUTDOWN, "the server is shutting down: no new sessions")
            return
        try:
            text = await receive_hello(ws)
            cfg, speech = self.host.config_for(P.read_hello(text)), P.hello_asks_speech(text)
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
            runner = await self._admit(cfg)
        except HostFull as e:
            await _refuse(ws, P.CLOSE_FULL, f"the cluster is full: {e} (on the replica with the most headroom) — "
                                            "try again later or add a GPU replica")
            return
        conn = Connection(ws, runner, self._drain_state(), speech)
        slots = self._slots()
        slots.live.add(conn)
        try:
            await self._run(conn)
        finally:
            await asyncio.to_thread(self.host.release, runner, conn.drain)
            slots.live.discard(conn)
            conn.released.set()                       # a client waiting for this slot may take it now
            del conn, runner
            await asyncio.to_thread(give_back)

    def _slots(self) -> Slots:
        if getattr(self, "_live", None) is None:
            self._live = Slots()
        return self._live

    async def _admit(self, cfg):
        """A started runner for ``cfg``; when the replica is full, the slot of a session whose client has gone
        quiet (slots count the sessions that send frames, not open sockets); HostFull when there is none."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.to_thread(self.host.admit, cfg, ResultsQueue(loop))
        except HostFull:
            if not await self._slots().take_quiet():
                raise
        return await asyncio.to_thread(self.host.admit, cfg, ResultsQueue(loop))

    async def _run(self, conn: Connection) -> None:
        runner, ws = conn.runner, conn.ws
        built = await asyncio.to_thread(runner.ready.wait, BUILD_TIMEOUT_S)
        if not built or runner.session is None:
            try:
                item = runner.results.get_nowait()
            except Exception:  # noqa: BLE001 - nothing posted: not built in time
                item = None
            message = item.message if isinstance(item, LiveError) else "the session was not built in time"
            await send_close(ws, P.encode("error", message=message), 1011)
            return
        await ws.send_text(P.encode("ready", info=dict(runner.session.info), replica=self.replica,
                                    node=self.node, actor=self.actor))
        await conn.run()


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
