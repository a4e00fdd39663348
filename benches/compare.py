"""comppo-core's kernels beside what users run today: the pytest-benchmark suites, as tables.

Run:  python benches/compare.py            (every table; needs the [bench] extra: numba,
                                            pytest-benchmark; torch for the torch columns)
      python benches/compare.py --quick    (fewer rounds)
      python benches/compare.py --from-json FILE   (the tables of a saved pytest-benchmark
                                            run of benches/, e.g. the committed baseline)

There is one benchmark implementation: the suites ``benches/test_bench_*.py`` (workloads,
peers and floors in ``benches/workloads.py``). This script runs them with pytest-benchmark
(``pytest benches/test_bench_... --benchmark-only --benchmark-json``), in a subprocess, and
prints their JSON as the tables below; ``pytest benches --benchmark-only`` runs the same
benchmarks and prints pytest-benchmark's own tables and a ratio summary.

Workloads (float32, each row's length uniform in [T/2, T], gates uniform in [0.5, 1],
γ = 1, λ = 0.95):

    W1  padded 512 × 4096       W2  padded 64 × 16384
    W3  padded 4096 × 512       W4  W1's data packed ([N] + cu_seqlens)

Columns of the gae table (each a benchmark of one group per workload; the median of its
rounds, or with ``--stat min`` the fastest):

    comppo        cc.gae(...) allocating its two outputs, as a user calls it
    comppo out=   cc.gae(..., out=(adv, ret)) into preallocated buffers
    numba         a numba-parallel loop over rows (prange) that allocates its outputs
    reference     comppo_core.reference.gae (Python loop; timed on a few rows, scaled)
    torch loop    verl's compute_gae_advantage_return loop over tokens (if torch is installed)
    floor         the memory floor: a parallel streaming pass over the same bytes
                  (the float inputs and the mask read, two outputs written) into
                  preallocated buffers on every thread numba uses

Two more columns time the regime a user's training process is in, which a benchmark
process that ran other batches is not: a fresh pytest process per workload
(``benches/test_bench_torch_regime.py --bench-regime W1``) that imports torch, makes the
batch with torch and allocates a little between calls:

    torch alloc   cc.gae(...) allocating its outputs, there
    torch out=    cc.gae(..., out=(adv, ret)), there

There glibc's dynamic mmap threshold sits at the size of one output, so two outputs freed
together would be handed back to the operating system and the next call would fault fresh
pages in again (about 1,000 page faults a call on W1 before rust/buffers.rs cached them).
The drop-in table gets the same regime's row.

Ratios are times divided by the floor (lower is better) and speedups of comppo over the
others. Timing noise on a shared machine is real: compare ratios, not bare times. The
benchmarks of a table run one after another, not interleaved (pytest-benchmark has no
alternation), so a slow stretch of the machine can hit one candidate and not its peer: on
a busy host give them time (``--min-seconds``, pytest-benchmark's
``--benchmark-max-time``), look at ``--stat min`` too, and repeat.

Further tables: the outcome path (``group_advantages`` on 65,536 sequences in groups of 16
against vectorised NumPy and torch; ``masked_whiten`` on W1's advantages against verl's
formula in NumPy and torch and its floor), ``td_targets`` and ``gates_from_concentration``
(W1, W4) against their peers and floors, and the verl drop-in against verl's loop.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# the workloads, peers and floors, also for benches/lab/ab_builds.py (compare.make_padded, ...)
from workloads import (  # noqa: E402, F401
    GAMMA,
    LAM,
    SHAPES,
    Workload,
    floor_call,
    make_padded,
    measure_times,
    numba,
    numpy_grpo,
    numpy_whiten,
    pack,
)

#: --only → the suites it runs
SUITES = {
    "gae": "test_bench_gae.py",
    "outcomes": "test_bench_outcomes.py",
    "td_targets": "test_bench_td_targets.py",
    "gates": "test_bench_gates.py",
    "dropins": "test_bench_verl.py",
}
REGIME = "test_bench_torch_regime.py"


# ---------------------------------------------------------------- running the suites
def pytest_command(files: list[str], json_path: str, a: argparse.Namespace, *more: str) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *(os.path.join(HERE, f) for f in files), "--benchmark-only",
           f"--benchmark-json={json_path}", f"--benchmark-min-rounds={a.rounds}",
           f"--benchmark-max-time={a.min_seconds}", f"--bench-workloads={a.workloads}",
           f"--bench-threads={a.threads}", f"--bench-ref-tokens={a.ref_tokens}", f"--bench-scale={a.scale}",
           "-p", "no:cacheprovider", "-q", *more]  # fmt: skip
    if a.no_torch:
        cmd += ["-k", "not torch"]
    return cmd


def run_pytest(files: list[str], a: argparse.Namespace, *more: str) -> list[dict[str, Any]]:
    """The ``benchmarks`` of the JSON of one pytest-benchmark run of ``files``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.json")
        cmd = pytest_command(files, path, a, *more)
        done = subprocess.run(cmd, cwd=os.path.dirname(HERE), capture_output=not a.verbose, text=True)
        if done.returncode not in (0, 5):  # 5: nothing collected (e.g. --no-torch of a torch-only suite)
            sys.stderr.write((done.stdout or "") + (done.stderr or ""))
            raise SystemExit(f"benchmarks failed (exit {done.returncode}): {' '.join(cmd)}")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return list(json.load(f)["benchmarks"])


