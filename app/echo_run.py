"""``python -m app.echo_run``: the app, as a user runs it, on a laptop without headphones, for minutes.

  python -m app.echo_run [--minutes 10] [--gain-db -13] [--seed 0] [--out DIR] [-- APP OPTIONS]

A private PulseAudio server (its own socket in a temporary folder; nothing of the machine's own sound is
touched) has two null sinks: "mic", whose monitor is the app's microphone, and "spk", where the app plays. A
loopback feeds "spk" back into "mic" at ``--gain-db`` (the speaker heard by the microphone), and a user speaks
into "mic": espeak-ng sentences in turns with pauses the model answers in, and three bursts (from 20 %, 55 %
and 83 % of the run, each a twentieth of it) where the user talks again 1.5 s into every pause, over the
model's reply. The app runs as a real process with echo cancellation on
(``python -m app.main --input-device pulse --output-device pulse --seconds N --export DIR --device cpu``;
anything after ``--`` goes to it too, a later option over an earlier one) and exports its session.

From the export and the user's own timeline (wall clock) it reports, per minute: the app's echo suppression
readout (lowest and median of the seconds it measured), the barge-ins and those that came while the user was
silent (self-interruptions), the seconds the engine heard "speech" while the user was silent (echo taken for
the user), the speech dropped, and the reply gap the app measured (p50, p90). JSON and Markdown in ``--out``.
Needs ``pulseaudio``, ``pactl``, ``paplay`` and ``espeak-ng`` (the Makefile's ``sysdeps`` installs them).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from app.pulse import PulseServer
from engine.stats import percentile

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("pulseaudio", "pactl", "paplay", "espeak-ng")
SENTENCES = ("Hello there. Can you tell me what the weather will be like tomorrow?",
             "That sounds good. And what about the weekend?",
             "Thank you, that was very helpful.",
             "Could you say that again, a little more slowly please?")
#: the user's pause after a turn (the model answers in it), and the pause in a burst (talking over the reply)
PAUSE_S = (7.0, 10.0)
BURST_PAUSE_S = 1.5
BURSTS = (0.2, 0.55, 0.83)
BURST_SHARE = 0.05
#: a barge-in or heard speech within this of a user turn is the user's (the app counts a second's events when
#: its record arrives, up to a second and a half after the audio)
NEAR_S = 2.5
TARGET_SUPPRESSION_DB = 20.0


class RunError(RuntimeError):
    """What stopped the run, in one line."""


def voices(folder: Path) -> List[Path]:
    """The user's sentences as WAV files (espeak-ng)."""
    out = []
    for i, text in enumerate(SENTENCES):
        wav = folder / f"turn{i}.wav"
        subprocess.run(["espeak-ng", "-s", "165", "-w", str(wav), text], check=True, capture_output=True,
                       timeout=60)
        out.append(wav)
    return out


def wav_seconds(path: Path) -> float:
    from engine.wavio import read_wav
    x, rate = read_wav(path)
    return len(x) / rate


class User(threading.Thread):
    """Speaks into the "mic" sink from ``start`` for ``seconds``: turns, pauses, bursts; keeps its timeline."""

    def __init__(self, env: Dict[str, str], wavs: Sequence[Path], seconds: float, seed: int):
        super().__init__(name="user", daemon=True)
        self.env, self.wavs, self.seconds = env, list(wavs), seconds
        self.lengths = [wav_seconds(w) for w in self.wavs]
        self.rng = np.random.default_rng(seed)
        self.turns: List[Tuple[float, float]] = []      # wall-clock (start, end) of each sentence played
        self.stop = threading.Event()
        self.t0 = 0.0

    def in_burst(self, t: float) -> bool:
        span = max(6.0, BURST_SHARE * self.seconds)
        return any(b * self.seconds <= t < b * self.seconds + span for b in BURSTS)

    def run(self) -> None:
        self.t0 = time.time()
        while not self.stop.is_set() and time.time() - self.t0 < self.seconds:
            k = int(self.rng.integers(len(self.wavs)))
            start = time.time()
            p = subprocess.Popen(["paplay", "--device=mic", str(self.wavs[k])], env=self.env)
            while p.poll() is None:
                if self.stop.wait(0.05):
                    p.terminate()
            p.wait()
            self.turns.append((start, max(time.time(), start + self.lengths[k])))
            pause = BURST_PAUSE_S if self.in_burst(time.time() - self.t0) else float(self.rng.uniform(*PAUSE_S))
            self.stop.wait(pause)


