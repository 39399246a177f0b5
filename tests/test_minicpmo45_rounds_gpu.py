"""LLM rounds on CUDA (engine/backbones/minicpmo45/rounds.py, tiny sizes, bf16): the members step from their own threads
on their own streams, the group step is captured, their stores grow on the way, and a member absent from the rounds
feeds and grows its own store on its own stream meanwhile (its sink written by the rounds). Every member's hidden
states, logits and store equal its own captured layer-graph steps one after another, bit for bit. The device's own
start-up check (``group_graphs.check``) admits or refuses each size; refused, the members step alone — the same bits
either way. What the CPU tests cannot see: the events between streams, the next leader on another stream, and a store
that moves while another thread's group step may still write its sink."""
from __future__ import annotations

import pytest
import torch

from engine.backbones.minicpmo45 import group_graphs
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import pin_attention_kernels, seeded_init
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.weights import build

from tests.test_minicpmo45_rounds import DT, _reference, _rounds, _rows, _run_members, _same, _stores, absent_member_moves

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="LLM rounds' streams and captures need CUDA")]
DEV = torch.device("cuda") if torch.cuda.is_available() else None


@pytest.fixture(scope="module")
def model():
    pin_attention_kernels("cuda")                     # as the backbone's build does
    m = build(Qwen3, preset("tiny").llm, device="cuda", dtype=DT).eval()
    seeded_init(m, 31)
    return m


def _device_check(model, verdicts):
    d = model.d
    region = kv_regions("llm", d.layers, d.kv_heads, d.head_dim, 32, 64, DT, "")[0]
    fresh = lambda: make_store(True, region, d.layers, 64, DEV, sink=True)          # noqa: E731
    return lambda n: group_graphs.check(model, fresh, DEV, n, verdicts, graphs=True, seed=n,
                                        absent=[n - 1] if n > 2 else [])


@pytest.mark.parametrize("n", [2, 4])
def test_members_on_their_own_streams_get_their_own_bits(model, n):
    rows = _rows(model, n, 14, 5, DEV)               # 14 steps from room 16: every store moves on the way
    want, ref = _reference(model, n, rows, 40, range(n), DEV)
    stores = _stores(model, n, 40, dev=DEV)
    r = _rounds(model, stores, dev=DEV)
    r.check = _device_check(model, r.verdicts)
    r._checked.clear()
    ok, why = r.admitted()
    got = _run_members(r, rows, range(n))
    _same(want, got, ref, stores, range(n))
    assert not r.errors, r.errors
    assert (r.rounds > 0) if ok else (r.rounds == 0), (ok, why, r.report())
    assert all(st.grown >= 1 for st in stores)


def test_an_absent_member_moves_its_own_store_while_the_others_meet(model):
    """Members 0 and 1 meet in rounds; member 2 (a member, not decoding) runs its own captured steps on its own
    stream at the same time, its store moving twice: the rounds write its sink meanwhile, its moves wait for the
    rounds' step and the last step's end on the device."""
    absent_member_moves(model, DEV, lambda r: _device_check(model, r.verdicts))
