"""One LLM step for a group of sessions (``group_graphs.GroupGraphs``; eager here, its captured graphs are the GPU's
test): every session's hidden state, logits and key/value store come out with the bits of its own one-token forward
(:meth:`Qwen3.forward` and its own layer graphs), whichever linears the device's row check lets it batch; sessions
at different lengths (so different RoPE positions and attention lengths), in float32 (the CPU proves no batched
GEMM: every linear row by row) and bfloat16 (all batched); the start-up ``check`` passes, and fails on a planted
error."""
import pytest
import torch

from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45 import group_graphs
from engine.backbones.minicpmo45.group_graphs import LINEARS, GroupGraphs, check
from engine.backbones.minicpmo45.group_graphs import check_rows as _check_rows
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.llm_graphs import LayerGraphs
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.weights import build

PREFIXES = (3, 11, 7, 20)            # each session's history before the step
CPU = torch.device("cpu")

_VERDICTS = {}


def check_rows(model, counts, seed=0):
    """The device's row verdicts, made once per weights, counts and seed (each makes thousands of trials; the
    tests' models of one dtype share their seeded weights)."""
    w = model.model.layers[0].self_attn.q_proj.weight
    key = (w.dtype, tuple(w.shape), float(w.detach().float().sum()), tuple(counts), seed)
    if key not in _VERDICTS:
        _VERDICTS[key] = _check_rows(model, counts, seed=seed)
    return _VERDICTS[key]


def _model(dtype):
    d = preset("tiny").llm
    model = build(Qwen3, d, device="cpu", dtype=dtype).eval()
    seeded_init(model, 21)
    return model, d


def _stores(model, d, dtype, n: int, seed: int):
    """``n`` demand stores, session s holding PREFIXES[s] positions fed from its own seeded embeddings."""
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 32, 64, dtype, "")
    out = []
    with torch.no_grad():
        for s in range(n):
            store = make_store(True, regions[0], d.layers, 64, "cpu")
            g = torch.Generator().manual_seed(seed + s)
            model(torch.randn(PREFIXES[s], d.hidden, generator=g).to(dtype), store)
            out.append(store)
    return out


def _solo(model, stores, embeds):
    with torch.no_grad():
        return [(h, model.logits(h)) for h in (model(embeds[s:s + 1], st) for s, st in enumerate(stores))]


def _setup(sessions: int, dtype, seed: int, rows_seed: int):
    """The model, fresh rows, two identical sets of stores (one stepped alone, one together) and the solo results."""
    model, d = _model(dtype)
    embeds = torch.randn(sessions, d.hidden, generator=torch.Generator().manual_seed(rows_seed)).to(dtype)
    alone, together = _stores(model, d, dtype, sessions, seed), _stores(model, d, dtype, sessions, seed)
    return model, embeds, alone, together, _solo(model, alone, embeds)


def _group_step(model, stores, embeds, verdicts):
    """One eager group step of ``stores``' sessions (a fresh GroupGraphs, as a host makes one per membership)."""
    return GroupGraphs(model, stores, CPU, verdicts, capture=False).forward(embeds)


def _same_store(a, b) -> bool:
    n = a.length
    return (n == b.length and torch.equal(a.k_buf[:, :, :n], b.k_buf[:, :, :n])
            and torch.equal(a.v_buf[:, :, :n], b.v_buf[:, :, :n]))


@pytest.mark.bits
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sessions", [1, 2, 3, 4])
def test_a_group_step_gives_each_session_its_own_bits(sessions, dtype, one_torch_thread):
    model, embeds, alone, together, want = _setup(sessions, dtype, 40, 99)
    verdicts = check_rows(model, range(1, 5), seed=3)
    assert set(verdicts) == set(LINEARS) and all(1 in v for v in verdicts.values())
    with torch.no_grad():
        got = _group_step(model, together, embeds, verdicts)
    for s in range(sessions):
        assert torch.equal(got[s][0], want[s][0]) and torch.equal(got[s][1], want[s][1]), (s, dtype)
        assert _same_store(together[s], alone[s]), s


@pytest.mark.bits
def test_every_linear_one_row_at_a_time_gives_the_same_bits(one_torch_thread):
    """No linear proven at any count (a device where cuBLAS changes kernels with the rows): still exact."""
    model, embeds, alone, together, want = _setup(3, torch.float32, 8, 5)
    with torch.no_grad():
        got = _group_step(model, together, embeds, {name: frozenset({1}) for name in LINEARS})
    assert all(torch.equal(got[s][1], want[s][1]) for s in range(3))


def test_rows_in_another_order_than_their_stores_are_caught(one_torch_thread):
    """The comparison bites: rows handed to the wrong sessions give other logits."""
    model, embeds, alone, together, want = _setup(2, torch.float32, 12, 6)
    with torch.no_grad():
        got = _group_step(model, together, embeds.flip(0), check_rows(model, (1, 2)))
    assert not torch.equal(got[0][1], want[0][1])


