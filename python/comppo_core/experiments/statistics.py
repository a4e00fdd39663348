"""The statistics of ``comppo-core compare``: Student's t intervals over seeds, paired.

Every interval is over seeds: a quantity is computed per seed (an accuracy, a paired
difference of two arms of the same seed, an interaction contrast), then
:func:`mean_ci` gives its mean and the half-width ``t_{(1+level)/2, n−1} · s / √n`` of
the ``level`` confidence interval (Student's t, ``s`` the sample standard deviation over
the ``n`` seeds; :func:`t_quantile` inverts :func:`t_cdf`, the regularised incomplete beta
function evaluated by its continued fraction).

**Paired differences.** Two arms of one seed start from the same warm start and see the
same prompts, so their difference is taken per seed before averaging::

    d(s) = acc(a, s) − acc(b, s),    d̄ ± t_{(1+level)/2, n−1} · s_d / √n

over the ``n`` seeds both ran (:func:`paired`), ``s_d`` the sample standard deviation of
the ``d(s)``: the between-seed spread of the warm start, common to both arms, cancels.

**Interaction.** The paper's 2×2 is {standard critic, TAC} × {fixed gate, concentration
gates}: ``ppo_fixed`` (standard, fixed), ``comp_gae`` (standard, concentration),
``tac_fixed`` (TAC, fixed), ``comppo`` (TAC, concentration). :func:`interaction` is the
difference-in-differences, per seed ``s``::

    I(s) = (acc(comppo, s) − acc(tac_fixed, s)) − (acc(comp_gae, s) − acc(ppo_fixed, s))

(how much more the concentration gates give with TAC than with a standard critic), with
the t-interval of its mean over the seeds all four arms ran.

**Contrasts.** :data:`CONTRASTS` names the paired differences ``acc(a, s) − acc(b, s)``
that answer the design's questions (does a critic help, do well-placed gates help, does
the gate's alignment or its direction matter); :func:`contrasts` gives each whose two arms
ran, with its interval, and :func:`reading` words an interval by what it allows:
``"a > b"`` or ``"a < b"`` when it excludes 0, ``"no difference detected (within ±x)"``
when it holds 0, ``x`` the larger of its ends in absolute value (so an effect bigger
than ``x`` points is ruled out at that level), and ``"one seed: no interval"`` without one.

**Critic fit.** :func:`window_means`: the mean of a per-step metric (the critic's
explained variance) over a run's first and last ``k`` steps.

Imports only the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CONTRASTS",
    "INTERACTION",
    "contrasts",
    "interaction",
    "mean_ci",
    "paired",
    "reading",
    "t_cdf",
    "t_quantile",
    "window_means",
]

#: The 2×2's cells in the order of the interaction ``(a − b) − (c − d)``: TAC with
#: concentration gates, TAC with a fixed gate, a standard critic with concentration gates,
#: a standard critic with a fixed gate.
INTERACTION = ("comppo", "tac_fixed", "comp_gae", "ppo_fixed")

#: The named paired differences ``(a, b, question)``: ``acc(a) − acc(b)`` answers ``question``.
CONTRASTS: tuple[tuple[str, str, str], ...] = (
    ("ppo", "grpo", "does a learned critic beat the group baseline"),
    ("ppo_fixed", "ppo", "does a constant gate (a discount) change plain GAE"),
    ("comp_gae", "ppo_fixed", "concentration gates vs a constant gate, standard critic"),
    ("comppo", "tac_fixed", "concentration gates vs a constant gate, TAC"),
    ("tac_fixed", "ppo_fixed", "TAC vs a standard critic, constant gate"),
    ("comppo", "comppo_shuffle", "the gates' placement within a response"),
    ("comppo", "comppo_position", "the gates beyond their per-position mean"),
    ("comppo_inverted", "comppo", "the gate mapping's direction"),
    ("comppo", "comppo_policy_entropy", "concentration gates vs the policy's entropy as the gate (GACA's signal)"),
    ("comppo", "comppo_token_nll", "concentration gates vs the token's NLL as the gate"),
    ("comppo_oracle", "tac_fixed", "gates high on the pivotal tokens vs a constant gate (diagnostic)"),
    ("comppo", "grpo", "CompPO vs GRPO"),
)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function: ``P(T ≤ t) = 1 − ½·I_{df/(df+t²)}(df/2, ½)`` for ``t ≥ 0``."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``t_cdf`` inverted by
    bisection to double precision); ``t_quantile(0.975, 2) = 4.3027``."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile: expected 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi)


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float | None]:
    """``(mean, half-width)`` of the ``level`` confidence interval of the mean of ``values``
    ``x_1 … x_n``::

        x̄ = (1/n) Σ x_i,    s = √( Σ (x_i − x̄)² / (n − 1) ),    half = t_{(1+level)/2, n−1} · s / √n

    (Student's t, :func:`t_quantile`); the half-width is None for a single value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci: expected at least one value, got none")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    s = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile(0.5 + level / 2.0, n - 1) * s / math.sqrt(n)


def interaction(final: dict[str, dict[int, float]], level: float = 0.95) -> dict[str, Any] | None:
    """The 2×2 interaction (module docstring) of the final accuracies ``final[arm][seed]``,
    or None unless every arm of :data:`INTERACTION` is in ``final`` with a seed in common.

    Returns ``{"arms": INTERACTION, "seeds": [...], "per_seed": [I(s), ...], "mean": m,
    "ci": half}`` (``half`` None for one seed; the interval is ``m ± half``)."""
    if not all(arm in final for arm in INTERACTION):
        return None
    a, b, c, d = (final[arm] for arm in INTERACTION)
    seeds = sorted(set(a) & set(b) & set(c) & set(d))
    if not seeds:
        return None
    per_seed = [(a[s] - b[s]) - (c[s] - d[s]) for s in seeds]
    mean, half = mean_ci(per_seed, level)
    return {"arms": list(INTERACTION), "seeds": seeds, "per_seed": per_seed, "mean": mean, "ci": half}


def contrasts(final: dict[str, dict[int, float]], level: float = 0.95) -> list[dict[str, Any]]:
    """Each of :data:`CONTRASTS` whose two arms are in ``final`` (``final[arm][seed]``) with a
    seed in common, in that order: ``{"a", "b", "question", "seeds", "per_seed", "mean",
    "ci"}`` (``ci`` the half-width, None for one seed)."""
    result = []
    for a, b, question in CONTRASTS:
        if a in final and b in final and (diff := paired(final[a], final[b], level)) is not None:
            result.append({"a": a, "b": b, "question": question, **diff})
    return result


def paired(a: dict[int, float], b: dict[int, float], level: float = 0.95) -> dict[str, Any] | None:
    """The paired difference ``d(s) = a[s] − b[s]`` over the seeds both have, with the
    interval of its mean (module docstring, :func:`mean_ci` of the ``d(s)``): ``{"seeds",
    "per_seed", "mean", "ci"}`` (``ci`` the half-width of :func:`mean_ci`, None for one
    seed), or None without a seed in common."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    per_seed = [a[s] - b[s] for s in seeds]
    mean, half = mean_ci(per_seed, level)
    return {"seeds": seeds, "per_seed": per_seed, "mean": mean, "ci": half}


def reading(a: str, b: str, mean: float, half: float | None) -> str:
    """What the interval ``mean ± half`` of ``acc(a) − acc(b)`` (fractions) allows, in words
    (module docstring); points with one decimal."""
    if half is None:
        return "one seed: no interval"
    lo, hi = mean - half, mean + half
    if lo > 0:
        return f"{a} > {b}"
    if hi < 0:
        return f"{a} < {b}"
    bound = round(100 * max(abs(lo), abs(hi)), 1)
    return f"no difference detected (within ±{bound:.1f})"


def window_means(values: Sequence[float | None], k: int = 10) -> tuple[float | None, float | None]:
    """The means of the first ``k`` and of the last ``k`` of ``values`` (one per step, in
    step order), each over its non-None entries (None when it has none); with fewer than
    ``2k`` values the two windows overlap."""
    if k < 1:
        raise ValueError(f"window_means: expected k >= 1, got {k}")

    def mean(window: Sequence[float | None]) -> float | None:
        vs = [float(v) for v in window if v is not None]
        return math.fsum(vs) / len(vs) if vs else None

    return mean(values[:k]), mean(values[-k:])
