"""The online (Triton) concentration kernel, ``comppo_core.hf.online``, run by Triton's
CPU interpreter: the exact same kernel source that runs on CUDA, on CPU tensors.

Triton reads ``TRITON_INTERPRET`` when it decorates its functions, its own library's at
its first import, so ``tests/conftest.py`` sets it for the whole session on a machine
without CUDA (where no compiled Triton kernel runs anyway), before anything imports
triton; the kernel tests here run under it, and on a CUDA machine they are skipped (the
compiled kernel is checked there by ``tests/gpu/test_probe_parity.py``). Half-precision
inputs take the kernel's float32 dot under the interpreter (whose half-precision dot is
wrong), which yields the same exact products; the CUDA half-precision dot is checked by
``tests/gpu/test_probe_parity.py`` on a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("triton")

import inspect  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import test_hf_probe as suite  # noqa: E402  (the probe tests' tiny models, batches and eager reference)
from hypothesis import Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from comppo_core import hf  # noqa: E402
from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.hf import online  # noqa: E402
from comppo_core.hf import statistics as hf_statistics  # noqa: E402
from comppo_core.hf.probe import _ModelState  # noqa: E402

# --------------------------------------------------------------------------- #
# Dispatch (main process: the kernel itself is replaced)
# --------------------------------------------------------------------------- #


@pytest.fixture
def online_on_cpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``auto`` treats CPU like CUDA (takes the online kernel first), with an empty
    online fallback cache, restored afterwards."""
    monkeypatch.setattr(hf_statistics, "_ONLINE_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(hf_statistics, "_ONLINE_BROKEN", set())
    yield


class TritonCompileError(Exception):
    """Stands for triton.compiler.errors.CompilationError, which is no RuntimeError."""


def test_online_needs_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(online, "interpreting", lambda: False)  # compiled Triton, as outside the tests
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ParameterError, match="'online' runs on CUDA tensors only, got cpu"):
        hf_statistics.head_mean_concentration(q, q, None, method="online")
    model, ids, am, _ = suite.eager_run("llama", "left")
    with pytest.raises(ParameterError, match="'online' runs on CUDA"):
        suite.probe_run(model, ids, am, "entropy", method="online")
    assert model.config._attn_implementation == "sdpa"  # restored after the error


def test_auto_takes_online_where_it_applies(monkeypatch: pytest.MonkeyPatch, online_on_cpu: None) -> None:
    calls: list[str] = []

    def fake(q: Any, k: Any, mask: Any, scale: float, causal: bool, statistic: str) -> Any:
        calls.append(statistic)  # raw 0 with 5 visible keys: entropy concentration 1
        return torch.zeros(q.shape[:3]), torch.full(q.shape[:3], 5.0)

    monkeypatch.setattr(online, "raw_statistics", fake)
    model, ids, am, _ = suite.eager_run("llama", "both")
    got = suite.probe_run(model, ids, am, "entropy")
    assert calls == ["entropy", "entropy"]  # one call per layer
    assert torch.all(got[am != 0] == 1.0) and torch.all(got[am == 0] == 0)


