"""The package's tasks on TRL: a ``datasets.Dataset`` per split and a reward function with TRL's signature.

A registered task (:mod:`comppo_core.rl.tasks`: ``addition``, ``chain``, ``filler_addition``,
a ``.jsonl`` file, a ``.hf.json`` saved Hugging Face dataset, a reasoning-gym dataset
``reasoning_gym:NAME``) trains under :class:`~comppo_core.integrations.trl.CompPOTrainer`
(or ``trl.GRPOTrainer``) unchanged::

    data = dataset_and_rewards("addition", digits=2, train_size=4096, eval_size=256)
    trainer = CompPOTrainer(model=..., reward_funcs=data.reward_funcs, train_dataset=data.train,
                            eval_dataset=data.heldout, processing_class=data.task.tokenizer.to_hf(), args=...)

    data = dataset_and_rewards("reasoning_gym:chain_sum", model=MODEL, chat_template=True,
                               task_options={"min_terms": 2, "max_terms": 3}, train_size=2048)
    trainer = CompPOTrainer(model=MODEL, reward_funcs=data.reward_funcs, train_dataset=data.train, ...)

A reasoning-gym task's rows are its generator's questions (with the answer format's
instruction) on each side of its split, and its reward function is the dataset's
``score_answer`` on the extracted answer (0 for a completion cut short; partial scores
pass through: :mod:`comppo_core.rl.tasks.reasoning_gym`). The task keeps the entry of each
question it drew, which the verifier reads: give TRL the reward functions of the same
:class:`TaskData` as its dataset (each process builds both, as each process runs the script).

**Datasets** (:func:`task_dataset`): one row per problem with the columns ``prompt`` (the
problem's prompt text, or with ``chat=True`` one user message holding it), ``answer`` and
``solution`` (the :class:`~comppo_core.rl.tasks.base.Problem`'s fields, what the verifier
reads). The train split is ``task.sample(np.random.default_rng(seed), n)`` (drawn with
replacement from the training side, as the package's trainer draws its prompts), the
validation and held-out splits are ``task.validation(n)`` and ``task.heldout(n)``, the very
lists the package evaluates on; so the three never meet.

**Rewards** (:func:`task_reward_function`): TRL calls ``reward(prompts=, completions=,
completion_ids=, answer=, solution=, trainer_state=, ...)``; the function returns
``task.rewards(problems, texts, finished)``, the package's verifier, where

* ``problems`` are rebuilt from the prompt text and the ``answer`` / ``solution`` columns;
* ``texts`` are TRL's completions (decoded with ``skip_special_tokens=True``; a chat
  completion's text is its last message's content);
* ``finished[i]`` (the response **stopped at EOS**) is whether ``completion_ids[i]`` holds
  an EOS id. TRL cuts every completion after its first EOS, so this is "its last token is
  EOS", TRL's own test of a truncated completion (``mask_truncated_completions``). The EOS
  ids are the task tokenizer's EOS, or those given (a task with the user's model:
  :func:`trl_eos_token_ids`, TRL's set: the tokenizer's EOS and the model's
  ``generation_config.eos_token_id``).

On the package's engine the text is the response decoded up to its first EOS with the
special tokens skipped and ``finished`` is whether it holds an EOS: the same text and flag
for the same tokens, so the same reward (tested).

Importing this module imports ``datasets`` only when a dataset is built.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ...errors import ParameterError
from ...rl.tasks.base import Problem, Side, Task

if TYPE_CHECKING:
    from datasets import Dataset

    from ...rl.config import TrainConfig

__all__ = [
    "TASK_COLUMNS",
    "TaskData",
    "TaskReward",
    "dataset_and_rewards",
    "pivotal_completion_columns",
    "pivotal_task",
    "task_dataset",
    "task_problems",
    "task_reward_function",
    "trl_eos_token_ids",
]

#: The columns of a task's dataset.
TASK_COLUMNS = ("prompt", "answer", "solution")


def task_problems(task: Task, split: Side = "train", n: int | None = None, *, seed: int = 0) -> list[Problem]:
    """The problems of ``split``: ``task.sample(np.random.default_rng(seed), n)`` for ``"train"``,
    ``task.validation(n)`` and ``task.heldout(n)`` for the others.

    ``n=None``: every row of the split of a task that lists its rows (a JSONL or saved
    dataset task's ``train_rows``, ``validation_rows``, ``heldout_rows``; the train rows in
    their file order); a task whose problems are drawn (the built-in ones) needs ``n``."""
    if split not in ("train", "validation", "heldout"):
        raise ParameterError(f"split: expected train, validation or heldout, got {split!r}", argument="split")
    if n is None:
        rows = getattr(task, f"{split}_rows", None)
        if not isinstance(rows, list):
            raise ParameterError(
                f"n: expected the number of {split} problems of the {task.name} task (its problems are drawn, not "
                "listed), got None",
                argument="n",
            )
        if split == "train":
            return list(rows)
        n = max(len(rows), 1)  # a task without a validation split refuses even one row, naming validation_fraction
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ParameterError(f"n: expected a positive integer, got {n!r}", argument="n")
    if split == "train":
        return task.sample(np.random.default_rng(seed), n)
    return task.validation(n) if split == "validation" else task.heldout(n)


def task_dataset(
    task: Task, split: Side = "train", n: int | None = None, *, seed: int = 0, chat: bool = False
) -> Dataset:
    """The problems of :func:`task_problems` as a ``datasets.Dataset`` with the columns
    :data:`TASK_COLUMNS` (``prompt`` a one-message conversation with ``chat``)."""
    from datasets import Dataset

    problems = task_problems(task, split, n, seed=seed)
    prompts: list[Any] = [[{"role": "user", "content": p.prompt}] if chat else p.prompt for p in problems]
    return Dataset.from_dict(
        {"prompt": prompts, "answer": [p.answer for p in problems], "solution": [p.solution for p in problems]}
    )


def _eos_ids(task: Task, eos_token_ids: int | Iterable[int] | None) -> frozenset[int]:
    if eos_token_ids is None:
        if task.tokenizer is None:
            raise ParameterError(
                f"eos_token_ids: expected the ids that end a response for the {task.name} task, which takes the "
                "model's tokenizer (trl_eos_token_ids(tokenizer, model)), got None",
                argument="eos_token_ids",
            )
        return frozenset({int(task.tokenizer.eos_token_id)})
    ids = [eos_token_ids] if isinstance(eos_token_ids, (int, np.integer)) else list(eos_token_ids)
    if not ids or any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in ids):
        raise ParameterError(
            f"eos_token_ids: expected a token id or a non-empty list of them, got {eos_token_ids!r}",
            argument="eos_token_ids",
        )
    return frozenset(int(i) for i in ids)


def _text(completion: Any) -> str:
    """A completion's text: the string, or a chat completion's last message's content."""
    if isinstance(completion, str):
        return completion
    message = completion[-1] if isinstance(completion, list) and completion else completion
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):  # content parts
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if not isinstance(content, str):
        raise ParameterError(
            f"completions: expected text or chat messages with text content, got {completion!r}",
            argument="completions",
        )
    return content


