"""Our CPU decodes hand every shape-dependent library kernel the peer's own problems (op, shapes, strides,
dtype, alignment: :mod:`op_signatures`), so the bit tests' ``torch.equal`` holds on any x86 CPU, whichever
kernels its MKL picks (AVX-512 / AMX on Intel, AVX2 on AMD or with ``MKL_ENABLE_INSTRUCTIONS=AVX2``). A
change that alters a shape, a layout or an alignment fails here even on a CPU whose kernels happen to
round both alike. Models are built outside the recording: only the decodes are compared."""
import pytest
import torch

import oracles

import stock_mimi
import test_mimi as MT
import test_nemotron_codec as NC
from engine.models.mimi import weights as MW
from engine.models.mimi.config import RELEASED as MIMI_RELEASED
from engine.models.mimi.config import TINY as MIMI_TINY
from engine.models.mimi.model import MimiDecoder
from engine.models.mimi.tail import MimiTail
from engine.models.nemotron_codec import peer as nemo
from engine.models.nemotron_codec import weights as NW
from engine.models.nemotron_codec.config import RELEASED
from engine.models.nemotron_codec.tail import make_tail
from op_signatures import assert_same_calls, record

pytestmark = [pytest.mark.oracle, pytest.mark.bits, pytest.mark.usefixtures("one_torch_thread")]
need_moshi = oracles.needs(oracles.MOSHI)
need_nemo = oracles.needs(oracles.NEMO)


def _nemotron_both(cfg, state, codes, pushes, **toggles):
    """(our audio, nemo's audio, our call signatures, nemo's) for one stream of ``codes`` pushed in ``pushes``."""
    codec = nemo.build(cfg, state)
    tail = make_tail(cfg=cfg, device="cpu", shared={"model": NC._model(cfg, state)}, **toggles)

    def ours():
        tail.start()
        out, i = [], 0
        for c in pushes:
            out.append(torch.from_numpy(tail.push(codes[:, i:i + c])))
            i += c
        return torch.cat(out + [torch.from_numpy(tail.flush())])
    ref, peer_calls = record(lambda: nemo.cached_decode(codec, codes))
    got, our_calls = record(ours)
    return got, ref, our_calls, peer_calls


@need_nemo
@pytest.mark.parametrize("cfg", [NC.TINY, NC.ODD, NC.NARROW, NC.WIDE_HOP], ids=["tiny", "odd", "narrow", "wide-hop"])
@pytest.mark.parametrize("demand", [True, False], ids=["demand", "stock"])
def test_nemotron_codec_issues_nemos_library_calls(cfg, demand):
    # the bit test's stream: 41 frames (seconds of 12, 13, 12, a last 4 flushed), pushes of odd sizes
    got, ref, ours, peer = _nemotron_both(cfg, NW.random_state(cfg, seed=3), NC._codes(cfg, 41, seed=4),
                                          [5, 9, 1, 20, 6], demand_sized=demand)
    assert_same_calls(ours, peer)
    assert torch.equal(got, ref)


@need_nemo
def test_nemotron_codec_released_size_issues_nemos_library_calls():
    # the released dimensions over a 12-frame second and 2 flushed frames
    got, ref, ours, peer = _nemotron_both(RELEASED, NW.random_state(RELEASED, seed=1), NC._codes(RELEASED, 14, seed=2),
                                          [14])
    assert_same_calls(ours, peer)
    assert torch.equal(got, ref)


def _mimi_both(cfg, k, frames, seed, **toggles):
    """(our audio, moshi's, our call signatures, moshi's) for ``frames`` random frames of ``k`` codebooks."""
    state = MW.random_state(cfg, seed=seed)
    codes = MT._codes(cfg, k, frames, seed=100 + seed)
    mimi = stock_mimi.build(cfg, state, num_codebooks=k)
    tail = MimiTail(MimiDecoder(cfg).load_moshi_state(state), "cpu", k, size="test", **toggles)

    def ours():
        tail.start()
        return torch.cat([torch.from_numpy(tail.push(codes[:, :5])), torch.from_numpy(tail.push(codes[:, 5:])),
                          torch.from_numpy(tail.flush())])
    ref, peer_calls = record(lambda: stock_mimi.stream_decode(mimi, codes).reshape(-1))
    got, our_calls = record(ours)
    return got, ref, our_calls, peer_calls


@need_moshi
@pytest.mark.parametrize("k,demand", [(8, True), (32, False)], ids=["8-demand", "32-stock"])
def test_mimi_issues_moshis_library_calls(k, demand):
    # the bit tests' streams: seconds of 12 and 13 frames, a ring that wraps, a short last second flushed.
    # moshi recomputes the RoPE table in every layer, ours once per frame: the same calls, other counts.
    got, ref, ours, peer = _mimi_both(MIMI_TINY, k, 30, seed=k, demand_sized=demand)
    assert_same_calls(ours, peer, counts=False)
    assert torch.equal(got, ref)


@need_moshi
def test_mimi_released_size_issues_moshis_library_calls():
    got, ref, ours, peer = _mimi_both(MIMI_RELEASED, 32, 14, seed=1)
    assert_same_calls(ours, peer, counts=False)
    assert torch.equal(got, ref)



# -- Step-Audio2 token2wav ----------------------------------------------------------------------------------
#
# Both sides record under ``inference_mode`` (the stock's HiFT runs under it whatever its caller does, so its
# composite calls arrive whole; ours are recorded alike). The stock computes its time embeddings, adaLN
# modulations, speaker projection and Snake inverses on every call, ours once per session (``prepare``, recorded
# with the stream): the same calls, other counts. The models are built outside the recording; a first stream of
# ours runs the start-up self-checks outside it too (their trials are not the decode).

