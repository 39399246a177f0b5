"""MiniCPM-o 4.5 as a duplex backbone: streaming audio encoder -> Qwen3 LLM -> TTS (-> Step-Audio2 tail).

Registers ``minicpm-o-4.5``: it speaks Step-Audio2 tokens, ends its replies in turns, runs no tail while
it listens, has its tail built with 5 flow steps (``TAIL_FLOW_STEPS``, as its own duplex loop builds
token2wav) and has it decode every buffer of ``TAIL_CHUNK_MIN_FRAMES`` + 3 lookahead = 8 tokens and up (as
that loop's ``force_flush`` does) and hands its speech on as 16-bit PCM (``speech_pcm16``: token2wav's
``stream`` returns PCM bytes, which that loop reads back as float), a speaking second shorter than a second
that does not end its turn after silence up to a second (``pads_short_speech``, as that loop returns its units);
its released folder (checked by content) brings the tail's token2wav weights and the default voice
(``assets/HT_ref_audio.wav``). It declares what it offers a session: a system prompt (default: the demo's default
duplex preset), the stock's 16 kHz input, the session's voice as its LLM's reference clip, the duplex page's Force
Listen, a "tts" mark inside THINK, the work it prepares between seconds (``AHEAD_SCOPES``), one-token LLM forwards
a host may batch, and its measured memory.
"""
from pathlib import Path
from typing import Optional

from engine.registry import BackboneEntry, BackboneFolder, MeasuredMemory, TailChunking, register_backbone

from .audio import RATE as NATIVE_RATE
from .backbone import AHEAD_SCOPES, MiniCPMO45Backbone
from .dims import PRESETS, Dims, preset
from .prompt import DEFAULT_SYSTEM_PROMPT

NAME = "minicpm-o-4.5"
DEFAULT_VOICE = Path("assets") / "HT_ref_audio.wav"     # the released folder's default voice
TAIL_FLOW_STEPS = 5     # its streaming token2wav's flow (Euler) steps; Step-Audio2's own stock uses 10
TAIL_CHUNK_MIN_FRAMES = 5   # its token2wav decodes any buffer of pre-lookahead (3) + 5 tokens each second


def default_voice(folder) -> Optional[Path]:
    """The released folder's default voice, if the folder has it."""
    p = Path(folder) / DEFAULT_VOICE
    return p if p.is_file() else None


def open_folder(path: str, size: str) -> BackboneFolder:
    """The released folder checked by content (one clear error for a broken one), with what it brings."""
    from .weights import open_folder as open_released
    folder = open_released(path)
    voice = default_voice(folder.path)
    return BackboneFolder(str(folder.path), tail_checkpoint=str(folder.token2wav) if folder.token2wav else None,
                          voice=str(voice) if voice else None)


def _owns(path: str) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


register_backbone(BackboneEntry(
    name=NAME, title="MiniCPM-o 4.5", make=MiniCPMO45Backbone, tails=("step-audio2",),
    speaks="Step-Audio2 tokens", speaks_in_turns=True, listen_skips_tail=True, open_folder=open_folder,
    folder_hint="MiniCPM-o 4.5 folder (config.json, shards, tokenizer.json; its assets/token2wav is the tail's)",
    owns_folder=_owns, order=20,
    # the stock duplex loop's token2wav: init_unified -> init_token2wav(streaming=True), n_timesteps=5
    tail_options={"n_timesteps": TAIL_FLOW_STEPS},
    # the stock duplex loop's _generate_waveform_from_tokens(force_flush=True): chunks of 8 to 28 tokens
    tail_chunking=TailChunking(min_frames=TAIL_CHUNK_MIN_FRAMES),
    system_prompt=DEFAULT_SYSTEM_PROMPT, native_rate=NATIVE_RATE, reference_clip=True, force_listen=True,
    stage_marks=("tts",), ahead=AHEAD_SCOPES, batched_steps=("llm",),
    # H200, released dims, graphs, 60 s: 20,543,700,992 bytes peak reserved, its build included
    measured_memory=(MeasuredMemory("released", 19.1, "graphs mode, 60 s on an H200, build included: "
                                    "docs/results/minicpmo45-vs-stock-loop.json"),),
    # the stock duplex loop's speech: token2wav's stream returns 16-bit PCM, read back as float (/ 32768)
    speech_pcm16=True,
    # ... and returns each speaking unit as at least a second: shorter speech (not a turn's end) after silence
    pads_short_speech=True))

__all__ = ["MiniCPMO45Backbone", "PRESETS", "Dims", "preset", "DEFAULT_VOICE", "default_voice", "open_folder",
           "TAIL_FLOW_STEPS", "TAIL_CHUNK_MIN_FRAMES"]
