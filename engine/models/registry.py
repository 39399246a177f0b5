"""The decoder registry is :mod:`engine.registry` (decoders and backbones, one list); this name stays for
code that imports ``engine.models.registry``: it is the same module object."""
import sys

from engine import registry as _registry

sys.modules[__name__] = _registry