def run_all(a: argparse.Namespace) -> list[dict[str, Any]]:
    only = [a.only] if a.only else list(SUITES)
    files = [SUITES[k] for k in only if not (k == "dropins" and a.no_torch)]
    benchmarks = run_pytest(files, a) if files else []
    if not a.no_torch and not a.no_regime:
        regimes = [w for w in a.workloads.split(",")] if "gae" in only else []
        regimes += ["dropin"] if "dropins" in only else []
        for regime in regimes:  # each in a fresh process: see the module
            benchmarks += run_pytest([REGIME], a, f"--bench-regime={regime}")
    return benchmarks


# ---------------------------------------------------------------- tables
def by_group(benchmarks: list[dict[str, Any]], stat: str = "median") -> dict[str, dict[str, Any]]:
    """``{group: {"workload": group, "tokens", candidate: seconds, "faults <candidate>": n}}``,
    seconds per call on the whole workload from the benchmark's ``stat`` (median or min)."""
    groups: dict[str, dict[str, Any]] = {}
    for b in benchmarks:
        info = b["extra_info"]
        row = groups.setdefault(b["group"], {"workload": b["group"]})
        if "tokens" in info:
            row["tokens"] = info["tokens"]
        seconds = b["stats"][stat] / info.get("fraction", 1.0)
        row[info["candidate"]] = seconds
        if "faults" in info:
            row[f"faults {info['candidate']}"] = info["faults"]
    return groups


