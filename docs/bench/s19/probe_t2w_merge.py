"""Session 19, call B: can the DiT's q/k/v (or k/v) projections run as one GEMM and keep the stock's bits?

Call A (probe_t2w_gemm.py) found no single fp32 linear with fewer kernels at the same bits: at 100/116 rows every
``F.linear`` is cuBLAS's split-K ``sgemm_largek`` with a memset, a ``scal`` and a cuBLASLt bias epilogue. Each output
element of a GEMM depends only on its row of x and its column of w, so if cuBLAS picks the same split-K kernel for
the weights stacked along N, each slice of the stacked product is the separate product's bits, with one GEMM's
helper kernels instead of three. Also tried: the projection without its bias under cuBLASLt with the bias left to
the next elementwise kernel (the fused residual adds ``(p + bias) * gate + x`` in the stock's order).

    python3 docs/bench/s19/probe_t2w_merge.py      # on the H200: one line per rows x variant
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "s18"))
from probe_t2w_gemm import kernels          # noqa: E402  (call A's: kernels, device us, names of one call)


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(19)
    c = 512
    ws = [torch.randn(c, c, device="cuda", generator=g) / c ** 0.5 for _ in range(3)]
    bs = [torch.randn(c, device="cuda", generator=g) for _ in range(3)]
    w_qkv, b_qkv = torch.cat(ws), torch.cat(bs)
    w_kv, b_kv = torch.cat(ws[1:]), torch.cat(bs[1:])
    for t in (1, 4, 8, 25, 50, 58, 100, 150, 300):
        x = torch.randn(2, t, c, device="cuda", generator=g)
        sep = [F.linear(x, w, b) for w, b in zip(ws, bs)]
        cases = {"qkv stacked (N=1536)": (lambda: F.linear(x, w_qkv, b_qkv), sep),
                 "kv stacked (N=1024)": (lambda: F.linear(x, w_kv, b_kv), sep[1:])}
        for name, (fn, ref) in cases.items():
            out = fn()
            same = all(torch.equal(o, r) for o, r in zip(out.split(c, dim=-1), ref))
            n, us, names = kernels(fn)
            n0, us0, _ = kernels(lambda: [F.linear(x, w, b) for w, b in zip(ws[3 - len(ref):], bs[3 - len(ref):])])
            print(f"rows {2 * t:4d} {name:22s} equal {str(same):5s} kernels {n} ({us:6.1f} us) vs separate {n0} "
                  f"({us0:6.1f} us)  {' | '.join(names)}", flush=True)


if __name__ == "__main__":
    main()
