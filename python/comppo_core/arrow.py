"""Arrow list columns in, Arrow list columns out: GAE and Comp-GAE without copies.

An Arrow ``list<float>`` column *is* the packed layout of docs/design.md §2. For a list array
of B rows::

    offsets   [B+1]   int32 (list) or int64 (large_list)   = cu_seqlens (+ offsets[0])
    values    [N]     the flat child array                  = the packed token array

so this module hands the child's values buffer straight to the kernels
(:func:`comppo_core.gae`, :func:`comppo_core.gates_from_concentration`) as a NumPy
view: **no copy of any float values buffer on the way in**. The results come back as
list arrays whose child wraps the kernels' output arrays (no copy either) and whose
offsets buffer *is* the input's, so rows align by construction.

Per sequence b (row b of the list columns), over its valid tokens ``i = 0..n-1``
(docs/design.md §3)::

    V_n = last_values[b] if a last-values column is given else 0
    δ_i = r_i + γ·g_i·V_{i+1} − V_i
    A_i = δ_i + γ·λ·g_i·A_{i+1},   A_n = 0        -> column "advantages"
    R_i = A^c_i + V_i   (A^c with λ_critic)        -> column "returns"

with gates ``g`` from a gate column, or from a concentration column through the gate
mapping of docs/design.md §4 (``low + (high − low)·sigmoid(sharpness·z)``), or 1 (plain GAE).

Accepted inputs:

* list columns: ``pa.ListArray`` / ``pa.LargeListArray`` / ``pa.ChunkedArray`` of
  them, with float16, float32 or float64 values (rewards, values, gates,
  concentration); the mask is a list of bool or integers (0/1). Sliced arrays
  (``array.offset != 0``, offsets not starting at 0) work without copies.
* every list column must have the rewards' row lengths; the output type is the
  rewards' type (``list<float32>`` in, ``list<float32>`` out).
* ``last_values``: a plain numeric column, one value per row.

Where copies happen (all documented, none of a float values buffer of matching dtype):
the offsets are converted to int64 for the kernels (``B+1`` integers); a bool mask is
unpacked from Arrow's bits to NumPy bools, and a mask of integers wider than a byte is
converted to bools (an int8 or uint8 one is read in place); a column whose chunks do not line up with
the rewards' chunks is concatenated for that stretch; a float column of another dtype
than the rewards is cast to the rewards' dtype (as :func:`comppo_core.gae` does).

Errors (docs/design.md §8) name the column, what was expected, and the first offending row and
position (``(row r, position p)``: ``column[r][p]``, counted from the start of the
column, plus ``row_offset`` where given):

* a null row or a null element → :class:`~comppo_core.errors.NonFiniteError`
  (a missing value at a token is as bad as a NaN);
* malformed offsets (negative, decreasing, beyond the child) →
  :class:`~comppo_core.errors.LayoutError`;
* a list column whose row lengths differ from the rewards' →
  :class:`~comppo_core.errors.ShapeError`;
* a column of the wrong type → :class:`~comppo_core.errors.DTypeError`; a missing
  column → :class:`~comppo_core.errors.ParameterError`;
* everything the kernels check (NaN/±inf, gates outside [0, 1], rewards on masked
  tokens, bad parameters) as in :func:`comppo_core.gae`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import numpy as np

try:
    import pyarrow as pa
except ImportError as _e:  # pragma: no cover - exercised only without pyarrow
    raise ImportError("comppo_core.arrow needs pyarrow: pip install 'comppo-core[arrow]'") from _e

from ._arrays import check_unit
from .advantages import gae as _gae
from .errors import (
    ComppoError,
    DTypeError,
    LayoutError,
    NonFiniteError,
    OutOfRangeError,
    ParameterError,
    ShapeError,
    location,
)
from .gate_params import GateParams, as_gate_params
from .gating import GATE_STD_EPS
from .gating import gates_from_concentration as _gates
from .options import MASKED_REWARD_MODES, check_choice

__all__ = [
    "AUTO_LAST_VALUES",
    "AUTO_MASK",
    "ArrowGAEResult",
    "Columns",
    "ConcentrationMoments",
    "ListColumn",
    "compute_advantages",
    "concentration_moments",
    "gae",
    "gates_from_concentration",
    "resolve_columns",
]

#: A list column: one list array, or a chunked array of them.
ListColumn: TypeAlias = pa.Array | pa.ChunkedArray


class _Auto:
    """Default of ``mask_col`` / ``last_values_col``: the conventional column if present."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name!r} if present>"


AUTO_MASK = _Auto("mask")
AUTO_LAST_VALUES = _Auto("last_values")


class ArrowGAEResult(NamedTuple):
    """``(advantages, returns)``: list columns of the rewards' type, sharing its offsets."""

    advantages: ListColumn
    returns: ListColumn


