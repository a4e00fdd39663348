"""pass@k by the unbiased estimator of Chen et al. (2021), exactly; torch-free.

``n`` responses are sampled per problem and ``c`` of them pass (a response passes when
the verifier's reward is at least :data:`PASS_REWARD`, full marks: every built-in
task rewards 0 or 1). The chance that at least one of ``k`` responses drawn without
replacement from the ``n`` passes is, per problem::

    pass@k(n, c) = 1 − C(n − c, k) / C(n, k)          (1 ≤ k ≤ n; C(m, k) = 0 for m < k)

an unbiased estimate of the model's pass@k on that problem; a task's pass@k is its mean
over the problems. :func:`pass_at_k` computes it with integer binomials and
:class:`fractions.Fraction` (no rounding until the final ``float``), and
:func:`task_summary` averages the exact fractions over the problems. Worked cases:
``n = 4, c = 1, k = 2``: ``1 − C(3, 2)/C(4, 2) = 1 − 3/6 = 1/2``; ``c = 0`` gives 0 and
``c = n`` gives 1 for every ``k``; ``k = n`` gives 1 as soon as ``c ≥ 1``; ``k = 1`` gives
``c / n``.

:func:`pass_ks` gives the ``k`` reported for ``n`` samples (1, 2, 4, … up to ``n``), and
:func:`macro` the unweighted mean of several tasks' numbers (each task counts once,
whatever its number of problems). ``comppo-core evaluate --samples N``
(:mod:`comppo_core.commands.evaluate`) reports them, through the held-out evaluation of
:mod:`comppo_core.rl.engine.evaluation`, which is why this module sits in ``rl`` (below
``experiments``); :mod:`comppo_core.experiments.pass_at_k` is its public name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from ...errors import ParameterError

__all__ = ["PASS_REWARD", "macro", "pass_at_k", "pass_at_k_exact", "pass_ks", "passed", "task_summary"]

#: A response passes when its reward is at least this (the verifier's full marks).
PASS_REWARD = 1.0


def passed(reward: float) -> bool:
    """Whether a response with this verifier reward passes (``reward >= PASS_REWARD``)."""
    return reward >= PASS_REWARD


def _count(name: str, value: object, low: int, high: int | None = None, what: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ParameterError(f"{name}: expected an integer {bound}{what}, got {value!r}", argument=name)
    return value


def pass_at_k_exact(n: int, c: int, k: int) -> Fraction:
    """``1 − C(n − c, k) / C(n, k)`` as an exact fraction (module docstring). ``n`` ≥ 1
    samples, ``c`` of them passing (``0 ≤ c ≤ n``), ``1 ≤ k ≤ n``; anything else is a
    :class:`~comppo_core.errors.ParameterError` naming ``n``, ``c`` or ``k``."""
    _count("n", n, 1)
    _count("c", c, 0, n, " (the passing samples of n)")
    _count("k", k, 1, n, " (at most the samples n)")
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem, ``1 − C(n − c, k) / C(n, k)``, computed exactly
    (:func:`pass_at_k_exact`) and rounded once to a float."""
    return float(pass_at_k_exact(n, c, k))


def pass_ks(n: int) -> tuple[int, ...]:
    """The ``k`` reported for ``n`` samples per problem: the powers of two up to ``n``
    (``pass_ks(6) == (1, 2, 4)``, ``pass_ks(8) == (1, 2, 4, 8)``)."""
    _count("n", n, 1)
    return tuple(1 << i for i in range(n.bit_length()))


def task_summary(n: int, correct: Sequence[int]) -> dict[str, float]:
    """``{"pass@k": …}`` for every ``k`` of :func:`pass_ks` ``(n)``: the mean over the
    problems of :func:`pass_at_k_exact` ``(n, c, k)``, ``correct`` holding each problem's
    ``c`` (averaged exactly, then rounded once). No problems is a
    :class:`~comppo_core.errors.ParameterError` naming ``correct``."""
    if not correct:
        raise ParameterError(
            "correct: expected the passing samples of at least one problem, got none", argument="correct"
        )
    ks = pass_ks(n)
    return {f"pass@{k}": float(sum(pass_at_k_exact(n, c, k) for c in correct) / len(correct)) for k in ks}


def macro(tasks: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The unweighted mean over ``tasks`` of every number all of them report (the keys
    of the first task, in its order, that every task has)."""
    if not tasks:
        raise ParameterError("tasks: expected at least one task's numbers, got none", argument="tasks")
    keys = [key for key in tasks[0] if all(key in t for t in tasks)]
    return {key: math.fsum(t[key] for t in tasks) / len(tasks) for key in keys}
