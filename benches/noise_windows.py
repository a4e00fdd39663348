"""How the timing noise of this machine is shaped: per-window medians of W1 rounds.

Run:  python benches/noise_windows.py [--rounds 1000] [--window 25]

Times three candidates round-robin, as ``compare.py`` does, on W1 (padded 512 x 4096,
float32): ``gae`` allocating its outputs, ``gae`` with ``out=`` into preallocated
buffers, and the memory floor. It then prints the median of each candidate over
consecutive windows of rounds, the minor page faults each candidate took, and how many
rounds had ``out=`` more than 1.3x slower than the allocating call of the same round.

On the 2-core development VM (2026-11-30, 1000 rounds of about 6 ms) both calls took
about 1.8 ms in most windows, yet in one run single windows of about a quarter of a
second had one of them 1.3-1.4x slower while the other stayed at its usual time: once
``out=`` (2.47 ms against 1.84), twice the allocating call, with no more page faults
than elsewhere (0-3 per window, none of them in the calls). In another run no window
stood out, but the floor's window medians ranged over 1.15-1.83 ms. A median over the
40 rounds of half a second can fall inside such a window; that is why ``compare.py``
runs each table row for several seconds, so that its median spans many windows.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402

import comppo_core as cc  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--window", type=int, default=25)
    a = p.parse_args(argv)
    if compare.numba is None:
        raise SystemExit("needs numba for the floor: pip install '.[bench]'")
    w = compare.make_padded("W1", 512, 4096, 1)
    adv, ret = np.empty_like(w.rewards), np.empty_like(w.rewards)
    o1, o2 = np.empty(w.elements, np.float32), np.empty(w.elements, np.float32)
    r1, v1, g1 = w.rewards.reshape(-1), w.values.reshape(-1), w.gates.reshape(-1)
    m1 = w.mask.reshape(-1).view(np.uint8)
    kw = w.kwargs()
    fns = {
        "comppo": lambda: cc.gae(w.rewards, w.values, gamma=compare.GAMMA, lam=compare.LAM, **kw),
        "comppo out=": lambda: cc.gae(w.rewards, w.values, gamma=compare.GAMMA, lam=compare.LAM, out=(adv, ret), **kw),
        "floor": lambda: compare.floor_stream_masked(r1, v1, g1, m1, o1, o2),
    }
    for fn in fns.values():
        fn()
    times = np.zeros((a.rounds, len(fns)))
    faults = np.zeros((a.rounds, len(fns)), dtype=np.int64)
    for i in range(a.rounds):
        for j, fn in enumerate(fns.values()):
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            fn()
            times[i, j] = time.perf_counter() - t0
            faults[i, j] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    ms = times * 1e3
    print(f"W1, {a.rounds} rounds; median ms per window of {a.window} rounds, and minor page faults")
    print(f"{'rounds':>10}" + "".join(f"{k:>13}" for k in fns) + f"{'faults':>16}")
    for i in range(0, a.rounds, a.window):
        med = np.median(ms[i : i + a.window], axis=0)
        f = " ".join(str(int(x)) for x in faults[i : i + a.window].sum(axis=0))
        print(f"{i:>10}" + "".join(f"{x:>13.2f}" for x in med) + f"{f:>16}")
    print("overall median ms: " + ", ".join(f"{k} {x:.2f}" for k, x in zip(fns, np.median(ms, axis=0))))
    slow = int((ms[:, 1] > 1.3 * ms[:, 0]).sum())
    print(f"rounds with out= over 1.3x the allocating call: {slow} of {a.rounds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
