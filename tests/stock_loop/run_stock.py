"""MiniCPM-o 4.5's own duplex loop (MiniCPM-o-Demo at 28b60cf), run over a WAV second by second (test oracle).

Runs in the stock venv (``.venv-stock``: transformers 4.51, the ``minicpmo`` sdist's Step-Audio2 token2wav),
never in the product's. It imports the demo's ``MiniCPMO45`` package in place from ``--oracle`` and drives a
session as the demo's worker does for its duplex page:

* the model: ``MiniCPMO`` built from the folder's config.json with the attention the demo's loader picks
  (``--attn``, default auto as the demo's: FlashAttention-2 where usable, else SDPA; with SDPA its TTS runs eager
  attention), every tensor loaded from its safetensors shards, then ``init_unified`` with the worker's duplex
  config (``force_listen_count`` 3, sampling 0.7 / top-k 20 / top-p 0.8); float32 on the CPU (the demo casts to
  bfloat16; ``--bf16`` does too);
* the processor: ``MiniCPMOProcessor`` with the demo's ``MiniCPMAAudioProcessor`` (Whisper features with the
  dynamic ``max - 8`` floor) and the folder's tokenizer;
* ``prepare`` as ``DuplexView.prepare`` calls it: the default preset's system prompt (``--system-prompt``),
  the LLM's reference audio = the folder's ``assets/HT_ref_audio.wav`` (librosa at 16 kHz), token2wav's
  prompt = the precomputed features of ``--voice`` (the folder has no speech tokenizer / campplus ONNX: the
  stock's ``_prepare_prompt`` is replaced by those tensors; ``s3tokenizer`` / ``onnxruntime`` / ``torchaudio``
  are stubbed because nothing else of theirs runs); token2wav gets the stock's own flow-step count (the default
  of ``init_token2wav``, which ``init_unified`` calls: 5);
* ``torch.manual_seed(S)`` immediately before ``prepare``; the flow's noise buffer is
  ``torch.randn(1, 80, 30000, generator=torch.Generator().manual_seed(S))``;
* every second: ``duplex_prefill`` of 16,000 samples, ``duplex_generate`` (the page's ``length_penalty`` 1.05,
  ``force_listen`` from ``--force-listen`` seconds), ``duplex_finalize``.

Per second it saves ``second_NNNN.pt``: audio features, encoder output (the LLM-width audio tokens), every
LLM logits row the loop takes, the unit's token ids, every TTS logits row, the codes, each token2wav call's
float waveform (before the int16 step) and its 16-bit PCM (the bytes ``stream`` returned), and the unit's
returned waveform; ``prepare.pt`` holds the prompt's ids and
the reference audio (as loaded), its Whisper features and lengths and its embeddings. ``timing.json`` holds
each second's wall ms (``duplex_prefill`` + ``duplex_generate``, in which token2wav runs, + ``duplex_finalize``;
synchronized on CUDA), decision and a hash of its decision, text and waveform, the process's peak memory
(CUDA: ``max_memory_reserved``; CPU: peak RSS, VmHWM) and what the stock ran with (``ran_with``: attention,
torch, transformers, flash-attn, the token2wav package and its version). ``--no-record``: only timing.json (the
bench's runs); ``--compile``: the demo's torch.compile mode (see :func:`compile_as_the_demo`); ``--device cuda``:
bfloat16 and token2wav on CUDA, as the demo. Usage::

    .venv-stock/bin/python tests/stock_loop/run_stock.py --folder F --wav in.wav --out DIR --seed S
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import io
import json
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

STUBBED = ("onnxruntime", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "s3tokenizer")
PRESET = "assets/presets/audio_duplex"
PAGE_LENGTH_PENALTY = 1.05          # static/audio-duplex: the page sends config.length_penalty 1.05
FORCE_LISTEN_COUNT = 3              # worker's DuplexConfig default, handed to init_unified
WARMUP_SECONDS = 10                 # warmup_compile's max_warmup_chunks default


class _Stub(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def unavailable(*a, **kw):
            raise RuntimeError(f"{self.__name__}.{attr} is stubbed in the stock-loop oracle")
        return unavailable


def _stub_modules() -> None:
    for name in STUBBED:
        if name in sys.modules:
            continue
        m = _Stub(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        m.__path__ = []
        sys.modules[name] = m
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, m)


def default_system_prompt(oracle: Path) -> str:
    """The duplex page's default preset (lowest ``order``) system prompt."""
    import yaml
    presets = [yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted((oracle / PRESET).glob("*.yaml"))]
    return min(presets, key=lambda p: p.get("order", 1 << 30))["system_prompt"]


