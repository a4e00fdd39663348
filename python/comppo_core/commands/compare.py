"""``comppo-core compare``: every arm × seed on the same settings, paired, with a results table.

For each seed ``s`` in ``0 … seeds−1`` the command warms the policy up once (the SFT warm
start of :func:`comppo_core.rl.train`, into ``OUT/warmstart/seed<s>/``), then runs every
arm from that checkpoint (``init_from``) with the same settings and seed, so the arms of a
seed differ only in their critic and advantages: the same initial policy, the same
prompts, the same evaluation set (a paired comparison). With ``--model`` or
``--init-from`` there is no warm start: every run starts from that model.

**A tuning protocol** (``--grid``; :mod:`comppo_core.experiments.grid` for the syntax,
:mod:`comppo_core.experiments.tuning` for the rules). Every arm runs every point of the grid
on the tuning seeds ``1000, 1001, …`` (``--tuning-seeds``, default 2), evaluated on the
validation split (``validation_fraction``, default 0.1 with a grid); each arm's setting
is the point with the best mean final validation accuracy (ties: more stable runs, then
the earlier point); then every arm runs the reporting seeds ``0 … n−1`` (``--seeds``,
default 5 with a grid) at its own chosen setting, evaluated on the held-out split. Each
arm's stability over the grid ("k/n stable", a collapse criterion fixed in advance) and
its chosen setting are reported.

Outputs under ``OUT``::

    warmstart/seed<s>/      the warm start (its warmstart/ is every arm's init_from)
    <arm>/seed<s>/          each run's config.json, metrics.jsonl, summary.json, checkpoint/
    grid/p<k>/point.json    with --grid: point k's settings
    grid/p<k>/<arm>/seed<t>/  the tuning runs (seed t ≥ 1000, validation split; none for a repeat: grid.py)
    grid/nonfinite.json     tuning runs stopped by a non-finite value (a collapse)
    grid/choice.json        each arm's chosen point, once the tuning is done
    results.md              the table below, per-seed accuracies, the settings
    results.json            the same numbers, machine-readable
    timings.json            the seconds each warm start and run took when it ran
    curves.png              held-out accuracy vs step: mean and 95% CI band per arm

    compare.json            the settings every run here shares (checked by --resume)

The table gives, per arm, the final held-out (greedy) accuracy: its mean over seeds and
a 95% confidence interval ``mean ± t_{0.975, n−1} · s / √n`` (Student's t, ``s`` the
sample standard deviation over the ``n`` seeds), and the same for the paired differences
``acc(arm, s) − acc(ref, s)`` to the warm start, to ``grpo`` and to ``comppo``; when the
four cells of the 2×2 are compared, their interaction
``(comppo − tac_fixed) − (comp_gae − ppo_fixed)`` with its paired CI
(:mod:`comppo_core.experiments.statistics`); and per arm with a critic its explained
variance over the first and the last 10 steps (:mod:`comppo_core.experiments.report`).

**Never mixing runs.** An ``OUT`` that already holds a compare (or any run) is refused
unless ``--resume`` or ``--overwrite``. ``--resume`` continues it with the same settings
(``compare.json``, the grid and the tuning seeds included; a differing setting is
refused, named): finished runs are reused, interrupted ones resume from their
checkpoint, and ``--arms`` / ``--seeds`` may add runs; ``results.md`` covers the arms and
seeds asked for. ``--overwrite`` deletes the compare's own files (the entries above) and
starts again. Ctrl-C finishes the current step, keeps the checkpoints and prints the
``--resume`` command (exit status 130).

Exit status: 0 on success, 2 on a bad flag (an unknown arm, a bad preset, a setting out
of range, a bad grid, a refused ``--out``: the message names the flag), 1 on a failure
while training (a non-finite value in a reporting run), 130/143 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from ..experiments import report
from ..experiments import runs as compare_runs
from ..experiments.grid import Grid, parse_grid
from ..experiments.report import REFERENCES, plot_curves, results_table
from ..experiments.statistics import mean_ci, t_cdf, t_quantile
from ..experiments.tuning import (
    DEFAULT_REPORTING_SEEDS,
    DEFAULT_TUNING_SEEDS,
    DEFAULT_VALIDATION_FRACTION,
    FIRST_TUNING_SEED,
    Outcome,
    choose,
    stability,
    tuning_seeds,
)
from ..options import ARM_NAMES
from ..rl.config import TrainConfig
from ..rl.core.arms import ARMS
from ..rl.runs import run_dir
from .train import (
    _Default,
    add_config_arguments,
    check_paths,
    config_from_args,
    require_rl_extra,
    show_log_lines,
    usage_error,
)

__all__ = ["REFERENCES", "add_parser", "mean_ci", "plot_curves", "results_table", "run", "t_cdf", "t_quantile"]

#: TrainConfig flags compare sets itself, and what to use instead.
_OWN_FLAGS = {
    "arm": "the arms are --arms",
    "seed": "the seeds are 0 … --seeds − 1",
    "eval_split": "compare evaluates its reported runs on the held-out split and --grid's tuning runs on the "
    "validation split",
}


#: What compare writes directly under OUT (with the <arm>/seed<s>/ run directories).
_OWN_ENTRIES = (
    "compare.json",
    "results.md",
    "results.json",
    "timings.json",
    "curves.png",
    "warmstart",
    "grid",
)

# --------------------------------------------------------------------------- #
# The command line
# --------------------------------------------------------------------------- #


#: The arms ``compare`` runs by default: every arm but the diagnostics (``comppo_oracle``
#: needs a task that marks its pivotal tokens).
DEFAULT_ARMS = tuple(name for name in ARM_NAMES if not ARMS[name].diagnostic)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``compare`` command on the ``comppo-core`` parser."""
    cmd = subparsers.add_parser(
        "compare",
        help="run every arm x seed from paired warm starts; results.md (mean, 95%% CI, paired differences) and "
        "curves.png; --grid tunes each arm first (needs [rl])",
        description=(
            "For each seed, warm-start once and run every arm from that checkpoint with the same settings "
            "(paired); write each run under --out, results.md (final held-out accuracy per arm: mean and 95%% "
            "CI over seeds, paired differences to the warm start, grpo and comppo, the critic x gates "
            "interaction), results.json and curves.png. With --grid, each arm's setting is first chosen on "
            "tuning seeds 1000, 1001, ... by validation accuracy (docs/training.md, compare). Settings: the "
            "flags given, then --preset, then the TrainConfig defaults."
        ),
    )
    cmd.add_argument(
        "--arms",
        default=",".join(DEFAULT_ARMS),
        metavar="A,B,...",
        help=(
            f"comma-separated arms to compare (default: every arm but the diagnostics, {','.join(DEFAULT_ARMS)}; "
            "add comppo_oracle on a task that marks its pivotal tokens)"
        ),
    )
    cmd.add_argument(
        "--seeds",
        default=None,
        metavar="N",
        help=f"reporting seeds 0 … N−1 (default: 3; {DEFAULT_REPORTING_SEEDS} with --grid)",
    )
    cmd.add_argument(
        "--grid",
        nargs="+",
        default=None,
        metavar="FIELD=V1,V2",
        help="tune each arm over this grid first: FIELD=V1,V2,... per TrainConfig field (e.g. actor_lr=1e-4,3e-4 "
        "kl_coef=0,0.1 lam=0.95,1.0), or one JSON file {field: [values]}",
    )
    cmd.add_argument(
        "--tuning-seeds",
        default=None,
        metavar="N",
        help=f"with --grid: tuning seeds {FIRST_TUNING_SEED} … {FIRST_TUNING_SEED}+N−1 "
        f"(default: {DEFAULT_TUNING_SEEDS})",
    )
    cmd.add_argument(
        "--jobs",
        default=None,
        metavar="N",
        help="runs at once, each in its own process of one torch thread (default 1: one after another, in this "
        "process); on a 2-core CPU, --jobs 2",
    )
    cmd.add_argument(
        "--warm-starts",
        default=None,
        metavar="DIR",
        help="copy each seed's warm start from the compare in DIR (read only) where it was made with the same "
        "seed, task, split, policy and SFT settings, whatever the RL settings; the seeds DIR lacks are made here",
    )
    add_config_arguments(cmd)
    cmd.set_defaults(run=run, command_parser=cmd)
    return cmd


