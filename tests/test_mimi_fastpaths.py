"""Mimi's faster orders through the start-up self-check (engine.fastpath): what is chosen, what is
refused and why, the session info, the CLI flag and the app's label (CPU; GPU: test_mimi_gpu.py)."""
import numpy as np
import pytest
import torch

import oracles

import stock_mimi
from engine import fastpath
from engine.models.mimi import fastpaths as FP
from engine.models.mimi import weights as W
from engine.models.mimi.config import TINY
from engine.models.mimi.model import MimiDecoder
from engine.models.mimi.tail import MimiTail

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def fresh(fresh_fastpath):
    yield


def _model(seed=4):
    return MimiDecoder(TINY).load_moshi_state(W.random_state(TINY, seed=seed))


def _codes(n, seed=9, k=8):
    return torch.randint(0, TINY.bins, (k, n), generator=torch.Generator().manual_seed(seed))


def test_cpu_reports_not_applicable_and_keeps_the_reference_order():
    tail = MimiTail(_model(), "cpu", 8, size="tiny")
    assert tail.fast_paths() == []
    tail.start()
    v = tail.fast_paths()
    assert [x.path for x in v] == ["layer-major order", "batched attention", "batched convs",
                                   "batched transposed convs", "strided-batched matmuls", "batched matmuls"]
    assert all(not x.chosen and x.reason.startswith("not applicable: the CPU decodes frame by frame") for x in v)
    assert tail.model.chosen == FP.REFERENCE


@pytest.mark.bits
def test_checked_on_cpu_each_verdict_follows_the_rule():
    # with the real ELU: each order is taken exactly when it keeps the bits here (on CPUs seen so far the
    # ELU makes layer-major order differ, and the rest is then not applicable); a refusal states its diff
    m = _model()
    v = {x.path: x for x in FP.choose(m, "cpu", check_cpu=True)}
    _assert_the_rule(m, v, FP.trial_codes(m, 8, "cpu"))
    again = FP.choose(m, "cpu", check_cpu=True)[0]
    lm = v[FP.BASE]
    assert again.cached and again.chosen == lm.chosen and again.reason == lm.reason


def test_trial_is_fresh_random_codes_both_step_shapes_and_the_state():
    m = _model()
    codes = FP.trial_codes(m, 8, "cpu")
    assert codes.shape == (8, 25) and codes.unique().numel() > 10          # 12 + 13 frames, not zeros
    out = FP.decode_trial(m, codes, **FP.REFERENCE)
    assert out["audio"].shape == (1, 1, 25 * TINY.frame_size) and out["audio"].abs().max() > 1e-3
    assert set(out["state"]) == {r.name for r in m.regions()}
    assert m.layer_major is None and m.batch_conv is None                  # flags restored after the trial


def test_explicit_flags_are_kept_and_reported():
    m = MimiDecoder(TINY, layer_major=False, batch_conv=False)
    v = {x.path: x for x in FP.choose(m, "cpu", check_cpu=True)}
    assert v["layer-major order"].reason == "set explicitly by the caller" and not v["layer-major order"].chosen
    assert v["batched convs"].reason == "set explicitly by the caller"
    assert "not applicable" in v["batched matmuls"].reason


class FakeDevice:
    """decode_trial as on a GPU whose libraries keep the bits for the orders in ``exact`` only."""

    def __init__(self, exact):
        self.exact, self.orders = exact, []

    def __call__(self, model, codes, **order):
        self.orders.append(dict(order))
        key = tuple(sorted(k for k, on in order.items() if on))
        audio = torch.linspace(-1, 1, 50)
        if key and key not in self.exact:
            audio = audio + 2.0 ** -20
        return {"audio": audio, "state": {"r": torch.ones(3)}}


