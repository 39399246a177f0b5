"""Backbones: LISTEN + THINK in front of a decoder tail (``synthetic`` embedded default, ``moshi``)."""
from .base import Backbone, BackboneInfo, Thought, TokenFormat, make_backbone

__all__ = ["Backbone", "BackboneInfo", "Thought", "TokenFormat", "make_backbone"]
