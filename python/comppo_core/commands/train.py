"""``comppo-core train``: one PPO run of one arm (:func:`comppo_core.rl.train`).

Every :class:`~comppo_core.rl.TrainConfig` field is a flag (``--actor-lr``, ``--kl-coef``,
...; ``task_options`` is ``--task-option KEY=VALUE``, once per setting). A run's settings are, in order of precedence: the flags given on the command line,
then the ``--preset`` (:data:`comppo_core.rl.config.PRESETS`: ``default`` is the
TrainConfig defaults, ``quick`` a shorter run, ``pretrained`` the update for a pretrained
model, applied, and said, when ``--model`` is given without ``--preset``), then the
TrainConfig defaults. With
``--resume`` the settings saved in ``OUT/config.json`` replace the preset, and the flags
given change them (the trainer accepts changes to ``steps``, ``progress``, ``save_every``,
``eval_every``, ``num_threads`` and ``device`` only).

The command prints, first, what it chose (threads, response budget, evaluation set), then
the held-out accuracy before and after and every file and folder written under ``--out``
(:func:`written`): ``config.json``, ``inputs.json`` (fingerprints of the inputs),
``metrics.jsonl`` (one row per step), ``critic_warmup.jsonl`` (an arm that warms its
critic up), ``summary.json``, ``warmstart/``, ``checkpoint/``, and ``tensorboard/`` or
``wandb/`` with ``--report-to`` (:mod:`comppo_core.rl.engine.trainer`). An ``--out`` that already holds a run is
refused unless ``--resume`` (continue it) or ``--overwrite`` (replace it).

Ctrl-C (or SIGTERM) finishes the current step, writes a checkpoint of the steps done,
prints how to resume and exits with 130 (143); a second Ctrl-C stops at once, keeping the
last checkpoint.

Exit status: 0 on success, 2 on a bad flag, setting or path (one line naming the flag,
before torch is imported), 1 on a failure while training (a non-finite loss, an
unreadable file), 130/143 when interrupted. Under ``torchrun`` a failure on one rank stops
every rank at once; the others exit with 1 too, printing
:class:`~comppo_core.rl.runs.interrupts.RankFailed` (the failing rank, its step, its error),
and torchrun's closing summary shows the error.

Neither the flags nor their help need torch: :class:`~comppo_core.rl.TrainConfig` imports
none, so the parser is built, ``--help`` shown and every flag checked without the
``[rl]`` extra; without it, a run stops there with a one-line error (exit status 1,
:func:`require_rl_extra`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from ..errors import ParameterError
from ..rl.config import DEFAULT_PRESET, MODEL_PRESET, PRESETS, TrainConfig, field_default
from ..rl.paths import check_paths
from ..rl.runs import run_dir

__all__ = [
    "MISSING_EXTRA",
    "add_parser",
    "config_from_args",
    "describe_start",
    "percent",
    "quiet_deepspeed_on_cpu",
    "require_rl_extra",
    "run",
    "show_log_lines",
    "usage_error",
    "written",
]

MISSING_EXTRA = "comppo-core {command} needs the [rl] extra: pip install 'comppo-core[rl]'"


def require_rl_extra(command: str) -> None:
    """Exit with status 1 and the one-line :data:`MISSING_EXTRA` unless torch and
    transformers import; a command that trains calls it once its flags are checked."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise SystemExit("comppo-core: error: " + MISSING_EXTRA.format(command=command)) from None
    quiet_deepspeed_on_cpu()


def quiet_deepspeed_on_cpu() -> None:
    """Name DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``) in this command's process
    when CUDA is absent and none is named: with DeepSpeed installed, accelerate imports it
    inside ``save_pretrained``, and its auto-detection then prints "[WARNING] ... Setting
    accelerator to CPU" on stdout among the command's own lines; it picks the CPU anyway."""
    import torch

    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


