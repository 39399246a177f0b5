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

What we keep instead of recomputing the buffer: a frame's power spectrum depends only on its window's
samples and the FFT gives each frame the same bits alone or in a batch, so each complete frame's spectrum is
computed once and kept; the frames that touch a reflected edge (the last one each second; the first two at
the start and after each slide) are computed afresh. The mel product is NOT cut to the new frames: the CPU's
matrix product rounds a column by where it falls in the product (MKL's AVX2 kernels give the last columns of
a product other bits than the same columns inside a wider one), so every second multiplies the filters by the
whole buffer's spectra, [n_mels, 201] @ [201, frames] with the stock's layout, and the floor is the max of
that whole log-mel, as the stock's are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch
import torch.nn.functional as F

from engine.core import Clock, Fixed, Region, SessionSpec, SlidingWindow, StateView, StepPlan, StreamingModel

RATE, HOP, WIN = 16000, 160, 400
BINS = WIN // 2 + 1                   # the power spectrum's bins
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
    first second), ``held`` (the 80 samples each second holds back) and ``power`` (each frame's power
    spectrum, [frames, 201]: row ``i`` is the frame centred on sample ``160 i`` of ``buffer``; the last row,
    the frame that reaches past the buffer's end, is rewritten each second).
    Host-shaped (its lengths change every second for 30 s): it runs eagerly, outside CUDA graphs.
    """

    name = "minicpmo45-mel"

    def __init__(self, fbank: torch.Tensor, window: torch.Tensor):
        super().__init__()
        self.register_buffer("fbank", fbank.to(torch.float32).contiguous(), persistent=False)  # [201, n_mels]
        self.register_buffer("window", window.to(torch.float32), persistent=False)             # [400]
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
            Region("power", (None, BINS), self.frames, SlideWindow(SLIDE_AT // HOP, SLIDE_BY // HOP, lead // HOP),
                   stock_note="the whole buffer's STFT recomputed each second", doc="each frame's power spectrum"),
        ]

    def session_spec(self) -> SessionSpec:
        return SessionSpec(steps=None, label="MiniCPM-o 4.5 streaming log-mel")

    def example_inputs(self, plan: StepPlan, device) -> Dict[str, torch.Tensor]:
        return {"pcm": torch.zeros(SECOND, device=device)}

    def step(self, state: StateView, inputs: Dict[str, torch.Tensor], plan: StepPlan) -> Dict[str, torch.Tensor]:
        buf, base, first = self._take(state, inputs["pcm"].to(torch.float32), plan)
        frames = buf.shape[0] // HOP                                  # the frames the stock keeps (last left out)
        power = state["power"].grow()[base:]                          # [frames, 201]
        assert power.shape[0] == frames and power.is_contiguous(), (power.shape, frames)
        lo = frames - 1 - FRAMES                                      # the last second's edge frame, now complete
        self._spectra(buf, power, lo, edge=first or base > 0)
        log_mel = self._log_mel(power)                                # [n_mels, frames]
        if buf.shape[0] < DYNAMIC_FROM:
            floor = torch.full((), FIXED_FLOOR, dtype=torch.float32)
        else:
            floor = log_mel.max() - DYNAMIC_RANGE
        out = log_mel[:, max(0, lo - 2 * CONTEXT):frames - 1]         # 104 frames (102 the first second)
        return {"features": (torch.maximum(out, floor) + 4.0) / 4.0}

    def _log_mel(self, power: torch.Tensor) -> torch.Tensor:
        """The whole buffer's log-mel from its spectra [frames, 201]: the stock's product, layout and clamp."""
        return torch.clamp(self.fbank.T @ power.T, min=1e-10).log10()

    def _take(self, state: StateView, pcm: torch.Tensor, plan: StepPlan):
        """This second's samples into the buffer (behind the 80 held back); the buffer as the log-mel sees it
        (after this second's slide), its first frame's row in ``power``, and whether it is the first second."""
        new = state["buffer"].tail()                                  # [16000]
        new[:HELD].copy_(state["held"].get())
        new[HELD:].copy_(pcm[:SECOND - HELD])
        state["held"].set(pcm[SECOND - HELD:])
        start = SLIDE_BY if plan.grown["buffer"] >= SLIDE_AT else 0   # the slide happens before the log-mel
        return state["buffer"].grow()[start:], start // HOP, plan.before["buffer"] < SECOND

    def _spectra(self, buf: torch.Tensor, power: torch.Tensor, lo: int, edge: bool) -> None:
        """Rows ``lo .. frames - 2`` (the new complete frames), the last row (the right edge) and, after a start
        or a slide, rows 0 and 1 (the reflected left edge): one FFT over those windows."""
        frames = power.shape[0]
        parts = [_edge_windows(buf, left=True)] if edge else []
        parts += [_windows(buf, lo, frames - 1), _edge_windows(buf, left=False)]
        spectra = torch.fft.rfft(torch.cat(parts) * self.window, dim=-1).abs() ** 2     # [windows, 201]
        if edge:
            power[:2].copy_(spectra[:2])
        power[lo:].copy_(spectra[-(frames - lo):])


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
