"""What a runner (embedded, hosted or remote) has put on its ``results`` queue, for tests."""
from __future__ import annotations

import queue
import time

from engine.session import LiveError


def collect(runner, n: int, timeout: float = 120.0) -> list:
    """Up to ``n`` results within ``timeout`` seconds; stops early at a LiveError (the runner has stopped)."""
    got, t0 = [], time.time()
    while len(got) < n and time.time() - t0 < timeout:
        try:
            got.append(runner.results.get(timeout=0.5))
        except queue.Empty:
            continue
        if isinstance(got[-1], LiveError):
            break
    return got
