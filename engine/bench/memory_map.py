"""Where a CUDA process's reserved memory is: the caching allocator's segments grouped by who holds them.

``torch.cuda.max_memory_reserved`` says how much; this says whose. Every segment the allocator holds belongs to a
memory pool and was made for one stream:

* a **graph pool** (a private pool): the graphs one :class:`~engine.core.graphs.GraphRuntime` captured — the
  executor's (one per model), the LLM's and the TTS's layer graphs, the TTS's per-length decode graphs, the host's
  batched LISTEN — named by its runtime (:func:`engine.core.graphs.owners`);
* the **default pool on the default stream**: the weights, the state regions and every eager second's work;
* the **default pool on the capture stream** (:func:`engine.core.graphs.capture_stream`, the one every runtime's
  warm-ups and captures run on): what warm-ups left cached there (the allocator keeps a stream's freed blocks for
  that stream only, so no other stream's work can use them);
* the **default pool on another stream** (a hosted session's, a lane's), by its handle.

Per group: reserved bytes, the bytes in live tensors, and the rest (cached, free). The session bench writes one map
per mode after its run (``memory_map`` in bench.json) and prints the largest groups."""
from __future__ import annotations

from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import torch

from engine.stats import MIB

DEFAULT_POOL = (0, 0)


def owner_of(segment: Mapping[str, object], pools: Mapping[Tuple[int, int], str],
             streams: Mapping[int, str], default_stream: int = 0) -> str:
    """The group ``segment`` (one entry of ``torch.cuda.memory_snapshot()``) is counted in."""
    pool = tuple(int(x) for x in segment.get("segment_pool_id", DEFAULT_POOL))
    stream = int(segment.get("stream", 0))
    if pool != DEFAULT_POOL:
        name = pools.get(pool)
        return f"graph pool: {name}" if name else f"graph pool {pool}: not a runtime's"
    if stream == default_stream:
        return "default stream: weights, state, eager work"
    name = streams.get(stream)
    return f"cached on the {name}" if name else f"cached on stream {stream:#x}"


def group(segments: Iterable[Mapping[str, object]], pools: Mapping[Tuple[int, int], str],
          streams: Mapping[int, str], default_stream: int = 0) -> List[Dict[str, object]]:
    """Rows ``{owner, segments, reserved, in_use, free}`` (bytes), the largest reserved first."""
    rows: Dict[str, Dict[str, object]] = {}
    for seg in segments:
        key = owner_of(seg, pools, streams, default_stream)
        row = rows.setdefault(key, {"owner": key, "segments": 0, "reserved": 0, "in_use": 0, "free": 0})
        total, used = int(seg.get("total_size", 0)), int(seg.get("allocated_size", 0))
        if used < 0 or used > total:
            raise ValueError(f"a segment of {total} bytes says {used} are allocated")
        row["segments"] += 1
        row["reserved"] += total
        row["in_use"] += used
        row["free"] += total - used
    return sorted(rows.values(), key=lambda r: (-int(r["reserved"]), str(r["owner"])))


def totals(rows: List[Dict[str, object]]) -> Dict[str, int]:
    return {k: sum(int(r[k]) for r in rows) for k in ("segments", "reserved", "in_use", "free")}


def snapshot_map(device) -> Optional[Dict[str, object]]:
    """The map of ``device``'s segments now (None off CUDA): ``rows`` and ``total``."""
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    from engine.core import graphs
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    segments = [s for s in torch.cuda.memory_snapshot() if int(s.get("device", index)) == index]
    pools, streams = graphs.owners()
    default = int(torch.cuda.default_stream(index).cuda_stream)
    rows = group(segments, pools, streams, default)
    return {"rows": rows, "total": totals(rows)}


def format_map(label: str, doc: Optional[Dict[str, object]], top: int = 8) -> str:
    """The ``top`` largest groups of one mode's map, in MiB (empty without a map)."""
    if not doc:
        return ""
    rows, tot = doc["rows"], doc["total"]
    lines = [f"reserved memory by owner, {label}: {tot['reserved'] / MIB:,.0f} MiB in {tot['segments']} segments "
             f"({tot['in_use'] / MIB:,.0f} in live tensors, {tot['free'] / MIB:,.0f} cached free)"]
    width = max([len(str(r["owner"])) for r in rows[:top]] + [5])
    for r in rows[:top]:
        lines.append(f"  {str(r['owner']):<{width}}  {r['reserved'] / MIB:>9,.1f} MiB reserved  "
                     f"{r['in_use'] / MIB:>9,.1f} in use  {r['free'] / MIB:>8,.1f} free  ({r['segments']} segments)")
    if len(rows) > top:
        rest = rows[top:]
        lines.append(f"  ... {len(rest)} more groups: {sum(int(r['reserved']) for r in rest) / MIB:,.1f} MiB")
    return "\n".join(lines)
