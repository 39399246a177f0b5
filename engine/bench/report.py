"""What every ``duplexcadence-bench`` command leaves behind: ``NAME.json``, ``NAME.md`` and ``NAME.png`` side by side.

The JSON carries a ``provenance`` object (:mod:`engine.bench.provenance`: commit, device, driver, torch /
CUDA / cuDNN / cuBLAS versions and the exact command), added here, so every bench records it without asking.
The markdown file holds the command line, the machine and the same aligned table the command printed; the
PNG is a plot people can paste into a report. Plots use matplotlib with its file-only Agg backend (the
``bench`` extra); without matplotlib the JSON and markdown are still written and one line says why the PNG
is missing. Nothing here imports Qt.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from engine.atomic import atomic_write
from engine.bench import provenance


def say(msg: str) -> None:
    """A progress line of a bench, on stderr (stdout carries its report)."""
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Bars:
    """A grouped bar chart: one group per label, one bar per series (e.g. median and p90 per mode)."""

    title: str
    ylabel: str
    labels: List[str]
    series: Dict[str, List[float]]
    hline: Optional[Tuple[float, str]] = None          # (y, label): a reference line such as a deadline


@dataclass
class Lines:
    """Lines over a common x axis (e.g. ms per second over the session, one line per mode)."""

    title: str
    xlabel: str
    ylabel: str
    series: Dict[str, Sequence[float]]
    hline: Optional[Tuple[float, str]] = None


@dataclass
class Figure:
    """One PNG: panels side by side."""

    panels: List[object] = field(default_factory=list)


def _write(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def machine() -> Dict[str, str]:
    """Where the numbers came from."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {"python": platform.python_version(), "torch": torch.__version__, "gpu": gpu,
            "cpu": platform.processor() or platform.machine(), "cores": str(os.cpu_count())}


def command_line(prog: str, argv: Sequence[str]) -> str:
    return " ".join([prog] + [shlex.quote(a) for a in argv])


def progressive_json(path: Path, prog: str, command: str) -> Optional[Callable[[Dict], None]]:
    """A ``dump(doc)`` that rewrites ``path`` with ``doc`` (plus the command and the run's provenance) as a run
    goes, so a run cut short keeps what it had; tried once here. None (after one error line) when ``path``
    cannot be written."""
    origin = provenance.record(command)

    def dump(doc: Dict) -> None:
        doc["command"] = command
        doc.setdefault("provenance", origin)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
    try:
        dump({})
    except OSError as e:
        print(f"{prog}: error: cannot write {path}: {e.strerror or e}", file=sys.stderr)
        return None
    return dump


def siblings(json_path: Path) -> Tuple[Path, Path]:
    """``x.json`` -> (``x.md``, ``x.png``)."""
    stem = json_path.with_suffix("") if json_path.suffix == ".json" else json_path
    return stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".png")


def markdown(title: str, command: str, tables: Sequence[Tuple[str, str]], notes: Sequence[str] = ()) -> str:
    """A shareable report: heading, command, machine, then each (caption, table)."""
    m = machine()
    gpu = "no GPU" if m["gpu"] == "none" else m["gpu"]
    out = [f"# {title}", "", f"Command: `{command}`", "",
           f"Machine: {gpu}; CPU {m['cpu']} x{m['cores']}; Python {m['python']}; torch {m['torch']}", ""]
    for caption, tab in tables:
        if caption:
            out += [f"**{caption}**", ""]
        out += [tab, ""]
    out += [f"- {n}" for n in notes]
    return "\n".join(out).rstrip() + "\n"


def _draw(ax, panel) -> None:
    if isinstance(panel, Bars):
        n = max(1, len(panel.series))
        width = 0.8 / n
        for i, (name, values) in enumerate(panel.series.items()):
            xs = [j + (i - (n - 1) / 2) * width for j in range(len(panel.labels))]
            bars = ax.bar(xs, values, width, label=name)
            ax.bar_label(bars, labels=[f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" for v in values], fontsize=7)
        ax.set_xticks(range(len(panel.labels)), [textwrap.fill(x, 16) for x in panel.labels], fontsize=8)
        ax.set_ylabel(panel.ylabel)
    elif isinstance(panel, Lines):
        for name, values in panel.series.items():
            ax.plot(range(len(values)), list(values), label=name, linewidth=1.2)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
    else:
        raise TypeError(f"unknown panel {type(panel).__name__}")
    if panel.hline is not None:
        ax.axhline(panel.hline[0], color="red", linestyle="--", linewidth=1, label=panel.hline[1])
    ax.set_title(panel.title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    if len(panel.series) > 1 or panel.hline is not None:
        ax.legend(fontsize=8)


def _width(panel) -> float:
    """Inches for one panel: bar charts get about an inch per group so their wrapped labels do not collide."""
    return max(5.5, 1.0 + 1.0 * len(panel.labels)) if isinstance(panel, Bars) else 5.5


def render_png(fig: Figure, path: Path) -> Optional[str]:
    """Draw ``fig`` to ``path``; returns None, or why no PNG was written (matplotlib missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg", force=True)
        from matplotlib.figure import Figure as MplFigure
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        return "no PNG plot: matplotlib is not installed (pip install 'duplexcadence[bench]')"
    import io
    n = max(1, len(fig.panels))
    widths = [_width(p) for p in fig.panels] or [5.5]
    mfig = MplFigure(figsize=(sum(widths), 4.2), layout="constrained")
    FigureCanvasAgg(mfig)
    axes = mfig.subplots(1, n, squeeze=False, width_ratios=widths)[0]
    for ax, panel in zip(axes, fig.panels):
        _draw(ax, panel)
    buf = io.BytesIO()
    mfig.savefig(buf, format="png", dpi=110)
    _write(path, buf.getvalue())
    return None


def stamp(json_path: Path, command: Optional[str] = None) -> bool:
    """Add the run's provenance to a JSON a bench wrote by itself (a JSON object without one); False when there is
    no such file or it already has one. The file is rewritten atomically."""
    path = Path(json_path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict) or "provenance" in doc:
        return False
    doc["provenance"] = provenance.record(command or doc.get("command"))
    _write(path, (json.dumps(doc, indent=1, default=str) + "\n").encode())
    return True


def write_all(json_path: Path, doc: Dict, md: str, fig: Optional[Figure], command: Optional[str] = None) -> List[Path]:
    """Write ``x.json`` (``doc`` with its ``provenance``: ``command``, else the doc's own ``command``, else this
    process's command line), ``x.md`` and (when ``fig``) ``x.png``; returns the paths written. A missing
    matplotlib is reported on stderr in one line, not raised."""
    if "provenance" not in doc:
        doc = {**doc, "provenance": provenance.record(command or doc.get("command"))}
    json_path = Path(json_path)
    try:
        json_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"cannot write {json_path}: {json_path.parent} is not a folder we can create "
                      f"({e.strerror or e})") from None
    md_path, png_path = siblings(json_path)
    _write(json_path, (json.dumps(doc, indent=1, default=str) + "\n").encode())
    _write(md_path, md.encode())
    written = [json_path, md_path]
    if fig is not None and fig.panels:
        why = render_png(fig, png_path)
        if why:
            print(f"note: {why}", file=sys.stderr)
        else:
            written.append(png_path)
    return written
