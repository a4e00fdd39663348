"""Input handling (docs/design.md §2): memory layouts (strided, reversed, Fortran-order,
read-only), inputs never modified, ``out=`` buffers, dtypes and array kinds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import DLPackProducer
from hypothesis import given
from hypothesis import strategies as st

import comppo_core as cc
from comppo_core import reference
from comppo_core.testing.strategies import RaggedBatch, assert_unchanged, ragged_batches

VARIANTS = [
    "contiguous",
    "reversed",
    "fortran",
    "strided",
    "row_strided",
    "readonly",
    "readonly_reversed",
    "transposed",
]


def variant(x: np.ndarray | None, how: str) -> np.ndarray | None:
    """An array equal to ``x`` with another memory layout (1-D or 2-D)."""
    if x is None:
        return None
    x = np.asarray(x)
    if how == "contiguous":
        return x.copy()
    if how in ("reversed", "readonly_reversed"):
        y = x[..., ::-1].copy()[..., ::-1]
        if how == "readonly_reversed":
            y.flags.writeable = False
        return y
    if how == "fortran":
        return np.asfortranarray(x.copy())
    if how == "strided":
        big = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype)
        big[..., ::2] = x
        big[..., 1::2] = 1 if x.dtype == np.bool_ else 99  # junk in the gaps
        return big[..., ::2]
    if how == "row_strided":
        if x.ndim == 1:
            big = np.zeros((x.shape[0], 3), dtype=x.dtype)
            big[:, 1] = x
            return big[:, 1]
        big = np.ones((2 * x.shape[0], x.shape[1]), dtype=x.dtype)
        big[::2] = x
        return big[::2]
    if how == "readonly":
        y = x.copy()
        y.flags.writeable = False
        return y
    if how == "transposed":
        return x.T.copy().T
    raise AssertionError(how)


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, tuple):
        for x, y in zip(a, b):
            assert_same(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)
    assert a.flags.c_contiguous


NONE = cc.GateParams(normalize="none")


@given(batch=ragged_batches(), hows=st.lists(st.sampled_from(VARIANTS), min_size=6, max_size=6), packed=st.booleans())
def test_memory_layouts_give_identical_results(batch: RaggedBatch, hows: list[str], packed: bool) -> None:
    r, v, kw = batch.packed() if packed else batch.padded()
    base_gae = cc.gae(r, v, gamma=0.9, lam=0.7, **kw)
    base_td = cc.td_targets(r, v, gamma=0.9, **kw)
    base_g = (
        cc.gates_from_concentration(v, mask=kw["mask"], cu_seqlens=kw.get("cu_seqlens"), params=NONE)
        if batch.valid.all()
        else None
    )

    rv, vv = variant(r, hows[0]), variant(v, hows[1])
    kwv = {
        "mask": variant(kw["mask"], hows[2]),
        "gates": variant(kw["gates"], hows[3]),
        "last_values": variant(kw["last_values"], hows[4]),
    }
    if packed:
        kwv["cu_seqlens"] = variant(kw["cu_seqlens"], hows[5])
    arrays = [rv, vv, *kwv.values()]
    before = [None if a is None else a.copy() for a in arrays]
    assert_same(cc.gae(rv, vv, gamma=0.9, lam=0.7, **kwv), base_gae)
    assert_same(cc.td_targets(rv, vv, gamma=0.9, **kwv), base_td)
    if base_g is not None:
        g = cc.gates_from_concentration(vv, mask=kwv["mask"], cu_seqlens=kwv.get("cu_seqlens"), params=NONE)
        assert_same(g, base_g)
    assert_unchanged(before, arrays)


@pytest.mark.parametrize("how", VARIANTS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_memory_layouts_fixed_batch(how: str, dtype: type) -> None:
    rng = np.random.default_rng(0)
    B, T = 7, 33
    m = rng.random((B, T)) < 0.8
    r = np.where(m, rng.normal(size=(B, T)), 0).astype(dtype)
    v = rng.normal(size=(B, T)).astype(dtype)
    g = rng.random((B, T)).astype(dtype)
    lv = rng.normal(size=B)
    c = rng.normal(size=(B, T)).astype(dtype)
    want = cc.gae(r, v, mask=m, gates=g, last_values=lv, gamma=0.95, lam=0.9, lam_critic=1.0)
    want_td = cc.td_targets(r, v, mask=m, gates=g, last_values=lv, gamma=0.95)
    want_g = cc.gates_from_concentration(c, mask=m, params=cc.GateParams(low=0.5))

    args = [variant(a, how) for a in (r, v, m, g, lv, c)]
    before = [a.copy() for a in args]  # type: ignore[union-attr]
    rv, vv, mv, gv, lvv, cv = args
    got = cc.gae(rv, vv, mask=mv, gates=gv, last_values=lvv, gamma=0.95, lam=0.9, lam_critic=1.0)
    assert_same(got, want)
    assert_same(cc.td_targets(rv, vv, mask=mv, gates=gv, last_values=lvv, gamma=0.95), want_td)
    assert_same(cc.gates_from_concentration(cv, mask=mv, params=cc.GateParams(low=0.5)), want_g)
    assert_unchanged(before, args)  # type: ignore[arg-type]
    # and the oracle agrees
    ref = reference.gae(r, v, mask=m, gates=g, last_values=lv, gamma=0.95, lam=0.9, lam_critic=1.0)
    tol = 1e-12 if dtype == np.float64 else 1e-6 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(got.advantages.astype(float), ref[0].astype(float), rtol=tol, atol=tol)


# --------------------------------------------------------------------------- #
# out=
# --------------------------------------------------------------------------- #


def _data(dtype: Any = np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    r = np.array([[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]], dtype=dtype)
    v = np.array([[0.5, 0.25, 0.5, 3.0], [0.5, 0.5, 7.0, 1.0]], dtype=dtype)
    g = np.array([[1.0, 0.5, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=dtype)
    m = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=dtype)
    return r, v, g, m


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("packed", [False, True])
def test_out_buffers_filled_and_returned(dtype: type, packed: bool) -> None:
    r, v, g, m = _data(dtype)
    kw: dict[str, Any] = {"mask": m, "gates": g, "gamma": 0.5, "lam": 0.5, "last_values": [1.0, 2.0]}
    if packed:
        r, v = r.reshape(-1), v.reshape(-1)
        kw.update(mask=m.reshape(-1), gates=g.reshape(-1), cu_seqlens=[0, 4, 8])
    want = cc.gae(r, v, **kw)
    adv = np.full(r.shape, np.nan, dtype=dtype)  # stale contents, masked positions included
    ret = np.full(r.shape, np.nan, dtype=dtype)
    res = cc.gae(r, v, out=(adv, ret), **kw)
    assert isinstance(res, cc.GAEResult)
    assert res.advantages is adv and res.returns is ret
    assert res[0] is adv and res[1] is ret
    np.testing.assert_array_equal(adv, want.advantages)
    np.testing.assert_array_equal(ret, want.returns)
    # reuse the same buffers for another call
    res2 = cc.gae(r, v, out=(adv, ret), **dict(kw, gamma=1.0))
    assert res2.advantages is adv
    np.testing.assert_array_equal(adv, cc.gae(r, v, **dict(kw, gamma=1.0)).advantages)


def test_out_dtype_follows_rewards() -> None:
    r = np.zeros((2, 3), dtype=np.int64)
    adv, ret = np.empty((2, 3)), np.empty((2, 3))
    assert cc.gae(r, r, out=(adv, ret)).advantages is adv  # int input -> float64 output
    with pytest.raises(cc.DTypeError, match="out"):
        cc.gae(r, r, out=(np.empty((2, 3), np.float32), np.empty((2, 3), np.float32)))


def _expect_out_error(exc: type[Exception], r: Any, v: Any, out: Any, **kw: Any) -> None:
    with pytest.raises(exc) as info:
        cc.gae(r, v, out=out, **kw)
    assert isinstance(info.value, cc.ComppoError)
    assert "out" in str(info.value)


def test_out_wrong_shape_dtype_layout() -> None:
    r, v, _, _ = _data()
    good = np.empty((2, 4))
    _expect_out_error(cc.ShapeError, r, v, (np.empty((2, 3)), good))
    _expect_out_error(cc.ShapeError, r, v, (good, np.empty(8)))
    _expect_out_error(cc.ShapeError, r, v, (np.empty((4, 2)), np.empty((4, 2))))
    _expect_out_error(cc.DTypeError, r, v, (np.empty((2, 4), np.float32), np.empty((2, 4))))
    _expect_out_error(cc.DTypeError, r, v, (good, np.empty((2, 4), np.float16)))
    _expect_out_error(cc.DTypeError, r.astype(np.float32), v.astype(np.float32), (good, np.empty((2, 4))))
    _expect_out_error(cc.ShapeError, r, v, (np.empty((2, 8))[:, ::2], good))  # non-contiguous
    _expect_out_error(cc.ShapeError, r, v, (good, np.asfortranarray(np.empty((2, 4)))))  # Fortran order
    ro = np.empty((2, 4))
    ro.flags.writeable = False
    _expect_out_error(cc.ShapeError, r, v, (good, ro))  # read-only
    _expect_out_error(cc.DTypeError, r, v, ([[0.0] * 4] * 2, good))  # not an array
    _expect_out_error(cc.ParameterError, r, v, (good,))
    _expect_out_error(cc.ParameterError, r, v, (good, np.empty((2, 4)), np.empty((2, 4))))
    _expect_out_error(cc.ParameterError, r, v, good)


def test_out_aliasing_inputs_or_each_other() -> None:
    r, v, g, m = _data()
    fresh = np.empty((2, 4))
    _expect_out_error(cc.ShapeError, r, v, (fresh, fresh))  # both outputs the same buffer
    big = np.empty(16)
    _expect_out_error(cc.ShapeError, r, v, (big[:8].reshape(2, 4), big[4:12].reshape(2, 4)))  # overlapping
    _expect_out_error(cc.ShapeError, r, v, (r, np.empty((2, 4))))
    _expect_out_error(cc.ShapeError, r, v, (np.empty((2, 4)), v))
    _expect_out_error(cc.ShapeError, r, v, (g, np.empty((2, 4))), gates=g)
    _expect_out_error(cc.ShapeError, r, v, (np.empty((2, 4)), m), mask=m)
    # a view of rewards' memory with another shape/strides also counts
    holder = np.zeros((2, 8))
    rr = holder[:, :4]
    rr[...] = r
    overlapping = holder.reshape(-1)[4:12].reshape(2, 4)  # holder[0, 4:] and holder[1, :4]
    _expect_out_error(cc.ShapeError, rr, v, (np.empty((2, 4)), overlapping))
    # inputs untouched by the refused calls
    np.testing.assert_array_equal(r, _data()[0])
    np.testing.assert_array_equal(v, _data()[1])


def test_out_aliasing_last_values() -> None:
    """``last_values`` is an input too: an ``out`` buffer sharing its memory must be
    refused with a package error naming ``out`` (or the result must be right)."""
    B, T = 8, 2
    r = np.zeros((B, T))
    v = np.arange(B * T, dtype=np.float64).reshape(B, T) / 8
    adv, ret = np.empty((B, T)), np.empty((B, T))
    lv = adv.reshape(-1)[:B]  # last_values lives in the advantages buffer
    lv[...] = np.arange(B) + 1.0
    lv_copy = lv.copy()
    want = cc.gae(r, v, last_values=lv_copy, gamma=0.5, lam=0.5)
    try:
        got = cc.gae(r, v, last_values=lv, gamma=0.5, lam=0.5, out=(adv, ret))
    except cc.ComppoError as e:
        assert "out" in str(e)
        return
    np.testing.assert_array_equal(got.advantages, want.advantages)
    np.testing.assert_array_equal(got.returns, want.returns)


# --------------------------------------------------------------------------- #
# dtypes and array kinds
# --------------------------------------------------------------------------- #


MASKS = [
    np.bool_,
    np.uint8,
    np.int8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
]


@pytest.mark.parametrize("mask_dtype", MASKS)
def test_every_mask_dtype_means_nonzero_is_valid(mask_dtype: type) -> None:
    rng = np.random.default_rng(1)
    valid = rng.random((5, 9)) < 0.6
    r = np.where(valid, rng.normal(size=(5, 9)), 0.0)
    v = rng.normal(size=(5, 9))
    want = cc.gae(r, v, mask=valid, gamma=0.9, lam=0.9)
    m = np.zeros((5, 9), dtype=mask_dtype)
    nonzero = 2 if np.dtype(mask_dtype).kind in "iu" else (True if mask_dtype is np.bool_ else 0.5)
    m[valid] = nonzero
    assert_same(cc.gae(r, v, mask=m, gamma=0.9, lam=0.9), want)
    if np.dtype(mask_dtype).kind in "if":
        m2 = m.copy()
        m2[valid] = -1  # negative nonzero also means valid
        assert_same(cc.gae(r, v, mask=m2, gamma=0.9, lam=0.9), want)
    # as a list too
    assert_same(cc.gae(r, v, mask=m.tolist(), gamma=0.9, lam=0.9), want)
    assert_same(cc.td_targets(r, v, mask=m, gamma=0.9), cc.td_targets(r, v, mask=valid, gamma=0.9))
    assert_same(cc.gates_from_concentration(v, mask=m), cc.gates_from_concentration(v, mask=valid))


def test_negative_zero_float_mask_is_masked() -> None:
    m = np.array([[1.0, -0.0, 1.0]])
    r = np.zeros((1, 3))
    v = np.array([[0.5, 100.0, 0.25]])
    adv, _ = cc.gae(r, v, mask=m)
    assert adv[0, 1] == 0.0
    # i=2: δ = 0 − 0.25 = −0.25; i=0: δ = 0.25 − 0.5 = −0.25, A0 = −0.5 (γ = λ = 1)
    np.testing.assert_array_equal(adv, [[-0.5, 0.0, -0.25]])


@pytest.mark.parametrize(
    "cu",
    [
        [0, 3, 3, 8],
        np.array([0, 3, 3, 8], np.int32),
        np.array([0, 3, 3, 8], np.uint32),
        np.array([0, 3, 3, 8], np.uint64),
        (0, 3, 3, 8),
    ],
)
def test_cu_seqlens_kinds(cu: Any) -> None:
    rng = np.random.default_rng(2)
    r, v = rng.normal(size=8), rng.normal(size=8)
    want = cc.gae(r, v, cu_seqlens=np.array([0, 3, 3, 8], np.int64), gamma=0.9, lam=0.5)
    assert_same(cc.gae(r, v, cu_seqlens=cu, gamma=0.9, lam=0.5), want)


def test_integer_bool_and_list_inputs_give_float64() -> None:
    r_int = np.array([[0, 0, 1], [0, 2, 0]], dtype=np.int32)
    v_int = np.array([[1, 1, 1], [0, 1, 0]], dtype=np.int64)
    want = cc.gae(r_int.astype(float), v_int.astype(float), gamma=0.5, lam=0.5)
    for r, v in [(r_int, v_int), (r_int.tolist(), v_int.tolist()), (r_int.astype(np.uint8), v_int.astype(np.int8))]:
        got = cc.gae(r, v, gamma=0.5, lam=0.5)
        assert_same(got, want)
    y = cc.td_targets(r_int.tolist(), v_int, gamma=0.5)
    assert y.dtype == np.float64
    g = cc.gates_from_concentration([[1, 2, 3]])
    assert g.dtype == np.float64
    assert cc.gae(r_int.astype(bool), v_int, gamma=0.5).advantages.dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_output_dtype_follows_rewards(dtype: type) -> None:
    r, v, g, m = _data(dtype)
    adv, ret = cc.gae(r, v, gates=g.astype(np.float64), mask=m.astype(bool))
    assert adv.dtype == ret.dtype == dtype
    assert cc.td_targets(r, v.astype(np.float64)).dtype == dtype
    assert cc.gates_from_concentration(v).dtype == dtype


def test_mixed_input_dtypes_are_accepted() -> None:
    rng = np.random.default_rng(3)
    r32 = rng.normal(size=(3, 10)).astype(np.float32)
    v64 = rng.normal(size=(3, 10))
    g16 = rng.random((3, 10)).astype(np.float16)
    adv, ret = cc.gae(r32, v64, gates=g16, gamma=0.9, lam=0.9)
    assert adv.dtype == np.float32
    want = reference.gae(r32, v64, gates=g16, gamma=0.9, lam=0.9)
    np.testing.assert_allclose(adv, want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want[1], rtol=1e-5, atol=1e-5)


def test_dlpack_producers() -> None:
    r, v, g, m = _data()
    want = cc.gae(r, v, gates=g, mask=m, gamma=0.5, lam=0.5)
    got = cc.gae(
        DLPackProducer(r), DLPackProducer(v), gates=DLPackProducer(g), mask=DLPackProducer(m), gamma=0.5, lam=0.5
    )
    assert isinstance(got.advantages, np.ndarray)
    assert_same(got, want)
    assert_same(cc.td_targets(DLPackProducer(r), DLPackProducer(v), gamma=0.5), cc.td_targets(r, v, gamma=0.5))
    assert_same(cc.gates_from_concentration(DLPackProducer(v)), cc.gates_from_concentration(v))
    rp = r.reshape(-1)
    assert_same(
        cc.gae(DLPackProducer(rp), DLPackProducer(v.reshape(-1)), cu_seqlens=DLPackProducer(np.array([0, 4, 8]))),
        cc.gae(rp, v.reshape(-1), cu_seqlens=[0, 4, 8]),
    )


def test_scalar_parameters_accept_numpy_scalars() -> None:
    r, v, _, _ = _data()
    want = cc.gae(r, v, gamma=0.5, lam=0.25)
    assert_same(cc.gae(r, v, gamma=np.float32(0.5), lam=np.float64(0.25)), want)
    assert_same(cc.gae(r, v, gamma=1, lam=0), cc.gae(r, v, gamma=1.0, lam=0.0))


@given(batch=ragged_batches())
def test_inputs_never_modified_even_on_error(batch: RaggedBatch) -> None:
    """A failing call leaves the inputs untouched too."""
    r, v, kw = batch.padded()
    before = batch.copies()
    with pytest.raises(cc.ParameterError):
        cc.gae(r, v, gamma=1.5, **kw)
    if batch.valid.any():
        bad = v.copy()
        bad[batch.valid] = np.nan
        snapshot = bad.copy()
        with pytest.raises(cc.NonFiniteError):
            cc.gae(r, bad, **kw)
        assert snapshot.tobytes() == bad.tobytes()
    assert_unchanged(before, batch.arrays())


@pytest.mark.parametrize("packed", [False, True])
def test_no_memory_beyond_outputs_for_contiguous_inputs(packed: bool) -> None:
    """Contiguous float32 inputs with a bool mask (or int64 cu_seqlens) are not copied:
    the peak of NumPy allocations during a call is the two outputs (docs/design.md §2)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    b, t = 64, 1024
    mask = np.arange(t)[None, :] < rng.integers(t // 2, t + 1, size=b)[:, None]
    rewards = (rng.standard_normal((b, t)) * mask).astype(np.float32)
    values = rng.standard_normal((b, t)).astype(np.float32)
    gates = rng.uniform(0.5, 1.0, (b, t)).astype(np.float32)
    if packed:
        cu = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int64)
        args: tuple = (rewards[mask], values[mask])
        kw: dict = {"cu_seqlens": cu, "gates": gates[mask]}
    else:
        args, kw = (rewards, values), {"mask": mask, "gates": gates}
    out_bytes = 2 * args[0].nbytes
    cc.gae(*args, lam=0.95, **kw)  # warm-up: first-call imports and caches
    tracemalloc.start()
    try:
        adv, ret = cc.gae(*args, lam=0.95, **kw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert adv.nbytes + ret.nbytes == out_bytes
    assert peak < out_bytes + 64 * 1024, f"peak {peak} B for {out_bytes} B of outputs"