class _Default:
    """The default of a TrainConfig flag, told apart from the same value given on the
    command line (a preset replaces defaults, never given flags)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __str__(self) -> str:
        return str(self.value)


def add_config_arguments(parser: argparse.ArgumentParser, hidden: tuple[str, ...] = ()) -> None:
    """``--preset``, ``--overwrite`` and one flag per TrainConfig field on ``parser``; a flag
    not given parses to its :class:`_Default`. The flags of the fields in ``hidden`` are
    parsed (the command refuses them, naming what to use) but not listed by ``--help``."""
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
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (its config.json, metrics.jsonl, checkpoints, ...; other files stay)",
    )
    TrainConfig.add_arguments(parser)
    for action in parser._actions:
        if action.dest in hidden:
            action.help = argparse.SUPPRESS
    parser.set_defaults(**{f.name: _Default(field_default(f)) for f in dataclasses.fields(TrainConfig)})


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


def preset_name(args: argparse.Namespace) -> str:
    """``--preset`` when given; else ``pretrained`` with ``--model`` (a pretrained model needs a
    smaller update than the built-in toy: rl.config.PRESETS) and ``default`` without."""
    if args.preset is not None:
        return str(args.preset)
    return MODEL_PRESET if "model" in config_fields(args) else DEFAULT_PRESET


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser, **fixed: Any) -> TrainConfig:
    """The run's TrainConfig: ``fixed`` fields, then the flags given, then the preset
    (:func:`preset_name`), then the defaults; a bad value is a usage error naming its flag. A
    preset applied because ``--model`` was given is said on stdout once the settings hold, with
    what it sets."""
    name = preset_name(args)
    given = config_fields(args)
    try:
        config = TrainConfig.from_preset(name, **{**given, **fixed})
    except ParameterError as exc:
        usage_error(parser, exc)
    if args.preset is None and name != DEFAULT_PRESET:  # said once the settings hold, before anything runs
        changes = {k: v for k, v in PRESETS[name].items() if k not in given and k not in fixed}
        shown = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in changes.items())
        print(
            f"{parser.prog}: the {name} preset, since --model is given without --preset: {shown} "
            "(--preset default for the TrainConfig defaults)",
            flush=True,
        )
    return config


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


def percent(x: float | None) -> str:
    """An accuracy as the commands print it: percent with one decimal (``66.8%``), ``n/a`` for none."""
    return "n/a" if x is None else f"{100 * x:.1f}%"


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core train``; returns the exit status."""
    cmd: argparse.ArgumentParser = args.command_parser
    config = _resumed_config(args, cmd) if args.resume is True else config_from_args(args, cmd)
    try:
        check_paths(config, overwrite=args.overwrite)
    except ParameterError as exc:
        usage_error(cmd, exc)
    require_rl_extra("train")
    from ..rl.engine.trainer import Trainer
    from ..rl.runs.interrupts import GracefulStop, TrainingInterrupted, exit_status

    if args.overwrite and config.out is not None and run_dir.holds_run(Path(config.out)):
        print(f"comppo-core train: --overwrite: replacing {run_dir.describe_run(Path(config.out))} in {config.out}")
    show_log_lines()
    t0 = time.perf_counter()
    with GracefulStop() as stop:
        try:
            try:
                trainer = Trainer(config, overwrite=args.overwrite)
            except ParameterError as exc:  # settings the trainer checks (a resume's, an arm's critic_warmup)
                usage_error(cmd, exc)
            if trainer.dist.is_main:
                print(describe_start(trainer), flush=True)
            summary = trainer.train(stop=stop)
        except TrainingInterrupted as exc:
            print(f"comppo-core train: stopped after step {exc.next_step}; {_resume_hint(config)}", file=sys.stderr)
            return exit_status(stop.signum or 2)
        except KeyboardInterrupt:
            print(f"comppo-core train: stopped at once; {_resume_hint(config)}", file=sys.stderr)
            return exit_status(2)
        except Exception as exc:  # printed by the caller (cli.main); under torchrun also in its summary
            record_for_torchrun(exc)
            raise
    seconds = time.perf_counter() - t0
    if not trainer.dist.is_main:  # under torchrun, rank 0 reports
        return 0
    first = summary["initial_eval_accuracy"]
    final = summary["final_eval_accuracy"]
    start = trainer.start_step
    print(
        f"comppo-core train: {config.arm}, seed {config.seed}, steps {start}-{config.steps}: held-out accuracy "
        f"{percent(first) if start == 0 else '(resumed)'} -> {percent(final)} in {seconds:.0f} s"
    )
    if config.out is not None:
        print(f"wrote {config.out}: {', '.join(written(config))}")
    else:
        print(json.dumps(summary, indent=2), file=sys.stdout)
    return 0


