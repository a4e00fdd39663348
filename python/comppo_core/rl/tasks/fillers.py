"""Random fillers around a response's answer: the layout of the tasks built for token credit.

A *wrapped* response is a filler of ``N`` symbols of :data:`FILLER` (``N`` uniform in
``[filler_min, filler_max]``), the separator ``|``, the task's own text (the *body*), then,
when ``tail_max > 0``, a second ``|`` and a tail of ``M`` symbols (``M`` uniform in
``[tail_min, tail_max]``)::

    "cabdbbac|<body>|cbabca"        filler N = 8, tail M = 6

The fillers change no reward; their random lengths move the body from one sample to the
next, so a per-position average cannot tell which tokens matter. :func:`pivotal_body`
marks the body's characters (between the first separator and the second, if any), the
tokens an oracle gate source treats as pivotal. Used by
:class:`~comppo_core.rl.tasks.chain.ChainTask` and
:class:`~comppo_core.rl.tasks.filler_addition.FillerAdditionTask`.
"""

from __future__ import annotations

import re

import numpy as np

from ...errors import ParameterError

__all__ = ["FILLER", "SEPARATOR", "FillerRange", "body_pattern", "pivotal_body", "wrap"]

#: The filler's symbols.
FILLER = "abcd"
#: Between the filler and the body, and between the body and the tail.
SEPARATOR = "|"


class FillerRange:
    """The filler's and the tail's length ranges, checked: ``0 ≤ low ≤ high ≤ 256`` each
    (``tail_max = 0``: no tail and no second separator). ``prefix`` names the arguments in
    an error (``"chain_"`` gives ``chain_filler_max``; the task classes pass ``""``)."""

    def __init__(self, filler_min: int, filler_max: int, tail_min: int, tail_max: int, *, prefix: str = "") -> None:
        for name, value in (
            ("filler_min", filler_min),
            ("filler_max", filler_max),
            ("tail_min", tail_min),
            ("tail_max", tail_max),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 256:
                raise ParameterError(
                    f"{prefix}{name}: expected an integer in [0, 256], got {value!r}", argument=prefix + name
                )
        for name, lo, hi in (("filler", filler_min, filler_max), ("tail", tail_min, tail_max)):
            if hi < lo:
                raise ParameterError(
                    f"{prefix}{name}_max: expected at least {name}_min={lo}, got {hi}", argument=f"{prefix}{name}_max"
                )
        self.filler_min, self.filler_max, self.tail_min, self.tail_max = filler_min, filler_max, tail_min, tail_max

    @property
    def extra_tokens(self) -> int:
        """Characters the wrapping adds at most: ``filler_max + 1``, plus ``1 + tail_max`` with a tail."""
        return self.filler_max + 1 + (self.tail_max + 1 if self.tail_max else 0)


def _symbols(rng: np.random.Generator, low: int, high: int) -> str:
    n = int(rng.integers(low, high + 1))
    return "".join(FILLER[int(i)] for i in rng.integers(0, len(FILLER), size=n))


def wrap(body: str, rng: np.random.Generator, sizes: FillerRange) -> str:
    """``filler | body [| tail]`` with fresh random fillers drawn with ``rng`` (the filler's
    length, its symbols, then the tail's length and symbols)."""
    head = _symbols(rng, sizes.filler_min, sizes.filler_max)
    tail = SEPARATOR + _symbols(rng, sizes.tail_min, sizes.tail_max) if sizes.tail_max else ""
    return head + SEPARATOR + body + tail


def body_pattern(body: str, sizes: FillerRange) -> re.Pattern[str]:
    """A regex that fully matches a wrapped response whose body matches the regex ``body``
    (its one capturing group is the body)."""
    sep = re.escape(SEPARATOR)
    tail = f"{sep}[{FILLER}]{{{sizes.tail_min},{sizes.tail_max}}}" if sizes.tail_max else ""
    return re.compile(f"[{FILLER}]{{{sizes.filler_min},{sizes.filler_max}}}{sep}({body}){tail}", re.ASCII)


def pivotal_body(response: str) -> list[bool]:
    """One flag per character of ``response``: True after its first separator and before
    its second one, if any (the body, whatever it holds); False for the fillers, the
    separators, and every character of a response without a separator."""
    cut = response.find(SEPARATOR)
    if cut < 0:
        return [False] * len(response)
    end = response.find(SEPARATOR, cut + 1)
    end = len(response) if end < 0 else end
    return [cut < k < end for k in range(len(response))]
