"""The clock-aware engine core: declarations, planner, state arenas, executor. No model code, no Qt."""
from .regions import (Clock, STILL, Retention, Static, Fixed, SlidingWindow, PrefixWindow, Ring, Horizon, Region,
                      SessionSpec, prefixed)
from .planner import Plan, StepPlan, ShapeSignature, make_plan, format_plan
from .arena import RegionState, DemandArena, StockArena, make_arena
from .growing import (DataClock, data_clock, GrowingStore, StockGrowth, DemandGrowth, make_growing, move_contents,
                      switch_policy)
from .model import StreamingModel, StateView
from .executor import Executor, GraphEntry, ExecStats

__all__ = [
    "Clock", "STILL", "Retention", "Static", "Fixed", "prefixed", "SlidingWindow", "PrefixWindow", "Ring", "Horizon", "Region",
    "SessionSpec", "Plan", "StepPlan", "ShapeSignature", "make_plan", "format_plan", "RegionState",
    "DemandArena", "StockArena", "make_arena", "DataClock", "data_clock", "GrowingStore", "StockGrowth",
    "DemandGrowth", "make_growing", "move_contents", "switch_policy", "StreamingModel", "StateView", "Executor",
    "GraphEntry", "ExecStats",
]
