"""`duplexcadence run`: a headless duplex session over a WAV file, with every second on the record.

  duplexcadence run --input IN.wav --output OUT.wav --log DIR [--model TAIL]
                    [--backbone BACKBONE] [--checkpoint PATH] [--backbone-checkpoint DIR]
                    [--voice WAV|NPZ] [--size auto|released|tiny] [--device auto|cpu|cuda] [--mode stock|demand|graphs]
                    [--realtime] [--seconds N] [--input-rate 16000|24000] [--engine ws://HOST:PORT [--token-file F]]

With --engine the session runs on a `duplexcadence serve` server (engine/serve); the files are the same.

IN.wav may have any sample rate and channel count (mixed down, resampled to the session's input rate:
24 kHz; 16 kHz by default for minicpm-o-4.5, the stock duplex loop's own input; --input-rate). OUT.wav is
24 kHz mono with one second out per second in (second k's answer is second k of OUT.wav: it
plays while second k+1 comes in). DIR receives session.csv, session.jsonl, session.trace.json
(open it in Perfetto), summary.json, the session's input and output WAVs and speech.npy (float32 at
24 kHz: what the decoder tail produced, every second concatenated, before any playback levelling or
queueing; MiniCPM-o 4.5's through 16-bit PCM, as its own duplex loop hands its speech on). Each record carries the second's decision, LLM token ids and speech codes (where the
backbone reports them). Default pace: as fast
as possible; ``--realtime`` feeds one second per second through the live runner, so a slow second
makes the next frames queue.

Nothing waits for the end: each second's record and audio go into a fresh ``DIR.partial-xxxx``
folder beside DIR as it is processed (see engine/session/journal.py), which becomes DIR when the
session ends. SIGINT (Ctrl-C) or SIGTERM stops at the second boundary, writes everything so far
and exits 130 / 143; a killed process leaves the partial folder with every second up to the last.
"""
from __future__ import annotations

import argparse
import shutil
import signal
import sys
from pathlib import Path
from typing import List, Tuple

import numpy as np

from engine.audio import AudioError, InputFrames
from engine import registry
from engine.cli.validate import OneLineParser, output_file, output_folder, seconds, seed
from engine.atomic import atomic_write
from engine.session import (DuplexSession, ExportError, LiveRunner, SessionConfig, format_summary,
                            summarize)
