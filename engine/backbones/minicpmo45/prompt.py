"""The system prompt MiniCPM-o 4.5's duplex session starts from, and its prefill before the first second.

The demo's duplex page starts a session with its default preset (the lowest ``order`` of its
``audio_duplex`` presets): the text below. The worker wraps it as
``<|im_start|>system\\n{prompt}\\n<|audio_start|>`` + the reference audio + ``<|audio_end|><|im_end|>``;
the model's ``prepare`` feeds the three parts into the LLM one forward each, asking for no logits and
drawing nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

#: the demo's default duplex preset ("中文通话"): the system prompt a session starts with unless one is given
DEFAULT_SYSTEM_PROMPT = ("扮演一个具有以上声音特征的助手。请认真、高质量地回复用户的问题。请用高自然度的方式和用户聊天。"
                         "你处于双工模式，可以一边听、一边说。你是由面壁智能开发的人工智能助手：面壁小钢炮。")


def wrap(system_prompt: str) -> Tuple[str, str]:
    """The text before the reference audio and the text after it."""
    return f"<|im_start|>system\n{system_prompt}\n<|audio_start|>", "<|audio_end|><|im_end|>"


@dataclass
class Prelude:
    """What ``prepare`` feeds: the prefix ids, the reference audio's embeddings [T, hidden] (or None), the
    suffix ids."""

    prefix_ids: List[int]
    reference: Optional[torch.Tensor]
    suffix_ids: List[int]


def prelude(tokenizer, system_prompt: str, reference: Optional[torch.Tensor] = None) -> Prelude:
    """The prelude of ``system_prompt`` through ``tokenizer`` (a ``tokenizers.Tokenizer``)."""
    prefix, suffix = wrap(system_prompt)
    ids = lambda text: list(tokenizer.encode(text, add_special_tokens=False).ids)   # noqa: E731
    return Prelude(ids(prefix), reference, ids(suffix))