L, C = ("layer_major",), ("batch_conv", "layer_major")
T, M = ("batch_conv_tr", "layer_major"), ("batch_matmul", "layer_major")
S, CS = ("batch_matmul_strided", "layer_major"), ("batch_conv", "batch_matmul_strided", "layer_major")
CT, CTM = ("batch_conv", "batch_conv_tr", "layer_major"), ("batch_conv", "batch_conv_tr", "batch_matmul", "layer_major")


def _want(lm, c, t, m, s=False):
    return {"layer_major": lm, "batch_attention": False, "batch_conv": c, "batch_conv_tr": t,
            "batch_matmul_strided": s, "batch_matmul": m}


@pytest.mark.parametrize("exact,want,combo", [
    ({L, C, T, M, CT, CTM}, _want(True, True, True, True), ""),
    ({L, C, T, M, CT}, _want(True, True, True, False), "batched convs + batched transposed convs + batched matmuls"),
    ({L, C, M}, _want(True, True, False, False), "batched convs + batched matmuls"),
    ({L, C, S, CS}, _want(True, True, False, False, s=True), ""),
    ({L, C}, _want(True, True, False, False), ""),
    (set(), _want(False, False, False, False), ""),
])
def test_choose_takes_every_order_that_keeps_the_bits(monkeypatch, exact, want, combo):
    fake = FakeDevice(exact)
    monkeypatch.setattr(FP, "decode_trial", fake)
    m = _model()
    v = FP.choose(m, "cpu", check_cpu=True)
    assert m.chosen == want
    assert all(o in (FP.REFERENCE,) or o["layer_major"] for o in fake.orders)
    assert [x.path for x in v if " + " in x.path] == ([combo] if combo else [])   # reported only when it fails
    for x in v:
        assert x.chosen == ("bit-identical" in x.reason)
        if "max abs diff" in x.reason:
            assert x.max_abs_diff == pytest.approx(2.0 ** -20)


def test_reference_forced_by_the_user(monkeypatch):
    monkeypatch.setattr(FP, "decode_trial", FakeDevice({("layer_major",)}))
    fastpath.force_reference(True)
    m = _model()
    v = FP.choose(m, "cpu", check_cpu=True)
    assert all(not x.chosen and "forced by the user" in x.reason for x in v)
    assert not m.uses("layer_major", True)


@pytest.mark.oracle
@oracles.needs(oracles.MOSHI)
def test_output_equals_moshi_with_the_check_and_with_the_reference_forced():
    state = W.random_state(TINY, seed=6)
    codes = _codes(30, seed=7)
    ref = stock_mimi.stream_decode(stock_mimi.build(TINY, state, num_codebooks=8), codes).reshape(-1)
    outs = []
    for forced in (False, True):
        fastpath.force_reference(forced)
        tail = MimiTail(MimiDecoder(TINY).load_moshi_state(state), "cpu", 8, size="tiny")
        tail.start()
        outs.append(torch.from_numpy(np.concatenate([tail.push(codes), tail.flush()])))
        assert ("forced by the user" in tail.fast_paths()[0].reason) == forced
    assert ref.abs().max() > 1e-3
    assert torch.equal(outs[0], ref) and torch.equal(outs[1], ref)


