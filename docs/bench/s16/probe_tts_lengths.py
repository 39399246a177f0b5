"""Issue 23, session 16: why some seconds' TTS past the prepared room take ~85 ms instead of ~50 (H200, call 1: seconds
26-30 and 34-39, TTS history ~690-840 and ~930-1,110 positions). Released TTS (bf16, seeded), a demand store of 1,400
positions (4,096 as the session's), the between-attention graphs: per history length n, the whole step (cuda events, median of 15) and, for layer
0, each eager attention op alone; then a profile of one step at the slowest and the fastest length (kernel names).
Writes $OUT/tts-lengths.json; prints a table."""
import json, os, statistics, sys
import torch
import torch.nn.functional as F
sys.path.insert(0, ".")
from engine.backbones.minicpmo45.dims import preset
from engine.backbones.minicpmo45.kv import kv_regions, make_store
from engine.backbones.minicpmo45.layers import seeded_init
from engine.backbones.minicpmo45.tts import TTS
from engine.backbones.minicpmo45.llm_graphs import LayerGraphs
from engine.backbones.minicpmo45.weights import build

d = preset("released")
dt = torch.bfloat16
tts = build(TTS, d.tts, d.llm, device="cuda", dtype=dt).eval()
seeded_init(tts, 4)
reg = kv_regions("tts", d.tts.layers, d.tts.kv_heads, d.tts.head_dim, 45, d.tts.max_positions, dt, "")
kv = make_store(True, reg[0], d.tts.layers, 4096, "cuda")     # the session's TTS store (max positions)
g = torch.Generator().manual_seed(0)
kv.k_buf.copy_(torch.randn(kv.k_buf.shape, generator=g).to(dt)); kv.v_buf.copy_(torch.randn(kv.v_buf.shape, generator=g).to(dt))
lg = LayerGraphs(tts, kv, torch.device("cuda"), capture=True, head=tts.head_code[0])
emb = tts.emb_code[0](torch.tensor([5], device="cuda"))
ev = lambda: torch.cuda.Event(enable_timing=True)


def timed(fn, reps):
    out = []
    for _ in range(reps):
        a, b = ev(), ev()
        a.record(); fn(); b.record(); b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def step_at(n):
    def f():
        kv.length = n - 1
        lg.forward(emb)
    return f


q = torch.randn(1, 12, 1, 64, generator=g).to(device="cuda", dtype=dt)
ops = {}
rows = []
with torch.no_grad():
    for _ in range(5):
        step_at(300)()
    for n in list(range(100, 1400, 10)):
        kt, v = kv.k_buf[0].transpose(1, 2).narrow(2, 0, n), kv.v_buf[0].narrow(1, 0, n)
        ktc, vc = kt.contiguous().transpose(1, 2).contiguous().transpose(1, 2), v.contiguous()   # the stock's layout
        s = torch.bmm(q[0], kt) * 0.125
        w = F.softmax(s, dim=-1, dtype=torch.float32).to(dt)
        r = dict(n=n, step_ms=timed(step_at(n), 15),
                 bmm1=timed(lambda: torch.bmm(q[0], kt), 15), mul=timed(lambda: s * 0.125, 15),
                 softmax=timed(lambda: F.softmax(s, dim=-1, dtype=torch.float32), 15),
                 bmm2=timed(lambda: torch.bmm(w, v), 15),
                 bmm1_contig=timed(lambda: torch.bmm(q[0], ktc), 15), bmm2_contig=timed(lambda: torch.bmm(w, vc), 15))
        rows.append(r)
    slow = max(rows, key=lambda r: r["step_ms"]); fast = min(rows, key=lambda r: r["step_ms"])
    prof = {}
    for tag, r in (("slow", slow), ("fast", fast)):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]) as p:
            step_at(r["n"])(); torch.cuda.synchronize()
        ka = sorted(((e.key, e.device_time_total / 1000.0, e.count) for e in p.key_averages() if e.device_time_total > 0),
                    key=lambda x: -x[1])[:12]
        prof[tag] = dict(n=r["n"], kernels=[dict(name=k[:110], ms=round(t, 4), n=c) for k, t, c in ka])
for r in rows:
    print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
print(json.dumps(prof, indent=1))
json.dump(dict(rows=rows, profile=prof), open(os.path.join(os.environ.get("OUT", "/tmp"), "tts-lengths.json"), "w"), indent=1)