class _Token2wavOnCpu:
    """Step-Audio2 ``Token2wav`` as the stock builds it. On the CPU its ``.cuda()`` calls and ``device='cuda'``
    literals go to the CPU; on CUDA it is built as the stock builds it. The voice prompt is the given tensors."""

    def __init__(self, model_dir: str, voice: dict, seed: int, device: str, n_timesteps: int):
        import stepaudio2.token2wav as t2w_mod
        self.mod = t2w_mod
        t2w_mod.s3tokenizer = types.SimpleNamespace(load_model=lambda path: _Null())
        t2w_mod.onnxruntime = types.SimpleNamespace(
            SessionOptions=lambda: types.SimpleNamespace(), GraphOptimizationLevel=types.SimpleNamespace(
                ORT_ENABLE_ALL=None), InferenceSession=lambda *a, **kw: None)
        t2w_mod.HiFTGenerator = _hift_at_checkpoint_width(Path(model_dir) / "hift.pt")
        if device == "cpu":
            t2w_mod.torch = _CpuTorch()
        with _cuda_is_cpu() if device == "cpu" else contextlib.nullcontext():
            t2w = t2w_mod.Token2wav(model_dir, float16=False, n_timesteps=n_timesteps)
        t2w.flow.decoder.rand_noise = torch.randn(1, 80, 30000, generator=torch.Generator().manual_seed(seed)).to(
            device)
        ptok = torch.as_tensor(voice["prompt_tokens"]).reshape(1, -1).to(torch.int32)
        pmel = torch.as_tensor(voice["prompt_mel"]).reshape(1, -1, 80).float()
        pmel = torch.nn.functional.pad(pmel, (0, 0, 0, ptok.shape[1] * t2w.flow.up_rate - pmel.shape[1]),
                                       mode="replicate")
        spk = torch.as_tensor(voice["speaker_embedding"]).reshape(1, -1).float()
        cache = tuple(t.to(device) for t in (ptok, torch.tensor([ptok.shape[1]], dtype=torch.int32), spk, pmel,
                                             torch.tensor([pmel.shape[1]], dtype=torch.int32)))
        t2w._prepare_prompt = lambda wav: cache
        self.t2w = t2w


def _hift_at_checkpoint_width(path: Path):
    """The stock ``HiFTGenerator()`` (released widths) at the widths of the folder's hift.pt (tiny folders)."""
    from stepaudio2.flashcosyvoice.modules.hifigan import ConvRNNF0Predictor, HiFTGenerator
    sd = torch.load(str(path), map_location="cpu", weights_only=True)
    base = int(sd["generator.conv_pre.bias"].shape[0])
    cond = int(sd["generator.f0_predictor.condnet.0.bias"].shape[0])
    return lambda: HiFTGenerator(base_channels=base,
                                 f0_predictor=ConvRNNF0Predictor(num_class=1, in_channels=80, cond_channels=cond))


class _Null:
    def cuda(self):
        return self

    def eval(self):
        return self


