"""The synthetic backbone: a seeded voice-activity turn policy in front of a seeded random speech decoder.

Registers ``synthetic``, the default backbone: it pairs with any tail (it speaks the tail's own token
format) and has no weights to load. Its speech decoder's LISTEN steps may run batched across the hosted
sessions of one set of weights (``batched_steps``).
"""
from engine.registry import BackboneEntry, register_backbone

from .backbone import AudioEmbedder, SyntheticBackbone, mel_filterbank


def make(fmt, *, size: str, device, seed: int = 0, checkpoint=None, demand_sized: bool = True,
         graph_replay: bool = True, reply_seconds: int = 4, debug: bool = False, shared=None) -> SyntheticBackbone:
    """The synthetic backbone for a tail reading ``fmt`` (``checkpoint`` is always None: no weights)."""
    return SyntheticBackbone(fmt, size=size, device=device, seed=seed, demand_sized=demand_sized,
                             graph_replay=graph_replay, reply_seconds=reply_seconds, debug=debug, shared=shared)


register_backbone(BackboneEntry(name="synthetic", title="Synthetic (seeded policy, random weights)", make=make,
                                order=0, batched_steps=("listen",)))

__all__ = ["AudioEmbedder", "SyntheticBackbone", "mel_filterbank", "make"]
