"""The memory plot against the card's size, offscreen (pytest-qt).

On CUDA-like info the plot draws the card's total memory (and the process cap) as labelled lines, in range once
the allocator's reserved bytes come within half of one; on the CPU it draws none and says why in its legend; the
replay view shows the same from an exported session's info, old exports without the fields still load, and the
app's export carries the fields.
"""
from __future__ import annotations

import json
import types

import pytest
import torch

from app.audio_io import FileInput
from app.plots import CPU_NOTE, UNRECORDED_NOTE, MemoryPlot, memory_limits
from app.review import CompareWindow
from app.viewmodel import SessionSeries
from engine.session import SecondRecord, SessionConfig, export_records
from engine.session.card_memory import device_memory
from test_app_fakes import SlowRunner, make_window, stop

MIB = 1 << 20
CARD_MIB = 143771.0                      # an H200's total_memory, in MiB
CUDA_INFO = {"device": "cuda:0", "tail_title": "Mimi decoder", "backbone_title": "Synthetic",
             "device_memory_mib": CARD_MIB, "memory_cap_mib": None}
TINY = SessionConfig(tail="mimi", backbone="synthetic", size="tiny", device="cpu", graph_replay=False)


def _series(reserved_mib: float, state_mib: float = 600.0, n: int = 6) -> SessionSeries:
    s = SessionSeries()
    for i in range(n):
        s.add(dict(index=i, listen_ms=10.0, think_ms=50.0, speak_ms=40.0, total_ms=100.0, deadline_ms=1000.0,
                   late_ms=0.0, missed=False, demand_sized=True, graph_replay=True, decision="speak",
                   state_bytes=int(state_mib * MIB), reserved_bytes=int(reserved_mib * MIB * (0.9 + 0.02 * i))))
    return s


def _plot(qtbot, info: dict, series: SessionSeries) -> MemoryPlot:
    p = MemoryPlot()
    qtbot.addWidget(p)
    p.set_info(info)
    p.update_from(series)
    return p


def _legend(p: MemoryPlot):
    return [label.text for _, label in p.legend.items]


def _top(p: MemoryPlot) -> float:
    return p.getPlotItem().viewRange()[1][1]


def test_card_line_on_cuda_info(qtbot):
    """Reserved within half of the card: the card's line is drawn at its size, labelled, and in range."""
    p = _plot(qtbot, CUDA_INFO, _series(reserved_mib=90_000.0))
    card, cap = p.lines
    assert card.isVisible() and not cap.isVisible()
    assert card.value() == pytest.approx(CARD_MIB / 1024)               # GiB on the axis
    assert card.label.format == "card 140.4 GiB"
    assert _top(p) > card.value()
    item = p.getPlotItem()
    assert item.getAxis("left").labelText == "GiB: state arena, reserved, card"
    title = item.titleLabel.text
    assert title.startswith("Memory: reserved peak ") and "of the card (140.4 GiB)" in title
    assert "card total" in _legend(p) and CPU_NOTE not in _legend(p)


def test_far_below_the_card_the_plot_keeps_its_scale_and_says_the_share(qtbot):
    """Reserved at ~1% of the card: the y-range fits the data (the line is off scale); the title gives the share."""
    p = _plot(qtbot, CUDA_INFO, _series(reserved_mib=1500.0))
    assert p.lines[0].isVisible() and _top(p) < p.lines[0].value()
    reserved = float(_series(1500.0).memory_mib()["reserved"].max())
    assert f"{100 * reserved / CARD_MIB:.0f}% of the card" in p.getPlotItem().titleLabel.text


def test_process_cap_line(qtbot):
    """A per-process cap below the card: a second line labelled "cap", and the title's share is of the cap."""
    info = dict(CUDA_INFO, memory_cap_mib=22528.0)
    p = _plot(qtbot, info, _series(reserved_mib=20_000.0))
    card, cap = p.lines
    assert cap.isVisible() and cap.value() == pytest.approx(22.0)
    assert cap.label.format == "process cap 22.0 GiB (16% of the card)"
    assert _top(p) > cap.value() and _top(p) < card.value()            # the card is far: only the cap is near
    assert "of the process cap (22.0 GiB)" in p.getPlotItem().titleLabel.text
    assert p.getPlotItem().getAxis("left").labelText.endswith("card and cap")


def test_cpu_info_draws_no_line_and_says_so(qtbot):
    p = _plot(qtbot, {"device": "cpu", "device_memory_mib": None, "memory_cap_mib": None},
              _series(reserved_mib=0.0, state_mib=3.0))
    assert not any(line.isVisible() for line in p.lines)
    assert CPU_NOTE in _legend(p) and "card total" not in _legend(p)
    assert p.getPlotItem().titleLabel.text == "State memory"
    assert p.getPlotItem().getAxis("left").labelText == "MiB: state arena, reserved (CUDA only)"
    p.set_info(CUDA_INFO)                                   # the next session's info replaces the note
    assert CPU_NOTE not in _legend(p) and p.lines[0].isVisible()