# --------------------------------------------------------------------------- #
# Column types
# --------------------------------------------------------------------------- #

_FLOAT_TYPES = (pa.float16(), pa.float32(), pa.float64())


def _is_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _float_list_ok(t: pa.DataType) -> bool:
    return _is_list(t) and t.value_type in _FLOAT_TYPES


def _mask_list_ok(t: pa.DataType) -> bool:
    return _is_list(t) and (pa.types.is_boolean(t.value_type) or pa.types.is_integer(t.value_type))


def _scalar_ok(t: pa.DataType) -> bool:
    return bool(pa.types.is_floating(t) or pa.types.is_integer(t))


_EXPECTED = {
    "float": "a list of float32 or float64 (list<float> or large_list<float>; float16 also works)",
    "mask": "a list of bool or integers 0/1 (list<bool> or list<int8..int64>)",
    "scalar": "a numeric column, one float per row",
}
_TYPE_OK = {"float": _float_list_ok, "mask": _mask_list_ok, "scalar": _scalar_ok}


@dataclass(frozen=True)
class Columns:
    """The columns one computation reads and writes, resolved against a schema.

    ``mask``, ``last_values``, ``gates`` and ``concentration`` are None when unused.
    """

    rewards: str
    values: str
    mask: str | None
    last_values: str | None
    gates: str | None
    concentration: str | None
    advantages: str
    returns: str

    def inputs(self) -> dict[str, str]:
        """``{role: column name}`` of the columns read."""
        roles = {
            "rewards": self.rewards,
            "values": self.values,
            "mask": self.mask,
            "last_values": self.last_values,
            "gates": self.gates,
            "concentration": self.concentration,
        }
        return {k: v for k, v in roles.items() if v is not None}


_KIND = {
    "rewards": "float",
    "values": "float",
    "gates": "float",
    "concentration": "float",
    "mask": "mask",
    "last_values": "scalar",
}


def _where(source: str | None) -> str:
    return f" in {source}" if source else ""


def resolve_columns(
    schema: pa.Schema,
    *,
    rewards_col: str = "rewards",
    values_col: str = "values",
    mask_col: str | None | _Auto = AUTO_MASK,
    last_values_col: str | None | _Auto = AUTO_LAST_VALUES,
    gates_col: str | None = None,
    concentration_col: str | None = None,
    advantages_col: str = "advantages",
    returns_col: str = "returns",
    replace: bool = False,
    source: str | None = None,
) -> Columns:
    """Checks the column options against ``schema`` and returns the columns to use.

    ``mask_col`` / ``last_values_col`` default to the column ``"mask"`` /
    ``"last_values"`` when the schema has one (None: do not use one). ``source`` (e.g. a
    file name) is quoted in messages.

    Raises :class:`ParameterError` for a missing column, both ``gates_col`` and
    ``concentration_col``, or an output column that exists while ``replace`` is False;
    :class:`DTypeError` for a column of the wrong type.
    """
    names = list(schema.names)
    listing = f" (columns: {', '.join(names)})"

    def pick(role: str, spec: str | None | _Auto) -> str | None:
        if isinstance(spec, _Auto):
            return spec.name if spec.name in names else None
        if spec is None:
            return None
        if not isinstance(spec, str):
            raise ParameterError(f"{role}_col: expected a column name, got {spec!r}", argument=f"{role}_col")
        if spec not in names:
            raise ParameterError(f"column {spec!r} ({role}) not found{_where(source)}{listing}", argument=spec)
        if names.count(spec) > 1:
            raise ParameterError(
                f"column {spec!r} ({role}) appears {names.count(spec)} times{_where(source)}", argument=spec
            )
        return spec

    if gates_col is not None and concentration_col is not None:
        raise ParameterError(
            "gates_col and concentration_col: give one of them (gates, or concentration to map to gates), not both",
            argument="gates_col",
        )
    rewards = pick("rewards", rewards_col)
    values = pick("values", values_col)
    assert rewards is not None and values is not None
    cols = Columns(
        rewards=rewards,
        values=values,
        mask=pick("mask", mask_col),
        last_values=pick("last_values", last_values_col),
        gates=pick("gates", gates_col),
        concentration=pick("concentration", concentration_col),
        advantages=advantages_col,
        returns=returns_col,
    )
    for role, name in cols.inputs().items():
        kind = _KIND[role]
        t = schema.field(name).type
        if not _TYPE_OK[kind](t):
            raise DTypeError(
                f"column {name!r} ({role}){_where(source)}: expected {_EXPECTED[kind]}, got {t}", argument=name
            )
    for role, name in (("advantages", advantages_col), ("returns", returns_col)):
        if not isinstance(name, str) or not name:
            raise ParameterError(f"{role}_col: expected a non-empty column name, got {name!r}", argument=f"{role}_col")
        if name in names and not replace:
            raise ParameterError(
                f"column {name!r} ({role}) already exists{_where(source)}; choose another name with "
                f"{role}_col or pass replace=True to overwrite it",
                argument=name,
            )
    if advantages_col == returns_col:
        raise ParameterError(
            f"advantages_col and returns_col: expected two different names, got {advantages_col!r} for both",
            argument="advantages_col",
        )
    return cols


