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

**Flags.** Every flag of ``comppo-core train`` but ``--arm``, ``--seed`` and ``--eval-split``
(compare sets those per run: ``--arms``, ``--seeds``; neither offered by ``--help`` nor
accepted), and compare's own: ``--arms``, ``--seeds``, ``--grid``, ``--tuning-seeds``,
``--jobs``, ``--warm-starts``, ``--resume``, ``--overwrite``, ``--engine``, ``--launcher``,
``--trl-config``.

**On TRL** (``--engine trl``, docs/trl.md "compare on TRL"): each run is a
:class:`~comppo_core.integrations.trl.CompPOTrainer` run on ``--model DIR`` in a process of
its own (``python -m comppo_core.integrations.trl.run RUN_DIR``), under ``--launcher`` when
given (``"accelerate launch --config_file F"``), with the GRPOConfig fields compare does not
set from ``--trl-config F``; the protocol, the files and the resume rules are the same
(:mod:`comppo_core.experiments.trl_engine`). The flags that do not apply (the built-in
policy and its SFT, ``--init-from``, ``--warm-starts``, ``--jobs``, ``--fsdp``, a KL other
than TRL's k3 in the loss) are refused, named; ``--launcher`` and ``--trl-config`` without
``--engine trl`` too.

**The command and the library.** This module is the command line only: it parses the
flags into :class:`comppo_core.experiments.settings.CompareSettings`, runs
:class:`comppo_core.experiments.protocol.Experiment` (which checks everything before
torch is imported, then trains and writes the files above), and turns the library's
errors into usage errors naming the flag (exit status 2), its stops into the
``--resume`` hint and the exit status of the signal.

Exit status: 0 on success, 2 on a bad flag (an unknown arm, a bad preset, a setting out
of range, a bad grid, a refused ``--out``: the message names the flag), 1 on a failure
while training (a non-finite value in a reporting run), 130/143 when interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from ..experiments import report
from ..experiments.grid import Grid, parse_grid
from ..experiments.protocol import Experiment
from ..experiments.runs import Stopped
from ..experiments.settings import DEFAULT_ARMS, DEFAULT_SEEDS, OWN_FIELDS, CompareSettings, parse_arms
from ..experiments.tuning import DEFAULT_REPORTING_SEEDS, DEFAULT_TUNING_SEEDS, FIRST_TUNING_SEED
from ..rl.config import PRESETS, TrainConfig, upgrade_fields
from .train import (
    _Default,
    add_config_arguments,
    config_fields,
    config_from_args,
    preset_name,
    require_rl_extra,
    show_log_lines,
    usage_error,
)

__all__ = ["DEFAULT_ARMS", "add_parser", "run", "settings_from_args"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``compare`` command on the ``comppo-core`` parser."""
    hidden = ", ".join(f"--{name.replace('_', '-')}" for name in OWN_FIELDS)
    cmd = subparsers.add_parser(
        "compare",
        # %-formatted by argparse (the command list), hence %%
        help="run every arm x seed from paired warm starts; results.md (mean, 95%% CI, paired differences) and "
        "curves.png; --grid tunes each arm first (needs [rl])",
        description=(
            "For each seed, warm-start once and run every arm from that checkpoint with the same settings "
            "(paired); write each run under --out, results.md (final held-out accuracy per arm: mean and 95% "
            "CI over seeds, paired differences to the warm start, grpo and comppo, the critic x gates "
            "interaction), results.json and curves.png. With --grid, each arm's setting is first chosen on "
            "tuning seeds 1000, 1001, ... by validation accuracy (docs/training.md, compare). Settings: the "
            "flags given, then --preset, then the TrainConfig defaults. Every flag of comppo-core train is "
            f"taken but {hidden}, which compare sets per run."
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
        help=f"reporting seeds 0 … N−1 (default: {DEFAULT_SEEDS}; {DEFAULT_REPORTING_SEEDS} with --grid)",
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
    cmd.add_argument(
        "--engine",
        default="package",
        choices=("package", "trl"),
        help="package: comppo_core.rl.Trainer (default); trl: each run a CompPOTrainer run on --model DIR in a "
        "process of its own (docs/trl.md, compare on TRL)",
    )
    cmd.add_argument(
        "--launcher",
        default=None,
        metavar="CMD",
        help='with --engine trl: start each run under this command, e.g. "accelerate launch --config_file F" '
        "(default: this python)",
    )
    cmd.add_argument(
        "--trl-config",
        default=None,
        metavar="FILE",
        help="with --engine trl: a YAML or JSON file of the GRPOConfig/CompPOConfig fields compare does not set "
        "(use_vllm, gradient_checkpointing, ...)",
    )
    # the train flags compare sets itself stay parsed (to refuse them, naming what to use),
    # not offered: --help leaves them out
    add_config_arguments(cmd, hidden=tuple(OWN_FIELDS))
    cmd.set_defaults(run=run, command_parser=cmd)
    return cmd


def _count(flag: str, text: str | None, cmd: argparse.ArgumentParser) -> int | None:
    """The count a flag's text gives (None when not given); a usage error below 1."""
    if text is None:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        what = {"--seeds": "seeds", "--tuning-seeds": "tuning seeds"}.get(flag, "processes")
        cmd.error(f"{flag}: expected a number of {what} >= 1, got {text!r}")
    return n


def recorded_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """With ``--resume``: the shared settings ``OUT/compare.json`` recorded, for every field
    neither a flag given nor the preset given sets, so a compare made under older defaults
    continues with its own (a default changed since, such as ``gate_causal``, is not a
    mismatch). Without ``--resume`` or a readable record: nothing (the protocol then
    reports what it finds)."""
    path = Path(args.out) / "compare.json"
    if args.resume is not True or not path.is_file():
        return {}
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))["settings"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(recorded, dict):
        return {}
    try:
        recorded = upgrade_fields(recorded)  # a field renamed since (gate_invert → gate_direction)
    except ParameterError:
        return {}
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    set_here = {*config_fields(args), *PRESETS.get(preset_name(args), {})}
    return {k: v for k, v in recorded.items() if k in names and k not in set_here}


def settings_from_args(args: argparse.Namespace, cmd: argparse.ArgumentParser) -> CompareSettings:
    """The experiment's :class:`CompareSettings` from compare's flags; a bad flag is a
    usage error naming it (exit status 2)."""
    for name, instead in OWN_FIELDS.items():
        if not isinstance(getattr(args, name), _Default):
            cmd.error(f"--{name.replace('_', '-')}: not a compare flag ({instead})")
    if not isinstance(args.out, str):
        cmd.error("--out: expected the output directory DIR, got none")
    try:
        arms = parse_arms(args.arms)
        grid: Grid | None = None if args.grid is None else parse_grid(args.grid)
    except ParameterError as exc:
        usage_error(cmd, exc)
    seeds = _count("--seeds", args.seeds, cmd)
    jobs = _count("--jobs", args.jobs, cmd)
    tuning = _count("--tuning-seeds", args.tuning_seeds, cmd)
    fixed: dict[str, Any] = {}
    if args.engine == "trl":  # TRL's KL estimator, unless a flag says otherwise (then refused, named)
        from ..experiments.trl_engine import TRL_FIXED

        fixed = {k: v for k, v in TRL_FIXED.items() if isinstance(getattr(args, k), _Default)}
    base = config_from_args(args, cmd, **{**recorded_defaults(args), **fixed}, arm=arms[0], seed=0, resume=False)
    given = not isinstance(args.validation_fraction, _Default)
    return CompareSettings(
        base=base,
        arms=arms,
        seeds=seeds,
        grid=grid,
        tuning_seeds=tuning,
        validation_fraction=base.validation_fraction if given else None,
        jobs=1 if jobs is None else jobs,
        warm_starts=None if args.warm_starts is None else Path(args.warm_starts),
        resume=args.resume is True,
        overwrite=bool(args.overwrite),
        preset=preset_name(args),
        engine=args.engine,
        launcher=args.launcher,
        trl_config=None if args.trl_config is None else Path(args.trl_config),
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core compare``; returns the exit status."""
    cmd: argparse.ArgumentParser = args.command_parser
    settings = settings_from_args(args, cmd)
    try:
        experiment = Experiment(settings)  # every check; nothing written, no torch
    except ParameterError as exc:
        usage_error(cmd, exc)
    require_rl_extra("compare")
    from ..rl.runs.interrupts import GracefulStop, TrainingInterrupted, exit_status

    show_log_lines()
    hint = "rerun the same command with --resume to continue"
    with GracefulStop() as stop:
        try:
            result = experiment.run(stop)
        except ParameterError as exc:  # found while a run is built (a bad --task file), or a chosen run's conflict
            usage_error(cmd, exc)
        except Stopped as exc:
            print(f"comppo-core compare: stopped after {exc}; {hint}", file=sys.stderr)
            return exit_status(stop.signum or 2)
        except TrainingInterrupted as exc:
            print(f"comppo-core compare: stopped after step {exc.next_step} of a run; {hint}", file=sys.stderr)
            return exit_status(stop.signum or 2)
        except KeyboardInterrupt:
            print(f"comppo-core compare: stopped at once; the checkpoints written are kept; {hint}", file=sys.stderr)
            return exit_status(2)
    out = result.out
    print(result.table, end="")
    if result.interaction is not None:
        print(report.interaction_line(result.interaction), end="")
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'curves.png'} ({result.seconds / 60:.1f} min)")
    return 0
