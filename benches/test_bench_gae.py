"""``cc.gae`` (Comp-GAE, padded W1–W3 and packed W4) beside numba, the Python-loop
reference, verl's torch loop and the memory floor, one group per workload.

Candidates (as ``benches/compare.py``'s gae table names them):

* ``comppo``: ``cc.gae(...)`` allocating its two outputs, as a user calls it;
* ``comppo out=``: ``cc.gae(..., out=(adv, ret))`` into preallocated buffers;
* ``numba``: a numba-parallel loop over rows that allocates its outputs;
* ``reference``: ``comppo_core.reference.gae`` (a Python loop) on the first rows
  (``--bench-ref-tokens`` elements), its time scaled to the workload;
* ``torch loop``: verl's loop over tokens on CPU tensors (padded workloads);
* ``floor``: a numba stream over the same bytes (inputs and mask read, two outputs written).

Each candidate's result is checked against comppo-core's before it is timed (comppo-core's
against the reference), outside the timed calls.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import workloads
from workloads import GAMMA, LAM, Workload

import comppo_core as cc

CANDIDATES = ("comppo", "comppo out=", "numba", "reference", "torch loop", "floor")
EXCLUDE = {("W4", "torch loop")}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    workloads.parametrize(metafunc, workloads.NAMES, CANDIDATES, EXCLUDE)


def comppo(w: Workload, out: tuple[np.ndarray, np.ndarray] | None = None) -> Callable[[], object]:
    # the keywords its layout needs, spelled out as a user writes the call
    r, v, m, g, cu = w.rewards, w.values, w.mask, w.gates, w.cu_seqlens
    if m is not None:
        return lambda: cc.gae(r, v, mask=m, gates=g, gamma=GAMMA, lam=LAM, out=out)
    return lambda: cc.gae(r, v, cu_seqlens=cu, gates=g, gamma=GAMMA, lam=LAM, out=out)


def candidate_call(w: Workload, candidate: str, ref_tokens: int) -> tuple[Callable[[], object], Workload, float]:
    """The call to time, the workload it computes (the reference's first rows), its fraction."""
    if candidate == "comppo":
        return comppo(w), w, 1.0
    if candidate == "comppo out=":
        return comppo(w, (np.empty_like(w.rewards), np.empty_like(w.rewards))), w, 1.0
    if candidate == "reference":
        part, fraction = w.head(ref_tokens)
        return (
            lambda: cc.reference.gae(part.rewards, part.values, gamma=GAMMA, lam=LAM, **part.kwargs()),
            part,
            fraction,
        )
    if candidate in ("numba", "floor") and workloads.numba is None:
        pytest.skip("numba is not installed: pip install '.[bench]'")
    if candidate == "numba":
        r, v, g, m, cu = w.rewards, w.values, w.gates, w.mask, w.cu_seqlens
        if m is not None:
            return lambda: workloads.numba_gae_padded(r, v, g, m, GAMMA, LAM), w, 1.0
        return lambda: workloads.numba_gae_packed(r, v, g, cu, GAMMA, LAM), w, 1.0
    if candidate == "floor":
        return workloads.floor_call(w), w, 1.0
    assert candidate == "torch loop"
    torch = pytest.importorskip("torch")
    import verl_original

    tr, tv, tg = (torch.from_numpy(x) for x in (w.rewards, w.values, w.gates))
    tm = torch.from_numpy(w.mask.astype(np.float32))
    return lambda: verl_original.gae_loop(tr, tv, tm, GAMMA, LAM, tg), w, 1.0


def check(w: Workload, part: Workload, candidate: str, result: object) -> None:
    """``result`` equals comppo-core's on the same data (comppo-core's: the reference's)."""
    if candidate == "floor":
        return
    want_adv, want_ret = comppo(part)()
    if candidate in ("comppo", "comppo out="):
        head, _ = w.head(20_000)
        ref_adv, ref_ret = cc.reference.gae(head.rewards, head.values, gamma=GAMMA, lam=LAM, **head.kwargs())
        head_adv, head_ret = comppo(head)()
        np.testing.assert_allclose(head_adv, ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(head_ret, ref_ret, rtol=1e-5, atol=1e-5)
    valid = np.ones(want_adv.shape, bool) if part.mask is None else part.mask
    adv, ret = (np.asarray(x) for x in result)  # type: ignore[attr-defined]
    tol = 1e-3 if candidate == "torch loop" else 1e-5  # float32 accumulation in torch, float64 elsewhere
    np.testing.assert_allclose(adv[valid], want_adv[valid], rtol=tol, atol=tol)
    np.testing.assert_allclose(ret[valid], want_ret[valid], rtol=tol, atol=tol)


def test_gae(bench, request: pytest.FixtureRequest, case: tuple[str, str]) -> None:
    name, candidate = case
    w = workloads.cached(name, request.config.getoption("--bench-scale"))
    fn, part, fraction = candidate_call(w, candidate, request.config.getoption("--bench-ref-tokens"))
    check(w, part, candidate, fn())  # also the warm-up: JIT, page faults, thread pools
    workloads.describe(bench, f"gae {w.name}", candidate, w, fraction)
    bench(fn)
