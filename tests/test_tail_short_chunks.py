"""Short token2wav chunks that are not a stream's last: a tail whose backbone declares its chunking
(``BackboneEntry.tail_chunking``: MiniCPM-o's duplex loop) decodes every buffer of at least 8 Step-Audio2
tokens each push, in chunks of up to 25 + 3, so its steps are declared one at a time
(:class:`engine.tail.DeclaredPlan`): each from the chunk it runs and the lengths the steps before it left.
The chunking is its own trait, apart from the turn base a tail keeps for ``new_turn``. CPU, tiny sizes."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.core import make_plan
from engine.models import registry
from engine.tail import DeclaredPlan

PROMPT = 300          # the tiny synthetic voice's mel frames


@pytest.fixture(scope="module")
def base():
    from engine.models.step_audio2.config import preset
    from engine.models.step_audio2.model import StepAudio2Token2Wav
    model = StepAudio2Token2Wav(preset("tiny"))
    spec = model.spec(PROMPT)
    return make_plan(model.regions(spec), spec)


def test_full_steps_declared_are_the_base_plan_s(base):
    p = DeclaredPlan.over(base)
    for k in range(6):
        sp = p.declare({"mel": 50})
        want = base.step(k)
        assert (sp.signature, sp.before, sp.grown, sp.after, sp.is_last) == \
               (want.signature, want.before, want.grown, want.after, False)
        assert p.step(k) is sp
    with pytest.raises(RuntimeError, match="declared"):
        p.step(6)


def test_a_short_chunk_has_its_own_shapes_and_shifts_the_steps_after_it(base):
    p = DeclaredPlan.over(base)
    steps = [p.declare({"mel": a}) for a in (10, 50, 50, 50, 12, 50)]
    assert [s.before["est_att"] for s in steps] == [PROMPT + x for x in (0, 10, 60, 100, 100, 100)]
    assert [s.grown["est_att"] for s in steps] == [PROMPT + x for x in (10, 60, 110, 150, 112, 150)]
    assert [s.before["enc.att"] for s in steps] == [s.before["est_att"] for s in steps]
    known = set(base.signatures)
    assert steps[0].signature not in known and steps[1].signature not in known and steps[4].signature not in known
    assert steps[3].signature in known and steps[5].signature == steps[3].signature   # settled: the full step's
    assert p.demand == base.demand                                  # nothing outgrows the base plan's arena
    p.reset()
    assert p.declare({"mel": 50}).signature == base.step(0).signature
    for a in (50, 50):
        p.declare({"mel": a})
    with pytest.raises(ValueError, match="longer than a full step"):
        p.declare({"mel": 52})                                      # past the window's demand


def test_a_finished_plan_ends_with_the_last_chunk(base):
    p = DeclaredPlan.over(base)
    for a in (10, 50):
        p.declare({"mel": a})
    done = p.finished({"mel": 6})
    assert done.finite and done.spec.steps == 3 and len(p.declared) == 2      # the live plan is untouched
    last = done.step(2)
    assert last.is_last and last.before["est_att"] == PROMPT + 60 and last.advances["mel"] == 6
    assert [s.signature for s in done.timeline] == [s.signature for s in p.declared] + [last.signature]
    p.declare({"mel": 50})
    big = p.finished({"mel": 54})                                   # a long last chunk: its own demand
    assert big.demand["est_att"] == PROMPT + 100 + 54 > p.demand["est_att"]


def _tail(mode: str, turns: bool, chunked=None):
    """A tiny Step-Audio2 tail; ``turns``: it keeps a turn base, ``chunked`` (default: as ``turns``): it cuts
    its tokens as MiniCPM-o 4.5's entry declares."""
    tail = registry.get("step-audio2").make_tail(size="tiny", device="cpu", seed=1, mode=mode)
    tail.keep_turn_base = turns
    if turns if chunked is None else chunked:
        tail.chunking = registry.get_backbone("minicpm-o-4.5").tail_chunking
    tail.start(seed=1)
    return tail


