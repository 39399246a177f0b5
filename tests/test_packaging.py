"""Packaging: the asset locator, the desktop entry and its installer (fast), and the frozen bundle (slow).

The slow tests (``make package-test``, i.e. ``pytest -m slow tests/test_packaging.py``) build the
PyInstaller bundle with ``packaging/build.sh``, unpack the tarball into a temporary folder and run a
scripted session from there, offscreen, with an environment that has no Python setup and a working
directory outside the repository. ``DUPLEXCADENCE_REUSE_BUNDLE=1`` reuses an existing ``dist/``
build instead of building (for iterating on these tests only).
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import time
import wave
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from engine import paths
from engine.audio import read_wav

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
DESKTOP = PACKAGING / "duplexcadence.desktop"
INSTALLER = PACKAGING / "install-desktop-entry.sh"


# ---------------------------------------------------------------- asset locator (fast)

def test_assets_dir_is_the_repository_folder_from_source(monkeypatch):
    monkeypatch.delenv(paths.ENV_VAR, raising=False)
    assert paths.assets_dir() == ROOT / "assets"
    assert paths.asset("duplexcadence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_assets_dir_is_inside_the_bundle_when_frozen(monkeypatch, tmp_path):
    monkeypatch.delenv(paths.ENV_VAR, raising=False)
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "x.bin").write_bytes(b"\x01")
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "_MEIPASS", str(tmp_path), raising=False)
    assert paths.is_frozen()
    assert paths.asset("x.bin") == tmp_path / "assets" / "x.bin"
    with pytest.raises(FileNotFoundError, match="duplexcadence.png"):
        paths.asset("duplexcadence.png")             # never falls back to the source tree


def test_asset_override_and_bad_names(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path))
    assert paths.assets_dir() == tmp_path
    for bad in ("../pyproject.toml", "/etc/passwd"):
        with pytest.raises(ValueError, match="relative"):
            paths.asset(bad)


# ---------------------------------------------------------------- optional GPU modules never break start-up (fast)

NO_SOURCE_SCRIPT = r'''
import sys, torch, triton
def jit(*args, **kwargs):                     # what @triton.jit does in a frozen app: it reads the kernel's source
    raise OSError("could not get source code")
triton.jit = jit
from app.main import main
try:
    main(["--help"])
except SystemExit as e:
    assert e.code == 0, e.code
from engine.models import registry
from engine.models.step_audio2 import fused
assert "step-audio2" in registry.names(), registry.names()
print("TRIED-AT-START", fused.triton is not None or fused._why_not is not None)
cuda = torch.device("cuda")
for _ in range(2):
    print("WHY", fused.available(cuda))
print("CPU", fused.available(torch.device("cpu")))
try:
    fused.mul_add(torch.randn(1, 2, 3), torch.randn(1, 1, 3), torch.randn(1, 1, 3))
except RuntimeError as e:
    print("RAISED", e)
'''


def test_the_app_starts_when_triton_cannot_define_its_kernels():
    """PyInstaller keeps bytecode only, so ``@triton.jit`` finds no kernel source in the bundle. The app must still
    start (Triton is not even tried then), and Step-Audio2's fused path reports why it is off, logged once."""
    pytest.importorskip("triton")
    r = subprocess.run([sys.executable, "-c", NO_SOURCE_SCRIPT], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, QT_QPA_PLATFORM="offscreen"), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    assert "TRIED-AT-START False" in out, r.stdout[-2000:]
    why = "Triton cannot define its kernels here (OSError: could not get source code)"
    assert out.count(f"WHY {why}") == 2, r.stdout[-2000:]
    assert "CPU a CUDA kernel (Triton)" in out
    assert f"RAISED the fused elementwise kernel cannot run: {why}" in out
    logged = [line for line in r.stderr.splitlines() if "fused elementwise: off" in line]
    assert logged == [f"step-audio2 fused elementwise: off, {why}; PyTorch's kernels run instead (same bits)"], \
        r.stderr[-2000:]


# ---------------------------------------------------------------- package metadata (fast)

METADATA_SCRIPT = r"""
import sys
from setuptools import build_meta
print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))
"""


