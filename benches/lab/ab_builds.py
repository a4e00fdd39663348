"""Two builds of the extension side by side in one process: which is faster on a workload.

Run:  python benches/lab/ab_builds.py OLD.so NEW.so [--workload W2] [--seconds 5] [--threads 2]

Copy each build's ``python/comppo_core/_core.abi3.so`` aside (``maturin develop
--release`` between the copies), then run this. Both modules are loaded under
different names, each with its own thread pool, and ``gae(..., out=)`` of each is timed
round-robin with ``compare.py``'s floor, so that the slow windows of a shared machine hit
both builds alike; separate processes, minutes apart, can land in different windows.
With ``--alloc`` each build's call allocates its outputs instead, as ``compare.py``'s
first column does. Prints the median and the fastest tenth of each, and their ratio to
the floor's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from types import ModuleType
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/: compare.py
import compare  # noqa: E402

SHAPES = {"W1": (512, 4096), "W2": (64, 16384), "W3": (4096, 512)}


def load(tag: str, path: str) -> ModuleType:
    """The extension module at ``path``, under the package name ``tag``."""
    spec = importlib.util.spec_from_file_location(f"{tag}._core", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("builds", nargs=2, help="two _core extension files")
    p.add_argument("--workload", choices=sorted(SHAPES), default="W2")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--alloc", action="store_true", help="time the allocating call, not out=")
    a = p.parse_args(argv)
    if compare.numba is None:
        raise SystemExit("needs numba for the floor: pip install '.[bench]'")
    w = compare.make_padded(a.workload, *SHAPES[a.workload], 2)
    assert w.mask is not None
    out = None if a.alloc else (np.empty_like(w.rewards), np.empty_like(w.rewards))
    fns: dict[str, Callable[[], object]] = {}
    for k, path in enumerate(a.builds):
        m = load(f"build{k}", path)
        m.set_num_threads(a.threads)
        fns[f"build {k} ({os.path.basename(os.path.dirname(os.path.abspath(path)))})"] = (
            # builds before f1e16cb named the entry gae_plain; the signature is the same
            lambda m=m: getattr(m, "gae_plain", m.gae)(  # type: ignore[misc]
                w.rewards, w.values, w.mask, None, w.gates, None, out,
                compare.GAMMA, compare.LAM, None, "error",
            )
        )
    fns["floor"] = compare.floor_call(w)
    times = compare.measure_times(fns, 1, a.seconds)
    med = {k: statistics.median(v) for k, v in times.items()}
    p10 = {k: sorted(v)[len(v) // 10] for k, v in times.items()}
    print(f"{a.workload} {'allocating' if a.alloc else 'out='}, threads={a.threads}, {len(times['floor'])} rounds")
    print(f"{'':28} {'median ms':>10} {'/floor':>7} {'p10 ms':>8} {'/floor':>7}")
    for name in fns:
        print(
            f"{name:28} {med[name] * 1e3:10.3f} {med[name] / med['floor']:7.2f}"
            f" {p10[name] * 1e3:8.3f} {p10[name] / p10['floor']:7.2f}"
        )
    names = list(fns)[:2]
    print(f"build 1 / build 0: median {med[names[1]] / med[names[0]]:.3f}, p10 {p10[names[1]] / p10[names[0]]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