def test_pushes_in_turns_decode_every_buffer_of_8_tokens(one_torch_thread):
    g = torch.Generator().manual_seed(0)
    codes = lambda n: torch.randint(0, 6561, (1, n), generator=g)    # noqa: E731
    tail, plain = _tail("demand", True), _tail("demand", False)
    arena = tail.executor.arena
    addresses = arena.addresses()
    seen = []
    for n, samples, left in ((7, 0, 7), (1, 5 * 2 * 480, 3), (25, 24000, 3), (30, 24000 + 5 * 960, 3),
                             (4, 0, 7), (21, 24000, 3)):
        out = tail.push(codes(n))
        assert out.size == samples and tail._buf.shape[1] == left, (n, out.size, tail._buf.shape[1])
        assert tail.executor.arena is arena and arena.addresses() == addresses      # no region moved
        seen.append(tail.executor.k)
    assert seen == [0, 1, 2, 4, 4, 5]
    chunks = [s.advances["mel"] // 2 for s in tail._declared.declared]
    assert chunks == [5, 25, 25, 5, 25]
    last = tail.new_turn(flush=True)                                 # the turn's last 3 tokens
    assert last.size == (8 + 6) * 480 and tail.executor.k == 0 and tail._declared.declared == []
    assert arena.addresses() == addresses
    assert plain.push(codes(8)).size == 0 and plain._buf.shape[1] == 8            # waits for 28 as before


def test_minicpmo_declares_its_tail_chunking_and_the_others_none():
    assert registry.get_backbone("minicpm-o-4.5").tail_chunking == registry.TailChunking(min_frames=5)
    others = [b.name for b in registry.backbones() if b.name != "minicpm-o-4.5"]
    assert others and all(registry.get_backbone(n).tail_chunking is None for n in others)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "5"])
def test_a_bad_chunk_minimum_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="min_frames: a positive whole number"):
        registry.TailChunking(min_frames=bad)


def test_chunking_and_the_turn_base_are_two_traits(one_torch_thread):
    g = torch.Generator().manual_seed(3)
    codes = lambda n: torch.randint(0, 6561, (1, n), generator=g)    # noqa: E731
    chunked = _tail("demand", turns=False, chunked=True)             # short chunks, no turn base
    assert chunked.push(codes(8)).size == 5 * 2 * 480 and chunked.executor.k == 1
    with pytest.raises(RuntimeError, match="keep_turn_base"):
        chunked.new_turn()
    based = _tail("demand", turns=True, chunked=False)               # a turn base, full steps only
    assert based.push(codes(8)).size == 0 and based._buf.shape[1] == 8
    assert based.push(codes(20)).size == 24000 and based.executor.k == 1
    assert based.new_turn(flush=True).size == (8 + 6) * 480 and based.executor.k == 0   # the last 3 tokens


def test_a_session_sets_the_chunking_its_backbone_declares(one_torch_thread):
    from engine.session import DuplexSession, SessionConfig
    for backbone, tail, want in (("minicpm-o-4.5", "step-audio2", registry.TailChunking(5)),
                                 ("synthetic", "step-audio2", None)):
        s = DuplexSession(SessionConfig(backbone=backbone, tail=tail, size="tiny", device="cpu", seed=4,
                                        cpu_threads=1))
        s.start()
        try:
            assert s.tail.chunking == want and (s.tail._declared is not None) == (want is not None)
        finally:
            s.close()