# --------------------------------------------------------------------------- #
# List arrays as the packed layout
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _Packed:
    """One list array (a chunk) seen as the packed layout, without copies.

    ``offsets`` is the array's own offsets (a view of its buffer, ``rows + 1`` entries,
    possibly not starting at 0 for a slice), ``cu_seqlens = offsets − offsets[0]`` and
    ``flat`` is the view of the child's values ``[offsets[0], offsets[-1])``.
    """

    array: pa.Array
    offsets: np.ndarray
    cu_seqlens: np.ndarray
    flat: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.array)


def _np_dtype(t: pa.DataType) -> np.dtype:
    return np.dtype(t.to_pandas_dtype())


def _locate(cu: np.ndarray, flat_index: int) -> tuple[int, int]:
    """(row, position) of a flat index in a packed layout."""
    row = int(np.searchsorted(cu, flat_index, side="right")) - 1
    return row, flat_index - int(cu[row])


def _describe(name: str, role: str) -> str:
    return f"column {name!r}" if name == role else f"column {name!r} ({role})"


def _packed(arr: pa.Array, name: str, role: str, kind: str, row0: int) -> _Packed:
    """The packed view of list array ``arr`` (column ``name``), checked: type, offsets,
    nulls. ``row0`` is added to row indices in messages."""
    col = _describe(name, role)
    if not _TYPE_OK[kind](arr.type):
        raise DTypeError(f"{col}: expected {_EXPECTED[kind]}, got {arr.type}", argument=name)
    rows = len(arr)
    off_type = np.dtype(np.int64 if pa.types.is_large_list(arr.type) else np.int32)
    off_buf = arr.buffers()[1]
    need = arr.offset + rows + 1
    if rows == 0 and (off_buf is None or off_buf.size < need * off_type.itemsize):
        offsets = np.zeros(1, dtype=off_type)
    else:
        if off_buf is None or off_buf.size < need * off_type.itemsize:
            have = 0 if off_buf is None else off_buf.size // off_type.itemsize
            raise LayoutError(
                f"{col}: expected an offsets buffer of at least {need} entries, got {have}", argument=name
            )
        offsets = np.frombuffer(off_buf, dtype=off_type, count=need)[arr.offset :]

    if arr.null_count:
        row = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise NonFiniteError(
            f"{col}: expected a list in every row, got null at row {row0 + row}", argument=name, row=row0 + row
        )

    child = arr.values
    start, end = int(offsets[0]), int(offsets[-1])
    if start < 0:
        raise LayoutError(f"{col}: expected list offsets >= 0, got {start} at row {row0}", argument=name, row=row0)
    steps = np.diff(offsets)
    if steps.size and int(steps.min()) < 0:
        r = int(np.flatnonzero(steps < 0)[0])
        raise LayoutError(
            f"{col}: expected non-decreasing list offsets, got row {row0 + r} ending at "
            f"{int(offsets[r + 1])} before its start {int(offsets[r])}",
            argument=name,
            row=row0 + r,
        )
    if end > len(child):
        raise LayoutError(
            f"{col}: expected list offsets within the {len(child)} child values, got {end} (last row {row0 + rows - 1})",
            argument=name,
            row=row0 + rows - 1,
        )
    cu = offsets if start == 0 else offsets - offsets.dtype.type(start)

    if child.null_count:
        sub = child.slice(start, end - start)
        if sub.null_count:
            k = int(np.flatnonzero(sub.is_null().to_numpy(zero_copy_only=False))[0])
            r, p = _locate(cu, k)
            raise NonFiniteError(
                f"{col}: expected no null values, got null at {location(row0 + r, p)}",
                argument=name,
                row=row0 + r,
                position=p,
            )

    if pa.types.is_boolean(child.type):
        # Arrow packs booleans in bits; NumPy needs one byte each: the one copy here.
        flat = child.slice(start, end - start).to_numpy(zero_copy_only=False)
    else:
        dt = _np_dtype(child.type)
        data = child.buffers()[1]
        total = child.offset + len(child)
        if data is None or data.size < total * dt.itemsize:
            raise LayoutError(f"{col}: the child values buffer is shorter than its {len(child)} values", argument=name)
        flat = np.frombuffer(data, dtype=dt, count=total)[child.offset + start : child.offset + end]
    if kind == "mask" and flat.dtype != np.bool_ and flat.size:
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi > 1:
            k = int(np.flatnonzero((flat < 0) | (flat > 1))[0])
            r, p = _locate(cu, k)
            raise OutOfRangeError(
                f"{col}: expected 0 or 1, got {int(flat[k])} at {location(row0 + r, p)}",
                argument=name,
                row=row0 + r,
                position=p,
            )
    if kind == "mask" and flat.dtype.itemsize == 1 and flat.dtype != np.bool_:
        flat = flat.view(np.bool_)  # bytes that are 0 or 1 are the kernels' bool mask, read in place
    return _Packed(arr, offsets, cu, flat)


