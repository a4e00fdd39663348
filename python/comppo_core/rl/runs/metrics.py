"""What a run logs: one ``metrics.jsonl`` row per step (:data:`METRIC_KEYS`), a last row
with the final evaluation, and the ``summary.json`` written after the last step; the same
rows go to TensorBoard or Weights & Biases with ``report_to`` (:class:`Reporter`).

A row holds the step's statistics over the global batch (None where a quantity does not
apply to the arm or the step, and for a non-finite value). The final row
(:func:`final_row`) has ``step`` = the number of steps run, ``eval_accuracy`` the held-out
accuracy after the last update, and None elsewhere. The summary reads the rows back from
``metrics.jsonl``, so a resumed run's summary covers the whole run.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ParameterError
from .run_dir import write_json_atomic, write_text_atomic

__all__ = [
    "METRIC_KEYS",
    "PHASES",
    "Reporter",
    "RunLog",
    "Timer",
    "append_row",
    "final_row",
    "finite_row",
    "summarize",
]

logger = logging.getLogger("comppo_core.rl")

#: The keys of each ``metrics.jsonl`` row (None where a quantity does not apply to the arm or step).
METRIC_KEYS = (
    "step",
    "arm",
    "seed",
    "reward_mean",
    "train_accuracy",
    "rewards_all_equal",
    "eval_accuracy",
    "kl",
    "kl_loss",
    "approx_kl",
    "clipfrac",
    "pg_loss",
    "value_loss",
    "value_clipfrac",
    "value_explained_var",
    "gate_mean",
    "gate_min",
    "gate_max",
    "adv_gini",
    "adv_effective_token_ratio",
    "response_length",
    "entropy",
    "grad_norm_actor",
    "grad_norm_critic",
    "actor_updated",
    "time_rollout_s",
    "time_score_s",
    "time_advantages_s",
    "time_update_s",
    "time_eval_s",
)

#: The timed phases of a step, averaged in the summary.
PHASES = ("time_rollout_s", "time_score_s", "time_advantages_s", "time_update_s")


class Timer:
    """``with Timer() as t: ...``; then ``t.seconds`` (wall clock, ``perf_counter``)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> Timer:  # noqa: PYI034 (typing.Self needs Python 3.11)
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t


