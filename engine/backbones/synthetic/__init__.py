"""The synthetic backbone: a seeded voice-activity turn policy in front of a seeded random speech decoder.

Registers ``synthetic``, the default backbone: it pairs with any tail (it speaks the tail's own token
format) and has no weights to load. It declares no batched step: each hosted session runs its own LISTEN steps
on its own stream (a batched LISTEN was refused by the H200's bit check at every group size).
"""
from engine.registry import BackboneEntry, register_backbone

from .backbone import AudioEmbedder, SyntheticBackbone, mel_filterbank


def make(fmt, *, size: str, device, seed: int = 0, checkpoint=None, demand_sized: bool = True,
         graph_replay: bool = True, reply_seconds: int = 4, debug: bool = False, shared=None) -> SyntheticBackbone:
    """The synthetic backbone for a tail reading ``fmt`` (``checkpoint`` is always None: no weights)."""
    return SyntheticBackbone(fmt, size=size, device=device, seed=seed, demand_sized=demand_sized,
                             graph_replay=graph_replay, reply_seconds=reply_seconds, debug=debug, shared=shared)


register_backbone(BackboneEntry(name="synthetic", title="Synthetic (seeded policy, random weights)", make=make,
                                order=0))

__all__ = ["AudioEmbedder", "SyntheticBackbone", "mel_filterbank", "make"]
