"""`duplexcadence-bench echo --minutes N`: a whole conversation without headphones, minute by minute.

  duplexcadence-bench echo --minutes 10 [--gain-db -13] [--speeds 0.81:1.0] [--modes on,off] [--seed 0]
                           [--delay-s 0.5] [--compute-ms 100:470] [--steps 8] [--no-bursts] [--out DIR]

The app's audio path (engine/echo: resampling, echo cancellation, barge-in, the speaker's queue) runs against
simulated devices (engine/bench/echo_devices.py) for ``--minutes`` of simulated time, as fast as the machine
goes: the speaker and the microphone on clocks of their own (``--speeds OUT:IN``, shares of their nominal
48 kHz), an echo path whose delay and gain change (steps every 1-1.5 minutes: delay jumps of -90 to +130 ms, gains
ramped over 2 s between ``--gain-db`` and 6 dB below it; a slow sway of +-15 ms and +-1.5 dB), a user who talks in turns and, from minutes
2, 5.5 and 8.3, interrupts every reply for 30 s (bursts of barge-ins, a twentieth of any run; double talk at each), a worker that is
held up now and then, and the engine (the synthetic backbone and a decoder tail, on the CPU) taking
``--compute-ms`` per listening / speaking second before its answer is queued (100 / 470 ms: MiniCPM-o 4.5
with graphs on an H100, docs/benchmarks.md).

Per minute and mode it reports the echo suppression (microphone vs what the engine was given, over the
blocks with echo and no user: the truth from the simulation) beside the canceller's own readout, the engine's
self-interruptions (it stopped its reply for "user speech" while the user was silent) and the seconds it heard
"speech" that was only echo, the barge-ins (false: no user turn), dropped speech against spoken seconds, the
mic->speaker delay and the reply gap (the user's last word to the model's first, at the speaker: the truth,
and what the app's own meter measured). JSON out.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from engine.bench import provenance
from engine.bench.echo_devices import Clocks, PathSchedule, conversation
from engine.bench.echo_loop import Loop, LoopConfig, Minute
from engine.stats import percentile

#: the echo targets (cancellation on): no self-interruption, at least this suppression in every minute
TARGET_SUPPRESSION_DB = 20.0
#: the drift targets: dropped speech at most this share of the spoken seconds; mic->speaker within the
#: playback delay plus this
TARGET_DROPPED_SHARE = 0.01
TARGET_DELAY_EXTRA_S = 1.5
#: the echo path's steps: (minute share of the run, delay ms, gain below --gain-db); a long run's schedule,
#: scaled to any length
STEPS = ((0.0, 120.0, 0.0), (0.125, 120.0, -4.0), (0.25, 180.0, -4.0), (0.4, 180.0, -1.0), (0.5, 90.0, -1.0),
         (0.65, 90.0, -6.0), (0.75, 220.0, 0.0), (0.9, 160.0, -3.0))
#: bursts of interruptions start at these shares of the run and last this share of it (30 s of ten minutes; a
#: short run's no shorter than 6 s)
BURSTS = (0.2, 0.55, 0.83)
BURST_SHARE = 0.05


def burst_s(seconds: int) -> float:
    return max(6.0, BURST_SHARE * seconds)


def steps(seconds: int, gain_db: float, count: int = len(STEPS)) -> List[Tuple[float, float, float]]:
    """The first ``count`` of :data:`STEPS` ((second, delay ms, gain dB)): all of them at their shares of the run,
    or fewer spread evenly over it (a short run's)."""
    if count >= len(STEPS):
        return [(share * seconds, d, gain_db + g) for share, d, g in STEPS]
    return [(i * seconds / count, d, gain_db + g) for i, (_, d, g) in enumerate(STEPS[:count])]


def schedule(seconds: int, gain_db: float, count: int = len(STEPS)) -> PathSchedule:
    return PathSchedule(steps(seconds, gain_db, count), sway_ms=15.0, sway_db=1.5)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parents[2])
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> str:
    import os
    return f"{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, " \
           f"Python {platform.python_version()}"


def _stats(v: List[float]) -> Dict[str, Optional[float]]:
    return {"n": len(v), "p50": round(percentile(v, 50), 3) if v else None,
            "p90": round(percentile(v, 90), 3) if v else None, "max": round(max(v), 3) if v else None}


