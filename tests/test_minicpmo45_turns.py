"""MiniCPM-o 4.5 turns and token2wav, as the stock duplex loop runs them (MiniCPM-o-Demo's
``_reset_token2wav_for_new_turn``): every reply's token2wav buffer starts with 3 silence tokens (4218)
over the state the voice prompt left; a reply's last second decodes what the tail holds as its last
chunk; a barge-in drops it. So a reply after a cut decodes exactly like a fresh stream's first reply
(CPU, tiny sizes, bit for bit), in the stock-like and the demand-sized arena."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.models import registry
from engine.session.config import SessionConfig
from engine.session.session import AudioFifo, DuplexSession

#: user speech per second: a 3 s turn, a 2 s pause (the reply), talk over it (barge-in), a 1 s turn, pause
PATTERN = [1, 1, 1, 0, 0, 1, 0, 0, 0]
SEED = 3


def _frames(pattern, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(24000) * (0.2 if s else 0.001)).astype(np.float32) for s in pattern]


def _recorded_session(demand: bool, pattern=PATTERN, turns=None):
    """A session whose tail calls are recorded, per second: the RNG state at the push, the tokens pushed and
    the audio returned, and each turn end (new_turn) with the audio it returned and the tail's state after.
    The demand-sized session runs a reply's last chunk first thing next second (the engine's schedule)."""
    s = DuplexSession(SessionConfig(backbone="minicpm-o-4.5", size="tiny", device="cpu", seed=SEED,
                                    demand_sized=demand, graph_replay=False, cpu_threads=1))
    s.start()
    if turns is not None:
        s.backbone.turns = turns
    tail = s.tail
    push, new_turn = tail.push, tail.new_turn
    calls = {}

    def rec_push(tokens):
        calls.update(rng=torch.get_rng_state(), tokens=tokens.clone(), k_before=tail.executor.k)
        calls["audio"] = push(tokens)
        return calls["audio"]

    def rec_new_turn(flush=True):
        out = new_turn(flush)
        calls.update(ended=("end" if flush else "cut"), turn_audio=out, k_after=tail.executor.k,
                     buffered=int(tail._buf.shape[1]))
        return out
    tail.push, tail.new_turn = rec_push, rec_new_turn
    seconds = []
    for f in _frames(pattern):
        calls.clear()
        _, r = s.process(f)
        seconds.append((r.decision, dict(calls)))
    s.close()
    return seconds


def _turn_end(session, k):
    """The turn end that follows the push of second ``k`` (in that second, or first thing in the next)."""
    for j in (k, k + 1):
        if "ended" in session[j][1]:
            return j, session[j][1]
    raise AssertionError(f"no turn end after second {k}")


@pytest.fixture(scope="module", params=[False, True], ids=["stock-like", "demand"])
def session(request):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield _recorded_session(request.param)
    finally:
        torch.set_num_threads(n)


def _fresh_turn(rng: torch.Tensor, tokens: torch.Tensor, flush: bool) -> np.ndarray:
    """The same tokens through a freshly started tail (same weights and voice, its speech through 16-bit PCM as
    the session's), from the same RNG state."""
    entry = registry.get_backbone("minicpm-o-4.5")
    tail = registry.get("step-audio2").make_tail(size="tiny", device="cpu", seed=SEED, mode="stock",
                                                 **entry.tail_kwargs())
    tail.pcm16 = entry.speech_pcm16
    tail.start(seed=SEED)
    torch.set_rng_state(rng)
    out = [tail.push(tokens)]
    if flush:
        out.append(tail.flush())
    return np.concatenate(out)


def test_turns_end_and_are_cut_as_the_stock_loop_does(session):
    decisions = [d for d, _ in session]
    assert decisions == ["listen", "listen", "listen", "speak", "speak", "listen", "speak", "listen", "listen"]
    cut = session[5][1]
    assert cut["ended"] == "cut" and "tokens" not in cut and cut["turn_audio"].size == 0   # nothing decoded
    assert cut["k_after"] == 0 and cut["buffered"] == 0              # the cut reply's 3 codes are gone
    j, end = _turn_end(session, 6)
    assert end["ended"] == "end" and end["k_after"] == 0 and end["buffered"] == 0
    assert session[6][1]["k_before"] == 0                           # the reply began at the tail's step 0
    silence = torch.full((3,), 4218)
    for k in (3, 6):                                                 # each reply's buffer opens with silence
        assert torch.equal(session[k][1]["tokens"][0, :3], silence)
    assert [k for k, (_, c) in enumerate(session) if "ended" in c] == [5, j]


def test_a_reply_after_a_barge_in_decodes_like_a_fresh_stream(session):
    """Second 6's reply (after the cut at second 5) == the same tokens through a new tail, bit for bit:
    the full chunk (1 s) and the turn's last chunk (the 3 codes the chunk read ahead)."""
    c = session[6][1]
    got = np.concatenate([c["audio"], _turn_end(session, 6)[1]["turn_audio"]])
    want = _fresh_turn(c["rng"], c["tokens"], flush=True)
    assert got.size == 24000 + 14 * 480 and np.abs(got).max() > 0
    assert np.array_equal(got, want)


def test_the_first_reply_is_a_fresh_stream_too(session):
    c = session[3][1]
    assert c["audio"].size == 24000 and np.array_equal(c["audio"], _fresh_turn(c["rng"], c["tokens"], flush=False))


class _Scripted:
    """Turn decisions from a script: "listen", "last" (speak and end the reply) or None (the LLM decides)."""

    label, max_turn_seconds = "scripted", 4

    def __init__(self, script):
        self.script = list(script)

    def decide(self, user_speech: bool):
        from engine.backbones.minicpmo45.turns import TurnDecision
        step = self.script.pop(0)
        return TurnDecision("speak", last=True) if step == "last" else TurnDecision(step)


def test_the_engine_runs_a_reply_end_next_second_with_the_same_draws(one_torch_thread):
    """A 1 s reply, then seconds where the LLM draws its own decision: stock-like decodes the reply's last
    chunk in the reply's last second, the demand-sized session first thing next second, before that
    second's draws; every token and every sample of the tail's audio is the same."""
    script = ["listen", "last", None, None, None]
    runs = {d: _recorded_session(d, [1, 0, 0, 0, 0], _Scripted(script)) for d in (False, True)}
    ends = {d: [k for k, (_, c) in enumerate(r) if c.get("ended") == "end"] for d, r in runs.items()}
    assert ends[False][0] == 1 and ends[True][0] == 2
    for (da, ca), (db, cb) in zip(runs[False], runs[True]):
        assert da == db
        assert ("tokens" in ca) == ("tokens" in cb) and ("tokens" not in ca or torch.equal(ca["tokens"], cb["tokens"]))
        assert "audio" not in ca or np.array_equal(ca["audio"], cb["audio"])
    flushed = [[r[k][1]["turn_audio"] for k in ends[d]] for d, r in runs.items()]
    assert all(np.array_equal(x, y) for x, y in zip(*flushed)) and flushed[0][0].size == 14 * 480


def test_new_turn_needs_the_turn_base(one_torch_thread):
    tail = registry.get("step-audio2").make_tail(size="tiny", device="cpu", seed=0, mode="stock")
    tail.start(seed=0)
    with pytest.raises(RuntimeError, match="keep_turn_base"):
        tail.new_turn()


def test_audio_fifo_primes_in_front_then_plays_leftovers_first():
    f = AudioFifo()
    assert not f.pop(4).any()
    f.push(np.array([1, 2], dtype=np.float32))
    assert f.pop(4).tolist() == [0, 0, 1, 2]                         # priming: zeros in front
    f.push(np.arange(1, 7, dtype=np.float32))
    assert f.pop(4).tolist() == [1, 2, 3, 4]
    assert f.pop(4).tolist() == [5, 6, 0, 0]                         # an underrun after audio: zeros behind


def _backbone_run(demand: bool, pattern, reply_seconds: int):
    """The backbone alone over a speech pattern: per second (decision, text, codes, TTS length before THINK)."""
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    from engine.vad import VadResult
    b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cpu", seed=SEED,
                           demand_sized=demand, graph_replay=False, reply_seconds=reply_seconds)
    torch.manual_seed(SEED)
    b.start()
    out = []
    for f, sp in zip(_frames(pattern), pattern):
        b.listen(torch.from_numpy(f), VadResult(bool(sp), 1.0 if sp else 0.0, 0.0, -70.0))
        before = b.kv_tts.length
        t = b.think(25)
        out.append((t.decision, t.turn_end, t.text, None if t.tokens is None else t.tokens.tolist(), before))
    return out, b.kv_tts


