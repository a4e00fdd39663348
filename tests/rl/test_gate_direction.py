"""``TrainConfig.gate_direction`` beyond the keywords (tests/rl/test_gate_sources.py has those):
``gate_invert`` against an explicit ``"as_is"``, and a diagnosis.json's task against the run's.

A diagnosis applies to the task it measured: another task (name or size) is refused naming
``gate_direction``, another split of the same task is not; a diagnosis that records no task
is warned about; the recorded task of every registered task is its ``to_dict``'s; the
diagnosis's recommended gate range is not applied; and end to end, on the diagnosis
``comppo-core diagnose`` writes (slow).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from comppo_core.errors import ParameterError
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.gate_direction import (
    DEFAULT_GATE_DIRECTION,
    DiagnosisTaskWarning,
    check_diagnosis_task,
    config_task_record,
    given_gate_direction,
    task_identity,
)
from comppo_core.rl.tasks import TASKS, build_task
from comppo_core.rl.tasks.answers import answer_check
from comppo_core.rl.tasks.jsonl import JsonlTask


def diagnosis(tmp_path: Path, task: dict[str, Any] | None, name: str = "diagnosis.json", **data: Any) -> str:
    """A diagnosis.json recording ``task`` (a task's to_dict, as diagnose writes it; None: none)."""
    path = tmp_path / name
    body = {"direction": "inverted", **data, **({} if task is None else {"settings": {"task": task}})}
    path.write_text(json.dumps(body))
    return str(path)


# ---- gate_invert against an explicit as_is


def test_an_explicit_as_is_beside_gate_invert_true_is_refused_naming_both() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ParameterError) as info:
        TrainConfig(gate_invert=True, gate_direction="as_is")
    assert info.value.argument == "gate_invert"
    assert "gate_invert: True means gate_direction='inverted', but gate_direction='as_is' is given too" in str(
        info.value
    )
    with pytest.warns(DeprecationWarning):  # the default is not a direction given: gate_invert decides
        assert TrainConfig(gate_invert=True).gate_direction == "inverted"
    with pytest.warns(DeprecationWarning):  # agreeing values are fine
        assert TrainConfig(gate_invert=True, gate_direction="inverted").gate_params.invert is True
    with pytest.warns(DeprecationWarning):
        assert TrainConfig(gate_invert=False, gate_direction="as_is").gate_params.invert is False


def test_the_default_direction_is_as_is_and_known_as_the_default() -> None:
    config = TrainConfig()
    assert config.gate_direction == "as_is" and given_gate_direction(config.gate_direction) is None
    assert given_gate_direction("as_is") == "as_is"  # given explicitly
    assert json.loads(config.to_json())["gate_direction"] == "as_is"
    assert given_gate_direction(config.replace(steps=2).gate_direction) is None  # a copy keeps it the default
    assert DEFAULT_GATE_DIRECTION == "as_is" and str(DEFAULT_GATE_DIRECTION) == "as_is"


# ---- the diagnosis's task


def test_the_recorded_task_of_a_config_is_its_built_tasks() -> None:
    """What config_task_record names without building the task is the built task's to_dict
    (TaskEntry.sizes' keys are to_dict's), for every registered task that is not a file."""
    changes = {"chain_digits": 6, "chain_filler_max": 5, "digits": 1, "addition_tail_max": 3}
    for name, entry in TASKS.items():
        if entry.file_suffix is not None:
            continue
        extra: dict[str, Any] = {}
        if entry.family:  # a family of tasks: one member, on a model (never loaded: building reads none)
            pytest.importorskip("reasoning_gym")
            name, extra = f"{name}:chain_sum", {"model": "m", "task_options": {"min_terms": 2}}
        config = TrainConfig(task=name, **changes, **extra)
        built = build_task(config).to_dict()
        recorded = config_task_record(config)
        assert {k: built[k] for k in recorded} == recorded, name
        assert task_identity(built) == recorded, name  # the split is all the identity leaves out


def test_a_file_task_is_compared_by_its_file_name(tmp_path: Path) -> None:
    rows = tmp_path / "add.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) + "\n" for i in range(20)))
    recorded = JsonlTask(str(rows)).to_dict()
    # the answer check is the task's too: a diagnosis rewarded by math-verify is not one rewarded by the hand rule
    assert task_identity(recorded) == {"name": "jsonl", "path": "add.jsonl", "answer_check": answer_check()}
    # the diagnosis ran elsewhere (a relative path); the run names the file by its absolute path
    check_diagnosis_task(diagnosis(tmp_path, {**recorded, "path": "data/add.jsonl"}), recorded)
    with pytest.raises(ParameterError, match="path: 'other.jsonl' there, 'add.jsonl' here") as info:
        check_diagnosis_task(diagnosis(tmp_path, {**recorded, "path": "other.jsonl"}), recorded)
    assert info.value.argument == "gate_direction"


