"""``comppo-core diagnose``: will the gate help on this model and task? Measured before training.

``comppo-core diagnose --out DIR`` samples responses to ``--prompts`` held-out problems of
``--task``, estimates each chosen response token's pivotality by Monte Carlo (the change it
makes to the policy's success probability, from ``--samples-per-prefix`` continuations per
prefix) and ranks the tokens by the attention concentration of every statistic and layer
and by the baselines (position, policy entropy, token NLL, token class), with bootstrap
intervals over responses; then it recommends the gate direction
(:mod:`comppo_core.experiments.diagnose`)::

    comppo-core diagnose --task chain --seed 0 --out diag/chain0
    comppo-core diagnose --model runs/x/warmstart --out diag/x          # a saved policy, its task.json's task
    comppo-core diagnose --model ~/models/my-sft --task data.jsonl --out diag/mine --prompts 16 --positions 8

The policy is ``--model DIR`` (a local Hugging Face model with its tokenizer: a run's
``warmstart/`` or ``checkpoint/actor``, a TRL output, yours; or a GGUF file,
``--model FILE.gguf``, :mod:`comppo_core.rl.models.gguf`; ``DIR/task.json``, written with a
run's warm start, gives the task's settings under the flags given, as for ``comppo-core
evaluate``), ``--init-from DIR`` (a built-in task's saved warm start), or, with neither, the
built-in task's SFT warm start made here exactly as ``comppo-core train`` and ``compare``
make it for ``--seed`` (the TrainConfig flags, ``--warmup-sft-steps``, ``--sft-carry-noise``,
the task's sizes, ... set it). Every other TrainConfig flag is accepted and read where it
applies: ``--temperature``, ``--top-p`` (the policy's sampling: responses and
continuations), ``--max-new-tokens``, ``--statistic`` (the statistic the recommendation
reads; every statistic is reported), ``--seed`` (the warm start and every draw here),
``--device``, ``--num-threads``, ``--progress/--no-progress``.

``--critic RUN`` (a ``train`` run whose checkpoint holds a critic, not LoRA) takes the run's
checkpointed actor as the policy and compares its critic's values of the prefixes with the
Monte-Carlo values (explained variance with its interval, MSE).

Writes ``DIR/diagnosis.json``, ``DIR/diagnosis.md`` and ``DIR/diagnosis.png`` (each atomically);
an existing non-empty ``--out`` is refused unless ``--overwrite`` (then only these three files
are replaced). Prints the cost estimate (continuations, generated tokens, and seconds from a
timed first and last batch) before the bulk of the work, a progress bar, then the recommendation.

Exit status: 0 on success; 2 on a bad flag (one line naming it; checked before torch is
imported where it can be); 1 without the ``[rl]`` extra.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from ..experiments.pivotality import POSITION_CHOICES
from ..rl.config import TrainConfig
from ..rl.models.pretrained import check_model_path
from ..rl.tasks import TASKS, size_fields
from ._argtypes import nonnegative_int, positive_int, unit_float
from .evaluate import saved_task_settings
from .train import _Default, add_config_arguments, config_fields, require_rl_extra, usage_error

__all__ = ["add_parser", "run"]

#: The TrainConfig fields whose flags ``--help`` lists (with every task's sizes): the policy, the task,
#: the sampling, where to compute and write. The others are accepted and read where they apply (the
#: built-in warm start's model and SFT settings), or refused (resume), but not listed.
LISTED_FIELDS = (
    "model", "init_from", "chat_template", "task", "task_options", "split_seed", "heldout_fraction",
    "warmup_sft_steps", "sft_carry_noise", "seed", "temperature", "top_p", "max_new_tokens", "statistic",
    "device", "dtype", "num_threads", "progress", "out",
)  # fmt: skip

#: The default budget (docs/diagnose.md gives its cost on the built-in tasks).
DEFAULT_PROMPTS = 32
DEFAULT_SAMPLES = 16
DEFAULT_BATCH_SIZE = 256
DEFAULT_THRESHOLD = 0.25
DEFAULT_BOOTSTRAP = 1000
#: What diagnose writes in --out.
OUTPUTS = ("diagnosis.json", "diagnosis.md", "diagnosis.png")


def _positions(text: str) -> int | None:
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'all' or an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 'all' or an integer >= 1, got {value}")
    return value


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``diagnose`` command on the ``comppo-core`` parser."""
    cmd = subparsers.add_parser(
        "diagnose",
        help="will the gate help? concentration against Monte-Carlo pivotality on held-out responses, with "
        "bootstrap CIs and a gate direction (needs [rl])",
        epilog=(
            "Every other flag of comppo-core train is accepted too and read where it applies (the built-in warm "
            "start's --model-* and --sft-* settings, say); comppo-core train --help lists them."
        ),
        description=(
            "Sample responses to held-out problems, estimate each token's pivotality |V(prefix+token) - V(prefix)| "
            "from continuations sampled from the policy, and report how well the attention concentration (every "
            "statistic and layer) and the baselines (position, policy entropy, token NLL, token class) rank the "
            "pivotal tokens: AUC and Spearman with bootstrap CIs over responses, and the gate direction to use. "
            "The policy: --model DIR (or FILE.gguf), --init-from DIR, or the built-in task's SFT warm start for "
            "--seed (as train makes it). Writes diagnosis.json, diagnosis.md and diagnosis.png in --out."
        ),
    )
    group = cmd.add_argument_group("diagnose")
    group.add_argument(
        "--prompts",
        type=positive_int,
        default=DEFAULT_PROMPTS,
        metavar="N",
        help=f"held-out problems, one response each (default: {DEFAULT_PROMPTS})",
    )
    group.add_argument(
        "--samples-per-prefix",
        type=positive_int,
        default=DEFAULT_SAMPLES,
        metavar="K",
        help=f"continuations sampled per prefix for its value (default: {DEFAULT_SAMPLES})",
    )
    group.add_argument(
        "--positions",
        type=_positions,
        default=None,
        metavar="all|N",
        help="response tokens scored per response: all, or N of them (default: all)",
    )
    group.add_argument(
        "--position-choice",
        choices=POSITION_CHOICES,
        default="even",
        help="with --positions N: evenly spread, random, or a contiguous window at a random start (seeded; "
        "default: even)",
    )
    group.add_argument(
        "--greedy",
        action="store_true",
        help="greedy responses (default: sampled at --temperature and --top-p, as the trainer's rollouts); the "
        "continuations are always sampled",
    )
    group.add_argument(
        "--pivotal-threshold",
        type=unit_float,
        default=DEFAULT_THRESHOLD,
        metavar="D",
        help=f"a token is pivotal when |V after - V before| >= D, for the AUC (default: {DEFAULT_THRESHOLD})",
    )
    group.add_argument(
        "--bootstrap",
        type=nonnegative_int,
        default=DEFAULT_BOOTSTRAP,
        metavar="B",
        help=f"bootstrap resamples over responses for the 95%% intervals (default: {DEFAULT_BOOTSTRAP})",
    )
    group.add_argument(
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH_SIZE,
        metavar="N",
        help=f"sequences per generate call and per scoring forward (default: {DEFAULT_BATCH_SIZE})",
    )
    group.add_argument(
        "--critic",
        default=None,
        metavar="RUN",
        help="a train run whose checkpoint holds a critic (RUN/checkpoint): its actor is the policy, and the "
        "critic's values are compared with the Monte-Carlo values (explained variance); not with --model or "
        "--init-from",
    )
    listed = {*LISTED_FIELDS, *size_fields()}
    add_config_arguments(cmd, hidden=tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name not in listed))
    for action in cmd._actions:
        if action.dest == "out":
            action.metavar = "DIR"
            action.help = "the directory to write diagnosis.json, diagnosis.md and diagnosis.png in (required)"
        elif action.dest == "overwrite":
            action.help = "write into a non-empty --out (only diagnosis.json, .md and .png are replaced)"
    cmd.set_defaults(run=run, command_parser=cmd)
    return cmd


