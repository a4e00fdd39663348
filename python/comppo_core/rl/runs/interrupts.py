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

A stop is acted on at the next step boundary; a phase that holds no step boundary for a
while (the critic warm-up, :mod:`comppo_core.rl.critics.warmup`) says so at once with
:func:`notice_on_stop`: a stop requested while it runs (or already requested when it
starts) prints its one-line notice on stderr immediately, instead of leaving the user
with seconds of silence.

On a failure: :class:`RankFailed` is what every *other* rank of a ``torchrun`` run raises
when one rank's step raised (a verifier's error, a non-finite value only its rows hold):
the failing rank announces its error and breaks the process group, so the others leave the
collective they wait in at once and raise this, naming the failing rank, its step and its
error (:meth:`comppo_core.rl.engine.distributed.Dist.stop_all`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from ...errors import ComppoError

__all__ = ["GracefulStop", "RankFailed", "TrainingInterrupted", "exit_status", "notice_on_stop", "stop_requested"]


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
        _announce()

    def __enter__(self) -> GracefulStop:  # noqa: PYI034 (typing.Self needs Python 3.11)
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous.clear()
        if self in _ACTIVE:
            _ACTIVE.remove(self)


#: The GracefulStops entered in the main thread and not exited yet, innermost last.
_ACTIVE: list[GracefulStop] = []


class _Notice:
    """A phase's notice (:func:`notice_on_stop`): its text, and whether it was printed."""

    def __init__(self, message: Callable[[], str]) -> None:
        self.message = message
        self.said = False


#: The notices of the phases under way, innermost last.
_NOTICES: list[_Notice] = []


def stop_requested() -> bool:
    """Whether a :class:`GracefulStop` under way in this process has been asked to stop."""
    return any(stop() for stop in _ACTIVE)


def _say(text: str) -> None:
    """Write one line on stderr, from a signal handler too: a handler that interrupts a
    write to the same stream cannot write through it (a reentrant call), so the line
    then goes to file descriptor 2 directly."""
    try:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    except (RuntimeError, OSError, ValueError, AttributeError):
        with contextlib.suppress(OSError):
            os.write(2, (text + "\n").encode())


def _announce() -> None:
    """Print the innermost phase's notice, once, if a stop was requested."""
    if _NOTICES and not _NOTICES[-1].said and stop_requested():
        _NOTICES[-1].said = True
        _say(_NOTICES[-1].message())


@contextlib.contextmanager
def notice_on_stop(message: str | Callable[[], str]) -> Iterator[None]:
    """While inside, a stop requested of a :class:`GracefulStop` (a first Ctrl-C or
    SIGTERM) prints ``message`` on stderr at once (a callable: its text at that moment),
    once; so does entering with a stop already requested. For a phase that runs a while
    before the run's next step boundary, where the stop is acted on. Without a
    GracefulStop under way (a signal then raises at once) it prints nothing."""
    notice = _Notice(message if callable(message) else lambda: message)
    _NOTICES.append(notice)
    try:
        _announce()
        yield
    finally:
        _NOTICES.remove(notice)
