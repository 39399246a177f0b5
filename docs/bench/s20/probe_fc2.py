"""Session 20: why the split-K partials take 49 us at k = 2,048 (cuBLAS 35) and which variant is faster.

Variants of the partial-sum kernel of ``engine/models/step_audio2/linears.py`` (the same arithmetic: four
contiguous k ranges, each an FMA chain in ascending k from zero), at the DiT MLP's second layer (100/116 rows,
k 2,048, n 512), each timed as 200 calls in one CUDA graph (``probe_linear_tiles.per_call_us``) and checked
``torch.equal`` against ``F.linear`` after the ordered reduction:
  spec: the row strides specialised (Triton knows they are multiples of 16: vector loads);
  wt:   the weight transposed once to [K, N] (the b tile's loads run along N, contiguous);
  stages: software pipelining depth; tiles as listed.

    python3 docs/bench/s20/probe_fc2.py
"""
import sys
import os

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "s19"))
from probe_linear_tiles import per_call_us          # noqa: E402
from engine.models.step_audio2 import linears, fused  # noqa: E402

fused._ready()
triton, tl = fused.triton, fused.tl


@triton.jit
def partials_spec(x_ptr, w_ptr, p_ptr, M, N, K, sx_m, sw_n, sw_k,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    s = tl.program_id(2)
    ks = tl.arange(0, BK)
    row_ok = rows < M
    col_ok = cols < N
    per = K // tl.num_programs(2)
    part = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(s * per, (s + 1) * per, BK):
        a = tl.load(x_ptr + rows[:, None] * sx_m + (k0 + ks)[None, :], mask=row_ok[:, None], other=0.0)
        b = tl.load(w_ptr + cols[None, :] * sw_n + (k0 + ks)[:, None] * sw_k, mask=col_ok[None, :], other=0.0)
        part = tl.dot(a, b, part, input_precision="ieee")
    tl.store(p_ptr + (s * M + rows[:, None]) * N + cols[None, :], part, mask=row_ok[:, None] & col_ok[None, :])


def run(x2, w, bias, wt, cfg, use_wt, stages):
    bm, bn, bk, warps = cfg
    m, k = x2.shape
    n = w.shape[0]
    parts = torch.empty(4, m, n, device=x2.device)
    out = torch.empty(m, n, device=x2.device)
    if use_wt:
        wp, sn, sk = wt, 1, n
    else:
        wp, sn, sk = w, k, 1
    partials_spec[(triton.cdiv(m, bm), triton.cdiv(n, bn), 4)](
        x2, wp, parts, m, n, k, x2.stride(0), sn, sk, BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages,
        enable_fp_fusion=False)
    linears._ready().reduce[(triton.cdiv(m * n, 1024),)](
        parts, bias, out, out, out, m * n, m, n, m, 0, 0, 0, SPLITS=4, GATED=False, BLOCK=1024, num_warps=4,
        enable_fp_fusion=False)
    return out


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(2020)
    tiles = [(32, 32, 16, 4), (16, 32, 32, 2), (16, 64, 32, 4), (32, 64, 32, 4), (64, 64, 32, 4), (64, 32, 32, 4),
             (16, 16, 64, 1), (32, 32, 64, 4), (64, 64, 16, 8), (32, 128, 32, 4)]
    for rows, k in [(116, 2048), (100, 2048), (116, 512)]:
        x = torch.randn(rows, k, device="cuda", generator=gen)
        w = torch.randn(512, k, device="cuda", generator=gen) / k ** 0.5
        b = torch.randn(512, device="cuda", generator=gen)
        wt = w.t().contiguous()
        ref = F.linear(x, w, b)
        print(f"rows {rows} k {k}: cuBLAS {per_call_us(lambda: F.linear(x, w, b)):.1f} us; ours now "
              f"{per_call_us(lambda: linears.linear(x[None], w, b)):.1f} us", flush=True)
        for cfg in tiles:
            for use_wt in (False, True):
                for stages in (1, 2, 3, 4):
                    try:
                        ok = torch.equal(run(x, w, b, wt, cfg, use_wt, stages), ref)
                        us = per_call_us(lambda: run(x, w, b, wt, cfg, use_wt, stages))
                        print(f"  {cfg} wt={int(use_wt)} stages={stages}: {us:.1f} us "
                              f"{'equal' if ok else 'DIFFERS'}", flush=True)
                    except Exception as e:
                        print(f"  {cfg} wt={int(use_wt)} stages={stages}: failed {type(e).__name__}: "
                              f"{str(e)[:100]}", flush=True)


if __name__ == "__main__":
    main()
