"""Session 19, call C: which summation order does cuBLAS's split-K ``sgemm_largek`` use for the DiT's fp32 linears?

At 100/116 rows (the CFG pair of a 50/58-frame chunk) ``F.linear`` runs as a memset, a ``scal``, the split-K SIMT
GEMM and a cuBLASLt bias epilogue: four kernels, ~26 us, 807 times a chunk. A SIMT GEMM accumulates each output by
a chain of fused multiply-adds along k; split-K cuts k into S ranges, sums each range's chain, then adds the
partial sums into the zeroed output, and the epilogue adds the bias. If one (S, layout, reduction) reproduces
every bit, one kernel of our own (partial chains, ordered reduction, bias) keeps the stock's bits with a quarter
of the launches. This probe searches that space with plain Triton FMA chains (slow, exact) and prints, per shape,
the configurations that are ``torch.equal`` to ``F.linear`` (or the closest, by mismatching elements).

    python3 docs/bench/s19/probe_splitk.py
"""
import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _chains(x_ptr, w_ptr, p_ptr, M, N, K, S, TK, BM: tl.constexpr, BN: tl.constexpr, INTERLEAVE: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    s = tl.program_id(2)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    per = K // S
    for i in range(0, per):
        if INTERLEAVE:
            k = ((i // TK) * S + s) * TK + i % TK          # tiles of TK dealt round-robin to the S splits
        else:
            k = s * per + i                               # one contiguous range per split
        a = tl.load(x_ptr + rm * K + k, mask=rm < M, other=0.0)
        b = tl.load(w_ptr + rn * K + k, mask=rn < N, other=0.0)
        acc = tl.fma(a[:, None], b[None, :], acc)
    tl.store(p_ptr + s * M * N + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def partials(x2, w, S, interleave, tk):
    M, K = x2.shape
    N = w.shape[0]
    p = torch.empty(S, M, N, device=x2.device)
    _chains[(triton.cdiv(M, 32), triton.cdiv(N, 32), S)](x2, w, p, M, N, K, S, tk, BM=32, BN=32,
                                                        INTERLEAVE=interleave, enable_fp_fusion=False)
    return p


def reduce(p, b, how):
    if how == "bias first":
        c = b.expand_as(p[0]).clone()
        for s in range(p.shape[0]):
            c = c + p[s]
        return c
    if how == "tree":
        parts = list(p)
        while len(parts) > 1:
            parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        return parts[0] + b
    c = p[0].clone()
    order = range(1, p.shape[0]) if how == "in order" else range(p.shape[0] - 1, 0, -1)
    for s in order:
        c = c + p[s]
    return c + b


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(191)
    for rows, k, n in [(100, 512, 512), (116, 512, 512), (100, 512, 2048), (100, 2048, 512), (116, 2048, 512),
                       (100, 320, 512), (100, 512, 80)]:
        w = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
        b = torch.randn(n, device="cuda", generator=g)
        x = torch.randn(rows, k, device="cuda", generator=g)
        ref = F.linear(x, w, b)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            F.linear(x, w, b)
            torch.cuda.synchronize()
        names = [e.name.split("(")[0][-40:] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        found, best = [], None
        for S, (inter, tk), how in itertools.product((1, 2, 3, 4, 5, 6, 8, 10, 16, 32),
                                                     [(False, 0), (True, 4), (True, 8), (True, 16), (True, 32),
                                                      (True, 64)],
                                                     ("in order", "reversed", "tree", "bias first")):
            if k % S or (inter and (k // S) % tk) or (S == 1 and (inter or how != "in order")):
                continue
            out = reduce(partials(x, w, S, inter, tk), b, how)
            bad = int((out != ref).sum())
            cfg = f"S={S} {'interleaved by ' + str(tk) if inter else 'contiguous'} {how}"
            if bad == 0:
                found.append(cfg)
            elif best is None or bad < best[0]:
                best = (bad, cfg)
        print(f"rows {rows} K {k} N {n} [{' | '.join(names)}]: equal with {found or 'none'}; "
              f"closest other {best}", flush=True)


if __name__ == "__main__":
    main()
