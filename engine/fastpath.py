"""Faster paths whose bits depend on the GPU or its libraries, enabled only after a start-up self-check.

Some ways of running a decoder do the same arithmetic in fewer, larger library calls (one cuDNN
convolution over a whole second instead of one per frame, one GEMM over a whole batch). Whether
the library then picks a kernel that sums in the same order, and so keeps every output bit, is up
to its heuristics on this GPU with this cuDNN / cuBLAS: exact on one machine, a few ulps off on
the next. Such a path is therefore never assumed. At start-up the engine runs a short trial at
the real shapes on the real device, the reference path and the candidate on the same fresh random
inputs (the caller makes them: never zeros), and enables the candidate only when every output
tensor is ``torch.equal`` to the reference's. The trial runs the way production runs the path: on
CUDA eagerly and captured into a CUDA graph and replayed (:func:`production_modes`, :func:`replayed`).
A verdict holds for the shapes it was tried at: callers check each shape a path runs at (a short last
second, a group's size) before it runs there. The verdict (chosen or refused, and why) is cached for the
process per :func:`cache_key` (path and shape, device name, SM count and MIG slice, torch / CUDA / cuDNN /
cuBLAS / Triton versions, the CPU's instruction set, model config, and a hash of our code the trial runs),
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

import hashlib
import importlib.util
import json
import os
import re
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from engine.core.gate import GATE
from engine.core.graphs import GraphRuntime, release_cached

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
    scope: str = ""                        # where a chosen path runs, when not everywhere ("inside captured ...")

    def line(self) -> str:
        """``batched convs: on — bit-identical to the reference (...)`` (``on (inside captured graphs only)``
        for a path that runs only there)."""
        state = ("on" + (f" ({self.scope})" if self.scope else "")) if self.chosen else "off"
        return f"{self.path}: {state} — {self.reason}{' (cached)' if self.cached else ''}"

    def as_dict(self) -> Dict[str, object]:
        return asdict(self)


_LENGTH = re.compile(r"^(.*) \((\d+) frames\)$")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def summarize(verdicts: Sequence[Verdict]) -> List[str]:
    """The verdicts as few lines for people: a path checked at many lengths (``... (14 frames)``) is one line per
    state and kind of reason, its lengths as ranges (``(1-24, 26, 50 frames)``); where the reasons differ only
    in their numbers (a max abs diff per length) the largest difference is given. Order: first appearance."""
    groups: Dict[tuple, List[Tuple[int, Verdict]]] = {}
    for v in verdicts:
        m = _LENGTH.match(v.path)
        base, n = (m.group(1), int(m.group(2))) if m else (v.path, -1)
        key = (base, v.chosen, v.scope, v.cached, _NUMBER.sub("#", v.reason))
        groups.setdefault(key, []).append((n, v))
    lines = []
    for (base, *_), members in groups.items():
        first = members[0][1]
        lengths = sorted({n for n, _ in members if n >= 0})
        path = f"{base} ({_ranges(lengths)} frames)" if lengths else base
        reason = first.reason
        diffs = [v.max_abs_diff for _, v in members if v.max_abs_diff is not None]
        if len({v.reason for _, v in members}) > 1 and diffs:
            reason = f"{reason}; largest over {len(members)} lengths {max(diffs):.3g}"
        lines.append(replace(first, path=path, reason=reason).line())
    return lines


def _ranges(values: List[int]) -> str:
    """Sorted lengths as runs of one step: [1, 2, 3, 5, 10, 12, 14, 16, 300] -> "1-3, 5, 10-16 by 2, 300"."""
    out, i = [], 0
    while i < len(values):
        j = i + 1
        if j < len(values):
            step = values[j] - values[i]
            while j + 1 < len(values) and values[j + 1] - values[j] == step:
                j += 1
        if j < len(values) and (j - i >= 2 or values[j] == values[i] + 1):
            by = values[i + 1] - values[i]
            out.append(f"{values[i]}-{values[j]}" + (f" by {by}" if by > 1 else ""))
            i = j + 1
        else:
            out.append(str(values[i]))
            i += 1
    return ", ".join(out)


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
    """What decides which kernels run and how they sum (part of every cache key): the device (name, SM
    count, MIG slice) and the library versions (torch, CUDA, cuDNN, cuBLAS, Triton); on the CPU the
    instruction set MKL and PyTorch dispatch to (AVX-512 and AVX2 kernels round some products differently)."""
    dev = torch.device(device)
    env = {"torch": torch.__version__, "device": dev.type, "triton": _triton_version()}
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        env.update(device=props.name, capability=f"{props.major}.{props.minor}",
                   sm_count=str(props.multi_processor_count), mig=_mig_profile(props),
                   memory=str(props.total_memory),
                   cuda=str(torch.version.cuda), cudnn=str(torch.backends.cudnn.version()),
                   cublas=_cublas_version(), blas=str(torch.backends.cuda.preferred_blas_library()),
                   tf32=f"{torch.backends.cuda.matmul.allow_tf32}/"
                                                   f"{torch.backends.cudnn.allow_tf32}",
                   cudnn_benchmark=str(torch.backends.cudnn.benchmark),
                   cudnn_deterministic=str(torch.backends.cudnn.deterministic))
    else:
        env.update(threads=str(torch.get_num_threads()), mkldnn=str(torch.backends.mkldnn.is_available()),
                   cpu_capability=_cpu_capability(),
                   mkl_instructions=os.environ.get("MKL_ENABLE_INSTRUCTIONS", ""))
    return env


def _mig_profile(props: object) -> str:
    """The MIG slice a device is (its name carries the profile, e.g. ``... MIG 1g.10gb``; its UUID starts
    with ``MIG-``), or ``none`` for a whole GPU."""
    name = str(getattr(props, "name", ""))
    if "MIG" in name:
        return name[name.index("MIG"):].strip()
    uuid = str(getattr(props, "uuid", "") or "")
    return "MIG" if uuid.upper().startswith("MIG") else "none"


def _triton_version() -> str:
    """Triton's installed version, read from its metadata (Triton itself is not imported), or ``absent``."""
    from importlib import metadata
    for dist in ("triton", "pytorch-triton"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "absent"


def _cpu_capability() -> str:
    getter = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return str(getter()) if getter is not None else "unknown"


def _cublas_version() -> str:
    """cuBLAS's own version: where torch exposes it, else asked of the libcublas this process loaded
    (``cublasGetProperty``), else the CUDA toolkit it ships with."""
    getter = getattr(torch._C, "_cuda_getCublasVersion", None) or getattr(torch.cuda, "get_cublas_version", None)
    try:
        if getter is not None:
            return str(getter())
        return _loaded_cublas_version() or f"cuda {torch.version.cuda}"
    except Exception:                      # a build without it: the toolkit version stands in
        return f"cuda {torch.version.cuda}"


def _loaded_cublas_version() -> Optional[str]:
    """``major.minor.patch`` of the libcublas mapped into this process (Linux), or None."""
    import ctypes
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines()
                    if "/libcublas.so" in line and "libcublasLt" not in line})
    if not paths:
        return None
    lib = ctypes.CDLL(paths[0])
    parts = []
    for prop in (0, 1, 2):                 # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        v = ctypes.c_int()
        if lib.cublasGetProperty(prop, ctypes.byref(v)) != 0:
            return None
        parts.append(str(v.value))
    return ".".join(parts)


