"""The verl drop-in (``comppo_core.integrations.verl.compute_gae_advantage_return`` on CPU
tensors) beside verl's own loop on the same tensors (``benches/verl_original.py``), on W1.

* ``drop-in (torch CPU)``: the drop-in, as verl calls it (GAE, then ``masked_whiten``);
* ``numpy path``: what the drop-in does, on NumPy arrays with the same float32 mask
  (``cc.gae`` with ``masked_rewards="drop"``, then whitening its own buffer in place):
  the wrapper's cost is the difference;
* ``verl loop``: verl's ``compute_gae_advantage_return``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import workloads
from workloads import GAMMA, LAM

import comppo_core as cc

torch = pytest.importorskip("torch")
import verl_original  # noqa: E402

from comppo_core.integrations import verl as verl_dropin  # noqa: E402

CANDIDATES = ("drop-in (torch CPU)", "numpy path", "verl loop")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "candidate" in metafunc.fixturenames:
        scale = metafunc.config.getoption("--bench-scale")
        metafunc.parametrize("candidate", CANDIDATES, ids=[workloads.case_id("W1", scale, c) for c in CANDIDATES])


def test_verl_gae(bench, request: pytest.FixtureRequest, candidate: str) -> None:
    w = workloads.cached("W1", request.config.getoption("--bench-scale"))
    tr, tv = torch.from_numpy(w.rewards), torch.from_numpy(w.values)
    tm = torch.from_numpy(w.mask.astype(np.float32))
    m32 = tm.numpy()  # the same float32 mask the tensors carry: same work, only the wrapper differs
    fn: Callable[[], Any]
    if candidate == "drop-in (torch CPU)":
        fn = lambda: verl_dropin.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)  # noqa: E731
    elif candidate == "numpy path":

        def fn() -> Any:
            adv, ret = cc.gae(w.rewards, w.values, mask=m32, gamma=GAMMA, lam=LAM, masked_rewards="drop")
            return cc.masked_whiten(adv, mask=m32, out=adv), ret

    else:
        fn = lambda: verl_original.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)  # noqa: E731
    adv, ret = (np.asarray(x) for x in fn())  # also the warm-up
    want_adv, want_ret = verl_original.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)
    valid = w.mask
    np.testing.assert_allclose(adv[valid], want_adv.numpy()[valid], atol=1e-3)
    np.testing.assert_allclose(ret[valid], want_ret.numpy()[valid], atol=1e-3)
    workloads.describe(bench, f"verl GAE {w.name}", candidate, w)
    bench(fn)
