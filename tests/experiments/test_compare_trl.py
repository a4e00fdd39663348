"""``comppo-core compare --engine trl``: each run a ``CompPOTrainer`` run in a process of its own.

What is pinned: the mapping of the compare's settings onto CompPOConfig (one PPO step is
``ppo_epochs · num_minibatches`` optimiser steps; a batch that does not split is refused);
the flags that do not apply to TRL are refused, named, before anything runs; end to end on
CPU from a tiny warm start saved to disk, 2 arms × 2 seeds × a 2-point grid write the same
results files as the package engine (tuning on the validation split, the choice, the
paired table, curves), each run's summary holding the package trainer's keys; ``--resume``
reuses every finished run; a different ``--trl-config`` or engine is refused, named; a
compare stopped by SIGINT mid-run exits 130 keeping the run's TRL checkpoint, and
``--resume`` reuses the finished run and resumes the stopped one to the numbers of an
uninterrupted run.

The runs are subprocesses (about 20 s each here, most of it importing torch, transformers
and trl), so the end-to-end tests are ``slow``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("matplotlib")

from comppo_core import cli  # noqa: E402
from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.experiments import trl_engine  # noqa: E402
from comppo_core.rl.config import TrainConfig  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

#: The tiny warm start every run starts from (a package SFT warm start: ~60% on 1-digit addition).
WARM: dict[str, Any] = {
    "digits": 1,
    "model_hidden": 32,
    "model_layers": 2,
    "model_heads": 4,
    "model_kv_heads": 2,
    "model_intermediate": 64,
    "warmup_sft_steps": 400,
    "sft_batch_size": 32,
    "sft_lr": 1e-2,
}

#: compare's flags of the tiny TRL runs.
TINY = [
    "--task", "addition", "--digits", "1", "--steps", "2", "--eval-every", "1", "--eval-size", "16",
    "--prompts-per-step", "4", "--group-size", "2", "--ppo-epochs", "1", "--num-minibatches", "1",
    "--critic-warmup", "0", "--tac-width", "16", "--num-threads", "1", "--no-progress", "--kl-coef", "0",
]  # fmt: skip


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A package warm start (SFT of a tiny Llama), a save_pretrained directory with its tokenizer."""
    from comppo_core.experiments.runs import warm_start

    out = tmp_path_factory.mktemp("warm")
    base = TrainConfig(arm="grpo", progress=False, num_threads=1, **WARM)
    policy, how = warm_start(base, 0, out / "seed0")
    assert how == "made"
    return Path(policy)


def compare_argv(out: Path, model: Path, *extra: str) -> list[str]:
    return ["compare", "--engine", "trl", "--model", str(model), *TINY, *extra, "--out", str(out)]


# ---------------------------------------------------------------------------------------------------------
# the mapping and the refusals (no run)


def test_one_ppo_step_is_ppo_epochs_times_minibatches_optimiser_steps() -> None:
    config = TrainConfig(steps=5, prompts_per_step=8, group_size=4, ppo_epochs=2, num_minibatches=2, save_every=3)
    args = trl_engine.trainer_arguments(
        config, {"gradient_accumulation_steps": 2, "use_vllm": True}, world_size=2, output_dir="o",
        max_completion_length=7,
    )  # fmt: skip
    assert args["max_steps"] == 5 * 4 and args["logging_steps"] == 4 and args["save_steps"] == 3 * 4
    assert args["num_iterations"] == 2 and args["steps_per_generation"] == 2 * 2
    # 32 completions a rollout = per_device × 2 processes × steps_per_generation 4
    assert args["per_device_train_batch_size"] == 4 and args["num_generations"] == 4
    assert args["use_vllm"] is True and args["max_completion_length"] == 7 and args["beta"] == config.kl_coef
    assert args["epsilon"] == args["epsilon_high"] == config.clip_low  # clip_high None: symmetric
    with pytest.raises(ParameterError, match=r"^prompts_per_step: expected prompts_per_step × group_size \(32\)"):
        trl_engine.trainer_arguments(config, {}, world_size=3, output_dir="o", max_completion_length=7)


def test_a_trl_config_field_compare_sets_is_refused_naming_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "trl.yaml"
    path.write_text("use_vllm: true\nlearning_rate: 0.1\n")
    with pytest.raises(ParameterError, match=r"^trl_config: learning_rate .* is set by compare \(--actor-lr\)"):
        trl_engine.read_trl_config(path)
    path.write_text("- a list\n")
    with pytest.raises(ParameterError, match=r"^trl_config: expected a mapping"):
        trl_engine.read_trl_config(path)
    path.write_text("gradient_checkpointing: true\n")
    assert trl_engine.read_trl_config(path) == {"gradient_checkpointing": True}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([], r"--model: expected a local Hugging Face model directory or a GGUF file with --engine trl"),
        (["--warmup-sft-steps", "5"], r"--warmup-sft-steps: not with --engine trl"),
        (["--kl-kind", "k2"], r"--kl-kind: expected k3 with --engine trl"),
        (["--jobs", "2"], r"--jobs: expected 1 with --engine trl"),
        (["--grid", "kl_kind=k2,k3"], r"--grid: grid/p0/\w+/seed1000: kl_kind: expected k3 with --engine trl"),
    ],
)
def test_flags_that_do_not_apply_to_trl_are_refused(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = [] if not flags else ["--model", str(tmp_path)]
    argv = ["compare", "--engine", "trl", *model, *TINY, *flags, "--out", str(tmp_path / "cmp")]
    assert cli.main(argv) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "cmp").exists()


