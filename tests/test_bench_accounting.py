"""Per-second accounting in ``duplexcadence-bench session`` (engine/bench/accounting.py): kernel ms, kernel and
graph launches per speaking / listening second next to the unprofiled wall time (CPU, tiny sizes)."""
import csv
import json

import pytest
import torch

from engine.bench import accounting


class Event:
    """A kineto event as the profiler hands it over: activity type, name, duration."""

    def __init__(self, kind, name, ns=0):
        self.kind, self._name, self.ns = kind, name, ns

    def activity_type(self):
        return self.kind

    def name(self):
        return self._name

    def duration_ns(self):
        return self.ns


EVENTS = [Event("cpu_op", "aten::mm", 5000), Event("cpu_op", "aten::add", 100),
          Event("cuda_runtime", "cudaLaunchKernel", 900), Event("cuda_runtime", "cudaLaunchKernelExC_v11060"),
          Event("cuda_driver", "cuLaunchKernel"), Event("cuda_runtime", "cudaGraphLaunch_v10000"),
          Event("cuda_runtime", "cudaMemcpyAsync"), Event("cuda_runtime", "cudaStreamSynchronize"),
          Event("kernel", "gemm", 1_500_000), Event("kernel", "elementwise", 250_000),
          Event("kernel", "graph node", 2_000_000), Event("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 7000),
          Event("gpu_memset", "Memset (Device)", 300)]


def test_count_events_sums_kernels_and_counts_launches_graphs_and_copies():
    c = accounting.count_events(EVENTS, cuda=True)
    assert c["kernel_ms"] == pytest.approx(3.75) and c["kernels"] == 3
    assert c["kernel_launches"] == 3                  # runtime (versioned name too) and driver launch calls
    assert c["graph_launches"] == 1 and c["memcpy"] == 1 and c["memset"] == 1 and c["cpu_ops"] == 2


class DeviceEvent:
    """torch 2.11's _KinetoEvent: no activity_type(), a device_type() instead."""

    def __init__(self, e):
        self.e = e

    def device_type(self):
        gpu = self.e.kind in ("kernel", "gpu_memcpy", "gpu_memset")
        return torch.autograd.DeviceType.CUDA if gpu else torch.autograd.DeviceType.CPU

    def name(self):
        return self.e.name()

    def duration_ns(self):
        return self.e.ns


def test_count_events_ranks_kernels_by_summed_time_under_their_short_names():
    gemv = "void gemv2T_kernel_val<int, int, __nv_bfloat16, float, 128, 16>(cublasGemvParamsEx<int>, float)"
    events = [Event("kernel", gemv, 300_000), Event("kernel", "elementwise", 250_000),
              Event("kernel", gemv.replace("float)", "int)"), 400_000), Event("kernel", "tiny", 1_000)]
    top = accounting.top_kernels(accounting.count_events(events, cuda=True)["kernel_tally"])
    assert top == [{"kernel": "gemv2T_kernel_val<int, int, __nv_bfloat16, float, 128, 16>", "n": 2,
                    "ms": pytest.approx(0.7)},
                   {"kernel": "elementwise", "n": 1, "ms": pytest.approx(0.25)},
                   {"kernel": "tiny", "n": 1, "ms": pytest.approx(0.001)}]
    many = [Event("kernel", f"k{i:02d}", 1000 * (i + 1)) for i in range(30)]
    top = accounting.top_kernels(accounting.count_events(many, cuda=True)["kernel_tally"])
    assert [k["kernel"] for k in top] == [f"k{i:02d}" for i in range(29, 29 - accounting.TOP_KERNELS, -1)]
    assert accounting.kernel_name("x" * 200).endswith("…") and len(accounting.kernel_name("x" * 200)) == 120
    assert accounting.kernel_name("void at::native::elementwise_kernel<128, 4, at::native::(anonymous namespace)::"
                                  "add<float>>(int, float*)") == "elementwise_kernel<128, 4, add<float>>"


def test_means_add_the_top_kernels_up_per_kind_and_the_table_lists_them():
    sec = lambda speaking: {"speaking": speaking, **{f: 1.0 for f in accounting.MEAN_FIELDS}}  # noqa: E731
    tally = lambda ms: {"gemm": (4, ms), "norm": (2, 1.0)}                                   # noqa: E731
    m = accounting.means([sec(True), sec(True), sec(False)], [tally(10.0), tally(20.0), tally(2.0)])
    assert m["speaking"]["top_kernels"] == [{"kernel": "gemm", "n": 4.0, "ms": 15.0},
                                            {"kernel": "norm", "n": 2.0, "ms": 1.0}]
    assert m["listening"]["top_kernels"][0] == {"kernel": "gemm", "n": 4.0, "ms": 2.0}
    # a kernel past one second's top list still counts in that second's mean: its whole tally is averaged
    many = {f"k{i:02d}": (1, float(i)) for i in range(accounting.TOP_KERNELS + 5)}
    low = dict(many, gemm=(1, 0.5))                       # gemm is last in this second
    hi = dict(many, gemm=(1, 100.0))
    top = accounting.means([sec(True), sec(True)], [low, hi])["speaking"]["top_kernels"]
    assert top[0] == {"kernel": "gemm", "n": 1.0, "ms": 50.25}
    text = accounting.format_kernels({"graphs": m})
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()]
    assert ["graphs", "speaking", "15.0", "4.0", "gemm"] in cells
    assert ["graphs", "listening", "2.0", "4.0", "gemm"] in cells
    assert max(len(line) for line in text.splitlines()) <= 120
    cpu = accounting.means([sec(True)], [None])
    assert cpu["speaking"]["top_kernels"] is None and cpu["listening"]["top_kernels"] is None
    assert accounting.format_kernels({"eager": cpu}) == ""


