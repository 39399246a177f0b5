"""Weights loaded once per host and shared by every session that runs the same model.

A key names what fixes the weights: which part (tail or backbone), the model's name, its size, the
device, the checkpoint, the seed of random weights, what the tail is conditioned on (its voice: the
shared modules hold the voice prompt, so two voices are two keys) and how the backbone has the tail built
(its flow-step count: the shared modules hold per-step constants). The first session of a key builds its
models the usual way; the host then asks them for their shareable modules (``shared_weights()``:
read-only while streaming) and keeps them here; the next sessions of that key are built around
them (``make_tail(shared=...)`` / ``make_backbone(shared=...)``) and load nothing. Everything
per-stream (state arenas, graphs, prompt copies, RNG) stays per session.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

import torch

from engine import registry
from engine.session import SessionConfig


@dataclass(frozen=True)
class WeightsKey:
    """What fixes a model's weights: part ("tail" | "backbone"), name, size, device, checkpoint, seed, the
    tail's conditioning (the voice file the resolved config chose; None: none, or the seeded prompt) and the
    options the backbone has its tail built with (``BackboneEntry.tail_options``: the shared Step-Audio2
    modules hold per-step constants, so MiniCPM-o's 5 flow steps and a plain pair's 10 are two keys)."""

    part: str
    name: str
    size: str
    device: str
    checkpoint: Optional[str]
    seed: int
    conditioning: Optional[str] = None
    options: Tuple[Tuple[str, object], ...] = ()     # how the backbone has its tail built (flow steps)

    @classmethod
    def tail(cls, cfg: SessionConfig) -> "WeightsKey":
        return cls("tail", cfg.tail, cfg.size, cfg.device, cfg.checkpoint, int(cfg.seed), cfg.voice,
                   registry.get_backbone(cfg.backbone).tail_options)

    @classmethod
    def backbone(cls, cfg: SessionConfig) -> "WeightsKey":
        return cls("backbone", cfg.backbone, cfg.size, cfg.device, cfg.backbone_checkpoint, int(cfg.seed))

    def label(self) -> str:
        src = self.checkpoint or f"seed {self.seed}"
        voice = f", voice {self.conditioning}" if self.conditioning else ""
        opts = "".join(f", {k}={v}" for k, v in self.options)
        return f"{self.part} {self.name} {self.size} on {self.device} ({src}{voice}{opts})"


def _tensors(value, depth: int = 0):
    """Tensors held by ``value``: a module's parameters, buffers and constants kept in plain attributes
    (lists of folded modulations, say), a tensor, or a small holder of tensors (a voice prompt)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, torch.nn.Module):
        yield from value.parameters()
        yield from value.buffers()
        for sub in value.modules():
            for attr in vars(sub).values():
                if isinstance(attr, (list, tuple)):
                    yield from _tensors(attr, depth + 1)
    elif isinstance(value, (list, tuple)) and depth < 4:
        for v in value:
            yield from _tensors(v, depth + 1)
    elif hasattr(value, "__dict__") and depth == 0:
        for v in vars(value).values():
            if isinstance(v, torch.Tensor):
                yield v


def module_bytes(values: Iterable[object], device: Optional[torch.device] = None) -> int:
    """Bytes of the storages behind ``values`` (each storage counted once), on ``device``'s type if given."""
    seen, total = set(), 0
    for v in values:
        for t in _tensors(v):
            if device is not None and t.device.type != torch.device(device).type:
                continue
            key = (t.untyped_storage().data_ptr(), str(t.device))
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


class WeightsCache:
    """Shared modules by :class:`WeightsKey` (thread-safe); reports what each key holds on its device."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: Dict[WeightsKey, Dict[str, object]] = {}
        self._hits: Dict[WeightsKey, int] = {}

    def get(self, key: WeightsKey) -> Optional[Dict[str, object]]:
        """The shared modules for ``key``, or None (the caller builds them and :meth:`put` s them)."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._hits[key] = self._hits.get(key, 0) + 1
            return found

    def put(self, key: WeightsKey, shared: Optional[Dict[str, object]]) -> None:
        """Keep ``shared`` (a model's ``shared_weights()``); None (cannot share) is ignored."""
        if shared is None:
            return
        with self._lock:
            self._entries.setdefault(key, shared)

    def keys(self):
        with self._lock:
            return list(self._entries)

    def bytes(self, key: WeightsKey) -> int:
        """Bytes the shared modules of ``key`` hold on its device."""
        with self._lock:
            shared = self._entries.get(key)
        return module_bytes(shared.values(), torch.device(key.device)) if shared else 0

    def report(self) -> Dict[str, Dict[str, int]]:
        """Per key: bytes on the device and how many sessions reused it."""
        return {k.label(): {"bytes": self.bytes(k), "reused": self._hits.get(k, 0)} for k in self.keys()}

    def retain(self, keep) -> int:
        """Drop every entry whose key is not in ``keep`` (its modules are freed once no session holds
        them); returns how many were dropped."""
        with self._lock:
            gone = [k for k in self._entries if k not in keep]
            for k in gone:
                del self._entries[k]
                self._hits.pop(k, None)
        return len(gone)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._hits.clear()
