"""LLM rounds (``rounds.LLMRounds``): hosted MiniCPM-o sessions' one-token steps met across threads in one group
step. On the CPU (eager, tiny sizes): members stepping together get their own steps' bits and stores, rounds run;
a member that is not decoding sits rounds out untouched; a round a decoding member never joins fires after
``wait_s``; a size the check refuses, a member outside a shared second, and a failed round step alone, with the
same bits (the failure reported). The captured graphs and the streams are the GPU's test."""
import contextlib
import threading

import pytest
import torch

from engine.backbones.minicpmo45 import group_graphs
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.llm_graphs import LayerGraphs
from engine.backbones.minicpmo45.rounds import LLMRounds
from engine.backbones.minicpmo45.weights import build

from tests.test_minicpmo45_group_graphs import check_rows as cached_check_rows

CPU = torch.device("cpu")
DT = torch.bfloat16


@pytest.fixture(scope="module")
def model():
    m = build(Qwen3, preset("tiny").llm, device="cpu", dtype=DT).eval()
    seeded_init(m, 31)
    return m


def _stores(model, n, seed, sink=True, dev=CPU):
    d = model.d
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 32, 64, DT, "")
    out = []
    with torch.no_grad():
        for s in range(n):
            st = make_store(True, regions[0], d.layers, 16, dev, growable=True, sink=sink)
            history = torch.randn(5 + 3 * s, d.hidden, generator=torch.Generator().manual_seed(seed + s))
            model(history.to(dev, DT), st)
            out.append(st)
    return out


def _solo(model, store, dev=CPU):
    graphs = dev.type == "cuda"
    lg = LayerGraphs(model, store, dev, capture=graphs)
    def step(e):
        if store.length + 1 > store.capacity or not step.lg.valid_for(store):
            store._room(store.length + 1)
            step.lg = LayerGraphs(model, store, dev, capture=graphs)
        return step.lg.forward(e)
    step.lg = lg
    return step


def _rows(model, n, k, seed, dev=CPU):
    return torch.randn(k, n, 1, model.d.hidden, generator=torch.Generator().manual_seed(seed)).to(dev, DT)


def _reference(model, n, rows, seed, active, dev=CPU):
    """Each member's own steps, one after another, over its own copy of the histories."""
    stores = _stores(model, n, seed, dev=dev)
    out = {s: [] for s in active}
    with torch.no_grad():
        for s in active:
            solo = _solo(model, stores[s], dev)
            out[s] = [solo(rows[k, s]) for k in range(rows.shape[0])]
    return out, stores


def row_verdicts(model):
    """The device's row verdicts for this model's linears (made once per weights: thousands of trials each)."""
    return cached_check_rows(model, range(1, 5), seed=3)


#: every linear one row at a time: the rounds' mechanics alone, with no GEMM verdict in play (a CPU's bf16 GEMMs
#: of a few rows differ from one row at a time about once in 10^5 outputs, which a verdict's trials may miss)
PER_ROW = {name: frozenset({1}) for name in group_graphs.LINEARS}


def _rounds(model, stores, check=lambda n: (True, f"{n}: checked"), wait_s=0.05, allow=None, dev=CPU,
            verdicts=None):
    r = LLMRounds(model, dev, row_verdicts(model) if verdicts is None else verdicts, check, wait_s=wait_s,
                  graphs=dev.type == "cuda")
    for s, st in enumerate(stores):
        r.join(s, st, _solo(model, st, dev), (allow or (lambda: True)))
    return r


def _run_members(r, rows, active, decoding=True):
    got, errors = {s: [] for s in active}, []
    barrier = threading.Barrier(len(active))
    for s in active:                                  # all marked before any steps: the first round waits for all
        r.decoding(s, decoding)

    def member(s):
        stream = torch.cuda.Stream(rows.device) if rows.is_cuda else None    # each member on its own stream
        try:
            with torch.no_grad(), (torch.cuda.stream(stream) if stream else contextlib.nullcontext()):
                barrier.wait()
                for k in range(rows.shape[0]):
                    h, logits = r.step(s, rows[k, s])
                    got[s].append((h.clone(), logits.clone()))
                r.decoding(s, False)
                if stream is not None:
                    stream.synchronize()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
    threads = [threading.Thread(target=member, args=(s,)) for s in active]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return got


def _same(want, got, stores_a, stores_b, members):
    for s in members:
        for k, (w, g) in enumerate(zip(want[s], got[s])):
            assert torch.equal(w[0], g[0]) and torch.equal(w[1], g[1]), (s, k)
        a, b = stores_a[s], stores_b[s]
        n = a.length
        assert b.length == n and torch.equal(a.k_buf[:, :, :n], b.k_buf[:, :, :n]), s
        assert torch.equal(a.v_buf[:, :, :n], b.v_buf[:, :, :n]), s


