"""Every registered task on both engines (comppo_core.integrations.trl.tasks, docs/trl.md "Tasks on TRL").

What is pinned: a task's datasets are its problems (the train draws, the validation and
held-out lists the package evaluates on); its TRL reward function gives the package's
rewards on the same tokens, finished or cut short, for text and chat completions (the
package side through the package's own ``rollout.generate`` / ``rollout.rewarded`` with a
stub policy); each built-in task trains a CompPOTrainer step with real generation, whose
rewards are the package's on the completions TRL generated; a JSONL file and a saved
Hugging Face dataset with a named reward function train on both engines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from trl_tiny import EXACT, tiny_llama  # noqa: E402

from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.integrations.trl import (  # noqa: E402
    TASK_COLUMNS,
    CompPOConfig,
    CompPOTrainer,
    dataset_and_rewards,
    pivotal_completion_columns,
    pivotal_task,
    task_dataset,
    task_problems,
    task_reward_function,
    trl_eos_token_ids,
)
from comppo_core.rl.config import TrainConfig  # noqa: E402
from comppo_core.rl.core import oracle  # noqa: E402
from comppo_core.rl.engine import rollout  # noqa: E402
from comppo_core.rl.tasks import build_task  # noqa: E402
from comppo_core.rl.tasks.addition import CharTokenizer  # noqa: E402
from comppo_core.rl.tasks.base import Problem, Task  # noqa: E402
from comppo_core.rl.tasks.hf_dataset import HFDatasetTask  # noqa: E402
from comppo_core.rl.tasks.jsonl import JsonlTask  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # transformers 5 renames inside TRL 1.16
    pytest.mark.usefixtures("one_torch_thread"),
]

#: The built-in tasks at small sizes (TrainConfig fields).
BUILT_IN: dict[str, dict[str, Any]] = {
    "addition": {"digits": 1},
    "chain": {"chain_digits": 4, "chain_steps": 2, "chain_filler_max": 3, "chain_tail_max": 2},
    "filler_addition": {"digits": 1, "addition_filler_max": 3, "addition_tail_max": 2},
}
#: The characters of the file tasks' prompts and answers (a character tokenizer over them).
CHARS = "0123456789+= abcdefghijklmnopqrstuvwxyz?()"


def rows_of(dataset: Any) -> list[Problem]:
    return [Problem(r["prompt"], r["answer"], r["solution"]) for r in dataset]


class StubPolicy:
    """A policy whose ``generate`` returns fixed responses after the prompts: what the
    package's ``rollout.generate`` reads of a Hugging Face model."""

    def __init__(self, responses: torch.Tensor) -> None:
        self.responses = responses

    def eval(self) -> StubPolicy:
        return self

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return torch.cat([input_ids, self.responses], dim=1)


def package_rewards(task: Task, tokenizer: Any, problems: list[Problem], completions: list[list[int]]) -> list[float]:
    """The package engine's rewards of these response tokens: its ``rollout.generate`` (the
    responses right-padded as ``generate`` pads after EOS) and ``rollout.rewarded``."""
    width = max(len(c) for c in completions)
    responses = torch.tensor([c + [tokenizer.pad_token_id] * (width - len(c)) for c in completions])
    generated = rollout.generate(
        StubPolicy(responses), tokenizer, problems, max_new_tokens=width, device=torch.device("cpu"), sample=False
    )
    out = rollout.rewarded(task, tokenizer, problems, generated, torch.arange(len(problems)))
    return [float(r) for r in out.rewards]


def trl_call(reward: Any, hf_tokenizer: Any, prompts: list[Any], problems: list[Problem], ids: list[list[int]]) -> Any:
    """The reward function called as TRL calls it, on TRL's decoding of ``ids``."""
    completions = hf_tokenizer.batch_decode(ids, skip_special_tokens=True)
    if not isinstance(prompts[0], str):
        completions = [[{"role": "assistant", "content": c}] for c in completions]
    return reward(
        prompts=prompts,
        completions=completions,
        completion_ids=ids,
        answer=[p.answer for p in problems],
        solution=[p.solution for p in problems],
        trainer_state=None,
        log_extra=None,
        log_metric=None,
    )


