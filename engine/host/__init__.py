"""Many duplex sessions in one process on one device: one scheduler that launches every session's work, shared
weights, per-session state and graphs, batched steps, admission by measured headroom (see
:mod:`engine.host.host`)."""
from .admission import Headroom, HostFull, LoadMeter
from .host import EngineHost
from .runner import HostedRunner
from .scheduler import Scheduler
from .session import HostedSession, SessionMemory
from .weights import WeightsCache, WeightsKey

__all__ = ["EngineHost", "HostFull", "HostedRunner", "HostedSession", "SessionMemory", "Headroom", "LoadMeter",
           "Scheduler", "WeightsCache", "WeightsKey"]
