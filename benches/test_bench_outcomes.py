"""The outcome path: ``cc.group_advantages`` (GRPO, 65,536 sequences in groups of 16, ids
shuffled; ``--bench-scale`` multiplies the sequences) beside vectorised NumPy and torch,
and ``cc.masked_whiten`` on W1's advantages beside verl's formula in NumPy and in torch
and the floor.

* ``comppo``: the package's call, allocating its output;
* ``comppo out=``: ``masked_whiten(..., out=buffer)``, into a preallocated buffer like the floor;
* ``numpy``: ``np.unique`` + ``bincount`` (GRPO), verl's formula (whitening);
* ``torch``: ``torch.unique`` + ``index_add_`` (GRPO), verl's ``masked_whiten`` (whitening);
* ``floor``: a numba stream reading ``x`` and the mask, writing one output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import workloads
from workloads import GAMMA, LAM

import comppo_core as cc

GROUP_CANDIDATES = ("comppo", "numpy", "torch")
WHITEN_CANDIDATES = ("comppo", "comppo out=", "numpy", "torch", "floor")
N_SEQUENCES, GROUP_SIZE = 65_536, 16


def group_label(scale: int) -> str:
    return f"group_advantages {N_SEQUENCES * scale}/{GROUP_SIZE}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    scale = metafunc.config.getoption("--bench-scale")
    if "group_candidate" in metafunc.fixturenames:
        ids = [f"{N_SEQUENCES * scale}x{GROUP_SIZE}-{c}" for c in GROUP_CANDIDATES]
        metafunc.parametrize("group_candidate", GROUP_CANDIDATES, ids=ids)
    if "whiten_candidate" in metafunc.fixturenames:
        ids = [workloads.case_id("W1", scale, c) for c in WHITEN_CANDIDATES]
        metafunc.parametrize("whiten_candidate", WHITEN_CANDIDATES, ids=ids)


_SCORES: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def scores_and_groups(scale: int) -> tuple[np.ndarray, np.ndarray]:
    if scale not in _SCORES:
        rng = np.random.default_rng(5)
        n = N_SEQUENCES * scale
        scores = rng.standard_normal(n)
        groups = rng.permutation(np.repeat(rng.permutation(n // GROUP_SIZE) * 7 + 3, GROUP_SIZE))
        _SCORES[scale] = scores, groups
    return _SCORES[scale]


def test_group_advantages(bench, request: pytest.FixtureRequest, group_candidate: str) -> None:
    scale = request.config.getoption("--bench-scale")
    scores, groups = scores_and_groups(scale)
    fn: Callable[[], Any]
    if group_candidate == "comppo":
        fn = lambda: cc.group_advantages(scores, groups, method="grpo")  # noqa: E731
    elif group_candidate == "numpy":
        fn = lambda: workloads.numpy_grpo(scores, groups)  # noqa: E731
    else:
        torch = pytest.importorskip("torch")
        ts, tg = torch.from_numpy(scores), torch.from_numpy(groups)
        fn = lambda: workloads.torch_grpo(ts, tg)  # noqa: E731
    want = cc.group_advantages(scores, groups, method="grpo")
    if group_candidate == "comppo":
        head = slice(0, 4096)  # the reference loops in Python: its first sequences (whole groups or not)
        ref = cc.reference.group_advantages(scores[head], groups[head], method="grpo")
        np.testing.assert_allclose(cc.group_advantages(scores[head], groups[head]), ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.asarray(fn()), want, rtol=1e-9, atol=1e-12)  # also the warm-up
    workloads.describe(bench, group_label(scale), group_candidate, None)
    bench.extra_info.update(workload=group_label(scale), sequences=int(scores.size))
    bench(fn)


_WHITEN: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def whiten_input(scale: int) -> tuple[np.ndarray, np.ndarray]:
    """W1's Comp-GAE advantages and its mask."""
    if scale not in _WHITEN:
        w = workloads.cached("W1", scale)
        adv = cc.gae(w.rewards, w.values, mask=w.mask, gates=w.gates, gamma=GAMMA, lam=LAM).advantages
        _WHITEN[scale] = adv, w.mask
    return _WHITEN[scale]


def test_masked_whiten(bench, request: pytest.FixtureRequest, whiten_candidate: str) -> None:
    scale = request.config.getoption("--bench-scale")
    w = workloads.cached("W1", scale)
    x, m = whiten_input(scale)
    fn: Callable[[], Any]
    if whiten_candidate == "comppo":
        fn = lambda: cc.masked_whiten(x, mask=m)  # noqa: E731
    elif whiten_candidate == "comppo out=":
        out = np.empty_like(x)
        fn = lambda: cc.masked_whiten(x, mask=m, out=out)  # noqa: E731
    elif whiten_candidate == "numpy":
        fn = lambda: workloads.numpy_whiten(x, m)  # noqa: E731
    elif whiten_candidate == "torch":
        torch = pytest.importorskip("torch")
        import verl_original

        tx, tm = torch.from_numpy(x), torch.from_numpy(m.astype(np.float32))
        fn = lambda: verl_original.masked_whiten(tx, tm)  # noqa: E731
    else:
        if workloads.numba is None:
            pytest.skip("numba is not installed: pip install '.[bench]'")
        fn = workloads.floor_call_unary(x, m)
    result = fn()  # also the warm-up
    if whiten_candidate == "comppo":
        head = slice(0, 8)
        ref = cc.reference.masked_whiten(x[head], mask=m[head])
        np.testing.assert_allclose(cc.masked_whiten(x[head], mask=m[head]), ref, rtol=1e-5, atol=1e-5)
    if whiten_candidate != "floor":
        got = np.asarray(result)
        np.testing.assert_allclose(got[m], cc.masked_whiten(x, mask=m)[m], rtol=1e-4, atol=1e-4)
    workloads.describe(bench, f"masked_whiten {w.name}", whiten_candidate, w)
    bench(fn)
