"""Session 18, call 2: the rows the bench would have printed with the repeat fix (engine/bench/stock_loop.py's
``tally_repeat``), rebuilt from the run's own files with the bench's own functions.

The run (``bash docs/bench/s18/device_call.sh start``, three interleaved 60 s repeats) lost the stock loop's
second repeat to the device script (the next call replaced the repository copy the background job ran in) and
then printed only that error for the stock row. Its first repeat had finished: ``stock-eager-1-timing.json`` is
the stock harness's own record of it. Ours: the three repeats in ``stock-rows-bench.json``.

    python3 docs/bench/s18/recompute_rows.py   # writes docs/bench/s18/call2/rows-recomputed.json
"""
import json
from pathlib import Path

from engine.bench import stock_loop as SL

HERE = Path(__file__).resolve().parent / "call2"


def main() -> None:
    run = json.loads((HERE / "stock-rows-bench.json").read_text())
    timing = json.loads((HERE / "stock-eager-1-timing.json").read_text())
    secs = timing["seconds"]
    stock = SL.row_of([s["ms"] for s in secs], [s["decision"] for s in secs], timing.get("peak_memory_bytes"))
    ours_row = run["rows"]["ours: graphs"]
    ours = [dict(r, decisions=ours_row["decisions"]) for r in ours_row["repeats"]]
    stock_error = run["rows"][SL.STOCK_LABELS["eager"]]["error"]
    reps = {SL.STOCK_LABELS["eager"]: [stock], "ours: graphs": ours}
    failed = {"eager": [{"repeat": 2, "error": stock_error + " (its folder removed by the device script)"}]}
    rows = SL.build_rows(reps, {}, ["eager"], failed)
    doc = {k: run[k] for k in ("seconds", "seed", "repeats", "device", "folder", "threads", "peak_memory",
                                "ahead", "torch", "gpu", "reference")}
    doc.update(rows=rows, recomputed_from=["stock-rows-bench.json", "stock-eager-1-timing.json"],
               note="stock row: repeat 1 of 3 (repeat 2 failed, repeat 3 not run); ours: median of 3 repeats")
    (HERE / "rows-recomputed.json").write_text(json.dumps(doc, indent=1))
    print(SL.format_rows(rows))


if __name__ == "__main__":
    main()
