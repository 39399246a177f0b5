"""Batched LISTEN replay: several hosted sessions' decoder steps as one batched step (slots).

Every second each session's backbone prefills ten audio embeddings into its AR speech decoder, one
engine step each. Sessions whose seconds come due together (a *group*, phase-aligned) can run
those steps as one: the row-wise work (norms, projections, feed-forward, head) runs once over the
``S`` slots' rows, the per-session part — rotary position, the write into the session's own KV
ring, attention over it, the sampled token from the session's own generator — runs per slot over
that session's own arena. On CUDA one graph per group replays all slots' step.

Whether a session's bits survive this is the device's business (a GEMM over ``S`` rows may take
another kernel, with another summation order, than over one row), so :func:`check` runs it at
start-up against the sessions' own solo steps on fresh random inputs and enables batching only
when every output and every byte of state is identical; otherwise it says where the bits differ.
The kernels depend on the slot count, so the check runs per count: the host checks a group's size
when a group of that size first forms (:meth:`.groups.ListenBatcher.verdict`); a size refused steps
each member's own graphs. On CUDA both sides run as production runs them: the sessions' own steps
replay their captured graphs, the batched step replays the group's captured graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from engine import fastpath
from engine.backbones.speech_decoder import SpeechDecoder, rotate
from engine.core import Executor, StepPlan
from engine.core.gate import GATE
from engine.core.graphs import GraphRuntime

from .rng import SessionRng

Uniform = Callable[[int, Tuple[int, int]], torch.Tensor]       # (slot, shape) -> uniform draws
#: how the S slots' rows meet a weight: one GEMM of S rows, or a batched GEMM of S one-row products
#: (the second keeps each row's summation as a one-row GEMM's on the CPU; the check decides per device)
GEMMS = ("rows", "bmm")
#: our code a check runs (its hash is part of the verdict's cache key)
CODE = ("engine.host", "engine.backbones", "engine.core", "engine.fastpath")


def project(x: torch.Tensor, lin: torch.nn.Linear, gemm: str) -> torch.Tensor:
    """``lin`` applied to every slot's row. x: [S, 1, in] -> [S, 1, out]."""
    if gemm == "rows":
        return lin(x)
    w = lin.weight.t().unsqueeze(0).expand(x.shape[0], -1, -1)              # [S, in, out], no copy
    y = torch.bmm(x, w)
    return y if lin.bias is None else y + lin.bias


def batched_step(model: SpeechDecoder, executors: Sequence[Executor], x: torch.Tensor,
                 uniform: Uniform, gemm: str = "bmm") -> Tuple[torch.Tensor, torch.Tensor]:
    """One decoder step for ``S`` sessions at once. x: [S, 1, dim] -> (tok [S, K], next [S, 1, dim]).

    Each slot reads and writes its own executor's arena (the arena's handles must be pointed at the
    step by ``arena.begin``); ``uniform(i, shape)`` draws slot ``i``'s Gumbel noise from its own RNG.
    """
    a = model.args
    S, C = x.shape[0], a.context
    per = []                                               # per slot: ring views, slot, cos, sin, mask
    for ex in executors:
        st = ex.state
        pos = st["k"].position()                           # 0-d int64 (device)
        ang = pos.to(torch.float32) * model.inv_freq       # [hd/2]
        mask = ((model.slots <= pos) | (pos >= C)).view(1, 1, 1, C)
        per.append((st["k"].get(), st["v"].get(), (pos % C).view(1), torch.cos(ang), torch.sin(ang), mask))
    for li, layer in enumerate(model.layers):
        q, k, v = project(layer.attn_norm(x), layer.wqkv, gemm).split(x.shape[-1], dim=-1)   # [S, 1, dim] each
        att = []
        for i, (k_all, v_all, slot, cos, sin, mask) in enumerate(per):
            qi = rotate(q[i:i + 1].view(1, 1, layer.h, layer.hd).transpose(1, 2), cos, sin)   # [1, H, 1, hd]
            ki = rotate(k[i:i + 1].view(1, 1, layer.h, layer.hd).transpose(1, 2), cos, sin)
            vi = v[i:i + 1].view(1, 1, layer.h, layer.hd).transpose(1, 2)
            k_all[li].index_copy_(1, slot, ki[0])
            v_all[li].index_copy_(1, slot, vi[0])
            att.append(F.scaled_dot_product_attention(qi, k_all[li].unsqueeze(0), v_all[li].unsqueeze(0),
                                                      attn_mask=mask))                 # [1, H, 1, hd]
        att_s = torch.cat(att, dim=0)                                                 # [S, H, 1, hd]
        x = x + project(att_s.transpose(1, 2).reshape(S, 1, -1), layer.wo, gemm)     # [S, 1, dim]
        h = layer.ffn_norm(x)
        x = x + project(F.silu(project(h, layer.w1, gemm)) * project(h, layer.w3, gemm), layer.w2, gemm)
    logits = project(model.norm(x), model.head, gemm).view(S, a.codebooks, a.vocab) / a.temperature
    toks = []
    for i in range(S):
        u = uniform(i, (a.codebooks, a.vocab)).clamp_(min=1e-20)
        toks.append(torch.argmax(logits[i] - torch.log(-torch.log(u)), dim=-1))       # [K]
    tok = torch.stack(toks)                                                           # [S, K]
    nxt = torch.cat([model.embed(t) for t in toks], dim=0)                           # [S, 1, dim]
    return tok, nxt


