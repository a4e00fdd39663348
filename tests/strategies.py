"""Hypothesis strategies and small helpers shared by the comppo-core tests.

Every generated batch is *ragged*: row ``b`` has ``lengths[b] <= T`` positions (the
rest of the padded row is padding), and inside its length an optional inner mask marks
observation/tool tokens as invalid (multi-turn). The same data therefore exists in both
layouts of docs/design.md §2:

* padded: ``[B, T]`` arrays + ``mask`` (``None`` only when every position is valid);
* packed: ``[N]`` arrays (the first ``lengths[b]`` positions of each row, concatenated)
  + ``cu_seqlens`` + ``mask`` ``[N]`` (``None`` when no inner mask was drawn).

Masked rewards are 0 (unless a test asks for junk there); masked values and gates may
hold junk (NaN, ±inf, out-of-range gates), which the contract says is never read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

#: Float dtypes the kernels compute in directly.
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: Mask dtypes users pass (bool, ints, floats; some are converted by the package).
MASK_DTYPES = tuple(
    np.dtype(t) for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.uint64, np.float32, np.float64)
)

B_MAX = 6
T_MAX = 12


def tolerance(dtype: np.dtype) -> dict[str, float]:
    """assert_allclose tolerances for GAE / TD outputs of ``dtype`` (kernel vs reference).

    Kernel and reference compute in float64; the kernel reassociates the GAE recursion
    over blocks of four positions, so they differ by float64 rounding of the partial
    sums (~1e-16 of the largest term; the drawn values are in [-10, 10], rows ≤ 12 long),
    and float32 is that float64 value rounded once. float16 is
    computed in float32 (f64 → f32 → f16, a double rounding), so allow one f16 ulp.
    """
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return {"rtol": 1e-12, "atol": 1e-12}
    if dtype == np.float32:
        return {"rtol": 1e-6, "atol": 1e-6}
    return {"rtol": 2e-3, "atol": 2e-3}


def unit_interval() -> st.SearchStrategy[float]:
    """γ, λ: the endpoints 0 and 1 are drawn often."""
    return st.one_of(st.sampled_from([0.0, 1.0, 0.5]), st.floats(0.0, 1.0))


@dataclass
class Batch:
    """A ragged batch in both layouts."""

    dtype: np.dtype
    lengths: np.ndarray  # [B] int
    valid: np.ndarray  # [B, T] bool: inside the row's length and not inner-masked
    inner: bool  # whether an inner (multi-turn) mask exists
    mask: np.ndarray | None  # [B, T] of a mask dtype; None only if all valid
    rewards: np.ndarray  # [B, T]
    values: np.ndarray  # [B, T]
    gates: np.ndarray | None  # [B, T]
    last_values: np.ndarray | None  # [B]
    cu_dtype: np.dtype

    @property
    def shape(self) -> tuple[int, int]:
        return self.rewards.shape  # type: ignore[return-value]

    @property
    def cu_seqlens(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(self.cu_dtype)

    def pack(self, x: np.ndarray | None) -> np.ndarray | None:
        """The packed ``[N]`` version of a padded ``[B, T]`` array."""
        if x is None:
            return None
        parts = [x[b, : self.lengths[b]] for b in range(x.shape[0])]
        return np.concatenate(parts) if parts else x.reshape(-1)[:0].copy()

    def unpack(self, flat: np.ndarray) -> np.ndarray:
        """Scatters a packed ``[N]`` result back to ``[B, T]`` (0 beyond each length)."""
        out = np.zeros(self.shape, dtype=flat.dtype)
        cu = self.cu_seqlens
        for b in range(self.shape[0]):
            out[b, : self.lengths[b]] = flat[cu[b] : cu[b + 1]]
        return out

    @property
    def packed_mask(self) -> np.ndarray | None:
        return self.pack(self.mask) if self.inner else None

    def padded(self, **extra: Any) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """``(rewards, values, kwargs)`` for a padded call."""
        kw: dict[str, Any] = {"mask": self.mask, "gates": self.gates, "last_values": self.last_values}
        kw.update(extra)
        return self.rewards, self.values, kw

    def packed(self, **extra: Any) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """``(rewards, values, kwargs)`` for the packed call on the same data."""
        kw: dict[str, Any] = {
            "mask": self.packed_mask,
            "gates": self.pack(self.gates),
            "last_values": self.last_values,
            "cu_seqlens": self.cu_seqlens,
        }
        kw.update(extra)
        r, v = self.pack(self.rewards), self.pack(self.values)
        assert r is not None and v is not None
        return r, v, kw

    def copies(self) -> list[np.ndarray | None]:
        return [None if a is None else a.copy() for a in self.arrays()]

    def arrays(self) -> list[np.ndarray | None]:
        return [self.rewards, self.values, self.mask, self.gates, self.last_values]


def _mask_values(draw: st.DrawFn, dtype: np.dtype, valid: np.ndarray) -> np.ndarray:
    """A mask array of ``dtype``: 0 where invalid, some nonzero value where valid."""
    if dtype == np.bool_:
        return valid.copy()
    if dtype.kind == "f":
        nonzero = [1.0, 0.5, 2.0, -1.0, 1e-3]
    elif dtype.kind == "u":
        nonzero = [1, 2, 255 if dtype.itemsize == 1 else 1000]
    else:
        nonzero = [1, 2, -1, 100]
    picks = draw(hnp.arrays(np.int64, valid.shape, elements=st.integers(0, len(nonzero) - 1)))
    out = np.zeros(valid.shape, dtype=dtype)
    choice = np.asarray(nonzero, dtype=dtype)[picks]
    out[valid] = choice[valid]
    return out


@st.composite
def ragged(
    draw: st.DrawFn, b_max: int = B_MAX, t_max: int = T_MAX
) -> tuple[np.ndarray, np.ndarray, bool, np.dtype | None]:
    """``(lengths, valid, inner, mask_dtype)``: a ragged validity pattern.

    ``mask_dtype is None`` means every position of the padded grid is valid (no mask).
    """
    B = draw(st.integers(0, b_max))
    T = draw(st.integers(1, t_max))
    # no mask about a third of the time; otherwise one of the mask dtypes
    mask_dtype = draw(st.one_of(st.none(), st.sampled_from(MASK_DTYPES), st.sampled_from(MASK_DTYPES)))
    if mask_dtype is None:
        return np.full(B, T, dtype=np.int64), np.ones((B, T), dtype=bool), False, None
    full = draw(st.booleans())
    lengths = (
        np.full(B, T, dtype=np.int64)
        if full
        else np.asarray(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)), dtype=np.int64)
    )
    inner = draw(st.booleans())
    in_len = np.arange(T)[None, :] < lengths[:, None]
    if inner:
        keep = draw(hnp.arrays(np.bool_, (B, T), elements=st.booleans()))
        # sometimes mask whole rows out
        dead_rows = draw(hnp.arrays(np.bool_, (B,), elements=st.booleans())) & draw(st.booleans())
        keep &= ~dead_rows[:, None]
        valid = in_len & keep
    else:
        valid = in_len
    return lengths, valid, inner, mask_dtype


def float_elements(dtype: np.dtype, lo: float = -10.0, hi: float = 10.0) -> st.SearchStrategy[float]:
    width = 8 * np.dtype(dtype).itemsize
    return st.floats(lo, hi, width=width, allow_subnormal=False)  # type: ignore[arg-type]


def gate_elements(dtype: np.dtype) -> st.SearchStrategy[float]:
    width = 8 * np.dtype(dtype).itemsize
    return st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0, width=width, allow_subnormal=False))  # type: ignore[arg-type]


JUNK_VALUES = [np.nan, np.inf, -np.inf, 7.0]
JUNK_GATES = [np.nan, np.inf, -np.inf, 7.0, -3.0, 1.5]


@st.composite
def batches(
    draw: st.DrawFn,
    dtypes: tuple[np.dtype, ...] = FLOATS,
    gates: bool | None = None,
    last_values: bool | None = None,
    junk: bool | None = None,
    b_max: int = B_MAX,
    t_max: int = T_MAX,
) -> Batch:
    """A ragged batch with rewards, values, optional gates and last_values.

    ``gates``/``last_values``/``junk``: force them on or off, or ``None`` to draw.
    ``junk``: NaN/±inf/out-of-range junk at masked positions of values and gates.
    """
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    lengths, valid, inner, mask_dtype = draw(ragged(b_max=b_max, t_max=t_max))
    shape = valid.shape
    mask = None if mask_dtype is None else _mask_values(draw, mask_dtype, valid)
    rewards = draw(hnp.arrays(dtype, shape, elements=float_elements(dtype)))
    rewards[~valid] = 0
    values = draw(hnp.arrays(dtype, shape, elements=float_elements(dtype)))
    use_gates = draw(st.booleans()) if gates is None else gates
    g = draw(hnp.arrays(dtype, shape, elements=gate_elements(dtype))) if use_gates else None
    use_junk = draw(st.booleans()) if junk is None else junk
    if use_junk and (~valid).any():
        pick = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, len(JUNK_VALUES) - 1)))
        values[~valid] = np.asarray(JUNK_VALUES, dtype=dtype)[pick][~valid]
        if g is not None:
            pick = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, len(JUNK_GATES) - 1)))
            g[~valid] = np.asarray(JUNK_GATES, dtype=dtype)[pick][~valid]
    use_lv = draw(st.booleans()) if last_values is None else last_values
    lv = draw(hnp.arrays(np.float64, (shape[0],), elements=float_elements(np.float64))) if use_lv else None
    cu_dtype = np.dtype(draw(st.sampled_from([np.int32, np.int64])))
    return Batch(
        dtype=dtype,
        lengths=lengths,
        valid=valid,
        inner=inner,
        mask=mask,
        rewards=rewards,
        values=values,
        gates=g,
        last_values=lv,
        cu_dtype=cu_dtype,
    )


@dataclass
class ConcBatch:
    """Concentrations in both layouts (see :class:`Batch`)."""

    dtype: np.dtype
    lengths: np.ndarray
    valid: np.ndarray
    inner: bool
    mask: np.ndarray | None
    conc: np.ndarray
    cu_dtype: np.dtype

    @property
    def cu_seqlens(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(self.cu_dtype)

    def pack(self, x: np.ndarray | None) -> np.ndarray | None:
        if x is None:
            return None
        parts = [x[b, : self.lengths[b]] for b in range(x.shape[0])]
        return np.concatenate(parts) if parts else x.reshape(-1)[:0].copy()

    def unpack(self, flat: np.ndarray, fill: float = 0.0) -> np.ndarray:
        out = np.full(self.conc.shape, fill, dtype=flat.dtype)
        cu = self.cu_seqlens
        for b in range(self.conc.shape[0]):
            out[b, : self.lengths[b]] = flat[cu[b] : cu[b + 1]]
        return out

    @property
    def packed_mask(self) -> np.ndarray | None:
        return self.pack(self.mask) if self.inner else None


@st.composite
def conc_batches(draw: st.DrawFn, dtypes: tuple[np.dtype, ...] = FLOATS, junk: bool | None = None) -> ConcBatch:
    """Concentrations on a 1/1000 grid in [-10, 10].

    A grid keeps every row's spread either 0 (exactly: the "flat row" rule) or >= 1e-3,
    so the z-score of the kernel (sequential f64 sums) and of the NumPy reference
    (pairwise sums) agree to ~1e-12 instead of amplifying rounding noise of nearly
    equal values by 1/(σ + ε).
    """
    dtype = np.dtype(draw(st.sampled_from(dtypes)))
    lengths, valid, inner, mask_dtype = draw(ragged())
    shape = valid.shape
    mask = None if mask_dtype is None else _mask_values(draw, mask_dtype, valid)
    # a few distinct levels often, so that flat rows and ties happen
    elem = st.one_of(st.integers(-10_000, 10_000), st.sampled_from([0, 1000, -2500]))
    ints = draw(hnp.arrays(np.int64, shape, elements=elem))
    conc = (ints / 1000.0).astype(dtype)
    use_junk = draw(st.booleans()) if junk is None else junk
    if use_junk and (~valid).any():
        pick = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, len(JUNK_VALUES) - 1)))
        conc[~valid] = np.asarray(JUNK_VALUES, dtype=dtype)[pick][~valid]
    cu_dtype = np.dtype(draw(st.sampled_from([np.int32, np.int64])))
    return ConcBatch(dtype=dtype, lengths=lengths, valid=valid, inner=inner, mask=mask, conc=conc, cu_dtype=cu_dtype)


def assert_unchanged(before: list[np.ndarray | None], after: list[np.ndarray | None]) -> None:
    """Inputs are never modified (bitwise, NaNs included)."""
    for a, b in zip(before, after):
        if a is None:
            assert b is None
            continue
        assert b is not None
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), "an input array was modified"
