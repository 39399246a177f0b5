"""Benchmarks people can share: one percentile / byte formatter / table helper (engine/stats.py), and every
``duplexcadence-bench`` command writing an aligned markdown table and a PNG next to its JSON (CPU, tiny sizes)."""
import json

import numpy as np
import pytest

import oracles

from engine.stats import format_bytes, percentile, table

PNG = b"\x89PNG\r\n\x1a\n"


def test_percentile_is_numpys_linear_percentile():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 60):
        v = rng.standard_normal(n).tolist()
        for q in (0, 10, 50, 90, 99, 100):
            assert percentile(v, q) == pytest.approx(float(np.percentile(v, q)), abs=0, rel=1e-15)
    assert percentile([], 50) == 0.0


def test_format_bytes_in_binary_units():
    assert [format_bytes(x) for x in (0, 512, 3.5 * 1024, 41 * 2 ** 20, 2.14 * 2 ** 30)] == \
        ["0 B", "512 B", "3.5 KiB", "41.0 MiB", "2.14 GiB"]


def test_table_wraps_for_a_terminal_and_not_for_markdown():
    rows = [["a rather long variant name that wraps", 1.0, "x"], ["b", 22.5, "y"]]
    heads = ["variant", "a long header that wraps", "z"]
    term = table(rows, heads, max_widths=[16, None, None], header_width=10).splitlines()
    assert max(len(line) for line in term) < 50 and len({len(line) for line in term}) == 1   # aligned
    md = table(rows, heads, max_widths=[16, None, None], header_width=10, wrap=False).splitlines()
    assert len(md) == 4 and set(md[1]) <= set("|-:")          # header, delimiter, one line per row


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_bench_plan_fits_120_columns_and_writes_json_md_png(tmp_path, capsys):
    from engine.bench.cli import main
    assert main(["plan", "--quiet", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "shape signatures" in out and _widest(out) <= 120
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert {"mimi", "step-audio2"} <= {m["model"] for m in doc["models"]}
    assert doc["provenance"]["command"] == "duplexcadence-bench plan --quiet --out " + str(tmp_path)
    assert "Planner" in (tmp_path / "plan.md").read_text()
    assert (tmp_path / "plan.png").read_bytes().startswith(PNG)


def test_bench_session_on_cpu_says_graph_replay_is_unavailable(tmp_path, capsys, one_torch_thread):
    from engine.bench.cli import main
    rc = main(["session", "--seconds", "2", "--size", "tiny", "--device", "cpu", "--flip-seconds", "0",
               "--quiet", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "stock-like" in out and "eager (graph replay" in out
    assert "| graphs" not in out and "| stock " not in out
    assert _widest(out) <= 120
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["modes"]["graphs"]["label"] == "eager (graph replay unavailable)"
    assert doc["modes"]["stock"]["label"] == "stock-like"
    for m in ("stock", "graphs"):                # each run's slowest second named, and each second's GC time
        w, mode = doc["modes"][m]["slowest_second"], doc["modes"][m]
        assert w["index"] in (0, 1) and w["total_ms"] >= mode["p99_total_ms"] - 1e-6 and w["captures"] == 0
        assert len(mode["gc_ms_per_second"]) == 2 and min(mode["gc_ms_per_second"]) >= 0
    assert "stock-like, slowest second: " in out and "garbage collection: " in " ".join(out.split())
    assert doc["reference"] == "stock" and doc["identical"] == {"graphs": True}     # never the reference vs itself
    assert doc["provenance"]["command"].startswith("duplexcadence-bench session --seconds 2 --size tiny")
    assert doc["provenance"]["device"].startswith("cpu") and doc["provenance"]["cudnn"] == "none (CPU run)"
    assert "bit-identical to the reference (stock-like): True (eager (graph replay unavailable): True)" in \
        " ".join(out.split())
    md = (tmp_path / "bench.md").read_text()
    assert "| eager (graph replay unavailable) |" in md             # one line per row in the .md
    assert (tmp_path / "bench.png").read_bytes().startswith(PNG)


def test_bench_session_takes_the_voice_and_refuses_a_missing_one_in_one_line(tmp_path, capsys):
    from engine.bench.cli import main
    rc = main(["session", "--seconds", "1", "--size", "tiny", "--device", "cpu", "--voice",
               str(tmp_path / "nowhere.npz"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "nowhere.npz" in err[0] and err[0].startswith(
        "duplexcadence-bench session: error:")


def test_bench_session_compares_only_distinct_runs():
    """The reference is compared with the other runs only: a changed run is found, one run alone compares nothing."""
    from engine.bench.session import identical_to_reference, same_line
    ref = np.random.default_rng(0).standard_normal(48000).astype(np.float32)
    other = ref.copy()
    other[123] = np.nextafter(other[123], np.float32(np.inf))                    # one ulp in one sample
    audio = {"stock": ref, "graphs": ref.copy(), "demand": other}
    assert identical_to_reference(["stock", "graphs", "demand"], audio) == {"graphs": True, "demand": False}
    assert identical_to_reference(["graphs"], audio) == {}
    labels = {"stock": "stock-like", "graphs": "graphs"}
    assert same_line({}, labels, "graphs", None, 0, 60).startswith("outputs bit-identical across modes: n/a (one run")
    line = same_line({"graphs": True}, labels, "stock", True, 60, 60)
    assert "(graphs: True)" in line and "stock-like: True" not in line and "(all 60 s): True" in line
    assert "(the first 10 of 60 s only): True" in same_line({"graphs": True}, labels, "stock", True, 10, 60)


def test_flip_schedule_flips_both_toggles_before_every_second_of_the_run():
    from engine.bench.session import flip_schedule
    for n in (1, 2, 7, 60):
        sched = flip_schedule(n)
        assert len(sched) == n and sched[0] == {"demand_sized": False, "graph_replay": False}
        for k in range(1, n):
            assert all(sched[k][t] != sched[k - 1][t] for t in ("demand_sized", "graph_replay")), (n, k)


def test_bench_session_one_run_says_n_a_and_flips_over_the_whole_run(tmp_path, capsys, one_torch_thread):
    import csv
    from engine.bench.cli import main
    rc = main(["session", "--seconds", "3", "--size", "tiny", "--device", "cpu", "--modes", "graphs",
               "--no-digests", "--quiet", "--out", str(tmp_path)])
    assert rc == 0
    out = " ".join(capsys.readouterr().out.split())                  # the terminal's lines unwrapped
    assert "bit-identical across modes: n/a (one run" in out and "toggles flipped every second (all 3 s): True" in out
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["identical"] == "n/a" and doc["flip_identical"] is True and doc["flip_seconds"] == 3
    with open(tmp_path / "session-flipped.csv") as f:                   # what each second of the flip run ran with
        assert [r["demand_sized"] for r in csv.DictReader(f)] == ["False", "True", "False"]


@pytest.mark.oracle
def test_bench_step_audio2_dry_run_interleaves_and_writes_json_md_png(tmp_path, capsys, one_torch_thread):
    oracles.require(oracles.STEPAUDIO2)
    from engine.bench.cli import main
    out = tmp_path / "sa2.json"
    rc = main(["step-audio2", "--device", "cpu", "--size", "tiny", "--chunks", "4", "--prompt-seconds", "2",
               "--modes", "graphs", "--quiet", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "as users run it" in text and "deterministic cuDNN" in text and _widest(text) <= 120
    doc = json.loads(out.read_text())
    rows = {r["variant"]: r for r in doc["rows"]}
    assert list(rows) == ["stock package", "stock package, deterministic cuDNN", "ours graphs"]
    assert rows["ours graphs"]["bit_identical"] and rows["stock package"]["bit_identical"]
    assert doc["meta"]["interleaved"] and "vs_stock_as_users_run_it" in doc["headline"]
    assert doc["provenance"]["command"].startswith("duplexcadence-bench step-audio2 --device cpu")
    assert len(rows["ours graphs"]["ms_per_chunk"]) == 4            # 4 full chunks timed, the short last one not
    assert "| ours graphs" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").read_bytes().startswith(PNG)
    assert rows["ours graphs"]["top_kernels_per_chunk"] is None           # a CUDA measurement: none on the CPU


def test_step_audio2_bench_tallies_a_chunks_kernels_by_name():
    """Where token2wav's chunk spends its kernel time (the JSON's ``top_kernels_per_chunk`` on CUDA): device events
    tallied by shortened name, then the profiled chunks' mean, most time first."""
    from types import SimpleNamespace as E
    from engine.bench import accounting
    from engine.bench.step_audio2 import device_tally
    a = device_tally([E(name="void gemm_kernel<float>(int, float*)", device_time=30.0),
                      E(name="void gemm_kernel<float>(int, float*)", device_time=50.0),
                      E(name="Memset (Device)", device_time=2.0)])
    b = device_tally([E(name="void gemm_kernel<float>(int, float*)", device_time=40.0)])
    gemm = accounting.kernel_name("void gemm_kernel<float>(int, float*)")
    assert a == {gemm: (2, 0.08), accounting.kernel_name("Memset (Device)"): (1, 0.002)}
    top = accounting.top_kernels(accounting.mean_tally([a, b]), 1)
    assert top == [{"kernel": gemm, "n": 1.5, "ms": pytest.approx(0.06)}]


@pytest.mark.oracle
def test_bench_nemotron_codec_on_cpu_writes_json_md_png_with_aligned_tables(tmp_path, capsys, one_torch_thread):
    oracles.require(oracles.NEMO)
    from engine.bench.cli import main
    out = tmp_path / "codec" / "nemo.json"
    rc = main(["nemotron-codec", "--size", "tiny", "--seconds", "2", "--warmup", "1", "--rounds", "1",
               "--window-seconds", "1", "--device", "cpu", "--quiet", "--json", str(out)])
    assert rc == 0
    term = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert len({len(line) for line in term}) == 1 and len(term[0]) <= 120          # aligned, fits a terminal
    doc = json.loads(out.read_text())
    assert {"command", "config", "modes"} <= set(doc) and "targets" not in doc        # targets: ours graphs vs nemo
    assert doc["command"].startswith("duplexcadence-bench nemotron-codec --size tiny")
    assert doc["provenance"]["command"] == doc["command"] and doc["provenance"]["torch"]
    modes = doc["modes"]
    assert list(modes)[:4] == ["nemo per-frame cached (as users run it)", "nemo per-frame cached (deterministic cuDNN)",
                               "ours stock", "ours demand"]
    assert "ours graphs" not in modes                        # no graph replay on CPU, so no row claims it
    for name in ("ours stock", "ours demand"):
        m = modes[name]
        assert m["vs_nemo"]["equal"] and m["seconds_timed"] == 1
        assert m["median_ms"] == m["p90_ms"] == m["max_ms"] > 0
    assert modes["nemo window re-decode (1 s window)"]["seconds_reached"] == 2
    md = [line for line in out.with_suffix(".md").read_text().splitlines() if line.startswith("|")]
    assert len(md) == 2 + len(modes) and len({len(line) for line in md}) == 1      # one aligned line per row
    assert set(md[1]) <= set("|-:") and md[2].startswith("| nemo per-frame cached (as users run it) ")
    assert out.with_suffix(".png").read_bytes().startswith(PNG)
