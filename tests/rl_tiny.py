"""The tiny training run the trainer's tests share: about a second on one CPU thread.

A 2-layer width-32 Llama, 1-digit addition, 3 SFT steps, 4 prompts × 2 samples, 2 steps,
no critic warm-up.
Each test file adds what it pins (its evaluation size and schedule, its device) on top.
"""

from __future__ import annotations

from typing import Any

#: ``TrainConfig`` fields of the tiny run.
TINY_SETTINGS: dict[str, Any] = {
    "digits": 1,
    "model_hidden": 32,
    "model_layers": 2,
    "model_heads": 4,
    "model_kv_heads": 2,
    "model_intermediate": 64,
    "warmup_sft_steps": 3,
    "sft_batch_size": 8,
    "prompts_per_step": 4,
    "group_size": 2,
    "steps": 2,
    "critic_warmup": 0,
    "save_every": 0,
    "tac_width": 16,
    "progress": False,
}


def as_flags(settings: dict[str, Any]) -> list[str]:
    """The CLI flags that give ``settings`` (``--no-<name>`` for a False bool)."""
    flags: list[str] = []
    for name, value in settings.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags
