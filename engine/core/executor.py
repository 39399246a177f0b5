"""The executor: runs a model's steps eagerly, or captures and replays one CUDA graph per signature.

Policy and mechanism are apart (cf. vLLM's dispatcher): the :class:`~engine.core.planner.Plan`
says which signatures exist and which step has which; the executor only captures and replays, and
owns no state of its own — every graph reads and writes the one arena, at stable addresses.

Capture without padding and without advancing real state:
* ahead of time (``prepare_graphs``), before the prompt prefill: each multi-use signature is warmed
  up once and captured over the arena while its contents do not matter yet; the arena is then
  zeroed and the RNG restored, so the session starts exactly as the eager one does;
* lazily, when graph replay is switched on mid-session: the step runs eagerly for real (that run
  is the warm-up), then its signature is captured for the next time (capture executes nothing).
Toggles requested between steps apply at the next step; switching the arena kind migrates the
state's contents (bit-exact copies) into the other arena.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from .arena import ArenaBase, DemandArena, make_arena
from .model import StateView, StreamingModel
from .graphs import GraphRuntime
from .planner import Plan, ShapeSignature, StepPlan
from .toggles import Toggles, graphs_can_run

log = logging.getLogger("engine.executor")

#: what one graph is captured for: the step's shape signature, and whether it is a stream's last step and its first
#: where the model branches on them (:attr:`~engine.core.model.StreamingModel.step_branches`: Step-Audio2's last
#: chunk reads no lookahead, its first has no overlap to fade), so such a step never replays another step's graph
GraphKey = Tuple[ShapeSignature, bool, bool]


def graph_key(sp: StepPlan, branches: Sequence[str] = ("last", "first")) -> GraphKey:
    return sp.signature, "last" in branches and bool(sp.is_last), "first" in branches and sp.index == 0


@dataclass
class GraphEntry:
    """One captured signature: the graph, its static inputs/outputs and the addresses it baked in."""

    signature: GraphKey
    graph: "torch.cuda.CUDAGraph"
    static_inputs: Dict[str, torch.Tensor]
    static_outputs: Dict[str, torch.Tensor]
    addresses: Dict[str, int]
    replays: int = 0


@dataclass
class ExecStats:
    eager_steps: int = 0
    replayed_steps: int = 0
    captures: int = 0
    migrations: int = 0
    notes: list = field(default_factory=list)


class Executor:
    """Runs one session of a :class:`StreamingModel` over a :class:`Plan`.

    ``demand_sized``: state in a :class:`DemandArena` (else the stock-like :class:`StockArena`).
    ``graph_replay``: one CUDA graph per signature (needs CUDA and the demand arena).
    ``debug``: at every replay, assert every region's view is at the address captured.
    """

    def __init__(self, model: StreamingModel, plan: Plan, device, demand_sized: bool = True,
                 graph_replay: bool = False, debug: bool = False):
        self.model = model
        self.plan = plan
        self.device = torch.device(device)
        self.debug = debug
        self.stats = ExecStats()
        self.k = 0
        self._want = Toggles(bool(demand_sized), bool(graph_replay))
        self._warned_no_cuda = False
        self.arena: ArenaBase = make_arena("demand" if demand_sized else "stock", plan, self.device)
        self.state = StateView(self.arena)
        self.graphs: Dict[GraphKey, GraphEntry] = {}
        self._branches = tuple(getattr(model, "step_branches", ()))
        self.runtime = GraphRuntime(self.device, f"executor: {type(model).__name__}")   # stream, pool, the gate

    # -- toggles -------------------------------------------------------------------------------------
    def set_toggles(self, toggles: Toggles) -> None:
        """Request toggles; they take effect at the next step boundary."""
        self._want = toggles

    def toggles(self) -> Toggles:
        """Toggles in effect for the next step (:meth:`Toggles.effective`: graph replay needs CUDA and
        demand-sized state)."""
        return Toggles(self._want.demand_sized, self._graphs_possible())

    def _graphs_possible(self) -> bool:
        if self._want.graph_replay and not graphs_can_run(self.device) and not self._warned_no_cuda:
            msg = "graph replay needs CUDA: running eagerly on %s" % self.device
            log.warning(msg)
            self.stats.notes.append(msg)
            self._warned_no_cuda = True
        return self._want.effective(self.device).graph_replay

    def _apply_toggles(self) -> None:
        want = "demand" if self._want.demand_sized else "stock"
        if self.arena.kind == want:
            return
        contents, positions = self.arena.export(), dict(self.arena.positions)
        self._drop_graphs()                      # graphs point into the old arena's storage
        old = self.arena
        self.arena = make_arena(want, self.plan, self.device)
        del old
        self.arena.load(contents, positions, self.k)
        self.state = StateView(self.arena)
        self.stats.migrations += 1

    # -- session -------------------------------------------------------------------------------------
    @torch.no_grad()
    def init_state(self, prompt: Optional[Dict[str, torch.Tensor]] = None) -> None:
        """Prompt prefill (eager, once, before step 0). Call ``prepare_graphs`` before this."""
        if self.k != 0:
            raise RuntimeError("init_state must run before the first step")
        self.model.init_state(self.state, prompt or {})

    @torch.no_grad()
    def restart(self, contents: Dict[str, torch.Tensor], positions: Dict[str, int]) -> None:
        """Back to step 0 with the state ``contents`` / ``positions`` (an ``arena.export()`` and
        ``arena.positions`` taken right after :meth:`init_state`): exact copies into the same arena, so
        the captured graphs stay valid; the plan's step 0 runs next."""
        self.arena.load(contents, dict(positions), 0)
        self.k = 0

    @torch.no_grad()
    def prepare_graphs(self, example_inputs: Callable[[StepPlan], Dict[str, torch.Tensor]],
                       extra: Sequence[StepPlan] = ()) -> int:
        """Capture every signature the plan uses more than once, ahead of time, before prefill; and each step
        of ``extra`` (steps the plan cannot list ahead but the stream expects, e.g. a turn's usual last chunk).

        Warm-up runs over the arena while its contents do not matter yet; afterwards the arena is
        zeroed, its positions reset and the RNG restored, so step 0 starts as the eager one does.
        Returns the number of graphs captured.
        """
        if self.k != 0:
            raise RuntimeError("prepare_graphs must run before the first step")
        if not self._graphs_possible():
            return 0
        first: Dict[GraphKey, StepPlan] = {}
        uses: Dict[GraphKey, int] = {}
        for s in self.plan.timeline:
            first.setdefault(self._key(s), s)
            uses[self._key(s)] = uses.get(self._key(s), 0) + 1
        wanted = [sp for key, sp in first.items() if uses[key] > 1 or not self.plan.finite]
        wanted += [sp for sp in extra if self._key(sp) not in first]   # a one-off step (the last chunk) stays eager
        rng = torch.cuda.get_rng_state(self.device)
        for sp in wanted:
            inputs = example_inputs(sp)
            self._with_lengths(sp, lambda: self._warm(sp, inputs))
            self._with_lengths(sp, lambda: self._capture(sp, inputs))
        torch.cuda.synchronize(self.device)
        self._reset_arena()
        torch.cuda.set_rng_state(rng, self.device)
        return len(wanted)

    @torch.no_grad()
    def step(self, inputs: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        """Run step ``k`` (the plan says its shapes) and return its outputs (safe to keep)."""
        self._apply_toggles()
        sp = self.plan.step(self.k)
        use_graph = self._graphs_possible()
        entry = self.graphs.get(self._key(sp)) if use_graph else None
        if entry is not None:
            out = self._replay(entry, sp, inputs)
        else:
            out = self._eager(sp, inputs)
            if use_graph and self._worth_capturing(sp):
                self._with_lengths(sp, lambda: self._capture(sp, inputs))
        self.k += 1
        return out

    # -- mechanism -----------------------------------------------------------------------------------
    def _eager(self, sp: StepPlan, inputs):
        self.arena.begin(sp)
        out = self.model.step(self.state, inputs, sp)
        self.arena.commit(sp)
        self.stats.eager_steps += 1
        return out

    def _key(self, sp: StepPlan) -> GraphKey:
        return graph_key(sp, self._branches)

    def _worth_capturing(self, sp: StepPlan) -> bool:
        if sp.is_last:              # a stream ends once: its last step has a graph only if prepared ahead
            return False
        if not self.plan.finite:
            return True
        key = self._key(sp)
        return any(self._key(s) == key for s in self.plan.timeline[sp.index + 1:])

    def _with_lengths(self, sp: StepPlan, fn):
        """Run ``fn`` with every region's host length set to the step's ``before`` (then restore)."""
        saved = {n: st.length for n, st in self.arena.states.items()}
        for n, st in self.arena.states.items():
            st.length = sp.before[n]
        try:
            return fn()
        finally:
            for n, st in self.arena.states.items():
                st.length = saved[n]
                st.step = None

    def _drop_graphs(self) -> None:
        """Forget every graph and its memory pool (a pool is never reused once its graphs are gone)."""
        self.graphs.clear()
        self.runtime.drop_pool()

    def _warm(self, sp: StepPlan, inputs):
        with self.runtime.side():
            self.arena.begin(sp)
            self.model.step(self.state, inputs, sp)
            self.arena.commit_device(sp)

    def _capture(self, sp: StepPlan, inputs):
        assert isinstance(self.arena, DemandArena), "graphs need the demand arena"
        static_in = {k: v.detach().clone() for k, v in inputs.items()}
        self.arena.prepare(sp)
        self.arena.begin(sp)
        addresses = self._addresses()

        def body():
            out = self.model.step(self.state, static_in, sp)
            self.arena.commit_device(sp)
            return out
        graph, static_out = self.runtime.capture(body)
        self.graphs[self._key(sp)] = GraphEntry(self._key(sp), graph, static_in, static_out, addresses)
        self.stats.captures += 1

    def _replay(self, entry: GraphEntry, sp: StepPlan, inputs):
        for k, v in inputs.items():
            dst = entry.static_inputs[k]
            if dst.shape != v.shape or dst.dtype != v.dtype:
                raise RuntimeError(f"input {k!r}: {tuple(v.shape)} {v.dtype} does not match the graph of "
                                   f"signature {sp.signature.label} ({tuple(dst.shape)} {dst.dtype})")
            dst.copy_(v, non_blocking=True)
        self.arena.begin(sp)
        if self.debug:
            now = self._addresses()
            if now != entry.addresses:
                bad = [n for n in now if now[n] != entry.addresses.get(n)]
                raise RuntimeError(f"state moved since capture (regions {bad}); graphs need stable addresses")
        self.runtime.replay(entry.graph)
        self.arena.commit_host(sp)
        entry.replays += 1
        self.stats.replayed_steps += 1
        return {k: v.clone() for k, v in entry.static_outputs.items()}

    def _addresses(self) -> Dict[str, int]:
        return {n: st.grow().data_ptr() for n, st in self.arena.states.items()}

    def _reset_arena(self) -> None:
        """Back to the session's initial state, in place (addresses kept for the captured graphs)."""
        a = self.arena
        for t in a._tensors().values():
            t.zero_()
        a.positions = {r.name: int(self.plan.spec.prefix.get(r.name, 0)) for r in self.plan.regions}
        for r in self.plan.regions:
            a.states[r.name].length = r.retention.initial(int(self.plan.spec.prefix.get(r.name, 0)))
        a._sync_counters(0)

    # -- reporting -----------------------------------------------------------------------------------
    def state_bytes(self) -> int:
        return self.arena.state_bytes()

    @property
    def mode(self) -> str:
        return self.toggles().mode
