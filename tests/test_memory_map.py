"""The memory map: the caching allocator's segments grouped by who holds them (engine/bench/memory_map.py)."""
from __future__ import annotations

import pytest
import torch

from engine.bench import memory_map as M

MIB = 2 ** 20
POOLS = {(0, 7): "executor: StepAudio2", (0, 9): "tts decode"}
STREAMS = {0x55: "capture stream: warm-ups and captures"}


def _seg(total, used, pool=(0, 0), stream=0):
    return {"device": 0, "total_size": total * MIB, "allocated_size": used * MIB, "segment_pool_id": pool,
            "stream": stream}


def test_segments_are_grouped_by_pool_and_stream_largest_first():
    segs = [_seg(20, 20), _seg(2, 1), _seg(40, 12, pool=(0, 7)), _seg(20, 20, pool=(0, 9)), _seg(2, 0, pool=(0, 9)),
            _seg(60, 0, stream=0x55), _seg(2, 2, pool=(0, 3)), _seg(4, 4, stream=0x77)]
    rows = M.group(segs, POOLS, STREAMS)
    got = {r["owner"]: (r["segments"], r["reserved"] // MIB, r["in_use"] // MIB, r["free"] // MIB) for r in rows}
    assert got == {
        "cached on the capture stream: warm-ups and captures": (1, 60, 0, 60),
        "graph pool: executor: StepAudio2": (1, 40, 12, 28),
        "default stream: weights, state, eager work": (2, 22, 21, 1),
        "graph pool: tts decode": (2, 22, 20, 2),
        "cached on stream 0x77": (1, 4, 4, 0),
        "graph pool (0, 3): not a runtime's": (1, 2, 2, 0)}
    assert [r["reserved"] for r in rows] == sorted((r["reserved"] for r in rows), reverse=True)
    tot = M.totals(rows)
    assert tot == {"segments": 8, "reserved": 150 * MIB, "in_use": 59 * MIB, "free": 91 * MIB}


def test_the_default_stream_is_the_one_named():
    """A process whose default stream handle is not 0 (per-thread default streams) still files it right."""
    rows = M.group([_seg(8, 8, stream=0x2), _seg(8, 0, stream=0)], {}, {}, default_stream=0x2)
    assert {r["owner"] for r in rows} == {"default stream: weights, state, eager work", "cached on stream 0x0"}


def test_a_segment_claiming_more_than_it_holds_is_refused():
    with pytest.raises(ValueError, match="a segment of 1048576 bytes says 2097152 are allocated"):
        M.group([_seg(1, 2)], {}, {})


def test_the_printed_map_names_the_largest_groups_in_mib():
    rows = M.group([_seg(20, 20), _seg(40, 12, pool=(0, 7)), _seg(6, 6, pool=(0, 9))], POOLS, STREAMS)
    text = M.format_map("ours: graphs", {"rows": rows, "total": M.totals(rows)}, top=2)
    lines = text.splitlines()
    assert lines[0] == ("reserved memory by owner, ours: graphs: 66 MiB in 3 segments (38 in live tensors, "
                        "28 cached free)")
    assert lines[1].split()[:4] == ["graph", "pool:", "executor:", "StepAudio2"] and "40.0 MiB reserved" in lines[1]
    assert "12.0 in use" in lines[1] and "28.0 free" in lines[1]
    assert lines[3] == "  ... 1 more groups: 6.0 MiB" and len(lines) == 4
    assert M.format_map("x", None) == ""


def test_no_map_off_cuda():
    assert M.snapshot_map("cpu") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_runtimes_graph_pool_and_the_capture_stream_are_named_on_cuda():
    """A real capture: its pool is filed under the runtime's name, its warm-up's blocks under the capture stream,
    and the map adds up to what the allocator reserves."""
    from engine.core.graphs import GraphRuntime
    rt = GraphRuntime("cuda", "memory map test")
    x = torch.randn(1024, 1024, device="cuda")
    with rt.side():
        (x @ x).sum()
    g, out = rt.capture(lambda: x @ x)
    rt.replay(g)
    torch.cuda.synchronize()
    doc = M.snapshot_map("cuda")
    owners = {r["owner"]: r for r in doc["rows"]}
    assert owners["graph pool: memory map test"]["in_use"] >= out.numel() * 4
    assert "cached on the capture stream: warm-ups and captures" in owners     # the warm-up's blocks
    assert doc["total"]["reserved"] == torch.cuda.memory_reserved()
    print(M.format_map("test", doc))
