"""A private PulseAudio server for scripted runs of the app: null sinks "mic" and "spk", nothing shared.

The server runs in user mode with no kernel modules and its own socket under a folder of the caller's; its
clients find it through the environment :attr:`PulseServer.env` (``PULSE_SERVER``, and "spk" / "mic.monitor" as
the default sink and source, so the app's ALSA "pulse" device plays into "spk" and records what is played into
"mic"). :meth:`PulseServer.loopback` feeds one sink's monitor into another at a gain (a speaker heard by a
microphone).
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Dict, Optional


class PulseError(RuntimeError):
    """The server did not start or refused a command (one line)."""


class PulseServer:
    """``with PulseServer(folder) as pulse:`` a running server; ``pulse.env`` for its clients."""

    def __init__(self, folder: Path, rate: int = 44100, start_s: float = 15.0):
        self.folder = Path(folder)
        self.rate = int(rate)
        self.start_s = float(start_s)
        self.proc: Optional[subprocess.Popen] = None
        run = self.folder / "run"
        sock = run / "native"
        self.env: Dict[str, str] = dict(os.environ, HOME=str(self.folder), XDG_RUNTIME_DIR=str(run),
                                        PULSE_RUNTIME_PATH=str(run / "pulse"), PULSE_SERVER=f"unix:{sock}",
                                        PULSE_SINK="spk", PULSE_SOURCE="mic.monitor")
        self._sock = sock

    def __enter__(self) -> "PulseServer":
        (self.folder / "run").mkdir(parents=True, exist_ok=True)
        self._log = open(self.folder / "pulseaudio.log", "w")
        self.proc = subprocess.Popen(
            ["pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--disallow-exit", "--use-pid-file=no",
             "--system=false", f"--load=module-native-protocol-unix socket={self._sock} auth-anonymous=1",
             f"--load=module-null-sink sink_name=mic rate={self.rate}",
             f"--load=module-null-sink sink_name=spk rate={self.rate}", "--load=module-always-sink",
             "--log-target=stderr"], env=self.env, stdout=self._log, stderr=self._log)
        deadline = time.monotonic() + self.start_s
        while subprocess.run(["pactl", "info"], env=self.env, capture_output=True).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                tail = (self.folder / "pulseaudio.log").read_text()[-300:].strip().splitlines()
                raise PulseError(f"PulseAudio did not start: {tail[-1] if tail else 'no log'}")
            time.sleep(0.1)
        self.pactl("set-default-sink", "spk")
        self.pactl("set-default-source", "mic.monitor")
        return self

    def pactl(self, *args: str) -> str:
        got = subprocess.run(["pactl", *args], env=self.env, capture_output=True, text=True, timeout=30)
        if got.returncode != 0:
            raise PulseError(f"pactl {' '.join(args)}: {got.stderr.strip() or got.returncode}")
        return got.stdout.strip()

    def loopback(self, source: str, sink: str, gain_db: float, latency_ms: int = 40) -> int:
        """Feed ``source`` into ``sink`` at ``gain_db``; returns the loopback's module index."""
        module = int(self.pactl("load-module", "module-loopback", f"source={source}", f"sink={sink}",
                                f"latency_msec={latency_ms}", "source_dont_move=true", "sink_dont_move=true"))
        stream = None
        for line in self.pactl("list", "sink-inputs").splitlines():
            line = line.strip()
            if line.startswith("Sink Input #"):
                stream = line.split("#", 1)[1]
            elif line == f"Owner Module: {module}" and stream is not None:
                self.pactl("set-sink-input-volume", stream, f"{gain_db:g}dB")
                return module
        raise PulseError(f"the loopback {source} -> {sink} has no stream to set the gain of")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if getattr(self, "_log", None) is not None:
            self._log.close()
