"""Rank statistics of a per-token score against a per-token target, with intervals by a cluster bootstrap.

``comppo-core diagnose`` (:mod:`comppo_core.experiments.diagnose`) asks how well a
per-token score (the concentration, the position, the policy's entropy, ...) ranks the
tokens that decide the outcome. Three rank statistics answer it, all invariant to any
increasing transform of the score:

* :func:`average_ranks`: the 1-based ranks of ``x``, ties given the mean of the ranks they
  span (``[5, 1, 5] → [2.5, 1, 2.5]``).
* :func:`auc`: the Mann–Whitney AUC of a score for positives over negatives::

      AUC = P(s⁺ > s⁻) + ½ P(s⁺ = s⁻) = (R⁺ − n⁺(n⁺ + 1)/2) / (n⁺ n⁻)

  ``R⁺`` the sum of the positives' average ranks among all ``n⁺ + n⁻`` scores. 1: every
  positive scores above every negative; 0.5: no better than chance; 0: inverted. None when
  either class is empty.
* :func:`spearman`: Spearman's ρ, the Pearson correlation of the two average-rank vectors
  (ties averaged, so it is the tie-corrected ρ); None when either vector is constant.

:func:`cluster_bootstrap` resamples whole clusters (a response's tokens are not
independent; the cluster is the response) with replacement, ``resamples`` times from a
seeded generator, recomputes a statistic on the tokens of the drawn clusters and returns
the percentile interval ``[q_{(1−level)/2}, q_{(1+level)/2}]`` of the resampled values
that are defined (a resample with one class empty gives no AUC and is left out; the count
left out is returned).

The plain references (:func:`auc_reference`: the mean over all positive–negative pairs;
:func:`spearman_reference`: ``1 − 6Σd²/(n(n²−1))`` when there are no ties, else Pearson of
ranks computed by counting) are what the tests pin the vectorised forms to. NumPy only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import ParameterError, ShapeError

__all__ = [
    "Interval",
    "auc",
    "auc_reference",
    "average_ranks",
    "cluster_bootstrap",
    "spearman",
    "spearman_reference",
]


def _vector(name: str, x: object) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ShapeError(f"{name}: expected a 1-D array, got shape {list(a.shape)}", argument=name)
    bad = np.flatnonzero(~np.isfinite(a))
    if bad.size:
        raise ParameterError(f"{name}: expected finite numbers, got {a[bad[0]]} at index {int(bad[0])}", argument=name)
    return a


def average_ranks(x: Sequence[float] | np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` (float64), each tie group given the mean of the ranks it spans."""
    a = _vector("x", x)
    n = a.size
    order = np.argsort(a, kind="mergesort")
    xs = a[order]
    new = np.ones(n, dtype=bool)
    new[1:] = xs[1:] != xs[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n)  # exclusive
    group = np.cumsum(new) - 1
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = ((starts + ends - 1) / 2.0 + 1.0)[group]
    return ranks


