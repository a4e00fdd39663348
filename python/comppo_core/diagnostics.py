"""Credit diagnostics a training loop logs for any per-token array (advantages, gates).

Over the n valid tokens, with a = |x| (DESIGN §5; ARCA's degeneracy diagnostics)::

    mean, std (population), min, max, frac_positive = #{x > 0} / n
    gini                  = Σ_i Σ_j |a_i − a_j| / (2 n² mean(a))     0 even … 1 − 1/n one-hot
    effective_token_ratio = exp(H(a / Σ a)) / n                      1 even … 1/n one-hot

All-zero credit counts as even: gini 0, ratio 1.
"""

from __future__ import annotations

from typing import Any

from . import _core
from ._torch import tensor_io
from ._arrays import as_numpy, flat_float, float_dtypes, layout_of

__all__ = ["STAT_KEYS", "credit_stats"]

STAT_KEYS = ("mean", "std", "min", "max", "frac_positive", "gini", "effective_token_ratio")


@tensor_io("x", "mask", "cu_seqlens")
def credit_stats(x: Any, *, mask: Any = None, cu_seqlens: Any = None) -> dict[str, float]:
    """Diagnostics of ``x`` over its valid tokens, as a dict of plain floats (keys
    :data:`STAT_KEYS`). At least one valid token is required."""
    arr = as_numpy(x, "x")
    compute, _ = float_dtypes(arr, "x")
    lay = layout_of(arr, "x", mask, cu_seqlens)
    x_flat = flat_float(arr, "x", lay.shape, compute)
    return dict(_core.credit_stats(x_flat, **lay.kernel_args()))
