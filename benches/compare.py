"""Side-by-side benchmark of comppo-core's GAE against what users run today.

Run:  python benches/compare.py            (all workloads; needs the [bench] extra: numba)
      python benches/compare.py --quick    (smaller repeat counts)

Workloads (float32, each row's length uniform in [T/2, T], gates uniform in [0.5, 1],
γ = 1, λ = 0.95):

    W1  padded 512 × 4096       W2  padded 64 × 16384
    W3  padded 4096 × 512       W4  W1's data packed ([N] + cu_seqlens)

Columns, all measured in one run, interleaved round by round (median of the rounds;
each table row runs at least --rounds rounds and at least --min-seconds seconds):

    comppo        cc.gae(...) allocating its two outputs, as a user calls it
    comppo out=   cc.gae(..., out=(adv, ret)) into preallocated buffers
    numba         a numba-parallel loop over rows (prange) that allocates its outputs
    reference     comppo_core.reference.gae (Python loop; timed on a few rows, scaled)
    torch loop    verl's compute_gae_advantage_return loop over tokens (if torch is installed)
    floor         the memory floor: a parallel streaming pass over the same bytes
                  (the float inputs and the mask read, two outputs written) into
                  preallocated buffers on every core

Two more columns time the regime a user's training process is in, which this
process is not: a fresh interpreter (``compare.py --torch-regime-child``) that imports
torch, makes the batch with torch (``torch.randn`` and friends, as a PPO loop's data
arrives) and allocates a little between calls:

    torch alloc   cc.gae(...) allocating its outputs, there
    torch out=    cc.gae(..., out=(adv, ret)), there

There glibc's dynamic mmap threshold sits at the size of one output (the largest block
freed so far), so two outputs freed together are trimmed off the heap and handed back
to the operating system, and the next call faults fresh pages in again (about 1,000
page faults a call on W1 before rust/buffers.rs cached them); in this process larger
blocks freed earlier have raised the threshold and the call reuses the heap instead.
The drop-in table gets the same regime's row.

Ratios are times divided by the floor (lower is better) and speedups of comppo over
the others. Timing noise on a shared machine is real: compare ratios, not bare times.

A second table times the outcome path:

    group_advantages   65,536 sequences in groups of 16 (ids shuffled), GRPO, against a
                       vectorised NumPy version (np.unique + bincount) and the same in torch
    masked_whiten      W1's advantages and mask, against verl's formula in NumPy and in
                       torch, and a floor streaming the same bytes (x and mask read, one
                       output written into a preallocated buffer); "comppo out=" writes
                       into a preallocated buffer too (out=), like the floor
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

# numba's OpenMP workers busy-wait after each parallel loop; on a small machine they
# would steal the cores from whatever the round-robin times next. Let them sleep.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

import comppo_core as cc  # noqa: E402

try:
    import numba
    from numba import njit, prange
except ImportError:  # pragma: no cover - the [bench] extra is missing
    numba = None

try:
    import torch
    import verl_original  # verl's published loop and masked_whiten (benches/verl_original.py)
except ImportError:  # pragma: no cover - torch is optional
    torch = None

GAMMA, LAM = 1.0, 0.95


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

    def kwargs(self) -> dict:
        return {"mask": self.mask, "cu_seqlens": self.cu_seqlens, "gates": self.gates}


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


# ---------------------------------------------------------------- alternatives
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

    # The memory floor: one parallel streaming pass over the same bytes (the float
    # inputs and the mask read, two float outputs written). A flat prange over
    # elements vectorizes and was the fastest of the variants tried (chunked prange,
    # slice arithmetic per thread, NumPy ufuncs on two Python threads).
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

    def floor_call(w: Workload) -> Callable[[], object]:
        """The memory floor of ``w``: a parallel stream over its inputs (and mask) into
        two preallocated outputs."""
        o1 = np.empty(w.elements, np.float32)
        o2 = np.empty(w.elements, np.float32)
        r1, v1, g1 = w.rewards.reshape(-1), w.values.reshape(-1), w.gates.reshape(-1)
        if w.mask is None:
            return lambda: floor_stream(r1, v1, g1, o1, o2)
        m1 = w.mask.reshape(-1).view(np.uint8)
        return lambda: floor_stream_masked(r1, v1, g1, m1, o1, o2)


# ---------------------------------------------------------------- timing
def measure(fns: dict[str, Callable[[], object]], rounds: int, min_seconds: float = 0.0) -> dict[str, float]:
    """Median seconds per call, running the candidates round-robin so drift hits all alike.

    At least ``rounds`` rounds, and more until ``min_seconds`` have passed. On the
    development VM the noise comes in windows of about a quarter of a second in which
    one set of buffers streams up to 1.6x slower than usual while the others do not
    (any candidate's, at random); a median over half a second of rounds can fall inside
    one such window, a median over several seconds does not.
    """
    return {k: statistics.median(v) for k, v in measure_times(fns, rounds, min_seconds).items()}


def measure_times(
    fns: dict[str, Callable[[], object]], rounds: int, min_seconds: float = 0.0
) -> dict[str, list[float]]:
    """The seconds of every call of :func:`measure`'s round-robin, per candidate."""
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


def reference_time(w: Workload, max_tokens: int) -> float:
    """The NumPy reference on the first rows (about ``max_tokens`` elements), scaled to the workload."""
    if w.cu_seqlens is not None:
        cu = w.cu_seqlens
        rows = max(1, int(np.searchsorted(cu, max_tokens)))
        n = int(cu[rows])
        args = (w.rewards[:n], w.values[:n])
        kw = {"cu_seqlens": cu[: rows + 1], "gates": w.gates[:n]}
        frac = n / w.elements
    else:
        rows = max(1, max_tokens // w.rewards.shape[1])
        args = (w.rewards[:rows], w.values[:rows])
        kw = {"mask": w.mask[:rows], "gates": w.gates[:rows]}
        frac = rows / w.rewards.shape[0]
    t0 = time.perf_counter()
    cc.reference.gae(*args, gamma=GAMMA, lam=LAM, **kw)
    return (time.perf_counter() - t0) / frac


def run(workloads: list[Workload], rounds: int, ref_tokens: int, with_torch: bool, min_seconds: float) -> list[dict]:
    rows = []
    for w in workloads:
        adv = np.empty_like(w.rewards)
        ret = np.empty_like(w.rewards)
        r, v, g, m, cu = w.rewards, w.values, w.gates, w.mask, w.cu_seqlens
        # Each candidate called as a user writes the call: the keyword arguments the
        # layout needs, spelled out (unpacking a dict of them, `**w.kwargs()`, cost the
        # comppo calls 8-16 us each on W2 that the others, called positionally, did not).
        # The lambdas bind this workload's arrays as default arguments (local loads, no
        # closure cells; each is called only while its workload is current anyway).
        fns: dict[str, Callable[[], object]]
        if m is not None:
            fns = {
                "comppo": lambda r=r, v=v, m=m, g=g: cc.gae(r, v, mask=m, gates=g, gamma=GAMMA, lam=LAM),
                "comppo out=": lambda r=r, v=v, m=m, g=g, adv=adv, ret=ret: cc.gae(
                    r, v, mask=m, gates=g, gamma=GAMMA, lam=LAM, out=(adv, ret)
                ),
            }
        else:
            fns = {
                "comppo": lambda r=r, v=v, cu=cu, g=g: cc.gae(r, v, cu_seqlens=cu, gates=g, gamma=GAMMA, lam=LAM),
                "comppo out=": lambda r=r, v=v, cu=cu, g=g, adv=adv, ret=ret: cc.gae(
                    r, v, cu_seqlens=cu, gates=g, gamma=GAMMA, lam=LAM, out=(adv, ret)
                ),
            }
        if numba is not None:
            if m is not None:
                fns["numba"] = lambda r=r, v=v, g=g, m=m: numba_gae_padded(r, v, g, m, GAMMA, LAM)
            else:
                fns["numba"] = lambda r=r, v=v, g=g, cu=cu: numba_gae_packed(r, v, g, cu, GAMMA, LAM)
            fns["floor"] = floor_call(w)
        if with_torch and torch is not None and w.mask is not None:
            tr, tv, tg = (torch.from_numpy(x) for x in (w.rewards, w.values, w.gates))
            tm = torch.from_numpy(w.mask.astype(np.float32))
            fns["torch loop"] = lambda tr=tr, tv=tv, tm=tm, tg=tg: verl_original.gae_loop(tr, tv, tm, GAMMA, LAM, tg)
        slow = {k: fns.pop(k) for k in ["torch loop"] if k in fns}
        t = measure(fns, rounds, min_seconds)
        t.update(measure(slow, max(1, rounds // 10)) if slow else {})
        t["reference"] = reference_time(w, ref_tokens)
        rows.append({"workload": w.name, "elements": w.elements, "tokens": w.tokens, **t})
    return rows


# ---------------------------------------------------------------- the torch regime
REGIME_CHILD = "--torch-regime-child"
SHAPES = {"W1": (512, 4096), "W2": (64, 16384), "W3": (4096, 512), "W4": (512, 4096)}


def torch_regime(names: list[str], rounds: int, min_seconds: float, threads: int | None, dropin: bool) -> dict:
    """The torch regime's times (see the module), each workload measured in a fresh
    interpreter of its own (one that ran a larger batch before would have raised glibc's
    threshold past it): ``{workload: {"torch alloc": s, "torch out=": s, "faults alloc":
    n, "faults out=": n}}``, and under ``"dropin"`` the verl drop-in's and verl's loop's
    seconds on W1."""
    results = {}
    for name in [*names, *(["dropin"] if dropin else [])]:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            REGIME_CHILD,
            name,
            str(rounds),
            str(min_seconds),
            str(threads or 0),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def regime_child(name: str, rounds: int, min_seconds: float) -> dict:
    """The body of ``--torch-regime-child``: the workload's batch made by torch, the
    allocating and the out= call round-robin, a few small allocations before each call
    (``name`` "dropin": the verl drop-in and verl's loop on W1's shape instead)."""
    torch.manual_seed(0)
    b, t = SHAPES["W1" if name == "dropin" else name]
    lengths = torch.randint(t // 2, t + 1, (b,))
    mask = torch.arange(t)[None, :] < lengths[:, None]
    if name == "dropin":
        from comppo_core.integrations import verl as verl_dropin

        tm = mask.float()
        tr, tv = torch.randn(b, t) * tm, torch.randn(b, t)
        d = measure(
            {"drop-in": lambda: verl_dropin.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)}, rounds, min_seconds
        )
        loop = lambda: verl_original.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)  # noqa: E731
        return {**d, **measure({"verl loop": loop}, max(3, rounds // 4))}
    rewards, values, gates = torch.randn(b, t) * mask, torch.randn(b, t), torch.rand(b, t) * 0.5 + 0.5
    if name == "W4":
        kw = {"cu_seqlens": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).numpy()}
        rewards, values, gates = rewards[mask], values[mask], gates[mask]
    else:
        kw = {"mask": mask.numpy()}
    r, v, g = rewards.numpy(), values.numpy(), gates.numpy()
    adv, ret = np.empty_like(r), np.empty_like(r)
    faults: dict[str, list[int]] = {"alloc": [], "out=": []}
    scratch: list = []

    def call(key: str, fn: Callable[[], object]) -> Callable[[], object]:
        def once() -> object:
            scratch[:] = [torch.empty(b, 64), list(range(10_000))]  # a loop's bookkeeping, between calls
            f0 = _faults()
            result = fn()
            faults[key].append(_faults() - f0)
            return result

        return once

    fns = {
        "torch alloc": call("alloc", lambda: cc.gae(r, v, gates=g, gamma=GAMMA, lam=LAM, **kw)),
        "torch out=": call("out=", lambda: cc.gae(r, v, gates=g, gamma=GAMMA, lam=LAM, out=(adv, ret), **kw)),
    }
    result: dict = measure(fns, rounds, min_seconds)
    result.update({f"faults {k}": statistics.median(f) for k, f in faults.items()})
    return result


def report(rows: list[dict]) -> str:
    cols = ["comppo", "comppo out=", "numba", "reference", "torch loop", "floor", "torch alloc", "torch out="]
    present = [c for c in cols if any(c in r for r in rows)]
    lines = []
    head = f"{'workload':<22}" + "".join(f"{c:>13}" for c in present)
    lines.append("time per call, ms (median of interleaved rounds)")
    lines.append(head)
    for r in rows:
        lines.append(
            f"{r['workload']:<22}" + "".join(f"{r[c] * 1e3:>13.2f}" if c in r else f"{'-':>13}" for c in present)
        )
    lines.append("")
    lines.append("ratios (lower is better for /floor; higher is better for speedups)")
    head2 = ["comppo/floor", "out=/floor", "numba/comppo", "ref/comppo", "torch/comppo", "Mtok/s comppo",
             "alloc/out=", "torch alloc/out="]  # fmt: skip
    lines.append(f"{'workload':<22}" + "".join(f"{c:>17}" for c in head2))
    for r in rows:

        def ratio(a: str, b: str, r: dict = r) -> str:
            return f"{r[a] / r[b]:>17.2f}" if a in r and b in r else f"{'-':>17}"

        cells = [ratio("comppo", "floor"), ratio("comppo out=", "floor"), ratio("numba", "comppo"),
                 ratio("reference", "comppo"), ratio("torch loop", "comppo"),
                 f"{r['tokens'] / r['comppo'] / 1e6:>17.0f}", ratio("comppo", "comppo out="),
                 ratio("torch alloc", "torch out=")]  # fmt: skip
        lines.append(f"{r['workload']:<22}" + "".join(cells))
    if any("faults alloc" in r for r in rows):
        lines.append("torch regime (fresh interpreter, batch made by torch): page faults per call, allocating / out=: "
                     + ", ".join(f"{r['workload'].split()[0]} {r['faults alloc']:.0f} / {r['faults out=']:.0f}"
                                 for r in rows if "faults alloc" in r))  # fmt: skip
    return "\n".join(lines)


# ---------------------------------------------------------------- outcome path
def numpy_grpo(scores: np.ndarray, groups: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO advantages the vectorised NumPy way (unique ids, bincount sums)."""
    _, inv, counts = np.unique(groups, return_inverse=True, return_counts=True)
    mean = np.bincount(inv, weights=scores) / counts
    dev = scores - mean[inv]
    std = np.sqrt(np.bincount(inv, weights=dev * dev) / np.maximum(counts - 1, 1))
    out = dev / (std[inv] + eps)
    out[counts[inv] == 1] = 0.0
    return out


def torch_grpo(scores, groups, eps: float = 1e-6):
    """The same in torch (unique + index_add)."""
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


if numba is not None:

    @njit(parallel=True, cache=True)
    def floor_whiten(x, m, o):  # pragma: no cover - jitted
        for i in prange(x.shape[0]):
            o[i] = x[i] + np.float32(m[i])


def run_outcomes(rounds: int, with_torch: bool, min_seconds: float) -> list[dict]:
    rng = np.random.default_rng(5)
    n_seq, group = 65_536, 16
    scores = rng.standard_normal(n_seq)
    groups = rng.permutation(np.repeat(rng.permutation(n_seq // group) * 7 + 3, group))
    fns: dict[str, Callable[[], object]] = {
        "comppo": lambda: cc.group_advantages(scores, groups, method="grpo"),
        "numpy": lambda: numpy_grpo(scores, groups),
    }
    if with_torch and torch is not None:
        ts, tg = torch.from_numpy(scores), torch.from_numpy(groups)
        fns["torch"] = lambda: torch_grpo(ts, tg)
    assert np.allclose(cc.group_advantages(scores, groups), numpy_grpo(scores, groups), rtol=1e-9, atol=1e-12)
    rows = [{"workload": f"group_advantages {n_seq}/{group}", **measure(fns, rounds, min_seconds)}]

    w = make_padded("W1", 512, 4096, 1)
    x = cc.gae(w.rewards, w.values, mask=w.mask, gates=w.gates, gamma=GAMMA, lam=LAM).advantages
    m = w.mask
    wout = np.empty_like(x)
    fns = {
        "comppo": lambda: cc.masked_whiten(x, mask=m),
        "comppo out=": lambda: cc.masked_whiten(x, mask=m, out=wout),
        "numpy": lambda: numpy_whiten(x, m),
    }
    if numba is not None:
        o = np.empty(x.size, np.float32)
        x1, m1 = x.reshape(-1), m.reshape(-1).view(np.uint8)
        fns["floor"] = lambda: floor_whiten(x1, m1, o)
    if with_torch and torch is not None:
        tx, tm = torch.from_numpy(x), torch.from_numpy(m.astype(np.float32))
        fns["torch"] = lambda: verl_original.masked_whiten(tx, tm)
    assert np.allclose(cc.masked_whiten(x, mask=m), numpy_whiten(x, m), atol=1e-5)
    rows.append({"workload": "masked_whiten W1", **measure(fns, rounds, min_seconds)})
    return rows


def report_outcomes(rows: list[dict]) -> str:
    lines = ["outcome path: time per call, ms (median of interleaved rounds) and ratios"]
    cols = ["comppo", "comppo out=", "numpy", "torch", "floor"]
    pairs = [("numpy", "comppo"), ("torch", "comppo"), ("comppo", "floor"), ("comppo out=", "floor")]
    lines.append(
        f"{'workload':<26}" + "".join(f"{c:>12}" for c in cols) + "".join(f"{a + '/' + b:>19}" for a, b in pairs)
    )
    for r in rows:
        cells = "".join(f"{r[c] * 1e3:>12.2f}" if c in r else f"{'-':>12}" for c in cols)
        ratios = "".join(f"{r[a] / r[b]:>19.2f}" if a in r and b in r else f"{'-':>19}" for a, b in pairs)
        lines.append(f"{r['workload']:<26}{cells}{ratios}")
    return "\n".join(lines)


# ---------------------------------------------------------------- verl drop-in
def run_dropins(rounds: int, min_seconds: float) -> list[dict]:
    from comppo_core.integrations import verl as verl_dropin

    w = make_padded("W1", 512, 4096, 1)
    tr, tv = torch.from_numpy(w.rewards), torch.from_numpy(w.values)
    tm = torch.from_numpy(w.mask.astype(np.float32))

    m32 = tm.numpy()  # the same float32 mask the tensors carry: same work, only the wrapper differs

    def numpy_path():  # what the drop-in does, on NumPy arrays (whitening its own buffer in place)
        adv, ret = cc.gae(w.rewards, w.values, mask=m32, gamma=GAMMA, lam=LAM, masked_rewards="drop")
        return cc.masked_whiten(adv, mask=m32, out=adv), ret

    fns: dict[str, Callable[[], object]] = {
        "drop-in (torch CPU)": lambda: verl_dropin.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM),
        "numpy path": numpy_path,
    }
    t = measure(fns, rounds, min_seconds)
    t["verl loop"] = measure(
        {"verl loop": lambda: verl_original.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)}, max(3, rounds // 4)
    )["verl loop"]
    a, _ = verl_dropin.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)
    b, _ = verl_original.compute_gae_advantage_return(tr, tv, tm, GAMMA, LAM)
    valid = tm.bool()
    assert torch.allclose(a[valid], b[valid], atol=1e-3), float((a[valid] - b[valid]).abs().max())
    return [{"workload": "verl GAE W1", **t}]


def report_dropins(rows: list[dict], regime: dict | None = None) -> str:
    lines = ["verl drop-in (compute_gae_advantage_return on CPU tensors): ms per call and ratios"]
    cols = ["drop-in (torch CPU)", "numpy path", "verl loop"]
    lines.append(f"{'workload':<14}" + "".join(f"{c:>21}" for c in cols) + f"{'verl/drop-in':>14}{'drop-in/numpy':>15}")
    for r in rows:
        cells = "".join(f"{r[c] * 1e3:>21.2f}" for c in cols)
        d = r["drop-in (torch CPU)"]
        lines.append(f"{r['workload']:<14}{cells}{r['verl loop'] / d:>14.1f}{d / r['numpy path']:>15.2f}")
    if regime is not None:
        d = regime["drop-in"]
        cells = f"{d * 1e3:>21.2f}{'-':>21}{regime['verl loop'] * 1e3:>21.2f}"
        lines.append(f"{'W1, torch regime':<14}{cells}{regime['verl loop'] / d:>14.1f}{'-':>15}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="W1,W2,W3,W4")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument(
        "--min-seconds",
        type=float,
        default=4.0,
        help="keep adding rounds until each table row has run this long (default 4)",
    )
    p.add_argument("--quick", action="store_true", help="fewer rounds, no minimum time")
    p.add_argument("--ref-tokens", type=int, default=100_000, help="elements the reference is timed on")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--only", choices=["gae", "outcomes", "dropins"], default=None, help="run one table only")
    p.add_argument("--no-regime", action="store_true", help="skip the torch regime's columns (a fresh interpreter)")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [REGIME_CHILD]:
        name, rounds_, seconds, threads = argv[1:5]
        if int(threads):
            cc.set_num_threads(int(threads))
        print(json.dumps(regime_child(name, int(rounds_), float(seconds))))
        return 0
    a = p.parse_args(argv)
    if a.threads:
        cc.set_num_threads(a.threads)
        if numba is not None:
            numba.set_num_threads(a.threads)
    rounds = 8 if a.quick else a.rounds
    min_seconds = 0.0 if a.quick else a.min_seconds
    want = a.workloads.split(",") if a.only in (None, "gae") else []
    w1 = make_padded("W1 padded 512x4096", 512, 4096, 1) if {"W1", "W4"} & set(want) else None
    all_w = {
        "W1": lambda: w1,
        "W2": lambda: make_padded("W2 padded 64x16384", 64, 16384, 2),
        "W3": lambda: make_padded("W3 padded 4096x512", 4096, 512, 3),
        "W4": lambda: pack("W4 packed (W1 data)", w1),
    }
    workloads = [all_w[k]() for k in want]
    print(
        f"comppo-core {cc.__version__}, threads={cc.get_num_threads()}, numba={'yes' if numba else 'no'}, "
        f"torch={'yes' if torch is not None and not a.no_torch else 'no'}, python {sys.version.split()[0]}"
    )
    with_regime = torch is not None and not a.no_torch and not a.no_regime
    regime = torch_regime(want, rounds, min_seconds, a.threads, a.only in (None, "dropins")) if with_regime else {}
    if a.only in (None, "gae"):
        rows = run(workloads, rounds, a.ref_tokens, not a.no_torch, min_seconds)
        for key, row in zip(want, rows):
            row.update(regime.get(key, {}))
        print(report(rows))
    if a.only in (None, "outcomes"):
        print()
        print(report_outcomes(run_outcomes(rounds, not a.no_torch, min_seconds)))
    if a.only in (None, "dropins") and torch is not None and not a.no_torch:
        print()
        print(report_dropins(run_dropins(rounds, min_seconds), regime.get("dropin")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
