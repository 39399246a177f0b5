"""Mimi on the engine without the oracle: plan and clocks, loading, tail bookkeeping, synth CLI."""
import numpy as np
import pytest
import torch

import oracles

from engine.cli import synth as synth_cli
from engine.models import registry
from engine.models.mimi import weights as W
from engine.models.mimi.config import RELEASED, TINY, with_context
from engine.models.mimi.model import MimiDecoder
from engine.models.mimi.tail import MimiTail, check_codes, make_tail
from engine.core.toggles import Toggles


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _codes(k, n, seed=0, cfg=TINY):
    return torch.randint(0, cfg.bins, (k, n), generator=torch.Generator().manual_seed(seed))


def test_seconds_alternate_12_and_13_frames_starting_with_12():
    assert RELEASED.seconds_pattern() == (12, 13)
    assert [RELEASED.frames_before(k) for k in range(5)] == [0, 12, 25, 37, 50]   # floor(12.5 k)
    assert RELEASED.frame_size == 1920 and RELEASED.upsample_stride == 2


def test_released_plan_two_signatures_and_stock_sizes():
    plan = registry.get("mimi").plan(size="released")
    assert len(plan.signatures) == 2 and plan.period == 2
    assert [plan.step(k).advances["frames"] for k in range(4)] == [12, 13, 12, 13]
    assert [plan.step(k).advances["24000hz"] for k in range(2)] == [23040, 24960]
    assert plan.demand["tr.kv0"] == 250 and plan.region("tr.kv0").shape_at(250) == (2, 1, 8, 250, 64)
    assert plan.demand["dec.stage0.partial"] == 8 and plan.demand["dec.conv_in"] == 6
    assert sum(plan.demand_bytes().values()) == sum(plan.stock_bytes().values())


def test_last_partial_second_plan():
    m = MimiDecoder(TINY)
    from engine.core import make_plan
    plan = make_plan(m.regions(), m.spec(steps=3, last_frames=5))
    assert [s.advances["frames"] for s in plan.timeline] == [12, 13, 5]
    assert plan.timeline[-1].advances["steps25"] == 10


def test_checkpoint_roundtrip_alias_and_errors(tmp_path):
    state = W.random_state(TINY, seed=3)
    codes = _codes(8, 14, seed=4)
    path = str(tmp_path / "mimi.safetensors")
    # the released file names attention projections in_proj_weight / out_proj.weight: accept both
    old = {W._alias(k): v for k, v in state.items()}
    W.save_checkpoint(old, path)
    a = make_tail(size="tiny", checkpoint=path)
    b = MimiTail(MimiDecoder(TINY).load_moshi_state(state), "cpu", 8, size="tiny")
    a.start(), b.start()
    assert not a.info.synthetic_weights and b.info.synthetic_weights
    assert np.array_equal(a.push(codes), b.push(codes))
    bad = dict(state)
    del bad["decoder.model.0.conv.conv.bias"]
    bad["quantizer.rvq_first.output_proj.weight"] = torch.zeros(3, 3, 1)
    with pytest.raises(ValueError, match=r"1 missing key.*decoder\.model\.0\.conv\.conv\.bias") as e:
        W.check_state(bad, TINY)
    assert "mis-shaped" in str(e.value) and "(3, 3, 1), expected (32, 16, 1)" in str(e.value)
    with pytest.raises(ValueError, match="not a Mimi decoder"):
        W.load_checkpoint(path, RELEASED)                 # tiny file, released dims
    with pytest.raises(FileNotFoundError):
        W.load_checkpoint(str(tmp_path / "none.safetensors"), TINY)
    (tmp_path / "x.pt").write_bytes(b"0")
    with pytest.raises(ValueError, match="safetensors"):
        W.load_checkpoint(str(tmp_path / "x.pt"), TINY)
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="cannot read"):
        W.load_checkpoint(str(tmp_path / "junk.safetensors"), TINY)


