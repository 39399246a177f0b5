"""Session 15 found that the first tiny-TTS second in a CUDA process draws a different code at step 3 than every
later run (docs/device-notes-session15.md, call 3). This finds the first module whose output differs between a
process's first and second run of the same second (same weights, inputs and seeds): forward hooks record every
TTS submodule's output, in call order, in both runs. Run on the device in a fresh process:
    PYTHONPATH=.:tests python3 docs/bench/s16/first_run_diagnostic.py
"""
from __future__ import annotations

import sys

import pytest
import torch

sys.path.insert(0, "tests")
import test_minicpmo45_codes_ahead as T            # noqa: E402  (the test's own second: _speak)
from engine.backbones.minicpmo45.tts import TTS     # noqa: E402


def recorded_run(mp) -> list:
    """One speaking second (EOS likely from step 3) with every TTS submodule's outputs recorded in call order."""
    seen = []

    def hook(mod, args, out):
        if isinstance(out, torch.Tensor):
            seen.append((mod.__dict__.get("_diag_name", type(mod).__name__), out.detach().float().cpu().clone()))
    original = TTS.__init__

    def init(self, *a, **k):
        original(self, *a, **k)
        for name, m in self.named_modules():
            m._diag_name = name or "tts"
            m.register_forward_hook(hook)
    mp.setattr(TTS, "__init__", init)
    codes = T._speak(True, 3, 0, False, mp, "cuda")[0]
    mp.undo()
    return codes, seen


def main() -> None:
    mp = pytest.MonkeyPatch()
    c1, first = recorded_run(mp)
    c2, second = recorded_run(mp)
    print("codes, run 1:", c1)
    print("codes, run 2:", c2)
    print(f"module outputs recorded: {len(first)} and {len(second)}")
    for i, ((n1, a), (n2, b)) in enumerate(zip(first, second)):
        if n1 != n2 or a.shape != b.shape or not torch.equal(a, b):
            diff = (a - b).abs().max().item() if a.shape == b.shape else float("nan")
            print(f"first difference at call {i}: {n1} vs {n2}, shape {tuple(a.shape)}, max abs diff {diff:.3g}")
            for j in range(max(0, i - 3), min(len(first), i + 3)):
                print("   ", j, first[j][0], tuple(first[j][1].shape))
            return
    print("no module output differs: the difference is outside the TTS modules (sampling, masks, the taps)")


if __name__ == "__main__":
    main()
