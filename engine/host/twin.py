"""The scheduler's twin on a simulated clock: how many sessions a device keeps on time, before it is run there.

The sessions' seconds are what the real scheduler ran on the CPU at tiny dims (:func:`shapes_of`: per second, its
decision and how many one-token LLM steps, TTS steps and token2wav calls it made — the voice-activity turn policy
makes the same decisions at any dims). Their cost is a table measured on the device at released dims
(:class:`CostTable`): each step kind's host time (the scheduler's one thread launches it) and device time, the
group LLM step's at each row count. :func:`simulate` then replays the scheduler's policy on a simulated clock:

* one host thread: the ready step with the earliest deadline is launched next, taking its host time;
* a session's own steps run in order on its own stream, a batched step on the batch stream, and the device runs
  at most ``table.lanes`` of them at once (its kernels are small: several streams overlap);
* a session parks where the real one parks: at every one-token LLM step (a batch of every session parked there,
  its cost that of its row count) and before every host read (its stream's work must be done first: after
  LISTEN, after each LLM step's sampling, after the TTS's codes, after token2wav).

Each second's latency is its finish less its frame's arrival (frames arrive once a second per session, phases
spread as the bench spreads them). :func:`predict` says, per session count, the late seconds and the p99.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

GOLDEN = 0.6180339887


@dataclass
class Shape:
    """One second as the scheduler runs it: its steps, in order."""

    speak: bool
    llm_steps: int          # one-token LLM forwards (LISTEN's <unit> and THINK's slots)
    tts_steps: int = 0
    t2w: int = 0


@dataclass
class CostTable:
    """Milliseconds per step kind, measured on one device at released dims: ``host`` (the scheduler's thread
    launching it) and ``gpu`` (its device time); ``group_gpu`` / ``group_host``: a group LLM step at each row count
    (missing counts interpolated); ``lanes``: how many streams' work the device overlaps."""

    device: str
    host: Dict[str, float]
    gpu: Dict[str, float]
    group_gpu: Dict[int, float]
    group_host: Dict[int, float]
    lanes: int = 4
    source: str = ""

    @classmethod
    def load(cls, path) -> "CostTable":
        d = json.loads(Path(path).read_text())
        return cls(d["device"], d["host"], d["gpu"], {int(k): v for k, v in d["group_gpu"].items()},
                   {int(k): v for k, v in d["group_host"].items()}, int(d.get("lanes", 4)), d.get("source", ""))

    def group(self, rows: int) -> Tuple[float, float]:
        """(host ms, device ms) of a group step of ``rows`` members."""
        return _interp(self.group_host, rows), _interp(self.group_gpu, rows)


def _interp(points: Dict[int, float], x: int) -> float:
    keys = sorted(points)
    if x <= keys[0]:
        return points[keys[0]]
    for a, b in zip(keys, keys[1:]):
        if a <= x <= b:
            return points[a] + (points[b] - points[a]) * (x - a) / (b - a)
    a, b = keys[-2], keys[-1]
    return points[b] + (points[b] - points[a]) * (x - b) / (b - a)


def shapes_of(records) -> List[Shape]:
    """Each second's shape from its record (the LLM tokens it chose; LISTEN feeds <unit> as a one-token step)."""
    out = []
    for r in records:
        llm = len(str(r.llm_tokens).split()) if r.llm_tokens else 0
        speak = r.decision == "speak"
        codes = len(str(r.tts_codes).split()) if r.tts_codes else 0
        out.append(Shape(speak, 1 + llm, (codes + 1) if speak else 0, 1 if speak and not r.tail_skipped else 0))
    return out