def _same_rows(ref: _Packed, other: _Packed, ref_name: str, name: str, role: str, row0: int) -> None:
    if ref.rows != other.rows:
        raise ShapeError(
            f"{_describe(name, role)}: expected {ref.rows} rows like column {ref_name!r}, got {other.rows}",
            argument=name,
        )
    if ref.cu_seqlens is other.cu_seqlens or np.array_equal(ref.cu_seqlens, other.cu_seqlens):
        return
    a, b = np.diff(ref.cu_seqlens), np.diff(other.cu_seqlens)
    r = int(np.flatnonzero(a != b)[0])
    raise ShapeError(
        f"{_describe(name, role)}: row {row0 + r} has {int(b[r])} values but column {ref_name!r} has "
        f"{int(a[r])}; every list column must have the rewards' row lengths",
        argument=name,
        row=row0 + r,
    )


def _scalars(arr: pa.Array, name: str, role: str, row0: int) -> np.ndarray:
    col = _describe(name, role)
    if not _scalar_ok(arr.type):
        raise DTypeError(f"{col}: expected {_EXPECTED['scalar']}, got {arr.type}", argument=name)
    if arr.null_count:
        row = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise NonFiniteError(
            f"{col}: expected a value in every row, got null at row {row0 + row} (use 0 for a terminal response)",
            argument=name,
            row=row0 + row,
        )
    out = arr.to_numpy(zero_copy_only=False)
    finite = np.isfinite(out)
    if not finite.all():
        r = int(np.flatnonzero(~finite)[0])
        raise ParameterError(
            f"{col}: expected finite values, got {_nonfinite(float(out[r]))} at row {row0 + r}",
            argument=name,
            row=row0 + r,
        )
    return out


def _nonfinite(x: float) -> str:
    """A non-finite value as the kernels' messages write it."""
    return "NaN" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _wrap(ref: _Packed, flat: np.ndarray, list_type: pa.DataType) -> pa.Array:
    """A list array of ``list_type`` with ``ref``'s rows and ``flat`` as its values.

    The offsets buffer is ``ref``'s own (same buffer, same array offset) when its offsets
    start at 0, else the rebased ``cu_seqlens``; the values buffer wraps ``flat``."""
    value_type = list_type.value_type
    child = pa.Array.from_buffers(value_type, len(flat), [None, pa.py_buffer(flat)])
    arr = ref.array
    bufs = arr.buffers()
    if ref.offsets is ref.cu_seqlens and bufs[1] is not None and bufs[1].size:
        off_buf, offset = bufs[1], arr.offset
    else:
        off_buf, offset = pa.py_buffer(np.ascontiguousarray(ref.cu_seqlens)), 0
    return pa.Array.from_buffers(list_type, len(arr), [None, off_buf], offset=offset, children=[child])


# --------------------------------------------------------------------------- #
# Errors of a chunk's kernel call: kernel arguments -> columns, chunk rows -> column rows
# --------------------------------------------------------------------------- #


def _relabel(exc: ComppoError, names: dict[str, str], row0: int) -> ComppoError:
    """``exc``, raised by a kernel call on one chunk, as the column's error: its
    ``argument`` (the kernel's name, a role) becomes the column's name and its ``row``
    counts from the column's start (``+ row0``); the flat ``index``, meaningless for a
    column, is dropped. The message is rewritten to match from the attributes: the
    argument it starts with, and the location it gives (``errors.location``, or
    ``at row r`` for a per-row value)."""
    msg, argument, row, index = str(exc), exc.argument, exc.row, exc.index
    if argument is not None and argument in names:
        prefix = f"{argument}: "
        if msg.startswith(prefix):
            msg = f"{_describe(names[argument], argument)}: {msg[len(prefix) :]}"
        argument = names[argument]
    if exc.row is not None:
        row = exc.row + row0
        if exc.position is not None:
            msg = msg.replace(location(exc.row, exc.position, exc.index), location(row, exc.position), 1)
            index = None
        else:
            msg = msg.replace(f"at row {exc.row}", f"at row {row}", 1)
    return type(exc)(msg, argument=argument, row=row, position=exc.position, index=index)


# --------------------------------------------------------------------------- #
# Chunks
# --------------------------------------------------------------------------- #


def _chunks(x: ListColumn) -> list[pa.Array]:
    return list(x.chunks) if isinstance(x, pa.ChunkedArray) else [x]


