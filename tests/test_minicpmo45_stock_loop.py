"""Our MiniCPM-o 4.5 stages against MiniCPM-o's own duplex loop, run by ``tests/stock_loop/run_stock.py``.

The stock loop (MiniCPM-o-Demo at 28b60cf, in place under ``../shared/oracles``) runs in its own venv
(``.venv-stock``: transformers 4.51 and the ``minicpmo`` sdist's Step-Audio2 token2wav; ``make test`` builds
it) over a tiny folder in the released layout that our loader reads too (``minicpmo45_stock_folder``), 33 s
of input with speech and pauses, seeded ``torch.manual_seed(S)`` before ``prepare``, the page's Force Listen
once (a barge-in), the head rows of ``<|listen|>`` / ``<|turn_eos|>`` scaled in the folder's weights so the
random model ends turns. It records every stage of every second and the generator's state before each draw.

Each test replays one stage with our modules on the stock's own inputs of that stage, in the stock's order,
in both KV modes (our stock-policy ``torch.cat`` history and our optimized preallocated one):

* LLM logits: our Qwen3 fed exactly what the stock fed (the system prompt's ids, the reference audio's
  embeddings, every ``<unit>``, audio tokens, decoded token, terminator and ``</unit>``) — every logits row;
* LLM tokens: our sampler on the stock's logits from the stock's generator state — every token;
* TTS logits and codes: our TTS on our own condition (our LLM's hidden states) with the stock's per-turn
  history, each row, and our code draw from the stock's generator state — every code;
* encoder output: our encoder's convolutions, positions, layers (their key/value history dropped where the
  stock drops its cache), final norm, projector and pooling on the stock's audio features of each second
  (its first second has no left context: 102 frames, nothing cut before) — every second;
* reference audio: our whole-clip path (ref_audio.py) on the folder's ``assets/HT_ref_audio.wav`` — the
  clip as loaded, its Whisper features and its embeddings — and our backbone's own prelude (system prompt
  around those embeddings), after which the first second's LLM logits are the stock's;
* audio features and encoder output in a session: our ``FrontEnd`` (the stock's streaming log-mel rules)
  and our encoder stepped second by second on their executors over the same 16 kHz input, in both arenas —
  every second's features and audio tokens;
* token2wav: the stock's code stream, per second as its loop buffered it, through our tail with our chunking
  (every buffer of >= 8 codes each speaking second, as the stock's force_flush) — every call's tokens,
  generator state and float waveform, over a folder whose TTS sometimes stops early (short chunks that are
  not a turn's last).

And the integrating proof: OUR whole ``DuplexSession`` (the folder, --seed S, 16 kHz frames, the model's turns,
the page's Force Listen at ``BARGE_IN``) in both modes, every second, every stage above, the tail's float waveform
and the second's speech torch.equal to the stock's record
(``test_our_whole_session_equals_the_stock_loop_every_second``).
The speech is the demo's: its token2wav's ``stream`` returns 16-bit PCM (clipped to [-1, 1], x 32767, truncated),
which its loop reads back / 32768, and so does ours (the backbone's ``speech_pcm16``); the record's per-call
PCM is the bytes the stock's own ``stream`` returned, and its unit waveform is checked to be those calls.

Where our loop still differs from the stock, the module's ``STOCK_DIFFERENCES`` list says so plainly (none now).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import oracles
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.sampling import code_logits, draw, text_sampler

ROOT = Path(__file__).resolve().parents[1]
ORACLE = ROOT.parent / "shared" / "oracles" / "MiniCPM-o-Demo-28b60cf"
STOCK_PY = ROOT / ".venv-stock" / "bin" / "python"
RUNNER = ROOT / "tests" / "stock_loop" / "run_stock.py"
SEEDS = (1, 2)
BARGE_IN = 20                     # the second the page's Force Listen is sent with
NUDGE = (4.0, 1.8)           # head-row factors of <|listen|>, <|turn_eos|>
SECONDS = 33

pytestmark = [pytest.mark.oracle, pytest.mark.bits]

#: where our loop is not yet the stock's, so no stage test claims it (none left)
STOCK_DIFFERENCES: tuple = ()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp, folder = _stock_folder(tmp_path_factory, "stock-loop")
    out: Dict[int, dict] = {}
    for seed, d in _run_stock(folder, tmp).items():
        out[seed] = {"prepare": torch.load(d / "prepare.pt", weights_only=False), "seconds": _seconds(d)}
    return folder, out


def _stock_folder(tmp_path_factory, name: str):
    """(a new temporary folder, the tiny released-layout checkpoint written in it); where the demo copy or the
    stock venv is absent, fails under CI and skips elsewhere, saying which (tests/oracles.py)."""
    oracles.require(oracles.DEMO, oracles.STOCK_VENV)
    sys.path.insert(0, str(ROOT / "tests"))
    import minicpmo45_stock_folder as F
    tmp = tmp_path_factory.mktemp(name)
    return tmp, F.write(tmp / "MiniCPM-o-4_5", nudge=NUDGE)


def _run_stock(folder: Path, tmp: Path, python: Path = STOCK_PY, device: str = "cpu", seeds: tuple = SEEDS,
               seconds: int = SECONDS, barge_in: int = BARGE_IN, timeout: int = 900, extra: tuple = ()
               ) -> Dict[int, Path]:
    """The stock loop over ``folder`` and the input (``seconds`` long), once per seed (on the CPU one thread;
    ``device`` cuda: bfloat16, as the demo; SDPA attention, the kernel our LLM matches; ``extra``: more of the
    harness's options); each seed's record folder."""
    wav = _input(tmp / "in16.wav", seconds)
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    dirs: Dict[int, Path] = {}
    for seed in seeds:
        d = dirs[seed] = tmp / f"seed{seed}"
        r = subprocess.run([str(python), str(RUNNER), "--oracle", str(ORACLE), "--folder", str(folder),
                            "--wav", str(wav), "--out", str(d), "--seed", str(seed), "--device", device,
                            "--force-listen", str(barge_in), "--attn", "sdpa", *extra], capture_output=True,
                           text=True, env=env,
                           timeout=timeout)
        assert r.returncode == 0, r.stderr[-3000:]
    return dirs


def _seconds(d: Path, seconds: int = SECONDS) -> list:
    return [torch.load(d / f"second_{s:04d}.pt", weights_only=False, map_location="cpu") for s in range(seconds)]


def _input(path: Path, seconds: int = SECONDS) -> Path:
    """33 s at 16 kHz: voiced stretches (a gliding tone with harmonics) between quiet pauses (longer inputs
    repeat the pattern, each stretch drawn afresh, and stop at ``seconds``)."""
    import soundfile as sf
    rng, sr = np.random.RandomState(5), 16000
    parts = []
    pattern = (("s", 4), ("q", 5), ("s", 3), ("q", 6), ("s", 2), ("q", 2), ("s", 3), ("q", 8))
    for kind, sec in pattern * (-(-seconds // SECONDS)):
        n = sec * sr
        t = np.arange(n) / sr
        if kind == "s":
            ph = 2 * np.pi * np.cumsum(120 + 30 * np.sin(2 * np.pi * 0.5 * t)) / sr
            x = sum(np.sin(k * ph) / k for k in range(1, 8)) * 0.25 * (0.6 + 0.4 * np.sin(6 * np.pi * t))
            x = x + rng.randn(n) * 0.02
        else:
            x = rng.randn(n) * 0.003
        parts.append(x)
    sf.write(str(path), np.concatenate(parts)[:seconds * sr].astype(np.float32), sr, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def modules(runs):
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    folder, _ = runs
    b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cpu", checkpoint=str(folder),
                           turn_policy="model")
    b.start()
    return b


def _store(d, demand: bool, prefix: str = "llm"):
    r = kv_regions(prefix, d.layers, d.kv_heads, d.head_dim, 33, d.max_positions, torch.float32, "")
    return make_store(demand, r[0], d.layers, 256, "cpu", growable=True)


def _replay_llm(b, run: dict, demand: bool) -> dict:
    """Every feed of the stock session through our Qwen3: our logits rows, the hidden state of every decoded
    token fed back, in order."""
    kv = _store(b.dims.llm, demand)
    logits: List[torch.Tensor] = []
    decoded: List[tuple] = []
    with torch.no_grad():
        for part in [run["prepare"]] + run["seconds"]:
            for ids, emb, want in part.get("feeds", []):
                x = b.llm.embed(ids) if ids is not None else emb
                if ids is not None:
                    assert torch.equal(x.float(), emb), f"embedding of {ids} differs"
                h = b.llm(x, kv)
                if want:
                    logits.append(b.llm.logits(h))
                    if ids is not None and len(ids) == 1:
                        decoded.append((ids[0], h[-1:]))
    return {"logits": logits, "decoded": decoded}


def _stock(run: dict, key: str) -> list:
    return [t for part in [run["prepare"]] + run["seconds"] for t in part.get(key, [])]


def test_the_stock_session_has_replies_a_barge_in_and_pauses(runs):
    _, out = runs
    for seed, run in out.items():
        secs = run["seconds"]
        speak = [s["second"] for s in secs if not s["is_listen"]]
        ends = [s["second"] for s in secs if s["end_of_turn"]]
        assert [s["is_listen"] for s in secs[:3]] == [True] * 3             # the worker's three forced listens
        assert secs[BARGE_IN]["is_listen"], seed                            # Force Listen
        assert len(ends) >= 2 and len(speak) >= 6, (seed, speak, ends)
        assert any(len(s.get("speech", [])) > 0 for s in secs)
        assert not [why for why in map(_demo_returned_its_calls, secs) if why], seed    # the demo's own speech
    a, b = (out[s]["seconds"] for s in SEEDS)
    assert any(x.get("codes") and y.get("codes") and not torch.equal(x["codes"][0], y["codes"][0])
               for x, y in zip(a, b)), "two seeds drew the same codes"


@pytest.mark.parametrize("demand", [False, True], ids=["stock-policy", "optimized"])
def test_llm_logits_equal_the_stock_loop(runs, modules, demand, one_torch_thread):
    _, out = runs
    for seed, run in out.items():
        ours, ref = _replay_llm(modules, run, demand)["logits"], _stock(run, "llm_logits")
        assert len(ours) == len(ref) > 30
        for i, (a, r) in enumerate(zip(ours, ref)):
            assert torch.equal(a, r), f"seed {seed}: LLM logits row {i} of {len(ref)}: max |diff| " \
                                      f"{(a - r).abs().max():.3g}"


def test_llm_tokens_equal_the_stock_loop(runs, modules, one_torch_thread):
    _, out = runs
    d = modules.dims
    for seed, run in out.items():
        sampler = text_sampler(d.sampling, d.tokens, modules.folder.bad_token_ids)
        ins, rngs, toks = (_stock(run, k) for k in ("llm_decode_in", "llm_rng", "llm_sampled"))
        assert len(toks) > 30
        for i, (x, rng, tok) in enumerate(zip(ins, rngs, toks)):
            torch.set_rng_state(rng)
            got = sampler(x)
            assert got == tok, f"seed {seed}: decode {i}: ours {got}, stock {tok}"



@pytest.mark.parametrize("demand", [False, True], ids=["stock-policy", "optimized"])
def test_tts_logits_and_codes_equal_the_stock_loop(runs, modules, demand, one_torch_thread):
    _, out = runs
    d = modules.dims
    for seed, run in out.items():
        decoded = iter(_replay_llm(modules, run, demand)["decoded"])
        kv = _store(d.tts, demand, "tts")
        step = 0
        for s in run["seconds"]:
            unit = [next(decoded) for _ in range(_decoded_in(s))]
            if not s.get("codes"):
                continue
            text = unit[1:]
            with torch.no_grad():
                cond = modules.tts.condition([t for t, _ in text], torch.cat([h for _, h in text]) if text else None)
                assert torch.equal(cond, s["tts_condition"][0]), f"seed {seed} s {s['second']}: TTS condition"
                call = s["tts_call"][0]
                assert kv.length == call["text_start_pos"], (kv.length, call)
                codes = torch.zeros(call["max_new_token"], dtype=torch.long)
                stock = s["tts_logits"]
                for t in range(len(stock)):
                    logits = modules.tts(cond, kv) if t == 0 else modules.tts.step_code(codes[t - 1:t], kv)
                    gap = (logits - stock[t]).abs().max()
                    assert torch.equal(logits, stock[t]), f"seed {seed} s {s['second']} step {t}: TTS logits {gap:.3g}"
                    torch.set_rng_state(s["tts_rng"][t])
                    codes[t:t + 1] = draw(code_logits(logits, codes, t, d.sampling, d.tts.eos, call["min_new_tokens"]))
                    if t < len(s["codes"][0]):
                        assert int(codes[t]) == int(s["codes"][0][t]), f"seed {seed} s {s['second']}: code {t}"
                    step += 1
                n = len(s["codes"][0])
                assert torch.equal(codes[:n], s["codes"][0]), f"seed {seed} s {s['second']}: codes"
            if s["end_of_turn"]:
                kv.reset()
        assert step > 100


def _decoded_in(s: dict) -> int:
    """How many single decoded tokens the second fed back with logits (its unit's j = 0.. tokens)."""
    return sum(1 for ids, _, want in s.get("feeds", []) if want and ids is not None and len(ids) == 1)


def _encode_stock_features(enc, seconds: list) -> List[torch.Tensor]:
    """Our encoder on the stock's per-second features: the stock's framing (CNN context: its first second has
    no prefix frames, every second 2 suffix frames), cache dropped when it would reach the positions."""
    a = enc.a
    k = v = None
    out = []
    for s in seconds:
        feat = s["audio_features"][0]                                       # [1, 80, frames]
        h = F.gelu(enc.conv2(F.gelu(enc.conv1(feat))))
        h = h[:, :, (0 if s["second"] == 0 else 1):-1].transpose(1, 2)     # [1, 50, d]
        before = 0 if k is None else k.shape[2]
        if k is not None and before + (feat.shape[-1] - 1) // 2 + 1 >= a.max_positions:
            k = v = None
            before = 0
        x = h + enc.embed_positions.weight[before:before + h.shape[1]].unsqueeze(0)
        kn = torch.zeros(a.layers, a.heads, before + h.shape[1], a.head_dim)
        vn = torch.zeros_like(kn)
        if k is not None:
            kn[:, :, :before], vn[:, :, :before] = k, v
        for i, layer in enumerate(enc.layers):
            x = layer(x, kn[i], vn[i], kn[i, :, before:], vn[i, :, before:])
        k, v = kn, vn
        x = enc.proj(enc.layer_norm(x))
        out.append(F.avg_pool1d(x.transpose(1, 2), a.pool, a.pool).transpose(1, 2)[0])
    return out


def test_encoder_output_equals_the_stock_loop_on_its_features(runs, modules, one_torch_thread):
    _, out = runs
    for seed, run in out.items():
        with torch.no_grad():
            ours = _encode_stock_features(modules.encoder, run["seconds"])
        for s, (a, r) in enumerate(zip(ours, (x["encoder"][0] for x in run["seconds"]))):
            assert torch.equal(a, r), f"seed {seed} second {s}: encoder output {(a - r).abs().max():.3g}"


def test_reference_audio_embeddings_equal_the_stock_loop(runs, modules, one_torch_thread):
    """Our whole-clip path (ref_audio.py) on the folder's HT_ref_audio.wav: the clip as our WAV reader loads it,
    its Whisper features (30 s window, max - 8 floor) and the encoder's output under the chunk mask, with the
    streaming encoder's own modules, are the stock's prepare's."""
    from engine.backbones.minicpmo45.ref_audio import choose_clip, clip_log_mel, load_clip, reference_embeddings
    folder, out = runs
    clip = choose_clip(folder, str(folder / "voice.npz"))         # an npz voice holds no audio: the folder's clip
    assert clip == folder / "assets" / "HT_ref_audio.wav" == modules.reference_clip
    pcm = torch.from_numpy(load_clip(clip))
    enc = modules.encoder
    with torch.no_grad():
        feats = clip_log_mel(pcm, enc.fbank)
        ours = reference_embeddings(enc, clip)
    for seed, run in out.items():
        prep = run["prepare"]
        assert torch.equal(pcm, prep["ref_audio"]), f"seed {seed}: the clip as loaded"
        ref_feats = prep["ref_features"][0]
        assert ref_feats.shape[0] == 1 and int(prep["ref_feature_lens"][0]) == feats.shape[1] == ref_feats.shape[2]
        assert torch.equal(feats, ref_feats[0]), f"seed {seed}: features {(feats - ref_feats[0]).abs().max():.3g}"
        ref = prep["ref_encoder"][0]
        assert ours.shape == ref.shape and ours.shape[0] > 10, (ours.shape, ref.shape)
        assert torch.equal(ours, ref), f"seed {seed}: reference embeddings {(ours - ref).abs().max():.3g}"


@pytest.mark.parametrize("demand", [False, True], ids=["stock-policy", "optimized"])
def test_prelude_and_first_second_equal_the_stock_loop(runs, demand, one_torch_thread):
    """Our backbone's own prelude (started in either KV mode: the default system prompt through the folder's
    tokenizer around our reference embeddings, fed by Protocol.prepare) is the stock's prepare: the same ids
    and embeddings, so the same KV history, and the first second's LLM logits (the stock's feeds of that
    second) are equal."""
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    from engine.backbones.minicpmo45.prompt import DEFAULT_SYSTEM_PROMPT, prelude
    from engine.backbones.minicpmo45.ref_audio import reference_embeddings
    folder, out = runs
    b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cpu", checkpoint=str(folder),
                           turn_policy="model", demand_sized=demand, graph_replay=False)
    b.start()
    try:
        with torch.no_grad():
            ours = prelude(b.folder.tokenizer, b.system_prompt, reference_embeddings(b.encoder, b.reference_clip))
        n = len(ours.prefix_ids) + ours.reference.shape[0] + len(ours.suffix_ids)
        assert b.kv_llm.kind == ("demand" if demand else "stock") and b.kv_llm.length == n
        k0, v0 = b.kv_llm.export()                                     # the prelude's history
        for seed, run in out.items():
            prep = run["prepare"]
            assert prep["system_prompt"] == b.system_prompt == DEFAULT_SYSTEM_PROMPT
            assert ours.prefix_ids == prep["prefix_ids"] and ours.suffix_ids == prep["suffix_ids"]
            feeds = prep["feeds"]
            assert [f[0] for f in feeds] == [ours.prefix_ids, None, ours.suffix_ids]
            assert torch.equal(feeds[1][1], ours.reference), f"seed {seed}: the reference embeddings fed"
            first = run["seconds"][0]
            b.kv_llm.load(k0, v0)
            rows = []
            with torch.no_grad():
                for ids, emb, want in first["feeds"]:
                    h = b.llm(b.llm.embed(ids) if ids is not None else emb, b.kv_llm)
                    if want:
                        rows.append(b.llm.logits(h))
            ref = first["llm_logits"]
            assert len(rows) == len(ref) > 0
            for i, (a, r) in enumerate(zip(rows, ref)):
                assert torch.equal(a, r), f"seed {seed}: first second's logits row {i}: max |diff| " \
                                          f"{(a - r).abs().max():.3g}"
    finally:
        b.close()


def test_our_session_seeds_and_voices_as_the_stock_does(runs, monkeypatch, one_torch_thread):
    """``--seed S`` / ``--voice X.npz`` in our session: token2wav's prompt is the npz's (the folder has no ONNX
    models), the LLM's prelude is built as the stock's, and the generator's state before our first LLM draw
    is the stock's before its first (seeded S before the prelude, which draws nothing)."""
    from engine.backbones.minicpmo45 import sampling
    from engine.session.config import SessionConfig
    from engine.session.session import DuplexSession
    folder, out = runs
    voice = np.load(folder / "voice.npz")
    for seed, run in out.items():
        states: List[torch.Tensor] = []
        real = sampling.TextSampler.__call__

        def spy(self, logits, *a, **kw):
            states.append(torch.get_rng_state())
            return real(self, logits, *a, **kw)
        monkeypatch.setattr(sampling.TextSampler, "__call__", spy)
        cfg = SessionConfig(backbone="minicpm-o-4.5", backbone_checkpoint=str(folder), device="cpu", size="tiny",
                            seed=seed, cpu_threads=1, voice=str(folder / "voice.npz"), demand_sized=False,
                            graph_replay=False).resolved()
        s = DuplexSession(cfg)
        s.start()
        try:
            assert torch.equal(s.tail.prompt.tokens.view(-1).cpu(), torch.as_tensor(voice["prompt_tokens"]).view(-1))
            rng = np.random.RandomState(seed)
            for _ in range(8):
                if states:
                    break
                s.process((rng.randn(24000) * 0.1).astype(np.float32))
        finally:
            s.close()
            monkeypatch.setattr(sampling.TextSampler, "__call__", real)
        assert states, "our session drew nothing in 8 s"
        assert torch.equal(states[0], _stock(run, "llm_rng")[0]), f"seed {seed}: first draw's generator state"


#: the TTS head's <eos> row scaled in the token2wav test's folder, so that replies' first and last seconds
#: (where the stock lets the TTS stop) sometimes end early: seconds of fewer than 25 codes, whose buffers the
#: stock decodes as short chunks (8 to 27 tokens) that are not a turn's last
T2W_EOS_NUDGE = 6.0
#: its seeds: the two of the other tests, and one whose run has a reply's first unit shorter than a second (its
#: TTS stopped after 11 codes: one short chunk, which the demo returns after silence up to a second)
T2W_SEEDS = SEEDS + (6,)


@pytest.fixture(scope="module")
def t2w_runs(tmp_path_factory):
    """The stock loop over a folder whose TTS sometimes stops early (``T2W_EOS_NUDGE``), seeds ``T2W_SEEDS``."""
    import json
    from safetensors.torch import load_file, save_file
    tmp, folder = _stock_folder(tmp_path_factory, "stock-loop-t2w")
    key = "tts.head_code.0.parametrizations.weight.original0"        # the weight norm's row gains
    shard = folder / json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][key]
    w = load_file(str(shard))
    w[key] = w[key].clone()
    w[key][preset("tiny").tts.eos] *= T2W_EOS_NUDGE
    save_file(w, str(shard))
    return folder, {seed: _seconds(d) for seed, d in _run_stock(folder, tmp, seeds=T2W_SEEDS).items()}


