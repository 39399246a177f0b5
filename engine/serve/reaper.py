"""The local Ray of `duplexcadence serve` goes when serve goes, however it goes (kill -9 included).

Ray ties its GCS and raylet to the process that started them, but the agents the raylet starts (the
dashboard and runtime-env agents) outlive a serve that was killed outright, each holding ports and
memory. So before serve starts its local Ray it marks its environment (``DUPLEXCADENCE_SERVE_RAY=<random>``,
inherited by every Ray process) and starts a reaper: a small process in a session of its own that holds the
read end of a pipe whose write end only serve holds. While serve lives the reaper also notes, every
:data:`WATCH_S`, each process below serve (its pid and start time): a process that renames itself (Ray's
agents set their title over the memory ``/proc/<pid>/environ`` reads) no longer shows the mark. When serve
ends, normally or not, the kernel closes the write end; the reaper reads end-of-file, asks every process
whose environment carries the mark, and every noted one still running under the same start time, to stop
(SIGTERM), and after :data:`GRACE_S` kills those still there. Nothing else on the machine is touched: the
mark is a fresh random value per serve, and a noted pid counts only with the start time it was noted with.
"""
from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

MARK = "DUPLEXCADENCE_SERVE_RAY"
GRACE_S = 3.0
WATCH_S = 0.5
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
        proc = subprocess.Popen([sys.executable, "-m", "engine.serve.reaper", mark, str(os.getpid())],
                                stdin=read_end,
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


def started(pid: int) -> Optional[int]:
    """The start time of ``pid`` in clock ticks since boot (None where it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def below(root: int) -> Dict[int, int]:
    """Every process below ``root`` (not ``root``): pid -> start time, from the kernel's children lists."""
    found: Dict[int, int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        for kid in _children(pid):
            if kid not in found:
                when = started(kid)
                if when is not None:
                    found[kid] = when
                    todo.append(kid)
    return found


def _children(pid: int) -> List[int]:
    kids: List[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return kids
    for task in tasks:
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return kids


def still_running(noted: Dict[int, int]) -> List[int]:
    """The noted pids that still name the process noted (same start time, not a reused pid)."""
    return [pid for pid, when in noted.items() if started(pid) == when and pid != os.getpid()]


def reap(mark: str, grace_s: float = GRACE_S, noted: Optional[Dict[int, int]] = None) -> int:
    """SIGTERM every marked process and every ``noted`` one still running, SIGKILL those left after
    ``grace_s``; returns how many there were."""
    noted = noted or {}

    def targets() -> List[int]:
        return sorted(set(marked(mark)) | set(still_running(noted)))

    pids = targets()
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in targets():
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


def watch(serve_pid: int, fd: int = 0, every_s: float = WATCH_S) -> Dict[int, int]:
    """Note the processes below ``serve_pid`` every ``every_s`` until end-of-file on ``fd``; returns them."""
    noted: Dict[int, int] = {}
    while True:
        if serve_pid:
            noted.update(below(serve_pid))
        try:
            ready, _, _ = select.select([fd], [], [], every_s)
            if ready and not os.read(fd, 4096):
                return noted
        except InterruptedError:
            continue
        except (OSError, ValueError):
            return noted


def main(argv: List[str]) -> int:
    """``python -m engine.serve.reaper MARK [SERVE_PID]``: note serve's processes until end-of-file on stdin,
    then :func:`reap`."""
    if len(argv) not in (1, 2) or not argv[0] or (len(argv) == 2 and not argv[1].isdigit()):
        return 2
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)       # serve's terminal going away is not the reaper's end
    noted = watch(int(argv[1]) if len(argv) == 2 else 0)
    reap(argv[0], noted=noted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
