"""The wire protocol between a remote client and a serving replica (one WebSocket = one session).

Everything here is plain Python (no Ray, no FastAPI): the server and the client both import it.

Client -> server
  * text ``{"type": "hello", "protocol": 1, "config": {...}, "speech": true}`` first (what the client asks of
    the session: tail, backbone, size, device, seed, toggles, reply_seconds and, for a backbone that takes
    one, its system prompt and its input rate; see :data:`CLIENT_FIELDS`); the server checks the prompt
    as untrusted text (:func:`engine.system_prompt.check`: at most 4,000 characters, no control characters).
    ``speech`` (optional, true or false): send each second's tail output with its result (see below); a
    client that leaves it out gets results as before, and a server that predates it ignores it;
  * binary: one second of mono audio at the session's ``input_rate`` (24 kHz unless the hello asked for a
    backbone's native rate: minicpm-o-4.5's 16 kHz) as little-endian float32, exactly ``4 * input_rate`` bytes;
  * text ``{"type": "toggles", "demand_sized": bool|null, "graph_replay": bool|null}``;
  * text ``{"type": "stop", "drain": bool}``: finish (with ``drain``: every queued second) and end.

Server -> client
  * text ``{"type": "ready", "info": {...}, "replica": str, "node": str}`` once the session is built;
  * binary: one finished second, :func:`pack_result` (a JSON header with the record, then the audio and,
    for a client whose hello asked for ``speech``, what the tail produced that second: the header's
    ``speech`` counts its samples, at most :data:`MAX_SPEECH_SAMPLES`);
  * text ``{"type": "refused", "message": str}`` then a close with a 44xx/45xx code (bad token,
    wrong model, full cluster): nothing was built;
  * text ``{"type": "error", "message": str}``: the session failed (it has stopped);
  * text ``{"type": "end", "seconds": int}`` after a stop, then a normal close.

Bounds (neither side trusts the other): a text message is at most :data:`MAX_TEXT_BYTES`, a frame
exactly ``4 * input_rate`` bytes (at most :data:`FRAME_BYTES`), a result at most :data:`MAX_SERVER_MESSAGE`; a client may be at most
:data:`MAX_AHEAD` seconds ahead of its results (beyond: ``error`` and close :data:`CLOSE_TOO_FAST`);
a draining server closes a live session at the end of its grace period (:data:`CLOSE_SHUTDOWN`); a client that
sends no frame for 20 s while it is owed no result is closed with a message saying so (:data:`CLOSE_IDLE`), as is
one quiet for 5 s when a full replica gives its slot to another client. The client, for its part, gives each
second it sent a deadline that only that second's result meets (other messages do not extend it).

Bits: audio travels as raw float32 and each record as JSON with Python's shortest round-trip float
repr, so a record and its audio arrive exactly as the server's session made them.
"""
from __future__ import annotations

import dataclasses
import json
import math
import struct
from typing import Any, Dict, Tuple
from urllib.parse import urlsplit

import numpy as np

from engine import system_prompt
from engine.session.live import LiveResult
from engine.session.records import SecondRecord

PROTOCOL = 1
RATE = 24000
FRAME_BYTES = 4 * RATE
PATH = "/session"

#: SessionConfig fields a client may ask for; the model itself (weights, size, device) is the server's
CLIENT_FIELDS = ("tail", "backbone", "size", "device", "seed", "demand_sized", "graph_replay", "reply_seconds",
                 "system_prompt", "input_rate")

# WebSocket close codes (4000-4999 are the application's)
CLOSE_NORMAL = 1000
CLOSE_UNAUTHORIZED = 4401
CLOSE_BAD_REQUEST = 4400
CLOSE_CONFLICT = 4409          # the client asked for a model this server does not serve
CLOSE_FULL = 4503              # every replica is at its session limit
CLOSE_SHUTDOWN = 4504          # the replica is shutting down (its drain grace period ended)
CLOSE_TOO_FAST = 4429          # the client sent more than MAX_AHEAD seconds ahead of its session
CLOSE_IDLE = 4408              # the client sent no frame for too long (engine/serve/pump.py's CLIENT_IDLE_S)

#: seconds of audio a client may have sent whose results have not come back (server: refused beyond)
MAX_AHEAD = 32
#: the largest control (text) message either side sends (the server's ``ready`` carries the session info, whose
#: fast-path verdicts for a chunked Step-Audio2 tail, every chunk length checked at start, are ~18,000 characters)
MAX_TEXT_BYTES = 64 * 1024
#: the largest JSON header of a result (a record is well under 4 KiB)
MAX_HEADER_BYTES = 64 * 1024
#: the most a second's tail output may hold (24 kHz samples) for the wire. A tail decodes what the second's tokens
#: complete: a full step (1 s) and, with chunking (MiniCPM-o 4.5), a short chunk (< 8 frames at 25 Hz, 0.32 s)
#: plus the last chunk of a turn that ended (< 8 frames): about 1.6 s at most; 4 s is well beyond any tail's.
MAX_SPEECH_SECONDS = 4
MAX_SPEECH_SAMPLES = MAX_SPEECH_SECONDS * RATE
#: the largest message a client accepts from a server: a result's length prefix, header, one second of audio
#: and, where the client asked for it, the second's tail output (4 + 64 KiB + 96,000 + 384,000 bytes: 533 KiB;
#: it was 158 KiB before results carried the tail output)
MAX_SERVER_MESSAGE = 4 + MAX_HEADER_BYTES + FRAME_BYTES + 4 * MAX_SPEECH_SAMPLES