class _CpuTorch(types.ModuleType):
    """``torch`` as token2wav.py sees it: ``device='cuda'`` literals are the CPU."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        attr = getattr(torch, name)
        if name in ("tensor", "zeros", "ones"):
            def on_cpu(*a, **kw):
                if kw.get("device") == "cuda":
                    kw["device"] = "cpu"
                return attr(*a, **kw)
            return on_cpu
        return attr


@contextlib.contextmanager
def _cuda_is_cpu():
    saved = torch.nn.Module.cuda, torch.Tensor.cuda
    torch.nn.Module.cuda = lambda self, *a, **kw: self
    torch.Tensor.cuda = lambda self, *a, **kw: self
    try:
        yield
    finally:
        torch.nn.Module.cuda, torch.Tensor.cuda = saved


def _load_state(folder: Path) -> dict:
    from safetensors.torch import load_file
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    state = {}
    for shard in sorted(set(index["weight_map"].values())):
        state.update(load_file(str(folder / shard)))
    return state


def stock_tokenizer(folder: Path):
    """The folder's tokenizer as the stock processor gets it, with tokenizer_config.json's ``bad_token_ids``."""
    from transformers import PreTrainedTokenizerFast
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), eos_token=cfg["eos_token"],
                                  bos_token=cfg["bos_token"], unk_token=cfg["unk_token"], pad_token=cfg["pad_token"])
    tok.bad_token_ids = list(cfg.get("bad_token_ids", []))
    return tok


#: the demo's attention choices (its config's ``attn_implementation``; "auto", its default: FlashAttention-2 where
#: the flash-attn package is importable and usable, else PyTorch's SDPA)
ATTENTION = ("auto", "sdpa", "flash_attention_2")


def resolve_attention(asked: str) -> str:
    """The attention the demo's loader picks for ``asked`` (``UnifiedProcessor._resolve_attn_implementation``):
    "auto" is flash_attention_2 where transformers finds flash-attn usable, else sdpa; flash_attention_2 asked
    where it is not usable is an error (one line), as there."""
    from transformers.utils import is_flash_attn_2_available
    usable = bool(is_flash_attn_2_available())
    if asked == "auto":
        return "flash_attention_2" if usable else "sdpa"
    if asked == "flash_attention_2" and not usable:
        raise SystemExit("run_stock.py: --attn flash_attention_2, but flash-attn is not installed or not usable here")
    return asked


def ran_with(attention: str, asked: str) -> dict:
    """What the stock ran with: its attention kernel (as asked and as resolved), torch, transformers, flash-attn
    (where importable) and the token2wav package (the distribution that ships ``stepaudio2``)."""
    import importlib.metadata as md
    import transformers

    def version(dist: str):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None
    t2w = version("minicpmo")
    return {"attention": attention, "attention_asked": asked, "torch": torch.__version__,
            "transformers": transformers.__version__, "flash_attn": version("flash-attn"),
            "token2wav": f"minicpmo {t2w} (stepaudio2.token2wav)" if t2w else "stepaudio2 (no minicpmo distribution)"}


def build(oracle: Path, folder: Path, voice: dict, seed: int, bf16: bool, device: str = "cpu",
          attention: str = "sdpa"):
    """The stock model, processor and duplex capability over ``folder`` (on CUDA: bfloat16, as the demo), its
    attention ``attention`` (resolved: sdpa or flash_attention_2)."""
    sys.path.insert(0, str(oracle))
    _stub_modules()
    import stepaudio2  # noqa: F401  (the sdist's package, with the stubs above in place)
    from MiniCPMO45 import modeling_minicpmo_unified as M
    from MiniCPMO45.configuration_minicpmo import MiniCPMOConfig
    from MiniCPMO45.processing_minicpmo import MiniCPMAAudioProcessor, MiniCPMOProcessor, MiniCPMVImageProcessor
    from MiniCPMO45.tokenization_minicpmo_fast import MiniCPMOTokenizerFast

    cfg_dict = json.loads((folder / "config.json").read_text())
    config = MiniCPMOConfig(**cfg_dict)
    config._attn_implementation = attention
    config._name_or_path = str(folder)
    from transformers.modeling_utils import no_init_weights
    with no_init_weights():            # as from_pretrained builds it: no random init, every weight is loaded below
        model = M.MiniCPMO(config)
    missing, unexpected = model.load_state_dict(_load_state(folder), strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise SystemExit(f"stock model and folder disagree: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model = (model.bfloat16() if bf16 or device == "cuda" else model.float()).eval()
    if device == "cuda":
        model.cuda()

    base = stock_tokenizer(folder)
    del MiniCPMOTokenizerFast      # the released class is a Qwen2 BPE; ours is character level, same ids
    audio = MiniCPMAAudioProcessor(feature_size=config.audio_config.num_mel_bins, sampling_rate=16000,
                                   hop_length=160, chunk_length=30, n_fft=400, padding_value=0.0)
    model.processor = MiniCPMOProcessor(image_processor=MiniCPMVImageProcessor(), audio_processor=audio, tokenizer=base)

    state = {"t2w": None}

    # init_unified calls init_token2wav(streaming=True): the flow-step count is the stock method's own default
    # (n_timesteps=5 in modeling_minicpmo_unified.py), read from its signature, not chosen here
    stock_steps = inspect.signature(M.MiniCPMO.init_token2wav).parameters["n_timesteps"].default

    def init_token2wav(streaming=False, model_dir=None, enable_float16=False, n_timesteps=stock_steps):
        state["t2w"] = _Token2wavOnCpu(str(folder / "assets" / "token2wav"), voice, seed, device, n_timesteps)
        model.tts.audio_tokenizer = state["t2w"].t2w
        return model.tts.audio_tokenizer

    model.init_token2wav = init_token2wav
    model.init_unified(duplex_config={"force_listen_count": FORCE_LISTEN_COUNT}, device=device)
    return model, M


class Recorder:
    """Per-second capture of every stage through wrappers and hooks on the stock objects.

    ``feeds``: every LLM feed in order as (token ids or None, embeddings, logits asked for);
    ``*_rng``: the global CPU generator's state just before each draw (LLM decode, TTS step, token2wav call),
    so one stage can be replayed alone on the stock's own inputs."""

    def __init__(self, model):
        self.model, self.d = model, model.duplex
        self.rec: dict = {}
        self.last_float = self.last_pcm = None
        self._ids: dict = {}
        _float_speech(self, model.tts.audio_tokenizer)
        dec = self.d.decoder
        self._wrap(model.processor, "process_audio_streaming", self._features)
        self._wrap(model, "get_audio_embedding_streaming", self._encoder)
        self._wrap(model.processor, "process_audio", self._ref_features)
        self._wrap(model, "get_audio_embedding", self._ref_encoder)
        self._wrap(dec, "embed_token", self._embedded)
        self._wrap(dec, "embed_tokens", self._embedded)
        self._wrap(dec, "feed", self._feed, before=self._feed_in)
        self._wrap(dec, "decode", self._decode, before=self._decode_in)
        mod = sys.modules[type(dec).__module__]            # decode's text filter, read as its module's global
        self._wrap(mod, "top_k_top_p_filtering", lambda out, a, kw: self._add("llm_filter_out", out),
                   before=lambda a, kw: self._add("llm_filter_in", a[0] if a else kw["logits"]))
        self._wrap(self.d, "_convert_results_to_tts_input", self._condition)
        self._wrap(model.tts, "generate_chunk", self._codes, before=self._tts_in)
        self._wrap(model.tts.audio_tokenizer, "stream", self._stream,
                   before=lambda a, kw: self._add("t2w_rng", torch.get_rng_state()))
        model.tts.head_code[0].register_forward_hook(self._tts_logits)

    def _wrap(self, obj, name, after, before=None):
        inner = getattr(obj, name)

        def wrapped(*a, **kw):
            if before is not None:
                before(a, kw)
            out = inner(*a, **kw)
            after(out, a, kw)
            return out
        setattr(obj, name, wrapped)

    def _add(self, key, t):
        if isinstance(t, torch.Tensor):
            t = t.detach().clone()
            t = t.float() if t.is_floating_point() else t
        self.rec.setdefault(key, []).append(t)

    def _features(self, out, a, kw):
        if out is not None:
            self._add("audio_features", out.audio_features)

    def _encoder(self, out, a, kw):
        self._add("encoder", torch.cat([t for g in out for t in g], dim=0))

    def _ref_features(self, out, a, kw):
        self._add("ref_features", out["audio_features"])
        self._add("ref_feature_lens", torch.cat(list(out["audio_feature_lens"])))

    def _ref_encoder(self, out, a, kw):
        self._add("ref_encoder", torch.cat([t for g in out for t in g], dim=0))

    def _embedded(self, out, a, kw):
        ids = a[0] if a else kw.get("token_ids", kw.get("tid"))
        self._ids[id(out)] = [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]

    def _feed_in(self, a, kw):
        emb = a[0] if a else kw["embeds"]
        self._add("feeds", (self._ids.pop(id(emb), None), emb.detach().float().clone(),
                            bool(kw.get("return_logits", len(a) > 1 and a[1]))))

    def _feed(self, out, a, kw):
        if out is not None:
            self._add("llm_logits", out[0])

    def _decode_in(self, a, kw):
        self._add("llm_rng", torch.get_rng_state())
        if torch.cuda.is_available():               # the CUDA draws' state (seed and Philox offset)
            self._add("llm_cuda_rng", torch.cuda.get_rng_state())
        self._add("llm_history", list(self.d.decoder.generated_tokens))   # its repetition window's source
        self._add("llm_decode_in", a[0] if a else kw["logits"])

    def _decode(self, out, a, kw):
        self._add("llm_sampled", int(out.view(-1)[0]))

    def _condition(self, out, a, kw):
        self._add("tts_condition", out[0])

    def _tts_in(self, a, kw):
        self._add("tts_call", {k: (int(v) if k in ("min_new_tokens", "max_new_token", "text_start_pos") else None)
                               for k, v in kw.items() if k in ("min_new_tokens", "max_new_token", "text_start_pos")})

    def _tts_logits(self, m, a, out):
        self._add("tts_rng", torch.get_rng_state())
        self._add("tts_logits", out[0, -1:])

    def _codes(self, out, a, kw):
        self._add("codes", out[0][0, :, 0])

    def _stream(self, out, a, kw):
        self._add("t2w_tokens", torch.tensor(a[0], dtype=torch.long))
        self._add("t2w_last", bool(kw.get("last_chunk", False)))
        self._add("speech", torch.from_numpy(self.last_float).view(-1))
        self._add("speech_pcm", torch.from_numpy(self.last_pcm).view(-1))

    def take(self) -> dict:
        rec, self.rec = self.rec, {}
        return rec