_code_hashes: Dict[Tuple[str, ...], str] = {}


def code_hash(modules: Sequence[str]) -> str:
    """A hash of our own code that a path's trial runs: every source (or, in a frozen app, bytecode) file
    of each named module or package, so that rewriting a kernel retires the verdicts cached for the old one."""
    key = tuple(sorted(set(modules)))
    got = _code_hashes.get(key)
    if got is None:
        h = hashlib.sha256()
        for name in key:
            h.update(name.encode())
            for f in _module_files(name):
                h.update(f.name.encode())
                try:
                    h.update(f.read_bytes())
                except OSError:            # unreadable: its name still counts
                    pass
        got = _code_hashes[key] = h.hexdigest()[:16]
    return got


def _module_files(name: str) -> List[Path]:
    """The files of module or package ``name`` (a package: its .py / .pyc files, recursively), sorted."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return []
    if spec.submodule_search_locations:
        files = [f for d in spec.submodule_search_locations for f in Path(d).rglob("*")
                 if f.suffix in (".py", ".pyc") and "__pycache__" not in f.parts]
        return sorted(files)
    return [Path(spec.origin)] if spec.origin and Path(spec.origin).is_file() else []


def code_of(fn: Callable) -> Tuple[str, ...]:
    """The code a trial runs by default: the package its function was written in, the engine core (the
    executor, arenas) and this module."""
    module = getattr(fn, "__module__", None) or "engine"
    package = module.rsplit(".", 1)[0] if "." in module else module
    return (package, "engine.core", __name__)


def cache_key(path: str, device: Union[str, torch.device], config: object,
              code: Sequence[str] = ()) -> str:
    """One string naming the path, the device and libraries (:func:`environment`), the model config (its
    ``repr``: with the shape where a verdict holds for one shape only) and the hash of the ``code`` it runs."""
    return json.dumps({"path": path, "env": environment(device), "config": repr(config),
                       "code": code_hash(code)}, sort_keys=True)


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


# -- running a trial as production runs it --------------------------------------------------------------
#: where a path runs only inside captured CUDA graphs (a verdict's ``scope``)
CAPTURED_ONLY = "inside captured graphs only"


def production_modes(device: Union[str, torch.device], captured_only: bool = False) -> Tuple[str, ...]:
    """How production runs a path on ``device``: ``eager`` steps, and on CUDA ``graph`` (the step captured
    once, then replayed); ``captured_only``: a path taken only while a graph is captured (none on the CPU,
    which captures nothing: such a path never runs there)."""
    if torch.device(device).type != "cuda":
        return () if captured_only else ("eager",)
    return ("graph",) if captured_only else ("eager", "graph")


def replayed(fn: Callable[[], Outputs], device: Union[str, torch.device],
             restore: Sequence[torch.Tensor] = ()) -> Outputs:
    """``fn()`` as a graph replay runs it: once eagerly on a side stream (lazy set-up, library workspaces, as
    the executor warms up), then captured into a CUDA graph and replayed; the replay's outputs, cloned.
    ``restore``: tensors ``fn`` changes in place (caches), put back to their contents before the replay, so
    it starts from what the eager run started from. ``fn`` must make no host-to-device copies."""
    dev = torch.device(device)
    saved = [t.clone() for t in restore]
    rt = GraphRuntime(dev, "self-check")
    with GATE.capturing():
        with rt.side():
            fn()
        torch.cuda.synchronize(dev)
        graph, out = rt.capture(fn)
    for t, s in zip(restore, saved):
        t.copy_(s)
    rt.replay(graph)
    torch.cuda.synchronize(dev)
    got = _cloned(out)
    del graph
    return got


def _cloned(out: Outputs) -> Outputs:
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, Mapping):
        return {k: _cloned(v) for k, v in out.items()}
    return [_cloned(v) for v in out]


# -- the check -------------------------------------------------------------------------------------------
def self_check(path: str, device: Union[str, torch.device], config: object, trial: Callable[[bool], Outputs],
               not_applicable: Optional[str] = None, code: Optional[Sequence[str]] = None) -> Verdict:
    """Decide whether faster path ``path`` runs: ``trial(False)`` (reference) against ``trial(True)``.

    ``trial(on)`` runs the decoder at the real shapes on ``device`` from the same fresh random inputs
    and state each time and returns its outputs (and final state, where it has one). ``config``
    names everything besides the device that decides the shapes (a model config, codebooks...).
    ``not_applicable``: why the path cannot run here at all (reported, never checked). The
    verdict is cached per :func:`cache_key`, with the hash of ``code`` (module and package names; None:
    :func:`code_of` the trial); a trial that raises refuses the path with its error.
    """
    return _decided(path, device, config, lambda: _run(path, trial), not_applicable,
                    code_of(trial) if code is None else code)


def decide(path: str, device: Union[str, torch.device], config: object, check: Callable[[], Tuple[bool, str]],
           not_applicable: Optional[str] = None, code: Optional[Sequence[str]] = None) -> Verdict:
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
    return _decided(path, device, config, run, not_applicable, code_of(check) if code is None else code)


def _decided(path: str, device: Union[str, torch.device], config: object, run: Callable[[], Verdict],
             not_applicable: Optional[str], code: Sequence[str]) -> Verdict:
    if reference_forced():
        return Verdict(path, False, f"reference path forced by the user ({ENV_FORCE} / --reference-paths)")
    if not_applicable:
        return Verdict(path, False, f"not applicable: {not_applicable}")
    key = cache_key(path, device, config, code)
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
    release_cached(device)      # the trials' dead graph pools and cached blocks go back (CUDA; else nothing)
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
