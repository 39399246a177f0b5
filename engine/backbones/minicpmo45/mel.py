"""LISTEN's front end: one second of 16 kHz audio -> the log-mel frames MiniCPM-o's duplex loop hands its encoder.

The rules (MiniCPM-o 4.5's streaming mel, read from its duplex loop; written here in our own form):

* The stream the mel sees is the input behind 560 zeros (its first chunk is 1,035 ms, the first second
  padded in front), read in hop-aligned pieces: the first ends 16,480 samples in (103 hops), every later
  one 16,000 further. So each second holds its last 80 input samples back for the next.
* The mel buffer is the stream from its start; once it reaches 30 s it drops its oldest 10 s.
* Each second the log-mel of the *whole buffer* is what counts: frame ``j`` is centred on sample
  ``160 j`` (25 ms periodic Hann window, 10 ms hop, reflected at both ends of the buffer), its power
  spectrum through the Slaney mel filters, ``log10`` above 1e-10; the buffer's last frame (its centre
  less than half a window from the end) is left out. Floor: ``-10`` while the buffer is under 5 s, else
  the largest value over every frame of the buffer minus 8. Then ``(x + 4) / 4``.
* The second hands on its 100 new frames with 2 frames of context each side (104), except the first:
  frames 0-101 (102, no left context).

What we keep instead of recomputing the buffer: a frame's log-mel depends only on its window's samples,
so each complete frame is computed once; per frame we keep only its peak (max over the 80 bins), the
buffer's floor is the max of those peaks and of the few frames that touch a reflected edge (the last
frame each second; the first two at the start and after each slide), which are computed afresh. The
bits are the whole-buffer computation's: a frame's FFT is the same alone or in a batch, and the mel
product is computed over at least 100 frames at a time with the filters on the left, as the stock's
(the CPU's matrix product gives other bits for a handful of columns).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch
import torch.nn.functional as F

from engine.core import Clock, Fixed, Region, SessionSpec, SlidingWindow, StateView, StepPlan, StreamingModel

RATE, HOP, WIN = 16000, 160, 400
SECOND = RATE                        # samples a step reads
FRAMES = SECOND // HOP               # new frames a second
CONTEXT = 2                          # frames of context each side of a second's frames
LEAD = 1035 * RATE // 1000 - SECOND  # 560 zeros in front of the stream (the 1,035 ms first chunk)
FIRST_END = (SECOND + LEAD) // HOP * HOP   # 16,480: where the first piece ends (hop-aligned)
HELD = SECOND + LEAD - FIRST_END     # 80 input samples each second holds back for the next
SLIDE_AT, SLIDE_BY = 30 * RATE, 10 * RATE  # the buffer drops 10 s once it reaches 30 s
DYNAMIC_FROM = 5 * RATE              # under 5 s the floor is fixed
FIXED_FLOOR, DYNAMIC_RANGE = -10.0, 8.0


@dataclass(frozen=True)
class SlideWindow(SlidingWindow):
    """Starts at ``lead`` units; once a step's view reaches ``window`` units the oldest ``stride`` go."""

    stride: int = 0
    lead: int = 0
    kind = "slide-window"

    def initial(self, prefix: int) -> int:
        return self.lead

    def after(self, grown: int, prefix: int) -> int:
        return grown - self.stride if grown >= self.window else grown

    def describe(self) -> str:
        return f"drop {self.stride} at {self.window}"


