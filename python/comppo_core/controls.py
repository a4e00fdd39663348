"""Gate controls: the paper's checks that gains come from *trajectory-specific* gates.

Each control keeps some statistics of the gates and destroys their alignment with
the trajectory; masked positions keep their input value:

* :func:`shuffle`: permutes each row's valid gates among that row's valid positions
  (same multiset per row, order destroyed). Seeded and deterministic: with
  ``keys = numpy.random.default_rng(seed).random(n_valid)`` drawn once for all valid
  tokens in row-major order, each row's valid gates are reordered by ascending key.
* :func:`by_position`: each valid gate becomes the batch mean gate at its
  valid-position index k (k = 0 for a row's first valid token), over the rows that
  have a k-th valid token.
* :func:`constant`: every valid gate becomes the batch mean of the valid gates.

These are single vectorized NumPy passes (they run once per batch, on gates);
:mod:`comppo_core.reference` has the one-row-at-a-time loops they are tested against.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ._arrays import as_numpy, float_dtypes, kernel_array, layout_of
from ._torch import tensor_io
from .errors import NonFiniteError

__all__ = ["by_position", "constant", "shuffle"]


class _Valid(NamedTuple):
    """The valid tokens of a batch in row-major order."""

    positions: np.ndarray  # flat index of each valid token
    rows: np.ndarray  # its row
    values: np.ndarray  # its gate, float64


def _valid_tokens(gates: Any, mask: Any, cu_seqlens: Any) -> tuple[np.ndarray, _Valid]:
    g = as_numpy(gates, "gates")
    float_dtypes(g, "gates")  # rejects non-numeric dtypes
    lay = layout_of(g, "gates", mask, cu_seqlens)
    flat = kernel_array(g).reshape(-1)
    if lay.cu_seqlens is None:
        b, t = lay.shape
        rows = np.repeat(np.arange(b, dtype=np.int64), t)
    else:
        cu = lay.cu_seqlens
        if cu.size == 0 or cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] != flat.size:
            from . import _core  # the kernels' own check of the layout names the first offending index

            zeros = np.zeros(flat.size)
            _core.td_targets(zeros, zeros, None, cu, None, None, 1.0)
        rows = np.repeat(np.arange(cu.size - 1, dtype=np.int64), np.diff(cu))
    positions = np.arange(flat.size, dtype=np.int64)
    if lay.mask is not None:
        keep = lay.mask.reshape(-1)
        positions, rows = positions[keep], rows[keep]
    values = flat[positions].astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        k = int(positions[bad[0]])
        row = int(rows[bad[0]])
        pos = k % lay.shape[1] if lay.cu_seqlens is None else k - int(lay.cu_seqlens[row])
        raise NonFiniteError(
            f"gates: expected finite values at valid positions, got {values[bad[0]]} at (row {row}, position {pos})",
            argument="gates",
            row=row,
            position=pos,
        )
    return g, _Valid(positions, rows, values)


def _with(g: np.ndarray, valid: _Valid, new_values: np.ndarray) -> np.ndarray:
    _, output = float_dtypes(g, "gates")
    out = np.array(g, dtype=output, copy=True, order="C")
    out.reshape(-1)[valid.positions] = new_values
    return out


@tensor_io("gates", "mask", "cu_seqlens")
def shuffle(gates: Any, *, mask: Any = None, cu_seqlens: Any = None, seed: int = 0) -> np.ndarray:
    """Each row's valid gates, permuted among its valid positions (seeded)."""
    g, v = _valid_tokens(gates, mask, cu_seqlens)
    keys = np.random.default_rng(seed).random(v.values.size)
    order = np.lexsort((keys, v.rows))  # by row, then by key
    return _with(g, v, v.values[order])


@tensor_io("gates", "mask", "cu_seqlens")
def by_position(gates: Any, *, mask: Any = None, cu_seqlens: Any = None) -> np.ndarray:
    """Each valid gate replaced by the batch mean gate at its valid-position index."""
    g, v = _valid_tokens(gates, mask, cu_seqlens)
    if v.values.size == 0:
        return _with(g, v, v.values)
    counts = np.bincount(v.rows)
    starts = np.cumsum(counts) - counts
    k = np.arange(v.values.size) - np.repeat(starts, counts)
    means = np.bincount(k, weights=v.values) / np.bincount(k)
    return _with(g, v, means[k])


@tensor_io("gates", "mask", "cu_seqlens")
def constant(gates: Any, *, mask: Any = None, cu_seqlens: Any = None) -> np.ndarray:
    """Every valid gate replaced by the batch mean of the valid gates."""
    g, v = _valid_tokens(gates, mask, cu_seqlens)
    if v.values.size == 0:
        return _with(g, v, v.values)
    return _with(g, v, np.full(v.values.size, v.values.mean()))
