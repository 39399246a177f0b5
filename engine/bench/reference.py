"""Every session of a capacity run against its own reference, every second: the bits the load must not change.

A session under load gives each second's output a digest (:func:`engine.host.drive.digest`). Afterwards each
session's whole input — every frame it was fed, in order — runs again, and every second's digest must come out
the same:

* ``own-steps``: every session at once, in the same host (its weights) with its scheduler's batched steps off
  (each session its own steps only, on its own stream, unpaced): what each would give alone, without running the
  device one session at a time;
* ``alone``: ``count`` sessions (spread over the run) each by itself in a plain
  :class:`~engine.session.DuplexSession` around the host's weights (read only), no scheduler at all.

Returns, per session, whether every second matched and the first second that did not.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

from engine.host import EngineHost, WeightsKey
from engine.host.drive import Driven, digest
from engine.session import DuplexSession, LiveError, SessionConfig


def _compare(got: Sequence[str], want: Sequence[str]) -> Dict[str, object]:
    first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if first is None and len(got) != len(want):
        first = min(len(got), len(want))
    return {"seconds": len(want), "identical": first is None, "first_difference": first}


def own_steps(host: EngineHost, cfg: SessionConfig, driven: Sequence[Driven]) -> Dict[int, Dict[str, object]]:
    """Each session's whole input again, all at once in ``host`` (its sessions under load gone) with its batched
    steps off; per session index: the comparison with its digests under load."""
    was, host.scheduler.batched = host.scheduler.batched, False
    try:
        runners = [host.open(cfg, force=True) for _ in driven]
        for r in runners:
            r.start()
        for r in runners:
            r.ready.wait()
        for d, r in zip(driven, runners):
            for k in range(len(d.digests)):
                r.submit(d.frames[k % len(d.frames)])
        out = {}
        for d, r in zip(driven, runners):
            got: List[str] = []
            for _ in range(len(d.digests)):
                res = r.results.get()
                if isinstance(res, LiveError):
                    break
                got.append(digest(res.audio))
            out[d.index] = _compare(got, d.digests)
        for r in runners:
            r.stop(timeout=60.0)
        return out
    finally:
        host.scheduler.batched = was


def alone(host: EngineHost, cfg: SessionConfig, driven: Sequence[Driven], count: int
          ) -> Dict[int, Dict[str, object]]:
    """``count`` sessions of ``driven`` (spread evenly), each run by itself in a plain session around ``host``'s
    weights (the calling thread launches its work: call it with the host's sessions gone)."""
    if count <= 0 or not driven:
        return {}
    from engine import registry
    step = max(1, len(driven) // count)
    out = {}
    for d in list(driven)[::step][:count]:
        shared_tail = host.weights.get(WeightsKey.tail(cfg))
        tail = None if shared_tail is None else registry.get_tail(cfg.tail).make_tail(
            size=cfg.size, device=cfg.device, seed=cfg.seed, checkpoint=cfg.checkpoint, shared=shared_tail)
        s = DuplexSession(cfg, tail=tail, backbone_shared=host.weights.get(WeightsKey.backbone(cfg)))
        s.start()
        try:
            got = [digest(s.process(d.frames[k % len(d.frames)])[0]) for k in range(len(d.digests))]
        finally:
            s.close()
        out[d.index] = _compare(got, d.digests)
    return out
