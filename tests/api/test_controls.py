"""Gate controls (docs/design.md §4): ``controls.shuffle`` (seeded per-row permutation of the
valid gates), ``controls.by_position`` (batch mean gate at each valid-position index)
and ``controls.constant`` (batch mean gate), against their definitions and
``comppo_core.reference.controls``, in both layouts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import comppo_core as cc
from comppo_core import reference
from comppo_core.testing.strategies import RaggedBatch, assert_unchanged, ragged_batches

CONTROLS: dict[str, tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]]] = {
    "shuffle": (cc.controls.shuffle, reference.controls.shuffle),
    "by_position": (cc.controls.by_position, reference.controls.by_position),
    "constant": (cc.controls.constant, reference.controls.constant),
}


def gate_batches() -> st.SearchStrategy[RaggedBatch]:
    """Ragged gate batches; junk (NaN, ±inf, out of range) at masked positions sometimes."""
    return ragged_batches(gates=True)


def valid_rows(g: np.ndarray, valid: np.ndarray) -> list[np.ndarray]:
    return [g[b][valid[b]].astype(np.float64) for b in range(g.shape[0])]


def mean_tol(dtype: np.dtype) -> dict[str, Any]:
    if dtype == np.float64:
        return {"rtol": 1e-12, "atol": 1e-15}
    if dtype == np.float32:
        return {"rtol": 1e-6, "atol": 1e-7}
    return {"rtol": 1e-3, "atol": 1e-4}


def shuffle_by_definition(g: np.ndarray, valid: np.ndarray, seed: int) -> np.ndarray:
    """keys = default_rng(seed).random(#valid) in row-major order; each row's valid gates
    reordered by ascending key."""
    keys = np.random.default_rng(seed).random(int(valid.sum()))
    out = g.copy()
    used = 0
    for b in range(g.shape[0]):
        cols = np.flatnonzero(valid[b])
        k = keys[used : used + cols.size]
        used += cols.size
        out[b, cols] = g[b, cols][np.argsort(k)]
    return out


# --------------------------------------------------------------------------- #
# Worked examples
# --------------------------------------------------------------------------- #

GATES = np.array([[0.9, 0.5, np.nan, 0.7], [0.1, 0.2, 0.3, 0.4], [0.6, 7.0, 0.8, 1.0]])
MASK = np.array([[1, 1, 0, 1], [1, 1, 1, 1], [1, 0, 1, 0]])


def test_by_position_by_hand() -> None:
    got = cc.controls.by_position(GATES, mask=MASK)
    # valid-position index 0: (0.9, 0.1, 0.6); 1: (0.5, 0.2, 0.8); 2: (0.7, 0.3); 3: (0.4,)
    m0, m1, m2, m3 = (0.9 + 0.1 + 0.6) / 3, (0.5 + 0.2 + 0.8) / 3, (0.7 + 0.3) / 2, 0.4
    want = np.array([[m0, m1, np.nan, m2], [m0, m1, m2, m3], [m0, 7.0, m1, 1.0]])
    np.testing.assert_allclose(got, want, rtol=1e-15)
    np.testing.assert_allclose(cc.controls.by_position(GATES[1:2]), GATES[1:2], rtol=0)


def test_constant_by_hand() -> None:
    got = cc.controls.constant(GATES, mask=MASK)
    mean = np.mean([0.9, 0.5, 0.7, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8])
    want = np.where(MASK == 1, mean, GATES)
    np.testing.assert_allclose(got, want, rtol=1e-15)
    assert np.isnan(got[0, 2]) and got[2, 1] == 7.0 and got[2, 3] == 1.0


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_shuffle_by_definition(seed: int) -> None:
    got = cc.controls.shuffle(GATES, mask=MASK, seed=seed)
    want = shuffle_by_definition(GATES, MASK != 0, seed)
    assert got.tobytes() == want.tobytes()


def test_default_seed_is_zero() -> None:
    assert cc.controls.shuffle(GATES, mask=MASK).tobytes() == cc.controls.shuffle(GATES, mask=MASK, seed=0).tobytes()


# --------------------------------------------------------------------------- #
# Against the reference, both layouts
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", sorted(CONTROLS))
@settings(max_examples=60)
@given(batch=gate_batches(), seed=st.integers(0, 2**32 - 1))
def test_matches_reference_both_layouts(name: str, batch: RaggedBatch, seed: int) -> None:
    fast, ref = CONTROLS[name]
    g = batch.gates
    assert g is not None
    kw: dict[str, Any] = {"seed": seed} if name == "shuffle" else {}
    before = batch.copies()

    got = fast(g, mask=batch.mask, **kw)
    want = ref(g, mask=batch.mask, **kw)
    assert got.dtype == g.dtype and got.shape == g.shape
    assert not np.shares_memory(got, g)
    if name == "shuffle":
        assert got.tobytes() == want.tobytes()
    else:
        np.testing.assert_allclose(got, want, **mean_tol(batch.dtype))
    # masked positions keep their input value, bit for bit (junk included)
    assert got[~batch.valid].tobytes() == g[~batch.valid].tobytes()

    flat = batch.pack(g)
    assert flat is not None
    pk = {"mask": batch.packed_mask, "cu_seqlens": batch.cu_seqlens}
    got_p = fast(flat, **pk, **kw)
    want_p = ref(flat, **pk, **kw)
    assert got_p.dtype == g.dtype and got_p.shape == flat.shape
    if name == "shuffle":
        assert got_p.tobytes() == want_p.tobytes()
    else:
        np.testing.assert_allclose(got_p, want_p, **mean_tol(batch.dtype))
    # the same valid tokens in the same order: the packed result is the padded one packed
    packed_from_padded = batch.pack(got)
    assert packed_from_padded is not None
    assert got_p.tobytes() == packed_from_padded.tobytes()
    assert_unchanged(before, batch.copies())


@given(batch=gate_batches(), seed=st.integers(0, 2**32 - 1))
def test_controls_keep_what_they_promise(batch: RaggedBatch, seed: int) -> None:
    """shuffle: each row's multiset of valid gates, deterministic; by_position: equal
    across rows at equal valid index, = the mean there; constant: the batch mean."""
    g = batch.gates
    assert g is not None
    tol = mean_tol(batch.dtype)
    rows_in = valid_rows(g, batch.valid)

    got = cc.controls.shuffle(g, mask=batch.mask, seed=seed)
    for row_in, row_out in zip(rows_in, valid_rows(got, batch.valid)):
        np.testing.assert_array_equal(np.sort(row_out), np.sort(row_in))
    assert got.tobytes() == shuffle_by_definition(g, batch.valid, seed).tobytes()
    assert cc.controls.shuffle(g, mask=batch.mask, seed=seed).tobytes() == got.tobytes()

    got = cc.controls.by_position(g, mask=batch.mask)
    rows_out = valid_rows(got, batch.valid)
    for k in range(max((r.size for r in rows_in), default=0)):
        at_k = [r[k] for r in rows_out if r.size > k]
        assert len(set(at_k)) == 1, f"rows differ at valid index {k}"
        np.testing.assert_allclose(at_k[0], np.mean([r[k] for r in rows_in if r.size > k]), **tol)

    got = cc.controls.constant(g, mask=batch.mask)
    vals = g[batch.valid].astype(np.float64)
    out = got[batch.valid]
    if vals.size:
        assert (out == out[0]).all()
        np.testing.assert_allclose(float(out[0]), vals.mean(), **tol)
    assert got[~batch.valid].tobytes() == g[~batch.valid].tobytes()


def test_shuffle_seeds() -> None:
    rng = np.random.default_rng(7)
    g = rng.random((4, 10))
    m = rng.random((4, 10)) < 0.8
    m[:, :6] = True  # every row has >= 6 distinct valid values
    outs = [cc.controls.shuffle(g, mask=m, seed=s) for s in range(20)]
    # same seed, same output; different seeds differ (overwhelmingly likely; fixed data)
    assert cc.controls.shuffle(g, mask=m, seed=3).tobytes() == outs[3].tobytes()
    assert len({o.tobytes() for o in outs}) == 20
    # the order of each row with >= 5 distinct values changes for most seeds
    for b in range(4):
        changed = sum(not np.array_equal(o[b][m[b]], g[b][m[b]]) for o in outs)
        assert changed >= 17, (b, changed)
    # masked positions untouched
    for o in outs:
        np.testing.assert_array_equal(o[~m], g[~m])


@pytest.mark.parametrize("n", [5, 6, 9])
def test_shuffle_changes_order_for_most_seeds(n: int) -> None:
    """A row of n >= 5 distinct values: the identity permutation has probability
    <= 1/120 per seed, so nearly all of 100 seeds reorder it (fixed data and seeds)."""
    g = np.random.default_rng(n).permutation(np.linspace(0.1, 0.9, n))[None, :]
    changed = sum(not np.array_equal(cc.controls.shuffle(g, seed=s), g) for s in range(100))
    assert changed >= 95


# --------------------------------------------------------------------------- #
# dtypes, inputs, edge cases, errors
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", sorted(CONTROLS))
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64, np.uint8, np.bool_])
def test_dtype(name: str, dtype: Any) -> None:
    fast, ref = CONTROLS[name]
    rng = np.random.default_rng(5)
    g = (rng.random((3, 7)) * (4 if np.dtype(dtype).kind in "iu" else 1)).astype(dtype)
    m = rng.random((3, 7)) < 0.7
    before = g.copy()
    got = fast(g, mask=m)
    want = ref(g, mask=m)
    want_dtype = np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float64)
    assert got.dtype == want.dtype == want_dtype
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **mean_tol(want_dtype))
    assert g.tobytes() == before.tobytes()


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_non_contiguous_inputs(name: str) -> None:
    fast, ref = CONTROLS[name]
    rng = np.random.default_rng(11)
    for g, m in (
        (rng.random((10, 14))[::2, ::2], (rng.random((10, 14)) < 0.7)[::2, ::2]),
        (np.asfortranarray(rng.random((5, 7))), np.asfortranarray(rng.random((5, 7)) < 0.7)),
    ):
        before = g.copy()
        got = fast(g, mask=m)
        assert got.flags.c_contiguous and got.shape == g.shape
        np.testing.assert_array_equal(got, fast(np.ascontiguousarray(g), mask=np.ascontiguousarray(m)))
        np.testing.assert_allclose(got, ref(g, mask=m), rtol=1e-12)
        np.testing.assert_array_equal(g, before)


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_no_valid_token_and_empty_batches(name: str) -> None:
    fast, ref = CONTROLS[name]
    g = np.array([[0.2, np.nan], [0.4, 0.5]])
    m = np.zeros((2, 2))
    for args, kw in (
        ((g,), {"mask": m}),
        ((np.zeros((0, 3)),), {}),
        ((np.zeros(0),), {"cu_seqlens": [0, 0, 0]}),
        ((np.array([0.3, 0.1]),), {"cu_seqlens": [0, 0, 2, 2]}),
    ):
        got = fast(*args, **kw)
        want = ref(*args, **kw)
        assert got.tobytes() == want.tobytes() and got.shape == args[0].shape
        assert not np.shares_memory(got, args[0])


@pytest.mark.parametrize("name", sorted(CONTROLS))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_at_valid_position(name: str, bad: float) -> None:
    fast, _ = CONTROLS[name]
    g = np.array([[0.5, np.nan, 0.5], [0.5, 0.5, bad]])
    m = np.array([[1, 0, 1], [1, 1, 1]])
    with pytest.raises(cc.NonFiniteError, match=r"row 1, position 2") as ei:
        fast(g, mask=m)
    assert "gates" in str(ei.value)
    with pytest.raises(cc.NonFiniteError, match=r"row 1, position 0"):
        fast(np.array([0.5, np.nan, bad, 0.2]), cu_seqlens=[0, 2, 4], mask=[1, 0, 1, 1])
    # NaN at a masked position is fine
    fast(g, mask=np.array([[1, 0, 1], [1, 1, 0]]))


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_layout_errors(name: str) -> None:
    fast, _ = CONTROLS[name]
    g = np.full((2, 3), 0.5)
    with pytest.raises(cc.ShapeError):
        fast(g.reshape(-1))  # 1-D without cu_seqlens
    with pytest.raises(cc.ShapeError, match="mask"):
        fast(g, mask=np.ones((3, 2)))
    with pytest.raises(cc.ShapeError):
        fast(g.reshape(-1), cu_seqlens=[0, 4, 5])  # does not end at N
    with pytest.raises(cc.ShapeError):
        fast(g.reshape(-1), cu_seqlens=[0, 4, 2, 6])  # decreasing
    with pytest.raises(cc.ShapeError):
        fast(g.reshape(-1), cu_seqlens=[1, 6])  # not starting at 0
    with pytest.raises(cc.DTypeError):
        fast(np.array([["a", "b"]]))
