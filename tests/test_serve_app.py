"""The app's Engine setting (offscreen window): a remote session started from the panels runs through
RemoteRunner and gives the embedded output; the server going away mid-session shows one message,
keeps every second in the session's journal and offers Reconnect, which starts a new session.

The server here is a small in-process WebSocket server that speaks engine/serve's protocol over the
product's LiveRunner (Ray's own endpoint is tested in test_serve_remote.py)."""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

pytest.importorskip("websockets")
pytest.importorskip("pytestqt")

from app import controller as ctl  # noqa: E402
from app.audio_io import FileInput  # noqa: E402
from app.controller import SessionController  # noqa: E402
from app.settings import open_qsettings  # noqa: E402
from app.window import MainWindow  # noqa: E402
from engine.audio import frames_of, load_mono  # noqa: E402
from engine.serve import auth  # noqa: E402
from engine.serve import protocol as P  # noqa: E402
from engine.serve.client import RemoteRunner  # noqa: E402
from engine.session import DuplexSession, LiveRunner, SessionConfig  # noqa: E402

TOKEN = "app-test-token-0123456789"


class ProtocolServer:
    """engine/serve's wire protocol over a LiveRunner per connection; ``die()`` drops every socket."""

    def __init__(self):
        from websockets.sync.server import serve
        self.server = serve(self._handle, "127.0.0.1", 0)
        self.port = self.server.socket.getsockname()[1]
        self.conns = []
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handle(self, ws) -> None:
        refusal = auth.check(TOKEN, ws.request.headers)
        if refusal:
            ws.send(P.encode("refused", message=refusal))
            ws.close(P.CLOSE_UNAUTHORIZED)
            return
        asked = P.read_hello(ws.recv())
        runner = LiveRunner(SessionConfig(cpu_threads=1, **asked))
        runner.start()
        runner.ready.wait(120)
        ws.send(P.encode("ready", info=dict(runner.session.info), replica="fake", node="", actor=""))
        self.conns.append(ws)
        threading.Thread(target=self._results, args=(ws, runner), daemon=True).start()
        try:
            for msg in ws:
                if isinstance(msg, bytes):
                    runner.submit(P.unpack_frame(msg))
                elif P.decode(msg)["type"] == "stop":
                    runner.stop(timeout=30.0, drain=P.decode(msg).get("drain", False))
                    break
        finally:
            runner.stop(timeout=5.0)

    def _results(self, ws, runner) -> None:
        while runner.running or not runner.results.empty():
            try:
                item = runner.results.get(timeout=0.1)
            except Exception:  # queue.Empty
                continue
            try:
                ws.send(P.pack_result(item))
            except Exception:  # noqa: BLE001 - the socket is gone
                return
        try:
            ws.send(P.encode("end", seconds=0))
            ws.close()
        except Exception:  # noqa: BLE001
            pass

    def die(self) -> None:
        for ws in self.conns:
            ws.socket.shutdown(socket.SHUT_RDWR)
        self.conns = []

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def server():
    s = ProtocolServer()
    yield s
    s.close()


def make_window(qtbot, tmp_path):
    w = MainWindow(controller=SessionController(LiveRunner, journal_root=tmp_path / "journals"),
                   settings=open_qsettings(str(tmp_path / "s.ini")), devices=lambda: ([], []), cuda=False)
    qtbot.addWidget(w)
    w.show()
    return w


def use_remote(w, url, token_file):
    p = w.engine_panel
    p.remote.setChecked(True)
    p.url.setText(url)
    p.token_file.setText(str(token_file))
    i = w.model_panel.tail.findData("mimi")
    w.model_panel.tail.setCurrentIndex(i)


def test_engine_setting_is_saved_on_edits_only(qtbot, tmp_path):
    ini = tmp_path / "s.ini"
    w = make_window(qtbot, tmp_path)
    assert "engine" not in ini.read_text() if ini.exists() else True      # building the window wrote nothing
    w.engine_panel.remote.setChecked(True)
    w.engine_panel.url.setText("ws://gpu-box:8765")
    w.engine_panel.url.editingFinished.emit()
    w.qsettings.sync()
    w2 = make_window(qtbot, tmp_path)
    assert w2.engine_panel.remote.isChecked() and w2.engine_panel.url.text() == "ws://gpu-box:8765"
    w2.persist_settings = False                                          # a scripted run changes nothing
    w2.engine_panel.embedded.setChecked(True)
    w2.qsettings.sync()
    assert open_qsettings(str(ini)).value("engine/mode") == "remote"


def test_remote_engine_from_the_panels(qtbot, tmp_path, speech_wav, server, one_torch_thread):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    w = make_window(qtbot, tmp_path)
    c = w.controller
    w.device_panel.add_input_file(str(speech_wav))
    # a URL that is not one, then no token: one message each, nothing starts
    use_remote(w, "localhost:8765", token_file)
    assert not w.start_session() and "Remote engine" in w.message_banner.text() and c.state == ctl.IDLE
    use_remote(w, f"ws://127.0.0.1:{server.port}", tmp_path / "missing")
    assert not w.start_session() and "cannot read the token file" in w.message_banner.text()
    use_remote(w, f"ws://127.0.0.1:{server.port}", token_file)
    qtbot.waitUntil(lambda: w.model_panel.validate()[0] is not None, timeout=30000)
    assert w.start_session()
    assert isinstance(c.runner, RemoteRunner)
    assert c.runner.leave == ("graph_replay",)                 # no CUDA here: the server decides graph replay
    qtbot.waitUntil(lambda: len(c.records) >= 4, timeout=90000)
    assert "session on 127.0.0.1" in w.engine_panel.status.text()
    server.die()                                            # the server goes away mid-session
    qtbot.waitUntil(lambda: c.state == ctl.IDLE, timeout=30000)
    kept = len(c.records)
    assert kept >= 4 and len(w.series) == kept                       # plotted like embedded seconds
    assert "went away after" in w.message_banner.text() and "kept" in w.message_banner.text()
    assert w.engine_panel.reconnect_button.isVisibleTo(w)
    # every second that arrived is in the journal, audio included, and exports like an embedded session
    paths = c.export(tmp_path / "export")
    assert len(paths["jsonl"].read_text().splitlines()) == kept
    heard = frames_of(load_mono(paths["input_wav"]))
    said = load_mono(paths["output_wav"])
    assert said.size == kept * 24000
    s = DuplexSession(SessionConfig(tail="mimi", size="tiny", device="cpu", cpu_threads=1))
    s.start()
    want = np.concatenate([s.process(f)[0] for f in heard[:kept]])
    s.close()
    assert np.abs(want - said).max() <= 1.0 / 32767                 # the journal's WAVs are 16-bit
    # Reconnect: a new session on the server (the lost one stays in its journal)
    w.engine_panel.reconnect_button.click()
    qtbot.waitUntil(lambda: c.state == ctl.RUNNING and len(c.records) >= 1, timeout=90000)
    assert isinstance(c.runner, RemoteRunner) and not w.engine_panel.reconnect_button.isVisibleTo(w)
    c.stop()
    qtbot.waitUntil(lambda: c.state == ctl.IDLE, timeout=30000)
    # a scripted start (start_with) stays embedded whatever the panel says
    assert w.start_with(SessionConfig(tail="mimi", size="tiny", device="cpu").resolved(), FileInput(speech_wav))
    assert isinstance(c.runner, LiveRunner)
    c.stop()
    qtbot.waitUntil(lambda: c.state == ctl.IDLE, timeout=30000)
