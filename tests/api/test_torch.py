"""torch tensors in, torch tensors out (docs/design.md §2, §6) on the CPU.

Every public function takes torch tensors and gives back torch tensors (``credit_stats``
a dict of floats) of the dtype and device of its first array argument:

* float32 / float64 give exactly the NumPy path's numbers; bfloat16 (which NumPy lacks)
  and float16 are computed in float32 and cast back, so they equal "the float32 result,
  cast";
* CPU tensors are shared, not copied: the kernel reads the tensors' own memory and the
  returned tensors are the very buffers the kernel wrote;
* ``requires_grad`` inputs are read through ``detach()``; outputs never carry grad;
  inputs are never modified;
* tensors on different devices, a device other than CPU/CUDA ('meta' here: no GPU on
  CI), NumPy and tensors mixed with a NumPy array first, and ``out=`` with tensors are
  :class:`comppo_core.DTypeError`;
* any other ``__dlpack__`` producer goes the NumPy way and gives NumPy results.

CUDA itself is exercised by ``tests/gpu/test_cuda_paths.py`` on a GPU machine.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import DLPackProducer  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import comppo_core as cc  # noqa: E402
from comppo_core import _core  # noqa: E402
from comppo_core._torch import _CudaTransfer, _to_numpy_cpu  # noqa: E402

B, T = 4, 9
LENGTHS = np.array([9, 7, 5, 8])

TORCH_OF_NP = {
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
}


# --------------------------------------------------------------------------- #
# data and the table of public functions
# --------------------------------------------------------------------------- #


def make_data(seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """One ragged multi-turn batch in both layouts (float64 / bool / int64 arrays)."""
    rng = np.random.default_rng(seed)
    length = np.arange(T)[None, :] < LENGTHS[:, None]  # right padding
    turn = np.ones((B, T), dtype=bool)
    turn[0, 3] = False  # observation / tool tokens inside responses
    turn[3, 2:4] = False
    mask = length & turn
    padded = {
        "rewards": rng.standard_normal((B, T)) * mask,
        "values": rng.standard_normal((B, T)),
        "gates": rng.uniform(0.5, 1.0, (B, T)),
        "conc": rng.uniform(0.0, 1.0, (B, T)),
        "x": rng.standard_normal((B, T)),
        "per_seq": rng.standard_normal(B),
        "scores": rng.standard_normal(8),
        "groups": np.array([3, 1, 3, 1, 0, 0, 2, 2], dtype=np.int64),
        "mask": mask,
    }
    packed = {k: (v[length] if v.shape == (B, T) else v) for k, v in padded.items()}
    packed["cu"] = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int64)
    return {"padded": padded, "packed": packed}


DATA = make_data()


@dataclass(frozen=True)
class Arg:
    param: str  # the function's parameter
    key: str  # the data it takes
    is_float: bool  # converted to the dtype under test (else: keeps its own dtype)
    positional: bool = False


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[..., Any]
    args: tuple[Arg, ...]  # args[0] is the first array argument
    kwargs: dict[str, Any] = field(default_factory=dict)
    packed_ok: bool = True

    def call(
        self,
        conv_float: Callable[[np.ndarray], Any],
        conv_other: Callable[[np.ndarray], Any],
        *,
        layout: str = "padded",
        override: dict[str, Any] | None = None,
    ) -> Any:
        data = DATA[layout]
        pos, kw = [], dict(self.kwargs)
        for a in self.arrays(layout):
            val = (conv_float if a.is_float else conv_other)(data[a.key])
            if override and a.param in override:
                val = override[a.param]
            if a.positional:
                pos.append(val)
            else:
                kw[a.param] = val
        return self.fn(*pos, **kw)

    def arrays(self, layout: str = "padded") -> tuple[Arg, ...]:
        if layout == "packed":
            return (*self.args, Arg("cu_seqlens", "cu", False))
        return self.args


def _gae_args() -> tuple[Arg, ...]:
    return (
        Arg("rewards", "rewards", True, True),
        Arg("values", "values", True, True),
        Arg("mask", "mask", False),
        Arg("gates", "gates", True),
    )


def _unary(param: str, key: str) -> tuple[Arg, ...]:
    return (Arg(param, key, True, True), Arg("mask", "mask", False))


CASES = [
    Case("gae", cc.gae, _gae_args(), {"gamma": 0.97, "lam": 0.9}),
    Case("td_targets", cc.td_targets, _gae_args(), {"gamma": 0.97}),
    Case(
        "gates_from_concentration",
        cc.gates_from_concentration,
        _unary("conc", "conc"),
        {"params": cc.GateParams(low=0.5, sharpness=2.0)},
    ),
    Case(
        "group_advantages",
        cc.group_advantages,
        (Arg("scores", "scores", True, True), Arg("groups", "groups", False, True)),
        packed_ok=False,
    ),
    Case("broadcast", cc.broadcast, _unary("per_sequence", "per_seq")),
    Case("masked_whiten", cc.masked_whiten, _unary("x", "x")),
    Case("credit_stats", cc.credit_stats, _unary("x", "x")),
    Case("controls.shuffle", cc.controls.shuffle, _unary("gates", "gates"), {"seed": 3}),
    Case("controls.by_position", cc.controls.by_position, _unary("gates", "gates")),
    Case("controls.constant", cc.controls.constant, _unary("gates", "gates")),
]
CASE_IDS = [c.name for c in CASES]
PACKED_CASES = [c for c in CASES if c.packed_ok]

# (case, non-first array argument) pairs
OTHER_ARGS = [(c, a) for c in CASES for a in c.args[1:]]
OTHER_IDS = [f"{c.name}-{a.param}" for c, a in OTHER_ARGS]


def as_np(dtype: Any) -> Callable[[np.ndarray], np.ndarray]:
    return lambda a: a.astype(dtype)


def as_tensor(dtype: Any, **kw: Any) -> Callable[[np.ndarray], Any]:
    """float64 data → a tensor of ``dtype`` (via torch, so bfloat16 works too)."""

    def conv(a: np.ndarray) -> Any:
        return torch.from_numpy(a).to(dtype).requires_grad_(kw.get("requires_grad", False))

    return conv


def plain_tensor(a: np.ndarray) -> Any:
    return torch.from_numpy(a.copy())


# --------------------------------------------------------------------------- #
# result helpers
# --------------------------------------------------------------------------- #


def parts(result: Any) -> list[Any]:
    """The array results of a call (dicts of floats are handled separately)."""
    return list(result) if isinstance(result, tuple) else [result]


def assert_dict_of_floats(d: Any) -> None:
    assert isinstance(d, dict)
    assert d and all(type(v) is float for v in d.values()), d


def assert_tensor_result(case: Case, result: Any, like: Any) -> None:
    """Tensors of ``like``'s dtype and device (a dict of floats for credit_stats)."""
    if case.name == "credit_stats":
        assert_dict_of_floats(result)
        return
    if case.name == "gae":
        assert isinstance(result, cc.GAEResult)
    for r in parts(result):
        assert isinstance(r, torch.Tensor), type(r)
        assert r.device == like.device
        assert r.dtype == like.dtype, f"{case.name}: {like.dtype} in, {r.dtype} out"
        assert not r.requires_grad and r.grad_fn is None


