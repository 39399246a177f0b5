"""`duplexcadence-bench drift`: a speaker or a microphone off its nominal rate, for minutes: is speech dropped, does
the delay stay bounded?

  duplexcadence-bench drift [--minutes 10] [--speeds 0.81:1.0,1.05:1.0] [--delay-s 0.5] [--seed 0] [--out DIR]

Each ``OUT:IN`` pair of ``--speeds`` runs the long echo bench's loop (engine/bench/echo_loop.py: the app's audio
path against simulated devices, a user talking in turns and bursts of interruptions, the engine on the CPU)
with the speaker's clock at ``OUT`` and the microphone's at ``IN`` times their nominal 48 kHz, and the speaker
not heard by the microphone (headphones: this bench is about the clocks, the echo bench about the echo). Per
minute it reports the seconds the engine spoke, the speech dropped to keep the delay bounded (barge-ins' flushes
apart: those are asked for), the mic->speaker delay (the end of an input second to its answer's first sound)
and the reply gap. Targets: dropped speech at most 1 % of the spoken seconds, the mic->speaker delay within the
playback delay + 1.5 s in every minute.
"""
from __future__ import annotations

import argparse
import sys
from typing import Dict, List

from engine.bench import echo_long, provenance
from engine.stats import table

TARGETS = {"dropped_share": echo_long.TARGET_DROPPED_SHARE, "mic_to_speaker_extra_s": echo_long.TARGET_DELAY_EXTRA_S}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="duplexcadence-bench drift", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="simulated minutes per pair (0.5 or more)")
    p.add_argument("--speeds", default="0.81:1.0,1.05:1.0",
                   help="comma-separated OUT:IN pairs: the speaker's and the microphone's clock, shares of nominal")
    p.add_argument("--delay-s", type=float, default=0.5, help="the session's playback delay")
    p.add_argument("--compute-ms", default="100:470", help="LISTEN:SPEAK, the engine's time per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-results/drift", help="folder for drift.json ('' for none)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def _one(a, speeds: str) -> Dict[str, object]:
    """One pair's run through the long echo bench's loop (its argument checks included)."""
    b = echo_long.build_parser().parse_args(
        ["--minutes", str(a.minutes), "--speeds", speeds, "--delay-s", str(a.delay_s), "--compute-ms", a.compute_ms,
         "--seed", str(a.seed), "--modes", "on", "--out", ""] + (["--quiet"] if a.quiet else []))
    echo_long.check_args(b)
    doc = echo_long.run_mode(b, cancel=True, echo=False)
    bound = a.delay_s + echo_long.TARGET_DELAY_EXTRA_S
    worst = max((r["mic_to_speaker_s_max"] or 0.0) for r in doc["minutes"])
    doc["meets_targets"] = {"dropped_share": doc["dropped_share"] <= echo_long.TARGET_DROPPED_SHARE,
                            "mic_to_speaker_every_minute": worst <= bound}
    doc["mic_to_speaker_bound_s"] = bound
    return doc


def run(a, argv: List[str]) -> Dict[str, object]:
    pairs = [p.strip() for p in a.speeds.split(",") if p.strip()]
    if not pairs:
        raise ValueError(f"--speeds takes OUT:IN pairs; got {a.speeds!r}")
    command = "duplexcadence-bench drift " + " ".join(argv)
    doc = {"command": command, "commit": echo_long.git_commit(), "provenance": provenance.record(command),
           "machine": echo_long.machine(), "minutes": a.minutes, "playback_delay_s": a.delay_s,
           "compute_ms": a.compute_ms, "seed": a.seed, "targets": TARGETS, "runs": {}}
    for pair in pairs:
        doc["runs"][pair] = _one(a, pair)
    return doc


def _table(doc: Dict[str, object]) -> str:
    rows = []
    for pair, r in doc["runs"].items():
        for m in r["minutes"]:
            rows.append([pair, m["minute"], m["spoken_s"], m["dropped_speech_s"], m["flushed_s"],
                         m["mic_to_speaker_s_max"]])
    return table(rows, ["OUT:IN", "minute", "spoken s", "dropped s", "flushed by barge-ins s", "mic->speaker max s"])


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    try:
        doc = run(a, argv)
    except ValueError as e:
        print(f"duplexcadence-bench drift: error: {e}", file=sys.stderr)
        return 2
    print(_table(doc))
    for pair, r in doc["runs"].items():
        print(f"{pair}: dropped {r['dropped_speech_s']} of {r['spoken_s']} s spoken ({100 * r['dropped_share']:.2f} %), "
              f"mic->speaker max {r['mic_to_speaker_s']['max']} s, reply gap p50 {r['reply_gap_s']['p50']} s; "
              f"targets {r['meets_targets']}")
    return echo_long.write_doc(a.out, "drift.json", doc, "drift")


if __name__ == "__main__":
    sys.exit(main())
