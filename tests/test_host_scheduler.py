"""The device's scheduler on the CPU: greenlets parked at yield points, batched steps, earliest deadline first,
build slices only when no second is ready, failures that stay with their session."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from engine.core import yieldpoints
from engine.host.rng import SessionRng
from engine.host.scheduler import Scheduler
from engine.host.tasks import DONE, FAILED


class Owner:
    """What a task needs of its session: its random state and stream (none on the CPU)."""

    def __init__(self, batched_steps=("k",)):
        self.rng, self.stream = SessionRng(torch.device("cpu")), None
        self.batched_steps = frozenset(batched_steps)

    def make_stream(self):
        pass


class Runner:
    """A batched step that adds each member's payload to a shared counter; records who ran together."""

    def __init__(self, fail=False):
        self.runs, self.fail, self.prepared = [], fail, []

    def run(self, members, payloads):
        if self.fail:
            raise RuntimeError("planted: the batched step broke")
        self.runs.append(sorted(m.name for m in members))
        return [p * 10 for p in payloads]

    def prepare(self, member):
        self.prepared.append(member.name)


class Member:
    def __init__(self, name, runner):
        self.name, self._runner = name, runner

    def batch_runner(self, kind, group):
        return self._runner

    def own(self, x):
        return x * 10 + 1                     # an own step: distinguishable from the batched one


def _run(sched, owner, body, what="second", deadline=0.0):
    done, box = threading.Event(), []

    def finished(t):
        box.append(t)
        done.set()
    sched.run(lambda: sched.spawn(owner, body, what, deadline, finished))
    return done, box


def _run_all(sched, bodies):
    """Every body as a second, all spawned in one turn of the loop (their frames came together)."""
    waits = [(threading.Event(), []) for _ in bodies]

    def spawn_all():
        for (done, box), body in zip(waits, bodies):
            sched.spawn(Owner(), body, "second", 0.0, lambda t, d=done, b=box: (b.append(t), d.set()))
    sched.run(spawn_all)
    return waits


def _step(member, x):
    got = yieldpoints.batched("k", "group", member, x)
    return member.own(x) if got is None else got


def test_members_parked_at_one_kind_run_as_one_batch_and_get_their_own_results():
    sched, runner = Scheduler(torch.device("cpu")), Runner()
    try:
        members = [Member(n, runner) for n in "abc"]
        waits = _run_all(sched, [lambda m=m, i=i: [_step(m, i), _step(m, i + 100)] for i, m in enumerate(members)])
        for done, box in waits:
            assert done.wait(10)
        assert [box[0].value for _, box in waits] == [[0, 1000], [10, 1010], [20, 1020]]
        assert runner.runs == [["a", "b", "c"], ["a", "b", "c"]]
        assert sched.stats.to_dict()["batches"]["k"] == {"runs": 2, "members_mean": 3.0, "members_max": 3}
    finally:
        sched.close()


def test_a_failed_batch_sends_its_members_to_their_own_steps_and_is_not_tried_again():
    sched, runner = Scheduler(torch.device("cpu")), Runner(fail=True)
    try:
        members = [Member(n, runner) for n in "ab"]
        waits = _run_all(sched, [lambda m=m: [_step(m, 1), _step(m, 2)] for m in members])
        for done, box in waits:
            assert done.wait(10) and box[0].state == DONE
        assert [box[0].value for _, box in waits] == [[11, 21], [11, 21]]        # own steps, both times
        assert not sched.batches("k", "group")
    finally:
        sched.close()


def test_scheduler_off_batching_runs_own_steps():
    sched, runner = Scheduler(torch.device("cpu"), batched=False), Runner()
    try:
        done, box = _run(sched, Owner(), lambda: _step(Member("a", runner), 3))
        assert done.wait(10) and box[0].value == 31 and runner.runs == []
    finally:
        sched.close()


def test_a_failing_second_fails_alone():
    sched, runner = Scheduler(torch.device("cpu")), Runner()
    try:
        def bad():
            _step(Member("bad", runner), 1)
            raise ValueError("planted: this session's second broke")
        good, failed = _run_all(sched, [lambda: [_step(Member("good", runner), 2), _step(Member("good", runner), 3)],
                                        bad])
        assert good[0].wait(10) and failed[0].wait(10)
        assert failed[1][0].state == FAILED and "planted" in str(failed[1][0].value)
        assert good[1][0].state == DONE and good[1][0].value == [20, 30]
    finally:
        sched.close()


def test_ready_seconds_run_earliest_deadline_first():
    sched, order = Scheduler(torch.device("cpu")), []
    try:
        def spawn_all():
            for name, deadline in (("late", 3.0), ("early", 1.0), ("middle", 2.0)):
                sched.spawn(Owner(), lambda n=name: order.append(n), "second", deadline, lambda t: None)
        sched.run(spawn_all)
        end = time.time() + 5
        while len(order) < 3 and time.time() < end:
            time.sleep(0.01)
        assert order == ["early", "middle", "late"]
    finally:
        sched.close()


