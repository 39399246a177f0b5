"""ALSA's error lines go to the app's event log, counted, instead of the terminal.

ALSA's library prints what it recovers from straight to stderr ("ALSA lib pcm.c:8545:(snd_pcm_recover) underrun
occurred"): a ten-minute session on a busy machine printed 670 such lines. :func:`install` gives libasound an
error handler (``snd_lib_error_set_handler``) that only counts each kind of line (the audio thread that calls it
never blocks: a counter under a lock); the session controller drains the counts once a second into its event
log (app/session_audio.py). Without libasound (no ALSA, another platform) nothing changes.
"""
from __future__ import annotations

import collections
import ctypes
import ctypes.util
import re
import threading
from typing import Counter, List, Optional, Tuple

#: void handler(const char *file, int line, const char *function, int err, const char *fmt, ...): the fixed
#: arguments only (the format's own arguments are not read)
HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p)
#: what a person reads for the lines that matter
READABLE = {"snd_pcm_recover": "underrun or overrun (ALSA restarted the stream)"}


def describe(function: str, fmt: str) -> str:
    """One kind of ALSA line in words: the known ones by name, the others as their format without its fields."""
    return READABLE.get(function) or f"{function}: {re.sub(r'%[-+ #0-9.]*[a-zA-Z]+', '…', fmt).strip()}"


class AlsaLog:
    """The counts of ALSA's error lines since the last :meth:`drain`, and in all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._new: Counter[str] = collections.Counter()
        self.total = 0
        self._handler = HANDLER(self._on_error)      # kept alive as long as libasound may call it
        self._lib = None

    def _on_error(self, file, line, function, err, fmt) -> None:
        text = describe((function or b"?").decode(errors="replace"), (fmt or b"").decode(errors="replace"))
        with self._lock:
            self._new[text] += 1
            self.total += 1

    def install(self, lib=None) -> bool:
        """Hand libasound the counting handler (``lib``: the library, else the system's); False without ALSA."""
        lib = lib if lib is not None else _libasound()
        if lib is None:
            return False
        lib.snd_lib_error_set_handler(self._handler)
        self._lib = lib
        return True

    def uninstall(self) -> None:
        """ALSA's own handler again (it prints to stderr)."""
        if self._lib is not None:
            self._lib.snd_lib_error_set_handler(None)
            self._lib = None

    def drain(self) -> List[Tuple[str, int]]:
        """(kind of line, how many) since the last drain."""
        with self._lock:
            new, self._new = self._new, collections.Counter()
        return sorted(new.items())


def _libasound():
    name = ctypes.util.find_library("asound")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name)
        lib.snd_lib_error_set_handler.argtypes = [ctypes.c_void_p]
        lib.snd_lib_error_set_handler.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


#: the process's one ALSA log (the app installs it at start)
ALSA = AlsaLog()


def install() -> bool:
    return ALSA.install()


def drained_lines() -> List[str]:
    """The event-log lines for what ALSA reported since the last call, one per kind of line."""
    return [f"ALSA: {text} ×{n} ({ALSA.total} in all)" for text, n in ALSA.drain()]


def probe(device: bytes = b"duplexcadence-no-such-device") -> Optional[int]:
    """Open a PCM that does not exist (ALSA reports it through its error handler); the error code, or None
    without ALSA. For tests."""
    lib = _libasound()
    if lib is None:
        return None
    pcm = ctypes.c_void_p()
    return lib.snd_pcm_open(ctypes.byref(pcm), device, 0, 0)
