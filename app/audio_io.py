"""Audio in and out: bounded ring buffers, streaming resamplers, device and file streams.

The rule every class here follows (cf. Friture): an audio callback only copies samples into or out
of a bounded :class:`RingBuffer` (and plays zeros when there is nothing queued). Resampling, gating
and framing happen on the frame-pump worker thread (``app/pump.py``), never in a callback.

Sources fill ``ring`` at their native ``rate``: :class:`DeviceInput` (PortAudio via sounddevice),
:class:`FileInput` (a WAV file played as the microphone at real-time pace, then silence) and
:class:`SilentInput` (what a session falls back to when a device disappears). Sinks drain their queue:
:class:`DeviceOutput`. :class:`Playback` (engine/echo/playout.py, as are :class:`Primed` and the
:class:`RingBuffer`) resamples the model's 24 kHz audio into a sink.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import soxr

from engine.echo import PlaybackQueue
from engine.echo.playout import ENGINE_RATE, Playback, Primed  # noqa: F401  (the app's names for them)
from engine.echo.queues import SILENCE_DB, RingBuffer, block_db  # noqa: F401
from engine.wavio import WavError, open_audio
class AudioUnavailable(RuntimeError):
    """No usable audio device or PortAudio; the message says what and that file input still works."""


class StreamResampler:
    """Mono streaming resampler (python-soxr ``ResampleStream``); identity when the rates match."""

    def __init__(self, in_rate: float, out_rate: float):
        self.in_rate, self.out_rate = float(in_rate), float(out_rate)
        self._rs = None
        if self.in_rate != self.out_rate:
            self._rs = soxr.ResampleStream(self.in_rate, self.out_rate, 1, dtype="float32", quality="HQ")

    def process(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        return x.copy() if self._rs is None else self._rs.resample_chunk(x)

    def flush(self) -> np.ndarray:
        """The samples still inside the filter (end of stream)."""
        if self._rs is None:
            return np.zeros(0, dtype=np.float32)
        return self._rs.resample_chunk(np.zeros(0, dtype=np.float32), last=True)

    def reset(self) -> None:
        if self._rs is not None:
            self._rs.clear()


class FrameAssembler:
    """Cuts a stream of samples into frames of exactly ``frame`` samples."""

    def __init__(self, frame: int = ENGINE_RATE):
        self.frame = int(frame)
        self._parts: List[np.ndarray] = []
        self._n = 0

    @property
    def pending(self) -> int:
        return self._n

    def push(self, x: np.ndarray) -> List[np.ndarray]:
        """Add samples; return the frames completed by them (possibly none)."""
        if len(x):
            self._parts.append(np.asarray(x, dtype=np.float32).reshape(-1))
            self._n += len(x)
        frames = []
        while self._n >= self.frame:
            buf = np.concatenate(self._parts)
            frames.append(buf[:self.frame].copy())
            rest = buf[self.frame:]
            self._parts, self._n = ([rest] if len(rest) else []), len(rest)
        return frames


# ----------------------------------------------------------------------------- devices

@dataclass(frozen=True)
class DeviceInfo:
    """One PortAudio device as the pickers show it."""
    index: int
    name: str
    hostapi: str
    inputs: int
    outputs: int
    rate: int            # the device's native (default) sample rate

    @property
    def label(self) -> str:
        friendly = READABLE.get(self.name.lower())
        name = f"{friendly} ({self.name})" if friendly else self.name
        return f"{name} ({self.hostapi}, {self.rate / 1000:g} kHz)"


#: ALSA's plugin devices that route through the sound server, named for people
READABLE = {"pulse": "PulseAudio / PipeWire", "pipewire": "PipeWire", "default": "System default",
            "sysdefault": "ALSA system default", "jack": "JACK"}


CLOSE_WAIT_S = 5.0          # how long stopping a device waits for PortAudio's close
#: an open stream whose callbacks stop for this long is taken as gone: a sound server that died can leave
#: PortAudio's stream "active" with nothing moving through it
STALL_S = 3.0


def _stuck_close(message: str) -> None:
    """A stream that would not close: say so, and keep PortAudio's exit handler (``Pa_Terminate``, which closes
    every open stream) from waiting on it again when the process ends."""
    import atexit
    import sys
    print(message, file=sys.stderr, flush=True)
    handler = getattr(sys.modules.get("sounddevice"), "_exit_handler", None)
    if handler is not None:
        atexit.unregister(handler)


def sounddevice_module():
    """Import sounddevice, turning a missing PortAudio into one clear AudioUnavailable."""
    try:
        import sounddevice
    except OSError as e:
        raise AudioUnavailable(f"PortAudio is not available ({e}); install libportaudio2. "
                               "File input keeps working.") from None
    return sounddevice


def list_devices() -> Tuple[List[DeviceInfo], List[DeviceInfo]]:
    """(input devices, output devices). Raises AudioUnavailable when PortAudio is missing."""
    sd = sounddevice_module()
    try:
        apis = [a["name"] for a in sd.query_hostapis()]
        devs = list(sd.query_devices())
    except Exception as e:     # PortAudioError and friends: say it once, clearly
        raise AudioUnavailable(f"cannot list audio devices: {e}") from None
    infos = [DeviceInfo(int(d["index"]), str(d["name"]), apis[d["hostapi"]], int(d["max_input_channels"]),
                        int(d["max_output_channels"]), int(round(d["default_samplerate"]))) for d in devs]
    first = lambda d: (d.name.lower() not in READABLE, d.index)      # noqa: E731 - the sound server's first
    infos.sort(key=first)
    return [d for d in infos if d.inputs > 0], [d for d in infos if d.outputs > 0]


def find_device(spec: str, devices: List[DeviceInfo], kind: str) -> DeviceInfo:
    """A device by index or by (case-insensitive) name; exact names win over substrings."""
    if not devices:
        raise AudioUnavailable(f"no audio {kind} devices found. File input keeps working.")
    if spec.isdigit():
        hits = [d for d in devices if d.index == int(spec)]
    else:
        hits = [d for d in devices if d.name.lower() == spec.lower()] or \
               [d for d in devices if spec.lower() in d.name.lower()]
    if not hits:
        names = ", ".join(d.name for d in devices)
        raise AudioUnavailable(f"no {kind} device matches {spec!r}; available: {names}")
    return hits[0]


class InputSource:
    """Where microphone samples come from: a producer that fills ``ring`` at ``rate``."""

    label = "input"
    #: True for sources with no device to open (files, silence): started only once the session is
    #: built, so none of their audio is spent while the model loads
    deferred = False

    def __init__(self, rate: int, seconds: float = 4.0):
        self.rate = int(rate)
        self.ring = RingBuffer(int(rate * seconds))
        self.xruns = 0                       # callback-reported overflows
        self.failure: Optional[str] = None   # set once the source died (device gone)

    @property
    def finished(self) -> bool:
        """True once a finite source (a file) has delivered all of its samples."""
        return False

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def check(self) -> Optional[str]:
        """Poll for failure (called from the GUI timer); returns the failure message or None."""
        return self.failure


class _PortAudioStream:
    """Open, close and watch one PortAudio stream (``direction`` "input" or "output") of a device."""

    direction = "input"
    device: "DeviceInfo"
    rate: int
    failure: Optional[str]
    _stream = None
    _stopping = False
    _heard_at = 0.0            # time.monotonic() of the last callback (or of the start)

    def start(self) -> None:
        sd = sounddevice_module()
        self._heard_at = time.monotonic()
        cls = sd.InputStream if self.direction == "input" else sd.OutputStream
        try:
            self._stream = cls(device=self.device.index, samplerate=self.rate, channels=1,
                               dtype="float32", callback=self._callback)
            self._stream.start()
        except Exception as e:
            raise AudioUnavailable(f"cannot open {self.direction} device '{self.device.name}': {e}") from None

    @property
    def latency_s(self) -> float:
        """The latency PortAudio reports for the open stream (seconds; 0 before it opens)."""
        try:
            return float(self._stream.latency) if self._stream is not None else 0.0
        except (AttributeError, TypeError, ValueError):
            return 0.0

    def stop(self) -> None:
        """Close the stream, waiting at most CLOSE_WAIT_S: a sound server that vanished can leave PortAudio's
        close waiting on it for ever, so the close runs on a helper thread and is left behind (one line on
        stderr) when it does not return; the window, the session and the exit go on."""
        self._stopping = True
        stream, self._stream = self._stream, None
        if stream is None:
            return
        closer = threading.Thread(target=stream.close, kwargs={"ignore_errors": True}, daemon=True,
                                  name=f"close {self.direction} device")
        closer.start()
        closer.join(CLOSE_WAIT_S)
        if closer.is_alive():
            _stuck_close(f"{self.direction} device '{self.device.name}' did not close within {CLOSE_WAIT_S:g} s "
                         f"(its sound server is gone?); left open")

    def check(self) -> Optional[str]:
        s = self._stream
        if self.failure is None and not self._stopping and s is not None and (not s.active or self._stalled()):
            self.failure = f"{self.direction} device '{self.device.name}' stopped (unplugged?)"
        return self.failure

    def _stalled(self) -> bool:
        return time.monotonic() - self._heard_at > STALL_S


def capture_rate(device: DeviceInfo, wanted: Optional[int] = None) -> int:
    """The rate to open ``device`` at: ``wanted`` (the session's input rate: 16 kHz for MiniCPM-o 4.5) where
    PortAudio says the device takes it, else the device's native rate (the frame pump then resamples)."""
    if wanted is None or int(wanted) == device.rate:
        return device.rate
    try:
        sounddevice_module().check_input_settings(device=device.index, samplerate=int(wanted), channels=1,
                                                  dtype="float32")
    except Exception:  # noqa: BLE001 - PortAudio missing or the rate refused: capture natively
        return device.rate
    return int(wanted)


class DeviceInput(_PortAudioStream, InputSource):
    """A PortAudio input device, mono float32, at ``rate`` where it takes it (:func:`capture_rate`), else at
    its native rate. ``clock``: (time.monotonic(), samples delivered) at the last callback, from which the
    audio path measures the device's real rate (engine/echo/clock.py)."""

    def __init__(self, device: DeviceInfo, rate: Optional[int] = None):
        super().__init__(capture_rate(device, rate))
        self.device = device
        self.label = device.name
        self._stream = None
        self._stopping = False
        self._count = 0
        self.clock: Optional[Tuple[float, int]] = None

    def _callback(self, indata, frames, when, status) -> None:
        self._heard_at = time.monotonic()
        if status.input_overflow:
            self.xruns += 1
        self.ring.write(indata[:, 0])        # copy only: nothing else happens in the callback
        self._count += frames
        self.clock = (self._heard_at, self._count)



class _PacedInput(InputSource):
    """A source whose samples come from a thread at real-time pace (``speed`` x real time)."""

    block_s = 0.02
    deferred = True

    def __init__(self, rate: int, speed: float = 1.0):
        super().__init__(rate)
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = float(speed)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _block(self, n: int) -> np.ndarray:
        raise NotImplementedError

    def _run(self) -> None:
        n = max(1, int(round(self.rate * self.block_s)))
        period = n / self.rate / self.speed
        t0, k = time.monotonic(), 0
        while not self._stop.is_set():
            k += 1
            delay = t0 + k * period - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            self.ring.write(self._block(n))

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"{type(self).__name__}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None


class SilentInput(_PacedInput):
    """Zeros at real-time pace: keeps a session's clock running when its device disappears."""

    label = "silence"

    def _block(self, n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)


class FileInput(_PacedInput):
    """A WAV file played as the microphone at real-time pace, then silence (``finished`` turns True).

    Streamed: each block is read and mixed down as it is played (engine.wavio's reader), so a 6-hour
    file costs what a second costs. A bad sample further in (NaN) ends the file there and becomes the
    source's ``failure`` (one line, as a vanished device's)."""

    def __init__(self, path, speed: float = 1.0, max_seconds: Optional[float] = None):
        reader = open_audio(path)                                   # WavError (one line) if unreadable
        total = reader.frames if max_seconds is None else min(reader.frames, math.ceil(max_seconds * reader.rate))
        if total == 0:
            reader.close()
            raise WavError(f"{reader.path} holds no audio samples")
        super().__init__(reader.rate, speed)
        self.path = str(path)
        self.label = f"file {path}"
        self.total = int(total)                   # samples that will be played (only what will be played)
        self._reader = reader
        self._pos = 0
        self.bad_data = False                     # True once a read failed on the file's own samples

    @property
    def finished(self) -> bool:
        return self._pos >= self.total

    @property
    def duration_s(self) -> float:
        return self.total / self.rate

    def _block(self, n: int) -> np.ndarray:
        out = np.zeros(n, dtype=np.float32)
        take = max(0, min(n, self.total - self._pos))
        if take:
            try:
                block = self._reader.read(take)
            except WavError as e:                   # the file itself is bad there: a scripted run ends on it
                self.failure, block = str(e), np.zeros((0, 1), dtype=np.float32)
                self.bad_data = True
                self.total = self._pos              # the file ends where it went bad
            out[:len(block)] = block.mean(axis=1) if block.shape[1] > 1 else block[:, 0]
        self._pos += n
        if self._pos >= self.total:
            self._reader.close()
        return out


class DeviceOutput(Primed, _PortAudioStream):
    """A PortAudio output device at its native rate. The callback pops exactly what the device needs
    from the bounded :class:`engine.echo.PlaybackQueue` (zeros where it ran dry) and copies what it
    wrote into ``played``: the far-end signal the echo canceller reads (on the pump's thread). ``clock``:
    (time.monotonic(), samples consumed) at the last callback: :class:`Playback` follows the device's real
    rate from it."""

    direction = "output"

    def __init__(self, device: DeviceInfo, delay_s: float = 0.0):
        self.device = device
        self.label = device.name
        self.rate = device.rate
        self.queue = PlaybackQueue(device.rate, delay_s)
        self.played = RingBuffer(int(device.rate * 2.0))
        self.xruns = 0
        self.failure: Optional[str] = None
        self._stream = None
        self._stopping = False
        self._count = 0
        self.clock: Optional[Tuple[float, int]] = None

    def _callback(self, outdata, frames, when, status) -> None:
        self._heard_at = time.monotonic()
        if status.output_underflow:
            self.xruns += 1
        outdata[:, 0] = self.pop_primed(frames)      # copies only: a bounded queue, zeros when dry
        self.played.write(outdata[:, 0])
        self._count += frames
        self.clock = (self._heard_at, self._count)