def _prompt_text(prompt: Any) -> str:
    """A prompt's text: the string, or a conversation's last user message's content."""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"] if isinstance(prompt, list) else []
    if not users or not isinstance(users[-1].get("content"), str):
        raise ParameterError(
            f"prompts: expected a prompt text or a conversation with a user message, got {prompt!r}", argument="prompts"
        )
    return str(users[-1]["content"])


class TaskReward:
    """A task's verifier as a TRL reward function (module docstring); ``__name__`` is the
    task's name, so TRL logs ``rewards/<name>/mean``. Made by :func:`task_reward_function`."""

    def __init__(self, task: Task, eos_token_ids: int | Iterable[int] | None = None) -> None:
        self.task = task
        #: the ids that end a response (a completion holding one stopped at EOS)
        self.eos_token_ids = _eos_ids(task, eos_token_ids)
        self.__name__ = task.name

    def finished(self, completion_ids: Sequence[Sequence[int]]) -> list[bool]:
        """Whether each completion stopped at EOS: it holds an EOS id (module docstring)."""
        return [any(int(t) in self.eos_token_ids for t in ids) for ids in completion_ids]

    def __call__(
        self,
        completions: Sequence[Any],
        prompts: Sequence[Any] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
        answer: Sequence[str] | None = None,
        solution: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """The verifier's reward of each completion (TRL's reward-function signature)."""
        for name, value in (("prompts", prompts), ("completion_ids", completion_ids), ("answer", answer)):
            if value is None:
                raise ParameterError(
                    f"{name}: expected TRL's {name} (a dataset of task_dataset's columns), got None", argument=name
                )
        assert prompts is not None and completion_ids is not None and answer is not None
        n = len(completions)
        if not len(prompts) == len(completion_ids) == len(answer) == n:
            raise ParameterError(
                f"completions: expected one prompt, answer and completion_ids per completion ({n}), got "
                f"{len(prompts)}, {len(answer)} and {len(completion_ids)}",
                argument="completions",
            )
        solutions = [""] * n if solution is None else solution
        problems = [Problem(_prompt_text(p), str(a), str(s)) for p, a, s in zip(prompts, answer, solutions)]
        texts = [_text(c) for c in completions]
        return self.task.rewards(problems, texts, self.finished(completion_ids))

    def __repr__(self) -> str:
        return f"TaskReward({self.task.describe()!r}, eos_token_ids={sorted(self.eos_token_ids)})"


def pivotal_task(reward_funcs: Any) -> Task | None:
    """The task of the first :class:`TaskReward` in ``reward_funcs`` (one, or a list) whose
    task marks its pivotal tokens (a ``pivotal(problem, response)`` method), else None: what
    the ``comppo_oracle`` arm reads on TRL."""
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    for fn in funcs:
        if isinstance(fn, TaskReward) and callable(getattr(fn.task, "pivotal", None)):
            return fn.task
    return None


def pivotal_completion_columns(
    task: Task,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    completion_ids: Any,
    completion_mask: Any,
) -> Any:
    """``[B, C]`` bool: which completion tokens ``task`` marks pivotal, for TRL's rows.

    Row b is the dataset row ``rows[b]`` (:func:`task_dataset`'s columns: prompt, answer,
    solution) and its completion ``completion_ids[b]`` (``[B, C]``, the tokens
    ``completion_mask[b]`` keeps). The problem is rebuilt from the columns as
    :class:`TaskReward` does; the response is the completion decoded without special tokens
    (the text the reward functions read), and the marks are
    :func:`comppo_core.rl.core.oracle.pivotal_columns`' (a token is pivotal when any of its
    characters is; EOS never is), so the oracle's gates are the package trainer's on the
    same response."""
    import torch

    from ...rl.core.oracle import pivotal_columns

    ids = torch.as_tensor(completion_ids)
    mask = torch.as_tensor(completion_mask).bool()
    if len(rows) != ids.shape[0]:
        raise ParameterError(
            f"rows: expected one dataset row per completion ({ids.shape[0]}), got {len(rows)}", argument="rows"
        )
    problems = [
        Problem(_prompt_text(r["prompt"]), str(r.get("answer", "")), str(r.get("solution", "") or "")) for r in rows
    ]
    responses = [
        tokenizer.decode([int(t) for t in ids[b][mask[b]]], skip_special_tokens=True) for b in range(ids.shape[0])
    ]
    # pivotal_columns reads columns j of ids [B, T] whose token is ids[:, j+1]: a one-token
    # prompt in front of the completion makes the completion's columns 0 … C−1
    rollout = _Rollout(
        input_ids=torch.cat([ids.new_zeros(ids.shape[0], 1), ids], dim=1),
        response_mask=mask,
        problems=problems,
        responses=responses,
    )
    return pivotal_columns(task, tokenizer, rollout)


class _Rollout(NamedTuple):
    """What :func:`~comppo_core.rl.core.oracle.pivotal_columns` reads of a rollout."""

    input_ids: Any
    response_mask: Any
    problems: list[Problem]
    responses: list[str]


def task_reward_function(task: Task, eos_token_ids: int | Iterable[int] | None = None) -> TaskReward:
    """``task``'s verifier as a TRL reward function (:class:`TaskReward`). ``eos_token_ids``:
    the ids that end a response (None: the task tokenizer's EOS; a task with the user's
    model needs them: :func:`trl_eos_token_ids`)."""
    return TaskReward(task, eos_token_ids)


def trl_eos_token_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """The ids TRL's generation stops at (``GRPOTrainer.eos_token_ids``): the tokenizer's EOS
    and the model's ``generation_config.eos_token_id`` (a model, or a local model directory
    whose ``generation_config.json`` is read; None: the tokenizer's alone)."""
    ids: list[int] = []
    if model is not None:
        config = getattr(model, "generation_config", None)
        if config is None:
            from transformers import GenerationConfig

            try:
                config = GenerationConfig.from_pretrained(str(model))
            except OSError:  # a directory without generation_config.json
                config = None
        eos = None if config is None else config.eos_token_id
        ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids = [int(tokenizer.eos_token_id), *ids]
    return ids


class TaskData(NamedTuple):
    """What :func:`dataset_and_rewards` returns: the task, its three datasets (validation
    None without a validation split) and the reward functions for ``reward_funcs=``."""

    task: Task
    train: Dataset
    validation: Dataset | None
    heldout: Dataset
    reward_funcs: list[TaskReward]


def dataset_and_rewards(
    task: Task | TrainConfig | str,
    *,
    train_size: int | None = None,
    eval_size: int | None = None,
    seed: int | None = None,
    chat: bool | None = None,
    eos_token_ids: int | Iterable[int] | None = None,
    **settings: Any,
) -> TaskData:
    """The datasets and the reward function of a task, ready for ``CompPOTrainer``.

    ``task``: a built task, a :class:`~comppo_core.rl.config.TrainConfig`, or its ``task``
    (a registered name or a file) with other TrainConfig fields in ``settings``
    (``dataset_and_rewards("chain", chain_digits=4)``, ``dataset_and_rewards("reasoning_gym:chain_sum",
    model=DIR, task_options={"min_terms": 2})``). With a config the defaults are
    its: ``train_size = steps · prompts_per_step``, ``eval_size``, ``seed``,
    ``chat = chat_template``, and for a task on the user's model (``config.model``) TRL's
    EOS ids of that model (:func:`trl_eos_token_ids`). A built task: ``seed`` 0, no chat,
    and the sizes as :func:`task_problems` takes them (None: every row of a file task)."""
    from ...rl.config import TrainConfig
    from ...rl.tasks import build_task

    if isinstance(task, str):
        task = TrainConfig(task=task, **settings)
    elif settings:
        raise ParameterError(
            f"settings: expected TrainConfig fields only with a task name, got {sorted(settings)}", argument="settings"
        )
    if isinstance(task, TrainConfig):
        config = task
        built = build_task(config)
        train_size = config.steps * config.prompts_per_step if train_size is None else train_size
        eval_size = config.eval_size if eval_size is None else eval_size
        seed = config.seed if seed is None else seed
        chat = config.chat_template if chat is None else chat
        if eos_token_ids is None and built.tokenizer is None and config.model is not None:
            from pathlib import Path

            from ...rl.models.pretrained import load_tokenizer

            # the package's loader reads a model directory's tokenizer or a GGUF file's own; a GGUF
            # file holds no generation_config.json, so its tokenizer's EOS is the one there is
            directory = config.model if Path(config.model).is_dir() else None
            eos_token_ids = trl_eos_token_ids(load_tokenizer(config.model), directory)
    else:
        built = task
    seed, chat = (0 if seed is None else seed), bool(chat)
    try:
        validation: Dataset | None = task_dataset(built, "validation", eval_size, chat=chat)
    except ParameterError as exc:
        if exc.argument != "validation_fraction":
            raise
        validation = None
    return TaskData(
        built,
        task_dataset(built, "train", train_size, seed=seed, chat=chat),
        validation,
        task_dataset(built, "heldout", eval_size, chat=chat),
        [task_reward_function(built, eos_token_ids)],
    )