@pytest.mark.bits
@pytest.mark.parametrize("n", [2, 3])
def test_members_stepping_together_get_their_own_bits_in_rounds(model, n, one_torch_thread):
    rows = _rows(model, n, 14, 5)                 # 14 steps: the stores (room 16) grow on the way
    want, ref = _reference(model, n, rows, 40, range(n))
    stores = _stores(model, n, 40)
    r = _rounds(model, stores)
    got = _run_members(r, rows, range(n))
    _same(want, got, ref, stores, range(n))
    assert r.rounds > 0 and not r.errors and r.admitted() == (True, f"{n}: checked")


@pytest.mark.bits
def test_a_member_not_decoding_sits_the_rounds_out_untouched(model, one_torch_thread):
    rows = _rows(model, 3, 6, 6)
    want, ref = _reference(model, 3, rows, 50, [0, 2])
    stores = _stores(model, 3, 50)
    idle = (stores[1].k_buf.clone(), stores[1].v_buf.clone(), stores[1].length)
    r = _rounds(model, stores)
    got = _run_members(r, rows, [0, 2])
    _same(want, got, ref, stores, [0, 2])
    cap = stores[1].capacity
    assert stores[1].length == idle[2] and torch.equal(stores[1].k_buf[:, :, :cap], idle[0][:, :, :cap])
    assert r.rounds > 0


def test_a_decoding_member_that_never_comes_holds_a_round_back_only_wait_s(model, one_torch_thread):
    rows = _rows(model, 2, 3, 7)
    want, ref = _reference(model, 2, rows, 60, [0])
    stores = _stores(model, 2, 60)
    r = _rounds(model, stores, wait_s=0.01)
    r.decoding(1, True)                               # marked, but never steps
    got = _run_members(r, rows[:, :1], [0])
    _same(want, got, ref, stores, [0])
    assert r.solo_steps == 3 and r.rounds == 0        # each round fired alone after wait_s


@pytest.mark.parametrize("why", ["refused", "not shared", "fails"])
def test_rounds_that_cannot_run_step_each_member_alone_with_the_same_bits(model, why, monkeypatch,
                                                                          one_torch_thread):
    rows = _rows(model, 2, 4, 8)
    want, ref = _reference(model, 2, rows, 70, range(2))
    stores = _stores(model, 2, 70)
    check = (lambda n: (False, "the device's check refused 2")) if why == "refused" else (lambda n: (True, "ok"))
    if why == "fails":
        def broken(self, embeds, present=None):
            raise RuntimeError("planted")
        monkeypatch.setattr(group_graphs.GroupGraphs, "forward", broken)
    r = _rounds(model, stores, check=check, allow=(lambda: False) if why == "not shared" else None)
    got = _run_members(r, rows, range(2))
    _same(want, got, ref, stores, range(2))
    assert r.rounds == 0 and r.solo_steps >= 8 - (why == "fails") * 4
    assert (r.errors and r.errors[0] == "RuntimeError: planted") if why == "fails" else not r.errors
    if why == "refused":
        assert r.admitted() == (False, "the device's check refused 2")


def test_membership_refuses_a_store_without_a_sink_and_a_full_group(model):
    stores = _stores(model, 3, 80)
    r = LLMRounds(model, CPU, {}, lambda n: (True, ""), slots=2, graphs=False)
    with pytest.raises(ValueError, match="needs an LLM store with a sink"):
        r.join(9, _stores(model, 1, 90, sink=False)[0], lambda e: None)
    assert r.join(0, stores[0], lambda e: None) == "one member steps its own graphs"
    r.join(1, stores[1], lambda e: None)
    with pytest.raises(ValueError, match="full"):
        r.join(2, stores[2], lambda e: None)
    r.leave(1)
    assert r.report()["members"] == 1
    with pytest.raises(KeyError):
        r.step(1, torch.zeros(1, model.d.hidden, dtype=DT))