def finite_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` restricted to :data:`METRIC_KEYS`, in that order, non-finite floats as None."""
    return {key: None if isinstance(v := row[key], float) and not math.isfinite(v) else v for key in METRIC_KEYS}


def final_row(step: int, arm: str, seed: int, eval_accuracy: float) -> dict[str, Any]:
    """The last ``metrics.jsonl`` row: the held-out accuracy after the last update."""
    row: dict[str, Any] = dict.fromkeys(METRIC_KEYS)
    row.update(step=step, arm=arm, seed=seed, eval_accuracy=eval_accuracy)
    return row


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``; a last line cut short by a crash is left out."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def _mean(values: list[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return float(np.mean(numbers)) if numbers else None


def append_row(out: Path, row: dict[str, Any]) -> None:
    """Append ``row`` to ``out/metrics.jsonl`` as one JSON line (one write of the whole line;
    a line cut short by a crash is skipped by :func:`read_rows` and dropped on resume)."""
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")


def summarize(
    rows: list[dict[str, Any]],
    *,
    out: Path | None,
    final_step: int,
    final_eval: float | None,
    run: dict[str, Any],
) -> dict[str, Any]:
    """The run's summary (:func:`comppo_core.rl.train`'s keys), over every row of
    ``out/metrics.jsonl`` when ``out`` is given (this process's ``rows`` otherwise), and
    written to ``out/summary.json``. ``run`` holds ``arm, seed, steps`` first and
    ``parameters, world_size, warm_start`` last; ``final_eval`` is the accuracy after the
    last step (``final_step``)."""
    history = rows
    if out is not None:
        history = read_rows(out / "metrics.jsonl")
    history = [h for h in history if h["step"] < final_step]  # the steps run (not the final row)
    evals = [[h["step"], h["eval_accuracy"]] for h in history if h["eval_accuracy"] is not None]
    if final_eval is not None:
        evals.append([final_step, final_eval])
    all_equal = sum(bool(h.get("rewards_all_equal")) for h in history)
    first = {k: run[k] for k in ("arm", "seed", "steps")}
    summary = {
        **first,
        "initial_eval_accuracy": evals[0][1] if evals and evals[0][0] == 0 else None,
        "final_eval_accuracy": final_eval,
        "eval": evals,
        "final_reward_mean": history[-1]["reward_mean"] if history else None,
        "mean_step_s": {p: _mean([h[p] for h in history]) for p in PHASES},
        "steps_without_signal": all_equal,
        **{k: v for k, v in run.items() if k not in first},
    }
    if out is not None:
        write_json_atomic(out / "summary.json", summary)
    return summary


class Reporter:
    """Sends each metrics row to TensorBoard (``OUT/tensorboard``, through
    ``torch.utils.tensorboard``) or Weights & Biases (``wandb.log``), with the keys of
    ``metrics.jsonl``: every number and bool of the row at ``global_step = row["step"]``.
    ``"none"`` sends nothing. Rank 0 only; :meth:`close` flushes."""

    def __init__(self, kind: str, out: Path | None, *, name: str, config: dict[str, Any]) -> None:
        self.kind = kind
        self._writer: Any = None
        self._run: Any = None
        if kind == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:
                raise ParameterError(
                    f"report_to: 'tensorboard' needs the tensorboard package: pip install 'comppo-core[tensorboard]' ({exc})",
                    argument="report_to",
                ) from None
            if out is None:
                raise ParameterError("report_to: 'tensorboard' writes under out, got out=None", argument="report_to")
            self._writer = SummaryWriter(log_dir=str(out / "tensorboard"))
        elif kind == "wandb":
            try:
                import wandb
            except ImportError:
                raise ParameterError(
                    "report_to: 'wandb' needs the wandb package: pip install 'comppo-core[wandb]'", argument="report_to"
                ) from None
            where = None if out is None else str(out)
            if out is not None:
                (out / "wandb").mkdir(parents=True, exist_ok=True)
            run_id = None if out is None else _wandb_id(out / "wandb" / "comppo_run_id")
            self._run = wandb.init(
                project="comppo-core", name=name, dir=where, config=config, id=run_id, resume="allow"
            )

    def log(self, row: dict[str, Any]) -> None:
        values = {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and k not in ("step", "seed")}
        if self._writer is not None:
            for key, value in values.items():
                self._writer.add_scalar(key, value, global_step=int(row["step"]))
        if self._run is not None:
            self._run.log(values, step=int(row["step"]))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._run is not None:
            self._run.finish()


def _wandb_id(path: Path) -> str:
    """The run's W&B id, made once and kept in ``path`` (a resumed run logs to the same W&B run)."""
    try:
        return path.read_text().strip()
    except OSError:
        import secrets

        run_id = secrets.token_hex(8)
        write_text_atomic(path, run_id)
        return run_id


class RunLog:
    """Where a run's rows go as it trains (rank 0; ``enabled=False`` elsewhere): each step's
    row to ``out/metrics.jsonl`` and the :class:`Reporter`, the progress bar (``progress``)
    or else one log line per step (logger ``comppo_core.rl``, INFO), the final row, and a
    warning the first time a step's rewards are all equal (no learning signal)."""

    def __init__(self, config: Any, out: Path | None, *, start_step: int, enabled: bool) -> None:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        self.config, self.out, self.enabled = config, out, enabled
        self.warned = False
        name = f"{config.arm}-seed{config.seed}"
        self.reporter = Reporter(config.report_to if enabled else "none", out, name=name, config=config.to_dict())
        show = config.progress and enabled
        self.bar = tqdm(total=config.steps, initial=start_step, desc=config.arm, disable=not show, leave=False)

    def step(self, row: dict[str, Any], *, max_new_tokens: int) -> None:
        if not self.enabled:
            return
        cfg = self.config
        if self.out is not None:
            append_row(self.out, row)
        self.reporter.log(row)
        if cfg.progress:
            postfix = {"reward": f"{row['reward_mean']:.3f}"}
            if row["eval_accuracy"] is not None:
                postfix["eval"] = f"{row['eval_accuracy']:.3f}"
            self.bar.set_postfix(postfix)
            self.bar.update(1)
        else:
            held_out = "" if row["eval_accuracy"] is None else f", held-out {100 * row['eval_accuracy']:.1f}%"
            logger.info(
                "%s seed %d: step %d/%d: reward %.3f%s",
                cfg.arm,
                cfg.seed,
                row["step"] + 1,
                cfg.steps,
                row["reward_mean"],
                held_out,
            )
        if row["rewards_all_equal"] and not self.warned:
            self.warned = True
            logger.warning(
                "step %d: every reward of the batch is %g, so the step has no learning signal; check the task's "
                "verifier and the response budget (max_new_tokens = %d). Such steps are counted in metrics.jsonl "
                "(rewards_all_equal) and summary.json (steps_without_signal).",
                row["step"] + 1,
                row["reward_mean"],
                max_new_tokens,
            )

    def final(self, step: int, eval_accuracy: float) -> None:
        """The final evaluation, as the last row."""
        if not self.enabled:
            return
        row = final_row(step, self.config.arm, self.config.seed, eval_accuracy)
        if self.out is not None:
            append_row(self.out, row)
        self.reporter.log(row)
        if not self.config.progress:
            logger.info(
                "%s seed %d: after step %d: held-out %.1f%%", row["arm"], row["seed"], step, 100 * eval_accuracy
            )

    def close(self) -> None:
        self.bar.close()
        self.reporter.close()
