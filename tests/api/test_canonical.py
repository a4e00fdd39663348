"""One Rust entry per public function (``rust/bindings.rs``): the canonical call is one
call into Rust, everything else is put in canonical form first and makes the same call.

Pinned here: which calls are canonical (computed by the first call, no Python
conversion), that arguments of every other kind give what the same data in canonical
form gives, or the error that names them, unaligned views, the kernels' errors whichever
way the call came, and the group overflow found by hypothesis (7e74d1f). The memory of
large outputs (the buffer cache, ``rust/buffers.rs``) is pinned in ``test_buffers.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import comppo_core as cc
from comppo_core import _core


class EntrySpy:
    """Wraps a ``_core`` entry and records what each call returned (None: not canonical)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.inner = getattr(_core, name)
        self.returned: list[Any] = []
        monkeypatch.setattr(_core, name, self)

    def __call__(self, *args: Any) -> Any:
        result = self.inner(*args)
        self.returned.append(result)
        return result

    @property
    def refused(self) -> list[bool]:
        return [r is None for r in self.returned]


def _batch(dtype: Any = np.float32) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    mask = np.ones((3, 8), bool)
    mask[0, 5:] = False
    mask[2, 2:4] = False
    rewards = (rng.standard_normal((3, 8)) * mask).astype(dtype)
    return {
        "rewards": rewards,
        "values": rng.standard_normal((3, 8)).astype(dtype),
        "mask": mask,
        "gates": rng.uniform(0.5, 1.0, (3, 8)).astype(dtype),
    }


def _packed(kw: dict[str, Any]) -> dict[str, Any]:
    m = kw.pop("mask")
    out = {k: v[m] for k, v in kw.items()}
    out["cu_seqlens"] = np.concatenate([[0], np.cumsum(m.sum(axis=1))]).astype(np.int64)
    return out