def minute_row(i: int, m: Minute) -> Dict[str, object]:
    erle = 10.0 * np.log10(m.mic_energy / max(m.clean_energy, 1e-20)) if m.echo_s >= 1.0 else None
    return {"minute": i, "suppression_db": round(float(erle), 1) if erle is not None else None,
            "echo_s": round(m.echo_s, 1),
            "readout_db": round(float(np.median(m.readout_db)), 1) if m.readout_db else None,
            "self_interrupts": m.self_interrupts, "echo_heard_s": m.echo_heard_s, "barge_ins": m.barge_ins,
            "false_barge_ins": m.false_barge_ins, "spoken_s": m.spoken_s,
            "dropped_speech_s": round(m.dropped_speech_s, 3), "flushed_s": round(m.flushed_s, 3),
            "mic_to_speaker_s_max": round(max(m.mic_to_speaker_s), 3) if m.mic_to_speaker_s else None}


def summarize(loop: Loop, seconds: int) -> Dict[str, object]:
    """The run's per-minute rows and totals."""
    tl = loop.tally
    rows = [minute_row(i, tl.minutes[i]) for i in range(-(-seconds // 60))]
    gaps = tl.reply_gaps(float(seconds))
    sups = [r["suppression_db"] for r in rows if r["suppression_db"] is not None]
    spoken = sum(r["spoken_s"] for r in rows)
    dropped = sum(r["dropped_speech_s"] for r in rows)
    delays = [d for m in tl.minutes.values() for d in m.mic_to_speaker_s]
    path = loop.path
    c = path.canceller
    return {"minutes": rows,
            "self_interrupts": sum(r["self_interrupts"] for r in rows),
            "echo_heard_s": sum(r["echo_heard_s"] for r in rows),
            "false_barge_ins": sum(r["false_barge_ins"] for r in rows),
            "barge_ins": sum(r["barge_ins"] for r in rows),
            "suppression_db_min": min(sups) if sups else None,
            "spoken_s": spoken, "dropped_speech_s": round(dropped, 3),
            "dropped_share": round(dropped / spoken, 5) if spoken else 0.0,
            "flushed_s": round(sum(r["flushed_s"] for r in rows), 3),
            "mic_to_speaker_s": _stats(delays),
            "reply_gap_s": _stats([g for _, g in gaps]),
            "reply_gap_s_app": _stats([g / 1000.0 for g in path.gaps.gaps_ms]),
            "barge_in_latency_ms": _stats(list(path.barge_in_ms)),
            "events": [f"{t:.2f} s {line}" for t, line in loop.events],
            "far_starved_s": round(getattr(getattr(path, "aligner", None), "starved", 0) / 24000.0, 3),
            "aec_cpu_fraction": round(c.cost(), 5) if c is not None else 0.0}


def run_mode(a, cancel: bool, echo: bool = True) -> Dict[str, object]:
    seconds = int(round(a.minutes * 60))
    out_speed, in_speed = a.speeds
    voice, turns = conversation(seconds, a.seed, [share * seconds for share in BURSTS] if a.bursts else (),
                                burst_s(seconds))
    listen, speak = a.compute_ms
    lc = LoopConfig(seconds=seconds, cancel=cancel, clocks=Clocks(out_speed=out_speed, in_speed=in_speed),
                    path=schedule(seconds, a.gain_db, a.steps), voice=voice, turns=turns, seed=a.seed, delay_s=a.delay_s,
                    compute_ms=(listen, speak), echo=echo, quiet=a.quiet)
    return summarize(Loop(lc).run(), seconds)


def _pair(text: str, name: str) -> Tuple[float, float]:
    try:
        x, y = (float(v) for v in text.split(":"))
    except ValueError:
        raise ValueError(f"{name} takes A:B (two numbers); got {text!r}") from None
    return x, y


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duplexcadence-bench echo --minutes", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, required=True, help="simulated minutes (0.5 or more)")
    p.add_argument("--gain-db", type=float, default=-13.0, help="the echo path's loudest gain")
    p.add_argument("--speeds", default="0.81:1.0", help="OUT:IN, the speaker's and the microphone's clock "
                                                        "as shares of nominal")
    p.add_argument("--modes", default="on,off", help="comma-separated: on (echo cancellation), off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--delay-s", type=float, default=0.5, help="the session's playback delay")
    p.add_argument("--compute-ms", default="100:470", help="LISTEN:SPEAK, the engine's time per second")
    p.add_argument("--no-bursts", dest="bursts", action="store_false", help="no bursts of interruptions")
    p.add_argument("--steps", type=int, default=len(STEPS),
                   help=f"the echo path's first N steps of {len(STEPS)}, spread over the run (a short run's)")
    p.add_argument("--out", default="bench-results/echo-long", help="folder for echo-long.json ('' for none)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def check_args(a) -> List[str]:
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in ("on", "off") for m in modes):
        raise ValueError(f"--modes takes on and/or off; got {a.modes!r}")
    if not 0.5 <= a.minutes <= 120:
        raise ValueError(f"--minutes must be between 0.5 and 120; got {a.minutes}")
    if not -60 <= a.gain_db <= 6:
        raise ValueError(f"--gain-db must be between -60 and 6; got {a.gain_db}")
    a.speeds = _pair(a.speeds, "--speeds")
    if not all(0.5 <= s <= 1.5 for s in a.speeds):
        raise ValueError(f"--speeds: each clock between 0.5 and 1.5 of nominal; got {a.speeds}")
    a.compute_ms = _pair(a.compute_ms, "--compute-ms")
    if not all(0 <= c < 1000 for c in a.compute_ms):
        raise ValueError(f"--compute-ms: each between 0 and 1000 ms (the engine keeps up); got {a.compute_ms}")
    if not 0 <= a.delay_s <= 3:
        raise ValueError(f"--delay-s must be between 0 and 3; got {a.delay_s}")
    if not 1 <= a.steps <= len(STEPS):
        raise ValueError(f"--steps must be between 1 and {len(STEPS)}; got {a.steps}")
    return modes


def meets(doc_on: Dict[str, object]) -> Dict[str, bool]:
    return {"self_interrupts": doc_on["self_interrupts"] == 0,
            "suppression_every_minute": doc_on["suppression_db_min"] is not None
            and doc_on["suppression_db_min"] >= TARGET_SUPPRESSION_DB}


def run(a, argv) -> Dict[str, object]:
    modes = check_args(a)
    command = "duplexcadence-bench echo " + " ".join(argv)
    doc = {"command": command, "commit": git_commit(), "machine": machine(), "provenance": provenance.record(command),
           "minutes": a.minutes, "gain_db": a.gain_db, "speeds": {"out": a.speeds[0], "in": a.speeds[1]},
           "seed": a.seed, "playback_delay_s": a.delay_s, "compute_ms": list(a.compute_ms),
           "path_steps": [[round(t, 1), d, g] for t, d, g in steps(int(round(a.minutes * 60)), a.gain_db, a.steps)],
           "bursts_s": [round(s * a.minutes * 60, 1) for s in BURSTS] if a.bursts else [],
           "burst_length_s": burst_s(int(round(a.minutes * 60))),
           "targets": {"self_interrupts": 0, "suppression_db_every_minute": TARGET_SUPPRESSION_DB}, "modes": {}}
    for mode in modes:
        doc["modes"][mode] = run_mode(a, mode == "on")
    if "on" in doc["modes"]:
        doc["meets_targets"] = meets(doc["modes"]["on"])
    return doc


def table(doc: Dict[str, object]) -> str:
    from engine.stats import table as tab
    rows = []
    for mode, m in doc["modes"].items():
        for r in m["minutes"]:
            rows.append([f"{mode}", r["minute"], r["suppression_db"], r["readout_db"], r["self_interrupts"],
                         r["echo_heard_s"], f"{r['false_barge_ins']}/{r['barge_ins']}", r["spoken_s"],
                         r["dropped_speech_s"], r["mic_to_speaker_s_max"]])
    return tab(rows, ["mode", "minute", "suppression dB", "readout dB", "self-interrupts", "echo heard s",
                      "false/all barge-ins", "spoken s", "dropped s", "mic->speaker max s"])


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    try:
        doc = run(a, argv)
    except ValueError as e:
        print(f"duplexcadence-bench echo: error: {e}", file=sys.stderr)
        return 2
    print(table(doc))
    for mode, m in doc["modes"].items():
        print(f"{mode}: self-interrupts {m['self_interrupts']}, lowest minute {m['suppression_db_min']} dB, "
              f"reply gap p50 {m['reply_gap_s']['p50']} s, dropped {m['dropped_speech_s']} of {m['spoken_s']} s")
    if "meets_targets" in doc:
        print(f"targets (cancellation on): {doc['meets_targets']}")
    return write_doc(a.out, "echo-long.json", doc, "echo")


def write_doc(out: Optional[str], name: str, doc: Dict[str, object], command: str) -> int:
    """Write ``doc`` as ``out/name`` (nothing where ``out`` is empty); 1 with one line where that fails."""
    if not out:
        return 0
    path = Path(out) / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n")
    except OSError as e:
        print(f"duplexcadence-bench {command}: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path}", file=sys.stderr)
    return 0
