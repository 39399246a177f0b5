"""Where two runs of a duplex session part: per-second digests of every stage, and the first difference.

``duplexcadence-bench session`` compares its modes bit for bit. The waveform alone says *that* two modes
differ, not where: a near-tie token sampled differently at second 14 changes every later second. So each
second keeps a SHA-1 of the bytes of what every stage made, in the order the stages run:

``encoder`` (the audio tokens of LISTEN), ``llm_logits`` (the LLM's logits row after the prefill and after
every decode step, one digest each), ``text`` (the decision and the text tokens), ``tts_logits`` (every TTS
step's logits), ``codes`` (the TTS's speech codes), ``tokens`` (what the decoder tail was handed) and
``audio`` (what the speaker got). A backbone offers the model stages through ``set_tap(fn)``; the
session bench adds ``tokens``, ``text`` and ``audio`` for every backbone. :func:`divergence` names the
first second, stage and item at which a run differs from the reference, and the first second each stage
differs at all (a TTS logit that moves by an ulp may never change a code).

Tensors are held by reference while the second runs (the stages hand over fresh tensors) and digested
after the second's timing stopped; the bench keeps that time off its virtual clock.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

STAGES = ("encoder", "llm_logits", "text", "tts_logits", "codes", "tokens", "audio")


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-1 (first 16 hex digits) of a tensor's dtype, shape and bytes."""
    t = t.detach()
    h = hashlib.sha1(f"{t.dtype}{tuple(t.shape)}".encode())
    flat = t.contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    h.update(flat.view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def bytes_digest(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:16]


def magnitude(t: torch.Tensor) -> Optional[float]:
    """Sum of |x| in float64 (floating tensors): how far apart two differing digests are."""
    if not t.is_floating_point():
        return None
    return float(t.detach().double().abs().sum())


class StageTap:
    """Collects ``(stage, tensor)`` pairs during a second; :meth:`second` digests and clears them."""

    def __init__(self) -> None:
        self.items: List[Tuple[str, torch.Tensor]] = []

    def __call__(self, stage: str, t: torch.Tensor) -> None:
        self.items.append((stage, t))

    def second(self, index: int, decision: str, text: str, audio: np.ndarray) -> Dict[str, object]:
        """The second's record: ``stages`` {stage: [digest, ...]} and ``l1`` {stage: [sum |x|, ...]}."""
        stages: Dict[str, List[str]] = {}
        l1: Dict[str, List[float]] = {}
        for stage, t in self.items:
            stages.setdefault(stage, []).append(tensor_digest(t))
            m = magnitude(t)
            if m is not None:
                l1.setdefault(stage, []).append(m)
        self.items = []
        stages["text"] = [bytes_digest(f"{decision}|{text}".encode())]
        a = np.ascontiguousarray(audio, dtype=np.float32)
        stages["audio"] = [bytes_digest(a.tobytes())]
        l1["audio"] = [float(np.abs(a.astype(np.float64)).sum())]
        return {"second": int(index), "decision": decision, "stages": stages, "l1": l1}


def _first_item(x: Sequence[str], y: Sequence[str]) -> int:
    for i, (a, b) in enumerate(zip(x, y)):
        if a != b:
            return i
    return min(len(x), len(y))


def divergence(ref: Sequence[Dict[str, object]], run: Sequence[Dict[str, object]]) -> Dict[str, object]:
    """Where ``run`` first differs from ``ref`` over their common seconds.

    ``second`` / ``stage`` / ``item``: the first differing second, the earliest stage (in :data:`STAGES`
    order) that differs in it and the index of its first differing digest (None when identical);
    ``ref_l1`` / ``l1``: sum |x| of that item in both runs; ``by_stage``: the first second each stage
    differs (None: identical throughout); ``seconds``: how many seconds were compared."""
    out: Dict[str, object] = {"seconds": min(len(ref), len(run)), "second": None, "stage": None, "item": None,
                              "ref_l1": None, "l1": None, "by_stage": {s: None for s in STAGES}}
    by_stage = out["by_stage"]
    for a, b in zip(ref, run):
        sa, sb = a["stages"], b["stages"]
        for stage in STAGES:
            x, y = sa.get(stage, []), sb.get(stage, [])
            if x == y:
                continue
            if by_stage[stage] is None:
                by_stage[stage] = a["second"]
            if out["second"] is None:
                i = _first_item(x, y)
                la, lb = a["l1"].get(stage, []), b["l1"].get(stage, [])
                out.update(second=a["second"], stage=stage, item=i,
                           ref_l1=la[i] if i < len(la) else None, l1=lb[i] if i < len(lb) else None)
    return out


def describe(label: str, ref_label: str, d: Dict[str, object]) -> str:
    """One line: where ``label`` first differs from ``ref_label`` and from which second each stage does."""
    if d["second"] is None:
        return f"{label}: identical to {ref_label} at every stage over {d['seconds']} s"
    item = f" #{d['item']}" if d["stage"] in ("llm_logits", "tts_logits") else ""
    mag = ""
    if d["ref_l1"] is not None and d["l1"] is not None:
        rel = abs(d["l1"] - d["ref_l1"]) / max(abs(d["ref_l1"]), 1e-30)
        mag = f" (sum |x| differs by {rel:.1e} relative)"
    stages = ", ".join(f"{s} from {k}" for s, k in d["by_stage"].items() if k is not None)
    return (f"{label} vs {ref_label}: first difference at second {d['second']}, stage {d['stage']}{item}{mag}; "
            f"{stages}")