def _unaligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous but unaligned copy of ``a`` (a view one byte into a buffer)."""
    buf = np.zeros(a.nbytes + 1, np.uint8)
    out = buf[1:].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert out.flags.c_contiguous and not out.flags.aligned
    return out


def _same(a: Any, b: Any) -> None:
    a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


# ---------------------------------------------------------------- the canonical call


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("packed", [False, True])
def test_canonical_calls_are_computed_by_the_first_call(
    monkeypatch: pytest.MonkeyPatch, dtype: Any, packed: bool
) -> None:
    """Contiguous float32/float64 arrays, a bool mask, int64 cu_seqlens, float64
    last_values and out=: one call into Rust each, none refused."""
    kw = _batch(dtype)
    kw = _packed(kw) if packed else kw
    r, v, g = kw.pop("rewards"), kw.pop("values"), kw.pop("gates")
    lay = kw  # mask or cu_seqlens
    lv = np.array([0.5, -1.0, 2.0])
    calls: dict[str, Callable[[], Any]] = {
        "gae": lambda: cc.gae(r, v, gates=g, last_values=lv, gamma=0.9, lam=0.8, lam_critic=1.0, **lay),
        "td_targets": lambda: cc.td_targets(r, v, gates=g, last_values=lv, gamma=0.9, **lay),
        "gates_from_concentration": lambda: cc.gates_from_concentration(
            g, params=cc.GateParams(normalize="batch", invert=True), **lay
        ),
        "masked_whiten": lambda: cc.masked_whiten(r, shift_mean=False, **lay),
        "credit_stats": lambda: cc.credit_stats(r, **lay),
    }
    for name, call in calls.items():
        spy = EntrySpy(monkeypatch, name)
        call()
        assert spy.refused == [False], name
    spy = EntrySpy(monkeypatch, "gae")
    out = (np.empty_like(r), np.empty_like(r))
    got = cc.gae(r, v, gates=g, out=out, **lay)
    assert spy.refused == [False] and got.advantages is out[0] and got.returns is out[1]
    spy = EntrySpy(monkeypatch, "masked_whiten")
    w = np.empty_like(r)
    assert cc.masked_whiten(r, out=w, **lay) is w
    x = r.copy()
    assert cc.masked_whiten(x, out=x, **lay) is x  # in place
    assert spy.refused == [False, False]
    spy = EntrySpy(monkeypatch, "broadcast")
    per_seq = np.arange(3, dtype=dtype)
    cc.broadcast(per_seq, **lay)
    assert spy.refused == [False]


def test_canonical_outcome_call(monkeypatch: pytest.MonkeyPatch) -> None:
    spy = EntrySpy(monkeypatch, "group_advantages")
    cc.group_advantages(np.arange(6.0), np.array([0, 0, 1, 1, 2, 2]), method="rloo", singleton="raw", eps=0.0)
    assert spy.refused == [False]


@pytest.mark.parametrize(
    "change",
    [
        {"rewards": lambda k: k["rewards"].astype(np.float16)},
        {"values": lambda k: np.asfortranarray(k["values"])},
        {"gates": lambda k: k["gates"].astype(np.float64)},  # float32 rewards: one dtype per call
        {"mask": lambda k: k["mask"].astype(np.uint8)},
        {"last_values": np.zeros(3, np.float32)},
        {"gamma": "0.5"},
    ],
)
def test_other_arguments_are_converted_then_make_the_same_call(
    monkeypatch: pytest.MonkeyPatch, change: dict[str, Any]
) -> None:
    kw = _batch()
    for k, f in change.items():
        kw[k] = f(kw) if callable(f) else f
    spy = EntrySpy(monkeypatch, "gae")
    cc.gae(kw.pop("rewards"), kw.pop("values"), **kw)
    assert spy.refused == [True, False]


# ---------------------------------------------------------------- conversions


def _gae_cases() -> dict[
    str, tuple[Callable[[dict[str, Any]], dict[str, Any]], Callable[[dict[str, Any]], dict[str, Any]]]
]:
    """``name: (spoil, canonical)``: a call's keywords of another kind, and the same data
    in canonical form (what the conversion must amount to)."""

    def same(k: dict[str, Any]) -> dict[str, Any]:
        return k

    def with_(**f: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
        return lambda k: {**k, **{name: fn(k) for name, fn in f.items()}}

    shared = np.zeros(64, np.float32)

    def through_another_object(k: dict[str, Any]) -> dict[str, Any]:
        shared[:24] = k["values"].reshape(-1)
        return {**k, "values": shared[:24].reshape(3, 8)}

    return {
        "integer rewards": (
            with_(rewards=lambda k: np.round(k["rewards"] * 3).astype(np.int64)),
            with_(
                rewards=lambda k: np.round(k["rewards"] * 3).astype(np.float64),
                values=lambda k: k["values"].astype(np.float64),
                gates=lambda k: k["gates"].astype(np.float64),
            ),
        ),
        "strided rewards": (with_(rewards=lambda k: np.repeat(k["rewards"], 2, axis=1)[:, ::2]), same),
        "fortran values": (with_(values=lambda k: np.asfortranarray(k["values"])), same),
        "big-endian values": (with_(values=lambda k: k["values"].astype(">f4")), same),
        "float64 gates with float32 rewards": (
            with_(gates=lambda k: k["gates"].astype(np.float64)),
            with_(gates=lambda k: k["gates"].astype(np.float64).astype(np.float32)),
        ),
        "list values": (with_(values=lambda k: k["values"].tolist()), same),
        "uint8 mask": (with_(mask=lambda k: k["mask"].astype(np.uint8)), same),
        "float mask with NaN": (with_(mask=lambda k: np.where(k["mask"], np.nan, 0.0)), same),
        "float32 last_values": (
            with_(last_values=lambda k: np.array([0.5, 2.0, -1.0], np.float32)),
            with_(last_values=lambda k: np.array([0.5, 2.0, -1.0])),
        ),
        "gamma a NumPy float32": (with_(gamma=lambda k: np.float32(0.5)), with_(gamma=lambda k: 0.5)),
        "gamma a string": (with_(gamma=lambda k: "0.5"), with_(gamma=lambda k: 0.5)),
        "values written through another object": (through_another_object, same),
    }


@pytest.mark.parametrize("name", list(_gae_cases()))
def test_converted_arguments_give_what_their_canonical_form_gives(name: str) -> None:
    spoil, canonical = _gae_cases()[name]
    kw = {**_batch(), "gamma": 0.9, "lam": 0.8}
    got = cc.gae(**spoil(dict(kw)))
    want = cc.gae(**canonical(dict(kw)))
    _same(tuple(got), tuple(want))


def test_int32_offsets_and_out_given_as_a_list() -> None:
    kw = _packed(_batch())
    r, v = kw.pop("rewards"), kw.pop("values")
    want = cc.gae(r, v, **kw)
    _same(tuple(cc.gae(r, v, **{**kw, "cu_seqlens": kw["cu_seqlens"].astype(np.int32)})), tuple(want))
    out = [np.empty_like(r), np.empty_like(r)]
    got = cc.gae(r, v, out=out, **kw)  # a list is taken like a tuple
    assert got.advantages is out[0]
    _same(tuple(got), tuple(want))


@pytest.mark.parametrize(
    "change, error, match",
    [
        ({"mask": lambda k: k["mask"][:, :4].copy()}, cc.ShapeError, "mask"),
        ({"last_values": np.zeros(4)}, cc.ShapeError, "last_values"),
        ({"gamma": 1.5}, cc.ParameterError, "gamma"),
        ({"gamma": float("nan")}, cc.ParameterError, "gamma"),
        ({"lam_critic": -0.1}, cc.ParameterError, "lam_critic"),
        ({"masked_rewards": "ignore"}, cc.ParameterError, "masked_rewards"),
        ({"out": lambda k: (k["values"], k["values"])}, cc.ShapeError, "shares memory"),
        ({"out": lambda k: (k["rewards"], np.empty_like(k["rewards"]))}, cc.ShapeError, "shares memory"),
        ({"out": lambda k: (np.empty((3, 8)), np.empty((3, 8)))}, cc.DTypeError, r"out \(advantages\)"),
        (
            {"out": lambda k: (np.empty_like(k["rewards"]), np.empty_like(k["rewards"])[::-1])},
            cc.ShapeError,
            r"out \(returns\)",
        ),
    ],
)
def test_arguments_no_conversion_fixes_are_named(change: dict[str, Any], error: type[Exception], match: str) -> None:
    kw = _batch()
    for k, f in change.items():
        kw[k] = f(kw) if callable(f) else f
    before = {k: v.copy() for k, v in kw.items() if isinstance(v, np.ndarray)}
    with pytest.raises(error, match=match):
        cc.gae(kw.pop("rewards"), kw.pop("values"), **kw)
    for k, v in before.items():
        if k in kw:
            np.testing.assert_array_equal(kw[k], v)


def test_out_overlapping_an_input_through_another_object_is_refused() -> None:
    shared = np.zeros(64, np.float32)
    kw = _batch()
    shared[:24] = kw["values"].reshape(-1)
    values = shared[:24].reshape(3, 8)
    out = (np.empty_like(kw["rewards"]), np.frombuffer(shared.data, np.float32)[8:32].reshape(3, 8))
    with pytest.raises(cc.ShapeError, match="shares memory"):
        cc.gae(kw["rewards"], values, mask=kw["mask"], out=out)


def test_the_other_functions_convert_or_name_their_arguments() -> None:
    b = _batch()
    conc, m = b["gates"], b["mask"]
    p = cc.GateParams(low=0.5, invert=True)
    want = cc.gates_from_concentration(conc, mask=m, params=p)
    want64 = cc.gates_from_concentration(conc.astype(np.float64), mask=m, params=p)
    _same(cc.gates_from_concentration(conc.tolist(), mask=m.astype(np.int8), params=p), want64)
    # the mapping's fields are converted (and named) by GateParams: a NumPy scalar is a number
    q = cc.GateParams(low=np.float32(0.5), invert=np.bool_(True))
    assert q == p
    _same(cc.gates_from_concentration(conc, mask=m, params=q), want)
    for kwargs, match in (
        ({"low": float("nan")}, "^low"),
        ({"high": float("inf")}, "^high"),
        ({"normalize": "rows"}, "^normalize"),
        ({"low": "0.5"}, "^low: expected a finite number, got '0.5'"),
        ({"invert": 1}, "^invert: expected a bool, got 1"),
        ({"low": 0.95, "high": 0.9}, "^low: expected low <= high"),
    ):
        with pytest.raises(cc.ParameterError, match=match):
            cc.gates_from_concentration(conc, mask=m, params=cc.GateParams(**kwargs))  # type: ignore[arg-type]
    with pytest.raises(cc.ParameterError, match="^low"):  # low > high: the kernel's own check as well
        cc._core.gates_from_concentration(conc, m, None, 0.95, 0.9, 1.0, "sequence", 0.0, 1.0, False)

    x = b["rewards"]
    want_w = cc.masked_whiten(x, mask=m)
    _same(cc.masked_whiten(x, mask=m.astype(np.int8), shift_mean=1), want_w)
    w = np.empty_like(x)
    assert cc.masked_whiten(x, mask=m, out=(w,)) is w  # a 1-tuple is taken like the array
    _same(w, want_w)
    for kwargs, error in (({"eps": -1.0}, cc.ParameterError), ({"eps": float("inf")}, cc.ParameterError),
                          ({"out": np.empty((3, 8))}, cc.DTypeError), ({"out": x[:, :]}, cc.ShapeError)):  # fmt: skip
        with pytest.raises(error):
            cc.masked_whiten(x, mask=m, **kwargs)

    s, g = np.arange(6.0), np.array([0, 0, 1, 1, 2, 2])
    want_g = cc.group_advantages(s, g)
    _same(cc.group_advantages(s.astype(np.float32), g), want_g.astype(np.float32))
    for scores, groups in ((np.arange(6), g), (np.arange(6.0).repeat(2)[::2], g), (s, g.astype(np.int32)), (s, list(g)),
                           (s, np.array(["a", "a", "b", "b", "c", "c"]))):  # fmt: skip
        _same(cc.group_advantages(scores, groups), want_g)
    for kwargs, error in (({"method": "ppo"}, cc.ParameterError), ({"singleton": "drop"}, cc.ParameterError),
                          ({"eps": -1.0}, cc.ParameterError), ({"eps": float("nan")}, cc.ParameterError)):  # fmt: skip
        with pytest.raises(error):
            cc.group_advantages(s, g, **kwargs)
    with pytest.raises(cc.ShapeError, match="scores"):
        cc.group_advantages(s.reshape(2, 3), g)
    with pytest.raises(cc.ShapeError, match="groups"):
        cc.group_advantages(s, np.zeros(5, np.int64))


def test_group_overflow_is_refused_whichever_way_the_call_comes() -> None:
    """Found by hypothesis (7e74d1f): a group of 0 and a subnormal score has a spread that
    rounds to zero, so with eps = 0 GRPO's advantages would be ±inf."""
    s, g = np.array([0.0, 2.2250738585e-313]), np.array([0, 0])
    for scores, groups in ((s, g), (list(s), [0, 0]), (s, g.astype(np.int32))):
        with pytest.raises(cc.ParameterError, match="overflow at index 0"):
            cc.group_advantages(scores, groups, method="grpo", eps=0.0)


