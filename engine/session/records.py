"""The record of one second of a duplex session, and summaries over many."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Dict, List, Sequence

from engine.stats import percentile  # noqa: F401  (re-exported: one percentile for the product)

DEADLINE_MS = 1000.0


@dataclass
class SecondRecord:
    """Everything measured about second ``index`` (times in ms, bytes in bytes).

    ``wall_start`` is when the second's work began (unix seconds); ``queue_wait_ms`` how long its
    frame waited behind a late second; the deadline is the arrival of the next frame, so
    ``late_ms = max(0, queue_wait_ms + total_ms - deadline_ms)``. GPU stages are timed with CUDA
    events; ``total_ms`` is the wall time of the whole second's work on the host.
    """

    index: int
    wall_start: float
    listen_ms: float
    think_ms: float
    speak_ms: float
    total_ms: float
    deadline_ms: float
    late_ms: float
    missed: bool
    queue_wait_ms: float
    decision: str                 # "listen" | "speak"
    tokens: int                   # speech tokens produced by THINK this second
    state_bytes: int              # engine arenas (tail + backbone), bytes held now
    alloc_bytes: int              # torch allocator (0 on the CPU)
    reserved_bytes: int
    peak_bytes: int
    demand_sized: bool            # toggles in effect for this second
    graph_replay: bool
    tail: str                     # model names
    backbone: str
    input_rms: float
    output_rms: float
    user_speech: bool = False     # voice activity detected in the input second
    backlog: int = 0              # frames still waiting when this second finished
    text: str = ""                # text the backbone produced (Moshi with a tokenizer), else ""
    tail_skipped: bool = False    # the backbone listened and the decoder tail did not run (listen_skips_tail)
    mic_to_speaker_ms: float = 0.0  # the app playing to a device: end of this input second -> its answer
    #                                 starts playing (0: not measured; a real delay is never 0)
    # the audio path around the engine (engine/echo): the app and `duplexcadence-bench echo` fill these; 0 = none
    barge_ins: int = 0            # barge-ins fired in this second (the user talked over the model's speech)
    barge_in_latency_ms: float = 0.0  # the user's onset -> the model's playback stopping (this second's barge-in)
    playback_gaps: int = 0        # times the speaker's queue ran dry in this second
    playback_gap_ms: float = 0.0  # the silence those gaps played
    echo_suppression_db: float = 0.0  # echo suppression while the model spoke (0: not measured or cancellation off)
    dropped_speech_ms: float = 0.0  # late speech dropped to keep the delay bounded (engine/echo/queues.py)
    reply_gap_ms: float = 0.0     # the user's last word -> the model's first audio at the speaker, for the reply
    #                               that began playing in this second (engine/echo/replygap.py; 0 = none)
    # the user's controls (engine/session/controls.py and the app): what was in effect, what was asked
    force_listen: bool = False    # the model was held to listening this second (it may not start speaking)
    echo_cancellation: bool = False  # the app cancelled the speaker's echo from the microphone
    barge_in_sensitivity: str = ""  # the app's interrupt sensitivity (low / normal / high; "" = none)
    playback_delay_s: float = 0.0  # the playback delay (buffer) the speaker's queue kept
    requests: str = ""            # toggle and control requests made during this second ("; "-joined)
    # what the backbone decided and drew (backbones that report them; "" otherwise): space-separated ids
    llm_tokens: str = ""          # the LLM's tokens this second, in order (decision token first)
    tts_codes: str = ""           # the speech codes its TTS drew this second (no silence prefix)
    # after the second, off its clock, in the time before the next frame: the graphs the next second replays
    ahead_ms: float = 0.0         # the time it took (0: none prepared)
    ahead_captures: int = 0       # the graphs captured
    # THINK's speech generator, where the backbone marks it (MiniCPM-o's TTS: its prefill and 26 steps); part of
    # think_ms (0: not marked, or a listening second)
    think_tts_ms: float = 0.0

    def to_dict(self) -> Dict[str, object]:
        """A plain, JSON-safe dict (floats rounded to microseconds / 1e-6)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or v is None:
                out[f.name] = v
            elif isinstance(v, float):
                out[f.name] = round(v, 6) if math.isfinite(v) else 0.0
            elif isinstance(v, int):
                out[f.name] = int(v)
            else:
                out[f.name] = str(v)
        return out

    @classmethod
    def columns(cls) -> List[str]:
        return [f.name for f in dataclasses.fields(cls)]


