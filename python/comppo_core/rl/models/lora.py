"""LoRA through peft for the trainer (``lora_rank > 0``): what is trained, saved and referenced.

peft is an optional dependency: :func:`require_peft` raises a
:class:`~comppo_core.errors.ParameterError` naming ``lora_rank`` when it is missing.

::

    wrapped = add_adapter(model, rank=r, alpha=α, target_modules="all-linear")
    model   = wrapped.get_base_model()     # the same transformers model, LoRA layers injected

peft injects the adapter into the model's own modules (``W x + (α/r)·B A x`` in every
targeted linear layer, ``B = 0`` at the start), so the trainer keeps computing with the
transformers model: generation, :func:`comppo_core.rl.forward`, the probe (which needs a
``PreTrainedModel`` and sets the attention implementation on it) and the TAC's taps on its
decoder layers all see the adapted weights. The :class:`peft.PeftModel` wrapper is kept for
three things:

* **the reference**: ``with wrapped.disable_adapter():`` runs the base model (TRL's
  ``null_ref_context``), so the KL reference needs no second copy of the weights;
* **the trainable parameters**: the adapter's alone (the base weights are frozen);
* **checkpoints**: ``wrapped.save_pretrained(dir)`` writes the adapter only
  (``adapter_config.json``, ``adapter_model.safetensors``); :func:`load_adapter` puts it
  back on the base model (the warm start, or ``config.model``).

No adapter dropout (``lora_dropout = 0``): a rollout's log-probs and the update's must come
from the same function.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ...errors import ParameterError

__all__ = ["add_adapter", "adapter_disabled", "load_adapter", "require_peft", "target_modules"]


def require_peft() -> Any:
    """The ``peft`` module, or a clear error: LoRA needs it."""
    try:
        import peft
    except ImportError as exc:
        raise ParameterError(
            f"lora_rank: LoRA needs peft, which is not installed ({exc}); pip install peft, or train every weight with "
            "lora_rank=0",
            argument="lora_rank",
        ) from exc
    return peft


def target_modules(spec: str) -> str | list[str]:
    """``"all-linear"`` (peft's: every linear layer but the output head) or a comma-separated
    list of module names (``"q_proj,v_proj"``)."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ParameterError(
            f"lora_target_modules: expected all-linear or module names, got {spec!r}", argument="lora_target_modules"
        )
    return "all-linear" if names == ["all-linear"] else names


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # peft 0.21 asks the model for is_gradient_checkpointing, which transformers 5 deprecates
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        yield


def add_adapter(model: Any, *, rank: int, alpha: float, modules: str, seed: int) -> Any:
    """``model`` wrapped in a fresh LoRA adapter (a ``peft.PeftModel``; the LoRA ``A``
    matrices are initialised from ``seed``, without touching torch's global RNG)."""
    peft = require_peft()
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_modules(modules), task_type="CAUSAL_LM"
    )
    with torch.random.fork_rng(devices=[]), _quiet():
        torch.manual_seed(seed)
        try:
            wrapped = peft.get_peft_model(model, config)
        except ValueError as exc:  # e.g. target modules not found in the model
            raise ParameterError(
                f"lora_target_modules: peft could not add the adapter: {exc}", argument="lora_target_modules"
            ) from exc
    return wrapped


def load_adapter(model: Any, path: str | Path) -> Any:
    """The adapter saved in ``path`` on ``model`` (trainable), as a ``peft.PeftModel``."""
    peft = require_peft()
    with _quiet():
        return peft.PeftModel.from_pretrained(model, str(path), is_trainable=True)


def adapter_disabled(wrapped: Any) -> Any:
    """The context in which the model computes without its adapter (the base model)."""
    return wrapped.disable_adapter()
