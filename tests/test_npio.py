"""User-supplied NumPy files: one clear error naming the file, never unpickling."""
import os

import numpy as np
import pytest

from engine.npio import load_array


def test_load_array_reads_npy_and_npz(tmp_path):
    a = np.arange(7, dtype=np.int64)
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "b.npz", x=a)
    assert np.array_equal(load_array(tmp_path / "a.npy", "tokens file"), a)
    assert np.array_equal(load_array(tmp_path / "b.npz", "prompt file")["x"], a)


def test_load_array_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="codes file .*missing.npy does not exist"):
        load_array(tmp_path / "missing.npy", "codes file")
    (tmp_path / "t.npy").write_text("not numpy")
    with pytest.raises(ValueError, match="t.npy: not a readable .npy file"):
        load_array(tmp_path / "t.npy", "tokens file")
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="o.npy"):
        load_array(tmp_path / "o.npy", "tokens file")          # object arrays would need pickle: refused
    os.mkfifo(tmp_path / "f.npy")
    with pytest.raises(ValueError, match="tokens file .*f.npy: it is a FIFO, not a regular file"):
        load_array(tmp_path / "f.npy", "tokens file")          # refused before anything opens it (never blocks)
