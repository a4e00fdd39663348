"""The plain path (rust/bindings/plain.rs) against the general path: ``gae`` first,
then ``td_targets``, ``gates_from_concentration``, ``masked_whiten`` and
``group_advantages``, which follow the same pattern.

``comppo_core.gae`` first offers its arguments to ``_core.gae_plain``, which computes
at once when every array is a NumPy array the kernel takes as it is, and otherwise
returns None having touched nothing; the general path (``advantages._gae``) then
converts the arguments or raises. These tests pin that the plain path is taken for the
common call, that it gives bit-identical results to the general one, and that every
other kind of argument falls through to the general path with its result or error.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import comppo_core as cc
from comppo_core import _core
from comppo_core.advantages import _gae

from strategies import FLOATS, assert_unchanged, batches, unit_interval

GENERAL_DEFAULTS: dict[str, Any] = {
    "mask": None,
    "cu_seqlens": None,
    "gates": None,
    "gamma": 1.0,
    "lam": 1.0,
    "lam_critic": None,
    "last_values": None,
    "masked_rewards": "error",
    "out": None,
}


def plain(rewards: Any, values: Any, **kw: Any) -> Any:
    """``_core.gae_plain`` with ``gae``'s keywords."""
    a = {**GENERAL_DEFAULTS, **kw}
    return _core.gae_plain(
        rewards, values, a["mask"], a["cu_seqlens"], a["gates"], a["last_values"], a["out"],
        a["gamma"], a["lam"], a["lam_critic"], a["masked_rewards"],
    )  # fmt: skip


def general(rewards: Any, values: Any, **kw: Any) -> Any:
    return _gae(rewards, values, **{**GENERAL_DEFAULTS, **kw})


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", result)`` or ``("raised", (type, message))``."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001 - compared as a value
        return "raised", (type(e), str(e))


def assert_same_outcome(a: tuple[str, Any], b: tuple[str, Any]) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "raised":
        assert a[1] == b[1]
    else:
        for x, y in zip(a[1], b[1]):
            assert x.dtype == y.dtype and x.shape == y.shape
            np.testing.assert_array_equal(x, y)


@given(
    batch=batches(dtypes=FLOATS),
    packed=st.booleans(),
    gamma=unit_interval(),
    lam=unit_interval(),
    lam_critic=st.none() | unit_interval(),
    with_out=st.booleans(),
)
def test_plain_path_is_taken_and_equals_the_general_path(
    batch: Any, packed: bool, gamma: float, lam: float, lam_critic: float | None, with_out: bool
) -> None:
    if batch.mask is not None and batch.mask.dtype != np.bool_:
        batch.mask = batch.valid.copy()
    batch.cu_dtype = np.dtype(np.int64)
    r, v, kw = batch.packed() if packed else batch.padded()
    kw.update(gamma=gamma, lam=lam, lam_critic=lam_critic)
    before = [r.copy(), v.copy(), *(None if x is None else x.copy() for x in kw.values() if isinstance(x, np.ndarray))]
    out = (np.full_like(r, 7.0), np.full_like(r, 7.0)) if with_out else None
    got = plain(r, v, out=out, **kw)
    assert got is not None, "the common call must take the plain path"
    if with_out:
        assert got[0] is out[0] and got[1] is out[1]
    want = general(r, v, **kw)
    assert_same_outcome(("ok", got), ("ok", want))
    assert_same_outcome(("ok", cc.gae(r, v, **kw)), ("ok", want))
    after = [r, v, *(x for x in kw.values() if isinstance(x, np.ndarray))]
    assert_unchanged(before, after)


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


