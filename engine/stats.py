"""Numbers for people, once for the whole product: percentiles, byte sizes, tables and progress.

The app (summary chips, per-stage statistics), the session records, the planner's report and every
``duplexcadence-bench`` command use these, so a p99 or a "41.0 MiB" means the same thing everywhere.
Tables are drawn by ``tabulate`` (GitHub-flavoured markdown: aligned on a terminal, rendered by any
markdown viewer); progress by ``tqdm`` on stderr. Engine code: no Qt here.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np

KIB = 1024
MIB = 1024 ** 2
GIB = 1024 ** 3


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linearly interpolated between the closest ranks (numpy's default
    method); 0.0 for no values."""
    if len(values) == 0:
        return 0.0
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def format_bytes(n: float) -> str:
    """Bytes for people: ``512 B``, ``3.2 KiB``, ``41.0 MiB``, ``2.14 GiB`` (binary units)."""
    n = float(n)
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str], floatfmt: str = ".1f",
          max_widths: Optional[Sequence[Optional[int]]] = None,
          header_width: Union[None, int, Sequence[Optional[int]]] = None,
          wrap: bool = True) -> str:
    """An aligned GitHub-markdown table. ``max_widths``: per column, wrap cells wider than this (None: no limit);
    ``header_width``: wrap headers wider than this (one width, or one per column). Both keep a table inside a terminal's width; a
    ``.md`` file wants ``wrap=False`` (one line per row, which markdown viewers lay out themselves)."""
    import tabulate as tabulate_module
    from tabulate import tabulate
    tabulate_module.MIN_PADDING = 0       # the GitHub format pads each cell by one space already
    rows = [list(r) for r in rows]
    kw: dict = {}
    if wrap and max_widths is not None and rows:
        kw["maxcolwidths"] = list(max_widths)
    if wrap and header_width is not None:
        kw["maxheadercolwidths"] = header_width if isinstance(header_width, int) else list(header_width)
    return tabulate(rows, headers=list(headers), tablefmt="github", floatfmt=floatfmt, **kw)


def progress(total: Optional[int] = None, desc: str = "", unit: str = "it", quiet: bool = False, **kw: Any):
    """A progress bar on stderr (tqdm); off when ``quiet``. Use as ``with progress(n) as bar: bar.update()``."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, disable=quiet, dynamic_ncols=True, leave=True, **kw)
