"""The TRL engine of ``comppo-core compare --engine trl``: what a run's settings mean on
:class:`~comppo_core.integrations.trl.CompPOTrainer`, and a run as a subprocess.

A compare's runs share one :class:`~comppo_core.rl.TrainConfig` (the grid, the pairing, the
resume rules and the report read it, whichever engine runs). On the TRL engine each run is
``python -m comppo_core.integrations.trl.run RUN_DIR`` (:mod:`comppo_core.integrations.trl.run`),
optionally under a launcher (``accelerate launch --config_file F -m …``), which reads
``RUN_DIR/config.json``: the run's TrainConfig, and under ``"trl"`` the engine's record
(:func:`engine_record`: the ``--trl-config`` file's settings and hash, the launcher).

**The mapping** (:func:`trainer_arguments`). One PPO step of the package (a rollout of
``prompts_per_step × group_size`` completions, then ``ppo_epochs × num_minibatches``
optimiser steps) is ``K = ppo_epochs · num_minibatches`` TRL optimiser steps:

==========================================  =================================================
TrainConfig                                  CompPOConfig
==========================================  =================================================
``steps``                                    ``max_steps = steps · K``
``prompts_per_step``, ``group_size``         ``num_generations = group_size``;
                                             ``per_device_train_batch_size = P·G / (W · S)``
``num_minibatches``                          ``steps_per_generation = S = num_minibatches · GA``
``ppo_epochs``                               ``num_iterations``
``actor_lr``                                 ``learning_rate`` (constant schedule, no warm-up)
``clip_low``, ``clip_high``                  ``epsilon``, ``epsilon_high`` (None: ``clip_low``)
``kl_coef``                                  ``beta`` (TRL's k3 estimator as a loss term)
``max_new_tokens``                           ``max_completion_length`` (None: the task's budget)
``save_every``                               ``save_steps = save_every · K`` (0: ``save_strategy="no"``)
``dtype``                                    ``bf16``
``device``                                   ``use_cpu`` (``cpu``)
``gamma`` … ``trunk_grad``, gates            the same CompPOConfig fields (``gate_*``: ``gate_params``)
==========================================  =================================================

``W`` is the number of processes, ``GA`` the ``--trl-config``'s
``gradient_accumulation_steps`` (default 1). The ``--trl-config`` file (YAML or JSON, a
mapping of GRPOConfig/CompPOConfig fields) sets everything else (``use_vllm``,
``gradient_checkpointing``, ``optim``, ...); a field this mapping sets is refused there,
naming the compare flag that sets it (:data:`NAMED_BY_COMPARE`).

**What the TRL engine refuses or fixes** (:func:`check_config`): the built-in policy and its
SFT warm start (``--model DIR`` is every run's starting policy), ``--init-from``,
``--fsdp`` (use a launcher), the KL estimator other than k3 in the loss
(:data:`TRL_FIXED`, TRL's), and an outcome baseline other than ``grpo``.

Imports no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ComppoError, NonFiniteError, ParameterError
from ..rl.config import TrainConfig
from ..rl.runs import run_dir
from .grid import POLICY_FIELDS

__all__ = [
    "ENGINES",
    "NAMED_BY_COMPARE",
    "NOT_ON_TRL",
    "RUN_MODULE",
    "TRL_FIXED",
    "TrlRunFailed",
    "check_config",
    "engine_record",
    "last_checkpoint",
    "parse_launcher",
    "read_trl_config",
    "same_engine",
    "run_command",
    "run_subprocess",
    "TRL_RUN_ENTRIES",
    "clear_trl_run",
    "trainer_arguments",
    "write_run_config",
]

#: The engines of ``compare --engine``.
ENGINES = ("package", "trl")

#: The module a TRL run executes (``python -m``).
RUN_MODULE = "comppo_core.integrations.trl.run"

#: TrainConfig fields the TRL engine fixes to TRL's meaning (a compare on TRL sets them; another value is refused).
TRL_FIXED: dict[str, Any] = {"kl_kind": "k3", "kl_mode": "loss"}

_WARM = "the TRL engine starts every run from --model DIR (no built-in policy, no SFT warm start)"

#: TrainConfig fields the TRL engine cannot honour, with the reason: refused at any value but the default.
NOT_ON_TRL: dict[str, str] = {
    # the built-in policy and its SFT warm start (--model DIR is every run's starting policy)
    **dict.fromkeys((f for f in POLICY_FIELDS if f != "model"), _WARM),
    "fsdp": 'on the TRL engine each run shards through its launcher (--launcher "accelerate launch --config_file F")',
}

#: CompPOConfig fields compare sets from its own settings, and the flag that sets each
#: (a ``--trl-config`` that sets one is refused, naming the flag).
NAMED_BY_COMPARE: dict[str, str] = {
    "output_dir": "--out (each run's directory)",
    "arm": "--arms",
    "seed": "--seeds",
    "data_seed": "--seeds",
    "max_steps": "--steps",
    "num_train_epochs": "--steps",
    "learning_rate": "--actor-lr",
    "lr_scheduler_type": "--actor-lr (a constant rate, as the package's trainer)",
    "warmup_steps": "--actor-lr (a constant rate, as the package's trainer)",
    "warmup_ratio": "--actor-lr (a constant rate, as the package's trainer)",
    "num_generations": "--group-size",
    "per_device_train_batch_size": "--prompts-per-step and --group-size",
    "generation_batch_size": "--prompts-per-step and --group-size",
    "steps_per_generation": "--num-minibatches",
    "num_iterations": "--ppo-epochs",
    "epsilon": "--clip-low",
    "epsilon_high": "--clip-high",
    "beta": "--kl-coef",
    "temperature": "--temperature",
    "top_p": "--top-p",
    "max_completion_length": "--max-new-tokens",
    "gamma": "--gamma",
    "lam": "--lam",
    "lam_critic": "--lam-critic",
    "whiten_advantages": "--whiten-advantages",
    "statistic": "--statistic",
    "gate_params": "--gate-low, --gate-high, --gate-sharpness, --gate-min-spread, --gate-normalize, --gate-direction",
    "fixed_gate": "--fixed-gate",
    "gate_causal": "--gate-causal",
    "gate_in_bootstrap": "--gate-in-bootstrap",
    "critic_lr": "--critic-lr",
    "weight_decay": "--weight-decay",
    "max_grad_norm": "--max-grad-norm",
    "dual_clip": "--dual-clip",
    "value_clip": "--value-clip",
    "vf_coef": "--vf-coef",
    "loss_agg": "--loss-agg",
    "critic_warmup": "--critic-warmup",
    "tac_width": "--tac-width",
    "tac_temporal": "--tac-temporal",
    "trunk_grad": "--trunk-grad",
    "bf16": "--dtype",
    "fp16": "--dtype",
    "use_cpu": "--device",
    "save_strategy": "--save-every",
    "save_steps": "--save-every",
    "logging_strategy": "compare (one metrics row per PPO step)",
    "logging_steps": "compare (one metrics row per PPO step)",
    "report_to": "--report-to",
    "disable_tqdm": "--progress",
    "eval_strategy": "--eval-every (compare evaluates greedy accuracy itself)",
    "eval_steps": "--eval-every (compare evaluates greedy accuracy itself)",
    "do_eval": "--eval-every (compare evaluates greedy accuracy itself)",
    "eval_on_start": "--eval-every (compare evaluates greedy accuracy itself)",
    "resume_from_checkpoint": "--resume",
    "overwrite_output_dir": "--overwrite",
}


class TrlRunFailed(ComppoError):
    """A TRL run's process failed (its exit status and the log to read are in the message)."""


