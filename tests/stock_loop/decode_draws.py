"""The stock duplex loop's text draw alone, on seeded random cases (run in the stock venv; test oracle only).

MiniCPM-o-Demo's own ``StreamDecoder`` (at 28b60cf), built as the duplex capability builds it (the folder's
tokenizer, ``forbidden_token_ids`` = ``<|tts_pad|>`` + the tokenizer's ``bad_token_ids``; its constructor adds
``<|chunk_eos|>``), draws one token per case with the duplex page's settings. Each case is drawn to reach
every branch of ``decode``: ``<|chunk_eos|>`` boosted so that the decision draw sometimes ends the unit (and
the text draw would often give it, were it not forbidden), ``<|turn_eos|>``'s logit on both sides of zero
(the length penalty's two arms), histories longer than the 512-token window and ids past the vocabulary,
bfloat16 and float32 logits. Writes, per case: the logits, the history, the CPU RNG state before the draw,
the token and the decoder's history after it.

    python decode_draws.py ORACLE FOLDER OUT.pt [--cases N]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

PAGE = dict(mode="sampling", temperature=0.7, top_k=20, top_p=0.8, listen_top_k=None, listen_prob_scale=1.0,
            text_repetition_penalty=1.05, text_repetition_window_size=512, length_penalty=1.05)


def case(i: int, vocab: int, ids: dict) -> tuple:
    """(logits [1, V], history) of case ``i``: its own seeded generator, apart from the draw's."""
    g = torch.Generator().manual_seed(7000 + i)
    logits = torch.randn(1, vocab, generator=g) * (0.5 + 2.5 * float(torch.rand(1, generator=g)))
    logits[0, ids["chunk_eos"]] += 4.0 * float(torch.rand(1, generator=g))
    logits[0, ids["turn_eos"]] = (float(torch.rand(1, generator=g)) - 0.5) * 6.0
    n = int(torch.randint(0, 700, (1,), generator=g))
    history = torch.randint(0, vocab + 8, (n,), generator=g).tolist()      # a few ids past the vocabulary
    return (logits.bfloat16() if i % 3 else logits), history


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("oracle")
    p.add_argument("folder")
    p.add_argument("out")
    p.add_argument("--cases", type=int, default=400)
    a = p.parse_args()
    sys.path.insert(0, a.oracle)
    from MiniCPMO45.utils import StreamDecoder
    from run_stock import stock_tokenizer              # beside this file
    tok = stock_tokenizer(Path(a.folder))
    ids = {n: tok.convert_tokens_to_ids(f"<|{n}|>") for n in ("chunk_eos", "turn_eos", "tts_pad")}
    vocab = len(tok)
    torch.set_num_threads(1)
    out = []
    for i in range(a.cases):
        logits, history = case(i, vocab, ids)
        dec = StreamDecoder(llm=None, tokenizer=tok, forbidden_token_ids=[ids["tts_pad"], *tok.bad_token_ids])
        dec.generated_tokens = list(history)
        torch.manual_seed(100 + i)
        rng = torch.get_rng_state()
        got = int(dec.decode(logits=logits.clone(), **PAGE).view(-1)[0])
        out.append({"logits": logits, "history": history, "rng": rng, "token": got,
                    "after": list(dec.generated_tokens), "forbidden": list(dec.forbidden_token_ids),
                    "rng_after": torch.get_rng_state()})
    torch.save(out, a.out)


if __name__ == "__main__":
    main()
