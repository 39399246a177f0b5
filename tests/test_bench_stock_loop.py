"""`duplexcadence-bench session --backbone minicpm-o-4.5 --stock-loop PYTHON`: MiniCPM-o-Demo's own
duplex loop (``tests/stock_loop/run_stock.py`` in ``.venv-stock``) next to our modes over the same folder, input
and seed, interleaved, with the rows' fields, the ratios against the stock eager row and bench.json — on the CPU
at tiny dims (8 s, one repeat). Also: bad input in one line, the pacing rule, the rows' arithmetic, and the
folder writer's streamed (``--size released``) path at tiny dims."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.bench import stock_loop as SL

ROOT = Path(__file__).resolve().parents[1]
STOCK_PY = ROOT / ".venv-stock" / "bin" / "python"
NUDGE = (4.0, 1.8)
SECONDS = 8
EAGER, WARM, COMPILED = SL.STOCK_LABELS["eager"], SL.STOCK_LABELS["warm"], SL.STOCK_LABELS["compile"]
OURS = ("ours: stock-like", "ours: eager (graph replay unavailable)")

sys.path.insert(0, str(ROOT / "tests"))
import minicpmo45_stock_folder as F  # noqa: E402
import oracles  # noqa: E402


def _bench(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "engine.bench.session", "--backbone", "minicpm-o-4.5", "--quiet",
                           *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=str(ROOT))


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    oracles.require(oracles.DEMO, oracles.STOCK_VENV)
    tmp = tmp_path_factory.mktemp("bench-stock-loop")
    folder = F.write(tmp / "MiniCPM-o-4_5", nudge=NUDGE)
    out = tmp / "out"
    # the compile row is asked with a 1 s limit: it cannot finish (the model alone takes longer to build), so
    # the row must say so in one line and carry no numbers (a real CPU compile keeps the eager stock's bits)
    r = _bench("--stock-loop", str(STOCK_PY), "--stock-loop-folder", str(folder), "--seconds", str(SECONDS),
               "--stock-loop-repeats", "1", "--stock-loop-compile-timeout", "1", "--modes", "stock,graphs",
               "--stock-loop-modes", "eager,warm,compile", "--account-seconds", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads((out / "bench.json").read_text()), out


def test_bench_prints_the_stock_rows_next_to_ours(bench):
    r, _, _ = bench
    for name in (EAGER, WARM, COMPILED, *OURS):
        assert f"| {name} " in r.stdout, name
    assert "not measured: did not finish in 1 s" in r.stdout
    assert "above 1: faster than the stock" in r.stdout


def test_rows_fields_and_ratios(bench):
    _, doc, _ = bench
    rows = doc["rows"]
    assert list(rows) == [EAGER, WARM, COMPILED, *OURS]
    assert doc["seconds"] == SECONDS and doc["repeats"] == 1 and doc["reference"] == EAGER
    assert doc["provenance"]["command"].startswith("duplexcadence-bench session --backbone minicpm-o-4.5")
    eager = rows[EAGER]
    for name in (EAGER, WARM, *OURS):
        row = rows[name]
        for m in SL.METRICS:
            assert isinstance(row[m], (int, float)) and row[m] >= 0, (name, m, row[m])
        assert row["mean_speaking_second_ms"] > 0 and row["peak_memory_bytes"] > 100 * 2 ** 20
        assert len(row["decisions"]) == SECONDS and row["decisions"][:3] == ["listen"] * 3   # the forced listens
        assert row["repeats"] == [{m: row[m] for m in SL.METRICS}]
    assert "speak" in eager["decisions"]
    for name in OURS:
        row = rows[name]
        assert row["speaking_ratio"] == pytest.approx(eager["mean_speaking_second_ms"] / row["mean_speaking_second_ms"])
        assert row["listening_ratio"] == pytest.approx(eager["mean_listening_second_ms"]
                                                       / row["mean_listening_second_ms"])
        # one torch thread each side, the same folder, input and seed: the same decisions every second
        assert row["decisions"] == eager["decisions"], name
        warm = rows[WARM]
        assert row["speaking_ratio_warm"] == pytest.approx(warm["mean_speaking_second_ms"]
                                                           / row["mean_speaking_second_ms"])
        assert row["note"] == (f"decisions as the stock eager's: {SECONDS} of {SECONDS} s; vs the warmed stock: "
                               f"{row['speaking_ratio_warm']:.2f}x speaking, {row['listening_ratio_warm']:.2f}x "
                               f"listening")
    assert rows[WARM]["note"].startswith("after one earlier 10 s session")
    assert set(rows[COMPILED]) == {"error"} and rows[COMPILED]["error"].startswith("not measured")


def test_our_rows_carry_the_per_second_accounting_and_records(bench):
    """Each of our rows has its first repeat's accounting (a separate profiled run: one speaking and one
    listening second here) printed under the rows, and its per-second records under --out; its peak counts
    the build (the CPU's measure is the process's peak RSS either way)."""
    r, doc, out = bench
    for name, mode in zip(OURS, ("stock", "graphs")):
        acc = doc["rows"][name]["accounting"]
        assert acc["counts"].startswith("cpu") and len(acc["seconds"]) == 2
        assert acc["speaking"]["seconds"] == 1 and acc["listening"]["seconds"] == 1
        assert acc["speaking"]["cpu_ops"] > acc["listening"]["cpu_ops"] > 0
        assert all(e["decision_matches_main"] for e in acc["per_second"])
        lines = (out / f"session-{mode}-1.csv").read_text().splitlines()
        assert len(lines) == SECONDS + 1 and lines[0].startswith("index,")
    assert "per-second accounting: wall ms from the main, unprofiled run" in r.stdout
    assert "accounting" not in doc["rows"][EAGER]
    for name in OURS:                           # where each second's time went, and the slowest one named
        row = doc["rows"][name]
        per = row["per_second"]
        assert len(per["captures"]) == len(per["replays"]) == len(per["gc_ms"]) == SECONDS
        assert all(x >= 0 for x in per["gc_ms"]) and per["replays"] == [0] * SECONDS   # the CPU replays nothing
        w = row["slowest_second"]
        assert 0 <= w["index"] < SECONDS and w["total_ms"] >= row["p99_total_ms"] - 1e-6
        assert f"{name}, slowest second: {w['index']} ({w['decision']})" in r.stdout


def test_the_stock_harness_records_each_second(bench):
    _, doc, out = bench
    t = json.loads((out / "stock-eager-1" / "timing.json").read_text())
    assert t["device"] == "cpu" and t["compile"] is False and t["threads"] == 1
    assert t["peak_memory_kind"] == "process peak RSS" and t["peak_memory_bytes"] == doc["rows"][EAGER][
        "peak_memory_bytes"]
    assert [s["second"] for s in t["seconds"]] == list(range(SECONDS))
    assert [s["decision"] for s in t["seconds"]] == doc["rows"][EAGER]["decisions"]
    assert all(s["ms"] > 0 and len(s["digest"]) == 16 for s in t["seconds"])
    assert max(s["ms"] for s in t["seconds"]) >= doc["rows"][EAGER]["p99_total_ms"] - 1e-6


def test_each_stock_row_says_what_it_ran_with(bench):
    """The attention kernel (asked auto, as the demo's default; on a CPU flash-attn is not usable, so SDPA), torch,
    transformers and the token2wav package with its version: in each stock run's timing.json, in its row, in
    bench.json and printed under the rows (a row that did not run has none)."""
    r, doc, out = bench
    stock_torch = subprocess.run([str(STOCK_PY), "-c", "import torch, transformers; "
                                  "print(torch.__version__, transformers.__version__)"],
                                 capture_output=True, text=True, timeout=120).stdout.split()
    for sm, name in (("eager", EAGER), ("warm", WARM)):
        w = json.loads((out / f"stock-{sm}-1" / "timing.json").read_text())["ran_with"]
        assert w == {"attention": "sdpa", "attention_asked": "auto", "torch": stock_torch[0],
                     "transformers": stock_torch[1], "flash_attn": None,
                     "token2wav": "minicpmo 0.1.2 (stepaudio2.token2wav)"}
        row = doc["rows"][name]["ran_with"]
        assert row == dict(w, compile=False, warm=sm == "warm", dtype="float32")
        assert doc["stock_ran_with"][name] == row
        line = f"{name}: ran with sdpa attention (asked auto), torch {stock_torch[0]}, transformers " \
               f"{stock_torch[1]}, token2wav minicpmo 0.1.2 (stepaudio2.token2wav), float32"
        assert line + (", warmed" if sm == "warm" else "") in " ".join(r.stdout.split()), line
    assert doc["stock_attention_asked"] == "auto" and doc["stock_ran_with"][COMPILED] is None


def test_the_stock_runs_are_asked_for_their_mode_and_attention(tmp_path, monkeypatch):
    """What the bench hands the harness: --compile for the demo's compile mode, --warm for the warmed stock, the
    attention asked (--attn), always --no-record; a run that exits with an error is a one-line row."""
    calls = []

    def fake(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "Traceback ...\nSystemExit: flash-attn is not usable here\n")
    monkeypatch.setattr(SL.subprocess, "run", fake)
    for compile, warm, attn in ((False, False, "auto"), (True, False, "sdpa"), (False, True, "flash_attention_2")):
        row = SL.run_stock(Path(sys.executable), tmp_path, tmp_path / "in.wav", tmp_path / "o", 3, 8, "cpu", 1,
                           compile, warm=warm, attn=attn)
        cmd = calls[-1]
        assert cmd[cmd.index("--attn") + 1] == attn and "--no-record" in cmd
        assert ("--compile" in cmd) is compile and ("--warm" in cmd) is warm
        assert row == {"error": "not measured: the stock loop exited 1: SystemExit: flash-attn is not usable here"}


def test_asking_for_flash_attention_where_it_cannot_run_is_a_one_line_row(tmp_path):
    """The demo fails fast where flash_attention_2 is asked and flash-attn is not usable; so does the harness, and
    the bench's eager row says so in one line (the bench then exits 1: there is no reference row)."""
    oracles.require(oracles.DEMO, oracles.STOCK_VENV)
    folder = F.write(tmp_path / "MiniCPM-o-4_5", nudge=NUDGE)
    r = _bench("--stock-loop", str(STOCK_PY), "--stock-loop-folder", str(folder), "--seconds", "4",
               "--stock-loop-repeats", "1", "--modes", "stock", "--stock-loop-modes", "eager",
               "--stock-loop-attn", "flash_attention_2", "--account-seconds", "0", "--out", str(tmp_path / "out"))
    assert r.returncode == 1, r.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert doc["rows"][EAGER] == {"error": "not measured: the stock loop exited 1: run_stock.py: --attn "
                                           "flash_attention_2, but flash-attn is not installed or not usable here"}
    assert "not measured: the stock loop exited 1" in r.stdout
    assert doc["stock_attention_asked"] == "flash_attention_2" and doc["stock_ran_with"] == {EAGER: None}


def test_the_warmed_stock_runs_an_earlier_session_and_keeps_the_bits(bench):
    """The warm row's process ran one earlier session (over the input's first seconds) before the timed one,
    and the timed one is the cold run's, second for second (decision, text, waveform hashed): the earlier
    session leaves nothing behind that changes the output, only the time."""
    _, doc, out = bench
    cold = json.loads((out / "stock-eager-1" / "timing.json").read_text())
    warm = json.loads((out / "stock-warm-1" / "timing.json").read_text())
    assert warm["warm"] is True and cold["warm"] is False and warm["compile"] is False
    assert warm["warmup_s"] > 0 and cold["warmup_s"] == 0.0
    assert [s["digest"] for s in warm["seconds"]] == [s["digest"] for s in cold["seconds"]]
    assert doc["rows"][WARM]["decisions"] == doc["rows"][EAGER]["decisions"]


def test_paced_misses_follow_the_session_rule():
    assert SL.paced([500, 1500, 200, 900]) == [False, True, False, False]
    assert SL.paced([1200, 900, 100]) == [True, True, False]        # waited 200 ms, then 1,100 - 1,000
    assert SL.paced([1000.0]) == [False]


def _rep(ms, decisions, peak):
    return SL.row_of(ms, decisions, peak)


def test_rows_are_medians_with_ratios_against_the_stock_eager_row():
    dec = ["listen", "speak", "speak", "listen"]
    reps = {EAGER: [_rep([10, 400, 600, 30], dec, 9), _rep([20, 500, 700, 40], dec, 11), _rep([30, 600, 800, 50],
                                                                                             dec, 10)],
            "ours: x": [_rep([5, 100, 100, 5], dec, 4), _rep([5, 200, 200, 5], dec, 6), _rep([5, 300, 300, 5], dec, 5)]}
    rows = SL.build_rows(reps, {"compile": "not measured: x"}, ["eager", "compile"])
    assert rows[EAGER]["mean_speaking_second_ms"] == 600 and rows[EAGER]["peak_memory_bytes"] == 10
    assert rows[COMPILED] == {"error": "not measured: x"}
    assert rows["ours: x"]["mean_speaking_second_ms"] == 200
    assert rows["ours: x"]["speaking_ratio"] == pytest.approx(3.0)
    assert rows["ours: x"]["listening_ratio"] == pytest.approx(30 / 5)
    assert rows["ours: x"]["note"] == "decisions as the stock eager's: 4 of 4 s"
    text = SL.format_rows(rows, wrap=False)
    assert "3.00x" in text and "not measured: x" in text


def test_a_later_failed_repeat_keeps_the_good_ones():
    """On the H200 the stock's second repeat once failed (its folder vanished under it) and the row
    printed only that error, dropping the first repeat's 60 good seconds. A failure after good repeats now
    leaves the row as their median and names the failed repeat; a first failure still ends the mode."""
    dec = ["listen", "speak"]
    reps, errors, failed = {}, {}, {}
    SL.tally_repeat(_rep([100, 900], dec, 7), 0, "eager", reps, errors, failed)
    SL.tally_repeat({"error": "not measured: the stock loop exited 1: ValueError: x"}, 1, "eager", reps, errors,
                    failed)
    SL.tally_repeat(_rep([300, 1100], dec, 9), 2, "eager", reps, errors, failed)
    SL.tally_repeat({"error": "not measured: did not finish in 9 s"}, 0, "compile", reps, errors, failed)
    assert errors == {"compile": "not measured: did not finish in 9 s"}
    rows = SL.build_rows(reps, errors, ["eager", "compile"], failed)
    eager = rows[EAGER]
    assert eager["mean_speaking_second_ms"] == 1000 and len(eager["repeats"]) == 2
    assert eager["failed_repeats"] == [{"repeat": 2, "error": "not measured: the stock loop exited 1: ValueError: x"}]
    assert eager["note"].startswith("median of 2 of 3 repeats; repeat 2 not measured")
    assert rows[COMPILED] == {"error": "not measured: did not finish in 9 s"}
    assert "median of 2 of 3 repeats" in SL.format_rows(rows, wrap=False)
    e, c = _rep([1, 2], dec, 1), _rep([1, 2], dec, 1)            # the compile row keeps both notes
    e["digests"] = c["digests"] = ["a", "b"]
    rows = SL.build_rows({EAGER: [e], COMPILED: [c]}, {}, ["eager", "compile"],
                         {"compile": [{"repeat": 2, "error": "not measured: y"}]})
    assert rows[COMPILED]["keeps_bits"] is True and "repeat 2 not measured: y" in rows[COMPILED]["note"]
    rows = SL.build_rows({EAGER: [e], WARM: [c]}, {}, ["eager", "warm"],
                         {"warm": [{"repeat": 3, "error": "not measured: z"}]})
    assert rows[WARM]["note"].startswith("after one earlier") and "repeat 3 not measured: z" in rows[WARM]["note"]


def test_compile_row_says_whether_it_kept_the_bits():
    dec = ["listen", "speak"]
    e, c = _rep([1, 2], dec, 1), _rep([1, 2], dec, 1)
    e["digests"], c["digests"] = ["a", "b"], ["a", "b"]
    rows = SL.build_rows({EAGER: [e], COMPILED: [c]}, {}, ["eager", "compile"])
    assert rows[COMPILED]["keeps_bits"] is True
    c["digests"] = ["a", "c"]
    rows = SL.build_rows({EAGER: [e], COMPILED: [c]}, {}, ["eager", "compile"])
    assert rows[COMPILED]["keeps_bits"] is False and "second 1" in rows[COMPILED]["note"]


def test_bad_input_is_one_line(tmp_path):
    oracle, runner = tmp_path, Path(__file__)
    py = sys.executable
    cases = [
        (dict(python=str(tmp_path / "nope"), folder=str(tmp_path)), "not an executable file"),
        (dict(python=py, folder=None), "needs --stock-loop-folder"),
        (dict(python=py, folder=str(tmp_path)), "not a MiniCPM-o 4.5 folder in the released layout"),
        (dict(python=py, folder=str(tmp_path), backbone="moshi"), "use --backbone minicpm-o-4.5"),
        (dict(python=py, folder=str(tmp_path), backbone_checkpoint=str(tmp_path / "other")), "differ"),
    ]
    for kw, words in cases:
        kw = dict(dict(backbone="minicpm-o-4.5", backbone_checkpoint=None), **kw)
        with pytest.raises(SL.StockLoopError) as e:
            SL.check(kw["python"], kw["folder"], kw["backbone"], kw["backbone_checkpoint"], oracle, runner)
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SL.StockLoopError, match="stock oracle .* is absent"):
        SL.check(py, str(tmp_path), "minicpm-o-4.5", None, tmp_path / "no-oracle", runner)


