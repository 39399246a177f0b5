"""Our whole MiniCPM-o 4.5 session on CUDA against MiniCPM-o's own duplex loop on CUDA (GPU).

The stock loop (MiniCPM-o-Demo at 28b60cf, ``tests/stock_loop/run_stock.py --device cuda``: bfloat16 as the
demo casts it, its Step-Audio2 token2wav in float32 on CUDA) and our ``DuplexSession`` on CUDA read the same
folder in the released layout, the same 16 kHz input (speech and pauses), the same seed, the folder's voice and
reference clip, the default system prompt; the page's Force Listen once. Every second, every stage is compared
with ``torch.equal`` (the stock's record holds floating rows as float32; ours are raised to float32 for the
comparison, which is exact for bfloat16): audio features, encoder output, every LLM logits row (bfloat16, as the
stock samples them), every text draw, every TTS logits row, the codes, the tail's float waveform and the speech as
the demo hands it on (token2wav's 16-bit PCM read back). A run must end a turn and have the page's Force Listen
cut an open reply; its report (``DC_STOCK_REPORT``) names the commit it ran on.

Three of our runs: stock-policy (demand_sized and graph replay off), optimized (both on: the arena and one CUDA
graph per shape signature), and the toggles flipped every second (both off in second 0, then flipped before every
later second). In the flip run a turn's last token2wav chunk may be played one second later or not, so its
speech and float waveform are checked whole: every second's concatenated (and the deferred last chunk after the
final second) against the stock's token2wav calls concatenated.

The stock process runs deterministically (``run_stock.py --deterministic``: cuDNN attention out of SDPA, cuDNN
held to deterministic algorithms, as our engine runs on CUDA; ``DC_STOCK_AS_USERS=1`` runs it exactly as its
users do): otherwise torch 2.11 on the H200 picks cuDNN attention for bfloat16 and atomics-based transposed convs
for token2wav's HiFT, neither of which repeats its own bits (docs/bit-identity.md; token2wav's HiFT: 1.5e-2
between two identical stock calls), and our engine takes both out for that
reason. Measured on the H200 (docs/bit-identity.md): at tiny dims 33 of 33 seconds equal at every stage in all
three modes; at the released dims 60 of 60 with the toggles flipped every second.

Environment (docs/bit-identity.md gives the commands):
``DC_STOCK_PYTHON``: the stock venv's interpreter (default ``.venv-stock/bin/python``, which must be a CUDA
torch); ``DC_STOCK_FOLDER``: a folder in the released layout (``python tests/minicpmo45_stock_folder.py DIR
--size released``), else the tiny folder is written; ``DC_STOCK_SECONDS``: input length (default 33 tiny, 60
with a folder); ``DC_STOCK_REPORT``: a JSON file for each run's per-second first difference (or none).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracles  # noqa: E402
import test_minicpmo45_stock_loop as S  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.oracle, pytest.mark.bits]

SEED = 1
MODES = ("stock-policy", "optimized", "flipped")


def _stock_python() -> Path:
    return Path(os.environ.get("DC_STOCK_PYTHON", str(S.STOCK_PY)))


def _require() -> None:
    """Skips without CUDA; with it, the demo copy and the stock interpreter are required (tests/oracles.py)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    oracles.require(oracles.DEMO, oracles.Oracle(f"the stock interpreter {_stock_python()}",
                                                 lambda: _stock_python().exists(),
                                                 "DC_STOCK_PYTHON, or make's .venv-stock with a CUDA torch"))


@pytest.fixture(scope="module")
def gpu_runs(tmp_path_factory):
    """(folder, size, seconds, the stock's per-second records) of one stock CUDA run, seed ``SEED``."""
    _require()
    given = os.environ.get("DC_STOCK_FOLDER")
    if given:
        tmp, folder, size = tmp_path_factory.mktemp("stock-gpu"), Path(given), "released"
    else:
        import minicpmo45_stock_folder as F
        tmp, size = tmp_path_factory.mktemp("stock-gpu"), "tiny"
        folder = F.write(tmp / "MiniCPM-o-4_5", nudge=S.NUDGE)
    seconds = int(os.environ.get("DC_STOCK_SECONDS", 60 if given else S.SECONDS))
    d = S._run_stock(folder, tmp, python=_stock_python(), device="cuda", seeds=(SEED,), seconds=seconds,
                     timeout=3000, extra=() if os.environ.get("DC_STOCK_AS_USERS") else ("--deterministic",))[SEED]
    if not given:                       # a released folder's second backbone would cost a load: tiny only
        _prelude_report(folder, torch.load(d / "prepare.pt", weights_only=False, map_location="cpu"))
    return folder, size, seconds, S._seconds(d, seconds), tmp / "in16.wav"


