"""Gate mapping: attention concentration → bounded per-token retention gate (docs/design.md §4).

::

    z = normalize(c)     "causal":   z_t = (c_t − μ_≤t)/(max(σ_≤t, min_spread) + 1e-8),
                                     over the row's valid tokens ≤ t
                         "sequence": z-score over the row's valid tokens
                         "batch":    z-score over all valid tokens of the batch
                         "none":     (c − center) / scale
    z = −z if invert
    g = low + (high − low) · sigmoid(sharpness · z)

z-scores use the population std (ddof 0): ``z = (c − μ)/(max(σ, min_spread) + 1e-8)``
(``min_spread`` = 0 by default: no floor); a row (or batch, or for ``"causal"`` a row's
valid prefix up to t) with one valid token or zero spread gets ``z = 0``, i.e. the
midpoint gate. Masked positions get ``g = 1``. ``low == high`` is a constant gate.

``"causal"``, the default of :class:`~comppo_core.GateParams`, makes the gate at token t
a function of the row's tokens up to t only (the first valid token of a row always gets
the midpoint gate); the kernel keeps running (Welford) statistics in one pass per row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core
from ._arrays import Outputs, as_numpy, float_dtypes, kernel_result, layout_of, token_array
from ._torch import tensor_io
from .gate_params import GateParams, as_gate_params

__all__ = ["GATE_STD_EPS", "gates_from_concentration"]

#: ε added to σ in the z-score.
GATE_STD_EPS = 1e-8


def gates_from_concentration(
    conc: Any,
    *,
    mask: Any = None,
    cu_seqlens: Any = None,
    params: GateParams | None = None,
) -> np.ndarray:
    """Retention gates in ``[params.low, params.high]`` from a per-token concentration statistic.

    Args:
      conc: ``[B, T]`` (padded) or ``[N]`` (packed, with ``cu_seqlens``) concentration c.
      mask: optional validity mask shaped like ``conc``; masked positions get gate 1.
      cu_seqlens: ``[B+1]`` sequence offsets of the packed layout, else None.
      params: the mapping, a :class:`~comppo_core.GateParams` (bounds ``low``/``high``,
        ``sharpness``, ``normalize`` = ``"causal"`` (the default), ``"sequence"``,
        ``"batch"`` or ``"none"`` with ``center``/``scale``, ``invert``, the z-score's
        floor on the spread ``min_spread``); None is
        ``GateParams()``. Anything else is a
        :class:`~comppo_core.errors.ParameterError` naming ``params``.

    Returns:
      gates shaped like ``conc``, in its dtype (float16 computed in float32).
    """
    p = as_gate_params(params)
    # Arguments in canonical form (see _arrays) are computed at once; anything else is
    # converted (or named) by _gates_from_concentration, which makes the same call.
    result = _core.gates_from_concentration(conc, mask, cu_seqlens, *_kernel_params(p))
    if result is not None:
        return result
    return _gates_from_concentration(conc, mask=mask, cu_seqlens=cu_seqlens, params=p)


def _kernel_params(p: GateParams) -> tuple[float, float, float, str, float, float, bool, float]:
    """The mapping as the kernel's positional arguments after the arrays."""
    return (p.low, p.high, p.sharpness, p.normalize, p.center, p.scale, p.invert, p.min_spread)


@tensor_io("conc", "mask", "cu_seqlens")
def _gates_from_concentration(
    conc: Any,
    *,
    mask: Any,
    cu_seqlens: Any,
    params: GateParams,
) -> np.ndarray:
    """:func:`gates_from_concentration` for any arguments: puts them in canonical form or
    raises the error that names the first bad one."""
    c = as_numpy(conc, "concentration")
    compute, output = float_dtypes(c, "concentration")
    lay = layout_of(c, "concentration", mask, cu_seqlens)
    c_canon = token_array(c, "concentration", lay.shape, compute)
    p = params  # validated by GateParams: finite numbers, a known normalize, a bool invert
    result = _core.gates_from_concentration(c_canon, lay.mask, lay.cu_seqlens, *_kernel_params(p))
    gates = kernel_result(result, "gates_from_concentration")
    return Outputs(("gates",), lay.shape, compute, output, None, ()).finish((gates,))[0]
