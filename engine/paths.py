"""Where the bundled assets (icon, default prompts, small tables) live, from source or frozen.

From a source checkout (plain or ``pip install -e``) the assets are the repository's ``assets/``
folder, next to the ``engine`` and ``app`` packages. In the PyInstaller one-folder bundle they are
``<bundle>/_internal/assets`` (``sys._MEIPASS``), so the frozen app never reads the source tree.
``DUPLEXCADENCE_ASSETS`` overrides both (a folder you name).

Only the standard library is used here, so both ``engine`` and ``app`` may import it.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

#: environment variable naming an assets folder that overrides the built-in location
ENV_VAR = "DUPLEXCADENCE_ASSETS"


def is_frozen() -> bool:
    """True when running from a PyInstaller bundle (``sys.frozen`` and ``sys._MEIPASS`` set)."""
    return bool(getattr(sys, "frozen", False)) and hasattr(sys, "_MEIPASS")


def assets_dir() -> Path:
    """The assets folder: ``$DUPLEXCADENCE_ASSETS``, else the bundle's, else the repository's."""
    override = os.environ.get(ENV_VAR)
    if override:
        return Path(override)
    if is_frozen():
        return Path(getattr(sys, "_MEIPASS")) / "assets"
    return Path(__file__).resolve().parent.parent / "assets"


def asset(name: str) -> Path:
    """Path of the asset ``name`` (relative to the assets folder); one clear error if it is missing."""
    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"asset name must be relative to the assets folder, got {name!r}")
    path = assets_dir() / rel
    if not path.exists():
        raise FileNotFoundError(f"asset {name!r} not found in {assets_dir()} "
                                f"(set {ENV_VAR} to a folder that has it)")
    return path