def test_tail_bookkeeping_and_bad_codes():
    tail = make_tail(size="tiny", seed=1, num_codebooks=8)
    with pytest.raises(RuntimeError, match="start"):
        tail.push(_codes(8, 1))
    tail.start()
    fs = TINY.frame_size
    assert tail.push(_codes(8, 11, 1)).size == 0                  # second 0 needs 12 frames
    assert tail.push(_codes(8, 1, 2)).size == 12 * fs
    assert tail.frames_needed() == 13
    assert tail.push(_codes(8, 27, 3)).size == (13 + 12) * fs     # seconds 1 and 2; 2 frames wait
    assert tail.flush().size == 2 * fs
    with pytest.raises(RuntimeError):
        tail.push(_codes(8, 1))
    for bad, msg in [(np.zeros((7, 3), np.int64), "codebooks=8"), (np.zeros(5, np.int64), "shape"),
                     (np.zeros((8, 2), np.float32), "integers"), (np.full((8, 2), TINY.bins), "lie in")]:
        with pytest.raises(ValueError, match=msg):
            check_codes(bad, 8, TINY.bins)
    with pytest.raises(ValueError, match="num_codebooks"):
        make_tail(size="tiny", num_codebooks=33)


def test_a_streams_first_second_finds_no_layout_on_the_meta_device():
    """The split RVQ's part layouts (found with additions on the meta device, whose first use imports torch's
    meta kernels: ~2 s on a CPU host) are found when the model is built, so no second of a stream pays for it
    (the capacity bench's first stock-like second took 1.5-1.9 s on a CPU host for it)."""
    from engine.models.mimi.modules import part_strides
    tail = make_tail(size="tiny", seed=3, num_codebooks=8)
    tail.start()
    before = part_strides.cache_info().misses
    assert tail.push(_codes(8, 12, 4)).size == 12 * TINY.frame_size
    assert part_strides.cache_info().misses == before


def test_silence_tokens_and_toggles():
    tail = make_tail(size="tiny", seed=2, num_codebooks=8)
    s = tail.silence_tokens(4)
    assert s.shape == (8, 4) and s.dtype == torch.int64 and bool((s[:, :1] == s).all())
    tail.set_toggles(Toggles(demand_sized=False, graph_replay=True))
    tail.start()
    assert tail.toggles() == {"demand_sized": False, "graph_replay": False}   # no CUDA here
    a = tail.push(torch.cat([s, _codes(8, 20, 5)], dim=1))
    tail.set_toggles(Toggles(demand_sized=True, graph_replay=True))   # migrates at the next second
    b = tail.push(_codes(8, 20, 6))
    assert tail.executor.arena.kind == "demand" and tail.state_bytes() > 0
    ref = make_tail(size="tiny", seed=2, num_codebooks=8)
    ref.start()
    r = ref.push(torch.cat([s, _codes(8, 20, 5), _codes(8, 20, 6)], dim=1))
    assert np.array_equal(np.concatenate([a, b]), r)


def test_ring_wrap_at_tiny_context_matches_whole_ring_reference():
    # the first frames' attention must ignore empty slots; a context of 4 steps wraps every 2 frames
    cfg = with_context(TINY, 4)
    state = W.random_state(cfg, seed=9)
    codes = _codes(8, 25, 9)
    outs = []
    for mode in [(True, False), (False, False)]:
        t = MimiTail(MimiDecoder(cfg).load_moshi_state(state), "cpu", 8, demand_sized=mode[0])
        t.start()
        outs.append(np.concatenate([t.push(codes), t.flush()]))
    assert outs[0].shape == (25 * cfg.frame_size,) and np.isfinite(outs[0]).all()
    assert np.array_equal(outs[0], outs[1])


def test_synth_cli(tmp_path, capsys):
    codes = _codes(32, 27, 7).numpy().astype(np.int32)
    np.save(tmp_path / "codes.npy", codes)
    out = tmp_path / "out.npy"
    rc = synth_cli.main(["--model", "mimi", "--size", "tiny", "--codes", str(tmp_path / "codes.npy"),
                         "--out", str(out), "--num-codebooks", "8", "--mode", "demand"])
    assert rc == 0
    wav = np.load(out)
    assert wav.dtype == np.float32 and wav.shape == (27 * TINY.frame_size,)
    assert "27 frames x 8 codebooks" in capsys.readouterr().err
    np.save(tmp_path / "flat.npy", codes[0])
    rc = synth_cli.main(["--model", "mimi", "--size", "tiny", "--codes", str(tmp_path / "flat.npy"),
                         "--out", str(out)])
    assert rc == 1 and "2-D" in capsys.readouterr().err


