"""Recovery never destroys: a thousand broken journals (truncated, NUL-filled, bit-flipped, partly deleted, a WAV
cut short or gone) recovered into targets that may be full, read-only or on another file system. Every second
whose line and audio survived comes back as it was, nothing untrusted comes back, and the journal is byte for
byte what it was unless the recovery succeeded (then only its marker changed)."""
from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Dict, List, Optional
from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from engine.session import ExportError, SecondRecord
from engine.session.journal import INPUT_WAV, MARKER, OUTPUT_WAV, RECORDS, SessionJournal, read_records
from engine.session.journal_lines import MAX_LINE, parse, read_lines, seal
from engine.session.recovery import RECOVERED, recover_journal

RATE = 100                     # a small journal rate keeps a thousand journals cheap; the layout is the same
SECONDS = 8
HEAD = 44


def record(k: int) -> SecondRecord:
    return SecondRecord(index=k, wall_start=1000.0 + k, listen_ms=1.0, think_ms=2.0, speak_ms=3.0, total_ms=6.5,
                        deadline_ms=1000.0, late_ms=0.0, missed=False, queue_wait_ms=0.0, decision="speak",
                        tokens=k, state_bytes=10, alloc_bytes=0, reserved_bytes=0, peak_bytes=0,
                        demand_sized=True, graph_replay=False, tail="mimi", backbone="synthetic",
                        input_rms=0.1, output_rms=0.2, text=f"second {k} {{brace}} [bracket]")


def make_journal(folder: Path, seconds: int = SECONDS, rate: int = RATE) -> Path:
    j = SessionJournal.create(folder, metadata={"config": {"tail": "mimi"}}, rate=rate)
    rng = np.random.default_rng(3)
    for k in range(seconds):
        j.append(record(k), rng.uniform(-0.5, 0.5, rate).astype(np.float32),
                 rng.uniform(-0.5, 0.5, rate).astype(np.float32))
    j.close()                                        # no finish: the process died here
    return folder


def snapshot(folder: Path) -> Dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


_PRISTINE: Dict[str, bytes] = {}


def pristine() -> Dict[str, bytes]:
    """The files of one sound journal of :data:`SECONDS` seconds (made once)."""
    if not _PRISTINE:
        with tempfile.TemporaryDirectory() as tmp:
            _PRISTINE.update(snapshot(make_journal(Path(tmp) / "j")))
    return _PRISTINE


# -- the faults of a target ---------------------------------------------------------------------------

def _under(path, root: Path) -> bool:
    try:
        return os.path.commonpath([os.path.abspath(path), str(root)]) == str(root)
    except (TypeError, ValueError):
        return False


class _Full:
    """A file on a disk that fills up: writes raise ENOSPC once ``budget`` bytes were written there."""

    def __init__(self, f, room: dict):
        self._f, self._room = f, room

    def write(self, data):
        self._room["left"] -= len(data)
        if self._room["left"] < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


@contextmanager
def target_fault(kind: str, journals: Path, targets: Path, budget: int = 0):
    """``kind``: "none"; "full" (writes under ``targets`` fail with ENOSPC after ``budget`` bytes); "read-only"
    (nothing can be created under ``targets``: EROFS); "other-fs" (``targets`` is another file system: a rename
    or link between it and ``journals`` fails with EXDEV). Root ignores permission bits, so faults are made."""
    real_open, real_mkdir, real_rename, real_replace, real_link = (builtins.open, os.mkdir, os.rename, os.replace,
                                                                    os.link)
    room = {"left": budget}

    def fs(path) -> str:
        return "targets" if _under(path, targets) else "journals" if _under(path, journals) else "other"

    def crossing(fn):
        def call(src, dst, *a, **kw):
            if fs(src) != fs(dst):
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(src), None, str(dst))
            return fn(src, dst, *a, **kw)
        return call

    def read_only(fn):
        def call(path, *a, **kw):
            if _under(path, targets):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return fn(path, *a, **kw)
        return call

    def full_open(file, mode="r", *a, **kw):
        f = real_open(file, mode, *a, **kw)
        if isinstance(file, (str, Path)) and _under(file, targets) and any(c in mode for c in "wxa+"):
            return _Full(f, room)
        return f

    with ExitStack() as stack:
        if kind == "other-fs":
            for name, fn in (("rename", real_rename), ("replace", real_replace), ("link", real_link)):
                stack.enter_context(mock.patch.object(os, name, crossing(fn)))
        elif kind == "read-only":
            stack.enter_context(mock.patch.object(os, "mkdir", read_only(real_mkdir)))
        elif kind == "full":
            stack.enter_context(mock.patch.object(builtins, "open", full_open))
        yield


