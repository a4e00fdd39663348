"""examples/paper: the paper-scale recipe's files are what compare accepts, and ``run.py --tiny``
runs the whole recipe (compare on TRL, frozen evaluation, its summary) on CPU.

What is pinned: every field of ``trl_config.yaml`` is a CompPOConfig field compare does not
set, and with the recipe's compare settings on 8 processes it makes a CompPOConfig (the
batch splits: 128 × 8 completions over 8 processes × 4 minibatches × 2 accumulation steps);
the accelerate config names the DeepSpeed JSON, which is ZeRO-3; the grid is valid for
every arm of the recipe; the dry run writes results.md, one frozen-evaluation JSON per
arm and seed with pass@k, and the frozen summary.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("torch")
pytest.importorskip("trl")

from comppo_core.experiments import trl_engine  # noqa: E402
from comppo_core.experiments.grid import parse_grid  # noqa: E402
from comppo_core.options import ARM_NAMES  # noqa: E402
from comppo_core.rl.config import TrainConfig  # noqa: E402

PAPER = Path(__file__).resolve().parents[2] / "examples" / "paper"

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def recipe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("paper_recipe", PAPER / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_trl_config_makes_a_comppo_config_with_the_recipes_settings(tmp_path: Path) -> None:
    from comppo_core.integrations.trl import CompPOConfig

    run = recipe()
    settings = trl_engine.read_trl_config(PAPER / "trl_config.yaml")  # none of compare's own fields
    names = {f.name for f in dataclasses.fields(CompPOConfig)}
    assert set(settings) <= names
    assert settings["use_vllm"] is True and settings["vllm_mode"] == "colocate"
    assert settings["vllm_importance_sampling_correction"] is False  # the critic arms refuse it
    paper = {k: v for k, v in run.PAPER.items() if k != "dtype"}  # bf16 needs a GPU to construct
    for arm in run.ARMS:
        config = TrainConfig(arm=arm, task=str(tmp_path / "t.jsonl"), model=str(tmp_path), kl_kind="k3", **paper)
        trl_engine.check_config(config)
        kwargs = trl_engine.trainer_arguments(
            config, settings, world_size=8, output_dir=str(tmp_path / "o"), max_completion_length=1024
        )
        assert kwargs["per_device_train_batch_size"] == 128 * 8 // (8 * 4 * 2)
        CompPOConfig(**{**kwargs, "use_cpu": True})
    accelerate = yaml.safe_load((PAPER / "accelerate_zero3.yaml").read_text())
    assert accelerate["distributed_type"] == "DEEPSPEED" and accelerate["num_processes"] == 8
    ds = Path(accelerate["deepspeed_config"]["deepspeed_config_file"])
    assert ds.parts[:2] == ("examples", "paper")
    assert json.loads((PAPER / ds.name).read_text())["zero_optimization"]["stage"] == 3


def test_the_grid_and_the_arms_are_the_recipes() -> None:
    run = recipe()
    assert set(run.ARMS) <= set(ARM_NAMES) and "comppo_oracle" not in run.ARMS
    assert {"grpo", "ppo", "ppo_fixed", "comp_gae", "tac_fixed", "comppo"} <= set(run.ARMS)
    grid = parse_grid([str(PAPER / "grid.json")])
    grid.check(TrainConfig(**{k: v for k, v in run.PAPER.items() if k != "dtype"}), list(run.ARMS))
    assert len(grid.points) == 4


@pytest.mark.slow
def test_the_tiny_recipe_runs_every_stage(tmp_path: Path) -> None:
    run = recipe()
    out = tmp_path / "paper"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(PAPER / "run.py"), "--tiny", "--out", str(out), "--samples", "2"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "$ comppo-core compare --engine trl" in done.stdout and "$ comppo-core evaluate" in done.stdout
    for name in ("results.md", "results.json", "curves.png"):
        assert (out / "compare" / name).is_file()
    results = json.loads((out / "compare" / "results.json").read_text())
    assert set(results["arms"]) == set(run.ARMS)
    for arm in run.ARMS:
        frozen = json.loads((out / "frozen" / f"{arm}_seed0.json").read_text())
        assert set(frozen["macro"]) >= {"greedy_pass@1", "pass@1", "pass@2"}
        summary = json.loads((out / "compare" / arm / "seed0" / "summary.json").read_text())
        assert summary["engine"] == "trl" and summary["steps"] == run.TINY["steps"]
    summary = json.loads((out / "frozen" / "summary.json").read_text())
    assert set(summary["arms"]) == set(run.ARMS) and summary["samples"] == 2
    assert len(summary["interaction"]["greedy_pass@1"]["per_seed"]) == 1  # one seed; the four cells of the 2×2 ran
    assert "| comppo |" in (out / "frozen" / "summary.md").read_text()