from engine.session.input_rate import InputRateJournal, chosen_input_rate
from engine.session.journal import OUTPUT_WAV, SESSION_FILES, SessionJournal, fresh_folder, publish
from engine.cli.feed import Interrupted, Progress, StopSignals, announce, feed
from engine.core.toggles import MODES, Toggles


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model, --backbone, --checkpoint, --backbone-checkpoint, --voice: choices, defaults and help texts from
    the registry."""
    p.add_argument("--model", default=registry.default_tail(), choices=registry.tail_names(),
                   help="decoder tail (SPEAK)")
    p.add_argument("--backbone", default=registry.default_backbone(), choices=registry.backbone_names(),
                   help="LISTEN + THINK")
    owners = " or ".join(e.name for e in registry.backbones() if e.owns_folder is not None)
    p.add_argument("--checkpoint", help="decoder tail weights (" + registry.checkpoint_hints() + ")"
                   + (f"; with --backbone {owners} a backbone folder here is taken as the backbone's" if owners else ""))
    p.add_argument("--backbone-checkpoint", help="the backbone's weights folder (" + registry.folder_hints() + ")")
    conditioned = [e for e in registry.tails() if e.conditioning is not None]
    p.add_argument("--voice", metavar="WAV|NPZ",
                   help="the voice of the " + " / ".join(e.name for e in conditioned) + " tail: "
                        + "; ".join(e.conditioning.help for e in conditioned)
                        + "; default: the backbone folder's voice, else a synthetic prompt")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="duplexcadence run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="input WAV (any rate, any channels)")
    p.add_argument("--output", required=True, help="output WAV (24 kHz mono)")
    p.add_argument("--log", required=True, help="folder for session.csv / .jsonl / .trace.json / summary.json")
    add_model_args(p)
    p.add_argument("--size", default="auto", choices=["auto", "released", "tiny"],
                   help="auto: released on a GPU, tiny on a CPU")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--mode", default="graphs", choices=list(MODES),
                   help="engine toggles: stock (stock-sized state, eager), demand, graphs (demand + graph replay)")
    p.add_argument("--realtime", action="store_true", help="pace the input at one second per second")
    p.add_argument("--seconds", type=seconds, default=None,
                   help="use only the first N seconds of the input (only those are read; at most 24 h)")
    p.add_argument("--seed", type=seed, default=0,
                   help="seed of the random weights and sampling (0 to 2**63-1); torch's CPU generator is seeded "
                        "with it right before the backbone's first second (minicpm-o-4.5: after its prompt prefill, "
                        "which draws nothing)")
    p.add_argument("--system-prompt", metavar="TEXT", default=None,
                   help="minicpm-o-4.5: the session's system prompt, fed before the first second "
                        "(default: the MiniCPM-o demo's default duplex preset); with --engine it goes to the "
                        "server, which refuses a blank one, one over 4000 characters or one with control characters")
    p.add_argument("--input-rate", type=input_rate, default=None, metavar="HZ",
                   help="the rate the session hears at (IN.wav is resampled to it): 24000, or 16000 with --backbone "
                        "minicpm-o-4.5, whose backbone then takes the 16 kHz frames as the stock duplex loop does; "
                        "default: 16000 for minicpm-o-4.5, 24000 for the other backbones")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--reference-paths", action="store_true",
                   help="keep every decoder on its reference path: no faster path, even where the start-up "
                        "self-check would find it bit-identical (also $DUPLEXCADENCE_REFERENCE_PATHS=1; embedded only)")
    p.add_argument("--engine", metavar="ws://HOST:PORT",
                   help="run the session on a `duplexcadence serve` server instead of embedded")
    p.add_argument("--token-file", help="with --engine: file holding the server's token (default: "
                                        "$DUPLEXCADENCE_TOKEN)")
    return p


def input_rate(text: str) -> int:
    """--input-rate: a whole number of Hz (which rates the backbone takes is the config's to say)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of Hz (16000 or 24000)") from None


def make_config(a: argparse.Namespace) -> SessionConfig:
    t = Toggles.from_mode(a.mode)
    ckpt, bb_ckpt = a.checkpoint, a.backbone_checkpoint
    owns = registry.get_backbone(a.backbone).owns_folder
    if bb_ckpt is None and ckpt and owns is not None and owns(ckpt):     # a backbone folder given as --checkpoint
        ckpt, bb_ckpt = None, ckpt
    cfg = SessionConfig(tail=a.model, backbone=a.backbone, size=a.size, device=a.device, checkpoint=ckpt,
                        backbone_checkpoint=bb_ckpt, demand_sized=t.demand_sized, graph_replay=t.graph_replay, seed=a.seed,
                        voice=getattr(a, "voice", None), system_prompt=getattr(a, "system_prompt", None),
                        input_rate=chosen_input_rate(a))
    return cfg.resolved()


def run_fast(cfg: SessionConfig, frames: List[np.ndarray], progress: Progress, journal: SessionJournal,
             stop: StopSignals) -> None:
    """Every second back to back, as fast as the engine goes; each one into the journal at once."""
    s = DuplexSession(cfg)
    try:
        s.start()
        stop.building = False
        announce(s.info)
        journal.metadata.update(s.info)          # the logs name the model (a replay's title)
        for f in frames:
            if stop.signum:
                break
            out, rec = s.process(f)
            journal.append(rec, f, out, speech=s.last_speech)
            progress.update(journal.seconds, rec)
        else:
            journal.append_speech(s.held_speech())     # a reply's last chunk the schedule held for a next second
    finally:
        stop.building = False
        s.close()


def run_realtime(cfg: SessionConfig, frames: List[np.ndarray], progress: Progress, journal: SessionJournal,
                 stop: StopSignals) -> None:
    """One frame per second into the live runner; late seconds make frames queue (none dropped).
    A stop signal ends it at the second in progress (which is kept)."""
    runner = LiveRunner(cfg)
    try:
        with stop.deferred():                    # a signal inside Thread.start would leave the worker unjoined
            runner.start()
        while not runner.ready.wait(0.1):
            pass
    except Interrupted:
        runner.stop(timeout=600.0)               # the worker finishes building, then stops: join it
        raise
    stop.building = False
    if runner.session is not None:
        announce(runner.session.info)
        journal.metadata.update(runner.session.info)
    try:
        feed(runner, frames, progress, journal, stop, lambda elapsed, done: int(elapsed) + 1,
             "the live runner stopped before the end of the input")
        runner.stop(timeout=60.0, drain=True)
        if runner.session is not None and not stop.signum:
            journal.append_speech(runner.session.held_speech())    # the worker has stopped: its session is ours
    finally:
        runner.stop(timeout=60.0)
        if runner.session is not None:
            runner.session.close()


def _copy_wav(src: Path, dest) -> Path:
    """The journal's output WAV as ``dest``, written atomically."""
    def write(f) -> None:
        with open(src, "rb") as g:
            shutil.copyfileobj(g, f, 1 << 20)
    return atomic_write(dest, write, ExportError)


def _journal_for(log: Path, cfg: SessionConfig) -> SessionJournal:
    """A journal in a fresh ``LOG.partial-xxxx`` folder beside ``log`` (renamed onto it at the end)."""
    log = log.expanduser()
    if log.exists() and not log.is_dir():
        raise ExportError(f"cannot write {log / 'session.csv'}: {log} is not a folder")
    try:
        folder = fresh_folder(log.parent, f"{log.name}.partial-")
    except OSError as e:
        raise ExportError(f"cannot write into {log.parent}: {e.strerror or e}") from None
    journal = InputRateJournal.create(folder, metadata={"config": {k: v for k, v in vars(cfg).items()}})
    journal.input_rate = cfg.input_rate        # the heard seconds go on session_input.wav at 24 kHz
    return journal


def _finish(a: argparse.Namespace, cfg: SessionConfig, journal: SessionJournal, signum: int) -> Tuple[Path, Path]:
    """Write the rest of the journal, the output WAV, and move the logs onto ``--log``."""
    summary = summarize(journal.records)
    summary.update({"config": {k: v for k, v in vars(cfg).items()}, "input": str(a.input),
                    "pace": "realtime" if a.realtime else "fast",
                    "interrupted": signal.Signals(signum).name if signum else None})
    journal.finish(summary=summary, metadata={**journal.metadata, "config": summary["config"]})
    try:
        log = publish(journal.directory, Path(a.log).expanduser())
    except OSError as e:
        raise ExportError(f"cannot write {a.log}: {e.strerror or e}; the session's files are in "
                          f"{journal.directory}") from None
    return _copy_wav(log / OUTPUT_WAV, a.output), log


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.reference_paths:
        from engine import fastpath
        fastpath.force_reference(True)
    with StopSignals() as stop:
        try:
            return _main(a, stop)
        except Interrupted as e:              # before the first second: nothing to keep
            print("duplexcadence run: interrupted after 0 s; nothing written", file=sys.stderr)
            return 128 + e.signum


def _main(a: argparse.Namespace, stop: StopSignals) -> int:
    try:
        runner = None
        if a.engine:                                   # the session runs on a server (engine/serve)
            from engine.cli.remote import make_runner, remote_config
            cfg = remote_config(a)
            runner = make_runner(a, cfg)
        else:
            cfg = make_config(a)
        output_file(a.output, "--output", inputs=[a.input], suffixes=(".wav",))
        output_folder(a.log, "--log", inputs=[a.input], names=SESSION_FILES)
        frames = InputFrames(a.input, rate=cfg.input_rate, max_seconds=a.seconds,   # streamed, at the session's rate
                             size=cfg.input_rate)
    except (ValueError, AudioError) as e:
        print(f"duplexcadence run: error: {e}", file=sys.stderr)
        return 2
    try:
        return _session(a, cfg, runner, frames, stop)
    finally:
        frames.close()


def _kept(journal: SessionJournal, a: argparse.Namespace) -> str:
    """What a failed finish kept and how to recover it (the journal stays unfinished on disk)."""
    if not journal.directory.is_dir():
        return ""
    return (f"; the {journal.seconds} s recorded so far are kept in {journal.directory}: once there is room, "
            f"run `duplexcadence recover {journal.directory} --log {a.log} --output {a.output}`")


def _session(a: argparse.Namespace, cfg: SessionConfig, runner, frames: InputFrames, stop: StopSignals) -> int:
    """The session over ``frames``, every second into a journal, then the outputs; the exit status."""
    progress = Progress(len(frames), a.quiet)
    stop.building = False                     # the journal folder is made whole (a signal waits)
    try:
        journal = _journal_for(Path(a.log), cfg)
    except ExportError as e:
        print(f"duplexcadence run: error: {e}", file=sys.stderr)
        return 1
    if stop.signum:
        journal.discard()
        raise Interrupted(stop.signum)
    stop.building = True
    error = None
    try:
        if runner is not None:
            from engine.cli.remote import run_remote
            run_remote(runner, frames, progress, journal, stop, a.realtime)
        else:
            (run_realtime if a.realtime else run_fast)(cfg, frames, progress, journal, stop)
    except Interrupted:
        pass
    except (ValueError, RuntimeError, ImportError, FileNotFoundError, ExportError) as e:
        error = e
    progress.close()
    signum = stop.signum
    stop.building = False
    if journal.seconds == 0:
        journal.discard()                  # nothing happened: leave the old logs and output alone
        if error is not None:
            print(f"duplexcadence run: error: {error}", file=sys.stderr)
            return 1
        if signum:
            print("duplexcadence run: interrupted after 0 s; nothing written", file=sys.stderr)
            return 128 + signum
    try:
        out, log = _finish(a, cfg, journal, signum)
    except (ExportError, AudioError) as e:
        first = f"{error}; then " if error is not None and str(error) != str(e) else ""
        print(f"duplexcadence run: error: {first}{e}{_kept(journal, a) if not journal.finished else ''}",
              file=sys.stderr)
        return 1
    n = journal.seconds
    written = f"wrote {out} ({n} s, 24 kHz mono) and {log}/ (session.csv, session.jsonl, session.trace.json, " \
              f"session_input.wav, session_output.wav, summary.json, speech.npy)"
    if error is not None:
        print(f"duplexcadence run: error: {error}; {written}", file=sys.stderr)
        return 1
    if signum:
        print(f"duplexcadence run: interrupted after {n} s; {written}", file=sys.stderr)
        return 128 + signum
    print(format_summary(summarize(journal.records)))
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
