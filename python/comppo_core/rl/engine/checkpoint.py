"""A run's checkpoint: what :meth:`comppo_core.rl.Trainer.train` writes and ``resume`` reads.

Layout of ``OUT/checkpoint/``::

    actor/            the policy (``save_pretrained``) with its tokenizer and task.json (a model
                      directory ``--model`` and ``comppo-core evaluate`` read), or with LoRA
                      the adapter alone
    state.pt          next_step, the torch RNG state of the run's update stream, the
                      actor's optimiser; the critic and its optimiser when the arm has one
    rng.json          the NumPy generator's state (the prompts drawn)
    progress.json     next_step (read without torch: what a directory holds, for messages)
    config.json       the run's TrainConfig
    warm_start.json   how the policy was warm-started (SFT steps, seconds, final loss)

Written atomically: the new checkpoint is written beside the old one
(``checkpoint.tmp``), the old one renamed to ``checkpoint.old``, the new one renamed into
place, then the old one deleted; a crash at any point leaves a complete checkpoint under
one of the two names, and :func:`find_checkpoint` finds it.

The package trainer's own format (TRL and verl keep theirs), so it sits in ``engine``, above
:mod:`comppo_core.rl.config` (a checkpoint holds and checks a TrainConfig) and the models,
which :mod:`comppo_core.rl.runs` (a run directory's rules, below them) does not import.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ...errors import ParameterError
from ..config import RESUMABLE_CHANGES, TrainConfig
from ..models.tokenizer import quiet_transformers, save_tokenizer
from ..runs.run_dir import (
    INPUT_FIELDS,
    check_moved_input,
    fingerprint,
    saved_checkpoint,
    write_json_atomic,
    write_text_atomic,
)

__all__ = [
    "RESUMABLE_CHANGES",
    "check_resumable",
    "describe_kept",
    "find_checkpoint",
    "keep_metrics_before",
    "load_state",
    "record_inputs",
    "save_checkpoint",
    "start_run",
]


def save_checkpoint(
    out: Path,
    *,
    next_step: int,
    actor: Any,
    tokenizer: Any,
    task: dict[str, Any],
    actor_opt: torch.optim.Optimizer,
    critic: nn.Module | None,
    critic_opt: torch.optim.Optimizer | None,
    torch_rng: torch.Tensor,
    rng: np.random.Generator,
    config: TrainConfig,
    warm_start: dict[str, Any],
    states: dict[str, Any] | None = None,
) -> None:
    """Write ``out/checkpoint`` for a run that continues at ``next_step`` (atomically;
    ``actor`` is what ``save_pretrained`` writes: the model, or its peft adapter; the
    ``tokenizer`` and the ``task`` record are saved beside it). ``states``: the full state
    dicts of ``actor``, ``actor_opt``, ``critic`` and ``critic_opt`` when the modules are
    sharded (FSDP2), written instead of the modules' own."""
    full = states or {}
    final, tmp, old = out / "checkpoint", out / "checkpoint.tmp", out / "checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    with quiet_transformers():
        actor.save_pretrained(tmp / "actor", **({"state_dict": full["actor"]} if "actor" in full else {}))
    save_tokenizer(tokenizer, tmp / "actor")
    write_json_atomic(tmp / "actor" / "task.json", task)
    state: dict[str, Any] = {"next_step": next_step, "torch_rng": torch_rng}
    state["actor_opt"] = full["actor_opt"] if "actor_opt" in full else actor_opt.state_dict()
    if critic is not None:
        assert critic_opt is not None
        state["critic"] = full["critic"] if "critic" in full else critic.state_dict()
        state["critic_opt"] = full["critic_opt"] if "critic_opt" in full else critic_opt.state_dict()
    torch.save(state, tmp / "state.pt")
    (tmp / "rng.json").write_text(json.dumps(rng.bit_generator.state))
    (tmp / "progress.json").write_text(json.dumps({"next_step": next_step}))
    (tmp / "config.json").write_text(config.to_json())
    (tmp / "warm_start.json").write_text(json.dumps(warm_start))
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(out: Path) -> Path:
    """The complete checkpoint under ``out`` (``checkpoint``, or ``checkpoint.old`` after a
    crash between the two renames of :func:`save_checkpoint`:
    :func:`comppo_core.rl.runs.run_dir.saved_checkpoint`), or a ParameterError naming ``resume``."""
    found = saved_checkpoint(out)
    if found is None:
        raise ParameterError(
            f"resume: expected a checkpoint in {str(out / 'checkpoint')!r}, found none", argument="resume"
        )
    return found[0]


