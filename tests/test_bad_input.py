"""Bad input to the command lines: one clear line, a non-zero exit, nothing destroyed.

Arguments (--seconds, --seed), output paths (special files, links, the input itself), atomic writes
(a full disk keeps the old file; the umask's mode), and `synth`'s outputs (.npy/.wav, never NaN).
"""
from __future__ import annotations

import argparse
import errno
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from engine import checkpoints
from engine.atomic import atomic_write
from engine.cli import run as run_cli
from engine.cli import synth as synth_cli
from engine.cli.validate import count, output_file, output_folder, seconds, seed
from engine.models.mimi import weights as MW
from engine.models.mimi.config import preset as mimi_preset
from engine.npio import save_audio
from engine.wavio import read_wav, write_wav

RNG = np.random.default_rng(10)
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def in_wav(tmp_path):
    return write_wav(tmp_path / "in.wav", 0.1 * RNG.standard_normal(24000 * 2).astype(np.float32), 24000)


@pytest.fixture(scope="module")
def mimi_ckpt(tmp_path_factory):
    """A tiny Mimi checkpoint and codes for it (CPU, well under a second to decode)."""
    d = tmp_path_factory.mktemp("mimi")
    cfg = mimi_preset("tiny")
    MW.save_checkpoint(MW.random_state(cfg, 3), str(d / "mimi.safetensors"))
    np.save(d / "codes.npy", np.random.RandomState(0).randint(0, cfg.bins, (cfg.n_q, 12)))
    return d


def _synth_mimi(d, out, *extra):
    return synth_cli.main(["--model", "mimi", "--size", "tiny", "--codes", str(d / "codes.npy"), "--mode", "stock",
                           "--out", str(out), *extra])


# -- arguments -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e9", "0", "-1", "abc", "86401"])
def test_seconds_must_be_finite_positive_and_sane(text):
    with pytest.raises(argparse.ArgumentTypeError):
        seconds(text)


