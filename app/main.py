"""`duplexcadence`: the desktop live-conversation app, plus headless subcommands.

  duplexcadence                      open the app (embedded default model)
  duplexcadence --input-file IN.wav  scripted session (see --help)
  duplexcadence synth ...            decode tokens with an engine decoder tail (no GUI)
  duplexcadence run ...              headless duplex session over a wav file (no GUI)
  duplexcadence serve ...            host sessions on Ray Serve for remote clients (extra: serve)
  duplexcadence recover JOURNAL      finish the journal a failed or killed `run` left (no GUI)
"""
from __future__ import annotations

import sys

SUBCOMMANDS = {
    "synth": "engine.cli.synth",
    "run": "engine.cli.run",
    "serve": "engine.cli.serve",
    "recover": "engine.cli.recover",
}
#: what each subcommand does, one line (``duplexcadence --help`` lists them)
SUBCOMMAND_HELP = {
    "synth": "decode tokens with an engine decoder tail (no GUI)",
    "run": "headless duplex session over a WAV file (no GUI)",
    "serve": "host sessions on Ray Serve for remote clients (extra: serve)",
    "recover": "finish the journal a failed or killed `run` left (no GUI)",
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        from engine.cli import run_subcommand
        return run_subcommand(f"duplexcadence {argv[0]}", SUBCOMMANDS[argv[0]], argv[1:])
    from app.gui_main import main as gui_main   # Qt is imported only here
    return int(gui_main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
