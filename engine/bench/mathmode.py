"""The arithmetic a benchmark runs under: one switch shared by every ``duplexcadence-bench`` command."""
from __future__ import annotations

import torch


def tf32_off() -> None:
    """Full fp32 arithmetic: TF32 off for matmuls and for cuDNN convolutions (nemo's ``disable_tf32``; the
    step-audio2 bench's ``--math tf32-off``). Process-wide, as PyTorch's flags are."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