def assert_same(got: Any, want: Any) -> None:
    """Equal results, exactly: tensors vs tensors or NumPy arrays, dicts vs dicts."""
    if isinstance(want, dict):
        assert got == want
        return
    for g, w in zip(parts(got), parts(want), strict=True):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor)
            assert g.dtype == w.dtype and g.shape == w.shape
            assert torch.equal(g, w), (g, w)
        else:
            g_np = g.numpy() if isinstance(g, torch.Tensor) else g
            assert g_np.shape == w.shape
            np.testing.assert_array_equal(g_np, w)


def cast(result: Any, dtype: Any) -> Any:
    """A tensor result cast to ``dtype`` (dicts unchanged)."""
    if isinstance(result, dict):
        return result
    if isinstance(result, tuple):
        return type(result)(*(r.to(dtype) for r in result))
    return result.to(dtype)


# --------------------------------------------------------------------------- #
# tensors in, tensors out
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_tensors_in_tensors_out(case: Case, dtype: Any) -> None:
    want = case.call(as_np(dtype), lambda a: a)
    inputs = {
        a.param: (as_tensor(TORCH_OF_NP[np.dtype(dtype)]) if a.is_float else plain_tensor)(DATA["padded"][a.key])
        for a in case.args
    }
    got = case.call(plain_tensor, plain_tensor, override=inputs)
    assert_tensor_result(case, got, inputs[case.args[0].param])
    assert_same(got, want)