def _not_plain_cases() -> dict[str, Callable[[], dict[str, Any]]]:
    """Calls the plain path must hand to the general path, as keyword dicts."""

    def case(**change: Any) -> Callable[[], dict[str, Any]]:
        def make() -> dict[str, Any]:
            kw = _batch()
            for k, f in change.items():
                kw[k] = f(kw) if callable(f) else f
            return kw

        return make

    shared = np.zeros(64, np.float32)
    cases = {
        "float16 rewards": case(rewards=lambda k: k["rewards"].astype(np.float16)),
        "integer rewards": case(rewards=lambda k: np.round(k["rewards"]).astype(np.int64)),
        "strided rewards": case(rewards=lambda k: np.repeat(k["rewards"], 2, axis=1)[:, ::2]),
        "fortran values": case(values=lambda k: np.asfortranarray(k["values"])),
        "big-endian values": case(values=lambda k: k["values"].astype(">f4")),
        "float64 gates with float32 rewards": case(gates=lambda k: k["gates"].astype(np.float64)),
        "list values": case(values=lambda k: k["values"].tolist()),
        "uint8 mask": case(mask=lambda k: k["mask"].astype(np.uint8)),
        "mask of another shape": case(mask=lambda k: k["mask"][:, :4].copy()),
        "3-D rewards": case(rewards=lambda k: k["rewards"][None], values=lambda k: k["values"][None],
                            mask=lambda k: k["mask"][None], gates=lambda k: k["gates"][None]),
        "1-D rewards without cu_seqlens": case(rewards=lambda k: k["rewards"].reshape(-1),
                                               values=lambda k: k["values"].reshape(-1), mask=None, gates=None),
        "float32 last_values": case(last_values=np.zeros(3, np.float32)),
        "last_values of the wrong length": case(last_values=np.zeros(4)),
        "gamma above 1": case(gamma=1.5),
        "gamma NaN": case(gamma=float("nan")),
        "gamma a string": case(gamma="0.9"),
        "lam_critic below 0": case(lam_critic=-0.1),
        "unknown masked_rewards": case(masked_rewards="ignore"),
        "out a list": case(out=lambda k: [np.empty_like(k["rewards"]), np.empty_like(k["rewards"])]),
        "out of another dtype": case(out=lambda k: (np.empty((3, 8)), np.empty((3, 8)))),
        "out read-only": case(out=lambda k: (np.empty_like(k["rewards"]), np.empty_like(k["rewards"]).copy())),
        "out the same array twice": case(out=lambda k: (lambda a: (a, a))(np.empty_like(k["rewards"]))),
        "out is rewards": case(out=lambda k: (k["rewards"], np.empty_like(k["rewards"]))),
        "out overlaps values through another object": case(
            values=lambda k: _put(shared[:24], k["values"]).reshape(3, 8),
            out=lambda k: (np.empty_like(k["rewards"]), np.frombuffer(shared.data, np.float32)[8:32].reshape(3, 8)),
        ),
    }
    return cases