def test_decoder_benches_count_kernels_per_audio_second_from_the_same_tally():
    """The Mimi and Nemotron codec benches' kernel numbers come from the accounting's counts (one tally)."""
    c = accounting.count_events(EVENTS, cuda=True)
    per = accounting.per_audio_second(c, 0.5, most=2)
    assert per["kernels_per_audio_s"] == 6 and per["kernel_ms_per_audio_s"] == pytest.approx(7.5)
    assert per["top_kernels_ms_per_audio_s"] == {"graph node": 4.0, "gemm": 3.0}


def test_count_events_from_device_types_where_torch_has_no_activity_type():
    """Device call D (torch 2.11): '_KinetoEvent' object has no attribute 'activity_type' — the same counts."""
    assert accounting.count_events([DeviceEvent(e) for e in EVENTS], cuda=True) == \
        accounting.count_events(EVENTS, cuda=True)


def test_count_events_on_the_cpu_leaves_the_cuda_fields_empty_not_zero():
    c = accounting.count_events([e for e in EVENTS if e.kind == "cpu_op"], cuda=False)
    assert c["cpu_ops"] == 2
    assert all(c[f] is None for f in accounting.CUDA_FIELDS)


def test_pick_seconds_halves_spreads_and_avoids_the_first_and_capturing_seconds():
    speaking = [False] * 4 + [True] * 6 + [False] * 10
    captures = [3] + [0] * 3 + [5] + [0] * 15                  # second 4: the first speaking one captured
    picks = accounting.pick_seconds(speaking, captures, 6)
    assert [k for k in picks if speaking[k]] == [5, 7, 9]
    assert [k for k in picks if not speaking[k]] == [1, 13, 19]
    assert accounting.pick_seconds(speaking[:4], captures[:4], 4) == [1, 2, 3]    # no speaking second: listening fills
    assert accounting.pick_seconds(speaking, captures, 0) == []
    with pytest.raises(ValueError, match="--account-seconds must be 0 or more"):
        accounting.pick_seconds(speaking, captures, -1)


