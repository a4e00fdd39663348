"""``benches/gpu_all.py --tiny``: the GPU script's CPU dry run, end to end (issue 42 item 5).

Runs the script as a subprocess (one torch thread per process) and checks its one table:
every part is there, every part that can run on a CPU ran and printed finite figures,
and what needs CUDA (the peak-memory targets, vLLM, the verl launches) is marked
``skipped: no CUDA`` rather than passed. ZeRO-3 runs when ``deepspeed`` is installed, the
verl part's dry run when ``verl`` is; else their rows say why not.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: the table's rows, in order
PARTS = (
    "tests/gpu",
    "gpu_gae",
    "gpu_probe",
    "gpu_critic",
    "gpu_train_step",
    "gpu_trl_step (CompPOTrainer vs GRPOTrainer)",
    "gpu_trl_step --zero3 (1-process ZeRO-3)",
    "gpu_verl_step (verl recipe vs verl GAE + critic)",
)
VERL = PARTS[-1]

pytestmark = pytest.mark.slow  # 38–75 s on 2 cores (with other work on them)


def test_gpu_all_tiny_runs_every_part_and_prints_one_table(tmp_path: Path) -> None:
    for module in ("torch", "transformers", "trl", "datasets"):
        pytest.importorskip(module)
    rows_file = tmp_path / "rows.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "benches/gpu_all.py", "--tiny", "--json", str(rows_file), "--logs", str(tmp_path / "logs")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    print(proc.stdout, f"\n({elapsed:.1f} s)")

    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert table[0] == "| part | status | key figures | target | met? |"
    assert tuple(line[2:].split(" | ")[0] for line in table[1:]) == PARTS

    deepspeed = importlib.util.find_spec("deepspeed") is not None
    verl = importlib.util.find_spec("verl") is not None
    rows = {row["part"]: row for row in json.loads(rows_file.read_text())["rows"]}
    assert tuple(rows) == PARTS
    for name, row in rows.items():
        if name.startswith("gpu_trl_step --zero3") and not deepspeed:
            assert row["status"].startswith("skipped: deepspeed"), row
            continue
        if name == VERL and not verl:  # skipped with its reason, not run, not failed
            assert row["status"] == "skipped: verl not installed (pip install 'comppo-core[verl]')", row
            assert not row["ran"] and not row["failed"] and not row["figures"], row
            continue
        assert row["ran"] and not row["failed"], row
        assert row["status"] == "ran (dry run, CPU)", row
        assert row["figures"], row
        for f in row["figures"]:
            if f["value"] is None:  # a CUDA-only figure: marked, never passed
                assert f["note"].startswith("skipped: no CUDA") and f["met"] is None, (name, f)
            else:
                assert math.isfinite(f["value"]), (name, f)

    # the targets that need CUDA are marked as such, in the table too
    for line in table[1:]:
        if line.startswith("| gpu_trl_step"):
            assert "peak memory: skipped: no CUDA" in line and "vLLM colocate: skipped: no CUDA" in line, line
    if verl:  # the dry run composed and validated both jobs' configs; the launch needs CUDA
        figures = {f["name"]: f for f in rows[VERL]["figures"]}
        assert figures["configs validated"]["value"] == 2, figures
        assert figures["comppo / verl-gae step"]["note"].startswith("skipped: no CUDA"), figures
    if deepspeed:
        zero3 = rows["gpu_trl_step --zero3 (1-process ZeRO-3)"]
        assert any("DEEPSPEED" in note and "ZeRO-3" in note for note in zero3["notes"]), zero3
    # the CompPO-vs-GRPO part measured both trainers' step
    trl = {f["name"]: f for f in rows["gpu_trl_step (CompPOTrainer vs GRPOTrainer)"]["figures"]}
    assert trl["step"]["bound"] == 1.15 and trl["peak memory"]["bound"] == 1.05


def _benches() -> tuple[object, object]:
    """benches/gpu_all.py and benches/gpu_verl_step.py as modules (neither needs verl to import)."""
    sys.path.insert(0, str(ROOT / "benches"))
    try:
        import gpu_all
        import gpu_verl_step
    finally:
        sys.path.remove(str(ROOT / "benches"))
    return gpu_all, gpu_verl_step


def test_a_part_that_cannot_run_here_is_skipped_with_its_reason_never_passed(tmp_path: Path) -> None:
    """A part whose command exits with one of its skip codes is reported by its own "skipped: ..." line."""
    gpu_all, _ = _benches()
    said = "skipped: transfer_queue not importable (pip install 'verl[verl-core]')"
    command = [sys.executable, "-c", f"print('setting up'); print({said!r}); raise SystemExit(3)"]
    part = gpu_all.Part(  # type: ignore[attr-defined]
        "fake", gpu=command, tiny=command, budget=10, tiny_budget=10, parse=gpu_all.parse_verl, skip_codes=(3,)
    )
    row = gpu_all.run_part(part, True, 30.0, tmp_path)  # type: ignore[attr-defined]
    assert (row.status, row.ran, row.failed, row.figures) == (said, False, False, [])
    other = gpu_all.Part(  # type: ignore[attr-defined]
        "fake", gpu=command, tiny=command, budget=10, tiny_budget=10, parse=gpu_all.parse_verl
    )
    row = gpu_all.run_part(other, True, 30.0, tmp_path)  # type: ignore[attr-defined]
    assert (row.status, row.failed) == ("FAILED (exit 3)", True)  # without the skip code: a failure


def test_the_verl_benchs_table_is_what_gpu_all_reads() -> None:
    """verl's console lines (behind Ray's prefix) → gpu_verl_step's table → gpu_all's figures: step 2's
    times and the ratios comppo / verl-gae; a job short of 2 steps gives no ratio."""
    import contextlib
    import io

    gpu_all, bench = _benches()
    log = {
        "comppo": "(TaskRunnerV1 pid=7) step:1 - timing_s/step:np.float64(30.0) - timing_s/update_actor:3.0\n"
        "\x1b[36m(TaskRunnerV1 pid=7)\x1b[0m step:2 - actor/pg_loss:np.float64(-0.25) - timing_s/step:np.float64(8.0)"
        " - timing_s/gen:3.0 - timing_s/old_log_prob:1.25 - timing_s/adv:0.25 - timing_s/update_actor:3.0\n",
        "verl-gae": "(TaskRunnerV1 pid=9) step:1 - timing_s/step:33.0\n"
        "(TaskRunnerV1 pid=9) step:2 - timing_s/step:10.0 - timing_s/gen:3.0 - timing_s/old_log_prob:1.0"
        " - timing_s/values:0.75 - timing_s/adv:0.25 - timing_s/update_critic:2.0 - timing_s/update_actor:3.0\n",
    }
    steps = {job: bench.parse_steps(text) for job, text in log.items()}  # type: ignore[attr-defined]
    assert steps["comppo"][2]["actor/pg_loss"] == -0.25 and steps["comppo"][1]["timing_s/step"] == 30.0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench.report({job: ("ran", s, 60.0) for job, s in steps.items()}, 2)  # type: ignore[attr-defined]
    figures, problems = gpu_all.parse_verl(out.getvalue(), False)  # type: ignore[attr-defined]
    assert not problems
    got = {f.name: f.value for f in figures}
    assert got == pytest.approx(
        {"comppo / verl-gae step": 0.8, "train (no generation)": 4.5 / 7.0, "comppo step": 8.0, "verl-gae step": 10.0},
        abs=1e-3,
    )
    assert all(f.bound is None for f in figures)  # no target for this pair: shown, not judged
    with contextlib.redirect_stdout(io.StringIO()):
        short = {"comppo": ("ran", steps["comppo"], 60.0), "verl-gae": ("TIMEOUT after 60 s", {}, 60.0)}
        assert not bench.report(short, 2)  # type: ignore[attr-defined]
        first_only = {"comppo": ("ran", steps["comppo"], 60.0), "verl-gae": ("ran", {1: steps["verl-gae"][1]}, 60.0)}
        assert not bench.report(first_only, 2)  # type: ignore[attr-defined]
