"""Session 21 probe (issue 24): which of MiniCPM-o 4.5's linears keep a session's bits when several sessions'
one-token rows go through them together, on this GPU, and what the rows cost.

For every linear of the LLM (Qwen3-8B sizes) and the TTS at the released sizes: a seeded bfloat16 weight
(N(0, 0.02)) and 32 fresh N(0, 1) rows; the reference is each row alone (`F.linear` of [1, K], as a session
runs it); candidates at r = 2..12, 16, 32 rows: one GEMM of r rows ("rows"), and a batched GEMM of r one-row
products sharing the weight ("bmm": matmul of [r, 1, K] by the weight's transpose). Prints per r which are
`torch.equal` to the solo rows, and the time of r solo rows vs one batched call (CUDA events, median of 20).
Usage: python3 docs/bench/s21/probe_rows.py OUT.json
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F

LINEARS = {  # name: (out, in)
    "llm.q": (4096, 4096), "llm.k": (1024, 4096), "llm.v": (1024, 4096), "llm.o": (4096, 4096),
    "llm.gate": (12288, 4096), "llm.up": (12288, 4096), "llm.down": (4096, 12288),
    "llm.lm_head": (151748, 4096),
    "tts.q": (768, 768), "tts.o": (768, 768), "tts.gate": (3072, 768), "tts.down": (768, 3072),
    "tts.head": (6562, 768),
}
ROWS = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 16, 32]


def timed(fn, n=20):
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main(path):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(2112)
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "linears": {}}
    for name, (n, k) in LINEARS.items():
        w = (torch.randn(n, k, generator=g, device=dev) * 0.02).to(torch.bfloat16)
        x = torch.randn(32, k, generator=g, device=dev).to(torch.bfloat16)
        solo = torch.cat([F.linear(x[i:i + 1], w) for i in range(32)])
        wt = w.t()
        rec = {}
        for r in ROWS:
            rows = torch.equal(F.linear(x[:r], w), solo[:r])
            bmm = torch.equal(torch.matmul(x[:r].unsqueeze(1), wt).squeeze(1), solo[:r])
            t_solo = timed(lambda: [F.linear(x[i:i + 1], w) for i in range(r)])
            t_rows = timed(lambda: F.linear(x[:r], w))
            t_bmm = timed(lambda: torch.matmul(x[:r].unsqueeze(1), wt))
            rec[r] = {"rows_equal": rows, "bmm_equal": bmm, "solo_ms": round(t_solo, 4),
                      "rows_ms": round(t_rows, 4), "bmm_ms": round(t_bmm, 4)}
        doc["linears"][name] = rec
        ok_rows = [r for r in ROWS if rec[r]["rows_equal"]]
        ok_bmm = [r for r in ROWS if rec[r]["bmm_equal"]]
        print(f"{name:12s} {n:6d}x{k:5d}  rows equal at {ok_rows}  bmm equal at {ok_bmm}  "
              f"8 solo {rec[8]['solo_ms']:.3f} ms / rows {rec[8]['rows_ms']:.3f} / bmm {rec[8]['bmm_ms']:.3f}",
              flush=True)
        del w, x, solo
    json.dump(doc, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