def test_the_tts_keeps_its_history_over_a_cut_and_its_store_grows(one_torch_thread):
    """As the stock's force-listen: a cut closes the turn and restarts token2wav, but the TTS's history
    goes on into the next reply (only a reply's own end drops it). Two cuts in a row outgrow the per-turn
    room (2 s replies: 90 positions): the demand store doubles; both stores give the same bits."""
    pattern = [1, 1, 0, 1, 1, 0, 1, 1, 0, 0, 0]
    stock, _ = _backbone_run(False, pattern, 2)
    demand, kv = _backbone_run(True, pattern, 2)
    assert stock == demand
    ends = [(k, e) for k, (_, e, *_r) in enumerate(stock) if e]
    assert ends == [(3, "cut"), (6, "cut"), (9, "end")]
    tts_before = [r[4] for r in stock]
    assert tts_before[5] > 0 and tts_before[7] > tts_before[5]       # the history survives both cuts
    assert tts_before[10] == 0                                       # ... and a reply's own end drops it
    assert kv.kind == "demand" and kv.grown >= 1 and kv.capacity > 2 * 45


def test_model_turns_listen_first_as_the_demo_server():
    """With a checkpoint the LLM decides, after the MiniCPM-o-Demo server's start-up guard: its first
    three seconds are forced to listen (force_listen_count = 3 there)."""
    from engine.backbones.minicpmo45.turns import make_turns
    t = make_turns("model", 4)
    assert [t.decide(True).forced for _ in range(5)] == ["listen", "listen", "listen", None, None]
    assert "first 3 s listen" in t.label and t.max_turn_seconds is None


