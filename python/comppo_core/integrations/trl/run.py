"""One run of ``comppo-core compare --engine trl``: ``python -m comppo_core.integrations.trl.run RUN_DIR``.

Reads ``RUN_DIR/config.json`` (the run's :class:`~comppo_core.rl.TrainConfig`, and under
``"trl"`` the engine's record: the ``--trl-config`` settings and the launcher;
:mod:`comppo_core.experiments.trl_engine`), builds the task's datasets and verifier
(:func:`~comppo_core.integrations.trl.tasks.dataset_and_rewards`) and a
:class:`~comppo_core.integrations.trl.CompPOTrainer` on the local model ``config.model``
(:func:`~comppo_core.experiments.trl_engine.trainer_arguments`: one PPO step is
``K = ppo_epochs · num_minibatches`` optimiser steps), trains with TRL's checkpoints in
``RUN_DIR/trl/checkpoint-<k>`` (resumed with ``resume_from_checkpoint`` when one is there),
and writes what the package's trainer writes for ``experiments/report.py``:

* ``metrics.jsonl``: one row per PPO step (:data:`~comppo_core.rl.runs.metrics.METRIC_KEYS`;
  TRL's logs of the step's ``K`` optimiser steps: ``reward_mean`` is TRL's ``reward``,
  ``value_explained_var``, ``pg_loss``, ... its ``comppo/…`` metrics, ``entropy``,
  ``response_length`` its ``completions/mean_length``), ``eval_accuracy`` at the steps
  ``s`` with ``s % eval_every == 0`` and a last row after the last step;
* ``summary.json`` (atomically, last): :func:`~comppo_core.rl.runs.metrics.summarize`'s keys
  (``initial_eval_accuracy``, ``final_eval_accuracy``, ``eval``, ...) with ``engine: "trl"``;
* ``model/``: the final policy and its tokenizer (``comppo-core evaluate --model RUN_DIR/model``).

**A GGUF model** (``config.model`` a ``.gguf`` file) is converted once into
``RUN_DIR/model_from_gguf/`` (:func:`comppo_core.rl.models.gguf.gguf_as_directory`: the plain
model and its tokenizer, reused on resume) and TRL loads that directory: its trainer loads
the policy and the reference model with ``from_pretrained`` itself.

**Evaluation** is the package's: greedy decoding of ``task.heldout(eval_size)`` (tuning runs:
``task.validation``) with the package's tokenizer of ``config.model``, decoded and rewarded
as :func:`comppo_core.rl.engine.evaluation.heldout_rewards` does; under a launcher each
process answers its contiguous share (every process keeps generating until all are done,
as ZeRO-3's gathers need) and the counts are summed.

**Stopping.** SIGINT or SIGTERM: the run finishes its PPO step, checkpoints and exits with
``128 + signal`` (a second signal acts at once). The process also exits when the compare
that started it (``COMPPO_COMPARE_PID``) is gone. Exit status 2 for a bad setting and 3
for a non-finite value, the message in ``RUN_DIR/error.json``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ...errors import NonFiniteError, ParameterError
from ...experiments import trl_engine
from ...rl.config import TrainConfig
from ...rl.runs import metrics, run_dir

__all__ = ["evaluate", "main", "metric_row"]

#: TRL's log keys → the package's metrics.jsonl keys.
_LOG_KEYS = {
    "reward": "reward_mean",
    "entropy": "entropy",
    "completions/mean_length": "response_length",
    "grad_norm": "grad_norm_actor",
    "kl": "kl",
    "clip_ratio/region_mean": "clipfrac",
}


def metric_row(step: int, arm: str, seed: int, logs: dict[str, Any], eval_accuracy: float | None) -> dict[str, Any]:
    """The ``metrics.jsonl`` row of PPO step ``step`` from TRL's logs of it (module docstring)."""
    row: dict[str, Any] = dict.fromkeys(metrics.METRIC_KEYS)
    row.update(step=step, arm=arm, seed=seed, eval_accuracy=eval_accuracy)
    for key, value in logs.items():
        name = _LOG_KEYS.get(key, key.removeprefix("comppo/") if key.startswith("comppo/") else None)
        if name in row and name not in ("step", "arm", "seed", "eval_accuracy") and isinstance(value, (int, float)):
            row[name] = float(value)
    return metrics.finite_row(row)