@pytest.mark.oracle
def test_bench_dry_run_on_cpu_reports_bit_identity(tmp_path):
    from engine.bench import mimi as bench
    oracles.require(oracles.MOSHI)
    out = tmp_path / "b.json"
    assert bench.main(["--size", "tiny", "--seconds", "2", "--warmup", "1", "--device", "cpu", "--repeats", "2",
                       "--json", str(out)]) == 0
    import json
    res = json.loads(out.read_text())
    for mode in ("ours stock-like", "ours demand", "ours graphs", "moshi eager", "moshi graphs"):
        assert res["modes"][mode]["vs_moshi_eager_rope"]["equal"], mode
        assert res["modes"][mode]["seconds_timed"] == 2 and len(res["modes"][mode]["round_medians_ms"]) == 2
        assert res["modes"][mode]["repeats_identical"], mode
    assert res["modes"]["moshi graphs"]["moshi_graphs_over_this"] == 1.0
    assert len(res["config"]["fast_paths"]) == 6 and res["config"]["chosen_order"] == "frame-major (the reference)"
    assert res["config"]["frames"] == 25 and res["command"].startswith("duplexcadence-bench mimi")
    md, png = out.with_suffix(".md").read_text(), out.with_suffix(".png").read_bytes()
    assert "| ours graphs" in md and png.startswith(b"\x89PNG")


def test_bench_equality_compares_whole_outputs_and_fails_on_a_length_difference():
    from engine.bench import mimi as bench
    x = torch.randn(1, 1, 4800, generator=torch.Generator().manual_seed(2))
    assert bench._equal(x, x.clone()) == {"equal": True, "max_abs_diff": 0.0}
    short = bench._equal(x[..., :3840], x)                  # the same samples as far as they go, 4 frames short
    assert short == {"equal": False, "max_abs_diff": None, "shapes": [[1, 1, 3840], [1, 1, 4800]]}
    assert not bench._equal(x, x[..., :3840])["equal"]
    assert bench._verdict(short) == "no (shape (1, 1, 3840) vs (1, 1, 4800))"
    off = x.clone()
    off[0, 0, -1] += 0.25                                    # the last sample: a check of a prefix would miss it
    v = bench._equal(off, x)
    assert not v["equal"] and v["max_abs_diff"] == pytest.approx(0.25) and bench._verdict(v) == "no (max 2.50e-01)"
    res = {"modes": {"ours graphs": {"median_ms": 1.0, "p90_ms": 1.0, "vs_moshi_eager_rope": short}}}
    assert "no (shape (1, 1, 3840) vs (1, 1, 4800))" in bench.table(res, wrap=False)


def test_layer_major_second_matches_frame_by_frame():
    # the CUDA order (each layer over the whole second) on CPU: the transformer is bit-exact here too;
    # the SEANet differs only where CPU ELU takes its scalar instead of its vectorized path (layouts)
    from engine.models.mimi.second import seanet_second, transformer_second
    cfg, n = RELEASED, 12
    m = MimiDecoder(cfg).load_moshi_state(W.random_state(cfg, seed=3))
    t = cfg.upsample_stride
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, cfg.dimension, n * t, generator=g)
    caches = [torch.randn(2, 1, cfg.num_heads, cfg.context, cfg.head_dim, generator=g) for _ in range(cfg.num_layers)]
    c2 = [c.clone() for c in caches]
    tab = m.transformer.second_tables(torch.tensor(7), n)
    with torch.no_grad():
        ref = torch.cat([m.transformer.frame(x[..., f * t:(f + 1) * t], caches, tab, f) for f in range(n)], -1)
        out = transformer_second(m.transformer, x.transpose(1, 2), c2, tab, batch_matmul=False).transpose(1, 2)
        assert torch.equal(ref, out) and all(torch.equal(a, b) for a, b in zip(caches, c2))
        regs = {r.name[len("dec."):]: torch.randn(r.shape_at(r.retention.length), generator=g)
                for r in m.regions() if r.name.startswith("dec.")}        # the SEANet block's own names
        regs2 = {k: v.clone() for k, v in regs.items()}
        ref = torch.cat([m.seanet.frame(x[..., f * t:(f + 1) * t].contiguous(), regs.get) for f in range(n)], -1)
        out = seanet_second(m.seanet, x, regs2.get, n, batch_conv=False)
    assert out.shape == (1, 1, n * cfg.frame_size)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    assert all(torch.allclose(regs[k], regs2[k], rtol=0, atol=1e-5) for k in regs)
