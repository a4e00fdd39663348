"""The standard critic on TRL: a value model prepared by accelerate like the policy.

The arms ``ppo``, ``ppo_fixed`` and ``comp_gae`` read their values from a second
transformer, as verl and OpenRLHF build it: :class:`~comppo_core.rl.StandardCritic`, the
actor's architecture with a float32 scalar head (``V_j = w · h_j^{last}``, column j reads the
prefix ``ids[:, :j+1]``), initialised from the policy's weights unless a ``value_model=`` is
given. :class:`ValueModel` owns it on a :class:`~comppo_core.integrations.trl.CompPOTrainer`:

``prepare``   once the trainer's accelerator has prepared the policy (when training starts):
              ``accelerator.prepare`` the critic as the policy was, so DDP replicates it,
              ZeRO-2/3 partition its optimiser state/parameters and FSDP2 shards it.
              Under DeepSpeed it becomes a second engine with its own AdamW (accelerate's
              ``accelerator.backward`` keeps driving the policy's engine); otherwise its AdamW
              is built over the prepared parameters (FSDP2's DTensors).
``backward``  the critic's part of a micro-batch's loss, ``vf_coef · share · value_loss ·
              world_size``, scaled as TRL scales the policy's (no division by the
              accumulation steps: the shares already sum to the step's loss). Its graph is
              disjoint from the policy's (its own transformer), so it is backwarded on its
              own: through the critic's engine under DeepSpeed (which steps at the
              accumulation boundary), else ``loss.backward()``; DDP's and FSDP2's hooks on
              the prepared module average the gradients over processes (hence the factor
              ``world_size``, as for the policy).
``step``      at the accumulation boundary: clip to ``max_grad_norm`` and step (the package
              trainer clips the actor and the critic separately, and so does this).
``save/load`` TRL checkpoints: ``comppo_critic.pt`` with the full (unsharded) state dicts of
              the critic and its optimiser (``torch.distributed.checkpoint.state_dict``, a
              collective under FSDP2), or under DeepSpeed the engine's own (partitioned)
              checkpoint in ``comppo_value_model/``.

With PEFT (``peft_config=``) the value model gets a LoRA of its own with the policy's
adapter settings; its LoRA and its head train, its transformer stays frozen.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

import torch
from torch import nn

from ...errors import ParameterError
from ...rl.critics.standard import StandardCritic

__all__ = ["DEEPSPEED_FOLDER", "ValueModel", "build_value_model"]

#: Under DeepSpeed, the folder of each TRL checkpoint holding the value model's engine checkpoint.
DEEPSPEED_FOLDER = "comppo_value_model"


def build_value_model(
    policy: Any,
    value_model: Any,
    *,
    seed: int,
    peft_config: Any = None,
    model_init_kwargs: Any = None,
) -> StandardCritic:
    """The standard critic of a run: a copy of ``policy``'s transformer (a model object, or a
    model id/path loaded with ``AutoModel``) unless ``value_model`` (a model or a path) is
    given; its head drawn from a generator seeded ``seed·1000 + 3`` (as
    :func:`comppo_core.rl.engine.build.make_critic`). With ``peft_config``: a LoRA of its own."""
    generator = torch.Generator().manual_seed(seed * 1000 + 3)
    source = policy if value_model is None else value_model
    if isinstance(source, str):
        kwargs = model_init_kwargs if isinstance(model_init_kwargs, dict) else {}  # TRL's, as it loads the policy
        critic = StandardCritic.from_pretrained(source, generator=generator, **kwargs)
    elif isinstance(source, nn.Module):
        if any(hasattr(p, "ds_id") for p in source.parameters()):
            raise ParameterError(
                "value_model: expected a model whose parameters are not ZeRO-3 partitioned (pass a model id or path, "
                "which is loaded partitioned, or the model before DeepSpeed touches it)",
                argument="value_model",
            )
        if hasattr(source, "get_base_model"):
            raise ParameterError(
                "value_model: expected a transformers model, got a PEFT model (pass the base model, or value_model=)",
                argument="value_model",
            )
        base = getattr(source, "base_model", source)  # a ...ForCausalLM's transformer, or a ...Model
        critic = StandardCritic(copy.deepcopy(base), generator=generator)
    else:
        got = type(source).__name__
        raise ParameterError(f"value_model: expected a model or a model id/path, got {got}", argument="value_model")
    if peft_config is not None:
        from peft import get_peft_model

        lora = copy.deepcopy(peft_config)
        if dataclasses.is_dataclass(lora) and hasattr(lora, "task_type"):
            lora.task_type = None  # a feature extractor: the critic reads the last hidden state
        critic.backbone = get_peft_model(critic.backbone, lora)
    return critic


class ValueModel:
    """The value model of a standard-critic arm under a trainer's accelerator (module docstring).

    Attributes:
      critic: the :class:`~comppo_core.rl.StandardCritic` (unprepared).
      module: what the forward calls: the critic until :meth:`prepare`, then accelerate's
        prepared object (the critic, DDP around it, its DeepSpeed engine, or the FSDP2 module).
      optimizer: its AdamW (None until :meth:`prepare`).
    """

    def __init__(self, critic: StandardCritic, accelerator: Any, *, lr: float, weight_decay: float, clip: float):
        self.critic = critic
        self.accelerator = accelerator
        self.module: nn.Module = critic
        self.optimizer: torch.optim.Optimizer | None = None
        self.engine: Any = None
        self.lr, self.weight_decay, self.clip = lr, weight_decay, clip

    @property
    def deepspeed(self) -> bool:
        return str(self.accelerator.distributed_type) == "DistributedType.DEEPSPEED"

    def _adamw(self, module: nn.Module) -> torch.optim.Optimizer:
        params = [p for p in module.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)

    def prepare(self) -> None:
        """Prepare the critic as the policy was (idempotent; module docstring)."""
        if self.optimizer is not None:
            return
        acc = self.accelerator
        if self.deepspeed:
            # a second engine; accelerate's backward must keep driving the policy's
            policy_engine, acc.deepspeed_engine_wrapped = acc.deepspeed_engine_wrapped, None
            try:
                self.module, self.optimizer = acc.prepare(self.critic, self._adamw(self.critic))
                self.engine = self.module
            finally:
                acc.deepspeed_engine_wrapped = policy_engine
        else:
            self.module = acc.prepare(self.critic)
            self.optimizer = self._adamw(self.module)

    def backward(self, loss: torch.Tensor, *, boundary: bool) -> None:
        """Backward the critic's part of a micro-batch's loss (module docstring); under
        DeepSpeed its engine also steps when ``boundary``."""
        if self.engine is not None:
            self.engine.set_gradient_accumulation_boundary(is_boundary=boundary)
            self.engine.backward(loss, scale_wrt_gas=False)
            if boundary:
                self.engine.step()
        else:
            loss.backward()

    def step(self) -> float:
        """Clip and step at the accumulation boundary (DeepSpeed's engine did it in
        :meth:`backward`); the gradient norm before clipping."""
        if self.engine is not None:
            norm = self.engine.get_global_grad_norm()
            return float(norm) if norm is not None else float("nan")
        assert self.optimizer is not None
        params = [p for p in self.module.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.clip)
        if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
            norm = norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # ---- checkpoints

    def state(self) -> dict[str, Any]:
        """Full state dicts of the critic and its optimiser (a collective when sharded);
        under DeepSpeed, the name of the engine's checkpoint folder instead."""
        if self.engine is not None:
            return {"deepspeed": DEEPSPEED_FOLDER}
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        assert self.optimizer is not None
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {
            "critic": get_model_state_dict(self.module, options=options),
            "optimizer": get_optimizer_state_dict(self.module, self.optimizer, options=options),
        }

    def save(self, folder: str) -> dict[str, Any]:
        """Write what :meth:`load` reads into ``folder`` (every process calls it); return
        what rank 0 writes to ``comppo_critic.pt``."""
        if self.engine is not None:
            self.engine.save_checkpoint(os.path.join(folder, DEEPSPEED_FOLDER), tag="value_model", save_latest=False)
        return self.state()

    def load(self, folder: str, state: dict[str, Any]) -> None:
        """Restore the critic and its optimiser from a checkpoint :meth:`save` wrote."""
        self.prepare()
        if self.engine is not None:
            if "deepspeed" not in state:
                raise ParameterError(
                    f"resume_from_checkpoint: expected a DeepSpeed checkpoint of the value model in {folder}, "
                    "got full state dicts (resume under the backend that saved it)",
                    argument="resume_from_checkpoint",
                )
            self.engine.load_checkpoint(
                os.path.join(folder, DEEPSPEED_FOLDER),
                tag="value_model",
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
            )
            return
        if "critic" not in state:
            raise ParameterError(
                f"resume_from_checkpoint: expected the value model's state dicts in {folder}, got a DeepSpeed "
                "checkpoint (resume under the backend that saved it)",
                argument="resume_from_checkpoint",
            )
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        assert self.optimizer is not None
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.module, state["critic"], options=options)
        set_optimizer_state_dict(self.module, self.optimizer, state["optimizer"], options=options)
