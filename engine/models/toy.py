"""A small stateful streaming module that exercises every kind of region the engine supports.

Used by the engine-core tests (CPU and GPU) and shown by ``duplexcadence-bench plan --model toy``.
Per step it takes ``n`` new frames (the clock's advance: 3, 4, 3, 4, ...), and keeps:

* ``conv``  – Fixed(2): the causal conv's last two input frames (replaced every step);
* ``kv``    – PrefixWindow(8): attention keys/values of the prompt plus the last 8 frames;
* ``ring``  – Ring(6): a ring of the last 6 hidden frames written at ``position % 6`` on the device;
* ``noise`` – draws from the default generator every step (checks graph-safe RNG).
"""
from __future__ import annotations

from typing import Dict, List

import torch
from torch import nn

from engine.core.graphs import example_randn, session_generator
from engine.core import (Clock, Fixed, PrefixWindow, Region, Ring, SessionSpec, StateView, StepPlan,
                         StreamingModel, make_plan)
from engine.registry import ModelEntry, register


class ToyStreamer(StreamingModel):
    """Causal conv -> attention over prefix+window KV -> mix with a ring of past frames, plus noise."""

    name = "toy"

    def __init__(self, channels: int = 16, heads: int = 2, window: int = 8, ring: int = 6,
                 pattern=(3, 4), prompt_frames: int = 5, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.c, self.h, self.window, self.ring_cap = channels, heads, window, ring
        self.d = channels // heads
        self.clock = Clock("frames", tuple(pattern), rate_hz=float(sum(pattern)) / len(pattern))
        self.prompt_frames = prompt_frames
        self.conv = nn.Conv1d(channels, channels, 3)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.out = nn.Linear(channels, channels)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)

    def regions(self, spec: SessionSpec) -> List[Region]:
        c, h, d = self.c, self.h, self.d
        return [
            Region("conv", (1, c, None), self.clock, Fixed(2), stock_note="new tensor each step"),
            Region("kv", (2, 1, h, None, d), self.clock, PrefixWindow(self.window), stock_units=64,
                   stock_note="buffer of 64 frames + cat/truncate"),
            Region("ring", (1, c, None), self.clock, Ring(self.ring_cap), stock_note="ring"),
        ]

    def spec(self, steps=None) -> SessionSpec:
        return SessionSpec(steps=steps, prefix={"kv": self.prompt_frames}, label="toy")

    def init_state(self, state: StateView, prompt: Dict[str, torch.Tensor]) -> None:
        kv = prompt.get("kv")
        if kv is not None:
            state["kv"].set(kv)

    def example_inputs(self, plan: StepPlan, device) -> Dict[str, torch.Tensor]:
        n = plan.advances[self.clock.name]
        return {"x": example_randn((1, self.c, n), device)}

    def step(self, state: StateView, inputs: Dict[str, torch.Tensor], plan: StepPlan) -> Dict[str, torch.Tensor]:
        x = inputs["x"]                                           # [1, C, n]
        n = x.shape[-1]
        conv_in = torch.cat([state["conv"].get(), x], dim=-1)     # [1, C, n+2]
        h = self.conv(conv_in)                                    # [1, C, n]
        state["conv"].set(conv_in[..., -2:])
        q, k, v = self.qkv(h.transpose(1, 2)).split(self.c, dim=-1)   # [1, n, C] each
        q = q.view(1, n, self.h, self.d).transpose(1, 2)          # [1, H, n, D]
        kv_new = torch.stack([k.view(1, n, self.h, self.d).transpose(1, 2),
                              v.view(1, n, self.h, self.d).transpose(1, 2)])   # [2, 1, H, n, D]
        state["kv"].tail().copy_(kv_new)
        kv = state["kv"].grow().contiguous()                      # [2, 1, H, T, D]
        att = torch.softmax(q @ kv[0].transpose(-1, -2) / self.d ** 0.5, dim=-1) @ kv[1]
        a = self.out(att.transpose(1, 2).reshape(1, n, self.c)).transpose(1, 2)   # [1, C, n]
        ring = state["ring"].get()                                # [1, C, R]
        idx = (state["ring"].position() + torch.arange(n, device=x.device)) % self.ring_cap
        ring.index_copy_(2, idx, h)
        mix = ring.mean(dim=-1, keepdim=True)                     # [1, C, 1]
        y = torch.tanh(a + mix) + 0.01 * torch.empty_like(a).normal_(generator=session_generator(a.device))
        return {"y": y}


def _plan(size: str = "released", steps=None, **_):
    m = ToyStreamer()
    return make_plan(m.regions(m.spec(steps)), m.spec(steps))


register(ModelEntry(name="toy", title="Toy streamer (engine self-test)",
                    architecture="conv + prefix/window attention + ring", plan=_plan))