def test_tts_decode_graphs_without_a_length_s_graph_run_between_attention_calls(one_torch_thread, monkeypatch):
    """A TTS length without its own graph (past a reply's room, a history carried over cuts; or any length
    after the store moved) runs through graphs between the attention calls (the LLM's LayerGraphs, valid
    at every length; on the CPU their segments run eagerly), with the bits of the plain eager step, and
    never pays a per-length capture (recorded here: the capture itself is CUDA's)."""
    from engine.backbones.minicpmo45.dims import preset
    from engine.backbones.minicpmo45.kv import kv_regions, make_store
    from engine.backbones.minicpmo45.layers import seeded_init
    from engine.backbones.minicpmo45.tts import TTS, DecodeGraphs
    d = preset("tiny")
    tts = TTS(d.tts, d.llm).eval()
    seeded_init(tts, 2)

    def store():
        return make_store(True, kv_regions("tts", d.tts.layers, d.tts.kv_heads, d.tts.head_dim, 45,
                                           d.tts.max_positions, torch.float32, "")[0], d.tts.layers, 8, "cpu",
                          growable=True)
    kv, ref = store(), store()
    dg = DecodeGraphs(tts, torch.device("cpu"), recurring=6)
    captured = []
    monkeypatch.setattr(dg, "capture", lambda kv, n, warm: captured.append(n))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        cond = torch.randn(3, d.tts.hidden, generator=g)
        tts(cond, kv)                                                # condition: KV at 3
        tts(cond, ref)
        for _ in range(8):                                           # lengths 4 .. 11 (the store grows at 9)
            code = torch.randint(0, d.tts.codes, (1,), generator=g)
            got, want = dg.step(code, kv), tts.step_code(code, ref)
            assert torch.equal(got, want), f"TTS logits differ at length {kv.length}"
    assert captured == [] and kv.length == 11 and kv.grown == 1 and dg.grown == 1
    assert dg.layered is not None and dg.layered.valid_for(kv) and dg.layered.replays == 3   # rebuilt after the move at 9
    assert dg.replays == 8
    assert torch.equal(kv.k_buf[:, :, :11], ref.k_buf[:, :, :11])