@pytest.mark.parametrize(
    "mask_dtype", [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32, torch.float64]
)
@pytest.mark.parametrize("case", [c for c in CASES if any(a.param == "mask" for a in c.args)], ids=lambda c: c.name)
def test_mask_tensor_dtypes(case: Case, mask_dtype: Any) -> None:
    want = case.call(as_np(np.float32), lambda a: a)
    got = case.call(as_tensor(torch.float32), lambda a: torch.from_numpy(a).to(mask_dtype))
    assert_same(got, want)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_low_precision_round_trip(case: Case, low: Any) -> None:
    """bfloat16 / float16 in → same dtype out, equal to the float32 result of the same
    (already rounded) inputs, cast: they are computed in float32."""
    inputs = {a.param: torch.from_numpy(DATA["padded"][a.key]).to(low) for a in case.args if a.is_float}
    got = case.call(plain_tensor, plain_tensor, override=inputs)
    assert_tensor_result(case, got, inputs[case.args[0].param])
    in32 = {k: v.float() for k, v in inputs.items()}
    want = cast(case.call(plain_tensor, plain_tensor, override=in32), low)
    assert_same(got, want)
    if low == torch.float16:  # and the NumPy float16 path agrees
        np_want = case.call(lambda a: a.astype(np.float16), lambda a: a)
        assert_same(got, np_want)


@pytest.mark.parametrize(
    "case, layout",
    [(c, lay) for c in CASES for lay in ("padded", "packed") if lay == "padded" or c.packed_ok],
    ids=lambda x: x if isinstance(x, str) else x.name,
)
def test_dlpack_producer_goes_the_numpy_way(case: Case, layout: str) -> None:
    want = case.call(as_np(np.float32), lambda a: a, layout=layout)
    got = case.call(lambda a: DLPackProducer(a.astype(np.float32)), DLPackProducer, layout=layout)
    if isinstance(want, dict):
        assert_dict_of_floats(got)
    else:
        for g in parts(got):
            assert type(g) is np.ndarray
    assert_same(got, want)


# --------------------------------------------------------------------------- #
# zero copy on the CPU
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.bool, torch.int32, torch.int64])
def test_cpu_tensor_to_numpy_is_a_view(dtype: Any) -> None:
    base = torch.arange(40).reshape(5, 8).to(dtype)
    for t in (base, base[1:, 2:], base.T):
        arr = _to_numpy_cpu(t)
        assert arr.ctypes.data == t.data_ptr()
        assert arr.shape == tuple(t.shape)
        assert arr.strides == tuple(s * t.element_size() for s in t.stride())
    leaf = torch.zeros(3, 4, dtype=torch.float32, requires_grad=True)
    assert _to_numpy_cpu(leaf).ctypes.data == leaf.data_ptr()


