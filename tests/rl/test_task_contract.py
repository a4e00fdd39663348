"""The contract every registered task keeps (``comppo_core.rl.tasks.TASKS``), one test each, over every entry.

What is pinned, for each task built from a small TrainConfig: it is a ``Task`` (the
protocol), its registry sizes are TrainConfig fields that reach its ``to_dict``; the same
seed gives the same train draws, validation and held-out lists; the three splits never
meet; the verifier rewards the task's own demonstrations 1 (and 0 unfinished); the
pivotal marks of a task that has them cover the response exactly and mark some of it;
and a tiny training run (each task with its own tokenizer) runs, logs within the task's
budget, and saves a ``task.json`` that ``comppo-core evaluate`` reads back into the same task.
A new task in the registry is tested here without a line more (its sizes: the defaults,
unless :data:`SMALL` names smaller ones); a family of tasks (``reasoning_gym:NAME``) is
tested through the member :data:`MEMBERS` names (skipped when its package is missing).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rl_tiny import TINY_SETTINGS

from comppo_core.errors import ParameterError
from comppo_core.rl.config import TASK_SIZES, TrainConfig
from comppo_core.rl.tasks import TASKS, TaskEntry, build_task, size_fields, task_entry
from comppo_core.rl.tasks.base import Problem, Task

#: Small sizes per task (a task not named here is built at the TrainConfig defaults).
SMALL: dict[str, dict[str, Any]] = {
    "addition": {"digits": 2},
    "chain": {"chain_digits": 4, "chain_steps": 2, "chain_filler_max": 4, "chain_tail_max": 3},
    "filler_addition": {"digits": 1, "addition_filler_max": 4, "addition_tail_max": 3},
    "reasoning_gym:chain_sum": {"task_options": {"min_terms": 2, "max_terms": 3, "size": 4000}},
}
#: The member each family is tested through, and the package it needs.
MEMBERS: dict[str, tuple[str, str]] = {"reasoning_gym": ("reasoning_gym:chain_sum", "reasoning_gym")}


def _entries() -> list[Any]:
    """Every registered task, a family as its member (skipped without the family's package)."""
    out: list[Any] = []
    for e in TASKS.values():
        if not e.family:
            out.append(pytest.param(e, id=e.name))
            continue
        member, package = MEMBERS[e.name]  # a new family: name the member to test here
        try:
            out.append(pytest.param(task_entry(member), id=member))
        except ParameterError:  # its package is missing
            out.append(pytest.param(e, id=member, marks=pytest.mark.skip(reason=f"needs {package}")))
    return out


ENTRIES = _entries()


def config_for(entry: TaskEntry, tmp_path: Path, **changes: Any) -> TrainConfig:
    """A TrainConfig of ``entry`` at its small sizes (a file task: a small file in ``tmp_path``)."""
    settings: dict[str, Any] = {**SMALL.get(entry.name, {}), **changes}
    if entry.file_suffix is not None:
        path = tmp_path / f"rows{entry.file_suffix}"
        rows = [{"prompt": f"What is {i} times 3?", "answer": 3 * i} for i in range(200)]
        if entry.file_suffix == ".jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif entry.file_suffix == ".hf.json":  # a saved Hugging Face dataset and a named reward function
            datasets = pytest.importorskip("datasets")
            if not (tmp_path / "rows").is_dir():
                datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "rows"))
            (tmp_path / "rows_reward.py").write_text(
                "def exact(completions, answer, **kwargs):\n"
                "    return [float(c == str(a)) for c, a in zip(completions, answer)]\n"
            )
            path.write_text(json.dumps({"dataset": "rows", "reward": "rows_reward.py:exact"}))
        else:
            raise AssertionError(f"no test file for a {entry.file_suffix} task: add one here")
        settings["task"] = str(path)
    else:
        settings["task"] = entry.name
    if entry.needs_model:
        settings["model"] = str(tmp_path / "model")  # never loaded: building a task reads no model
    return TrainConfig(**settings)


def reference_response(task: Task, problem: Problem, rng: np.random.Generator) -> str:
    """The task's own demonstration of ``problem``: ``demonstration(problem, rng)`` when it
    has one, else the problem's solution, else (a file of prompts and answers) the answer."""
    demo = getattr(task, "demonstration", None)
    if callable(demo):
        return str(demo(problem, rng))
    return problem.solution or problem.answer


@pytest.fixture(params=ENTRIES)
def entry(request: pytest.FixtureRequest) -> TaskEntry:
    return request.param  # type: ignore[no-any-return]


def test_the_task_is_a_task_and_its_sizes_are_config_fields(entry: TaskEntry, tmp_path: Path) -> None:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(entry.sizes.values()) <= fields
    assert set(entry.sizes.values()) - {"digits"} <= set(TASK_SIZES) <= set(size_fields())
    config = config_for(entry, tmp_path, split_seed=3, heldout_fraction=0.25, validation_fraction=0.1)
    assert task_entry(config.task) is entry
    task = build_task(config)
    assert isinstance(task, Task)
    assert task.name == entry.name
    saved = task.to_dict()
    assert json.loads(json.dumps(saved)) == saved and saved["name"] == entry.name
    assert {arg: saved[arg] for arg in entry.sizes} == {arg: getattr(config, f) for arg, f in entry.sizes.items()}
    assert (saved["split_seed"], saved["heldout_fraction"], saved["validation_fraction"]) == (3, 0.25, 0.1)
    assert isinstance(task.describe(), str) and task.describe()
    assert (task.tokenizer is None) == entry.needs_model
    assert task.max_new_tokens >= 1


