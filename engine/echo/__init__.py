"""The audio path around the engine, without Qt: echo cancellation (WebRTC AEC3 via livekit), the
barge-in detector and its ducking decision, and the bounded playback and input queues.

The app's frame pump and audio callbacks use these; ``duplexcadence-bench echo`` drives all of them
headless (engine/bench/echo.py).
"""
from .bargein import SENSITIVITY, BargeIn, BargeInDetector
from .canceller import EchoCanceller, EchoUnavailable
from .queues import InputBacklog, PlaybackQueue, QueueCounts

__all__ = ["EchoCanceller", "EchoUnavailable", "BargeInDetector", "BargeIn", "SENSITIVITY", "PlaybackQueue",
           "InputBacklog", "QueueCounts"]