def test_the_check_refuses_a_count_whose_rows_differ(monkeypatch, one_torch_thread):
    """A GEMM that rounds its second row differently (as cuBLAS's other kernel does) is refused at that count."""
    model, _ = _model(torch.float32)
    real = torch.nn.functional.linear

    def skewed(x, w, b=None):
        y = real(x, w, b)
        return y + (y.new_zeros(y.shape).index_fill_(0, torch.tensor([1]), 1e-3) if x.shape[0] > 1 else 0)

    monkeypatch.setattr(torch.nn.functional, "linear", skewed)
    verdicts = check_rows(model, (1, 2, 3))
    assert all(v == frozenset({1}) for v in verdicts.values())


def test_one_row_per_session_is_required(one_torch_thread):
    model, d = _model(torch.float32)
    stores = _stores(model, d, torch.float32, 2, 1)
    with pytest.raises(ValueError, match="takes 2 rows, not 3"):
        _group_step(model, stores, torch.zeros(3, d.hidden), {})


def _own(model, stores, rows):
    with torch.no_grad():
        return [LayerGraphs(model, st, CPU, capture=False).forward(rows[s:s + 1]) for s, st in enumerate(stores)]


@pytest.mark.bits
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sessions", [1, 2, 4])
def test_the_group_graphs_give_each_session_its_own_bits(sessions, dtype, one_torch_thread):
    model, d = _model(dtype)
    rows = torch.randn(sessions, d.hidden, generator=torch.Generator().manual_seed(77)).to(dtype)
    alone, together = _stores(model, d, dtype, sessions, 50), _stores(model, d, dtype, sessions, 50)
    want = _own(model, alone, rows)
    verdicts = check_rows(model, range(1, 5), seed=4)
    group = GroupGraphs(model, together, CPU, verdicts, capture=False)
    with torch.no_grad():
        got = group.forward(rows)
        again = _own(model, alone, rows + 1)                   # a second step: the stores moved on alike
        got2 = group.forward(rows + 1)
    for s in range(sessions):
        for w, g in ((want[s], got[s]), (again[s], got2[s])):
            assert torch.equal(w[0], g[0]) and torch.equal(w[1], g[1]), (s, dtype)
        assert _same_store(alone[s], together[s]), s
    assert group.valid_for(together) and not group.valid_for(alone)


def _make_store(model, d, dtype):
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 32, 64, dtype, "")
    return lambda: make_store(True, regions[0], d.layers, 64, "cpu")


@pytest.mark.bits
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_check_passes_where_the_step_keeps_the_bits(dtype, one_torch_thread):
    model, d = _model(dtype)
    verdicts = check_rows(model, range(1, 4), seed=2)
    ok, why = check(model, _make_store(model, d, dtype), CPU, 3, verdicts, graphs=False, seed=5)
    assert ok, why
    assert why.startswith("3 sessions: identical")


def test_the_check_catches_a_row_handed_to_the_wrong_session(monkeypatch, one_torch_thread):
    """Planted: the last graph hands session 0 the final hidden state of row 1. The check must say so."""
    model, d = _model(torch.bfloat16)
    final = group_graphs.group_final

    def swapped(llm, x):
        (h,) = final(llm, x)
        return (h.flip(0),)
    monkeypatch.setattr(group_graphs, "group_final", swapped)
    ok, why = check(model, _make_store(model, d, torch.bfloat16), CPU, 2, check_rows(model, [1, 2]), graphs=False)
    assert not ok and "session 0 of 2" in why and "hidden state or logits differ" in why


def _sink_stores(model, d, dtype, n: int, seed: int):
    """As :func:`_stores`, each with a sink (one position past its room)."""
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 32, 64, dtype, "")
    out = []
    with torch.no_grad():
        for s in range(n):
            store = make_store(True, regions[0], d.layers, 64, "cpu", sink=True)
            g = torch.Generator().manual_seed(seed + s)
            model(torch.randn(PREFIXES[s], d.hidden, generator=g).to(dtype), store)
            out.append(store)
    return out


def test_a_sink_is_one_position_past_the_room_and_moves_with_a_growth():
    d = preset("tiny").llm
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 32, 256, torch.float32, "")
    st = make_store(True, regions[0], d.layers, 8, "cpu", growable=True, sink=True)
    plain = make_store(True, regions[0], d.layers, 8, "cpu")
    assert st.sink == 8 and st.k_buf.shape[2] == 9 and plain.sink is None and plain.k_buf.shape[2] == 8
    assert st.state_bytes() == plain.state_bytes() * 9 // 8           # the sink is counted, not hidden
    st.ensure(12)                                                     # a growth: 16 positions of room + the sink
    assert st.capacity == 16 and st.sink == 16 and st.k_buf.shape[2] == 17


