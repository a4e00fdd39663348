"""Outcome advantages: one score per sequence → group-relative advantages → tokens.

Group-relative advantages (docs/design.md §5), per group G of sequences sharing an id, with
μ the group mean and σ the unbiased (ddof 1) standard deviation, in float64::

    "grpo":               a = (s − μ) / (σ + eps)          GRPO (verl, TRL)
    "drgrpo":             a = s − μ                        Dr.GRPO (no std division)
    "rloo":               a = s − (Σ_G s − s)/(n − 1)      RLOO: mean of the *others*
    "reinforce_baseline": a = s − μ                        REINFORCE++-baseline

A group of one has no baseline: 0 (``singleton="zero"``) or the raw score
(``singleton="raw"``, verl's behaviour). A group of equal scores gets 0, never NaN.
:func:`broadcast` then puts each sequence's value on its valid tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _core
from ._arrays import (
    Outputs,
    _as_cu_seqlens,
    _as_mask,
    as_numpy,
    check_finite,
    float_dtypes,
    kernel_array,
    kernel_result,
)
from ._torch import tensor_io
from .errors import DTypeError, ParameterError, ShapeError
from .options import GROUP_METHODS, SINGLETON_MODES, check_choice

__all__ = ["GROUP_METHODS", "broadcast", "group_advantages"]


def _group_ids(groups: Any, n: int) -> np.ndarray:
    """Group ids as contiguous int64; labels that are not integers (strings, objects)
    are mapped to integers first."""
    g = as_numpy(groups, "groups") if not isinstance(groups, (list, tuple)) else np.asarray(groups)
    if g.ndim != 1 or g.shape[0] != n:
        raise ShapeError(f"groups: expected shape ({n},), one id per score, got {g.shape}", argument="groups")
    if g.size == 0:
        return np.zeros(0, dtype=np.int64)
    if g.dtype.kind in "iub":
        if g.dtype.kind == "u" and g.size and int(g.max()) > np.iinfo(np.int64).max:
            return np.unique(g, return_inverse=True)[1].astype(np.int64)
        return kernel_array(g, np.int64)
    if g.dtype.kind in "USO":
        return np.unique(g, return_inverse=True)[1].astype(np.int64).reshape(-1)
    raise DTypeError(f"groups: expected integer ids (or string labels), got dtype {g.dtype}", argument="groups")


def group_advantages(
    scores: Any,
    groups: Any,
    *,
    method: str = "grpo",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> np.ndarray:
    """Group-relative outcome advantages, one per sequence.

    Args:
      scores: ``[B]`` outcome scores (any real dtype; computed in float64).
      groups: ``[B]`` group ids: integers in any order, not necessarily contiguous
        (string labels work too).
      method: ``"grpo"``, ``"drgrpo"``, ``"rloo"`` or ``"reinforce_baseline"``.
      eps: added to σ for ``"grpo"``.
      singleton: ``"zero"`` (default) or ``"raw"`` for groups of one sequence.

    Returns:
      ``[B]`` advantages, computed in float64 and returned in the dtype of float
      ``scores`` (float64 for integer scores). verl's REINFORCE++-baseline then whitens the
      token-level result: ``masked_whiten(broadcast(a, mask=m), mask=m)``.
    """
    # float64 scores and int64 ids (canonical form) are computed at once; anything else
    # (tensors, other dtypes, labels, bad arguments) is converted (or named) by
    # _group_advantages, which makes the same call.
    result = _core.group_advantages(scores, groups, method, eps, singleton)
    if result is not None:
        return result
    return _group_advantages(scores, groups, method=method, eps=eps, singleton=singleton)


@tensor_io("scores", "groups")
def _group_advantages(scores: Any, groups: Any, *, method: str, eps: float, singleton: str) -> np.ndarray:
    """:func:`group_advantages` for any arguments: puts them in canonical form (tensors,
    other dtypes, string labels) or raises the error that names the first bad one."""
    s = as_numpy(scores, "scores")
    if s.ndim != 1:
        raise ShapeError(
            f"scores: expected a 1-D [B] array, one score per sequence, got shape {s.shape}", argument="scores"
        )
    if s.dtype.kind not in "biuf":
        raise DTypeError(f"scores: expected real numbers, got dtype {s.dtype}", argument="scores")
    s64 = kernel_array(s, np.float64)
    ids = _group_ids(groups, s.shape[0])
    check_choice("method", method, GROUP_METHODS)
    check_choice("singleton", singleton, SINGLETON_MODES)
    eps_ = check_finite("eps", eps)
    if eps_ < 0:
        raise ParameterError(f"eps: expected a number >= 0, got {eps_}", argument="eps")
    out = kernel_result(_core.group_advantages(s64, ids, method, eps_, singleton), "group_advantages")
    _, output = float_dtypes(s, "scores")
    return out if output == out.dtype else out.astype(output)


def broadcast(per_sequence: Any, *, mask: Any = None, cu_seqlens: Any = None) -> np.ndarray:
    """Per-sequence values to per-token: ``x[b, i] = a[b]`` at valid positions, 0 elsewhere.

    Args:
      per_sequence: ``[B]`` values (e.g. :func:`group_advantages`).
      mask: ``[B, T]`` validity mask (required for the padded layout: it gives T), or
        an optional ``[N]`` mask with ``cu_seqlens``.
      cu_seqlens: ``[B+1]`` offsets of the packed layout (``N = cu_seqlens[-1]``).

    Returns:
      ``[B, T]`` or ``[N]`` in the dtype of ``per_sequence`` (float16 via float32;
      integers give float64).
    """
    # Arguments in canonical form (see _arrays) are computed at once; anything else is
    # converted (or named) by _broadcast, which makes the same call.
    result = _core.broadcast(per_sequence, mask, cu_seqlens)
    if result is not None:
        return result
    return _broadcast(per_sequence, mask=mask, cu_seqlens=cu_seqlens)


@tensor_io("per_sequence", "mask", "cu_seqlens")
def _broadcast(per_sequence: Any, *, mask: Any, cu_seqlens: Any) -> np.ndarray:
    """:func:`broadcast` for any arguments: puts them in canonical form or raises the
    error that names the first bad one."""
    a = as_numpy(per_sequence, "per_sequence")
    if a.ndim != 1:
        raise ShapeError(f"per_sequence: expected a 1-D [B] array, got shape {a.shape}", argument="per_sequence")
    compute, output = float_dtypes(a, "per_sequence")
    b = a.shape[0]
    if cu_seqlens is None:
        if mask is None:
            raise ShapeError(
                "mask: the padded layout needs a [B, T] mask to know T (or pass cu_seqlens)", argument="mask"
            )
        m = as_numpy(mask, "mask")
        if m.ndim != 2 or m.shape[0] != b:
            raise ShapeError(f"mask: expected shape ({b}, T), one row per sequence, got {m.shape}", argument="mask")
        shape: tuple[int, ...] = tuple(m.shape)
        canon_mask: np.ndarray | None = _as_mask(m, shape)
        cu = None
    else:
        cu = _as_cu_seqlens(cu_seqlens)
        if cu.shape[0] != b + 1:
            raise ShapeError(
                f"cu_seqlens: expected {b + 1} offsets (one more than per_sequence), got {cu.shape[0]}",
                argument="cu_seqlens",
            )
        n = int(cu[-1]) if cu.size else 0
        if n < 0:
            raise ShapeError(f"cu_seqlens: expected offsets ending at N >= 0, got {n}", argument="cu_seqlens")
        shape = (n,)
        canon_mask = None if mask is None else _as_mask(mask, shape)
    result = _core.broadcast(kernel_array(a, compute), canon_mask, cu)
    tokens = kernel_result(result, "broadcast")
    return Outputs(("tokens",), shape, compute, output, None, ()).finish((tokens,))[0]
