"""The System prompt panel (offscreen window): with MiniCPM-o 4.5 chosen it shows the demo's default duplex
preset, an edited prompt goes into the session's config and the session starts from it (its export records
it), the field is disabled while a session runs, Reset to default, the text is remembered with the settings,
and a bad prompt is one message that leaves the text as it was. Another backbone shows one line instead."""
from __future__ import annotations

import json

import pytest

from app import controller as ctl
from app.audio_io import FileInput
from app.prompt_panel import RUNNING_NOTE
from app.settings import load_settings, open_qsettings
from engine import system_prompt
from engine.backbones.minicpmo45.prompt import DEFAULT_SYSTEM_PROMPT
from engine.session import LiveRunner, SessionConfig
from test_app_fakes import SlowRunner, make_window, stop

MINE = "You are a terse assistant.\nAnswer in one sentence.\t简短地回答。"


def choose(w, tail="step-audio2", backbone="minicpm-o-4.5", size="tiny"):
    w.model_panel.set_values(tail, backbone, size, "", "")


def test_default_and_other_backbones(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, LiveRunner)
    p = w.prompt_panel
    choose(w)
    assert p.text() == DEFAULT_SYSTEM_PROMPT and p.edit.isVisible() and p.reset_button.isVisible()
    assert p.edit.isEnabled() and not p.note.isVisible()
    assert p.status.text() == f"{len(DEFAULT_SYSTEM_PROMPT)} / 4,000 characters (default)"
    assert p.value() == (DEFAULT_SYSTEM_PROMPT, "")
    choose(w, tail="mimi", backbone="synthetic")         # a backbone without a system prompt: one line
    assert not p.edit.isVisible() and not p.reset_button.isVisible() and p.note.isVisible()
    assert p.note.text().endswith("backbone has no system prompt.") and "\n" not in p.note.text()
    assert p.value() == (None, "") and p.text() == DEFAULT_SYSTEM_PROMPT      # kept for when it comes back


def test_edit_reaches_the_config_and_reset(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, LiveRunner)
    p = w.prompt_panel
    choose(w)
    p.edit.setPlainText(MINE)
    assert p.status.text().endswith("characters") and "(default)" not in p.status.text()
    qtbot.waitUntil(lambda: w.model_panel.validate()[0] is not None, timeout=30000)
    cfg = w.session_config()
    assert cfg is not None and cfg.system_prompt == MINE and cfg.backbone == "minicpm-o-4.5"
    p.reset_button.click()
    assert p.text() == DEFAULT_SYSTEM_PROMPT and w.session_config().system_prompt == DEFAULT_SYSTEM_PROMPT
    choose(w, tail="mimi", backbone="synthetic")
    qtbot.waitUntil(lambda: w.model_panel.validate()[0] is not None, timeout=30000)
    assert w.session_config().system_prompt is None      # the config would refuse a prompt for this backbone


def test_session_starts_from_the_edited_prompt_and_exports_it(qtbot, tmp_path, speech_wav, one_torch_thread):
    """The panels' Start: the running session's backbone holds the edited text, the field is disabled (with
    a note) until the session ends, and the exported trace records the prompt used."""
    w = make_window(qtbot, tmp_path, LiveRunner)
    p = w.prompt_panel
    choose(w)
    w.device_panel.add_input_file(str(speech_wav))
    p.edit.setPlainText(MINE)
    qtbot.waitUntil(lambda: w.model_panel.validate()[0] is not None, timeout=30000)
    assert w.start_session()
    c = w.controller
    assert not p.edit.isEnabled() and not p.reset_button.isEnabled() and p.note.text() == RUNNING_NOTE
    qtbot.waitUntil(lambda: len(c.records) >= 2, timeout=90000)
    assert c.runner.session.backbone.system_prompt == MINE
    assert c.session_info["system_prompt"] == MINE
    stop(qtbot, w)
    assert p.edit.isEnabled() and p.reset_button.isEnabled() and not p.note.isVisible()
    paths = w.export_to(tmp_path / "export")
    trace = json.loads(paths["trace"].read_text())
    assert trace["otherData"]["system_prompt"] == MINE


def test_disabled_while_any_session_runs(qtbot, tmp_path, speech_wav):
    w = make_window(qtbot, tmp_path, SlowRunner)
    p = w.prompt_panel
    choose(w)
    assert w.start_with(SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu"),
                        FileInput(speech_wav))
    assert w.controller.state != ctl.IDLE and not p.edit.isEnabled() and not p.reset_button.isEnabled()
    stop(qtbot, w)
    assert p.edit.isEnabled()


def test_prompt_is_remembered_with_the_settings(qtbot, tmp_path):
    w = make_window(qtbot, tmp_path, LiveRunner)
    choose(w)
    w.save_settings()
    assert load_settings(open_qsettings(str(tmp_path / "s.ini"))).system_prompt == ""   # the default: not copied
    w.prompt_panel.edit.setPlainText(MINE)
    w.save_settings()
    assert load_settings(open_qsettings(str(tmp_path / "s.ini"))).system_prompt == MINE
    w2 = make_window(qtbot, tmp_path, LiveRunner)
    assert w2.model_panel.backbone.currentData() == "minicpm-o-4.5" and w2.prompt_panel.text() == MINE


@pytest.mark.parametrize("text, words", [
    ("", "The system prompt is empty"),
    (" \n\t ", "The system prompt is empty"),
    ("x" * 4001, "4,001 characters long; at most 4,000"),
    ("Be brief.\x1b[31m", "control character (U+001B) at character 10"),
    ("nul\x00", "control character (U+0000) at character 4"),
])
def test_bad_prompt_is_one_message_and_keeps_the_text(qtbot, tmp_path, speech_wav, text, words):
    w = make_window(qtbot, tmp_path, SlowRunner)
    p = w.prompt_panel
    choose(w)
    w.device_panel.add_input_file(str(speech_wav))
    p.edit.setPlainText(text)
    assert words in p.status.text()                          # said under the field as it is typed
    qtbot.waitUntil(lambda: w.model_panel.validate()[0] is not None, timeout=30000)
    n_errors = sum(e.kind == "error" for e in w.log.events)
    assert not w.start_session() and w.controller.state == ctl.IDLE
    assert words in w.message_banner.text() and "\n" not in w.message_banner.text()
    assert sum(e.kind == "error" for e in w.log.events) == n_errors + 1   # one message
    assert p.text() == text and p.edit.isEnabled()          # the user's text is not lost
    p.edit.setPlainText("x" * system_prompt.MAX_CHARS)          # fixed: the red line goes
    assert p.value() == ("x" * system_prompt.MAX_CHARS, "") and p.status.text() == "4,000 / 4,000 characters"
