"""Runs a user can trust: no command replaces a run unasked, a run resumes from anywhere,
interrupts keep the work, flag and path errors answer before torch is imported, and the
run says what it chose (threads, budget) and logs where users look (TensorBoard).

Runs are the tiny run of :mod:`rl_tiny` (about a second each on one thread).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rl_tiny import TINY_SETTINGS, as_flags  # noqa: E402

from comppo_core import cli  # noqa: E402
from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.rl.config import TrainConfig  # noqa: E402
from comppo_core.rl.engine.trainer import Trainer  # noqa: E402
from comppo_core.rl.runs import run_dir  # noqa: E402
from comppo_core.rl.runs.interrupts import GracefulStop, TrainingInterrupted  # noqa: E402

TINY = as_flags({**TINY_SETTINGS, "eval_size": 8, "eval_every": 2, "device": "cpu"})
ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def actor_weights(run: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(run / "checkpoint" / "actor" / "model.safetensors")


def jsonl_helpers() -> Any:
    """tests/rl/test_rl_jsonl.py (its tiny tokenizer, model and task writers), also when
    tests/rl is not collected in this session (so not on sys.path)."""
    if "test_rl_jsonl" not in sys.modules:
        import importlib.util

        spec = importlib.util.spec_from_file_location("test_rl_jsonl", ROOT / "tests" / "rl" / "test_rl_jsonl.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["test_rl_jsonl"] = module
        spec.loader.exec_module(module)
    return sys.modules["test_rl_jsonl"]


def light(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (the package's own, this one's environment)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd, env=dict(os.environ)
    )


# ---------------------------------------------------------------------------------------------------------
# never lose a run


def test_train_refuses_an_out_that_holds_a_run_unless_resume_or_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert cli.main(["train", "--arm", "grpo", *TINY, "--out", str(out)]) == 0
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert cli.main(["train", "--arm", "grpo", *TINY, "--steps", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out: " in err and "--resume" in err and "--overwrite" in err
    assert "a run of grpo, seed 0, 2 steps (a checkpoint after 2 steps)" in err
    assert (out / "metrics.jsonl").read_text() == before  # untouched
    (out / "notes.txt").write_text("mine")
    assert cli.main(["train", "--arm", "grpo", *TINY, "--steps", "1", "--out", str(out), "--overwrite"]) == 0
    printed = capsys.readouterr().out
    assert "--overwrite: replacing a run of grpo, seed 0, 2 steps" in printed
    assert [r["step"] for r in lines(out / "metrics.jsonl")] == [0, 1]  # one step, then the final evaluation
    assert (out / "notes.txt").read_text() == "mine"  # overwrite deletes the run's files only
    # the library refuses too
    with pytest.raises(ParameterError, match="already holds a run") as info:
        Trainer(TrainConfig(**{**TINY_SETTINGS, "out": str(out)}))
    assert info.value.argument == "out"


def test_compare_refuses_other_settings_and_names_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", "--arms", "grpo", "--seeds", "1", *TINY, "--out", str(out)]
    assert cli.main(argv) == 0
    results = (out / "results.md").read_text()
    assert "1 arm × 1 seed," in results
    summary = (out / "grpo" / "seed0" / "summary.json").read_text()
    capsys.readouterr()
    # other steps, with --resume: refused, naming the setting; nothing is rewritten
    assert cli.main([*argv, "--steps", "3", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--steps: the runs in --out have steps=2, got 3" in err
    assert (out / "grpo" / "seed0" / "summary.json").read_text() == summary
    assert (out / "results.md").read_text() == results
    # another arm with the same settings continues the compare; the table lists what was asked
    assert cli.main(["compare", "--arms", "grpo,ppo", "--seeds", "1", *TINY, "--out", str(out), "--resume"]) == 0
    assert "(reused)" in capsys.readouterr().out
    assert (out / "grpo" / "seed0" / "summary.json").read_text() == summary
    assert "2 arms × 1 seed," in (out / "results.md").read_text()
    # --overwrite starts again, deleting the compare's own files only
    (out / "notes.txt").write_text("mine")
    assert cli.main([*argv, "--steps", "1", "--overwrite"]) == 0
    assert not (out / "ppo").exists() and (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "compare.json").read_text())["settings"]["steps"] == 1


def _compare_with_an_interrupted_run(out: Path) -> tuple[list[str], Path, dict[str, Any]]:
    """A finished one-run compare whose run is then redone and stopped after its first
    step (its checkpoint continues at step 1): ``(argv, the run, its straight weights)``."""
    argv = ["compare", "--arms", "grpo", "--seeds", "1", *TINY, "--steps", "3", "--out", str(out)]
    assert cli.main(argv) == 0
    run = out / "grpo" / "seed0"
    straight = actor_weights(run)
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoint")
    polls = iter([False, True])  # stop before step 1
    with pytest.raises(TrainingInterrupted):
        Trainer(TrainConfig.from_json((run / "config.json").read_text()), overwrite=True).train(
            stop=lambda: next(polls)
        )
    assert json.loads((run / "checkpoint" / "progress.json").read_text()) == {"next_step": 1}
    assert not (run / "summary.json").exists()
    return argv, run, straight


def test_compare_resumes_an_interrupted_run_from_its_checkpoint(tmp_path: Path) -> None:
    argv, run, straight = _compare_with_an_interrupted_run(tmp_path / "cmp")
    assert cli.main([*argv, "--resume"]) == 0
    resumed = actor_weights(run)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


# ---------------------------------------------------------------------------------------------------------
# resume from anywhere


def test_resume_from_another_directory_and_any_spelling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert cli.main(["train", "--arm", "grpo", *TINY, "--out", "runs/mine"]) == 0
    saved = TrainConfig.from_json((work / "runs" / "mine" / "config.json").read_text())
    assert saved.out == str(work / "runs" / "mine")  # stored absolute
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert cli.main(["train", "--resume", "--out", str(work / "runs" / "mine") + "/", "--steps", "3"]) == 0
    monkeypatch.chdir(work / "runs")
    assert cli.main(["train", "--resume", "--out", "./mine/", "--steps", "4"]) == 0
    steps = [r["step"] for r in lines(work / "runs" / "mine" / "metrics.jsonl") if r["reward_mean"] is not None]
    assert steps == [0, 1, 2, 3]


def test_a_resumed_run_may_find_its_model_moved_only_with_the_same_content(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    helpers = jsonl_helpers()
    CHARS, save_model, save_tokenizer, write_task = (  # noqa: N806
        helpers.CHARS,
        helpers.save_model,
        helpers.save_tokenizer,
        helpers.write_task,
    )

    model = tmp_path / "model"
    save_tokenizer(model)
    save_model(model, 4 + len(CHARS))
    task = write_task(tmp_path / "task.jsonl")
    out = tmp_path / "run"
    common = ["--model", str(model), "--task", str(task), "--max-new-tokens", "4", "--prompts-per-step", "2"]
    common += ["--group-size", "2", "--eval-size", "4", "--progress", "--no-progress", "--device", "cpu"]
    assert cli.main(["train", "--arm", "grpo", *common, "--steps", "1", "--out", str(out)]) == 0
    inputs = json.loads((out / "inputs.json").read_text())
    assert set(inputs) == {"model", "task"} and inputs["model"]["sha256"] == run_dir.fingerprint(model)["sha256"]
    moved = tmp_path / "moved"
    shutil.copytree(model, moved)
    assert cli.main(["train", "--resume", "--out", str(out), "--steps", "2", "--model", str(moved)]) == 0
    assert TrainConfig.from_json((out / "config.json").read_text()).model == str(moved)
    other = tmp_path / "other"
    shutil.copytree(model, other)
    (other / "config.json").write_text((other / "config.json").read_text().replace("\n", "\n "))
    capsys.readouterr()
    assert cli.main(["train", "--resume", "--out", str(out), "--steps", "3", "--model", str(other)]) == 2
    err = capsys.readouterr().err
    assert "--model: " in err and "is not the run's model: its content differs" in err


# ---------------------------------------------------------------------------------------------------------
# interrupts


@pytest.fixture(autouse=True)
def python_sigint_handler() -> Any:
    """Python's own SIGINT handler for each test, as an interactive shell gives it (a
    shell's background job inherits SIGINT ignored, and Python then leaves it so); what
    was there is put back after."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_at(monkeypatch: pytest.MonkeyPatch, step: int, signum: int = signal.SIGINT) -> None:
    """Send ``signum`` to this process during the update of step ``step`` (mid-step)."""
    original = Trainer.update

    def update(self: Trainer, batch: Any, step_index: int) -> dict[str, Any]:
        if step_index == step:
            signal.raise_signal(signum)
        return original(self, batch, step_index)

    monkeypatch.setattr(Trainer, "update", update)