def _aligned(x: ListColumn, start: int, length: int) -> pa.Array:
    """Rows ``[start, start + length)`` of ``x`` as one array: a zero-copy slice when
    they lie in one chunk, else the chunks concatenated (a copy)."""
    if isinstance(x, pa.ChunkedArray):
        piece = x.slice(start, length)
        if piece.num_chunks == 1:
            return piece.chunk(0)
        if piece.num_chunks == 0:
            return pa.array([], type=x.type)
        return pa.concat_arrays(piece.chunks)
    if start == 0 and length == len(x):
        return x
    return x.slice(start, length)


def _check_column(x: Any, name: str, role: str) -> None:
    if not isinstance(x, (pa.Array, pa.ChunkedArray)):
        raise DTypeError(f"{name}: expected a pyarrow Array or ChunkedArray, got {type(x).__name__}", argument=name)


def _assemble(template: ListColumn, pieces: list[pa.Array], list_type: pa.DataType) -> ListColumn:
    if isinstance(template, pa.ChunkedArray):
        return pa.chunked_array(pieces, type=list_type)
    return pieces[0]


# --------------------------------------------------------------------------- #
# normalize="batch" over several chunks (or files, or Ray blocks)
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class ConcentrationMoments:
    """Count, mean, ``Σ (c − mean)²``, min and max of valid concentration values (float64).

    ``normalize="batch"`` z-scores every valid token with the mean and population std of
    *all* valid tokens: ``z = (c − mean)/(sqrt(m2/n) + 1e-8)``, and ``z = 0`` when
    ``n <= 1`` or ``min == max``. Moments of separate pieces (chunks, row groups, Ray
    blocks) :meth:`merge` exactly in exact arithmetic (Chan et al.), so the batch can
    span more data than one kernel call. In floating point the merged mean and std may
    differ from one kernel call over everything in their last bits.
    """

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    @classmethod
    def of(cls, valid: np.ndarray) -> ConcentrationMoments:
        """The moments of a 1-D array of (finite) valid values."""
        if valid.size == 0:
            return cls()
        x = valid.astype(np.float64, copy=False)
        mean = float(x.sum()) / x.size
        d = x - np.float64(mean)
        return cls(int(x.size), mean, float(np.dot(d, d)), float(x.min()), float(x.max()))

    def merge(self, other: ConcentrationMoments) -> ConcentrationMoments:
        """The moments of both pieces together."""
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.n / n)
        m2 = self.m2 + other.m2 + delta * delta * (self.n * other.n / n)
        return ConcentrationMoments(n, mean, m2, min(self.min, other.min), max(self.max, other.max))

    @property
    def flat(self) -> bool:
        """Whether every z-score is 0 (at most one valid value, or zero spread)."""
        return self.n <= 1 or self.min == self.max

    def gate_args(self, sharpness: float, min_spread: float = 0.0) -> dict[str, Any]:
        """The arguments of :func:`comppo_core.gates_from_concentration` that apply these
        batch statistics: ``normalize="none"`` with ``center = mean`` and
        ``scale = max(std, min_spread) + 1e-8`` (``std`` itself for ``min_spread = 0``);
        a flat batch maps to the midpoint gate (sharpness 0)."""
        if self.flat:
            return {"normalize": "none", "center": 0.0, "scale": 1.0, "sharpness": 0.0}
        std = math.sqrt(self.m2 / self.n)
        if not (math.isfinite(self.mean) and math.isfinite(std)):
            raise ParameterError(
                f"concentration: values too large (up to {max(abs(self.min), abs(self.max)):.3g}) for "
                "normalize='batch' statistics across chunks; rescale the column",
                argument="concentration",
            )
        spread = max(std, min_spread) if min_spread > 0.0 else std
        return {"normalize": "none", "center": self.mean, "scale": spread + GATE_STD_EPS, "sharpness": sharpness}


def _valid_moments(c: _Packed, m: _Packed | None, name: str, row0: int) -> ConcentrationMoments:
    valid = c.flat if m is None else c.flat[m.flat != 0]
    finite = np.isfinite(valid)
    if not finite.all():
        k_valid = int(np.flatnonzero(~finite)[0])
        k = k_valid if m is None else int(np.flatnonzero(m.flat != 0)[k_valid])
        r, p = _locate(c.cu_seqlens, k)
        raise NonFiniteError(
            f"{_describe(name, 'concentration')}: expected finite values at valid positions, got {_nonfinite(float(c.flat[k]))} "
            f"at {location(row0 + r, p)}",
            argument=name,
            row=row0 + r,
            position=p,
        )
    return ConcentrationMoments.of(valid)


