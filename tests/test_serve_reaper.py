"""The processes a serve's local Ray starts go when serve goes, kill -9 included (engine/serve/reaper.py): a
stand-in serve marks its environment, starts the reaper and two long-lived children in sessions of their own
(as Ray's agents outlive their raylet); kill -9 of the stand-in ends both, and a process without the mark is
left alone."""
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
import subprocess, sys, time
from engine.serve import reaper
reaper.start(reaper.mark_environment())
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        for _ in range(2)]
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
        assert len(kids) == 2 and all(_alive(k) for k in kids)
        serve.send_signal(signal.SIGKILL)
        serve.wait(10)
        end = time.monotonic() + 15
        while time.monotonic() < end and any(_alive(k) for k in kids):
            time.sleep(0.1)
        assert not any(_alive(k) for k in kids), "the marked processes outlived serve"
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
