"""CPU bit-identity probe for another machine: run the CPU bit tests there, both ways.

The CPU bit tests (ours ``torch.equal`` to nemo's / moshi's decode) must pass whatever kernels the CPU's
MKL picks: AVX-512 / AMX on an Intel Xeon, AVX2 on AMD or with ``MKL_ENABLE_INSTRUCTIONS=AVX2``. This
script, run from the repository root on such a machine (e.g. the GPU host, whose CPU is an Intel Xeon),

1. says which CPU, torch, MKL and ATen kernels it runs on;
2. shows whether this CPU's MKL rounds by alignment (the same values through ``cos`` / ``exp`` /
   a GEMM at each offset from a 64-byte boundary: where they differ, the layout and alignment of a
   library call's input decide its bits, which is why ours must hand MKL the peer's own layouts);
3. runs the bit tests (``-m "bits or oracle"``: Nemotron vs nemo, Mimi vs moshi, the library-call
   signatures) with this CPU's own kernels, then again with MKL, oneDNN and ATen held to AVX2.

The peers are test-only oracles. Where they are not installed, pass ``--wheels DIR`` holding the
pure-python wheels (nemo-toolkit 3.0.0, omegaconf 2.4.0, moshi 0.2.13, einops 0.8.2, and a PyYAML
wheel for this Python where ``yaml`` is missing): they are unpacked into a temporary folder put on
``PYTHONPATH`` for the test runs (nothing is installed). Needs pytest. Exit status 0 when every run passed.

    python tests/cpu_bits_probe.py --wheels .whl                # both runs
    python tests/cpu_bits_probe.py --wheels .whl --runs own     # one run (each fits a 10-minute slot)
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_nemotron_codec.py", "tests/test_op_signatures.py", "tests/test_mimi.py",
         "tests/test_nemotron_fastpaths.py", "tests/test_mimi_fastpaths.py"]
AVX2 = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def cpu_report() -> List[str]:
    """The CPU's model and vector extensions, torch's version, MKL and ATen kernel level."""
    import torch
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")),
                 platform.processor() or "unknown")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    ext = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16") if f in flags]
    mkl = next((ln.strip() for ln in torch.__config__.show().splitlines() if "Math Kernel Library" in ln), "no MKL")
    return [f"cpu: {model} ({' '.join(ext) or 'no AVX2'})",
            f"torch {torch.__version__}, python {platform.python_version()}, {mkl}",
            f"ATen kernels: {torch.backends.cpu.get_cpu_capability()}, "
            f"MKL_ENABLE_INSTRUCTIONS={os.environ.get('MKL_ENABLE_INSTRUCTIONS', '(unset)')}"]


def alignment_probe(n: int = 1000) -> Dict[str, int]:
    """For cos, exp and a GEMM: at how many of the 16 float offsets from a 64-byte boundary the same
    values give other bits than at the boundary (0 everywhere: this CPU's MKL ignores alignment)."""
    import torch
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    base, w = torch.randn(n + 16, generator=g), torch.randn(40, 24, generator=g)
    out: Dict[str, int] = {}
    for name, fn in (("cos", torch.cos), ("exp", torch.exp)):
        ref = fn(base[:n].clone())
        out[name] = sum(not torch.equal(fn(_at_offset(base[:n], k)), ref) for k in range(1, 16))
    rows = base[:24 * 40].view(40, 24)
    ref = rows.clone() @ w.t()
    out["mm"] = sum(not torch.equal(_at_offset(rows, k) @ w.t(), ref) for k in range(1, 16))
    return out


def _at_offset(x, k: int):
    """A copy of ``x`` whose data starts ``k`` floats past a 64-byte boundary."""
    import torch
    buf = torch.empty(x.numel() + 16, dtype=x.dtype)
    start = (-(buf.data_ptr() // 4) % 16 + k) % 16
    view = buf[start:start + x.numel()].view(x.shape)
    view.copy_(x)
    return view


def unpack_wheels(folder: Path) -> str:
    """Each ``*.whl`` in ``folder`` unpacked into one temporary folder; its path (for PYTHONPATH)."""
    target = Path(tempfile.mkdtemp(prefix="bits-probe-"))
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"--wheels {folder}: no .whl files there (see this script's docstring for which)")
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            z.extractall(target)
    print(f"unpacked {len(wheels)} wheels into {target}: {', '.join(w.name.split('-')[0] for w in wheels)}")
    return str(target)


def run_tests(extra_env: Dict[str, str], pythonpath: str, label: str, tests: List[str], select: str) -> int:
    """pytest on ``tests`` (``-k select`` where given) under ``extra_env``; its exit status."""
    env = dict(os.environ, **extra_env, QT_QPA_PLATFORM="offscreen")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH", "")) if p)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
           "-m", "(bits or oracle) and not gpu and not slow", *tests] + (["-k", select] if select else [])
    print(f"\n== {label}: {' '.join(f'{k}={v}' for k, v in extra_env.items()) or 'this CPU own kernels'}", flush=True)
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                           env=env, capture_output=True, text=True)
    print(f"ATen kernels in this run: {probe.stdout.strip()}", flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="CPU bit-identity probe (run from the repository root)")
    ap.add_argument("--wheels", type=Path, help="folder of the oracle wheels to unpack onto PYTHONPATH")
    ap.add_argument("--runs", nargs="+", choices=("own", "avx2"), default=["own", "avx2"],
                    help="own: this CPU's own kernels; avx2: MKL, oneDNN and ATen held to AVX2 (default: both)")
    ap.add_argument("--tests", nargs="+", default=TESTS, help="test files (default: the CPU bit tests)")
    ap.add_argument("-k", dest="select", default="", help="pytest -k expression")
    args = ap.parse_args(argv)
    print("\n".join(cpu_report()))
    diffs = alignment_probe()
    print("MKL rounds by alignment here (offsets of 15 with other bits): "
          + ", ".join(f"{k} {v}" for k, v in diffs.items()))
    path = unpack_wheels(args.wheels) if args.wheels else ""
    runs = {"own": ({}, "own kernels"), "avx2": (AVX2, "AVX2 kernels")}
    codes = {runs[r][1]: run_tests(runs[r][0], path, runs[r][1], args.tests, args.select) for r in args.runs}
    print("\n" + "; ".join(f"{k}: {'passed' if c == 0 else f'FAILED (pytest status {c})'}" for k, c in codes.items()))
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