def evaluate(
    model: Any, tokenizer: Any, task: Any, problems: list[Any], *, max_new_tokens: int, accelerator: Any
) -> float:
    """Greedy accuracy of ``model`` on ``problems`` (module docstring), split over the processes."""
    import torch

    from ...rl.engine import rollout
    from ...rl.engine.distributed import shard_bounds

    world, rank = accelerator.num_processes, accelerator.process_index
    lo, hi = shard_bounds(len(problems), rank, world)
    width = rollout.prompt_width(tokenizer, problems)
    was_training = model.training
    share = problems[lo:hi] if hi > lo else problems[:1]  # an empty share still runs generate's collectives
    with torch.no_grad(), accelerator.autocast():
        ids, _, width, in_response = rollout.generate(
            model, tokenizer, share, max_new_tokens=max_new_tokens, device=accelerator.device, sample=False,
            width=width, synced=world > 1,
        )  # fmt: skip
    texts, finished = rollout.decode(tokenizer, ids, width, in_response)
    correct = float(sum(task.rewards(share, texts, finished.tolist()))) if hi > lo else 0.0
    if was_training:
        model.train()
    total = torch.tensor([correct], dtype=torch.float64, device=accelerator.device)
    if world > 1:
        total = accelerator.reduce(total, reduction="sum")
    return float(total.item()) / len(problems)


def _watch_compare() -> None:
    """Exit at once when the compare that started this run is gone (its checkpoints kept)."""
    pid = os.environ.get("COMPPO_COMPARE_PID")
    if not pid or not pid.isdigit():
        return

    def watch() -> None:
        while True:
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass
            time.sleep(0.5)

    threading.Thread(target=watch, name="watch-compare", daemon=True).start()