def run_app(env: Dict[str, str], seconds: int, export: Path, extra: Sequence[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "app.main", "--input-device", "pulse", "--output-device", "pulse",
           "--seconds", str(seconds), "--export", str(export), "--device", "cpu", *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds + 600)


def _near(t0: float, t1: float, turns: Sequence[Tuple[float, float]]) -> bool:
    return any(a < t1 + NEAR_S and b > t0 - NEAR_S for a, b in turns)


def minutes(records: List[dict], turns: Sequence[Tuple[float, float]]) -> List[dict]:
    """Per minute of the session: the readout, barge-ins (false: no user turn near), echo heard, dropped."""
    rows: Dict[int, dict] = {}
    for r in records:
        m = rows.setdefault(int(r["index"]) // 60, {"suppression": [], "barge_ins": 0, "self_interrupts": 0,
                                                   "echo_heard_s": 0, "dropped_ms": 0.0, "spoken_s": 0,
                                                   "reply_gap_ms": []})
        heard_at = float(r["wall_start"]) - float(r.get("queue_wait_ms", 0.0)) / 1000.0   # end of its capture
        arrived = float(r["wall_start"]) + float(r["total_ms"]) / 1000.0
        user = _near(heard_at - 1.0, arrived, turns)
        if r.get("echo_suppression_db"):
            m["suppression"].append(float(r["echo_suppression_db"]))
        m["barge_ins"] += int(r.get("barge_ins", 0))
        m["self_interrupts"] += 0 if user else int(r.get("barge_ins", 0))
        m["echo_heard_s"] += int(bool(r.get("user_speech")) and not _near(heard_at - 1.0, heard_at, turns))
        m["dropped_ms"] += float(r.get("dropped_speech_ms", 0.0))
        m["spoken_s"] += int(r.get("decision") == "speak")
        if r.get("reply_gap_ms"):
            m["reply_gap_ms"].append(float(r["reply_gap_ms"]))
    out = []
    for k in sorted(rows):
        m = rows[k]
        sup = m.pop("suppression")
        m.update(minute=k, suppression_db_min=round(min(sup), 1) if sup else None,
                 suppression_db_p50=round(percentile(sup, 50), 1) if sup else None, measured_s=len(sup),
                 dropped_s=round(m.pop("dropped_ms") / 1000.0, 2))
        out.append(m)
    return out


def summarize(rows: List[dict], summary: dict) -> dict:
    gaps = [g for m in rows for g in m["reply_gap_ms"]]
    lows = [m["suppression_db_min"] for m in rows if m["suppression_db_min"] is not None]
    return {"self_interrupts": sum(m["self_interrupts"] for m in rows),
            "echo_heard_s": sum(m["echo_heard_s"] for m in rows),
            "barge_ins": sum(m["barge_ins"] for m in rows),
            "suppression_db_lowest_minute": min(lows) if lows else None,
            "minutes_measured": len(lows),
            "dropped_s": round(sum(m["dropped_s"] for m in rows), 2),
            "spoken_s": sum(m["spoken_s"] for m in rows),
            "reply_gap_s": {"n": len(gaps), "p50": round(percentile(gaps, 50) / 1000, 2) if gaps else None,
                            "p90": round(percentile(gaps, 90) / 1000, 2) if gaps else None},
            "app_summary": summary,
            "meets_targets": {"self_interrupts": sum(m["self_interrupts"] for m in rows) == 0,
                              "suppression_every_minute": bool(lows) and len(lows) == len(rows)
                              and min(lows) >= TARGET_SUPPRESSION_DB}}