class KernelSpy:
    """Wraps a ``comppo_core._core`` entry and records, of its last call, the data pointers
    of the arrays it was given (``args``, by position; None for anything else) and of
    the arrays it returned (``results``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.inner = getattr(_core, name)
        self.args: list[int | None] = []
        self.results: list[int] = []
        monkeypatch.setattr(_core, name, self)

    def __call__(self, *args: Any) -> Any:
        self.args = [a.ctypes.data if isinstance(a, np.ndarray) else None for a in args]
        result = self.inner(*args)
        if result is not None:
            self.results = [r.ctypes.data for r in (result if isinstance(result, tuple) else (result,))]
        return result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_kernel_reads_and_writes_tensor_memory(monkeypatch: pytest.MonkeyPatch, dtype: Any) -> None:
    d = DATA["padded"]
    r, v, g = (torch.from_numpy(d[k]).to(dtype) for k in ("rewards", "values", "gates"))
    m = torch.from_numpy(d["mask"])  # bool: a kernel mask dtype, read in place
    spy = KernelSpy(monkeypatch, "gae")
    adv: Any
    ret: Any
    adv, ret = cc.gae(r, v, mask=m, gates=g, gamma=0.9, lam=0.8)
    # inputs: the kernel saw the tensors' own memory (no copies)
    assert spy.args[:3] == [r.data_ptr(), v.data_ptr(), m.data_ptr()]  # rewards, values, mask
    assert spy.args[4] == g.data_ptr()
    # outputs: the returned tensors are the buffers the kernel wrote (torch.from_numpy)
    assert spy.results == [adv.data_ptr(), ret.data_ptr()]


@pytest.mark.parametrize(
    "name, fn",
    [
        ("masked_whiten", cc.masked_whiten),
        ("gates_from_concentration", cc.gates_from_concentration),
        ("broadcast", None),
    ],
)
def test_unary_kernels_read_and_write_tensor_memory(monkeypatch: pytest.MonkeyPatch, name: str, fn: Any) -> None:
    d = DATA["padded"]
    m = torch.from_numpy(d["mask"])
    spy = KernelSpy(monkeypatch, name)
    out: Any
    if fn is None:
        a = torch.from_numpy(d["per_seq"].astype(np.float32))
        out = cc.broadcast(a, mask=m)
    else:
        a = torch.from_numpy(d["x"].astype(np.float32))
        out = fn(a, mask=m)
    assert spy.args[:2] == [a.data_ptr(), m.data_ptr()]
    assert spy.results == [out.data_ptr()]


@pytest.mark.parametrize("case", [c for c in CASES if c.name != "credit_stats"], ids=lambda c: c.name)
def test_outputs_are_fresh_and_gradless(case: Case) -> None:
    inputs = {a.param: torch.from_numpy(DATA["padded"][a.key].copy()) for a in case.args}
    before = {k: t.clone() for k, t in inputs.items()}
    outs = parts(case.call(plain_tensor, plain_tensor, override=inputs))
    for i, o in enumerate(outs):
        assert not o.requires_grad and o.grad_fn is None
        assert o.is_leaf
        for t in [*inputs.values(), *outs[i + 1 :]]:
            assert not np.shares_memory(o.numpy(), t.numpy())
    for o in outs:
        o.add_(1.0)  # writing into an output never touches an input
    for k, t in inputs.items():
        assert torch.equal(t, before[k]), k


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_requires_grad_inputs(case: Case) -> None:
    want = case.call(as_tensor(torch.float32), plain_tensor)
    leaves = {
        a.param: as_tensor(torch.float32, requires_grad=True)(DATA["padded"][a.key]) for a in case.args if a.is_float
    }
    nonleaf = {k: t * 1.0 for k, t in leaves.items()}  # carries a grad_fn
    for inputs in (leaves, nonleaf):
        got = case.call(plain_tensor, plain_tensor, override=inputs)
        assert_tensor_result(case, got, inputs[case.args[0].param])
        assert_same(got, want)
    assert all(t.grad is None for t in leaves.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_inputs_never_modified(case: Case, dtype: Any) -> None:
    inputs = {a.param: (as_tensor(dtype) if a.is_float else plain_tensor)(DATA["padded"][a.key]) for a in case.args}
    before = {k: t.clone() for k, t in inputs.items()}
    case.call(plain_tensor, plain_tensor, override=inputs)
    for k, t in inputs.items():
        assert t.dtype == before[k].dtype
        assert torch.equal(t, before[k]), k


def test_non_contiguous_and_offset_tensors() -> None:
    d = DATA["padded"]
    r, v = (torch.from_numpy(np.ascontiguousarray(d[k].T)).T for k in ("rewards", "values"))
    assert not r.is_contiguous()
    m = torch.from_numpy(np.pad(d["mask"], ((1, 0), (0, 0))))[1:]  # storage offset
    assert m.storage_offset() > 0
    got: Any = cc.gae(r, v, mask=m, gamma=0.9, lam=0.7)
    want = cc.gae(d["rewards"], d["values"], mask=d["mask"], gamma=0.9, lam=0.7)
    assert_same(got, want)
    assert all(t.is_contiguous() for t in got)


def test_empty_tensors() -> None:
    for shape in [(0, 5), (3, 0)]:
        adv, ret = cc.gae(torch.zeros(shape), torch.zeros(shape), gamma=0.9)
        assert isinstance(adv, torch.Tensor) and adv.shape == shape and adv.dtype == torch.float32
        assert isinstance(ret, torch.Tensor) and ret.shape == shape


# --------------------------------------------------------------------------- #
# devices and mixing kinds: DTypeError
# --------------------------------------------------------------------------- #


TORCH_FOR_OTHER = {np.dtype(np.bool_): torch.bool, np.dtype(np.int64): torch.int64}


def meta_like(a: np.ndarray, is_float: bool) -> Any:
    dtype = torch.float32 if is_float else TORCH_FOR_OTHER[a.dtype]
    return torch.empty(a.shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("case, arg", OTHER_ARGS, ids=OTHER_IDS)
def test_second_tensor_on_another_device(case: Case, arg: Arg) -> None:
    meta = meta_like(DATA["padded"][arg.key], arg.is_float)
    with pytest.raises(cc.DTypeError, match=f"^{arg.param}: .*meta"):
        case.call(as_tensor(torch.float32), plain_tensor, override={arg.param: meta})


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_meta_device_alone(case: Case) -> None:
    lead = case.args[0]
    meta = meta_like(DATA["padded"][lead.key], lead.is_float)
    # the first argument alone (required positional partners on 'meta' too), the others absent
    pos = [meta] + [meta_like(DATA["padded"][a.key], a.is_float) for a in case.args[1:] if a.positional]
    with pytest.raises(cc.DTypeError, match=f"^{lead.param}: .*meta"):
        case.fn(*pos, **case.kwargs)
    # every array argument on 'meta' (same device everywhere, but not CPU or CUDA)
    all_meta = {a.param: meta_like(DATA["padded"][a.key], a.is_float) for a in case.args}
    with pytest.raises(cc.DTypeError, match="meta"):
        case.call(plain_tensor, plain_tensor, override=all_meta)
    # meta first, CPU after
    with pytest.raises(cc.DTypeError):
        case.call(as_tensor(torch.float32), plain_tensor, override={lead.param: meta})


@pytest.mark.parametrize("case, arg", OTHER_ARGS, ids=OTHER_IDS)
def test_numpy_first_then_tensor(case: Case, arg: Arg) -> None:
    t = (as_tensor(torch.float32) if arg.is_float else plain_tensor)(DATA["padded"][arg.key])
    with pytest.raises(cc.DTypeError, match=f"^{arg.param}: expected a NumPy array like {case.args[0].param}"):
        case.call(as_np(np.float32), lambda a: a, override={arg.param: t})


def test_tensor_dtype_errors_are_type_errors() -> None:
    r = torch.zeros(2, 3)
    with pytest.raises(TypeError):
        cc.gae(r, torch.zeros(2, 3, device="meta"))


def test_out_with_tensors_is_rejected() -> None:
    d = DATA["padded"]
    r, v = torch.from_numpy(d["rewards"]), torch.from_numpy(d["values"])
    np_out = (np.empty((B, T)), np.empty((B, T)))
    for out in (np_out, (torch.empty(B, T, dtype=torch.float64), torch.empty(B, T, dtype=torch.float64))):
        with pytest.raises(cc.DTypeError, match="^out: "):
            cc.gae(r, v, mask=torch.from_numpy(d["mask"]), out=out)
    # NumPy in, NumPy out= is fine
    got = cc.gae(d["rewards"], d["values"], mask=d["mask"], out=np_out)
    assert got.advantages is np_out[0]


# --------------------------------------------------------------------------- #
# packed layout with torch cu_seqlens
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", PACKED_CASES, ids=lambda c: c.name)
def test_packed_with_torch_cu_seqlens(case: Case, dtype: Any, cu_dtype: Any) -> None:
    def other(a: np.ndarray) -> Any:
        t = torch.from_numpy(a.copy())
        return t.to(cu_dtype) if a.dtype == np.int64 else t

    got = case.call(as_tensor(dtype), other, layout="packed")
    lead = as_tensor(dtype)(DATA["packed"][case.args[0].key])
    assert_tensor_result(case, got, lead)
    if dtype == torch.bfloat16:  # the float32 tensor path on the rounded inputs, cast
        want = cast(case.call(lambda a: as_tensor(dtype)(a).float(), other, layout="packed"), dtype)
    else:  # the NumPy path with NumPy cu_seqlens of the same dtype
        np_cu = np.int32 if cu_dtype == torch.int32 else np.int64
        want = case.call(
            as_np(np.float64 if dtype == torch.float64 else np.float32),
            lambda a: a.astype(np_cu) if a.dtype == np.int64 else a,
            layout="packed",
        )
    assert_same(got, want)


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
def test_packed_gae_equals_padded(cu_dtype: Any) -> None:
    p, q = DATA["padded"], DATA["packed"]
    length = np.arange(T)[None, :] < LENGTHS[:, None]
    kw: dict[str, Any] = {"gamma": 0.95, "lam": 0.9}
    packed = cc.gae(
        torch.from_numpy(q["rewards"]),
        torch.from_numpy(q["values"]),
        gates=torch.from_numpy(q["gates"]),
        mask=torch.from_numpy(q["mask"]),
        cu_seqlens=torch.from_numpy(q["cu"]).to(cu_dtype),
        **kw,
    )
    padded = cc.gae(
        torch.from_numpy(p["rewards"]),
        torch.from_numpy(p["values"]),
        gates=torch.from_numpy(p["gates"]),
        mask=torch.from_numpy(p["mask"]),
        **kw,
    )
    for got, want in zip(packed, padded):
        assert got.shape == (int(LENGTHS.sum()),)
        torch.testing.assert_close(got, want[torch.from_numpy(length)], rtol=0, atol=0)


# --------------------------------------------------------------------------- #
# the CUDA path's packing, emulated on the CPU
# --------------------------------------------------------------------------- #


@pytest.fixture
def cpu_stands_in_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lets ``_CudaTransfer`` run on CPU tensors: no pinned memory, no CUDA stream. The
    packing (one byte buffer per direction, NumPy views into it) is device-agnostic."""
    real_empty = torch.empty

    def empty(*args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(synchronize=lambda: None)
    )