def test_online_failure_warns_once_and_falls_back(monkeypatch: pytest.MonkeyPatch, online_on_cpu: None) -> None:
    model, ids, am, _ = suite.eager_run("llama", "both")  # head_dim 8
    expected = suite.probe_run(model, ids, am, "l2", method="fused")
    calls: list[int] = []

    def failing(q: Any, *args: Any) -> Any:
        calls.append(int(q.shape[-1]))
        raise TritonCompileError("at 37:28: unsupported")

    monkeypatch.setattr(online, "raw_statistics", failing)
    with pytest.warns(RuntimeWarning, match=r"online \(Triton\) kernel failed on cpu, float32, head_dim 8") as rec:
        got = suite.probe_run(model, ids, am, "l2")
    runtime = [w for w in rec if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1  # once, not once per layer
    # it points at head_mean_concentration's caller, the probe's observe
    observe, _ = inspect.getsourcelines(_ModelState.observe)
    start = _ModelState.observe.__code__.co_firstlineno
    assert runtime[0].filename.endswith("probe.py") and start <= runtime[0].lineno < start + len(observe)
    assert calls == [8]
    assert torch.equal(got, expected)  # auto's next choice, the fused method, exactly
    assert hf_statistics._ONLINE_BROKEN == {("cpu", None, torch.float32, 8)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        again = suite.probe_run(model, ids, am, "l2")
    assert torch.equal(again, expected) and calls == [8]


def test_online_fatal_errors_and_explicit_method_are_not_fallbacks(
    monkeypatch: pytest.MonkeyPatch, online_on_cpu: None
) -> None:
    def oom(*args: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(online, "raw_statistics", oom)
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(torch.OutOfMemoryError):
        hf_statistics.head_mean_concentration(q, q, None)
    assert not hf_statistics._ONLINE_BROKEN

    def broken(*args: Any) -> Any:
        raise TritonCompileError("unsupported")

    monkeypatch.setattr(online, "raw_statistics", broken)
    monkeypatch.setattr(online, "interpreting", lambda: True)  # let method="online" take CPU tensors
    with pytest.raises(TritonCompileError):
        hf_statistics.head_mean_concentration(q, q, None, method="online")
    assert not hf_statistics._ONLINE_BROKEN


# --------------------------------------------------------------------------- #
# The kernel under Triton's interpreter
# --------------------------------------------------------------------------- #

F = TypeVar("F", bound=Callable[..., Any])


def interpreted(test: F) -> F:
    """A kernel test: it needs the interpreter (set by tests/conftest.py without CUDA), and it
    is ``slow`` (the interpreter runs each program instance in Python)."""
    needs = pytest.mark.skipif(
        not online.interpreting(),
        reason="TRITON_INTERPRET is not set (a CUDA machine: tests/gpu checks the compiled kernel)",
    )
    return pytest.mark.slow(needs(test))  # type: ignore[no-any-return]


STATS = ("entropy", "max", "l2")


def chunked(q: Any, k: Any, mask: Any, causal: bool, statistic: str) -> Any:
    return hf_statistics.head_mean_concentration(q, k, mask, is_causal=causal, statistic=statistic, method="chunked")


def via_online(q: Any, k: Any, mask: Any, causal: bool, statistic: str) -> Any:
    return hf_statistics.head_mean_concentration(q, k, mask, is_causal=causal, statistic=statistic, method="online")


# the interpreter runs each program in Python: few examples, small sizes, no shrinking
@interpreted
@settings(max_examples=50, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(
    b=st.integers(1, 3),
    hkv=st.integers(1, 2),
    group=st.sampled_from([1, 2, 3]),
    t=st.integers(1, 100),
    d=st.sampled_from([8, 16, 24, 64]),
    dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
    layout=st.sampled_from(["contiguous", "transposed"]),
    mask_kind=st.sampled_from(
        ["causal", "full", "padded_window", "causal_padded", "causal_span_out", "per_head", "broadcast_batch"]
    ),
    statistic=st.sampled_from(STATS),
    tiles=st.sampled_from([online.TILES, (32, 16, 2), (16, 16, 1)]),
    seed=st.integers(0, 2**16),
)
def test_kernel_matches_chunked(
    b: int,
    hkv: int,
    group: int,
    t: int,
    d: int,
    dtype: str,
    layout: str,
    mask_kind: str,
    statistic: str,
    tiles: tuple[int, int, int],
    seed: int,
) -> None:
    """Any shape (ragged last query and key tiles), tiles of several sizes (many key
    tiles per row: the running maximum is rescaled often), GQA, head sizes that are
    not powers of two, transformers' transposed layout, every mask kind: the kernel
    equals the chunked float32 method to float32 roundoff."""
    g = torch.Generator().manual_seed(seed)
    h = hkv * group
    if layout == "contiguous":
        q = torch.randn(b, h, t, d, generator=g)
        k = torch.randn(b, hkv, t, d, generator=g)
    else:  # [B, T, H, d] transposed to [B, H, T, d], as the attention modules hand them over
        q = torch.randn(b, t, h, d, generator=g).transpose(1, 2)
        k = torch.randn(b, t, hkv, d, generator=g).transpose(1, 2)
    q, k = (2.0 * q).to(getattr(torch, dtype)), (2.0 * k).to(getattr(torch, dtype))
    i = torch.arange(t)
    mask = None
    if mask_kind == "padded_window":
        keep = torch.rand(b, t, generator=g) > 0.2
        keep[0, : min(5, t)] = False  # left padding: the first queries see nothing
        mask = ((i[None, :] <= i[:, None]) & ((i[:, None] - i[None, :]) < 9))[None, None] & keep[:, None, None, :]
    elif mask_kind == "causal_padded":  # as a left-padded batch: whole tiles seen entirely
        starts = torch.randint(0, max(1, t // 2), (b,), generator=g)
        mask = (i[None, :] <= i[:, None])[None, None] & (i[None, :] >= starts[:, None])[:, None, None, :]
    elif mask_kind == "causal_span_out":  # keys [t/3, t/2) hidden: the entirely seen tiles are not contiguous
        span = (i >= t // 3) & (i < t // 2)
        mask = ((i[None, :] <= i[:, None]) & ~span[None, :])[None, None].expand(b, 1, t, t)
    elif mask_kind == "per_head":
        mask = torch.rand(b, h, t, t, generator=g) < 0.4
    elif mask_kind == "broadcast_batch":
        mask = (torch.rand(1, 1, t, t, generator=g) < 0.6).expand(b, 1, t, t)
    causal = mask_kind == "causal"
    want = chunked(q, k, mask, causal, statistic)
    default, online.TILES = online.TILES, tiles
    try:
        got = via_online(q, k, mask, causal, statistic)
    finally:
        online.TILES = default
    assert got.dtype == torch.float32 and got.shape == (b, t)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert (got - want).abs().max() <= 1e-5, (got - want).abs().max()  # float32 roundoff of values in [0, 1]


@interpreted
@pytest.mark.parametrize("statistic", STATS)
def test_entirely_seen_tiles(statistic: str) -> None:
    """Tiles of 16 keys, 100 queries: with left padding (row 0 by 21, row 1 by 0) most
    tiles are seen entirely and read without the mask; with keys 33..49 hidden the
    entirely seen tiles are not contiguous (0..31 and 64.. for the last query blocks),
    so the whole range is read with the mask."""
    g = torch.Generator().manual_seed(11)
    q, k = torch.randn(2, 2, 100, 16, generator=g), torch.randn(2, 1, 100, 16, generator=g)
    i = torch.arange(100)
    causal = i[None, :] <= i[:, None]
    padded = causal[None, None] & (i[None, :] >= torch.tensor([21, 0])[:, None])[:, None, None, :]
    span_out = (causal & ~((i >= 33) & (i < 50))[None, :])[None, None]
    default, online.TILES = online.TILES, (16, 16, 1)
    try:
        for mask in (padded, span_out):
            got = via_online(q, k, mask, False, statistic)
            assert (got - chunked(q, k, mask, False, statistic)).abs().max() <= 1e-5
    finally:
        online.TILES = default


@interpreted
def test_worked_example_by_hand() -> None:
    """One head, d = 1, scale 1: query 1 sees keys 0 and 1 with scores 0 and log 3, so
    p = (1/4, 3/4): entropy concentration 1 − H/log 2, max 3/4, l2 10/16. Query 0 sees
    one key: 1 for every statistic."""
    q = torch.tensor([[[[1.0], [1.0]]]])
    k = torch.tensor([[[[0.0], [math.log(3.0)]]]])
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    expected = {"entropy": 1 - h / math.log(2), "max": 0.75, "l2": 10 / 16}
    for statistic, value in expected.items():
        got = hf_statistics.head_mean_concentration(q, k, None, scale=1.0, statistic=statistic, method="online")
        assert abs(got[0, 0].item() - 1.0) <= 1e-7 and abs(got[0, 1].item() - value) <= 1e-6, (statistic, got)


@interpreted
def test_rows_without_keys_and_non_finite_rows() -> None:
    """A query that sees no key gives 0; a query that sees a NaN or infinite score gives
    NaN (never a plausible number); the others are unaffected."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 70, 16, generator=g)
    k = torch.randn(1, 2, 70, 16, generator=g)
    q[0, 1, 40] = math.nan  # head 1's query 40 only
    k[0, 0, 66] = math.inf  # head 0: every query ≥ 66 sees it
    mask = torch.ones(1, 1, 70, 70, dtype=torch.bool).tril()
    mask[..., 10, :] = False  # query 10 sees no key
    for statistic in STATS:
        with np.errstate(invalid="ignore", over="ignore"):  # the interpreter's numpy meets the NaN and inf
            got = via_online(q, k, mask, False, statistic)
        want = chunked(q, k, mask, False, statistic)
        nan = torch.isnan(got[0])
        assert torch.equal(nan, torch.isnan(want[0]))
        assert nan[40] and nan[66:].all() and nan.sum() == 1 + 4, statistic
        assert got[0, 10] == 0
        assert (got[~torch.isnan(got)] - want[~torch.isnan(want)]).abs().max() <= 1e-5


@interpreted
def test_empty_queries_or_keys() -> None:
    q = torch.randn(2, 2, 0, 16)
    assert via_online(q, torch.randn(2, 2, 0, 16), None, True, "entropy").shape == (2, 0)
    got = via_online(torch.randn(2, 2, 5, 16), torch.randn(2, 2, 0, 16), None, False, "l2")
    assert got.shape == (2, 5) and torch.all(got == 0)


@interpreted
@pytest.mark.parametrize("padding", suite.PADDINGS)
@pytest.mark.parametrize("arch", suite.ARCHS)
def test_probe_with_online_method_matches_eager_weights(arch: str, padding: str) -> None:
    """The whole probe with method="online" on the tiny models (sliding windows, GQA,
    GPT-2's multi-head attention, every padding), against eager attention weights."""
    model, ids, am, _ = suite.eager_run(arch, padding)
    for statistic in STATS:
        ref = suite.reference(arch, padding, statistic)
        got = suite.probe_run(model, ids, am, statistic, method="online")
        assert (got.double() - ref).abs().max() <= 1e-4, (arch, padding, statistic)
        assert torch.all(got[am == 0] == 0)


@interpreted
def test_probe_with_online_method_bfloat16() -> None:
    model, ids, am, _ = suite.eager_run("qwen3", "both", "bfloat16")
    for statistic in STATS:
        got = suite.probe_run(model, ids, am, statistic, method="online")
        ref = suite.reference("qwen3", "both", statistic, dtype_name="bfloat16")
        assert (got.double() - ref).abs().max() <= suite.BF16_ATOL
        chunked_probe = suite.probe_run(model, ids, am, statistic, method="chunked")
        assert (got - chunked_probe).abs().max() <= 1e-5  # both float32 on the same exact scores


@interpreted
def test_auto_stays_off_the_interpreter_on_cpu() -> None:
    """``auto`` picks online on CUDA only: on CPU it never reaches the (slow) interpreter."""
    calls = []
    original = online.raw_statistics

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    online.raw_statistics = spy  # type: ignore[assignment]
    try:
        hf_statistics.head_mean_concentration(torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16), None)
    finally:
        online.raw_statistics = original  # type: ignore[assignment]
    assert calls == []
    with pytest.raises(ParameterError, match="online"):
        hf.ConcentrationProbe(suite.build("llama"), method="onlin")