def _check_out(cmd: argparse.ArgumentParser, out: Any, overwrite: bool) -> Path:
    """``--out`` as a path: a new or empty directory (made with its missing parents when the
    report is written, as ``train`` makes its ``--out``), or any with ``--overwrite``."""
    if not isinstance(out, str):
        cmd.error("--out: expected the directory to write diagnosis.json, diagnosis.md and diagnosis.png in")
    path = Path(out)
    if path.exists() and not path.is_dir():
        cmd.error(f"--out: expected a directory, got {out!r}, a file")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        cmd.error(f"--out: expected a new or empty directory, got {out!r}, which holds files (--overwrite replaces "
                  "diagnosis.json, .md and .png there)")  # fmt: skip
    existing = next(parent for parent in path.absolute().parents if parent.exists())
    if not path.exists() and not existing.is_dir():
        cmd.error(f"--out: expected a directory that can be made, got {out!r}, under the file {str(existing)!r}")
    return path


def _same_task(a: str, b: str) -> bool:
    """Whether two ``--task`` values name the same task (a file by any spelling of its path)."""
    return a == b or (a not in TASKS and b not in TASKS and Path(a).resolve() == Path(b).resolve())


def _critic_run(args: argparse.Namespace, cmd: argparse.ArgumentParser) -> tuple[Path, TrainConfig] | None:
    """With ``--critic RUN``: the run's checkpoint directory and its config (the policy is its
    ``actor/``); a usage error naming ``--critic`` when RUN holds no checkpoint, its arm has
    no critic, or it trained a LoRA adapter; ``--model`` and ``--init-from`` are refused."""
    if args.critic is None:
        return None
    for name in ("model", "init_from"):
        if not isinstance(getattr(args, name), _Default):
            cmd.error(f"--{name.replace('_', '-')}: expected no policy with --critic (the policy is the run's actor)")
    from ..rl.core.arms import get_arm
    from ..rl.runs.run_dir import saved_checkpoint

    found = saved_checkpoint(Path(args.critic))
    if found is None:
        cmd.error(f"--critic: expected a train run with a checkpoint, got {args.critic!r}, which holds none")
    ckpt = found[0]
    try:
        run_config = TrainConfig.from_json((ckpt / "config.json").read_text(encoding="utf-8"))
        arm = get_arm(run_config.arm)
    except (OSError, ParameterError) as exc:
        cmd.error(f"--critic: {str(ckpt / 'config.json')!r}: {exc}")
    if arm.critic is None:
        cmd.error(f"--critic: expected a run whose arm has a critic, got {args.critic!r}, a {arm.name!r} run")
    if run_config.lora_rank:
        cmd.error(
            f"--critic: expected a run without LoRA (its checkpoint holds the adapter alone), got {args.critic!r}"
        )
    args.model = str(ckpt / "actor")
    return ckpt, run_config