def test_seconds_and_seed_accept_what_users_mean():
    assert seconds("2.5") == 2.5 and seconds("86400") == 86400.0
    assert seed("0") == 0 and seed(str(2 ** 63 - 1)) == 2 ** 63 - 1
    for bad in (str(2 ** 64), "-1", "1.5", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            seed(bad)
    assert count("8") == 8
    for bad in ("0", "-1", "1e3", str(2 ** 40)):
        with pytest.raises(argparse.ArgumentTypeError):
            count(bad)


@pytest.mark.parametrize("argv", [["--seconds", "nan"], ["--seconds", "1e9"], ["--seconds", "0"],
                                  ["--seed", str(2 ** 64)]])
def test_every_command_line_refuses_bad_numbers_in_one_line(argv, tmp_path, in_wav, capsys):
    from app.gui_main import main as gui_main
    run_argv = ["--input", str(in_wav), "--output", str(tmp_path / "o.wav"), "--log", str(tmp_path / "log")]
    synth_argv = ["--model", "mimi", "--out", str(tmp_path / "o.npy")]
    for main, base in ((run_cli.main, run_argv), (synth_cli.main, synth_argv), (gui_main, ["--input-file", str(in_wav)])):
        with pytest.raises(SystemExit) as e:
            main(base + argv)
        assert e.value.code == 2
        line = _one_line(capsys.readouterr().err)
        assert argv[0] in line and "error" in line and "Overflow" not in line
    assert not (tmp_path / "o.wav").exists() and not (tmp_path / "log").exists()


@pytest.mark.parametrize("cmd,argv", [
    ("capacity", ["--seconds", "nan"]), ("capacity", ["--window", "inf"]), ("capacity", ["--ramp-limit", "-1"]),
    ("capacity", ["--time-limit", "nan"]), ("serve-capacity", ["--seconds", "nan"]), ("echo", ["--gain-db", "nan"]),
    ("session", ["--seconds", "-inf"]), ("step-audio2", ["--prompt-seconds", "nan"]),
])
def test_every_benchmark_refuses_a_number_that_is_not_finite_in_one_line(cmd, argv, capsys):
    """nan compares false with every bound: a benchmark given one must refuse it (exit 2), not run and exit 0."""
    from engine.bench.cli import main as bench_main
    try:
        rc = bench_main([cmd, *argv])
    except SystemExit as e:
        rc = e.code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and argv[0] in err[0] and "Traceback" not in err[0], (rc, err)


def test_serve_refuses_numbers_that_are_not_finite(capsys):
    from engine.cli.serve import main as serve_main
    for argv in (["--drain-timeout", "nan"], ["--cpus-per-replica", "inf"], ["--drain-seconds", "nan"]):
        with pytest.raises(SystemExit) as e:
            serve_main(argv)
        assert e.value.code == 2 and argv[0] in _one_line(capsys.readouterr().err)


# -- output paths ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--log", "--output"])
def test_an_empty_output_name_is_refused_not_read_as_the_current_folder(flag, tmp_path, in_wav, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = {"--output": str(tmp_path / "o.wav"), "--log": str(tmp_path / "log"), flag: ""}
    rc = run_cli.main(["--input", str(in_wav), "--output", argv["--output"], "--log", argv["--log"], "--model",
                       "mimi", "--size", "tiny", "--device", "cpu", "--quiet"])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and f"{flag} is empty" in line
    assert [p.name for p in tmp_path.iterdir()] == ["in.wav"]                   # nothing written here

def _specials(tmp_path):
    """A FIFO, a symlink to a file, a folder and (as root) a copy of /dev/null: none may be replaced."""
    (tmp_path / "target.wav").write_bytes(b"keep me")
    os.mkfifo(tmp_path / "fifo.wav")
    os.symlink(tmp_path / "target.wav", tmp_path / "link.wav")
    (tmp_path / "dir.wav").mkdir()
    names = ["fifo.wav", "link.wav", "dir.wav"]
    if IS_ROOT:
        os.mknod(tmp_path / "null.wav", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        names.append("null.wav")
    return names


def _kinds(tmp_path):
    return {n: stat.S_IFMT(os.lstat(tmp_path / n).st_mode) for n in os.listdir(tmp_path)}


def test_outputs_that_are_special_files_are_refused_and_left_alone(tmp_path):
    names = _specials(tmp_path)
    before = _kinds(tmp_path)
    for n in names:
        with pytest.raises(ValueError, match=n):
            output_file(tmp_path / n, "--output")
        with pytest.raises(OSError, match="cannot write"):
            atomic_write(tmp_path / n, lambda f: f.write(b"x"))
        with pytest.raises(ValueError, match="cannot write"):
            write_wav(tmp_path / n, np.zeros(10, np.float32), 8000)
    assert _kinds(tmp_path) == before and (tmp_path / "target.wav").read_bytes() == b"keep me"
    os.symlink(tmp_path / "dir.wav", tmp_path / "linkdir")
    with pytest.raises(ValueError, match="symbolic link"):
        output_folder(tmp_path / "linkdir", "--log")
    with pytest.raises(ValueError, match="not a folder"):
        output_folder(tmp_path / "target.wav", "--log")
    assert output_folder(tmp_path / "dir.wav", "--log") == tmp_path / "dir.wav"


def test_an_output_that_is_the_input_is_refused(tmp_path, in_wav, capsys):
    os.link(in_wav, tmp_path / "hard.wav")                  # same inode under another name
    data = in_wav.read_bytes()
    for out in (in_wav, tmp_path / "hard.wav", tmp_path / "." / "in.wav"):
        with pytest.raises(ValueError, match="input"):
            output_file(out, "--output", inputs=[str(in_wav)])
        rc = run_cli.main(["--input", str(in_wav), "--output", str(out), "--log", str(tmp_path / "log")])
        assert rc == 2 and "--output" in _one_line(capsys.readouterr().err)
    with pytest.raises(ValueError, match="input"):
        output_folder(tmp_path, "--export", inputs=[str(tmp_path / "hard.wav")], names=["hard.wav"])
    assert in_wav.read_bytes() == data and not (tmp_path / "log").exists()


def test_run_refuses_special_outputs_before_starting(tmp_path, in_wav, capsys):
    names = _specials(tmp_path)
    before = _kinds(tmp_path)
    for n in names:
        rc = run_cli.main(["--input", str(in_wav), "--output", str(tmp_path / n), "--log", str(tmp_path / "log")])
        assert rc == 2 and n in _one_line(capsys.readouterr().err)
    rc = run_cli.main(["--input", str(in_wav), "--output", str(tmp_path / "o.wav"), "--log", str(tmp_path / "link.wav")])
    assert rc == 2 and "--log" in _one_line(capsys.readouterr().err)
    assert _kinds(tmp_path) == before


def test_gui_refuses_special_outputs_before_opening_a_window(tmp_path, in_wav, qapp, capsys):
    from app.gui_main import main as gui_main
    names = _specials(tmp_path)
    before = _kinds(tmp_path)
    for flag, n in (("--output-file", names[0]), ("--screenshot", "link.png"), ("--export", "link.wav"),
                    ("--output-file", "in.wav"), ("--screenshot", "shot.gif")):
        if n == "link.png":
            os.symlink(tmp_path / "target.wav", tmp_path / n)
        target = in_wav if n == "in.wav" else tmp_path / n
        assert gui_main(["--input-file", str(in_wav), "--settings", str(tmp_path / "s.ini"), flag, str(target)]) == 2
        assert flag in _one_line(capsys.readouterr().err)
    after = _kinds(tmp_path)
    after.pop("s.ini", None)
    assert after == {**before, "link.png": stat.S_IFLNK}


def test_outputs_into_a_missing_folder_or_an_unwritable_place_are_refused_before_any_work(tmp_path, in_wav, qapp,
                                                                                          capsys):
    """A file's folder must exist (a typo is not made into a new folder); a place that takes no new folder
    (/proc, as root too) is refused before the session, not after it ran."""
    from app.gui_main import main as gui_main
    missing = tmp_path / "no-such-folder" / "o.wav"
    with pytest.raises(ValueError, match="the folder .*no-such-folder does not exist"):
        output_file(missing, "--output")
    assert output_folder(tmp_path / "new" / "log", "--log", names=["a.csv"]) == tmp_path / "new" / "log"
    rc = run_cli.main(["--input", str(in_wav), "--output", str(missing), "--log", str(tmp_path / "log")])
    assert rc == 2 and "does not exist" in _one_line(capsys.readouterr().err)
    for flag, target in (("--output-file", missing), ("--screenshot", tmp_path / "gone" / "s.png")):
        assert gui_main(["--input-file", str(in_wav), "--settings", str(tmp_path / "s.ini"), flag, str(target)]) == 2
        assert f"{flag} {target}: the folder" in _one_line(capsys.readouterr().err)
    if Path("/proc/self").is_dir():
        with pytest.raises(ValueError, match="cannot write into /proc"):
            output_folder("/proc/duplexcadence-export", "--export")
        assert gui_main(["--input-file", str(in_wav), "--settings", str(tmp_path / "s.ini"), "--export",
                         "/proc/duplexcadence-export"]) == 2
        assert "--export /proc/duplexcadence-export: cannot write into /proc" in _one_line(capsys.readouterr().err)
    assert not any((tmp_path / n).exists() for n in ("no-such-folder", "gone", "new", "log"))


# -- atomic writes ----------------------------------------------------------------------------------------

def test_a_full_disk_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.npy"
    np.save(path, np.arange(5.0))
    old = path.read_bytes()

    def disk_full(f):
        f.write(b"\x93NUMPY half a header")
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError, match="No space left on device") as e:
        atomic_write(path, disk_full, sync=True)
    assert str(path) in str(e.value)
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["out.npy"]


def test_new_files_get_the_umask_mode_and_replaced_files_keep_theirs(tmp_path):
    old = os.umask(0o027)
    try:
        write_wav(tmp_path / "a.wav", np.zeros(8, np.float32), 8000)
        assert stat.S_IMODE(os.stat(tmp_path / "a.wav").st_mode) == 0o640
        os.umask(0o002)
        atomic_write(tmp_path / "b.txt", lambda f: f.write("x"), text=True)
        assert stat.S_IMODE(os.stat(tmp_path / "b.txt").st_mode) == 0o664
        os.chmod(tmp_path / "a.wav", 0o604)
        write_wav(tmp_path / "a.wav", np.zeros(9, np.float32), 8000)
        assert stat.S_IMODE(os.stat(tmp_path / "a.wav").st_mode) == 0o604
    finally:
        os.umask(old)


# -- synth outputs -----------------------------------------------------------------------------------------

def test_synth_writes_wav_or_npy_and_reports_what_it_wrote(tmp_path, mimi_ckpt, capsys):
    assert _synth_mimi(mimi_ckpt, tmp_path / "x.npy", "--seed", "5") == 0
    assert "x.npy" in capsys.readouterr().err
    assert _synth_mimi(mimi_ckpt, tmp_path / "x.wav", "--seed", "5") == 0
    assert str(tmp_path / "x.wav") in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["x.npy", "x.wav"]               # no x.wav.npy
    ref = np.load(tmp_path / "x.npy")
    y, rate = read_wav(tmp_path / "x.wav")
    assert rate == mimi_preset("tiny").sample_rate and y.shape == ref.shape
    assert np.max(np.abs(y - np.clip(ref, -1, 32767 / 32768))) <= 0.5 / 32768 + 1e-7
    assert _synth_mimi(mimi_ckpt, tmp_path / "x.flac") == 1
    assert ".npy or .wav" in _one_line(capsys.readouterr().err)


def test_synth_on_a_full_disk_keeps_the_old_output(tmp_path, mimi_ckpt, capsys, monkeypatch):
    out = tmp_path / "x.npy"
    np.save(out, np.arange(3.0))
    old = out.read_bytes()

    def disk_full(f, arr, allow_pickle=False):
        f.write(b"\x93NUMPY" + b"\0" * 40)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(np, "save", disk_full)
    assert _synth_mimi(mimi_ckpt, out) == 1
    assert "No space left on device" in _one_line(capsys.readouterr().err)
    assert out.read_bytes() == old and os.listdir(tmp_path) == ["x.npy"]


def test_synth_never_writes_nan_audio(tmp_path, mimi_ckpt, capsys, monkeypatch):
    with pytest.raises(ValueError, match="NaN"):
        save_audio(tmp_path / "a.npy", np.array([0.0, np.nan, 0.5], np.float32), 24000)
    state = MW.random_state(mimi_preset("tiny"), 3)
    key = "decoder.model.0.conv.conv.bias"
    state[key][0] = float("nan")
    MW.save_checkpoint(state, str(tmp_path / "nan.safetensors"))
    argv = ["--checkpoint", str(tmp_path / "nan.safetensors")]
    assert _synth_mimi(mimi_ckpt, tmp_path / "a.npy", *argv) == 1             # refused when loading
    line = _one_line(capsys.readouterr().err)
    assert "nan.safetensors" in line and key in line and "NaN" in line
    monkeypatch.setattr(checkpoints, "check_tensor", lambda *a: None)      # past the loader: the output check
    assert _synth_mimi(mimi_ckpt, tmp_path / "a.npy", *argv) == 1
    assert "NaN" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "a.npy").exists()


def test_synth_refuses_an_npz_tokens_file_and_the_input_as_output(tmp_path, mimi_ckpt, capsys):
    np.savez(tmp_path / "t.npz", tokens=np.arange(30))
    argv = ["--model", "step-audio2", "--size", "tiny", "--tokens", str(tmp_path / "t.npz"), "--out"]
    assert synth_cli.main(argv + [str(tmp_path / "o.npy")]) == 1
    assert ".npz" in _one_line(capsys.readouterr().err)
    codes = mimi_ckpt / "codes.npy"
    data = codes.read_bytes()
    assert _synth_mimi(mimi_ckpt, codes) == 1
    assert "input" in _one_line(capsys.readouterr().err) and codes.read_bytes() == data


def test_a_fifo_output_never_blocks_a_command(tmp_path, mimi_ckpt, capsys):
    os.mkfifo(tmp_path / "f.npy")
    done = []
    t = threading.Thread(target=lambda: done.append(_synth_mimi(mimi_ckpt, tmp_path / "f.npy")), daemon=True)
    t.start()
    t.join(60)
    assert done == [1] and "FIFO" in _one_line(capsys.readouterr().err)
