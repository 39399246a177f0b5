"""`duplexcadence run --engine ws://HOST:PORT`: the headless session, run by a remote server.

The flow is the embedded ``run``'s (the same journal, progress, summary and files); only the runner
differs: :class:`~engine.serve.client.RemoteRunner`. Without ``--realtime`` each second is sent
when the previous one came back (as fast as the server goes, no queueing); with it, one second per
second. If the server goes away, every second received so far is written like an interrupted run
and the command says what happened (exit 1).
"""
from __future__ import annotations

import argparse
from typing import List

import numpy as np

from engine import system_prompt
from engine.core.toggles import Toggles
from engine.cli.feed import Interrupted, announce, feed, take
from engine.session import SessionConfig
from engine.session.input_rate import check_input_rate, chosen_input_rate

from engine.serve.auth import read_token
from engine.serve.client import RemoteRunner


def remote_config(a: argparse.Namespace) -> SessionConfig:
    """What the client asks of the server: the model names, seed, toggles and system prompt (nothing resolved here:
    the server owns weights, size and device). Local checkpoint paths make no sense remotely."""
    if a.checkpoint or a.backbone_checkpoint:
        raise ValueError("--checkpoint and --backbone-checkpoint name the server's weights: give them to "
                         "`duplexcadence serve`, not to a client with --engine")
    if getattr(a, "voice", None):
        raise ValueError("--voice names a file for the server's tail: not with --engine (the server's "
                         "checkpoint default voice is used)")
    t = Toggles.from_mode(a.mode)
    prompt = getattr(a, "system_prompt", None)
    if prompt is not None:
        system_prompt.check(prompt)                  # the server checks it too; say so before connecting
    rate = chosen_input_rate(a)
    check_input_rate(a.backbone, rate)               # the server checks it too; say so before connecting
    return SessionConfig(tail=a.model, backbone=a.backbone, size=a.size, device=a.device,
                         demand_sized=t.demand_sized, graph_replay=t.graph_replay, seed=a.seed,
                         system_prompt=prompt, input_rate=rate)


def make_runner(a: argparse.Namespace, cfg: SessionConfig) -> RemoteRunner:
    """The remote runner for ``--engine`` (the token from --token-file or $DUPLEXCADENCE_TOKEN); it asks for each
    second's tail output, which the journal writes as speech.npy (a server that predates the ask sends none)."""
    return RemoteRunner(cfg, a.engine, read_token(a.token_file, role="client"), speech=True)


def run_remote(runner: RemoteRunner, frames: List[np.ndarray], progress, journal, stop, realtime: bool) -> None:
    """Feed ``frames`` to the remote session and journal each second as it comes back."""
    try:
        with stop.deferred():                    # a signal inside Thread.start would leave the worker unjoined
            runner.start()
        while not runner.ready.wait(0.1):
            pass
    except Interrupted:
        runner.stop(timeout=10.0)
        raise
    stop.building = False
    if runner.session is None:
        take(runner.results.get(), frames, journal, progress)     # the refusal, as a RuntimeError
        return
    announce(runner.session.info)
    pace = (lambda elapsed, done: int(elapsed) + 1) if realtime else (lambda elapsed, done: done + 1)
    try:
        feed(runner, frames, progress, journal, stop, pace,
             f"the session on {runner.where} ended before the end of the input")
    finally:
        runner.stop(timeout=10.0)
