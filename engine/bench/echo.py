"""`duplexcadence-bench echo`: the whole loop without headphones, headless and repeatable.

  duplexcadence-bench echo [--seconds 60] [--delay-ms 120] [--gain-db -10] [--seed 0]
                           [--reported-delay-ms MS] [--tail TAIL] [--size tiny] [--device cpu]
                           [--modes on,off] [--out DIR]
  duplexcadence-bench echo --minutes N ...   (a whole conversation on drifting devices: engine/bench/echo_long.py)

A session (the synthetic backbone and a decoder tail: the app's default unless ``--tail`` names another; the
title line and the JSON name it) runs second by second. Its speech plays through a
simulated echo path (``--delay-ms`` later, ``--gain-db`` quieter, a short room impulse response made from
``--seed``) back into its input, over a user's speech-like voice whose turns ``--seed`` places. Audio moves
in 20 ms blocks as a device's callbacks move it: the echo canceller (engine/echo, WebRTC AEC3) is fed what
the speaker plays and what the microphone hears; the barge-in detector (engine/echo/bargein.py) reads the
cleaned microphone and ducks the playback at the next block, as the app does; the engine follows at its
next second. The canceller is told ``--reported-delay-ms`` (what an audio layer would report; by default
the true delay off by a seeded error of up to 40 %), never tuned to the path.

Each mode (``on``: cancellation; ``off``: the raw microphone) reports ``erle_db`` (echo return loss
enhancement over the model's speaking seconds, frames without the user), ``false_barge_ins`` (barge-ins the
model's own voice fired: the detector's, and the engine's own self-interruptions), ``missed_barge_ins``
(the user talked over the model's speech and it kept playing over 300 ms), ``barge_in_latency_ms``
(the user's onset, or the model starting over the user, to the model's playback stopping: median and
worst). Results: a table on stdout and ``echo.json``, ``echo.md``, ``echo.png`` under ``--out`` (plus each
mode's records).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

from engine.cli.validate import OneLineParser
from engine.bench import report
from engine.bench.echo_sim import BLOCK, RATE, SPEECH_DB, EchoPath, LoopResult, level_db, run_loop, user_voice
from engine.models import registry
from engine.session import SessionConfig, export_records
from engine.stats import percentile, table

#: speech over the user for longer than this is a missed barge-in (ms)
MISS_MS = 300.0
#: a barge-in fired this long after a turn's end still belongs to it (the detector's quiet time)
AFTER_TURN_S = 0.55
TARGETS = {"erle_db": 20.0, "false_barge_ins": 0, "missed_barge_ins": 0, "barge_in_latency_ms": 300.0}


def _blocks(x: np.ndarray) -> np.ndarray:
    n = x.size // BLOCK
    return np.mean(np.square(x[:n * BLOCK].reshape(n, BLOCK), dtype=np.float64), axis=1)


def erle_db(r: LoopResult, turns: List[Tuple[int, int]]) -> float:
    """Microphone energy vs cleaned energy over the model's speaking seconds, in 20 ms blocks where the echo
    is present and the user is not talking (dB; 0 when the model never spoke)."""
    echo, mic, clean = _blocks(r.echo), _blocks(r.mic), _blocks(r.clean)
    use = 10.0 * np.log10(echo + 1e-12) > SPEECH_DB - 10.0
    speaking = [rec.index + 1 for rec in r.records if rec.decision == "speak"]     # output k plays in k+1
    in_speaking = np.zeros(use.size, bool)
    per_s = RATE // BLOCK
    for k in speaking:
        in_speaking[k * per_s:(k + 1) * per_s] = True
    for a, b in turns:
        use[max(0, a // BLOCK - 5): b // BLOCK + 10] = False
    use &= in_speaking
    if not use.any():
        return 0.0
    return float(10.0 * np.log10(mic[use].sum() / max(clean[use].sum(), 1e-20)))


def _speech_blocks(x: np.ndarray) -> np.ndarray:
    return 10.0 * np.log10(_blocks(x) + 1e-12) > SPEECH_DB


def barge_ins(r: LoopResult, turns: List[Tuple[int, int]]) -> Dict[str, object]:
    """Each turn the model spoke over, its latency (onset to the last speech block played over it) and
    whether a barge-in fired for it; each barge-in that no turn explains is false."""
    played, sched = _speech_blocks(r.played), _speech_blocks(r.scheduled)
    latencies, missed, events = [], 0, []
    for a, b in turns:
        lo, hi = a // BLOCK, min(b // BLOCK, played.size)
        over = np.flatnonzero(sched[lo:hi] | played[lo:hi])
        if over.size == 0:
            continue                                      # the model was silent all through this turn
        onset = max(a, (lo + over[0]) * BLOCK)            # the user's onset, or the model starting over the user
        spoken = np.flatnonzero(played[onset // BLOCK:hi])
        stop = (onset // BLOCK + spoken[-1] + 1) * BLOCK if spoken.size else onset
        ms = (stop - onset) * 1000.0 / RATE
        fired = any(a <= f <= b + AFTER_TURN_S * RATE for f, _ in r.fired)
        latencies.append(float(ms))
        missed += int(ms > MISS_MS and not fired)
        events.append({"onset_s": round(onset / RATE, 3), "latency_ms": round(ms, 1), "fired": fired})
    false_local = sum(1 for f, _ in r.fired if not any(a <= f <= b + AFTER_TURN_S * RATE for a, b in turns))
    return {"latencies": latencies, "missed": missed, "false_local": false_local, "events": events}


def engine_self_interruptions(r: LoopResult, turns: List[Tuple[int, int]]) -> int:
    """Seconds where the engine stopped its reply for 'user speech' while the user was silent all second."""
    user = np.zeros(len(r.records), bool)
    for a, b in turns:
        user[a // RATE: min(len(user), -(-b // RATE))] = True
    out = 0
    for prev, rec in zip(r.records, r.records[1:]):
        if prev.decision == "speak" and rec.decision != "speak" and rec.user_speech and not user[rec.index]:
            out += 1
    return out


def annotate(r: LoopResult, events: List[Dict[str, object]]) -> None:
    """Fill the records' audio-path fields: barge-ins (by the second they fired in), the latency of each turn
    the model spoke over (by its onset's second), the canceller's echo suppression."""
    n = len(r.records)
    for fired_at, _ in r.fired:
        if fired_at // RATE < n:
            r.records[fired_at // RATE].barge_ins += 1
    for e in events:
        k = int(e["onset_s"])
        if k < n and e["fired"]:
            r.records[k].barge_in_latency_ms = max(r.records[k].barge_in_latency_ms, float(e["latency_ms"]))
    for rec, supp in zip(r.records, r.suppression):
        rec.echo_suppression_db = round(supp, 3) if supp is not None else 0.0


def summarize_mode(r: LoopResult, turns: List[Tuple[int, int]]) -> Dict[str, object]:
    b = barge_ins(r, turns)
    annotate(r, b["events"])
    lat = b["latencies"]
    self_int = engine_self_interruptions(r, turns)
    supp = [s for s in r.suppression if s is not None]
    return {"erle_db": round(erle_db(r, turns), 2),
            "false_barge_ins": b["false_local"] + self_int,
            "false_barge_ins_detector": b["false_local"], "engine_self_interruptions": self_int,
            "missed_barge_ins": b["missed"], "barge_ins_fired": len(r.fired), "user_turns_over_speech": len(lat),
            "barge_in_latency_ms": {"median": round(percentile(lat, 50), 1) if lat else 0.0,
                                    "worst": round(max(lat), 1) if lat else 0.0},
            "barge_in_events": b["events"],
            "echo_suppression_db_last": round(supp[-1], 2) if supp else None,
            "speak_seconds": sum(1 for rec in r.records if rec.decision == "speak"),
            "aec_cpu_fraction": round(r.aec_cost, 5)}


def meets_targets(m: Dict[str, object]) -> Dict[str, bool]:
    """Each echo target (TARGETS) for a mode with cancellation on."""
    return {"erle_db": bool(m["erle_db"] >= TARGETS["erle_db"]), "false_barge_ins": m["false_barge_ins"] == 0,
            "missed_barge_ins": m["missed_barge_ins"] == 0,
            "barge_in_latency_ms": bool(m["barge_in_latency_ms"]["worst"] <= TARGETS["barge_in_latency_ms"])}


def reported_delay(delay_ms: float, seed: int) -> float:
    """What an audio layer would report: the true delay off by a seeded error of up to 40 %."""
    return round(delay_ms * np.random.default_rng(seed + 31).uniform(0.6, 1.4), 1)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="duplexcadence-bench echo", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--delay-ms", type=float, default=120.0, help="speaker-to-microphone delay of the echo path")
    p.add_argument("--gain-db", type=float, default=-10.0, help="echo path gain (negative: quieter)")
    p.add_argument("--seed", type=int, default=0, help="the room response and the user's turns")
    p.add_argument("--reported-delay-ms", type=float, default=None,
                   help="the latency the canceller is told (default: the true delay off by a seeded error)")
    p.add_argument("--tail", default=registry.default_tail(), choices=registry.tail_names(),
                   help=f"decoder tail (default: the app's, {registry.default_tail()})")
    p.add_argument("--size", default="tiny", choices=["auto", "released", "tiny"])
    p.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    p.add_argument("--modes", default="on,off", help="comma-separated: on (echo cancellation), off")
    p.add_argument("--out", default="bench-results/echo", help="folder for echo.json, echo.md, echo.png")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--minutes", type=float, default=None,
                   help="a whole conversation instead: N simulated minutes on devices with clocks of their own, the "
                        "echo path changing ('duplexcadence-bench echo --minutes 1 --help' for its options)")
    return p


def check_args(a) -> List[str]:
    """The modes asked for; ValueError with one sentence for a bad option."""
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in ("on", "off") for m in modes):
        raise ValueError(f"--modes takes on and/or off; got {a.modes!r}")
    if a.seconds < 5:
        raise ValueError(f"--seconds must be at least 5 (a turn and a reply); got {a.seconds}")
    if not 0 <= a.delay_ms <= 1000:
        raise ValueError(f"--delay-ms must be between 0 and 1000; got {a.delay_ms}")
    if not -60 <= a.gain_db <= 6:
        raise ValueError(f"--gain-db must be between -60 and 6; got {a.gain_db}")
    if a.reported_delay_ms is not None and not 0 <= a.reported_delay_ms <= 1000:
        raise ValueError(f"--reported-delay-ms must be between 0 and 1000; got {a.reported_delay_ms}")
    return modes


def run(a) -> Dict[str, object]:
    """Every mode over the same path and voice; the JSON document."""
    modes = check_args(a)
    cfg = SessionConfig(tail=a.tail, backbone="synthetic", size=a.size, device=a.device, seed=a.seed).resolved()
    voice, turns = user_voice(a.seconds, a.seed)
    told = a.reported_delay_ms if a.reported_delay_ms is not None else reported_delay(a.delay_ms, a.seed)
    doc = {"seconds": a.seconds, "delay_ms": a.delay_ms, "gain_db": a.gain_db, "seed": a.seed,
           "reported_delay_ms": told, "tail": a.tail, "size": cfg.size, "device": cfg.device,
           "user_turns": [[round(x / RATE, 3), round(y / RATE, 3)] for x, y in turns], "targets": TARGETS,
           "modes": {}, "_records": {}}
    for mode in modes:
        r = run_loop(cfg, voice, EchoPath(a.delay_ms, a.gain_db, a.seed), mode == "on", told, a.seed, a.quiet)
        doc["modes"][mode] = summarize_mode(r, turns)
        doc["_records"][mode] = r.records
    if "on" in doc["modes"]:
        doc["meets_targets"] = meets_targets(doc["modes"]["on"])
    return doc


def _table(doc: Dict[str, object]) -> str:
    heads = ["mode", "ERLE dB", "false barge-ins", "(detector/engine)", "missed", "latency p50 ms", "worst ms",
             "turns over speech", "AEC cost %"]
    rows = [[f"cancellation {m}", f"{s['erle_db']:.1f}", s["false_barge_ins"],
             f"{s['false_barge_ins_detector']}/{s['engine_self_interruptions']}", s["missed_barge_ins"],
             f"{s['barge_in_latency_ms']['median']:.0f}", f"{s['barge_in_latency_ms']['worst']:.0f}",
             s["user_turns_over_speech"], f"{100 * s['aec_cpu_fraction']:.2f}"] for m, s in doc["modes"].items()]
    return table(rows, heads)


def title_line(a, doc: Dict[str, object]) -> str:
    """The run in one line: its length, the tail that spoke, the path and what the canceller was told."""
    return (f"echo loop: {a.seconds} s, {doc['tail']} tail ({doc['size']}, {doc['device']}), path {a.delay_ms:g} ms / "
            f"{a.gain_db:g} dB (seed {a.seed}), canceller told {doc['reported_delay_ms']:g} ms")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(x == "--minutes" or x.startswith("--minutes=") for x in argv):
        from engine.bench import echo_long
        return echo_long.main(argv)
    a = build_parser().parse_args(argv)
    try:
        doc = run(a)
    except ValueError as e:
        print(f"duplexcadence-bench echo: error: {e}", file=sys.stderr)
        return 2
    records = doc.pop("_records")
    title = title_line(a, doc)
    tab = _table(doc)
    print(title)
    print(tab)
    notes = [f"targets (cancellation on): {doc['meets_targets']}"] if "meets_targets" in doc else []
    for line in notes:
        print(line)
    if a.out:
        out = Path(a.out)
        try:
            for mode, recs in records.items():
                export_records(recs, out, stem=f"echo-{mode}")
            lat = {f"cancellation {m}": [e["latency_ms"] for e in s["barge_in_events"]] for m, s in doc["modes"].items()}
            fig = report.Figure([
                report.Bars("false / missed barge-ins", "count", list(lat),
                            {"false": [s["false_barge_ins"] for s in doc["modes"].values()],
                             "missed": [s["missed_barge_ins"] for s in doc["modes"].values()]}),
                report.Lines("barge-in latency per user turn over speech", "turn", "ms", lat,
                             hline=(TARGETS["barge_in_latency_ms"], "target"))])
            md = report.markdown(title, report.command_line("duplexcadence-bench echo", argv or sys.argv[1:]),
                                 [("", tab)], notes)
            report.write_all(out / "echo.json", doc, md, fig)
        except OSError as e:
            print(f"duplexcadence-bench echo: error: {e}", file=sys.stderr)
            return 1
        print(f"wrote {out / 'echo.json'}, echo.md, echo.png and each mode's records", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
