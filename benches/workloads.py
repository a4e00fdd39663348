"""The kernel benchmarks' workloads, the peers comppo-core is timed against, and the floors.

One definition for everything that times the kernels: the pytest-benchmark suites
(``benches/test_bench_*.py``) import it, and ``benches/compare.py`` renders those suites'
JSON; ``benches/lab/ab_builds.py`` borrows the workloads and the floor.

Workloads (float32, each row's length uniform in ``[T/2, T]``, gates uniform in
``[0.5, 1]``, γ = 1, λ = 0.95)::

    W1  padded 512 × 4096       W2  padded 64 × 16384
    W3  padded 4096 × 512       W4  W1's data packed ([N] + cu_seqlens)

``scale`` multiplies the rows B (``pytest benches --bench-scale 4`` on a bigger machine).

Peers:

* ``numba_*``: numba-parallel loops over rows (``prange``), allocating their outputs;
* ``numpy_*``: the vectorised NumPy way a user writes it (``numpy_grpo``, ``numpy_whiten``,
  ``numpy_gates``); ``comppo_core.reference`` is the plain Python-loop oracle;
* ``torch_grpo`` here and verl's loop and ``masked_whiten`` in ``benches/verl_original.py``.

Floors: a numba ``prange`` stream over the same bytes as the kernel (its float inputs and
its mask read, its outputs written) into preallocated buffers, on every thread numba may
use. Nothing that reads the inputs and writes the outputs can be much faster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# numba's OpenMP workers busy-wait after each parallel loop; on a small machine they
# would steal the cores from whatever is timed next. Let them sleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

try:
    import numba
    from numba import njit, prange
except ImportError:  # pragma: no cover - the [bench] extra is missing
    numba = None

GAMMA, LAM = 1.0, 0.95

#: name → (layout, B, T, seed); W4 packs W1's data
SHAPES: dict[str, tuple[int, int]] = {"W1": (512, 4096), "W2": (64, 16384), "W3": (4096, 512), "W4": (512, 4096)}
SEEDS = {"W1": 1, "W2": 2, "W3": 3, "W4": 1}
NAMES = tuple(SHAPES)


@dataclass
class Workload:
    name: str
    rewards: np.ndarray
    values: np.ndarray
    gates: np.ndarray
    mask: np.ndarray | None
    cu_seqlens: np.ndarray | None

    @property
    def tokens(self) -> int:
        return int(self.mask.sum()) if self.mask is not None else int(self.rewards.size)

    @property
    def elements(self) -> int:
        return int(self.rewards.size)

    @property
    def packed(self) -> bool:
        return self.cu_seqlens is not None

    def kwargs(self) -> dict[str, Any]:
        return {"mask": self.mask, "cu_seqlens": self.cu_seqlens, "gates": self.gates}

    def head(self, max_elements: int) -> tuple[Workload, float]:
        """The first rows, about ``max_elements`` elements (at least one row), and the
        fraction of the workload's elements they hold."""
        if self.cu_seqlens is not None:
            cu = self.cu_seqlens
            rows = max(1, int(np.searchsorted(cu, max_elements)))
            rows = min(rows, cu.shape[0] - 1)
            n = int(cu[rows])
            part = Workload(self.name, self.rewards[:n], self.values[:n], self.gates[:n], None, cu[: rows + 1])
        else:
            assert self.mask is not None
            rows = max(1, max_elements // self.rewards.shape[1])
            part = Workload(
                self.name, self.rewards[:rows], self.values[:rows], self.gates[:rows], self.mask[:rows], None
            )
        return part, part.elements / self.elements


def make_padded(name: str, b: int, t: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(t // 2, t + 1, size=b)
    mask = np.arange(t)[None, :] < lengths[:, None]
    rewards = (rng.standard_normal((b, t)) * mask).astype(np.float32)
    values = rng.standard_normal((b, t)).astype(np.float32)
    gates = rng.uniform(0.5, 1.0, (b, t)).astype(np.float32)
    return Workload(name, rewards, values, gates, mask, None)


def pack(name: str, w: Workload) -> Workload:
    assert w.mask is not None
    lengths = w.mask.sum(axis=1)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return Workload(name, w.rewards[w.mask], w.values[w.mask], w.gates[w.mask], None, cu)


def label(name: str, scale: int = 1) -> str:
    """``"W1 padded 512x4096"``, ``"W4 packed 512x4096"`` (the shape its data came from)."""
    b, t = SHAPES[name]
    return f"{name} {'packed' if name == 'W4' else 'padded'} {b * scale}x{t}"


def make(name: str, scale: int = 1) -> Workload:
    """Workload ``name`` (W1–W4) with ``scale`` times its rows."""
    b, t = SHAPES[name]
    w = make_padded(label(name, scale), b * scale, t, SEEDS[name])
    return pack(label(name, scale), w) if name == "W4" else w


# ---------------------------------------------------------------- numba peers and floors
if numba is not None:

    @njit(parallel=True, cache=True)
    def numba_gae_padded(r, v, g, m, gamma, lam):  # pragma: no cover - jitted
        b_, t_ = r.shape
        adv = np.empty_like(r)
        ret = np.empty_like(r)
        for b in prange(b_):
            a = 0.0
            v_next = 0.0
            for t in range(t_ - 1, -1, -1):
                if m[b, t]:
                    gg = gamma * g[b, t]
                    d = r[b, t] + gg * v_next - v[b, t]
                    a = d + gg * lam * a
                    adv[b, t] = a
                    ret[b, t] = a + v[b, t]
                    v_next = v[b, t]
                else:
                    adv[b, t] = 0.0
                    ret[b, t] = 0.0
        return adv, ret

    @njit(parallel=True, cache=True)
    def numba_gae_packed(r, v, g, cu, gamma, lam):  # pragma: no cover - jitted
        adv = np.empty_like(r)
        ret = np.empty_like(r)
        for b in prange(cu.shape[0] - 1):
            a = 0.0
            v_next = 0.0
            for i in range(cu[b + 1] - 1, cu[b] - 1, -1):
                gg = gamma * g[i]
                d = r[i] + gg * v_next - v[i]
                a = d + gg * lam * a
                adv[i] = a
                ret[i] = a + v[i]
                v_next = v[i]
        return adv, ret

    @njit(parallel=True, cache=True)
    def numba_td_padded(r, v, g, m, gamma):  # pragma: no cover - jitted
        b_, t_ = r.shape
        y = np.empty_like(r)
        for b in prange(b_):
            v_next = 0.0
            for t in range(t_ - 1, -1, -1):
                if m[b, t]:
                    y[b, t] = r[b, t] + gamma * g[b, t] * v_next
                    v_next = v[b, t]
                else:
                    y[b, t] = 0.0
        return y

    @njit(parallel=True, cache=True)
    def numba_td_packed(r, v, g, cu, gamma):  # pragma: no cover - jitted
        y = np.empty_like(r)
        for b in prange(cu.shape[0] - 1):
            v_next = 0.0
            for i in range(cu[b + 1] - 1, cu[b] - 1, -1):
                y[i] = r[i] + gamma * g[i] * v_next
                v_next = v[i]
        return y

    # A flat prange over elements vectorizes and was the fastest of the floor variants
    # tried (chunked prange, slice arithmetic per thread, NumPy ufuncs on two threads).
    @njit(parallel=True, cache=True)
    def floor_stream_masked(r, v, g, m, o1, o2):  # pragma: no cover - jitted
        for i in prange(r.shape[0]):
            o1[i] = r[i] + g[i]
            o2[i] = v[i] + np.float32(m[i])

    @njit(parallel=True, cache=True)
    def floor_stream(r, v, g, o1, o2):  # pragma: no cover - jitted
        for i in prange(r.shape[0]):
            o1[i] = r[i] + g[i]
            o2[i] = v[i]

    @njit(parallel=True, cache=True)
    def floor_stream3_masked(r, v, g, m, o):  # pragma: no cover - jitted
        for i in prange(r.shape[0]):
            o[i] = r[i] + g[i] * v[i] + np.float32(m[i])

    @njit(parallel=True, cache=True)
    def floor_stream3(r, v, g, o):  # pragma: no cover - jitted
        for i in prange(r.shape[0]):
            o[i] = r[i] + g[i] * v[i]

    @njit(parallel=True, cache=True)
    def floor_stream1_masked(x, m, o):  # pragma: no cover - jitted
        for i in prange(x.shape[0]):
            o[i] = x[i] + np.float32(m[i])

    @njit(parallel=True, cache=True)
    def floor_stream1(x, o):  # pragma: no cover - jitted
        for i in prange(x.shape[0]):
            o[i] = x[i] + np.float32(1.0)


def _flat_mask(w: Workload) -> np.ndarray | None:
    return None if w.mask is None else w.mask.reshape(-1).view(np.uint8)


def floor_call(w: Workload) -> Callable[[], object]:
    """``gae``'s floor on ``w``: rewards, values, gates (and mask) read, two outputs written."""
    o1 = np.empty(w.elements, np.float32)
    o2 = np.empty(w.elements, np.float32)
    r1, v1, g1, m1 = w.rewards.reshape(-1), w.values.reshape(-1), w.gates.reshape(-1), _flat_mask(w)
    if m1 is None:
        return lambda: floor_stream(r1, v1, g1, o1, o2)
    return lambda: floor_stream_masked(r1, v1, g1, m1, o1, o2)


def floor_call_one_output(w: Workload) -> Callable[[], object]:
    """``td_targets``' floor on ``w``: rewards, values, gates (and mask) read, one output written."""
    o = np.empty(w.elements, np.float32)
    r1, v1, g1, m1 = w.rewards.reshape(-1), w.values.reshape(-1), w.gates.reshape(-1), _flat_mask(w)
    if m1 is None:
        return lambda: floor_stream3(r1, v1, g1, o)
    return lambda: floor_stream3_masked(r1, v1, g1, m1, o)


def floor_call_unary(x: np.ndarray, mask: np.ndarray | None) -> Callable[[], object]:
    """The floor of a map ``x`` (and mask) → one output: ``masked_whiten``, ``gates_from_concentration``."""
    o = np.empty(x.size, np.float32)
    x1 = x.reshape(-1)
    if mask is None:
        return lambda: floor_stream1(x1, o)
    m1 = mask.reshape(-1).view(np.uint8)
    return lambda: floor_stream1_masked(x1, m1, o)


# ---------------------------------------------------------------- NumPy and torch peers
def numpy_grpo(scores: np.ndarray, groups: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO advantages the vectorised NumPy way (unique ids, bincount sums)."""
    _, inv, counts = np.unique(groups, return_inverse=True, return_counts=True)
    mean = np.bincount(inv, weights=scores) / counts
    dev = scores - mean[inv]
    std = np.sqrt(np.bincount(inv, weights=dev * dev) / np.maximum(counts - 1, 1))
    out = dev / (std[inv] + eps)
    out[counts[inv] == 1] = 0.0
    return out


def torch_grpo(scores: Any, groups: Any, eps: float = 1e-6) -> Any:
    """The same in torch (unique + index_add)."""
    import torch

    _, inv, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    sums = torch.zeros(counts.shape[0], dtype=scores.dtype).index_add_(0, inv, scores)
    mean = sums / counts
    dev = scores - mean[inv]
    var = torch.zeros_like(sums).index_add_(0, inv, dev * dev) / (counts - 1).clamp(min=1)
    out = dev / (var.sqrt()[inv] + eps)
    return torch.where(counts[inv] == 1, torch.zeros_like(out), out)


def numpy_whiten(x: np.ndarray, m: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """verl's masked_whiten written with NumPy."""
    mf = m.astype(x.dtype)
    n = mf.sum()
    mean = (x * mf).sum() / n
    var = (((x - mean) ** 2) * mf).sum() / n * (n / (n - 1))
    return (x - mean) * (1.0 / np.sqrt(var + eps)) * mf


def numpy_gates(
    conc: np.ndarray,
    mask: np.ndarray | None,
    cu_seqlens: np.ndarray | None,
    params: Any,
) -> np.ndarray:
    """``gates_from_concentration`` in vectorised NumPy (float64), for ``params.normalize``
    ``"sequence"`` (each row's mean and population std, ``np.add.reduceat``) or
    ``"causal"`` (running means and stds from cumulative sums of c and c², restarted per
    row), then the bounded sigmoid. A padded batch is compressed to its valid tokens
    first (``conc[mask]``) and scattered back; masked tokens get 1. A row (or prefix) with
    one valid token or constant values gets z = 0."""
    if cu_seqlens is None:
        assert mask is not None
        valid = mask.astype(bool)
        counts = valid.sum(axis=1)
        keep = counts > 0
        cu = np.concatenate([[0], np.cumsum(counts[keep])])
        out = np.ones(conc.shape, conc.dtype)
        out[valid] = numpy_gates(conc[valid], None, cu, params)
        return out
    from comppo_core.reference import GATE_STD_EPS

    c = conc.astype(np.float64)
    lengths = np.diff(cu_seqlens)
    starts = cu_seqlens[:-1]
    if params.normalize == "sequence":
        n = np.repeat(lengths, lengths)
        mean = np.repeat(np.add.reduceat(c, starts) / lengths, lengths)
        dev = c - mean
        std = np.repeat(np.sqrt(np.add.reduceat(dev * dev, starts) / lengths), lengths)
        flat = np.repeat(np.maximum.reduceat(c, starts) == np.minimum.reduceat(c, starts), lengths)
    else:
        n = np.arange(1, c.size + 1) - np.repeat(starts, lengths)

        def running_sum(x: np.ndarray) -> np.ndarray:
            s = np.cumsum(x)
            return s - np.repeat(np.concatenate([[0.0], s])[starts], lengths)

        mean = running_sum(c) / n
        dev = c - mean
        std = np.sqrt(np.maximum(running_sum(c * c) / n - mean * mean, 0.0))
        # offsets keep each row's running max and min within the row
        big = 2.0 * (np.abs(c).max() + 1.0) * np.repeat(np.arange(lengths.size), lengths)
        flat = (np.maximum.accumulate(c + big) - big) == (np.minimum.accumulate(c - big) + big)
    z = np.where(flat | (n <= 1), 0.0, dev / (std + GATE_STD_EPS))
    if params.invert:
        z = -z
    with np.errstate(over="ignore"):
        g = params.low + (params.high - params.low) / (1.0 + np.exp(-params.sharpness * z))
    return g.astype(conc.dtype)


# ---------------------------------------------------------------- lab helper
def measure_times(
    fns: dict[str, Callable[[], object]], rounds: int, min_seconds: float = 0.0
) -> dict[str, list[float]]:
    """Seconds of every call, the candidates run round-robin (one call of each per round).

    Kernel work only (``benches/lab/ab_builds.py`` A/B-tests two builds of the extension,
    which one pytest process cannot load side by side); the benchmarks users run are the
    pytest-benchmark suites.
    """
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up (JIT, page cache, thread pools)
        fn()
    start = time.perf_counter()
    done = 0
    while done < rounds or time.perf_counter() - start < min_seconds:
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        done += 1
    return times


# ---------------------------------------------------------------- the suites' parametrisation
_CACHE: dict[tuple[str, int], Workload] = {}


def cached(name: str, scale: int = 1) -> Workload:
    """:func:`make`, built once per process (the suites share W1's data)."""
    if (name, scale) not in _CACHE:
        _CACHE[name, scale] = make(name, scale)
    return _CACHE[name, scale]


def selected(option: str, among: tuple[str, ...] = NAMES) -> list[str]:
    """The names of ``among`` that ``option`` (``"W1,W4"``) lists, in ``among``'s order."""
    want = option.split(",")
    return [n for n in among if n in want]


def case_id(name: str, scale: int, candidate: str) -> str:
    """``W1-512x4096-comppo_out``: workload, shape and candidate, so that a baseline saved at
    another scale never matches."""
    b, t = SHAPES[name]
    slug = candidate.replace("=", "").replace("(", "").replace(")", "").replace(" ", "_").strip("_")
    return f"{name}-{b * scale}x{t}-{slug}"


def parametrize(metafunc: Any, among: tuple[str, ...], candidates: tuple[str, ...], exclude: set | None = None) -> None:
    """Parametrises a suite's ``case`` argument with ``(workload, candidate)`` for the selected
    workloads of ``among`` (``--bench-workloads``) and every candidate, workload-major so that
    each group runs together; ``exclude`` lists pairs that do not exist (verl's loop has no
    packed layout)."""
    if "case" not in metafunc.fixturenames:
        return
    scale = metafunc.config.getoption("--bench-scale")
    names = selected(metafunc.config.getoption("--bench-workloads"), among)
    cases = [(n, c) for n in names for c in candidates if (n, c) not in (exclude or set())]
    metafunc.parametrize("case", cases, ids=[case_id(n, scale, c) for n, c in cases])


def describe(benchmark: Any, group: str, candidate: str, w: Workload | None, fraction: float = 1.0) -> None:
    """Names ``benchmark``'s group and candidate and records what the ratios need."""
    benchmark.group = group
    benchmark.extra_info.update(candidate=candidate, fraction=fraction)
    if w is not None:
        benchmark.extra_info.update(workload=w.name, tokens=w.tokens, elements=w.elements)


#: peers that take 0.05–2 s a call (Python loops): at least 3 rounds, whatever --benchmark-min-rounds says
SLOW_CANDIDATES = frozenset({"reference", "torch loop", "verl loop"})
