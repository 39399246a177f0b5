"""Hostile folders and files: every case is one line on stderr, a non-zero exit, at most 5 s of the
command's own work and 500 MB above a baseline run's peak RSS, and nothing written.

Each CLI case runs ``duplexcadence`` in a subprocess (a small wrapper imports torch first and times only the
command itself; the peak RSS comes from ``os.wait4``) and is compared with a baseline run that fails at once on
a missing folder. Cases about permissions run with root's DAC-override capabilities dropped (``setpriv``), so
they hold when the suite runs as root. The app's model-folder checker gets the same folders in one subprocess
(tests/test_hostile_app.py): the same line, bounded the same way.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import pytest

import oracles

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20
WORK_LIMIT_S = 5.0
RSS_LIMIT = 500 * MB
WRAPPER = ("import os, sys, time\nimport numpy, torch\nimport engine.session\n"
           "t0 = time.perf_counter()\nfrom app.main import main\n"
           "try:\n    rc = main(sys.argv[1:])\n"
           "finally:\n    hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM'))\n"
           "    open(os.environ['DC_ELAPSED'], 'w').write(f'{time.perf_counter() - t0} {hwm}')\n"
           "sys.exit(rc)\n")
DROP_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


@dataclass
class Result:
    rc: int
    out: str
    err: str
    work_s: float
    peak: int                       # bytes


def run_cli(args: List[str], scratch: Path, timeout: float = 120.0, drop_dac: bool = False,
            until: Optional[Callable[[], bool]] = None) -> Result:
    """``duplexcadence ARGS`` in a subprocess; ``until``: send SIGINT once it holds (polled)."""
    scratch.mkdir(parents=True, exist_ok=True)
    n = len(list(scratch.iterdir()))
    files = [scratch / f"{k}-{n}" for k in ("stdout", "stderr", "elapsed")]
    cmd = (DROP_DAC if drop_dac else []) + [sys.executable, "-c", WRAPPER, *map(str, args)]
    env = dict(os.environ, DC_ELAPSED=str(files[2]), QT_QPA_PLATFORM="offscreen", RUST_BACKTRACE="1")
    with open(files[0], "wb") as o, open(files[1], "wb") as e:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=o, stderr=e, env=env)
    killer = threading.Timer(timeout, p.kill)
    killer.start()
    if until is not None:
        t0 = time.monotonic()
        while not until() and time.monotonic() - t0 < timeout and p.poll() is None:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
    _, status, usage = os.wait4(p.pid, 0)
    killer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    # the child's own peak (VmHWM: this program's memory since exec). ru_maxrss is no measure here: Linux keeps
    # the largest RSS across exec, so a child forked from a big pytest process reports the parent's size
    work, hwm_kb = (files[2].read_text().split() + [""])[:2] if files[2].exists() else ("inf", "")
    peak = int(hwm_kb) * 1024 if hwm_kb else usage.ru_maxrss * 1024
    return Result(p.returncode, files[0].read_text(errors="replace"), files[1].read_text(errors="replace"),
                  float(work), peak)


def snapshot(*folders: Path) -> Dict[str, tuple]:
    out = {}
    for f in folders:
        if f.is_dir():
            for p in sorted(f.rglob("*")):
                st = os.lstat(p)
                out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def assert_refused(r: Result, base: Result, message: str, out_dir: Path, before=None, after=None) -> str:
    """One line naming ``message``, non-zero exit, bounded work and memory, nothing in ``out_dir``."""
    lines = [ln for ln in r.err.strip().splitlines() if ln.strip()]
    assert r.rc != 0, r.err
    assert len(lines) == 1 and "Traceback" not in r.err, r.err[-3000:]
    assert message in lines[0], lines[0]
    assert r.work_s <= WORK_LIMIT_S, f"{r.work_s:.1f} s: {lines[0]}"
    assert r.peak - base.peak <= RSS_LIMIT, f"{(r.peak - base.peak) / MB:.0f} MB above the baseline"
    assert list(out_dir.iterdir()) == [], list(out_dir.iterdir())
    assert before == after
    return lines[0]


# -- the folders ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wav(tmp_path_factory) -> Path:
    from engine.wavio import write_wav
    p = tmp_path_factory.mktemp("in") / "in.wav"
    return write_wav(p, 0.1 * np.random.default_rng(5).standard_normal(24000).astype(np.float32), 24000)


@pytest.fixture(scope="module")
def minicpm(tmp_path_factory) -> Path:
    return build_minicpm(tmp_path_factory)


def build_minicpm(tmp_path_factory) -> Path:
    """A sound tiny MiniCPM-o 4.5 folder in the released layout (the cases copy and break it)."""
    oracles.require(oracles.TOKENIZERS)
    from safetensors.torch import save_file
    from test_minicpmo45_weights import _config, _tokenizer, _weights
    p = tmp_path_factory.mktemp("MiniCPM-o-4_5")
    (p / "config.json").write_text(json.dumps(_config(), indent=2))
    (p / "added_tokens.json").write_text(json.dumps(_tokenizer(p)))
    w = _weights()
    keys = sorted(w)
    wm = {}
    for name, ks in (("model-00001-of-00002.safetensors", keys[:len(keys) // 2]),
                     ("model-00002-of-00002.safetensors", keys[len(keys) // 2:])):
        save_file({k: w[k] for k in ks}, str(p / name))
        wm.update({k: name for k in ks})
    (p / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return p


def _config_edit(**fields) -> Callable[[Path], None]:
    def edit(p: Path) -> None:
        cfg = json.loads((p / "config.json").read_text())
        cfg.update(fields)
        (p / "config.json").write_text(json.dumps(cfg))
    return edit


def _write(name: str, text) -> Callable[[Path], None]:
    def edit(p: Path) -> None:
        (p / name).write_bytes(text.encode() if isinstance(text, str) else text)
    return edit


def _tokenizer_edit(fn) -> Callable[[Path], None]:
    def edit(p: Path) -> None:
        doc = json.loads((p / "tokenizer.json").read_text())
        fn(doc)
        (p / "tokenizer.json").write_text(json.dumps(doc))
    return edit


def _shards_outside(link: bool) -> Callable[[Path], None]:
    """The first shard moved out of the folder: named by its absolute path, or replaced by a symbolic link to a
    FIFO outside it (a link to a regular file anywhere is what a hub snapshot holds, and is read)."""
    def edit(p: Path) -> None:
        name = "model-00001-of-00002.safetensors"
        outside = p.parent / f"{p.name}-outside.safetensors"
        shutil.move(str(p / name), outside)
        idx = json.loads((p / "model.safetensors.index.json").read_text())
        if link:
            fifo = p.parent / f"{p.name}-outside.fifo"
            os.mkfifo(fifo)
            (p / name).symlink_to(fifo)
        else:
            idx["weight_map"] = {k: (str(outside) if v == name else v) for k, v in idx["weight_map"].items()}
        (p / "model.safetensors.index.json").write_text(json.dumps(idx))
    return edit


def _merge_bomb(doc: dict) -> None:
    doc["model"] = {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"] * 2_500_000}


DEEP = 100_000
MINICPM_CASES = {
    "nested config.json": (_write("config.json", '{"a":' * DEEP + "1" + "}" * DEEP), "nested 100,000 levels deep"),
    "zero heads": (_config_edit(num_attention_heads=0), "num_attention_heads must be a whole number from 1"),
    "a list for a number": (_config_edit(hidden_size=[64]), "hidden_size must be a whole number"),
    "negative hidden size": (_config_edit(hidden_size=-64), "hidden_size must be a whole number"),
    "vocabulary of 10^9": (_config_edit(vocab_size=10 ** 9), "vocab_size must be a whole number from 16"),
    "10^5 layers": (_config_edit(num_hidden_layers=10 ** 5), "num_hidden_layers must be a whole number"),
    "more weights than memory": (_config_edit(hidden_size=16384, num_hidden_layers=256, intermediate_size=131072,
                                              num_attention_heads=128, num_key_value_heads=8, head_dim=128),
                                 "more than the"),
    "5,000,000 values": (_write("config.json", '{"a": [' + ",".join(['"a"'] * 5_000_000) + "]}"),
                         "holds 5,000,000 values, more than the 2,097,152"),
    "NaN field": (_write("config.json", '{"rope_theta": NaN}'), "NaN: every number must be finite"),
    "100,000-digit integer": (_write("config.json", '{"hidden_size": ' + "9" * DEEP + "}"),
                              "integer of 100,000 digits"),
    "added tokens a list": (_write("added_tokens.json", "[1, 2]"), "does not hold a JSON object"),
    "added token negative": (_write("added_tokens.json", '{"<unit>": -5}'), "must be a whole number from 0"),
    "tokenizer panics when read": (_tokenizer_edit(lambda d: d.update(normalizer={
        "type": "Precompiled", "precompiled_charsmap": "/////w=="})), "could not be read as a tokenizer"),
    "tokenizer panics on any text": (_tokenizer_edit(lambda d: d.update(normalizer={
        "type": "Precompiled", "precompiled_charsmap": "AAAAAA=="})), "could not be read as a tokenizer"),
    "BPE merge bomb": (_tokenizer_edit(_merge_bomb), "values, more than the 2,097,152 such a file has"),
    "absolute shard path": (_shards_outside(link=False), "outside the folder"),
    "shard linked to a FIFO outside": (_shards_outside(link=True), "which is a link to a FIFO"),
}


def _alias_bomb(key: str) -> str:
    doc, prev = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n', "a"
    for n in "bcdefghij":
        doc += f"{n}: &{n} [{','.join([f'*{prev}'] * 9)}]\n"
        prev = n
    return doc + f"{key}: *{prev}\n"


CODEC_CASES = {
    "alias bomb": (_alias_bomb("codec_config"), "expands to more than"),
    "num_quantizers 1e8": ("num_quantizers: 100000000\n", "num_quantizers must be a whole number from 1 to 256"),
    "num_blocks 1e7": ("num_blocks: 10000000\n", "num_blocks must be a whole number from 0 to 64"),
    "nested YAML": ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than 64 levels"),
    "5,000 rates": ("rates: [" + ", ".join(["2"] * 5000) + "]\n", "must be a list of 1 to 8 whole numbers"),
    "10,000-digit integer": ("latent_size: " + "7" * 10_000 + "\n", "integer of 10,000 digits"),
    "100,000-digit integer": ("latent_size: " + "7" * DEEP + "\n", "has a line of 100,013 characters"),
}


def _safetensors(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


MIMI_CASES = {
    "nested header": (_safetensors(b'{"a":' * 20_000 + b"1" + b"}" * 20_000), "nested 20,000 levels deep"),
    "integer shape": (_safetensors(b'{"w": {"dtype": "F32", "shape": 5, "data_offsets": [0, 20]}}' + b" " * 20),
                      "has shape 5; a shape is a list"),
}


MOSHI_CASES = {
    "zero heads": ('{"dim": 64, "num_heads": 0}', "num_heads must be a whole number from 1"),
    "a width of 10^9": ('{"dim": 1000000000}', "dim must be a whole number from 0 to 1,048,576"),
    "more weights than memory": ('{"dim": 32768, "num_heads": 32, "num_layers": 256}', "more than the"),
    "nested config.json": ('{"a":' * DEEP + "1" + "}" * DEEP, "nested 100,000 levels deep"),
}


def _case_folder(tmp: Path, kind: str, case: str, minicpm: Optional[Path] = None) -> tuple:
    """(the run arguments naming the broken folder or file, the folder to snapshot)."""
    if kind == "minicpm":
        p = tmp / "MiniCPM-o-4_5"
        shutil.copytree(minicpm, p)
        MINICPM_CASES[case][0](p)
        return ["--backbone", "minicpm-o-4.5", "--model", "step-audio2", "--backbone-checkpoint", p], p
    if kind == "moshi":
        p = tmp / "moshi"
        p.mkdir()
        (p / "config.json").write_text(MOSHI_CASES[case][0])
        for name in ("model.safetensors", "tokenizer-e351c8d8-checkpoint125.safetensors"):
            (p / name).write_bytes(_safetensors(b"{}"))
        return ["--backbone", "moshi", "--model", "mimi", "--backbone-checkpoint", p], p
    if kind == "codec":
        p = tmp / "codec"
        p.mkdir()
        (p / "codec_config.yaml").write_text(CODEC_CASES[case][0])
        (p / "codec.safetensors").write_bytes(_safetensors(b"{}"))
        return ["--model", "nemotron-codec", "--checkpoint", p], p
    if kind == "mimi":
        p = tmp / "mimi"
        p.mkdir()
        (p / "tokenizer-e351c8d8-checkpoint125.safetensors").write_bytes(MIMI_CASES[case][0])
        return ["--model", "mimi", "--checkpoint", p / "tokenizer-e351c8d8-checkpoint125.safetensors"], p
    p = tmp / "token2wav"
    p.mkdir()
    (p / "flow.yaml").write_text("flow: " + "[\n" * DEEP + "]\n" * DEEP)
    for name in ("flow.pt", "hift.pt"):
        (p / name).write_bytes(b"PK\x03\x04")
    return ["--model", "step-audio2", "--checkpoint", p], p


ALL_CASES = ([("minicpm", c) for c in MINICPM_CASES] + [("codec", c) for c in CODEC_CASES]
             + [("mimi", c) for c in MIMI_CASES] + [("moshi", c) for c in MOSHI_CASES]
             + [("flow", "flow.yaml nested 100,000 deep")])
MESSAGES = {("minicpm", c): m for c, (_, m) in MINICPM_CASES.items()}
MESSAGES.update({("codec", c): m for c, (_, m) in CODEC_CASES.items()})
MESSAGES.update({("mimi", c): m for c, (_, m) in MIMI_CASES.items()})
MESSAGES.update({("moshi", c): m for c, (_, m) in MOSHI_CASES.items()})
MESSAGES[("flow", "flow.yaml nested 100,000 deep")] = "nested deeper than 64 levels"


def _run_args(wav: Path, out: Path) -> list:
    return ["run", "--input", wav, "--output", out / "out.wav", "--log", out / "log", "--size", "tiny",
            "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, wav) -> Result:
    """A run refused at once (the folder does not exist): the startup every case is measured against."""
    tmp = tmp_path_factory.mktemp("baseline")
    out = tmp / "out"
    out.mkdir()
    r = run_cli(_run_args(wav, out) + ["--backbone", "minicpm-o-4.5", "--model", "step-audio2",
                                       "--backbone-checkpoint", tmp / "missing"], tmp / "scratch")
    assert r.rc != 0 and "does not exist" in r.err, r.err
    return r


@pytest.mark.parametrize("kind, case", ALL_CASES, ids=[f"{k}: {c}" for k, c in ALL_CASES])
def test_a_hostile_folder_is_one_line(tmp_path, wav, minicpm, baseline, kind, case):
    args, folder = _case_folder(tmp_path, kind, case, minicpm)
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(folder)
    r = run_cli(_run_args(wav, out) + args, tmp_path / "scratch")
    assert_refused(r, baseline, MESSAGES[(kind, case)], out, before, snapshot(folder))


NOEXEC = {"minicpm": ["--backbone", "minicpm-o-4.5", "--model", "step-audio2", "--backbone-checkpoint"],
          "moshi": ["--backbone", "moshi", "--model", "mimi", "--backbone-checkpoint"],
          "codec": ["--model", "nemotron-codec", "--checkpoint"], "token2wav": ["--model", "step-audio2", "--checkpoint"]}


@pytest.mark.parametrize("kind", sorted(NOEXEC))
def test_a_folder_without_execute_permission_is_one_line(tmp_path, wav, minicpm, baseline, kind):
    p = tmp_path / "noexec"
    if kind == "minicpm":
        shutil.copytree(minicpm, p)
    else:
        p.mkdir()
        names = {"moshi": ["model.safetensors", "tokenizer-e351c8d8-checkpoint125.safetensors"],
                 "codec": ["codec_config.yaml", "codec.safetensors"], "token2wav": ["flow.yaml", "flow.pt", "hift.pt"]}
        for name in names[kind]:
            (p / name).write_bytes(b"")
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(p)
    p.chmod(0o600)
    try:
        r = run_cli(_run_args(wav, out) + NOEXEC[kind] + [p], tmp_path / "scratch", drop_dac=True)
    finally:
        p.chmod(0o755)
    line = assert_refused(r, baseline, "permission denied", out, before, snapshot(p))
    assert str(p) in line and "chmod u+rx" in line


# -- token files, arrays, outputs -------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "serve"])
@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "folder"])
def test_a_token_file_must_be_a_small_regular_file(tmp_path, wav, baseline, command, kind):
    token = Path("/dev/zero") if kind == "/dev/zero" else tmp_path / "token"
    if kind == "fifo":
        os.mkfifo(token)
    elif kind == "folder":
        token.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    args = (_run_args(wav, out) + ["--model", "mimi", "--engine", "ws://127.0.0.1:9", "--token-file", token]
            if command == "run" else ["serve", "--host", "127.0.0.1", "--port", "9", "--token-file", token])
    r = run_cli(args, tmp_path / "scratch", timeout=60)
    kinds = {"fifo": "a FIFO", "/dev/zero": "a device", "folder": "a folder"}
    assert_refused(r, baseline, f"it is {kinds[kind]}, not a regular file", out)


def _npy_claiming(path: Path, shape: tuple, dtype=np.int64, body: int = 64) -> Path:
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                                 "shape": shape})
        f.write(b"\0" * body)
    return path


def _npz_inflating(path: Path, nbytes: int) -> Path:
    """An .npz whose one array really holds ``nbytes`` of zeros (it compresses to almost nothing)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open("prompt_mel.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (nbytes // 4,)})
        chunk = b"\0" * (8 * MB)
        for _ in range(nbytes // len(chunk)):
            f.write(chunk)
    return path


@pytest.mark.parametrize("case", ["npy tokens claiming 8 GB", "npz prompt claiming 8 GB", "npz prompt of 300 MB"])
def test_arrays_claiming_huge_sizes_are_refused_before_allocating(tmp_path, wav, baseline, case):
    out = tmp_path / "out"
    out.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    if case.startswith("npy"):
        args = ["synth", "--model", "mimi", "--size", "tiny", "--codes",
                _npy_claiming(src / "codes.npy", (8, 10 ** 9 // 8)), "--out", out / "o.npy"]
        message = "claims an array of 8,000,000,000 bytes"
    else:
        if "8 GB" in case:
            z = src / "voice.npz"
            with zipfile.ZipFile(z, "w") as zf:
                zf.write(_npy_claiming(src / "m.npy", (10 ** 9,), np.float64), "prompt_mel.npy")
            message = "claims an array of 8,000,000,000 bytes"
        else:
            z = _npz_inflating(src / "voice.npz", 300 * MB)
            message = "more than the 256 MiB"
        args = _run_args(wav, out) + ["--model", "step-audio2", "--voice", z]
    r = run_cli(args, tmp_path / "scratch")
    assert_refused(r, baseline, message, out)


def test_outputs_at_a_mount_point_or_an_unwritable_parent_are_refused_up_front(tmp_path, wav, baseline):
    mount = next((p for p in ("/proc", "/sys", "/dev/shm") if os.path.ismount(p)), None)
    if mount is None:
        pytest.skip("no mount point to aim at")
    out = tmp_path / "out"
    out.mkdir()
    r = run_cli(["run", "--input", wav, "--output", out / "o.wav", "--log", mount, "--model", "mimi", "--size",
                 "tiny", "--device", "cpu"], tmp_path / "scratch")
    assert_refused(r, baseline, f"--log {mount} is a mount point", out)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        r = run_cli(["run", "--input", wav, "--output", out / "o.wav", "--log", locked / "logs", "--model", "mimi",
                     "--size", "tiny", "--device", "cpu"], tmp_path / "scratch", drop_dac=True)
    finally:
        locked.chmod(0o755)
    assert_refused(r, baseline, f"cannot write into {locked}", out)
    assert list(locked.iterdir()) == []
