"""Bad input files: audio inputs streamed and checked, flow.yaml bounded and typed,
checkpoint tensors finite, the Moshi adapter loading only safetensors. One clear line each."""
from __future__ import annotations

import json
import os
import struct
import threading
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile
import torch

from engine.audio import load_mono
from engine.backbones.moshi.files import validate_folder
from engine.models.mimi import weights as MW
from engine.models.mimi.config import preset as mimi_preset
from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.config import flow_config_from_yaml, preset
from engine.wavio import WavError, read_wav

RNG = np.random.default_rng(11)


def _pcm16_wav(path: Path, x: np.ndarray, rate: int, data_size=None) -> Path:
    """A 16-bit mono WAV whose data size field says ``data_size`` (default: the truth)."""
    pcm = np.clip(np.round(x * 32768), -32768, 32767).astype("<i2").tobytes()
    size = len(pcm) if data_size is None else data_size
    fmt = struct.pack("<HHIIHH", 1, 1, rate, 2 * rate, 2, 16)
    path.write_bytes(b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt
                     + b"data" + struct.pack("<I", size) + pcm)
    return path


@pytest.fixture
def three_s(tmp_path):
    x = (0.3 * RNG.standard_normal(3 * 8000)).clip(-0.9, 0.9).astype(np.float32)
    return x, _pcm16_wav(tmp_path / "ok.wav", x, 8000)


# -- audio input ----------------------------------------------------------------------------------------

def test_a_huge_input_is_streamed_only_as_far_as_asked(tmp_path):
    path = tmp_path / "huge.wav"
    n = (1 << 30) - 44                                       # 1 GiB of 16-bit samples: 6.2 h at 24 kHz
    head = _pcm16_wav(tmp_path / "h.wav", np.zeros(0, np.float32), 24000, data_size=n).read_bytes()
    with open(path, "wb") as f:
        f.write(head)
        f.write((0.25 * RNG.standard_normal(48000) * 32768).astype("<i2").tobytes())
        f.truncate(len(head) + n)                            # sparse: costs no disk
    tracemalloc.start()
    t0 = time.perf_counter()
    x = load_mono(path, max_seconds=2)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert x.shape == (48000,) and np.abs(x).max() > 0
    assert peak < 16 << 20 and time.perf_counter() - t0 < 20


@pytest.mark.parametrize("kind", ["/dev/zero", "folder", "fifo"])
def test_non_regular_inputs_are_refused_without_blocking(tmp_path, kind):
    path = {"/dev/zero": Path("/dev/zero"), "folder": tmp_path, "fifo": tmp_path / "f.wav"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    out = []

    def read():
        try:
            read_wav(path)
        except WavError as e:
            out.append(str(e))
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(20)
    assert len(out) == 1 and str(path) in out[0] and "not an audio file" in out[0]


def test_unknown_data_sizes_read_the_real_data(tmp_path, three_s):
    x, ok = three_s
    ref, rate = read_wav(ok)
    assert rate == 8000 and ref.size == x.size
    for size in (0, 0xFFFFFFFF):                             # what recorders writing to a pipe leave
        y, _ = read_wav(_pcm16_wav(tmp_path / f"s{size}.wav", x, 8000, data_size=size))
        assert np.array_equal(y, ref)
        assert load_mono(tmp_path / f"s{size}.wav", rate=8000).size == x.size


def test_truncated_empty_and_non_finite_inputs_are_one_line(tmp_path, three_s):
    x, ok = three_s
    data = ok.read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: 44 + 8000])
    with pytest.raises(WavError, match=r"cut.wav: truncated WAV file: its header promises 3.00 s .* holds 0.50 s"):
        read_wav(tmp_path / "cut.wav")
    (tmp_path / "head.wav").write_bytes(data[:30])
    with pytest.raises(WavError, match="head.wav"):
        read_wav(tmp_path / "head.wav")
    _pcm16_wav(tmp_path / "big.wav", x, 8000, data_size=10 ** 8)
    with pytest.raises(WavError, match="big.wav: truncated"):
        read_wav(tmp_path / "big.wav")
    _pcm16_wav(tmp_path / "empty.wav", np.zeros(0, np.float32), 8000)
    assert read_wav(tmp_path / "empty.wav")[0].size == 0
    with pytest.raises(WavError, match="empty.wav holds no audio"):
        load_mono(tmp_path / "empty.wav")
    for bad in (np.nan, np.inf):
        y = x.copy()
        y[12345] = bad
        soundfile.write(tmp_path / "f.wav", y, 8000, subtype="FLOAT")
        with pytest.raises(WavError, match=r"f.wav: sample 12345 \(at 1.543 s\) is NaN or infinite"):
            load_mono(tmp_path / "f.wav", max_seconds=2)
    assert load_mono(tmp_path / "f.wav", rate=8000, max_seconds=1.5).size == 12000    # the bad sample lies later
    (tmp_path / "x.wav").write_bytes(data[:20] + struct.pack("<H", 85) + data[22:])    # MP3-in-WAV, garbage
    with pytest.raises(WavError, match="x.wav: unsupported WAV encoding"):
        read_wav(tmp_path / "x.wav")
    (tmp_path / "j.wav").write_bytes(data[:12] + b"junk\0\0\0\0" * 5000 + data[12:])   # a chunk walk is bounded
    with pytest.raises(WavError, match="j.wav: more than 4096 RIFF chunks"):
        read_wav(tmp_path / "j.wav")
    (tmp_path / "t.wav").write_text("hello")
    with pytest.raises(WavError, match="t.wav: not a WAV file"):
        read_wav(tmp_path / "t.wav")


