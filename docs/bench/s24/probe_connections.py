"""Session 24 probe (issue 24: 16 Step-Audio2 pairs held 60 s with 20 of 960 seconds late, p50 475 ms): does the
CUDA driver's work-queue count (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default) keep sessions' token2wav replays from
running side by side?

Predicted: 16 sessions each on its own stream, each replay forking parallel lanes, share 8 queues; their tiny
kernels (6,998 a chunk, ~6 us each) queue behind each other. With 32 queues a round of 16 sessions' chunks should
take less wall than with 8; at 1-4 sessions no difference.

The parent runs one child process per setting (the driver reads the variable once, at the context's start), in
the order of ``SETTINGS``. Each child: the released token2wav (seeded random weights, shared by all sessions), 16
sessions in graph mode, each with its own stream and random state (``SessionRng``, as the host gives them), built
one after another, their start-up chunks run one by one; then for S = 1, 4, 8, 16: rounds in which S threads each
run their session's next 1 s chunk on their own stream at once (a barrier starts them), the round's wall from the
barrier to the last stream's end. Every session's audio of every chunk is hashed: the settings must give the same
bits (they only change which kernels may overlap).
Usage: PYTHONPATH=. python3 docs/bench/s24/probe_connections.py OUT.json
(a dry run on a CPU: DEVICE=cpu SIZE=tiny SETTINGS=8,32; no streams there, so no timing worth reading)
"""
import contextlib
import hashlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time

SETTINGS = tuple(int(x) for x in os.environ.get("SETTINGS", "8,32,32,8").split(","))
SESSIONS, COUNTS, ROUNDS, START = 16, (1, 4, 8, 16), 6, 3


def child(path):
    import torch

    from engine.bench.step_audio2 import _tokens
    from engine.core import graphs
    from engine.host.rng import SessionRng
    from engine.models.step_audio2 import weights as W
    from engine.models.step_audio2.config import preset
    from engine.models.step_audio2.prompt import synthetic_prompt
    from engine.models.step_audio2.stream import Session, schedule

    dev = torch.device(os.environ.get("DEVICE", "cuda"))
    torch.backends.cudnn.deterministic = True
    cfg = preset(os.environ.get("SIZE", "released"))
    on_gpu = dev.type == "cuda"

    class NoStream:
        def synchronize(self):
            pass

    def on(stream):
        return torch.cuda.stream(stream) if on_gpu else contextlib.nullcontext()
    model = W.build(cfg, W.random_state_dict(cfg, 0), dev)
    prompt = synthetic_prompt(6.0, 0)
    chunks = START + ROUNDS * len(COUNTS) + 1
    res = {"connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "unset"), "gpu": torch.cuda.get_device_name() if on_gpu else "cpu",
           "torch": torch.__version__, "build_s": [], "rounds": {}, "hashes": {}}
    sessions = []
    for sid in range(SESSIONS):
        tokens = _tokens(chunks, sid)
        sched = schedule(len(tokens))
        rng, stream = SessionRng(dev), torch.cuda.Stream(dev) if on_gpu else NoStream()
        t0 = time.perf_counter()
        with rng.installed(), graphs.working_for(rng), on(stream):
            sess = Session(model, prompt, len(sched), sched[-1][1], "graphs", seed=sid)
        res["build_s"].append(round(time.perf_counter() - t0, 3))
        sessions.append({"sess": sess, "rng": rng, "stream": stream, "tokens": tokens, "sched": sched, "k": 0,
                         "hashes": []})

    def next_chunk(s):
        start, n, _ = s["sched"][s["k"]]
        with graphs.working_for(s["rng"]), on(s["stream"]):
            audio = s["sess"].run(s["tokens"][start:start + n])
        s["k"] += 1
        return audio

    def keep(s, audio):
        s["stream"].synchronize()
        s["hashes"].append(hashlib.sha256(audio.cpu().numpy().tobytes()).hexdigest()[:16])

    for s in sessions:                                   # start-up chunks (own shapes, eager): one by one
        for _ in range(START):
            with s["rng"].installed():
                keep(s, next_chunk(s))
    lock = threading.Lock() if not on_gpu else contextlib.nullcontext()
    for S in COUNTS:
        walls = []
        for _ in range(ROUNDS):
            members = sessions[:S]
            barrier, ends, outs = threading.Barrier(S + 1), [0.0] * S, [None] * S

            def work(i, s):
                barrier.wait()
                with lock, (s["rng"].installed() if not on_gpu else contextlib.nullcontext()):
                    outs[i] = next_chunk(s)      # a CPU's generator is one for all: one at a time, installed
                s["stream"].synchronize()
                ends[i] = time.perf_counter()
            threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(members)]
            for t in threads:
                t.start()
            barrier.wait()
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            walls.append((max(ends) - t0) * 1000)
            for s, audio in zip(members, outs):
                keep(s, audio)
        res["rounds"][str(S)] = {"median_ms": round(statistics.median(walls), 2), "walls_ms": [round(w, 2) for w in walls]}
        print(res["connections"], S, res["rounds"][str(S)], flush=True)
    res["hashes"] = {str(i): s["hashes"] for i, s in enumerate(sessions)}
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


def parent(path):
    out = {"settings": list(SETTINGS), "runs": []}
    for i, n in enumerate(SETTINGS):
        part = f"{path}.{i}-{n}.json"
        env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS=str(n))
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, __file__, "--child", part], env=env).returncode
        run = {"connections": n, "exit": rc, "wall_s": round(time.perf_counter() - t0, 1)}
        if rc == 0:
            with open(part) as f:
                run.update(json.load(f))
        out["runs"].append(run)
        ok = [r for r in out["runs"] if r.get("hashes")]
        out["bits_equal_across_settings"] = all(r["hashes"] == ok[0]["hashes"] for r in ok) if ok else None
        by = {}
        for r in ok:
            for S, v in r["rounds"].items():
                by.setdefault(S, {}).setdefault(str(r["connections"]), []).append(v["median_ms"])
        out["median_round_ms"] = {S: {c: round(statistics.median(v), 2) for c, v in d.items()} for S, d in by.items()}
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps({k: out[k] for k in ("median_round_ms", "bits_equal_across_settings")}, indent=1))
    best = {c: ms for c, ms in out.get("median_round_ms", {}).get(str(SESSIONS), {}).items()}
    if out.get("bits_equal_across_settings") and len(best) == len(set(SETTINGS)):   # every setting measured
        print("BEST", min(best, key=best.get))


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        parent(sys.argv[1])