# ---------------------------------------------------------------- kernel errors


@pytest.mark.parametrize(
    "spoil, error, where",
    [
        (lambda k: k["rewards"].__setitem__((1, 3), np.nan), cc.NonFiniteError, r"rewards: .*\(row 1, position 3\)"),
        (lambda k: k["gates"].__setitem__((2, 6), 1.5), cc.OutOfRangeError, r"gates: .*\(row 2, position 6\)"),
        (lambda k: k["rewards"].__setitem__((0, 6), 2.0), cc.MaskedRewardError, r"\(row 0, position 6\)"),
        (lambda k: k["values"].__setitem__((2, 0), np.inf), cc.NonFiniteError, r"values: .*\(row 2, position 0\)"),
    ],
)
def test_kernel_errors_are_the_same_whichever_way_the_call_comes(
    spoil: Callable[[dict[str, Any]], None], error: type[Exception], where: str
) -> None:
    kw = _batch()
    spoil(kw)
    r, v = kw.pop("rewards"), kw.pop("values")
    messages = []
    for rr, kk in ((r, kw), (np.asfortranarray(r), kw), (r, {**kw, "mask": kw["mask"].astype(np.float32)})):
        with pytest.raises(error, match=where) as info:
            cc.gae(rr, v, **kk)
        messages.append(str(info.value))
    assert len(set(messages)) == 1
    if error is not cc.MaskedRewardError:
        with pytest.raises(error, match=where):
            cc.td_targets(r, v, **kw)


