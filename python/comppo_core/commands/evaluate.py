"""``comppo-core evaluate``: the held-out greedy accuracy of a saved model, nothing else.

``comppo-core evaluate --model DIR`` loads the causal LM and the tokenizer saved in ``DIR``
(:func:`comppo_core.rl.models.pretrained.load_policy`, :func:`~comppo_core.rl.models.pretrained.load_tokenizer`),
builds the task as the trainer does (:func:`comppo_core.rl.tasks.build_task`: a registered
task, e.g. the built-in addition task, its split fixed by ``--digits``, ``--split-seed`` and
``--heldout-fraction``, or ``--task FILE.jsonl``), takes the same evaluation set
(``task.heldout(--eval-size)``) and prints the accuracy of greedy decoding on it
(:func:`comppo_core.rl.engine.evaluation.heldout_rewards`, the computation of
:meth:`comppo_core.rl.Trainer.evaluate`)::

    comppo-core evaluate: runs/x/warmstart: held-out accuracy 53.9% (1091 of 2024 problems, 2-digit addition) in 12 s

A directory the trainer saved (``OUT/warmstart``) holds ``task.json``, the run's task:
its task, digits, split seed, held-out fraction and chat-template setting are then the
defaults, so ``comppo-core evaluate --model runs/x/warmstart`` evaluates the run's own
held-out set. The flags given override them; without ``task.json`` the defaults are
:class:`~comppo_core.rl.TrainConfig`'s. ``--json FILE`` also writes the numbers, the task
and the settings as JSON (atomically: a temporary file renamed into place). Its
``problems`` is the number of held-out problems evaluated: ``--eval-size`` is an upper
bound (a split with fewer problems is evaluated whole: 2024 for 2-digit addition), so
the JSON gives the requested size as ``settings.eval_size_requested``.

Exit status: 0 on success; 2 on a bad flag, a ``--model`` that is not a directory or holds
no tokenizer, a bad task file or split (one line naming the flag), all checked before
torch is imported where they can be; 1 without the ``[rl]`` extra.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from ..rl.config import TrainConfig
from ..rl.models.pretrained import check_model_directory
from ..rl.runs import run_dir
from ..rl.tasks import TASKS, build_task
from .train import percent, require_rl_extra, usage_error

__all__ = ["add_parser", "run", "saved_task_settings"]


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``evaluate`` command on the ``comppo-core`` parser."""
    cmd = subparsers.add_parser(
        "evaluate",
        help="held-out greedy accuracy of a saved model (a run's warmstart/ or checkpoint/actor, or yours) "
        "(needs [rl])",
        description=(
            "Load the model and tokenizer saved in --model DIR, build the task as the trainer does and print the "
            "greedy accuracy on its held-out problems. Defaults: DIR/task.json (written with a run's warm start), "
            "then the TrainConfig defaults; the flags given override both."
        ),
    )
    cmd.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="a local Hugging Face model directory with its tokenizer (a run's warmstart/ or checkpoint/actor)",
    )
    cmd.add_argument(
        "--task",
        default=None,
        metavar="TASK",
        help=", ".join(e.name for e in TASKS.values() if e.file_suffix is None)
        + " (the registered tasks) or "
        + " or ".join(f"a {e.file_suffix} file" for e in TASKS.values() if e.file_suffix is not None)
        + " (default: DIR/task.json's, else addition)",
    )
    cmd.add_argument(
        "--eval-size",
        type=_integer,
        default=None,
        metavar="N",
        help="held-out problems to evaluate at most (all of them if the split has fewer), as the trainer's "
        "eval_size (default: 2048)",
    )
    cmd.add_argument(
        "--digits",
        type=_integer,
        default=None,
        metavar="D",
        help="addition: operands below 10**D (default: DIR/task.json's, else 2)",
    )
    cmd.add_argument(
        "--split-seed",
        type=_integer,
        default=None,
        metavar="S",
        help="fixes which problems are held out (default: DIR/task.json's, else 0)",
    )
    cmd.add_argument(
        "--heldout-fraction",
        type=_number,
        default=None,
        metavar="F",
        help="share of problems held out (default: DIR/task.json's, else 0.2)",
    )
    cmd.add_argument(
        "--max-new-tokens",
        type=_integer,
        default=None,
        metavar="N",
        help="response budget in tokens (default: the task's longest response; 256 for a .jsonl task)",
    )
    cmd.add_argument(
        "--chat-template",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="each prompt as one user turn of the tokenizer's chat template, if it has one (default: "
        "DIR/task.json's, else off)",
    )
    cmd.add_argument(
        "--device",
        default=None,
        metavar="DEVICE",
        help="auto (cuda when available, else cpu), cpu, cuda or cuda:N (default: auto)",
    )
    cmd.add_argument(
        "--num-threads",
        type=_integer,
        default=None,
        metavar="N",
        help="torch threads (default: 1, as the trainer on CPU)",
    )
    cmd.add_argument(
        "--json",
        default=None,
        metavar="FILE",
        help="also write the accuracy, counts, model, task and settings to FILE as JSON",
    )
    cmd.set_defaults(run=run, command_parser=cmd)
    return cmd