@pytest.mark.parametrize("shape", [(4, 8), (3, 5)], ids=["4x8", "3x5"])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64], ids=["bool", "f32mask", "i64mask"])
@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.float32, torch.float64],
    ids=["float16", "bfloat16", "float32", "float64"],
)
def test_cuda_transfer_packing(
    cpu_stands_in_for_cuda: None, dtype: Any, mask_dtype: Any, shape: tuple[int, int]
) -> None:
    """All inputs of a call go into one byte buffer and come out as NumPy views; a view
    must start at an offset aligned for its dtype whatever precedes it (a bool mask of
    15 bytes, float16 data, ...), and the results come back the same way."""
    rng = np.random.default_rng(0)
    mask_np = rng.random(shape) < 0.8
    t = {
        "rewards": torch.from_numpy(rng.standard_normal(shape) * mask_np).to(dtype),
        "values": torch.from_numpy(rng.standard_normal(shape)).to(dtype),
        "mask": torch.from_numpy(mask_np).to(mask_dtype),
        "gates": torch.from_numpy(rng.uniform(0.5, 1.0, shape)).to(dtype),
        "last_values": torch.from_numpy(rng.standard_normal(shape[0])).to(dtype),
    }
    transfer = _CudaTransfer(t, torch.device("cpu"))
    arrays = transfer.arrays()
    for name, tensor in t.items():
        np.testing.assert_array_equal(arrays[name], _to_numpy_cpu(tensor), err_msg=name)
    result = cc.gae(
        arrays["rewards"],
        arrays["values"],
        mask=arrays["mask"],
        gates=arrays["gates"],
        last_values=arrays["last_values"],
        gamma=0.9,
        lam=0.8,
    )
    back = transfer.back(list(result), t["rewards"])
    want = cc.gae(
        t["rewards"], t["values"], mask=t["mask"], gates=t["gates"], last_values=t["last_values"], gamma=0.9, lam=0.8
    )
    for got, w in zip(back, want, strict=True):
        assert got.dtype == w.dtype == dtype
        assert torch.equal(got, w)