def _prelude_report(folder: Path, prep: dict) -> None:
    """The reference clip's features and embeddings, ours on CUDA against the stock's prepare (into the
    report only: the whole-session tests below are the check)."""
    from engine.backbones.base import TokenFormat
    from engine.backbones.minicpmo45 import MiniCPMO45Backbone
    from engine.backbones.minicpmo45.ref_audio import clip_log_mel, load_clip, reference_embeddings
    b = MiniCPMO45Backbone(TokenFormat(1, 6561, 25.0), size="tiny", device="cuda", checkpoint=str(folder),
                           turn_policy="model")
    b.start()
    clip = folder / "assets" / "HT_ref_audio.wav"
    with torch.no_grad():
        feats = clip_log_mel(torch.from_numpy(load_clip(clip)), b.encoder.fbank.cpu())
        emb = S._host(reference_embeddings(b.encoder, clip))
    ref_feats, ref_emb = prep["ref_features"][0][0], prep["ref_encoder"][0]
    diff = {"ref_features": torch.equal(feats, ref_feats),
            "ref_embeddings": bool(emb.shape == ref_emb.shape and torch.equal(emb, ref_emb)),
            "ref_embeddings_max_diff": float((emb - ref_emb).abs().max()) if emb.shape == ref_emb.shape else None}
    _report_extra("prelude", diff)
    del b
    torch.cuda.empty_cache()


def _report_extra(key: str, value) -> None:
    path = os.environ.get("DC_STOCK_REPORT")
    if path:
        p = Path(path)
        doc = json.loads(p.read_text()) if p.exists() else {}
        doc[key] = value
        p.write_text(json.dumps(doc, indent=1))


def _toggles(mode: str, seconds: int):
    if mode != "flipped":
        return None
    from engine.bench.session import flip_schedule
    return flip_schedule(seconds)


def _speech_whole(stock: list, key: str) -> torch.Tensor:
    """The stock run's speech, every second's concatenated (:func:`S._stock_speech`: as the demo returns it), or with
    ``key`` "speech" every token2wav call's float waveform."""
    return torch.cat([S._stock_speech(stock, k, False, key) for k in range(len(stock))])


def _compare(ours: List[dict], stock: list, mode: str) -> Dict[int, str]:
    """Each second's first differing stage ('' where all are equal); -1: the deferred last chunk, or in the flip
    run the whole speech and float waveform."""
    n = len(stock)
    if mode != "flipped":
        return {(-1 if k == n else k): S._difference_at(ours, stock, k, deferred=mode == "optimized")
                for k in range(n + 1)}
    diffs = {k: S._first_difference(ours[k], stock[k], None) for k in range(n)}
    bad = []
    for ours_key, key in (("speech", "speech_pcm"), ("speech_float", "speech")):
        mine, theirs = torch.cat([S._host(s[ours_key]) for s in ours]), S._host(_speech_whole(stock, key))
        if mine.shape != theirs.shape or not torch.equal(mine, theirs):
            bad.append(f"whole {ours_key}: {tuple(mine.shape)} vs the stock's {tuple(theirs.shape)}")
    diffs[-1] = "; ".join(bad)
    return diffs


def _cut_by_force_listen(stock: list) -> bool:
    """Whether the page's Force Listen (second ``S.BARGE_IN``) cut a reply that was open."""
    k = S.BARGE_IN
    return 0 < k < len(stock) and stock[k]["is_listen"] and not stock[k - 1]["is_listen"] \
        and not stock[k - 1]["end_of_turn"]


def _commit() -> str:
    """The commit the proof ran on (with ``+dirty`` where the tree has changes)."""
    import subprocess
    root = Path(__file__).resolve().parents[1]
    run = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()  # noqa: E731
    head = run("rev-parse", "HEAD") or "unknown"
    return head + ("+dirty" if run("status", "--porcelain", "--untracked-files=no") else "")


def _report(mode: str, stock: list, diffs: Dict[int, str], size: str) -> None:
    path = os.environ.get("DC_STOCK_REPORT")
    if not path:
        return
    p = Path(path)
    doc = json.loads(p.read_text()) if p.exists() else {}
    doc[mode] = {"size": size, "seconds": len(stock), "commit": _commit(), "torch": torch.__version__,
                 "device": torch.cuda.get_device_name(),
                 "speaking_seconds": sum(not s["is_listen"] for s in stock),
                 "turn_ends": sum(bool(s.get("end_of_turn")) for s in stock),
                 "force_listen_second": S.BARGE_IN, "force_listen_cut_a_reply": _cut_by_force_listen(stock),
                 "equal_seconds": sum(1 for k, v in diffs.items() if k >= 0 and not v),
                 "first_differences": {str(k): v for k, v in diffs.items() if v}}
    p.write_text(json.dumps(doc, indent=1))


