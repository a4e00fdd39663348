"""``comppo-core evaluate``: frozen evaluation of a saved policy, nothing else.

``comppo-core evaluate --model DIR`` loads the causal LM and the tokenizer saved in ``DIR``
(:func:`comppo_core.rl.models.pretrained.load_policy`, :func:`~comppo_core.rl.models.pretrained.load_tokenizer`:
a run's ``warmstart/`` or ``checkpoint/actor``, a TRL output directory, any model saved with
``save_pretrained`` beside its tokenizer), or ``--model FILE.gguf`` the model and tokenizer of
a GGUF file (:mod:`comppo_core.rl.models.gguf`; no ``task.json`` then), builds each task as the trainer does
(:func:`comppo_core.rl.tasks.build_task`: a registered task, e.g. the built-in addition
task, its split fixed by ``--digits``, ``--split-seed`` and ``--heldout-fraction``, or
``--task FILE.jsonl``; ``--task`` may be given several times), takes the same evaluation
set (``task.heldout(--eval-size)``) and prints the accuracy of greedy decoding on it
(:func:`comppo_core.rl.engine.evaluation.task_evaluation`, the computation of
:meth:`comppo_core.rl.Trainer.evaluate`)::

    comppo-core evaluate: runs/x/warmstart: held-out accuracy 53.9% (1091 of 2024 problems, 2-digit addition) in 12 s

``--samples N`` also draws ``N`` responses per problem (``--temperature``, default 1,
``--top-p``, default 1; keyed by ``--seed``, so a seed gives the same draws on any batch
size: :mod:`comppo_core.rl.engine.evaluation`) and reports pass@k for k = 1, 2, 4, … ≤ N
by the unbiased estimator (:mod:`comppo_core.experiments.pass_at_k`). One line per task,
then, with several tasks, their macro average (each task counts once)::

    comppo-core evaluate: M: held-out accuracy 68.8% (11 of 16 problems, 1-digit addition), sampled pass@1 59.4%, pass@2 67.7%, pass@4 75.0% (4 samples) in 0 s
    comppo-core evaluate: M: held-out accuracy 0.0% (0 of 16 problems, 2-digit addition between fillers (0-16, tail 0-16)), sampled pass@1 0.0%, pass@2 0.0%, pass@4 0.0% (4 samples) in 0 s
    comppo-core evaluate: M: macro over 2 tasks: held-out accuracy 34.4%, sampled pass@1 29.7%, pass@2 33.9%, pass@4 37.5% (4 samples) in 4 s

``--batch-size`` bounds the sequences of one ``generate`` call (greedy and sampled).
``--temperature``, ``--top-p`` or ``--seed`` without ``--samples`` is refused.

A directory the trainer saved (``OUT/warmstart``) holds ``task.json``, the run's task:
without ``--task`` that task is evaluated, and for that task its digits, split seed,
held-out fraction, evaluation size and response budget are the defaults, so
``comppo-core evaluate --model runs/x/warmstart`` evaluates the run's own held-out set;
its chat-template setting is the default for every task. The flags given override them
(for every task); a task other than the run's gets :class:`~comppo_core.rl.TrainConfig`'s
defaults, as every task does without ``task.json``.

``--json FILE`` also writes the numbers (atomically: a temporary file renamed into
place)::

    {"model": DIR,
     "tasks": {TASK: {"task": {...}, "eval_size_requested": …, "max_new_tokens": …,
                      "problems": P, "greedy_correct": [0 or 1 per problem],
                      "n": N, "correct": [passing samples per problem],   # with --samples N
                      "accuracy": …, "greedy_pass@1": …,
                      "pass@1": …, "pass@2": …, …,                          # with --samples N
                      "seconds": …}},
     "macro": {"accuracy": …, "greedy_pass@1": …, "pass@1": …, …},
     "tokenizer": {...}, "settings": {"samples": {...} or None, "batch_size": …, ...}, "seconds": …}

``TASK`` is the ``--task`` as given (a registered name, or the file's path). A response
passes when its reward is at least 1 (:data:`~comppo_core.experiments.pass_at_k.PASS_REWARD`);
``accuracy`` is the mean greedy reward, the trainer's number, and equals ``greedy_pass@1``
for a 0/1 verifier (every built-in task). With one task and no ``--samples`` the file
also keeps the keys of the one-task report, unchanged: ``accuracy``, ``correct`` (the
greedy count), ``problems``, ``task`` at the top and ``eval_size_requested``,
``max_new_tokens`` in ``settings``; with several tasks or ``--samples`` read ``tasks``
and ``macro``. ``problems`` is the number of held-out problems evaluated:
``--eval-size`` is an upper bound (a split with fewer problems is evaluated whole: 2024
for 2-digit addition), so the JSON gives the requested size as ``eval_size_requested``.

Exit status: 0 on success; 2 on a bad flag, a ``--model`` that is neither a GGUF file nor a
directory holding a tokenizer (a training run's directory is refused naming its
``checkpoint/actor`` and ``warmstart``), a bad task file or split (one line naming the flag), all checked before
torch is imported where they can be; 1 without the ``[rl]`` extra.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from ..experiments.pass_at_k import macro
from ..rl.config import KeyValueAction, TrainConfig
from ..rl.engine.evaluation import Sampling, TaskEvaluation, check_batch_size
from ..rl.models.pretrained import check_model_path
from ..rl.runs import run_dir
from ..rl.tasks import TASKS, Task, build_task
from ..rl.tasks.base import Problem
from .train import percent, require_rl_extra, usage_error

__all__ = ["add_parser", "run", "saved_task_settings"]

#: Rows of one ``generate`` call (``--batch-size``): greedy, and samples of several problems.
DEFAULT_BATCH_SIZE = 256
#: task.json's settings that hold for every task (the tokenizer's); the others are its task's.
_MODEL_SETTINGS = ("chat_template",)


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
        help="frozen evaluation of a saved model (a run's warmstart/ or checkpoint/actor, a TRL output, yours, a "
        "GGUF file): "
        "held-out greedy accuracy, pass@k with --samples (needs [rl])",
        description=(
            "Load the model and tokenizer saved in --model DIR (or the GGUF file --model FILE.gguf), build each "
            "--task as the trainer does and print the "
            "greedy accuracy on its held-out problems, with --samples N also pass@k (k = 1, 2, 4, ... <= N, the "
            "unbiased estimator), per task and macro-averaged over the tasks. Defaults: DIR/task.json (written "
            "with a run's warm start) for its task, then the TrainConfig defaults; the flags given override both."
        ),
    )
    cmd.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="a local Hugging Face model directory with its tokenizer (a run's warmstart/ or checkpoint/actor), "
        "or a GGUF file (FILE.gguf: its model and tokenizer, read by transformers' GGUF loader; needs "
        "comppo-core[gguf])",
    )
    cmd.add_argument(
        "--task",
        action="append",
        default=None,
        metavar="TASK",
        help=", ".join(e.spelling for e in TASKS.values() if e.file_suffix is None)
        + " (the registered tasks) or "
        + " or ".join(f"a {e.file_suffix} file" for e in TASKS.values() if e.file_suffix is not None)
        + "; give it again for more tasks, each evaluated on its held-out split (default: DIR/task.json's, "
        "else addition)",
    )
    cmd.add_argument(
        "--task-option",
        dest="task_options",
        action=KeyValueAction,
        default=None,
        metavar="KEY=VALUE",
        help="a setting of a task that takes them (reasoning_gym:NAME: its dataset's), once per setting, the value "
        "read as JSON when it parses (default: DIR/task.json's for its task, else none)",
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
        "--samples",
        type=_integer,
        default=None,
        metavar="N",
        help="also sample N responses per problem and report pass@k for k = 1, 2, 4, ... <= N (unbiased "
        "estimator; default: greedy only)",
    )
    cmd.add_argument(
        "--temperature",
        type=_number,
        default=None,
        metavar="T",
        help="sampling temperature of --samples (default: 1.0)",
    )
    cmd.add_argument(
        "--top-p",
        type=_number,
        default=None,
        metavar="P",
        help="nucleus threshold of --samples (default: 1.0, off)",
    )
    cmd.add_argument(
        "--seed",
        type=_integer,
        default=None,
        metavar="S",
        help="keys the --samples draws: the same seed, the same samples (default: 0)",
    )
    cmd.add_argument(
        "--batch-size",
        type=_integer,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"sequences per generate call, greedy or sampled (default: {DEFAULT_BATCH_SIZE})",
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
        help="also write every task's numbers (per-problem counts, pass@k), the macro average, the model and the "
        "settings to FILE as JSON",
    )
    cmd.set_defaults(run=run, command_parser=cmd)
    return cmd


def saved_task_settings(model_dir: Path) -> tuple[dict[str, Any], Path | None]:
    """The TrainConfig fields ``model_dir/task.json`` gives defaults for, and the file
    (``({}, None)`` without one). The file is what the trainer writes beside its warm start,
    ``{**task.to_dict(), "tokenizer": tokenizer.to_dict()}``; a file that is not a JSON
    object is a :class:`~comppo_core.errors.ParameterError` naming ``model``. A GGUF file
    (``model_dir`` a file) has none."""
    path = model_dir / "task.json"
    if model_dir.is_file() or not path.is_file():
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


def _task_configs(
    args: argparse.Namespace, cmd: argparse.ArgumentParser, model_dir: Path
) -> tuple[list[tuple[str, TrainConfig]], Path | None]:
    """Each task's settings, ``(TASK as given, config)``: the flags given, then
    ``DIR/task.json`` (its task's settings for its task alone, its tokenizer's for every
    task), then the TrainConfig defaults."""
    try:
        saved, task_json = saved_task_settings(model_dir)
    except ParameterError as exc:
        usage_error(cmd, exc)
    common = {k: v for k, v in saved.items() if k in _MODEL_SETTINGS}
    own = {k: v for k, v in saved.items() if k not in _MODEL_SETTINGS}
    saved_task = own.pop("task", TrainConfig.task)
    given = {
        name: getattr(args, name)
        for name in ("eval_size", "digits", "split_seed", "heldout_fraction", "max_new_tokens", "task_options")
        + ("chat_template", "device", "num_threads")
        if getattr(args, name) is not None
    }
    names = args.task or [saved_task]
    twice = next((t for i, t in enumerate(names) if t in names[:i]), None)
    if twice is not None:
        cmd.error(f"--task: expected each task once, got {twice!r} twice")
    out = []
    for name in names:
        from_file = {**common, **(own if _same_task(name, saved_task) else {})}
        try:
            config = TrainConfig(model=str(model_dir), progress=False, task=name, **{**from_file, **given})
        except ParameterError as exc:
            if exc.argument in from_file and exc.argument not in given:  # the file, not a flag, is at fault
                usage_error(cmd, ParameterError(f"model: {str(task_json)!r}: {exc}", argument="model"))
            usage_error(cmd, exc)
        out.append((name, config))
    return out, task_json


def _same_task(a: str, b: str) -> bool:
    """Whether two ``--task`` values name the same task (a file by any spelling of its path)."""
    return a == b or (a not in TASKS and b not in TASKS and Path(a).resolve() == Path(b).resolve())


def _sampling(args: argparse.Namespace, cmd: argparse.ArgumentParser) -> Sampling | None:
    """``--samples`` and its settings (None without it); a sampling flag without it is refused."""
    rest = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    if args.samples is None:
        stray = next((name for name, value in rest.items() if value is not None), None)
        if stray is not None:
            flag = "--" + stray.replace("_", "-")
            cmd.error(f"{flag}: expected with --samples N (greedy decoding draws nothing), got {rest[stray]!r} alone")
        return None
    try:
        return Sampling(args.samples, **{name: value for name, value in rest.items() if value is not None})
    except ParameterError as exc:
        usage_error(cmd, exc)


def _count(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def _line(model: str, what: str, numbers: dict[str, float], sampling: Sampling | None, seconds: float) -> str:
    """One printed line: ``what`` is the task's accuracy and counts, or the macro's."""
    out = f"comppo-core evaluate: {model}: {what}"
    if numbers["greedy_pass@1"] != numbers["accuracy"]:  # a verifier with partial rewards
        out += f", greedy pass@1 {percent(numbers['greedy_pass@1'])}"
    if sampling is not None:
        ks = [key for key in numbers if key.startswith("pass@")]
        out += ", sampled " + ", ".join(f"{key} {percent(numbers[key])}" for key in ks)
        out += f" ({sampling.samples} samples)"
    return f"{out} in {seconds:.0f} s"


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core evaluate``; returns the exit status."""
    cmd: argparse.ArgumentParser = args.command_parser
    t0 = time.perf_counter()
    # ---- everything that needs no torch: the paths, the settings, the tasks and their held-out sets
    try:
        model_dir = check_model_path(args.model)
    except ParameterError as exc:
        usage_error(cmd, exc)
    json_path = None if args.json is None else Path(args.json)
    if json_path is not None and (json_path.is_dir() or not json_path.parent.is_dir()):
        what = "is a directory" if json_path.is_dir() else "whose directory does not exist"
        cmd.error(f"--json: expected a file to write, got {args.json!r}, which {what}")
    sampling = _sampling(args, cmd)
    try:
        batch_size = check_batch_size(args.batch_size)
    except ParameterError as exc:
        usage_error(cmd, exc)
    configs, task_json = _task_configs(args, cmd, model_dir)
    tasks: list[tuple[str, TrainConfig, Task, list[Problem]]] = []
    for name, config in configs:
        try:
            task = build_task(config)
            problems = task.heldout(config.eval_size)
        except ParameterError as exc:
            usage_error(cmd, exc)
        if not problems:
            cmd.error(f"--task: expected a task with held-out problems, got {name!r}, which holds none out")
        tasks.append((name, config, task, problems))
    require_rl_extra("evaluate")

    # ---- the model, then each task
    import torch

    from ..rl.engine.distributed import resolve_device
    from ..rl.engine.evaluation import task_evaluation
    from ..rl.models.pretrained import load_policy, load_tokenizer

    first = configs[0][1]  # the device, the threads and the chat template are every task's
    try:
        device = resolve_device(first.device)
        tokenizer = load_tokenizer(model_dir, chat_template=first.chat_template)
        actor = load_policy(model_dir).to(device)
    except ParameterError as exc:
        usage_error(cmd, exc)
    torch.set_num_threads(1 if first.num_threads is None else first.num_threads)  # the trainer's rule on CPU
    results: dict[str, dict[str, Any]] = {}  # the JSON's tasks
    evaluations: list[TaskEvaluation] = []
    for name, config, task, problems in tasks:
        t_task = time.perf_counter()
        max_new_tokens = config.max_new_tokens or task.max_new_tokens
        evaluation = task_evaluation(
            actor, tokenizer, task, problems, max_new_tokens=max_new_tokens, device=device, batch_size=batch_size,
            sampling=sampling,
        )  # fmt: skip
        seconds = time.perf_counter() - t_task
        description = task.describe()
        results[name] = {
            "task": {**task.to_dict(), "description": description},
            "eval_size_requested": config.eval_size,
            "max_new_tokens": max_new_tokens,
            **evaluation.to_dict(),
            "seconds": seconds,
        }
        evaluations.append(evaluation)
        numbers = evaluation.numbers()
        what = (
            f"held-out accuracy {percent(numbers['accuracy'])} ({_count(evaluation.reward_sum)} of "
            f"{evaluation.problems} problems, {description})"
        )
        print(_line(args.model, what, numbers, sampling, seconds), flush=True)
    averaged = macro([e.numbers() for e in evaluations])
    seconds = time.perf_counter() - t0
    if len(results) > 1:
        what = f"macro over {len(results)} tasks: held-out accuracy {percent(averaged['accuracy'])}"
        print(_line(args.model, what, averaged, sampling, seconds))
    if json_path is not None:
        settings: dict[str, Any] = {
            "samples": None if sampling is None else sampling.to_dict(),
            "batch_size": batch_size,
            "chat_template": tokenizer.chat_template,
            "device": str(device),
            "num_threads": torch.get_num_threads(),
            "task_json": None if task_json is None else str(task_json.resolve()),
        }
        report = _report(model_dir, results, averaged, evaluations, sampling, settings)
        report.update(tokenizer=tokenizer.to_dict(), settings=settings, seconds=seconds)
        run_dir.write_json_atomic(json_path, report)
    return 0


def _report(
    model_dir: Path,
    results: dict[str, dict[str, Any]],
    averaged: dict[str, float],
    evaluations: list[TaskEvaluation],
    sampling: Sampling | None,
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The JSON's model, tasks and macro; with one task and no ``--samples`` also the
    one-task report's keys, as before (module docstring), ``settings`` updated in place."""
    report: dict[str, Any] = {"model": str(model_dir.resolve()), "tasks": results, "macro": averaged}
    if len(results) == 1 and sampling is None:
        entry = next(iter(results.values()))
        total = evaluations[0].reward_sum
        report.update(
            accuracy=entry["accuracy"],
            correct=int(total) if total.is_integer() else total,
            problems=entry["problems"],
            task=entry["task"],
        )
        settings.update(eval_size_requested=entry["eval_size_requested"], max_new_tokens=entry["max_new_tokens"])
    return report