def _config(args: argparse.Namespace, cmd: argparse.ArgumentParser) -> tuple[TrainConfig, Path | None]:
    """The settings: the flags given, then ``--model DIR``'s task.json, then the preset and defaults."""
    if args.resume is True:
        cmd.error("--resume: diagnose starts nothing to resume")
    given = config_fields(args)
    saved: dict[str, Any] = {}
    task_json = None
    model = given.get("model")
    if model is not None:
        try:
            model_dir = check_model_path(model)
            saved, task_json = saved_task_settings(model_dir)
        except ParameterError as exc:
            usage_error(cmd, exc)
        saved_task = saved.get("task", TrainConfig.task)
        if "task" in given and not _same_task(given["task"], saved_task):  # another task: the tokenizer's alone
            saved = {k: v for k, v in saved.items() if k == "chat_template"}
    fixed = {
        "out": None,
        "progress": bool(args.progress.value if isinstance(args.progress, _Default) else args.progress),
    }
    try:
        config = TrainConfig.from_preset(args.preset or "default", **{**saved, **given, **fixed, "critic_warmup": 0})
    except ParameterError as exc:
        if exc.argument in saved and exc.argument not in given:
            usage_error(cmd, ParameterError(f"model: {str(task_json)!r}: {exc}", argument="model"))
        usage_error(cmd, exc)
    return config, task_json


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core diagnose``; returns the exit status."""
    cmd: argparse.ArgumentParser = args.command_parser
    out = _check_out(cmd, args.out.value if isinstance(args.out, _Default) else args.out, args.overwrite)
    critic_run = _critic_run(args, cmd)
    config, task_json = _config(args, cmd)
    from ..experiments.diagnose import DiagnoseSettings

    try:
        settings = DiagnoseSettings(
            prompts=args.prompts, samples_per_prefix=args.samples_per_prefix, positions=args.positions,
            position_choice=args.position_choice, greedy=args.greedy, temperature=config.temperature,
            top_p=config.top_p, max_new_tokens=config.max_new_tokens, statistic=config.statistic,
            pivotal_threshold=args.pivotal_threshold, bootstrap=args.bootstrap, seed=config.seed,
            batch_size=args.batch_size,
        )  # fmt: skip
    except ParameterError as exc:
        usage_error(cmd, exc)
    require_rl_extra("diagnose")
    import torch

    from ..experiments.diagnose import diagnose
    from ..experiments.diagnosis_output import write_outputs
    from ..rl.engine.build import initial_policy, make_task
    from ..rl.engine.distributed import resolve_device

    t0 = time.perf_counter()
    try:
        device = resolve_device(config.device)
        task, tokenizer = make_task(config)
    except ParameterError as exc:
        usage_error(cmd, exc)
    torch.set_num_threads(1 if config.num_threads is None and device.type == "cpu" else (config.num_threads or 1))
    with torch.random.fork_rng(devices=[]):  # the trainer's warm start (Trainer._fresh): torch seeded with the seed
        torch.manual_seed(config.seed)
        try:
            actor, warm = initial_policy(config, task, tokenizer.vocab_size, device)
        except ParameterError as exc:
            usage_error(cmd, exc)
    if config.model is not None:
        source = f"{config.model}"
    elif config.init_from is not None:
        source = f"{config.init_from} (--init-from)"
    else:
        source = f"the built-in SFT warm start of seed {config.seed} ({warm['sft_steps']} steps)"
    judge = None
    if critic_run is not None:
        with torch.random.fork_rng(devices=[]):  # a TAC's init draws from torch's RNG before its weights load
            judge = _load_critic(critic_run, actor, device)
        source += f" with the critic of {args.critic}"
    print(
        f"comppo-core diagnose: {source}, task {task.describe()} (ready in {time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    report = diagnose(
        actor, tokenizer, task, settings, device=device, progress=config.progress,
        say=lambda line: print(f"comppo-core {line}", flush=True), critic=judge,
    )  # fmt: skip
    report["source"] = source
    report["cost"]["seconds"]["policy"] = warm["sft_seconds"]
    report["settings"]["train_config"] = config.to_dict()
    report["settings"]["task_json"] = None if task_json is None else str(task_json.resolve())
    paths = write_outputs(out, report, source)
    rec = report["recommendation"]
    average = report["auc"][settings.statistic]["gates"]["auc"]
    lo, hi = average["ci"]
    shown = "n/a" if average["estimate"] is None else f"{average['estimate']:.3f}"
    if lo is not None:
        shown += f" [{lo:.3f}, {hi:.3f}]"
    print(
        f"comppo-core diagnose: direction {rec['direction']} (AUC of the layer-average {settings.statistic} "
        f"concentration as gates {shown}), gate range {rec['gate_range']}; {report['cost']['generated_tokens']} generated "
        f"tokens in {time.perf_counter() - t0:.0f} s"
    )
    print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def _load_critic(critic_run: tuple[Path, TrainConfig], actor: Any, device: Any) -> Any:
    """The run's critic (its checkpoint's weights) for ``actor``, with the run's arm and scoring settings."""
    import torch

    from ..experiments.diagnose import CriticUnderTest
    from ..rl.core import step
    from ..rl.core.arms import get_arm
    from ..rl.engine.build import make_critic

    ckpt, run_config = critic_run
    arm = get_arm(run_config.arm)
    critic = make_critic(arm, actor, run_config)
    assert critic is not None
    state = torch.load(ckpt / "state.pt", weights_only=True, map_location="cpu")
    critic.load_state_dict(state["critic"])
    return CriticUnderTest(critic.to(device).eval(), arm, step.ScoringSettings.from_config(run_config))