# -- what survived --------------------------------------------------------------------------------------

def original_lines(pristine: Dict[str, bytes]) -> List[bytes]:
    lines = pristine[RECORDS].split(b"\n")
    assert lines[-1] == b"" and len(lines) == SECONDS + 1
    return lines[:-1]


def surviving_lines(mutated: bytes, originals: List[bytes]) -> Dict[int, bytes]:
    """Second -> its line, for the lines whose bytes are all still there, between separators."""
    pieces = set(mutated.replace(b"\0", b"\n").split(b"\n"))
    return {k: line for k, line in enumerate(originals) if line in pieces}


def second_bytes(wav: Optional[bytes], k: int) -> Optional[bytes]:
    if wav is None or len(wav) < HEAD + 2 * RATE * (k + 1):
        return None
    return wav[HEAD + 2 * RATE * k: HEAD + 2 * RATE * (k + 1)]


# -- the property ---------------------------------------------------------------------------------------

_OP = st.tuples(st.sampled_from(["truncate", "nul", "flip", "delete"]), st.floats(0, 1), st.integers(1, 400),
                st.integers(0, 7))
_WAV = st.one_of(st.just(None), st.just("missing"), st.floats(0, 1))
_FAULT = st.sampled_from(["none", "none", "full", "read-only", "other-fs"])