def auc(scores: Sequence[float] | np.ndarray, positive: Sequence[bool] | np.ndarray) -> float | None:
    """Mann–Whitney ``P(s⁺ > s⁻) + ½ P(s⁺ = s⁻)`` (module docstring); None when a class is empty."""
    s = _vector("scores", scores)
    p = np.asarray(positive, dtype=bool)
    if p.shape != s.shape:
        raise ShapeError(
            f"positive: expected one flag per score ({s.size}), got shape {list(p.shape)}", argument="positive"
        )
    n1 = int(p.sum())
    n0 = s.size - n1
    if n1 == 0 or n0 == 0:
        return None
    r = average_ranks(s)
    return float((r[p].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float | None:
    """Spearman's ρ with ties averaged (module docstring); None when ``x`` or ``y`` is constant."""
    a = _vector("x", x)
    b = _vector("y", y)
    if a.shape != b.shape:
        raise ShapeError(f"y: expected the shape of x, {list(a.shape)}, got {list(b.shape)}", argument="y")
    if a.size < 2:
        return None
    ra = average_ranks(a) - (a.size + 1) / 2.0
    rb = average_ranks(b) - (b.size + 1) / 2.0
    den = math.sqrt(float((ra * ra).sum()) * float((rb * rb).sum()))
    if den == 0.0:
        return None
    return float((ra * rb).sum() / den)


def auc_reference(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """The AUC as the mean over all positive–negative pairs of ``1[s⁺ > s⁻] + ½ 1[s⁺ = s⁻]``."""
    pos = [float(s) for s, f in zip(scores, positive) if f]
    neg = [float(s) for s, f in zip(scores, positive) if not f]
    if not pos or not neg:
        return None
    total = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return total / (len(pos) * len(neg))


def spearman_reference(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's ρ by counting: rank of ``v`` = 1 + #{smaller} + ½ #{equal others}; then
    ``1 − 6Σd²/(n(n²−1))`` without ties, else the Pearson correlation of the ranks."""
    n = len(x)

    def ranks(v: Sequence[float]) -> list[float]:
        return [1.0 + sum(w < u for w in v) + 0.5 * (sum(w == u for w in v) - 1) for u in v]

    rx, ry = ranks(x), ranks(y)
    if n < 2:
        return None
    if len(set(x)) == n and len(set(y)) == n:
        return 1.0 - 6.0 * sum((a - b) ** 2 for a, b in zip(rx, ry)) / (n * (n * n - 1))
    mx, my = sum(rx) / n, sum(ry) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0.0 or syy == 0.0:
        return None
    return sxy / math.sqrt(sxx * syy)


@dataclasses.dataclass(frozen=True)
class Interval:
    """A statistic on the whole sample and its bootstrap percentile interval.

    Attributes:
      estimate: the statistic on all tokens (None when undefined there).
      low, high: the interval's ends (None when fewer than 2 resamples were defined).
      level: the interval's level (0.95).
      resamples: resamples drawn; ``undefined``: of those, how many gave no value.
    """

    estimate: float | None
    low: float | None
    high: float | None
    level: float
    resamples: int
    undefined: int

    def covers(self, value: float) -> bool | None:
        """Whether ``[low, high]`` holds ``value`` (None without an interval)."""
        if self.low is None or self.high is None:
            return None
        return self.low <= value <= self.high

    def to_dict(self) -> dict[str, float | int | None]:
        return dataclasses.asdict(self)


def cluster_bootstrap(
    statistic: Callable[[np.ndarray], float | None],
    clusters: Sequence[np.ndarray],
    *,
    resamples: int,
    rng: np.random.Generator,
    level: float = 0.95,
) -> Interval:
    """``statistic`` of the token indices of all ``clusters`` and its percentile interval over
    ``resamples`` draws of ``len(clusters)`` clusters with replacement (module docstring).

    ``clusters``: one integer array of token indices per cluster (a response's tokens);
    ``statistic(indices) -> float | None`` reads the tokens at ``indices`` (with repeats)."""
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 0:
        raise ParameterError(f"resamples: expected an integer >= 0, got {resamples!r}", argument="resamples")
    if not 0.0 < level < 1.0:
        raise ParameterError(f"level: expected a number in (0, 1), got {level!r}", argument="level")
    parts = [np.asarray(c, dtype=np.int64) for c in clusters]
    everything = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    estimate = statistic(everything) if everything.size else None
    values: list[float] = []
    undefined = 0
    for _ in range(resamples if parts else 0):
        drawn = rng.integers(0, len(parts), size=len(parts))
        value = statistic(np.concatenate([parts[i] for i in drawn]))
        if value is None or not math.isfinite(value):
            undefined += 1
        else:
            values.append(value)
    if len(values) < 2:
        return Interval(estimate, None, None, level, resamples, undefined)
    lo, hi = np.quantile(np.asarray(values), [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return Interval(estimate, float(lo), float(hi), level, resamples, undefined)
