"""A card too small for a session: one clear line (engine.session.devicemem), checked with a fake CUDA."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.session import devicemem


@pytest.fixture
def fake_card(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (3 << 30, 24 << 30))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: SimpleNamespace(total_memory=24 << 30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tiny Card")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda i=None: 1.0, raising=False)


def test_out_of_memory_becomes_one_line(fake_card):
    with pytest.raises(devicemem.DeviceTooSmall) as e:
        with devicemem.Guard(torch.device("cuda"), "minicpm-o-4.5", "released")("to start the session", 5.0):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB ...\n(trace)")
    msg = str(e.value)
    assert "\n" not in msg and e.value.__cause__ is None
    assert "Tiny Card has 24.0 GiB, 5.0 GiB was free;" in msg and "(tried to allocate 2.00 GiB)" in msg
    assert "measured to reserve 19.1 GiB" in msg and "to start the session" in msg


def test_other_errors_and_the_cpu_pass_through(fake_card):
    with pytest.raises(ValueError, match="bad"):
        with devicemem.Guard(torch.device("cuda"), "synthetic", "tiny")("in second 3"):
            raise ValueError("bad")
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        with devicemem.Guard(torch.device("cpu"), "synthetic", "tiny")("in second 3"):
            raise RuntimeError("CUDA out of memory")
    with pytest.raises(devicemem.DeviceTooSmall, match=r"in second 3 \(tried to allocate 20.00 MiB\): Tiny Card .* 3.0 GiB was free"):
        with devicemem.Guard(torch.device("cuda"), "synthetic", "tiny")("in second 3"):
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")
    assert devicemem.free_gib(torch.device("cpu")) is None


def test_a_session_that_does_not_fit_says_so(monkeypatch, fake_card):
    """The session's build goes through the guard: an allocator failure there is the one line."""
    from engine.session import DuplexSession, SessionConfig

    def boom(self):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")
    monkeypatch.setattr(DuplexSession, "_build", boom)
    s = DuplexSession(SessionConfig(size="tiny", device="cpu"))
    s.device = torch.device("cuda")                     # as if on a card: the guard's CUDA branch
    with pytest.raises(devicemem.DeviceTooSmall, match=r"not enough GPU memory to start the session \(tried to allocate 16.00 GiB\): Tiny Card"):
        s.start()


def test_the_cap_is_named(fake_card, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda i=None: 0.5, raising=False)
    msg = devicemem.message(torch.device("cuda"), "synthetic", "tiny", "in second 1", None)
    assert "3.0 GiB was free, and this process may use 12.0 GiB (its memory cap)" in msg


def test_one_guard_a_session_names_each_second(monkeypatch, fake_card):
    """start() builds the session's guard once; each second enters it again, naming its own index."""
    from engine.session import DuplexSession, SessionConfig
    built = []

    class Counted(devicemem.Guard):
        def __init__(self, *args):
            built.append(args)
            super().__init__(*args)
    monkeypatch.setattr(devicemem, "Guard", Counted)
    s = DuplexSession(SessionConfig(size="tiny", device="cpu"))
    s.start()
    frame = np.zeros(s.cfg.input_rate, dtype=np.float32)
    s.process(frame)
    s.process(frame)
    assert len(built) == 1 and isinstance(s._oom, Counted)

    def boom(frames):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    monkeypatch.setattr(s.backbone, "think", boom)
    s._oom.device = torch.device("cuda")                # as if on a card: the guard's CUDA branch
    with pytest.raises(devicemem.DeviceTooSmall, match=r"GPU memory in second 2 \(tried to allocate 1.00 GiB\): "
                                                       r"Tiny Card has 24.0 GiB, 3.0 GiB was free\."):
        s.process(frame)
    assert len(built) == 1