_HEADER = struct.Struct("<I")  # length of the JSON header that precedes a result's audio


class ProtocolError(ValueError):
    """A message that does not follow the protocol (the text says what is wrong)."""


def encode(kind: str, **fields: Any) -> str:
    """A text message: ``{"type": kind, **fields}``."""
    return json.dumps({"type": kind, **fields})


def decode(text: str) -> Dict[str, Any]:
    """A text message as a dict with a ``type``; ProtocolError otherwise."""
    if not isinstance(text, str):
        raise ProtocolError("a control message is text")
    if len(text) > MAX_TEXT_BYTES:
        raise ProtocolError(f"a text message of {len(text)} characters is over the limit of {MAX_TEXT_BYTES}")
    try:
        msg = json.loads(text)
    except (TypeError, ValueError, RecursionError) as e:
        raise ProtocolError(f"a text message is not JSON: {_first_line(e)}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError("a text message is a JSON object with a string 'type'")
    return msg


def flag(msg: Dict[str, Any], key: str):
    """``msg[key]`` when it is true, false or absent/null; ProtocolError for anything else."""
    value = msg.get(key)
    if value is not None and not isinstance(value, bool):
        raise ProtocolError(f"{key} must be true, false or null, got {str(value)[:40]!r}")
    return value


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0][:200]


def hello(config: Dict[str, Any], speech: bool = False) -> str:
    """The client's first message: the fields of :data:`CLIENT_FIELDS` it sets (a system prompt travels as
    its own characters, not \\u escapes, so the longest one allowed fits in :data:`MAX_TEXT_BYTES`); with
    ``speech``, the ask for each second's tail output (left out otherwise: the hello is as it always was)."""
    asked = {k: v for k, v in config.items() if k in CLIENT_FIELDS}
    extra = {"speech": True} if speech else {}
    return json.dumps({"type": "hello", "protocol": PROTOCOL, "config": asked, **extra}, ensure_ascii=False)


def hello_asks_speech(text: str) -> bool:
    """Whether a hello (already read by :func:`read_hello`) asks for each second's tail output."""
    return flag(decode(text), "speech") is True


def read_hello(text: str) -> Dict[str, Any]:
    """The config of a hello message; ProtocolError when it is not one."""
    msg = decode(text)
    if msg["type"] != "hello":
        raise ProtocolError(f"the first message must be a hello, not {msg['type']!r}")
    if msg.get("protocol") != PROTOCOL:
        raise ProtocolError(f"protocol {msg.get('protocol')!r} is not supported (this server speaks {PROTOCOL}): "
                            "update the client or the server so both are the same version")
    flag(msg, "speech")                              # true, false or absent
    config = msg.get("config")
    if not isinstance(config, dict):
        raise ProtocolError("a hello carries a 'config' object")
    unknown = sorted(set(config) - set(CLIENT_FIELDS))
    if unknown:
        raise ProtocolError(f"a hello's config cannot set {', '.join(unknown)}")
    if config.get("system_prompt") is not None:
        try:
            system_prompt.check(config["system_prompt"])
        except ValueError as e:
            raise ProtocolError(str(e)) from None
    return config


def pack_frame(frame: np.ndarray) -> bytes:
    """One second of audio (``[input_rate]`` in, ``[24000]`` out) float32 as little-endian bytes."""
    return np.ascontiguousarray(frame, dtype="<f4").tobytes()


def unpack_frame(data: bytes, rate: int = RATE) -> np.ndarray:
    """The ``[rate]`` float32 frame of a binary message (``rate``: the session's input rate); ProtocolError
    when its size is wrong."""
    if len(data) != 4 * int(rate):
        raise ProtocolError(f"a frame is one second of mono {int(rate) / 1000:g} kHz float32 audio (the session's "
                            f"input_rate: {4 * int(rate)} bytes); got {len(data)} bytes")
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


def record_fields(rec: SecondRecord) -> Dict[str, Any]:
    """Every field of a record, unrounded (JSON keeps floats exactly)."""
    return dataclasses.asdict(rec)


def pack_result(res: LiveResult, speech: bool = False) -> bytes:
    """A finished second: ``[u32 header length][JSON header][float32 audio]``; with ``speech``, then
    ``[float32 speech]`` (``res.speech``, none when it is None), its sample count in the header's ``speech``.
    ProtocolError when the speech is longer than :data:`MAX_SPEECH_SAMPLES`."""
    fields = {"record": record_fields(res.record), "keeps_up": bool(res.keeps_up), "notice": res.notice}
    tail = b""
    if speech:
        said = np.zeros(0, np.float32) if res.speech is None else np.asarray(res.speech).reshape(-1)
        if said.size > MAX_SPEECH_SAMPLES:
            raise ProtocolError(f"second {res.record.index}'s tail output is {said.size} samples "
                                f"({said.size / RATE:.2f} s); a result carries at most {MAX_SPEECH_SAMPLES} "
                                f"({MAX_SPEECH_SECONDS} s)")
        fields["speech"], tail = int(said.size), pack_frame(said)
    header = json.dumps(fields).encode("utf-8")
    return _HEADER.pack(len(header)) + header + pack_frame(res.audio) + tail