@pytest.mark.parametrize(("step", "signum", "status"), [(0, signal.SIGINT, 130), (2, signal.SIGTERM, 143)])
def test_an_interrupt_finishes_the_step_keeps_a_checkpoint_and_resumes_bit_for_bit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    step: int,
    signum: int,
    status: int,
) -> None:
    """Step 0: before the first checkpoint; step 2: mid-run. Either way the current step
    completes, a checkpoint continues after it, one line says how to resume, and the
    resumed run ends with the parameters of a run never interrupted."""
    argv = ["train", "--arm", "comppo", *TINY, "--steps", "4", "--save-every", "0"]
    straight = tmp_path / "straight"
    assert cli.main([*argv, "--out", str(straight)]) == 0
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _interrupt_at(m, step, signum)
        assert cli.main([*argv, "--out", str(out)]) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"stopped after step {step + 1}" in err and f"comppo-core train --out {out} --resume" in err
    assert f"the checkpoint after {step + 1} of 4 steps is kept" in err
    assert json.loads((out / "checkpoint" / "progress.json").read_text()) == {"next_step": step + 1}
    assert [r["step"] for r in lines(out / "metrics.jsonl")] == list(range(step + 1))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers put back
    assert cli.main(["train", "--resume", "--out", str(out)]) == 0
    a, b = actor_weights(straight), actor_weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert lines(straight / "metrics.jsonl")[-1]["eval_accuracy"] == lines(out / "metrics.jsonl")[-1]["eval_accuracy"]


