"""The local Ray of `duplexcadence serve` goes when serve goes, however it goes (kill -9 included).

Ray ties its GCS and raylet to the process that started them, but the agents the raylet starts (the
dashboard and runtime-env agents) outlive a serve that was killed outright, each holding ports and
memory. So before serve starts its local Ray it marks its environment (``DUPLEXCADENCE_SERVE_RAY=<random>``,
inherited by every Ray process) and starts a reaper: a small process in a session of its own that holds the
read end of a pipe whose write end only serve holds. When serve ends, normally or not, the kernel closes the
write end; the reaper reads end-of-file, asks every process whose environment carries the mark to stop
(SIGTERM), and after :data:`GRACE_S` kills those still there. Nothing else on the machine is touched: the
mark is a fresh random value per serve.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

MARK = "DUPLEXCADENCE_SERVE_RAY"
GRACE_S = 3.0
_STARTED: list = []


def mark_environment(environ=os.environ) -> str:
    """Mark this process's environment (the local Ray it starts inherits it); returns the mark."""
    value = secrets.token_hex(16)
    environ[MARK] = value
    return value


def start(mark: str) -> Optional[subprocess.Popen]:
    """Start the reaper for ``mark``, bound to this process by a pipe (None where it cannot start: serve runs
    on, as before, without it)."""
    if getattr(sys, "frozen", False):            # a bundled app has no interpreter to run the module with
        return None
    env = {k: v for k, v in os.environ.items() if k != MARK}         # the reaper is not one of its targets
    try:
        read_end, write_end = os.pipe()
        proc = subprocess.Popen([sys.executable, "-m", "engine.serve.reaper", mark], stdin=read_end,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                start_new_session=True, close_fds=True,
                                cwd=str(Path(__file__).resolve().parents[2]))
    except OSError:
        return None
    os.close(read_end)
    os.set_inheritable(write_end, False)         # Ray's processes must not hold it open after serve is gone
    _STARTED.append((proc, write_end))          # the write end stays open for this process's life (its exit closes it)
    return proc


def marked(mark: str, exclude: int = 0) -> List[int]:
    """Pids of the processes whose environment holds ``MARK=mark`` (those this user may read)."""
    entry = f"{MARK}={mark}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in (os.getpid(), exclude):
            continue
        try:
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if entry in env.split(b"\0"):
            found.append(int(d.name))
    return found


def reap(mark: str, grace_s: float = GRACE_S) -> int:
    """SIGTERM every marked process, SIGKILL those left after ``grace_s``; returns how many there were."""
    pids = marked(mark)
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in marked(mark):
        _signal(pid, signal.SIGKILL)
    return len(pids)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: List[str]) -> int:
    """``python -m engine.serve.reaper MARK``: wait for end-of-file on stdin, then :func:`reap`."""
    if len(argv) != 1 or not argv[0]:
        return 2
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)       # serve's terminal going away is not the reaper's end
    while True:
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    reap(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