def test_session_info_and_run_cli_say_what_runs(speech_wav, tmp_path, capsys):
    from engine.cli.run import main
    from engine.session import DuplexSession, SessionConfig
    s = DuplexSession(SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu"))
    s.start()
    try:
        lines = s.info["fast_paths"]
    finally:
        s.close()
    assert len(lines) == 6 and lines[0].startswith("layer-major order: off — not applicable")
    assert s.info["fast_paths"] == lines                                   # kept after close
    args = ["--input", str(speech_wav), "--output", str(tmp_path / "o.wav"), "--log", str(tmp_path / "logs"),
            "--size", "tiny", "--device", "cpu", "--quiet", "--model", "mimi", "--seconds", "2",
            "--reference-paths"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "fast path: batched convs: off — reference path forced by the user" in err


def test_app_window_shows_the_verdicts(qtbot, tmp_path):
    from test_app_fakes import make_window
    w = make_window(qtbot, tmp_path, lambda cfg: None)
    lines = ["layer-major order: on — bit-identical to the reference (19 tensors, 5000 values)",
             "batched convs: on — bit-identical to the reference (19 tensors, 5000 values)",
             "batched matmuls: off — max abs diff 2e-06 (first in out.audio)"]
    w.on_info({"tail_title": "Mimi", "backbone_title": "synthetic", "size": "released", "device": "cuda",
               "fast_paths": lines})
    assert w.session_label.text().endswith("· faster paths: layer-major order, batched convs")
    assert w.session_label.toolTip().splitlines()[1:] == lines
    w.on_info({"tail_title": "Mimi", "backbone_title": "synthetic", "size": "tiny", "device": "cpu"})
    assert "faster paths" not in w.session_label.text() and w.session_label.toolTip() == ""


@pytest.mark.bits
@pytest.mark.parametrize("bias", [False, True])
def test_transposed_conv_over_a_second_equals_frame_by_frame(bias):
    # the upsample (depthwise, no bias) and a SEANet stage (bias): per-frame calls, overlap-added at once,
    # == moshi's frame-by-frame order with its `partial` carried between frames, bit for bit
    from engine.models.mimi.modules import causal_conv_tr
    from engine.models.mimi.second import conv_tr_second
    g = torch.Generator().manual_seed(3)
    n, ln, stride = 13, 2 if bias else 1, 4 if bias else 2
    cin, cout, groups = (16, 8, 1) if bias else (32, 32, 32)
    x = torch.randn(1, cin, n * ln, generator=g)
    w = torch.randn(cin, cout // groups, 2 * stride, generator=g)
    b = torch.randn(cout, generator=g) if bias else None
    p1 = torch.randn(1, cout, stride, generator=g)
    p2 = p1.clone()
    ref = torch.cat([causal_conv_tr(x[..., f * ln:(f + 1) * ln].contiguous(), p1, w, b, stride, groups=groups)
                     for f in range(n)], -1)
    out = conv_tr_second(x, p2, w, b, stride, n, groups=groups)
    assert torch.equal(out, ref) and torch.equal(p1, p2)


def _transformer_second_both(seed: int, **variant):
    """The released transformer over one 13-frame second whose ring wraps, frame by frame and in
    ``variant``, from the same random caches: (reference out, variant out, reference caches, variant caches)."""
    from engine.models.mimi.config import RELEASED
    from engine.models.mimi.second import transformer_second
    cfg, n = RELEASED, 13
    m = MimiDecoder(cfg).load_moshi_state(W.random_state(cfg, seed=3))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, n * cfg.upsample_stride, cfg.dimension, generator=g)
    caches = [torch.randn(2, 1, cfg.num_heads, cfg.context, cfg.head_dim, generator=g) for _ in range(cfg.num_layers)]
    c2 = [c.clone() for c in caches]
    tab = m.transformer.second_tables(torch.tensor(240), n)                  # the ring wraps in this second
    with torch.no_grad():
        ref = transformer_second(m.transformer, x, caches, tab, batch_matmul=False)
        out = transformer_second(m.transformer, x, c2, tab, batch_matmul=False, **variant)
    return ref, out, caches, c2


def test_strided_batched_matmuls_run_the_transformer_second():
    # the strided-batched GEMM path: the same values to float rounding and the same caches bit for bit.
    # Whether its bits equal the per-frame GEMMs' is the library's business on each CPU (MKL's batched and
    # single kernels may differ with AVX-512): the self-check decides, see the rule test below.
    ref, out, caches, c2 = _transformer_second_both(8, strided=True)
    assert all(torch.equal(a, b) for a, b in zip(caches, c2))
    assert torch.allclose(out, ref, atol=1e-5, rtol=0) and ref.abs().max() > 1e-2


def test_batched_attention_sees_each_frames_ring():
    # one attention call over the second's frames, each frame over the ring as after its own write:
    # the values of frame by frame (a wrong ring or mask is far off), the ring itself bit for bit
    from engine.models.mimi.second import transformer_second
    ref, out, caches, c2 = _transformer_second_both(9, batch_attention=True)
    assert all(torch.equal(a, b) for a, b in zip(caches, c2))
    assert torch.allclose(out, ref, atol=1e-5, rtol=0) and ref.abs().max() > 1e-2   # bits: the self-check's call
    with pytest.raises(ValueError, match="ring of at least 26 steps"):
        transformer_second(_model().transformer, torch.zeros(1, 26, TINY.dimension),
                           [torch.zeros(2, 1, TINY.num_heads, TINY.context, TINY.head_dim)] * TINY.num_layers,
                           _model().transformer.second_tables(torch.tensor(0), 13), False, batch_attention=True)


def test_synth_says_which_paths_ran_and_takes_reference_paths(tmp_path, capsys):
    from engine.cli import synth as synth_cli
    np.save(tmp_path / "c.npy", _codes(14).numpy())
    args = ["--model", "mimi", "--size", "tiny", "--codes", str(tmp_path / "c.npy"), "--out", str(tmp_path / "o.npy")]
    assert synth_cli.main(args) == 0
    err = capsys.readouterr().err
    assert "fast path: layer-major order: off — not applicable" in err
    assert synth_cli.main(args + ["--reference-paths"]) == 0
    assert "fast path: batched convs: off — reference path forced by the user" in capsys.readouterr().err


def _same(a, b) -> bool:
    """A trial's audio and every state region torch.equal to another's."""
    return torch.equal(a["audio"], b["audio"]) and a["state"].keys() == b["state"].keys() and \
        all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])


