"""`duplexcadence` without a subcommand: the desktop app, optionally scripted.

Interactive:  duplexcadence
Scripted:     duplexcadence --input-file IN.wav [--output-file OUT.wav] [--seconds N] [--export DIR]
                            [--screenshot PNG] [--model TAIL] [--backbone BACKBONE]
                            [--checkpoint PATH] [--simulate-echo DELAY_MS:GAIN_DB] [--no-echo-cancellation]
A scripted run uses the model and controls its flags name (defaults otherwise, never the saved settings,
which it leaves alone; its journal goes to the sessions folder's scripted/ and every second is kept), plays the WAV as the microphone at real-time pace (then silence), stops after N
seconds of input (default: the file's length), lets every one of those seconds finish, writes the
output WAV, the exports and a screenshot of the window, and exits 0 (1 when the session failed — a
dead thread included — or a file could not be written, 2 for bad arguments). SIGINT / SIGTERM stop
the session at the second in progress, write everything so far and exit 130 / 143; the interactive
app keeps the session's journal (see app/lifecycle.py) and quits with the same codes.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Optional, Tuple

from engine.cli.validate import OneLineParser, output_file, output_folder, seconds, seed
from engine import registry

SCRIPT_FLAGS = ("input_file", "input_device", "seconds", "export", "screenshot", "output_file")
SCREENSHOT_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def build_parser() -> argparse.ArgumentParser:
    from app.subcommands import SUBCOMMAND_HELP
    listed = "\n".join(f"  {name:<9} {text}" for name, text in SUBCOMMAND_HELP.items())
    p = OneLineParser(prog="duplexcadence", description="Live full-duplex conversation with a clock-aware engine.",
                      epilog=f"subcommands (see 'duplexcadence SUBCOMMAND -h'):\n{listed}",
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    s = p.add_argument_group("scripted session (demos, tests, screenshots)")
    s.add_argument("--input-file", metavar="IN.wav", help="play this WAV as the microphone, at real-time pace")
    s.add_argument("--input-device", metavar="NAME", help="use this audio input device (name or index)")
    s.add_argument("--output-device", metavar="NAME", help="play the model's speech on this device")
    s.add_argument("--output-file", metavar="OUT.wav", help="write the model's speech (24 kHz) here")
    s.add_argument("--simulate-echo", metavar="DELAY_MS:GAIN_DB",
                   help="play the model's speech into a simulated speaker whose echo comes back into the input "
                        "file's microphone (e.g. 120:-10): a laptop without headphones, no device needed")
    s.add_argument("--seconds", type=seconds,
                   help="stop after N seconds of input (default: the input file's length; at most 24 h)")
    s.add_argument("--export", metavar="DIR", help="write CSV, JSON Lines, trace and WAVs of the session here")
    s.add_argument("--screenshot", metavar="PNG", help="save a screenshot of the window at the end")
    m = p.add_argument_group("model")
    m.add_argument("--model", dest="tail", choices=registry.tail_names(), help="decoder tail")
    m.add_argument("--backbone", choices=registry.backbone_names())
    m.add_argument("--size", choices=["auto", "released", "tiny"])
    m.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    m.add_argument("--checkpoint", help="decoder tail checkpoint (" + registry.checkpoint_hints() + ")")
    m.add_argument("--backbone-checkpoint", help="the backbone's weights folder (" + registry.folder_hints() + ")")
    m.add_argument("--voice", metavar="WAV|NPZ", help="the voice of the " + " / ".join(registry.conditioned_tails())
                   + " tail (default: the backbone folder's voice, else synthetic)")
    m.add_argument("--no-echo-cancellation", action="store_true",
                   help="hand the engine the raw microphone (the speaker's echo included)")
    m.add_argument("--no-demand-sized", action="store_true", help="stock-sized state arenas")
    m.add_argument("--no-graph-replay", action="store_true", help="run every second eagerly")
    m.add_argument("--seed", type=seed, default=0, help="seed of the random weights and sampling (0 to 2**63-1)")
    m.add_argument("--reference-paths", action="store_true",
                   help="keep every decoder on its reference path (no self-checked faster path)")
    p.add_argument("--settings", metavar="INI", help="keep settings in this INI file (default: the platform store)")
    return p


def _scripted(a: argparse.Namespace) -> bool:
    return any(getattr(a, k) is not None for k in SCRIPT_FLAGS)


def _config(a: argparse.Namespace, base):
    """``base`` overridden by the command line, resolved (ValueError with one message)."""
    over = {k: v for k, v in (("tail", a.tail), ("backbone", a.backbone), ("size", a.size),
                              ("checkpoint", a.checkpoint), ("backbone_checkpoint", a.backbone_checkpoint),
                              ("voice", a.voice))
            if v is not None}
    cfg = base.replace(device=a.device, seed=a.seed, demand_sized=not a.no_demand_sized,
                       graph_replay=not a.no_graph_replay, **over)
    return cfg.resolved()


class ScriptedRun:
    """Drives one scripted session in a window: start, stop after N s, write files, quit."""

    def __init__(self, window, args: argparse.Namespace):
        self.window, self.args = window, args
        self.exit_code = 0
        self.seconds = 0
        self.signum = 0                  # SIGINT / SIGTERM received: stop, write everything, exit 128 + N
        self._shot = False
        self._finished = False

    def start(self, cfg, source, sink) -> bool:
        from PySide6.QtCore import QTimer
        seconds = self.args.seconds
        if seconds is None:
            seconds = getattr(source, "duration_s", 0.0) or 10.0
        seconds = self.seconds = max(1, math.ceil(seconds))
        c = self.window.controller
        c.stopped.connect(self.finish)
        c.record.connect(self._on_record)
        c.message.connect(self._on_message)
        warned = []                                  # the first "cannot keep up" goes to stderr, once
        c.notice.connect(lambda t: t and not warned and (warned.append(t), self._on_message("warning", t)))
        if not self.window.start_with(cfg, source, sink, max_seconds=seconds):
            return False
        # the session finishes by itself after N seconds of input; this only guards a source that
        # stops delivering (an unplugged device): then whatever arrived is kept
        QTimer.singleShot(int((3 * seconds + 60) * 1000), lambda: c.finish(timeout_s=60.0))
        return True

    def _on_record(self, rec) -> None:
        """The last second is in: take the screenshot while the session still looks live (the state shows that
        second's LISTENING or SPEAKING, not the FINISHING… the input's end has already brought)."""
        if self.args.screenshot and not self._shot and rec.index + 1 >= self.seconds:
            self.window.show_decision(rec.decision)
            self._screenshot()

    def _screenshot(self) -> None:
        from PySide6.QtWidgets import QApplication
        self._shot = True
        QApplication.processEvents()
        path = Path(self.args.screenshot)              # its folder was checked before the session
        if not self.window.grab().save(str(path)):
            self._on_message("error", f"cannot write screenshot {path}")

    def _on_message(self, level: str, text: str) -> None:
        print(f"duplexcadence: {level}: {text}", file=sys.stderr)
        if level == "error":
            self.exit_code = 1

    def interrupt(self, signum: int) -> None:
        """SIGINT/SIGTERM: stop at the second in progress; :meth:`finish` writes everything so far."""
        from PySide6.QtWidgets import QApplication
        if not self.signum:
            self.signum = signum
        if self.window.controller.state == "idle":
            if not self._finished:
                QApplication.instance().exit(128 + signum)    # no session running (any more)
            return
        self.window.controller.stop()

    def finish(self) -> None:
        """The session stopped (done, failed or interrupted): write the files, say so, quit."""
        from PySide6.QtWidgets import QApplication
        from engine.session import ExportError
        from engine.wavio import WavError
        if self._finished:
            return
        self._finished = True
        a, c = self.args, self.window.controller
        wrote = []
        if a.screenshot and not self._shot:
            self._screenshot()
        if a.output_file:
            try:
                wrote.append(str(c.save_output(a.output_file)))
            except OSError as e:
                self._on_message("error", f"cannot write {a.output_file}: {e.strerror or e}")
            except WavError as e:
                self._on_message("error", str(e))
        if a.export:
            try:
                c.export(a.export)
                wrote.append(f"{a.export}/")
            except ExportError as e:
                self._on_message("error", f"export failed: {e}")
        n = len(c.records)
        print(f"duplexcadence: {n} seconds processed, {sum(1 for r in c.records if r.missed)} missed")
        if self.signum:
            where = ", ".join(wrote) or (f"the session journal {c.journal.directory}" if c.journal else "nothing")
            print(f"duplexcadence: interrupted after {n} s; wrote {where}", file=sys.stderr)
            self.exit_code = 128 + self.signum
        QApplication.instance().exit(self.exit_code)


def check_outputs(a: argparse.Namespace) -> None:
    """Refuse output paths that are special files, links or the input, or in a folder that does not exist or
    takes nothing new, before the window opens."""
    from engine.session.journal import SESSION_FILES
    inputs = [a.input_file]
    if a.output_file:
        output_file(a.output_file, "--output-file", inputs, suffixes=(".wav",))
    if a.screenshot:
        output_file(a.screenshot, "--screenshot", inputs, suffixes=SCREENSHOT_SUFFIXES)
    if a.export:
        output_folder(a.export, "--export", inputs, names=SESSION_FILES)


def _audio(a: argparse.Namespace):
    """(source, sink) for a scripted run; raises AudioUnavailable / WavError with one message."""
    from app.audio_io import DeviceInput, DeviceOutput, FileInput, find_device, list_devices
    check_outputs(a)
    source = sink = None
    if a.simulate_echo is not None:
        from app.loopback import LoopbackInput, parse_echo
        if not a.input_file or a.output_device is not None or a.input_device is not None:
            raise ValueError("--simulate-echo needs --input-file and no audio device (it is the room)")
        delay, gain = parse_echo(a.simulate_echo)
        source = LoopbackInput(a.input_file, delay, gain, seed=a.seed, max_seconds=a.seconds)
        return source, source.sink
    if a.input_file:
        source = FileInput(a.input_file, max_seconds=a.seconds)
    if a.input_device is not None or a.output_device is not None:
        inputs, outputs = list_devices()
        if a.input_device is not None:
            source = DeviceInput(find_device(a.input_device, inputs, "input"))
        if a.output_device is not None:
            sink = DeviceOutput(find_device(a.output_device, outputs, "output"))
    if source is None:
        raise ValueError("a scripted run needs --input-file or --input-device")
    if a.input_device is not None and a.seconds is None:
        raise ValueError("--input-device needs --seconds")
    return source, sink


def display_platform(env, scripted: bool, platform: str = sys.platform) -> Tuple[Optional[str], str]:
    """Where the window draws when there is no display: (the Qt platform to use, or None for Qt's choice; the
    one line to print, or ""). On Linux without $DISPLAY and $WAYLAND_DISPLAY (and no $QT_QPA_PLATFORM), Qt
    would abort the process (SIGABRT) with a message about a missing library: a scripted run draws
    offscreen instead (its screenshot and exports are the same), the interactive app says there is no
    display."""
    if not platform.startswith("linux") or env.get("QT_QPA_PLATFORM") or env.get("DISPLAY") \
            or env.get("WAYLAND_DISPLAY"):
        return None, ""
    if scripted:
        return "offscreen", ("duplexcadence: no display ($DISPLAY and $WAYLAND_DISPLAY are unset): the scripted "
                             "session draws offscreen")
    return None, ("duplexcadence: error: no display: $DISPLAY and $WAYLAND_DISPLAY are unset; start the app "
                  "from a desktop session, or run a scripted session (--input-file, see --help)")


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    platform, line = display_platform(os.environ, _scripted(a))
    if line:
        print(line, file=sys.stderr)
    if platform is None and line:
        return 2
    if platform is not None:
        os.environ["QT_QPA_PLATFORM"] = platform
    if a.reference_paths:
        from engine import fastpath
        fastpath.force_reference(True)
    from PySide6.QtWidgets import QApplication
    app = QApplication.instance() or QApplication(["duplexcadence"])
    app.setApplicationName("DuplexCadence")
    app.setDesktopFileName("duplexcadence")        # matches packaging/duplexcadence.desktop (Wayland)
    app.setOrganizationName("DuplexCadence")
    from app import alsa_log
    alsa_log.install()                   # ALSA's underrun lines go to the event log, counted, not the terminal
    from app.lifecycle import SignalBridge, install_thread_guard
    from app.settings import open_qsettings
    from app.window import MainWindow
    install_thread_guard()               # a thread that dies stops the session with one message
    bridge = SignalBridge()              # SIGINT / SIGTERM reach the GUI thread
    try:
        if not _scripted(a):
            return _interactive(app, bridge, MainWindow(settings=open_qsettings(a.settings)))
        return _script(a, app, bridge)
    finally:
        bridge.uninstall()


def _interactive(app, bridge, window) -> int:
    """The app as users run it: offers to recover a session a dead process left behind; a signal
    stops the session, keeps everything so far (its journal) and quits with 128 + the signal."""
    from PySide6.QtCore import QTimer

    def on_signal(signum: int) -> None:
        window.close_policy = "keep"
        c = window.controller
        n = len(c.records) if c.state != "idle" else 0
        window.close()
        if c.journal is not None and n:
            print(f"duplexcadence: interrupted after {n} s; the session is kept in {c.journal.directory}",
                  file=sys.stderr)
        app.exit(128 + signum)
    bridge.received.connect(on_signal)
    window.show()
    QTimer.singleShot(0, window.offer_recovery)
    code = int(app.exec())
    window.controller.shutdown()         # never leave an engine or pump thread running at exit
    return code


def _script(a: argparse.Namespace, app, bridge) -> int:
    from app.audio_io import AudioUnavailable
    from app.settings import open_qsettings
    from app.window import MainWindow
    from engine.wavio import WavError
    from engine.session import SessionConfig
    try:
        cfg = _config(a, SessionConfig())        # flags and defaults only: a demo is reproducible
        source, sink = _audio(a)
    except (ValueError, AudioUnavailable, WavError) as e:     # WavError is a ValueError too
        print(f"duplexcadence: error: {e}", file=sys.stderr)
        return 2
    window = MainWindow(settings=open_qsettings(a.settings))
    window.persist_settings = False
    window.controller.scripted = True    # journals apart: demos never push out the user's sessions
    window.use_default_controls(echo=not a.no_echo_cancellation)   # flags and defaults, not saved settings
    window.close_policy = "keep"         # closing the window ends the run like the end of the input
    window.show()
    run = ScriptedRun(window, a)
    bridge.received.connect(run.interrupt)
    if not run.start(cfg, source, sink):
        print(f"duplexcadence: error: {window.message_banner.text()}", file=sys.stderr)
        return 1
    code = int(app.exec())
    window.controller.shutdown()         # never leave an engine or pump thread running at exit
    window.close()
    return code or run.exit_code


if __name__ == "__main__":
    sys.exit(main())
