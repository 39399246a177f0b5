"""Session 7 diagnostic: the stock's own StreamDecoder.decode against our TextSampler on CUDA, at the first
draw where the tiny CUDA run parted (same logits, same CUDA RNG state, same history).
Run with the stock's interpreter from the repository copy: /tmp/vs/python docs/bench/s7/diag_sampler.py DUMP"""
import sys
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, "shared-oracles/MiniCPM-o-Demo-28b60cf")
from MiniCPMO45.utils import StreamDecoder, top_k_top_p_filtering  # noqa: E402
from engine.backbones.minicpmo45.dims import Sampling, _tiny_tokens  # noqa: E402
from engine.backbones.minicpmo45.sampling import TextSampler, top_k_top_p  # noqa: E402

d = torch.load(sys.argv[1], weights_only=False)
tk, s = _tiny_tokens(256), Sampling()
k, row = d["second"], 4
hist = [t for (_, _, ss, _) in d["rng"][:k] for t in ss] + d["rng"][k][2][:row]
print("history", len(hist), "chunk_eos in it:", tk.chunk_eos in hist)
logits = d["stock"]["llm_decode_in"][row].to(torch.bfloat16).cuda()
state = d["rng"][k][3][row]


def stock_decode(x):
    me = types.SimpleNamespace(chunk_eos_id=tk.chunk_eos, forbidden_token_ids=[tk.tts_pad, 3, 5],
                               generated_tokens=list(hist), generated_special_tokens=[], turn_eos_id=tk.turn_eos,
                               listen_id=tk.listen, special_token_ids=[], context="",
                               tokenizer=types.SimpleNamespace(decode=lambda *a, **kw: ""))
    torch.cuda.set_rng_state(state)
    return int(StreamDecoder.decode(me, x, mode="sampling", temperature=0.7, top_k=20, top_p=0.8,
                                    listen_top_k=None, listen_prob_scale=1.0, text_repetition_penalty=1.05,
                                    text_repetition_window_size=512, length_penalty=s.length_penalty).view(-1)[0])


def ours(x):
    smp = TextSampler(s, tk, forbidden=[tk.tts_pad, 3, 5])
    smp.history = list(hist)
    torch.cuda.set_rng_state(state)
    return smp(x)


print("recorded: stock", d["stock"]["llm_sampled"][row], "ours", d["ours"]["sampled"][row])
print("replayed: stock", stock_decode(logits.clone()), "ours", ours(logits.clone()), "length_penalty", s.length_penalty)
# the intermediates: stock's steps by its own function, ours by ours
smp = TextSampler(s, tk, forbidden=[tk.tts_pad, 3, 5])
smp.history = list(hist)
a = smp._penalised(logits.clone())
b = logits.clone()
b[:, [tk.tts_pad, 3, 5]] = float("-inf")
for t in set(hist[-512:]):
    if t < b.size(-1):
        b[0, t] /= 1.05
te = tk.turn_eos
b[0, te] = b[0, te] / s.length_penalty if b[0, te] > 0 else b[0, te] * s.length_penalty
print("penalised equal:", torch.equal(a, b), "where:", (a != b).nonzero().view(-1).tolist()[:10],
      a[0, te].item(), b[0, te].item())
fa = top_k_top_p(a / s.temperature, s.top_k, s.top_p)
fb = top_k_top_p_filtering(b / 0.7, top_k=20, top_p=0.8)
print("filtered equal:", torch.equal(fa, fb), "kept ours", (fa > -1e30).sum().item(), "stock", (fb > -1e30).sum().item())
pa, pb = F.softmax(fa, dim=-1), F.softmax(fb, dim=-1)
print("probs equal:", torch.equal(pa, pb), pa.dtype, "p75/p250 ours", pa[0, 75].item(), pa[0, 250].item(),
      "stock", pb[0, 75].item(), pb[0, 250].item())
print("kept ours", sorted((fa[0] > -1e30).nonzero().view(-1).tolist()))
print("kept stock", sorted((fb[0] > -1e30).nonzero().view(-1).tolist()))
# the stock's decode with its intermediates, step by step on CUDA (its own top_k_top_p_filtering)
torch.cuda.set_rng_state(state)
first = torch.multinomial(F.softmax(logits.clone()[0], dim=-1), num_samples=1).item()
fb2 = top_k_top_p_filtering(b / 0.7, top_k=20, top_p=0.8)
second = torch.multinomial(F.softmax(fb2, dim=-1), num_samples=1).squeeze(1).item()
print("stock steps by hand: decision", first, "text", second)
for name, x in (("float32 logits", logits.float()),):
    print(name, "stock", stock_decode(x.clone()), "ours", ours(x.clone()))
