"""Arrow list columns in and out (``comppo_core.arrow``): zero-copy inputs, shared offsets,
slices, chunks, large lists, both float dtypes, the table helper and its errors."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

import comppo_core as cc  # noqa: E402
from comppo_core import GateParams, _core, arrow  # noqa: E402

DTYPES = [np.float32, np.float64]


# --------------------------------------------------------------------------- #
# Data
# --------------------------------------------------------------------------- #


def packed_batch(
    seed: int, rows: int, max_len: int, dtype: Any = np.float32, min_len: int = 0
) -> dict[str, np.ndarray]:
    """Packed [N] arrays + cu_seqlens [B+1]: an outcome reward on each row's last valid
    token, random values, a mask with interior zeros, gates, concentration, last values."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, max_len + 1, size=rows)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    n = int(cu[-1])
    mask = rng.random(n) > 0.2
    rewards = np.where(mask, rng.normal(0.0, 0.1, n), 0.0).astype(dtype)
    return {
        "cu": cu,
        "rewards": rewards,
        "values": rng.standard_normal(n).astype(dtype),
        "mask": mask,
        "gates": rng.uniform(0.5, 1.0, n).astype(dtype),
        "concentration": rng.random(n).astype(dtype),
        "last_values": rng.standard_normal(rows),
    }


def lists(cu: np.ndarray, flat: np.ndarray, large: bool = False) -> pa.Array:
    cls = pa.LargeListArray if large else pa.ListArray
    offsets = pa.array(cu.astype(np.int64 if large else np.int32))
    return cls.from_arrays(offsets, pa.array(flat))


def table_of(d: dict[str, np.ndarray], large: bool = False, with_last: bool = True) -> pa.Table:
    cols = {k: lists(d["cu"], d[k], large) for k in ("rewards", "values", "mask", "gates", "concentration")}
    if with_last:
        cols["last_values"] = pa.array(d["last_values"])
    return pa.table(cols)


def flat(x: Any) -> np.ndarray:
    """The values of a list column (array or chunked) as one NumPy array."""
    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks()
    return np.asarray(x.flatten())


def row_lengths(x: Any) -> np.ndarray:
    if isinstance(x, pa.ChunkedArray):
        x = x.combine_chunks()
    return np.asarray(pa.compute.list_value_length(x))


def snapshot(*arrays: Any) -> list[bytes]:
    out = []
    for a in arrays:
        for chunk in a.chunks if isinstance(a, pa.ChunkedArray) else [a]:
            for b in chunk.buffers():
                out.append(b"" if b is None else b.to_pybytes())
    return out


# --------------------------------------------------------------------------- #
# Equality with the packed kernel
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("large", [False, True])
def test_gae_equals_packed_kernel(dtype: Any, large: bool) -> None:
    d = packed_batch(1, 40, 60, dtype)
    kw = dict(gamma=0.99, lam=0.9, lam_critic=0.97)
    want = cc.gae(
        d["rewards"],
        d["values"],
        cu_seqlens=d["cu"],
        mask=d["mask"],
        gates=d["gates"],
        last_values=d["last_values"],
        **kw,
    )
    got = arrow.gae(
        lists(d["cu"], d["rewards"], large),
        lists(d["cu"], d["values"], large),
        mask=lists(d["cu"], d["mask"], large),
        gates=lists(d["cu"], d["gates"], large),
        last_values=pa.array(d["last_values"]),
        **kw,
    )
    for col, ref in zip(got, want):
        assert col.type == (pa.large_list if large else pa.list_)(pa.from_numpy_dtype(np.dtype(dtype)))
        col.validate(full=True)
        np.testing.assert_array_equal(flat(col), ref)
        np.testing.assert_array_equal(row_lengths(col), np.diff(d["cu"]))


def test_plain_gae_and_integer_mask() -> None:
    d = packed_batch(2, 30, 50)
    m8 = d["mask"].astype(np.int8)
    want = cc.gae(d["rewards"], d["values"], cu_seqlens=d["cu"], mask=d["mask"], lam=0.95)
    got = arrow.gae(lists(d["cu"], d["rewards"]), lists(d["cu"], d["values"]), mask=lists(d["cu"], m8), lam=0.95)
    np.testing.assert_array_equal(flat(got.advantages), want.advantages)
    np.testing.assert_array_equal(flat(got.returns), want.returns)


