"""Errors (docs/design.md §3, §8): every bad input raises a package error (a ``ComppoError``,
hence a ``ValueError``; ``DTypeError`` is also a ``TypeError``) whose message names the
argument and, for per-token problems, the first offending ``(row R, position P)`` in
row-major order; position is the index inside the sequence in both layouts."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import ERROR_CLASSES
from hypothesis import assume, given
from hypothesis import strategies as st

import comppo_core as cc
from comppo_core import reference
from comppo_core.testing.strategies import RaggedBatch, ragged_batches

ERRORS = [cls for cls in ERROR_CLASSES if cls is not cc.ComppoError]  # its subclasses


def expect(exc: type[Exception], fn: Callable[[], Any], *fragments: str) -> str:
    """Calls ``fn``, checks it raises ``exc`` (a ComppoError and ValueError) with every
    fragment in its message; returns the message."""
    with pytest.raises(exc) as info:
        fn()
    err = info.value
    assert type(err) is exc, f"expected exactly {exc.__name__}, got {type(err).__name__}: {err}"
    assert isinstance(err, cc.ComppoError) and isinstance(err, ValueError)
    msg = str(err)
    for f in fragments:
        assert f in msg, f"{f!r} not in message {msg!r}"
    return msg


def test_exception_hierarchy() -> None:
    assert issubclass(cc.ComppoError, ValueError)
    for e in ERRORS:
        assert issubclass(e, cc.ComppoError) and issubclass(e, ValueError)
        assert getattr(cc, e.__name__) is e
    # errors.__all__, the list the error tests take, misses no error class of the module
    defined = {c for c in vars(cc.errors).values() if isinstance(c, type) and issubclass(c, cc.ComppoError)}
    assert defined == set(ERROR_CLASSES) and cc.ComppoError in ERROR_CLASSES
    assert issubclass(cc.DTypeError, TypeError)
    assert issubclass(cc.LayoutError, cc.ShapeError)


Z = np.zeros((2, 3))
R1 = np.zeros(5)  # packed data, N = 5


def gae(*a: Any, **k: Any) -> Callable[[], Any]:
    return lambda: cc.gae(*a, **k)


def td(*a: Any, **k: Any) -> Callable[[], Any]:
    return lambda: cc.td_targets(*a, **k)


def gates(*a: Any, **k: Any) -> Callable[[], Any]:
    return lambda: cc.gates_from_concentration(*a, **k)


def mapped(*a: Any, fields: dict[str, Any], **k: Any) -> Callable[[], Any]:
    """gates_from_concentration with ``params=GateParams(**fields)``, built in the call
    (a bad field raises there, as GateParams checks it)."""
    return lambda: cc.gates_from_concentration(*a, params=cc.GateParams(**fields), **k)


# --------------------------------------------------------------------------- #
# per-token errors: first offending (row, position)
# --------------------------------------------------------------------------- #

KINDS = ["rewards", "values", "gates", "gate_range", "masked_reward"]


def _offenders(batch: RaggedBatch, kind: str, picks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    want_valid = kind != "masked_reward"
    return sorted({(b, t) for b, t in picks if batch.valid[b, t] == want_valid})


@given(batch=ragged_batches(gates=True), kind=st.sampled_from(KINDS), data=st.data())
def test_first_offending_token_is_named(batch: RaggedBatch, kind: str, data: st.DataObject) -> None:
    B, T = batch.shape
    assume(B > 0)
    picks = data.draw(st.lists(st.tuples(st.integers(0, B - 1), st.integers(0, T - 1)), min_size=1, max_size=4))
    bad = _offenders(batch, kind, picks)
    assume(bad)
    if kind == "gate_range":
        bad_value = data.draw(st.sampled_from([-0.5, 1.5, 7.0, -1e-3]))
    elif kind == "masked_reward":
        bad_value = data.draw(st.sampled_from([1.0, -2.0, np.nan, np.inf]))
    else:
        bad_value = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    r, v = batch.rewards.copy(), batch.values.copy()
    g = batch.gates.copy()  # type: ignore[union-attr]
    target = {"rewards": r, "masked_reward": r, "values": v, "gates": g, "gate_range": g}[kind]
    for b, t in bad:
        target[b, t] = bad_value
    exc, arg = {
        "rewards": (cc.NonFiniteError, "rewards"),
        "values": (cc.NonFiniteError, "values"),
        "gates": (cc.NonFiniteError, "gates"),
        "gate_range": (cc.OutOfRangeError, "gates"),
        "masked_reward": (cc.MaskedRewardError, "rewards"),
    }[kind]

    # padded
    b0, t0 = bad[0]
    kw = {"mask": batch.mask, "gates": g, "last_values": batch.last_values}
    msg = expect(exc, gae(r, v, gamma=0.9, lam=0.8, **kw), arg, f"(row {b0}, position {t0})")
    assert msg.startswith(arg)
    if kind != "masked_reward":  # td_targets does not check masked rewards (documented)
        expect(exc, td(r, v, gamma=0.9, **kw), arg, f"(row {b0}, position {t0})")
    else:
        # ... and masked_rewards="drop" accepts them
        cc.gae(r, v, gamma=0.9, lam=0.8, masked_rewards="drop", **kw)
        cc.td_targets(r, v, gamma=0.9, **kw)

    # packed: only the offenders inside each row's length exist; position is in-sequence
    in_len = [(b, t) for b, t in bad if t < batch.lengths[b]]
    if not in_len or (kind == "masked_reward" and not batch.inner):
        return
    b0, t0 = in_len[0]
    flat = int(batch.cu_seqlens[b0]) + t0
    kwp = {
        "mask": batch.packed_mask,
        "gates": batch.pack(g),
        "last_values": batch.last_values,
        "cu_seqlens": batch.cu_seqlens,
    }
    frag = (arg, f"(row {b0}, position {t0})", f"flat index {flat}")
    expect(exc, gae(batch.pack(r), batch.pack(v), gamma=0.9, lam=0.8, **kwp), *frag)
    if kind != "masked_reward":
        expect(exc, td(batch.pack(r), batch.pack(v), gamma=0.9, **kwp), *frag)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("arg", ["rewards", "values", "gates"])
def test_non_finite_at_valid_position(arg: str, bad: float) -> None:
    arrays = {"rewards": np.zeros((2, 4)), "values": np.zeros((2, 4)), "gates": np.ones((2, 4))}
    arrays[arg][1, 2] = bad
    arrays[arg][1, 3] = bad  # a later offender is not the one reported
    m = np.array([[1, 1, 1, 1], [1, 1, 1, 1]])
    r, v, g = arrays["rewards"], arrays["values"], arrays["gates"]
    msg = expect(cc.NonFiniteError, gae(r, v, gates=g, mask=m), arg, "row 1, position 2")
    assert "position 3" not in msg
    expect(cc.NonFiniteError, td(r, v, gates=g, mask=m), arg, "row 1, position 2")
    # packed: rows [0, 4) and [4, 8): flat index 6 is row 1, position 2
    expect(
        cc.NonFiniteError,
        gae(r.reshape(-1), v.reshape(-1), gates=g.reshape(-1), cu_seqlens=[0, 4, 8]),
        arg,
        "row 1, position 2",
    )


def test_non_finite_errors_in_float32_and_float16() -> None:
    for dtype in (np.float32, np.float16):
        r = np.zeros((1, 3), dtype=dtype)
        v = np.array([[0, np.inf, 0]], dtype=dtype)
        expect(cc.NonFiniteError, gae(r, v), "values", "row 0, position 1")


def test_non_finite_at_masked_position_is_fine() -> None:
    r = np.array([[0.0, 0.0, 1.0, 0.0]])
    v = np.array([[0.5, np.nan, 0.25, np.inf]])
    g = np.array([[1.0, np.nan, 0.5, 7.0]])  # masked gates are never read: NaN, 7 allowed
    m = np.array([[1, 0, 1, 0]], dtype=bool)
    adv, ret = cc.gae(r, v, gates=g, mask=m, gamma=0.5, lam=0.5)
    assert np.isfinite(adv).all() and np.isfinite(ret).all()
    want = reference.gae(r, v, gates=g, mask=m, gamma=0.5, lam=0.5)
    np.testing.assert_allclose(adv, want[0], rtol=1e-12)
    np.testing.assert_allclose(ret, want[1], rtol=1e-12)
    # valid positions 0, 2 (γ = λ = 0.5, terminal):
    # i=2: gg = 0.25, δ = 1 + 0 − 0.25 = 0.75, A = 0.75
    # i=0: gg = 0.5,  δ = 0 + 0.5·0.25 − 0.5 = −0.375, A = −0.375 + 0.25·0.75 = −0.1875
    np.testing.assert_array_equal(adv, [[-0.1875, 0, 0.75, 0]])
    y = cc.td_targets(r, v, gates=g, mask=m, gamma=0.5)
    np.testing.assert_array_equal(y, [[0.125, 0, 1.0, 0]])


@pytest.mark.parametrize("g", [-0.25, 1.25, 7.0, -1e-300, 1.0 + 2**-52])
def test_gate_outside_unit_interval(g: float) -> None:
    gates_ = np.array([[1.0, 0.0, g]])
    msg = expect(
        cc.OutOfRangeError, gae(np.zeros((1, 3)), np.zeros((1, 3)), gates=gates_), "gates", "row 0, position 2"
    )
    assert "[0, 1]" in msg
    expect(cc.OutOfRangeError, td(np.zeros((1, 3)), np.zeros((1, 3)), gates=gates_), "gates", "row 0, position 2")
    # the same gate on a masked position is allowed
    cc.gae(np.zeros((1, 3)), np.zeros((1, 3)), gates=gates_, mask=[[1, 1, 0]])


def test_exact_gate_endpoints_are_allowed() -> None:
    g = np.array([[0.0, 1.0, -0.0]])
    adv, _ = cc.gae(np.zeros((1, 3)), np.ones((1, 3)), gates=g)
    assert np.isfinite(adv).all()


@pytest.mark.parametrize("bad", [1.0, -0.5, np.nan, np.inf])
def test_masked_reward_error_and_drop(bad: float) -> None:
    r = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, bad]])
    v = np.full((2, 3), 0.5)
    m = np.array([[1, 1, 0], [1, 1, 0]])
    msg = expect(cc.MaskedRewardError, gae(r, v, mask=m), "rewards", "row 1, position 2", "masked_rewards")
    assert "drop" in msg
    dropped = cc.gae(r, v, mask=m, masked_rewards="drop")
    clean = cc.gae(np.where(m != 0, r, 0.0), v, mask=m)
    np.testing.assert_array_equal(dropped.advantages, clean.advantages)
    np.testing.assert_array_equal(dropped.returns, clean.returns)
    # packed, multi-turn: row 1 = flat [3, 6), masked position 2 = flat 5
    expect(
        cc.MaskedRewardError,
        gae(r.reshape(-1), v.reshape(-1), mask=m.reshape(-1), cu_seqlens=[0, 3, 6]),
        "rewards",
        "row 1, position 2",
        "flat index 5",
    )


def test_masked_rewards_bogus() -> None:
    for bad in ("bogus", "Error", None, 1):
        expect(cc.ParameterError, gae(Z, Z, masked_rewards=bad), "masked_rewards")


# --------------------------------------------------------------------------- #
# scalar parameters
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("name", ["gamma", "lam", "lam_critic"])
@pytest.mark.parametrize("value", [-0.1, 1.0000001, 2.0, np.nan, np.inf, -np.inf, "x"])
def test_gamma_lam_outside_unit_interval(name: str, value: Any) -> None:
    expect(cc.ParameterError, gae(Z, Z, **{name: value}), name)
    if name == "gamma":
        expect(cc.ParameterError, td(Z, Z, gamma=value), "gamma")


@pytest.mark.parametrize("name", ["gamma", "lam", "lam_critic"])
@pytest.mark.parametrize("value", [0, 1, 0.0, 1.0, np.float32(0.5), np.float64(1.0)])
def test_gamma_lam_endpoints_allowed(name: str, value: Any) -> None:
    # the endpoints are taken, and they mean what the plain reference makes of them
    rewards = np.array([[0.0, 0.5, 1.0], [1.0, -1.0, 0.25]])
    values = np.array([[0.2, -0.1, 0.3], [0.0, 0.4, -0.6]])
    got = cc.gae(rewards, values, **{name: value})
    want = reference.gae(rewards, values, **{name: float(value)})
    for g, w in zip(got, want):  # advantages, returns
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    if name == "gamma":
        np.testing.assert_allclose(
            cc.td_targets(rewards, values, gamma=value), reference.td_targets(rewards, values, gamma=float(value))
        )


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"low": 0.95, "high": 0.9}, "low"),
        ({"low": -0.1}, "low"),
        ({"low": 1.5, "high": 1.0}, "low"),
        ({"high": 1.1}, "high"),
        ({"low": 0.0, "high": -0.2}, ""),
        ({"low": np.nan}, "low"),
        ({"high": np.inf}, "high"),
        ({"normalize": "zscore"}, "normalize"),
        ({"normalize": None}, "normalize"),
        ({"normalize": "none", "scale": 0.0}, "scale"),
        ({"normalize": "none", "scale": -1.0}, "scale"),
        ({"normalize": "none", "scale": np.nan}, "scale"),
        ({"normalize": "none", "center": np.inf}, "center"),
        ({"sharpness": np.nan}, "sharpness"),
        ({"sharpness": np.inf}, "sharpness"),
    ],
)
def test_gate_parameters(kwargs: dict[str, Any], arg: str) -> None:
    c = np.array([[1.0, 2.0, 3.0]])
    expect(cc.ParameterError, mapped(c, fields=kwargs), arg)
    expect(cc.ParameterError, mapped(c[0], cu_seqlens=[0, 3], fields=kwargs), arg)


def test_gate_parameters_allowed_edges() -> None:
    c = np.array([[1.0, 2.0, 3.0]])
    for low, high in [(0.0, 0.0), (1.0, 1.0), (0.0, 1.0), (0.5, 0.5)]:
        g = cc.gates_from_concentration(c, params=cc.GateParams(low=low, high=high))
        assert ((g >= low) & (g <= high)).all()
    cc.gates_from_concentration(c, params=cc.GateParams(sharpness=-2.0))
    cc.gates_from_concentration(c, params=cc.GateParams(sharpness=0.0))


def test_non_finite_concentration() -> None:
    c = np.array([[1.0, 2.0, 3.0], [1.0, np.nan, np.inf]])
    expect(cc.NonFiniteError, gates(c), "concentration", "row 1, position 1")
    for normalize in ("batch", "none"):
        expect(cc.NonFiniteError, mapped(c, fields={"normalize": normalize}), "concentration", "row 1, position 1")
    # masked: fine
    cc.gates_from_concentration(c, mask=[[1, 1, 1], [1, 0, 0]])
    expect(
        cc.NonFiniteError,
        gates(c.reshape(-1), cu_seqlens=[0, 2, 6]),
        "concentration",
        "row 1, position 2",
        "flat index 4",
    )


# --------------------------------------------------------------------------- #
# shapes, layouts, dtypes
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "call, arg",
    [
        (gae(Z, np.zeros((2, 4))), "values"),
        (gae(Z, np.zeros((3, 2))), "values"),
        (gae(Z, np.zeros(6)), "values"),
        (gae(Z, Z, gates=np.ones((2, 2))), "gates"),
        (gae(Z, Z, mask=np.ones((3, 2))), "mask"),
        (gae(Z, Z, mask=np.ones(6)), "mask"),
        (gae(Z, Z, mask=np.ones((2, 3, 1))), "mask"),
        (gae(np.zeros((2, 3, 1)), np.zeros((2, 3, 1))), "rewards"),
        (gae(np.float64(1.0), np.float64(1.0)), "rewards"),
        (gae(Z, Z, cu_seqlens=[0, 6]), "rewards"),
        (gae(R1, R1, cu_seqlens=[[0, 5]]), "cu_seqlens"),
        (gae(R1, np.zeros(4), cu_seqlens=[0, 5]), "values"),
        (gae(R1, R1, mask=np.ones(4), cu_seqlens=[0, 5]), "mask"),
        (gae(Z, Z, last_values=[1.0]), "last_values"),
        (gae(Z, Z, last_values=np.zeros(3)), "last_values"),
        (gae(Z, Z, last_values=np.zeros((2, 1))), "last_values"),
        (gae(R1, R1, cu_seqlens=[0, 2, 5], last_values=[1.0]), "last_values"),
        (td(Z, np.zeros((2, 4))), "values"),
        (td(Z, Z, mask=np.ones((2, 2))), "mask"),
        (td(Z, Z, last_values=[0.0]), "last_values"),
        (gates(Z, mask=np.ones((3, 2))), "mask"),
        (gates(np.zeros((2, 3, 1))), "concentration"),
    ],
)
def test_shape_errors(call: Callable[[], Any], arg: str) -> None:
    msg = expect(cc.ShapeError, call, arg)
    assert msg.startswith(arg)


@pytest.mark.parametrize("fn", ["gae", "td_targets", "gates_from_concentration"])
def test_one_dimensional_without_cu_seqlens(fn: str) -> None:
    x = np.zeros(4)
    call = {"gae": gae(x, x), "td_targets": td(x, x), "gates_from_concentration": gates(x)}[fn]
    msg = expect(cc.ShapeError, call)
    assert "cu_seqlens" in msg and ("rewards" in msg or "concentration" in msg)


@pytest.mark.parametrize(
    "cu, index",
    [
        ([1, 2, 5], 0),  # does not start at 0
        ([-1, 2, 5], 0),
        ([0, 3, 2, 5], 2),  # decreasing
        ([0, -1, 5], 1),
        ([0, 2, 4], 2),  # does not end at N = 5
        ([0, 2, 6], 2),
        ([0, 5, 5, 7], 3),
        ([0], 0),
    ],
)
@pytest.mark.parametrize("cu_dtype", [np.int32, np.int64])
def test_cu_seqlens_layout_errors(cu: list[int], index: int, cu_dtype: type) -> None:
    cu_arr = np.asarray(cu, dtype=cu_dtype)
    for call in (gae(R1, R1, cu_seqlens=cu_arr), td(R1, R1, cu_seqlens=cu_arr), gates(R1, cu_seqlens=cu_arr)):
        msg = expect(cc.LayoutError, call, "cu_seqlens", f"first offending index {index}")
        assert re.search(r"first offending index \d+", msg)


def test_cu_seqlens_empty_and_wrong_dtype() -> None:
    expect(cc.LayoutError, gae(np.zeros(0), np.zeros(0), cu_seqlens=np.zeros(0, dtype=np.int64)), "cu_seqlens")
    expect(cc.DTypeError, gae(R1, R1, cu_seqlens=np.array([0.0, 5.0])), "cu_seqlens")
    expect(cc.DTypeError, gae(R1, R1, cu_seqlens=np.array([0, 5], dtype=complex)), "cu_seqlens")


@pytest.mark.parametrize(
    "rewards",
    [
        np.zeros((2, 3), dtype=np.complex128),
        np.zeros((2, 3), dtype=np.complex64),
        np.array([["a", "b", "c"], ["d", "e", "f"]]),
        np.array([[b"a", b"b", b"c"], [b"d", b"e", b"f"]]),
        np.zeros((2, 3), dtype="datetime64[s]"),
        np.zeros((2, 3), dtype=object),
        [[1.0, "a", 2.0], [0.0, 0.0, 0.0]],
    ],
    ids=["complex128", "complex64", "str", "bytes", "datetime", "object", "list-with-str"],
)
def test_non_float_rewards(rewards: Any) -> None:
    msg = expect(cc.DTypeError, gae(rewards, Z), "rewards")
    assert msg.startswith("rewards")
    with pytest.raises(TypeError):
        cc.gae(rewards, Z)
    expect(cc.DTypeError, td(rewards, Z), "rewards")


def test_non_float_other_arguments() -> None:
    cplx = np.zeros((2, 3), dtype=np.complex128)
    expect(cc.DTypeError, gae(Z, cplx), "values")
    expect(cc.DTypeError, gae(Z, Z, gates=cplx), "gates")
    expect(cc.DTypeError, gae(Z, Z, mask=cplx), "mask")
    expect(cc.DTypeError, gae(Z, Z, mask=np.array([["a"] * 3] * 2)), "mask")
    expect(cc.DTypeError, gae(Z, Z, last_values=["a", "b"]), "last_values")
    expect(cc.DTypeError, gates(cplx), "concentration")
    expect(cc.DTypeError, gae(object(), Z), "rewards")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_last_values_non_finite(bad: float) -> None:
    # README: a non-finite last_values is a ParameterError (a per-row value, not a token)
    expect(cc.ParameterError, gae(Z, Z, last_values=[1.0, bad]), "last_values", "row 1")
    expect(cc.ParameterError, td(Z, Z, last_values=[bad, 1.0]), "last_values", "row 0")
    expect(cc.ParameterError, gae(R1, R1, cu_seqlens=[0, 2, 5], last_values=[1.0, bad]), "last_values", "row 1")


def test_set_num_threads_rejects_non_positive(restore_threads: int) -> None:
    for n in (0, -1):
        expect(cc.ParameterError, lambda: cc.set_num_threads(n), "n")
    assert cc.get_num_threads() == restore_threads
