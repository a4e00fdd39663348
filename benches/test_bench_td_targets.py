"""``cc.td_targets`` (one-step gated bootstrap targets ``y_i = r_i + γ·g_i·V_{i+1}``) beside
numba, the Python-loop reference and the floor, on W1 (padded) and W4 (packed).

* ``comppo``: ``cc.td_targets(...)``, allocating its output;
* ``numba``: a numba-parallel loop over rows, allocating its output;
* ``reference``: ``comppo_core.reference.td_targets`` on the first rows, scaled;
* ``floor``: a numba stream reading the rewards, values, gates (and mask), writing one output.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import workloads
from workloads import GAMMA, Workload

import comppo_core as cc

CANDIDATES = ("comppo", "numba", "reference", "floor")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    workloads.parametrize(metafunc, ("W1", "W4"), CANDIDATES)


def comppo(w: Workload) -> Callable[[], np.ndarray]:
    r, v, m, g, cu = w.rewards, w.values, w.mask, w.gates, w.cu_seqlens
    if m is not None:
        return lambda: cc.td_targets(r, v, mask=m, gates=g, gamma=GAMMA)
    return lambda: cc.td_targets(r, v, cu_seqlens=cu, gates=g, gamma=GAMMA)


def candidate_call(w: Workload, candidate: str, ref_tokens: int) -> tuple[Callable[[], object], Workload, float]:
    if candidate == "comppo":
        return comppo(w), w, 1.0
    if candidate == "reference":
        part, fraction = w.head(ref_tokens)
        return lambda: cc.reference.td_targets(part.rewards, part.values, gamma=GAMMA, **part.kwargs()), part, fraction
    if workloads.numba is None:
        pytest.skip("numba is not installed: pip install '.[bench]'")
    if candidate == "floor":
        return workloads.floor_call_one_output(w), w, 1.0
    r, v, g, m, cu = w.rewards, w.values, w.gates, w.mask, w.cu_seqlens
    if m is not None:
        return lambda: workloads.numba_td_padded(r, v, g, m, GAMMA), w, 1.0
    return lambda: workloads.numba_td_packed(r, v, g, cu, GAMMA), w, 1.0


def check(w: Workload, part: Workload, candidate: str, result: object) -> None:
    """``result`` equals comppo-core's on the same data (comppo-core's: the reference's)."""
    if candidate == "floor":
        return
    if candidate == "comppo":
        head, _ = w.head(20_000)
        want_head = cc.reference.td_targets(head.rewards, head.values, gamma=GAMMA, **head.kwargs())
        np.testing.assert_allclose(comppo(head)(), want_head, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(result), comppo(part)(), rtol=1e-6, atol=1e-6)


def test_td_targets(bench, request: pytest.FixtureRequest, case: tuple[str, str]) -> None:
    name, candidate = case
    w = workloads.cached(name, request.config.getoption("--bench-scale"))
    fn, part, fraction = candidate_call(w, candidate, request.config.getoption("--bench-ref-tokens"))
    check(w, part, candidate, fn())  # also the warm-up
    workloads.describe(bench, f"td_targets {w.name}", candidate, w, fraction)
    bench(fn)