def uniform_from(rngs: Sequence[SessionRng], device: torch.device) -> Uniform:
    """Slot ``i`` draws as its session would alone: from its own CUDA generator state (capturable),
    or on the CPU from its own saved state, installed around the draw."""
    def draw(i: int, shape: Tuple[int, int]) -> torch.Tensor:
        gen = rngs[i].generator
        if gen is not None:
            return torch.rand(shape, device=device, generator=gen)
        with rngs[i].installed():
            return torch.rand(shape, device=device)
    return draw


@dataclass
class SlotGraph:
    """The captured batched step of one group: static input rows and the signature it was captured at."""

    graph: "torch.cuda.CUDAGraph"
    static_x: torch.Tensor            # [S, 1, dim]
    static_out: Tuple[torch.Tensor, torch.Tensor]     # (tok [S, K], next [S, 1, dim])
    signature: object
    members: Tuple[int, ...]          # executor ids, in slot order


class SlotStepper:
    """Runs the batched step for a fixed list of (executor, rng) slots: eagerly, or by one graph."""

    def __init__(self, model: SpeechDecoder, executors: Sequence[Executor], rngs: Sequence[SessionRng],
                 device: torch.device, gemm: str = "bmm"):
        self.model, self.executors, self.rngs = model, list(executors), list(rngs)
        self.gemm = gemm
        self.device = torch.device(device)
        self.uniform = uniform_from(self.rngs, self.device)
        self.slot_graph: Optional[SlotGraph] = None
        self.runtime = GraphRuntime(self.device, "batched listen")

    def step_plans(self) -> Optional[List[StepPlan]]:
        """Each slot's plan for its next step, or None when they do not share one signature."""
        plans = [ex.plan.step(ex.k) for ex in self.executors]
        return plans if len({p.signature for p in plans}) == 1 else None

    @torch.no_grad()
    def eager(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        plans = self._plans()
        for ex, sp in zip(self.executors, plans):
            ex.arena.begin(sp)
        out = batched_step(self.model, self.executors, x, self.uniform, self.gemm)
        for ex, sp in zip(self.executors, plans):
            ex.arena.commit(sp)
            ex.k += 1
            ex.stats.eager_steps += 1
        return out

    @torch.no_grad()
    def capture(self) -> None:
        """Capture the group's step (over live state: warm-up runs on it, then it is restored)."""
        plans = self._plans()
        S, dim = len(self.executors), self.model.args.dim
        static_x = torch.zeros(S, 1, dim, device=self.device)
        snaps = [ex.arena.snapshot() for ex in self.executors]
        rng = [r.generator.get_state() for r in self.rngs]
        with GATE.capturing():
            with self.runtime.side():                      # warm-up: cuBLAS workspaces, lazy inits
                self._run(plans, static_x, commit_host=False)
            torch.cuda.synchronize(self.device)
            for ex, snap in zip(self.executors, snaps):
                ex.arena.restore(snap)
            for r, st in zip(self.rngs, rng):
                r.generator.set_state(st)
            graph, static_out = self.runtime.capture(lambda: self._run(plans, static_x, commit_host=False),
                                                     generators=[r.generator for r in self.rngs])
            torch.cuda.synchronize(self.device)
        self.slot_graph = SlotGraph(graph, static_x, static_out, plans[0].signature,
                                    tuple(id(e) for e in self.executors))

    def _run(self, plans, x, commit_host: bool):
        for ex, sp in zip(self.executors, plans):
            ex.arena.begin(sp)
        out = batched_step(self.model, self.executors, x, self.uniform, self.gemm)
        for ex, sp in zip(self.executors, plans):
            ex.arena.commit_device(sp)
            if commit_host:
                ex.arena.commit_host(sp)
        if not commit_host:                                # capture / warm-up: the host side stays put
            for ex in self.executors:
                for st in ex.arena.states.values():
                    st.step = None
        return out

    @torch.no_grad()
    def replay(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """One batched step by the group's graph; returns (tok, next) as views of its static outputs
        (overwritten by the next replay: LISTEN discards them, the start-up check copies them)."""
        g = self.slot_graph
        plans = self._plans()
        if g is None or plans[0].signature != g.signature:
            raise RuntimeError("the group's batched graph does not match the sessions' next step")
        g.static_x.copy_(x, non_blocking=True)
        for ex, sp in zip(self.executors, plans):
            ex.arena.begin(sp)
        self.runtime.replay(g.graph)
        for ex, sp in zip(self.executors, plans):
            ex.arena.commit_host(sp)
            ex.k += 1
            ex.stats.replayed_steps += 1
        return g.static_out

    def _plans(self) -> List[StepPlan]:
        plans = self.step_plans()
        if plans is None:
            raise RuntimeError("the sessions' next steps have different shape signatures")
        return plans


# -- the start-up check ---------------------------------------------------------------------------------
def probe_executor(model: SpeechDecoder, rng: SessionRng, device: torch.device, seed: int) -> Executor:
    """A fresh decoder stream as a session builds it (graphs captured with its own RNG installed)."""
    from engine.core import make_plan
    graphs = device.type == "cuda"
    with rng.installed(), torch.no_grad():
        spec = model.session_spec()
        ex = Executor(model, make_plan(model.regions(spec), spec), device, demand_sized=True, graph_replay=graphs)
        ex.prepare_graphs(lambda sp: model.example_inputs(sp, device))
        ex.init_state({})
        torch.manual_seed(seed)
    return ex


def check(model: SpeechDecoder, device, slots: int = 3, steps: int = 4, seed: int = 0) -> Tuple[Optional[str], str]:
    """Which way of batching (see :data:`GEMMS`) keeps every session's bits here, and why / why not.

    Returns (gemm or None, why): the first way whose every token, next embedding and byte of state
    equals each session's own solo steps, on random inputs at different positions, over ``slots``
    sessions (a verdict holds for that slot count only). Each way is an :mod:`engine.fastpath` check:
    cached per device, library versions, code, decoder dims and slot count, and off where the user keeps
    the reference paths (``--reference-paths``).
    """
    reasons = []
    for gemm in GEMMS:
        v = fastpath.decide(f"batched LISTEN ({gemm}, {slots} slots)", device,
                            (repr(model.args), slots, steps, seed),
                            lambda gemm=gemm: check_gemm(model, device, gemm, slots, steps, seed), code=CODE)
        if v.chosen:
            return gemm, f"{v.reason} ({gemm})"
        reasons.append(f"{gemm}: {v.reason}")
    return None, "; ".join(reasons)


def check_gemm(model: SpeechDecoder, device, gemm: str, slots: int, steps: int, seed: int) -> Tuple[bool, str]:
    """One way of batching against solo steps; (identical, what was found)."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed + 7)
    xs = torch.randn(slots + steps, slots, 1, model.args.dim, generator=g).to(device)     # [T, S, 1, dim]

    def streams():
        rngs = [SessionRng(device) for _ in range(slots)]
        exs = [probe_executor(model, r, device, seed + i) for i, r in enumerate(rngs)]
        for i, (ex, r) in enumerate(zip(exs, rngs)):       # slot i starts i steps in: different positions
            with r.installed():
                for t in range(i):
                    ex.step({"x": xs[t, i:i + 1]})
        return exs, rngs

    exs, rngs = streams()
    solo = []
    for t in range(steps):
        outs = []
        for i, (ex, r) in enumerate(zip(exs, rngs)):
            with r.installed():
                o = ex.step({"x": xs[slots + t, i:i + 1]})
            outs.append((o["tok"].clone(), o["next"].clone()))
        solo.append(outs)
    solo_state = [ex.arena.export() for ex in exs]
    bexs, brngs = streams()
    stepper = SlotStepper(model, bexs, brngs, device, gemm)
    if device.type == "cuda":
        stepper.capture()
    for t in range(steps):
        x = xs[slots + t]                                                      # [S, 1, dim]
        tok, nxt = stepper.replay(x) if device.type == "cuda" else stepper.eager(x)
        for i in range(slots):
            if not (torch.equal(tok[i], solo[t][i][0]) and torch.equal(nxt[i:i + 1], solo[t][i][1])):
                return False, f"step {t}, slot {i}: the sampled token differs from the session's own step"
    for i, ex in enumerate(bexs):
        got = ex.arena.export()
        for n in got:
            if not torch.equal(got[n], solo_state[i][n]):
                d = (got[n].double() - solo_state[i][n].double()).abs().max().item()
                return False, (f"slot {i}'s {n} cache differs from its solo steps (max |diff| {d:.3g}: the batched "
                               f"kernels sum in another order on this device)")
    return True, f"{steps} batched steps over {slots} slots equal each session's solo steps bit for bit"