def test_float16_computed_in_float32_and_returned_as_float16() -> None:
    d = packed_batch(3, 10, 20, np.float16)
    want = cc.gae(d["rewards"], d["values"], cu_seqlens=d["cu"], lam=0.9)
    got = arrow.gae(lists(d["cu"], d["rewards"]), lists(d["cu"], d["values"]), lam=0.9)
    assert got.advantages.type == pa.list_(pa.float16())
    np.testing.assert_array_equal(flat(got.advantages), want.advantages)


# --------------------------------------------------------------------------- #
# No copies in, shared offsets out
# --------------------------------------------------------------------------- #


def _data_address(arr: pa.Array) -> int:
    """Address of the first value row 0 of list array ``arr`` reads."""
    child = arr.values
    itemsize = np.dtype(child.type.to_pandas_dtype()).itemsize
    first = arr.offsets[0].as_py()
    return int(child.buffers()[1].address) + (child.offset + first) * itemsize


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("sliced", [False, True])
def test_values_buffers_reach_the_kernel_without_copies(
    monkeypatch: pytest.MonkeyPatch, dtype: Any, large: bool, sliced: bool
) -> None:
    """The arrays the Rust kernel receives *are* the Arrow values buffers (same address),
    for rewards, values, gates and an int8 mask, also for a slice not starting at 0."""
    d = packed_batch(4, 50, 40, dtype, min_len=1)
    cols = {k: lists(d["cu"], d[k], large) for k in ("rewards", "values", "gates")}
    cols["mask"] = lists(d["cu"], d["mask"].astype(np.int8), large)
    if sliced:
        cols = {k: v.slice(7, 30) for k, v in cols.items()}
        assert cols["rewards"].offset == 7 and cols["rewards"].offsets[0].as_py() > 0
    seen: dict[str, Any] = {}
    real = _core.gae

    def spy(*args: Any) -> Any:  # _core.gae(rewards, values, mask, cu_seqlens, gates, ...)
        seen.update(rewards=args[0], values=args[1], mask=args[2], gates=args[4])
        return real(*args)

    monkeypatch.setattr(_core, "gae", spy)
    arrow.gae(cols["rewards"], cols["values"], mask=cols["mask"], gates=cols["gates"], lam=0.9)
    for role in ("rewards", "values", "gates", "mask"):
        got = seen[role]
        assert got.__array_interface__["data"][0] == _data_address(cols[role]), role
        assert got.size == int(cols[role].offsets[-1].as_py() - cols[role].offsets[0].as_py())


