"""The synthetic backbone: a seeded turn policy in front of a seeded random speech decoder."""
from .backbone import AudioEmbedder, SyntheticBackbone, mel_filterbank

__all__ = ["AudioEmbedder", "SyntheticBackbone", "mel_filterbank"]
