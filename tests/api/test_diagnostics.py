"""credit_stats (docs/design.md §5): the per-batch numbers a training loop logs for a per-token
array, against the formulas of docs/design.md §5 (brute-force Gini double sum, entropy ratio), worked
examples and ``comppo_core.reference``, in both layouts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import comppo_core as cc
from comppo_core import reference
from comppo_core.testing.strategies import RaggedBatch, assert_unchanged, ragged_batches

KEYS = {"mean", "std", "min", "max", "frac_positive", "gini", "effective_token_ratio"}
THREADS = (1, 2, 3)


def brute_gini(x: np.ndarray) -> float:
    """Σ_i Σ_j |a_i − a_j| / (2 n² mean(a)) with a = |x|; 0 when a ≡ 0."""
    a = np.abs(x.astype(np.float64))
    n = a.size
    if a.sum() == 0:
        return 0.0
    return float(np.abs(a[:, None] - a[None, :]).sum() / (2.0 * n * n * a.mean()))


def brute_ratio(x: np.ndarray) -> float:
    """exp(H(|x|/Σ|x|))/n, 0·log 0 = 0; 1 when |x| ≡ 0."""
    a = np.abs(x.astype(np.float64))
    if a.sum() == 0:
        return 1.0
    p = a / a.sum()
    p = p[p > 0]
    return float(math.exp(-(p * np.log(p)).sum()) / a.size)


def check_dict(d: Any) -> None:
    assert isinstance(d, dict)
    assert set(d) == KEYS
    for k, v in d.items():
        assert type(v) is float, f"{k}: {type(v).__name__}"


def test_worked_example() -> None:
    d = cc.credit_stats(np.array([[1.0, -3.0, 7.0]]), mask=np.array([[1, 1, 0]]))
    check_dict(d)
    assert d["mean"] == -1.0 and d["std"] == 2.0
    assert d["min"] == -3.0 and d["max"] == 1.0
    assert d["frac_positive"] == 0.5
    assert abs(d["gini"] - 0.25) < 1e-15
    want = math.exp(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))) / 2
    assert abs(d["effective_token_ratio"] - want) < 1e-15
    # packed: the same two valid values, and a masked junk NaN
    dp = cc.credit_stats(np.array([1.0, np.nan, -3.0]), cu_seqlens=[0, 2, 3], mask=[1, 0, 1])
    for k in KEYS:
        assert abs(dp[k] - d[k]) < 1e-15, k


@pytest.mark.parametrize("n", [1, 2, 3, 7, 50])
@pytest.mark.parametrize("value", [3.0, -0.5, 1e-300])
def test_one_hot_credit(n: int, value: float) -> None:
    x = np.zeros((1, n + 2))
    x[0, n // 2] = value
    x[0, n:] = np.nan  # two masked junk positions
    m = np.zeros((1, n + 2), dtype=bool)
    m[0, :n] = True
    d = cc.credit_stats(x, mask=m)
    check_dict(d)
    assert abs(d["gini"] - (1.0 - 1.0 / n)) < 1e-12
    assert abs(d["effective_token_ratio"] - 1.0 / n) < 1e-12
    assert d["frac_positive"] == (1.0 / n if value > 0 else 0.0)


@pytest.mark.parametrize("n", [1, 2, 5, 64])
def test_even_and_all_zero_credit(n: int) -> None:
    for x in (np.full((1, n), 2.5), np.where(np.arange(n) % 2 == 0, 1.5, -1.5)[None, :]):
        d = cc.credit_stats(x)
        assert abs(d["gini"]) < 1e-12
        assert abs(d["effective_token_ratio"] - 1.0) < 1e-12
    d = cc.credit_stats(np.zeros((2, n)))
    check_dict(d)
    assert d["gini"] == 0.0 and d["effective_token_ratio"] == 1.0
    assert d["mean"] == 0.0 and d["std"] == 0.0 and d["frac_positive"] == 0.0
    assert d["min"] == 0.0 and d["max"] == 0.0


def stats_tol(vals: np.ndarray, dtype: np.dtype) -> tuple[float, float]:
    scale = 1.0 + float(np.abs(vals).max()) if vals.size else 1.0
    return 1e-9, 1e-12 * scale


@given(batch=st.one_of(ragged_batches(), ragged_batches(max_rows=3, max_len=40)))
def test_matches_reference_and_formulas_both_layouts(batch: RaggedBatch) -> None:
    x = batch.values  # junk (NaN, ±inf) at masked positions sometimes
    vals = x[batch.valid].astype(np.float64)
    before = batch.copies()
    flat = batch.pack(x)
    assert flat is not None
    pk = {"mask": batch.packed_mask, "cu_seqlens": batch.cu_seqlens}
    if vals.size == 0:
        with pytest.raises(cc.ParameterError, match="at least 1"):
            cc.credit_stats(x, mask=batch.mask)
        with pytest.raises(cc.ParameterError, match="at least 1"):
            cc.credit_stats(flat, **pk)
        return
    d = cc.credit_stats(x, mask=batch.mask)
    dp = cc.credit_stats(flat, **pk)
    want = reference.credit_stats(x, mask=batch.mask)
    check_dict(d)
    check_dict(dp)
    rtol, atol = stats_tol(vals, batch.dtype)
    for k in KEYS:
        assert math.isclose(d[k], want[k], rel_tol=rtol, abs_tol=atol), (k, d[k], want[k])
        assert math.isclose(dp[k], d[k], rel_tol=rtol, abs_tol=atol), (k, dp[k], d[k])
    # the formulas of docs/design.md §5, brute force
    assert math.isclose(d["gini"], brute_gini(vals), rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(d["effective_token_ratio"], brute_ratio(vals), rel_tol=1e-9, abs_tol=1e-12)
    assert d["min"] == vals.min() and d["max"] == vals.max()
    assert d["frac_positive"] == np.count_nonzero(vals > 0) / vals.size
    assert math.isclose(d["mean"], vals.mean(), rel_tol=1e-9, abs_tol=atol)
    assert math.isclose(d["std"], vals.std(), rel_tol=1e-9, abs_tol=atol)  # population std
    assert -1e-12 <= d["gini"] <= 1.0 - 1.0 / vals.size + 1e-12  # rounding noise around 0
    assert 1.0 / vals.size - 1e-12 <= d["effective_token_ratio"] <= 1.0 + 1e-12
    assert_unchanged(before, batch.copies())


@given(
    n=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["normal", "sparse", "ties", "heavy"]),
)
def test_gini_equals_brute_force_double_sum(n: int, seed: int, kind: str) -> None:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.normal(size=n)
    elif kind == "sparse":
        x = rng.normal(size=n) * (rng.random(n) < 0.2)
    elif kind == "ties":
        x = rng.integers(-3, 4, size=n).astype(np.float64)
    else:
        x = rng.standard_cauchy(size=n)
    d = cc.credit_stats(x[None, :])
    assert math.isclose(d["gini"], brute_gini(x), rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(d["effective_token_ratio"], brute_ratio(x), rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64, np.int8, np.bool_])
def test_input_dtypes(dtype: Any) -> None:
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(4, 6)) * 3).astype(dtype)
    m = rng.random((4, 6)) < 0.6
    m[0, 0] = True
    d = cc.credit_stats(x, mask=m)
    check_dict(d)
    want = reference.credit_stats(x, mask=m)
    for k in KEYS:
        assert math.isclose(d[k], want[k], rel_tol=1e-6, abs_tol=1e-6), (k, d[k], want[k])


def test_non_contiguous_inputs() -> None:
    rng = np.random.default_rng(8)
    x = rng.normal(size=(10, 14))[::2, ::2]
    m = (rng.random((10, 14)) < 0.7)[::2, ::2]
    d = cc.credit_stats(x, mask=m)
    assert d == cc.credit_stats(np.ascontiguousarray(x), mask=np.ascontiguousarray(m))
    want = reference.credit_stats(x, mask=m)
    for k in KEYS:
        assert math.isclose(d[k], want[k], rel_tol=1e-9, abs_tol=1e-12), k
    xf = np.asfortranarray(rng.normal(size=(4, 9)))
    assert cc.credit_stats(xf) == cc.credit_stats(np.ascontiguousarray(xf))


def test_errors() -> None:
    with pytest.raises(cc.ParameterError, match="at least 1"):
        cc.credit_stats(np.ones((2, 3)), mask=np.zeros((2, 3)))
    with pytest.raises(cc.ParameterError, match="at least 1"):
        cc.credit_stats(np.zeros((0, 3)))
    with pytest.raises(cc.ParameterError, match="at least 1"):
        cc.credit_stats(np.zeros(0), cu_seqlens=[0])
    for bad in (np.nan, np.inf, -np.inf):
        x = np.array([[1.0, np.nan, 2.0], [3.0, 4.0, bad]])
        m = np.array([[1, 0, 1], [1, 1, 1]])
        with pytest.raises(cc.NonFiniteError, match=r"row 1, position 2"):
            cc.credit_stats(x, mask=m)
        with pytest.raises(cc.NonFiniteError, match=r"row 1, position 1"):
            cc.credit_stats(np.array([1.0, 2.0, 3.0, bad]), cu_seqlens=[0, 2, 4])
    with pytest.raises(cc.ShapeError):
        cc.credit_stats(np.ones(3))  # 1-D needs cu_seqlens
    with pytest.raises(cc.ShapeError, match="mask"):
        cc.credit_stats(np.ones((2, 3)), mask=np.ones((3, 2)))
    with pytest.raises(cc.DTypeError):
        cc.credit_stats(np.array([["a"]]))


def test_thread_count_invariance(restore_threads: int) -> None:
    """300 × 700 (>= 32768 positions: the parallel moments and sort), padded and packed."""
    rng = np.random.default_rng(4)
    b, t = 300, 700
    lengths = rng.integers(0, t + 1, size=b)
    valid = np.arange(t)[None, :] < lengths[:, None]
    x = rng.normal(size=(b, t)) * (rng.random((b, t)) < 0.5)  # many exact zeros, ties
    x[~valid] = np.nan
    cu = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.concatenate([x[i, : lengths[i]] for i in range(b)])
    cases: list[tuple[np.ndarray, dict[str, Any]]] = [
        (x, {"mask": valid}),
        (x.astype(np.float32), {"mask": valid}),
        (np.nan_to_num(x), {}),
        (flat, {"cu_seqlens": cu}),
    ]
    results: dict[int, list[dict[str, float]]] = {}
    for n in THREADS:
        cc.set_num_threads(n)
        results[n] = [cc.credit_stats(a, **kw) for a, kw in cases]
    for n in THREADS[1:]:
        for got, want in zip(results[n], results[THREADS[0]]):
            for k in KEYS:
                assert np.float64(got[k]).tobytes() == np.float64(want[k]).tobytes(), (n, k)
    want_ref = reference.credit_stats(x, mask=valid)
    for k in KEYS:
        assert math.isclose(results[1][0][k], want_ref[k], rel_tol=1e-9, abs_tol=1e-12), k
