"""The tuning protocol of ``comppo-core compare --grid``: seeds, the choice, stability.

Every arm gets the same budget: it runs every point of the grid
(:mod:`comppo_core.experiments.grid`) on the same **tuning seeds**, evaluated on the
**validation split** (``eval_split="validation"``), and its setting is chosen from those
runs alone; then it runs the **reporting seeds** at its chosen setting, evaluated on the
held-out split, which no choice has seen.

* **Seeds.** Tuning seeds are ``1000, 1001, …`` (:func:`tuning_seeds`;
  ``--tuning-seeds 2`` is 1000 and 1001), reporting seeds ``0 … n−1`` (``--seeds``,
  :data:`DEFAULT_REPORTING_SEEDS` with a grid): disjoint while ``n ≤ 1000``.
* **Splits.** The validation split is :data:`DEFAULT_VALIDATION_FRACTION` of the problems
  unless ``--validation-fraction`` says otherwise (0 is refused: the protocol needs one);
  it is disjoint from the held-out split and excluded from training, in both phases.
* **Collapse** (fixed in advance): a tuning run *collapses* when it stopped on a
  non-finite loss or gradient, or when its final validation accuracy is below its
  step-0 validation accuracy (the warm start's) by more than :data:`COLLAPSE_MARGIN`
  (5 points): :func:`collapsed`. An arm is reported "k/n stable": k runs of its n =
  points × tuning seeds did not collapse (:func:`stability`).
* **The choice** (:func:`choose`): per point, the *objective* (:func:`objective`) is the
  mean over the tuning seeds of the final validation accuracy, a run stopped by a
  non-finite value counting 0::

      J(point) = (1/K) · Σ_k acc_val(point, 1000 + k)     (0 for a non-finite stop)

  The highest objective wins; ties go to the point with more stable runs, then to the
  earlier point in the grid's order (``p0`` first: the values as given, the last field
  varying fastest). Exact equality is a tie. ("Score" in this package is the scoring
  forward pass, :func:`comppo_core.rl.core.step.score`; the tuning's number is the objective.)

Imports only the standard library.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "COLLAPSE_MARGIN",
    "DEFAULT_REPORTING_SEEDS",
    "DEFAULT_TUNING_SEEDS",
    "DEFAULT_VALIDATION_FRACTION",
    "FIRST_TUNING_SEED",
    "Outcome",
    "choose",
    "collapsed",
    "objective",
    "stability",
    "tuning_seeds",
]

#: The first tuning seed; tuning seeds are ``FIRST_TUNING_SEED + k``.
FIRST_TUNING_SEED = 1000
#: Tuning seeds per point when ``--tuning-seeds`` is not given.
DEFAULT_TUNING_SEEDS = 2
#: Reporting seeds with ``--grid`` when ``--seeds`` is not given.
DEFAULT_REPORTING_SEEDS = 5
#: ``validation_fraction`` with ``--grid`` when ``--validation-fraction`` is not given.
DEFAULT_VALIDATION_FRACTION = 0.1
#: A run collapses when its final validation accuracy is below its step-0 accuracy by more than this.
COLLAPSE_MARGIN = 0.05
_EPS = 1e-12  # "more than": a drop of exactly the margin (up to float rounding) is no collapse


def tuning_seeds(n: int) -> list[int]:
    """The ``n`` tuning seeds, ``FIRST_TUNING_SEED … FIRST_TUNING_SEED + n − 1``."""
    return [FIRST_TUNING_SEED + k for k in range(n)]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A tuning run's result: its step-0 and final validation accuracy, or the message of
    the non-finite value that stopped it (then both accuracies may be None)."""

    initial: float | None
    final: float | None
    nonfinite: str | None = None

    def __post_init__(self) -> None:
        if self.nonfinite is None and (self.initial is None or self.final is None):
            raise ValueError("Outcome: a run that finished needs its initial and final accuracy")

    def to_dict(self) -> dict[str, Any]:
        return {"initial": self.initial, "final": self.final, "nonfinite": self.nonfinite, "collapsed": collapsed(self)}


def collapsed(outcome: Outcome, margin: float = COLLAPSE_MARGIN) -> bool:
    """Whether a tuning run collapsed: a non-finite stop, or ``initial − final > margin``
    (a drop of exactly the margin, up to float rounding, is none)."""
    if outcome.nonfinite is not None:
        return True
    assert outcome.initial is not None and outcome.final is not None
    return outcome.initial - outcome.final > margin + _EPS


def objective(outcomes: Sequence[Outcome]) -> float:
    """A point's tuning objective for an arm: the mean final validation accuracy over its
    tuning seeds, ``(1/K) · Σ_k final_k``, a non-finite stop counting 0."""
    if not outcomes:
        raise ValueError("objective: expected the outcomes of at least one tuning run, got none")
    return math.fsum(0.0 if o.nonfinite is not None else float(o.final or 0.0) for o in outcomes) / len(outcomes)


def stability(by_point: Sequence[Sequence[Outcome]]) -> tuple[int, int]:
    """``(k, n)``: the runs over the whole grid (every point, every tuning seed) that did
    not collapse, and all of them."""
    runs = [o for outcomes in by_point for o in outcomes]
    return sum(not collapsed(o) for o in runs), len(runs)


def choose(by_point: Sequence[Sequence[Outcome]]) -> int:
    """The index of the chosen point (module docstring): the highest :func:`objective`;
    ties to more stable runs, then to the earliest point: the argmax of
    ``(objective, stable runs, −index)``."""
    if not by_point:
        raise ValueError("choose: expected at least one point, got none")
    keys = [(objective(o), sum(not collapsed(x) for x in o), -i) for i, o in enumerate(by_point)]
    return -max(keys)[2]