def check_config(config: TrainConfig, defaults: TrainConfig | None = None) -> None:
    """A :class:`ParameterError` naming the first setting of ``config`` the TRL engine
    cannot run (module docstring); ``defaults``: what "not set" means (TrainConfig's)."""
    defaults = TrainConfig() if defaults is None else defaults
    if config.model is None:
        raise ParameterError(
            "model: expected a local Hugging Face model directory or a GGUF file with --engine trl (every run "
            "starts from it), got none",
            argument="model",
        )
    for name, why in NOT_ON_TRL.items():
        if getattr(config, name) != getattr(defaults, name):
            raise ParameterError(f"{name}: not with --engine trl ({why})", argument=name)
    for name, value in TRL_FIXED.items():
        if getattr(config, name) not in (value, *(["low_var_kl"] if value == "k3" else [])):
            raise ParameterError(
                f"{name}: expected {value} with --engine trl (TRL's KL is the k3 estimator in the loss), got "
                f"{getattr(config, name)!r}",
                argument=name,
            )
    if config.group_method != "grpo":
        raise ParameterError(
            f"group_method: expected grpo with --engine trl (TRL's group-relative advantages), got "
            f"{config.group_method!r}",
            argument="group_method",
        )
    if config.device not in ("auto", "cpu", "cuda"):
        raise ParameterError(
            f"device: expected auto, cpu or cuda with --engine trl (the launcher places the processes), got "
            f"{config.device!r}",
            argument="device",
        )


