"""Headless command-line entry points (no Qt): ``duplexcadence synth|run`` and ``duplexcadence-bench``."""
from __future__ import annotations

import importlib
import sys


def run_subcommand(prog: str, modname: str, argv) -> int:
    """Import ``modname`` only now (keeps startup light) and run its ``main(argv)``."""
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if e.name != modname:                      # a real missing dependency inside it: let it show
            raise
        print(f"{prog}: not built in this version", file=sys.stderr)
        return 2
    return int(mod.main(list(argv)) or 0)
