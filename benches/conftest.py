"""pytest-benchmark setup of the kernel benchmarks (``pytest benches --benchmark-only``).

Options (besides pytest-benchmark's own ``--benchmark-*``):

* ``--bench-workloads W1,W2,W3,W4``: the gae workloads to run (td_targets and gates run
  those of W1 and W4 selected; ``-k`` selects further);
* ``--bench-scale N``: N times the rows of every workload (a bigger machine; the names
  carry the shapes, so a baseline saved at one scale is never compared with another);
* ``--bench-threads N``: threads of comppo-core and of numba (default 1: one thread per
  process times steadily on a shared host; 0 = every core, as ``compare.py`` runs);
* ``--bench-ref-tokens N``: elements the Python-loop reference is timed on (default
  100,000; its time is scaled to the workload, see below);
* ``--bench-regime NAME``: run the torch regime of workload NAME (or ``dropin``) in this
  process, which must be a fresh one (``benches/test_bench_torch_regime.py``).

Each benchmark sets ``benchmark.group`` to its workload, so pytest-benchmark's table puts
comppo-core beside its peers on one workload, and records in ``benchmark.extra_info`` its
``candidate``, ``workload``, ``tokens``, ``threads`` and ``fraction`` (the share of the
workload it timed: 1, but the reference's few rows).

Ratios are computed here, not by a pytest-benchmark hook: the ``bench`` fixture registers
every finished benchmark, and after each one the ratios of its whole group are recomputed
in place, so once the group has run every member's ``extra_info`` holds

* ``seconds``: median / fraction (the time of one call on the whole workload);
* ``ratio_to_floor``: ``seconds`` over the floor's;
* ``ratios``: ``{peer: seconds / peer's seconds}`` for every other member of the group
  (lower is faster for this one);
* both from the fastest round too (``seconds_min``, ``ratio_to_floor_min``,
  ``ratios_min``), and ``mtok_per_s``.

The JSON pytest-benchmark writes (``--benchmark-json``, ``--benchmark-save``) carries them,
since its ``extra_info`` is the same dict, and the run ends with a ratio table per group.
"""

from __future__ import annotations

import importlib.util
import os
from collections import defaultdict
from typing import Any

import pytest

NEEDS_PLUGIN = (
    "`pytest benches` needs pytest-benchmark: pip install 'pytest-benchmark>=5' "
    "(or pip install '.[bench]'); then run `pytest benches --benchmark-only`"
)
try:
    import pytest_benchmark  # noqa: F401
except ImportError as e:
    raise pytest.UsageError(NEEDS_PLUGIN) from e

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before numba starts its workers

import workloads  # noqa: E402  (benches/ is on sys.path: pytest's rootdir-relative import)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("comppo-core benchmarks")
    group.addoption("--bench-workloads", default="W1,W2,W3,W4", help="gae workloads to run (default W1,W2,W3,W4)")
    group.addoption("--bench-scale", type=int, default=1, help="multiply the rows of every workload (default 1)")
    group.addoption(
        "--bench-threads", type=int, default=1, help="threads of comppo-core and numba (default 1; 0 = every core)"
    )
    group.addoption(
        "--bench-ref-tokens", type=int, default=100_000, help="elements the reference is timed on (default 100000)"
    )
    group.addoption(
        "--bench-regime", default=None, help="run the torch regime of this workload (W1..W4 or dropin), fresh process"
    )


