"""Thread count: results are bitwise independent of it; get/set and the
COMPPO_NUM_THREADS environment variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import comppo_core as cc
from comppo_core import reference
from comppo_core.options import NORMALIZE_MODES

THREADS = (1, 2, 3)


def padded_batch(seed: int, dtype: Any = np.float64) -> dict[str, np.ndarray]:
    """64 × 1000 with ragged right padding, inner observation spans, gates with exact
    0s and 1s, and truncated rows (last_values)."""
    rng = np.random.default_rng(seed)
    B, T = 64, 1000
    lengths = rng.integers(0, T + 1, size=B)
    lengths[:4] = [T, 0, 1, T]
    valid = np.arange(T)[None, :] < lengths[:, None]
    obs_start = rng.integers(0, T, size=B)
    obs = (np.arange(T)[None, :] >= obs_start[:, None]) & (np.arange(T)[None, :] < obs_start[:, None] + 37)
    valid &= ~obs
    g = rng.random((B, T))
    g[rng.random((B, T)) < 0.05] = 0.0
    g[rng.random((B, T)) < 0.05] = 1.0
    return {
        "rewards": np.where(valid, rng.normal(size=(B, T)), 0.0).astype(dtype),
        "values": rng.normal(size=(B, T)).astype(dtype),
        "mask": valid,
        "gates": g.astype(dtype),
        "last_values": rng.normal(size=B),
        "conc": rng.normal(size=(B, T)).astype(dtype),
    }


def packed_batch(seed: int) -> dict[str, np.ndarray]:
    """Ragged packed batch (~65k tokens over 150 sequences, empty ones included)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 900, size=150)
    lengths[::17] = 0
    cu = np.concatenate([[0], np.cumsum(lengths)])
    N = int(cu[-1])
    valid = rng.random(N) < 0.9
    return {
        "rewards": np.where(valid, rng.normal(size=N), 0.0),
        "values": rng.normal(size=N),
        "mask": valid.astype(np.uint8),
        "gates": rng.random(N),
        "last_values": rng.normal(size=len(lengths)),
        "conc": rng.normal(size=N),
        "cu_seqlens": cu,
    }


def run_all(d: dict[str, np.ndarray]) -> list[np.ndarray]:
    lay = {"mask": d["mask"], "cu_seqlens": d.get("cu_seqlens")}
    adv, ret = cc.gae(
        d["rewards"],
        d["values"],
        gates=d["gates"],
        last_values=d["last_values"],
        gamma=0.99,
        lam=0.95,
        lam_critic=1.0,
        **lay,
    )
    adv1, ret1 = cc.gae(d["rewards"], d["values"], gamma=1.0, lam=1.0, **lay)
    y = cc.td_targets(d["rewards"], d["values"], gates=d["gates"], last_values=d["last_values"], gamma=0.99, **lay)
    outs = [adv, ret, adv1, ret1, y]
    for normalize in NORMALIZE_MODES:
        outs.append(
            cc.gates_from_concentration(
                d["conc"], params=cc.GateParams(normalize=normalize, low=0.2, sharpness=2.0), **lay
            )
        )
    return outs


@pytest.mark.parametrize(
    "make",
    [lambda: padded_batch(0), lambda: padded_batch(1, np.float32), lambda: packed_batch(2)],
    ids=["padded64", "padded32", "packed"],
)
def test_results_bitwise_identical_across_thread_counts(make: Any, restore_threads: int) -> None:
    d = make()
    results = {}
    for n in THREADS:
        cc.set_num_threads(n)
        assert cc.get_num_threads() == n
        results[n] = run_all(d)
    for n in THREADS[1:]:
        for a, b in zip(results[THREADS[0]], results[n]):
            assert a.dtype == b.dtype
            assert a.tobytes() == b.tobytes(), f"result differs between 1 and {n} threads"


