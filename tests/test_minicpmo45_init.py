"""seeded_init draws into the parameter and scales in place (no parameter-sized temporaries beyond the float32
draw, so the released model builds under a 22 GiB cap): the bits of ``randn(...).to(dtype) * std``."""
import pytest
import torch

from engine.backbones.minicpmo45.layers import seeded_init


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_seeded_init_keeps_the_bits_of_draw_round_scale(dt):
    m = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Linear(300, 7)).to(dt)
    seeded_init(m, 5)
    g = torch.Generator().manual_seed(5)
    for name, p in m.named_parameters():
        if name.endswith("bias"):
            continue
        ref = torch.randn(p.shape, generator=g, dtype=torch.float32).to(dt) * 0.02
        assert torch.equal(ref, p), name