def _float_speech(rec, t2w) -> None:
    """Each token2wav call as the loop makes it (``stream`` returns the stock's own 16-bit PCM bytes), and the
    float waveform it turned into those bytes: the array the stock's ``stream`` hands to ``np.clip`` (its
    module's ``np`` is wrapped to note it), so both come from the stock's code."""
    stream, mod = t2w.stream, sys.modules[type(t2w).__module__]
    mod.np = _ClipNoted(rec)

    def noted(tokens, prompt_wav, last_chunk=False, return_waveform=False):
        rec.last_float = None
        out = stream(tokens, prompt_wav, last_chunk=last_chunk, return_waveform=return_waveform)
        if return_waveform:
            rec.last_float = np.asarray(out, dtype=np.float32).copy()
            rec.last_pcm = None
        else:
            rec.last_pcm = np.frombuffer(out, dtype="<i2").copy()
        return out
    t2w.stream = noted


class _ClipNoted(types.ModuleType):
    """``numpy`` as token2wav.py sees it: ``clip`` notes the float waveform it is given (the stream's output
    before its int16 step) on the recorder."""

    def __init__(self, rec):
        super().__init__("numpy")
        self._rec = rec

    def __getattr__(self, name):
        return getattr(np, name)

    def clip(self, a, *args, **kw):
        self._rec.last_float = np.asarray(a, dtype=np.float32).copy()
        return np.clip(a, *args, **kw)