def test_memory_limits_from_info():
    assert memory_limits({}) == ([], "")
    assert memory_limits({"device": "cuda"}) == ([], UNRECORDED_NOTE)         # an older session
    assert memory_limits({"device": "cpu"}) == ([], CPU_NOTE)
    assert memory_limits(dict(CUDA_INFO, memory_cap_mib=CARD_MIB))[0] == [("card 140.4 GiB", CARD_MIB)]
    for bad in ("140 GiB", -1.0, float("nan"), True, [1]):         # a remote engine's info, not trusted
        assert memory_limits(dict(CUDA_INFO, device_memory_mib=bad)) == ([], UNRECORDED_NOTE)
    assert len(memory_limits(dict(CUDA_INFO, memory_cap_mib="22 GiB"))[0]) == 1


def test_device_memory_reads_the_card_and_the_cap(monkeypatch):
    """The session's info fields: None on the CPU; on CUDA the card's total and the capped share, in MiB."""
    assert device_memory("cpu") == {"device_memory_mib": None, "memory_cap_mib": None}
    props = types.SimpleNamespace(total_memory=int(CARD_MIB * MIB))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 1.0)
    assert device_memory("cuda:0") == {"device_memory_mib": CARD_MIB, "memory_cap_mib": None}
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 0.25)
    assert device_memory("cuda:0") == {"device_memory_mib": CARD_MIB, "memory_cap_mib": CARD_MIB / 4}


def test_session_info_carries_the_fields_on_the_cpu():
    from engine.session import DuplexSession
    s = DuplexSession(TINY)
    s.start()
    try:
        assert s.info["device_memory_mib"] is None and s.info["memory_cap_mib"] is None
    finally:
        s.close()


def _export(folder, info: dict, reserved_mib: float, n: int = 4):
    recs = [SecondRecord(index=i, wall_start=1000.0 + i, listen_ms=10.0, think_ms=50.0, speak_ms=40.0,
                         total_ms=100.0, deadline_ms=1000.0, late_ms=0.0, missed=False, queue_wait_ms=0.0,
                         decision="speak", tokens=25, state_bytes=600 * MIB, alloc_bytes=0,
                         reserved_bytes=int(reserved_mib * MIB), peak_bytes=0, demand_sized=True, graph_replay=True,
                         tail="mimi", backbone="synthetic", input_rms=0.1, output_rms=0.1) for i in range(n)]
    export_records(recs, folder, metadata=info)
    return folder


def test_review_shows_the_line_and_old_exports_load(qtbot, tmp_path):
    """The replay view draws the card line from the export's info; an export from before the fields (CUDA,
    no size) loads with a note, a CPU one with the CPU's note; side by side they share one unit and range."""
    w = CompareWindow()
    qtbot.addWidget(w)
    cuda = w.open_folder(_export(tmp_path / "cuda", CUDA_INFO, reserved_mib=100_000.0))
    assert cuda.memory_plot.lines[0].isVisible() and cuda.memory_plot.lines[0].label.format == "card 140.4 GiB"
    old_info = {k: v for k, v in CUDA_INFO.items() if not k.endswith("_mib")}
    old = w.open_folder(_export(tmp_path / "old", old_info, reserved_mib=2000.0))
    assert old is not None and not old.memory_plot.lines[0].isVisible()
    assert UNRECORDED_NOTE in _legend(old.memory_plot)
    cpu = w.open_folder(_export(tmp_path / "cpu", {"device": "cpu"}, reserved_mib=0.0), beside=True)
    assert CPU_NOTE in _legend(cpu.memory_plot)
    a = w.open_folder(tmp_path / "cuda")
    b = w.open_folder(tmp_path / "cpu", beside=True)
    assert a is not None and b is not None
    assert b.memory_plot.getPlotItem().getAxis("left").labelText.startswith("GiB")     # one unit for both
    assert _top(a.memory_plot) == pytest.approx(_top(b.memory_plot)) and _top(b.memory_plot) > CARD_MIB / 1024


class CudaLikeRunner(SlowRunner):
    """SlowRunner whose session says it runs on a CUDA card with a per-process cap."""

    def __init__(self, cfg):
        super().__init__(cfg, work_s=0.01)
        self.session.info.update(device="cuda:0", device_memory_mib=CARD_MIB, memory_cap_mib=22528.0)


def test_live_window_shows_the_card_and_its_export_carries_the_fields(qtbot, tmp_path, speech_wav):
    w = make_window(qtbot, tmp_path, CudaLikeRunner)
    assert w.start_with(TINY, FileInput(speech_wav, speed=4.0))
    qtbot.waitUntil(lambda: len(w.controller.records) >= 3, timeout=10000)
    stop(qtbot, w)
    assert [line.isVisible() for line in w.memory_plot.lines] == [True, True]
    assert w.memory_plot.lines[1].label.format.startswith("process cap 22.0 GiB")
    w.export_to(tmp_path / "out")
    other = json.loads((tmp_path / "out" / "session.trace.json").read_text())["otherData"]
    assert other["device_memory_mib"] == CARD_MIB and other["memory_cap_mib"] == 22528.0
    rows = [json.loads(x) for x in (tmp_path / "out" / "session.jsonl").read_text().splitlines()]
    assert len(rows) == len(w.controller.records) and all("reserved_bytes" in r for r in rows)
    assert "reserved_bytes" in (tmp_path / "out" / "session.csv").read_text().splitlines()[0].split(",")