def unpack_result(data: bytes) -> LiveResult:
    """The :class:`LiveResult` of a binary server message (record and audio bit for bit).

    Checked before anything is used (the server is not trusted): the header's length and JSON, the
    record's fields, and the audio: exactly one second of finite float32 samples; where the header counts
    ``speech`` samples, that many finite float32 samples (at most :data:`MAX_SPEECH_SAMPLES`) follow the
    audio and become the result's ``speech`` (None where the header has no count).
    """
    if len(data) < _HEADER.size:
        raise ProtocolError("a result message is shorter than its header")
    (n,) = _HEADER.unpack_from(data)
    if n > MAX_HEADER_BYTES or _HEADER.size + n > len(data):
        raise ProtocolError(f"a result's header claims {n} bytes (at most {MAX_HEADER_BYTES}, within the message)")
    head = data[_HEADER.size:_HEADER.size + n]
    try:
        meta = json.loads(head.decode("utf-8"))
        rec = SecondRecord(**meta["record"])
        keeps_up, notice, said = meta.get("keeps_up", True), meta.get("notice", ""), meta.get("speech")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise ProtocolError(f"a result's header cannot be read: {_first_line(e)}") from None
    _check_record(rec)
    if not isinstance(notice, str) or len(notice) > 1000:
        raise ProtocolError("a result's notice is not a short text")
    if said is not None and (isinstance(said, bool) or not isinstance(said, int)
                             or not 0 <= said <= MAX_SPEECH_SAMPLES):
        raise ProtocolError(f"a result's speech count is {said!r:.40}, not a number of samples from 0 to "
                            f"{MAX_SPEECH_SAMPLES} ({MAX_SPEECH_SECONDS} s)")
    body = len(data) - _HEADER.size - n
    if body != FRAME_BYTES + 4 * (said or 0):
        if said is None:
            raise ProtocolError(f"a result's audio is {body} bytes; one second of 24 kHz float32 is {FRAME_BYTES}")
        raise ProtocolError(f"a result's audio and speech are {body} bytes; one second of 24 kHz float32 and "
                            f"{said} speech samples are {FRAME_BYTES + 4 * said}")
    audio = _finite(data, RATE, _HEADER.size + n, "audio")
    speech = None if said is None else _finite(data, said, _HEADER.size + n + FRAME_BYTES, "speech")
    return LiveResult(rec, audio, bool(keeps_up), notice, speech)


def _finite(data: bytes, count: int, offset: int, what: str) -> np.ndarray:
    """``count`` float32 samples of ``data`` from ``offset``; ProtocolError when one is NaN or infinite."""
    x = np.frombuffer(data, dtype="<f4", count=count, offset=offset).astype(np.float32)
    if not np.isfinite(x).all():
        raise ProtocolError(f"a result's {what} holds NaN or infinite samples")
    return x


_KINDS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_record(rec: SecondRecord) -> None:
    """Every field of a received record has its declared type (a number where a number belongs,
    finite; short text): what the caller prints and writes is then safe to format."""
    for f in dataclasses.fields(rec):
        value = getattr(rec, f.name)
        kinds = _KINDS.get(f.type if isinstance(f.type, str) else getattr(f.type, "__name__", ""), ())
        wrong = (not isinstance(value, kinds) or (isinstance(value, bool) and f.type != "bool")
                 or (isinstance(value, float) and not math.isfinite(value))
                 or (isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2 ** 63)
                 or (isinstance(value, str) and len(value) > 10_000))
        if kinds and wrong:
            raise ProtocolError(f"a result's record field {f.name} is {str(value)[:40]!r}, not a valid {f.type}")


def session_url(url: str) -> Tuple[str, str]:
    """``(websocket URL of the session endpoint, host:port for messages)`` from what a user types.

    ``ws://HOST:PORT`` and ``wss://HOST:PORT`` are taken as they are (the session path is added when
    missing); ``http(s)://`` is read as ``ws(s)://``. Anything else is a ValueError saying so.
    """
    text = str(url or "").strip()
    parts = urlsplit(text)
    scheme = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}.get(parts.scheme.lower())
    if scheme is None or not parts.hostname:
        raise ValueError(f"engine URL {text!r} is not a ws://HOST:PORT or wss://HOST:PORT address")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"engine URL {text!r} has a port that is not a number from 0 to 65535") from None
    netloc = parts.netloc.rsplit("@", 1)[-1]
    path = parts.path.rstrip("/")
    if not path.endswith(PATH):
        path = path + PATH
    where = netloc if port is not None else f"{parts.hostname}:{443 if scheme == 'wss' else 80}"
    return f"{scheme}://{netloc}{path}", where
