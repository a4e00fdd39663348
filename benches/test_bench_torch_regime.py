"""The torch regime: ``cc.gae`` in a fresh process whose batch was made by torch and which
allocates a little between calls, as a PPO loop's process does (``--bench-regime W1``, one
workload per process; ``benches/compare.py`` starts one such pytest process per workload).

There glibc's dynamic mmap threshold sits at the size of one output (the largest block
freed so far), so two outputs freed together would be trimmed off the heap and the next
call would fault fresh pages in again (about 1,000 page faults a call on W1 before
rust/buffers.rs cached them). A process that ran larger batches before has raised the
threshold and reuses its heap instead; hence one workload per fresh process, and these
benchmarks are skipped without ``--bench-regime``.

* ``torch alloc``: ``cc.gae(...)`` allocating its outputs;
* ``torch out=``: ``cc.gae(..., out=(adv, ret))``;
* ``--bench-regime dropin``: the verl drop-in (``drop-in``) and verl's loop (``verl loop``)
  on W1's shape, in that regime.

``extra_info["faults"]`` is the median of the minor page faults per timed call.
"""

from __future__ import annotations

import resource
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import workloads
from workloads import GAMMA, LAM

import comppo_core as cc

torch = pytest.importorskip("torch")

GAE_CANDIDATES = ("torch alloc", "torch out=")
DROPIN_CANDIDATES = ("drop-in", "verl loop")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "candidate" not in metafunc.fixturenames:
        return
    regime = metafunc.config.getoption("--bench-regime")
    scale = metafunc.config.getoption("--bench-scale")
    name = "W1" if regime in (None, "dropin") else regime
    if regime is not None and regime != "dropin" and regime not in workloads.NAMES:
        raise pytest.UsageError(f"--bench-regime: {regime!r} is none of {', '.join(workloads.NAMES)}, dropin")
    candidates = DROPIN_CANDIDATES if regime == "dropin" else GAE_CANDIDATES
    ids = [workloads.case_id(name, scale, c) for c in candidates]
    metafunc.parametrize("candidate", candidates, ids=ids)


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


_BATCH: dict[str, Any] = {}


def batch(name: str, scale: int) -> dict[str, Any]:
    """Workload ``name``'s shape, its batch made by torch (as a PPO loop's data arrives)."""
    if not _BATCH:
        torch.manual_seed(0)
        b, t = workloads.SHAPES[name]
        b *= scale
        lengths = torch.randint(t // 2, t + 1, (b,))
        mask = torch.arange(t)[None, :] < lengths[:, None]
        rewards, values = torch.randn(b, t) * mask, torch.randn(b, t)
        gates = torch.rand(b, t) * 0.5 + 0.5
        _BATCH.update(mask=mask, rewards=rewards, values=values, gates=gates, lengths=lengths)
        if name == "W4":
            cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).numpy()
            _BATCH.update(rewards=rewards[mask], values=values[mask], gates=gates[mask], cu=cu)
    return _BATCH


def check_head(result: Any, r: np.ndarray, v: np.ndarray, g: np.ndarray, kw: dict[str, Any]) -> None:
    """The first rows of ``result`` equal the reference's."""
    if "cu_seqlens" in kw:
        cu = kw["cu_seqlens"][:9]
        n = int(cu[-1])
        want = cc.reference.gae(r[:n], v[:n], cu_seqlens=cu, gates=g[:n], gamma=GAMMA, lam=LAM)
        got = (result[0][:n], result[1][:n])
    else:
        m = kw["mask"][:8]
        want = cc.reference.gae(r[:8], v[:8], mask=m, gates=g[:8], gamma=GAMMA, lam=LAM)
        got = (result[0][:8], result[1][:8])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_torch_regime(bench, request: pytest.FixtureRequest, candidate: str) -> None:
    regime = request.config.getoption("--bench-regime")
    if regime is None:
        pytest.skip(
            "the torch regime needs a fresh process per workload: pytest ... --bench-regime W1 (compare.py does)"
        )
    scale = request.config.getoption("--bench-scale")
    name = "W1" if regime == "dropin" else regime
    d = batch(name, scale)
    label = workloads.label(name, scale)
    fn: Callable[[], Any]
    if regime == "dropin":
        import verl_original

        from comppo_core.integrations import verl as verl_dropin

        tm = d["mask"].float()
        tr, tv = d["rewards"], d["values"]
        if candidate == "drop-in":
            fn = lambda: verl_dropin.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)  # noqa: E731
        else:
            fn = lambda: verl_original.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)  # noqa: E731
        valid = d["mask"]
        got = fn()[0]
        want = verl_original.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)[0]
        torch.testing.assert_close(got[valid], want[valid], atol=1e-3, rtol=1e-3)
        group = f"verl GAE {label}, torch regime"
    else:
        kw = {"cu_seqlens": d["cu"]} if name == "W4" else {"mask": d["mask"].numpy()}
        r, v, g = d["rewards"].numpy(), d["values"].numpy(), d["gates"].numpy()
        out = (np.empty_like(r), np.empty_like(r)) if candidate == "torch out=" else None
        fn = lambda: cc.gae(r, v, gates=g, gamma=GAMMA, lam=LAM, out=out, **kw)  # noqa: E731
        check_head(fn(), r, v, g, kw)
        group = f"gae {label}, torch regime"
    faults: list[int] = []
    scratch: list[Any] = []
    b = d["mask"].shape[0]

    def once() -> Any:
        scratch[:] = [torch.empty(b, 64), list(range(10_000))]  # a loop's bookkeeping, between calls
        f0 = _faults()
        result = fn()
        faults.append(_faults() - f0)
        return result

    once()  # the warm-up
    faults.clear()
    workloads.describe(bench, group, candidate, None)
    bench.extra_info.update(workload=f"{label}, torch regime", regime=regime)
    bench(once)
    bench.extra_info["faults"] = statistics.median(faults)