class _Twin:
    """The simulated device: one host thread, streams, ``lanes`` device slots (all times in ms)."""

    def __init__(self, table: CostTable, shapes: Sequence[Sequence[Shape]], seconds: int):
        self.t, self.table, self.shapes, self.seconds = table, table, shapes, seconds
        self.n = len(shapes)
        self.phase = [1000.0 * ((i * GOLDEN) % 1.0) for i in range(self.n)]
        self.lanes: List[float] = [0.0] * max(1, table.lanes)     # when each device slot frees up
        self.stream_end = [0.0] * (self.n + 1)                      # the last item's end on each stream
        self.latency: List[List[float]] = [[] for _ in range(self.n)]

    def _device(self, stream: int, start: float, ms: float) -> float:
        """Run ``ms`` of device work on ``stream`` from ``start``; when it ends."""
        k = min(range(len(self.lanes)), key=lambda i: self.lanes[i])
        begin = max(start, self.stream_end[stream], self.lanes[k])
        end = begin + ms
        self.lanes[k] = end
        self.stream_end[stream] = end
        return end

    def run(self) -> List[List[float]]:
        host = 0.0
        todo = {i: [] for i in range(self.n)}            # per session: the steps its second has left
        ready_at = {i: 0.0 for i in range(self.n)}
        arrival = {i: self.phase[i] for i in range(self.n)}
        second = {i: 0 for i in range(self.n)}
        for i in range(self.n):
            todo[i] = self._steps(self.shapes[i][0])
            ready_at[i] = arrival[i]
        while any(second[i] < self.seconds for i in range(self.n)):
            for i in range(self.n):                      # seconds whose last step is done: the next one's steps
                if second[i] < self.seconds and not todo[i]:
                    self.latency[i].append(ready_at[i] - arrival[i])
                    second[i] += 1
                    arrival[i] += 1000.0
                    if second[i] < self.seconds:
                        todo[i] = self._steps(self.shapes[i][second[i] % len(self.shapes[i])])
                        ready_at[i] = max(ready_at[i], arrival[i])
            live = [i for i in range(self.n) if second[i] < self.seconds and todo[i]]
            runnable = [i for i in live if todo[i][0] != "llm" and ready_at[i] <= host]
            waiting_llm = [i for i in live if todo[i][0] == "llm" and ready_at[i] <= host]
            if runnable:
                i = min(runnable, key=lambda j: arrival[j])
                kind = todo[i].pop(0)
                host += self.t.host.get(kind, 0.0)
                ready_at[i] = self._device(i, host, self.t.gpu.get(kind, 0.0))
            elif waiting_llm:
                h, g = self.t.group(len(waiting_llm)) if len(waiting_llm) > 1 else (
                    self.t.host.get("llm_own", 0.0), self.t.gpu.get("llm_own", 0.0))
                host += h
                end = self._device(self.n, max(host, max(self.stream_end[j] for j in waiting_llm)), g)
                for j in waiting_llm:
                    todo[j].pop(0)
                    host += self.t.host.get("sample", 0.0)
                    ready_at[j] = self._device(j, max(host, end), self.t.gpu.get("sample", 0.0))
            elif live:
                host = max(host, min(ready_at[i] for i in live))
        return self.latency

    @staticmethod
    def _steps(s: Shape) -> List[str]:
        steps = ["listen", "llm"]
        if s.speak:
            steps += ["llm"] * max(0, s.llm_steps - 1) + ["tts"] * s.tts_steps + ["t2w"] * s.t2w
        else:
            steps += ["llm"] * max(0, s.llm_steps - 1)
        return steps


def simulate(table: CostTable, shapes: Sequence[Sequence[Shape]], seconds: int) -> List[List[float]]:
    """Each session's seconds' latency (ms, arrival to done) over ``seconds`` seconds on the simulated device."""
    return _Twin(table, shapes, seconds).run()


def predict(table: CostTable, shapes: Sequence[Sequence[Shape]], counts: Sequence[int], seconds: int = 60
            ) -> Dict[int, Dict[str, float]]:
    """Per session count (the first ``n`` sessions' shapes, each cycled): late seconds, mean and p99 latency."""
    out = {}
    for n in counts:
        lat = [x for row in simulate(table, [shapes[i % len(shapes)] for i in range(n)], seconds) for x in row]
        lat.sort()
        out[n] = {"seconds": len(lat), "late": sum(1 for x in lat if x > 1000.0),
                  "mean_ms": round(sum(lat) / len(lat), 1),
                  "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1)}
    return out


def capacity(table: CostTable, shapes: Sequence[Sequence[Shape]], most: int = 64, seconds: int = 60) -> int:
    """The most sessions with no late second on the simulated device (1 .. ``most``)."""
    best = 0
    for n in range(1, most + 1):
        if predict(table, shapes, [n], seconds)[n]["late"]:
            break
        best = n
    return best