def lateness(queue_wait_ms: float, total_ms: float, deadline_ms: float = DEADLINE_MS):
    """(late_ms, missed) for a second that waited ``queue_wait_ms`` and took ``total_ms``."""
    late = queue_wait_ms + total_ms - deadline_ms
    return (late, True) if late > 0 else (0.0, False)


def summarize(records: Sequence[SecondRecord]) -> Dict[str, object]:
    """Seconds, misses, p50/p99 of total and of each stage, worst lateness, final backlog."""
    totals = [r.total_ms for r in records]
    out: Dict[str, object] = {
        "seconds": len(records),
        "misses": sum(1 for r in records if r.missed),
        "p50_total_ms": percentile(totals, 50),
        "p99_total_ms": percentile(totals, 99),
        "max_total_ms": max(totals) if totals else 0.0,
        "max_late_ms": max((r.late_ms for r in records), default=0.0),
        "speak_seconds": sum(1 for r in records if r.decision == "speak"),
        "tokens": sum(r.tokens for r in records),
        "final_backlog": records[-1].backlog if records else 0,
        "peak_bytes": max((r.peak_bytes for r in records), default=0),
        "state_bytes": records[-1].state_bytes if records else 0,
    }
    for stage in ("listen", "think", "speak"):
        vals = [getattr(r, f"{stage}_ms") for r in records]
        out[f"p50_{stage}_ms"] = percentile(vals, 50)
        out[f"p99_{stage}_ms"] = percentile(vals, 99)
    out["keeps_up"] = keeps_up(records)
    return out


def keeps_up(records: Sequence[SecondRecord], window: int = 10) -> bool:
    """Whether the engine keeps the cadence: the recent mean compute per second fits the deadline.

    A backlog drains only when seconds take less than the deadline on average; over the last
    ``window`` seconds that mean must stay under it (and a non-empty backlog must be shrinking).
    """
    if not records:
        return True
    recent = list(records)[-window:]
    mean = sum(r.total_ms for r in recent) / len(recent)
    if mean >= recent[0].deadline_ms:
        return False
    return recent[-1].backlog <= recent[0].backlog or recent[-1].backlog == 0


def keep_up_notice(records: Sequence[SecondRecord], window: int = 10) -> str:
    """"" while the recent seconds fit the cadence (:func:`keeps_up`), else what is wrong, in one line."""
    if keeps_up(records, window):
        return ""
    recent = list(records)[-window:]
    mean = sum(r.total_ms for r in recent) / len(recent)
    return (f"cannot keep up: {recent[-1].backlog} second(s) waiting, {mean:.0f} ms of work per second over "
            f"the last {len(recent)} s (deadline {recent[-1].deadline_ms:.0f} ms)")


def format_summary(s: Dict[str, object]) -> str:
    line = (f"{s['seconds']} s, {s['misses']} missed, total p50 {s['p50_total_ms']:.1f} ms / "
            f"p99 {s['p99_total_ms']:.1f} ms (listen {s['p50_listen_ms']:.1f}, think {s['p50_think_ms']:.1f}, "
            f"speak {s['p50_speak_ms']:.1f} ms p50); {s['speak_seconds']} s spoken, {s['tokens']} tokens")
    if s["misses"]:
        line += f"; worst {s['max_late_ms']:.0f} ms late"
    line += "; keeps up" if s["keeps_up"] else "; CANNOT keep up (mean work per second exceeds the deadline)"
    return line
