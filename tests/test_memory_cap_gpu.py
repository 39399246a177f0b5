"""A 24 GB card is enough: a released MiniCPM-o 4.5 session in graphs mode runs 40 s at 0
misses under a 22 GiB per-process cap (torch.cuda.set_per_process_memory_fraction); under an 8 GiB cap it
refuses to start with one clear line, not an out-of-memory trace. Each in its own process (the cap is
process-wide)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
CHILD = r"""
import json, sys, torch
from engine.audio import frames_of
from engine.bench.session import speech_like
from engine.session import DuplexSession, SessionConfig
from engine.session.devicemem import DeviceTooSmall
cap_gib, seconds = float(sys.argv[1]), int(sys.argv[2])
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * (1 << 30) / total), 0)
s = DuplexSession(SessionConfig(backbone="minicpm-o-4.5", size="released", device="cuda", seed=11))
try:
    s.start()
except DeviceTooSmall as e:
    import traceback
    where = "".join(traceback.format_exception(e.__context__))[-1500:] if e.__context__ else ""
    print(json.dumps({"refused": str(e), "where": where}))
    raise SystemExit(0)
late = 0
for f in frames_of(speech_like(seconds, seed=909))[:seconds]:
    _, rec = s.process(f)
    late += int(rec.total_ms > 1000.0)
out = {"late": late, "reserved_gib": torch.cuda.max_memory_reserved() / (1 << 30),
       "spoke": sum(r.decision == "speak" for r in s.records)}
s.close()
print(json.dumps(out))
"""


def _child(cap_gib: float, seconds: int) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, str(cap_gib), str(seconds)], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_released_minicpmo_fits_a_22_gib_cap():
    got = _child(22.0, 40)
    print(got)
    assert "refused" not in got, got
    assert got["late"] == 0 and got["reserved_gib"] <= 22.0 and got["spoke"] > 0, got


def test_an_8_gib_cap_refuses_in_one_line():
    got = _child(8.0, 1)
    assert "refused" in got, got
    msg = got["refused"]
    assert msg.startswith("not enough GPU memory to start the session (tried to allocate") and "\n" not in msg, msg
    assert "measured to reserve" in msg