def peak_memory(device: str) -> dict:
    """The process's peak memory: ``torch.cuda.max_memory_reserved`` on CUDA, else its own peak RSS (VmHWM)."""
    if device == "cuda":
        return {"peak_memory_bytes": int(torch.cuda.max_memory_reserved()), "peak_memory_kind": "cuda reserved"}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return {"peak_memory_bytes": int(line.split()[1]) * 1024, "peak_memory_kind": "process peak RSS"}
    return {"peak_memory_bytes": None, "peak_memory_kind": "not available (no /proc/self/status)"}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def prepare(model, oracle: Path, folder: Path, system_prompt, seed: int) -> tuple:
    """``duplex_prepare`` as the duplex page calls it, seeded right before; (prefix, suffix, system prompt, ref)."""
    import librosa
    system_prompt = system_prompt if system_prompt is not None else default_system_prompt(oracle)
    ref, _ = librosa.load(str(folder / "assets" / "HT_ref_audio.wav"), sr=16000, mono=True)
    prefix = f"<|im_start|>system\n{system_prompt}\n<|audio_start|>"
    suffix = "<|audio_end|><|im_end|>"
    torch.manual_seed(seed)
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        model.duplex_prepare(prefix_system_prompt=prefix, suffix_system_prompt=suffix, ref_audio=ref,
                             prompt_wav_path=str(folder / "assets" / "HT_ref_audio.wav"))
    return prefix, suffix, system_prompt, ref


