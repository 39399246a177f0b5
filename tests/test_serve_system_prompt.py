"""A system prompt through the serve protocol: `run --engine URL --system-prompt TEXT` starts the server's
session from TEXT (and its logs record it); the server checks the prompt as untrusted input — too long,
control characters, not text, or for a backbone that takes none: refused in words, nothing built.

No Ray: the server here is a small in-process WebSocket server doing what the Serve endpoint does with a
hello (``protocol.read_hello`` then ``SessionHost.config_for``, a refusal for a ValueError), over the
product's LiveRunner (Ray's own endpoint is tested in test_serve_remote.py)."""
from __future__ import annotations

import json
import threading

import pytest

pytest.importorskip("websockets")

from websockets.sync.client import connect  # noqa: E402

from engine.serve import auth  # noqa: E402
from engine.serve import protocol as P  # noqa: E402
from engine.serve.client import RemoteRunner, client_config  # noqa: E402
from engine.serve.hosting import SessionHost  # noqa: E402
from engine.session import LiveRunner, SessionConfig  # noqa: E402

TOKEN = "prompt-test-token-0123456789"
SERVED = SessionConfig(tail="step-audio2", backbone="minicpm-o-4.5", size="tiny", device="cpu", cpu_threads=1)
MINE = "You are a terse assistant.\n用一句话回答。 🙂"


class PromptServer:
    """The Serve endpoint's hello handling (read_hello, config_for, refusals) over a LiveRunner."""

    def __init__(self, base: SessionConfig):
        from websockets.sync.server import serve
        self.host = SessionHost(base, max_sessions=2)
        self.runners = []
        self.server = serve(self._handle, "127.0.0.1", 0)
        self.url = f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handle(self, ws) -> None:
        refusal = auth.check(TOKEN, ws.request.headers)
        try:
            cfg = None if refusal else self.host.config_for(P.read_hello(ws.recv()))
        except (ValueError, KeyError, TypeError) as e:         # as engine/serve/deployment.py refuses
            ws.send(P.encode("refused", message=str(e)))
            ws.close(P.CLOSE_BAD_REQUEST, str(e)[:120])
            return
        runner = LiveRunner(cfg)
        self.runners.append(runner)
        runner.start()
        runner.ready.wait(120)
        ws.send(P.encode("ready", info=dict(runner.session.info), replica="fake", node="", actor=""))
        try:
            for msg in ws:
                if isinstance(msg, bytes):
                    runner.submit(P.unpack_frame(msg, runner.input_rate))   # as engine/serve/pump.py
                    ws.send(P.pack_result(runner.results.get(timeout=60)))
                elif P.decode(msg)["type"] == "stop":
                    ws.send(P.encode("end", seconds=len(runner.session.records)))
                    break
        finally:
            runner.stop(timeout=10.0)

    def close(self) -> None:
        self.server.shutdown()
        self.host.close_all()


@pytest.fixture
def server():
    s = PromptServer(SERVED)
    yield s
    s.close()


def test_run_engine_passes_the_prompt_to_the_servers_session(server, tmp_path, monkeypatch, speech_wav,
                                                             one_torch_thread):
    from engine.cli.run import main as run_main
    (tmp_path / "token").write_text(TOKEN + "\n")
    monkeypatch.delenv("DUPLEXCADENCE_TOKEN", raising=False)
    code = run_main(["--input", str(speech_wav), "--seconds", "2", "--quiet", "--output", str(tmp_path / "o.wav"),
                     "--log", str(tmp_path / "log"), "--model", "step-audio2", "--backbone", "minicpm-o-4.5",
                     "--engine", server.url, "--token-file", str(tmp_path / "token"), "--system-prompt", MINE])
    assert code == 0
    (runner,) = server.runners
    assert runner.session.cfg.system_prompt == MINE and runner.session.backbone.system_prompt == MINE
    trace = json.loads((tmp_path / "log" / "session.trace.json").read_text())
    assert trace["otherData"]["config"]["system_prompt"] == MINE                 # the logs record it
    assert json.loads((tmp_path / "log" / "summary.json").read_text())["config"]["system_prompt"] == MINE


