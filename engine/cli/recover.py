"""`duplexcadence recover`: finish the journal a failed or killed `duplexcadence run` left behind.

  duplexcadence recover JOURNAL [--log DIR] [--output OUT.wav]

JOURNAL is the ``DIR.partial-xxxx`` folder a run writes beside its ``--log`` folder (the run's error
line names it), or a folder holding such journals when exactly one is unfinished. Every second whose
record and audio are whole is kept; the WAVs are cut to them and the CSV and trace are written
(engine/session/journal.py, the same recovery the app offers at start-up). ``--log`` then moves the
recovered files into place and ``--output`` writes the session's output WAV, as the run would have.
Nothing is written when a check fails; the journal stays as it was.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Optional

from engine.atomic import atomic_write
from engine.cli.validate import OneLineParser, fail, output_file, output_folder
from engine.session.export import ExportError
from engine.session.journal import OUTPUT_WAV, RECORDS, SESSION_FILES, publish, read_marker, read_records, \
    recover, unfinished_journals

PROG = "duplexcadence recover"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("journal", help="the unfinished journal folder (DIR.partial-xxxx) or a folder holding one")
    p.add_argument("--log", help="move the recovered files to this folder (as `run --log` would have)")
    p.add_argument("--output", help="write the session's output WAV here (as `run --output` would have)")
    return p


def find_journal(path) -> Path:
    """The unfinished journal ``path`` names (itself, or the one unfinished journal inside it)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ValueError(f"{p} is not a folder; give the DIR.partial-xxxx folder the run named")
    if read_marker(p) is not None:
        return p
    found = unfinished_journals(p)
    if len(found) == 1:
        return found[0].directory
    if not found:
        raise ValueError(f"{p} is not an unfinished session journal and holds none (a finished session "
                         f"needs no recovery)")
    raise ValueError(f"{p} holds {len(found)} unfinished journals; name one: "
                     + ", ".join(j.directory.name for j in found[:4]))


def _copy_wav(src: Path, dest: Path) -> Path:
    def write(f) -> None:
        with open(src, "rb") as g:
            shutil.copyfileobj(g, f, 1 << 20)
    return atomic_write(dest, write, ExportError)


def main(argv: Optional[list] = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        journal = find_journal(a.journal)
        if a.log:
            output_folder(a.log, "--log", inputs=[str(journal / n) for n in SESSION_FILES], names=SESSION_FILES)
        if a.output:
            output_file(a.output, "--output", inputs=[str(journal / OUTPUT_WAV)], suffixes=(".wav",))
    except ValueError as e:
        return fail(PROG, str(e))
    try:
        files = recover(journal)
        seconds = len(read_records(journal / RECORDS))
        where = journal
        if a.log:
            where = publish(journal, Path(a.log).expanduser())
        wrote = [f"{where}/ ({', '.join(sorted(p.name for p in files.values()))})"]
        if a.output:
            wrote.append(str(_copy_wav(where / OUTPUT_WAV, Path(a.output))))
    except (ExportError, OSError) as e:
        return fail(PROG, str(e) if isinstance(e, ExportError) else f"{e.strerror or e} ({journal})", 1)
    print(f"recovered {seconds} s: wrote " + " and ".join(wrote))
    return 0


if __name__ == "__main__":
    sys.exit(main())
