"""``CompPOConfig.gate_direction``: TrainConfig's values and meaning on TRL.

Every arm takes the direction ``TrainConfig`` gives it (the same keywords, the same
diagnosis.json reading, the same refusals); the trainer's gates are the mirror image under
``inverted`` and unchanged under ``none`` on an arm whose gates have no direction, on the tiny
TRL model; ``gate_params.invert=True`` is the same switch; a diagnosis of another task than
the trainer's reward function's is refused, one whose task cannot be compared warned about.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("datasets")

from trl_tiny import make_trainer, synthetic_rows, tiny_llama  # noqa: E402

import comppo_core as cc  # noqa: E402
from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.integrations import trl as cctrl  # noqa: E402
from comppo_core.rl.config import TrainConfig  # noqa: E402
from comppo_core.rl.core.step import ScoringSettings  # noqa: E402
from comppo_core.rl.gate_direction import DiagnosisTaskWarning  # noqa: E402
from comppo_core.rl.tasks.addition import CharTokenizer  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # transformers 5 renames inside TRL 1.16
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func':UserWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]

TOK = CharTokenizer()


def config(**fields: Any) -> Any:
    return cctrl.CompPOConfig(output_dir="unused", report_to=[], use_cpu=True, **fields)


def diagnosis(tmp_path: Path, task: dict[str, Any] | None, **data: Any) -> str:
    """A diagnosis.json of ``data`` recording ``task`` (a task's to_dict; None: no task)."""
    path = tmp_path / "diagnosis.json"
    path.write_text(json.dumps({**data, **({} if task is None else {"settings": {"task": task}})}))
    return str(path)


def outcome(make: Any) -> tuple[str, Any]:
    """``("ok", applied direction)`` or ``("refused", (argument, message))`` of ``make()``."""
    try:
        return "ok", make().applied_gate_direction
    except ParameterError as exc:
        return "refused", (exc.argument, str(exc))


# ---- the config


def test_every_arm_takes_the_direction_train_config_gives_it(tmp_path: Path) -> None:
    """For every arm and every kind of value (the keywords, a diagnosis), CompPOConfig applies
    what TrainConfig applies, or refuses what it refuses with the same message."""
    task = {"name": "addition", "digits": 2}  # TrainConfig()'s task: the run TrainConfig checks against
    path = diagnosis(tmp_path, task, direction="inverted", directions={"policy_entropy": "as_is", "token_nll": "none"})
    for arm in cctrl.ARM_CHOICES:
        for value in ("as_is", "inverted", "none", path):
            ours = outcome(lambda: config(arm=arm, gate_direction=value))
            theirs = outcome(lambda: TrainConfig(arm=arm, gate_direction=value))
            assert ours == theirs, (arm, value)
    assert outcome(lambda: config(arm="comppo", gate_direction="none"))[0] == "refused"  # both refuse some
    assert config(arm="comppo", gate_direction=path).gate_direction.startswith(path + "#sha256=")


def test_the_applied_gate_params_are_train_configs() -> None:
    for direction in ("as_is", "inverted"):
        ours = config(arm="comppo", gate_direction=direction)
        theirs = TrainConfig(arm="comppo", gate_direction=direction)
        # CompPOConfig's default mapping is TrainConfig's (the whole-row z-score that gate_causal replaces)
        assert ours.applied_gate_params == ScoringSettings.from_config(theirs).gate_params
        assert ours.applied_gate_params.invert is (direction == "inverted")
        assert ours.gate_params.invert is False  # the field itself is left as given
    assert config(gate_params=cc.GateParams(low=0.5)).applied_gate_params.low == 0.5


def test_gate_params_invert_is_the_same_switch() -> None:
    c = config(arm="comppo", gate_params=cc.GateParams(invert=True))
    assert c.gate_direction == "inverted" and c.applied_gate_params.invert is True
    assert config(gate_params=cc.GateParams(invert=True), gate_direction="inverted").applied_gate_params.invert
    for given in ("as_is", "none"):  # an explicit as_is is not the default: a contradiction
        with pytest.raises(ParameterError, match=f"gate_params: invert=True means gate_direction='inverted', but "
                           f"gate_direction='{given}' is given too") as info:  # fmt: skip
            config(arm="tac_fixed", gate_params=cc.GateParams(invert=True), gate_direction=given)
        assert info.value.argument == "gate_params"


@pytest.mark.parametrize("value", ["", " ", 3, None])
def test_a_gate_direction_that_is_not_a_string_is_refused(value: Any) -> None:
    with pytest.raises(ParameterError, match="gate_direction: expected one of 'as_is', 'inverted', 'none'") as info:
        config(gate_direction=value)
    assert info.value.argument == "gate_direction"


def test_the_config_writes_the_direction() -> None:
    c = config(gate_direction="inverted")
    assert c.to_dict()["gate_direction"] == "inverted"
    assert json.loads(c.to_json_string())["gate_direction"] == "inverted"
    assert json.loads(config().to_json_string())["gate_direction"] == "as_is"


# ---- the trainer's gates on the tiny model


def first_scored(out: Path, **fields: Any) -> tuple[Any, Any]:
    """A one-step CompPOTrainer on fixed synthetic rows, and the batch of its first scoring pass."""
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    settings = {"per_device_train_batch_size": 8, "num_generations": 2, "max_steps": 1, "learning_rate": 1e-3}
    settings.update(tac_width=16, max_completion_length=8, critic_lr=1e-3, **fields)
    trainer = make_trainer(tiny_llama(TOK.vocab_size), TOK.to_hf(), rows, scores, str(out), **settings)
    seen: list[Any] = []
    score = trainer._score
    trainer._score = lambda *a, **k: seen.append(score(*a, **k)) or seen[-1]
    trainer.train()
    return trainer, seen[0][0]


@pytest.mark.slow
def test_inverted_gives_the_mirror_image_of_the_gates(tmp_path: Path) -> None:
    """``inverted``: each gate ``g`` becomes ``low + high − g`` (the sigmoid's mirror image),
    the mapping TrainConfig(gate_direction="inverted") gives the package trainer."""
    _, as_is = first_scored(tmp_path / "a", arm="comppo")
    trainer, inverted = first_scored(tmp_path / "i", arm="comppo", gate_direction="inverted")
    assert trainer.scoring.gate_params == TrainConfig(arm="comppo", gate_direction="inverted").gate_params
    m = as_is.response_mask
    assert torch.equal(m, inverted.response_mask)
    low, high = trainer.scoring.gate_params.low, trainer.scoring.gate_params.high
    g = as_is.gates[m]
    assert float(g.max() - g.min()) > 1e-3  # the gates vary: the mirror image is not the same gates
    torch.testing.assert_close(inverted.gates[m], low + high - g, atol=1e-6, rtol=0.0)
    assert bool((inverted.gates[~m] == 1.0).all())


def test_none_on_an_arm_without_a_direction_leaves_its_gates(tmp_path: Path) -> None:
    """``none``: an arm whose gates have no direction (a constant gate) trains as with
    ``as_is``; an arm whose gates have one refuses it, naming the arm to run (TrainConfig's)."""
    _, as_is = first_scored(tmp_path / "a", arm="tac_fixed")
    _, none = first_scored(tmp_path / "n", arm="tac_fixed", gate_direction="none")
    for name in ("gates", "advantages", "returns", "old_values"):
        assert torch.equal(getattr(as_is, name), getattr(none, name)), name
    with pytest.raises(ParameterError, match="run tac_fixed") as info:
        config(arm="comppo", gate_direction="none")
    assert info.value.argument == "gate_direction"


# ---- the diagnosis's task


def test_a_diagnosis_of_another_task_is_refused_by_the_trainer(tmp_path: Path) -> None:
    from comppo_core.integrations.trl import dataset_and_rewards

    data = dataset_and_rewards("chain", train_size=8, eval_size=4, chain_digits=4, chain_steps=2)
    tok = data.task.tokenizer
    assert tok is not None

    def trainer(path: str) -> Any:
        return cctrl.CompPOTrainer(
            model=tiny_llama(tok.vocab_size),
            reward_funcs=data.reward_funcs,
            args=config(arm="comppo", gate_direction=path, critic_warmup=0, tac_width=16),
            train_dataset=data.train,
            processing_class=CharTokenizer(tok.alphabet).to_hf(),  # type: ignore[attr-defined]
        )

    same = {**data.task.to_dict(), "split_seed": 7}  # another split of the same task: applies
    assert trainer(diagnosis(tmp_path, same, direction="inverted")).scoring.gate_params.invert is True
    other = {**data.task.to_dict(), "digits": 8}
    with pytest.raises(ParameterError, match="measured another task than this trainer's .*digits: 8 there, 4 here"):
        trainer(diagnosis(tmp_path, other, direction="inverted"))


def test_a_diagnosis_whose_task_cannot_be_compared_is_warned_about(tmp_path: Path) -> None:
    """No task's reward function among reward_funcs (the user's own), or a diagnosis that
    records no task: the direction applies, with a DiagnosisTaskWarning."""
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    settings = {"per_device_train_batch_size": 8, "num_generations": 2, "tac_width": 16, "critic_warmup": 0}
    for task, match in (({"name": "chain", "digits": 4}, "task is not known"), (None, "records no task")):
        path = diagnosis(tmp_path, task, direction="inverted")
        with pytest.warns(DiagnosisTaskWarning, match=match):
            trainer = make_trainer(
                tiny_llama(TOK.vocab_size), TOK.to_hf(), rows, scores, str(tmp_path), gate_direction=path, **settings
            )
        assert trainer.scoring.gate_params.invert is True
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosisTaskWarning)  # a keyword reads no diagnosis
        make_trainer(tiny_llama(TOK.vocab_size), TOK.to_hf(), rows, scores, str(tmp_path), gate_direction="inverted")


def test_docs_trl_lists_every_comppo_config_field_with_its_help() -> None:
    """docs/trl.md's "CompPOConfig's fields" table: one row per field CompPOConfig adds to
    GRPOConfig, its meaning the field's help text (so the table cannot drift)."""
    import dataclasses
    import re

    from trl.trainer.grpo_config import GRPOConfig

    text = (Path(__file__).resolve().parents[2] / "docs" / "trl.md").read_text(encoding="utf-8")
    section = text.split("## CompPOConfig's fields", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| `[^`]*` \| (.*) \|$", section, flags=re.MULTILINE))
    base = {f.name for f in dataclasses.fields(GRPOConfig)}
    added = {f.name: f.metadata["help"] for f in dataclasses.fields(cctrl.CompPOConfig) if f.name not in base}
    assert rows == added