def test_a_diagnosis_of_the_runs_task_applies_whatever_its_split(tmp_path: Path) -> None:
    task = build_task(TrainConfig(task="chain")).to_dict()
    path = diagnosis(tmp_path, {**task, "split_seed": 5, "heldout_fraction": 0.5})
    config = TrainConfig(task="chain", arm="comppo", gate_direction=path)
    assert config.applied_gate_direction == "inverted" and config.gate_params.invert is True


@pytest.mark.parametrize(
    "run, message",
    [
        ({"task": "addition"}, "name: 'chain' there, 'addition' here"),
        ({"task": "filler_addition"}, "name: 'chain' there, 'filler_addition' here"),
        ({"task": "chain", "chain_digits": 6}, "digits: 8 there, 6 here"),
        ({"task": "chain", "chain_filler_max": 4, "chain_steps": 3}, "steps: 8 there, 3 here; filler_max: 32 there"),
    ],
)
def test_a_diagnosis_of_another_task_is_refused_naming_gate_direction(
    tmp_path: Path, run: dict[str, Any], message: str
) -> None:
    path = diagnosis(tmp_path, build_task(TrainConfig(task="chain")).to_dict())
    for arm in ("comppo", "grpo"):  # every arm: the diagnosis is the run's settings, read or not
        with pytest.raises(ParameterError, match=message) as info:
            TrainConfig(arm=arm, gate_direction=path, **run)
        assert info.value.argument == "gate_direction"
        assert str(info.value).startswith("gate_direction: the diagnosis ")
        assert "pass --gate-direction as_is or inverted" in str(info.value)


def test_a_compare_of_another_task_refuses_at_replace(tmp_path: Path) -> None:
    """``replace`` (a compare's runs) checks again: the settings cannot drift to another task."""
    path = diagnosis(tmp_path, build_task(TrainConfig()).to_dict())
    config = TrainConfig(arm="comppo", gate_direction=path)
    assert config.replace(seed=3, arm="comp_gae").applied_gate_direction == "inverted"
    with pytest.raises(ParameterError, match="digits: 2 there, 3 here"):
        config.replace(digits=3)


def test_a_diagnosis_that_records_no_task_is_applied_with_a_warning(tmp_path: Path) -> None:
    path = diagnosis(tmp_path, None)
    with pytest.warns(DiagnosisTaskWarning, match="records no task"):
        config = TrainConfig(arm="comppo", gate_direction=path)
    assert config.gate_params.invert is True
    with pytest.warns(DiagnosisTaskWarning, match="task is not known"):
        check_diagnosis_task(diagnosis(tmp_path, {"name": "chain"}), None, run="this trainer")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_diagnosis_task("inverted", None)  # a keyword reads no file


def test_the_recommended_gate_range_is_not_applied(tmp_path: Path) -> None:
    """The run's gate range is its own settings' (the diagnosis does not tune one: module
    docstring of comppo_core.rl.gate_direction)."""
    task = config_task_record(TrainConfig())
    path = diagnosis(tmp_path, task, recommendation={"direction": "inverted", "gate_range": [0.5, 1.0]})
    params = TrainConfig(arm="comppo", gate_low=0.8, gate_direction=path).gate_params
    assert (params.low, params.high, params.invert) == (0.8, 1.0, True)


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_a_real_diagnosis_applies_to_its_task_and_is_refused_on_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``comppo-core diagnose``'s own diagnosis.json: ``train``'s settings of the same task
    (another seed, split and warm start) take its direction; of another size, refuse it."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    from rl_tiny import TINY_SETTINGS, as_flags

    from comppo_core import cli

    task = {"task": "chain", "chain_digits": 2, "chain_steps": 1, "chain_filler_max": 2, "chain_tail_max": 0}
    settings = {k: v for k, v in TINY_SETTINGS.items() if k not in ("steps", "prompts_per_step", "group_size")}
    budget = ["--prompts", "3", "--samples-per-prefix", "2", "--positions", "3", "--bootstrap", "20"]
    out = tmp_path / "diag"
    flags = as_flags({**settings, **task, "warmup_sft_steps": 20})
    assert cli.main(["diagnose", *flags, *budget, "--no-progress", "--out", str(out)]) == 0
    capsys.readouterr()
    path = str(out / "diagnosis.json")
    recommended = json.loads(Path(path).read_text())["direction"]
    config = TrainConfig(arm="tac_fixed", seed=4, split_seed=3, warmup_sft_steps=5, gate_direction=path, **task)
    assert config.applied_gate_direction == recommended
    with pytest.raises(ParameterError, match="steps: 1 there, 2 here") as info:
        TrainConfig(arm="tac_fixed", gate_direction=path, **{**task, "chain_steps": 2})
    assert info.value.argument == "gate_direction"