# --------------------------------------------------------------------------- #
# random batches: tensor path == NumPy path
# --------------------------------------------------------------------------- #


@settings(max_examples=40)
@given(
    b=st.integers(0, 5),
    t=st.integers(1, 12),
    dtype=st.sampled_from([np.float32, np.float64]),
    seed=st.integers(0, 2**32 - 1),
    gamma=st.floats(0, 1),
    lam=st.floats(0, 1),
    with_gates=st.booleans(),
)
def test_random_gae_tensor_equals_numpy(
    b: int, t: int, dtype: Any, seed: int, gamma: float, lam: float, with_gates: bool
) -> None:
    rng = np.random.default_rng(seed)
    mask = rng.random((b, t)) < 0.8
    r = (rng.standard_normal((b, t)) * mask).astype(dtype)
    v = rng.standard_normal((b, t)).astype(dtype)
    g = rng.uniform(0, 1, (b, t)).astype(dtype) if with_gates else None
    kw: dict[str, Any] = {"gamma": gamma, "lam": lam}
    want = cc.gae(r, v, mask=mask, gates=g, **kw)
    got = cc.gae(
        torch.from_numpy(r),
        torch.from_numpy(v),
        mask=torch.from_numpy(mask),
        gates=None if g is None else torch.from_numpy(g),
        **kw,
    )
    assert_same(got, want)


def test_case_table_is_consistent() -> None:
    """Guards the table above: each case's first argument is a float array passed
    positionally, and every public function of the brief is covered."""
    for c in CASES:
        assert c.args[0].is_float and c.args[0].positional
    assert {c.fn for c in CASES} == {
        cc.gae,
        cc.td_targets,
        cc.gates_from_concentration,
        cc.group_advantages,
        cc.broadcast,
        cc.masked_whiten,
        cc.credit_stats,
        cc.controls.shuffle,
        cc.controls.by_position,
        cc.controls.constant,
    }
