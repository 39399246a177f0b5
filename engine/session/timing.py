"""Stage timing for one second: CUDA events on the GPU, ``perf_counter`` on the CPU.

On the GPU the host runs ahead of the device, so host timestamps would charge a stage's kernels to
whichever stage happened to wait for them; an event recorded on the stream between two stages
measures the device's own boundary. Reading them costs one synchronize at the end of the second,
which the session needs anyway to hand the audio out.
"""
from __future__ import annotations

import time
from typing import Dict, List, Tuple

import torch

from engine.core import yieldpoints


class StageClock:
    """Marks stage boundaries of one second and reports each stage's milliseconds."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.device = torch.device(device)
        self.marks: List[Tuple[str, object]] = []

    def mark(self, name: str) -> None:
        """Boundary ``name`` (the end of the previous stage, the start of the next)."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(self.device))
            self.marks.append((name, ev))
        else:
            self.marks.append((name, time.perf_counter()))

    def stages(self) -> Dict[str, float]:
        """Milliseconds from each mark to the next, keyed by the earlier mark's name."""
        if self.cuda:
            yieldpoints.wait()                 # under a device's scheduler: park until the second's work is done
            self.marks[-1][1].synchronize()
        out = {}
        for (name, a), (_, b) in zip(self.marks, self.marks[1:]):
            out[name] = float(a.elapsed_time(b)) if self.cuda else (b - a) * 1000.0
        return out


def allocator_bytes(device: torch.device) -> Tuple[int, int, int]:
    """(allocated, reserved, peak allocated) of the torch CUDA allocator; zeros on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0, 0, 0
    return (int(torch.cuda.memory_allocated(device)), int(torch.cuda.memory_reserved(device)),
            int(torch.cuda.max_memory_allocated(device)))