def _replay_token2wav(folder: Path, seconds: list, seed: int, mode: str) -> List[dict]:
    """The stock's code stream, per second as its duplex loop buffered it, through our Step-Audio2 tail as the
    session drives it for MiniCPM-o (the entry's tail_chunking: our chunking; keep_turn_base: new_turn at a
    reply's end or at the barge-in that cuts it; a reply's first push behind 3 silences), the global generator
    set to the stock's state before each speaking second's first token2wav call. Returns each of our
    token2wav steps: its tokens, the generator's state before it and its float waveform."""
    from engine import registry
    tail = registry.get("step-audio2").make_tail(size="tiny", device="cpu", seed=seed, mode=mode,
                                                 checkpoint=str(folder / "assets" / "token2wav"),
                                                 prompt=str(folder / "voice.npz"),
                                                 **registry.get_backbone("minicpm-o-4.5").tail_kwargs())
    assert tail.model.cfg.flow.n_timesteps == 5          # the stock duplex loop's token2wav flow steps
    tail.keep_turn_base = True
    tail.chunking = registry.get_backbone("minicpm-o-4.5").tail_chunking
    tail.start(seed=seed)
    calls: List[dict] = []
    step_inputs, audio = tail.step_inputs, tail._audio

    def rec_inputs(chunk):
        calls.append({"tokens": chunk.reshape(-1).clone(), "rng": torch.get_rng_state()})
        return step_inputs(chunk)

    def rec_audio(out):
        calls[-1]["speech"] = out["audio"].reshape(-1).float().clone()
        return audio(out)
    tail.step_inputs, tail._audio = rec_inputs, rec_audio
    fresh, ended = True, True            # token2wav restarted (3 silences next); the LLM's turn ended
    with torch.no_grad():
        for s in seconds:
            if s["is_listen"]:
                # a second forced to listen (the first three, the page's Force Listen) while the turn is open
                # cuts it and restarts token2wav; a turn the LLM ended inside a listening unit keeps token2wav
                if not ended and (s["second"] < 3 or s["second"] == BARGE_IN):
                    tail.new_turn(flush=False)
                    fresh = True
                ended = True
                continue
            if s.get("t2w_rng"):
                torch.set_rng_state(s["t2w_rng"][0])
            codes = s["codes"][0].view(1, -1)
            tail.push(torch.cat([torch.full((1, 3), 4218), codes], dim=1) if fresh else codes)
            fresh, ended = False, s["end_of_turn"]
            if ended:
                tail.new_turn(flush=True)
                fresh = True
    return calls


