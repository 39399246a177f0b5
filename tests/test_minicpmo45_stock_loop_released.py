"""Our whole MiniCPM-o 4.5 loop against MiniCPM-o's own, with token2wav's released vocoder and flow widths (CPU).

The 33 s proof (``test_minicpmo45_stock_loop``) runs a token2wav whose HiFT is 32 channels wide. Here the folder's
token2wav has the released dims but for the DiT's depth: the released HiFT (80 -> 512 channels, upsampling 8 x 5
x 3, iSTFT n_fft 16 hop 4, 8 harmonics, its F0 predictor 512 wide and made to give voiced frames), the released
conformer encoder (6 + 4 blocks, FFN 2048) and a DiT 512 wide, 8 heads of 64, MLP ratio 4, 2 blocks deep. The LLM
and TTS are the tiny ones of the 33 s proof, their ``<|turn_eos|>`` head row scaled 2.6 (so a turn ends early).

12 s of input (speech and pauses), seed 5, the page's Force Listen at second 9: the stock speaks in seconds 3-5 and
8, is cut by the Force Listen while that reply is open, speaks again and ends that turn (its last token2wav chunk)
in second 10, and starts the next reply in second 11. Our
``DuplexSession`` in both modes against the stock loop's record: every second every stage (as the 33 s proof),
each second's token2wav float waveform, and the second's speech as the demo hands it on — token2wav's
``stream`` returns 16-bit PCM (clipped to [-1, 1], x 32767, truncated), which the loop reads back / 32768.
A loop that hands on the float instead differs in every speaking second (by up to 6e-5, and by what the
cross-fade lifts past full scale where it does).
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracles  # noqa: E402
import test_minicpmo45_stock_loop as S  # noqa: E402

pytestmark = [pytest.mark.oracle, pytest.mark.bits]

SEED = 5                        # the session's seed (torch.manual_seed before prepare, the flow's noise)
T2W_SEED = 29                   # token2wav's weights
NUDGE = (4.0, 2.6)              # head-row factors of <|listen|>, <|turn_eos|>
SECONDS = 12
BARGE_IN = 9


def released_widths():
    """Token2wav at the released dims, the DiT 2 blocks deep (its 16 blocks x 5 flow steps dominate a CPU run)."""
    from engine.models.step_audio2.config import preset
    r = preset("released")
    return replace(r, flow=replace(r.flow, dit=replace(r.flow.dit, depth=2)))


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """(folder, the stock loop's seconds, the input WAV)."""
    oracles.require(oracles.DEMO, oracles.STOCK_VENV)
    import minicpmo45_stock_folder as F
    tmp = tmp_path_factory.mktemp("stock-loop-released")
    folder = F.write(tmp / "MiniCPM-o-4_5", nudge=NUDGE, t2w=released_widths(), t2w_seed=T2W_SEED)
    d = S._run_stock(folder, tmp, seeds=(SEED,), seconds=SECONDS, barge_in=BARGE_IN)[SEED]
    return folder, S._seconds(d, SECONDS), tmp / "in16.wav"


def test_the_stock_run_ends_a_turn_and_is_cut_by_the_force_listen(released):
    _, stock, _ = released
    speak = [s["second"] for s in stock if not s["is_listen"]]
    ends = [s["second"] for s in stock if s["end_of_turn"]]
    assert ends and speak[-1] > min(ends), (speak, ends)          # a turn ends, and a reply follows it
    cut = stock[BARGE_IN - 1]
    assert stock[BARGE_IN]["is_listen"] and not cut["is_listen"] and not cut["end_of_turn"], "no reply was cut"
    assert any(last for s in stock for last in s.get("t2w_last", [])), "no turn's last token2wav chunk"
    assert not [why for why in map(S._demo_returned_its_calls, stock) if why]


@pytest.mark.parametrize("demand", [False, True], ids=["stock-policy", "optimized"])
def test_our_loop_speaks_the_stock_loops_speech_with_the_released_vocoder(released, demand, monkeypatch,
                                                                         one_torch_thread):
    import soundfile as sf
    from engine.models.step_audio2.hift_parts import F0Predictor
    folder, stock, wav = released
    f0 = []
    forward = F0Predictor.forward
    monkeypatch.setattr(F0Predictor, "forward", lambda self, x: f0.append(forward(self, x)) or f0[-1])
    pcm, rate = sf.read(str(wav), dtype="float32")
    assert rate == 16000 and len(pcm) == SECONDS * rate
    ours = S._our_session_seconds(folder, pcm, SEED, demand, seconds=SECONDS, barge_in=BARGE_IN)
    assert ours[0]["record"] is not None and folder.is_dir()
    voiced = torch.cat([f.reshape(-1) for f in f0]) > 10.0        # the NSF source's voicing threshold (Hz)
    assert f0 and 0.2 < voiced.float().mean() < 1.0, "the vocoder's frames are not voiced: its source is trivial"
    for k in range(SECONDS + 1):
        why = S._difference_at(ours, stock, k, deferred=demand)
        assert not why, f"second {k}: {why}"
    assert float(torch.cat([s["speech"] for s in ours]).abs().max()) > 0.1, "the speech is near silence"