def test_bench_session_accounts_speaking_and_listening_seconds_on_cpu(tmp_path, capsys, one_torch_thread):
    from engine.bench.cli import main
    rc = main(["session", "--seconds", "6", "--size", "tiny", "--device", "cpu", "--modes", "graphs",
               "--flip-seconds", "0", "--no-digests", "--account-seconds", "4", "--quiet", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    text = " ".join(out.split())
    assert "wall ms from the main, unprofiled run" in text and "CPU op count is given instead" in text
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["account_seconds"] == 4 and doc["modes"]["graphs"]["mean_speaking_second_ms"] > 0    # old keys kept
    acc = doc["modes"]["graphs"]["accounting"]
    with open(tmp_path / "session-graphs.csv") as f:
        main_run = list(csv.DictReader(f))                   # the main, unprofiled run's records
    per = acc["per_second"]
    assert acc["seconds"] == [e["index"] for e in per] == [1, 3, 4, 5]
    for e in per:
        rec = main_run[e["index"]]
        assert e["speaking"] == (rec["decision"] == "speak") and e["decision_matches_main"], e
        assert e["wall_ms"] == pytest.approx(float(rec["total_ms"]), abs=1e-5)
        assert e["graph_replays_counted"] == e["graph_replays_main"] == e["graph_captures_counted"] == 0
        assert e["cpu_ops"] > 0 and e["profiled_wall_ms"] > 0
        assert all(e[f] is None for f in accounting.CUDA_FIELDS)            # no CUDA numbers made up on the CPU
        assert e["top_kernels"] is None
    for kind, flag in (("speaking", True), ("listening", False)):
        rows = [e for e in per if e["speaking"] is flag]
        assert acc[kind]["seconds"] == len(rows) == 2
        for f in ("wall_ms", "cpu_ops", "graph_replays_counted"):
            assert acc[kind][f] == pytest.approx(sum(e[f] for e in rows) / len(rows)), (kind, f)
        assert acc[kind]["kernel_ms"] is None and acc[kind]["kernel_launches"] is None
    assert acc["speaking"]["top_kernels"] is None
    md = (tmp_path / "bench.md").read_text()
    assert "where the kernel time goes" not in md
    assert "**per-second accounting**" in md and "| eager (graph replay unavailable) | speaking" in md


def test_bench_session_refuses_a_negative_account_seconds_in_one_line(tmp_path, capsys):
    from engine.bench.cli import main
    rc = main(["session", "--seconds", "2", "--size", "tiny", "--device", "cpu", "--account-seconds", "-1",
               "--quiet", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["duplexcadence-bench session: error: --account-seconds must be 0 or more, not -1"]
    assert not (tmp_path / "bench.json").exists()


def test_account_at_counts_the_seconds_named_even_the_first_and_capturing_ones(tmp_path, capsys, one_torch_thread):
    """``--account-at``: the seconds a run named (the first speaking one, its slowest) are counted as asked, the
    first second included, with --account-seconds 0; a bad list is refused in one line before anything runs."""
    assert accounting.parse_at("10, 3,3", 20) == [3, 10] and accounting.parse_at(None, 5) is None
    assert accounting.parse_at(" ", 5) is None
    for bad, msg in (("3,x", "whole seconds separated by commas"), ("5", "must lie in 0..4"), ("-1", "0..4")):
        with pytest.raises(ValueError, match=msg):
            accounting.parse_at(bad, 5)
    from engine.bench.cli import main
    rc = main(["session", "--seconds", "4", "--size", "tiny", "--device", "cpu", "--modes", "graphs",
               "--flip-seconds", "0", "--no-digests", "--account-seconds", "0", "--account-at", "0,3", "--quiet",
               "--out", str(tmp_path)])
    assert rc == 0
    acc = json.loads((tmp_path / "bench.json").read_text())["modes"]["graphs"]["accounting"]
    assert acc["seconds"] == [e["index"] for e in acc["per_second"]] == [0, 3]
    assert all(e["decision_matches_main"] and e["cpu_ops"] > 0 for e in acc["per_second"])
    capsys.readouterr()
    rc = main(["session", "--seconds", "2", "--size", "tiny", "--device", "cpu", "--account-at", "2", "--quiet",
               "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["duplexcadence-bench session: error: --account-at '2': each second must lie in 0..1 "
                               "(--seconds 2)"]
    assert not (tmp_path / "bad").exists()


class Op:
    """A profiler FunctionEvent as ``prof.events()`` hands it over with ``with_stack``: name, parent, CPU time."""

    def __init__(self, name, parent=None, us=0.0, device="DeviceType.CPU"):
        self.name, self.cpu_parent, self.cpu_time_total, self.device_type = name, parent, us, device


def test_host_sites_charge_each_top_level_op_to_our_innermost_frame():
    from engine.bench import host_sites as hs
    outer = Op("/work/main/engine/backbones/minicpmo45/protocol.py(130): prefill")
    inner = Op("engine/backbones/minicpmo45/llm.py(46): forward", outer)
    torch_frame = Op("torch/nn/modules/module.py(1750): _call_impl", inner)
    mm = Op("aten::mm", torch_frame, 40.0)
    child = Op("aten::resolve_conj", mm, 1.0)                 # dispatched by aten::mm: in its total, not counted
    add = Op("aten::add", outer, 10.0)
    builtin = Op("<built-in method item of Tensor object at 0x1>", outer)
    item = Op("aten::item", builtin, 5.0)
    stray = Op("aten::empty", Op("torch/profiler/profiler.py(1118): __enter__"), 2.0)
    kernel = Op("gemm", None, 99.0, "DeviceType.CUDA")
    t = hs.tally([outer, inner, torch_frame, mm, child, add, builtin, item, stray, kernel])
    assert t == {"engine/backbones/minicpmo45/llm.py:forward": (1, 0.04),
                 "engine/backbones/minicpmo45/protocol.py:prefill": (2, 0.015), hs.OUTSIDE: (1, 0.002)}
    assert [x["site"] for x in hs.top(t)] == ["engine/backbones/minicpmo45/protocol.py:prefill", hs.OUTSIDE,
                                              "engine/backbones/minicpmo45/llm.py:forward"]    # ties: by name
    assert hs.site("C:\\repo\\engine\\core\\graphs.py(270): replay") == "engine/core/graphs.py:replay"
    assert hs.site("aten::mm") is None and hs.site("torch/functional.py(9): f") is None


def test_a_profiled_window_names_the_engine_function_that_ran_its_ops():
    """A real profile on the CPU: the ops of ``rope_tables`` are charged to it, Python frames are not counted as
    CPU operators, and the counts without sites are the same operators."""
    from engine.backbones.minicpmo45.layers import rope_tables
    run = lambda: rope_tables(torch.arange(6), 8, 10000.0, torch.float32)     # noqa: E731
    run()                                                   # its frequencies cached, as in both windows below
    _, plain = accounting.profiled(run, cuda=False)
    _, c = accounting.profiled(run, cuda=False, sites=True)
    top = {x["site"]: x for x in accounting.host_sites.top(c["site_tally"])}
    assert top["engine/backbones/minicpmo45/layers.py:rope_tables"]["ops"] >= 4
    assert c["cpu_ops"] == plain["cpu_ops"] and "site_tally" not in plain


def test_bench_session_account_sites_on_cpu(tmp_path, capsys, one_torch_thread):
    from engine.bench.cli import main
    rc = main(["session", "--seconds", "6", "--size", "tiny", "--device", "cpu", "--modes", "graphs",
               "--flip-seconds", "0", "--no-digests", "--account-seconds", "4", "--account-sites", "--quiet",
               "--out", str(tmp_path)])
    assert rc == 0
    assert "where the host operators come from" in (tmp_path / "bench.md").read_text()
    doc = json.loads((tmp_path / "bench.json").read_text())
    acc = doc["modes"]["graphs"]["accounting"]
    assert doc["account_sites"] is True
    for e in acc["per_second"]:
        sites = e["top_host_sites"]
        assert sites and all(s["site"].startswith("engine/") or s["site"] == "(not called from engine/)"
                             for s in sites)
        assert sum(s["ops"] for s in sites) <= e["cpu_ops"]
    for kind in ("speaking", "listening"):
        assert acc[kind]["top_host_sites"], kind
    capsys.readouterr()