def saved_task_settings(model_dir: Path) -> tuple[dict[str, Any], Path | None]:
    """The TrainConfig fields ``model_dir/task.json`` gives defaults for, and the file
    (``({}, None)`` without one). The file is what the trainer writes beside its warm start,
    ``{**task.to_dict(), "tokenizer": tokenizer.to_dict()}``; a file that is not a JSON
    object is a :class:`~comppo_core.errors.ParameterError` naming ``model``."""
    path = model_dir / "task.json"
    if not path.is_file():
        return {}, None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ParameterError(
            f"model: {str(path)!r}: expected the task the trainer saved, as JSON, got an unreadable file: {exc}",
            argument="model",
        ) from None
    if not isinstance(saved, dict):
        raise ParameterError(
            f"model: {str(path)!r}: expected the task the trainer saved, as a JSON object, got {type(saved).__name__}",
            argument="model",
        )
    out: dict[str, Any] = {}
    name = saved.get("name")
    entry = TASKS.get(name) if isinstance(name, str) else None  # the registry's: a name, or a file task's path
    if entry is not None and entry.file_suffix is None:
        out["task"] = entry.name
    elif entry is not None and "path" in saved:
        out["task"] = saved["path"]
    else:  # a task.json without a registered task: its sizes read as the default task's
        entry = TASKS[TrainConfig.task]
    fields = {"split_seed": "split_seed", "heldout_fraction": "heldout_fraction", **entry.sizes}
    out.update({field: saved[key] for key, field in fields.items() if key in saved})
    tokenizer = saved.get("tokenizer")
    if isinstance(tokenizer, dict) and "chat_template" in tokenizer:
        out["chat_template"] = tokenizer["chat_template"]
    evaluation = saved.get("evaluation")  # the run's own evaluation set and response budget
    if isinstance(evaluation, dict):
        out.update({k: evaluation[k] for k in ("eval_size", "max_new_tokens") if k in evaluation})
    return out, path


def _config(args: argparse.Namespace, cmd: argparse.ArgumentParser, model_dir: Path) -> tuple[TrainConfig, Path | None]:
    """The settings: the flags given, then ``DIR/task.json``, then the TrainConfig defaults."""
    try:
        saved, task_json = saved_task_settings(model_dir)
    except ParameterError as exc:
        usage_error(cmd, exc)
    given = {
        name: getattr(args, name)
        for name in ("task", "eval_size", "digits", "split_seed", "heldout_fraction", "max_new_tokens")
        + ("chat_template", "device", "num_threads")
        if getattr(args, name) is not None
    }
    try:
        config = TrainConfig(model=str(model_dir), progress=False, **{**saved, **given})
    except ParameterError as exc:
        if exc.argument in saved and exc.argument not in given:  # the file, not a flag, is at fault
            usage_error(cmd, ParameterError(f"model: {str(task_json)!r}: {exc}", argument="model"))
        usage_error(cmd, exc)
    return config, task_json


def _count(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core evaluate``; returns the exit status."""
    cmd: argparse.ArgumentParser = args.command_parser
    t0 = time.perf_counter()
    # ---- everything that needs no torch: the paths, the settings, the task and its held-out set
    try:
        model_dir = check_model_directory(args.model)
    except ParameterError as exc:
        usage_error(cmd, exc)
    json_path = None if args.json is None else Path(args.json)
    if json_path is not None and (json_path.is_dir() or not json_path.parent.is_dir()):
        what = "is a directory" if json_path.is_dir() else "whose directory does not exist"
        cmd.error(f"--json: expected a file to write, got {args.json!r}, which {what}")
    config, task_json = _config(args, cmd, model_dir)
    try:
        task = build_task(config)
        problems = task.heldout(config.eval_size)
    except ParameterError as exc:
        usage_error(cmd, exc)
    require_rl_extra("evaluate")

    # ---- the model
    import torch

    from ..rl.engine.distributed import resolve_device
    from ..rl.engine.evaluation import heldout_rewards
    from ..rl.models.pretrained import load_policy, load_tokenizer

    try:
        device = resolve_device(config.device)
        tokenizer = load_tokenizer(model_dir, chat_template=config.chat_template)
        actor = load_policy(model_dir).to(device)
    except ParameterError as exc:
        usage_error(cmd, exc)
    torch.set_num_threads(1 if config.num_threads is None else config.num_threads)  # the trainer's rule on CPU
    max_new_tokens = config.max_new_tokens or task.max_new_tokens
    rewards = heldout_rewards(actor, tokenizer, task, problems, max_new_tokens=max_new_tokens, device=device)
    correct = sum(rewards)
    accuracy = correct / len(rewards)
    seconds = time.perf_counter() - t0
    description = task.describe()
    print(
        f"comppo-core evaluate: {args.model}: held-out accuracy {percent(accuracy)} ({_count(correct)} of "
        f"{len(rewards)} problems, {description}) in {seconds:.0f} s"
    )
    if json_path is not None:
        run_dir.write_json_atomic(
            json_path,
            {
                "model": str(model_dir.resolve()),
                "accuracy": accuracy,
                "correct": int(correct) if float(correct).is_integer() else correct,
                "problems": len(rewards),
                "task": {**task.to_dict(), "description": description},
                "tokenizer": tokenizer.to_dict(),
                "settings": {
                    "eval_size_requested": config.eval_size,
                    "max_new_tokens": max_new_tokens,
                    "chat_template": tokenizer.chat_template,
                    "device": str(device),
                    "num_threads": torch.get_num_threads(),
                    "task_json": None if task_json is None else str(task_json.resolve()),
                },
                "seconds": seconds,
            },
        )
    return 0
