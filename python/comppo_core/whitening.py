"""Masked whitening over all valid tokens of a batch, as verl's ``masked_whiten``.

::

    μ  = Σ x / n,   σ² = Σ (x − μ)² / (n − 1)      over the n valid tokens (unbiased)
    w  = (x − μ) · 1/sqrt(σ² + eps)
    w  = w + μ                                      if shift_mean is False

Masked positions get 0. Fewer than two valid tokens is an error (no unbiased variance);
zero spread with ``eps=0`` whitens every valid token to 0 (plus μ without shift_mean).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core
from ._arrays import Layout, Outputs, as_numpy, check_finite, float_dtypes, kernel_result, layout_of, token_array
from ._torch import tensor_io
from .errors import DTypeError, ParameterError, ShapeError

__all__ = ["masked_whiten"]


def masked_whiten(
    x: Any,
    *,
    mask: Any = None,
    cu_seqlens: Any = None,
    shift_mean: bool = True,
    eps: float = 1e-8,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Whitens ``x`` with the mean and unbiased variance of its valid tokens.

    Args:
      x: ``[B, T]`` (padded) or ``[N]`` (packed, with ``cu_seqlens``).
      mask: optional validity mask shaped like ``x``.
      shift_mean: False adds the mean back after scaling (verl's option).
      eps: added to the variance.
      out: optional preallocated NumPy array shaped like ``x``, of the output dtype,
        C-contiguous and not overlapping ``x`` or ``mask``; the result is written there
        and returned (saves allocating, and page-faulting, a fresh array per call).
        ``out=x`` (the same array object) whitens ``x`` in place.

    Returns:
      shaped like ``x``, in its dtype (float16 via float32; integers give float64).
    """
    # Arguments in canonical form (see _arrays; out=x included) are computed at once;
    # anything else is converted (or named) by _masked_whiten, which makes the same call.
    result = _core.masked_whiten(x, mask, cu_seqlens, shift_mean, eps, out)
    if result is not None:
        return result
    return _masked_whiten(x, mask=mask, cu_seqlens=cu_seqlens, shift_mean=shift_mean, eps=eps, out=out)


@tensor_io("x", "mask", "cu_seqlens")
def _masked_whiten(
    x: Any, *, mask: Any, cu_seqlens: Any, shift_mean: bool, eps: float, out: np.ndarray | None
) -> np.ndarray:
    """:func:`masked_whiten` for any arguments: puts them in canonical form (tensors,
    other dtypes, strided arrays), whitens in place for ``out=x``, or raises the error
    that names the first bad one."""
    arr = as_numpy(x, "x")
    compute, output = float_dtypes(arr, "x")
    lay = layout_of(arr, "x", mask, cu_seqlens)
    eps_ = check_finite("eps", eps)
    if eps_ < 0:
        raise ParameterError(f"eps: expected a number >= 0, got {eps_}", argument="eps")
    if out is not None and out is x:
        return _whiten_in_place(arr, lay, compute, mask, cu_seqlens, bool(shift_mean), eps_)
    x_canon = token_array(arr, "x", lay.shape, compute)
    outs = Outputs(("whitened",), lay.shape, compute, output, out, (arr, mask, cu_seqlens, x_canon, lay.mask))
    kernel_out = None if outs.kernel is None else outs.kernel[0]
    result = _core.masked_whiten(x_canon, lay.mask, lay.cu_seqlens, bool(shift_mean), eps_, kernel_out)
    return outs.finish((kernel_result(result, "masked_whiten"),))[0]


def _whiten_in_place(
    x: np.ndarray, lay: Layout, compute: np.dtype, mask: Any, cu_seqlens: Any, shift_mean: bool, eps: float
) -> np.ndarray:
    """``masked_whiten(x, out=x)``: overwrites ``x`` (a writeable float array) and returns it."""
    if not x.flags.writeable:
        raise ShapeError("out (whitened): out=x whitens x in place, but x is read-only", argument="out")
    if x.dtype.kind != "f":
        raise DTypeError(
            f"out (whitened): out=x needs a float array to hold the result, got dtype {x.dtype}", argument="out"
        )
    if x.dtype == compute and x.flags.c_contiguous and x.flags.aligned:
        kernel_result(_core.masked_whiten(x, lay.mask, lay.cu_seqlens, shift_mean, eps, x), "masked_whiten")
    else:  # float16 (computed in float32), strided or unaligned: whiten into a fresh array, copy back
        x[...] = masked_whiten(x, mask=mask, cu_seqlens=cu_seqlens, shift_mean=shift_mean, eps=eps)
    return x
