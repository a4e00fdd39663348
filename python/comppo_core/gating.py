"""Gate mapping: attention concentration → bounded per-token retention gate (docs/design.md §4).

::

    z = normalize(c)     "sequence": z-score over the row's valid tokens
                         "batch":    z-score over all valid tokens of the batch
                         "none":     (c − center) / scale
    z = −z if invert
    g = low + (high − low) · sigmoid(sharpness · z)

z-scores use the population std (ddof 0): ``z = (c − μ)/(σ + 1e-8)``; a row (or
batch) with one valid token or zero spread gets ``z = 0``, i.e. the midpoint gate.
Masked positions get ``g = 1``. ``low == high`` is a constant gate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core
from ._arrays import Outputs, as_numpy, check_finite, float_dtypes, kernel_result, layout_of, token_array
from ._torch import tensor_io
from .gate_params import GateParams, from_keywords
from .options import NORMALIZE_MODES, check_choice

__all__ = ["GATE_STD_EPS", "gates_from_concentration"]

#: ε added to σ in the z-score.
GATE_STD_EPS = 1e-8


def gates_from_concentration(
    conc: Any,
    *,
    mask: Any = None,
    cu_seqlens: Any = None,
    low: float = 0.9,
    high: float = 1.0,
    sharpness: float = 1.0,
    normalize: str = "sequence",
    center: float = 0.0,
    scale: float = 1.0,
    invert: bool = False,
    params: GateParams | None = None,
) -> np.ndarray:
    """Retention gates in ``[low, high]`` from a per-token concentration statistic.

    Args:
      conc: ``[B, T]`` (padded) or ``[N]`` (packed, with ``cu_seqlens``) concentration c.
      mask: optional validity mask shaped like ``conc``; masked positions get gate 1.
      low, high: gate bounds, ``0 <= low <= high <= 1``.
      sharpness: slope of the sigmoid.
      normalize: ``"sequence"``, ``"batch"`` or ``"none"`` (uses ``center`` and ``scale > 0``).
      invert: map high concentration to low gates.
      params: the seven above as one :class:`~comppo_core.GateParams`, instead of the
        keywords (which must then keep their defaults: a keyword given as well is a
        :class:`~comppo_core.errors.ParameterError` naming it).

    Returns:
      gates shaped like ``conc``, in its dtype (float16 computed in float32).
    """
    if params is not None:
        p = from_keywords(params, locals())
        low, high, sharpness, normalize, center, scale, invert = (
            p.low,
            p.high,
            p.sharpness,
            p.normalize,
            p.center,
            p.scale,
            p.invert,
        )
    # Arguments in canonical form (see _arrays) are computed at once; anything else is
    # converted (or named) by _gates_from_concentration, which makes the same call.
    result = _core.gates_from_concentration(
        conc, mask, cu_seqlens, low, high, sharpness, normalize, center, scale, invert
    )
    if result is not None:
        return result
    return _gates_from_concentration(
        conc, mask=mask, cu_seqlens=cu_seqlens, low=low, high=high, sharpness=sharpness,
        normalize=normalize, center=center, scale=scale, invert=invert,
    )  # fmt: skip


@tensor_io("conc", "mask", "cu_seqlens")
def _gates_from_concentration(
    conc: Any,
    *,
    mask: Any,
    cu_seqlens: Any,
    low: float,
    high: float,
    sharpness: float,
    normalize: str,
    center: float,
    scale: float,
    invert: bool,
) -> np.ndarray:
    """:func:`gates_from_concentration` for any arguments: puts them in canonical form or
    raises the error that names the first bad one."""
    c = as_numpy(conc, "concentration")
    compute, output = float_dtypes(c, "concentration")
    lay = layout_of(c, "concentration", mask, cu_seqlens)
    c_canon = token_array(c, "concentration", lay.shape, compute)
    norm = check_choice("normalize", normalize, NORMALIZE_MODES)
    result = _core.gates_from_concentration(
        c_canon,
        lay.mask,
        lay.cu_seqlens,
        check_finite("low", low),
        check_finite("high", high),
        check_finite("sharpness", sharpness),
        norm,
        check_finite("center", center),
        check_finite("scale", scale),
        bool(invert),
    )
    gates = kernel_result(result, "gates_from_concentration")
    return Outputs(("gates",), lay.shape, compute, output, None, ()).finish((gates,))[0]