def _aiff(frames_claimed: int, body: bytes = b"") -> bytes:
    """An AIFF file: a COMM chunk claiming ``frames_claimed`` 16-bit mono frames at 24 kHz, then ``body``."""
    rate = b"\x40\x0d\xbb\x80" + bytes(6)                     # 24000 as an 80-bit extended float
    comm = b"COMM" + struct.pack(">IhIh", 18, 1, frames_claimed, 16) + rate
    form = b"AIFF" + comm + body
    return b"FORM" + struct.pack(">I", len(form)) + form


@pytest.mark.parametrize("case", ["no sound chunk", "an empty sound chunk", "a truncated header"])
def test_a_header_only_aiff_is_one_line_and_no_session(tmp_path, case):
    """A header that claims a second of samples the file does not hold: one line, exit 2, no session of silence,
    and nothing else on stderr (libsndfile's failed seek used to print a traceback from inside its callback)."""
    import subprocess
    import sys
    data = {"no sound chunk": _aiff(24000), "an empty sound chunk": _aiff(24000, b"SSND" + struct.pack(">III", 8, 0, 0)),
            "a truncated header": _aiff(24000)[:30]}[case]
    (tmp_path / "in.aiff").write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "app.main", "run", "--input", str(tmp_path / "in.aiff"), "--output",
                        str(tmp_path / "o.wav"), "--log", str(tmp_path / "log"), "--model", "mimi", "--size", "tiny",
                        "--device", "cpu", "--quiet"], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(err) == 1 and "in.aiff" in err[0] and "Traceback" not in r.stderr, err
    assert not (tmp_path / "o.wav").exists() and not (tmp_path / "log").exists()


def test_a_header_whose_samples_cannot_be_read_is_refused_up_front(tmp_path, monkeypatch):
    """A decoder that reports frames and then yields none (what a header-only file can look like to libsndfile) is
    refused when the input is opened, not played as a second of silence."""
    import engine.wavio as wavio
    from engine.audio import InputFrames

    class Empty:
        path, rate, channels, frames = tmp_path / "x.aiff", 24000, 1, 24000

        def read(self, n):
            return np.zeros((0, 1), np.float32)

        def close(self):
            pass
    monkeypatch.setattr(wavio, "open_audio", lambda path: Empty())
    with pytest.raises(WavError, match="x.aiff holds no audio samples \\(its header claims 24,000; none can be read\\)"):
        InputFrames(tmp_path / "x.aiff")


