"""The processes a serve's local Ray starts go when serve goes, kill -9 included (engine/serve/reaper.py): a
stand-in serve marks its environment, starts the reaper and three long-lived children in sessions of their own
(as Ray's agents outlive their raylet), one of them started without the mark (as an agent whose title overwrote
what /proc shows of its environment); kill -9 of the stand-in ends all three, and a process that was never
below serve and has no mark is left alone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from engine.serve import reaper

ROOT = Path(__file__).resolve().parents[1]
SERVE = """
import os, subprocess, sys, time
from engine.serve import reaper
mark = reaper.mark_environment()
reaper.start(mark)
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
kids = [subprocess.Popen(sleep, start_new_session=True) for _ in range(2)]
bare = {k: v for k, v in os.environ.items() if k != reaper.MARK}
kids.append(subprocess.Popen(sleep, start_new_session=True, env=bare))
time.sleep(4 * reaper.WATCH_S)                       # the reaper has noted them
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"     # a zombie is gone


def test_kill_9_of_serve_ends_every_process_its_ray_started(tmp_path):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    serve = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        kids = [int(x) for x in serve.stdout.readline().split()]
        assert len(kids) == 3 and all(_alive(k) for k in kids)
        assert reaper.MARK.encode() not in Path(f"/proc/{kids[2]}/environ").read_bytes()
        serve.send_signal(signal.SIGKILL)
        serve.wait(10)
        end = time.monotonic() + 15
        while time.monotonic() < end and any(_alive(k) for k in kids):
            time.sleep(0.1)
        assert not any(_alive(k) for k in kids), "processes serve started outlived it"
        assert _alive(bystander.pid)                                        # no mark, not touched
    finally:
        for p in (serve, bystander):
            p.kill()
            p.wait(10)
        for k in kids if "kids" in locals() else []:
            if _alive(k):
                os.kill(k, signal.SIGKILL)


def test_only_the_exact_mark_is_reaped(monkeypatch):
    mark = "a" * 32
    env = dict(os.environ, **{reaper.MARK: mark})
    other = dict(os.environ, **{reaper.MARK: mark + "b", "X" + reaper.MARK: mark})
    ps = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=e) for e in (env, other)]
    try:
        time.sleep(0.3)
        assert reaper.marked(mark) == [ps[0].pid]
        assert reaper.reap(mark, grace_s=2.0) == 1
        ps[0].wait(10)
        assert ps[1].poll() is None
    finally:
        for p in ps:
            p.kill()
            p.wait(10)


def test_a_noted_pid_counts_only_with_its_start_time():
    """A pid noted below serve that the system has since given to another process is not touched."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        when = reaper.started(p.pid)
        assert when is not None and reaper.below(os.getpid())[p.pid] == when
        assert reaper.still_running({p.pid: when}) == [p.pid]
        assert reaper.still_running({p.pid: when + 1}) == []            # same pid, another process
        assert reaper.reap("b" * 32, grace_s=2.0, noted={p.pid: when + 1}) == 0
        assert p.poll() is None
        assert reaper.reap("b" * 32, grace_s=2.0, noted={p.pid: when}) == 1
        assert p.wait(10) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
