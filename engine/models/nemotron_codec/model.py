"""The Nemotron VoiceChat EAR-TTS codec decoder as an engine model: declared regions, one whole-second step.

A step decodes one second of codes (12 frames in even seconds, 13 in odd ones). Every frame gets
exactly the arithmetic of the stock's one-frame cached decode (``RVQVAEModel.decode(code[:, t:t+1],
cache=CausalConv1dCache())``): the same library calls at the same per-frame shapes, the same
elementwise functions (see :mod:`.blocks`), so the bits match; the executor captures the whole
second as one CUDA graph per frame count (two signatures), with no host sync inside.

Regions (each stage's clock advances that stage's columns per frame; all Fixed, replaced in place):

* ``stage{s}.block{b}.history`` — block b of stage s: the depthwise conv's last ``kernel - 1`` inputs;
* ``istft.spec``                — the last ``spec_history`` spectrogram columns (real | imaginary).

The transposed convs have ``kernel == stride`` (no overlap between frames) and the codebook sum is
per frame: neither carries state.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

from engine.core.graphs import example_randint
from engine.core import Clock, Region, SessionSpec, StateView, StepPlan, StreamingModel, prefixed

from .blocks import BATCHABLE, CausalConvNeXt, StreamingISTFT, per_frame
from .config import CodecConfig


class NemotronCodecDecoder(StreamingModel):
    """Codes [K, n] -> audio [1, n * wav_to_token_ratio] at ``cfg.sample_rate``.

    ``pointwise_per_frame``: apply transcendental elementwise functions frame by frame (None: on
    the CPU only, where their bits depend on an element's place in the tensor); ``batched``: the
    kinds of library call (``True``: all of :data:`~.blocks.BATCHABLE`) made once per second instead
    of per frame — exact only where cuDNN / cuFFT / the reduction keep the same summation order for
    both shapes. None (the default) leaves it to the start-up self-check (:func:`.fastpaths.choose`,
    which sets :attr:`chosen`); before a check, None batches nothing.
    """

    name = "nemotron-codec"

    def __init__(self, cfg: CodecConfig, pointwise_per_frame: Optional[bool] = None,
                 batched: Union[None, bool, Iterable[str]] = None):
        super().__init__()
        self.cfg = cfg
        self.pointwise_per_frame, self.batched = pointwise_per_frame, batched
        self.chosen: FrozenSet[str] = frozenset()     # the self-check's kinds, used while ``batched`` is None
        self.codebooks = nn.Parameter(torch.zeros(cfg.num_quantizers, cfg.codebook_size, cfg.latent_size),
                                      requires_grad=False)
        self.upsample = nn.ParameterList()
        self.stages = nn.ModuleList()
        for (c_in, c_out), r in zip(cfg.stage_channels(), cfg.stage_rates()):
            self.upsample.append(nn.Parameter(torch.zeros(c_in, c_out // cfg.groups, r), requires_grad=False))
            self.stages.append(nn.ModuleList(CausalConvNeXt(c_out, cfg.kernel_size) for _ in range(cfg.num_blocks)))
        self.head = StreamingISTFT(cfg.stage_channels()[-1][1], cfg.n_fft, cfg.hop_length, cfg.spec_history,
                                   cfg.trim)

    # -- engine contract ---------------------------------------------------------------------------------
    def clocks(self) -> Dict[str, Clock]:
        """One clock per stage counting its columns (``cols0`` advances 12 or 13 frames' worth)."""
        cfg, pattern = self.cfg, self.cfg.seconds_pattern()
        out = {}
        for s, cols in enumerate(cfg.columns_per_frame()):
            out[f"cols{s}"] = Clock(f"cols{s}", tuple(p * cols for p in pattern), rate_hz=cfg.frame_rate * cols)
        return out

    def regions(self, spec: Optional[SessionSpec] = None) -> List[Region]:
        ck, regs = self.clocks(), []
        for s, blocks in enumerate(self.stages):
            for b, block in enumerate(blocks):
                regs += prefixed(f"stage{s}.block{b}", block.regions(ck[f"cols{s}"]))
        last = len(self.stages) - 1
        return regs + prefixed("istft", self.head.regions(ck[f"cols{last}"]))

    def spec(self, steps: Optional[int] = None, last_frames: Optional[int] = None) -> SessionSpec:
        """A session of ``steps`` seconds (None: open-ended live); ``last_frames``: a short last second."""
        last = {}
        if steps is not None and last_frames is not None:
            per = dict(zip([f"cols{s}" for s in range(len(self.stages))], self.cfg.columns_per_frame()))
            last = {name: int(last_frames) * per.get(name, 1) for name in self.clocks()}
        c = self.cfg
        return SessionSpec(steps=steps, last_advance=last,
                           label=f"nemotron-codec {c.base_hidden_size}x{'/'.join(map(str, c.stage_rates()))}")

    def frames_in(self, plan: StepPlan) -> int:
        """Frames a step decodes (its first stage's columns over that stage's columns per frame)."""
        return plan.advances["cols0"] // self.cfg.columns_per_frame()[0]

    def example_inputs(self, plan: StepPlan, device) -> Dict[str, torch.Tensor]:
        n = self.frames_in(plan)
        return {"codes": example_randint(self.cfg.codebook_size, (self.cfg.num_quantizers, n), device)}

    def step(self, state: StateView, inputs: Dict[str, torch.Tensor], plan: StepPlan) -> Dict[str, torch.Tensor]:
        return {"audio": self.decode(state, inputs["codes"])}

    # -- decode ---------------------------------------------------------------------------------------------
    def batched_kinds(self) -> FrozenSet[str]:
        """The library calls made once per second: as given, else as the self-check chose."""
        if self.batched is None:
            return self.chosen
        batch = BATCHABLE if self.batched is True else frozenset(self.batched or ())
        if not batch <= BATCHABLE:
            raise ValueError(f"batched: unknown kinds {sorted(batch - BATCHABLE)}; choose from {sorted(BATCHABLE)}")
        return batch

    def latents(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [K, n] -> [n, latent, 1]: the residual codebooks' vectors summed in codebook order."""
        n = codes.shape[1]
        z = torch.zeros((n, self.cfg.latent_size), dtype=self.codebooks.dtype, device=codes.device)
        for i in range(codes.shape[0]):
            z = z + self.codebooks[i].index_select(0, codes[i])
        return z[:, :, None]

    def upsample_second(self, x: torch.Tensor, w: torch.Tensor, layout: Optional[Tuple[int, ...]],
                        batched: bool) -> Tuple[torch.Tensor, Optional[Tuple[int, ...]]]:
        """One stage's transposed conv over the second; the per-frame strides its output has.

        The stock's first stage takes the [1, 1, L] latent transposed (strides ``(L, 1, L)``); later stages
        take the previous transposed conv's output layout (the ConvNeXt residual keeps it: channels-last
        where the library returned that). Per frame, each input is handed over in ``layout``, so the
        library picks the stock's kernel (MKL / oneDNN paths differ between layouts)."""
        strides: List[Tuple[int, ...]] = []

        def up(b: torch.Tensor) -> torch.Tensor:
            y = torch.conv_transpose1d(b, w, stride=w.shape[-1], groups=self.cfg.groups)
            strides.append(tuple(y.stride()))
            return y
        out = per_frame(up, x, batched, strides=layout)
        return out, (None if batched else strides[0])

    def decode(self, state, codes: torch.Tensor) -> torch.Tensor:
        """codes [K, n] -> audio [1, n * wav_to_token_ratio] over the state handles.

        Batched calls run only in whole seconds (12 or 13 frames: the shapes the self-check tried); a
        short last second makes every call per frame."""
        cfg = self.cfg
        frames = self.pointwise_per_frame if self.pointwise_per_frame is not None else not codes.is_cuda
        kinds = self.batched_kinds()
        batch = kinds if codes.shape[1] in cfg.seconds_pattern() else frozenset()
        x = self.latents(codes)                                                      # [n, L, 1]
        layout: Optional[Tuple[int, ...]] = (cfg.latent_size, 1, cfg.latent_size)
        for s, (w, blocks) in enumerate(zip(self.upsample, self.stages)):
            x, layout = self.upsample_second(x, w, layout, "convtr" in batch)          # [n, C_s, cols_s]
            for b, block in enumerate(blocks):
                x = block.second(x, state.under(f"stage{s}.block{b}"), frames, batch)
        wav = self.head.second(x, state.under("istft"), frames, batch)              # [n, frame samples]
        return wav.reshape(1, -1)
