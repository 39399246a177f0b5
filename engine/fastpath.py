"""Faster paths whose bits depend on the GPU or its libraries, enabled only after a start-up self-check.

Some ways of running a decoder do the same arithmetic in fewer, larger library calls (one cuDNN
convolution over a whole second instead of one per frame, one GEMM over a whole batch). Whether
the library then picks a kernel that sums in the same order, and so keeps every output bit, is up
to its heuristics on this GPU with this cuDNN / cuBLAS: exact on one machine, a few ulps off on
the next. Such a path is therefore never assumed. At start-up the engine runs a short trial at
the real shapes on the real device, the reference path and the candidate on the same fresh random
inputs (the caller makes them: never zeros), and enables the candidate only when every output
tensor is ``torch.equal`` to the reference's. The verdict (chosen or refused, and why) is cached
for the process per (path, device name, torch / CUDA / cuDNN / cuBLAS versions, model config),
optionally on disk (``DUPLEXCADENCE_FASTPATH_CACHE``), and goes into the session info.

Usage (one call per path)::

    verdict = fastpath.self_check("batched convs", device, cfg, trial)   # trial(on: bool) -> tensors
    model.batch_conv = verdict.chosen

A check that must compare on its own (the host's batched LISTEN against each session's own steps)
uses :func:`decide` with ``check() -> (identical, why)`` instead.

``DUPLEXCADENCE_REFERENCE_PATHS=1`` (or ``--reference-paths`` on the command line, which calls
:func:`force_reference`) keeps every decoder on its reference path, without running the checks.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

#: "1" (or "yes"/"true"): every decoder stays on its reference path
ENV_FORCE = "DUPLEXCADENCE_REFERENCE_PATHS"
#: "1": keep verdicts on disk in the user's cache folder; a path: keep them in that file
ENV_CACHE = "DUPLEXCADENCE_FASTPATH_CACHE"

Outputs = Union[torch.Tensor, Sequence["Outputs"], Mapping[str, "Outputs"]]

_lock = threading.Lock()
_cache: Dict[str, "Verdict"] = {}
_forced: Optional[bool] = None


@dataclass(frozen=True)
class Verdict:
    """Whether one faster path runs here, and why (one line for people: :meth:`line`)."""

    path: str                              # "batched convs"
    chosen: bool                           # True: the faster path runs
    reason: str                            # "bit-identical to the reference (...)" / "max abs diff 5.96e-08 ..."
    max_abs_diff: Optional[float] = None   # None when nothing was compared
    cached: bool = False                   # the verdict came from an earlier check (this process or the disk)

    def line(self) -> str:
        """``batched convs: on — bit-identical to the reference (...)``."""
        return f"{self.path}: {'on' if self.chosen else 'off'} — {self.reason}{' (cached)' if self.cached else ''}"

    def as_dict(self) -> Dict[str, object]:
        return asdict(self)


# -- the user's override ---------------------------------------------------------------------------------
def force_reference(on: Optional[bool] = True) -> None:
    """Keep every decoder on its reference path (True), allow checked faster paths (False), or
    follow ``$DUPLEXCADENCE_REFERENCE_PATHS`` again (None). Applies to streams started afterwards."""
    global _forced
    _forced = None if on is None else bool(on)


def reference_forced() -> bool:
    """Whether the user asked for the reference paths (the call wins over the environment)."""
    if _forced is not None:
        return _forced
    return os.environ.get(ENV_FORCE, "").strip().lower() in ("1", "yes", "true", "on")


# -- what the bits depend on -----------------------------------------------------------------------------
def environment(device: Union[str, torch.device]) -> Dict[str, str]:
    """Device name and library versions that decide which kernels run (part of every cache key)."""
    dev = torch.device(device)
    env = {"torch": torch.__version__, "device": dev.type}
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        env.update(device=props.name, capability=f"{props.major}.{props.minor}",
                   cuda=str(torch.version.cuda), cudnn=str(torch.backends.cudnn.version()),
                   cublas=_cublas_version(), tf32=f"{torch.backends.cuda.matmul.allow_tf32}/"
                                                   f"{torch.backends.cudnn.allow_tf32}",
                   cudnn_benchmark=str(torch.backends.cudnn.benchmark),
                   cudnn_deterministic=str(torch.backends.cudnn.deterministic))
    else:
        env.update(threads=str(torch.get_num_threads()), mkldnn=str(torch.backends.mkldnn.is_available()))
    return env


def _cublas_version() -> str:
    """cuBLAS's own version where torch exposes it, else the CUDA toolkit it ships with."""
    getter = getattr(torch._C, "_cuda_getCublasVersion", None) or getattr(torch.cuda, "get_cublas_version", None)
    try:
        return str(getter()) if getter is not None else f"cuda {torch.version.cuda}"
    except Exception:                      # a build without it: the toolkit version stands in
        return f"cuda {torch.version.cuda}"