@pytest.mark.parametrize("cu", [[1, 8, 16, 24], [0, 8, 4, 24], [0, 8, 16, 23]])
def test_layout_errors_are_the_same_for_int64_and_int32_offsets(cu: list[int]) -> None:
    kw = _batch()
    r, v = kw["rewards"].reshape(-1), kw["values"].reshape(-1)
    messages = set()
    for dtype in (np.int64, np.int32):
        for fn in (lambda c: cc.gae(r, v, cu_seqlens=c), lambda c: cc.td_targets(r, v, cu_seqlens=c),
                   lambda c: cc.gates_from_concentration(r, cu_seqlens=c)):  # fmt: skip
            with pytest.raises(cc.LayoutError, match="cu_seqlens") as info:
                fn(np.array(cu, dtype))
            messages.add(str(info.value))
    assert len(messages) == 1


def test_empty_or_two_dimensional_offsets() -> None:
    kw = _batch()
    r, v = kw["rewards"].reshape(-1), kw["values"].reshape(-1)
    with pytest.raises(cc.LayoutError, match="at least one entry"):
        cc.gae(r, v, cu_seqlens=np.array([], np.int64))
    with pytest.raises(cc.ShapeError, match="cu_seqlens"):
        cc.gae(r, v, cu_seqlens=np.array([[0, 8, 16, 24]]))


