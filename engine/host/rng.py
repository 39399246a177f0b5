"""Each hosted session draws its random numbers from its own generator state, as if it ran alone.

The models draw from the device's default generators (the synthetic decoder's Gumbel sampling, the
HiFT's source noise), and a lone session seeds them with ``torch.manual_seed`` at its start. In a
host, N sessions share those generators, so their draws would interleave and every output would
depend on the others. :class:`SessionRng` gives each session its own state instead:

* CUDA: a separate generator *state object* (``Generator.clone_state``), installed on the default
  generator with ``graphsafe_set_state`` while the session is built and while it runs eagerly. A
  CUDA graph registers the state object that was installed when it was captured and, at every
  replay, reads and advances that object's seed and offset — not whatever is installed then. So a
  session's graphs keep drawing from its own state even while other sessions replay concurrently on
  other streams (each state also has its own seed/offset tensors for the graph, so nothing races).
* CPU: the default CPU generator's state, put on whenever the device's scheduler switches into one of the
  session's greenlets and saved when it parks (:meth:`SessionRng.enter` / :meth:`SessionRng.leave`).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch


def _default_cuda_generator(device: torch.device) -> "torch.Generator":
    torch.cuda.init()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.default_generators[index]


class SessionRng:
    """One session's random number state (CPU, and CUDA when the session runs there)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._cpu: torch.Tensor = torch.get_rng_state()
        self._gen: Optional[torch.Generator] = None
        self._state: Optional[torch.Generator] = None
        self._depth = 0
        self._parked_depth = 0
        if self.device.type == "cuda":
            self._gen = _default_cuda_generator(self.device)
            self._state = self._gen.clone_state()      # a new state object, registered by this session's graphs

    @property
    def generator(self) -> Optional[torch.Generator]:
        """The session's CUDA generator (its own state object), for explicit ``generator=`` draws."""
        return self._state

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Make this session's state the default generators' for the duration of the block (re-entrant:
        inside an installed block, e.g. a capture during one of the session's own seconds, nothing changes)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._depth = 1
        try:
            with self._swapped():
                yield
        finally:
            self._depth = 0

    @contextlib.contextmanager
    def _swapped(self) -> Iterator[None]:
        self._put_on()
        try:
            yield
        finally:
            self._take_off()

    def _put_on(self) -> None:
        """This session's states on the default generators; the ones there kept to be put back."""
        self._outer_cpu = torch.get_rng_state()
        torch.set_rng_state(self._cpu)
        if self._gen is not None:
            self._outer = self._gen.graphsafe_get_state()
            self._gen.graphsafe_set_state(self._state)

    def _take_off(self) -> None:
        """This session's states saved (as far as they advanced) and the kept ones put back."""
        self._cpu = torch.get_rng_state()
        torch.set_rng_state(self._outer_cpu)
        if self._gen is not None:
            self._gen.graphsafe_set_state(self._outer)

    def enter(self) -> None:
        """The scheduler switches into one of this session's greenlets: its states go on the default generators,
        as deep inside :meth:`installed` blocks as the greenlet was when it parked (at least one: an
        ``installed`` block inside then changes nothing)."""
        self._put_on()
        self._depth = max(1, self._parked_depth)

    def leave(self) -> None:
        """The greenlet parked or ended: this session's states saved as far as they advanced, the others back."""
        self._parked_depth = self._depth
        self._depth = 0
        self._take_off()

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Inside :meth:`installed`: the states that were on the default generators before it are back for the
        block (another session's capture may run meanwhile: a build hands the capture lock over), this
        session's put on again after, each as far as it advanced. Outside: nothing changes."""
        if not self._depth:
            yield
            return
        self._take_off()
        try:
            yield
        finally:
            self._put_on()
