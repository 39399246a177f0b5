"""The session info's fast-path lines (fastpath.summarize): a path checked at every chunk length is one line per
state and kind of reason, its lengths as runs, the largest difference where the numbers vary; nothing is lost."""
from engine.fastpath import Verdict, _ranges, summarize


def test_lengths_become_runs():
    assert _ranges([1, 2, 3, 5, 10, 12, 14, 16, 300]) == "1-3, 5, 10-16 by 2, 300"
    assert _ranges([2, 4]) == "2, 4" and _ranges([7]) == "7" and _ranges([]) == ""
    assert _ranges(list(range(1, 27)) + list(range(28, 51, 2)) + [150, 300]) == "1-26, 28-50 by 2, 150, 300"


def test_one_line_per_path_state_and_kind_of_reason():
    vs = [Verdict(f"HiFT lanes ({n} frames)", True, "bit-identical to the reference (2 modes)", scope="in graphs")
          for n in (2, 4, 6, 8)]
    vs += [Verdict(f"DiT convs ({n} frames)", False, f"max abs diff {d} (first in out.eager[{i}])", d)
           for n, d, i in ((2, 4.5e-06, 0), (4, 9.1e-06, 3), (6, 4.5e-06, 0))]
    vs += [Verdict("DiT convs (8 frames)", True, "bit-identical to the reference (2 modes)"),
           Verdict("grouped-query attention", False, "not applicable: no grouped heads"),
           Verdict("HiFT lanes (10 frames)", True, "bit-identical to the reference (2 modes)", cached=True,
                   scope="in graphs")]
    lines = summarize(vs)
    assert lines == [
        "HiFT lanes (2-8 by 2 frames): on (in graphs) — bit-identical to the reference (2 modes)",
        "DiT convs (2-6 by 2 frames): off — max abs diff 4.5e-06 (first in out.eager[0]); largest over 3 lengths 9.1e-06",
        "DiT convs (8 frames): on — bit-identical to the reference (2 modes)",
        "grouped-query attention: off — not applicable: no grouped heads",
        "HiFT lanes (10 frames): on (in graphs) — bit-identical to the reference (2 modes) (cached)"]
    same = [Verdict(f"x ({n} frames)", False, "max abs diff 1e-06", 1e-06) for n in (1, 2)]
    assert summarize(same) == ["x (1-2 frames): off — max abs diff 1e-06"]     # one reason: nothing added
