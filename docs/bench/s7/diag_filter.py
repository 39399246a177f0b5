"""Session 7 diagnostic: the stock's real text-filter input at the first parted draw against our penalised
logits (same history); run after the GPU test wrote its dump: python3 docs/bench/s7/diag_filter.py DUMP"""
import sys

import torch

from engine.backbones.minicpmo45.dims import Sampling, _tiny_tokens
from engine.backbones.minicpmo45.sampling import TextSampler, top_k_top_p

d = torch.load(sys.argv[1], weights_only=False)
tk, s = _tiny_tokens(256), Sampling()
st, ours = d["stock"], d["ours"]
print("filter calls", len(st["llm_filter_in"] or []), "draws", len(st["llm_sampled"]))
for row in range(min(len(ours["sampled"]), len(st["llm_sampled"]))):
    smp = TextSampler(s, tk, forbidden=[tk.tts_pad, 3, 5])
    smp.history = list(ours["history"][row])
    x = st["llm_decode_in"][row].to(torch.bfloat16)
    a = smp._penalised(x.clone()) / s.temperature
    fin, fout = st["llm_filter_in"][row], st["llm_filter_out"][row]
    f = top_k_top_p(a, s.top_k, s.top_p)
    print(row, "tokens", ours["sampled"][row], st["llm_sampled"][row], "filter in equal", torch.equal(a.float(), fin),
          "where", (a.float() != fin).nonzero()[:, -1].tolist()[:8], "out equal", torch.equal(f.float(), fout),
          "kept stock", (fout[0] > -1e30).sum().item(), "ours", (f[0] > -1e30).sum().item())
    if not torch.equal(a.float(), fin):
        idx = (a.float() != fin).nonzero()[:, -1].tolist()[:8]
        print("   ours", a.float()[0, idx].tolist(), "stock", fin[0, idx].tolist(), "raw", x.float()[0, idx].tolist())