def _fail(run_out: Path, status: int, exc: BaseException, argument: str | None = None) -> int:
    message = str(exc)
    record = {"message": message, "argument": argument, "kind": type(exc).__name__}
    if os.environ.get("RANK", "0") == "0":
        run_dir.write_json_atomic(run_out / "error.json", record)
    print(f"comppo-core compare (TRL run {run_out}): {message}", file=sys.stderr, flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    """Run the TRL run in ``argv[0]`` (module docstring); its exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m comppo_core.integrations.trl.run RUN_DIR", file=sys.stderr)
        return 2
    run_out = Path(args[0]).resolve()
    _watch_compare()
    from ...rl.runs.interrupts import GracefulStop, exit_status

    with GracefulStop() as stop:
        try:
            return _train(run_out, stop)
        except ParameterError as exc:
            return _fail(run_out, trl_engine.EXIT_BAD_SETTING, exc, exc.argument)
        except NonFiniteError as exc:
            return _fail(run_out, trl_engine.EXIT_NONFINITE, exc, exc.argument)
        except _Stopped:
            return exit_status(stop.signum or 2)


class _Stopped(Exception):
    pass


def _train(run_out: Path, stop: Any) -> int:
    saved = json.loads((run_out / "config.json").read_text())
    record = saved.pop("trl", None) or {}
    config = TrainConfig.from_dict(saved)
    trl_settings = dict((record.get("trl_config") or {}).get("settings") or {})
    tuning = config.eval_split == "validation"

    import torch
    from transformers import AutoTokenizer, TrainerCallback

    from ...rl.models.gguf import gguf_as_directory, is_gguf_file
    from ...rl.models.pretrained import load_tokenizer
    from ...rl.tasks import build_task
    from .config import CompPOConfig
    from .tasks import dataset_and_rewards, trl_eos_token_ids
    from .trainer import CompPOTrainer

    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    model_dir = str(config.model)
    if is_gguf_file(model_dir):  # TRL loads from_pretrained: a save_pretrained copy (module docstring)
        model_dir = str(gguf_as_directory(model_dir, run_out / "model_from_gguf"))
    task = build_task(config)
    max_new_tokens = config.max_new_tokens or task.max_new_tokens
    eval_problems = task.validation(config.eval_size) if tuning else task.heldout(config.eval_size)
    hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = trl_eos_token_ids(hf_tokenizer, model_dir)
    data = dataset_and_rewards(
        config, train_size=config.steps * config.prompts_per_step, eos_token_ids=eos, chat=config.chat_template
    )
    eval_tokenizer = load_tokenizer(model_dir, chat_template=config.chat_template)
    world = _launched_processes()
    per_rollout = config.ppo_epochs * config.num_minibatches
    kwargs = trl_engine.trainer_arguments(
        config, trl_settings, world_size=world, output_dir=str(run_out / "trl"), max_completion_length=max_new_tokens
    )
    if config.device == "auto" and not torch.cuda.is_available():  # CPU processes (gloo under a launcher)
        kwargs["use_cpu"] = True
    try:
        args = CompPOConfig(**kwargs)
    except TypeError as exc:  # a field GRPOConfig does not have
        raise ParameterError(f"trl_config: {exc}", argument="trl_config") from None
    checkpoint = trl_engine.last_checkpoint(run_out)
    start = 0 if checkpoint is None else int(checkpoint.name.removeprefix("checkpoint-")) // per_rollout

    evals: dict[int, float] = {}
    t_start = time.perf_counter()

    class Recorder(TrainerCallback):  # type: ignore[misc]
        """Evaluates at PPO-step boundaries, writes one metrics row per PPO step, stops on a signal."""

        trainer: Any = None

        def _evaluate(self, s: int) -> None:
            tr = self.trainer
            model = tr.accelerator.unwrap_model(tr.model)
            evals[s] = evaluate(
                model, eval_tokenizer, task, eval_problems, max_new_tokens=max_new_tokens, accelerator=tr.accelerator
            )

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            s = state.global_step // per_rollout
            if config.eval_every and s % config.eval_every == 0 and s < config.steps:
                self._evaluate(s)

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            g = state.global_step
            if g % per_rollout:
                return control
            s = g // per_rollout
            if config.eval_every and s % config.eval_every == 0 and s < config.steps:
                self._evaluate(s)
            if _any_process(stop(), self.trainer.accelerator) and s < config.steps:
                control.should_save = True
                control.should_training_stop = True
            return control

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            g = state.global_step
            if not state.is_world_process_zero or not logs or g == 0 or g % per_rollout or "reward" not in logs:
                return
            s = g // per_rollout - 1  # the PPO step these logs cover
            metrics.append_row(run_out, metric_row(s, config.arm, config.seed, logs, evals.get(s)))

    recorder = Recorder()
    peft_config = None
    if config.lora_rank:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,  # type: ignore[arg-type]  # peft takes a float
            target_modules=config.lora_target_modules,
            task_type="CAUSAL_LM",
        )
    trainer = CompPOTrainer(
        model=model_dir,
        reward_funcs=data.reward_funcs,
        args=args,
        train_dataset=data.train,
        processing_class=hf_tokenizer,
        callbacks=[recorder],
        peft_config=peft_config,
    )
    recorder.trainer = trainer
    if trainer.accelerator.num_processes != world:
        raise ParameterError(
            f"launcher: the run's batch was split for {world} process(es) (the launcher's WORLD_SIZE), but "
            f"accelerate runs {trainer.accelerator.num_processes}; launch with torchrun-style variables "
            "(accelerate launch with a multi-GPU or DeepSpeed/FSDP config)",
            argument="launcher",
        )
    main_process = trainer.accelerator.is_main_process
    if main_process:  # the rows of the steps this run will do again go (a resumed run rewrites them)
        path = run_out / "metrics.jsonl"
        kept = [r for r in metrics.read_rows(path) if r.get("step", 0) < start] if path.is_file() else []
        run_dir.write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
        (run_out / "summary.json").unlink(missing_ok=True)
    trainer.accelerator.wait_for_everyone()
    trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
    done = trainer.state.global_step // per_rollout
    if done < config.steps:  # stopped by a signal: the checkpoint of the last PPO step is written
        raise _Stopped
    final = evaluate(
        trainer.accelerator.unwrap_model(trainer.model), eval_tokenizer, task, eval_problems,
        max_new_tokens=max_new_tokens, accelerator=trainer.accelerator,
    )  # fmt: skip
    trainer.save_model(str(run_out / "model"))
    if main_process:
        hf_tokenizer.save_pretrained(str(run_out / "model"))
        metrics.append_row(run_out, metrics.final_row(config.steps, config.arm, config.seed, final))
        critic = trainer.critic
        run = {
            "arm": config.arm,
            "seed": config.seed,
            "steps": config.steps,
            "engine": "trl",
            "parameters": {
                "actor": sum(p.numel() for p in trainer.accelerator.unwrap_model(trainer.model).parameters()),
                "critic": 0 if critic is None else sum(p.numel() for p in critic.parameters()),
            },
            "world_size": world,
            "optimizer_steps": trainer.state.global_step,
            "resumed_from": None if checkpoint is None else checkpoint.name,
            "seconds": time.perf_counter() - t_start,
        }
        metrics.summarize([], out=run_out, final_step=config.steps, final_eval=final, run=run)
    trainer.accelerator.wait_for_everyone()
    return 0


def _launched_processes() -> int:
    """The number of processes the launcher started: ``WORLD_SIZE`` (torchrun, ``accelerate
    launch``), else MPI's (``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``), else 1."""
    for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) >= 1:
            return int(value)
    return 1


def _any_process(flag: bool, accelerator: Any) -> bool:
    """Whether ``flag`` holds on any process (every process stops at the same step)."""
    if accelerator.num_processes == 1:
        return flag
    import torch

    t = torch.tensor([int(flag)], device=accelerator.device)
    return bool(accelerator.reduce(t, reduction="max").item())


if __name__ == "__main__":
    sys.exit(main())
