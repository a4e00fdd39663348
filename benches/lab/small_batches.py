"""Per-call latency of `cc.gae` on PPO-sized batches, with idle time between calls.

Run:  python benches/lab/small_batches.py

A PPO loop calls the advantage kernel once per step, with other work in between, so the
pool's workers are asleep when a call arrives and waking them is part of the call. This
times `cc.gae(..., out=...)` (float32, gates, a right-padded mask, rows of length
uniform in [T/2, T]) with `--gap-ms` of sleep before each call, in one process per
thread count (`COMPPO_NUM_THREADS` is read once per process), and prints the median
microseconds per call and the ratio of each thread count to one thread.
Timing noise on a shared machine is real: compare ratios, not bare times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SHAPES = ((8, 4096), (16, 4096), (32, 4096), (64, 4096), (256, 4096))


def worker(calls: int, gap_ms: float) -> dict[str, float]:
    import comppo_core as cc

    rng = np.random.default_rng(0)
    result = {}
    for b, t in SHAPES:
        lens = rng.integers(t // 2, t + 1, b)
        mask = np.arange(t)[None, :] < lens[:, None]
        r = (rng.standard_normal((b, t)) * mask).astype(np.float32)
        v = rng.standard_normal((b, t)).astype(np.float32)
        g = rng.uniform(0.5, 1.0, (b, t)).astype(np.float32)
        adv, ret = np.empty_like(r), np.empty_like(r)
        times = []
        for _ in range(calls):
            time.sleep(gap_ms / 1e3)
            t0 = time.perf_counter()
            cc.gae(r, v, mask=mask, gates=g, gamma=1.0, lam=0.95, out=(adv, ret))
            times.append(time.perf_counter() - t0)
        result[f"{b}x{t}"] = float(np.median(times)) * 1e6
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--gap-ms", type=float, default=0.5, help="sleep before each call")
    p.add_argument("--threads", default=f"1,{os.cpu_count() or 1}")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a.calls, a.gap_ms)))
        return 0
    counts = sorted({int(x) for x in a.threads.split(",")})
    runs = {}
    for n in counts:
        env = {**os.environ, "COMPPO_NUM_THREADS": str(n)}
        cmd = [sys.executable, __file__, "--worker", "--calls", str(a.calls), "--gap-ms", str(a.gap_ms)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        runs[n] = json.loads(out.strip().splitlines()[-1])
    print(f"cc.gae(out=...) per call, median us, {a.gap_ms} ms idle before each call")
    head = f"{'batch':<12}" + "".join(f"{f'{n} thr':>10}" for n in counts)
    head += "".join(f"{f'{n}/1 thr':>10}" for n in counts if n != 1)
    print(head)
    for shape in runs[counts[0]]:
        row = f"{shape:<12}" + "".join(f"{runs[n][shape]:>10.0f}" for n in counts)
        if 1 in runs:
            row += "".join(f"{runs[n][shape] / runs[1][shape]:>10.2f}" for n in counts if n != 1)
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