def table(rows: List[dict]) -> str:
    head = ("| minute | readout dB (lowest / p50) | seconds measured | barge-ins | self-interrupts | "
            "echo heard s | spoken s | dropped s |\n|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {m['minute']} | {m['suppression_db_min']} / {m['suppression_db_p50']} | {m['measured_s']} | "
        f"{m['barge_ins']} | {m['self_interrupts']} | {m['echo_heard_s']} | {m['spoken_s']} | {m['dropped_s']} |\n"
        for m in rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.echo_run", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--gain-db", type=float, default=-13.0, help="the speaker into the microphone (dB)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("echo-run"))
    return p


def check(a: argparse.Namespace) -> Optional[str]:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} (the Makefile's sysdeps target installs them)"
    if not 0.25 <= a.minutes <= 60:
        return f"--minutes must be within 0.25..60, not {a.minutes:g}"
    if not -60.0 <= a.gain_db <= 6.0:
        return f"--gain-db must be within -60..6 dB, not {a.gain_db:g}"
    return None


def run(a: argparse.Namespace, extra: Sequence[str]) -> dict:
    seconds = int(round(a.minutes * 60))
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="duplexcadence-echo-") as tmp:
        tmp = Path(tmp)
        wavs = voices(tmp)
        with PulseServer(tmp / "pulse") as pulse:
            pulse.loopback("spk.monitor", "mic", a.gain_db)
            env = dict(pulse.env, QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"),
                       DUPLEXCADENCE_SETTINGS=str(tmp / "settings.ini"))
            user = User(pulse.env, wavs, seconds + 30.0, a.seed)
            user.start()
            try:
                app = run_app(env, seconds, a.out / "export", extra)
            finally:
                user.stop.set()
                user.join(10)
    if app.returncode != 0:
        raise RunError(f"the app exited {app.returncode}: {app.stderr.strip().splitlines()[-1:]}")
    export = a.out / "export"
    records = [json.loads(x) for x in (export / "session.jsonl").read_text().splitlines() if x.strip()]
    summary = json.loads((export / "summary.json").read_text()) if (export / "summary.json").exists() else {}
    rows = minutes(records, user.turns)
    command = "python -m app.echo_run " + " ".join(sys.argv[1:])
    doc = {"command": command, "commit": _commit(), "provenance": _provenance(command),
           "minutes": a.minutes, "gain_db": a.gain_db, "seed": a.seed, "user_turns": len(user.turns),
           "seconds": len(records), **summarize(rows, summary), "per_minute": rows}
    (a.out / "echo-run.json").write_text(json.dumps(doc, indent=2) + "\n")
    (a.out / "echo-run.md").write_text(f"# The app without headphones: {a.minutes:g} min at {a.gain_db:g} dB\n\n"
                                       + table(rows))
    return doc


def _provenance(command: str) -> Dict[str, str]:
    """Where the run ran (the app's CPU session: no GPU libraries took part)."""
    import platform
    from engine.fastpath import environment
    env = environment("cpu")
    return {"commit": _commit(), "device": f"cpu ({platform.processor() or platform.machine()}, "
                                          f"{env.get('cpu_capability', 'unknown')}, {os.cpu_count()} CPUs)",
            "driver": "none (CPU run)", "torch": env["torch"], "cuda": "none (CPU run)",
            "cudnn": "none (CPU run)", "cublas": "none (CPU run)", "python": platform.python_version(),
            "command": command, "recorded": "by app.echo_run, at the run"}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    a = build_parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    problem = check(a)
    if problem:
        print(f"echo_run: {problem}", file=sys.stderr)
        return 2
    try:
        doc = run(a, extra)
    except (RunError, OSError, subprocess.SubprocessError) as e:
        print(f"echo_run: {e}", file=sys.stderr)
        return 1
    print(table(doc["per_minute"]))
    print(f"self-interrupts {doc['self_interrupts']}, lowest minute {doc['suppression_db_lowest_minute']} dB, "
          f"reply gap p50 {doc['reply_gap_s']['p50']} s, dropped {doc['dropped_s']} of {doc['spoken_s']} s")
    print(f"targets: {doc['meets_targets']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