def mutate(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for kind, where, length, bit in ops:
        if not b:
            break
        at = min(int(where * len(b)), len(b) - 1)
        if kind == "truncate":
            del b[at:]
        elif kind == "nul":
            b[at:at + length] = bytes(len(b[at:at + length]))
        elif kind == "flip":
            b[at] ^= 1 << bit
        else:
            del b[at:at + length]
    return bytes(b)


@settings(max_examples=1000, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(ops=st.lists(_OP, min_size=0, max_size=4), wavs=st.tuples(_WAV, _WAV), fault=_FAULT,
       budget=st.integers(0, 4000))
def test_recovery_keeps_every_surviving_second_and_never_changes_a_journal_it_failed_on(ops, wavs, fault, budget):
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp, \
            mock.patch.object(os, "fsync", lambda fd: None):      # durability is not what is checked here
        journals, targets = Path(tmp) / "journals", Path(tmp) / "targets"
        j = journals / "run.partial-0000"
        j.mkdir(parents=True)
        targets.mkdir()
        files = dict(pristine())
        files[RECORDS] = mutate(files[RECORDS], ops)
        for name, how in zip((INPUT_WAV, OUTPUT_WAV), wavs):
            if how == "missing":
                del files[name]
            elif how is not None:
                files[name] = files[name][:int(how * len(files[name]))]
        for name, data in files.items():
            (j / name).write_bytes(data)
        dest = targets / "recovered"
        try:
            with target_fault(fault, journals, targets, budget):
                done = recover_journal(j, dest)
        except ExportError as e:
            assert fault in ("full", "read-only"), e
            assert "\n" not in str(e) and "the journal is unchanged" in str(e)
            assert snapshot(j) == files                                   # byte for byte
            assert list(targets.iterdir()) == []                          # nothing half-made is left
            return
        assert fault != "read-only"
        after = snapshot(j)
        assert MARKER not in after and RECOVERED in after
        assert {n: d for n, d in after.items() if n != RECOVERED} == {n: d for n, d in files.items() if n != MARKER}
        _check_recovered(dest, done, pristine(), files)


def _check_recovered(dest: Path, done, pristine: Dict[str, bytes], files: Dict[str, bytes]) -> None:
    originals = original_lines(pristine)
    alive = surviving_lines(files[RECORDS], originals)
    kept = (dest / RECORDS).read_bytes().split(b"\n")[:-1]
    assert set(alive.values()) <= set(kept) <= set(originals)          # every survivor, nothing untrusted
    assert [r.index for r in read_records(dest / RECORDS)] == sorted(originals.index(x) for x in kept)
    assert done.records == len(kept)
    seconds = done.seconds
    for name in (INPUT_WAV, OUTPUT_WAV):
        wav = (dest / name).read_bytes()
        assert len(wav) == HEAD + 2 * RATE * seconds
        for k in range(seconds):
            want = second_bytes(files.get(name), k)
            got = wav[HEAD + 2 * RATE * k: HEAD + 2 * RATE * (k + 1)]
            assert got == (want if want is not None else bytes(2 * RATE)), (name, k)
    whole = [len(files[n]) - HEAD >= 2 * RATE * (k + 1) for n in (INPUT_WAV, OUTPUT_WAV) if n in files
             for k in range(SECONDS)]
    assert all(k < seconds for k in alive) and (not any(whole) or seconds >= 1)
    assert len((dest / "session.csv").read_text().splitlines()) == len(kept) + 1
    assert json.loads((dest / "session.trace.json").read_text())["otherData"]["recovered"]["records"] == len(kept)


# -- the cases the property covers, each on its own ----------------------------------------------------------

def test_a_missing_output_wav_costs_its_audio_never_the_records(tmp_path):
    j = make_journal(tmp_path / "j", seconds=18, rate=24000)
    (j / OUTPUT_WAV).unlink()
    before = snapshot(j)
    done = recover_journal(j, tmp_path / "out")
    assert done.records == 18 and done.seconds == 18 and done.silent == {"output": 18}
    assert "the output audio was missing: 18 s of silence" in done.describe()
    assert len(read_records(tmp_path / "out" / RECORDS)) == 18
    assert (tmp_path / "out" / INPUT_WAV).read_bytes() == before[INPUT_WAV]                 # every sample kept
    assert (tmp_path / "out" / OUTPUT_WAV).stat().st_size == HEAD + 2 * 24000 * 18
    assert {n: d for n, d in snapshot(j).items() if n != RECOVERED} == {n: d for n, d in before.items()
                                                                         if n != MARKER}


def test_a_nul_filled_line_costs_that_line_only(tmp_path):
    j = make_journal(tmp_path / "j", seconds=16)
    lines = (j / RECORDS).read_bytes().split(b"\n")
    lines[2] = bytes(len(lines[2]))                                     # what a crash leaves where a line was
    (j / RECORDS).write_bytes(b"\n".join(lines))
    done = recover_journal(j, tmp_path / "out")
    assert [r.index for r in read_records(tmp_path / "out" / RECORDS)] == [0, 1] + list(range(3, 16))
    assert done.records == 15 and done.seconds == 16 and done.refused == 0


def test_a_deeply_nested_line_is_refused_without_recursion(tmp_path):
    j = make_journal(tmp_path / "j", seconds=4)
    lines = (j / RECORDS).read_text().split("\n")
    lines.insert(1, '{"a":' * 100_000 + "1" + "}" * 100_000)
    lines.insert(2, "[" * (MAX_LINE + 10))
    (j / RECORDS).write_text("\n".join(lines))
    done = recover_journal(j, tmp_path / "out")
    assert done.records == 4 and done.refused == 2
    assert parse('{"index": [[[[1]]]]}') is None and parse("{" * 50_000) is None


def test_a_journal_written_before_lines_were_sealed_is_read_by_index(tmp_path):
    j = make_journal(tmp_path / "j", seconds=5)
    plain = [json.dumps(record(k).to_dict()) for k in (0, 1, 3, 2, 4)]    # a line out of order is not trusted
    (j / RECORDS).write_text("\n".join(plain) + "\n" + '{"index": 9, "wall_st')
    assert [x.at for x in read_lines(j / RECORDS)] == [0, 1, 3, 4]
    assert recover_journal(j, tmp_path / "sealed").records == 0     # its marker says its lines were sealed
    marker = json.loads((j / "session.recovered").read_text())
    (j / "session.recovered").unlink()
    (j / MARKER).write_text(json.dumps({k: v for k, v in marker.items() if k not in ("lines", "recovered_into")}))
    done = recover_journal(j, tmp_path / "out")                      # a journal from before the seal
    assert done.records == 4 and done.seconds == 5


def test_a_sealed_line_names_its_own_place_and_a_flipped_one_is_refused():
    line = seal(record(7), 3)
    assert parse(line).at == 3 and parse(line).record == record(7) and parse(line).sealed
    flipped = line.replace('"tokens": 7', '"tokens": 6')
    assert json.loads(flipped)["tokens"] == 6 and parse(flipped) is None          # valid JSON, wrong CRC


def test_recover_into_another_file_system_copies_and_the_suggested_command_still_works(tmp_path, capsys):
    from engine.cli import recover as R
    journals, other = tmp_path / "disk-a", tmp_path / "disk-b"
    j = make_journal(journals / "log.partial-1234", seconds=3, rate=24000)
    other.mkdir()
    before = snapshot(j)
    with target_fault("full", journals, other, budget=50_000):            # the other disk fills up as well
        assert R.main([str(j), "--log", str(other / "log"), "--output", str(other / "out.wav")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "the journal is unchanged" in err[0]
    assert snapshot(j) == before and list(other.iterdir()) == []
    with target_fault("other-fs", journals, other):
        assert R.main([str(j), "--log", str(other / "log"), "--output", str(other / "out.wav")]) == 0
    said = capsys.readouterr().out
    assert said.startswith("recovered 3 s (3 records): wrote") and "marked recovered" in said
    assert len(read_records(other / "log" / RECORDS)) == 3 and (other / "out.wav").stat().st_size == HEAD + 6 * 24000
    assert (j / INPUT_WAV).read_bytes() == before[INPUT_WAV]
    assert R.main([str(j)]) == 2
    assert "was recovered already into" in capsys.readouterr().err


def test_recover_refuses_what_it_cannot_use_in_one_line(tmp_path, capsys):
    from engine.cli import recover as R
    j = make_journal(tmp_path / "log.partial-1", seconds=2)
    for argv, words in (([str(j), "--log", ""], "--log is empty"), ([str(j), "--output", ""], "--output is empty"),
                        ([str(j), "--log", str(j / "inner")], "inside the journal"), ([""], "empty text")):
        rc = R.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc in (1, 2) and len(err) == 1 and words in err[0], (argv, err)
    assert not (j / "inner").exists() and (j / MARKER).is_file()
    assert R.main([str(j)]) == 0                                            # the default: NAME.recovered beside
    assert (tmp_path / "log.recovered" / RECORDS).is_file()
    shutil.rmtree(tmp_path / "log.recovered")


def test_files_that_are_not_regular_are_never_opened(tmp_path):
    """A FIFO where the records were and a link to /dev/zero where a WAV was: nothing blocks or reads forever;
    they count as lost and the rest is recovered."""
    j = make_journal(tmp_path / "j", seconds=3)
    marker = json.loads((j / MARKER).read_text())
    (j / MARKER).write_text(json.dumps({k: v for k, v in marker.items() if k != "rate"}))   # the rate from a WAV
    (j / RECORDS).unlink()
    os.mkfifo(j / RECORDS)
    (j / INPUT_WAV).rename(j / "kept.wav")
    os.mkfifo(j / INPUT_WAV)
    (j / OUTPUT_WAV).unlink()
    (j / OUTPUT_WAV).symlink_to("/dev/zero")
    done = recover_journal(j, tmp_path / "out", rate=RATE)
    assert done.records == 0 and done.seconds == 0 and done.silent == {}
    (j / INPUT_WAV).unlink()
    (j / "kept.wav").rename(j / INPUT_WAV)
    (j / "session.recovered").rename(j / MARKER)
    done = recover_journal(j, tmp_path / "out2")                      # the rate read from the input WAV's header
    assert done.records == 0 and done.seconds == 3 and done.silent == {"output": 3}
    assert (tmp_path / "out2" / OUTPUT_WAV).stat().st_size == HEAD + 2 * RATE * 3
