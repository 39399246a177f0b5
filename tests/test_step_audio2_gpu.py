"""On the GPU: ours == the stock Step-Audio2 package (torch.equal) with real graph capture/replay.

Run on a GPU: ``pytest -q tests/test_step_audio2_gpu.py``.
"""
import numpy as np
import pytest
import torch

import oracles

from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.stream import synthesize
from engine.models.step_audio2.tail import StepAudio2Tail
from engine.core.toggles import Toggles

pytestmark = [pytest.mark.gpu, pytest.mark.oracle]
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
oracles.require_module(oracles.STEPAUDIO2)
import stock_step_audio2 as S  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def exact_math():
    # the same settings for both sides; deterministic cuDNN algorithms (the HiFT's transposed convs may
    # otherwise use atomics, and then not even the stock package repeats its own bits)
    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


@pytest.fixture(scope="module")
def case():
    return S.make_case("oracle", prompt_tokens=37, n_tokens=160)


@pytest.fixture(scope="module")
def stock(case):
    return S.stock_outputs(case, "cuda")


@pytest.mark.parametrize("mode", ["stock", "demand", "graphs"])
def test_every_mode_is_bit_identical_to_the_stock_package_on_cuda(case, stock, mode):
    model = W.build(case.cfg, case.state, "cuda")
    ours = synthesize(model, case.prompt, case.tokens, mode, case.seed)
    S.assert_chunks_equal(ours, stock)


def test_faster_paths_on_and_off_are_both_bit_identical(case, stock):
    """Graphs with every checked faster path (lanes, fused elementwise, channels-last convs where the
    self-check chose them) and graphs on the reference paths; the verdicts name every path and length."""
    on = W.build(case.cfg, case.state, "cuda")
    S.assert_chunks_equal(synthesize(on, case.prompt, case.tokens, "graphs", case.seed), stock)
    off = W.build(case.cfg, case.state, "cuda").use_reference_paths()
    S.assert_chunks_equal(synthesize(off, case.prompt, case.tokens, "graphs", case.seed), stock)
    lines = [v.line() for v in on.verdicts()]
    print("\n".join(lines))
    assert any("DiT parallel lanes (50 frames)" in x for x in lines) and any("HiFT" in x for x in lines)
    assert not any(v.chosen for v in off.verdicts())


def test_live_tail_with_toggles_flipping_mid_stream_is_bit_identical(case, stock):
    model = W.build(case.cfg, case.state, "cuda")
    tail = StepAudio2Tail(model, case.prompt, "oracle", synthetic=True, mode="graphs")
    tail.start(seed=case.seed)
    plan = [dict(graph_replay=True), dict(demand_sized=False), dict(demand_sized=True, graph_replay=False),
            dict(graph_replay=True), {}, {}]
    out, asked = [], Toggles.from_mode("graphs")
    for i in range(0, len(case.tokens), 25):
        asked = asked.merged(**plan[(i // 25) % len(plan)])       # each change on top of the last request
        tail.set_toggles(asked)
        out.append(tail.push(torch.tensor(case.tokens[i:i + 25]).view(1, -1)))
    out.append(tail.flush())
    assert np.array_equal(np.concatenate(out), np.concatenate(stock))


def test_released_dims_graphs_bit_identical_on_cuda():
    case = S.make_case("released", prompt_tokens=75, n_tokens=131, seed=5)
    ref = S.stock_outputs(case, "cuda")
    model = W.build(case.cfg, case.state, "cuda")
    S.assert_chunks_equal(synthesize(model, case.prompt, case.tokens, "graphs", case.seed), ref)


def test_a_chunked_stream_s_last_chunk_replays_the_graph_prepared_at_start():
    """MiniCPM-o's chunking (a p99 second's cause): a turn's usual last chunk (the lookahead's 3 tokens, the state
    settled) replays the graph the tail captured at start, on the live executor, with no capture in it, and the
    stream stays the stock package's fed as MiniCPM-o's loop feeds it, bit for bit (153 tokens: 6 full chunks of
    25 + 3, then the last 3 alone)."""
    from engine.models import registry
    case = S.make_case("oracle", prompt_tokens=37, n_tokens=153, seed=11)
    t = case.tokens
    ref = S.stock_outputs(case, "cuda", chunks=[(t[25 * i:25 * i + 28], False) for i in range(6)] + [(t[150:], True)])
    model = W.build(case.cfg, case.state, "cuda")
    tail = StepAudio2Tail(model, case.prompt, "oracle", synthetic=True, mode="graphs")
    tail.chunking = registry.get_backbone("minicpm-o-4.5").tail_chunking
    tail.start(seed=case.seed)
    ex = tail.executor
    out, i = [], 0
    for n in (28, 25, 25, 25, 25, 25):
        out.append(tail.push(torch.tensor(case.tokens[i:i + n]).view(1, -1)))
        i += n
    captures, replays = ex.stats.captures, ex.stats.replayed_steps
    out.append(tail.flush())
    assert tail.executor is ex and ex.stats.captures == captures and ex.stats.replayed_steps == replays + 1
    assert np.array_equal(np.concatenate(out), np.concatenate(ref))