@pytest.mark.parametrize("mode", ["stock", "demand"], ids=["stock-policy", "optimized"])
def test_token2wav_chunks_and_waveform_equal_the_stock_loop(t2w_runs, mode, one_torch_thread):
    """Our tail decodes exactly the stock duplex loop's token2wav calls (its force_flush chunking: every
    buffer of >= 8 codes each speaking second, chunks of up to 25 + 3, a turn's rest as its last chunk), from
    the same generator state, and each call's float waveform is the stock's (torch.equal)."""
    folder, out = t2w_runs
    short = 0
    for seed, seconds in out.items():
        stock = [(t, last, w, rng) for s in seconds for t, last, w, rng in
                 zip(s.get("t2w_tokens", []), s.get("t2w_last", []), s.get("speech", []), s.get("t2w_rng", []))]
        lengths = [(len(t), last) for t, last, _, _ in stock]
        short += sum(1 for n, last in lengths if 8 <= n < 28 and not last)
        assert sum(last for _, last in lengths) >= 2 and (28, False) in lengths
        ours = _replay_token2wav(folder, seconds, seed, mode)
        assert [len(c["tokens"]) for c in ours] == [n for n, _ in lengths], f"seed {seed}: chunk lengths"
        for i, (c, (tokens, last, wav, rng)) in enumerate(zip(ours, stock)):
            assert torch.equal(c["tokens"], tokens), f"seed {seed}: call {i}: tokens"
            assert torch.equal(c["rng"], rng), f"seed {seed}: call {i}: generator state"
            gap = (c["speech"] - wav).abs().max() if c["speech"].shape == wav.shape else "shape"
            assert torch.equal(c["speech"], wav), f"seed {seed}: call {i} ({len(tokens)} tokens, last {last}): {gap}"
    assert short > 0, "no short chunk that is not a turn's last in the stock's runs"


