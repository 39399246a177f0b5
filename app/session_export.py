"""What a session leaves (a mixin of :class:`app.controller.SessionController`): its journal finished, the
heard and said audio, the model's speech as a WAV, the exports (CSV, JSON Lines, Perfetto trace, WAVs,
transcript: all or none) and the discard of a stopped session.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Dict, List

import numpy as np

from app.audio_io import ENGINE_RATE
from app.states import IDLE
from app.transcript import TRANSCRIPT, transcript_text
from engine.atomic import atomic_write
from engine.session import ExportError
from engine.session.export import audio_path_summary, to_csv, to_trace
from engine.session.journal import (CSV, INPUT_WAV, OUTPUT_WAV, RECORDS, SESSION_FILES, SUMMARY, TRACE,
                                    export_folder)
from engine.wavio import WavError, read_wav, write_wav


def _rows_of(path: Path) -> List[dict]:
    """The records of a JSON Lines file as dicts (the transcript of a finished journal)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class SessionExport:
    """The session's journal and exports."""

    def _finish_journal(self) -> None:
        if self.journal is None or self.journal.finished:
            return
        try:
            self.journal.finish(summary=audio_path_summary(self.journal.records), metadata=dict(self.session_info))
        except ExportError as e:
            self.failure = self.failure or str(e)
            self.message.emit("error", str(e))

    def input_audio(self) -> np.ndarray:
        """What the engine heard, second by second (24 kHz, 16-bit precision): the processed seconds."""
        return self._journal_wav(INPUT_WAV)

    def output_audio(self) -> np.ndarray:
        """The speech the model produced, second by second (24 kHz, 16-bit precision)."""
        return self._journal_wav(OUTPUT_WAV)

    def _journal_wav(self, name: str) -> np.ndarray:
        if self.journal is None or not (self.journal.directory / name).is_file():
            return np.zeros(0, dtype=np.float32)
        return read_wav(self.journal.directory / name)[0]

    def save_output(self, path) -> Path:
        """The model's speech as a WAV file, atomically (raises WavError naming the path on failure)."""
        if self.journal is None:
            return write_wav(path, np.zeros(0, dtype=np.float32), ENGINE_RATE)
        src = self.journal.directory / OUTPUT_WAV

        def write(f) -> None:
            with open(src, "rb") as g:
                shutil.copyfileobj(g, f, 1 << 20)
        return atomic_write(path, write, WavError)

    def export(self, directory) -> Dict[str, Path]:
        """Timing logs (CSV, JSON Lines, Chrome trace) and input/output WAVs into ``directory``: all
        of them or, on a failure, none (the folder is filled beside it, then renamed into place).
        Works during a session too (everything up to the last second). Raises ExportError with one
        message naming the path."""
        j = self.journal
        if j is None:
            raise ExportError(f"cannot export to {directory}: no session yet")
        records, meta = list(j.records), dict(self.session_info)
        rows = [r.to_dict() for r in records] if not j.finished else None

        def fill(tmp: Path) -> None:
            if j.finished:
                for name in SESSION_FILES:
                    if (j.directory / name).is_file():
                        shutil.copyfile(j.directory / name, tmp / name)
            else:
                for name in (RECORDS, INPUT_WAV, OUTPUT_WAV):
                    shutil.copyfile(j.directory / name, tmp / name)
                (tmp / CSV).write_text(to_csv(records), encoding="utf-8")
                (tmp / TRACE).write_text(to_trace(records, meta), encoding="utf-8")
                (tmp / SUMMARY).write_text(json.dumps(audio_path_summary(records), indent=2) + "\n",
                                           encoding="utf-8")
            lines = rows if rows is not None else _rows_of(tmp / RECORDS)
            (tmp / TRANSCRIPT).write_text(transcript_text(lines), encoding="utf-8")
        paths = export_folder(directory, fill)
        paths["transcript"] = Path(directory).expanduser() / TRANSCRIPT
        self.event.emit("export", f"wrote {len(paths)} files to {directory}")
        return paths

    def discard(self) -> None:
        """Delete the last session's journal (after it stopped)."""
        if self.journal is not None and self.state == IDLE:
            self.journal.discard()
            self.journal = None