def _arms(text: str, cmd: argparse.ArgumentParser) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    if not arms:
        cmd.error(f"--arms: expected a comma-separated list of arms among {', '.join(ARM_NAMES)}, got {text!r}")
    for i, a in enumerate(arms):
        if a not in ARM_NAMES:
            cmd.error(f"--arms: expected arms among {', '.join(ARM_NAMES)}, got {a!r}")
        if a in arms[:i]:
            cmd.error(f"--arms: expected each arm once, got {a!r} twice")
    return arms


def _count(flag: str, text: str | None, default: int, cmd: argparse.ArgumentParser) -> int:
    if text is None:
        return default
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        what = {"--seeds": "seeds", "--tuning-seeds": "tuning seeds"}.get(flag, "processes")
        cmd.error(f"{flag}: expected a number of {what} >= 1, got {text!r}")
    return n


# --------------------------------------------------------------------------- #
# The output directory
# --------------------------------------------------------------------------- #


def _holds_compare(out: Path) -> bool:
    """Whether ``out`` holds a compare's files or any run."""
    return run_dir.holds_run(out) or any((out / name).exists() for name in (*_OWN_ENTRIES, *ARM_NAMES))


def _clear_compare(out: Path) -> None:
    """Delete a compare's own files in ``out``: :data:`_OWN_ENTRIES` and the runs in
    ``<arm>/seed<s>/`` (their run files only; a directory left empty goes too)."""
    for name in _OWN_ENTRIES:
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    for arm in ARM_NAMES:
        if not (out / arm).is_dir():
            continue
        for seed_dir in (out / arm).glob("seed*"):
            if seed_dir.is_dir():
                run_dir.clear_run(seed_dir)
                with contextlib.suppress(OSError):
                    seed_dir.rmdir()
        with contextlib.suppress(OSError):
            (out / arm).rmdir()


