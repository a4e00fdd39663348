"""The kernel benchmarks (``benches/test_bench_*.py``, pytest-benchmark) and ``benches/compare.py``,
which prints their JSON as tables (issue 46 item 4). No timing is asserted here: these
check that the suites run and check their peers, that each group's ratios in
``extra_info`` are the ratios of its medians, and that compare.py renders them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = ROOT / "benches"


def load_compare() -> Any:
    spec = importlib.util.spec_from_file_location("benches_compare", BENCHES / "compare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench(group: str, candidate: str, median: float, **info: Any) -> dict[str, Any]:
    """One benchmark of a pytest-benchmark JSON, as the suites write it."""
    return {
        "group": group,
        "name": f"test[{candidate}]",
        "stats": {"median": median, "min": median},
        "extra_info": {"candidate": candidate, "workload": group.split(" ", 1)[1], "fraction": 1.0, **info},
    }


def test_tables_render_times_and_ratios_from_the_json() -> None:
    compare = load_compare()
    g = "gae W1 padded 512x4096"
    benchmarks = [
        bench(g, "comppo", 0.002, tokens=1_000_000, threads=1),
        bench(g, "comppo out=", 0.001, tokens=1_000_000, threads=1),
        bench(g, "numba", 0.006, threads=1),
        bench(g, "floor", 0.0016, threads=1),
        # the reference timed on a tenth of the workload: its median is scaled by 1 / fraction
        {**bench(g, "reference", 0.1, threads=1), "extra_info": {"candidate": "reference", "fraction": 0.1}},
        bench(f"{g}, torch regime", "torch alloc", 0.003, faults=0),
        bench(f"{g}, torch regime", "torch out=", 0.002, faults=0),
        bench("masked_whiten W1 padded 512x4096", "comppo", 0.001),
        bench("masked_whiten W1 padded 512x4096", "numpy", 0.007),
        bench("td_targets W4 packed 512x4096", "comppo", 0.001),
        bench("td_targets W4 packed 512x4096", "floor", 0.0005),
        bench("verl GAE W1 padded 512x4096", "drop-in (torch CPU)", 0.004),
        bench("verl GAE W1 padded 512x4096", "numpy path", 0.005),
        bench("verl GAE W1 padded 512x4096", "verl loop", 0.5),
    ]
    text = compare.tables(benchmarks)
    gae_row = next(line for line in text.splitlines() if line.startswith("W1 padded") and "1.25" in line)
    # comppo/floor 1.25, out=/floor 0.62 (0.625 rounds half to even), numba/comppo 3.00,
    # ref/comppo 500.00, Mtok/s 500, alloc/out= 2.00, torch alloc/out= 1.50
    assert gae_row.split()[3:] == ["1.25", "0.62", "3.00", "500.00", "-", "500", "2.00", "1.50"]
    assert "W1 0 / 0" in text  # the regime's page faults
    whiten = next(line for line in text.splitlines() if line.startswith("masked_whiten"))
    assert "7.00" in whiten.split()  # numpy/comppo
    td = next(line for line in text.splitlines() if line.startswith("td_targets W4"))
    assert td.split()[-1] == "2.00"  # comppo/floor
    dropin = next(line for line in text.splitlines() if line.startswith("verl GAE W1"))
    assert dropin.split()[-2:] == ["125.00", "0.80"]  # verl/drop-in, drop-in/numpy


def test_compare_keeps_what_the_lab_tools_import() -> None:
    compare = load_compare()
    w = compare.make_padded("W", 4, 16, 0)
    assert w.rewards.shape == (4, 16) and (compare.GAMMA, compare.LAM) == (1.0, 0.95)
    if compare.numba is not None:
        compare.floor_call(w)()
    times = compare.measure_times({"a": lambda: None}, 3)
    assert len(times["a"]) == 3


def run(cmd: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", **env}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=full_env, timeout=600)


@pytest.mark.slow  # 10–40 s on 2 shared cores
def test_suites_run_their_checks_and_write_group_ratios(tmp_path: Path) -> None:
    pytest.importorskip("pytest_benchmark")
    pytest.importorskip("numba")
    out = tmp_path / "bench.json"
    done = run([sys.executable, "-m", "pytest", "benches/test_bench_outcomes.py", "benches/test_bench_td_targets.py",
                "--benchmark-only", "--benchmark-max-time=0.01", "--benchmark-min-rounds=3",
                "--bench-workloads=W4", "-k", "not reference and not torch", f"--benchmark-json={out}",
                "-p", "no:cacheprovider", "-q"])  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ratios within each group" in done.stdout
    benchmarks = json.loads(out.read_text())["benchmarks"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for b in benchmarks:
        groups.setdefault(b["group"], []).append(b)
    assert set(groups) == {
        "group_advantages 65536/16",
        "masked_whiten W1 padded 512x4096",
        "td_targets W4 packed 512x4096",
    }
    assert {b["extra_info"]["candidate"] for b in groups["td_targets W4 packed 512x4096"]} == {
        "comppo",
        "numba",
        "floor",
    }
    for members in groups.values():
        seconds = {b["extra_info"]["candidate"]: b["stats"]["median"] for b in members}
        for b in members:
            info = b["extra_info"]
            assert info["seconds"] == pytest.approx(b["stats"]["median"])
            assert info["ratios"] == pytest.approx(
                {peer: info["seconds"] / s for peer, s in seconds.items() if peer != info["candidate"]}
            )
            if "floor" in seconds and info["candidate"] != "floor":
                assert info["ratio_to_floor"] == pytest.approx(info["seconds"] / seconds["floor"])
    text = load_compare().tables(benchmarks)
    assert "outcome path" in text and "td_targets" in text


@pytest.mark.slow  # 20–60 s on 2 shared cores
def test_every_benchmark_checks_its_result_once(tmp_path: Path) -> None:
    """``--benchmark-disable`` runs each benchmark's body once: every peer's result checked
    against comppo-core's, comppo-core's against the reference (W4 and W1 only)."""
    pytest.importorskip("pytest_benchmark")
    pytest.importorskip("numba")
    done = run([sys.executable, "-m", "pytest", "benches", "--benchmark-disable", "--bench-workloads=W4",
                "--bench-ref-tokens=5000", "-p", "no:cacheprovider", "-q"])  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " failed" not in done.stdout


def test_compare_from_json_prints_the_tables(tmp_path: Path) -> None:
    path = tmp_path / "saved.json"
    saved = {"benchmarks": [bench("td_targets W1 padded 512x4096", "comppo", 0.003, threads=1),
                            bench("td_targets W1 padded 512x4096", "numba", 0.006, threads=1)]}  # fmt: skip
    path.write_text(json.dumps(saved))
    done = run([sys.executable, str(BENCHES / "compare.py"), "--from-json", str(path)])
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("td_targets W1"))
    assert row.split()[-1] == "2.00"  # numba/comppo
    assert "threads per process: 1" in done.stdout


def test_pytest_benches_without_the_plugin_says_what_to_install(tmp_path: Path) -> None:
    (tmp_path / "pytest_benchmark.py").write_text("raise ImportError('not installed, for this test')\n")
    done = run([sys.executable, "-m", "pytest", "benches", "--benchmark-only", "-p", "no:cacheprovider", "-q"],
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONPATH=str(tmp_path))  # fmt: skip
    assert done.returncode != 0
    assert "needs pytest-benchmark: pip install 'pytest-benchmark>=5'" in done.stdout + done.stderr