def test_flac_ogg_and_mu_law_inputs_are_read(tmp_path, three_s):
    x, ok = three_s
    ref, _ = read_wav(ok)
    soundfile.write(tmp_path / "a.flac", ref, 8000, subtype="PCM_16")
    y, rate = read_wav(tmp_path / "a.flac")
    assert rate == 8000 and np.array_equal(y, ref)                          # lossless
    for name, subtype in (("a.ogg", "VORBIS"), ("u.wav", "ULAW")):
        soundfile.write(tmp_path / name, ref, 8000, subtype=subtype)
        y, rate = read_wav(tmp_path / name)
        assert rate == 8000 and abs(y.size - ref.size) < 800 and np.corrcoef(y[:20000], ref[:20000])[0, 1] > 0.9
    st = np.stack([ref, -ref], axis=1)
    soundfile.write(tmp_path / "st.flac", st, 8000, subtype="PCM_24")
    assert np.abs(read_wav(tmp_path / "st.flac")[0]).max() < 1e-6             # mixed down


# -- flow.yaml ---------------------------------------------------------------------------------------------

FLOW_OK = ("flow: !new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec\n  encoder: !new:E {}\n"
           "  decoder: !new:D {estimator: !new:DiT {}}\n")


def _alias_bomb(levels: int = 9) -> str:
    doc, prev = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n', "a"
    for n in "bcdefghijk"[:levels - 1]:
        doc += f"{n}: &{n} [{','.join([f'*{prev}'] * 9)}]\n"
        prev = n
    return doc + f"flow: !new:x.CausalMaskedDiffWithXvec\n  encoder: *{prev}\n"


@pytest.mark.parametrize("text, message", [
    (_alias_bomb(), "expands to more than"),
    ("flow: [1, 2]\n", "'flow' must be a !new:...CausalMaskedDiffWithXvec constructor, found a list"),
    ("flow: 3\n", "found a number"),
    ("a: !ref <b>\nb: !ref <a>\nflow: !ref <a>\n", "!ref cycle a -> b -> a"),
    ("flow: " + "[" * 200 + "]" * 200 + "\n", "nested deeper than"),
    ("x: &x [1]\ny: [" + ", ".join(["*x"] * 300) + "]\n", "more than 256 YAML aliases"),
    (FLOW_OK.replace("{}\n  decoder", "{num_blocks: [1]}\n  decoder"), "flow.encoder.num_blocks must be an integer"),
    (FLOW_OK.replace("DiT {}", "DiT {depth: 1e12}"), "flow.decoder.estimator.depth must be an integer"),
    (FLOW_OK.replace("encoder: !new:E {}", "encoder: 5"), "'flow.encoder' must be a !new:"),
    ("flow: [\n", "not a readable flow.yaml"),
])
def test_bad_flow_yaml_is_one_line_and_fast(tmp_path, text, message):
    if "bomb" in message or "expands" in message:
        assert len(text) < 800
    (tmp_path / "flow.yaml").write_text(text)
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as e:
        flow_config_from_yaml(tmp_path / "flow.yaml")
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert message in msg and str(tmp_path / "flow.yaml") in msg and "\n" not in msg


def test_flow_yaml_size_is_bounded_and_a_good_one_still_reads(tmp_path):
    assert flow_config_from_yaml(_write(tmp_path / "flow.yaml", FLOW_OK)).vocab_size == 6561
    with pytest.raises(ValueError, match="larger than 1024 KiB"):
        flow_config_from_yaml(_write(tmp_path / "flow.yaml", FLOW_OK + "#" * (1 << 20)))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- checkpoint tensors ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sa2_ckpt(tmp_path_factory):
    from test_step_audio2_io import _write_checkpoint
    d = tmp_path_factory.mktemp("sa2")
    _write_checkpoint(d, W.random_state_dict(preset("tiny"), seed=2))
    return d


@pytest.mark.parametrize("fname, key, value", [
    ("flow.pt", "decoder.estimator.blocks.0.attn.k_norm.weight", float("nan")),
    ("flow.pt", "encoder_proj.bias", float("-inf")),
    ("hift.pt", "generator.conv_post.bias", "int"),
])
def test_non_finite_or_integer_weights_are_refused(tmp_path, sa2_ckpt, fname, key, value):
    for f in ("flow.yaml", "flow.pt", "hift.pt"):
        (tmp_path / f).write_bytes((sa2_ckpt / f).read_bytes())
    sd = torch.load(tmp_path / fname)
    if value == "int":
        sd[key] = torch.zeros_like(sd[key], dtype=torch.int64)
    else:
        sd[key] = sd[key].clone()
        sd[key].view(-1)[-1] = value
    torch.save(sd, tmp_path / fname)
    with pytest.raises(ValueError) as e:
        W.checkpoint_state(tmp_path)
    msg = str(e.value)
    assert str(tmp_path / fname) in msg and key in msg
    assert ("int64" in msg) if value == "int" else ("NaN or infinite" in msg)