def pytest_configure(config: pytest.Config) -> None:
    import comppo_core as cc

    if not config.pluginmanager.hasplugin("benchmark"):
        raise pytest.UsageError(
            "pytest-benchmark is installed but not loaded (PYTEST_DISABLE_PLUGIN_AUTOLOAD or -p no:benchmark): "
            "add -p pytest_benchmark.plugin"
        )
    # a test that fails before timing would also warn that it left the fixture unused
    config.addinivalue_line("filterwarnings", "ignore:Benchmark fixture was not used")
    names = config.getoption("--bench-workloads").split(",")
    unknown = [n for n in names if n not in workloads.NAMES]
    if unknown:
        raise pytest.UsageError(f"--bench-workloads: unknown {unknown}; choose from {','.join(workloads.NAMES)}")
    if config.getoption("--bench-scale") < 1:
        raise pytest.UsageError("--bench-scale must be >= 1")
    threads = config.getoption("--bench-threads")
    if threads < 0:
        raise pytest.UsageError("--bench-threads must be >= 0")
    if threads:
        cc.set_num_threads(threads)
        if workloads.numba is not None:
            workloads.numba.set_num_threads(min(threads, workloads.numba.config.NUMBA_NUM_THREADS))
        if importlib.util.find_spec("torch") is not None:
            import torch

            torch.set_num_threads(threads)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(item, "callspec", None)
        values = params.params.values() if params is not None else ()
        if any(
            v in workloads.SLOW_CANDIDATES or (isinstance(v, tuple) and v[-1] in workloads.SLOW_CANDIDATES)
            for v in values
        ):
            item.add_marker(pytest.mark.benchmark(min_rounds=3))


def pytest_report_header(config: pytest.Config) -> str:
    import comppo_core as cc

    numba_threads = workloads.numba.get_num_threads() if workloads.numba is not None else "not installed"
    return (
        f"comppo-core {cc.__version__}: threads {cc.get_num_threads()}, numba threads {numba_threads}, "
        f"workloads {config.getoption('--bench-workloads')} x{config.getoption('--bench-scale')} rows"
    )


# ---------------------------------------------------------------- ratios
_FINISHED: dict[str, list[Any]] = defaultdict(list)  # group → pytest-benchmark's Metadata of each finished run


def _update_group_ratios(members: list[Any]) -> None:
    seconds, fastest = {}, {}
    for m in members:
        info, me = m.extra_info, m.extra_info["candidate"]
        info["seconds"] = seconds[me] = m.stats.median / info.get("fraction", 1.0)
        info["seconds_min"] = fastest[me] = m.stats.min / info.get("fraction", 1.0)
    for m in members:
        info, me = m.extra_info, m.extra_info["candidate"]
        info["ratios"] = {peer: seconds[me] / s for peer, s in seconds.items() if peer != me and s > 0}
        info["ratios_min"] = {peer: fastest[me] / s for peer, s in fastest.items() if peer != me and s > 0}
        if "floor" in seconds and me != "floor":
            info["ratio_to_floor"] = seconds[me] / seconds["floor"]
            info["ratio_to_floor_min"] = fastest[me] / fastest["floor"]
        if info.get("tokens"):
            info["mtok_per_s"] = info["tokens"] / seconds[me] / 1e6


@pytest.fixture
def bench(benchmark: Any, request: pytest.FixtureRequest) -> Any:
    """pytest-benchmark's ``benchmark``, registered for the group ratios once it has run.

    The test sets ``benchmark.group`` and ``benchmark.extra_info["candidate"]`` before
    timing."""
    yield benchmark
    meta = benchmark.stats
    if meta is None or not meta.stats or "candidate" not in benchmark.extra_info:
        return
    info = benchmark.extra_info
    info.setdefault("threads", request.config.getoption("--bench-threads"))
    members = _FINISHED[benchmark.group]
    members[:] = [m for m in members if m.extra_info["candidate"] != info["candidate"]] + [meta]
    _update_group_ratios(members)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FINISHED:
        return
    tr = terminalreporter
    tr.section("comppo-core: ratios within each group (time of the row / time of the column; lower is faster)")
    for group, members in _FINISHED.items():
        names = [m.extra_info["candidate"] for m in members]
        scaled = any(m.extra_info.get("fraction", 1.0) < 1.0 for m in members)
        note = "; the reference timed on its first rows, scaled" if scaled else ""
        tr.write_line("")
        tr.write_line(f"{group}  (median ms per call{note})")
        width = max(14, *(len(n) + 2 for n in names))
        tr.write_line(f"{'':<{width}}{'ms':>10}" + "".join(f"{'/' + n:>{width}}" for n in names))
        for m in members:
            info = m.extra_info
            cells = "".join(
                f"{info['ratios'][n]:>{width}.2f}" if n in info["ratios"] else f"{'-':>{width}}" for n in names
            )
            tr.write_line(f"{info['candidate']:<{width}}{info['seconds'] * 1e3:>10.3f}{cells}")
