"""Session 18, for the next session's device call: can token2wav's fp32 linears lose their helper kernels?

Issue 16's profile of one token2wav chunk: 807 split-K fp32 GEMMs, each issued by cuBLAS(Lt) with a memset, a
``scal`` and a bias epilogue kernel beside it (~3,200 of the chunk's 8,918 kernels). Issue 23 asks token2wav
<= 47 ms (48.8 in session 18). This probe takes the DiT's linear shapes (hidden 512, heads 8 x 64, MLP 2,048,
adaLN 9 x 512; rows = 2 (the CFG pair) x frames) and, per shape, compares the stock's call (``F.linear`` with
bias over [2, T, in]) with other ways to the same product: ``torch.equal`` on fresh random inputs, the kernels
each launches and their summed device time. A variant that keeps the bits with fewer kernels is a candidate for
a self-checked faster path (engine/fastpath); one that does not is ruled out.

    python3 docs/bench/s18/probe_t2w_gemm.py            # on the H200; prints one line per shape and variant
"""
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

SHAPES = [("to_q/k/v, proj", 512, 512), ("fc1", 512, 2048), ("fc2", 2048, 512), ("adaLN (9 x hidden)", 512, 4608),
          ("final adaLN (2 x hidden)", 512, 1024), ("out linear", 512, 80)]
FRAMES = (8, 50, 58, 300)


def variants(x, w, b):
    x2 = x.reshape(-1, x.shape[-1])
    return {
        "F.linear(x, w, b) [stock]": lambda: F.linear(x, w, b),
        "addmm(b, x2d, w.t())": lambda: torch.addmm(b, x2, w.t()).view(*x.shape[:-1], -1),
        "mm(x2d, w.t()) + b": lambda: (x2 @ w.t() + b).view(*x.shape[:-1], -1),
        "F.linear(x, w) + b": lambda: F.linear(x, w) + b,
        "mm(x2d, w.t().contiguous().t()) + b": lambda: (x2 @ wt_copy(w).t() + b).view(*x.shape[:-1], -1),
        "mm(x2d, w.t(), out) ; out += b": lambda: _mm_add(x2, w, b).view(*x.shape[:-1], -1),
        "F.linear(x, w, b) via cublasLt": lambda: _lt(lambda: F.linear(x, w, b)),
        "F.linear(x, w) via cublasLt, + b": lambda: _lt(lambda: F.linear(x, w)) + b,
    }


_WT = {}


def wt_copy(w):
    """w transposed in memory ([in, out] row-major), made once per weight (a build-time copy)."""
    key = w.data_ptr()
    if key not in _WT:
        _WT[key] = w.t().contiguous()
    return _WT[key]


def _mm_add(x2, w, b):
    out = torch.empty(x2.shape[0], w.shape[0], device=x2.device)
    torch.mm(x2, w.t(), out=out)
    return out.add_(b)


def _lt(fn):
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        return fn()
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def kernels(fn):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    names = sorted({e.name.split("(")[0][-60:] for e in ev})
    return len(ev), sum(e.device_time for e in ev), names


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False                      # the stock's fp32 (TF32 off for matmul)
    g = torch.Generator(device="cuda").manual_seed(18)
    for label, din, dout in SHAPES:
        w = torch.randn(dout, din, device="cuda", generator=g) / din ** 0.5
        b = torch.randn(dout, device="cuda", generator=g)
        for t in (1,) if "adaLN" in label else FRAMES:
            x = torch.randn(2, t, din, device="cuda", generator=g)
            vs = variants(x, w, b)
            ref = vs["F.linear(x, w, b) [stock]"]()
            for name, fn in vs.items():
                out = fn()
                for _ in range(3):
                    fn()
                n, us, names = kernels(fn)
                same = torch.equal(out, ref)
                print(f"{label:24s} rows {2 * t:4d} {name:28s} equal {str(same):5s} kernels {n} {us:7.1f} us "
                      f"{' | '.join(names)}", flush=True)


if __name__ == "__main__":
    main()
