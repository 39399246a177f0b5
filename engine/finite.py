"""What a model hands on must be finite: one check per second on its output, never per kernel.

Weights that are out of range (scaled by 1e30, say) still load, and the model then computes infinities and
NaN; played or written, they are garbage (NaN clips to an arbitrary 16-bit value). The session looks once per
second at what leaves a model, the tail's audio and a backbone's decision logits, and stops with
:class:`NonFiniteOutput`, one line naming the model and the second; every second before it is kept.
"""
from __future__ import annotations

import numpy as np


class NonFiniteOutput(ValueError):
    """A model's output held NaN or infinite values (the message names the model and the second)."""


def _say(what: str) -> str:
    return (f"{what} holds NaN or infinite values: the model's weights are out of range or broken (a checkpoint "
            f"scaled or damaged?); the session stopped there")


def check_audio(x, what: str) -> None:
    """NonFiniteOutput unless every sample of ``x`` (a NumPy array) is finite."""
    if x is not None and not np.isfinite(np.asarray(x)).all():
        raise NonFiniteOutput(_say(what))


def check_logits(t, what: str) -> None:
    """NonFiniteOutput unless every value of the tensor ``t`` is finite (one reduction, one read; under a device's
    scheduler the session parks until the reduction is done, so the read never holds the others back)."""
    import torch

    from engine.core import yieldpoints
    if t is None:
        return
    ok = torch.isfinite(t).all()
    yieldpoints.wait()
    if not bool(ok):
        raise NonFiniteOutput(_say(what))
