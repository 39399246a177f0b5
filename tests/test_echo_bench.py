"""`duplexcadence-bench echo` at a short length on echo paths drawn at random within the echo targets' ranges
(delays 30-250 ms, gains -3 to -20 dB): with cancellation the targets hold (ERLE >= 20 dB, no false and no
missed barge-in, barge-in latency <= 300 ms); without it the model's own voice fires barge-ins."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.bench import echo as bench

SECONDS = 20
#: the tail these short runs speak with: Mimi (four times faster on a CPU than the app's default tail, which the
#: bench runs unless told otherwise)
TAIL = ("--tail", "mimi")


def paths(n: int = 3, seed: int = 2025):
    """``n`` (seed, delay ms, gain dB) drawn within the echo targets' ranges (never tuned for)."""
    rng = np.random.default_rng(seed)
    return [(int(s), round(float(rng.uniform(30, 250)), 1), round(float(rng.uniform(-20, -3)), 1))
            for s in rng.integers(0, 10_000, n)]


def check(doc):
    on, off = doc["modes"]["on"], doc["modes"]["off"]
    why = json.dumps({k: doc[k] for k in ("delay_ms", "gain_db", "seed", "reported_delay_ms")}) + json.dumps(on)
    assert on["erle_db"] >= 20.0, why
    assert on["false_barge_ins"] == 0, why
    assert on["missed_barge_ins"] == 0, why
    assert on["user_turns_over_speech"] >= 1, why              # the latency was measured at all
    assert on["barge_in_latency_ms"]["worst"] <= 300.0, why
    assert all(doc["meets_targets"].values()), why
    assert off["false_barge_ins"] > 0, json.dumps(off)          # without cancellation the problem shows
    assert off["erle_db"] == pytest.approx(0.0, abs=0.01)


#: seed 4474 (212 ms, -5.8 dB): the echo within 10 dB of the user's voice, where AEC3 holds the user back for
#: ~340 ms at a barge-in; before the double-talk check (engine/echo/doubletalk.py) that barge-in took 381 ms
KNOWN_SLOW = (4474, 212.0, -5.8)
#: the other random paths run this long (the known slow one its full 20 s)
SHORT_SECONDS = 12


def cases():
    """Five random paths: three drawn with seed 2025 (the first is the known slow one; the second runs through
    the command line below) and two with seed 31."""
    drawn = paths() + paths(2, seed=31)
    assert drawn[0] == KNOWN_SLOW
    return [pytest.param(*p, id=f"seed{p[0]}") for i, p in enumerate(drawn) if i != 1]


@pytest.mark.parametrize("seed,delay_ms,gain_db", cases())
def test_echo_bench_targets(seed, delay_ms, gain_db):
    seconds = SECONDS if (seed, delay_ms, gain_db) == KNOWN_SLOW else SHORT_SECONDS
    a = bench.build_parser().parse_args(["--seconds", str(seconds), "--seed", str(seed), "--delay-ms", str(delay_ms),
                                         "--gain-db", str(gain_db), "--quiet", "--out", "", *TAIL])
    doc = bench.run(a)
    check(doc)


def test_echo_bench_command_writes_its_files(tmp_path, capsys):
    seed, delay_ms, gain_db = paths()[1]
    out = tmp_path / "echo"
    rc = bench.main(["--seconds", str(SECONDS), "--seed", str(seed), "--delay-ms", str(delay_ms),
                     "--gain-db", str(gain_db), "--quiet", "--out", str(out), *TAIL])
    assert rc == 0
    doc = json.loads((out / "echo.json").read_text())
    check(doc)
    assert (out / "echo.md").read_text().startswith("# echo loop")
    assert (out / "echo-on.csv").exists() and (out / "echo-off.jsonl").exists()
    rows = [json.loads(x) for x in (out / "echo-on.jsonl").read_text().splitlines()]
    assert sum(r["barge_ins"] for r in rows) == doc["modes"]["on"]["barge_ins_fired"]
    assert any(r["echo_suppression_db"] > 20 for r in rows)
    assert doc["tail"] == "mimi"
    stdout = capsys.readouterr().out
    assert "ERLE dB" in stdout and f"echo loop: {SECONDS} s, mimi tail (tiny, cpu)" in stdout


def test_echo_bench_speaks_with_the_apps_default_tail_and_names_it():
    from engine.session import SessionConfig
    a = bench.build_parser().parse_args([])
    assert a.tail == SessionConfig().tail == "step-audio2"
    doc = {"tail": a.tail, "size": "tiny", "device": "cpu", "reported_delay_ms": 100.0}
    assert bench.title_line(a, doc).startswith(f"echo loop: {a.seconds} s, step-audio2 tail (tiny, cpu), path")


def test_echo_bench_bad_option_is_one_line(capsys):
    assert bench.main(["--gain-db", "30", "--quiet", "--out", ""]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gain-db" in err[0]