@pytest.mark.bits
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("present", [(True, False, True), (False, True, False, True), (False, False, True)])
def test_members_absent_from_a_round_keep_their_stores_and_the_present_their_bits(present, dtype,
                                                                                  one_torch_thread):
    """A round where some members sit out (listening while the others decode): the present members get their
    own step's bits, two rounds running; an absent member's store is untouched below its sink, its length
    unchanged, and it gets no result. Its row may hold anything (here: large values)."""
    model, d = _model(dtype)
    n = len(present)
    rows = torch.randn(n, d.hidden, generator=torch.Generator().manual_seed(78)).to(dtype)
    rows[[not p for p in present]] = 1e3
    alone, together = _sink_stores(model, d, dtype, n, 60), _sink_stores(model, d, dtype, n, 60)
    before = [(st.k_buf[:, :, :st.capacity].clone(), st.length) for st in together]
    group = GroupGraphs(model, together, CPU, check_rows(model, range(1, 5), seed=4), capture=False)
    with torch.no_grad():
        for step in range(2):
            got = group.forward(rows + step, present)
            for s, p in enumerate(present):
                if not p:
                    assert got[s] is None
                    continue
                want = _own(model, [alone[s]], (rows + step)[s:s + 1])[0]
                assert torch.equal(want[0], got[s][0]) and torch.equal(want[1], got[s][1]), (s, step)
    for s, p in enumerate(present):
        if p:
            assert _same_store(alone[s], together[s]), s
        else:
            k0, n0 = before[s]
            assert together[s].length == n0 and torch.equal(together[s].k_buf[:, :, :together[s].capacity], k0)


def test_a_round_refuses_an_absent_member_without_a_sink_and_an_empty_round(one_torch_thread):
    model, d = _model(torch.float32)
    stores = _stores(model, d, torch.float32, 2, 1)
    group = GroupGraphs(model, stores, CPU, {}, capture=False)
    with pytest.raises(ValueError, match="needs a store with a sink"):
        group.forward(torch.zeros(2, d.hidden), [True, False])
    with pytest.raises(ValueError, match="a member present"):
        group.forward(torch.zeros(2, d.hidden), [False, False])
    with pytest.raises(ValueError, match="one flag per member"):
        group.forward(torch.zeros(2, d.hidden), [True])


def test_the_check_with_members_absent_passes_and_catches_a_write_past_the_sink(monkeypatch, one_torch_thread):
    """The start-up check with a member sitting out passes; planted: absent rows written at the member's length
    instead of its sink (the race the sink exists for) — the check must name that member."""
    model, d = _model(torch.bfloat16)
    regions = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 32, 64, torch.bfloat16, "")
    sinks = lambda: make_store(True, regions[0], d.layers, 64, "cpu", sink=True)     # noqa: E731
    verdicts = check_rows(model, [1, 2, 3])
    ok, why = check(model, sinks, CPU, 3, verdicts, graphs=False, seed=9, absent=[1])
    assert ok and "1 sitting the round out untouched" in why, why
    real = GroupGraphs._set_positions
    monkeypatch.setattr(GroupGraphs, "_set_positions", lambda self, here=None: real(self, None))
    ok, why = check(model, sinks, CPU, 3, verdicts, graphs=False, seed=9, absent=[1])
    assert not ok and why.startswith("session 1 of 3: absent from the round"), why


def test_a_row_count_whose_gemm_differs_once_in_many_trials_is_refused(monkeypatch):
    """A GEMM of several rows whose kernel sums in another order than one row alone rounds to the same bf16 nearly
    always (a CPU's 3-row bf16 GEMM of a 32-wide weight: about once in 10^5 outputs), so the verdict runs trials
    until ``ROW_CHECK_ELEMENTS`` outputs are compared. With a GEMM that is row by row by construction every count
    passes; a planted difference in one output of the 40th 3-row trial of one weight is caught, and nothing else
    changes. (The machine's own GEMMs are left out: which counts they keep differs between CPUs.)"""
    from engine.backbones.minicpmo45 import group_graphs as G
    model, _ = _model(torch.bfloat16)
    w_gate = model.model.layers[0].mlp.gate_proj.weight
    seen = {"n": 0}

    def rowwise(x, w, b=None):
        return torch.cat([(x[i:i + 1].float() @ w.float().t()).to(x.dtype) for i in range(x.shape[0])])

    def planted(x, w, b=None):
        y = rowwise(x, w)
        if w is w_gate and x.shape[0] == 3:
            seen["n"] += 1
            if seen["n"] == 40:
                y.view(-1)[5] += 1
        return y
    monkeypatch.setattr(G.F, "linear", rowwise)
    before = G.check_rows(model, [1, 3], seed=9)
    assert G.row_trials(3, w_gate.shape[0]) >= 40 and all(v == frozenset({1, 3}) for v in before.values())
    monkeypatch.setattr(G.F, "linear", planted)
    after = G.check_rows(model, [1, 3], seed=9)
    assert after["gate_proj"] == frozenset({1}) and seen["n"] >= 40
    assert {k: v for k, v in after.items() if k != "gate_proj"} == {k: v for k, v in before.items() if k != "gate_proj"}