def test_a_build_slices_only_between_seconds_and_its_own_prepare_runs_there():
    """A build parks at every slice point; while a second is ready it waits, so the second's work (here: three
    steps) never waits behind more than the slice in progress. The batched step's checks run in the build."""
    sched, runner, log = Scheduler(torch.device("cpu")), Runner(), []
    try:
        def build():
            yieldpoints.prepare("k", "group", Member("builder", runner))
            for i in range(3):
                log.append(f"slice {i}")
                yieldpoints.slice_point()

        def second():
            for i in range(3):
                log.append(f"second {i}")
                _step(Member("s", runner), i)
        b = _run(sched, Owner(), build, "build")
        s = _run(sched, Owner(), second)
        assert b[0].wait(10) and s[0].wait(10)
        assert runner.prepared == ["builder"]
        first_second = log.index("second 0")
        assert all(x.startswith("second") for x in log[first_second:first_second + 3]), log
    finally:
        sched.close()


def test_greenlets_keep_their_own_random_state():
    """Two sessions seeded alike draw the same numbers whatever the interleaving: each greenlet's draws come from
    its own state, switched in and out at every park."""
    sched, runner = Scheduler(torch.device("cpu")), Runner()
    try:
        def body(name):
            torch.manual_seed(5)
            out = []
            for i in range(4):
                out.append(float(torch.rand(1)))
                _step(Member(name, runner), i)
            return out
        a, b = _run_all(sched, [lambda: body("a"), lambda: body("b")])
        assert a[0].wait(10) and b[0].wait(10)
        torch.manual_seed(5)
        alone = [float(torch.rand(1)) for _ in range(4)]
        assert a[1][0].value == alone and b[1][0].value == alone and len(runner.runs) == 4
    finally:
        sched.close()


def test_the_twin_predicts_fewer_sessions_when_steps_cost_more():
    from engine.host.twin import CostTable, Shape, capacity, predict
    cheap = CostTable("sim", {"listen": 2, "llm_own": 1, "sample": 0.1, "tts": 0.1, "t2w": 1},
                      {"listen": 10, "llm_own": 5, "sample": 0.1, "tts": 1.0, "t2w": 20},
                      {2: 6, 32: 20}, {2: 2, 32: 30}, lanes=2)
    dear = CostTable("sim", cheap.host, {k: v * 3 for k, v in cheap.gpu.items()}, {2: 18, 32: 60}, cheap.group_host,
                     lanes=2)
    shapes = [[Shape(k % 2 == 0, 6 if k % 2 == 0 else 2, 26 if k % 2 == 0 else 0, k % 2 == 0) for k in range(10)]]
    got = predict(cheap, shapes, [1, 4], seconds=10)
    assert got[1]["late"] == 0 and got[1]["seconds"] == 10 and got[4]["seconds"] == 40
    assert 0 < capacity(dear, shapes, most=40, seconds=10) < capacity(cheap, shapes, most=40, seconds=10)


def test_only_the_steps_a_backbone_declares_are_batched():
    sched, runner = Scheduler(torch.device("cpu")), Runner()
    try:
        def spawn_all(waits):
            for (done, box) in waits:
                sched.spawn(Owner(batched_steps=()), lambda: [_step(Member("a", runner), 1)], "second", 0.0,
                            lambda t, d=done, b=box: (b.append(t), d.set()))
        waits = [(threading.Event(), []) for _ in range(2)]
        sched.run(lambda: spawn_all(waits))
        for done, box in waits:
            assert done.wait(10) and box[0].value == [11]
        assert runner.runs == []
    finally:
        sched.close()


def test_a_loop_that_breaks_tells_everyone_instead_of_leaving_them_waiting(monkeypatch):
    """A bug in the loop itself (here, planted in its turn) must not hang the callers: the second in flight ends
    FAILED, and every later call raises at once with the reason."""
    sched, runner = Scheduler(torch.device("cpu")), Runner()
    try:
        started, never = threading.Event(), threading.Event()

        def body():
            started.set()
            while not never.is_set():                   # parked again and again: every turn resumes it
                yieldpoints.slice_point()
        waits = _run_all(sched, [body])
        assert started.wait(5)

        def broken():
            raise RuntimeError("planted: the loop broke")
        monkeypatch.setattr(sched, "_run_ready", broken)
        sched.poke()
        done, box = waits[0]
        assert done.wait(5) and box[0].state == FAILED and "planted" in str(box[0].value)
        with pytest.raises(RuntimeError, match="the device's scheduler stopped: RuntimeError: planted"):
            sched.run(lambda: None, timeout=5)
    finally:
        sched.close()
