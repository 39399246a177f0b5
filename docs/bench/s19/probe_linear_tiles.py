"""Session 19, call D: the split-K linear's tile sizes on the H200 (engine/models/step_audio2/linears.py).

For the DiT's steady shapes (116 and 100 rows; k 512 and 2,048; n 512), each tile configuration's kernel is
captured 200 times into one CUDA graph and replayed: microseconds per call, against cuBLAS's four kernels
(``F.linear``) the same way; and ``torch.equal`` to ``F.linear`` for each (the tile must not change the bits).

    python3 docs/bench/s19/probe_linear_tiles.py
"""
import torch
import torch.nn.functional as F

from engine.models.step_audio2 import linears

CONFIGS = [(16, 32, 32, 2), (16, 32, 16, 2), (16, 32, 32, 1), (16, 16, 32, 1), (16, 64, 32, 2), (32, 32, 32, 2),
           (16, 32, 64, 2), (32, 32, 16, 4), (16, 16, 16, 1)]


def per_call_us(fn, n=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) * 1e3 / n)
    return best


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(23)
    for rows, k in [(58, 512), (58, 2048), (50, 512), (50, 2048)]:
        x = torch.randn(2, rows, k, device="cuda", generator=gen)
        w = torch.randn(512, k, device="cuda", generator=gen) / k ** 0.5
        b = torch.randn(512, device="cuda", generator=gen)
        gate = torch.randn(2, 1, 512, device="cuda", generator=gen)
        res = torch.randn(2, rows, 512, device="cuda", generator=gen)
        ref = F.linear(x, w, b)
        ref_g = ref * gate + res
        line = [f"rows {2 * rows} k {k}: cuBLAS {per_call_us(lambda: F.linear(x, w, b)):.1f} us, +gated residual "
                f"{per_call_us(lambda: F.linear(x, w, b) * gate + res):.1f} us"]
        for cfg in CONFIGS:
            linears.BM, linears.BN, linears.BK, linears.WARPS = cfg
            ok = torch.equal(linears.linear(x, w, b), ref) and torch.equal(linears.linear(x, w, b, gate, res), ref_g)
            line.append(f"{cfg}: {per_call_us(lambda: linears.linear(x, w, b)):.1f} / gated "
                        f"{per_call_us(lambda: linears.linear(x, w, b, gate, res)):.1f} us {'equal' if ok else 'DIFFERS'}")
        print("\n  ".join(line), flush=True)


if __name__ == "__main__":
    main()