@pytest.mark.parametrize("demand", [False, True], ids=["stock-policy", "optimized"])
def test_our_whole_session_speaks_the_stock_loops_short_units(t2w_runs, demand, tmp_path, one_torch_thread):
    """Over the folder whose TTS sometimes stops early (``T2W_EOS_NUDGE``), the first seed whose run has a speaking
    unit shorter than a second (a reply's first, which the demo returns after silence up to a second) and short
    chunks that are not a turn's last. Our whole session in both modes: every second, every stage and the speech
    as the demo returns it."""
    import soundfile as sf
    folder, out = t2w_runs
    short = [s for s in T2W_SEEDS if any(_demo_pad(x) for x in out[s] if not x["is_listen"])]
    assert short, "no speaking unit shorter than a second in the stock's runs"
    seed = short[0]
    stock = out[seed]
    assert not [why for why in map(_demo_returned_its_calls, stock) if why]
    pcm, _ = sf.read(str(_input(tmp_path / "in16.wav")), dtype="float32")
    ours = _our_session_seconds(folder, pcm, seed, demand)
    for k in range(SECONDS + 1):
        why = _difference_at(ours, stock, k, deferred=demand)
        assert not why, f"second {k}: {why}"


@pytest.mark.parametrize("demand", [False, True], ids=["stock-policy", "optimized"])
def test_front_end_and_encoder_equal_the_stock_loop_in_a_session(runs, modules, demand, tmp_path,
                                                                   one_torch_thread):
    """The same 16 kHz input the stock read, second by second through our FrontEnd (the stock's streaming
    log-mel: 560 leading zeros, 80 samples held back a second, the whole-buffer floor, the 30 s buffer slid
    by 10 s) and our encoder on its executor (first second 102 frames, no left context): every second's
    features and encoder output equal the stock's."""
    import soundfile as sf
    from engine.backbones.minicpmo45.audio import FrontEnd
    from engine.core import Executor, make_plan
    pcm, rate = sf.read(str(_input(tmp_path / "in16.wav")), dtype="float32")
    assert rate == 16000 and len(pcm) == SECONDS * rate
    enc = modules.encoder
    spec = enc.session_spec()
    _, out = runs
    for seed, run in out.items():
        front = FrontEnd(enc.fbank, enc.window, "cpu", demand_sized=demand)
        ex = Executor(enc, make_plan(enc.regions(spec), spec), "cpu", demand_sized=demand, graph_replay=False)
        ex.init_state({})
        with torch.no_grad():
            for s, rec in enumerate(run["seconds"]):
                feats = front(torch.from_numpy(pcm[s * rate:(s + 1) * rate]))
                want = rec["audio_features"][0][0]
                assert feats.shape == want.shape and torch.equal(feats, want), \
                    f"seed {seed} second {s}: features {tuple(feats.shape)} vs {tuple(want.shape)}" + \
                    (f", max |diff| {(feats - want).abs().max():.3g}" if feats.shape == want.shape else "")
                emb = ex.step({"features": feats})["emb"]
                assert torch.equal(emb, rec["encoder"][0]), \
                    f"seed {seed} second {s}: encoder output {(emb - rec['encoder'][0]).abs().max():.3g}"