def test_bench_refuses_bad_input_in_one_line(tmp_path):
    r = _bench("--stock-loop", str(tmp_path / "no-python"), "--stock-loop-folder", str(tmp_path), timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not an executable file" in lines[0], r.stderr
    r = _bench("--stock-loop", sys.executable, "--stock-loop-modes", "eager,jit", timeout=120)
    assert r.returncode == 2 and "--stock-loop-modes" in r.stderr.strip().splitlines()[-1]


def test_streamed_folder_writer_at_tiny_dims(tmp_path, monkeypatch):
    """``--size released``'s path (bf16, shard by shard) at the tiny preset: the tiny folder's keys and shapes,
    bf16, several shards each no bigger than asked (one tensor alone excepted), the nudged head rows, and our
    loader opens it."""
    from safetensors import safe_open
    from engine.backbones.minicpmo45.weights import open_folder
    saved = []
    real = F.save_file

    def recording(tensors, path):
        saved.append(sum(t.numel() * t.element_size() for t in tensors.values()) if len(tensors) > 1 else 0)
        real(tensors, path)
    monkeypatch.setattr(F, "save_file", recording)
    limit = 1 << 20
    folder = F.write_streamed(tmp_path / "f", size="tiny", nudge=(1.0, 3.0), shard_bytes=limit)
    assert len(saved) >= 3 and max(saved) <= limit
    ref = F.weights(11)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(index) == sorted(ref)
    got = {}
    for shard in sorted(set(index.values())):
        with safe_open(str(folder / shard), "pt") as h:
            got.update({k: h.get_tensor(k) for k in h.keys()})
    for k, v in got.items():
        assert v.dtype == torch.bfloat16 and v.shape == ref[k].shape, k
    head, t = got["llm.lm_head.weight"].float(), F.D.tokens
    assert head[t.turn_eos].abs().mean() > 2.0 * head[t.listen].abs().mean()
    assert torch.all(got["llm.model.norm.weight"] == 1) and torch.all(got["apm.conv1.bias"] == 0)
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert all((folder / f).is_file() for f in SL.RELEASED_LAYOUT)
    assert open_folder(folder).dims == F.D