def test_the_lists_are_a_function_of_their_seed(entry: TaskEntry, tmp_path: Path) -> None:
    config = config_for(entry, tmp_path, validation_fraction=0.1)
    a, b = build_task(config), build_task(config)
    for seed in (0, 1):
        assert a.sample(np.random.default_rng(seed), 40) == b.sample(np.random.default_rng(seed), 40)
    assert a.sample(np.random.default_rng(0), 40) != a.sample(np.random.default_rng(1), 40)
    assert a.heldout(30) == b.heldout(30) and a.validation(30) == b.validation(30)
    assert a.heldout(30) == a.heldout(30) and a.validation(30) == a.validation(30)  # no hidden state
    other = build_task(config.replace(split_seed=config.split_seed + 1))
    assert {p.prompt for p in other.heldout(30)} != {p.prompt for p in a.heldout(30)}


def test_train_validation_and_heldout_never_meet(entry: TaskEntry, tmp_path: Path) -> None:
    task = build_task(config_for(entry, tmp_path, validation_fraction=0.15))
    train = {p.prompt for p in task.sample(np.random.default_rng(0), 400)}
    held = {p.prompt for p in task.heldout(200)}
    valid = {p.prompt for p in task.validation(200)}
    assert train and held and valid
    assert not train & held and not train & valid and not held & valid
    assert len(task.heldout(10)) == 10 and len({p.prompt for p in task.heldout(10)}) == 10  # distinct
    without = build_task(config_for(entry, tmp_path))
    with pytest.raises(ParameterError, match="^validation_fraction: expected a validation split") as info:
        without.validation(5)
    assert info.value.argument == "validation_fraction"


def test_the_verifier_rewards_the_tasks_own_demonstrations(entry: TaskEntry, tmp_path: Path) -> None:
    task = build_task(config_for(entry, tmp_path, validation_fraction=0.1))
    rng = np.random.default_rng(0)
    problems = task.sample(rng, 50) + task.heldout(20) + task.validation(20)
    responses = [reference_response(task, p, rng) for p in problems]
    n = len(problems)
    assert [task.reward(p, r, True) for p, r in zip(problems, responses)] == [1.0] * n
    assert task.rewards(problems, responses, [True] * n) == [1.0] * n
    assert task.rewards(problems, responses, [False] * n) == [0.0] * n  # a response cut short earns nothing
    if task.tokenizer is not None:  # every demonstration fits the budget, EOS included
        assert max(len(task.tokenizer.encode(r)) + 1 for r in responses) <= task.max_new_tokens


def test_pivotal_marks_fall_inside_the_response(entry: TaskEntry, tmp_path: Path) -> None:
    task = build_task(config_for(entry, tmp_path))
    pivotal = getattr(task, "pivotal", None)
    if not callable(pivotal):
        pytest.skip(f"the {entry.name} task marks no pivotal tokens")
    rng = np.random.default_rng(0)
    for p in task.sample(rng, 30) + task.heldout(10):
        response = reference_response(task, p, rng)
        flags = list(pivotal(p, response))
        assert len(flags) == len(response) and all(isinstance(f, bool) for f in flags)
        assert any(flags) and not all(flags)  # the tokens that decide, among others that do not
        assert pivotal(p, "") == []


# ---------------------------------------------------------------------------------------------------------
# a tiny run of each task that brings its own tokenizer (a file task's runs: test_rl_jsonl.py)

RUNNABLE = [e for e in TASKS.values() if not e.needs_model]


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("run_entry", RUNNABLE, ids=[e.name for e in RUNNABLE])
def test_a_tiny_run_trains_and_saves_a_task_evaluate_reads_back(run_entry: TaskEntry, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from comppo_core.commands.evaluate import saved_task_settings
    from comppo_core.rl import train

    small = {**TINY_SETTINGS, **SMALL.get(run_entry.name, {}), "task": run_entry.name, "device": "cpu"}
    small.update(eval_size=8, eval_every=2)
    config = TrainConfig(**small)
    task = build_task(config)
    oracle = callable(getattr(task, "pivotal", None))
    arm = "comppo_oracle" if oracle else "comppo"
    summary = train(config.replace(arm=arm, out=str(tmp_path / "run")))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step") is not None and r.get("reward_mean") is not None]
    assert [r["step"] for r in steps] == [0, 1]
    assert all(0 < r["response_length"] <= task.max_new_tokens for r in steps)  # within the task's budget
    # the summary is the run's: its arm and steps, the step-0 and final evaluations, the last reward
    assert (summary["arm"], summary["steps"]) == (arm, 2)
    assert [s for s, _ in summary["eval"]] == [0, 2]  # eval_every 2: before step 0, after the last
    assert [summary["initial_eval_accuracy"], summary["final_eval_accuracy"]] == [a for _, a in summary["eval"]]
    assert all(0.0 <= a <= 1.0 for _, a in summary["eval"])
    assert summary["final_reward_mean"] == steps[-1]["reward_mean"]
    if oracle:  # the oracle's gates: high on the pivotal tokens, low elsewhere, nothing between
        for r in steps:
            for g in (r["gate_min"], r["gate_max"]):
                assert min(abs(g - config.gate_low), abs(g - config.gate_high)) < 1e-6, r
    saved, path = saved_task_settings(tmp_path / "run" / "warmstart")
    assert path is not None and saved["task"] == run_entry.name
    assert {f: saved[f] for f in run_entry.sizes.values()} == {f: getattr(config, f) for f in run_entry.sizes.values()}
    assert set(saved) & set(size_fields()) <= set(run_entry.sizes.values())  # no other task's sizes
    again = build_task(TrainConfig(**{**small, **saved}))
    assert again.to_dict() == task.to_dict()