def test_the_package_metadata_builds_without_deprecation_boxes(tmp_path):
    """The license is an SPDX expression (PEP 639): setuptools prints no deprecation box on an install."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates SPDX licenses (the build itself asks for >= 77)")
    for name in ("pyproject.toml", "README.md", "NOTICE"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "meta").mkdir()
    r = subprocess.run([sys.executable, "-W", "always", "-c", METADATA_SCRIPT, str(tmp_path / "meta")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Deprecat" not in r.stdout + r.stderr, r.stderr[-3000:]
    meta = next((tmp_path / "meta").glob("*.dist-info")) / "METADATA"
    assert "License-Expression: Apache-2.0" in meta.read_text().splitlines()


# ---------------------------------------------------------------- desktop entry (fast)

def _validate(path: Path) -> None:
    tool = shutil.which("desktop-file-validate")
    if tool is None:
        pytest.skip("desktop-file-validate is not installed (package desktop-file-utils)")
    r = subprocess.run([tool, str(path)], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr


def _entry(path: Path) -> dict:
    lines = path.read_text().splitlines()
    assert lines[0] == "[Desktop Entry]"
    return dict(line.split("=", 1) for line in lines[1:] if line and not line.startswith("#"))


def test_desktop_file_validates():
    _validate(DESKTOP)
    e = _entry(DESKTOP)
    assert (e["Type"], e["Name"], e["Icon"], e["Exec"]) == ("Application", "DuplexCadence", "duplexcadence",
                                                             "duplexcadence")


def _fake_bundle(folder: Path) -> Path:
    """A folder laid out like the bundle: the executable, _internal/assets icons, the installer."""
    (folder / "_internal" / "assets").mkdir(parents=True)
    for icon in ("duplexcadence.png", "duplexcadence.svg"):
        shutil.copy(ROOT / "assets" / icon, folder / "_internal" / "assets" / icon)
    exe = folder / "duplexcadence"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    shutil.copy(DESKTOP, folder / DESKTOP.name)
    shutil.copy(INSTALLER, folder / INSTALLER.name)
    return folder


def _install(args, data_home: Path, script: Path = INSTALLER):
    env = dict(os.environ, XDG_DATA_HOME=str(data_home))
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=env)


def _check_installed(data_home: Path, exe: Path) -> None:
    entry = data_home / "applications" / "duplexcadence.desktop"
    _validate(entry)
    e = _entry(entry)
    assert e["Exec"] == f'"{exe}"' and e["TryExec"] == str(exe)
    hicolor = data_home / "icons" / "hicolor"
    assert (hicolor / "256x256" / "apps" / "duplexcadence.png").read_bytes() == \
        (ROOT / "assets" / "duplexcadence.png").read_bytes()
    assert (hicolor / "scalable" / "apps" / "duplexcadence.svg").is_file()


def test_installer_writes_a_valid_entry_and_uninstalls(tmp_path):
    bundle = _fake_bundle(tmp_path / "unpacked with space")
    data = tmp_path / "data"
    r = _install([], data, script=bundle / INSTALLER.name)      # default: the script's own folder
    assert r.returncode == 0, r.stderr
    _check_installed(data, bundle / "duplexcadence")
    r = _install(["--uninstall"], data)
    assert r.returncode == 0, r.stderr
    assert not (data / "applications" / "duplexcadence.desktop").exists()
    assert not (data / "icons" / "hicolor" / "256x256" / "apps" / "duplexcadence.png").exists()


@pytest.mark.parametrize("args, message", [
    (["{missing}"], "no such folder"),
    (["{empty}"], "has no 'duplexcadence' executable"),
    (["--bogus"], "unknown option"),
    (["a", "b"], "at most one"),
    (["{dollar}"], "must not contain"),
])
def test_installer_rejects_bad_input_with_one_message(tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    dollar = _fake_bundle(tmp_path / "a$b")
    args = [a.format(missing=tmp_path / "nope", empty=tmp_path / "empty", dollar=dollar) for a in args]
    r = _install(args, tmp_path / "data")
    assert r.returncode == 1
    assert r.stderr.count("error:") == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "data" / "applications" / "duplexcadence.desktop").exists()


# ---------------------------------------------------------------- the frozen bundle (slow)

@pytest.fixture(scope="module")
def built():
    """Build dist/duplexcadence and its tarball once; (package-info dict, tarball path)."""
    pytest.importorskip("PyInstaller", reason="PyInstaller missing: pip install -e '.[package]'")
    info_file = ROOT / "dist" / "package-info.json"
    if not (os.environ.get("DUPLEXCADENCE_REUSE_BUNDLE") == "1" and info_file.is_file()):
        t0 = time.monotonic()
        r = subprocess.run(["bash", str(PACKAGING / "build.sh")], cwd=ROOT, capture_output=True, text=True,
                           env=dict(os.environ, PY=sys.executable))
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
        print(f"\nbuild.sh took {time.monotonic() - t0:.0f} s")
    info = json.loads(info_file.read_text())
    print(f"bundle {info['name']}: {info['bundle_mb']} MB, tarball {info['tarball_mb']} MB, "
          f"built in {info['build_s']} s")
    return info, ROOT / "dist" / f"{info['name']}.tar.gz"


@pytest.fixture(scope="module")
def unpacked(built, tmp_path_factory):
    """The tarball unpacked into a fresh folder outside the repository: its top-level folder."""
    info, tarball = built
    dest = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(tarball) as tf:
        tf.extractall(dest, filter="tar")
    top = dest / info["name"]
    assert (top / "duplexcadence").is_file() and os.access(top / "duplexcadence", os.X_OK)
    return top


def _bare_env(home: Path) -> dict:
    """An environment without the venv or any Python setting: what a user's desktop session has."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", paths.ENV_VAR)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local/share"),
               QT_QPA_PLATFORM="offscreen")
    return env


