"""`duplexcadence synth`: decode speech tokens to a float32 waveform with an engine decoder tail."""
from __future__ import annotations

import argparse
import sys

from engine.cli.validate import OneLineParser, count, output_file, seed
from engine import registry
from engine.npio import AUDIO_SUFFIXES


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="duplexcadence synth", description=__doc__)
    p.add_argument("--model", required=True, help="decoder tail: " + " | ".join(registry.tail_names()))
    p.add_argument("--checkpoint", help="decoder weights (" + registry.checkpoint_hints() + "); "
                                        "omit for seeded random weights at the released size")
    p.add_argument("--out", required=True, help="output: .npy (float32 waveform, 24 kHz, bit exact) or .wav "
                                                "(16-bit PCM); written atomically")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=seed, default=0, help="seed of the random weights (0 to 2**63-1)")
    p.add_argument("--mode", default="graphs", choices=["stock", "demand", "graphs"],
                   help="state allocation / execution mode (all give the same bits); graphs fall back "
                        "to eager without CUDA")
    p.add_argument("--size", default="released", choices=["released", "tiny"],
                   help="size of the seeded random weights when no --checkpoint is given")
    p.add_argument("--reference-paths", action="store_true",
                   help="no self-checked faster path: the decoder's reference path only (also "
                        "$DUPLEXCADENCE_REFERENCE_PATHS=1)")
    registry.add_options(p, registry.tails(), checks={"file": None, "count": count})   # each model's own
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.reference_paths:
        from engine import fastpath
        fastpath.force_reference(True)
    try:
        entry = registry.get(a.model)
    except KeyError as e:
        p.error(str(e.args[0]))
    if entry.synth is None:
        print(f"duplexcadence synth: model {a.model!r} has no synth command", file=sys.stderr)
        return 2
    try:
        output_file(a.out, "--out", inputs=[getattr(a, k, None) for k in registry.file_options(registry.tails()) + ("checkpoint",)],
                    suffixes=AUDIO_SUFFIXES)
        return int(entry.synth(a) or 0)
    except (OSError, ValueError, KeyError) as e:                # FileNotFoundError and WavError included
        print(f"duplexcadence synth: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
