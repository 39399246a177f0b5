"""Device-only probe (not product code): where a released MiniCPM-o 4.5 second spends its GPU kernel time.
Runs a graphs-mode session over speech-like input, profiles seconds K0..K1, prints the top kernels by GPU time
for speaking and for listening seconds, and writes JSON to $OUT/profile-mc.json."""
import json, os, sys, collections
import torch
from torch.profiler import ProfilerActivity, profile
from engine.audio import frames_of
from engine.bench.session import speech_like
from engine.session import DuplexSession, SessionConfig

K0, K1 = int(sys.argv[1]), int(sys.argv[2])
s = DuplexSession(SessionConfig(backbone="minicpm-o-4.5", size="released", device="cuda", seed=7))
s.start()
frames = frames_of(speech_like(K1, seed=4242))[:K1]
by = {"speak": collections.Counter(), "listen": collections.Counter()}
n = {"speak": 0, "listen": 0}
for k, f in enumerate(frames):
    if k < K0:
        s.process(f)
        continue
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        _, rec = s.process(f)
        torch.cuda.synchronize()
    kind = "speak" if rec.decision == "speak" else "listen"
    n[kind] += 1
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by[kind][e.name[:90]] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
out = {}
for kind in by:
    if not n[kind]:
        continue
    tot = sum(by[kind].values()) / n[kind] / 1000.0
    top = [(name, round(us / n[kind] / 1000.0, 3)) for name, us in by[kind].most_common(25)]
    out[kind] = {"seconds": n[kind], "kernel_ms_per_second": round(tot, 2), "top_ms_per_second": top}
    print(f"== {kind}: {n[kind]} seconds, {tot:.1f} ms of kernels per second")
    for name, ms in top:
        print(f"{ms:9.2f}  {name}")
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "profile-mc.json"), "w"), indent=1)