def read_trl_config(path: Path) -> dict[str, Any]:
    """The settings of a ``--trl-config`` file: a YAML (``.yaml``/``.yml``) or JSON mapping of
    GRPOConfig/CompPOConfig fields, none of :data:`NAMED_BY_COMPARE`; a ParameterError
    naming ``trl_config`` otherwise (the field's type is checked by CompPOConfig when a run
    builds it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParameterError(
            f"trl_config: expected a readable file, got {str(path)!r}: {exc}", argument="trl_config"
        ) from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml  # type: ignore[import-untyped]

            settings = yaml.safe_load(text)
        else:
            settings = json.loads(text)
    except ValueError as exc:  # yaml.YAMLError is not a ValueError
        raise ParameterError(f"trl_config: {str(path)!r} is not valid JSON: {exc}", argument="trl_config") from None
    except Exception as exc:  # yaml's errors
        raise ParameterError(f"trl_config: {str(path)!r} is not valid YAML: {exc}", argument="trl_config") from None
    if settings is None:
        settings = {}
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        raise ParameterError(
            f"trl_config: expected a mapping of GRPOConfig fields in {str(path)!r}, got {type(settings).__name__}",
            argument="trl_config",
        )
    for key in settings:
        if key in NAMED_BY_COMPARE:
            raise ParameterError(
                f"trl_config: {key} in {str(path)!r} is set by compare ({NAMED_BY_COMPARE[key]}); remove it",
                argument="trl_config",
            )
    ga = settings.get("gradient_accumulation_steps", 1)
    if isinstance(ga, bool) or not isinstance(ga, int) or ga < 1:
        raise ParameterError(
            f"trl_config: gradient_accumulation_steps: expected an integer >= 1, got {ga!r}", argument="trl_config"
        )
    return settings


def parse_launcher(text: str | None) -> list[str] | None:
    """``--launcher``'s words (``shlex``): ``"accelerate launch --config_file F"`` →
    ``["accelerate", "launch", "--config_file", "F"]``; None for none."""
    if text is None:
        return None
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ParameterError(f"launcher: expected a command line, got {text!r}: {exc}", argument="launcher") from None
    if not words:
        raise ParameterError(
            f"launcher: expected a command such as 'accelerate launch', got {text!r}", argument="launcher"
        )
    return words


def engine_record(trl_config: Path | None, launcher: str | None) -> dict[str, Any]:
    """What ``compare.json`` and each run's ``config.json`` record of the TRL engine:
    ``{"engine": "trl", "launcher": ..., "trl_config": {"path", "sha256", "settings"} or None}``."""
    record: dict[str, Any] = {"engine": "trl", "launcher": launcher, "trl_config": None}
    if trl_config is not None:
        settings = read_trl_config(trl_config)
        digest = hashlib.sha256(trl_config.read_bytes()).hexdigest()
        record["trl_config"] = {"path": str(trl_config.resolve()), "sha256": digest, "settings": settings}
    return record


def same_engine(a: Any, b: Any) -> bool:
    """Whether two engine records (:func:`engine_record`) name the same engine: the same
    launcher and the same ``--trl-config`` contents (its SHA-256), wherever the file lies (a
    resume from another directory or mount finds its runs)."""

    def key(r: Any) -> tuple[Any, ...] | None:
        if not isinstance(r, dict):
            return None
        t = r.get("trl_config")
        return (r.get("engine"), r.get("launcher"), None if not isinstance(t, dict) else t.get("sha256"))

    return key(a) is not None and key(a) == key(b)


def trainer_arguments(
    config: TrainConfig, trl_settings: dict[str, Any], *, world_size: int, output_dir: str, max_completion_length: int
) -> dict[str, Any]:
    """The ``CompPOConfig(**kwargs)`` of a run (the mapping of the module docstring): the
    ``--trl-config`` settings, then compare's. A batch that does not split over the
    processes is a ParameterError naming ``prompts_per_step``."""
    ga = int(trl_settings.get("gradient_accumulation_steps", 1))
    per_rollout = config.ppo_epochs * config.num_minibatches
    completions = config.prompts_per_step * config.group_size
    steps_per_generation = config.num_minibatches * ga
    per_device, rest = divmod(completions, world_size * steps_per_generation)
    if rest or per_device < 1:
        raise ParameterError(
            f"prompts_per_step: expected prompts_per_step × group_size ({completions}) to split evenly over "
            f"{world_size} process(es) × num_minibatches ({config.num_minibatches}) × gradient_accumulation_steps "
            f"({ga})",
            argument="prompts_per_step",
        )
    from ..gate_params import GateParams

    gp = config.gate_params
    mine: dict[str, Any] = {
        "output_dir": output_dir,
        "arm": config.arm,
        "seed": config.seed,
        "max_steps": config.steps * per_rollout,
        "learning_rate": config.actor_lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "num_generations": config.group_size,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": ga,
        "steps_per_generation": steps_per_generation,
        "num_iterations": config.ppo_epochs,
        "epsilon": config.clip_low,
        "epsilon_high": config.clip_low if config.clip_high is None else config.clip_high,
        "beta": config.kl_coef,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "max_completion_length": max_completion_length,
        "bf16": config.dtype == "bfloat16",
        "use_cpu": config.device == "cpu",
        # save_every 0: no periodic checkpoint (a stop still saves one; model/ is written at the end)
        "save_strategy": "steps" if config.save_every > 0 else "no",
        "save_steps": max(1, config.save_every) * per_rollout,
        "logging_strategy": "steps",
        "logging_steps": per_rollout,
        "report_to": [] if config.report_to == "none" else [config.report_to],
        "disable_tqdm": not config.progress,
        "eval_strategy": "no",
        "weight_decay": config.weight_decay,
        "max_grad_norm": config.max_grad_norm,
        "critic_lr": config.critic_lr,
        "dual_clip": config.dual_clip,
        "loss_agg": config.loss_agg,
    }
    if config.arm != "grpo":
        mine.update(
            gamma=config.gamma,
            lam=config.lam,
            lam_critic=config.lam_critic,
            whiten_advantages=config.whiten_advantages,
            statistic=config.statistic,
            gate_params=GateParams(
                low=gp.low,
                high=gp.high,
                sharpness=gp.sharpness,
                normalize=gp.normalize,
                invert=gp.invert,
                min_spread=gp.min_spread,
            ),
            fixed_gate=config.fixed_gate,
            gate_causal=config.gate_causal,
            gate_in_bootstrap=config.gate_in_bootstrap,
            value_clip=config.value_clip,
            vf_coef=config.vf_coef,
            critic_warmup=config.critic_warmup,
            tac_width=config.tac_width,
            tac_temporal=config.tac_temporal,
            trunk_grad=config.trunk_grad,
        )
    else:
        mine.update(dual_clip=None)  # TRL's GRPO loss has no dual clip
    # one checkpoint kept, as the package's trainer keeps one (a --trl-config may keep more)
    return {"save_total_limit": 1, **trl_settings, **mine}


def last_checkpoint(run_out: Path) -> Path | None:
    """The newest complete TRL checkpoint of a run (``RUN_DIR/trl/checkpoint-<step>`` holding
    ``trainer_state.json``, written last by transformers), or None."""
    found = []
    for path in (run_out / "trl").glob("checkpoint-*"):
        suffix = path.name.removeprefix("checkpoint-")
        if suffix.isdigit() and (path / "trainer_state.json").is_file():
            found.append((int(suffix), path))
    return max(found)[1] if found else None


def run_command(launcher: list[str] | None, run_out: Path) -> list[str]:
    """The command of one run: ``python -m comppo_core.integrations.trl.run RUN_DIR``, or
    under a launcher ``LAUNCHER… -m comppo_core.integrations.trl.run RUN_DIR``
    (``accelerate launch`` takes ``-m module``)."""
    if launcher is None:
        return [sys.executable, "-m", RUN_MODULE, str(run_out)]
    return [*launcher, "-m", RUN_MODULE, str(run_out)]


#: How often the compare polls its run's process and its own stop (seconds).
POLL_S = 0.2

#: The exit status a run's process uses for a bad setting (its message in ``RUN_DIR/error.json``).
EXIT_BAD_SETTING = 2
#: ... and for a non-finite value.
EXIT_NONFINITE = 3


def run_subprocess(
    run_out: Path, launcher: list[str] | None, stop: Callable[[], bool], num_threads: int | None
) -> tuple[str, Any]:
    """Run the TRL run in ``run_out`` (its ``config.json`` written) in a process of its own
    session, its output appended to ``RUN_DIR/run.log``; ``("done", summary)``, or
    ``("stopped", checkpoint)`` after a stop (``stop()`` turned True: the run's processes get
    one SIGTERM, finish the PPO step, checkpoint and exit; a second signal to the compare
    ends them at once). A bad setting found by the run raises its ParameterError, a
    non-finite value its NonFiniteError, any other failure :class:`TrlRunFailed`."""
    env = dict(os.environ)
    env["COMPPO_COMPARE_PID"] = str(os.getpid())
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if num_threads is not None:
        env["OMP_NUM_THREADS"] = str(num_threads)
    error_path = run_out / "error.json"
    with contextlib.suppress(FileNotFoundError):
        error_path.unlink()
    log_path = run_out / "run.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            run_command(launcher, run_out), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        signalled = False
        try:
            while proc.poll() is None:
                if stop() and not signalled:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
                    signalled = True
                time.sleep(POLL_S)
        except BaseException:  # a second signal to the compare (KeyboardInterrupt): end the run at once
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
    rc = proc.returncode
    if rc == 0 and (run_out / "summary.json").is_file():
        return "done", json.loads((run_out / "summary.json").read_text())
    error: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        error = json.loads(error_path.read_text())
    if rc == EXIT_BAD_SETTING and error:
        raise ParameterError(str(error.get("message")), argument=error.get("argument") or "trl_config")
    if rc == EXIT_NONFINITE and error:
        raise NonFiniteError(str(error.get("message")), argument=error.get("argument") or "loss")
    if signalled or rc in (128 + signal.SIGTERM, 128 + signal.SIGINT, -signal.SIGTERM, -signal.SIGINT):
        return "stopped", last_checkpoint(run_out)
    tail = ""
    with contextlib.suppress(OSError):
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
    raise TrlRunFailed(
        f"the TRL run in {str(run_out)!r} failed with exit status {rc}; its log {str(log_path)!r} ends:\n{tail}"
    )


def write_run_config(run_out: Path, config: TrainConfig, record: dict[str, Any]) -> None:
    """Write ``RUN_DIR/config.json``: the run's TrainConfig and the engine's record under ``"trl"``."""
    run_out.mkdir(parents=True, exist_ok=True)
    run_dir.write_json_atomic(run_out / "config.json", {**config.to_dict(), "trl": record})


#: What a TRL run writes in its directory (deleted by :func:`clear_trl_run`, nothing else).
TRL_RUN_ENTRIES = ("config.json", "metrics.jsonl", "summary.json", "trl", "model", "run.log", "error.json")


def clear_trl_run(run_out: Path) -> None:
    """Delete the TRL run in ``run_out``: the :data:`TRL_RUN_ENTRIES` there, nothing else."""
    import shutil

    for name in TRL_RUN_ENTRIES:
        p = run_out / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
