"""Credit diagnostics a training loop logs for any per-token array (advantages, gates).

Over the n valid tokens, with a = |x| (docs/design.md §5; ARCA's degeneracy diagnostics)::

    mean, std (population), min, max, frac_positive = #{x > 0} / n
    gini                  = Σ_i Σ_j |a_i − a_j| / (2 n² mean(a))     0 even … 1 − 1/n one-hot
    effective_token_ratio = exp(H(a / Σ a)) / n                      1 even … 1/n one-hot

All-zero credit counts as even: gini 0, ratio 1.
"""

from __future__ import annotations

from typing import Any

from . import _core
from ._arrays import as_numpy, float_dtypes, kernel_result, layout_of, token_array
from ._torch import tensor_io

__all__ = ["STAT_KEYS", "credit_stats"]

STAT_KEYS = ("mean", "std", "min", "max", "frac_positive", "gini", "effective_token_ratio")


def credit_stats(x: Any, *, mask: Any = None, cu_seqlens: Any = None) -> dict[str, float]:
    """Diagnostics of ``x`` over its valid tokens, as a dict of plain floats (keys
    :data:`STAT_KEYS`). At least one valid token is required."""
    # Arguments in canonical form (see _arrays) are computed at once; anything else is
    # converted (or named) by _credit_stats, which makes the same call.
    result = _core.credit_stats(x, mask, cu_seqlens)
    if result is not None:
        return result
    return _credit_stats(x, mask=mask, cu_seqlens=cu_seqlens)


@tensor_io("x", "mask", "cu_seqlens")
def _credit_stats(x: Any, *, mask: Any, cu_seqlens: Any) -> dict[str, float]:
    """:func:`credit_stats` for any arguments: puts them in canonical form or raises the
    error that names the first bad one."""
    arr = as_numpy(x, "x")
    compute, _ = float_dtypes(arr, "x")
    lay = layout_of(arr, "x", mask, cu_seqlens)
    x_canon = token_array(arr, "x", lay.shape, compute)
    return kernel_result(_core.credit_stats(x_canon, lay.mask, lay.cu_seqlens), "credit_stats")