class _Recorder:
    """Wraps one of the backbone's callables (its FrontEnd, its text sampler): each output goes to ``sink``."""

    def __init__(self, inner, sink, before=None):
        self._inner, self._sink, self._before = inner, sink, before

    def __call__(self, *a, **kw):
        if self._before is not None:
            self._before()
        out = self._inner(*a, **kw)
        self._sink(out)
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _our_session_seconds(folder: Path, pcm: np.ndarray, seed: int, demand: bool, device: str = "cpu",
                         size: str = "tiny", seconds: int = SECONDS, barge_in: int = BARGE_IN,
                         toggles: Optional[list] = None) -> List[dict]:
    """OUR whole session over the stock's input: ``DuplexSession`` (minicpm-o-4.5 over the folder, --seed S,
    the folder's voice.npz and reference clip, the default system prompt, 16 kHz frames as they are), the
    page's Force Listen at ``BARGE_IN``. Per second: the front end's features, the encoder's audio tokens, every
    LLM logits row, every draw of the text sampler, every TTS logits row, the codes, the record, and the tail's
    output for the second (``last_speech``: before playback levelling, where ``run --log`` takes speech.npy);
    the optimized mode's deferred last chunk of the final second is run after it (``tail_after``).
    ``toggles``: the toggles asked before each second (the GPU test's flip run), else the mode's own."""
    from engine.session.config import SessionConfig
    from engine.session.session import DuplexSession
    cfg = SessionConfig(backbone="minicpm-o-4.5", backbone_checkpoint=str(folder), device=device, size=size,
                        seed=seed, cpu_threads=1, voice=str(folder / "voice.npz"), input_rate=16000,
                        **({} if demand else {"demand_sized": False, "graph_replay": False}))
    s = DuplexSession(cfg)
    s.start()
    cur: Dict[str, list] = {}
    out: List[dict] = []
    try:
        b = s.backbone
        b.set_tap(lambda stage, t: cur.setdefault(stage, []).append(t.detach().clone()))
        b.front = _Recorder(b.front, lambda y: cur.setdefault("features", []).append(y.clone()))
        smp = b.protocol.sampler

        def before():
            cur.setdefault("history", []).append(list(smp.history))
            if torch.device(device).type == "cuda":
                cur.setdefault("cuda_rng", []).append(torch.cuda.get_rng_state())
        b.protocol.sampler = _Recorder(smp, lambda t: cur.setdefault("sampled", []).append(int(t)), before=before)
        audio = s.tail._audio

        def tapped(step_out):                     # each token2wav call's float waveform, before its PCM step
            cur.setdefault("t2w_float", []).append(step_out["audio"].detach().reshape(-1).float().cpu().clone())
            return audio(step_out)
        s.tail._audio = tapped
        with torch.no_grad():
            for k in range(seconds):
                cur = {}
                if toggles is not None:
                    s.set_toggles(toggles[k])
                _, rec = s.process(pcm[k * 16000:(k + 1) * 16000], force_listen=k == barge_in)
                out.append(dict(cur, record=rec, speech=torch.from_numpy(s.last_speech.copy()),
                                speech_float=_joined(cur.get("t2w_float", []))))
                cur = {}
                s.ahead()                                # the next second's graphs, as the live worker prepares them
            tail_after = s.tail.new_turn(flush=True) if s._turn_flush else np.zeros(0, np.float32)
        out.append({"speech": torch.from_numpy(np.asarray(tail_after, np.float32).reshape(-1)),
                    "speech_float": _joined(cur.get("t2w_float", []))})
    finally:
        s.close()
    return out


