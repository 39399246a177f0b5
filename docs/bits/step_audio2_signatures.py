import sys, torch, numpy as np, time
sys.path.insert(0, "/work/main/tests")
torch.set_num_threads(1)
import stock_step_audio2 as S
from op_signatures import record, differences
from engine.models.step_audio2 import weights as W
from engine.models.step_audio2.stream import synthesize
case = S.make_case("oracle", prompt_tokens=37, n_tokens=int(sys.argv[1]))
flow, hift = S.build_flow(case.cfg.flow), S.build_hift(case.cfg.hift)
flow.load_state_dict({k[5:]: v for k, v in case.state.items() if k.startswith("flow.")}, strict=True)
hift.load_state_dict({k[5:]: v for k, v in case.state.items() if k.startswith("hift.")}, strict=True)
def stock():
    st = S.StockStream(flow, hift, case.prompt.tokens, case.prompt.mel, case.prompt.spk, "cpu", noise=S.flow_noise(case.seed))
    torch.manual_seed(case.seed)
    with torch.no_grad(): return st.stream(case.tokens)
t=time.time(); ref, pc = record(stock); print("stock", time.time()-t)
model = W.build(case.cfg, case.state, "cpu")
def ours():
    with torch.inference_mode(): return synthesize(model, case.prompt, case.tokens, sys.argv[2], case.seed)
t=time.time(); got, oc = record(ours); print("ours", time.time()-t)
print(sum(pc.values()), sum(oc.values()), all(np.array_equal(a, b) for a, b in zip(got, ref)))
print("\n".join(differences(oc, pc, 60)))
print("SET-LEVEL:")
from collections import Counter
print("\n".join(differences(Counter(set(oc)), Counter(set(pc)), 60)))
print("PEER-ONLY:")
po = [s for s in set(pc) if s not in set(oc)]
print(len(po), len(set(pc)), len(set(oc)))
for s in sorted(po, key=repr)[:40]: print(str(s)[:300])
