"""Session 22 probe (issue 24): what makes a second take seconds right after a MiniCPM-o session is admitted?

Ray Serve's replica refused a 5th whole MiniCPM-o session at "the slowest second took 4,195 ms" while 4 held 30 s
with a worst of 785 ms, and the in-process ramp once saw three sessions finish nothing in a 6 s window after a
5th was added. This probe runs the host in process (released dims, random weights, graphs, 1 ms switch
interval): 3 sessions built then fed, 12 s; a 4th added (fed as soon as it is built), 20 s; a 5th, 20 s. A sampler
thread notes every 20 ms the process's graph captures and gate upgrades. Printed: every second over 600 ms
(session, index, arrival relative to the start, queue wait, work, decision, captures and upgrades during it) and
the builds' spans. JSON: every second of every session.
Usage: PYTHONPATH=. python3 docs/bench/s22/probe_admission.py OUT.json (a CPU smoke run: DEVICE=cpu SIZE=tiny SCALE=0.2;
HAND_OVER=0: builds hold the capture lock throughout (session 23 turned the hand-over on by default);
STACKS=1 (session 23): every 0.5 s while a session is built, each thread's innermost frames, written beside
OUT as OUT.stacks.txt with the gate's hand-over count after each build — what a stalled second waits on;
session 24: the gate's trace is on (TRACE=0 turns it off): for every slow second, how long its session's thread
waited for the gate and the capture lock within it, and which threads held the capture lock meanwhile)
"""
import json
import os
import sys
import threading
import time

import torch

from engine.bench.capacity import session_inputs
from engine.bench.ramp import set_count
from engine.core import graphs
from engine.core.gate import GATE
from engine.host import EngineHost
from engine.host.drive import PacedLoad
from engine.session import SessionConfig

sys.setswitchinterval(0.001)
DEV, SIZE, SCALE = os.environ.get("DEVICE", "cuda"), os.environ.get("SIZE", "released"), float(os.environ.get("SCALE", "1"))
cfg = SessionConfig(tail="step-audio2", backbone="minicpm-o-4.5", size=SIZE, device=DEV, seed=0)
host = EngineHost(device=DEV, launch="threads", hand_over=os.environ.get("HAND_OVER", "1") == "1")
load = PacedLoad(host)
inputs = session_inputs(6, 0)
T0 = time.perf_counter()
samples, stop = [], threading.Event()


def sample():
    while not stop.is_set():
        c, _ = graphs.launches()
        samples.append((time.perf_counter() - T0, c, GATE.upgrades))
        time.sleep(0.02)


threading.Thread(target=sample, daemon=True).start()
if os.environ.get("TRACE", "1") == "1":
    GATE.trace = []
building, stacks = threading.Event(), []


def stack_sampler():
    import traceback
    me = threading.get_ident()
    while not stop.is_set():
        if building.is_set():
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                top = traceback.extract_stack(frame)[-7:]
                stacks.append(f"{time.perf_counter() - T0:8.2f} {names.get(ident, ident)}: " + " <- ".join(
                    f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(top)))
        time.sleep(0.5)


if os.environ.get("STACKS") == "1":
    threading.Thread(target=stack_sampler, daemon=True).start()
builds = []
for n, hold_s in ((3, 12.0), (4, 20.0), (5, 20.0)):
    b0 = time.perf_counter() - T0
    building.set()
    set_count(load, cfg, inputs, n)
    building.clear()
    builds.append((n, b0, time.perf_counter() - T0))
    stacks.append(f"-- {n} sessions built {b0:.1f} .. {builds[-1][2]:.1f} s; gate hand-overs so far {GATE.handovers}")
    print(f"{n} sessions: built {b0:.1f} .. {builds[-1][2]:.1f} s", flush=True)
    time.sleep(hold_s * SCALE)
stop.set()
time.sleep(1.5)


def during(a, b):
    inside = [s for s in samples if a <= s[0] <= b]
    before = [s for s in samples if s[0] < a]
    c0, u0 = (before[-1][1], before[-1][2]) if before else (0, 0)
    return (inside[-1][1] - c0, inside[-1][2] - u0) if inside else (0, 0)


rows = []
for d in load.sessions:
    for r in d.records:
        arrival = d.t0 + r.index - T0
        done = arrival + (r.queue_wait_ms + r.total_ms) / 1e3
        caps, ups = during(arrival, done)
        rows.append({"session": d.index, "index": r.index, "arrival_s": round(arrival, 3), "queue_ms": r.queue_wait_ms,
                     "work_ms": r.total_ms, "listen_ms": r.listen_ms, "think_ms": r.think_ms, "speak_ms": r.speak_ms,
                     "decision": r.decision, "captures": caps, "upgrades": ups})
rows.sort(key=lambda x: x["arrival_s"])
trace = [(who, what, t0 - T0, t1 - T0) for who, what, t0, t1 in (GATE.trace or [])]


def waits_in(x):
    """The gate's trace within a slow second: its own thread's waits by kind, and the capture lock's holders."""
    a, b = x["arrival_s"], x["arrival_s"] + (x["queue_ms"] + x["work_ms"]) / 1e3
    me, mine, holders = f"hosted-session-{x['session']}", {}, {}
    for who, what, t0, t1 in trace:
        overlap = min(b, t1) - max(a, t0)
        if overlap <= 0:
            continue
        if who == me and what.startswith("wait"):
            mine[what] = round(mine.get(what, 0.0) + overlap * 1e3, 1)
        elif what.startswith("held") and who != me:
            holders[f"{who}: {what}"] = round(holders.get(f"{who}: {what}", 0.0) + overlap * 1e3, 1)
    return {"waits_ms": mine, "capture_lock_held_by_others_ms": holders}


for x in rows:
    if trace and x["queue_ms"] + x["work_ms"] > 600:
        x.update(waits_in(x))
print("slow seconds (arrival to done over 600 ms):")
for x in rows:
    if x["queue_ms"] + x["work_ms"] > 600:
        print(f"  s{x['session']} #{x['index']:3d} at {x['arrival_s']:7.2f} s: queue {x['queue_ms']:6.0f} work "
              f"{x['work_ms']:6.0f} (L {x['listen_ms']:.0f} T {x['think_ms']:.0f} S {x['speak_ms']:.0f}) "
              f"{x['decision']:6s} captures {x['captures']} upgrades {x['upgrades']}")
        if "waits_ms" in x:
            print(f"      waited {x['waits_ms']}; capture lock held by others {x['capture_lock_held_by_others_ms']}")
print("captures over time (s, total):", [(round(t, 1), c) for t, c, _ in samples[::50]])
if stacks:
    open(sys.argv[1] + ".stacks.txt", "w").write("\n".join(stacks) + "\n")
json.dump({"builds": builds, "handovers": GATE.handovers, "seconds": rows, "samples": samples[::5],
           "trace_kept": len(trace), "trace": [t for t in trace if t[3] - t[2] > 0.05][:5000],
           "errors": load.errors()}, open(sys.argv[1], "w"), indent=1)
load.close()
host.close()
