"""Probe (session 17): does MiniCPM-o's CPU log-mel front end cause LISTEN's spikes?

LISTEN in speaking seconds sat at ~30 ms with spikes of 55-73 ms in ~1 second of 6 (session 17 call 1; sessions 10
and 16 call 3 too). The front end runs on the CPU with torch's intra-op threads (16 on the device); idle threads
go to sleep and wake for the next second's FFT and mel product. This times the front end, features moved to the
GPU and synchronized, with 16 threads and with 1, back to back and after idle gaps like a live second's, and checks
that the features are the same bits either way.

    python3 docs/bench/s17/probe_front_end.py > $OUT/probe-front-end.txt
"""
from __future__ import annotations

import statistics
import time

import torch

from engine.backbones.minicpmo45.audio import FrontEnd, slaney_mel

WIN = 400


def _front(threads: int) -> FrontEnd:
    torch.set_num_threads(threads)
    front = FrontEnd(slaney_mel(128), torch.hann_window(WIN, periodic=True), "cuda", demand_sized=True)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        front(torch.randn(24000, generator=g) * 0.1)
    return front


def _time(front: FrontEnd, gap: float, calls: int, g: torch.Generator) -> list:
    ms = []
    for _ in range(calls):
        x = torch.randn(24000, generator=g) * 0.1
        time.sleep(gap)
        t0 = time.perf_counter()
        front(x)
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1000.0)
    return ms


def main() -> None:
    default = torch.get_num_threads()
    for threads in (default, 1):
        front = _front(threads)
        g = torch.Generator().manual_seed(2)
        for gap in (0.0, 0.15, 0.9):
            ms = sorted(_time(front, gap, 15, g))
            print(f"threads {threads:2d} gap {gap:4.2f} s: median {statistics.median(ms):6.2f} ms, "
                  f"p90 {ms[int(0.9 * len(ms))]:6.2f}, max {ms[-1]:6.2f}")
    fronts = {t: _front(t) for t in (default, 1)}
    same = True
    for k in range(20):
        x = torch.randn(24000, generator=torch.Generator().manual_seed(100 + k)) * 0.2
        outs = {}
        for t, front in fronts.items():
            torch.set_num_threads(t)
            outs[t] = front(x).cpu()
        same &= torch.equal(outs[default], outs[1])
    torch.set_num_threads(default)
    print(f"features with {default} threads and with 1 over 20 seconds: {'the same bits' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