need_stepaudio2 = oracles.needs(oracles.STEPAUDIO2)


def _t2w_case(cfg, prompt_tokens: int, n_tokens: int, seed: int):
    import stock_step_audio2 as S
    from engine.models.step_audio2 import weights as W
    from engine.models.step_audio2.stream import Prompt
    g = torch.Generator().manual_seed(seed)
    prompt = Prompt(torch.randint(0, 6561, (1, prompt_tokens), generator=g),
                    torch.randn(1, 2 * prompt_tokens, 80, generator=g), torch.randn(1, 192, generator=g))
    tokens = torch.randint(0, 6561, (n_tokens,), generator=g).tolist()
    return S.voiced(W.random_state_dict(cfg, seed), cfg), prompt, tokens


def _stock_t2w(cfg, state, prompt, seed: int, turns):
    """The stock ``Token2wav.stream`` over ``turns`` (lists of (tokens, last) chunks; between turns the caches go
    back to the prompt's, as MiniCPM-o's loop resets them): its audio and its call signatures."""
    import stock_step_audio2 as S
    from engine.models.step_audio2.stream import flow_noise
    flow, hift = S.build_flow(cfg.flow), S.build_hift(cfg.hift)
    flow.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("flow.")}, strict=True)
    hift.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("hift.")}, strict=True)

    def run():
        st = S.StockStream(flow, hift, prompt.tokens, prompt.mel, prompt.spk, "cpu", noise=flow_noise(seed),
                           n_timesteps=cfg.flow.n_timesteps)
        torch.manual_seed(seed)
        out = []
        for i, chunks in enumerate(turns):
            if i:
                with S._quiet():
                    st.t2w.stream_cache, st.t2w.hift_cache_dict = st.t2w.set_stream_cache(None)
            out += st.stream(None, chunks)
        return torch.cat([torch.from_numpy(w) for w in out])
    return record(run)


def _prepared_and(model, run):
    """Our constants made again (recorded) and ``run``'s calls; their union, and ``run``'s result."""
    _, made = record(lambda: (model.flow.build_constants(), model.hift.prepare()))
    out, calls = record(run)
    return out, made + calls


@need_stepaudio2
@pytest.mark.parametrize("mode", ["stock", "demand"])
def test_step_audio2_issues_the_stock_library_calls(mode):
    """The oracle dims (the stock's widths, shallow) over a 21-token prompt and 61 tokens: prompt prefill, a
    start-up chunk, two steady ones and an 11-token last chunk."""
    from engine.models.step_audio2 import weights as W
    from engine.models.step_audio2.config import preset
    from engine.models.step_audio2.stream import schedule, synthesize
    cfg = preset("oracle")
    state, prompt, tokens = _t2w_case(cfg, 21, 61, seed=4)
    with torch.inference_mode():
        ref, peer = _stock_t2w(cfg, state, prompt, 4, [[(tokens[s:s + n], last) for s, n, last in schedule(61)]])
        model = W.build(cfg, state, "cpu")
        synthesize(model, prompt, tokens, mode, 4)
        got, ours = _prepared_and(model, lambda: torch.cat([torch.from_numpy(w) for w in
                                                            synthesize(model, prompt, tokens, mode, 4)]))
    assert_same_calls(ours, peer, counts=False)
    assert torch.equal(got, ref)


def _loop_turns(tokens):
    """Two replies as MiniCPM-o's duplex loop hands them to token2wav: each behind 3 silences; the first of
    25 + 25 + 12 codes (chunks of 28, 28 and a short 15, then its last 3 at the turn's end), the second of 20
    (a short first chunk of 23, then its last 3)."""
    first, second = [4218] * 3 + tokens[:62], [4218] * 3 + tokens[62:82]
    return [first[:28], first[28:53], first[53:65]], [second], \
        [[(first[0:28], False), (first[25:53], False), (first[50:65], False), (first[62:65], True)],
         [(second[0:23], False), (second[20:23], True)]]


@need_stepaudio2
def test_step_audio2_in_minicpmo_s_loop_issues_the_stock_library_calls():
    """The released vocoder and the released flow widths (the DiT 2 deep), 5 flow steps, our tail driven as the
    session drives it for MiniCPM-o 4.5 (its chunking: short chunks; a turn's end flushes its last chunk and
    goes back to the prompt's state) against the stock stream over the same chunks and resets."""
    from dataclasses import replace
    from engine.models.step_audio2 import weights as W
    from engine.models.step_audio2.config import preset
    from engine.models.step_audio2.tail import StepAudio2Tail
    from engine.models import registry
    r = preset("released")
    cfg = replace(r, flow=replace(r.flow, n_timesteps=5, dit=replace(r.flow.dit, depth=2)))
    state, prompt, tokens = _t2w_case(cfg, 17, 82, seed=6)
    pushes1, pushes2, turns = _loop_turns(tokens)

    def ours_run(tail):
        tail.start(seed=6)
        out = [tail.push(torch.tensor([p])) for p in pushes1] + [tail.new_turn(flush=True)]
        out += [tail.push(torch.tensor([p])) for p in pushes2] + [tail.new_turn(flush=True)]
        return torch.cat([torch.from_numpy(w) for w in out])
    with torch.inference_mode():
        ref, peer = _stock_t2w(cfg, state, prompt, 6, turns)
        tail = StepAudio2Tail(W.build(cfg, state, "cpu"), prompt, "test", synthetic=True, mode="demand")
        tail.keep_turn_base = True
        tail.chunking = registry.get_backbone("minicpm-o-4.5").tail_chunking
        ours_run(tail)
        got, ours = _prepared_and(tail.model, lambda: ours_run(tail))
    assert_same_calls(ours, peer, counts=False)
    assert torch.equal(got, ref)
