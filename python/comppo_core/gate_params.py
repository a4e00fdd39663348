"""The gate mapping's parameters as one value (docs/design.md §4).

::

    z = normalize(c)                     "sequence" | "batch" | "none" ((c − center)/scale)
    z = −z if invert
    g = low + (high − low) · sigmoid(sharpness · z)

:class:`GateParams` holds the seven parameters of that mapping, so every layer that
maps concentration to gates (the array API, Arrow, Hugging Face, Ray, the CLI and
``rl``) takes one ``gate_params=`` value instead of spelling the seven keywords out
again. ``GateParams()`` is the mapping's defaults; ``cc.gates_from_concentration(c,
**params.as_kwargs())`` applies it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .errors import ParameterError

__all__ = ["NORMALIZE_MODES", "GateParams"]

#: The values ``normalize`` may take.
NORMALIZE_MODES = ("sequence", "batch", "none")


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ParameterError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class GateParams:
    """Parameters of concentration → gate (see the module docstring for the equation).

    Args:
      low, high: gate bounds, ``0 <= low <= high <= 1`` (``low == high``: constant gate).
      sharpness: slope of the sigmoid (finite).
      normalize: ``"sequence"`` (z-score over each row's valid tokens), ``"batch"``
        (over all valid tokens) or ``"none"`` (``(c − center)/scale``).
      center, scale: used by ``normalize="none"``; ``scale > 0``.
      invert: map high concentration to low gates.

    Validated on construction: a bad value raises :class:`~comppo_core.errors.ParameterError`
    naming the field.
    """

    low: float = 0.9
    high: float = 1.0
    sharpness: float = 1.0
    normalize: str = "sequence"
    center: float = 0.0
    scale: float = 1.0
    invert: bool = False

    def __post_init__(self) -> None:
        for name in ("low", "high", "sharpness", "center", "scale"):
            object.__setattr__(self, name, _number(name, getattr(self, name)))
        if not 0.0 <= self.low <= 1.0:
            raise ParameterError(f"low: expected a number in [0, 1], got {self.low!r}")
        if not 0.0 <= self.high <= 1.0:
            raise ParameterError(f"high: expected a number in [0, 1], got {self.high!r}")
        if self.low > self.high:
            raise ParameterError(f"low: expected low <= high, got low={self.low!r} > high={self.high!r}")
        if self.scale <= 0.0:
            raise ParameterError(f"scale: expected a number > 0, got {self.scale!r}")
        if self.normalize not in NORMALIZE_MODES:
            raise ParameterError(f"normalize: expected one of {NORMALIZE_MODES}, got {self.normalize!r}")
        if not isinstance(self.invert, bool):
            raise ParameterError(f"invert: expected a bool, got {self.invert!r}")

    @classmethod
    def constant(cls, value: float) -> "GateParams":
        """The constant gate ``g ≡ value`` (``low == high == value``)."""
        return cls(low=value, high=value)

    def as_kwargs(self) -> dict[str, Any]:
        """The seven keywords of :func:`comppo_core.gates_from_concentration`."""
        return dataclasses.asdict(self)
