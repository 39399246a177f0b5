"""Where a bench's numbers came from, recorded in its JSON at the run: commit, device, driver, libraries, command.

Every ``duplexcadence-bench`` JSON written through :func:`engine.bench.report.write_all` or
:func:`~engine.bench.report.progressive_json` carries a ``provenance`` object (:func:`record`): the commit of
the checkout that ran (with ``+ uncommitted changes`` when its tracked files differ from it), the device (the
GPU's name, or the CPU), the NVIDIA driver, the torch / CUDA / cuDNN / cuBLAS / Triton versions as the
fast-path self-check reads them (:func:`engine.fastpath.environment`), Python, and the exact command line. A
field that cannot be read here (no git in a bundle, no driver on a CPU machine) says so in words.
"""
from __future__ import annotations

import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

from engine import fastpath

ROOT = Path(__file__).resolve().parents[2]
#: how long a helper program (git, nvidia-smi) may take before its field reads "unknown"
TIMEOUT_S = 10.0
UNKNOWN = "unknown"


def _run(argv: Sequence[str]) -> Optional[str]:
    """A program's first output line, or None when it is missing, fails or hangs."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip().splitlines()
    return out[0].strip() if done.returncode == 0 and out else None


def commit() -> str:
    """The checkout's commit, marked when its tracked files have changes; words when it is not a git checkout."""
    head = _run(["git", "rev-parse", "HEAD"])
    if head is None:
        return f"{UNKNOWN} (not run from a git checkout)"
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return head + (" + uncommitted changes" if dirty else "")


def driver() -> str:
    """The NVIDIA driver's version (nvidia-smi, else the kernel module's), or why there is none."""
    smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if smi:
        return smi
    try:
        line = Path("/proc/driver/nvidia/version").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "none (no NVIDIA driver found)"
    words = [w for w in line.split() if w[:1].isdigit() and "." in w]
    return words[0] if words else line.strip()


def argv_command() -> str:
    """This process's own command line, for a bench that was not handed its command."""
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    if prog == "cli.py" and "engine" in sys.argv[0]:
        prog = "python -m engine.bench.cli"
    return " ".join([prog] + [shlex.quote(a) for a in sys.argv[1:]])


def record(command: Optional[str] = None) -> Dict[str, str]:
    """The provenance of a run in this process: see the module's docstring."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    env = fastpath.environment(device)
    cpu = platform.processor() or platform.machine()
    out = {"commit": commit(),
           "device": env["device"] if device == "cuda" else f"cpu ({cpu}, {env.get('cpu_capability', UNKNOWN)})",
           "driver": driver() if device == "cuda" else "none (CPU run)",
           "torch": env["torch"], "cuda": env.get("cuda", "none (CPU run)"),
           "cudnn": env.get("cudnn", "none (CPU run)"), "cublas": env.get("cublas", "none (CPU run)"),
           "triton": env.get("triton", UNKNOWN), "python": platform.python_version(),
           "command": command or argv_command(),
           "recorded": "by the bench, at the run"}
    return out
