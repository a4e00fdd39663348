"""What W2's time is made of: compute, waking the pool, and the cache, against its floor.

Run:  python benches/lab/w2_anatomy.py [--seconds 8]

W2 of ``compare.py`` (padded 64 x 16384, float32, 21 MB) fits the 32 MB L3 cache of
the development VM, so on a quiet host its floor streams it from cache and the
kernel's own costs decide the ratio. This times, round-robin so that drift hits all
alike, ``cc.gae(..., out=)`` on W2 under seven conditions, and the floor:

    back to back    a second call right after a first: the pool's helper is awake
                    and the arrays are in cache (the kernel's compute on both cores)
    1 thread        the same on one thread (compute on one core)
    after a pause   after a 2 ms busy-wait on the calling thread, long enough for the
                    helper to go to sleep: the call pays for waking it
    after floor     right after a floor call, as in compare.py's rounds
    pause + wake    the pause, then a small parallel call (8 x 4096) that wakes the
                    helper and returns without waiting for it
    floor + wake    the same after a floor call
    after eviction  after copying 64 MB on one thread, which pushes W2 out of the
                    L3 cache
    floor           the memory floor of compare.py, right after another floor call

On 2026-11-30, before the fused multiply-adds and the faster masked runs (two runs of
8 s, the floor at 0.57-0.60 ms, a busier hour than the quiet one in which compare.py's
W2 floor fell to 0.30-0.41 ms): back to back 1.10-1.13x the floor, one thread
1.82-1.94x, after a pause 1.50-1.56x, after the floor 1.21-1.26x. After them (two runs,
the floor at 0.60 ms): back to back 0.98-0.99x, one thread 1.70-1.80x, after a pause
1.39-1.51x, after the floor 1.08-1.13x. A temporary trace of when the helper joins
each call: back to back a median of 2 us; after the floor also 2 us (90th percentile
55 us), and the call still takes 7-12% longer than back to back, as much when the floor
writes into W2's own outputs, so the wake-up explains little of that part and evicted
outputs none of it; after a pause 45-75 us, which with the wake's other costs makes the
pause the dearest case.

On 2026-12-01, with the last three cases added (two runs of 8 s, the floor at 0.59-0.64
ms): back to back 0.84-0.89x, one thread 1.41-1.47x, after a pause 1.13-1.28x, after
the floor 0.86-0.97x, pause + wake 0.84-0.95x, floor + wake 0.78-0.89x, after
eviction 1.43-1.55x. Waking the helper first takes back most of what the pause costs,
and in these runs all of what the floor costs; and W2 right after its own previous
call is fast mostly because much of its 21 MB is still in the L3 cache: pushed out,
the call takes 1.6-1.7x as long. Read the ratios, not the times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/: compare.py
import compare  # noqa: E402

import comppo_core as cc  # noqa: E402

PAUSE_S = 0.002


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=8.0, help="how long to run the rounds")
    a = p.parse_args(argv)
    if compare.numba is None:
        raise SystemExit("needs numba for the floor: pip install '.[bench]'")
    w = compare.make_padded("W2", 64, 16384, 2)
    assert w.mask is not None
    adv, ret = np.empty_like(w.rewards), np.empty_like(w.rewards)
    kw = w.kwargs()
    threads = cc.get_num_threads()

    def gae() -> None:
        cc.gae(w.rewards, w.values, gamma=compare.GAMMA, lam=compare.LAM, out=(adv, ret), **kw)

    floor = compare.floor_call(w)
    # A batch just big enough to run on the pool: calling it wakes the pool's helper,
    # and it returns without waiting for the helper to arrive.
    small = compare.make_padded("small", 8, 4096, 5)
    small_kw = small.kwargs()
    # Twice the L3 cache of the development VM, copied on one thread: pushes W2 out.
    evict_src = np.ones(16 << 20, np.float32)
    evict_dst = np.empty_like(evict_src)

    def wake() -> None:
        cc.gae(small.rewards, small.values, gamma=compare.GAMMA, lam=compare.LAM, **small_kw)

    def timed(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def back_to_back() -> float:
        gae()
        return timed(gae)

    def one_thread() -> float:
        cc.set_num_threads(1)
        try:
            gae()
            return timed(gae)
        finally:
            cc.set_num_threads(threads)

    def after_pause() -> float:
        busy_wait(PAUSE_S)
        return timed(gae)

    def after_floor() -> float:
        floor()
        return timed(gae)

    def pause_wake() -> float:
        busy_wait(PAUSE_S)
        wake()
        return timed(gae)

    def floor_wake() -> float:
        floor()
        wake()
        return timed(gae)

    def after_eviction() -> float:
        np.copyto(evict_dst, evict_src)
        return timed(gae)

    def floor_twice() -> float:
        floor()
        return timed(floor)

    cases = {
        "back to back": back_to_back,
        "1 thread": one_thread,
        "after a pause": after_pause,
        "after floor": after_floor,
        "pause + wake": pause_wake,
        "floor + wake": floor_wake,
        "after eviction": after_eviction,
        "floor": floor_twice,
    }
    for case in cases.values():  # warm-up (JIT, pool, page faults)
        case()
    times: dict[str, list[float]] = {k: [] for k in cases}
    start = time.perf_counter()
    while time.perf_counter() - start < a.seconds:
        for name, case in cases.items():
            times[name].append(case())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"comppo-core {cc.__version__}, threads={threads}, W2 padded 64x16384 out=, {len(times['floor'])} rounds")
    print(f"{'case':16} {'median ms':>10} {'/floor':>8}")
    for k, t in med.items():
        print(f"{k:16} {t * 1e3:10.3f} {t / med['floor']:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