def test_graceful_stop_turns_the_first_signal_into_a_request() -> None:
    with GracefulStop() as stop:
        assert not stop()
        signal.raise_signal(signal.SIGINT)
        assert stop() and stop.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):  # the second one acts at once
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.slow
def test_ctrl_c_in_a_real_process_prints_one_line_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "run"
    flags = [*TINY, "--steps", "200", "--save-every", "0", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "comppo_core.cli", "train", "--arm", "grpo", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # printed once the run is built
    assert first.startswith("comppo-core train: grpo, seed 0, 200 steps on cpu, 1 torch thread(s) per process")
    deadline = time.monotonic() + 60
    while not (out / "checkpoint" / "progress.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)  # the checkpoint after the first step
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("comppo-core train: stopped after step")
    next_step = json.loads((out / "checkpoint" / "progress.json").read_text())["next_step"]
    assert next_step >= 1 and f"the checkpoint after {next_step} of 200 steps is kept" in err


# ---------------------------------------------------------------------------------------------------------
# fast by default, answers in seconds


def test_the_trainer_uses_one_thread_per_process_on_cpu_unless_told() -> None:
    torch.set_num_threads(2)
    trainer = Trainer(TrainConfig(**{**TINY_SETTINGS, "device": "cpu"}))
    assert trainer.threads == 1 and torch.get_num_threads() == 1
    trainer = Trainer(TrainConfig(**{**TINY_SETTINGS, "device": "cpu", "num_threads": 2}))
    assert trainer.threads == 2 and torch.get_num_threads() == 2
    from comppo_core.commands.train import describe_start

    text = describe_start(trainer)
    assert "2 torch thread(s) per process" in text and "response budget: " in text and "held-out evaluation: " in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--out", "{file}"], "--out: expected a directory for the run's files"),
        (["train", "--out", "{run}"], "--out: '{run}' already holds a run"),
        (["train", "--model", "{missing}"], "--model: expected a local model directory"),
        (["train", "--model", "{empty}"], "--model: expected a tokenizer in"),
        (["train", "--model", "{notemplate}", "--chat-template"], "--chat-template: the tokenizer in"),
        (["train", "--model", "{notemplate}", "--task", "{missing}.jsonl"], "--task: expected a JSONL file"),
        (["train", "--arm", "foo"], "--arm: expected one of"),
        (["train", "--init-from", "{missing}"], "--init-from: expected a local model directory"),
        (["compare", "--out", "{file}"], "--out: expected a directory"),
        (["compare", "--out", "{run}"], "--out: '{run}' holds a run of comppo-core train"),
        (
            ["train", "--out", "{compare}", "--overwrite"],
            "--out: '{compare}' holds a compare (compare.json), not a run",
        ),
        (["train", "--out", "{empty}", "--report-to", "wandb"], "--report-to: 'wandb' needs the wandb package"),
    ],
)
def test_flag_and_path_errors_answer_in_one_line_before_torch(tmp_path: Path, argv: list[str], message: str) -> None:
    save_tokenizer = jsonl_helpers().save_tokenizer

    paths = {
        "file": tmp_path / "a_file",
        "run": tmp_path / "run",
        "missing": tmp_path / "nope",
        "empty": tmp_path / "empty",
    }
    paths["file"].write_text("x")
    paths["run"].mkdir()
    (paths["run"] / "config.json").write_text("{}")
    paths["empty"].mkdir()
    paths["compare"] = tmp_path / "cmp"
    paths["compare"].mkdir()
    (paths["compare"] / "compare.json").write_text("{}")
    paths["notemplate"] = tmp_path / "notemplate"
    save_tokenizer(paths["notemplate"])
    filled = [a.format(**paths) for a in argv]
    code = (
        "import sys\n"
        "from comppo_core.cli import main\n"
        f"rc = main({filled!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "sys.exit(rc)\n"
    )
    done = light(code)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "usage:" not in done.stderr
    assert message.format(**paths) in done.stderr