def test_a_backbone_moves_its_llm_store_into_one_with_a_sink_bit_for_bit(one_torch_thread):
    """Joining rounds (engine/host/llm_rounds.py) first gives the session's LLM store a sink: the history moves
    bit for bit, the LLM graphs over the old storage are dropped, a second call changes nothing; a stock-policy
    store cannot have one."""
    from engine.backbones.base import TokenFormat, make_backbone
    b = make_backbone("minicpm-o-4.5", TokenFormat(1, 6561, 25.0), size="tiny", device="cpu", seed=4)
    b.start()
    old = b.kv_llm
    k0, v0 = old.export()
    assert old.sink is None and b.ensure_llm_sink()
    new = b.kv_llm
    assert new is not old and new is b.protocol.kv_llm and new.sink == new.capacity == old.capacity
    k1, v1 = new.export()
    assert torch.equal(k0, k1) and torch.equal(v0, v1) and new.length == old.length
    assert b.llm_graphs is None and b.llm_exact is None
    assert b.ensure_llm_sink() and b.kv_llm is new
    stock = make_backbone("minicpm-o-4.5", TokenFormat(1, 6561, 25.0), size="tiny", device="cpu", seed=4,
                          demand_sized=False)
    stock.start()
    assert not stock.ensure_llm_sink() and stock.kv_llm.kind != "demand"


def test_a_members_store_moves_only_between_group_steps(model, one_torch_thread):
    """A member's store may grow on its own thread while another member leads a group step that writes it (its
    sink): the move waits for the rounds' step lock (on the GPU also for the last step's end on the device), so the
    old storage is never let go under a step in flight. Members get the guard when they join and lose it when they
    leave."""
    stores = _stores(model, 2, 100)
    r = _rounds(model, stores)
    assert all(st.move_guard is not None for st in stores)
    moved = threading.Event()
    with r.steps:                                     # a group step launching
        t = threading.Thread(target=lambda: (stores[1]._room(stores[1].capacity + 1), moved.set()))
        t.start()
        assert not moved.wait(0.3)                    # the move waits for the step
    t.join(10)
    assert moved.is_set() and stores[1].grown == 1
    r.leave(1)
    assert stores[1].move_guard is None and stores[0].move_guard is not None


@pytest.mark.bits
def test_a_store_that_moves_after_the_capture_is_captured_again_before_the_step(model, monkeypatch, one_torch_thread):
    """Between the group's capture and its launch (the step lock is let go in between) a member's store moves: the
    leader sees it (``valid_for``) and captures again; every member still gets its own bits."""
    rows = _rows(model, 2, 3, 9)
    want, ref = _reference(model, 2, rows, 110, range(2))
    stores = _stores(model, 2, 110)
    r = _rounds(model, stores)
    made, recapture = [], LLMRounds._recapture

    def then_move(self, sts):
        recapture(self, sts)
        made.append(self.group)
        if len(made) == 1:
            stores[1]._room(stores[1].capacity + 1)  # what a member's own thread may do right here
    monkeypatch.setattr(LLMRounds, "_recapture", then_move)
    got = _run_members(r, rows, range(2))
    _same(want, got, ref, stores, range(2))
    assert len(made) >= 2 and made[0] is not made[1] and stores[1].grown >= 1 and r.rounds > 0


def absent_member_moves(model, dev, check=None, verdicts=None):
    """Members 0 and 1 meet in rounds while member 2 (a member, not decoding) runs its own steps on its own thread
    (and stream, on CUDA), its store moving twice; every member's results and store equal its own steps'.
    ``check(rounds)``: the size check to use (None: admit every size); ``verdicts``: the GEMM row verdicts (None: the
    device's)."""
    rows = _rows(model, 3, 30, 6, dev)
    want, ref = _reference(model, 3, rows, 60, range(3), dev)
    stores = _stores(model, 3, 60, dev=dev)
    r = _rounds(model, stores, dev=dev, verdicts=verdicts)
    if check is not None:
        r.check, r._checked = check(r), {}
    own, errors = [], []

    def alone():
        stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        step = _solo(model, stores[2], dev)
        try:
            with torch.no_grad(), (torch.cuda.stream(stream) if stream else contextlib.nullcontext()):
                for k in range(rows.shape[0]):
                    h, logits = step(rows[k, 2])
                    own.append((h.clone(), logits.clone()))
                if stream is not None:
                    stream.synchronize()
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
    t = threading.Thread(target=alone)
    t.start()
    got = _run_members(r, rows, [0, 1])
    t.join(120)
    assert not errors, errors
    got[2] = own
    _same(want, got, ref, stores, range(3))
    assert stores[2].grown >= 2 and not r.errors, (stores[2].grown, r.errors)
    return r


@pytest.mark.bits
def test_an_absent_member_moves_its_own_store_while_the_others_meet(model, one_torch_thread):
    """On the CPU (eager): the rounds' writes to an absent member's sink and its own steps and moves on its own
    thread leave every member its own bits (the GPU test adds streams and captures)."""
    r = absent_member_moves(model, CPU, verdicts=PER_ROW)
    assert r.rounds > 0