def _joined(parts: list) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0)


def _pcm(t: torch.Tensor) -> torch.Tensor:
    """16-bit PCM as the demo's loop reads it back (``astype(float32) / 32768``, exact in float32)."""
    return t.float() / 32768.0


def _stock_speech(seconds: list, k: int, deferred: bool, key: str = "speech_pcm") -> torch.Tensor:
    """The stock's speech of second ``k`` as the demo returns it: its token2wav calls' 16-bit PCM read back,
    after the silence that makes a speaking unit a whole second where it is shorter and does not end its turn
    (``key`` "speech": the calls' float waveforms alone, before either step); ``deferred``: as our optimized
    schedule plays it, a turn's last chunk one second later (before that second's own speech)."""
    def calls(i: int) -> list:
        s = seconds[i] if 0 <= i < len(seconds) else {}
        got = s.get(key, [])
        return list(zip(map(_pcm, got) if key == "speech_pcm" else got, s.get("t2w_last", [])))
    got, lead = calls(k), []
    pad = _demo_pad(seconds[k]) if key == "speech_pcm" and k < len(seconds) else 0
    if deferred:
        lead, got = [c for c in calls(k - 1) if c[1]], [c for c in got if not c[1]]
    return _joined([w for w, _ in lead] + [torch.zeros(pad)] + [w for w, _ in got])