def test_launcher_and_trl_config_need_the_trl_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compare", "--launcher", "accelerate launch", *TINY, "--out", str(tmp_path / "cmp")]) == 2
    assert "--launcher: only with --engine trl" in capsys.readouterr().err
    assert trl_engine.run_command(["accelerate", "launch", "--config_file", "f.yaml"], Path("r")) == [
        "accelerate", "launch", "--config_file", "f.yaml", "-m", "comppo_core.integrations.trl.run", "r",
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------------
# end to end


def _md_row(text: str, arm: str) -> list[str]:
    return next(line.split("|")[1:-1] for line in text.splitlines() if line.startswith(f"| {arm} |"))


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_compare_on_trl_tunes_reports_resumes_and_refuses_a_mismatch(
    warm_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    trl_config = tmp_path / "trl.yaml"
    trl_config.write_text("optim: adamw_torch\nmask_truncated_completions: false\n")
    grid = ["--arms", "grpo,comppo", "--seeds", "2", "--grid", "actor_lr=1e-3,1e-2", "--tuning-seeds", "1"]
    argv = compare_argv(out, warm_model, *grid, "--trl-config", str(trl_config))
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    for name in ("results.md", "results.json", "curves.png", "grid/choice.json"):
        assert (out / name).is_file()
    record = json.loads((out / "compare.json").read_text())
    assert record["engine"]["engine"] == "trl" and record["engine"]["launcher"] is None
    assert record["engine"]["trl_config"]["settings"] == {"optim": "adamw_torch", "mask_truncated_completions": False}
    runs = [f"grid/p{i}/{arm}/seed1000" for i in (0, 1) for arm in ("grpo", "comppo")]
    runs += [f"{arm}/seed{s}" for arm in ("grpo", "comppo") for s in (0, 1)]
    for rel in runs:
        run = out / rel
        summary = json.loads((run / "summary.json").read_text())
        saved = json.loads((run / "config.json").read_text())
        assert saved["trl"] == record["engine"] and saved["model"] == str(warm_model)
        assert summary["engine"] == "trl" and summary["steps"] == 2 and summary["optimizer_steps"] == 2
        assert [step for step, _ in summary["eval"]] == [0, 1, 2]
        assert summary["final_eval_accuracy"] == summary["eval"][-1][1]
        assert (run / "model" / "model.safetensors").is_file() and trl_engine.last_checkpoint(run) is not None
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1, 2] and rows[0]["reward_mean"] is not None
        if saved["arm"] == "comppo":
            assert rows[0]["gate_mean"] is not None and summary["parameters"]["critic"] > 0
        assert saved["eval_split"] == ("validation" if rel.startswith("grid/") else "heldout")
    # every arm of a seed starts from the same model: the same step-0 accuracy (paired)
    for s in (0, 1):
        starts = {json.loads((out / arm / f"seed{s}" / "summary.json").read_text())["initial_eval_accuracy"]
                  for arm in ("grpo", "comppo")}  # fmt: skip
        assert len(starts) == 1 and next(iter(starts)) > 0  # the warm start answers some
    results = json.loads((out / "results.json").read_text())
    assert set(results["arms"]) == {"grpo", "comppo"} and results["tuning"]["tuning_seeds"] == [1000]
    text = (out / "results.md").read_text()
    assert "## Tuning" in text and _md_row(text, "comppo")[1].strip() == "2"
    assert "Engine: TRL (`CompPOTrainer`" in text and results["engine"] == record["engine"]
    assert printed.count("validation accuracy") == 4 and printed.count("held-out accuracy") == 4

    # --resume reuses every run (no process started)
    assert cli.main([*argv, "--resume"]) == 0
    again = capsys.readouterr().out
    assert again.count("(reused)") == 8
    assert json.loads((out / "results.json").read_text())["arms"] == results["arms"]

    # a different --trl-config, or the package engine, is refused, named
    trl_config.write_text("optim: adamw_torch\n")
    assert cli.main([*argv, "--resume"]) == 2
    assert re.search(r"--trl-config: the compare in --out ran with the TRL settings of", capsys.readouterr().err)
    package = [a for a in argv if a not in ("--engine", "trl", "--trl-config", str(trl_config))]
    assert cli.main([*package, "--kl-kind", "k3", "--resume"]) == 2
    assert "--engine: the compare in --out ran on the trl engine, got --engine package" in capsys.readouterr().err


def _metrics(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "killpg"), reason="POSIX process groups")
def test_a_stopped_compare_resumes_to_the_uninterrupted_numbers(warm_model: Path, tmp_path: Path) -> None:
    """SIGINT to the compare process while its second run trains: exit status 130, the run
    stopped at a PPO step with its TRL checkpoint, nothing finished lost; ``--resume``
    reuses the finished run and resumes the stopped one, whose metrics, evaluations and
    final accuracy equal a run of the same settings that was never stopped."""
    out = tmp_path / "cmp"
    steps = ["--steps", "24", "--eval-every", "8", "--save-every", "1", "--actor-lr", "1e-2"]
    argv = [*compare_argv(out, warm_model, "--arms", "grpo,comppo", "--seeds", "1"), *steps]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    stopped_run = out / "comppo" / "seed0"
    log = tmp_path / "compare.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "comppo_core.cli", *argv], stdout=fh, stderr=subprocess.STDOUT,
                                env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while trl_engine.last_checkpoint(stopped_run) is None and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGINT)
        status = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert status == 130, text
    assert "stopped after step" in text and "--resume" in text
    assert (out / "grpo" / "seed0" / "summary.json").is_file()  # finished before the stop
    checkpoint = trl_engine.last_checkpoint(stopped_run)
    assert checkpoint is not None and not (stopped_run / "summary.json").exists()
    assert int(checkpoint.name.removeprefix("checkpoint-")) < 24

    resumed = subprocess.run(
        [sys.executable, "-m", "comppo_core.cli", *argv, "--resume"], capture_output=True, text=True, env=env
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "grpo seed 0: held-out accuracy" in resumed.stdout and "(reused)" in resumed.stdout
    assert re.search(r"comppo seed 0: held-out accuracy .* s, resumed\)", resumed.stdout)
    summary = json.loads((stopped_run / "summary.json").read_text())
    assert summary["resumed_from"] == checkpoint.name

    # the same run never stopped: its config.json in a fresh directory, the run module itself
    reference = tmp_path / "reference"
    reference.mkdir()
    shutil.copy(stopped_run / "config.json", reference / "config.json")
    done = subprocess.run(
        [sys.executable, "-m", trl_engine.RUN_MODULE, str(reference)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    expected = json.loads((reference / "summary.json").read_text())
    assert summary["eval"] == expected["eval"] and summary["final_reward_mean"] == expected["final_reward_mean"]
    assert _metrics(stopped_run) == _metrics(reference)
    results = json.loads((out / "results.json").read_text())
    assert results["curves"]["comppo"]["0"] == expected["eval"]


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_each_run_under_a_launcher_uses_its_processes(warm_model: Path, tmp_path: Path) -> None:
    """``--launcher "accelerate launch --config_file ddp.yaml"`` (2 CPU processes): each run is
    two gloo processes (``accelerate launch -m``) splitting each step's batch; the held-out
    accuracy, answered half by each process, is the package's one-process evaluation of the
    same model."""
    import torch
    from trl_backends import write_accelerate_config

    from comppo_core.rl.engine.evaluation import heldout_rewards
    from comppo_core.rl.models.pretrained import load_policy, load_tokenizer
    from comppo_core.rl.tasks import build_task

    config_file = write_accelerate_config("ddp", tmp_path / "ddp.yaml", 2)
    launcher = f"{sys.executable} -m accelerate.commands.launch --config_file {config_file}"
    out = tmp_path / "cmp"
    argv = compare_argv(out, warm_model, "--arms", "comppo", "--seeds", "1", "--launcher", launcher)
    assert cli.main(argv) == 0
    summary = json.loads((out / "comppo" / "seed0" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["optimizer_steps"] == 2
    rows = (out / "comppo" / "seed0" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 3  # one process writes: steps 0, 1 and the final row
    config = TrainConfig(task="addition", digits=1, eval_size=16, model=str(warm_model))
    task = build_task(config)
    rewards = heldout_rewards(
        load_policy(warm_model), load_tokenizer(warm_model), task, task.heldout(16),
        max_new_tokens=task.max_new_tokens, device=torch.device("cpu"),
    )  # fmt: skip
    assert summary["initial_eval_accuracy"] == sum(rewards) / len(rewards)
    assert json.loads((out / "compare.json").read_text())["engine"]["launcher"] == launcher


def test_a_trl_config_moved_elsewhere_is_the_same_engine(tmp_path: Path) -> None:
    """A resume that names the same --trl-config contents at another path finds its runs
    (a run is cleared only for another engine: other contents or launcher)."""
    from comppo_core.experiments import trl_engine

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "trl.yaml").write_text("gradient_checkpointing: true\n")
    (tmp_path / "other.yaml").write_text("gradient_checkpointing: false\n")
    a = trl_engine.engine_record(tmp_path / "a" / "trl.yaml", None)
    b = trl_engine.engine_record(tmp_path / "b" / "trl.yaml", None)
    assert a["trl_config"]["path"] != b["trl_config"]["path"]
    assert trl_engine.same_engine(a, b)
    assert not trl_engine.same_engine(a, trl_engine.engine_record(tmp_path / "other.yaml", None))
    assert not trl_engine.same_engine(a, trl_engine.engine_record(tmp_path / "a" / "trl.yaml", "accelerate launch"))
    assert not trl_engine.same_engine(None, a)
