"""The gate mapping's parameters as one value (docs/design.md §4).

::

    z = normalize(c)                     "causal" | "sequence" | "batch" | "none" ((c − center)/scale)
                                         z-scores: (c − μ)/(max(σ, min_spread) + 1e-8)
    z = −z if invert
    g = low + (high − low) · sigmoid(sharpness · z)

:class:`GateParams` holds the eight parameters of that mapping, and it is the only way
a public function takes them: every layer that maps concentration to gates (the array
API, Arrow, Hugging Face, Ray, the CLI and ``rl``) takes one ``GateParams``, as
``params=`` in :func:`comppo_core.gates_from_concentration` and
:func:`comppo_core.arrow.gates_from_concentration`, as ``gate_params=`` where the function
has other parameters too. ``None`` there means ``GateParams()``, the mapping's defaults::

    cc.gates_from_concentration(c, params=cc.GateParams(low=0.5, sharpness=2.0))

(Before 0.2 those functions also took the first seven as keywords, ``low=0.5``; see CHANGELOG.md.)
:func:`as_gate_params` is the check they share.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from .errors import ParameterError
from .options import NORMALIZE_MODES, check_choice

__all__ = ["DEFAULTS", "NORMALIZE_MODES", "GateParams", "as_gate_params"]


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ParameterError(f"{name}: expected a finite number, got {value!r}", argument=name)
    return float(value)


@dataclasses.dataclass(frozen=True)
class GateParams:
    """Parameters of concentration → gate (see the module docstring for the equation).

    Args:
      low, high: gate bounds, ``0 <= low <= high <= 1`` (``low == high``: constant gate).
      sharpness: slope of the sigmoid (finite).
      normalize: ``"causal"`` (the default: the row's running z-score, at token t over
        its valid tokens up to and including t, so the gate at t depends on nothing after
        t), ``"sequence"`` (z-score over each row's valid tokens; the earlier default),
        ``"batch"`` (over all valid tokens) or ``"none"`` (``(c − center)/scale``).
      center, scale: finite; used by ``normalize="none"``, which needs ``scale > 0``
        (other modes ignore them, so there any finite scale is accepted, as by
        :func:`comppo_core.gates_from_concentration`).
      invert: map high concentration to low gates.
      min_spread: a floor on the spread the z-score divides by, in the concentration's
        units: ``z = (c − μ)/(max(σ, min_spread) + 1e-8)`` in ``"causal"``, ``"sequence"``
        and ``"batch"`` (``"none"`` ignores it). A row whose concentration varies by much
        less than ``min_spread`` then gets gates near the midpoint
        ``low + (high − low)/2`` instead of spread over the whole range (a z-score alone
        makes any variation, however small, span the range). Finite, ``>= 0``; the default
        0 is no floor (the mapping before the field existed, bit for bit).

    Validated on construction, with the rules and messages of
    :func:`comppo_core.gates_from_concentration`: a bad value raises
    :class:`~comppo_core.errors.ParameterError` whose ``argument`` is the field.
    """

    low: float = 0.9
    high: float = 1.0
    sharpness: float = 1.0
    normalize: str = "causal"
    center: float = 0.0
    scale: float = 1.0
    invert: bool = False
    min_spread: float = 0.0

    def __post_init__(self) -> None:
        check_choice("normalize", self.normalize, NORMALIZE_MODES)
        for name in ("low", "high", "sharpness", "center", "scale", "min_spread"):
            object.__setattr__(self, name, _number(name, getattr(self, name)))
        for name in ("low", "high"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ParameterError(f"{name}: expected a number in [0, 1], got {getattr(self, name)!r}", argument=name)
        if self.low > self.high:
            raise ParameterError(f"low: expected low <= high (high = {self.high!r}), got {self.low!r}", argument="low")
        if self.min_spread < 0.0:
            raise ParameterError(
                f"min_spread: expected a finite number >= 0, got {self.min_spread!r}", argument="min_spread"
            )
        if self.normalize == "none" and self.scale <= 0.0:
            raise ParameterError(f"scale: expected a finite number > 0, got {self.scale!r}", argument="scale")
        if not isinstance(self.invert, (bool, np.bool_)):
            raise ParameterError(f"invert: expected a bool, got {self.invert!r}", argument="invert")
        object.__setattr__(self, "invert", bool(self.invert))

    @classmethod
    def constant(cls, value: float) -> GateParams:
        """The constant gate ``g ≡ value`` (``low == high == value``)."""
        return cls(low=value, high=value)

    def as_kwargs(self) -> dict[str, Any]:
        """The fields as a dict, ``{"low": ..., ..., "invert": ..., "min_spread": ...}``
        (``GateParams(**p.as_kwargs()) == p``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


_DEFAULT = GateParams()

#: The mapping's defaults, field by field (``GateParams().as_kwargs()``).
DEFAULTS: dict[str, Any] = _DEFAULT.as_kwargs()


def as_gate_params(params: GateParams | None, name: str = "params") -> GateParams:
    """The :class:`GateParams` a public function applies for its argument ``params``:
    ``GateParams()`` for None, ``params`` itself for a GateParams.

    Anything else (a dict of keywords, say) raises
    :class:`~comppo_core.errors.ParameterError` whose ``argument`` is ``name``, the
    caller's name for the argument (``"params"``, ``"gate_params"``).
    """
    if params is None:
        return _DEFAULT
    if not isinstance(params, GateParams):
        raise ParameterError(f"{name}: expected a comppo_core.GateParams, got {type(params).__name__}", argument=name)
    return params