def _demo_pad(second: dict) -> int:
    """The silence the demo's loop puts before a speaking unit's speech: up to a second where the unit's calls
    are shorter and do not end its turn (a unit that decoded nothing: a second of it)."""
    if second["is_listen"]:
        return 0
    n = sum(int(t.numel()) for t in second.get("speech_pcm", []))
    return 0 if second["end_of_turn"] and n else max(0, 24000 - n)


def _demo_returned_its_calls(second: dict) -> str:
    """'' when the unit's waveform the demo returned is its token2wav calls' PCM read back after the silence
    :func:`_demo_pad` says (a listening unit: a second of silence), else how it is not."""
    calls = _joined([_pcm(t) for t in second.get("speech_pcm", [])])
    wave = second["waveform"].reshape(-1)
    pad = 24000 if second["is_listen"] else _demo_pad(second)
    want = _joined([torch.zeros(pad), calls])
    if wave.shape != want.shape or not torch.equal(wave, want):
        return f"second {second['second']}: the returned {wave.shape[0]} samples are not its calls' " \
               f"{calls.shape[0]} after {pad} of silence"
    return ""


def _host(t: torch.Tensor) -> torch.Tensor:
    """On the CPU; floating tensors as float32 (exact for the bfloat16 rows of a CUDA run: the stock's record
    holds its rows as float32)."""
    t = t.detach().cpu()
    return t.float() if t.is_floating_point() else t


def _first_difference(ours: dict, stock: dict, speech: Optional[torch.Tensor],
                      speech_float: Optional[torch.Tensor] = None) -> str:
    """'' when every stage of the second is torch.equal, else the first stage that differs and how: the speech
    against ``speech`` (the demo's, 16-bit PCM read back; not compared where None) after token2wav's float
    waveform against ``speech_float`` (where given and ours has it)."""
    def rows(a: list, b: list) -> str:
        for i, (x, y) in enumerate(zip(map(_host, a), map(_host, b))):
            if x.shape != y.shape or not torch.equal(x, y):
                return f"row {i}: " + (f"max |diff| {(x - y).abs().max():.3g}" if x.shape == y.shape
                                       else f"shape {tuple(x.shape)} vs {tuple(y.shape)}")
        if len(a) != len(b):
            return f"{len(a)} rows vs the stock's {len(b)} (the first {min(len(a), len(b))} equal)"
        return ""
    rec = ours["record"]
    checks = (
        ("decision", "" if (rec.decision == "listen") == stock["is_listen"] else f"ours {rec.decision}"),
        ("audio features", rows(ours.get("features", []), [stock["audio_features"][0][0]])),
        ("encoder output", rows(ours.get("encoder", []), [stock["encoder"][0]])),
        ("LLM logits", rows(ours.get("llm_logits", []), stock.get("llm_logits", []))),
        ("LLM tokens", "" if ours.get("sampled", []) == stock.get("llm_sampled", [])
         else f"ours {ours.get('sampled', [])}, stock {stock.get('llm_sampled', [])}"),
        ("TTS logits", rows(ours.get("tts_logits", []), stock.get("tts_logits", []))),
        ("TTS codes", rows(ours.get("codes", []), stock.get("codes", []))),
        ("token2wav float waveform", rows([ours["speech_float"]], [speech_float])
         if speech_float is not None and "speech_float" in ours else ""),
        ("speech (16-bit PCM)", rows([ours["speech"]], [speech]) if speech is not None else ""),
    )
    return next((f"{stage}: {why}" for stage, why in checks if why), "")