def trainer_for(out: Path, model: Any, tokenizer: Any, dataset: Any, reward: Any, **changes: Any) -> CompPOTrainer:
    """A CompPOTrainer of one step with real generation (no rollout_func)."""
    settings = {**EXACT, "arm": "comppo", "max_steps": 1, "per_device_train_batch_size": 8, "num_generations": 2}
    settings.update(max_completion_length=8, tac_width=16, learning_rate=1e-3, temperature=1.0)
    settings.update(changes)
    return CompPOTrainer(
        model=model,
        reward_funcs=reward,
        args=CompPOConfig(output_dir=str(out), **settings),
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def recording(reward: Any, calls: list[dict[str, Any]]) -> Any:
    """``reward`` recording what TRL gave it and what it returned."""

    def recorded(**kwargs: Any) -> list[float]:
        out = reward(**kwargs)
        calls.append({**kwargs, "out": out})
        return out  # type: ignore[no-any-return]

    recorded.__name__ = reward.__name__
    return recorded


# ---------------------------------------------------------------------------------------------------------
# the built-in tasks: datasets, rewards, a TRL step


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_the_datasets_are_the_tasks_splits(name: str) -> None:
    config = TrainConfig(task=name, validation_fraction=0.1, **BUILT_IN[name])
    data = dataset_and_rewards(config, train_size=40, eval_size=20, seed=3)
    task = data.task
    assert task.to_dict() == build_task(config).to_dict()
    assert data.validation is not None
    for ds in (data.train, data.validation, data.heldout):
        assert tuple(ds.column_names) == TASK_COLUMNS
    assert rows_of(data.train) == task.sample(np.random.default_rng(3), 40)  # the package's draws
    assert rows_of(data.validation) == task.validation(20) and rows_of(data.heldout) == task.heldout(20)
    sides = [{p.prompt for p in rows_of(d)} for d in (data.train, data.validation, data.heldout)]
    assert all(sides) and not sides[0] & sides[1] and not sides[0] & sides[2] and not sides[1] & sides[2]
    chat = task_dataset(task, "heldout", 20, chat=True)
    assert [r["prompt"] for r in chat] == [[{"role": "user", "content": p.prompt}] for p in task.heldout(20)]
    # a config's defaults: steps × prompts_per_step train rows drawn with its seed, its eval_size
    small = dataset_and_rewards(name, steps=2, prompts_per_step=5, eval_size=7, seed=4, **BUILT_IN[name])
    assert rows_of(small.train) == small.task.sample(np.random.default_rng(4), 10)
    assert rows_of(small.heldout) == small.task.heldout(7) and small.validation is None
    assert [f.__name__ for f in small.reward_funcs] == [name]
    with pytest.raises(ParameterError, match=r"^n: expected the number of train problems") as info:
        task_problems(task, "train")
    assert info.value.argument == "n"


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_the_reward_function_is_the_packages_verifier(name: str) -> None:
    task = build_task(TrainConfig(task=name, **BUILT_IN[name]))
    tok = task.tokenizer
    assert tok is not None
    hf = CharTokenizer(tok.alphabet).to_hf()  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    base = task.heldout(6) + task.sample(rng, 6)
    budget = task.max_new_tokens
    problems: list[Problem] = []
    ids: list[list[int]] = []
    for p in base:
        demo = task.demonstration(p, rng) if hasattr(task, "demonstration") else p.solution  # type: ignore[attr-defined]
        wrong = demo[:-1] + ("0" if demo[-1] != "0" else "1")
        for text, finished in ((demo, True), (wrong, True), ("", True), ((demo * 4)[:budget], False)):
            problems.append(p)
            ids.append(tok.encode(text) + ([tok.eos_token_id] if finished else []))  # TRL: cut after the EOS
    expected = package_rewards(task, tok, problems, ids)
    assert expected[::4] == [1.0] * len(base) and sum(expected) == len(base)  # right and finished: 1, else 0
    reward = task_reward_function(task)
    assert reward.__name__ == name
    assert trl_call(reward, hf, [p.prompt for p in problems], problems, ids) == expected
    chat_prompts = [[{"role": "user", "content": p.prompt}] for p in problems]
    assert trl_call(reward, hf, chat_prompts, problems, ids) == expected  # chat prompts and completions


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_each_built_in_task_trains_a_step_on_trl(name: str, tmp_path: Path) -> None:
    data = dataset_and_rewards(name, train_size=16, eval_size=8, **BUILT_IN[name])
    task, tok = data.task, data.task.tokenizer
    assert tok is not None
    hf = CharTokenizer(tok.alphabet).to_hf()  # type: ignore[attr-defined]
    calls: list[dict[str, Any]] = []
    model = tiny_llama(tok.vocab_size)
    trainer = trainer_for(tmp_path / "out", model, hf, data.train, recording(data.reward_funcs[0], calls))
    trainer.train()
    logged = trainer.state.log_history[0]
    assert f"rewards/{name}/mean" in logged and "comppo/value_loss" in logged
    assert len(calls) == 1 and len(calls[0]["completions"]) == 8
    call = calls[0]
    problems = [Problem(p, a, s) for p, a, s in zip(call["prompts"], call["answer"], call["solution"])]
    assert {p.prompt for p in problems} <= set(data.train["prompt"])
    assert call["out"] == package_rewards(task, tok, problems, call["completion_ids"])


# ---------------------------------------------------------------------------------------------------------
# comppo_oracle on TRL: the task's pivotal marks on TRL's completions


@pytest.mark.parametrize("name", ["chain", "filler_addition"])
def test_the_oracles_marks_on_trl_are_the_packages(name: str) -> None:
    """The pivotal completion tokens of TRL's rows (dataset columns, completion ids cut at
    EOS by the mask) are the package trainer's oracle columns on the same responses."""
    data = dataset_and_rewards(name, train_size=16, eval_size=8, **BUILT_IN[name])
    task, tok = data.task, data.task.tokenizer
    assert tok is not None and pivotal_task(data.reward_funcs) is task
    hf = CharTokenizer(tok.alphabet).to_hf()  # type: ignore[attr-defined]
    rows = [dict(r) for r in data.train.select(range(6))]
    problems = rows_of(rows)
    # each row's worked solution, and one cut short at the completion length (no EOS, as TRL's
    # max_completion_length cuts it; the marks follow the text)
    completions = [tok.encode(p.solution) + [tok.eos_token_id] for p in problems[:3]]
    width = max(len(c) for c in completions)
    completions += [tok.encode((p.solution * width)[:width]) for p in problems[3:]]
    assert all(len(c) == width for c in completions[3:])
    ids = torch.tensor([c + [tok.pad_token_id] * (width - len(c)) for c in completions])
    mask = torch.tensor([[k < len(c) for k in range(width)] for c in completions])
    marks = pivotal_completion_columns(task, hf, rows, ids, mask)
    generated = rollout.generate(
        StubPolicy(ids), tok, problems, max_new_tokens=width, device=torch.device("cpu"), sample=False
    )
    r = rollout.rewarded(task, tok, problems, generated, torch.arange(len(problems)))
    package = oracle.pivotal_columns(task, tok, r)
    for b in range(len(rows)):
        ours = marks[b][mask[b]].tolist()
        theirs = package[b][r.response_mask[b]].tolist()
        assert ours[: len(theirs)] == theirs and not any(ours[len(theirs) :]), b  # EOS: never pivotal
        assert any(theirs), b  # the marks are not all False: the comparison has something to compare
    with pytest.raises(ParameterError, match="rows") as e:
        pivotal_completion_columns(task, hf, rows[:2], ids, mask)
    assert e.value.argument == "rows"


def test_the_oracles_marks_follow_the_text_each_token_adds_with_a_sentencepiece_tokenizer() -> None:
    """A Metaspace (SentencePiece-style) tokenizer decodes a lone token without its leading
    space: the marks follow the characters each token adds to the decoded response."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, "▁The": 2, "▁answer": 3, "▁is": 4, "▁5": 5}
    tok = Tokenizer(BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")
    ids = [2, 3, 4, 5, 1]
    assert "".join(hf.decode([i]) for i in ids[:4]) != hf.decode(ids[:4])  # the lone tokens lose their spaces

    class FiveIsPivotal:
        def pivotal(self, problem: Problem, response: str) -> list[bool]:
            assert response == "The answer is 5"
            return [c == "5" for c in response]

    rows = [{"prompt": "q", "answer": "5", "solution": ""}]
    marks = pivotal_completion_columns(
        FiveIsPivotal(), hf, rows, torch.tensor([ids]), torch.ones(1, 5, dtype=torch.bool)
    )
    assert marks.tolist() == [[False, False, False, True, False]]  # "▁5" only; EOS never


def test_the_oracle_arm_trains_on_trl_and_needs_a_task_that_marks_pivotal_tokens(tmp_path: Path) -> None:
    data = dataset_and_rewards("chain", train_size=16, eval_size=8, **BUILT_IN["chain"])
    tok = data.task.tokenizer
    assert tok is not None
    hf = CharTokenizer(tok.alphabet).to_hf()  # type: ignore[attr-defined]
    gates: list[torch.Tensor] = []
    trainer = trainer_for(
        tmp_path / "out",
        tiny_llama(tok.vocab_size),
        hf,
        data.train,
        data.reward_funcs,
        arm="comppo_oracle",
        critic_warmup=0,
    )
    score = trainer._score

    def recorded(*args: Any, **kwargs: Any) -> Any:
        batch, stats = score(*args, **kwargs)
        gates.append(batch.gates[batch.response_mask])
        return batch, stats

    trainer._score = recorded  # type: ignore[method-assign]
    trainer.train()
    assert "comppo/value_loss" in trainer.state.log_history[0]
    params = trainer.scoring.gate_params
    (g,) = gates  # the oracle's two values, and both occur
    assert sorted(g.unique().tolist()) == pytest.approx([params.low, params.high])
    addition = dataset_and_rewards("addition", train_size=16, eval_size=8, digits=1)
    with pytest.raises(ParameterError, match="reward_funcs") as e:
        trainer_for(
            tmp_path / "o2", tiny_llama(tok.vocab_size), hf, addition.train, addition.reward_funcs, arm="comppo_oracle"
        )
    assert e.value.argument == "reward_funcs"


# ---------------------------------------------------------------------------------------------------------
# a JSONL file and a saved Hugging Face dataset: tasks on both engines

REWARDS_PY = '''
def exact(completions, answer, prompts, **kwargs):
    """1 when the completion is the answer (after spaces), else 0."""
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]


def length(completions, **kwargs):
    """The completion's length in characters (so a reward tells the text and whether it finished)."""
    return [float(len(c)) for c in completions]
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A model directory (a tiny Llama that stops at EOS about half the time, a character
    tokenizer), and the same 60 rows as a JSONL file and as a saved dataset with a reward
    module and two specs (its ``exact`` and ``length`` rewards)."""
    root = tmp_path_factory.mktemp("files")
    tok = CharTokenizer(CHARS)
    tok.to_hf().save_pretrained(root / "model")
    model = tiny_llama(tok.vocab_size)
    with torch.no_grad():  # EOS's logit follows the digits' embeddings: some completions stop, some run out
        emb = model.model.embed_tokens.weight
        direction = sum(emb[i] / emb[i].norm() for i in tok.encode("0123456789"))
        model.lm_head.weight[tok.eos_token_id] = 2.0 * direction / direction.norm()
    model.save_pretrained(root / "model")
    rng = np.random.default_rng(0)
    pairs = [tuple(int(x) for x in rng.integers(0, 10, size=2)) for _ in range(60)]
    rows = [{"prompt": f"what is {a}+{b}? ({i})", "answer": str(a + b), "id": i} for i, (a, b) in enumerate(pairs)]
    (root / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "sums"))
    (root / "my_rewards.py").write_text(REWARDS_PY)
    (root / "sums.hf.json").write_text(json.dumps({"dataset": "sums", "reward": "my_rewards.py:exact"}))
    (root / "lengths.hf.json").write_text(json.dumps({"dataset": "sums", "reward": "my_rewards.py:length"}))
    paths = {"jsonl": root / "sums.jsonl", "hf": root / "sums.hf.json", "lengths": root / "lengths.hf.json"}
    return {"root": root, "model": root / "model", **paths}


def file_config(files: dict[str, Path], kind: str, out: Path | None = None, **changes: Any) -> TrainConfig:
    settings: dict[str, Any] = {"task": str(files[kind]), "model": str(files["model"]), "validation_fraction": 0.2}
    settings.update(prompts_per_step=4, group_size=2, steps=1, eval_size=4, eval_every=1, max_new_tokens=6)
    settings.update(save_every=0, tac_width=16, progress=False, device="cpu", critic_warmup=0)
    settings.update(out=None if out is None else str(out), **changes)
    return TrainConfig(**settings)


def test_a_saved_dataset_is_split_as_the_jsonl_file(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    hf = build_task(file_config(files, "hf"))
    jsonl = build_task(file_config(files, "jsonl"))
    assert isinstance(hf, HFDatasetTask) and isinstance(jsonl, JsonlTask)
    assert hf.heldout(100) == jsonl.heldout(100) and hf.validation(100) == jsonl.validation(100)
    assert hf.train_rows == jsonl.train_rows
    assert hf.sample(np.random.default_rng(1), 20) == jsonl.sample(np.random.default_rng(1), 20)
    assert hf.to_dict()["reward"] == "my_rewards.py:exact" and hf.describe() == "sums"
    # the dataset directory itself with reward="module:function" is the same task
    monkeypatch.syspath_prepend(str(files["root"]))
    direct = HFDatasetTask(files["root"] / "sums", reward="my_rewards:exact", validation_fraction=0.2)
    assert direct.heldout(100) == hf.heldout(100)
    every = dataset_and_rewards(build_task(file_config(files, "hf", validation_fraction=0.0)), eos_token_ids=2)
    assert isinstance(every.task, HFDatasetTask) and every.validation is None  # n=None: every row of a split
    assert rows_of(every.train) == every.task.train_rows and rows_of(every.heldout) == every.task.heldout_rows
    p = hf.heldout(3)
    assert direct.rewards(p, [q.answer for q in p], [True, True, False]) == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("kind", ["jsonl", "hf"])
def test_a_file_task_trains_on_both_engines(kind: str, files: dict[str, Path], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comppo_core.rl import train
    from comppo_core.rl.models.pretrained import load_tokenizer

    # the package's engine
    summary = train(file_config(files, kind, tmp_path / "package"))
    assert summary["steps"] == 1 and 0.0 <= summary["final_eval_accuracy"] <= 1.0
    # TRL's: the datasets, and the model's EOS ids for the task that takes the model's tokenizer
    config = file_config(files, kind)
    data = dataset_and_rewards(config, train_size=16)
    assert data.task.to_dict() == build_task(config).to_dict()
    assert rows_of(data.heldout) == data.task.heldout(4) and data.validation is not None
    hf = AutoTokenizer.from_pretrained(files["model"])
    assert trl_eos_token_ids(hf, files["model"]) == [2] == sorted(data.reward_funcs[0].eos_token_ids)
    # the same rewards on the same tokens: right and finished, right but cut short, wrong
    tok = load_tokenizer(str(files["model"]))
    problems = data.task.heldout(4) * 3
    ids = [tok.encode(p.answer) + [2] for p in problems[:4]] + [tok.encode(p.answer) for p in problems[4:8]]
    ids += [tok.encode(str(int(p.answer) + 1)) + [2] for p in problems[8:]]
    expected = package_rewards(data.task, tok, problems, ids)
    assert expected == [1.0] * 4 + [0.0] * 8
    assert trl_call(data.reward_funcs[0], hf, [p.prompt for p in problems], problems, ids) == expected
    # a CompPOTrainer step with real generation (the saved dataset: its length reward, which
    # is the text's length when finished, else 0)
    if kind == "hf":
        data = dataset_and_rewards(file_config(files, "lengths"), train_size=16)
    calls: list[dict[str, Any]] = []
    model = AutoModelForCausalLM.from_pretrained(files["model"])
    trainer = trainer_for(tmp_path / "trl", model, hf, data.train, recording(data.reward_funcs[0], calls))
    trainer.train()
    assert f"rewards/{data.task.name}/mean" in trainer.state.log_history[0]
    call = calls[0]
    problems = [Problem(p, a, s) for p, a, s in zip(call["prompts"], call["answer"], call["solution"])]
    assert call["out"] == package_rewards(data.task, tok, problems, call["completion_ids"])
    finished = [2 in ids for ids in call["completion_ids"]]
    assert any(finished) and not all(finished)  # both kinds of completion were scored
    if kind == "hf":
        texts = [hf.decode(ids, skip_special_tokens=True) for ids in call["completion_ids"]]
        assert call["out"] == [float(len(t)) if f else 0.0 for t, f in zip(texts, finished)]


def test_what_a_saved_dataset_task_refuses(files: dict[str, Path], tmp_path: Path) -> None:
    rewards = str(files["root"] / "my_rewards.py")

    def spec(**keys: Any) -> Path:
        path = tmp_path / "t.hf.json"
        path.write_text(json.dumps({"dataset": str(files["root"] / "sums"), "reward": rewards + ":exact", **keys}))
        return path

    for keys, message in [
        ({"reward": "exact"}, "reward: expected 'module:function'"),
        ({"reward": rewards + ":nope"}, "reward: expected a function 'nope'"),
        ({"reward": "no_such_module_here:f"}, "reward: cannot load 'no_such_module_here'"),
        ({"dataset": str(tmp_path / "missing")}, "expected a dataset saved by save_to_disk"),
        ({"prompt_column": "question"}, "expected a column 'question' of prompts"),
        ({"extra": 1}, "expected the keys"),
    ]:
        with pytest.raises(ParameterError, match=message) as info:
            HFDatasetTask(spec(**keys))
        assert info.value.argument == "task"
    dup = tmp_path / "dup"
    datasets.Dataset.from_list([{"prompt": "a", "answer": "1"}, {"prompt": "a", "answer": "2"}]).save_to_disk(str(dup))
    with pytest.raises(ParameterError, match=r"row 1: expected one row per prompt") as info:
        HFDatasetTask(dup, reward=rewards + ":exact")
    assert info.value.row == 1
    with pytest.raises(ParameterError, match=r"expected reward='module:function' with a dataset directory"):
        HFDatasetTask(files["root"] / "sums")
    with pytest.raises(ParameterError, match=r"expected reward in the spec file, got it as an argument too"):
        HFDatasetTask(files["hf"], reward=rewards + ":exact")
    task = build_task(file_config(files, "jsonl"))
    with pytest.raises(ParameterError, match=r"^eos_token_ids: expected the ids that end a response") as info:
        task_reward_function(task)
    assert info.value.argument == "eos_token_ids"


# ---------------------------------------------------------------------------------------------------------
# a reasoning-gym dataset on TRL (rl/tasks/reasoning_gym.py)

#: Printable ASCII and the newline but < and > (no alphabet may spell a special token, <pad>): a character
#: tokenizer that encodes chain_sum's questions.
ASCII = "".join(chr(c) for c in range(32, 127) if chr(c) not in "<>") + "\n"
#: chain_sum at small sizes.
CHAIN_SUM = {"task": "reasoning_gym:chain_sum", "task_options": {"min_terms": 2, "max_terms": 2, "size": 2000}}


@pytest.fixture(scope="module")
def ascii_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama and a character tokenizer of printable ASCII, saved."""
    from conftest import tiny_lm

    path = tmp_path_factory.mktemp("ascii")
    tok = CharTokenizer(ASCII)
    tok.to_hf().save_pretrained(path)
    special = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    tiny_lm(
        "llama", vocab=tok.vocab_size, init=None, special_tokens=False, max_positions=256, **special
    ).save_pretrained(path)
    return path


def test_a_reasoning_gym_dataset_and_its_reward_on_trl(ascii_model: Path, tmp_path: Path) -> None:
    pytest.importorskip("reasoning_gym")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comppo_core.rl.models.pretrained import load_tokenizer
    from comppo_core.rl.tasks.reasoning_gym import ReasoningGymTask

    config = TrainConfig(**CHAIN_SUM, model=str(ascii_model), validation_fraction=0.1, seed=2)
    data = dataset_and_rewards(config, train_size=30, eval_size=12)
    task = data.task
    assert isinstance(task, ReasoningGymTask) and task.to_dict() == build_task(config).to_dict()
    assert data.validation is not None and tuple(data.train.column_names) == TASK_COLUMNS
    assert rows_of(data.train) == task.sample(np.random.default_rng(2), 30)  # the package's draws
    assert rows_of(data.validation) == task.validation(12) and rows_of(data.heldout) == task.heldout(12)
    sides = [{p.prompt for p in rows_of(d)} for d in (data.train, data.validation, data.heldout)]
    assert not sides[0] & sides[1] and not sides[0] & sides[2] and not sides[1] & sides[2]
    by_name = dataset_and_rewards("reasoning_gym:chain_sum", model=str(ascii_model), **{"task_options": {}})
    assert by_name.task.name == "reasoning_gym:chain_sum" and by_name.task.options == {}
    # the reward: the dataset's score_answer on TRL's completions, the package's on the same tokens
    reward = data.reward_funcs[0]
    assert reward.__name__ == "reasoning_gym:chain_sum" and sorted(reward.eos_token_ids) == [2]
    tok, hf = load_tokenizer(str(ascii_model)), AutoTokenizer.from_pretrained(ascii_model)
    problems: list[Problem] = []
    ids: list[list[int]] = []
    for p in task.heldout(4):  # right, wrong, partial (the answer among other text), right but cut short
        for text, finished in ((p.answer, True), ("x", True), (f"{p.answer} or 100000", True), (p.answer, False)):
            problems.append(p)
            ids.append(tok.encode(text) + ([2] if finished else []))
    expected = package_rewards(task, tok, problems, ids)
    partial = [task._generator("train").score_answer(f"{p.answer} or 100000", task.entry(p)) for p in problems[::4]]
    assert expected[0::4] == [1.0] * 4 and expected[1::4] == [0.0] * 4 and expected[3::4] == [0.0] * 4
    assert expected[2::4] == [float(np.float32(s)) for s in partial] and all(0.0 < s < 1.0 for s in partial)
    on_trl = trl_call(reward, hf, [p.prompt for p in problems], problems, ids)  # float64 there, float32 in a rollout
    assert on_trl[2::4] == partial and [float(np.float32(r)) for r in on_trl] == expected
    chat = [[{"role": "user", "content": p.prompt}] for p in problems]
    assert trl_call(reward, hf, chat, problems, ids) == on_trl
    # a CompPOTrainer step with real generation: its rewards are the package's on TRL's completions
    calls: list[dict[str, Any]] = []
    model = AutoModelForCausalLM.from_pretrained(ascii_model)
    trainer = trainer_for(tmp_path / "trl", model, hf, data.train, recording(reward, calls))
    trainer.train()
    assert "rewards/reasoning_gym:chain_sum/mean" in trainer.state.log_history[0]
    call = calls[0]
    drawn = [Problem(p, a, s) for p, a, s in zip(call["prompts"], call["answer"], call["solution"])]
    assert [float(np.float32(r)) for r in call["out"]] == package_rewards(task, tok, drawn, call["completion_ids"])