def _png_size(path: Path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_bundle_layout(unpacked):
    internal = unpacked / "_internal"
    for rel in ("assets/duplexcadence.png", "assets/duplexcadence.svg",
                "PySide6/Qt/plugins/platforms/libqoffscreen.so", "PySide6/Qt/plugins/platforms/libqxcb.so",
                "PySide6/Qt/plugins/platforms/libqwayland.so", "torch/lib/libtorch_cpu.so"):
        assert (internal / rel).is_file(), rel
    for unwanted in ("moshi", "stepaudio2", "pytest", "hypothesis", "torch/test", "libasound.so.2"):
        assert not (internal / unwanted).exists(), f"{unwanted} must not be bundled"
    if unpacked.name.endswith("-cpu"):
        assert not (internal / "triton").exists(), "the CPU bundle must not carry Triton (a CUDA-only path)"
    notice = (ROOT / "NOTICE").read_bytes()
    assert (internal / "NOTICE").read_bytes() == notice and (unpacked / "NOTICE").read_bytes() == notice
    assert list(internal.glob("libportaudio.so*")), "PortAudio must be bundled"
    _validate(unpacked / "duplexcadence.desktop")


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_scripted_session_runs_from_the_unpacked_bundle(unpacked, tmp_path):
    speech = tmp_path / "in.wav"
    subprocess.run(["espeak-ng", "-w", str(speech), "Hello. This is a short test of the frozen app, "
                    "talking for about four seconds."], check=True)
    export, shot = tmp_path / "export", tmp_path / "shot.png"
    r = subprocess.run([str(unpacked / "duplexcadence"), "--input-file", str(speech), "--seconds", "3",
                        "--export", str(export), "--screenshot", str(shot)],
                       cwd=tmp_path, env=_bare_env(tmp_path / "home"), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    w, h = _png_size(shot)
    assert w >= 400 and h >= 300
    files = sorted(p.name for p in export.iterdir())
    assert {"session.csv", "session.jsonl", "session.trace.json", "session_output.wav"} <= set(files), files
    records = [json.loads(line) for line in (export / "session.jsonl").read_text().splitlines() if line]
    assert len(records) >= 2, records
    with wave.open(str(export / "session_output.wav")) as f:
        assert f.getnframes() > 0


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_simulated_echo_runs_from_the_unpacked_bundle(unpacked, tmp_path):
    """``--simulate-echo`` (the room of app/loopback.py, engine/echo/room.py) works in the bundle, which leaves
    the benches out: the model's speech plays into the simulated speaker and the canceller runs on its echo."""
    speech = tmp_path / "in.wav"
    subprocess.run(["espeak-ng", "-w", str(speech), "Hello. The frozen app hears its own voice through a "
                    "simulated room now."], check=True)
    export = tmp_path / "export"
    r = subprocess.run([str(unpacked / "duplexcadence"), "--input-file", str(speech), "--seconds", "3",
                        "--simulate-echo", "120:-10", "--export", str(export), "--model", "mimi", "--size", "tiny",
                        "--device", "cpu"],
                       cwd=tmp_path, env=_bare_env(tmp_path / "home"), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "3 seconds processed" in r.stdout, r.stdout + r.stderr[-2000:]
    records = [json.loads(line) for line in (export / "session.jsonl").read_text().splitlines() if line]
    assert len(records) == 3 and all(rec["echo_cancellation"] for rec in records), records
    heard, rate = read_wav(export / "session_input.wav")
    assert rate == 24000 and np.sqrt(np.mean(heard ** 2)) > 0.005, "the simulated microphone heard nothing"


@contextmanager
def _pulse_server(folder: Path):
    """A private PulseAudio server with null sinks "mic" and "spk"; yields the client environment."""
    missing = [t for t in ("pulseaudio", "pactl", "paplay") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"PulseAudio tools missing ({', '.join(missing)}); the Makefile's sysdeps installs them")
    run = folder / "run"
    run.mkdir(parents=True)
    sock = run / "native"
    env = dict(_bare_env(folder / "home"), XDG_RUNTIME_DIR=str(run), PULSE_RUNTIME_PATH=str(run / "pulse"),
               PULSE_SERVER=f"unix:{sock}", PULSE_SINK="spk", PULSE_SOURCE="mic.monitor")
    with open(folder / "pulseaudio.log", "w") as log:
        server = subprocess.Popen(
            ["pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--use-pid-file=no", "--system=false",
             f"--load=module-native-protocol-unix socket={sock} auth-anonymous=1",
             "--load=module-null-sink sink_name=mic", "--load=module-null-sink sink_name=spk",
             "--log-target=stderr"], env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 15
            while subprocess.run(["pactl", "info"], env=env, capture_output=True).returncode != 0:
                assert server.poll() is None and time.monotonic() < deadline, \
                    "PulseAudio did not start:\n" + (folder / "pulseaudio.log").read_text()[-2000:]
                time.sleep(0.1)
            yield env
        finally:
            server.terminate()
            server.wait(10)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_audio_devices_work_from_the_bundle(unpacked, tmp_path):
    """The bundled PortAudio with the system's ALSA reaches a sound server: speech played into the
    "mic" sink is what the frozen app hears."""
    speech = tmp_path / "in.wav"
    subprocess.run(["espeak-ng", "-w", str(speech), "Testing the microphone of the frozen app."], check=True)
    export = tmp_path / "export"
    with _pulse_server(tmp_path) as env:
        app = subprocess.Popen([str(unpacked / "duplexcadence"), "--input-device", "pulse", "--output-device",
                                "pulse", "--seconds", "4", "--export", str(export), "--model", "mimi",
                                "--size", "tiny", "--device", "cpu"],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while app.poll() is None:                        # keep talking until the session is over
            subprocess.run(["paplay", "--device=mic", str(speech)], env=env, timeout=60)
        out, err = app.communicate(timeout=600)
    assert app.returncode == 0, err[-3000:]
    assert "4 seconds processed" in out, out + err[-2000:]
    heard, rate = read_wav(export / "session_input.wav")
    assert rate == 24000 and len(heard) == 4 * 24000
    assert np.sqrt(np.mean(heard ** 2)) > 0.01, "no speech reached the frozen app through PortAudio"


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_desktop_entry_installs_from_the_unpacked_bundle(unpacked, tmp_path):
    data = tmp_path / "data"
    r = _install([], data, script=unpacked / INSTALLER.name)
    assert r.returncode == 0, r.stderr
    _check_installed(data, unpacked / "duplexcadence")