def test_mimi_weights_must_be_finite_floats(tmp_path):
    cfg = mimi_preset("tiny")
    state = MW.random_state(cfg, 1)
    key = f"{MW.TR}.0.linear1.weight"
    state[key] = state[key].to(torch.int32)
    MW.save_checkpoint(state, str(tmp_path / "m.safetensors"))
    with pytest.raises(ValueError, match=f"m.safetensors: tensor {key} is int32"):
        MW.load_checkpoint(str(tmp_path / "m.safetensors"), cfg)


# -- the Moshi weights folder ------------------------------------------------------------------------------

@pytest.mark.parametrize("names, message", [
    ({"moshi_name": "model.pt"}, "only .safetensors weights"),
    ({"mimi_name": "mimi.bin"}, "only .safetensors weights"),
    ({"moshi_name": "../model.safetensors"}, "inside the folder"),
    ({"moshi_name": 7}, "must be a string"),
])
def test_moshi_folder_loads_only_safetensors(tmp_path, names, message):
    for f in ("model.safetensors", "model.pt", "mimi.bin", "tokenizer-e351c8d8-checkpoint125.safetensors"):
        (tmp_path / f).write_bytes(b"x")
    assert validate_folder(tmp_path).lm == tmp_path / "model.safetensors"
    (tmp_path / "config.json").write_text(json.dumps(names))
    with pytest.raises(ValueError, match=message):
        validate_folder(tmp_path)


@pytest.mark.parametrize("config, words", [
    ({"dim": 64, "num_heads": 4}, "AssertionError at test_bad_input_files.py:"),       # a bare assert in moshi
    ({"dim": 64, "heads": 4}, "missing 1 required positional argument: 'num_heads'"),
])
def test_a_partial_moshi_config_is_one_line_naming_it(tmp_path, monkeypatch, config, words):
    """moshi builds the LM from config.json with asserts and plain calls; a config it cannot build from is one
    ValueError naming the config (what `run` prints), never an AssertionError traceback."""
    from engine.backbones.base import TokenFormat
    from engine.backbones.moshi import backbone as MB

    class LMModel:                                  # what moshi's constructor checks, in its own way
        def __init__(self, dim, num_heads, n_q=None, **rest):
            if rest:
                raise TypeError(f"__init__() got an unexpected keyword argument {next(iter(rest))!r}")
            if n_q is None:
                raise AssertionError                # a bare assert: no message of its own

    loaders = SimpleNamespace(get_moshi_lm=lambda path, lm_kwargs, device, dtype: LMModel(**lm_kwargs))
    monkeypatch.setattr(MB, "import_moshi", lambda: (loaders, None, None))
    for f in ("model.safetensors", "tokenizer-e351c8d8-checkpoint125.safetensors"):
        (tmp_path / f).write_bytes(b"x")
    (tmp_path / "config.json").write_text(json.dumps(config))
    b = MB.MoshiBackbone(TokenFormat(8, 2048, 12.5), size="released", device="cpu", checkpoint=str(tmp_path))
    with pytest.raises(ValueError) as e:
        b.start()
    msg = str(e.value)
    assert f"the Moshi config {tmp_path / 'config.json'} does not describe a model moshi can build" in msg
    assert words in msg and "\n" not in msg, msg


# -- the synthetic-weights note ----------------------------------------------------------------------------

def test_the_synthetic_weights_note_is_only_for_synthetic_voices():
    from engine.session import DuplexSession, SessionConfig
    s = DuplexSession(SessionConfig(size="tiny", device="cpu").resolved())
    s.backbone = SimpleNamespace(info=SimpleNamespace(synthetic=True, title="b"), close=lambda: None)
    s.tail = SimpleNamespace(info=SimpleNamespace(synthetic_weights=False, title="t"), fast_paths=lambda: [])
    info = s.info
    assert not info["synthetic"] and "load a checkpoint" not in info["note"] and "backbone" in info["note"]
    s.tail = SimpleNamespace(info=SimpleNamespace(synthetic_weights=True, title="t"), fast_paths=lambda: [])
    assert s.info["synthetic"] and "load a checkpoint" in s.info["note"]
