"""Mimi on the engine == moshi's own streaming decode, bit for bit (CPU; moshi is a test-only oracle)."""
import numpy as np
import pytest
import torch

import oracles
import stock_mimi
from engine.models.mimi import weights as W
from engine.models.mimi.config import RELEASED, TINY, with_context
from engine.models.mimi.model import MimiDecoder
from engine.models.mimi.tail import MimiTail

pytestmark = [pytest.mark.oracle, pytest.mark.usefixtures("one_torch_thread"), oracles.needs(oracles.MOSHI)]


def _codes(cfg, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.bins, (k, n), generator=g)


def _ours_by_tail(cfg, state, codes, chunks, **toggles):
    tail = MimiTail(MimiDecoder(cfg).load_moshi_state(state), "cpu", codes.shape[0], size="test", **toggles)
    tail.start()
    out, i = [], 0
    for c in chunks:
        out.append(tail.push(codes[:, i:i + c]))
        i += c
    out.append(tail.flush())
    return torch.from_numpy(np.concatenate(out)), tail


@pytest.mark.parametrize("k", [8, 32])
def test_tiny_equals_moshi_ring_wraps(k):
    # context 10 steps at 25 Hz: the ring wraps after 5 frames, 40 frames wrap it 8 times
    state = W.random_state(TINY, seed=k)
    codes = _codes(TINY, k, 40, seed=100 + k)
    ref = stock_mimi.stream_decode(stock_mimi.build(TINY, state, num_codebooks=k), codes).reshape(-1)
    # pushes of odd sizes: the tail buffers frames and decodes whole seconds (12, 13, 12), then flushes 3
    ours, tail = _ours_by_tail(TINY, state, codes, [5, 9, 1, 20, 5])
    # the last 3 frames ran as the last step of a finite plan (a fresh executor over the same state)
    assert tail.executor.k == 4 and tail.executor.stats.eager_steps == 1
    assert ours.shape == ref.shape == (40 * TINY.frame_size,)
    assert torch.equal(ours, ref)


def test_the_released_ring_of_250_steps_wraps_and_equals_moshi():
    """The released context (250 steps at 25 Hz: 10 s) at tiny widths. 150 frames are 300 steps: from frame
    125 on every new key/value overwrites the oldest slot and the attention window slides over the wrap;
    every sample equals moshi's RingKVCache decode, with the demand arena and with the stock one."""
    cfg = with_context(TINY, RELEASED.context)
    assert cfg.context == 250 and cfg.upsample_stride == 2
    state = W.random_state(cfg, seed=9)
    codes = _codes(cfg, 8, 150, seed=10)
    ref = stock_mimi.stream_decode(stock_mimi.build(cfg, state, num_codebooks=8), codes).reshape(-1)
    for demand in (True, False):
        ours, tail = _ours_by_tail(cfg, state, codes, [150], demand_sized=demand)
        assert ours.shape == ref.shape == (150 * cfg.frame_size,)
        assert torch.equal(ours[:125 * cfg.frame_size], ref[:125 * cfg.frame_size]), "before the wrap"
        assert torch.equal(ours, ref), f"after the ring wrapped (demand_sized={demand})"


def test_stock_arena_equals_demand_arena_and_moshi_tiny():
    state = W.random_state(TINY, seed=5)
    codes = _codes(TINY, 8, 37, seed=6)
    ref = stock_mimi.stream_decode(stock_mimi.build(TINY, state, num_codebooks=8), codes).reshape(-1)
    stock, t1 = _ours_by_tail(TINY, state, codes, [37], demand_sized=False)
    demand, t2 = _ours_by_tail(TINY, state, codes, [37], demand_sized=True)
    assert t1.executor.arena.kind == "stock" and t2.executor.arena.kind == "demand"
    assert torch.equal(stock, ref) and torch.equal(demand, ref)


def test_released_size_equals_moshi_32_codebooks():
    # the one released-size test: 30 frames (seconds of 12 and 13, then 5 flushed)
    state = W.random_state(RELEASED, seed=1)
    codes = _codes(RELEASED, 32, 30, seed=2)
    ref = stock_mimi.stream_decode(stock_mimi.build(RELEASED, state, num_codebooks=32), codes).reshape(-1)
    ours, _ = _ours_by_tail(RELEASED, state, codes, [30])
    assert ref.abs().max() > 1e-3                      # the weights make real signal, not zeros
    assert torch.equal(ours, ref)


def _released_header_only(path) -> None:
    """A .safetensors file whose header lists every released decoder key at its shape, its data a sparse hole
    (the header is all a size check reads; 228 MB of weights take no disk)."""
    import json
    import math
    import struct
    sizes = {"F32": 4}
    entries, offset = {}, 0
    for k, shape in W.decoder_keys(RELEASED).items():
        n = math.prod(shape) * sizes["F32"]
        entries[k] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(entries).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        f.truncate(8 + len(head) + offset)


def test_a_released_checkpoint_under_the_tiny_size_names_the_flag(tmp_path, capsys):
    """--size auto builds the tiny Mimi on a CPU: a released checkpoint is refused in one line that says to give
    --size released (the check reads the header only)."""
    from engine.cli.run import main as run_main
    from engine.wavio import write_wav
    ckpt = tmp_path / "tokenizer-e351c8d8-checkpoint125.safetensors"
    _released_header_only(ckpt)
    with pytest.raises(ValueError, match="holds the released Mimi decoder.*give --size released"):
        W.load_checkpoint(str(ckpt), TINY)
    wav = write_wav(tmp_path / "in.wav", np.zeros(24000, np.float32), 24000)
    rc = run_main(["--input", str(wav), "--output", str(tmp_path / "o.wav"), "--log", str(tmp_path / "log"),
                   "--model", "mimi", "--checkpoint", str(ckpt), "--size", "auto", "--device", "cpu", "--quiet"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 1 and len(err) == 1 and "--size released" in err[0] and "Traceback" not in err[0], err