def _dump(mode: str, ours: List[dict], stock: list, diffs: Dict[int, str]) -> None:
    """With ``DC_STOCK_DUMP`` (a folder): both sides' LLM rows, draws and the stock's RNG states of the first
    differing second, for reading off the device."""
    out, first = os.environ.get("DC_STOCK_DUMP"), min((k for k, v in diffs.items() if v and k >= 0), default=None)
    if not out or first is None:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    o = ours[first]
    torch.save({"second": first, "why": diffs[first],
                "ours": {k: [S._host(t) for t in o.get(k, [])] for k in ("llm_logits", "tts_logits", "codes")}
                | {"sampled": o.get("sampled", []), "history": o.get("history", [])},
                "stock": {k: stock[first].get(k) for k in ("llm_logits", "llm_sampled", "llm_rng", "llm_decode_in",
                                                          "tts_logits", "codes", "llm_history",
                                                          "llm_filter_in", "llm_filter_out")},
                "rng": [(o.get("sampled", []), o.get("cuda_rng", []), s.get("llm_sampled", []),
                         s.get("llm_cuda_rng", [])) for o, s in zip(ours, stock)]},
               Path(out) / f"{mode}-second{first}.pt")


@pytest.mark.parametrize("mode", MODES)
def test_our_cuda_session_equals_the_stock_loop_on_cuda(gpu_runs, mode):
    """Every second, every stage, torch.equal to the stock loop's CUDA record (see the module docstring)."""
    import soundfile as sf
    folder, size, seconds, stock, wav = gpu_runs
    pcm, rate = sf.read(str(wav), dtype="float32")
    assert rate == 16000 and len(pcm) == seconds * rate
    ours = S._our_session_seconds(folder, pcm, SEED, demand=mode == "optimized", device="cuda", size=size,
                                  seconds=seconds, toggles=_toggles(mode, seconds))
    diffs = _compare(ours, stock, mode)
    _report(mode, stock, diffs, size)
    _dump(mode, ours, stock, diffs)
    bad = {k: v for k, v in diffs.items() if v}
    assert not bad, f"{mode}: {len(bad)} seconds differ; first: " + "; ".join(
        f"second {k}: {v}" for k, v in sorted(bad.items())[:3])
    assert sum(not s["is_listen"] for s in stock) >= 2, "the stock run never spoke: the check covered no reply"
    assert any(s["end_of_turn"] for s in stock) and _cut_by_force_listen(stock), (
        "the run needs a turn that ends and a reply cut by the Force Listen at second "
        f"{S.BARGE_IN}: write the folder with a larger <|turn_eos|> factor (--nudge 4.0,2.6)")


def test_the_deterministic_stock_repeats_itself_on_cuda(tmp_path_factory):
    """The oracle itself: the stock loop run twice on CUDA with ``--deterministic`` gives the same record every
    second (the precondition of any bit-for-bit claim against it); with ``DC_STOCK_AS_USERS=1`` the same check
    is made of the stock as its users run it, where cuDNN's choices are expected to break it."""
    _require()
    import minicpmo45_stock_folder as F
    tmp = tmp_path_factory.mktemp("stock-repeat")
    folder = F.write(tmp / "MiniCPM-o-4_5", nudge=S.NUDGE)
    extra = () if os.environ.get("DC_STOCK_AS_USERS") else ("--deterministic",)
    seconds = 12
    runs = []
    for n in (1, 2):
        (tmp / f"run{n}").mkdir()
        d = S._run_stock(folder, tmp / f"run{n}", python=_stock_python(), device="cuda", seeds=(SEED,),
                         seconds=seconds, timeout=1200, extra=extra)[SEED]
        runs.append(S._seconds(d, seconds))
    diffs = {k: S._first_difference(_as_ours(runs[0], k), runs[1][k], S._stock_speech(runs[1], k, deferred=False))
             for k in range(seconds)}
    _report_extra("stock_repeats" + ("_as_users" if extra == () else ""),
                  {str(k): v for k, v in diffs.items() if v} or "every second equal")
    assert not any(diffs.values()), {k: v for k, v in diffs.items() if v}


def _as_ours(seconds: list, k: int) -> dict:
    """Second ``k`` of a stock record in the shape ``_first_difference`` reads our seconds in."""
    from types import SimpleNamespace
    second = seconds[k]
    return {"record": SimpleNamespace(decision="listen" if second["is_listen"] else "speak"),
            "features": [second["audio_features"][0][0]] if second.get("audio_features") else [],
            "encoder": [second["encoder"][0]] if second.get("encoder") else [],
            "llm_logits": second.get("llm_logits", []), "sampled": second.get("llm_sampled", []),
            "tts_logits": second.get("tts_logits", []), "codes": second.get("codes", []),
            "speech": S._stock_speech(seconds, k, deferred=False)}
