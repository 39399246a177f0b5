"""CUDA work queues (engine/cuda_queues.py): a host of many sessions asks the driver for more than 8 hardware queues
(CUDA_DEVICE_MAX_CONNECTIONS) before CUDA starts; a count out of range, or one asked for after CUDA started with
another, is refused in one line. Whether 32 queues keep more sessions on time is a device measurement
(``duplexcadence-bench capacity --cuda-connections 32``, docs/benchmarks.md); here, that the setting reaches the environment the driver reads."""
import subprocess
import sys

import pytest
import torch

from engine import cuda_queues
from engine.cuda_queues import ENV


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setenv(ENV, "8")              # recorded, so the test's own writes are undone afterwards
    monkeypatch.delenv(ENV)
    monkeypatch.setattr(cuda_queues, "_started_with", None)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    return monkeypatch


def test_unset_means_the_driver_default_and_none_changes_nothing(fresh):
    assert cuda_queues.in_effect() == 8
    assert cuda_queues.request(None) == 8
    assert ENV not in __import__("os").environ


def test_a_request_before_cuda_starts_reaches_the_environment(fresh):
    import os
    assert cuda_queues.request(32) == 32 and os.environ[ENV] == "32" and cuda_queues.in_effect() == 32
    assert cuda_queues.request(16) == 16 and os.environ[ENV] == "16"


@pytest.mark.parametrize("bad", [0, 33, -1, True, 8.0, "32"])
def test_a_count_out_of_range_is_refused(fresh, bad):
    with pytest.raises(ValueError, match="from 1 to 32"):
        cuda_queues.request(bad)


def test_after_cuda_started_only_the_count_in_effect_is_taken(fresh):
    import os
    fresh.setenv(ENV, "8")
    fresh.setattr(torch.cuda, "is_initialized", lambda: True)
    assert cuda_queues.request(8) == 8
    with pytest.raises(cuda_queues.TooLate, match="before the process's first CUDA call"):
        cuda_queues.request(32)
    fresh.setenv(ENV, "32")                   # a later change of the environment does not reach the context
    assert cuda_queues.in_effect() == 8 and os.environ[ENV] == "32"


@pytest.mark.parametrize("raw, n", [("garbage", 8), ("64", 32), ("0", 1), (" 12 ", 12)])
def test_the_environment_is_read_as_the_driver_reads_it(fresh, raw, n):
    fresh.setenv(ENV, raw)
    assert cuda_queues.in_effect() == n


def test_a_process_started_after_the_request_sees_it(fresh, tmp_path):
    """Ray Serve replicas and the probe's children are new processes: they inherit the environment."""
    cuda_queues.request(24)
    out = subprocess.run([sys.executable, "-c", f"import os; print(os.environ['{ENV}'])"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "24"
