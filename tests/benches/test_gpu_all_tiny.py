"""``benches/gpu_all.py --tiny``: the GPU script's CPU dry run, end to end (issue 42 item 5).

Runs the script as a subprocess (one torch thread per process) and checks its one table:
every part is there, every part that can run on a CPU ran and printed finite figures,
and what needs CUDA (the peak-memory targets, vLLM) is marked ``skipped: no CUDA``
rather than passed. ZeRO-3 runs when ``deepspeed`` is installed, else its row says why not.
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
)

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
    rows = {row["part"]: row for row in json.loads(rows_file.read_text())["rows"]}
    assert tuple(rows) == PARTS
    for name, row in rows.items():
        if name.startswith("gpu_trl_step --zero3") and not deepspeed:
            assert row["status"].startswith("skipped: deepspeed"), row
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
    if deepspeed:
        zero3 = rows["gpu_trl_step --zero3 (1-process ZeRO-3)"]
        assert any("DEEPSPEED" in note and "ZeRO-3" in note for note in zero3["notes"]), zero3
    # the CompPO-vs-GRPO part measured both trainers' step
    trl = {f["name"]: f for f in rows["gpu_trl_step (CompPOTrainer vs GRPOTrainer)"]["figures"]}
    assert trl["step"]["bound"] == 1.15 and trl["peak memory"]["bound"] == 1.05