class StreamingLogMel(StreamingModel):
    """The stock-equal streaming log-mel: step input ``pcm`` [16000] float32 (one second at 16 kHz),
    output ``features`` [n_mels, 102] on the first second, [n_mels, 104] after.

    Regions: ``buffer`` (the mel buffer's samples, up to 30 s; the stream's 480 leading zeros before the
    first second), ``held`` (the 80 samples each second holds back) and ``peaks`` (each complete frame's
    largest log-mel value, frame ``i`` of ``peaks`` centred on sample ``160 i`` of ``buffer``).
    Host-shaped (its lengths change every second for 30 s): it runs eagerly, outside CUDA graphs.
    """

    name = "minicpmo45-mel"

    def __init__(self, fbank: torch.Tensor, window: torch.Tensor):
        super().__init__()
        self.register_buffer("fbank", fbank.to(torch.float32), persistent=False)      # [201, n_mels]
        self.register_buffer("window", window.to(torch.float32), persistent=False)    # [400]
        self.samples = Clock("samples16k", (SECOND,), rate_hz=float(RATE))
        self.frames = Clock("mel", (FRAMES,), rate_hz=float(FRAMES))

    def regions(self, spec: SessionSpec) -> List[Region]:
        note = "numpy buffer concatenated each second, sliced by 10 s at 30 s; whole-buffer log-mel each second"
        lead = FIRST_END - SECOND
        return [
            Region("buffer", (None,), self.samples, SlideWindow(SLIDE_AT, SLIDE_BY, lead),
                   stock_note=note, doc="16 kHz samples of the mel buffer"),
            Region("held", (HELD,), self.samples, Fixed(HELD), stock_note="the duplex loop's audio_buffer rest",
                   doc="input samples held back for the next second"),
            Region("peaks", (None,), self.frames,
                   SlideWindow(SLIDE_AT // HOP, SLIDE_BY // HOP, lead // HOP - 1),
                   stock_note="recomputed with the whole buffer each second", doc="each complete frame's peak"),
        ]

    def session_spec(self) -> SessionSpec:
        return SessionSpec(steps=None, label="MiniCPM-o 4.5 streaming log-mel")

    def example_inputs(self, plan: StepPlan, device) -> Dict[str, torch.Tensor]:
        return {"pcm": torch.zeros(SECOND, device=device)}

    def step(self, state: StateView, inputs: Dict[str, torch.Tensor], plan: StepPlan) -> Dict[str, torch.Tensor]:
        pcm = inputs["pcm"].to(torch.float32)
        new = state["buffer"].tail()                                  # [16000]
        new[:HELD].copy_(state["held"].get())
        new[HELD:].copy_(pcm[:SECOND - HELD])
        state["held"].set(pcm[SECOND - HELD:])
        view = state["buffer"].grow()                                 # the buffer before this second's slide
        grown = plan.grown["buffer"]
        start = SLIDE_BY if grown >= SLIDE_AT else 0                  # the slide happens before the log-mel
        buf = view[start:]
        frames = buf.shape[0] // HOP                                  # the buffer's frames (last one left out)
        first = plan.before["buffer"] < SECOND                        # the stream's first second
        peaks = state["peaks"].grow()                                 # [frames of the view - 1]
        assert peaks.shape[0] == grown // HOP - 1, (peaks.shape, grown)
        lo = max(0, frames - 1 - FRAMES - 2 * CONTEXT)                # first frame handed on
        edge = first or start > 0                                     # frames 0 and 1 meet the reflected start
        parts = [_edge_windows(buf, left=True)] if edge else []
        parts += [_windows(buf, 2 if first else lo, frames - 1), _edge_windows(buf, left=False)]
        mel = self._log_mel(torch.cat(parts))                         # [n_mels, windows]
        top = mel.max(dim=0).values                                   # each frame's peak
        base = start // HOP
        if edge:
            peaks[base:base + 2].copy_(top[:2])
        peaks[-FRAMES:].copy_(top[-1 - FRAMES:-1])                    # the second's new complete frames
        floor = self._floor(buf.shape[0], peaks[base:], top[-1:])
        out = mel[:, -1 - (frames - 1 - lo):-1]                       # frames lo .. frames - 2
        return {"features": (torch.maximum(out, floor) + 4.0) / 4.0}

    def _log_mel(self, windows: torch.Tensor) -> torch.Tensor:
        power = torch.fft.rfft(windows * self.window, dim=-1).abs() ** 2    # [n, 201]
        return torch.clamp(self.fbank.T @ power.T, min=1e-10).log10()      # [n_mels, n]

    def _floor(self, length: int, peaks: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        if length < DYNAMIC_FROM:
            return torch.full((), FIXED_FLOOR, dtype=torch.float32, device=peaks.device)
        return torch.maximum(peaks.max(), right.max()) - DYNAMIC_RANGE


def _windows(buf: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """The windows of complete frames ``lo .. hi - 1``: [hi - lo, 400]."""
    return buf[lo * HOP - WIN // 2:(hi - 1) * HOP + WIN // 2].unfold(0, WIN, HOP)


def _edge_windows(buf: torch.Tensor, left: bool) -> torch.Tensor:
    """Frames whose windows reach past an end of the buffer (mirrored there): the first two or the last one."""
    half = WIN // 2
    if left:
        seg = F.pad(buf[:HOP + half].view(1, 1, -1), (half, 0), mode="reflect").view(-1)   # [560]
        return seg.unfold(0, WIN, HOP)                                                    # [2, 400]
    over = half - HOP                                                                     # 40 past the end
    seg = F.pad(buf[-(WIN - over):].view(1, 1, -1), (0, over), mode="reflect")
    return seg.view(1, WIN)                                                               # [1, 400]
