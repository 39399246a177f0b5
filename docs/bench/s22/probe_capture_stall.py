"""Session 22 probe (issue 24): does one thread's graph capturing stall another thread's eager CUDA work?

probe_admission.py showed running whole MiniCPM-o sessions' THINK (eager attention between layer graphs, a
host read of each sampled token) taking 5-11 s while another session was being built, each ending right when
the build ended, with no gate upgrade. Here thread A runs a THINK-like loop on its own stream (small eager
ops, a host read each iteration) in two forms, allocating new tensors or writing into buffers made once;
thread B meanwhile (1) idles, (2) warms up and captures graphs through GraphRuntime for 6 s, as a build does,
(3) runs the same work eagerly. Printed per phase: A's iteration p50 / p99 / max (ms), the allocator's
device allocations and all-stream synchronizations (torch.cuda.memory_stats) during the phase.
Usage: PYTHONPATH=. python3 docs/bench/s22/probe_capture_stall.py OUT.json
"""
import json
import sys
import threading
import time

import torch

from engine.core.graphs import GraphRuntime

sys.setswitchinterval(0.001)
dev = torch.device("cuda")
torch.manual_seed(0)
W = torch.randn(512, 512, device=dev)
X = torch.randn(8, 512, device=dev)


def a_loop(allocating: bool, stop: threading.Event, times: list) -> None:
    s = torch.cuda.Stream(dev)
    buf, out, tot = torch.empty(8, 512, device=dev), torch.empty(8, 512, device=dev), torch.empty((), device=dev)
    with torch.cuda.stream(s):
        while not stop.is_set():
            t = time.perf_counter()
            for _ in range(36):                        # a layer's attention calls a token, as in THINK
                if allocating:
                    y = torch.softmax(X @ W, dim=-1)
                    v = float(y.sum()) if _ == 35 else None
                else:
                    torch.matmul(X, W, out=buf)
                    torch.tanh(buf, out=out)
                    if _ == 35:
                        torch.sum(out, dim=(0, 1), out=tot)
                        v = float(tot)
            times.append((time.perf_counter() - t) * 1e3)


def chain(x):
    for _ in range(100):
        x = torch.tanh(x @ W)
    return x


def b_capture(stop: threading.Event, count: list) -> None:
    rt = GraphRuntime(dev, "probe captures")
    x = torch.randn(8, 512, device=dev)
    while not stop.is_set():
        with rt.side():
            chain(x)
        g, _ = rt.capture(lambda: chain(x))
        count[0] += 1
        del g


def b_eager(stop: threading.Event, count: list) -> None:
    s = torch.cuda.Stream(dev)
    x = torch.randn(8, 512, device=dev)
    with torch.cuda.stream(s):
        while not stop.is_set():
            chain(x)
            s.synchronize()
            count[0] += 1


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else 0.0


def stats():
    m = torch.cuda.memory_stats(dev)
    return {k: m.get(k, 0) for k in ("num_device_alloc", "num_device_free", "num_sync_all_streams", "num_alloc_retries")}


results = []
for allocating in (True, False):
    for phase, b, secs in (("alone", None, 2.0), ("beside captures", b_capture, 6.0), ("beside eager", b_eager, 4.0)):
        stop, times, count = threading.Event(), [], [0]
        s0 = stats()
        ta = threading.Thread(target=a_loop, args=(allocating, stop, times))
        tb = threading.Thread(target=b, args=(stop, count)) if b else None
        ta.start()
        if tb:
            tb.start()
        time.sleep(secs)
        stop.set()
        ta.join()
        if tb:
            tb.join()
        torch.cuda.synchronize()
        s1 = stats()
        r = {"allocating": allocating, "phase": phase, "iterations": len(times), "p50_ms": pct(times, 50),
             "p99_ms": pct(times, 99), "max_ms": max(times, default=0.0), "b_rounds": count[0],
             "allocator": {k: s1[k] - s0[k] for k in s0}}
        results.append(r)
        print(f"A {'allocating' if allocating else 'in buffers':10s} {phase:16s}: {len(times):5d} its, p50 "
              f"{r['p50_ms']:7.2f} p99 {r['p99_ms']:8.2f} max {r['max_ms']:8.2f} ms; B rounds {count[0]}; "
              f"allocator {r['allocator']}", flush=True)
json.dump(results, open(sys.argv[1], "w"), indent=1)