def one_second(model, chunk: np.ndarray, force_listen: bool, device: str) -> tuple:
    """``duplex_prefill`` + ``duplex_generate`` (token2wav runs inside it) + ``duplex_finalize`` of one second:
    (the result, its wall ms, synchronized on CUDA)."""
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        model.duplex_prefill(audio_waveform=chunk)
        res = model.duplex_generate(decode_mode="sampling", temperature=0.7, top_k=20, top_p=0.8,
                                    listen_prob_scale=1.0, listen_top_k=None, text_repetition_penalty=1.05,
                                    text_repetition_window_size=512, length_penalty=PAGE_LENGTH_PENALTY,
                                    force_listen_override=force_listen)
        model.duplex_finalize()
    _sync(device)
    return res, (time.perf_counter() - t0) * 1000.0


def digest(res) -> str:
    """The second's decision, text and waveform, hashed (taken after the second's timing)."""
    h = hashlib.sha256()
    h.update(b"L" if res["is_listen"] else b"S")
    h.update(str(res["text"]).encode())
    h.update(np.ascontiguousarray(np.asarray(res["audio_waveform"], np.float32)).tobytes())
    return h.hexdigest()[:16]


def earlier_session(model, oracle, folder, args, wav: np.ndarray) -> None:
    """A whole duplex session before the timed one, over the input's first WARMUP_SECONDS seconds: what a worker
    that has served before has run (its lazy CUDA start-up and first kernel choices are behind it)."""
    prepare(model, oracle, folder, args.system_prompt, args.seed)
    for s in range(min(WARMUP_SECONDS, len(wav) // 16000)):
        one_second(model, wav[s * 16000:(s + 1) * 16000], False, args.device)


def compile_as_the_demo(model, oracle, folder, args, wav: np.ndarray) -> float:
    """``--compile``: what the demo's loader does when its users set ``compile`` (``UnifiedProcessor._load_model``):
    ``apply_torch_compile(mode="default", dynamic=True)`` (llm.model and tts.model), then a warm-up duplex
    session. The demo warms up over its sample video's first 10 one-second units (``warmup_compile``,
    ``max_warmup_chunks`` 10); that video is not in the oracle copy and the folder has no vision tower, so the
    warm-up is the same loop over the input's first 10 seconds, audio only. Returns the seconds it took."""
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        model.apply_torch_compile(mode="default", dynamic=True, skip_modules=None)
    earlier_session(model, oracle, folder, args, wav)
    return time.perf_counter() - t0


def warm_as_a_serving_worker(model, oracle, folder, args, wav: np.ndarray) -> float:
    """``--warm``: the eager stock as a running worker's later session meets it: one earlier session first (the
    demo warms up only in its compile mode, so a worker's first session is the cold one). Returns its seconds."""
    t0 = time.perf_counter()
    earlier_session(model, oracle, folder, args, wav)
    return time.perf_counter() - t0


def run(args) -> None:
    import soundfile as sf
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and args.deterministic:
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cudnn.deterministic = True
    oracle, folder, out = Path(args.oracle), Path(args.folder), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wav, sr = sf.read(args.wav, dtype="float32", always_2d=True)
    if sr != 16000:
        raise SystemExit(f"{args.wav}: the stock loop takes 16 kHz input, this is {sr} Hz")
    wav = wav.mean(axis=1).astype(np.float32)
    voice = dict(np.load(args.voice or folder / "voice.npz"))
    attention = resolve_attention(args.attn)
    t_build = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        model, _ = build(oracle, folder, voice, args.seed, args.bf16, args.device, attention)
    build_s = time.perf_counter() - t_build
    if args.compile and args.warm:
        raise SystemExit("--compile already runs a warm-up session; --warm is for the eager stock")
    warmup_s = (compile_as_the_demo(model, oracle, folder, args, wav) if args.compile
                else warm_as_a_serving_worker(model, oracle, folder, args, wav) if args.warm else 0.0)
    rec = None if args.no_record else Recorder(model)

    prefix, suffix, system_prompt, ref = prepare(model, oracle, folder, args.system_prompt, args.seed)
    if rec is not None:
        prep = rec.take()
        prep.update(prefix_ids=model.duplex.tokenizer.encode(prefix, add_special_tokens=False),
                    suffix_ids=model.duplex.tokenizer.encode(suffix, add_special_tokens=False),
                    system_prompt=system_prompt, ref_audio=torch.from_numpy(ref))
        torch.save(prep, out / "prepare.pt")

    forced = {int(s) for s in args.force_listen.split(",") if s} if args.force_listen else set()
    seconds = len(wav) // 16000 if args.seconds is None else args.seconds
    timing = []
    for s in range(seconds):
        res, ms = one_second(model, wav[s * 16000:(s + 1) * 16000], s in forced, args.device)
        timing.append({"second": s, "ms": ms, "decision": "listen" if res["is_listen"] else "speak",
                       "digest": digest(res)})
        if rec is None:
            print(f"{s:4d} {timing[-1]['decision'].upper():6s} {ms:.1f} ms", flush=True)
            continue
        r = rec.take()
        r.update(second=s, is_listen=bool(res["is_listen"]), end_of_turn=bool(res["end_of_turn"]),
                 text=res["text"], waveform=torch.from_numpy(np.asarray(res["audio_waveform"], np.float32)),
                 total_ids=list(model.duplex.total_ids), wall_ms=ms)
        torch.save(r, out / f"second_{s:04d}.pt")
        print(f"{s:4d} {'LISTEN' if r['is_listen'] else 'SPEAK '} eot={int(r['end_of_turn'])} "
              f"codes={sum(len(c) for c in r.get('codes', []))} t2w_calls={len(r.get('speech', []))} "
              f"{ms:.1f} ms", flush=True)
    doc = {"device": args.device, "compile": bool(args.compile), "warm": bool(args.warm or args.compile),
           "threads": args.threads, "seed": args.seed,
           "deterministic": bool(args.deterministic) if args.device == "cuda" else None,
           "dtype": "bfloat16" if args.bf16 or args.device == "cuda" else "float32", "build_s": build_s,
           "warmup_s": warmup_s, "torch": torch.__version__, "ran_with": ran_with(attention, args.attn),
           "seconds": timing, **peak_memory(args.device)}
    (out / "timing.json").write_text(json.dumps(doc, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--oracle", default=str(Path(__file__).resolve().parents[3] / "shared" / "oracles" /
                                           "MiniCPM-o-Demo-28b60cf"))
    p.add_argument("--folder", required=True)
    p.add_argument("--wav", required=True, help="16 kHz input")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seconds", type=int, default=None)
    p.add_argument("--voice", default=None, help="token2wav prompt features (.npz); default FOLDER/voice.npz")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--force-listen", default="", help="comma-separated seconds sent with force_listen (barge-in)")
    p.add_argument("--attn", default="auto", choices=ATTENTION,
                   help="the LLM's attention, as the demo's attn_implementation (its default auto: "
                        "flash_attention_2 where flash-attn is usable, else sdpa; the bit tests ask for sdpa)")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: bfloat16, as the demo")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the bits the tests compare)")
    p.add_argument("--compile", action="store_true",
                   help="the demo's torch.compile mode: apply_torch_compile(mode='default', dynamic=True) and "
                        "a warm-up session, as its loader does when compile is set")
    p.add_argument("--warm", action="store_true",
                   help="eager, after one earlier session over the input's first 10 s (a serving worker's later "
                        "session; without it, its first)")
    p.add_argument("--deterministic", action="store_true",
                   help="CUDA: cuDNN attention out of SDPA and cuDNN held to deterministic algorithms, as our "
                        "engine runs (without it, as the demo's users run it: torch 2.11 on the H200 picks cuDNN "
                        "attention for bf16 and atomics-based transposed convs for token2wav, and the stock does "
                        "not repeat its own bits)")
    p.add_argument("--no-record", action="store_true",
                   help="timing only: no per-stage capture, only timing.json (what the bench runs)")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("run_stock.py: --device cuda, but this torch has no CUDA (build .venv-stock with a CUDA torch)")
    run(a)


if __name__ == "__main__":
    main()
