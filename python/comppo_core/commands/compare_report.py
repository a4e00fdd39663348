"""The results of ``comppo-core compare``: the tables of ``results.md`` and the curves.

* :func:`results_table`: per arm the final accuracy (mean and 95% CI over seeds) and the
  paired differences to the warm start and to each of :data:`REFERENCES` compared;
* :func:`interaction_line`: the 2×2 interaction and its paired CI
  (:func:`comppo_core.commands.compare_stats.interaction`);
* :func:`explained_variance_table`: the critic's explained variance over the first and
  the last steps of the runs, per arm (``—`` for an arm without a critic);
* :func:`tuning_tables`: with ``--grid``, the chosen setting and "k/n stable" per arm,
  and every point's validation score (:mod:`comppo_core.commands.tuning`);
* :func:`plot_curves`: ``curves.png``.

Numbers are fractions in the dicts and percent (one decimal) in the tables.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .compare_stats import mean_ci
from .grid import Grid
from .tuning import COLLAPSE_MARGIN, Outcome, collapsed, score, stability

__all__ = [
    "REFERENCES",
    "ci_cell",
    "collapse_rule",
    "explained_variance_table",
    "interaction_line",
    "pct",
    "plot_curves",
    "results_table",
    "tuning_tables",
]

#: The arms the paired differences are taken against (when they are compared).
REFERENCES = ("grpo", "comppo")


def pct(x: float, signed: bool = False) -> str:
    v = round(100 * x, 1) + 0.0  # + 0.0: no "-0.0"
    return f"{v:+.1f}" if signed else f"{v:.1f}"


def ci_cell(mean: float, half: float | None, signed: bool = False) -> str:
    if half is None:
        return "—"
    return f"[{pct(mean - half, signed)}, {pct(mean + half, signed)}]"


def results_table(final: dict[str, dict[int, float]], warm: dict[int, float]) -> tuple[str, dict[str, Any]]:
    """The markdown table of final accuracies (``final[arm][seed]``, fractions) and paired
    differences to the warm start (``warm[seed]``) and to each of :data:`REFERENCES` that
    is an arm here; also the numbers as a dict (fractions)."""
    refs = [r for r in REFERENCES if r in final]
    header = ["arm", "seeds", "accuracy %", "95% CI", "vs warm start", "95% CI"]
    for r in refs:
        header += [f"vs {r}", "95% CI"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    numbers: dict[str, Any] = {}
    for arm, by_seed in final.items():
        seeds = sorted(by_seed)
        accs = [by_seed[s] for s in seeds]
        m, h = mean_ci(accs)
        dm, dh = mean_ci([by_seed[s] - warm[s] for s in seeds])
        row = [arm, str(len(seeds)), pct(m), ci_cell(m, h), pct(dm, True), ci_cell(dm, dh, True)]
        entry: dict[str, Any] = {"seeds": seeds, "accuracy": accs, "mean": m, "ci": h, "vs_warm_start": [dm, dh]}
        for r in refs:
            common = [s for s in seeds if s in final[r]]
            if r == arm or not common:
                row += ["—", "—"]
                continue
            rm, rh = mean_ci([by_seed[s] - final[r][s] for s in common])
            row += [pct(rm, True), ci_cell(rm, rh, True)]
            entry[f"vs_{r}"] = [rm, rh]
        lines.append("| " + " | ".join(row) + " |")
        numbers[arm] = entry
    return "\n".join(lines) + "\n", numbers


def plot_curves(
    curves: dict[str, dict[int, list[tuple[int, float]]]], warm: dict[int, float], path: Path, title: str
) -> None:
    """``curves[arm][seed]`` = ``[(step, accuracy), …]`` as a PNG (matplotlib, Agg) with two
    panels: the held-out accuracy per arm, mean over seeds and 95% CI band (t-distribution),
    the warm start's mean dashed; and the paired gain over the seed's warm start,
    ``acc(step) − acc(step 0)``, mean and CI band (between-seed spread of the warm start,
    which dominates the first panel's bands, cancels there)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.0, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax_acc, ax_gain = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for arm, by_seed in curves.items():
        runs = {s: dict(c) for s, c in by_seed.items()}
        steps = sorted(set.intersection(*(set(r) for r in runs.values())))
        color = None
        for ax, shift in ((ax_acc, False), (ax_gain, True)):
            stats = [mean_ci([r[st] - (r[steps[0]] if shift else 0.0) for r in runs.values()]) for st in steps]
            mean = [100 * m for m, _ in stats]
            (line,) = ax.plot(steps, mean, marker="o", markersize=3, label=arm, color=color)
            color = line.get_color()
            if all(h is not None for _, h in stats):  # clipped to what an accuracy (or a gain) can be
                floor, ceiling = (-100.0, 100.0) if shift else (0.0, 100.0)
                lo = [max(floor, 100 * (m - (h or 0.0))) for m, h in stats]
                hi = [min(ceiling, 100 * (m + (h or 0.0))) for m, h in stats]
                ax.fill_between(steps, lo, hi, color=color, alpha=0.10, linewidth=0)
    if warm:
        mean_warm = 100 * math.fsum(warm.values()) / len(warm)
        ax_acc.axhline(mean_warm, color="0.4", linestyle="--", linewidth=1, label="warm start")
    ax_gain.axhline(0.0, color="0.4", linestyle="--", linewidth=1)
    ax_acc.set_ylabel("held-out greedy accuracy (%)")
    ax_gain.set_ylabel("gain over the warm start (points, paired)")
    for ax in (ax_acc, ax_gain):
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
    ax_acc.legend(fontsize=8, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)  # a reader never sees half a PNG


def interaction_line(inter: dict[str, Any] | None) -> str:
    """The interaction (a dict of :func:`~comppo_core.commands.compare_stats.interaction`) as
    one markdown paragraph, or "" for None."""
    if inter is None:
        return ""
    a, b, c, d = inter["arms"]
    n = len(inter["seeds"])
    return (
        f"Interaction (critic × gates), paired per seed: ({a} − {b}) − ({c} − {d}) = "
        f"{pct(inter['mean'], True)} points, 95% CI {ci_cell(inter['mean'], inter['ci'], True)} "
        f"({n} seed{'s' if n != 1 else ''}; per seed: {', '.join(pct(v, True) for v in inter['per_seed'])}).\n"
    )


def explained_variance_table(ev: dict[str, tuple[float | None, float | None] | None], window: int) -> str:
    """``ev[arm]`` = (mean over seeds of the critic's explained variance over the first
    ``window`` steps, the same over the last ``window``), None for an arm without a critic."""

    def cell(x: float | None) -> str:
        return "—" if x is None else f"{x:.3f}"

    lines = [
        f"| arm | explained variance, first {window} steps | last {window} steps |",
        "|---|---|---|",
    ]
    for arm, pair in ev.items():
        first, last = pair if pair is not None else (None, None)
        lines.append(f"| {arm} | {cell(first)} | {cell(last)} |")
    return "\n".join(lines) + "\n"


def tuning_tables(
    grid: Grid, outcomes: dict[str, list[list[Outcome]]], chosen: dict[str, int], seeds: Sequence[int]
) -> tuple[str, dict[str, Any]]:
    """The tuning's markdown (the chosen setting and "k/n stable" per arm, then every
    point's validation score per arm, ``*`` on the chosen) and its numbers.

    ``outcomes[arm][point][k]`` is the run of tuning seed ``seeds[k]`` at that point."""
    points = grid.points
    lines = [
        "| arm | chosen | setting | validation accuracy % | stable |",
        "|---|---|---|---|---|",
    ]
    numbers: dict[str, Any] = {}
    for arm, by_point in outcomes.items():
        i = chosen[arm]
        k, n = stability(by_point)
        lines.append(f"| {arm} | {grid.name(i)} | {grid.describe(points[i])} | {pct(score(by_point[i]))} | {k}/{n} |")
        numbers[arm] = {
            "chosen": grid.name(i),
            "setting": points[i],
            "stable": [k, n],
            "scores": {grid.name(j): score(o) for j, o in enumerate(by_point)},
            "runs": {
                grid.name(j): {str(s): o.to_dict() for s, o in zip(seeds, by_o)} for j, by_o in enumerate(by_point)
            },
        }
    arms = list(outcomes)
    lines += [
        "",
        "Validation accuracy % per point (mean over the tuning seeds; collapsed runs in parentheses; * chosen):",
        "",
        "| point | setting | " + " | ".join(arms) + " |",
        "|---|---|" + "---|" * len(arms),
    ]
    for j, point in enumerate(points):
        cells = []
        for arm in arms:
            o = outcomes[arm][j]
            down = sum(collapsed(x) for x in o)
            cells.append(pct(score(o)) + (f" ({down} collapsed)" if down else "") + (" *" if chosen[arm] == j else ""))
        lines.append(f"| {grid.name(j)} | {grid.describe(point)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", numbers


def collapse_rule() -> str:
    """The collapse criterion in words (results.md, results.json)."""
    return (
        "a tuning run collapses when it stops on a non-finite loss or gradient, or when its final validation "
        f"accuracy is below its step-0 (warm start) validation accuracy by more than {100 * COLLAPSE_MARGIN:g} points"
    )