# ---------------------------------------------------------------- unaligned views


@pytest.mark.parametrize("which", ["rewards", "values", "gates", "last_values", "cu_seqlens", "out"])
def test_unaligned_arrays_are_read_or_named_never_a_panic(which: str) -> None:
    """An unaligned view cannot be read as a Rust slice: inputs are copied, an unaligned
    ``out`` is named."""
    kw = _batch()
    if which == "cu_seqlens":
        kw = _packed(kw)
    kw["last_values"] = np.array([0.5, -1.0, 2.0])
    r, v = kw.pop("rewards"), kw.pop("values")
    want = cc.gae(r, v, **kw)
    if which == "rewards":
        r = _unaligned(r)
    elif which == "values":
        v = _unaligned(v)
    elif which == "out":
        kw["out"] = (_unaligned(np.zeros_like(r)), np.zeros_like(r))
    else:
        kw[which] = _unaligned(kw[which])
    if which == "out":
        with pytest.raises(
            cc.ShapeError, match=r"out \(advantages\): expected a writeable, aligned C-contiguous array"
        ):
            cc.gae(r, v, **kw)
        return
    _same(tuple(cc.gae(r, v, **kw)), tuple(want))
    td = {k: kw[k] for k in ("mask", "cu_seqlens", "gates", "last_values") if k in kw}
    _same(cc.td_targets(r, v, **td), cc.td_targets(np.ascontiguousarray(r), np.ascontiguousarray(v), **{
        k: np.ascontiguousarray(a) for k, a in td.items()}))  # fmt: skip


def test_unaligned_whitening_and_group_arguments_never_panic() -> None:
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    m = np.ones((3, 8), bool)
    want = cc.masked_whiten(x, mask=m)
    _same(cc.masked_whiten(_unaligned(x), mask=m), want)
    with pytest.raises(cc.ShapeError, match="aligned"):
        cc.masked_whiten(x, mask=m, out=_unaligned(np.zeros_like(x)))
    inplace = _unaligned(x)
    assert cc.masked_whiten(inplace, mask=m, out=inplace) is inplace
    _same(inplace, want)
    s, g = np.arange(6.0), np.array([0, 0, 1, 1, 2, 2])
    want_g = cc.group_advantages(s, g)
    for args in ((_unaligned(s), g), (s, _unaligned(g))):
        _same(cc.group_advantages(*args), want_g)
    _same(cc.broadcast(_unaligned(s[:3]), mask=m), cc.broadcast(s[:3], mask=m))
    stats = cc.credit_stats(_unaligned(x), mask=m)
    assert stats == cc.credit_stats(x, mask=m)
