"""`duplexcadence --input-file ...`: a scripted session in a real process, offscreen."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtGui import QImage

from app.gui_main import build_parser
from app.gui_main import main as gui_main
from engine.wavio import read_wav

ROOT = Path(__file__).resolve().parent.parent


def run_app(args, tmp_path, timeout=240):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", DUPLEXCADENCE_SETTINGS=str(tmp_path / "settings.ini"))
    return subprocess.run([sys.executable, "-m", "app.main", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_scripted_session_writes_everything(tmp_path, speech_wav):
    out = tmp_path / "out"
    out.mkdir()                                              # an output file's folder must exist
    p = run_app(["--input-file", str(speech_wav), "--seconds", "3", "--model", "mimi", "--size", "tiny",
                 "--device", "cpu", "--output-file", str(out / "reply.wav"), "--export", str(out / "export"),
                 "--screenshot", str(out / "shot.png")], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "3 seconds processed" in p.stdout
    files = sorted(f.name for f in (out / "export").iterdir())
    assert files == ["session.csv", "session.jsonl", "session.trace.json", "session_input.wav",
                     "session_output.wav", "summary.json", "transcript.txt"]
    assert (out / "export" / "transcript.txt").read_text().startswith("DuplexCadence transcript")
    lines = (out / "export" / "session.jsonl").read_text().splitlines()
    assert [json.loads(x)["index"] for x in lines] == [0, 1, 2]
    reply, rate = read_wav(out / "reply.wav")
    assert rate == 24000 and len(reply) == 3 * 24000
    img = QImage(str(out / "shot.png"))
    assert img.width() >= 1200 and img.height() >= 800
    assert not (tmp_path / "settings.ini").exists()          # a scripted run leaves the settings alone


def test_bad_arguments_are_one_clear_message(tmp_path, speech_wav, qapp, capsys, monkeypatch):
    monkeypatch.setenv("DUPLEXCADENCE_SETTINGS", str(tmp_path / "settings.ini"))
    missing = tmp_path / "no-such-folder"
    assert gui_main(["--input-file", str(speech_wav), "--model", "step-audio2", "--checkpoint", str(missing)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"duplexcadence: error: Step-Audio2 checkpoint folder {missing} does not exist")
    assert gui_main(["--input-file", str(tmp_path / "missing.wav")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "missing.wav" in err
    assert gui_main(["--seconds", "3"]) == 2
    assert "needs --input-file or --input-device" in capsys.readouterr().err


def test_parser_knows_the_scripted_flags():
    a = build_parser().parse_args(["--input-file", "a.wav", "--output-file", "b.wav", "--seconds", "20",
                                   "--export", "d", "--screenshot", "s.png", "--model", "mimi",
                                   "--backbone", "moshi", "--checkpoint", "c"])
    assert (a.input_file, a.output_file, a.seconds, a.export, a.screenshot, a.tail, a.backbone, a.checkpoint) == \
        ("a.wav", "b.wav", 20.0, "d", "s.png", "mimi", "moshi", "c")


def _no_display_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    return dict(env, DUPLEXCADENCE_SETTINGS=str(tmp_path / "settings.ini"))


def test_without_a_display_scripted_runs_draw_offscreen_and_the_app_says_so(tmp_path):
    """No $DISPLAY: Qt would abort (rc 134) naming a missing library. A scripted run goes on offscreen (here it
    reaches its own one-line error about the input), the interactive app says there is no display."""
    env = _no_display_env(tmp_path)
    p = subprocess.run([sys.executable, "-m", "app.main", "--input-file", str(tmp_path / "missing.wav")], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "draws offscreen" in p.stderr and "missing.wav" in p.stderr.splitlines()[-1], p.stderr[-2000:]
    p = subprocess.run([sys.executable, "-m", "app.main"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [
        "duplexcadence: error: no display: $DISPLAY and $WAYLAND_DISPLAY are unset; start the app from a desktop "
        "session, or run a scripted session (--input-file, see --help)"]


def test_help_names_every_subcommand():
    from app.main import SUBCOMMANDS
    lines = build_parser().format_help().splitlines()
    for name in SUBCOMMANDS:
        assert any(line.startswith(f"  {name} ") for line in lines), name
