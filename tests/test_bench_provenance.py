"""Every bench JSON records where its numbers came from (engine.bench.provenance), added by the report writer."""
from __future__ import annotations

import json
import subprocess

from engine.bench import provenance, report

FIELDS = ("commit", "device", "driver", "torch", "cuda", "cudnn", "cublas", "triton", "python", "command", "recorded")


def test_a_record_names_the_commit_device_driver_libraries_and_command():
    rec = provenance.record("duplexcadence-bench mimi --seconds 8")
    assert set(FIELDS) <= set(rec) and rec["command"] == "duplexcadence-bench mimi --seconds 8"
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=provenance.ROOT)
    if head.returncode == 0:                          # a source checkout: its commit, dirty or not
        assert rec["commit"].split()[0] == head.stdout.strip()
    assert all(isinstance(rec[f], str) and rec[f] for f in FIELDS)


def test_write_all_and_progressive_json_stamp_every_document(tmp_path):
    report.write_all(tmp_path / "a.json", {"x": 1}, "# a\n", None, command="duplexcadence-bench plan")
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["x"] == 1 and doc["provenance"]["command"] == "duplexcadence-bench plan"
    dump = report.progressive_json(tmp_path / "b.json", "prog", "duplexcadence-bench nemotron-codec --seconds 2")
    dump({"rows": [1]})
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["provenance"]["command"] == doc["command"] == "duplexcadence-bench nemotron-codec --seconds 2"


def test_a_document_that_brings_its_provenance_keeps_it(tmp_path):
    """A result recorded elsewhere (an older run's, filled in after it) is written as it is."""
    old = {"commit": "abc", "recorded": "after the run"}
    report.write_all(tmp_path / "c.json", {"provenance": old}, "# c\n", None, command="ignored")
    assert json.loads((tmp_path / "c.json").read_text())["provenance"] == old


def test_a_json_a_bench_wrote_itself_is_stamped_once(tmp_path):
    """``report.stamp``: a bench that writes its own JSON (the stock-loop rows) gets the provenance added once."""
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"rows": {"a": 1}}))
    assert report.stamp(path, "duplexcadence-bench session --stock-loop PY")
    doc = json.loads(path.read_text())
    assert doc["rows"] == {"a": 1} and doc["provenance"]["command"] == "duplexcadence-bench session --stock-loop PY"
    assert not report.stamp(path, "again") and json.loads(path.read_text()) == doc
    assert not report.stamp(tmp_path / "missing.json")