def _moments_of_columns(
    conc: ListColumn, mask: ListColumn | None, conc_name: str, mask_name: str, row0: int
) -> ConcentrationMoments:
    total = ConcentrationMoments()
    start = 0
    for chunk in _chunks(conc):
        n = len(chunk)
        c = _packed(chunk, conc_name, "concentration", "float", row0 + start)
        m = None
        if mask is not None:
            m = _packed(_aligned(mask, start, n), mask_name, "mask", "mask", row0 + start)
            _same_rows(c, m, conc_name, mask_name, "mask", row0 + start)
        total = total.merge(_valid_moments(c, m, conc_name, row0 + start))
        start += n
    return total


def concentration_moments(
    data: pa.Table | pa.RecordBatch | ListColumn,
    *,
    concentration_col: str = "concentration",
    mask: ListColumn | None = None,
    mask_col: str | None | _Auto = AUTO_MASK,
    row_offset: int = 0,
) -> ConcentrationMoments:
    """The :class:`ConcentrationMoments` of the valid concentration values of a table
    (column ``concentration_col``, mask column ``mask_col``) or of a list column (with an
    optional ``mask`` list column). Merge those of several tables to z-score over all of
    them with ``normalize="batch"`` (pass the result as ``batch_moments=``)."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        table = _as_table(data)
        names = table.schema.names
        if concentration_col not in names:
            raise ParameterError(
                f"column {concentration_col!r} (concentration) not found (columns: {', '.join(names)})",
                argument=concentration_col,
            )
        mcol = mask_col.name if isinstance(mask_col, _Auto) and mask_col.name in names else mask_col
        if isinstance(mcol, _Auto):
            mcol = None
        if mcol is not None and mcol not in names:
            raise ParameterError(f"column {mcol!r} (mask) not found (columns: {', '.join(names)})", argument=mcol)
        conc = table.column(concentration_col)
        mcolumn = None if mcol is None else table.column(mcol)
        return _moments_of_columns(conc, mcolumn, concentration_col, mcol or "mask", row_offset)
    _check_column(data, "concentration", "concentration")
    if mask is not None:
        _check_column(mask, "mask", "mask")
    return _moments_of_columns(data, mask, "concentration", "mask", row_offset)


# --------------------------------------------------------------------------- #
# The computation over aligned chunks
# --------------------------------------------------------------------------- #


def _chunk_params(params: GateParams, moments: ConcentrationMoments | None) -> GateParams:
    """The mapping one chunk's kernel call applies: ``params``, except that
    ``normalize="batch"`` with the moments of more than the chunk becomes ``"none"``
    with their mean and std (:meth:`ConcentrationMoments.gate_args`)."""
    if params.normalize == "batch" and moments is not None:
        return dataclasses.replace(params, **moments.gate_args(params.sharpness, params.min_spread))
    return params


def _batch_moments(
    conc: ListColumn,
    mask: ListColumn | None,
    names: dict[str, str],
    params: GateParams,
    given: ConcentrationMoments | None,
    row0: int,
) -> ConcentrationMoments | None:
    """The moments to use for normalize="batch": the given ones, else None when the
    column is one chunk (the kernel's own batch z-score is exact), else computed."""
    if params.normalize != "batch":
        return None
    if given is not None:
        if not isinstance(given, ConcentrationMoments):
            raise ParameterError(
                f"batch_moments: expected a ConcentrationMoments, got {type(given).__name__}", argument="batch_moments"
            )
        return given
    if len(_chunks(conc)) <= 1:
        return None
    return _moments_of_columns(conc, mask, names["concentration"], names.get("mask", "mask"), row0)


def _run(
    cols: dict[str, ListColumn],
    names: dict[str, str],
    *,
    gamma: float,
    lam: float,
    lam_critic: float | None,
    masked_rewards: str,
    gate_params: GateParams | None,
    batch_moments: ConcentrationMoments | None,
    row_offset: int,
) -> Iterator[tuple[_Packed, np.ndarray, np.ndarray]]:
    """Per chunk of the rewards: (packed rewards chunk, advantages, returns)."""
    rewards = cols["rewards"]
    moments = None
    if gate_params is not None and "concentration" in cols:
        moments = _batch_moments(cols["concentration"], cols.get("mask"), names, gate_params, batch_moments, row_offset)
    start = 0
    for chunk in _chunks(rewards):
        n = len(chunk)
        row0 = row_offset + start
        r = _packed(chunk, names["rewards"], "rewards", "float", row0)
        packed: dict[str, _Packed] = {}
        for role in ("values", "mask", "gates", "concentration"):
            if role in cols:
                kind = "mask" if role == "mask" else "float"
                p = _packed(_aligned(cols[role], start, n), names[role], role, kind, row0)
                _same_rows(r, p, names["rewards"], names[role], role, row0)
                packed[role] = p
        last = None
        if "last_values" in cols:
            last = _scalars(_aligned(cols["last_values"], start, n), names["last_values"], "last_values", row0)
        mask = packed["mask"].flat if "mask" in packed else None
        try:
            gates = packed["gates"].flat if "gates" in packed else None
            if "concentration" in packed:
                assert gate_params is not None
                chunk_params = _chunk_params(gate_params, moments)
                gates = _gates(packed["concentration"].flat, mask=mask, cu_seqlens=r.cu_seqlens, params=chunk_params)
            adv, ret = _gae(
                r.flat,
                packed["values"].flat,
                mask=mask,
                cu_seqlens=r.cu_seqlens,
                gates=gates,
                gamma=gamma,
                lam=lam,
                lam_critic=lam_critic,
                last_values=last,
                masked_rewards=masked_rewards,
            )
        except ComppoError as e:
            raise _relabel(e, names, row0) from e
        yield r, adv, ret
        start += n


def _check_params(gamma: Any, lam: Any, lam_critic: Any, masked_rewards: Any) -> None:
    check_unit("gamma", gamma)
    check_unit("lam", lam)
    if lam_critic is not None:
        check_unit("lam_critic", lam_critic)
    check_choice("masked_rewards", masked_rewards, MASKED_REWARD_MODES)


# --------------------------------------------------------------------------- #
# Public API: columns
# --------------------------------------------------------------------------- #


def gae(
    rewards: ListColumn,
    values: ListColumn,
    *,
    mask: ListColumn | None = None,
    gates: ListColumn | None = None,
    last_values: Any = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    lam_critic: float | None = None,
    masked_rewards: str = "error",
    row_offset: int = 0,
) -> ArrowGAEResult:
    """Comp-GAE advantages and λ-returns of Arrow list columns (docs/design.md §3).

    Args:
      rewards: ``[B]`` rows of per-token rewards: a ``ListArray`` / ``LargeListArray`` of
        float32 or float64 (or a ``ChunkedArray`` of them); its offsets are the
        ``cu_seqlens`` ``[B+1]`` and its values the packed ``[N]`` array.
      values: critic values, a list column with the rewards' row lengths.
      mask: optional list column of bool or 0/1 integers (1 = valid token) with the
        rewards' row lengths; masked tokens are skipped and get 0.
      gates: optional list column of gates in [0, 1] (default 1: plain GAE).
      last_values: optional ``[B]`` bootstrap values of truncated rows (a numeric Arrow
        column or array-like; default 0).
      gamma, lam, lam_critic, masked_rewards: as :func:`comppo_core.gae`.
      row_offset: added to row indices in error messages (for a slice of a dataset).

    Returns:
      ``ArrowGAEResult(advantages, returns)``: list columns of the rewards' type and
      chunking; each chunk shares its offsets buffer with the rewards chunk (when the
      chunk's offsets start at 0; a slice starting later gets rebased offsets), and its
      values buffer is the kernel's output (no copy).
    """
    _check_params(gamma, lam, lam_critic, masked_rewards)
    cols: dict[str, Any] = {"rewards": rewards, "values": values}
    for role, x in (("mask", mask), ("gates", gates)):
        if x is not None:
            cols[role] = x
    for role, x in cols.items():
        _check_column(x, role, role)
    if last_values is not None:
        if not isinstance(last_values, (pa.Array, pa.ChunkedArray)):
            last_values = pa.array(np.asarray(last_values))
        cols["last_values"] = last_values
    for role, x in cols.items():
        if len(x) != len(rewards):
            raise ShapeError(f"{role}: expected {len(rewards)} rows like rewards, got {len(x)}", argument=role)
    names = {role: role for role in cols}
    advs, rets = [], []
    for r, adv, ret in _run(
        cols,
        names,
        gamma=gamma,
        lam=lam,
        lam_critic=lam_critic,
        masked_rewards=masked_rewards,
        gate_params=None,
        batch_moments=None,
        row_offset=row_offset,
    ):
        advs.append(_wrap(r, adv, rewards.type))
        rets.append(_wrap(r, ret, rewards.type))
    return ArrowGAEResult(_assemble(rewards, advs, rewards.type), _assemble(rewards, rets, rewards.type))


def gates_from_concentration(
    concentration: ListColumn,
    *,
    mask: ListColumn | None = None,
    params: GateParams | None = None,
    batch_moments: ConcentrationMoments | None = None,
    row_offset: int = 0,
) -> ListColumn:
    """Retention gates of an Arrow list column of concentration (docs/design.md §4)::

        z = normalize(c);  z = −z if invert;  g = low + (high − low)·sigmoid(sharpness·z)

    with the mapping ``params``, a :class:`~comppo_core.GateParams` (None:
    ``GateParams()``). ``normalize="causal"`` (the default) z-scores each token against its
    row's valid tokens up to it, ``"sequence"`` each row, ``"batch"`` all valid tokens of
    the column (every chunk; or the data ``batch_moments`` were computed over), ``"none"``
    uses ``(c − center)/scale``; all but ``"batch"`` work row by row, whatever the chunks. Masked tokens get 1. Returns a list column of
    the concentration's type and chunking, sharing its offsets.
    """
    _check_column(concentration, "concentration", "concentration")
    gate = as_gate_params(params)
    names = {"concentration": "concentration", "mask": "mask"}
    if mask is not None:
        _check_column(mask, "mask", "mask")
        if len(mask) != len(concentration):
            raise ShapeError(
                f"mask: expected {len(concentration)} rows like concentration, got {len(mask)}", argument="mask"
            )
    moments = _batch_moments(concentration, mask, names, gate, batch_moments, row_offset)
    pieces = []
    start = 0
    for chunk in _chunks(concentration):
        n = len(chunk)
        row0 = row_offset + start
        c = _packed(chunk, "concentration", "concentration", "float", row0)
        m = None
        if mask is not None:
            m = _packed(_aligned(mask, start, n), "mask", "mask", "mask", row0)
            _same_rows(c, m, "concentration", "mask", "mask", row0)
        try:
            chunk_params = _chunk_params(gate, moments)
            g = _gates(c.flat, mask=None if m is None else m.flat, cu_seqlens=c.cu_seqlens, params=chunk_params)
        except ComppoError as e:
            raise _relabel(e, names, row0) from e
        pieces.append(_wrap(c, g, concentration.type))
        start += n
    return _assemble(concentration, pieces, concentration.type)


# --------------------------------------------------------------------------- #
# Public API: tables
# --------------------------------------------------------------------------- #


def _as_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    raise DTypeError(f"table: expected a pyarrow Table or RecordBatch, got {type(data).__name__}", argument="table")


def compute_advantages(
    table: pa.Table | pa.RecordBatch,
    *,
    rewards_col: str = "rewards",
    values_col: str = "values",
    mask_col: str | None | _Auto = AUTO_MASK,
    last_values_col: str | None | _Auto = AUTO_LAST_VALUES,
    gates_col: str | None = None,
    concentration_col: str | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    lam_critic: float | None = None,
    masked_rewards: str = "error",
    gate_params: GateParams | None = None,
    batch_moments: ConcentrationMoments | None = None,
    advantages_col: str = "advantages",
    returns_col: str = "returns",
    replace: bool = False,
    row_offset: int = 0,
) -> pa.Table:
    """``table`` plus the columns ``advantages_col`` and ``returns_col`` (Comp-GAE).

    One row per response. Reads the list columns ``rewards_col`` and ``values_col``, the
    optional mask (``mask_col``; by default the column ``"mask"`` if the table has one,
    None for none) and last values (``last_values_col``; by default ``"last_values"`` if
    present). Gates come from ``gates_col``, or from ``concentration_col`` through the
    gate mapping ``gate_params``, a :class:`~comppo_core.GateParams` (None:
    ``GateParams()``; see :func:`gates_from_concentration`), or are 1 (plain GAE).

    ``gate_params.normalize="batch"`` z-scores over every valid token of the table (all chunks), or
    over the data ``batch_moments`` describe (:func:`concentration_moments`; the
    streaming CLI and :mod:`comppo_core.ray` pass the moments of the whole input), so
    that the result does not depend on how the data is cut.

    The new columns have the rewards' type and chunking and share its offsets; the
    input columns are passed through untouched (the result is a new table). An output
    name that already exists is an error unless ``replace=True`` (then it is replaced
    in place). ``row_offset`` is added to row indices in error messages.

    Returns a ``pa.Table`` (a ``RecordBatch`` input is viewed as a one-batch table).
    """
    t = _as_table(table)
    cols = resolve_columns(
        t.schema,
        rewards_col=rewards_col,
        values_col=values_col,
        mask_col=mask_col,
        last_values_col=last_values_col,
        gates_col=gates_col,
        concentration_col=concentration_col,
        advantages_col=advantages_col,
        returns_col=returns_col,
        replace=replace,
    )
    _check_params(gamma, lam, lam_critic, masked_rewards)
    gate = as_gate_params(gate_params, "gate_params")
    params = gate if cols.concentration else None
    names = cols.inputs()
    arrays = {role: t.column(name) for role, name in names.items()}
    advs, rets = [], []
    for r, adv, ret in _run(
        arrays,
        names,
        gamma=gamma,
        lam=lam,
        lam_critic=lam_critic,
        masked_rewards=masked_rewards,
        gate_params=params,
        batch_moments=batch_moments,
        row_offset=row_offset,
    ):
        advs.append(_wrap(r, adv, arrays["rewards"].type))
        rets.append(_wrap(r, ret, arrays["rewards"].type))
    list_type = arrays["rewards"].type
    out = t
    for name, pieces in ((cols.advantages, advs), (cols.returns, rets)):
        column = pa.chunked_array(pieces, type=list_type)
        field = pa.field(name, list_type)
        idx = out.schema.get_field_index(name)
        out = out.set_column(idx, field, column) if idx >= 0 else out.append_column(field, column)
    return out
