"""Streaming blocks are reusable: a block declares its regions under short names, and any decoder can
mount it under a prefix of its own choosing, once or several times.

Step-Audio2's HiFT vocoder and conformer encoder, and the Nemotron codec's causal ConvNeXt block, are
each mounted twice in one host model (two voices sharing weights, under ``a`` and ``b``) and run through
the executor; every output and every final state equals (torch.equal) the same block run on its own,
unprefixed, in a host of its own, with the same inputs and the random draws taken in the same order.
Both arenas (demand-sized and stock-like).
"""
from typing import Dict, List, Sequence

import pytest
import torch

from engine.core import (STILL, Clock, Executor, PrefixWindow, SessionSpec, StreamingModel, make_plan,
                         prefixed)
from engine.models.nemotron_codec import weights as NW
from engine.models.nemotron_codec.config import TINY as CODEC
from engine.models.nemotron_codec.model import NemotronCodecDecoder
from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.config import LOOKAHEAD, WINDOW, preset

TINY = preset("tiny")
MEL = Clock("mel", (50,), rate_hz=50.0)
T0 = CODEC.columns_per_frame()[0]                        # the codec's first stage: columns per frame
COLS = Clock("cols", (12 * T0, 13 * T0), rate_hz=12.5 * T0)
CHUNK = 25 + LOOKAHEAD                               # tokens a chunk feeds the encoder (lookahead included)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return W.build(TINY, W.random_state_dict(TINY, seed=4), "cpu")


class _Voices(StreamingModel):
    """A host holding one block mounted under each of ``prefixes`` ("" = the block on its own)."""

    def __init__(self, block: torch.nn.Module, prefixes: Sequence[str], kind: str):
        super().__init__()
        self.block, self.prefixes, self.kind = block, tuple(prefixes), kind

    def _name(self, p: str) -> str:
        return f"{p}.att" if p else "att"

    def regions(self, spec=None):
        regs = []
        for p in self.prefixes:
            if self.kind == "hift":
                own = self.block.regions(STILL)
            elif self.kind == "convnext":
                own = self.block.regions(COLS)
            else:
                own = self.block.regions(MEL, PrefixWindow(WINDOW))
            regs += prefixed(p, own)
        return regs

    def init_state(self, state, prompt: Dict[str, torch.Tensor]) -> None:
        for p in self.prefixes:
            if self.kind == "encoder":
                self.block.prefill(prompt[p], state.under(p))

    def step(self, state, inputs, plan):
        out = {}
        for p in self.prefixes:
            x, first, last = inputs[p], plan.index == 0, plan.is_last
            if self.kind == "hift":
                out[p] = self.block.stream(state.under(p), x, first, last)
            elif self.kind == "convnext":
                out[p] = self.block.second(x, state.under(p), frames=True)
            else:
                out[p] = self.block.stream(x, last, state.under(p), plan.before[self._name(p)])
        return out


def _final_state(ex: Executor, prefix: str) -> Dict[str, torch.Tensor]:
    return {k: ex.state.under(prefix)[k].get().clone() for k in ex.state.under(prefix)}


def _interleaved(make, streams: Sequence[str], inputs: List[Dict[str, torch.Tensor]], prompt):
    """Each stream through its own host (block unprefixed), stepped a, b, a, b ... as the shared host runs them."""
    exs = {s: make(s) for s in streams}
    for s, ex in exs.items():
        ex.init_state({"": prompt[s]} if prompt else None)
    outs = [{s: exs[s].step({"": x[s]})[""] for s in streams} for x in inputs]
    return outs, {s: _final_state(exs[s], "") for s in streams}


def _assert_same(two_outs, two_ex, ref_outs, ref_states, streams):
    for got, want in zip(two_outs, ref_outs):
        for s in streams:
            assert torch.equal(got[s], want[s])
    for s in streams:
        mine = _final_state(two_ex, s)
        assert sorted(mine) == sorted(ref_states[s])
        for k in mine:
            assert torch.equal(mine[k], ref_states[s][k]), f"{s}.{k}"


