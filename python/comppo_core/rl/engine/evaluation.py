"""Held-out accuracy: greedy responses to a task's evaluation problems, scored by its verifier.

One computation for :meth:`comppo_core.rl.Trainer.evaluate` and ``comppo-core evaluate``
(:mod:`comppo_core.commands.evaluate`)::

    task = build_task(config)                        # the run's task, as the trainer builds it
    problems = task.heldout(config.eval_size)        # the fixed evaluation set
    accuracy = heldout_accuracy(actor, tokenizer, task, problems,
                                max_new_tokens=config.max_new_tokens or task.max_new_tokens,
                                device=device)

:func:`heldout_scores` generates greedily (:func:`comppo_core.rl.engine.rollout.generate` with
``sample=False``) with the prompts left-padded to the widest prompt of the whole
evaluation set (``width``; a rank scoring its share passes the set's width, so every
rank's layout is the one-process layout), decodes each response up to its first EOS and
returns the verifier's scores (:meth:`task.scores`); :func:`heldout_accuracy` is their mean.

:func:`build_task` and :func:`describe_task` import no torch, so a command builds the task
(and reports a bad task file or split) before it loads a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import TASKS, TrainConfig
from ..tasks.addition import AdditionTask, Problem
from ..tasks.chain import ChainTask
from ..tasks.filler_addition import FillerAdditionTask
from ..tasks.jsonl import JsonlTask

__all__ = ["build_task", "describe_task", "heldout_accuracy", "heldout_scores"]


def build_task(config: TrainConfig) -> Any:
    """The task of ``config``, as :func:`comppo_core.rl.engine.build.make_task` builds it: the
    built-in addition task (``digits``, ``split_seed``, ``heldout_fraction``,
    ``validation_fraction``), the built-in chain task (``chain_digits``, ``chain_steps``,
    ``chain_filler_min``, ``chain_filler_max``, ``chain_tail_min``, ``chain_tail_max`` and the
    same split settings), the built-in addition between fillers (``digits``,
    ``addition_filler_min``, ``addition_filler_max``, ``addition_tail_min``,
    ``addition_tail_max`` and the split settings) or the JSONL file ``task`` (the split settings and
    ``max_new_tokens``). Imports no torch."""
    if config.task == "chain":
        return ChainTask(
            config.chain_digits,
            config.chain_steps,
            filler_min=config.chain_filler_min,
            filler_max=config.chain_filler_max,
            tail_min=config.chain_tail_min,
            tail_max=config.chain_tail_max,
            split_seed=config.split_seed,
            heldout_fraction=config.heldout_fraction,
            validation_fraction=config.validation_fraction,
        )
    if config.task == "filler_addition":
        return FillerAdditionTask(
            config.digits,
            filler_min=config.addition_filler_min,
            filler_max=config.addition_filler_max,
            tail_min=config.addition_tail_min,
            tail_max=config.addition_tail_max,
            split_seed=config.split_seed,
            heldout_fraction=config.heldout_fraction,
            validation_fraction=config.validation_fraction,
        )
    if config.task in TASKS:
        return AdditionTask(
            config.digits,
            split_seed=config.split_seed,
            heldout_fraction=config.heldout_fraction,
            validation_fraction=config.validation_fraction,
        )
    return JsonlTask(
        config.task,
        split_seed=config.split_seed,
        heldout_fraction=config.heldout_fraction,
        max_new_tokens=config.max_new_tokens,
        validation_fraction=config.validation_fraction,
    )


def describe_task(task: Any) -> str:
    """A few words for ``task``: ``"2-digit addition"``, ``"chain recall (8 digits, filler
    20-40, 8 steps)"``, ``"2-digit addition between fillers (0-16, tail 0-16)"``, or the
    JSONL file's name."""
    if isinstance(task, FillerAdditionTask):
        return (
            f"{task.digits}-digit addition between fillers ({task.filler_min}-{task.filler_max}, "
            f"tail {task.tail_min}-{task.tail_max})"
        )
    if isinstance(task, AdditionTask):
        return f"{task.digits}-digit addition"
    if isinstance(task, ChainTask):
        return f"chain recall ({task.digits} digits, filler {task.filler_min}-{task.filler_max}, {task.steps} steps)"
    if isinstance(task, JsonlTask):
        return Path(task.path).name
    return str(getattr(task, "name", type(task).__name__))


def heldout_scores(
    actor: Any,
    tokenizer: Any,
    task: Any,
    problems: Sequence[Problem],
    *,
    max_new_tokens: int,
    device: Any,
    width: int | None = None,
) -> list[float]:
    """The verifier's score of ``actor``'s greedy response to each of ``problems``, in one
    batch (module docstring). ``width``: the prompts' padded width (default: the widest
    prompt of ``problems``); ``device``: where ``actor`` is (a ``torch.device``)."""
    from . import rollout

    if not problems:
        return []
    if width is None:
        width = rollout.prompt_width(tokenizer, problems)
    ids, _, width, in_response = rollout.generate(
        actor, tokenizer, problems, max_new_tokens=max_new_tokens, device=device, sample=False, width=width
    )
    texts, finished = rollout.decode(tokenizer, ids, width, in_response)
    return [float(s) for s in task.scores(problems, texts, finished.tolist())]


def heldout_accuracy(
    actor: Any, tokenizer: Any, task: Any, problems: Sequence[Problem], *, max_new_tokens: int, device: Any
) -> float:
    """The mean of :func:`heldout_scores` over ``problems`` (held-out greedy accuracy)."""
    scores = heldout_scores(actor, tokenizer, task, problems, max_new_tokens=max_new_tokens, device=device)
    return sum(scores) / len(scores) if scores else 0.0