def cache_key(path: str, device: Union[str, torch.device], config: object) -> str:
    """One string naming the path, the device and libraries, and the model config (its ``repr``)."""
    return json.dumps({"path": path, "env": environment(device), "config": repr(config)}, sort_keys=True)


def clear_cache() -> None:
    """Forget this process's verdicts (tests; the disk cache stays)."""
    with _lock:
        _cache.clear()


# -- comparing outputs -----------------------------------------------------------------------------------
def _flatten(out: Outputs, name: str = "out") -> List[Tuple[str, torch.Tensor]]:
    if isinstance(out, torch.Tensor):
        return [(name, out)]
    if isinstance(out, Mapping):
        return [p for k in out for p in _flatten(out[k], f"{name}.{k}")]
    if isinstance(out, (list, tuple)):
        return [p for i, v in enumerate(out) for p in _flatten(v, f"{name}[{i}]")]
    raise TypeError(f"a self-check trial must return tensors (or lists / dicts of them), got {type(out).__name__}")


def compare(reference: Outputs, candidate: Outputs) -> Tuple[bool, str, Optional[float]]:
    """(identical, why, max abs diff) of two trials' outputs, tensor by tensor with ``torch.equal``."""
    ref, cand = _flatten(reference), _flatten(candidate)
    if [n for n, _ in ref] != [n for n, _ in cand]:
        return False, "the candidate returns other outputs than the reference", None
    if not ref:
        return False, "the trial returned no tensors: nothing was proven", None
    if all(t.is_floating_point() and not bool(t.ne(0).any()) for _, t in ref):
        return False, "the reference outputs are all zero: the trial proves nothing", None
    worst, first = 0.0, ""
    for (name, a), (_, b) in zip(ref, cand):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False, f"{name}: shape/dtype {tuple(b.shape)} {b.dtype} != {tuple(a.shape)} {a.dtype}", None
        if not torch.equal(a, b):
            d = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
            first = first or name
            worst = max(worst, d)
    if first:
        return False, f"max abs diff {worst:.3g} (first in {first})", worst
    n = sum(t.numel() for _, t in ref)
    return True, f"bit-identical to the reference ({len(ref)} tensors, {n} values)", 0.0


# -- the check -------------------------------------------------------------------------------------------
def self_check(path: str, device: Union[str, torch.device], config: object, trial: Callable[[bool], Outputs],
               not_applicable: Optional[str] = None) -> Verdict:
    """Decide whether faster path ``path`` runs: ``trial(False)`` (reference) against ``trial(True)``.

    ``trial(on)`` runs the decoder at the real shapes on ``device`` from the same fresh random inputs
    and state each time and returns its outputs (and final state, where it has one). ``config``
    names everything besides the device that decides the shapes (a model config, codebooks...).
    ``not_applicable``: why the path cannot run here at all (reported, never checked). The
    verdict is cached per :func:`cache_key`; a trial that raises refuses the path with its error.
    """
    return _decided(path, device, config, lambda: _run(path, trial), not_applicable)