def test_a_chunked_tail_checks_every_chunk_length_at_start(monkeypatch, one_torch_thread):
    """A stream cut into short chunks runs no fast-path self-check mid-stream: every chunk length (short chunks,
    a turn's last chunk of any length) was checked at start. A tail without chunking leaves them to first use.
    (On the H200 a first check inside a second cost a turn's last chunk 390 ms of SPEAK.)"""
    from engine.models.step_audio2 import checked
    first_checks = []
    which = checked.CheckedPaths.which

    def logged(self, shape, device, config):
        if shape not in self.checked:
            first_checks.append((self.block, shape))
        return which(self, shape, device, config)
    monkeypatch.setattr(checked.CheckedPaths, "which", logged)
    g = torch.Generator().manual_seed(5)
    codes = lambda n: torch.randint(0, 6561, (1, n), generator=g)    # noqa: E731
    plain = _tail("demand", True, chunked=False)
    assert ("step-audio2 HiFT", 14) not in first_checks              # left to first use
    tail = _tail("demand", True)
    assert ("step-audio2 HiFT", 14) in first_checks and ("step-audio2 encoder", 24) in first_checks
    first_checks.clear()
    for pushes in ((28, 25, 1), (28, 25, 9), (28, 4), (13,), (28, 22)):   # last chunks of 4, 3, 7, 13... tokens
        for n in pushes:
            tail.push(codes(n))
        tail.new_turn(flush=True)
    assert first_checks == [], first_checks
    plain.push(codes(28))
    plain.new_turn(flush=True)                                       # a last chunk of 3 tokens, checked now
    assert ("step-audio2 HiFT", 14) in first_checks


def test_a_turn_s_last_chunk_runs_on_the_live_executor_as_prepared_at_start(monkeypatch, one_torch_thread):
    """A chunked stream's last step is declared on its own plan and run by its own executor, so a graph captured
    at start replays it (on CUDA); the one :meth:`start` prepares is the usual one, the lookahead's 3 tokens once
    the state settled. The audio is the old path's (a finite copy of the state, run eagerly), bit for bit."""
    from engine.core.executor import graph_key
    from engine.tail import EngineTail

    def run(live: bool, pushes):
        g = torch.Generator().manual_seed(9)
        tail = _tail("demand", True)
        if not live:
            monkeypatch.setattr(tail, "_declare_last", lambda n: False)
        ex = tail.executor
        out = [tail.push(torch.randint(0, 6561, (1, n), generator=g)) for n in pushes]
        out.append(tail.flush())
        return tail, ex, torch.from_numpy(np.concatenate(out))

    usual = _tail("demand", True)._usual_last_steps()
    assert len(usual) == 1 and usual[0].is_last and usual[0].advances["mel"] == 6 and usual[0].index > 0
    for pushes in ((28, 25, 25, 25), (28, 4), (28, 25, 25, 30, 1)):  # settled with 3 left; early; 4 left
        tail, ex, audio = run(True, pushes)
        _, old_ex, old = run(False, pushes)
        assert torch.equal(audio, old) and audio.numel() > 0
        assert tail.executor is ex and old_ex is not None
        last = tail._declared.declared[-1]
        assert last.is_last and (graph_key(last) == graph_key(usual[0])) == (pushes == (28, 25, 25, 25))
    assert EngineTail._usual_last_steps(_tail("demand", True, chunked=False)) == []


def test_graph_keys_part_first_and_last_steps_only_where_the_model_branches_on_them(base):
    """Step-Audio2 reads ``is_last`` and ``index == 0`` in its step, so a first or last step has a graph of its own
    even at another step's shapes; a model that reads neither (Mimi, the Nemotron codec, the audio encoder) shares
    one graph per signature, as before (one capture fewer each, in the GPU tests)."""
    from dataclasses import replace
    from engine.core import Executor
    from engine.core.executor import graph_key
    from engine.models.mimi.model import MimiDecoder
    from engine.models.step_audio2.config import preset
    from engine.models.step_audio2.model import StepAudio2Token2Wav
    settled, first = base.step(5), base.step(0)
    last = replace(settled, is_last=True)
    assert StepAudio2Token2Wav.step_branches == ("last", "first") and MimiDecoder.step_branches == ()
    ex = Executor(StepAudio2Token2Wav(preset("tiny")), base, "cpu")
    assert ex._key(last) != ex._key(settled) and ex._key(first) == (first.signature, False, True)
    for sp in (settled, first, last):
        assert graph_key(sp, ()) == (sp.signature, False, False)
