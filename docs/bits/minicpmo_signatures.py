import sys, torch, inspect
sys.path.insert(0, "/work/main/tests")
torch.set_num_threads(1)
import test_minicpmo45_oracle as O
from op_signatures import record, differences
from collections import Counter
from transformers import DynamicCache, LlamaConfig, LlamaModel
from engine.backbones.minicpmo45.llm import Qwen3
from engine.backbones.minicpmo45.tts import TTS
from engine.backbones.minicpmo45.layers import seeded_init
D = O.D
def qwen():
    d = D.llm
    ref = O.qwen3_reference(d); ours = Qwen3(d).eval(); seeded_init(ours, 8, std=0.1)
    ref.load_state_dict(ours.state_dict(), strict=False)
    cache, kv = DynamicCache(), O._store("llm", d.layers, d.kv_heads, d.head_dim)
    g = torch.Generator().manual_seed(0); pos = 0
    with torch.no_grad():
        for t in (1, 10, 1, 1, 1, 2, 1, 10, 1):
            x = torch.randn(t, d.hidden, generator=g)
            out, pc = record(lambda: O._run(ref, x.unsqueeze(0), torch.arange(pos, pos + t).unsqueeze(0), cache))
            h, oc = record(lambda: ours.logits(ours(x, kv)))
            print("feed", t, torch.equal(h, out.logits[0, -1:].float()))
            print("\n".join(differences(Counter(set(oc)), Counter(set(pc)), 30)))
            pos += t
def tts():
    d = D.tts
    cfg = LlamaConfig(hidden_size=d.hidden, intermediate_size=d.ffn, num_hidden_layers=d.layers,
                      num_attention_heads=d.heads, num_key_value_heads=d.kv_heads, rms_norm_eps=d.eps,
                      rope_theta=d.rope_theta, max_position_embeddings=d.max_positions, vocab_size=16)
    cfg._attn_implementation = "sdpa"
    ref = LlamaModel(cfg).eval(); ours = TTS(d, D.llm).eval(); seeded_init(ours, 9, std=0.1)
    body = {k[len("model."):]: v for k, v in ours.state_dict().items() if k.startswith("model.")}
    ref.load_state_dict(body, strict=False)
    cache, kv = DynamicCache(), O._store("tts", d.layers, d.kv_heads, d.head_dim)
    g = torch.Generator().manual_seed(1); pos = 0
    with torch.no_grad():
        for t in (8, 1, 1, 1, 5, 1):
            x = torch.randn(t, d.hidden, generator=g)
            want, pc = record(lambda: ours.head_code[0](O._run(ref, x.unsqueeze(0), torch.arange(pos, pos + t).unsqueeze(0), cache).last_hidden_state[:, -1]).float())
            got, oc = record(lambda: ours(x, kv))
            print("feed", t, torch.equal(got, want))
            print("\n".join(differences(Counter(set(oc)), Counter(set(pc)), 30)))
            pos += t
{"qwen": qwen, "tts": tts}[sys.argv[1]]()