def _check_out(
    out: Path,
    base: TrainConfig,
    configs: dict[str, TrainConfig],
    resume: bool,
    overwrite: bool,
    protocol: dict[str, Any],
) -> str | None:
    """Why ``out`` cannot take this compare (a message naming the flag), or None.
    ``configs`` maps each run's directory under ``out`` to its config; ``protocol`` is the
    grid and the tuning seeds (``compare.json`` must have the same)."""
    if out.exists() and not out.is_dir():
        return f"--out: expected a directory, got {str(out)!r}, a file"
    if resume and overwrite:
        return "--overwrite: expected --resume or --overwrite, not both"
    if (out / "config.json").is_file() and not (out / "compare.json").is_file():
        return f"--out: {str(out)!r} holds a run of comppo-core train ({run_dir.describe_run(out)}), not a compare"
    if overwrite or not _holds_compare(out):
        return None
    if not resume:
        return (
            f"--out: {str(out)!r} already holds a compare (or a run); continue it with --resume (same settings) or "
            "replace it with --overwrite"
        )
    try:
        record = json.loads((out / "compare.json").read_text())
        saved = record["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        record, saved = {}, None
    if saved is not None and (why := compare_runs.differing(saved, base)):
        return why
    if "init_from" in record and record["init_from"] != base.init_from:  # every run's starting policy
        return f"--init-from: the runs in --out started from {record['init_from']!r}, got {base.init_from!r}"
    for key, flag in (("grid", "--grid"), ("tuning_seeds", "--tuning-seeds")):
        if saved is not None and record.get(key) != protocol[key]:
            return f"{flag}: the compare in --out has {key} {record.get(key)!r}, got {protocol[key]!r}"
    for rel, config in configs.items():  # the runs themselves (also a compare without compare.json)
        saved_run = compare_runs.saved_config(out / rel)
        if saved_run is not None and (why := compare_runs.differing(saved_run, config)):
            return f"{why} ({rel})"
    return None


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core compare``; returns the exit status."""
    cmd: argparse.ArgumentParser = args.command_parser
    for name, instead in _OWN_FLAGS.items():
        if not isinstance(getattr(args, name), _Default):
            cmd.error(f"--{name.replace('_', '-')}: not a compare flag ({instead})")
    if not isinstance(args.out, str):
        cmd.error("--out: expected the output directory DIR, got none")
    resume = args.resume is True
    arms = _arms(args.arms, cmd)
    grid: Grid | None = None
    if args.grid is not None:
        try:
            grid = parse_grid(args.grid)
        except ParameterError as exc:
            usage_error(cmd, exc)
    elif args.tuning_seeds is not None:
        cmd.error("--tuning-seeds: only with --grid (the seeds a grid's settings are chosen on)")
    n_seeds = _count("--seeds", args.seeds, DEFAULT_REPORTING_SEEDS if grid else 3, cmd)
    jobs = _count("--jobs", args.jobs, 1, cmd)
    tseeds = tuning_seeds(_count("--tuning-seeds", args.tuning_seeds, DEFAULT_TUNING_SEEDS, cmd)) if grid else []
    if grid and n_seeds > FIRST_TUNING_SEED:
        cmd.error(
            f"--seeds: expected at most {FIRST_TUNING_SEED} with --grid (disjoint from the tuning seeds), got {n_seeds}"
        )
    fixed: dict[str, Any] = {}
    if grid and isinstance(args.validation_fraction, _Default):
        fixed["validation_fraction"] = DEFAULT_VALIDATION_FRACTION
    base = config_from_args(args, cmd, arm=arms[0], seed=0, resume=False, **fixed)
    if base.eval_every == 0:
        cmd.error("--eval-every: expected >= 1 (compare reports the held-out accuracy), got 0")
    if grid and not base.validation_fraction:
        cmd.error(
            "--validation-fraction: expected > 0 with --grid (the settings are chosen on the validation split), got 0"
        )
    configs: dict[str, TrainConfig] = {}
    if grid is None:
        for arm in arms:
            for seed in range(n_seeds):
                try:
                    configs[f"{arm}/seed{seed}"] = base.replace(arm=arm, seed=seed)
                except ParameterError as exc:  # a setting invalid for one arm
                    usage_error(cmd, exc)
    else:
        try:
            grid.check(base, arms)
        except ParameterError as exc:
            usage_error(cmd, exc)
        alike = {arm: grid.first_alike(arm) for arm in arms}
        for i, point in enumerate(grid.points):
            for arm in arms:
                if alike[arm][i] != i:  # the same run as an earlier point's (grid.py, "Repeats")
                    continue
                for t in tseeds:
                    config = base.replace(arm=arm, seed=t, eval_split="validation", **point)
                    configs[f"grid/{grid.name(i)}/{arm}/seed{t}"] = config
    assert base.out is not None
    out = Path(base.out)
    protocol = {"grid": None if grid is None else grid.to_dict(), "tuning_seeds": tseeds or None}
    refused = _check_out(out, base, configs, resume, args.overwrite, protocol)
    if refused:
        cmd.error(refused)
    try:
        check_paths(base.replace(out=None), overwrite=False)
    except ParameterError as exc:
        usage_error(cmd, exc)
    source = None if args.warm_starts is None else Path(args.warm_starts)
    if source is not None:
        if base.init_from is not None or base.model is not None:
            cmd.error("--warm-starts: only without --init-from and --model (those runs make no warm start)")
        if not (source / "compare.json").is_file() or not (source / "warmstart").is_dir():
            cmd.error(f"--warm-starts: expected the directory of a compare with warm starts, got {str(source)!r}")
        if source.resolve() == out.resolve():
            source = None  # its own warm starts: reused as they are
        else:
            try:
                compare_runs.check_warm_starts(source, base, [*range(n_seeds), *tseeds])
            except ParameterError as exc:
                usage_error(cmd, exc)
    require_rl_extra("compare")
    from ..rl.runs.interrupts import GracefulStop, TrainingInterrupted, exit_status

    show_log_lines()
    if args.overwrite:
        _clear_compare(out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "settings": compare_runs.settings_of(base),
        "init_from": base.init_from,
        "arms": arms,
        "seeds": n_seeds,
        **protocol,
    }
    run_dir.write_json_atomic(out / "compare.json", record)

    t_start = time.perf_counter()
    summaries: dict[tuple[str, int], dict[str, Any]] = {}
    hint = "rerun the same command with --resume to continue"
    outcomes: dict[str, list[list[Outcome]]] = {}
    chosen: dict[str, int] = {}
    with GracefulStop() as stop:
        runner = compare_runs.Runner(
            cmd, out, base, len(configs) + len(arms) * n_seeds * (grid is not None), stop, jobs, source
        )
        try:
            if grid is not None:
                outcomes = compare_runs.tune(runner, grid, arms, tseeds, configs)
                chosen = {arm: choose(outcomes[arm]) for arm in arms}
                choice = {arm: {"point": grid.name(i), "settings": grid.points[i]} for arm, i in chosen.items()}
                run_dir.write_json_atomic(out / "grid" / "choice.json", choice)
                for arm, i in chosen.items():
                    k, n = stability(outcomes[arm])
                    print(f"{arm}: chose {grid.name(i)} ({grid.describe(grid.points[i])}); {k}/{n} stable", flush=True)
                for arm in arms:
                    for seed in range(n_seeds):
                        rel = f"{arm}/seed{seed}"
                        configs[rel] = base.replace(arm=arm, seed=seed, **grid.points[chosen[arm]])
                        saved_run = compare_runs.saved_config(out / rel)
                        if saved_run is not None and (why := compare_runs.differing(saved_run, configs[rel])):
                            cmd.error(
                                f"--grid: {rel} in --out holds a run at another setting than {arm}'s chosen one "
                                f"({why}); replace the compare with --overwrite"
                            )
            items = [
                (f"{arm}/seed{seed}", configs[f"{arm}/seed{seed}"], f"{arm} seed {seed}")
                for seed in range(n_seeds)
                for arm in arms
            ]
            reported = runner.run_all(items)
            for seed in range(n_seeds):
                for arm in arms:
                    summary = reported[f"{arm}/seed{seed}"]
                    assert summary is not None  # a reporting run's non-finite stop is raised
                    summaries[arm, seed] = summary
        except compare_runs.Stopped as exc:
            print(f"comppo-core compare: stopped after {exc}; {hint}", file=sys.stderr)
            return exit_status(stop.signum or 2)
        except TrainingInterrupted as exc:
            print(f"comppo-core compare: stopped after step {exc.next_step} of a run; {hint}", file=sys.stderr)
            return exit_status(stop.signum or 2)
        except KeyboardInterrupt:
            print(f"comppo-core compare: stopped at once; the checkpoints written are kept; {hint}", file=sys.stderr)
            return exit_status(2)
    seconds = time.perf_counter() - t_start
    table, inter = report.write_results(
        out,
        base,
        args.preset or "default",
        summaries,
        arms,
        n_seeds,
        report.Timing(runner.keys, runner.timings, runner.reused, seconds),
        report.Tuning(grid, outcomes, chosen, tseeds) if grid is not None else None,
    )
    print(table, end="")
    if inter is not None:
        print(report.interaction_line(inter), end="")
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'curves.png'} ({seconds / 60:.1f} min)")
    return 0