def gae_rows(groups: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for group, row in groups.items():
        if group.startswith("gae ") and "torch regime" not in group:
            regime = groups.get(f"{group}, torch regime", {})
            row = {**row, "workload": group.removeprefix("gae ")}
            for key in ("torch alloc", "torch out="):
                if key in regime:
                    row[key] = regime[key]
            if "faults torch alloc" in regime and "faults torch out=" in regime:
                row["faults alloc"], row["faults out="] = regime["faults torch alloc"], regime["faults torch out="]
            rows.append(row)
    return rows


def _ratio(r: dict[str, Any], a: str, b: str, width: int) -> str:
    return f"{r[a] / r[b]:>{width}.2f}" if a in r and b in r and r[b] > 0 else f"{'-':>{width}}"


def report(rows: list[dict[str, Any]]) -> str:
    cols = ["comppo", "comppo out=", "numba", "reference", "torch loop", "floor", "torch alloc", "torch out="]
    present = [c for c in cols if any(c in r for r in rows)]
    lines = ["gae: time per call, ms"]
    lines.append(f"{'workload':<22}" + "".join(f"{c:>13}" for c in present))
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
        mtok = f"{r['tokens'] / r['comppo'] / 1e6:>17.0f}" if "comppo" in r and "tokens" in r else f"{'-':>17}"
        cells = [_ratio(r, "comppo", "floor", 17), _ratio(r, "comppo out=", "floor", 17),
                 _ratio(r, "numba", "comppo", 17), _ratio(r, "reference", "comppo", 17),
                 _ratio(r, "torch loop", "comppo", 17), mtok, _ratio(r, "comppo", "comppo out=", 17),
                 _ratio(r, "torch alloc", "torch out=", 17)]  # fmt: skip
        lines.append(f"{r['workload']:<22}" + "".join(cells))
    if any("faults alloc" in r for r in rows):
        lines.append("torch regime (fresh process, batch made by torch): page faults per call, allocating / out=: "
                     + ", ".join(f"{r['workload'].split()[0]} {r['faults alloc']:.0f} / {r['faults out=']:.0f}"
                                 for r in rows if "faults alloc" in r))  # fmt: skip
    return "\n".join(lines)


def report_table(title: str, rows: list[dict[str, Any]], cols: list[str], pairs: list[tuple[str, str]]) -> str:
    """A table of ``rows``: ms per call of ``cols``, then the ratios ``a/b`` of ``pairs``."""
    cols = [c for c in cols if any(c in r for r in rows)]
    pairs = [(a, b) for a, b in pairs if any(a in r and b in r for r in rows)]
    width = max([26, *(len(r["workload"]) + 2 for r in rows)])
    lines = [title]
    lines.append(
        f"{'workload':<{width}}" + "".join(f"{c:>12}" for c in cols) + "".join(f"{a + '/' + b:>19}" for a, b in pairs)
    )
    for r in rows:
        cells = "".join(f"{r[c] * 1e3:>12.2f}" if c in r else f"{'-':>12}" for c in cols)
        ratios = "".join(_ratio(r, a, b, 19) for a, b in pairs)
        lines.append(f"{r['workload']:<{width}}{cells}{ratios}")
    return "\n".join(lines)


def report_outcomes(rows: list[dict[str, Any]]) -> str:
    return report_table(
        "outcome path: time per call, ms and ratios",
        rows,
        ["comppo", "comppo out=", "numpy", "torch", "floor"],
        [("numpy", "comppo"), ("torch", "comppo"), ("comppo", "floor"), ("comppo out=", "floor")],
    )


def report_dropins(rows: list[dict[str, Any]], regime: dict[str, Any] | None = None) -> str:
    lines = ["verl drop-in (compute_gae_advantage_return on CPU tensors): ms per call and ratios"]
    cols = ["drop-in (torch CPU)", "numpy path", "verl loop"]
    width = max([22, *(len(r["workload"]) + 2 for r in rows)])
    lines.append(
        f"{'workload':<{width}}" + "".join(f"{c:>21}" for c in cols) + f"{'verl/drop-in':>14}{'drop-in/numpy':>15}"
    )
    for r in rows:
        cells = "".join(f"{r[c] * 1e3:>21.2f}" if c in r else f"{'-':>21}" for c in cols)
        lines.append(
            f"{r['workload']:<{width}}{cells}{_ratio(r, 'verl loop', 'drop-in (torch CPU)', 14)}"
            f"{_ratio(r, 'drop-in (torch CPU)', 'numpy path', 15)}"
        )
    if regime is not None and "drop-in" in regime and "verl loop" in regime:
        d = regime["drop-in"]
        cells = f"{d * 1e3:>21.2f}{'-':>21}{regime['verl loop'] * 1e3:>21.2f}"
        lines.append(f"{'W1, torch regime':<{width}}{cells}{regime['verl loop'] / d:>14.2f}{'-':>15}")
    return "\n".join(lines)


def tables(benchmarks: list[dict[str, Any]], stat: str = "median") -> str:
    """Every table the benchmarks fill, as ``compare.py`` prints them (times: ``stat``)."""
    groups = by_group(benchmarks, stat)
    out: list[str] = []
    rows = gae_rows(groups)
    if rows:
        out.append(report(rows))

    def pick(prefix: str) -> list[dict[str, Any]]:
        return [r for g, r in groups.items() if g.startswith(prefix) and "torch regime" not in g]

    outcome_rows = pick("group_advantages") + pick("masked_whiten")
    if outcome_rows:
        out.append(report_outcomes(outcome_rows))
    peers: list[tuple[str, str, list[str], list[tuple[str, str]]]] = [
        ("td_targets", "td_targets: time per call, ms and ratios", ["comppo", "numba", "reference", "floor"],
         [("numba", "comppo"), ("reference", "comppo"), ("comppo", "floor")]),
        ("gates_from_concentration", "gates_from_concentration: time per call, ms and ratios",
         ["comppo", "numpy", "reference", "floor"],
         [("numpy", "comppo"), ("reference", "comppo"), ("comppo", "floor")]),
    ]  # fmt: skip
    for prefix, title, cols, pairs in peers:
        if pick(prefix):
            out.append(report_table(title, pick(prefix), cols, pairs))
    dropin_rows = pick("verl GAE")
    regime = next((r for g, r in groups.items() if g.startswith("verl GAE") and "torch regime" in g), None)
    if dropin_rows or regime:
        out.append(report_dropins(dropin_rows, regime))
    return "\n\n".join(out)


def header(benchmarks: list[dict[str, Any]], machine: dict[str, Any] | None = None) -> str:
    threads = sorted({b["extra_info"].get("threads") for b in benchmarks} - {None})
    words = ", ".join("every core" if t == 0 else str(t) for t in threads) or "?"
    line = f"{len(benchmarks)} benchmarks, threads per process: {words}"
    if machine:
        line += f", python {machine.get('python_version', '?')}, {machine.get('cpu', {}).get('brand_raw', '')}"
    return line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default="W1,W2,W3,W4")
    p.add_argument("--rounds", type=int, default=10, help="at least this many rounds per benchmark (default 10)")
    p.add_argument("--min-seconds", type=float, default=1.0, help="time each benchmark for about this long (default 1)")
    p.add_argument("--quick", action="store_true", help="3 rounds, 0.1 s per benchmark")
    p.add_argument("--ref-tokens", type=int, default=100_000, help="elements the reference is timed on")
    p.add_argument("--scale", type=int, default=1, help="multiply the rows of every workload")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="threads of comppo-core and numba (default 0: every core)")
    p.add_argument("--only", choices=sorted(SUITES), default=None, help="run one table only")
    p.add_argument("--no-regime", action="store_true", help="skip the torch regime's columns (fresh processes)")
    p.add_argument("--json", default=None, help="also write the benchmarks' JSON here")
    p.add_argument("--from-json", default=None, help="print the tables of this pytest-benchmark JSON; run nothing")
    p.add_argument("--stat", choices=["median", "min"], default="median", help="the time of a benchmark")
    p.add_argument("--verbose", action="store_true", help="show pytest's output")
    a = p.parse_args(argv)
    if a.from_json:
        with open(a.from_json) as f:
            saved = json.load(f)
        print(header(saved["benchmarks"], saved.get("machine_info")))
        print(tables(saved["benchmarks"], a.stat))
        return 0
    if a.quick:
        a.rounds, a.min_seconds = 3, 0.1
    import comppo_core as cc

    benchmarks = run_all(a)
    print(f"comppo-core {cc.__version__}, numba={'yes' if numba else 'no'}, python {sys.version.split()[0]}; "
          + header(benchmarks))  # fmt: skip
    print(tables(benchmarks, a.stat))
    if a.json:
        tmp = f"{a.json}.tmp"
        with open(tmp, "w") as f:
            json.dump({"benchmarks": benchmarks}, f, indent=1)
        os.replace(tmp, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
