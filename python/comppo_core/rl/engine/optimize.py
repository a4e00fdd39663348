"""The optimisers of a run and one gradient step of them.

Two AdamW optimisers, the actor's (every trainable weight, or a LoRA adapter's) and the
critic's, each clipping its own gradient to ``max_grad_norm``. One step (:meth:`Optimizers.step`)::

    loss.backward()                       (this process's share of the minibatch loss)
    all-reduce the gradients              (a sum over processes; the identity on one)
    clip each optimiser's gradient norm; refuse a non-finite loss or norm
    actor.step() if the actor trains (not during critic_warmup); critic.step()

A non-finite loss on any process raises :class:`~comppo_core.errors.NonFiniteError` on
every process (the all-reduce carries the flag and the rank that raised it), before any
weight changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from ...errors import NonFiniteError
from .distributed import Dist

__all__ = ["Optimizers"]


class Optimizers:
    """AdamW over ``actor_params`` and (if any) ``critic_params``, with their clipping."""

    def __init__(
        self,
        actor_params: Sequence[nn.Parameter],
        critic_params: Sequence[nn.Parameter],
        *,
        actor_lr: float,
        critic_lr: float,
        weight_decay: float,
        max_grad_norm: float,
        has_critic: bool,
    ) -> None:
        self.actor_params = list(actor_params)
        self.critic_params = list(critic_params)
        self.max_grad_norm = max_grad_norm
        self.actor = torch.optim.AdamW(self.actor_params, lr=actor_lr, weight_decay=weight_decay)
        self.critic = (
            torch.optim.AdamW(self.critic_params, lr=critic_lr, weight_decay=weight_decay) if has_critic else None
        )

    def zero_grad(self) -> None:
        self.actor.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.zero_grad(set_to_none=True)

    def step(self, loss: torch.Tensor | None, *, dist: Dist, train_actor: bool, where: str) -> dict[str, float]:
        """Backward ``loss`` (None: this process has no rows in the minibatch), all-reduce,
        clip and step (module docstring); returns the gradient norms before clipping
        (``grad_norm_actor`` when the actor trains, ``grad_norm_critic`` with a critic)."""
        value = math.nan if loss is None else float(loss.detach())
        bad = loss is not None and not math.isfinite(value)
        if bad and not dist.distributed:
            raise NonFiniteError(f"loss: expected a finite value, got {value} ({where})", argument="loss")
        if loss is not None and not bad:
            loss.backward()
        rank = dist.all_reduce_gradients(self.actor_params + self.critic_params, nonfinite=bad)
        if rank is not None:
            got = f"got {value}" if bad else f"got a non-finite value on rank {rank}"
            raise NonFiniteError(f"loss: expected a finite value, {got} ({where})", argument="loss")
        norms = {}
        if train_actor:
            norms["grad_norm_actor"] = float(torch.nn.utils.clip_grad_norm_(self.actor_params, self.max_grad_norm))
        if self.critic is not None:
            norms["grad_norm_critic"] = float(torch.nn.utils.clip_grad_norm_(self.critic_params, self.max_grad_norm))
        for name, norm in norms.items():
            if not math.isfinite(norm):
                raise NonFiniteError(
                    f"gradient: expected a finite norm of the {name[10:]}'s gradient, got {norm} ({where})",
                    argument="gradient",
                )
        if train_actor:
            self.actor.step()
        if self.critic is not None:
            self.critic.step()
        return norms