def test_no_allocation_beyond_the_outputs() -> None:
    """Peak NumPy allocation of a call is the two outputs (plus the int64 offsets);
    nothing is taken from Arrow's memory pool."""
    d = packed_batch(5, 200, 400, np.float32, min_len=100)
    r, v, g = (lists(d["cu"], d[k]) for k in ("rewards", "values", "gates"))
    arrow.gae(r, v, gates=g, lam=0.9)  # warm-up
    out_bytes = 2 * d["rewards"].nbytes
    pool_before = pa.total_allocated_bytes()
    tracemalloc.start()
    try:
        res = arrow.gae(r, v, gates=g, lam=0.9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pa.total_allocated_bytes() == pool_before
    assert peak < out_bytes + d["cu"].nbytes + 64 * 1024, f"peak {peak} B for {out_bytes} B of outputs"
    assert flat(res.advantages).nbytes * 2 == out_bytes


@pytest.mark.parametrize("large", [False, True])
def test_outputs_share_the_input_offsets_and_wrap_the_kernel_outputs(large: bool) -> None:
    d = packed_batch(6, 20, 30)
    r, v = lists(d["cu"], d["rewards"], large), lists(d["cu"], d["values"], large)
    adv, ret = arrow.gae(r, v, lam=0.9)
    for col in (adv, ret):
        assert col.buffers()[1].address == r.buffers()[1].address
        assert col.offset == r.offset
        assert col.null_count == 0
        col.validate(full=True)
    # a slice whose offsets start at 0 keeps sharing the buffer, with the same array offset
    empty_head = lists(np.array([0, 0, 0, 3, 5]), np.arange(5, dtype=np.float32))
    s = empty_head.slice(1, 3)
    adv_s, _ = arrow.gae(s, s)
    assert adv_s.buffers()[1].address == s.buffers()[1].address and adv_s.offset == 1
    adv_s.validate(full=True)


def test_inputs_are_not_modified() -> None:
    d = packed_batch(7, 25, 30)
    t = table_of(d)
    before = snapshot(*t.columns)
    out = arrow.compute_advantages(
        t, concentration_col="concentration", gamma=0.9, lam=0.8, gate_params=GateParams(low=0.3)
    )
    assert snapshot(*t.columns) == before
    assert t.num_columns == 6 and out.num_columns == 8


# --------------------------------------------------------------------------- #
# Slices and chunks
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("large", [False, True])
def test_sliced_arrays(large: bool) -> None:
    d = packed_batch(8, 40, 25, min_len=1)
    r, v, m = (lists(d["cu"], d[k], large) for k in ("rewards", "values", "mask"))
    lo, n = 11, 17
    got = arrow.gae(
        r.slice(lo, n), v.slice(lo, n), mask=m.slice(lo, n), last_values=d["last_values"][lo : lo + n], lam=0.9
    )
    a, b = int(d["cu"][lo]), int(d["cu"][lo + n])
    want = cc.gae(
        d["rewards"][a:b],
        d["values"][a:b],
        mask=d["mask"][a:b],
        cu_seqlens=d["cu"][lo : lo + n + 1] - a,
        last_values=d["last_values"][lo : lo + n],
        lam=0.9,
    )
    assert len(got.advantages) == n
    got.advantages.validate(full=True)
    np.testing.assert_array_equal(flat(got.advantages), want.advantages)
    np.testing.assert_array_equal(flat(got.returns), want.returns)
    # the columns can be sliced differently as long as rows line up
    got2 = arrow.gae(
        r.slice(lo, n),
        pa.concat_arrays([v.slice(lo, n)]),
        mask=m.slice(lo, n),
        last_values=d["last_values"][lo : lo + n],
        lam=0.9,
    )
    np.testing.assert_array_equal(flat(got2.advantages), want.advantages)


def test_chunked_arrays_with_misaligned_chunks() -> None:
    d = packed_batch(9, 60, 30)
    r, v, g = (lists(d["cu"], d[k]) for k in ("rewards", "values", "gates"))
    rc = pa.chunked_array([r.slice(0, 13), r.slice(13, 0), r.slice(13, 30), r.slice(43)])
    vc = pa.chunked_array([v.slice(0, 25), v.slice(25)])  # other boundaries
    gc = g  # a plain array next to chunked ones
    got = arrow.gae(rc, vc, gates=gc, lam=0.9, gamma=0.99)
    want = cc.gae(d["rewards"], d["values"], cu_seqlens=d["cu"], gates=d["gates"], lam=0.9, gamma=0.99)
    assert isinstance(got.advantages, pa.ChunkedArray)
    assert [len(c) for c in got.advantages.chunks] == [13, 0, 30, 17]
    for c in got.advantages.chunks:
        c.validate(full=True)
    np.testing.assert_array_equal(flat(got.advantages), want.advantages)
    np.testing.assert_array_equal(flat(got.returns), want.returns)


def test_zero_rows_and_empty_rows() -> None:
    empty = pa.array([], pa.list_(pa.float32()))
    adv, ret = arrow.gae(empty, empty)
    assert len(adv) == 0 and adv.type == empty.type
    zero_chunks = pa.chunked_array([], pa.list_(pa.float64()))
    adv, _ = arrow.gae(zero_chunks, zero_chunks)
    assert isinstance(adv, pa.ChunkedArray) and len(adv) == 0
    r = pa.array([[], [1.0], []], pa.list_(pa.float32()))
    adv, ret = arrow.gae(r, r, gamma=0.5)
    assert adv.to_pylist() == [[], [0.0], []] and ret.to_pylist() == [[], [1.0], []]


# --------------------------------------------------------------------------- #
# Gates and the table helper
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("normalize", ["causal", "sequence", "none"])
def test_gates_from_concentration_column(normalize: str) -> None:
    d = packed_batch(10, 30, 40)
    p = GateParams(low=0.3, high=0.9, sharpness=2.0, normalize=normalize, center=0.4, scale=0.2, invert=True)
    want = cc.gates_from_concentration(d["concentration"], mask=d["mask"], cu_seqlens=d["cu"], params=p)
    got = arrow.gates_from_concentration(lists(d["cu"], d["concentration"]), mask=lists(d["cu"], d["mask"]), params=p)
    np.testing.assert_array_equal(flat(got), want)


def test_default_mapping_is_causal_in_any_chunking() -> None:
    """params=None is GateParams(): the row's running z-score, per row, so cutting the
    column into chunks (at any row) changes nothing."""
    d = packed_batch(13, 30, 40)
    want = cc.gates_from_concentration(
        d["concentration"], mask=d["mask"], cu_seqlens=d["cu"], params=GateParams(normalize="causal")
    )
    whole = cc.gates_from_concentration(
        d["concentration"], mask=d["mask"], cu_seqlens=d["cu"], params=GateParams(normalize="sequence")
    )
    assert not np.array_equal(want, whole)
    c, m = lists(d["cu"], d["concentration"]), lists(d["cu"], d["mask"])
    np.testing.assert_array_equal(flat(arrow.gates_from_concentration(c, mask=m)), want)
    chunked = pa.chunked_array([c.slice(0, 7), c.slice(7, 0), c.slice(7)])
    np.testing.assert_array_equal(flat(arrow.gates_from_concentration(chunked, mask=m)), want)


def test_table_with_concentration_equals_kernels() -> None:
    d = packed_batch(11, 40, 50)
    t = table_of(d)
    p = GateParams(low=0.5, high=1.0, sharpness=1.5)  # the default normalisation, "causal"
    out = arrow.compute_advantages(
        t, concentration_col="concentration", gamma=0.99, lam=0.95, lam_critic=1.0, gate_params=p
    )
    g = cc.gates_from_concentration(d["concentration"], mask=d["mask"], cu_seqlens=d["cu"], params=p)
    want = cc.gae(
        d["rewards"], d["values"], mask=d["mask"], cu_seqlens=d["cu"], gates=g, last_values=d["last_values"],
        gamma=0.99, lam=0.95, lam_critic=1.0,
    )  # fmt: skip
    assert out.column_names == [*t.column_names, "advantages", "returns"]
    np.testing.assert_array_equal(flat(out.column("advantages")), want.advantages)
    np.testing.assert_array_equal(flat(out.column("returns")), want.returns)
    for name in t.column_names:
        assert out.column(name).equals(t.column(name))


def test_table_with_gate_column_and_custom_names() -> None:
    d = packed_batch(12, 20, 30)
    t = table_of(d, with_last=False).rename_columns(["r", "v", "m", "g", "c"])
    out = arrow.compute_advantages(
        t, rewards_col="r", values_col="v", mask_col="m", gates_col="g", advantages_col="A", returns_col="R", lam=0.9
    )
    want = cc.gae(d["rewards"], d["values"], mask=d["mask"], cu_seqlens=d["cu"], gates=d["gates"], lam=0.9)
    np.testing.assert_array_equal(flat(out.column("A")), want.advantages)
    np.testing.assert_array_equal(flat(out.column("R")), want.returns)


def test_table_optional_columns_default_to_the_conventional_names() -> None:
    d = packed_batch(13, 20, 30)
    t = table_of(d)
    # "mask" and "last_values" are used because they are there ...
    out = arrow.compute_advantages(t, lam=0.9)
    want = cc.gae(d["rewards"], d["values"], mask=d["mask"], cu_seqlens=d["cu"], last_values=d["last_values"], lam=0.9)
    np.testing.assert_array_equal(flat(out.column("advantages")), want.advantages)
    # ... and ignored with None
    out = arrow.compute_advantages(t, lam=0.9, mask_col=None, last_values_col=None, masked_rewards="drop")
    want = cc.gae(d["rewards"], d["values"], cu_seqlens=d["cu"], lam=0.9)
    np.testing.assert_array_equal(flat(out.column("advantages")), want.advantages)
    # a RecordBatch works too
    out_b = arrow.compute_advantages(t.to_batches()[0], lam=0.9)
    assert isinstance(out_b, pa.Table) and out_b.num_rows == t.num_rows


def test_replace_existing_output_columns() -> None:
    d = packed_batch(14, 10, 10)
    t = arrow.compute_advantages(table_of(d), lam=0.9)
    with pytest.raises(cc.ParameterError, match=r"column 'advantages' \(advantages\) already exists"):
        arrow.compute_advantages(t, lam=0.5)
    t2 = arrow.compute_advantages(t, lam=0.5, replace=True)
    assert t2.column_names == t.column_names
    want = cc.gae(d["rewards"], d["values"], mask=d["mask"], cu_seqlens=d["cu"], last_values=d["last_values"], lam=0.5)
    np.testing.assert_array_equal(flat(t2.column("advantages")), want.advantages)


def test_batch_normalization_spans_every_chunk() -> None:
    """normalize="batch" z-scores over the whole column: one chunk is the kernel's own
    batch z-score (bit for bit); several chunks (merged moments) agree to rounding."""
    d = packed_batch(15, 60, 40)
    t = table_of(d)
    p = GateParams(normalize="batch", low=0.2, high=1.0, sharpness=3.0)
    kw: dict[str, Any] = dict(concentration_col="concentration", gate_params=p, lam=0.9)
    one = arrow.compute_advantages(t, **kw)
    g = cc.gates_from_concentration(d["concentration"], mask=d["mask"], cu_seqlens=d["cu"], params=p)
    want = cc.gae(
        d["rewards"], d["values"], mask=d["mask"], cu_seqlens=d["cu"], gates=g, last_values=d["last_values"], lam=0.9
    )
    np.testing.assert_array_equal(flat(one.column("advantages")), want.advantages)
    many = arrow.compute_advantages(pa.Table.from_batches(t.to_batches(max_chunksize=7)), **kw)
    assert many.column("advantages").num_chunks == 9
    np.testing.assert_allclose(flat(many.column("advantages")), want.advantages, rtol=1e-5, atol=1e-6)
    # per-chunk normalization would differ visibly: the moments really span the column
    per_chunk = np.concatenate(
        [
            flat(arrow.compute_advantages(pa.Table.from_batches([b]), **kw).column("advantages"))
            for b in t.to_batches(max_chunksize=7)
        ]
    )
    assert np.max(np.abs(per_chunk - want.advantages)) > 1e-3


def test_concentration_moments_merge() -> None:
    d = packed_batch(16, 50, 30, np.float64)
    t = table_of(d)
    whole = arrow.concentration_moments(t)
    parts = arrow.ConcentrationMoments()
    for b in t.to_batches(max_chunksize=9):
        parts = parts.merge(arrow.concentration_moments(b))
    valid = d["concentration"][d["mask"]]
    for m in (whole, parts):
        assert m.n == valid.size
        assert m.mean == pytest.approx(valid.mean(), rel=1e-13)
        assert m.m2 / m.n == pytest.approx(valid.var(), rel=1e-12)
        assert (m.min, m.max) == (valid.min(), valid.max())
    flat_m = arrow.ConcentrationMoments.of(np.full(4, 0.25))
    assert flat_m.flat and flat_m.gate_args(2.0)["sharpness"] == 0.0


# --------------------------------------------------------------------------- #
# Errors
# --------------------------------------------------------------------------- #


def test_null_row_and_null_value_name_the_column_and_row() -> None:
    r = pa.array([[0.0, 1.0], [0.5], None, [1.0]], pa.list_(pa.float32()))
    ok = pa.array([[0.0, 1.0], [0.5], [], [1.0]], pa.list_(pa.float32()))
    with pytest.raises(cc.NonFiniteError, match=r"column 'rewards': expected a list in every row, got null at row 2"):
        arrow.gae(r, ok)
    v = pa.array([[0.0, 1.0], [0.5], [], [None]], pa.list_(pa.float32()))
    with pytest.raises(
        cc.NonFiniteError, match=r"column 'values': expected no null values, got null at \(row 3, position 0\)"
    ):
        arrow.gae(ok, v)
    # a null outside a slice does not matter; the row index counts within the slice
    assert len(arrow.gae(ok.slice(0, 3), v.slice(0, 3)).advantages) == 3
    t = pa.table({"rewards": ok, "values": v})
    with pytest.raises(cc.NonFiniteError, match=r"\(row 1003, position 0\)"):
        arrow.compute_advantages(t, row_offset=1000)


def test_nan_row_index_counts_across_chunks() -> None:
    d = packed_batch(17, 30, 10, min_len=2)
    values = d["values"].copy()
    values[d["cu"][21] + 1] = np.nan
    d["mask"][:] = True
    t = table_of({**d, "values": values})
    t = pa.Table.from_batches(t.to_batches(max_chunksize=8))
    with pytest.raises(
        cc.NonFiniteError,
        match=r"^column 'values': expected finite values at valid positions, got NaN at \(row 21, position 1\)$",
    ):
        arrow.compute_advantages(t)
    t2 = t.rename_columns(["rewards", "V", "mask", "gates", "concentration", "last_values"])
    with pytest.raises(cc.NonFiniteError, match=r"column 'V' \(values\): .*\(row 21, position 1\)"):
        arrow.compute_advantages(t2, values_col="V")


def test_bad_offsets() -> None:
    bad = pa.Array.from_buffers(
        pa.list_(pa.float32()),
        3,
        [None, pa.py_buffer(np.array([0, 4, 2, 6], np.int32))],
        children=[pa.array(np.zeros(6, np.float32))],
    )
    with pytest.raises(
        cc.LayoutError,
        match=r"column 'rewards': expected non-decreasing list offsets, got row 1 ending at 2 before its start 4",
    ):
        arrow.gae(bad, bad)


def test_row_lengths_must_match_the_rewards() -> None:
    r = pa.array([[0.0], [0.0, 1.0], [1.0]], pa.list_(pa.float32()))
    v = pa.array([[0.0], [0.0, 1.0, 2.0], [1.0]], pa.list_(pa.float32()))
    with pytest.raises(cc.ShapeError, match=r"column 'values': row 1 has 3 values but column 'rewards' has 2"):
        arrow.gae(r, v)
    with pytest.raises(cc.ShapeError, match=r"mask: expected 3 rows like rewards, got 2"):
        arrow.gae(r, r, mask=pa.array([[True], [True, True]]))
    t = pa.table({"rewards": r, "values": r, "mask": pa.array([[True], [True], [True]])})
    with pytest.raises(cc.ShapeError, match=r"column 'mask': row 1 has 1 values but column 'rewards' has 2"):
        arrow.compute_advantages(t)


def test_wrong_types_and_missing_columns() -> None:
    r = pa.array([[0.0], [1.0]], pa.list_(pa.float32()))
    with pytest.raises(
        cc.DTypeError,
        match=r"column 'values' \(values\): expected a list of float32 or float64.*got list<item: string>",
    ):
        arrow.compute_advantages(pa.table({"rewards": r, "values": pa.array([["a"], ["b"]])}))
    with pytest.raises(
        cc.DTypeError, match=r"column 'rewards' \(rewards\): expected a list of float32.*got list<item: int64>"
    ):
        arrow.compute_advantages(pa.table({"rewards": pa.array([[0], [1]]), "values": r}))
    with pytest.raises(cc.DTypeError, match=r"column 'rewards': expected a list of float32"):
        arrow.gae(pa.array([1.0, 2.0]), r)
    with pytest.raises(cc.DTypeError, match=r"column 'mask' \(mask\): expected a list of bool or integers"):
        arrow.compute_advantages(pa.table({"rewards": r, "values": r, "mask": r}))
    with pytest.raises(cc.DTypeError, match=r"rewards: expected a pyarrow Array or ChunkedArray, got ndarray"):
        arrow.gae(np.zeros(3), r)
    with pytest.raises(cc.ParameterError, match=r"column 'values' \(values\) not found \(columns: rewards, v\)"):
        arrow.compute_advantages(pa.table({"rewards": r, "v": r}))
    with pytest.raises(cc.ParameterError, match=r"column 'g' \(gates\) not found"):
        arrow.compute_advantages(pa.table({"rewards": r, "values": r}), gates_col="g")
    with pytest.raises(cc.ParameterError, match=r"give one of them"):
        arrow.compute_advantages(pa.table({"rewards": r, "values": r}), gates_col="rewards", concentration_col="values")
    with pytest.raises(cc.ParameterError, match=r"expected two different names"):
        arrow.compute_advantages(pa.table({"rewards": r, "values": r}), advantages_col="x", returns_col="x")


def test_bad_values_mask_gates_and_last_values() -> None:
    r = pa.array([[0.0, 0.0], [0.0, 1.0]], pa.list_(pa.float32()))
    t = pa.table({"rewards": r, "values": r, "mask": pa.array([[1, 1], [1, 2]], pa.list_(pa.int8()))})
    with pytest.raises(cc.OutOfRangeError, match=r"column 'mask': expected 0 or 1, got 2 at \(row 1, position 1\)"):
        arrow.compute_advantages(t)
    g = pa.array([[1.0, 1.0], [0.5, 1.5]], pa.list_(pa.float32()))
    with pytest.raises(
        cc.OutOfRangeError, match=r"column 'g' \(gates\): expected values in \[0, 1\], got 1.5 at \(row 1, position 1\)"
    ):
        arrow.compute_advantages(pa.table({"rewards": r, "values": r, "g": g}), gates_col="g")
    lv = pa.array([0.0, None])
    with pytest.raises(
        cc.NonFiniteError, match=r"column 'last_values': expected a value in every row, got null at row 1"
    ):
        arrow.compute_advantages(pa.table({"rewards": r, "values": r, "last_values": lv}))
    with pytest.raises(cc.ParameterError, match=r"column 'last_values': expected finite values, got NaN at row 5"):
        arrow.compute_advantages(
            pa.table({"rewards": r, "values": r, "last_values": [0.0, float("nan")]}), row_offset=4
        )
    masked = pa.table({"rewards": r, "values": r, "mask": pa.array([[True, True], [True, False]])})
    with pytest.raises(
        cc.MaskedRewardError, match=r"column 'rewards': expected 0 at masked positions, got 1 at \(row 1, position 1\)"
    ):
        arrow.compute_advantages(masked)
    assert arrow.compute_advantages(masked, masked_rewards="drop").column("advantages").to_pylist() == [
        [0.0, 0.0],
        [0.0, 0.0],
    ]
    with pytest.raises(cc.ParameterError, match=r"gamma: expected a number in \[0, 1\], got 2.0"):
        arrow.compute_advantages(pa.table({"rewards": r, "values": r}), gamma=2.0)
    c = pa.array([[0.1, float("inf")], [0.2, 0.3]], pa.list_(pa.float32()))
    with pytest.raises(
        cc.NonFiniteError,
        match=r"column 'c' \(concentration\): expected finite values at valid positions, got inf at \(row 0, position 1\)",
    ):
        arrow.compute_advantages(pa.table({"rewards": r, "values": r, "c": c}), concentration_col="c")
    cc2 = pa.chunked_array([c.slice(0, 1), c.slice(1)])
    with pytest.raises(cc.NonFiniteError, match=r"got inf at \(row 0, position 1\)"):
        arrow.compute_advantages(
            pa.table({"rewards": r, "values": r, "c": cc2}),
            concentration_col="c",
            gate_params=GateParams(normalize="batch"),
        )


def test_batch_across_chunks_with_a_floor() -> None:
    """``GateParams.min_spread`` reaches the batch z-score over every chunk (the moments are merged,
    then floored): equal to the kernel's over the flattened rows, and near-constant rows stay near the
    midpoint."""
    rng = np.random.default_rng(0)
    rows = [list(8e-5 + 6e-5 * rng.random(int(n))) for n in rng.integers(1, 30, 20)]
    col = pa.chunked_array([pa.array(rows[:7], pa.list_(pa.float64())), pa.array(rows[7:], pa.list_(pa.float64()))])
    flat = np.concatenate([np.asarray(r) for r in rows])
    cu = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    for floor in (0.0, 1e-3):
        p = cc.GateParams(low=0.0, high=1.0, normalize="batch", min_spread=floor)
        got = np.concatenate([np.asarray(x) for x in arrow.gates_from_concentration(col, params=p).to_pylist()])
        np.testing.assert_allclose(got, cc.gates_from_concentration(flat, cu_seqlens=cu, params=p), rtol=0, atol=1e-12)
    assert np.abs(got - 0.5).max() < 0.02  # the floor keeps these near-constant rows at the midpoint