@pytest.mark.parametrize("demand", [True, False], ids=["demand", "stock-like"])
def test_hift_block_under_two_prefixes_equals_the_block_on_its_own(tiny, demand):
    hift, streams = tiny.hift, ("a", "b")
    g = torch.Generator().manual_seed(11)
    frames = [50, 50, 50]                                              # first, steady, last chunk
    inputs = [{s: torch.randn(1, TINY.hift.in_channels, n, generator=g) for s in streams} for n in frames]
    spec = SessionSpec(steps=len(frames))
    two = _Voices(hift, streams, "hift")
    assert [r.name for r in two.regions()] == ["a.mel", "a.source", "a.speech", "b.mel", "b.source", "b.speech"]
    torch.manual_seed(5)
    ex = Executor(two, make_plan(two.regions(spec), spec), "cpu", demand_sized=demand)
    ex.init_state()
    two_outs = [ex.step(x) for x in inputs]

    def make(_):
        one = _Voices(hift, ("",), "hift")
        return Executor(one, make_plan(one.regions(spec), spec), "cpu", demand_sized=demand)
    torch.manual_seed(5)
    ref_outs, ref_states = _interleaved(make, streams, inputs, None)
    _assert_same(two_outs, ex, ref_outs, ref_states, streams)
    assert not torch.equal(two_outs[1]["a"], two_outs[1]["b"])        # two voices, two states


@pytest.mark.parametrize("demand", [True, False], ids=["demand", "stock-like"])
def test_encoder_block_under_two_prefixes_with_different_prompts(tiny, demand):
    enc, streams = tiny.flow.encoder, ("a", "b")
    c = TINY.flow.encoder.input_size
    g = torch.Generator().manual_seed(12)
    prompt_tokens = {"a": 3, "b": 7}                                   # different prefixes per mount
    prompt = {s: torch.randn(1, n + LOOKAHEAD, c, generator=g) for s, n in prompt_tokens.items()}
    last_tokens = 9
    counts = [CHUNK, CHUNK, CHUNK, last_tokens]                        # start-up, steady (window full), last
    inputs = [{s: torch.randn(1, n, c, generator=g) for s in streams} for n in counts]
    steps = len(counts)

    def spec_for(names):
        return SessionSpec(steps=steps, prefix={names[s]: 2 * prompt_tokens[s] for s in names},
                           last_advance={"mel": 2 * last_tokens})
    two = _Voices(enc, streams, "encoder")
    spec = spec_for({"a": "a.att", "b": "b.att"})
    assert sorted(r.name for r in two.regions(spec)) == ["a.att", "a.cnn", "b.att", "b.cnn"]
    ex = Executor(two, make_plan(two.regions(spec), spec), "cpu", demand_sized=demand)
    ex.init_state(prompt)
    two_outs = [ex.step(x) for x in inputs]

    def make(s):
        one = _Voices(enc, ("",), "encoder")
        sp = SessionSpec(steps=steps, prefix={"att": 2 * prompt_tokens[s]}, last_advance={"mel": 2 * last_tokens})
        return Executor(one, make_plan(one.regions(sp), sp), "cpu", demand_sized=demand)
    ref_outs, ref_states = _interleaved(make, streams, inputs, prompt)
    _assert_same(two_outs, ex, ref_outs, ref_states, streams)
    assert two_outs[-1]["a"].shape[1] == 2 * last_tokens
    assert ex.state["a.att"].get().shape[3] == 2 * prompt_tokens["a"] + WINDOW
    assert ex.state["b.att"].get().shape[3] == 2 * prompt_tokens["b"] + WINDOW


@pytest.mark.parametrize("demand", [True, False], ids=["demand", "stock-like"])
def test_codec_convnext_block_under_two_prefixes(demand):
    codec = NemotronCodecDecoder(CODEC)
    NW.load_into(codec, NW.check_state(NW.random_state(CODEC, 5), CODEC, "test"))
    block, streams = codec.stages[0][1], ("a", "b")                    # stage 0, block 1: [n, C, T0] a second
    c = block.dim
    g = torch.Generator().manual_seed(13)
    inputs = [{s: torch.randn(n, c, T0, generator=g) for s in streams} for n in (12, 13, 12)]
    spec = SessionSpec(steps=len(inputs))
    two = _Voices(block, streams, "convnext")
    assert [r.name for r in two.regions()] == ["a.history", "b.history"]
    ex = Executor(two, make_plan(two.regions(spec), spec), "cpu", demand_sized=demand)
    ex.init_state()
    two_outs = [ex.step(x) for x in inputs]

    def make(_):
        one = _Voices(block, ("",), "convnext")
        return Executor(one, make_plan(one.regions(spec), spec), "cpu", demand_sized=demand)
    ref_outs, ref_states = _interleaved(make, streams, inputs, None)
    _assert_same(two_outs, ex, ref_outs, ref_states, streams)
    assert not torch.equal(ex.state["a.history"].get(), ex.state["b.history"].get())

