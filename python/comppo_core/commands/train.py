"""``comppo-core train``: one PPO run of one arm (:func:`comppo_core.rl.train`).

Every :class:`~comppo_core.rl.TrainConfig` field is a flag (``--actor-lr``, ``--kl-coef``,
...). A run's settings are, in order of precedence: the flags given on the command line,
then the ``--preset`` (:data:`comppo_core.rl.config.PRESETS`: ``default`` is the
TrainConfig defaults, ``quick`` a shorter run), then the TrainConfig defaults. With
``--resume`` the settings saved in ``OUT/config.json`` replace the preset, and the flags
given change them (the trainer accepts changes to ``steps``, ``progress``, ``save_every``,
``eval_every``, ``num_threads`` and ``device`` only).

The command prints the held-out accuracy before and after and the files written under
``--out``: ``config.json``, ``metrics.jsonl`` (one row per step), ``summary.json``,
``warmstart/`` and ``checkpoint/`` (:mod:`comppo_core.rl.trainer`).

Exit status: 0 on success, 2 on a bad flag or setting (the message names the flag), 1 on
a failure while training (a non-finite loss, an unreadable file).

Neither the flags nor their help need torch: :class:`~comppo_core.rl.TrainConfig` imports
none, so the parser is built, ``--help`` shown and every flag checked without the
``[rl]`` extra; without it, a run stops there with a one-line error (exit status 1,
:func:`require_rl_extra`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from ..errors import ParameterError
from ..rl.config import PRESETS, TrainConfig

__all__ = ["MISSING_EXTRA", "add_parser", "config_from_args", "require_rl_extra", "run", "usage_error"]

MISSING_EXTRA = "comppo-core {command} needs the [rl] extra: pip install 'comppo-core[rl]'"


def require_rl_extra(command: str) -> None:
    """Exit with status 1 and the one-line :data:`MISSING_EXTRA` unless torch and
    transformers import; a command that trains calls it once its flags are checked."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise SystemExit("comppo-core: error: " + MISSING_EXTRA.format(command=command)) from None


class _Default:
    """The default of a TrainConfig flag, told apart from the same value given on the
    command line (a preset replaces defaults, never given flags)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        return str(self.value)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--preset`` and one flag per TrainConfig field on ``parser``; a flag not given
    parses to its :class:`_Default`."""
    described = "; ".join(
        f"{name}: " + (", ".join(f"{k}={v}" for k, v in changes.items()) or "the TrainConfig defaults")
        for name, changes in PRESETS.items()
    )
    parser.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        default=None,
        help=f"named settings under the flags given ({described}); default: default",
    )
    TrainConfig.add_arguments(parser)
    parser.set_defaults(**{f.name: _Default(f.default) for f in dataclasses.fields(TrainConfig)})


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields given on the command line."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    return {k: v for k, v in vars(args).items() if k in names and not isinstance(v, _Default)}


def usage_error(parser: argparse.ArgumentParser, exc: Exception) -> NoReturn:
    """Exit with status 2 and ``exc``'s message, naming the flag of its ``argument`` (a
    TrainConfig field: ``gate_low`` is ``--gate-low``)."""
    argument = getattr(exc, "argument", None)
    message = str(exc)
    if argument:
        message = f"--{argument.replace('_', '-')}: {message.removeprefix(f'{argument}: ')}"
    parser.error(message)


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser, **fixed: Any) -> TrainConfig:
    """The run's TrainConfig: ``fixed`` fields, then the flags given, then the preset, then
    the defaults; a bad value is a usage error naming its flag."""
    try:
        return TrainConfig.from_preset(args.preset or "default", **{**config_fields(args), **fixed})
    except ParameterError as exc:
        usage_error(parser, exc)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``train`` command on the ``comppo-core`` parser."""
    cmd = subparsers.add_parser(
        "train",
        help="train one arm with PPO on the built-in task or your model and data: metrics.jsonl, checkpoints, "
        "resume (needs [rl])",
        description=(
            "Warm-start a small Llama on worked additions (or load --model), then run PPO steps of one arm "
            "(rollout -> score -> advantages -> update) and write metrics.jsonl, summary.json and checkpoints "
            "under --out. Settings: the flags given, then --preset, then the TrainConfig defaults."
        ),
    )
    add_config_arguments(cmd)
    cmd.set_defaults(run=run, command_parser=cmd)
    return cmd


def _resumed_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> TrainConfig:
    """With ``--resume``: the saved ``OUT/config.json`` with the flags given on top."""
    if args.preset is not None:
        parser.error("--preset: not used with --resume (the run continues with the settings in OUT/config.json)")
    if not isinstance(args.out, str):
        parser.error("--resume: expected --out DIR, the directory of the run to continue")
    path = Path(args.out) / "config.json"
    if not path.is_file():
        parser.error(f"--resume: expected a run in {args.out} (no {path} found)")
    try:
        saved = TrainConfig.from_json(path.read_text())
    except ParameterError as exc:  # a file, not a flag, is at fault
        parser.error(f"--resume: {path}: {exc}")
    try:
        return saved.replace(**{**config_fields(args), "resume": True})
    except ParameterError as exc:
        usage_error(parser, exc)


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core train``; returns the exit status."""
    cmd: argparse.ArgumentParser = args.command_parser
    config = _resumed_config(args, cmd) if args.resume is True else config_from_args(args, cmd)
    require_rl_extra("train")
    from ..rl.trainer import Trainer

    t0 = time.perf_counter()
    try:
        trainer = Trainer(config)
    except ParameterError as exc:  # settings the trainer checks (a resume's, an arm's critic_warmup)
        usage_error(cmd, exc)
        raise
    summary = trainer.train()
    seconds = time.perf_counter() - t0
    if not trainer.dist.is_main:  # under torchrun, rank 0 reports
        return 0
    first = summary["initial_eval_accuracy"]
    final = summary["final_eval_accuracy"]
    start = trainer.start_step
    print(
        f"comppo-core train: {config.arm}, seed {config.seed}, steps {start}-{config.steps}: held-out accuracy "
        f"{_percent(first) if start == 0 else '(resumed)'} -> {_percent(final)} in {seconds:.0f} s"
    )
    if config.out is not None:
        print(f"wrote {config.out}: config.json, metrics.jsonl, summary.json, checkpoint/")
    else:
        print(json.dumps(summary, indent=2), file=sys.stdout)
    return 0
