"""One-step gated TD targets y_i = r_i + γ·g_i·V_{i+1} (docs/design.md §3): kernel == reference,
both layouts, worked examples, and y == the λ_critic = 0 return of Comp-GAE."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tolerance
from hypothesis import given

import comppo_core as cc
from comppo_core import reference
from comppo_core.testing.strategies import RaggedBatch, assert_unchanged, discounts, ragged_batches


def _td_kwargs(kw: dict[str, object]) -> dict[str, object]:
    return {k: kw[k] for k in ("mask", "gates", "last_values", "cu_seqlens") if k in kw}


@given(batch=ragged_batches(), gamma=discounts())
def test_td_targets_match_reference_both_layouts(batch: RaggedBatch, gamma: float) -> None:
    before = batch.copies()
    r, v, kw = batch.padded()
    got = cc.td_targets(r, v, gamma=gamma, **_td_kwargs(kw))  # type: ignore[arg-type]
    want = reference.td_targets(r, v, gamma=gamma, **_td_kwargs(kw))  # type: ignore[arg-type]
    assert got.dtype == want.dtype == batch.dtype and got.shape == r.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **tolerance(batch.dtype))
    assert not got[~batch.valid].any()

    rp, vp, kwp = batch.packed()
    packed = cc.td_targets(rp, vp, gamma=gamma, **_td_kwargs(kwp))  # type: ignore[arg-type]
    assert packed.shape == rp.shape and packed.dtype == batch.dtype
    np.testing.assert_array_equal(batch.unpack(packed), got)
    want_p = reference.td_targets(rp, vp, gamma=gamma, **_td_kwargs(kwp))  # type: ignore[arg-type]
    np.testing.assert_allclose(packed.astype(np.float64), want_p.astype(np.float64), **tolerance(batch.dtype))
    assert_unchanged(before, batch.arrays())


@given(batch=ragged_batches(dtypes=("float32", "float64")), gamma=discounts())
def test_td_targets_equal_reference_bit_for_bit(batch: RaggedBatch, gamma: float) -> None:
    """No sum is reassociated (each target is ``r + (γ·g)·V_next`` in float64, rounded
    once), so the kernel's four-position blocks and single steps both give the
    reference's bits."""
    r, v, kw = batch.padded()
    got = cc.td_targets(r, v, gamma=gamma, **_td_kwargs(kw))  # type: ignore[arg-type]
    want = reference.td_targets(r, v, gamma=gamma, **_td_kwargs(kw))  # type: ignore[arg-type]
    assert got.tobytes() == want.tobytes()


@given(batch=ragged_batches(dtypes="float16"), gamma=discounts())
def test_td_targets_float16(batch: RaggedBatch, gamma: float) -> None:
    r, v, kw = batch.padded()
    got = cc.td_targets(r, v, gamma=gamma, **_td_kwargs(kw))  # type: ignore[arg-type]
    want = reference.td_targets(r, v, gamma=gamma, **_td_kwargs(kw))  # type: ignore[arg-type]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **tolerance(np.dtype(np.float16)))


@given(batch=ragged_batches(dtypes="float64"), gamma=discounts(), lam=discounts())
def test_td_targets_are_lambda_zero_returns(batch: RaggedBatch, gamma: float, lam: float) -> None:
    """With λ_critic = 0, R_i = δ_i + V_i = r_i + γ·g_i·V_{i+1} = y_i."""
    r, v, kw = batch.padded()
    y = cc.td_targets(r, v, gamma=gamma, **_td_kwargs(kw))  # type: ignore[arg-type]
    _, ret = cc.gae(r, v, gamma=gamma, lam=lam, lam_critic=0.0, **kw)  # type: ignore[arg-type]
    # δ + V rounds twice, so not bitwise; values are O(10)
    np.testing.assert_allclose(ret, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_td_targets_worked_example_with_gates(dtype: type) -> None:
    r = np.array([[0.0, 0.0, 1.0]], dtype=dtype)
    v = np.array([[0.5, 0.25, 0.5]], dtype=dtype)
    g = np.array([[1.0, 0.5, 1.0]], dtype=dtype)
    # γ = 0.5, terminal:
    # y2 = 1 + (0.5·1)·0      = 1.0
    # y1 = 0 + (0.5·0.5)·V2   = 0.25·0.5 = 0.125
    # y0 = 0 + (0.5·1)·V1     = 0.5·0.25 = 0.125
    y = cc.td_targets(r, v, gates=g, gamma=0.5)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, [[0.125, 0.125, 1.0]])
    # packed, with a truncated bootstrap V_n = 2:  y2 = 1 + 0.5·2 = 2.0
    yp = cc.td_targets(r[0], v[0], gates=g[0], gamma=0.5, cu_seqlens=[0, 3], last_values=[2.0])
    np.testing.assert_array_equal(yp, [0.125, 0.125, 2.0])


def test_td_targets_skip_masked_and_ignore_masked_rewards() -> None:
    # mask [1, 0, 1]: y0 bootstraps from V2 (position 1 is skipped); a reward on the
    # masked token is not checked by td_targets (documented) and does not leak.
    r = np.array([[1.0, 5.0, 2.0]])
    v = np.array([[10.0, 99.0, 20.0]])
    m = np.array([[1, 0, 1]])
    g = np.array([[0.5, 0.3, 1.0]])
    # y0 = 1 + (0.5·0.5)·20 = 6;  y2 = 2 + (0.5·1)·4 = 4
    y = cc.td_targets(r, v, mask=m, gates=g, gamma=0.5, last_values=[4.0])
    np.testing.assert_array_equal(y, [[6.0, 0.0, 4.0]])


def test_td_targets_gamma_zero_is_reward() -> None:
    r = np.array([[0.25, -1.0, 3.0]])
    v = np.array([[7.0, 8.0, 9.0]])
    np.testing.assert_array_equal(cc.td_targets(r, v, gamma=0.0, last_values=[5.0]), r)


def test_td_targets_empty() -> None:
    assert cc.td_targets(np.zeros((0, 4)), np.zeros((0, 4))).shape == (0, 4)
    assert cc.td_targets(np.zeros(0, np.float32), np.zeros(0, np.float32), cu_seqlens=[0, 0]).dtype == np.float32
