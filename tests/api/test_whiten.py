"""Masked whitening over the valid tokens of a batch (docs/design.md §5), as verl's
``verl.utils.torch_functional.masked_whiten``: the kernel against a NumPy port of verl's
definition and against ``comppo_core.reference``, in both layouts, plus properties and
errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import comppo_core as cc
from comppo_core import reference
from comppo_core.testing.strategies import RaggedBatch, assert_unchanged, ragged_batches

THREADS = (1, 2, 3)


# --------------------------------------------------------------------------- #
# NumPy port of verl's masked_mean / masked_var / masked_whiten
# --------------------------------------------------------------------------- #


def verl_masked_mean(values: np.ndarray, mask: np.ndarray) -> float:
    return float((values * mask).sum() / mask.sum())


def verl_masked_var(values: np.ndarray, mask: np.ndarray, unbiased: bool = True) -> float:
    mean = verl_masked_mean(values, mask)
    centered_values = values - mean
    variance = verl_masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        if mask_sum == 0:
            raise ValueError("At least one element in the mask has to be 1.")
        if mask_sum == 1:
            raise ValueError("The sum of the mask is one, which can cause a division by zero.")
        variance = variance * (mask_sum / (mask_sum - 1))
    return float(variance)


def verl_masked_whiten(values: np.ndarray, mask: np.ndarray, shift_mean: bool = True, eps: float = 1e-8) -> np.ndarray:
    """verl hard-codes eps = 1e-8; ``eps`` is exposed here to test the parameter."""
    mean, var = verl_masked_mean(values, mask), verl_masked_var(values, mask)
    whitened = (values - mean) * (1.0 / np.sqrt(var + eps))  # torch.rsqrt
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# --------------------------------------------------------------------------- #
# Helpers
# --------------------------------------------------------------------------- #


def valid_stats(x: np.ndarray, valid: np.ndarray) -> tuple[int, float, float, float]:
    """(n, max |x|, mean, unbiased var) of the valid values, in float64."""
    v = x[valid].astype(np.float64)
    if v.size < 2:
        return v.size, 0.0, 0.0, 0.0
    return v.size, float(np.abs(v).max()), float(v.mean()), float(v.var(ddof=1))


def well_posed(x: np.ndarray, valid: np.ndarray, eps: float) -> bool:
    """At least 2 valid tokens, and var + eps not lost in rounding noise: with eps = 0 and
    (nearly) equal valid values, every implementation divides rounding noise by itself."""
    n, big, _, var = valid_stats(x, valid)
    return n >= 2 and var + eps > 1e-20 * (1.0 + big) ** 2


def whiten_tol(x: np.ndarray, valid: np.ndarray, eps: float, dtype: np.dtype) -> dict[str, Any]:
    """Two sums in different orders differ by rounding noise of the mean (~ulp(max|x|)),
    which whitening scales by 1/sqrt(var + eps)."""
    _, big, mean, var = valid_stats(x, valid)
    amp = (1.0 + big) / np.sqrt(var + eps)
    if np.dtype(dtype) == np.float64:
        return {"rtol": 1e-10, "atol": 1e-12 * amp + 1e-12 * abs(mean)}
    return {"rtol": 2e-6, "atol": 2e-6 * (1.0 + abs(mean)) + 1e-12 * amp}


def packed_args(batch: RaggedBatch, x: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    flat = batch.pack(x)
    assert flat is not None
    return flat, {"mask": batch.packed_mask, "cu_seqlens": batch.cu_seqlens}


# --------------------------------------------------------------------------- #
# Worked example
# --------------------------------------------------------------------------- #


def test_by_hand() -> None:
    # valid [1, 2, 3, 4]: μ 2.5, σ² = 5/3 (unbiased); junk (even NaN) at masked positions
    x = np.array([[1.0, 2.0, 99.0], [3.0, 4.0, np.nan]])
    m = np.array([[1, 1, 0], [1, 1, 0]])
    d = np.sqrt(5.0 / 3.0)
    got = cc.masked_whiten(x, mask=m, eps=0.0)
    np.testing.assert_allclose(got, [[-1.5 / d, -0.5 / d, 0.0], [0.5 / d, 1.5 / d, 0.0]], rtol=1e-15)
    assert got[0, 2] == 0.0 and got[1, 2] == 0.0
    got = cc.masked_whiten(x, mask=m, eps=0.0, shift_mean=False)
    np.testing.assert_allclose(
        got, [[-1.5 / d + 2.5, -0.5 / d + 2.5, 0.0], [0.5 / d + 2.5, 1.5 / d + 2.5, 0.0]], rtol=1e-15
    )
    # default eps = 1e-8
    got = cc.masked_whiten(x, mask=m)
    np.testing.assert_allclose(got[m == 1], np.array([-1.5, -0.5, 0.5, 1.5]) / np.sqrt(5.0 / 3.0 + 1e-8), rtol=1e-15)
    # packed, same data: sequences [1, 2, 99] and [3, 4], the 99 masked
    got_p = cc.masked_whiten(np.array([1.0, 2.0, 99.0, 3.0, 4.0]), cu_seqlens=[0, 3, 5], mask=[1, 1, 0, 1, 1], eps=0.0)
    np.testing.assert_allclose(got_p, [-1.5 / d, -0.5 / d, 0.0, 0.5 / d, 1.5 / d], rtol=1e-15)


def test_no_mask_means_every_token_valid() -> None:
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    np.testing.assert_array_equal(cc.masked_whiten(x), cc.masked_whiten(x, mask=np.ones((3, 4), dtype=bool)))
    np.testing.assert_allclose(cc.masked_whiten(x), verl_masked_whiten(x, np.ones((3, 4))), rtol=1e-12)


# --------------------------------------------------------------------------- #
# Against verl's definition and the reference
# --------------------------------------------------------------------------- #


@given(batch=ragged_batches(dtypes="float64"), shift_mean=st.booleans(), eps=st.sampled_from([1e-8, 0.0, 0.25]))
def test_matches_verl_port(batch: RaggedBatch, shift_mean: bool, eps: float) -> None:
    assume(well_posed(batch.values, batch.valid, eps))
    x = np.where(batch.valid, batch.values, 7.0)  # verl computes values * mask: finite junk only
    m = batch.valid.astype(np.float64)
    want = verl_masked_whiten(x, m, shift_mean=shift_mean, eps=eps)
    got = cc.masked_whiten(x, mask=batch.mask, shift_mean=shift_mean, eps=eps)
    np.testing.assert_allclose(
        got[batch.valid], want[batch.valid], **whiten_tol(x, batch.valid, eps, np.dtype(np.float64))
    )
    assert (got[~batch.valid] == 0).all()


@given(
    batch=st.one_of(ragged_batches(), ragged_batches(max_rows=3, max_len=40)),  # long rows: chunked sums with tails
    shift_mean=st.booleans(),
    eps=st.sampled_from([1e-8, 0.0, 0.25]),
)
def test_matches_reference_both_layouts(batch: RaggedBatch, shift_mean: bool, eps: float) -> None:
    x = batch.values  # junk (NaN, ±inf) at masked positions sometimes
    n = int(batch.valid.sum())
    before = batch.copies()
    kw: dict[str, Any] = {"shift_mean": shift_mean, "eps": eps}
    if n < 2:
        with pytest.raises(cc.ParameterError, match="at least 2"):
            cc.masked_whiten(x, mask=batch.mask, **kw)
        flat, pk = packed_args(batch, x)
        with pytest.raises(cc.ParameterError, match="at least 2"):
            cc.masked_whiten(flat, **pk, **kw)
        return
    assume(well_posed(x, batch.valid, eps))
    got = cc.masked_whiten(x, mask=batch.mask, **kw)
    want = reference.masked_whiten(x, mask=batch.mask, **kw)
    assert got.dtype == batch.dtype and got.shape == x.shape
    tol = whiten_tol(x, batch.valid, eps, batch.dtype)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **tol)
    assert (got[~batch.valid] == 0).all()
    assert np.isfinite(got).all()

    flat, pk = packed_args(batch, x)
    got_p = cc.masked_whiten(flat, **pk, **kw)
    want_p = reference.masked_whiten(flat, **pk, **kw)
    assert got_p.dtype == batch.dtype and got_p.shape == flat.shape
    np.testing.assert_allclose(got_p.astype(np.float64), want_p.astype(np.float64), **tol)
    # the packed call sees the same valid values in the same rows (summed in chunks
    # that may fall differently): the same numbers up to rounding
    np.testing.assert_allclose(batch.unpack(got_p).astype(np.float64), got.astype(np.float64), **tol)

    # eps = 0: the valid outputs have mean 0 (the input mean with shift_mean=False) and
    # unbiased std 1
    _, big, mean, var = valid_stats(x, batch.valid)
    if var > 1e-6 * (1.0 + big) ** 2:
        w = cc.masked_whiten(x, mask=batch.mask, eps=0.0, shift_mean=shift_mean)[batch.valid].astype(np.float64)
        mtol = 1e-9 if batch.dtype == np.float64 else 1e-4
        assert abs(w.mean() - (0.0 if shift_mean else mean)) <= mtol * (1.0 + abs(mean))
        assert abs(w.std(ddof=1) - 1.0) <= mtol
    assert_unchanged(before, batch.copies())


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64, np.int32, np.bool_])
def test_output_dtype(dtype: Any) -> None:
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(3, 5)) * 4).astype(dtype)
    m = rng.random((3, 5)) < 0.7
    m[0, :2] = True
    want_dtype = np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float64)
    got = cc.masked_whiten(x, mask=m)
    want = reference.masked_whiten(x, mask=m)
    assert got.dtype == want.dtype == want_dtype
    tol = 2e-3 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    assert (got[~m] == 0).all()


@pytest.mark.parametrize("value", [0.0, 1.0, -2.5, 0.1, 8.04548048])
def test_equal_values_whiten_to_zero(value: float) -> None:
    """All valid values equal: the default eps gives 0 at every valid token."""
    x = np.full((3, 4), value)
    m = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 1]])
    got = cc.masked_whiten(x, mask=m)
    np.testing.assert_allclose(got, 0.0, atol=1e-10 * (1 + abs(value)))
    assert (got[m == 0] == 0).all()


@pytest.mark.parametrize("value", [0.0, 1.0, 8.04548048])
def test_zero_variance_with_eps_zero_is_not_a_silent_nan(value: float) -> None:
    """eps = 0 is accepted, so zero variance over the valid tokens must not come back as
    NaN at every valid position (docs/design.md §8: never return garbage silently): either a
    clear ComppoError or finite values (0, as group_advantages does for equal scores)."""
    x = np.full((2, 3), value)
    try:
        got = cc.masked_whiten(x, eps=0.0)
    except cc.ComppoError:
        return
    assert np.isfinite(got).all(), got


def test_non_contiguous_inputs() -> None:
    rng = np.random.default_rng(6)
    for x, m in (
        (np.asfortranarray(rng.normal(size=(5, 7))), np.asfortranarray(rng.random((5, 7)) < 0.7)),
        (rng.normal(size=(10, 14))[::2, ::2], (rng.random((10, 14)) < 0.7)[::2, ::2]),
        (rng.normal(size=(7, 5)).T, rng.random((5, 7)) < 0.7),
    ):
        got = cc.masked_whiten(x, mask=m)
        np.testing.assert_array_equal(got, cc.masked_whiten(np.ascontiguousarray(x), mask=np.ascontiguousarray(m)))
        np.testing.assert_allclose(got, reference.masked_whiten(x, mask=m), rtol=1e-10, atol=1e-12)
    flat = rng.normal(size=40)[::2]
    got = cc.masked_whiten(flat, cu_seqlens=np.array([0, 5, 5, 20])[::1], mask=(rng.random(40) < 0.8)[::2])
    assert got.shape == (20,)


def test_nan_at_masked_position_is_fine() -> None:
    x = np.array([[1.0, np.nan, 3.0], [np.inf, 5.0, -np.inf]])
    m = np.array([[1, 0, 1], [0, 1, 0]])
    got = cc.masked_whiten(x, mask=m)
    want = reference.masked_whiten(x, mask=m)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert np.isfinite(got).all() and (got[m == 0] == 0).all()


# --------------------------------------------------------------------------- #
# Errors
# --------------------------------------------------------------------------- #


def test_fewer_than_two_valid_tokens() -> None:
    for x, kw in (
        (np.array([[1.0, 2.0, 3.0]]), {"mask": np.array([[0, 1, 0]])}),
        (np.array([[1.0, 2.0, 3.0]]), {"mask": np.zeros((1, 3))}),
        (np.array([[5.0]]), {}),
        (np.zeros((0, 4)), {}),
        (np.array([1.0, 2.0, 3.0]), {"cu_seqlens": [0, 1, 3], "mask": [0, 0, 1]}),
        (np.array([1.0]), {"cu_seqlens": [0, 1]}),
    ):
        with pytest.raises(cc.ParameterError, match="at least 2") as ei:
            cc.masked_whiten(x, **kw)  # type: ignore[arg-type]
        assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_at_valid_position_names_row_and_position(bad: float) -> None:
    x = np.array([[1.0, 2.0, np.nan, 4.0], [1.0, 2.0, bad, np.nan]])
    m = np.array([[1, 1, 0, 1], [1, 1, 1, 1]])
    with pytest.raises(cc.NonFiniteError, match=r"row 1, position 2") as ei:
        cc.masked_whiten(x, mask=m)
    assert "x" in str(ei.value)
    # packed: sequences [1, 2, NaN(masked), 4] and [bad, 5]
    xp = np.array([1.0, 2.0, np.nan, 4.0, bad, 5.0])
    with pytest.raises(cc.NonFiniteError, match=r"row 1, position 0"):
        cc.masked_whiten(xp, cu_seqlens=[0, 4, 6], mask=[1, 1, 0, 1, 1, 1])


def test_parameter_and_shape_errors() -> None:
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    with pytest.raises(cc.ParameterError, match="eps"):
        cc.masked_whiten(x, eps=-1e-8)
    with pytest.raises(cc.ParameterError, match="eps"):
        cc.masked_whiten(x, eps=float("inf"))
    with pytest.raises(cc.ShapeError, match="cu_seqlens"):
        cc.masked_whiten(x.reshape(-1))  # 1-D needs cu_seqlens
    with pytest.raises(cc.ShapeError, match="mask"):
        cc.masked_whiten(x, mask=np.ones((3, 2)))
    with pytest.raises(cc.ShapeError):
        cc.masked_whiten(x.reshape(-1), cu_seqlens=[0, 2, 5])  # does not end at N
    with pytest.raises(cc.ShapeError):
        cc.masked_whiten(x, cu_seqlens=[0, 3, 6])  # 2-D with cu_seqlens
    with pytest.raises(cc.DTypeError) as ei:
        cc.masked_whiten(np.array([["a", "b"]]))
    assert isinstance(ei.value, TypeError)


# --------------------------------------------------------------------------- #
# Thread-count invariance (the parallel path: >= 32768 positions)
# --------------------------------------------------------------------------- #


def big_batches() -> list[dict[str, Any]]:
    rng = np.random.default_rng(3)
    b, t = 300, 700
    lengths = rng.integers(0, t + 1, size=b)
    lengths[:3] = [t, 0, 1]
    valid = np.arange(t)[None, :] < lengths[:, None]
    x = rng.normal(loc=2.0, scale=3.0, size=(b, t))
    x[~valid] = np.nan  # junk where masked
    cu = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.concatenate([x[i, : lengths[i]] for i in range(b)])
    return [
        {"x": x, "mask": valid},
        {"x": x.astype(np.float32), "mask": valid.astype(np.uint8)},
        {"x": np.nan_to_num(x, nan=0.5)},
        {"x": flat, "cu_seqlens": cu},
        {"x": np.where(rng.random(flat.size) < 0.1, np.nan, flat), "cu_seqlens": cu, "mask": None},
    ]


def test_thread_count_invariance(restore_threads: int) -> None:
    cases = big_batches()
    cases[-1]["mask"] = np.isfinite(cases[-1]["x"])
    results: dict[int, list[bytes]] = {}
    for n in THREADS:
        cc.set_num_threads(n)
        assert cc.get_num_threads() == n
        outs = []
        for kw in cases:
            for shift_mean in (True, False):
                outs.append(cc.masked_whiten(**kw, shift_mean=shift_mean).tobytes())
        results[n] = outs
    for n in THREADS[1:]:
        assert results[n] == results[THREADS[0]], f"masked_whiten differs between 1 and {n} threads"


def test_big_batch_matches_reference(restore_threads: int) -> None:
    cc.set_num_threads(3)
    for kw in big_batches()[:1] + big_batches()[3:4]:
        got = cc.masked_whiten(**kw)
        want = reference.masked_whiten(**kw)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_out_buffer_is_filled_and_returned(dtype: Any) -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((5, 40)).astype(dtype)
    m = rng.random((5, 40)) < 0.7
    want = cc.masked_whiten(x, mask=m)
    out = np.full((5, 40), 7.0, dtype=dtype)
    got = cc.masked_whiten(x, mask=m, out=out)
    assert got is out
    np.testing.assert_array_equal(out, want)
    # packed layout, reused buffer
    lengths = m.sum(axis=1)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    flat = x[m]
    out_p = np.full(flat.shape, 7.0, dtype=dtype)
    assert cc.masked_whiten(flat, cu_seqlens=cu, out=out_p) is out_p
    np.testing.assert_array_equal(out_p, want[m])


def test_out_buffer_errors() -> None:
    x = np.ones((2, 3), dtype=np.float32)
    x[0, 0] = 2.0
    with pytest.raises(cc.ShapeError, match=r"out \(whitened\): expected shape \(2, 3\)"):
        cc.masked_whiten(x, out=np.empty((3, 2), np.float32))
    with pytest.raises(cc.DTypeError, match=r"out \(whitened\): expected dtype float32"):
        cc.masked_whiten(x, out=np.empty((2, 3), np.float64))
    with pytest.raises(cc.ShapeError, match="shares memory"):
        cc.masked_whiten(x, out=x[:])  # a view of x, not x itself: not in place
    with pytest.raises(cc.ShapeError, match="C-contiguous"):
        cc.masked_whiten(x, out=np.empty((3, 2), np.float32).T)
    torch = pytest.importorskip("torch")
    with pytest.raises(cc.DTypeError, match="NumPy arrays only"):
        cc.masked_whiten(torch.from_numpy(x), out=torch.empty(2, 3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shift_mean", [True, False])
def test_out_is_x_whitens_in_place(dtype: Any, shift_mean: bool) -> None:
    rng = np.random.default_rng(12)
    x = rng.standard_normal((6, 50)).astype(dtype)
    m = rng.random((6, 50)) < 0.6
    m[2, 7] = False
    want = cc.masked_whiten(x, mask=m, shift_mean=shift_mean)
    y = x.copy()
    y[2, 7] = np.nan  # masked NaN: the select form of the write pass
    assert cc.masked_whiten(y, mask=m, shift_mean=shift_mean, out=y) is y
    np.testing.assert_array_equal(y, want)
    # packed layout and a strided (non-contiguous) array
    cu = np.concatenate([[0], np.cumsum(m.sum(axis=1))])
    flat = x[m]
    want_packed = cc.masked_whiten(flat, cu_seqlens=cu, shift_mean=shift_mean)
    assert cc.masked_whiten(flat, cu_seqlens=cu, shift_mean=shift_mean, out=flat) is flat
    np.testing.assert_array_equal(flat, want_packed)
    big = np.zeros((6, 100), dtype=dtype)
    big[:, ::2] = x
    strided = big[:, ::2]
    cc.masked_whiten(strided, mask=m, shift_mean=shift_mean, out=strided)
    np.testing.assert_array_equal(strided, want)
    assert np.all(big[:, 1::2] == 0)


def test_out_is_x_errors() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    x.flags.writeable = False
    with pytest.raises(cc.ShapeError, match="read-only"):
        cc.masked_whiten(x, out=x)
    xi = np.arange(12).reshape(3, 4)
    with pytest.raises(cc.DTypeError, match="needs a float array"):
        cc.masked_whiten(xi, out=xi)
    np.testing.assert_array_equal(xi, np.arange(12).reshape(3, 4))