# ---------------------------------------------------------------------------------------------------------
# your own data, stated; logging people use


def test_a_step_without_learning_signal_is_counted_and_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = TrainConfig(**{**TINY_SETTINGS, "device": "cpu", "max_new_tokens": 1, "out": str(tmp_path / "run")})
    with caplog.at_level(logging.WARNING, logger="comppo_core.rl"):
        summary = Trainer(config).train()
    warnings = [r for r in caplog.records if "no learning signal" in r.getMessage()]
    assert len(warnings) == 1 and "max_new_tokens = 1" in warnings[0].getMessage()
    steps = [r for r in lines(tmp_path / "run" / "metrics.jsonl") if r["reward_mean"] is not None]
    assert all(r["rewards_all_equal"] is True and r["reward_mean"] == 0.0 for r in steps)
    assert summary["steps_without_signal"] == config.steps


def test_without_the_progress_bar_each_step_prints_a_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "--arm", "grpo", *TINY, "--out", str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert "grpo seed 0: step 1/2: reward " in err and "held-out" in err
    assert "grpo seed 0: after step 2: held-out" in err


def test_tensorboard_gets_the_metrics_keys(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert cli.main(["train", "--arm", "comppo", *TINY, "--out", str(out), "--report-to", "tensorboard"]) == 0
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    rows = lines(out / "metrics.jsonl")
    numeric = {k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and k not in ("step", "seed")}
    assert tags == numeric and "eval_accuracy" in tags and "value_loss" in tags
    evals = [(e.step, e.value) for e in events.Scalars("eval_accuracy")]
    assert evals == [(r["step"], pytest.approx(r["eval_accuracy"])) for r in rows if r["eval_accuracy"] is not None]


def test_wandb_offline_gets_the_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert cli.main(["train", "--arm", "grpo", *TINY, "--out", str(out), "--report-to", "wandb"]) == 0
    assert list((out / "wandb").glob("offline-run-*")), "no offline W&B run written"


def test_a_jsonl_parse_error_names_the_right_column(tmp_path: Path) -> None:
    from comppo_core.rl.tasks.jsonl import read_rows

    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "what is 2+2", "answer": 4\n')
    with pytest.raises(ParameterError, match=r"line 2: expected a JSON object, got a parse error at column 38"):
        read_rows(path)


# ---------------------------------------------------------------------------------------------------------
# the trained model is reusable


def test_a_saved_actor_is_a_model_directory_for_train_and_evaluate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert cli.main(["train", "--arm", "grpo", *TINY, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    actor = out / "checkpoint" / "actor"
    assert (actor / "tokenizer.json").is_file() and (actor / "task.json").is_file()
    report = tmp_path / "eval.json"
    capsys.readouterr()
    assert cli.main(["evaluate", "--model", str(actor), "--json", str(report)]) == 0  # task.json: the run's set
    result = json.loads(report.read_text())
    assert result["accuracy"] == summary["final_eval_accuracy"]  # the run's own held-out set and number
    assert "held-out accuracy" in capsys.readouterr().out
    again = tmp_path / "again"
    argv = ["train", "--arm", "grpo", "--model", str(actor), "--steps", "1", "--eval-size", "8", "--eval-every", "1"]
    assert cli.main([*argv, "--prompts-per-step", "4", "--group-size", "2", "--no-progress", "--out", str(again)]) == 0
    first = json.loads((again / "summary.json").read_text())["initial_eval_accuracy"]
    assert first == summary["final_eval_accuracy"]  # the checkpoint's actor, read back with its tokenizer


def test_a_checkpoint_left_as_checkpoint_old_by_a_crash_is_found_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash between the two renames of a save leaves only checkpoint.old: the refusal,
    the resume and compare all treat it as the run's checkpoint (nothing is deleted)."""
    argv, run, straight = _compare_with_an_interrupted_run(tmp_path / "cmp")
    (run / "checkpoint").rename(run / "checkpoint.old")
    assert run_dir.saved_checkpoint(run) == (run / "checkpoint.old", 1)
    assert run_dir.describe_run(run) == "a run of grpo, seed 0, 3 steps (a checkpoint after 1 steps)"
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 0
    assert "resumed" in capsys.readouterr().out  # resumed from checkpoint.old, not restarted
    resumed = actor_weights(run)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
