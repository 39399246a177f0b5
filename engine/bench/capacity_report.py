"""What the capacity bench prints and leaves beside its JSON: the table, the markdown, the plot.

The table has one row per mode and count held (mean and p99 second, late seconds, the GPU's busy share, the
scheduler's batches, MiB per session) and the stock loop's row first where it ran. The plot has one panel per
count: every session's seconds (arrival to done) over the window, against the 1 s deadline.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from engine.session.records import DEADLINE_MS


def _rows(doc: Dict[str, object]) -> List[List[object]]:
    body = []
    stock = doc.get("stock_loop")
    if stock:
        body.append(stock_row(stock))
    for name, m in doc["modes"].items():
        if "steps" not in m:
            body.append([name, "-", "", "", "", "", "", "", m.get("error", "")])
            continue
        same = m.get("bit_identical_to_solo")
        for w in m["steps"]:
            batches = w["scheduler"]["batches"]
            mean = "; ".join(f"{v['members_mean']:.1f}/run" for v in batches.values()) or "-"
            busy = "-" if w.get("gpu_busy_percent") is None else f"{w['gpu_busy_percent']:.0f}"
            body.append([name, w["sessions"], f"{w['p50_ms']:.0f} / {w['mean_ms']:.0f}", f"{w['p99_ms']:.0f}",
                         f"{w['misses']} of {w['seconds']}", busy, mean,
                         f"{w['memory']['per_session_allocated_mib']:.0f}", "-" if same is None else str(same)])
    return body


def stock_row(r: Dict[str, object]) -> List[object]:
    """The stock loop's row: its worker's one session (on time or not), its p50 and p99 second, its late seconds,
    its process's peak memory (the reference)."""
    if "error" in r:
        return [r["label"], "its worker", "", "", "", "", "", "", r["error"]]
    ms = lambda x: "-" if x is None else f"{x:.0f}"                          # noqa: E731
    peak = "-" if r.get("peak_memory_bytes") is None else f"{r['peak_memory_bytes'] / 2**20:.0f} (peak)"
    return [r["label"], "its worker", ms(r.get("p50_total_ms")), ms(r.get("p99_total_ms")),
            f"{r['misses']} of {r['seconds']}", "-", "-", peak, "reference"]


def versus_stock(doc: Dict[str, object]) -> Optional[str]:
    """One line on the stock loop's count against our modes' (None without a stock-loop row)."""
    stock = doc.get("stock_loop")
    if not stock:
        return None
    if stock.get("max_sessions") is None:
        return f"stock loop: not measured ({stock['error']})"
    ours = "; ".join(f"{name} keeps {m['max_sessions']}" for name, m in doc["modes"].items() if "max_sessions" in m)
    return (f"stock loop keeps {stock['max_sessions']} session(s) on time ({stock['misses']} of "
            f"{stock['seconds']} s missed by its one session)" + (f"; {ours}" if ours else ""))


HEADS = ["mode", "sessions", "p50 / mean ms", "p99 ms", "late", "GPU busy %", "LLM batch", "MiB/session",
         "bit-identical"]


def table(doc: Dict[str, object], wrap: bool = True) -> str:
    """Per mode and count held: how its seconds kept the deadline, the device's load, memory and bits."""
    from engine.stats import table as aligned
    knees = [f"{name}: {m['max_sessions']} session(s) on time" for name, m in doc["modes"].items()
             if "max_sessions" in m]
    versus = versus_stock(doc)
    lines = (["; ".join(knees)] if knees else []) + ([versus] if versus else [])
    return "\n".join([aligned(_rows(doc), HEADS, max_widths=[40, 12] + [None] * 6 + [40], wrap=wrap)] + lines)


def write_markdown(doc: Dict[str, object], path: Path) -> None:
    """The table (one line per row) and the command, next to the JSON."""
    from engine.atomic import atomic_write
    from engine.bench import report
    notes = [f"{doc['tail']} + {doc['backbone']}, {doc['size']}, {doc['gpu']}, each count held {doc['seconds']:g} s; "
             f"commit {doc.get('provenance', {}).get('commit')}",
             f"reference: {doc['reference']} (every session, every second) and {doc['alone']} session(s) alone"]
    if doc.get("stock_loop"):
        notes.append(str(doc["stock_loop"].get("why", "")))
    md = report.markdown("Sessions one device keeps on time", str(doc["command"]), [("", table(doc, wrap=False))],
                         notes)
    atomic_write(path, lambda f: f.write(md), text=True)


def plot(doc: Dict[str, object], path: Path) -> str:
    """One panel per count held (of the first mode that ran): each session's seconds against the deadline."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    mode, m = next(((k, v) for k, v in doc["modes"].items() if v.get("steps")), (None, None))
    if m is None:
        return "plot skipped: no mode held a count"
    steps = m["steps"]
    fig, axes = plt.subplots(1, len(steps), figsize=(3.2 * len(steps), 3.4), dpi=110, squeeze=False, sharey=True)
    for ax, w in zip(axes[0], steps):
        for s in w["per_session"]:
            pts = s.get("series") or []
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.8, alpha=0.7)
        ax.axhline(DEADLINE_MS, ls="--", color="red", lw=1)
        ax.set_title(f"{w['sessions']} sessions: {w['misses']} late", fontsize=9)
        ax.set_xlabel("s into the window")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("arrival to done (ms)")
    fig.suptitle(f"{doc['backbone']} + {doc['tail']} ({doc['size']}, {doc['gpu']}), {mode}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return f"plot: {path}"
