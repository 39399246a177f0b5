"""The session controller's states (app/controller.py), one name each for the window and the mixins."""
from __future__ import annotations

IDLE, STARTING, RUNNING, DRAINING, STOPPING = "idle", "starting", "running", "draining", "stopping"