def _difference_at(ours: list, stock: list, k: int, deferred: bool) -> str:
    """Second ``k`` of our session against the stock's record (:func:`_first_difference`, both waveforms, the
    turn's last chunk one second later where ``deferred``); ``k`` past the stock's last second: the deferred
    chunk our optimized schedule runs after the final second (nothing otherwise)."""
    if k >= len(stock):
        want = {key: _stock_speech(stock, k, True, key) if deferred else torch.zeros(0)
                for key in ("speech_pcm", "speech")}
        got = {"speech_pcm": ours[k]["speech"], "speech": ours[k]["speech_float"]}
        bad = [key for key in want if not torch.equal(_host(got[key]), _host(want[key]))]
        return f"the deferred last chunk after the final second: {', '.join(bad)} differ" if bad else ""
    return _first_difference(ours[k], stock[k], _stock_speech(stock, k, deferred),
                             _stock_speech(stock, k, deferred, "speech"))


@pytest.mark.parametrize("demand", [False, True], ids=["stock-policy", "optimized"])
def test_our_whole_session_equals_the_stock_loop_every_second(runs, demand, tmp_path, one_torch_thread):
    """The integrating proof: OUR ``DuplexSession`` over the stock's 33 s input (speech and
    pauses, the three forced listens, >= 2 replies, the page's Force Listen at ``BARGE_IN`` cutting a reply),
    seeded S, the folder's voice and reference clip, the default system prompt, 16 kHz frames
    (``input_rate=16000``), the model's own turns (the voice-activity policy is off with a checkpoint folder):
    every second, every stage torch.equal to the stock loop's record — audio features, encoder output, every
    LLM logits row, every text draw, every TTS logits row, the codes, the tail's float waveform against the
    stock's token2wav float output, and the second's speech (before rate conversion and playback levelling)
    against the demo's: token2wav's 16-bit PCM read back, as the demo's loop hands it on.

    Both our modes: stock-policy (demand_sized=False, graph_replay=False) and optimized (the defaults; on the
    CPU graph replay does not run, so this is the demand-sized arena eager). The optimized schedule runs a
    turn's last token2wav chunk first thing the next second (same draws, same order): there the second's
    waveform is the stock's with that chunk moved one second later; the final second's is run after it."""
    import soundfile as sf
    folder, out = runs
    pcm, rate = sf.read(str(_input(tmp_path / "in16.wav")), dtype="float32")
    assert rate == 16000 and len(pcm) == SECONDS * rate
    for seed, run in out.items():
        stock = run["seconds"]
        ours = _our_session_seconds(folder, pcm, seed, demand)
        assert sum(not s["is_listen"] for s in stock) >= 6 and stock[BARGE_IN]["is_listen"]
        for k in range(SECONDS + 1):
            why = _difference_at(ours, stock, k, deferred=demand)
            assert not why, f"seed {seed} second {k}: {why}"


# -- bfloat16 on the CPU: the stock's dtype semantics without a GPU ------------------------------------------

@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory):
    """The stock loop cast to bfloat16 as the demo casts it (``run_stock.py --bf16``: ``model.bfloat16()``,
    its rotary buffers and the TTS head's weight-norm parts included), on the CPU, seed 1, the 33 s input."""
    tmp, folder = _stock_folder(tmp_path_factory, "stock-loop-bf16")
    d = _run_stock(folder, tmp, seeds=(1,), extra=("--bf16",))[1]
    return folder, _seconds(d), tmp / "in16.wav"


@pytest.mark.parametrize("demand", [False, True], ids=["stock-policy", "optimized"])
def test_our_bfloat16_session_equals_the_stock_loop_in_bfloat16(bf16_runs, demand, monkeypatch, one_torch_thread):
    """Our whole session with the models in bfloat16 (as on CUDA) against the stock loop in bfloat16, on the CPU:
    every second, every stage torch.equal (the bfloat16 rows raised to float32 on both sides, exactly). This is
    where the dtype rules the CUDA run depends on are checked in CI: LLM logits sampled in bfloat16, RoPE
    frequencies cast with the model, the TTS head folded from its bfloat16 weight-norm parts."""
    import soundfile as sf
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    monkeypatch.setattr(MiniCPMO45Backbone, "model_dtype", staticmethod(lambda device: torch.bfloat16))
    folder, stock, wav = bf16_runs
    pcm, _ = sf.read(str(wav), dtype="float32")
    ours = _our_session_seconds(folder, pcm, 1, demand)
    assert sum(not s["is_listen"] for s in stock) >= 6 and stock[BARGE_IN]["is_listen"]
    assert ours[0]["llm_logits"][0].dtype == torch.bfloat16
    for k in range(SECONDS + 1):
        why = _difference_at(ours, stock, k, deferred=demand)
        assert not why, f"second {k}: {why}"
