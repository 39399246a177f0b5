"""The Moshi backbone: Moshi's own LM and Mimi encoder (from the ``moshi`` package) for LISTEN/THINK.

``moshi`` is an optional extra (``pip install 'duplexcadence[moshi]'``) imported only here, and only
when this backbone is chosen. SPEAK stays ours: the session feeds the codes Moshi generates to the
engine's Mimi decoder tail.

Per second (12 or 13 Mimi frames of 80 ms: second k covers frames floor(12.5k) .. floor(12.5(k+1))-1):
* LISTEN — the second's samples join a sample buffer; Mimi's streaming encoder turns every whole
  1,920-sample frame in it into 8 codes (12 or 13 frames, matching the rule above);
* THINK — one ``LMGen.step`` per frame, the user's codes in, Moshi's text token and 8 audio codes
  out (none for the first frames while the acoustic delay fills: the session pads those with the
  tail's silence). The decision is "speak" when Moshi's text stream says something (a token other
  than its padding) in this second.

moshi compiles a few functions with ``torch.compile`` on first use (tens of seconds, and again for
new shapes): a live session cannot stall on that, so every call runs under moshi's own
``no_compile()``; on CUDA moshi still replays its LM and depformer as CUDA graphs.
"""
from __future__ import annotations

import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import numpy as np
import torch


from engine.backbones.policy import LISTEN, SPEAK
from engine.backbones.base import Backbone, BackboneInfo, Thought, TokenFormat
from .files import MoshiFiles, validate_folder

if TYPE_CHECKING:
    from engine.vad import VadResult

FRAME = 1920          # samples per Mimi frame at 24 kHz (12.5 Hz)


def import_moshi():
    """``(loaders, LMGen, no_compile)`` from the moshi package, or ImportError saying how to install it."""
    try:
        from moshi.models import loaders
        from moshi.models.lm import LMGen
        from moshi.utils.compile import no_compile
    except ImportError as e:
        import sys
        if getattr(sys, "frozen", False):      # the installed bundle ships without the optional extra
            raise ImportError("the moshi backbone is not part of this installed build; run DuplexCadence "
                              "from source with the 'moshi' extra to use it") from None
        raise ImportError(f"the moshi backbone needs the optional 'moshi' extra "
                          f"(pip install 'duplexcadence[moshi]'): {e}") from None
    return loaders, LMGen, no_compile


@contextmanager
def _built_from(files: MoshiFiles):
    """moshi builds its models from the folder's config.json with ``assert`` and plain calls: a config that lacks
    a field or holds a wrong one fails inside moshi (an AssertionError, a TypeError for a missing argument, a
    shape mismatch while loading). That is one ValueError naming the folder's config, not a traceback."""
    try:
        yield
    except (AssertionError, TypeError, KeyError, IndexError, AttributeError, RuntimeError) as e:
        where = files.folder / "config.json"
        source = f"the Moshi config {where}" if files.lm_config is not None else f"the Moshi weights in {files.folder}"
        raise ValueError(f"{source} does not describe a model moshi can build ({_why(e)}); a config.json gives "
                         f"every LM constructor argument of the released one (or leave it out for moshi's "
                         f"defaults)") from None


def _why(e: BaseException) -> str:
    """The first line of an exception, or where a bare ``assert`` failed."""
    first = (str(e).strip().splitlines() or [""])[0][:200]
    if first:
        return f"{type(e).__name__}: {first}"
    frames = traceback.extract_tb(e.__traceback__)
    at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(e).__name__}{at}"