def test_remote_runner_reports_the_prompt_the_server_used(server):
    """Without a prompt the hello leaves it out and the server's session starts from the backbone's default;
    the ready message's info says which text that was."""
    from engine.backbones.minicpmo45.prompt import DEFAULT_SYSTEM_PROMPT
    asked = SessionConfig(tail="step-audio2", backbone="minicpm-o-4.5")
    assert "system_prompt" not in client_config(asked)
    for given, used in ((None, DEFAULT_SYSTEM_PROMPT), (MINE, MINE)):
        r = RemoteRunner(asked.replace(system_prompt=given), server.url, TOKEN)
        r.start()
        assert r.ready.wait(120) and r.session is not None
        assert r.session.info["system_prompt"] == used
        r.stop(timeout=10.0)


def _refusal(url: str, prompt) -> tuple:
    """(the server's first answer, its close code) to a hand-made hello carrying ``prompt``: an untrusted
    client, past every check the product's client makes."""
    hello = json.dumps({"type": "hello", "protocol": P.PROTOCOL,
                        "config": {"tail": "step-audio2", "backbone": "minicpm-o-4.5", "system_prompt": prompt}})
    with connect(url + P.PATH, additional_headers=auth.auth_headers(TOKEN), open_timeout=10) as ws:
        ws.send(hello)
        first = P.decode(ws.recv(timeout=30))
        try:
            ws.recv(timeout=10)
        except Exception:  # noqa: BLE001 - ConnectionClosed: the close code is what is asked
            pass
        return first, ws.close_code


@pytest.mark.parametrize("prompt, words", [
    ("x" * 4001, "the system prompt is 4,001 characters long; at most 4,000 are allowed"),
    ("y" * 15000, "the system prompt is 15,000 characters long"),
    ("z" * 70000, "a text message of 70"),                   # over the protocol's bound: not even parsed
    ("ok\x07", "control character (U+0007) at character 3"),
    ("\ud800 lone surrogate", "control character (U+D800)"),
    (["a", "list"], "must be text, got list"),
    ("   ", "the system prompt is empty"),
])
def test_server_refuses_a_bad_prompt_in_words(server, prompt, words):
    first, code = _refusal(server.url, prompt)
    assert first["type"] == "refused" and words in first["message"] and code == P.CLOSE_BAD_REQUEST
    assert server.runners == []                              # nothing was built


def test_prompt_rules_on_each_side():
    # the longest prompt allowed fits the protocol's bound even in 4-byte characters
    assert P.read_hello(P.hello({"system_prompt": "🙂" * 4000}))["system_prompt"] == "🙂" * 4000
    assert P.read_hello(P.hello({"system_prompt": "中" * 4000}))["system_prompt"] == "中" * 4000
    with pytest.raises(P.ProtocolError, match="at most 4,000"):
        P.read_hello(P.hello({"system_prompt": "中" * 4001}))
    # the product's client says so before it connects (no server is needed)
    with pytest.raises(ValueError, match="at most 4,000"):
        RemoteRunner(SERVED.replace(system_prompt="x" * 4001), "ws://127.0.0.1:9", TOKEN)
    # a server whose backbone takes no prompt refuses one in words
    host = SessionHost(SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu"), max_sessions=1)
    with pytest.raises(ValueError, match="a system prompt is for the minicpm-o-4.5 backbone"):
        host.config_for({"system_prompt": "Be brief."})
    assert host.config_for({}).system_prompt is None
    host.close_all()


def test_run_engine_refuses_a_bad_prompt_before_connecting(tmp_path, capsys):
    from engine.cli.run import main as run_main
    code = run_main(["--input", str(tmp_path / "in.wav"), "--output", str(tmp_path / "o.wav"), "--log",
                     str(tmp_path / "log"), "--backbone", "minicpm-o-4.5", "--engine", "ws://127.0.0.1:9",
                     "--system-prompt", "x" * 4001])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "at most 4,000 are allowed" in err
    assert not (tmp_path / "log").exists()
