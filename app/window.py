"""The main window: Start/Stop, model and audio panels, toggles, live plots, summary, events, export.

Its layout is app/window_layout.py, its menus and keys app/window_actions.py and app/help_menu.py, its questions
(closing a running session, recovering a dead one) app/lifecycle.py; this file holds what it does with a session.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QMainWindow

from app import controller as ctl
from app import alsa_log, theme, wheel
from app.audio_io import AudioUnavailable, DeviceInput, DeviceOutput, FileInput, list_devices
from app.help_menu import HelpMenu
from app.settings import AppSettings, load_settings, open_qsettings, save_settings
from app.viewmodel import EventLog, SessionSeries, keep_up_advice
from app.lifecycle import SessionDialogs
from app.window_actions import PTT_RELEASE_MS, WindowActions
from app.window_layout import DEFAULT_SIZE, MIN_SIZE, SYNTHETIC_BANNER, WindowLayout  # noqa: F401  (tests)
from engine.wavio import WavError
from engine.paths import asset
from engine.core.toggles import Toggles
from engine.session import ExportError, SessionConfig

ICON = "duplexcadence.png"
#: the per-stage statistics look back this many seconds (their cost stays flat)
STATS_WINDOW_S = 600
STATE_STYLE = {
    "listen": ("LISTENING", "#4c78a8"), "speak": ("SPEAKING", "#59a14f"), ctl.STARTING: ("STARTING…", "#8a8f98"),
    ctl.IDLE: ("IDLE", "#8a8f98"), ctl.DRAINING: ("FINISHING…", "#8a8f98"), ctl.STOPPING: ("STOPPING…", "#8a8f98"),
}


class MainWindow(WindowLayout, WindowActions, HelpMenu, SessionDialogs, QMainWindow):
    """The DuplexCadence desktop window (one live session at a time)."""

    def __init__(self, controller: Optional[ctl.SessionController] = None, settings: Optional[QSettings] = None,
                 devices: Callable = list_devices, cuda: Optional[bool] = None):
        theme.apply_env_theme()                     # $DUPLEXCADENCE_THEME=dark|light, else the system's
        wheel.install()                             # the wheel scrolls the panels; it changes focused controls only
        super().__init__()
        self.setWindowTitle("DuplexCadence — live duplex conversation")
        try:
            self.setWindowIcon(QIcon(str(asset(ICON))))
        except FileNotFoundError:
            pass                                   # an icon is nice, not needed
        self.qsettings = settings if settings is not None else open_qsettings()
        self.settings = load_settings(self.qsettings)
        self.persist_settings = True     # scripted runs turn this off: demos never change settings
        self.close_policy: Optional[str] = None   # closing mid-session: None asks; "keep"/"export"/"discard"
        self.cuda = self._detect_cuda() if cuda is None else cuda
        self.controller = controller or ctl.SessionController()
        self.series = SessionSeries()
        self.log = EventLog()
        self._build()
        wheel.guard(self)
        self._connect()
        self._load_devices(devices)
        self._apply_settings(self.settings)
        self._last_toggles = None
        self._ptt_release = QTimer(self, singleShot=True, interval=PTT_RELEASE_MS)
        self._ptt_release.timeout.connect(lambda: self.controller.press_talk(False))
        self._replay = None
        self._started_model = None
        self.setMinimumSize(*MIN_SIZE)
        self.resize(*DEFAULT_SIZE)

    # -- construction --------------------------------------------------------------------------
    @staticmethod
    def _detect_cuda() -> bool:
        try:
            return SessionConfig().resolved().device == "cuda"
        except ValueError:
            return False

    def _connect(self) -> None:
        c = self.controller
        c.record.connect(self.on_record)
        c.info.connect(self.on_info)
        c.state_changed.connect(self.on_state)
        c.message.connect(self.show_message)
        c.event.connect(self.events.add)
        c.meters.connect(self.on_meters)
        c.notice.connect(self.on_notice)
        self.start_button.clicked.connect(self.start_session)
        self.stop_button.clicked.connect(self.controller.stop)
        self.export_button.clicked.connect(self.export_dialog)
        self.toggle_panel.toggled.connect(self.on_toggles)
        self.device_panel.push_to_talk_changed.connect(c.set_push_to_talk)
        self.device_panel.input_changed.connect(self.on_input_changed)
        self.device_panel.output_changed.connect(self.on_output_changed)
        self.device_panel.output_changed.connect(self._output_hint)
        self.model_panel.changed.connect(self.on_model_changed)
        cp = self.conversation
        cp.echo_changed.connect(self.on_echo)
        cp.force_listen_changed.connect(c.set_force_listen)
        cp.sensitivity_changed.connect(c.set_sensitivity)
        cp.delay_changed.connect(c.set_delay)
        self.engine_panel.reconnect.connect(self.start_session)
        QApplication.instance().installEventFilter(self)

    def _load_devices(self, devices: Callable) -> None:
        try:
            inputs, outputs = devices()
            error = "" if inputs else "No audio input device found: play a WAV file as the microphone."
        except AudioUnavailable as e:
            inputs, outputs, error = [], [], str(e)
        self.device_panel.populate(inputs, outputs, error, self.settings.input_file)
        if error:
            self.events.add("device", error)
        for line in alsa_log.drained_lines():       # what ALSA said while the devices were listed
            self.events.add("alsa", line)

    def _apply_settings(self, s: AppSettings) -> None:
        self.model_panel.set_values(s.tail, s.backbone, s.size, s.checkpoint, s.backbone_checkpoint, s.voice)
        self.prompt_panel.set_text(s.system_prompt)
        self.device_panel.select_device(self.device_panel.input, s.input_device)
        self.device_panel.select_device(self.device_panel.output, s.output_device)
        if s.input_file and self.device_panel.input.count() and not s.input_device:
            self.device_panel.add_input_file(s.input_file)
        self.device_panel.ptt.setChecked(s.push_to_talk)
        u = self.controller.controls
        u.echo, u.sensitivity, u.delay_s = s.echo_cancellation, s.interrupt, s.playback_delay
        self.conversation.show_controls(u)
        self.toggle_panel.demand.setChecked(s.demand_sized)
        self.toggle_panel.graphs.setChecked(s.graph_replay and self.cuda)
        if s.geometry:
            self.restoreGeometry(s.geometry)
        # shown before any session when no checkpoint is chosen, so a Start does not move the plots
        self.synthetic_banner.setVisible(not self.model_panel.checkpoint.path())

    def save_settings(self) -> None:
        m, d = self.model_panel, self.device_panel
        (ik, iv), (ok, ov) = d.selected_input(), d.selected_output()
        s = self.settings
        s.tail, s.backbone, s.size = m.tail.currentData(), m.backbone.currentData(), m.size.currentData()
        s.checkpoint, s.backbone_checkpoint = m.checkpoint.path(), m.backbone_checkpoint.path()
        s.voice, s.system_prompt = m.voice.path(), self.prompt_panel.saved_text()
        s.input_device = iv.name if ik == "device" else ""
        s.input_file = iv if ik == "file" else s.input_file
        s.output_device = ov.name if ok == "device" else ""
        s.push_to_talk = d.ptt.isChecked()
        s.demand_sized, s.graph_replay = self.toggle_panel.demand.isChecked(), self.toggle_panel.graphs.isChecked()
        cp = self.conversation
        s.echo_cancellation, s.interrupt, s.playback_delay = (cp.echo.isChecked(), cp.sensitivity.currentData(),
                                                              float(cp.delay.value()))
        s.geometry = bytes(self.saveGeometry().data())
        save_settings(self.qsettings, s)

    # -- session -------------------------------------------------------------------------------
    def session_config(self) -> Optional[SessionConfig]:
        """The resolved config from the panels, or None (and a message saying what is wrong)."""
        cfg, err = self.model_panel.validate()
        prompt, bad = self.prompt_panel.value()        # None for a backbone without one; the text stays put
        problem = err if cfg is None else bad or self.engine_panel.prepare()   # engine: embedded or a usable URL
        if problem:
            self.show_message("error", problem)
            return None
        demand, graphs = self.toggle_panel.values()
        return cfg.replace(demand_sized=demand, graph_replay=graphs, system_prompt=prompt)

    def _make_source(self, kind: str, value, rate: int):        # a device captures at the session's rate
        return DeviceInput(value, rate) if kind == "device" else FileInput(value)

    def _make_sink(self, kind: str, value):
        return DeviceOutput(value, self.controller.controls.delay_s) if kind == "device" else None

    def start_session(self) -> bool:
        """Start from what the panels show; on a problem show one message and return False."""
        cfg = self.session_config()
        if cfg is None:
            return False
        kind, value = self.device_panel.selected_input()
        if kind == "choose":
            self.show_message("error", "Choose an input: a microphone or a WAV file.")
            return False
        try:
            source = self._make_source(kind, value, cfg.input_rate)
            sink = self._make_sink(*self.device_panel.selected_output())
        except (AudioUnavailable, WavError) as e:
            self.show_message("error", str(e))
            return False
        if self.persist_settings:
            self.save_settings()
        return self.start_with(cfg, source, sink, show_config=False)

    def start_with(self, cfg: SessionConfig, source, sink=None, max_seconds: Optional[int] = None,
                   show_config: bool = True) -> bool:
        """Start a session on the given audio (scripted runs and tests come in here); with
        ``max_seconds`` it finishes by itself after that many seconds of input. ``show_config``
        makes the panels show ``cfg`` (the panels' own Start leaves them as the user set them)."""
        if show_config:
            self._show_config(cfg, source, sink)
        self._started_model = self.model_panel.config()      # what the panel showed when this session began
        self.message_banner.hide()
        self.keepup_banner.hide()
        self._fresh_view = False          # the last session's view stays until this one's first second
        self._output_hint()
        try:
            self.controller.start(cfg, source, sink, max_seconds=max_seconds)
        except (AudioUnavailable, ExportError) as e:
            self.show_message("error", str(e))
            return False
        self.synthetic_banner.setVisible(cfg.checkpoint is None)
        return True

    def _clear_view(self) -> None:
        """The new session's first second: the plots, transcript and readouts start afresh."""
        self._fresh_view = True
        self.series.clear()
        self.transcript.show_rows([])
        self.readouts.reset()
        self._last_toggles = None
        self.events.collapse_reset()

    def use_default_controls(self, echo: bool = True) -> None:
        """A scripted run: the conversation's controls at their defaults (never the saved settings)."""
        from app.controller import UserControls
        d = UserControls()
        d.echo = bool(echo)
        self.controller.controls = d
        self.conversation.show_controls(d, quiet=True)

    def _output_hint(self, *_) -> None:
        kind, dev = self.device_panel.selected_output()
        self.conversation.show_output(dev.name if kind == "device" else "speaker" if kind == "sim" else None)

    def on_echo(self, on: bool) -> None:
        self.controller.set_echo(on)
        self.conversation.update_hint()

    def _show_config(self, cfg: SessionConfig, source, sink=None) -> None:
        """Make the panels show what a (scripted) session runs with (the Output picker names its
        device, or "No playback" when nothing plays)."""
        # a voice the user named, not the backbone folder's default (an unresolved config: as given)
        named = cfg.voice_origin == "--voice" or (bool(cfg.voice) and not cfg.voice_origin)
        self.model_panel.set_values(cfg.tail, cfg.backbone, cfg.size, cfg.checkpoint or "",
                                    cfg.backbone_checkpoint or "", cfg.voice if named else "")
        self.prompt_panel.set_text(cfg.system_prompt or "")
        self.toggle_panel.demand.setChecked(cfg.demand_sized)
        self.toggle_panel.graphs.setChecked(cfg.graph_replay and self.cuda)
        if isinstance(source, FileInput):
            self.device_panel.add_input_file(source.path)
        elif isinstance(source, DeviceInput):
            self.device_panel.select_device(self.device_panel.input, source.device.name)
        self.device_panel.show_output(sink.device.name if isinstance(sink, DeviceOutput) else None,
                                      label="" if sink is None or isinstance(sink, DeviceOutput) else sink.label)

    def on_toggles(self, demand: bool, graphs: bool) -> None:
        self.controller.set_toggles(Toggles(demand_sized=demand, graph_replay=graphs))

    def on_model_changed(self) -> None:
        """The panel's (asynchronous) check is done: say when a change made during a session applies."""
        if self.controller.state == ctl.IDLE:
            self.synthetic_banner.setVisible(not self.model_panel.checkpoint.path())
        if self.controller.state != ctl.IDLE and self.model_panel.config() != self._started_model:
            status = self.model_panel.status
            status.setText(status.text() + " — applies at the next Start; the running session continues")

    def on_input_changed(self) -> None:
        kind, value = self.device_panel.selected_input()
        if self.controller.state in (ctl.STARTING, ctl.RUNNING) and kind in ("device", "file"):
            try:
                self.controller.replace_input(self._make_source(kind, value, self.controller.pump.rate))
            except (AudioUnavailable, WavError) as e:
                self.show_message("error", str(e))

    def on_output_changed(self) -> None:
        if self.controller.state in (ctl.STARTING, ctl.RUNNING):
            try:
                self.controller.replace_output(self._make_sink(*self.device_panel.selected_output()))
            except AudioUnavailable as e:
                self.show_message("error", str(e))

    # -- slots: results ------------------------------------------------------------------------
    def on_record(self, rec) -> None:
        if not getattr(self, "_fresh_view", True):
            self._clear_view()
        row = self.series.add(rec)
        delay = self.controller.monitor.delay_for(row["index"])
        if delay is not None:
            row["mic_to_speaker_ms"] = round(delay, 3)
            row["answer_plays"] = self.controller.monitor.playing
        changes = self.series.mode_changes()
        if changes and changes[-1]["index"] == row["index"]:
            self.events.add("toggle", f"in effect from second {row['index']}: {changes[-1]['label']}")
        if row["missed"]:
            self.events.add("late", f"second {row['index']} missed the deadline by {row['late_ms']:.0f} ms")
        if row.get("barge_ins"):
            self.events.add("barge-in", f"second {row['index']}: {row['barge_ins']} barge-in(s), playback silent "
                                        f"{row.get('barge_in_latency_ms', 0):.0f} ms after the onset")
        self.transcript.show_rows(self.series.rows)
        self.readouts.show_row(row, self.controller.totals, echo=self.controller.echo_state())
        self._show_state(row["decision"] if self.controller.state == ctl.RUNNING else self.controller.state)
        self.refresh()

    def refresh(self) -> None:
        self.timing_plot.update_from(self.series)
        self.memory_plot.update_from(self.series)
        self.summary_row.show_summary(self.series.summary())
        n = min(len(self.series), STATS_WINDOW_S)
        self.stats.show_stats(self.series.window(STATS_WINDOW_S), note=f"over the last {n} s" if n else "")
        can = len(self.series) > 0 and self.controller.journal is not None
        self.export_button.setEnabled(can)
        self.export_action.setEnabled(can)

    def on_notice(self, text: str) -> None:
        """The engine's "cannot keep up" line, refreshed every second; hidden once it keeps up."""
        if text and self.controller.state in (ctl.STARTING, ctl.RUNNING, ctl.DRAINING):
            advice = keep_up_advice(self.controller.session_info, self.cuda)
            self.keepup_banner.setText(f"⚠ {text}. Late speech is dropped to keep the delay bounded. {advice}")
            self.keepup_banner.show()
        else:
            self.keepup_banner.hide()

    def on_info(self, info: dict) -> None:
        self.synthetic_banner.setVisible(bool(info.get("synthetic")))
        self.memory_plot.set_info(info)             # the card's size (CUDA) or the CPU's note
        self.session_label.setText(f"{info.get('tail_title', '?')} · {info.get('backbone_title', '?')} · "
                                   f"{info.get('size', '?')} on {info.get('device', '?')}")
        self.events.add("session", f"running: {info.get('tail_title')} + {info.get('backbone_title')} on "
                                   f"{info.get('device')} ({info.get('size')})", info)
        paths = info.get("fast_paths") or []
        on = [line.split(": ", 1)[0] for line in paths if ": on" in line]
        self.session_label.setToolTip("Faster paths (start-up self-check against the reference path):\n"
                                      + "\n".join(paths) if paths else "")
        if paths:                          # one line: the details are in its data and the label's tooltip
            self.session_label.setText(self.session_label.text() + f" · faster paths: {', '.join(on) or 'none'}")
            off = len(paths) - len(on)
            self.events.add("session", f"faster paths: {len(on)} on ({', '.join(on) or 'none'}), {off} off or "
                                       "not applicable (see the tooltip)", {"fast_paths": list(paths)})

    def on_state(self, state: str) -> None:
        busy = state != ctl.IDLE
        self.start_button.setEnabled(not busy)
        self.start_action.setEnabled(not busy)
        stoppable = state in (ctl.STARTING, ctl.RUNNING, ctl.DRAINING)
        self.stop_button.setEnabled(stoppable)
        self.stop_action.setEnabled(stoppable)
        if state == ctl.STARTING:
            self._echo_warned = False
        if state == ctl.IDLE:
            can = len(self.series) > 0 and self.controller.journal is not None
            self.export_button.setEnabled(can)    # a failed Start kept the last session: its Export stays
            self.export_action.setEnabled(can)
        if state in (ctl.STOPPING, ctl.IDLE):
            self.keepup_banner.hide()             # stale once the session stops
            self.backlog_label.setText("")
            self.device_panel.out_meter.set_idle("")
            self.device_panel.show_mic_idle()
        self._show_state("listen" if state == ctl.RUNNING else state)

    def on_meters(self, m: dict) -> None:
        self.device_panel.show_meters(m)
        self.backlog_label.setText(f"queued: {m.get('backlog', 0)} s in · {m.get('playback_s', 0.0):.1f} s out · "
                                   f"barge-ins {m.get('barge_ins', 0)}")
        self.scope.refresh()
        self._ticks = getattr(self, "_ticks", 0) + 1
        if self._ticks % 8 == 0:                 # the spectrogram: only its new hops, 3 times a second
            self.spectrogram.refresh()
        if m.get("echo_error") and not getattr(self, "_echo_warned", False):
            self._echo_warned = True
            self.show_message("warning", m["echo_error"])
        if m.get("starting") and m.get("unheard_s"):     # speech while the model loads is not heard (the
            self.state_label.setText("STARTING… (not listening yet)")   # controller's banner says so too)

    def _progress(self, key: str) -> str:
        """What stopping or finishing is waiting for: the second in progress."""
        done, fed = len(self.series), self.controller.submitted
        if key == ctl.STOPPING:
            return f"STOPPING: finishing second {done}…" if fed > done else "STOPPING…"
        if key == ctl.DRAINING:
            return f"FINISHING: second {min(done + 1, fed)} of {fed}…" if fed else "FINISHING…"
        return STATE_STYLE.get(key, (key.upper(), ""))[0]

    def show_decision(self, decision: str) -> None:
        """The state label shows a second's decision ("listen" / "speak") whatever the session's state."""
        self._show_state(decision)

    def _show_state(self, key: str) -> None:
        text, colour = STATE_STYLE.get(key, (key.upper(), "#8a8f98"))
        self.state_label.setText(self._progress(key) if key in (ctl.STOPPING, ctl.DRAINING) else text)
        self.state_label.setStyleSheet(f"background: {colour}; color: white; font-weight: bold; font-size: 13pt;"
                                       "padding: 4px 14px; border-radius: 4px;")

    def show_message(self, level: str, text: str) -> None:
        self.message_banner.set_colour({"error": "#f4b6b2", "warning": "#fbe3a6"}.get(level, "#cfe3f6"))
        self.message_banner.setText(text)
        self.message_banner.show()
        self.events.add(level, text)

    # -- export --------------------------------------------------------------------------------
    def export_dialog(self) -> None:
        folder = self.choose_export_folder("Export the session into…")
        if folder:
            self.settings.export_dir = folder
            self.export_to(folder)

    def export_to(self, folder) -> Optional[Dict[str, Path]]:
        """Write all exports into ``folder``; a failure shows one message and returns None."""
        try:
            paths = self.controller.export(folder)       # whole or nothing (engine/session/journal.py)
        except (ExportError, WavError, OSError) as e:
            self.show_message("error", f"export failed: {e}")
            return None
        self.show_message("info", f"exported {len(paths)} files to {folder}")
        return paths

    # -- closing ------------------------------------------------------------------------------
    def closeEvent(self, event) -> None:
        """Closing during a session asks Export / Discard / Cancel (``close_policy`` answers instead:
        scripted runs keep the session and export it themselves), then WAITS until the engine and
        pump threads are gone: a thread destroyed while it runs aborts the process."""
        c = self.controller
        if c.state != ctl.IDLE:
            choice = self.close_policy or self.ask_close()
            if choice == "cancel":
                event.ignore()
                return
            self.show_message("info", "finishing the second in progress…")
            QApplication.processEvents()
            c.shutdown()
            if choice == "export":
                folder = self.choose_folder("Export the session into…")
                if folder:
                    self.export_to(folder)
            elif choice == "discard":
                c.discard()
        if self.persist_settings:
            self.save_settings()
        QApplication.instance().removeEventFilter(self)
        super().closeEvent(event)
