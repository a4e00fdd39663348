"""Stopping a run early: on request, or because one process of a distributed run failed.

On request: Ctrl-C (SIGINT) or SIGTERM finish the current step, write a checkpoint of the
steps completed, and end with the conventional exit status.

:class:`GracefulStop` is a context manager for the main thread that turns the first
SIGINT/SIGTERM into a request (``stop()`` becomes True) instead of an exception, so the
trainer can stop between two steps (:meth:`comppo_core.rl.Trainer.train` polls it); the
second signal is not intercepted any more, so a second Ctrl-C stops at once (a
``KeyboardInterrupt``; the last checkpoint written stays as it was). On exit the previous
handlers are put back. :class:`TrainingInterrupted` is what the trainer raises when it
stopped on request.

On a failure: :class:`RankFailed` is what every *other* rank of a ``torchrun`` run raises
when one rank's step raised (a verifier's error, a non-finite value only its rows hold):
the failing rank announces its error and breaks the process group, so the others leave the
collective they wait in at once and raise this, naming the failing rank, its step and its
error (:meth:`comppo_core.rl.engine.distributed.Dist.stop_all`).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from ...errors import ComppoError

__all__ = ["GracefulStop", "RankFailed", "TrainingInterrupted", "exit_status"]


class TrainingInterrupted(Exception):
    """:meth:`Trainer.train` stopped on request (``stop``): the steps before ``next_step``
    are done and checkpointed in ``checkpoint`` (None without ``out``); resume continues."""

    def __init__(self, next_step: int, checkpoint: Path | None) -> None:
        where = "no checkpoint (out=None)" if checkpoint is None else f"checkpoint {str(checkpoint)!r}"
        super().__init__(f"training stopped on request before step {next_step}; {where}")
        self.next_step = next_step
        self.checkpoint = checkpoint


class RankFailed(ComppoError):
    """Another rank of this distributed run failed: ``rank`` (None when no rank reported
    an error) raised ``error`` (``"ValueError: ..."``) at ``step``; this rank stopped too.

    The message names all three, e.g. ``rank 1 of 2 failed at step 2: ValueError: the
    verifier broke; every rank stopped, the last good checkpoint (after 2 steps) is kept
    at 'runs/x/checkpoint'``."""

    def __init__(
        self, message: str, *, rank: int | None = None, step: int | None = None, error: str | None = None
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.step = step
        self.error = error


def exit_status(signum: int) -> int:
    """The shell's status for a process ended by signal ``signum``: ``128 + signum``
    (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + int(signum)


class GracefulStop:
    """``with GracefulStop() as stop: trainer.train(stop=stop)``: ``stop()`` is True once
    SIGINT or SIGTERM arrived; ``stop.signum`` is the first such signal (None before).
    Outside the main thread (where Python cannot install handlers) it never asks to stop."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __call__(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        for s, previous in self._previous.items():  # a second signal acts at once
            signal.signal(s, previous)

    def __enter__(self) -> GracefulStop:  # noqa: PYI034 (typing.Self needs Python 3.11)
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous.clear()
