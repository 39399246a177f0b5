"""The group step as layer graphs over all sessions' rows (``group_graphs.GroupGraphs``), run eagerly on the CPU:
each session's hidden state, logits and store equal its own one-token layer-graph forward, at 1-4 sessions of
different lengths, in float32 (the CPU proves no batched GEMM: every linear row by row) and bfloat16 (all
batched); the start-up ``check`` passes, and fails on a planted error. The captured graphs are the GPU's test."""
import pytest
import torch

from engine.backbones.minicpmo45 import group_graphs
from engine.backbones.minicpmo45.group_graphs import GroupGraphs, check
from engine.backbones.minicpmo45.group_step import check_rows
from engine.backbones.minicpmo45.llm_graphs import LayerGraphs

from tests.test_minicpmo45_group_step import _model, _same_store, _stores

CPU = torch.device("cpu")


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
    from engine.backbones.minicpmo45.kv import kv_regions, make_store
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
    """Planted: the last graph hands session 0 the head of row 1. The check must say so."""
    model, d = _model(torch.bfloat16)
    final = group_graphs.group_final

    def swapped(llm, x):
        h, logits = final(llm, x)
        return h, logits.flip(0)
    monkeypatch.setattr(group_graphs, "group_final", swapped)
    ok, why = check(model, _make_store(model, d, torch.bfloat16), CPU, 2, check_rows(model, [1, 2]), graphs=False)
    assert not ok and "session 0 of 2" in why and "logits differ" in why


def test_a_row_count_that_does_not_match_the_group_is_refused(one_torch_thread):
    model, d = _model(torch.float32)
    stores = _stores(model, d, torch.float32, 2, 1)
    group = GroupGraphs(model, stores, CPU, check_rows(model, [1, 2]), capture=False)
    with pytest.raises(ValueError, match="takes 2 rows, not 3"):
        group.forward(torch.zeros(3, d.hidden))
