"""``cc.gates_from_concentration`` (``GateParams`` with ``normalize="causal"``, each token's
z-score over its row's prefix, and ``"sequence"``, over the whole row; a bounded sigmoid)
beside vectorised NumPy, the reference and the floor, on W1 (padded) and W4 (packed); the
concentration is the workload's values. One group per workload and normalisation.

* ``comppo``: ``cc.gates_from_concentration(conc, mask=...)`` (or ``cu_seqlens=``);
* ``numpy``: the same in vectorised NumPy (masked row means and stds; ``np.add.reduceat``
  when packed), as a user writes it;
* ``reference``: ``comppo_core.reference.gates_from_concentration`` on the first rows, scaled;
* ``floor``: a numba stream reading the concentration (and mask), writing one output.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import workloads
from workloads import Workload

import comppo_core as cc

CANDIDATES = ("comppo", "numpy", "reference", "floor")
NORMALIZE = ("causal", "sequence")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    workloads.parametrize(metafunc, ("W1", "W4"), CANDIDATES)
    if "normalize" in metafunc.fixturenames:
        metafunc.parametrize("normalize", NORMALIZE)


def gate_params(normalize: str) -> cc.GateParams:
    try:
        return cc.GateParams(normalize=normalize)
    except cc.ParameterError:  # a comppo-core from before normalize="causal"
        pytest.skip(f"this comppo-core has no normalize={normalize!r}")


def comppo(w: Workload, params: cc.GateParams) -> Callable[[], np.ndarray]:
    c, m, cu = w.values, w.mask, w.cu_seqlens
    if m is not None:
        return lambda: cc.gates_from_concentration(c, mask=m, params=params)
    return lambda: cc.gates_from_concentration(c, cu_seqlens=cu, params=params)


def candidate_call(
    w: Workload, candidate: str, params: cc.GateParams, ref_tokens: int
) -> tuple[Callable[[], object], Workload, float]:
    if candidate == "comppo":
        return comppo(w, params), w, 1.0
    if candidate == "numpy":
        c, m, cu = w.values, w.mask, w.cu_seqlens
        return lambda: workloads.numpy_gates(c, m, cu, params), w, 1.0
    if candidate == "reference":
        part, fraction = w.head(ref_tokens)
        c, m, cu = part.values, part.mask, part.cu_seqlens
        return lambda: cc.reference.gates_from_concentration(c, mask=m, cu_seqlens=cu, params=params), part, fraction
    if workloads.numba is None:
        pytest.skip("numba is not installed: pip install '.[bench]'")
    return workloads.floor_call_unary(w.values, w.mask), w, 1.0


def check(w: Workload, part: Workload, candidate: str, params: cc.GateParams, result: object) -> None:
    """``result`` equals comppo-core's on the same data (comppo-core's: the reference's)."""
    if candidate == "floor":
        return
    if candidate == "comppo":
        head, _ = w.head(8_192)
        want = cc.reference.gates_from_concentration(
            head.values, mask=head.mask, cu_seqlens=head.cu_seqlens, params=params
        )
        np.testing.assert_allclose(comppo(head, params)(), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(result), comppo(part, params)(), rtol=1e-6, atol=1e-6)


def test_gates(bench, request: pytest.FixtureRequest, case: tuple[str, str], normalize: str) -> None:
    name, candidate = case
    params = gate_params(normalize)
    w = workloads.cached(name, request.config.getoption("--bench-scale"))
    ref_tokens = request.config.getoption("--bench-ref-tokens")
    if normalize == "causal":
        ref_tokens //= 10  # the reference's causal z-score is quadratic in the row's length
    fn, part, fraction = candidate_call(w, candidate, params, ref_tokens)
    check(w, part, candidate, params, fn())  # also the warm-up
    workloads.describe(bench, f"gates_from_concentration {normalize} {w.name}", candidate, w, fraction)
    bench(fn)
