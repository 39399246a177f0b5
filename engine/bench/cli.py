"""`duplexcadence-bench`: planner inspection and side-by-side benchmarks (stock vs ours, one run).

Subcommands live in their own modules (engine/bench/<name>.py, each with ``main(argv) -> int``).
"""
from __future__ import annotations

import sys

from engine.cli import run_subcommand

COMMANDS = {
    "plan": ("engine.bench.plan", "print a model's timeline, shape signatures and bytes per region vs stock"),
    "session": ("engine.bench.session", "duplex session: per-second totals and misses, stock vs optimized"),
    "capacity": ("engine.bench.capacity", "sessions one device keeps on time, per mode (engine host)"),
    "serve-capacity": ("engine.bench.serve_capacity", "sessions a Ray Serve deployment keeps on time, per replica count"),
    "echo": ("engine.bench.echo", "the loop without headphones: echo cancellation and barge-in, on vs off "
                                  "(--minutes N: a whole conversation on drifting devices)"),
    "drift": ("engine.bench.drift", "speaker and microphone clocks off nominal: dropped speech, mic->speaker delay"),
    "twin": ("engine.bench.twin", "the scheduler on a simulated clock: sessions a device would keep, from a cost table"),
}


def commands():
    """The fixed commands plus each registered decoder's own benchmark (``ModelEntry.bench``)."""
    from engine.models import registry
    return {**COMMANDS, **registry.benchmarks()}


def usage() -> str:
    rows = "\n".join(f"  {name:<15} {doc}" for name, (_, doc) in commands().items())
    return f"usage: duplexcadence-bench COMMAND [options]\n\ncommands:\n{rows}\n\n'duplexcadence-bench COMMAND --help' for options."


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    table = commands()
    if cmd not in table:
        print(f"duplexcadence-bench: unknown command {cmd!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return run_subcommand(f"duplexcadence-bench {cmd}", table[cmd][0], rest)


if __name__ == "__main__":
    sys.exit(main())
