"""The Mimi decoder as an engine model: regions with their clocks, and one whole-second step.

A step decodes one second of codes: 12 frames in even seconds, 13 in odd ones (second ``k`` covers
frames ``floor(12.5 k) .. floor(12.5 (k+1)) - 1``). Inside the step the frames run one after the
other exactly as moshi's streaming decode runs them (one ``decode`` call per frame), so the bits
match; the executor captures the whole second as one CUDA graph per distinct frame count (two).

Regions (every clock advances by whole frames' worth of its units per second):

* ``up.partial``            — the x2 upsample's transposed-conv overlap, Fixed(2) at 12.5 Hz;
* ``tr.kv{i}``              — layer i's keys and values, a Ring of ``context`` 25 Hz steps (the
  attention always sees the whole ring with a mask, as moshi's ``RingKVCache`` does);
* ``dec.conv_in``           — the first SEANet conv's last k-1 inputs at 25 Hz;
* ``dec.stage{s}.partial``  — stage s's transposed-conv overlap, Fixed(ratio);
* ``dec.stage{s}.res{j}``   — the residual conv's last (k-1)*dilation inputs;
* ``dec.conv_out``          — the last conv's last k-1 inputs at 24 kHz.

``tr.*`` and ``dec.*`` are declared by the transformer and the SEANet decoder themselves (streaming
blocks, see :mod:`.modules`) and mounted here under those prefixes.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch
from torch import nn

from engine.core.graphs import example_randint
from engine.core import Clock, Fixed, Region, SessionSpec, StateView, StepPlan, StreamingModel, prefixed

from . import weights as W
from .config import MimiConfig
from .modules import CONV_TR_NOTE, MimiTransformer, SEANetDecoder, SplitRVQ, causal_conv_tr
from .second import conv_tr_second, seanet_second, transformer_second


class MimiDecoder(StreamingModel):
    """Mimi's decode path (codes -> 24 kHz) with engine-declared streaming state.

    ``layer_major``: run each layer over the whole second (fewer kernels, same bits, see ``second.py``);
    ``batch_matmul`` / ``batch_conv`` / ``batch_conv_tr``: one matmul / conv / transposed-conv call per
    second instead of per frame; ``batch_matmul_strided``: one strided-batched GEMM over the frames;
    ``batch_attention``: one attention call over the frames (each exact only where cuBLAS / cuDNN /
    the attention kernel keep the same arithmetic). None (the
    default) leaves each to the start-up self-check (``fastpaths.choose``, which fills
    :attr:`chosen`); before a check, None means layer-major on CUDA only and no batched calls.
    """

    name = "mimi"

    def __init__(self, cfg: MimiConfig, layer_major: Optional[bool] = None, batch_matmul: Optional[bool] = None,
                 batch_conv: Optional[bool] = None, batch_conv_tr: Optional[bool] = None,
                 batch_matmul_strided: Optional[bool] = None, batch_attention: Optional[bool] = None):
        super().__init__()
        self.cfg = cfg
        self.layer_major, self.batch_matmul, self.batch_conv = layer_major, batch_matmul, batch_conv
        self.batch_conv_tr, self.batch_matmul_strided = batch_conv_tr, batch_matmul_strided
        self.batch_attention = batch_attention
        self.chosen: Dict[str, bool] = {}      # the self-check's choice for each flag left None
        #: the flags checked per frame count (``fastpaths.choose``: the whole seconds' counts up front)
        self.chosen_at: Dict[int, Dict[str, bool]] = {}
        #: checks a frame count first met (a short last second) before it runs: -> its flags
        self.check_frames: Optional[Callable[[int], Dict[str, bool]]] = None
        self.rvq = SplitRVQ(cfg)
        self.upsample = nn.Parameter(torch.zeros(cfg.dimension, 1, 2 * cfg.upsample_stride), requires_grad=False)
        self.transformer = MimiTransformer(cfg)
        self.seanet = SEANetDecoder(cfg)

    # -- weights ---------------------------------------------------------------------------------
    @torch.no_grad()
    def load_moshi_state(self, state: Dict[str, torch.Tensor], source: str = "state dict") -> "MimiDecoder":
        """Copy a moshi-layout state dict (checked against the config) into this model."""
        cfg = self.cfg
        sd = W.check_state(state, cfg, source)
        dev = self.upsample.device
        books = [W.codebook(sd, "rvq_first", j) for j in range(cfg.n_q_semantic)]
        books += [W.codebook(sd, "rvq_rest", j) for j in range(cfg.n_q - cfg.n_q_semantic)]
        self.rvq.codebooks.copy_(torch.stack(books).to(dev))
        self.rvq.proj_first.copy_(sd["quantizer.rvq_first.output_proj.weight"])
        self.rvq.proj_rest.copy_(sd["quantizer.rvq_rest.output_proj.weight"])
        self.upsample.copy_(sd["upsample.convtr.convtr.convtr.weight"])
        for i, layer in enumerate(self.transformer.layers):
            p = f"{W.TR}.{i}."
            pairs = [("norm1_w", "norm1.weight"), ("norm1_b", "norm1.bias"), ("norm2_w", "norm2.weight"),
                     ("norm2_b", "norm2.bias"), ("in_proj", "self_attn.in_projs.0.weight"),
                     ("out_proj", "self_attn.out_projs.0.weight"), ("linear1", "linear1.weight"),
                     ("linear2", "linear2.weight"), ("scale1", "layer_scale_1.scale"),
                     ("scale2", "layer_scale_2.scale")]
            for ours, theirs in pairs:
                getattr(layer, ours).copy_(sd[p + theirs])
        self._load_seanet(sd)
        return self

    def _load_seanet(self, sd: Dict[str, torch.Tensor]) -> None:
        idx = W.seanet_indices(self.cfg)
        dec = self.seanet

        def conv(i):
            return sd[f"decoder.model.{i}.conv.conv.weight"], sd[f"decoder.model.{i}.conv.conv.bias"]
        for (w, b), (sw, sb) in [((dec.w_in, dec.b_in), conv(idx["conv_in"])),
                                 ((dec.w_out, dec.b_out), conv(idx["conv_out"]))]:
            w.copy_(sw)
            b.copy_(sb)
        for s, stage in enumerate(dec.stages):
            pre = f"decoder.model.{idx[f'stage{s}.convtr']}.convtr.convtr."
            stage.w.copy_(sd[pre + "weight"])
            stage.b.copy_(sd[pre + "bias"])
            for j, res in enumerate(stage.res):
                pre = f"decoder.model.{idx[f'stage{s}.res{j}']}.block."
                res.w1.copy_(sd[pre + "1.conv.conv.weight"])
                res.b1.copy_(sd[pre + "1.conv.conv.bias"])
                res.w2.copy_(sd[pre + "3.conv.conv.weight"])
                res.b2.copy_(sd[pre + "3.conv.conv.bias"])

    # -- engine contract ---------------------------------------------------------------------------
    def clocks(self) -> Dict[str, Clock]:
        """One clock per rate the decoder runs at; each advances a whole second of frames per step."""
        cfg = self.cfg
        pattern = cfg.seconds_pattern()
        out = {}
        for key, units in cfg.units_per_frame().items():
            rate = cfg.frame_rate * units
            name = {"frames": "frames", "steps25": "steps25"}.get(key, f"{rate:g}hz")
            out[key] = Clock(name, tuple(p * units for p in pattern), rate_hz=rate)
        return out

    def regions(self, spec: Optional[SessionSpec] = None) -> List[Region]:
        cfg, ck = self.cfg, self.clocks()
        regs = [Region("up.partial", (1, cfg.dimension, None), ck["frames"], Fixed(cfg.upsample_stride),
                       stock_note=CONV_TR_NOTE, doc="x2 upsample overlap (no bias)")]
        regs += prefixed("tr", self.transformer.regions(ck["steps25"]))
        stage_clocks = [ck[f"rate{s}"] for s in range(len(cfg.ratios))]
        return regs + prefixed("dec", self.seanet.regions(ck["steps25"], stage_clocks))

    def spec(self, steps: Optional[int] = None, last_frames: Optional[int] = None) -> SessionSpec:
        """A session of ``steps`` seconds (None: open-ended live); ``last_frames``: a short last second."""
        last = {}
        if steps is not None and last_frames is not None:
            units = self.cfg.units_per_frame()
            last = {c.name: last_frames * units[k] for k, c in self.clocks().items()}
        return SessionSpec(steps=steps, last_advance=last, label=f"mimi {self.cfg.num_layers}x{self.cfg.dimension}")

    def example_inputs(self, plan: StepPlan, device, num_codebooks: int = 8) -> Dict[str, torch.Tensor]:
        n = plan.advances["frames"]
        return {"codes": example_randint(self.cfg.bins, (num_codebooks, n), device)}

    def step(self, state: StateView, inputs: Dict[str, torch.Tensor], plan: StepPlan) -> Dict[str, torch.Tensor]:
        return {"audio": self.decode_frames(state, inputs["codes"])}

    def uses(self, flag: str, default: bool = False, frames: Optional[int] = None) -> bool:
        """Whether ``flag`` is on (for a step of ``frames`` frames): as set explicitly, else as the self-check
        chose (for that frame count), else ``default``."""
        given = getattr(self, flag)
        return bool(given) if given is not None else self.chosen_for(frames).get(flag, default)

    def chosen_for(self, frames: Optional[int]) -> Dict[str, bool]:
        """The self-check's flags for a step of ``frames`` frames. A count no check has seen is checked now
        (:attr:`check_frames`) before it runs; inside a graph capture, or with no check to ask, it runs the
        reference order (every flag off)."""
        if frames is None or not self.chosen_at:
            return self.chosen
        got = self.chosen_at.get(frames)
        if got is None:
            capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
            if self.check_frames is None or capturing:
                return dict.fromkeys(self.chosen, False)
            got = self.chosen_at[frames] = self.check_frames(frames)
        return got

    def decode_frames(self, state: StateView, codes: torch.Tensor) -> torch.Tensor:
        """codes [K, n] -> audio [1, 1, n * frame_size] over the state handles.

        Frame by frame (each frame through every layer, as moshi), or on CUDA layer by layer over the
        whole second (``second.py``: the same bits with fewer, per-second elementwise kernels).
        """
        n = codes.shape[1]
        dec = state.under("dec")
        names = set(dec)

        def region(name: str) -> Optional[torch.Tensor]:
            return dec[name].get() if name in names else None
        caches = [state[f"tr.kv{i}"].get() for i in range(self.cfg.num_layers)]   # [2, 1, H, cap, Dh]
        tables = self.transformer.second_tables(state["tr.kv0"].position(), n)
        lat = self.rvq.latents(codes)                                              # [1, n, dim] per part
        uses = lambda flag, default=False: self.uses(flag, default, n)             # noqa: E731 - this step's count
        if uses("layer_major", codes.is_cuda):
            lat_n = torch.cat([self.rvq.frame(lat, f) for f in range(n)], dim=-1)    # [1, D, n]
            x = conv_tr_second(lat_n, state["up.partial"].get(), self.upsample, None, self.cfg.upsample_stride, n,
                               uses("batch_conv_tr"), groups=self.cfg.dimension).transpose(1, 2)   # [1, n*T, D]
            x = transformer_second(self.transformer, x, caches, tables, uses("batch_matmul"),
                                   uses("batch_matmul_strided"), uses("batch_attention"))
            return seanet_second(self.seanet, x.transpose(1, 2), region, n, uses("batch_conv"),
                                 uses("batch_conv_tr"))
        out = []
        for f in range(n):
            x = self.rvq.frame(lat, f)                                             # [1, D, 1]
            x = causal_conv_tr(x, state["up.partial"].get(), self.upsample, None,
                               self.cfg.upsample_stride, groups=self.cfg.dimension)   # [1, D, 2]
            x = self.transformer.frame(x, caches, tables, f)                       # [1, D, 2]
            out.append(self.seanet.frame(x, region))                               # [1, 1, frame_size]
        return torch.cat(out, dim=-1)
