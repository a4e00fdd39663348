"""Held-out accuracy: greedy responses to a task's evaluation problems, rewarded by its verifier.

One computation for :meth:`comppo_core.rl.Trainer.evaluate` and ``comppo-core evaluate``
(:mod:`comppo_core.commands.evaluate`)::

    task = build_task(config)                        # the run's task (comppo_core.rl.tasks)
    problems = task.heldout(config.eval_size)        # the fixed evaluation set
    accuracy = heldout_accuracy(actor, tokenizer, task, problems,
                                max_new_tokens=config.max_new_tokens or task.max_new_tokens,
                                device=device)

:func:`heldout_rewards` generates greedily (:func:`comppo_core.rl.engine.rollout.generate` with
``sample=False``) with the prompts left-padded to the widest prompt of the whole
evaluation set (``width``; a rank evaluating its share passes the set's width, so every
rank's layout is the one-process layout), decodes each response up to its first EOS and
returns the verifier's rewards (``task.rewards``); :func:`heldout_accuracy` is their mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..tasks.base import Problem, Task

__all__ = ["heldout_accuracy", "heldout_rewards"]


def heldout_rewards(
    actor: Any,
    tokenizer: Any,
    task: Task,
    problems: Sequence[Problem],
    *,
    max_new_tokens: int,
    device: Any,
    width: int | None = None,
) -> list[float]:
    """The verifier's reward of ``actor``'s greedy response to each of ``problems``, in one
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
    return [float(r) for r in task.rewards(problems, texts, finished.tolist())]


def heldout_accuracy(
    actor: Any, tokenizer: Any, task: Task, problems: Sequence[Problem], *, max_new_tokens: int, device: Any
) -> float:
    """The mean of :func:`heldout_rewards` over ``problems`` (held-out greedy accuracy)."""
    rewards = heldout_rewards(actor, tokenizer, task, problems, max_new_tokens=max_new_tokens, device=device)
    return sum(rewards) / len(rewards) if rewards else 0.0
