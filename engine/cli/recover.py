"""`duplexcadence recover`: recover the journal a failed or killed `duplexcadence run` left behind.

  duplexcadence recover JOURNAL [--log DIR] [--output OUT.wav]

JOURNAL is the ``DIR.partial-xxxx`` folder a run writes beside its ``--log`` folder (the run's error
line names it), or a folder holding such journals when exactly one is unfinished. The journal is only
read: every second whose record survived keeps it, every second whose audio survived keeps its audio
(a torn or corrupt line costs that line alone; a lost WAV costs its audio, silence in its place), and
the recovered session (CSV, JSON Lines, trace, WAVs) is built in a new folder: ``--log`` (any file
system: it is copied, never moved across), else ``NAME.recovered`` beside the journal. It is read back
and checked before it is moved into place; only then is the journal marked recovered (it is kept;
delete it once the recovered session is where you want it). ``--output`` writes the session's output
WAV, as the run would have. When anything fails, the journal stays exactly as it was.
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
from engine.session.journal import OUTPUT_WAV, SESSION_FILES, read_marker, unfinished_journals
from engine.session.recovery import RECOVERED, mark_recovered, recover_journal, recovered_into

PROG = "duplexcadence recover"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("journal", help="the unfinished journal folder (DIR.partial-xxxx) or a folder holding one")
    p.add_argument("--log", help="the folder to recover into (default: NAME.recovered beside the journal)")
    p.add_argument("--output", help="write the session's output WAV here (as `run --output` would have)")
    return p


def find_journal(path) -> Path:
    """The unfinished journal ``path`` names (itself, or the one unfinished journal inside it)."""
    p = Path(path).expanduser()
    if not str(path).strip():
        raise ValueError("the journal folder is empty text; give the DIR.partial-xxxx folder the run named")
    if not p.is_dir():
        raise ValueError(f"{p} is not a folder; give the DIR.partial-xxxx folder the run named")
    if read_marker(p) is not None:
        return p
    into = recovered_into(p)
    if into is not None:
        raise ValueError(f"{p} was recovered already{' into ' + into if into else ''}; to recover it again, "
                         f"rename its {RECOVERED} to session.unfinished")
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


def _check(a: argparse.Namespace) -> Path:
    journal = find_journal(a.journal)
    inputs = [str(journal / n) for n in SESSION_FILES]
    if a.log is not None:
        if not a.log.strip():
            raise ValueError("--log is empty; name the folder to recover into")
        output_folder(a.log, "--log", inputs=inputs, names=SESSION_FILES)
    if a.output is not None:
        if not a.output.strip():
            raise ValueError("--output is empty; name the WAV file to write")
        output_file(a.output, "--output", inputs=inputs, suffixes=(".wav",))
    return journal


def main(argv: Optional[list] = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        journal = _check(a)
    except ValueError as e:
        return fail(PROG, str(e))
    try:
        done = recover_journal(journal, a.log, mark=False)
    except ExportError as e:
        return fail(PROG, str(e), 1)
    wrote = [f"{done.folder}/ ({', '.join(sorted(p.name for p in done.files.values()))})"]
    if a.output:
        try:
            wrote.append(str(_copy_wav(done.folder / OUTPUT_WAV, Path(a.output).expanduser())))
        except ExportError as e:
            return fail(PROG, f"{done.describe()} into {done.folder}, but {e}; the journal {journal} stays "
                              f"unfinished", 1)
    done.unmarked = mark_recovered(journal, done.folder)
    kept = (f"the journal {journal} is kept, marked recovered (delete it when done)" if not done.unmarked
            else f"the journal {journal} could not be marked recovered ({done.unmarked}) and stays unfinished")
    print(f"{done.describe()}: wrote {' and '.join(wrote)}; {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
