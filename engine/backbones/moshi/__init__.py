"""The Moshi backbone: Kyutai's Moshi LM in front of the Mimi tail (the moshi package is imported only
when this backbone is built)."""
from .files import MoshiFiles, validate_folder

__all__ = ["MoshiFiles", "validate_folder"]