def check_resumable(ckpt: Path, config: TrainConfig) -> None:
    """A ParameterError naming the first field of ``config`` that differs from the
    checkpoint's config, unless it is one of :data:`RESUMABLE_CHANGES`; an input named by
    path (``model``, ``task``, ``init_from``) may be at another path if its content is the
    one the run recorded (:func:`comppo_core.rl.runs.run_dir.check_moved_input`)."""
    saved = TrainConfig.from_json((ckpt / "config.json").read_text())
    try:
        inputs = json.loads((ckpt.parent / "inputs.json").read_text())
    except (OSError, ValueError):
        inputs = {}
    for f in dataclasses.fields(TrainConfig):
        name = f.name
        if name in RESUMABLE_CHANGES or getattr(saved, name) == getattr(config, name):
            continue
        if name in INPUT_FIELDS:
            check_moved_input(name, inputs.get(name), getattr(saved, name), getattr(config, name))
            continue
        raise ParameterError(
            f"{name}: a resumed run must keep the checkpoint's settings (only {', '.join(RESUMABLE_CHANGES)} may "
            f"change); the checkpoint has {getattr(saved, name)!r}, got {getattr(config, name)!r}",
            argument=name,
        )


def start_run(out: Path, config: TrainConfig, warm_start: Any, tokenizer: Any, task: dict[str, Any]) -> None:
    """The files a fresh run starts with: ``config.json``, ``inputs.json``
    (:func:`record_inputs`), ``warmstart/`` (the policy ``warm_start`` with its tokenizer and
    ``task.json``, a model directory ``--model`` and ``comppo-core evaluate`` read; none when
    ``warm_start`` is None) and an empty ``metrics.jsonl``; each written atomically."""
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "config.json", config.to_json())
    record_inputs(out, config)
    if warm_start is not None:
        with quiet_transformers():
            warm_start.save_pretrained(out / "warmstart")
        save_tokenizer(tokenizer, out / "warmstart")
        write_json_atomic(out / "warmstart" / "task.json", task)
    write_text_atomic(out / "metrics.jsonl", "")


def record_inputs(out: Path, config: TrainConfig) -> None:
    """Write ``out/inputs.json``: the fingerprint of each input the run names by path."""
    inputs = {}
    for name in INPUT_FIELDS:
        value = getattr(config, name)
        if isinstance(value, str) and Path(value).exists():
            inputs[name] = {"path": value, **fingerprint(value)}
    write_json_atomic(out / "inputs.json", inputs)


def load_state(ckpt: Path) -> tuple[dict[str, Any], np.random.Generator, dict[str, Any]]:
    """``(state.pt's dict, the NumPy generator, warm_start)`` of a checkpoint."""
    state = torch.load(ckpt / "state.pt", weights_only=True, map_location="cpu")
    rng = np.random.default_rng()
    rng.bit_generator.state = json.loads((ckpt / "rng.json").read_text())
    return state, rng, json.loads((ckpt / "warm_start.json").read_text())


def keep_metrics_before(out: Path, step: int) -> None:
    """Drop the rows of ``out/metrics.jsonl`` from ``step`` on (a resumed run rewrites them)."""
    path = out / "metrics.jsonl"
    rows = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
    kept = [ln for ln in rows if _step_of(ln) < step]
    write_text_atomic(path, "".join(ln + "\n" for ln in kept))


def _step_of(line: str) -> float:
    """A metrics row's step; a line cut short by a crash while it was appended counts as
    after every step (dropped on resume)."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return float("inf")


def describe_kept(out: Path | None) -> str:
    """What a failed run leaves behind, for its error message."""
    if out is None:
        return "no checkpoint is written without out"
    found = saved_checkpoint(out)
    if found is None:
        return "no checkpoint had been written yet"
    ckpt, step = found
    after = "" if step is None else f" (after {step} steps)"
    return f"the last good checkpoint{after} is kept at {str(ckpt)!r}"
