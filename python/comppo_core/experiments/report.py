"""The results of ``comppo-core compare``: the tables of ``results.md`` and the curves.

* :func:`results_table`: per arm the final accuracy (mean and 95% CI over seeds) and the
  paired differences to the warm start and to each of :data:`REFERENCES` compared;
* :func:`interaction_line`: the 2×2 interaction and its paired CI
  (:func:`comppo_core.experiments.statistics.interaction`);
* :func:`contrasts_table`: the named paired differences
  (:data:`~comppo_core.experiments.statistics.CONTRASTS`) with their intervals and what
  the intervals allow (:func:`~comppo_core.experiments.statistics.reading`);
* :func:`explained_variance_table`: the critic's explained variance over the first and
  the last steps of the runs, per arm (``—`` for an arm without a critic);
* :func:`tuning_tables`: with ``--grid``, the chosen setting and "k/n stable" per arm,
  and every point's tuning objective, the mean validation accuracy
  (:func:`comppo_core.experiments.tuning.objective`; ``scores`` in ``results.json``);
* :func:`plot_curves`: ``curves.png``;
* :func:`write_results`: ``results.md``, ``results.json`` and ``curves.png`` of a compare's
  runs (the summaries, and each run's ``metrics.jsonl`` for :func:`explained_variance`).

Numbers are fractions in the dicts and percent (one decimal) in the tables.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..rl.config import TrainConfig
from ..rl.core.arms import ARMS
from ..rl.runs import run_dir
from .grid import Grid
from .statistics import contrasts, interaction, mean_ci, paired, reading, window_means
from .tuning import COLLAPSE_MARGIN, Outcome, collapsed, objective, stability

__all__ = [
    "EV_WINDOW",
    "REFERENCES",
    "Timing",
    "Tuning",
    "ci_cell",
    "collapse_rule",
    "contrasts_table",
    "eval_size",
    "explained_variance",
    "explained_variance_table",
    "interaction_line",
    "pct",
    "plot_curves",
    "results_table",
    "tuning_tables",
    "write_results",
]

#: The arms the paired differences are taken against (when they are compared).
REFERENCES = ("grpo", "comppo")

#: Steps at each end of a run over which the critic's explained variance is averaged.
EV_WINDOW = 10


def pct(x: float, signed: bool = False) -> str:
    """A fraction as percent with one decimal (``0.4567`` → ``"45.7"``; ``signed``: ``"+45.7"``)."""
    v = round(100 * x, 1) + 0.0  # + 0.0: no "-0.0"
    return f"{v:+.1f}" if signed else f"{v:.1f}"


def ci_cell(mean: float, half: float | None, signed: bool = False) -> str:
    """The interval ``[mean − half, mean + half]`` in percent (``"[40.1, 49.9]"``); ``—`` without one."""
    if half is None:
        return "—"
    return f"[{pct(mean - half, signed)}, {pct(mean + half, signed)}]"


def results_table(final: dict[str, dict[int, float]], warm: dict[int, float]) -> tuple[str, dict[str, Any]]:
    """The markdown table of final accuracies (``final[arm][seed]``, fractions) and paired
    differences to the warm start (``warm[seed]``) and to each of :data:`REFERENCES` that
    is an arm here; also the numbers as a dict (fractions).

    Per arm over its seeds ``s``: the mean accuracy and its 95% interval
    ``mean ± t_{0.975, n−1} · sd / √n`` (:func:`~comppo_core.experiments.statistics.mean_ci`),
    the same of the paired gains ``acc(arm, s) − warm(s)``, and of ``acc(arm, s) − acc(ref, s)``
    over the seeds both ran (:func:`~comppo_core.experiments.statistics.paired`)."""
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
            diff = None if r == arm else paired(by_seed, final[r])
            if diff is None:
                row += ["—", "—"]
                continue
            row += [pct(diff["mean"], True), ci_cell(diff["mean"], diff["ci"], True)]
            entry[f"vs_{r}"] = [diff["mean"], diff["ci"]]
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
    """The interaction (a dict of :func:`~comppo_core.experiments.statistics.interaction`) as
    one markdown paragraph ending in its reading (``interaction > 0``, ``interaction < 0`` or
    "no difference detected (within ±x)": :func:`~comppo_core.experiments.statistics.reading`),
    or "" for None."""
    if inter is None:
        return ""
    a, b, c, d = inter["arms"]
    n = len(inter["seeds"])
    said = reading("interaction", "0", inter["mean"], inter["ci"])  # the contrasts' rule
    return (
        f"Interaction (critic × gates), paired per seed: ({a} − {b}) − ({c} − {d}) = "
        f"{pct(inter['mean'], True)} points, 95% CI {ci_cell(inter['mean'], inter['ci'], True)} "
        f"({n} seed{'s' if n != 1 else ''}; per seed: {', '.join(pct(v, True) for v in inter['per_seed'])}): "
        f"{said}.\n"
    )


def contrasts_table(found: list[dict[str, Any]]) -> str:
    """The contrasts of :func:`~comppo_core.experiments.statistics.contrasts` as a markdown
    table (points, paired 95% CI, the reading), or "" when there is none."""
    if not found:
        return ""
    lines = ["| contrast | question | mean | 95% CI | reading |", "|---|---|---|---|---|"]
    for c in found:
        a, b, m, h = c["a"], c["b"], c["mean"], c["ci"]
        lines.append(
            f"| {a} − {b} | {c['question']} | {pct(m, True)} | {ci_cell(m, h, True)} | {reading(a, b, m, h)} |"
        )
    return "\n".join(lines) + "\n"


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
    point's objective, the mean validation accuracy, per arm, ``*`` on the chosen) and its
    numbers (``scores``: the objective per point).

    ``outcomes[arm][point][k]`` is the run of tuning seed ``seeds[k]`` at that point. An
    arm's chosen setting leaves out the fields it does not read (named after it: "gate_low
    not read"), and a repeat (:meth:`Grid.first_alike`) is marked with the point whose run
    it is."""
    from ..rl.core.arms import get_arm

    points = grid.points
    lines = [
        "| arm | chosen | setting | validation accuracy % | stable |",
        "|---|---|---|---|---|",
    ]
    numbers: dict[str, Any] = {}
    for arm, by_point in outcomes.items():
        i = chosen[arm]
        k, n = stability(by_point)
        unread = [f for f in grid.fields if get_arm(arm).ignores(f)]
        setting = grid.describe({f: v for f, v in points[i].items() if f not in unread})
        if unread:
            setting = (setting + " " if setting else "") + f"({', '.join(unread)} not read)"
        lines.append(f"| {arm} | {grid.name(i)} | {setting} | {pct(objective(by_point[i]))} | {k}/{n} |")
        numbers[arm] = {
            "chosen": grid.name(i),
            "setting": points[i],
            "stable": [k, n],
            "scores": {grid.name(j): objective(o) for j, o in enumerate(by_point)},
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
    alike = {arm: grid.first_alike(arm) for arm in arms}
    for j, point in enumerate(points):
        cells = []
        for arm in arms:
            o = outcomes[arm][j]
            down = sum(collapsed(x) for x in o)
            cell = pct(objective(o)) + (f" ({down} collapsed)" if down else "")
            cell += f" (= {grid.name(alike[arm][j])})" if alike[arm][j] != j else ""
            cells.append(cell + (" *" if chosen[arm] == j else ""))
        lines.append(f"| {grid.name(j)} | {grid.describe(point)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", numbers


def collapse_rule() -> str:
    """The collapse criterion in words (results.md, results.json)."""
    return (
        "a tuning run collapses when it stops on a non-finite loss or gradient, or when its final validation "
        f"accuracy is below its step-0 (warm start) validation accuracy by more than {100 * COLLAPSE_MARGIN:g} points"
    )


def explained_variance(out: Path, arms: list[str], seeds: range) -> dict[str, tuple[float | None, float | None] | None]:
    """Per arm with a critic: the mean over ``seeds`` of the critic's explained variance
    over the first and the last :data:`EV_WINDOW` steps of each run (``metrics.jsonl``)."""
    from ..rl.runs.metrics import read_rows

    result: dict[str, tuple[float | None, float | None] | None] = {}
    for arm in arms:
        if ARMS[arm].critic is None:
            result[arm] = None
            continue
        firsts, lasts = [], []
        for s in seeds:
            path = out / arm / f"seed{s}" / "metrics.jsonl"
            rows = [r for r in read_rows(path) if r.get("reward_mean") is not None] if path.is_file() else []
            first, last = window_means([r.get("value_explained_var") for r in rows], EV_WINDOW)
            firsts += [first] if first is not None else []
            lasts += [last] if last is not None else []
        result[arm] = (
            math.fsum(firsts) / len(firsts) if firsts else None,
            math.fsum(lasts) / len(lasts) if lasts else None,
        )
    return result


@dataclasses.dataclass(frozen=True)
class Timing:
    """What ``results.md`` says of the time: the warm starts and runs asked for (``keys``,
    in order), the seconds each took when it ran (``timings``), how many were reused, and
    this invocation's seconds."""

    keys: list[str]
    timings: dict[str, float]
    reused: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class Tuning:
    """A grid's tuning: ``outcomes[arm][point][k]`` of tuning seed ``seeds[k]``, ``chosen[arm]`` a point index."""

    grid: Grid
    outcomes: dict[str, list[list[Outcome]]]
    chosen: dict[str, int]
    seeds: list[int]


def write_results(
    out: Path,
    base: TrainConfig,
    preset: str,
    summaries: dict[tuple[str, int], dict[str, Any]],
    arms: list[str],
    n_seeds: int,
    timing: Timing,
    tuned: Tuning | None,
    engine: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any] | None]:
    """Write ``results.md``, ``results.json`` and ``curves.png`` of the runs' ``summaries``
    (``(arm, seed)`` → summary; the runs in ``out/<arm>/seed<s>/``); return the main table
    and the interaction (None without the 2×2)."""
    keys, timings, seconds = timing.keys, timing.timings, timing.seconds
    timed = [timings[k] for k in keys if k in timings]
    untimed = len(keys) - len(timed)
    final = {arm: {s: summaries[arm, s]["final_eval_accuracy"] for s in range(n_seeds)} for arm in arms}
    starts = {s: [summaries[arm, s]["initial_eval_accuracy"] for arm in arms] for s in range(n_seeds)}
    warm = {s: starts[s][0] for s in range(n_seeds)}
    unpaired = [s for s in range(n_seeds) if len(set(starts[s])) > 1]
    curves = {
        arm: {s: [(int(st), float(a)) for st, a in summaries[arm, s]["eval"]] for s in range(n_seeds)} for arm in arms
    }
    table, numbers = results_table(final, warm)
    inter = interaction(final)
    found = contrasts(final)
    ev = explained_variance(out, arms, range(n_seeds))
    wm, wh = mean_ci(list(warm.values()))
    setting = f"preset `{preset}`"
    if tuned is not None:
        setting += ", each arm at the setting chosen on the validation split (Tuning, below)"
    lines = [
        "# comppo-core compare",
        "",
        f"{len(arms)} arm{'s' if len(arms) > 1 else ''} × {n_seeds} seed{'s' if n_seeds > 1 else ''}, {setting}, "
        f"{base.steps} PPO steps of {base.prompts_per_step} prompts × {base.group_size} samples; final held-out "
        f"greedy accuracy on {eval_size(base)} problems, in percent. Every arm of a seed starts from the same warm "
        "start (paired differences); 95% CIs from Student's t over seeds.",
        "",
        f"Warm start: {pct(wm)}% {ci_cell(wm, wh)} (per seed: {', '.join(pct(warm[s]) for s in range(n_seeds))}).",
        "",
        table,
    ]
    if inter is not None:
        lines += [interaction_line(inter)]
    if found:
        lines += [
            "Named contrasts, paired per seed (points; reading: which side the 95% CI excludes 0 on, or the "
            "largest difference it leaves open):",
            "",
            contrasts_table(found),
        ]
    lines += [
        "Final accuracy per seed (%):",
        "",
        "| arm | " + " | ".join(f"seed {s}" for s in range(n_seeds)) + " |",
        "|---|" + "---|" * n_seeds,
    ]
    lines += ["| " + arm + " | " + " | ".join(pct(final[arm][s]) for s in range(n_seeds)) + " |" for arm in arms]
    if unpaired:
        lines += ["", f"Note: the arms of seed(s) {unpaired} did not start at one accuracy: {starts}."]
    lines += [
        "",
        f"The critic's explained variance (`value_explained_var`), mean over the first and the last {EV_WINDOW} "
        "steps of each run, then over seeds (—: no critic, or no finite value):",
        "",
        explained_variance_table(ev, EV_WINDOW),
    ]
    tuning: dict[str, Any] | None = None
    if tuned is not None:
        grid, tseeds = tuned.grid, tuned.seeds
        text, per_arm = tuning_tables(grid, tuned.outcomes, tuned.chosen, tseeds)
        n_points = len(grid.points)
        fields = "; ".join(f"{f}: {v}" for f, v in grid.to_dict().items())
        lines += [
            "## Tuning",
            "",
            f"Grid of {n_points} point{'s' if n_points > 1 else ''} ({fields}), "
            f"tuning seeds {', '.join(map(str, tseeds))}, validation split of {eval_size(base, 'validation')} problems "
            f"(validation_fraction {base.validation_fraction}), disjoint from the held-out split. Each arm's setting: "
            "the best mean final validation accuracy over the tuning seeds (a non-finite stop scores 0); ties to more "
            f"stable runs, then the earlier point. Stable: {collapse_rule()}.",
            "",
            text,
        ]
        tuning = {
            "grid": grid.to_dict(),
            "points": {grid.name(i): p for i, p in enumerate(grid.points)},
            "tuning_seeds": tseeds,
            "validation_fraction": base.validation_fraction,
            "collapse": collapse_rule(),
            "arms": per_arm,
        }
    defaults = type(base)()
    changed = {k: v for k, v in base.to_dict().items() if k not in ("arm", "seed", "out") and v != getattr(defaults, k)}
    lines += [
        "",
        f"Time: {math.fsum(timed) / 60:.1f} min for the warm starts and runs, as each took when it ran"
        + (f" ({untimed} not timed)" if untimed else "")
        + f"; this invocation {seconds / 60:.1f} min"
        + (f", reusing {timing.reused} finished runs" if timing.reused else "")
        + " (seconds per run: timings.json).",
        "",
        engine_line(engine),
        "",
        "Settings changed from the TrainConfig defaults: "
        + (", ".join(f"`{k}={v}`" for k, v in changed.items()) if changed else "none")
        + ".",
        "",
    ]
    run_dir.write_text_atomic(out / "results.md", "\n".join(lines))
    run_dir.write_json_atomic(
        out / "results.json",
        {
            "arms": numbers,
            "warm_start": {str(s): a for s, a in warm.items()},
            "interaction": inter,
            "contrasts": found,
            "explained_variance": {
                arm: None if pair is None else {"first": pair[0], "last": pair[1], "window": EV_WINDOW}
                for arm, pair in ev.items()
            },
            "tuning": tuning,
            "curves": curves,
            "config": base.to_dict(),
            "engine": engine or {"engine": "package"},
            "seconds": seconds,
            "timings": {k: timings.get(k) for k in keys},
        },
    )
    plot_curves(
        curves,
        warm,
        out / "curves.png",
        f"held-out accuracy, mean and 95% CI over {n_seeds} seed{'s' if n_seeds > 1 else ''}",
    )
    return table, inter


def engine_line(engine: dict[str, Any] | None) -> str:
    """What ran the runs, for ``results.md``: the package's trainer, or TRL with its launcher and settings file."""
    if engine is None:
        return "Engine: the package's trainer (`comppo_core.rl.Trainer`)."
    launcher = engine.get("launcher")
    trl_config = engine.get("trl_config")
    return (
        "Engine: TRL (`CompPOTrainer`, each run a process of its own"
        + (f" under `{launcher}`" if launcher else "")
        + (f"; TRL settings from `{trl_config['path']}`, sha256 {trl_config['sha256'][:12]}…" if trl_config else "")
        + "); one PPO step is `ppo_epochs × num_minibatches` TRL optimiser steps (docs/trl.md, compare on TRL)."
    )


def eval_size(config: TrainConfig, split: str = "heldout") -> str:
    """How many problems of ``split`` the runs evaluate on, for the caption."""
    if config.task == "addition":
        from ..rl.tasks.addition import AdditionTask

        task = AdditionTask(
            config.digits,
            split_seed=config.split_seed,
            heldout_fraction=config.heldout_fraction,
            validation_fraction=config.validation_fraction,
        )
        return str(len(getattr(task, split)(config.eval_size)))
    return f"up to {config.eval_size}"
