"""Headless command-line entry points (no Qt): ``duplexcadence synth|run`` and ``duplexcadence-bench``."""
from __future__ import annotations

import importlib
import signal
import sys


def run_subcommand(prog: str, modname: str, argv) -> int:
    """Import ``modname`` only now (keeps startup light) and run its ``main(argv)``.

    Ctrl-C before the command takes signals over is one line and exit 130, never a traceback: while the
    module imports (torch, NumPy and the models: the first second or two) SIGINT is only noted, so no
    import is broken off half-way (NumPy would report a KeyboardInterrupt inside its C extension as a
    broken install), and the command then stops before it starts; a KeyboardInterrupt later is the same line."""
    noted = []
    old = _note_sigint(noted)
    try:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name != modname:                      # a real missing dependency inside it: let it show
                raise
            print(f"{prog}: not built in this version", file=sys.stderr)
            return 2
    finally:
        _restore(old)
    try:
        if noted:
            raise KeyboardInterrupt
        return int(mod.main(list(argv)) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def _note_sigint(noted: list):
    """SIGINT appends to ``noted`` instead of raising (None where no handler can be set: not the main thread)."""
    try:
        return signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    except (ValueError, OSError):
        return None


def _restore(old) -> None:
    if old is not None:
        try:
            signal.signal(signal.SIGINT, old)
        except (ValueError, OSError):
            pass