def _put(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    dst[...] = src.reshape(dst.shape)
    return dst


@pytest.mark.parametrize("name", list(_not_plain_cases()))
def test_other_arguments_take_the_general_path(name: str) -> None:
    kw = _not_plain_cases()[name]()
    if name == "out read-only":
        kw["out"][1].flags.writeable = False
    r, v = kw.pop("rewards"), kw.pop("values")
    assert plain(r, v, **kw) is None
    assert_same_outcome(outcome(lambda: cc.gae(r, v, **kw)), outcome(lambda: general(r, v, **kw)))


def test_packed_cu_seqlens_must_be_int64_for_the_plain_path() -> None:
    kw = _batch()
    r, v = kw["rewards"].reshape(-1), kw["values"].reshape(-1)
    for cu in (np.array([0, 8, 16, 24], np.int32), np.array([[0, 8, 16, 24]]), np.array([], np.int64)):
        assert plain(r, v, cu_seqlens=cu) is None
        assert_same_outcome(outcome(lambda: cc.gae(r, v, cu_seqlens=cu)), outcome(lambda: general(r, v, cu_seqlens=cu)))
    cu = np.array([0, 8, 16, 24], np.int64)
    assert plain(r, v, cu_seqlens=cu) is not None


@pytest.mark.parametrize(
    "spoil",
    [
        lambda k: k["rewards"].__setitem__((1, 3), np.nan),
        lambda k: k["gates"].__setitem__((2, 6), 1.5),
        lambda k: k["rewards"].__setitem__((0, 6), 2.0),  # a reward on a masked token
        lambda k: k["values"].__setitem__((2, 0), np.inf),
    ],
)
def test_kernel_errors_are_the_same_on_both_paths(spoil: Callable[[dict[str, Any]], None]) -> None:
    kw = _batch()
    spoil(kw)
    r, v = kw.pop("rewards"), kw.pop("values")
    got, want = outcome(lambda: plain(r, v, **kw)), outcome(lambda: general(r, v, **kw))
    assert got[0] == "raised"
    assert_same_outcome(got, want)


def test_packed_layout_errors_are_the_same_on_both_paths() -> None:
    kw = _batch()
    r, v = kw["rewards"].reshape(-1), kw["values"].reshape(-1)
    for cu in ([1, 8, 16, 24], [0, 8, 4, 24], [0, 8, 16, 23]):
        cu64 = np.array(cu, np.int64)
        got, want = outcome(lambda: plain(r, v, cu_seqlens=cu64)), outcome(lambda: general(r, v, cu_seqlens=cu64))
        assert got[0] == "raised"
        assert_same_outcome(got, want)


def test_tensors_take_the_general_path() -> None:
    torch = pytest.importorskip("torch")
    kw = _batch()
    r, v = torch.from_numpy(kw["rewards"]), torch.from_numpy(kw["values"])
    assert plain(r, v, mask=torch.from_numpy(kw["mask"])) is None
    adv, ret = cc.gae(r, v, mask=torch.from_numpy(kw["mask"]))
    assert isinstance(adv, torch.Tensor) and isinstance(ret, torch.Tensor)
    want = general(kw["rewards"], kw["values"], mask=kw["mask"])
    np.testing.assert_array_equal(adv.numpy(), want[0])


# ---------------------------------------------------------------- td_targets
from comppo_core.advantages import _td_targets  # noqa: E402

TD_KEYWORDS = ("mask", "cu_seqlens", "gates", "gamma", "last_values")


def td_plain(rewards: Any, values: Any, **kw: Any) -> Any:
    """``_core.td_targets_plain`` with ``td_targets``' keywords."""
    a = {**GENERAL_DEFAULTS, **kw}
    return _core.td_targets_plain(rewards, values, a["mask"], a["cu_seqlens"], a["gates"], a["last_values"], a["gamma"])


def td_general(rewards: Any, values: Any, **kw: Any) -> Any:
    return _td_targets(rewards, values, **{k: {**GENERAL_DEFAULTS, **kw}[k] for k in TD_KEYWORDS})


@given(batch=batches(dtypes=FLOATS), packed=st.booleans(), gamma=unit_interval())
def test_td_plain_path_is_taken_and_equals_the_general_path(batch: Any, packed: bool, gamma: float) -> None:
    if batch.mask is not None and batch.mask.dtype != np.bool_:
        batch.mask = batch.valid.copy()
    batch.cu_dtype = np.dtype(np.int64)
    r, v, kw = batch.packed() if packed else batch.padded()
    kw["gamma"] = gamma
    before = [r.copy(), v.copy(), *(x.copy() for x in kw.values() if isinstance(x, np.ndarray))]
    got = td_plain(r, v, **kw)
    assert got is not None, "the common call must take the plain path"
    want = td_general(r, v, **kw)
    assert_same_outcome(("ok", (got,)), ("ok", (want,)))
    assert_same_outcome(("ok", (cc.td_targets(r, v, **kw),)), ("ok", (want,)))
    assert_unchanged(before, [r, v, *(x for x in kw.values() if isinstance(x, np.ndarray))])


def _td_not_plain_cases() -> list[str]:
    """The cases of ``_not_plain_cases`` that use only ``td_targets``' arguments."""
    own = {"rewards", "values", *TD_KEYWORDS}
    return [name for name, make in _not_plain_cases().items() if set(make()) <= own]


@pytest.mark.parametrize("name", _td_not_plain_cases())
def test_td_other_arguments_take_the_general_path(name: str) -> None:
    kw = _not_plain_cases()[name]()
    r, v = kw.pop("rewards"), kw.pop("values")
    assert td_plain(r, v, **kw) is None
    got, want = outcome(lambda: (cc.td_targets(r, v, **kw),)), outcome(lambda: (td_general(r, v, **kw),))
    assert_same_outcome(got, want)


def test_td_not_plain_cases_cover_every_kind_of_argument() -> None:
    names = _td_not_plain_cases()
    for expected in ("float16 rewards", "strided rewards", "uint8 mask", "float32 last_values", "gamma above 1"):
        assert expected in names


@pytest.mark.parametrize(
    "spoil",
    [
        lambda k: k["rewards"].__setitem__((1, 3), np.nan),
        lambda k: k["gates"].__setitem__((2, 6), 1.5),
        lambda k: k["values"].__setitem__((2, 0), np.inf),
    ],
)
def test_td_kernel_errors_are_the_same_on_both_paths(spoil: Callable[[dict[str, Any]], None]) -> None:
    kw = _batch()
    spoil(kw)
    r, v = kw.pop("rewards"), kw.pop("values")
    got, want = outcome(lambda: td_plain(r, v, **kw)), outcome(lambda: td_general(r, v, **kw))
    assert got[0] == "raised"
    assert_same_outcome(got, want)


def test_td_packed_layout_and_tensors() -> None:
    kw = _batch()
    r, v = kw["rewards"].reshape(-1), kw["values"].reshape(-1)
    for cu in ([1, 8, 16, 24], [0, 8, 4, 24], [0, 8, 16, 23]):
        cu64 = np.array(cu, np.int64)
        got, want = outcome(lambda: td_plain(r, v, cu_seqlens=cu64)), outcome(lambda: td_general(r, v, cu_seqlens=cu64))
        assert got[0] == "raised"
        assert_same_outcome(got, want)
    assert td_plain(r, v, cu_seqlens=np.array([0, 8, 16, 24], np.int32)) is None
    for which in ("rewards", "gates", "last_values"):
        k = {**_batch(), "last_values": np.array([0.5, -1.0, 2.0])}
        k[which] = _unaligned(k[which])
        rr, vv = k.pop("rewards"), k.pop("values")
        assert td_plain(rr, vv, **k) is None
        np.testing.assert_array_equal(cc.td_targets(rr, vv, **k), td_general(np.ascontiguousarray(rr), vv, **k))
    torch = pytest.importorskip("torch")
    kw = _batch()
    tr, tv = torch.from_numpy(kw["rewards"]), torch.from_numpy(kw["values"])
    assert td_plain(tr, tv, mask=torch.from_numpy(kw["mask"])) is None
    y = cc.td_targets(tr, tv, mask=torch.from_numpy(kw["mask"]))
    assert isinstance(y, torch.Tensor)
    np.testing.assert_array_equal(y.numpy(), td_general(kw["rewards"], kw["values"], mask=kw["mask"]))


# ---------------------------------------------------------------- gates_from_concentration
from comppo_core.gating import _gates_from_concentration  # noqa: E402

GATE_DEFAULTS: dict[str, Any] = {
    "mask": None, "cu_seqlens": None, "low": 0.9, "high": 1.0, "sharpness": 1.0,
    "normalize": "sequence", "center": 0.0, "scale": 1.0, "invert": False,
}  # fmt: skip


def gates_plain(conc: Any, **kw: Any) -> Any:
    """``_core.gates_from_concentration_plain`` with the public function's keywords."""
    a = {**GATE_DEFAULTS, **kw}
    return _core.gates_from_concentration_plain(
        conc, a["mask"], a["cu_seqlens"], a["low"], a["high"], a["sharpness"], a["normalize"], a["center"], a["scale"], a["invert"]
    )


def gates_general(conc: Any, **kw: Any) -> Any:
    return _gates_from_concentration(conc, **{**GATE_DEFAULTS, **kw})


@given(
    batch=batches(dtypes=FLOATS),
    packed=st.booleans(),
    bounds=st.tuples(unit_interval(), unit_interval()),
    sharpness=st.sampled_from([0.0, 0.5, 1.0, 4.0]),
    normalize=st.sampled_from(["sequence", "batch", "none"]),
    invert=st.booleans(),
)
def test_gates_plain_path_is_taken_and_equals_the_general_path(
    batch: Any, packed: bool, bounds: tuple[float, float], sharpness: float, normalize: str, invert: bool
) -> None:
    """Bounds in either order: ``low > high`` is the kernel's error on both paths."""
    if batch.mask is not None and batch.mask.dtype != np.bool_:
        batch.mask = batch.valid.copy()
    batch.cu_dtype = np.dtype(np.int64)
    _, conc, kw = batch.packed() if packed else batch.padded()
    kw = {"mask": kw["mask"], "cu_seqlens": kw.get("cu_seqlens")}
    kw.update(low=bounds[0], high=bounds[1], sharpness=sharpness, normalize=normalize, center=0.5, scale=2.0, invert=invert)
    before = [conc.copy(), *(x.copy() for x in kw.values() if isinstance(x, np.ndarray))]
    got = outcome(lambda: (gates_plain(conc, **kw),))
    assert got[0] == "raised" or got[1][0] is not None, "the common call must take the plain path"
    want = outcome(lambda: (gates_general(conc, **kw),))
    assert_same_outcome(got, want)
    assert_same_outcome(outcome(lambda: (cc.gates_from_concentration(conc, **kw),)), want)
    assert_unchanged(before, [conc, *(x for x in kw.values() if isinstance(x, np.ndarray))])


def _gates_not_plain_cases() -> dict[str, Callable[[], tuple[np.ndarray, dict[str, Any]]]]:
    """Calls the gates plain path must hand to the general path: ``(conc, kwargs)``."""

    def case(conc: Callable[[np.ndarray], Any] = lambda c: c, **kw: Any) -> Callable[[], tuple[np.ndarray, dict[str, Any]]]:
        def make() -> tuple[np.ndarray, dict[str, Any]]:
            b = _batch()
            return conc(b["gates"]), {"mask": b["mask"], **kw}

        return make

    return {
        "float16 conc": case(lambda c: c.astype(np.float16)),
        "strided conc": case(lambda c: np.repeat(c, 2, axis=1)[:, ::2]),
        "list conc": case(lambda c: c.tolist()),
        "unaligned conc": case(lambda c: _unaligned(c)),
        "uint8 mask": case(mask=_batch()["mask"].astype(np.uint8)),
        "low NaN": case(low=float("nan")),
        "high inf": case(high=float("inf")),
        "low a string": case(low="0.5"),
        "unknown normalize": case(normalize="rows"),
        "invert an int": case(invert=1),
        "invert a NumPy bool": case(invert=np.bool_(True)),
    }


@pytest.mark.parametrize("name", list(_gates_not_plain_cases()))
def test_gates_other_arguments_take_the_general_path(name: str) -> None:
    conc, kw = _gates_not_plain_cases()[name]()
    assert gates_plain(conc, **kw) is None
    got = outcome(lambda: (cc.gates_from_concentration(conc, **kw),))
    assert_same_outcome(got, outcome(lambda: (gates_general(conc, **kw),)))


@pytest.mark.parametrize(
    "change",
    [{"low": 1.5}, {"low": 0.95, "high": 0.9}, {"normalize": "none", "scale": 0.0}, {"conc_nan": (1, 2)}],
)
def test_gates_kernel_errors_are_the_same_on_both_paths(change: dict[str, Any]) -> None:
    b = _batch()
    conc, kw = b["gates"], {"mask": b["mask"], **change}
    if "conc_nan" in kw:
        conc[kw.pop("conc_nan")] = np.nan
    got, want = outcome(lambda: gates_plain(conc, **kw)), outcome(lambda: gates_general(conc, **kw))
    assert got[0] == "raised"
    assert_same_outcome(got, want)


def test_gates_packed_cu_seqlens_and_tensors() -> None:
    b = _batch()
    conc = b["gates"].reshape(-1)
    for cu in ([1, 8, 16, 24], [0, 8, 4, 24]):
        cu64 = np.array(cu, np.int64)
        got, want = outcome(lambda: gates_plain(conc, cu_seqlens=cu64)), outcome(lambda: gates_general(conc, cu_seqlens=cu64))
        assert got[0] == "raised"
        assert_same_outcome(got, want)
    assert gates_plain(conc, cu_seqlens=np.array([0, 8, 16, 24], np.int32)) is None
    assert gates_plain(conc, cu_seqlens=np.array([0, 8, 16, 24], np.int64)) is not None
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(b["gates"])
    assert gates_plain(t) is None
    y = cc.gates_from_concentration(t, mask=torch.from_numpy(b["mask"]))
    assert isinstance(y, torch.Tensor)
    np.testing.assert_array_equal(y.numpy(), gates_general(b["gates"], mask=b["mask"]))


# ---------------------------------------------------------------- masked_whiten
from comppo_core.whitening import _masked_whiten  # noqa: E402


def whiten_plain(x: Any, mask: Any = None, cu_seqlens: Any = None, shift_mean: Any = True, eps: Any = 1e-8, out: Any = None) -> Any:
    return _core.masked_whiten_plain(x, mask, cu_seqlens, shift_mean, eps, out)


def whiten_general(x: Any, mask: Any = None, cu_seqlens: Any = None, shift_mean: Any = True, eps: Any = 1e-8, out: Any = None) -> Any:
    return _masked_whiten(x, mask=mask, cu_seqlens=cu_seqlens, shift_mean=shift_mean, eps=eps, out=out)


@given(batch=batches(dtypes=FLOATS), packed=st.booleans(), shift_mean=st.booleans(), with_out=st.booleans())
def test_whiten_plain_path_is_taken_and_equals_the_general_path(
    batch: Any, packed: bool, shift_mean: bool, with_out: bool
) -> None:
    if batch.mask is not None and batch.mask.dtype != np.bool_:
        batch.mask = batch.valid.copy()
    batch.cu_dtype = np.dtype(np.int64)
    x, _, kw = batch.packed() if packed else batch.padded()
    kw = {"mask": kw["mask"], "cu_seqlens": kw.get("cu_seqlens")}
    before = [x.copy(), None if kw["mask"] is None else kw["mask"].copy()]
    out = np.full_like(x, 7.0) if with_out else None
    got = outcome(lambda: (whiten_plain(x, shift_mean=shift_mean, out=out, **kw),))
    want = outcome(lambda: (whiten_general(x, shift_mean=shift_mean, **kw),))
    if got[0] == "ok":  # else the kernel raised (fewer than two valid tokens): compared below
        assert got[1][0] is not None, "the common call must take the plain path"
        assert not with_out or got[1][0] is out
    assert_same_outcome(got, want)
    assert_same_outcome(outcome(lambda: (cc.masked_whiten(x, shift_mean=shift_mean, **kw),)), want)
    assert_unchanged(before, [x, kw["mask"]])


def _whiten_not_plain_cases() -> dict[str, Callable[[], dict[str, Any]]]:
    def case(**change: Any) -> Callable[[], dict[str, Any]]:
        def make() -> dict[str, Any]:
            b = _batch()
            kw = {"x": b["rewards"], "mask": b["mask"]}
            for k, f in change.items():
                kw[k] = f(kw) if callable(f) else f
            return kw

        return make

    return {
        "float16 x": case(x=lambda k: k["x"].astype(np.float16)),
        "strided x": case(x=lambda k: np.repeat(k["x"], 2, axis=1)[:, ::2]),
        "int8 mask": case(mask=lambda k: k["mask"].astype(np.int8)),
        "eps negative": case(eps=-1.0),
        "eps infinite": case(eps=float("inf")),
        "shift_mean not a bool": case(shift_mean=1),
        "out=x (in place)": case(out=lambda k: k["x"]),
        "out of another dtype": case(out=np.empty((3, 8))),
        "out a view of x": case(out=lambda k: k["x"][:, :]),
        "out a tuple": case(out=lambda k: (np.empty_like(k["x"]),)),
    }


@pytest.mark.parametrize("name", list(_whiten_not_plain_cases()))
def test_whiten_other_arguments_take_the_general_path(name: str) -> None:
    kw = _whiten_not_plain_cases()[name]()
    assert whiten_plain(**kw) is None
    if name == "out=x (in place)":  # whitens x itself: compare on copies
        kw2 = {**kw, "x": kw["x"].copy()}
        kw2["out"] = kw2["x"]
        assert_same_outcome(outcome(lambda: (cc.masked_whiten(**kw),)), outcome(lambda: (whiten_general(**kw2),)))
        return
    assert_same_outcome(outcome(lambda: (cc.masked_whiten(**kw),)), outcome(lambda: (whiten_general(**kw),)))


# ---------------------------------------------------------------- group_advantages
from comppo_core.outcomes import _group_advantages  # noqa: E402

GROUP_METHODS = ["grpo", "drgrpo", "rloo", "reinforce_baseline"]


@given(
    scores=st.lists(st.floats(-1e6, 1e6), max_size=40),
    n_groups=st.integers(1, 6),
    method=st.sampled_from(GROUP_METHODS),
    singleton=st.sampled_from(["zero", "raw"]),
    eps=st.sampled_from([0.0, 1e-6, 0.5]),
    data=st.data(),
)
def test_group_plain_path_is_taken_and_equals_the_general_path(
    scores: list[float], n_groups: int, method: str, singleton: str, eps: float, data: Any
) -> None:
    s = np.array(scores, np.float64)
    g = np.array(data.draw(st.lists(st.integers(-3, n_groups), min_size=len(s), max_size=len(s))), np.int64)
    before = [s.copy(), g.copy()]
    # The same result or the same error (subnormal scores can make a group's spread
    # round to zero, and with eps = 0 the advantages overflow: both paths refuse).
    got = outcome(lambda: (_core.group_advantages_plain(s, g, method, eps, singleton),))
    if got[0] == "ok":
        assert got[1][0] is not None and got[1][0].dtype == np.float64
    want = outcome(lambda: (_group_advantages(s, g, method=method, eps=eps, singleton=singleton),))
    assert_same_outcome(got, want)
    assert_same_outcome(outcome(lambda: (cc.group_advantages(s, g, method=method, eps=eps, singleton=singleton),)), want)
    assert_unchanged(before, [s, g])


def test_group_plain_path_refuses_an_overflow_like_the_general_path() -> None:
    """Found by the property above: a group of 0 and a subnormal score has a spread that
    rounds to zero, so with eps = 0 GRPO's advantages would be ±inf."""
    s, g = np.array([0.0, 2.2250738585e-313]), np.array([0, 0])
    for fn in (
        lambda: _core.group_advantages_plain(s, g, "grpo", 0.0, "zero"),
        lambda: _group_advantages(s, g, method="grpo", eps=0.0, singleton="zero"),
        lambda: cc.group_advantages(s, g, method="grpo", eps=0.0),
    ):
        with pytest.raises(cc.ParameterError, match="overflow at index 0"):
            fn()


@pytest.mark.parametrize(
    "change",
    [
        {"scores": np.arange(6, dtype=np.float32)},
        {"scores": np.arange(6)},
        {"scores": np.arange(12.0)[::2]},
        {"scores": np.arange(6.0).reshape(2, 3)},
        {"groups": np.array([0, 0, 1, 1, 2, 2], np.int32)},
        {"groups": np.array(["a", "a", "b", "b", "c", "c"])},
        {"groups": [0, 0, 1, 1, 2, 2]},
        {"groups": np.zeros(5, np.int64)},
        {"method": "ppo"},
        {"singleton": "drop"},
        {"eps": -1.0},
        {"eps": float("nan")},
        {"scores": np.array([0.0, 1.0, np.nan, 3.0, 4.0, 5.0])},  # plain: the kernel raises
    ],
)
def test_group_other_arguments_take_the_general_path(change: dict[str, Any]) -> None:
    kw: dict[str, Any] = {"scores": np.arange(6.0), "groups": np.array([0, 0, 1, 1, 2, 2]), "method": "grpo",
                          "eps": 1e-6, "singleton": "zero", **change}  # fmt: skip
    plain_kernel_error = "scores" in change and np.isnan(np.asarray(change["scores"], dtype=float)).any()
    if not plain_kernel_error:
        assert _core.group_advantages_plain(kw["scores"], kw["groups"], kw["method"], kw["eps"], kw["singleton"]) is None
    s, g = kw.pop("scores"), kw.pop("groups")
    got = outcome(lambda: (cc.group_advantages(s, g, **kw),))
    want = outcome(lambda: (_group_advantages(s, g, **kw),))
    assert_same_outcome(got, want)
    if plain_kernel_error:
        assert got[0] == "raised"


# ---------------------------------------------------------------- unaligned arrays
def _unaligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous but unaligned copy of ``a`` (a view one byte into a buffer)."""
    buf = np.zeros(a.nbytes + 1, np.uint8)
    out = buf[1:].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert out.flags.c_contiguous and not out.flags.aligned
    return out


@pytest.mark.parametrize("which", ["rewards", "values", "gates", "last_values", "cu_seqlens", "out"])
def test_unaligned_arrays_are_read_or_named_never_a_panic(which: str) -> None:
    """An unaligned view cannot be read as a Rust slice: the plain path hands it on,
    the general path copies inputs and names an unaligned ``out``."""
    kw = _batch()
    r, v = kw.pop("rewards"), kw.pop("values")
    packed = which == "cu_seqlens"
    if packed:
        m = kw.pop("mask")
        r, v, kw["gates"] = r[m], v[m], kw["gates"][m]
        kw["cu_seqlens"] = np.concatenate([[0], np.cumsum(m.sum(axis=1))]).astype(np.int64)
    kw["last_values"] = np.array([0.5, -1.0, 2.0])
    want = general(r, v, **kw)
    if which == "rewards":
        r = _unaligned(r)
    elif which == "values":
        v = _unaligned(v)
    elif which == "out":
        kw["out"] = (_unaligned(np.zeros_like(r)), np.zeros_like(r))
    else:
        kw[which] = _unaligned(kw[which])
    assert plain(r, v, **kw) is None
    if which == "out":
        with pytest.raises(cc.ShapeError, match=r"out \(advantages\): expected a writeable, aligned C-contiguous array"):
            cc.gae(r, v, **kw)
        return
    got = cc.gae(r, v, **kw)
    assert_same_outcome(("ok", got), ("ok", want))


def test_unaligned_whitening_and_group_arguments_never_panic() -> None:
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    m = np.ones((3, 8), bool)
    want = whiten_general(x, m)
    assert whiten_plain(_unaligned(x), m) is None
    np.testing.assert_array_equal(cc.masked_whiten(_unaligned(x), mask=m), want)
    with pytest.raises(cc.ShapeError, match="aligned"):
        cc.masked_whiten(x, mask=m, out=_unaligned(np.zeros_like(x)))
    inplace = _unaligned(x)
    assert cc.masked_whiten(inplace, mask=m, out=inplace) is inplace
    np.testing.assert_array_equal(inplace, want)
    s, g = np.arange(6.0), np.array([0, 0, 1, 1, 2, 2])
    want_g = _group_advantages(s, g, method="grpo", eps=1e-6, singleton="zero")
    for args in ((_unaligned(s), g), (s, _unaligned(g))):
        assert _core.group_advantages_plain(*args, "grpo", 1e-6, "zero") is None
        np.testing.assert_array_equal(cc.group_advantages(*args), want_g)
