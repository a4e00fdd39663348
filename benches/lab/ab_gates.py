"""Two builds' ``gates_from_concentration`` kernels side by side in one process (W1: 512 x 4096 float32, padded).

Run:  OMP_NUM_THREADS=1 python benches/lab/ab_gates.py OLD.so NEW.so

Times the causal and the whole-row ("sequence") z-score of each build round-robin (25 rounds),
checks that the two agree bit for bit without a floor, and times the new build with
``min_spread=1e-3`` too (a build that takes it: from d9a1923). Prints medians and their ratio to
the old build's. (``ab_builds.py`` is the same for ``gae``.)
"""

import importlib.machinery
import importlib.util
import statistics
import sys
import time

import numpy as np


def load(path, name):
    loader = importlib.machinery.ExtensionFileLoader("comppo_core._core", path)
    spec = importlib.util.spec_from_file_location("comppo_core._core", path, loader=loader)
    m = importlib.util.module_from_spec(spec)
    loader.exec_module(m)
    return m


old = load(sys.argv[1], "old")
sys.modules.pop("comppo_core._core", None)
new = load(sys.argv[2], "new")
rng = np.random.default_rng(0)
B, T = 512, 4096
c = rng.random((B, T), dtype=np.float32)
lens = rng.integers(T // 4, T + 1, B)
m = np.arange(T)[None, :] < lens[:, None]
for mode in ("causal", "sequence"):
    args = (c, m, None, 0.9, 1.0, 1.0, mode, 0.0, 1.0, False)
    calls = {
        "old": lambda args=args: old.gates_from_concentration(*args),
        "new floor 0": lambda args=args: new.gates_from_concentration(*args),
        "new floor 1e-3": lambda args=args: new.gates_from_concentration(*args, 1e-3),
    }
    assert np.array_equal(calls["old"](), calls["new floor 0"]())
    times = {k: [] for k in calls}
    for _ in range(25):
        for k, f in calls.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    base = statistics.median(times["old"])
    print(
        mode,
        "; ".join(
            f"{k}: median {statistics.median(v) * 1e3:.1f} ms ({statistics.median(v) / base:.3f}x old)"
            for k, v in times.items()
        ),
    )
