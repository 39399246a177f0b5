"""Many duplex sessions in one process on one device: shared weights, per-session state and graphs,
a per-second scheduler, admission by measured headroom (see :mod:`engine.host.host`)."""
from .admission import Headroom, HostFull, LoadMeter
from .host import LAUNCH_MODES, EngineHost
from .runner import HostedRunner
from .session import HostedSession, SessionMemory
from .weights import WeightsCache, WeightsKey

__all__ = ["EngineHost", "HostFull", "HostedRunner", "HostedSession", "SessionMemory", "Headroom", "LoadMeter",
           "WeightsCache", "WeightsKey", "LAUNCH_MODES"]