def written(config: TrainConfig) -> list[str]:
    """The run's entries (:data:`~comppo_core.rl.runs.run_dir.RUN_ENTRIES`) in ``config.out``,
    in that order, a folder with its ``/``. A run starts in a directory that holds none of
    them (or replaces them, ``--overwrite``) or continues its own (``--resume``), so every
    one there is this run's."""
    assert config.out is not None
    out = Path(config.out)
    return [name + "/" * (out / name).is_dir() for name in run_dir.RUN_ENTRIES if (out / name).exists()]


def record_for_torchrun(exc: BaseException) -> None:
    """Under ``torchrun``, write ``exc`` to the agent's error file (``TORCHELASTIC_ERROR_FILE``),
    so its closing summary shows this rank's error instead of a pointer to the docs. Call it
    in the ``except`` block (the file holds the traceback being handled); never raises."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    with contextlib.suppress(Exception):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)


def _resume_hint(config: TrainConfig) -> str:
    """How to continue an interrupted run (or why it cannot be)."""
    if config.out is None:
        return "nothing was written (no --out), so there is nothing to resume"
    found = run_dir.saved_checkpoint(Path(config.out))
    if found is None:
        return f"no checkpoint was written; start again with --out {config.out} --overwrite"
    done = "" if found[1] is None else f"after {found[1]} of {config.steps} steps "
    return f"the checkpoint {done}is kept: comppo-core train --out {config.out} --resume"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A log handler writing to whatever ``sys.stderr`` is when a record comes (a test's
    capture, a redirect made after the handler was added)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def show_log_lines() -> None:
    """Show the trainer's log lines (logger ``comppo_core``: a line per step without the
    progress bar, warnings) on stderr, as the commands print them."""
    log = logging.getLogger("comppo_core")
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def describe_start(trainer: Any) -> str:
    """The run's first lines: where and with how many threads it computes, the response
    budget, the evaluation set and, for a JSONL task, its split (a reasoning-gym task: its
    dataset and answer format)."""
    cfg = trainer.config
    threads = "torch's default threads" if trainer.threads is None else f"{trainer.threads} torch thread(s) per process"
    why = " (--num-threads to change)" if cfg.num_threads is None else ""
    budget = "--max-new-tokens" if cfg.max_new_tokens is not None else "the task's default; --max-new-tokens to change"
    task = trainer.task
    split = ""
    if hasattr(task, "train_rows"):
        split = f" ({len(task.train_rows)} training and {len(task.heldout_rows)} held-out rows of {task.path})"
    elif hasattr(task, "answer_format"):  # reasoning-gym: which dataset, how the answer is asked for
        split = f" of {task.describe()}, answer format {task.answer_format}"
    return (
        f"comppo-core train: {cfg.arm}, seed {cfg.seed}, {cfg.steps} steps on {trainer.device}, {threads}{why}\n"
        f"  response budget: {trainer.max_new_tokens} tokens ({budget}); held-out evaluation: "
        f"{len(trainer.eval_problems)} problems{split}"
    )