def decide(path: str, device: Union[str, torch.device], config: object, check: Callable[[], Tuple[bool, str]],
           not_applicable: Optional[str] = None) -> Verdict:
    """:func:`self_check` for a check that runs both paths and compares them itself (several
    streams against one batched step, say): ``check()`` -> (bit-identical, why). Cached, overridden
    and reported the same way; a check that raises refuses the path with its error."""
    def run() -> Verdict:
        try:
            with torch.no_grad():
                ok, why = check()
        except Exception as e:
            return Verdict(path, False, f"the check failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return Verdict(path, bool(ok), why)
    return _decided(path, device, config, run, not_applicable)


def _decided(path: str, device: Union[str, torch.device], config: object, run: Callable[[], Verdict],
             not_applicable: Optional[str]) -> Verdict:
    if reference_forced():
        return Verdict(path, False, f"reference path forced by the user ({ENV_FORCE} / --reference-paths)")
    if not_applicable:
        return Verdict(path, False, f"not applicable: {not_applicable}")
    key = cache_key(path, device, config)
    with _lock:
        hit = _cache.get(key)
    if hit is None:
        hit = _disk_get(key)
        if hit is not None:
            with _lock:
                _cache[key] = hit
    if hit is not None:
        return replace(hit, cached=True)
    verdict = run()
    with _lock:
        _cache[key] = verdict
    _disk_put(key, verdict)
    return verdict


def _run(path: str, trial: Callable[[bool], Outputs]) -> Verdict:
    try:
        with torch.no_grad():
            ref = trial(False)
            cand = trial(True)
            ok, why, diff = compare(ref, cand)
            if not ok and diff is not None:
                again, _, d2 = compare(ref, trial(False))
                if not again:
                    why = f"the reference path does not repeat its own bits here (max abs diff {d2:.3g})"
    except Exception as e:                 # e.g. a library refuses the larger call: the reference stays
        return Verdict(path, False, f"the check failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    return Verdict(path, ok, why, diff)


# -- the optional disk cache -----------------------------------------------------------------------------
def disk_cache_file() -> Optional[Path]:
    """The verdicts file named by ``$DUPLEXCADENCE_FASTPATH_CACHE`` (None: no disk cache)."""
    v = os.environ.get(ENV_CACHE, "").strip()
    if not v or v.lower() in ("0", "no", "false", "off"):
        return None
    if v.lower() in ("1", "yes", "true", "on"):
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        return base / "duplexcadence" / "fastpath.json"
    return Path(v).expanduser()


def _disk_read(f: Path) -> Dict[str, dict]:
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):          # missing or unreadable: checked again, and rewritten
        return {}


def _disk_get(key: str) -> Optional[Verdict]:
    f = disk_cache_file()
    if f is None:
        return None
    v = _disk_read(f).get(key)
    try:
        return Verdict(str(v["path"]), bool(v["chosen"]), str(v["reason"]),
                       None if v.get("max_abs_diff") is None else float(v["max_abs_diff"]))
    except (TypeError, KeyError, ValueError):
        return None


def _disk_put(key: str, verdict: Verdict) -> None:
    f = disk_cache_file()
    if f is None or verdict.reason.startswith("the check failed"):
        return
    from engine.atomic import atomic_write
    with _lock:
        data = _disk_read(f)
        data[key] = {k: v for k, v in verdict.as_dict().items() if k != "cached"}
        try:
            atomic_write(f, lambda fh: json.dump(data, fh, indent=1, sort_keys=True), text=True)
        except OSError:                    # a read-only cache folder costs a check per process, nothing more
            pass


def lines(verdicts: Sequence[Verdict]) -> List[str]:
    """The verdicts as lines for the session info, the CLI and the app."""
    return [v.line() for v in verdicts]
