"""Held-out evaluation: a task's evaluation problems answered by a frozen policy and rewarded by its verifier.

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
``batch_size`` bounds the rows of one ``generate`` call (default: the whole set at once,
as the trainer does); the layout, and so each row's tokens, is the same whatever the
batches (up to the float rounding of batched kernels).

**Frozen evaluation** (``comppo-core evaluate``): :func:`task_evaluation` gives one task's
:class:`TaskEvaluation`: the greedy rewards above and, with a :class:`Sampling`, pass@k by the unbiased
estimator (:mod:`comppo_core.rl.engine.pass_at_k`) from ``samples`` responses per
problem drawn by :func:`sampled_passes`. Each draw is keyed, as the trainer's rollouts
are (:mod:`comppo_core.rl.engine.sampling`), by::

    row_keys(seed, crc32(task.name), [(problem index, sample index)])

so the samples are a function of the seed, the task, the problem's place in the
evaluation set and the sample's index: the same for any ``batch_size``, whichever other
tasks are evaluated beside it, and for the first problems of a larger ``eval_size``.
Nothing here is drawn from torch's RNG. Importing this module imports no torch.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Sequence
from typing import Any

from ...errors import ParameterError
from ..tasks.base import Problem, Task
from .pass_at_k import passed, task_summary

__all__ = [
    "Sampling",
    "TaskEvaluation",
    "check_batch_size",
    "heldout_accuracy",
    "heldout_rewards",
    "sampled_passes",
    "sampling_stream",
    "task_evaluation",
]


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How ``comppo-core evaluate --samples`` draws: ``samples`` responses per problem at
    ``temperature`` and ``top_p``, keyed by ``seed`` (module docstring). A bad value is a
    :class:`~comppo_core.errors.ParameterError` naming the field."""

    samples: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("samples", "seed"):
            value, low = getattr(self, name), 1 if name == "samples" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ParameterError(f"{name}: expected an integer >= {low}, got {value!r}", argument=name)
        for name, high in (("temperature", math.inf), ("top_p", 1.0)):
            value = getattr(self, name)
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and 0.0 < value <= high
            if not ok or not math.isfinite(value):
                shown = "(0.0, inf)" if high == math.inf else "(0.0, 1.0]"
                raise ParameterError(f"{name}: expected a number in {shown}, got {value!r}", argument=name)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_batch_size(batch_size: Any) -> int:
    """``batch_size`` if it is an integer ≥ 1, else a :class:`~comppo_core.errors.ParameterError`
    naming ``batch_size``."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ParameterError(f"batch_size: expected an integer >= 1, got {batch_size!r}", argument="batch_size")
    return batch_size


def sampling_stream(task: Task) -> int:
    """The ``step`` word of the sample keys of ``task``: ``crc32(task.name)`` (module docstring)."""
    return zlib.crc32(task.name.encode("utf-8"))


def _chunks(n: int, batch_size: int | None) -> list[range]:
    size = n if batch_size is None else check_batch_size(batch_size)
    return [range(start, min(start + size, n)) for start in range(0, n, size)]


def heldout_rewards(
    actor: Any,
    tokenizer: Any,
    task: Task,
    problems: Sequence[Problem],
    *,
    max_new_tokens: int,
    device: Any,
    width: int | None = None,
    batch_size: int | None = None,
) -> list[float]:
    """The verifier's reward of ``actor``'s greedy response to each of ``problems`` (module
    docstring). ``width``: the prompts' padded width (default: the widest prompt of
    ``problems``); ``batch_size``: rows per ``generate`` call (default: all in one);
    ``device``: where ``actor`` is (a ``torch.device``)."""
    from . import rollout

    if not problems:
        return []
    if width is None:
        width = rollout.prompt_width(tokenizer, problems)
    out: list[float] = []
    for rows in _chunks(len(problems), batch_size):
        batch = [problems[i] for i in rows]
        ids, _, width, in_response = rollout.generate(
            actor, tokenizer, batch, max_new_tokens=max_new_tokens, device=device, sample=False, width=width
        )
        texts, finished = rollout.decode(tokenizer, ids, width, in_response)
        out += [float(r) for r in task.rewards(batch, texts, finished.tolist())]
    return out


def heldout_accuracy(
    actor: Any, tokenizer: Any, task: Task, problems: Sequence[Problem], *, max_new_tokens: int, device: Any
) -> float:
    """The mean of :func:`heldout_rewards` over ``problems`` (held-out greedy accuracy)."""
    rewards = heldout_rewards(actor, tokenizer, task, problems, max_new_tokens=max_new_tokens, device=device)
    return sum(rewards) / len(rewards) if rewards else 0.0


def sampled_passes(
    actor: Any,
    tokenizer: Any,
    task: Task,
    problems: Sequence[Problem],
    sampling: Sampling,
    *,
    max_new_tokens: int,
    device: Any,
    batch_size: int,
    width: int | None = None,
) -> list[int]:
    """How many of ``sampling.samples`` keyed draws (module docstring) pass the verifier
    (:func:`~comppo_core.rl.engine.pass_at_k.passed`), per problem: the ``c`` of the
    pass@k estimator. The ``len(problems) · samples`` rows, problem by problem, are
    generated ``batch_size`` at a time, at the prompts' common ``width`` (default: the
    widest prompt of ``problems``)."""
    from . import rollout
    from .sampling import row_keys

    if not problems:
        return []
    if width is None:
        width = rollout.prompt_width(tokenizer, problems)
    rows = [(i, j) for i in range(len(problems)) for j in range(sampling.samples)]
    stream = sampling_stream(task)
    counts = [0] * len(problems)
    for chunk in _chunks(len(rows), batch_size):
        keyed = [rows[r] for r in chunk]
        batch = [problems[i] for i, _ in keyed]
        ids, _, width, in_response = rollout.generate(
            actor, tokenizer, batch, max_new_tokens=max_new_tokens, device=device, sample=True,
            temperature=sampling.temperature, top_p=sampling.top_p, keys=row_keys(sampling.seed, stream, keyed),
            width=width,
        )  # fmt: skip
        texts, finished = rollout.decode(tokenizer, ids, width, in_response)
        for (i, _), reward in zip(keyed, task.rewards(batch, texts, finished.tolist())):
            counts[i] += passed(float(reward))
    return counts


@dataclasses.dataclass(frozen=True)
class TaskEvaluation:
    """One task's frozen evaluation (:func:`task_evaluation`).

    Attributes:
      rewards: the verifier's reward of the greedy response to each problem.
      sampling: how the samples were drawn (None: greedy only).
      correct: with ``sampling``, how many of the ``sampling.samples`` responses to each
        problem passed (the ``c`` of the pass@k estimator); else None.
    """

    rewards: list[float]
    sampling: Sampling | None = None
    correct: list[int] | None = None

    @property
    def problems(self) -> int:
        return len(self.rewards)

    @property
    def reward_sum(self) -> float:
        """The greedy rewards summed, as :meth:`~comppo_core.rl.Trainer.evaluate` sums them."""
        return float(sum(self.rewards))

    def numbers(self) -> dict[str, float]:
        """``accuracy`` (the mean greedy reward: the trainer's ``eval_accuracy``),
        ``greedy_pass@1`` (the share of greedy responses that pass; ``accuracy`` itself for
        a 0/1 verifier) and, with ``sampling``, ``pass@k`` for every ``k`` of
        :func:`~comppo_core.rl.engine.pass_at_k.pass_ks` ``(samples)``: the numbers
        :func:`~comppo_core.rl.engine.pass_at_k.macro` averages over tasks."""
        greedy = [passed(r) for r in self.rewards]
        out = {"accuracy": self.reward_sum / self.problems, "greedy_pass@1": sum(greedy) / len(greedy)}
        if self.sampling is not None and self.correct is not None:
            out.update(task_summary(self.sampling.samples, self.correct))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The task's entry of ``comppo-core evaluate --json``'s ``tasks``: ``problems``,
        ``greedy_correct`` (1 or 0 per problem: whether its greedy response passed), and
        with ``sampling`` ``n`` (samples per problem) and ``correct`` (passing samples per
        problem), then :meth:`numbers`."""
        out: dict[str, Any] = {"problems": self.problems, "greedy_correct": [int(passed(r)) for r in self.rewards]}
        if self.sampling is not None and self.correct is not None:
            out.update(n=self.sampling.samples, correct=list(self.correct))
        return {**out, **self.numbers()}


def task_evaluation(
    actor: Any,
    tokenizer: Any,
    task: Task,
    problems: Sequence[Problem],
    *,
    max_new_tokens: int,
    device: Any,
    batch_size: int,
    sampling: Sampling | None = None,
) -> TaskEvaluation:
    """One task's frozen evaluation on ``problems`` (at least one): the greedy rewards
    (:func:`heldout_rewards`) and, with ``sampling``, each problem's passing samples
    (:func:`sampled_passes`), both ``batch_size`` rows per ``generate`` call."""
    if not problems:
        raise ParameterError("problems: expected at least one problem to evaluate, got none", argument="problems")
    check_batch_size(batch_size)
    kw: dict[str, Any] = {"max_new_tokens": max_new_tokens, "device": device, "batch_size": batch_size}
    rewards = heldout_rewards(actor, tokenizer, task, problems, **kw)
    if sampling is None:
        return TaskEvaluation(rewards)
    return TaskEvaluation(rewards, sampling, sampled_passes(actor, tokenizer, task, problems, sampling, **kw))
