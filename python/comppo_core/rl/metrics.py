"""What a run logs: one ``metrics.jsonl`` row per step (:data:`METRIC_KEYS`) and the
``summary.json`` written after the last step.

A row holds the step's statistics over the global batch (None where a quantity does not
apply to the arm or the step, and for a non-finite value); the summary reads the rows
back from ``metrics.jsonl``, so a resumed run's summary covers the whole run.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["METRIC_KEYS", "PHASES", "Timer", "append_row", "finite_row", "summarize"]

#: The keys of each ``metrics.jsonl`` row (None where a quantity does not apply to the arm or step).
METRIC_KEYS = (
    "step",
    "arm",
    "seed",
    "reward_mean",
    "train_accuracy",
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


def append_row(out: Path, row: dict[str, Any]) -> None:
    """Append ``row`` to ``out/metrics.jsonl`` as one JSON line."""
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
        text = (out / "metrics.jsonl").read_text()
        history = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    evals = [[h["step"], h["eval_accuracy"]] for h in history if h["eval_accuracy"] is not None]
    if final_eval is not None:
        evals.append([final_step, final_eval])
    first = {k: run[k] for k in ("arm", "seed", "steps")}
    summary = {
        **first,
        "initial_eval_accuracy": evals[0][1] if evals and evals[0][0] == 0 else None,
        "final_eval_accuracy": final_eval,
        "eval": evals,
        "final_reward_mean": history[-1]["reward_mean"] if history else None,
        "mean_step_s": {p: float(np.mean([h[p] for h in rows])) if rows else None for p in PHASES},
        **{k: v for k, v in run.items() if k not in first},
    }
    if out is not None:
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