def test_big_batch_matches_reference(restore_threads: int) -> None:
    """The multi-task, multi-lane path (many rows per task) against the oracle."""
    cc.set_num_threads(2)
    d = packed_batch(5)
    kw = {"mask": d["mask"], "cu_seqlens": d["cu_seqlens"], "gates": d["gates"], "last_values": d["last_values"]}
    adv, ret = cc.gae(d["rewards"], d["values"], gamma=0.99, lam=0.95, lam_critic=0.5, **kw)
    want = reference.gae(d["rewards"], d["values"], gamma=0.99, lam=0.95, lam_critic=0.5, **kw)
    np.testing.assert_allclose(adv, want[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ret, want[1], rtol=1e-12, atol=1e-12)
    batch = cc.GateParams(normalize="batch")
    g = cc.gates_from_concentration(d["conc"], mask=d["mask"], cu_seqlens=d["cu_seqlens"], params=batch)
    want_g = reference.gates_from_concentration(d["conc"], mask=d["mask"], cu_seqlens=d["cu_seqlens"], params=batch)
    np.testing.assert_allclose(g, want_g, rtol=1e-9, atol=1e-12)
    causal = cc.GateParams(normalize="causal", low=0.2, sharpness=2.0)
    g = cc.gates_from_concentration(d["conc"], mask=d["mask"], cu_seqlens=d["cu_seqlens"], params=causal)
    want_g = reference.gates_from_concentration(d["conc"], mask=d["mask"], cu_seqlens=d["cu_seqlens"], params=causal)
    np.testing.assert_allclose(g, want_g, rtol=1e-9, atol=1e-12)


def test_set_get_num_threads(restore_threads: int) -> None:
    assert isinstance(restore_threads, int) and restore_threads >= 1
    for n in (3, 1, 2, 1):
        cc.set_num_threads(n)
        assert cc.get_num_threads() == n
    # setting the same count twice is fine and calls still work
    cc.set_num_threads(2)
    cc.set_num_threads(2)
    np.testing.assert_array_equal(cc.gae(np.zeros((1, 2)), np.zeros((1, 2))).advantages, [[0.0, 0.0]])


def _child(env_value: str | None, code: str) -> str:
    env = dict(os.environ)
    env.pop("COMPPO_NUM_THREADS", None)
    if env_value is not None:
        env["COMPPO_NUM_THREADS"] = env_value
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_env_var_sets_default_thread_count() -> None:
    assert _child("3", "import comppo_core as cc; print(cc.get_num_threads())") == "3"
    assert _child("1", "import comppo_core as cc; print(cc.get_num_threads())") == "1"
    # set_num_threads overrides the environment
    code = "import comppo_core as cc; cc.set_num_threads(2); print(cc.get_num_threads())"
    assert _child("3", code) == "2"
    # without the variable: some positive default
    assert int(_child(None, "import comppo_core as cc; print(cc.get_num_threads())")) >= 1


def test_env_var_threads_compute_the_same() -> None:
    code = (
        "import hashlib, numpy as np, comppo_core as cc\n"
        "rng = np.random.default_rng(0)\n"
        "r = rng.normal(size=(64, 1000)); v = rng.normal(size=(64, 1000))\n"
        "a, _ = cc.gae(r, v, gamma=0.99, lam=0.95)\n"
        "print(cc.get_num_threads(), hashlib.sha256(a.tobytes()).hexdigest())\n"
    )
    one = _child("1", code).split()
    three = _child("3", code).split()
    assert one[0] == "1" and three[0] == "3"
    assert one[1] == three[1]


def test_concurrent_python_threads(restore_threads: int) -> None:
    """The GIL is released during a kernel: calls from several Python threads at once
    (while the pool size changes) still give the sequential results."""
    from concurrent.futures import ThreadPoolExecutor

    batches = [padded_batch(10 + i) for i in range(3)] + [packed_batch(20)]
    cc.set_num_threads(2)
    want = [run_all(d) for d in batches]

    def work(i: int) -> list[np.ndarray]:
        if i == 5:
            cc.set_num_threads(3)
        return run_all(batches[i % len(batches)])

    with ThreadPoolExecutor(max_workers=4) as ex:
        got = list(ex.map(work, range(8)))
    for i, res in enumerate(got):
        for a, b in zip(res, want[i % len(batches)]):
            assert a.tobytes() == b.tobytes()


def test_calls_that_stop_early_leave_the_pool_working(restore_threads: int) -> None:
    """Large calls that stop with an error (found by the layout check, or by the kernel
    once helpers have joined), single long rows (one task: no helper ever joins), and many
    calls in a row, with and without out=, allocating and not, must each leave the pool
    working and every result the same bits as on one thread."""
    d = padded_batch(30, np.float32)
    r, v, m, g = d["rewards"], d["values"], d["mask"], d["gates"]
    assert r.size >= 1 << 15  # large enough to run in parallel
    long_r = np.ascontiguousarray(r.reshape(1, -1))
    long_v = np.ascontiguousarray(v.reshape(1, -1))

    def good() -> list[np.ndarray]:
        out = (np.empty_like(r), np.empty_like(r))
        got = [*cc.gae(r, v, mask=m, gates=g, gamma=0.99, lam=0.95)]
        got += [*cc.gae(r, v, mask=m, gates=g, gamma=0.99, lam=0.95, out=out)]
        got += [cc.td_targets(r, v, mask=m, gates=g, gamma=0.99)]
        got += [cc.masked_whiten(got[0], mask=m), cc.gates_from_concentration(d["conc"], mask=m)]
        got += [*cc.gae(long_r, long_v, gamma=0.99, lam=0.95)]
        return got

    cc.set_num_threads(1)
    want = good()
    cc.set_num_threads(2)
    nan_r, nan_m = r.copy(), m.copy()
    nan_r[7, 3], nan_m[7, 3] = np.nan, True  # a valid NaN: the kernel's error
    bad_cu = np.array([0, 5, 3, r.size], dtype=np.int64)  # decreasing: the layout check fails
    for _ in range(20):
        with pytest.raises(cc.ComppoError, match="rewards"):
            cc.gae(nan_r, v, mask=nan_m, gates=g)
        with pytest.raises(cc.ComppoError, match="cu_seqlens"):
            cc.gae(r.reshape(-1), v.reshape(-1), cu_seqlens=bad_cu)
        for a, b in zip(good(), want):
            assert a.tobytes() == b.tobytes()


def test_avx2_and_baseline_builds_are_bit_identical() -> None:
    """The AVX2 copies of the hot loops do the same arithmetic (their fused multiply-adds
    are ``mul_add`` calls in the baseline): with COMPPO_DISABLE_AVX2=1 the baseline code
    must give the very same bits."""
    import subprocess
    import sys

    script = (
        "import numpy as np, comppo_core as cc, sys\n"
        "sys.stderr.write(cc._core.simd_path())\n"  # the path this process runs
        "rng = np.random.default_rng(3)\n"
        "m = rng.random((64, 700)) < 0.8\n"
        "r = (rng.standard_normal((64, 700)) * m).astype(np.float32)\n"
        "v = rng.standard_normal((64, 700)).astype(np.float32)\n"
        "g = rng.uniform(0.5, 1, (64, 700)).astype(np.float32)\n"
        "a, ret = cc.gae(r, v, mask=m, gates=g, gamma=0.99, lam=0.95, lam_critic=1.0)\n"
        "w = cc.masked_whiten(a, mask=m)\n"
        # mean far from the spread: rows take the two-pass fallback of the moments
        "w2 = cc.masked_whiten(a + np.float32(300.0), mask=m)\n"
        "s = np.array(list(cc.credit_stats(a, mask=m).values()), dtype=np.float64)\n"
        # gates: the vectorized sigmoid, float32 moments (sequence and batch) and float64;
        # causal (the default): the running statistics and the blocks of sigmoids, f32 and f64
        "P = cc.GateParams\n"
        "q = cc.gates_from_concentration(g, mask=m, params=P(low=0.3, normalize='sequence'))\n"
        "q2 = cc.gates_from_concentration(g, mask=m, params=P(low=0.3, normalize='batch'))\n"
        "q3 = cc.gates_from_concentration(g.astype(np.float64), mask=m, params=P(low=0.3, sharpness=4.0,\n"
        "                                 normalize='sequence'))\n"
        "q4 = cc.gates_from_concentration(g, mask=m, params=P(low=0.3))\n"
        "q5 = cc.gates_from_concentration(g.astype(np.float64), mask=m, params=P(low=0.3, sharpness=4.0))\n"
        # TD targets: four-position blocks and single steps
        "y = cc.td_targets(r, v, mask=m, gates=g, gamma=0.99)\n"
        "sys.stdout.buffer.write(a.tobytes() + ret.tobytes() + w.tobytes() + w2.tobytes() + s.tobytes()\n"
        "                        + q.tobytes() + q2.tobytes() + q3.tobytes() + q4.tobytes() + q5.tobytes()\n"
        "                        + y.tobytes())\n"
    )
    outs, paths = [], []
    for disable in ("0", "1"):
        env = {**__import__("os").environ, "COMPPO_DISABLE_AVX2": disable}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, check=True)
        outs.append(done.stdout)
        paths.append(done.stderr.decode())
    assert paths[1] == "baseline"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():  # Linux: both paths really ran where the CPU has AVX2 and FMA
        flags = set(cpuinfo.read_text().split())
        assert paths[0] == ("avx2" if {"avx2", "fma"} <= flags else "baseline")
    assert len(outs[0]) == 8 * 64 * 700 * 4 + 8 * 7 + 2 * 64 * 700 * 8
    assert outs[0] == outs[1]
