"""The gate mapping's parameters as one value (docs/design.md §4).

::

    z = normalize(c)                     "sequence" | "batch" | "none" ((c − center)/scale)
    z = −z if invert
    g = low + (high − low) · sigmoid(sharpness · z)

:class:`GateParams` holds the seven parameters of that mapping, so every layer that
maps concentration to gates (the array API, Arrow, Hugging Face, Ray, the CLI and
``rl``) passes one value instead of spelling the seven keywords out again.
``GateParams()`` is the mapping's defaults; ``cc.gates_from_concentration(c,
params=params)`` (or ``**params.as_kwargs()``) applies it.

The public functions that took the seven keywords before take them still, or one
``GateParams`` instead (``params=`` in :func:`comppo_core.gates_from_concentration` and
:func:`comppo_core.arrow.gates_from_concentration`, ``gate_params=`` where the function
has other parameters too); :func:`from_keywords` is the rule they share: with a
``GateParams``, every keyword must keep its default.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import ParameterError
from .options import NORMALIZE_MODES, check_choice

__all__ = ["DEFAULTS", "NORMALIZE_MODES", "GateParams", "from_keywords"]


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
      normalize: ``"sequence"`` (z-score over each row's valid tokens), ``"batch"``
        (over all valid tokens) or ``"none"`` (``(c − center)/scale``).
      center, scale: finite; used by ``normalize="none"``, which needs ``scale > 0``
        (other modes ignore them, so there any finite scale is accepted, as by
        :func:`comppo_core.gates_from_concentration`).
      invert: map high concentration to low gates.

    Validated on construction, with the rules and messages of
    :func:`comppo_core.gates_from_concentration`: a bad value raises
    :class:`~comppo_core.errors.ParameterError` whose ``argument`` is the field.
    """

    low: float = 0.9
    high: float = 1.0
    sharpness: float = 1.0
    normalize: str = "sequence"
    center: float = 0.0
    scale: float = 1.0
    invert: bool = False

    def __post_init__(self) -> None:
        check_choice("normalize", self.normalize, NORMALIZE_MODES)
        for name in ("low", "high", "sharpness", "center", "scale"):
            object.__setattr__(self, name, _number(name, getattr(self, name)))
        for name in ("low", "high"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ParameterError(f"{name}: expected a number in [0, 1], got {getattr(self, name)!r}", argument=name)
        if self.low > self.high:
            raise ParameterError(f"low: expected low <= high (high = {self.high!r}), got {self.low!r}", argument="low")
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
        """The seven keywords of :func:`comppo_core.gates_from_concentration`."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


#: The mapping's defaults, keyword by keyword (``GateParams().as_kwargs()``).
DEFAULTS: dict[str, Any] = GateParams().as_kwargs()


def from_keywords(params: GateParams | None, scope: Mapping[str, Any], *, name: str = "params") -> GateParams:
    """The one :class:`GateParams` of a call given either ``params`` or the seven keywords.

    ``scope`` maps at least the seven keyword names (:data:`DEFAULTS`) to the values the
    call received; a function with those parameters passes its ``locals()``, and only those
    seven entries are read. With ``params`` None they make the GateParams (validated); with a
    GateParams, a keyword that differs from its default is an error, as both would say
    what the mapping is. ``name`` is the caller's name for ``params`` (in messages).

    Raises :class:`~comppo_core.errors.ParameterError` (``argument`` the first keyword
    given as well, or ``name`` for a ``params`` that is not a GateParams).
    """
    keywords = {k: scope[k] for k in DEFAULTS}
    if params is None:
        return GateParams(**keywords)
    if not isinstance(params, GateParams):
        raise ParameterError(f"{name}: expected a comppo_core.GateParams, got {type(params).__name__}", argument=name)
    given = [k for k, v in keywords.items() if not _same(v, DEFAULTS[k])]
    if given:
        raise ParameterError(
            f"{given[0]}: the gate mapping is given twice, as {name}= and as the keyword{'s' if len(given) > 1 else ''} "
            f"{', '.join(given)}; pass one or the other",
            argument=given[0],
        )
    return params


def _same(value: Any, default: Any) -> bool:
    return type(value) is type(default) and value == default
