"""Peak memory of a piece of torch work, on CPU or CUDA (for tests and benchmarks).

* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``.
* CPU: torch has no peak counter for its CPU allocator, so the work runs under
  ``torch.profiler`` with ``profile_memory=True``, which reports every allocation and
  free of the CPU allocator (kernel workspaces included) with a timestamp; the peak is
  the maximum of their running sum. ``within=name`` restricts the sum to the intervals
  of a ``torch.profiler.record_function(name)`` range, e.g. :data:`STATISTIC_RANGE`
  (the probe's statistic computation), giving the transient memory that code adds.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["STATISTIC_RANGE", "peak_memory"]

#: The record_function range around each layer's statistic computation in the probe.
STATISTIC_RANGE = "comppo_core.hf.statistic"


def peak_memory(fn: Callable[[], Any], device: Any = "cpu", *, within: str | None = None) -> int:
    """Peak bytes allocated by ``fn()`` above what was allocated when it started.

    With ``within``, only allocations made inside ``record_function(within)`` ranges
    count (each range starts from 0); the result is the largest such peak (CPU only)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if within is not None:
            raise ValueError("within: supported on CPU only")
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        fn()
        torch.cuda.synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev) - base)
    if dev.type != "cpu":
        raise ValueError(f"device: expected cpu or cuda, got {dev}")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    mem = sorted(((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"), key=lambda x: x[0])
    if within is None:
        intervals = [(mem[0][0] if mem else 0, mem[-1][0] if mem else 0)]
    else:
        intervals = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if e.name() == within)
    stamps = [ts for ts, _ in mem]
    peak = 0
    for lo, hi in intervals:
        live = 0
        for _, nbytes in mem[bisect.bisect_left(stamps, lo) : bisect.bisect_right(stamps, hi)]:
            live += nbytes
            peak = max(peak, live)
    return peak