class MoshiBackbone(Backbone):
    """Moshi (LM + Mimi encoder, weights from a folder) behind the backbone interface."""

    def __init__(self, fmt: TokenFormat, *, size: str, device, seed: int = 0, checkpoint=None):
        self.fmt = fmt
        self.device = torch.device(device)
        self.seed = int(seed)
        self.files: MoshiFiles = validate_folder(checkpoint)
        self.samples = np.zeros(0, dtype=np.float32)
        self.codes: Optional[torch.Tensor] = None
        self.tokenizer = None
        self.info = BackboneInfo(name="moshi", title=f"Moshi (LM + Mimi encoder from {self.files.folder.name})",
                                 synthetic=False)

    def start(self) -> None:
        loaders, LMGen, self._no_compile = import_moshi()
        f = self.files
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        lm_kwargs = f.lm_config if f.lm_config is not None else None
        with _built_from(f):
            self.lm = loaders.get_moshi_lm(str(f.lm), lm_kwargs=lm_kwargs, device=self.device, dtype=dtype)
        self.lm.eval()
        user_books = self.lm.num_codebooks - self.lm.dep_q - 1
        self._check_format(user_books)
        with _built_from(f):
            self.mimi = loaders.get_mimi(str(f.mimi), mimi_config=f.mimi_config, device=self.device,
                                         num_codebooks=max(self.lm.dep_q, user_books))
            self.lm_gen = LMGen(self.lm, **f.lm_gen_config)
        self.mimi.streaming_forever(1)
        self.lm_gen.streaming_forever(1)
        self.pad_ids = {self.lm.text_padding_token_id, self.lm.end_of_text_padding_id}
        self.tokenizer = self._load_tokenizer()

    def _check_format(self, user_books: int) -> None:
        lm, fmt = self.lm, self.fmt
        if lm.card != fmt.vocab or lm.dep_q != fmt.codebooks:
            raise ValueError(f"Moshi's LM speaks {lm.dep_q} codebooks of {lm.card} codes but the decoder tail "
                             f"reads {fmt.codebooks} of {fmt.vocab}: load the Mimi tail at the matching size")
        if abs(fmt.rate_hz - 12.5) > 1e-9 or user_books < 1:
            raise ValueError(f"Moshi runs at 12.5 Hz with user codebooks; the tail reads {fmt.rate_hz} Hz")

    def _load_tokenizer(self):
        if self.files.tokenizer is None:
            return None
        try:
            import sentencepiece
            return sentencepiece.SentencePieceProcessor(model_file=str(self.files.tokenizer))
        except Exception:  # noqa: BLE001 - the text is a nicety, never a reason to fail a session
            return None

    # -- per second --------------------------------------------------------------------------------
    def listen(self, audio: torch.Tensor, vad: VadResult) -> None:
        self.samples = np.concatenate([self.samples, audio.detach().to("cpu", torch.float32).numpy()])
        n = self.samples.size // FRAME
        if n == 0:
            self.codes = None
            return
        chunk = torch.from_numpy(self.samples[: n * FRAME].copy()).to(self.device).view(1, 1, -1)
        self.samples = self.samples[n * FRAME:]
        with torch.no_grad(), self._no_compile():
            self.codes = self.mimi.encode(chunk)                   # [1, books, n]

    def think(self, frames: int) -> Thought:
        if self.codes is None:
            return Thought(LISTEN, None, 0)
        texts: List[int] = []
        audio: List[torch.Tensor] = []
        with torch.no_grad(), self._no_compile():
            for t in range(self.codes.shape[-1]):
                out = self.lm_gen.step(self.codes[:, :, t:t + 1])  # [1, 1 + dep_q, 1] or None (delay)
                if out is None:
                    continue
                texts.append(out[0, 0, 0])
                audio.append(out[0, 1:, 0])                        # [dep_q]
        if not audio:
            return Thought(LISTEN, None, 0)
        tokens = torch.stack(audio, dim=1)[:, -frames:]            # [dep_q, m <= frames]
        ids = torch.stack(texts).tolist()
        spoken = [i for i in ids if i not in self.pad_ids]
        decision = SPEAK if spoken else LISTEN
        return Thought(decision, tokens, int(tokens.numel()), self._text(spoken))

    def _text(self, ids: List[int]) -> str:
        if self.tokenizer is None or not ids:
            return ""
        try:
            return str(self.tokenizer.decode(ids))
        except Exception:  # noqa: BLE001
            return ""

    def close(self) -> None:
        self.lm_gen = None
        self.lm = None
        self.mimi = None