def _assert_the_rule(m, verdicts, codes):
    """Each verdict is chosen exactly when its order's trial keeps every bit of the reference's, decoded
    here independently of choose() (an order that needs layer-major order is not applicable without it)."""
    with torch.no_grad():
        ref = FP.decode_trial(m, codes, **FP.REFERENCE)
        assert ref["audio"].abs().max() > 1e-3
        for path, flag in FP.FLAGS.items():
            v = verdicts[path]
            if path != FP.BASE and not verdicts[FP.BASE].chosen:
                assert not v.chosen and v.reason == f"not applicable: it runs in {FP.BASE}, which is off here", v
                continue
            out = FP.decode_trial(m, codes, **{**FP.REFERENCE, "layer_major": True, flag: True})
            keeps = _same(out, ref)
            assert v.chosen == keeps and v.reason.startswith("bit-identical" if keeps else "max abs diff"), v
            assert (v.max_abs_diff > 0) != keeps, v
        got = FP.decode_trial(m, codes, **m.chosen)                          # the combination taken
        assert _same(got, ref)


@pytest.mark.bits
def test_real_trials_choose_exactly_what_keeps_the_bits(monkeypatch):
    # The rule, whatever this CPU's kernels do: real trials through choose() take a path exactly when its
    # order decodes the reference's bits (audio and state), checked here independently. ELU is replaced by
    # a layout-independent activation (the CPU's ELU differs between its vectorized and scalar paths), so
    # layer-major order can keep the bits and the orders built on it are really tried.
    from engine.models.mimi.config import with_context
    monkeypatch.setattr(torch.nn.functional, "elu", lambda x, *a, **k: torch.relu(x))
    cfg = with_context(TINY, 40)                                             # a ring longer than a second
    m = MimiDecoder(cfg).load_moshi_state(W.random_state(cfg, seed=3))
    v = {x.path: x for x in FP.choose(m, "cpu", check_cpu=True)}             # + combinations that failed
    assert set(FP.FLAGS) <= set(v)
    _assert_the_rule(m, v, FP.trial_codes(m, 8, "cpu"))
