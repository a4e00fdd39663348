"""The recipe's trainer: verl 0.9.1's synchronous v1 trainer running the package's arms.

:func:`register_trainer` registers ``CompPOTrainer``, a subclass of verl's ``PPOTrainerSync``
(``verl/trainer/ppo/v1/trainer_sync.py``), as ``trainer.v1.trainer_mode=comppo``. What it changes:

* ``__init__``: :func:`~comppo_core.integrations.verl.config.prepare_verl_config` (the
  ``comppo`` block validated, the verl settings its arm implies applied, the block copied to
  ``actor_rollout_ref.comppo`` for the actor's worker).
* ``_init_resource_pool_mgr``: the actor role's worker is
  ``CompPOActorRolloutRefWorker`` (:mod:`~comppo_core.integrations.verl.worker`); a separate
  reference worker and the critic (verl's ``TrainingWorker``, the standard-critic arms) stay verl's.
* ``_compute_old_log_prob``: after verl's, the engine's per-token ``comp_gates`` (and the TAC's
  ``values``) in the TransferQueue are moved into the response layout with verl's
  ``response_from_nested``, as verl does for ``log_probs`` (and for the critic's ``values``).
* ``_compute_advantage``: the grpo arm is verl's own path, unchanged. Every critic arm runs
  :func:`comppo_advantages` on verl's ``token_level_rewards`` (after verl's KL-in-reward and
  rollout correction, as verl's method does), its values (the TAC's, or verl's critic's) and
  the gates.

:func:`comppo_advantages` is the arms' advantage computation, tensors in and out (no Ray, no
TransferQueue), what the tests pin against the package's trainer
(:func:`comppo_core.rl.core.step.step_gates` + :func:`comppo_core.rl.core.step.compute_advantages`).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ...errors import ParameterError
from ...rl.core.gate_sources import GateContext
from .config import TRAINER_MODE, CompPOConfig
from .estimator import compute_comp_gae_advantage_return

__all__ = ["arm_gates", "comppo_advantages", "register_trainer", "trainer_class"]


def arm_gates(
    comppo: CompPOConfig, gates: torch.Tensor | None, response_mask: torch.Tensor, *, step: int
) -> torch.Tensor | None:
    """Comp-GAE's ``[B, R]`` gates of the arm (1 off the response), from the actor's concentration gates.

    ``gates`` are the engine's ``comp_gates`` in the response layout ``[B, R]`` (the mapping of the
    concentration, ``comppo.gate``), ``response_mask`` ``[B, R]``. By the arm's gate source
    (:data:`comppo_core.rl.core.gate_sources.GATE_SOURCES`, as the package's trainer:
    :func:`comppo_core.rl.core.step.step_gates`)::

        none            None (GAE)
        concentration   the gates
        constant        comppo.fixed_gate on the response, or the batch mean of the gates (cc.controls.constant)
        shuffle         each row's gates permuted, seeded comppo.seed·1_000_003 + step (cc.controls.shuffle)
        by_position     the batch mean at each response position (cc.controls.by_position)
        inverted        low + high − g

    The controls act on the response tokens in row-major order, so they are the same on this
    layout as on the package's ``[B, T−1]`` one. Inputs are not modified.
    """
    source = comppo.spec.gate_source
    if not source.gated:
        return None
    mask = response_mask.to(torch.bool)
    if gates is None:
        raise ParameterError(
            f"gates: the comppo.arm={comppo.arm} arm needs the actor's concentration gates (comp_gates)",
            argument="gates",
        )
    if tuple(gates.shape) != tuple(mask.shape):
        raise ParameterError(
            f"gates: expected the response layout {list(mask.shape)} of response_mask, got {list(gates.shape)}",
            argument="gates",
        )
    if source.policy_statistic is not None or source.pivotal:
        raise ParameterError(
            f"comppo.arm: the {comppo.arm} arm's gates are not available in the verl recipe", argument="comppo.arm"
        )
    g = torch.where(mask, gates.detach().float(), 1.0)
    if source.takes_fixed_gate and comppo.fixed_gate is not None:
        return torch.where(mask, float(comppo.fixed_gate), 1.0).to(torch.float32)
    if source.mapping is None:
        return g
    params = comppo.gate_params
    context = GateContext(low=params.low, high=params.high, seed=comppo.seed, step=int(step))
    replaced = source.mapping(g, mask, context)
    return torch.where(mask, replaced.to(device=g.device, dtype=torch.float32), 1.0)


def comppo_advantages(
    comppo: CompPOConfig,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None,
    gates: torch.Tensor | None,
    gamma: float,
    lam: float,
    step: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` ``[B, R]`` of a critic arm, in verl's response layout.

    ``values`` are the critic's (the TAC's for a TAC arm, verl's critic's for a standard-critic arm),
    ``gates`` the actor's concentration gates (:func:`arm_gates` turns them into the arm's)::

        A = compute_comp_gae_advantage_return(r, V, m, g_arm, γ, λ, whiten=comppo.whiten)[0]
        R = compute_comp_gae_advantage_return(r, V, m, g_arm, γ, λ_critic, whiten=False)[1]

    ``λ_critic = comppo.lam_critic`` (None: λ), the package's decoupled returns. The grpo arm has no
    critic: verl's own GRPO computes it (a :class:`~comppo_core.errors.ParameterError` here)."""
    if not comppo.spec.uses_gae:
        raise ParameterError(
            f"comppo.arm: the {comppo.arm} arm's advantages are verl's own (group-relative, no critic)",
            argument="comppo.arm",
        )
    if values is None:
        raise ParameterError(f"values: the {comppo.arm} arm's advantages need the critic's values", argument="values")
    g = arm_gates(comppo, gates, response_mask, step=step)
    mask = response_mask.to(torch.bool)
    adv, ret = compute_comp_gae_advantage_return(token_level_rewards, values, mask, g, gamma, lam, whiten=comppo.whiten)
    lam_critic = comppo.lam_critic
    if lam_critic is not None and float(lam_critic) != float(lam):
        _, ret = compute_comp_gae_advantage_return(
            token_level_rewards, values, mask, g, gamma, float(lam_critic), whiten=False
        )
    return adv, ret


_lock = threading.Lock()
_trainer: type | None = None


def trainer_class() -> type:
    """``CompPOTrainer`` (module docstring), built once per process (imports verl's v1 trainer)."""
    global _trainer
    with _lock:
        if _trainer is None:
            _trainer = _build()
        return _trainer


def register_trainer() -> type:
    """Registers ``CompPOTrainer`` as verl's ``trainer.v1.trainer_mode=comppo`` (idempotent) and returns it.

    Raises:
      ImportError: verl (or its v1 trainer's dependencies: ``verl[verl-core]``) is not installed.
    """
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY  # type: ignore[import-not-found]
    from verl.trainer.ppo.v1.trainer_base import register_trainer as verl_register_trainer

    cls = trainer_class()
    if TRAINER_REGISTRY.get(TRAINER_MODE) is not cls:
        verl_register_trainer(TRAINER_MODE)(cls)
    return cls


def _build() -> type:
    import numpy as np
    from tensordict import TensorDict  # type: ignore[import-not-found, unused-ignore]
    from verl.protocol import DataProto  # type: ignore[import-not-found]
    from verl.trainer.ppo.utils import Role  # type: ignore[import-not-found]
    from verl.trainer.ppo.v1 import trainer_base  # type: ignore[import-not-found]
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync  # type: ignore[import-not-found]
    from verl.workers.utils.padding import response_from_nested, response_to_nested  # type: ignore[import-not-found]

    from .config import prepare_verl_config
    from .worker import worker_classes

    class CompPOTrainer(PPOTrainerSync):  # type: ignore[misc]
        """verl's synchronous v1 trainer running the ``comppo`` block's arm (:mod:`~comppo_core.integrations.verl.trainer`)."""

        def __init__(self, config: Any) -> None:
            self.comppo = prepare_verl_config(config)
            super().__init__(config)

        def _init_resource_pool_mgr(self) -> None:
            import ray

            super()._init_resource_pool_mgr()
            actor_worker: Any = ray.remote(worker_classes()[1])
            for role in (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor):
                if role in self.role_worker_mapping:
                    self.role_worker_mapping[role] = actor_worker

        def _compute_old_log_prob(self, batch: Any, metrics: dict[str, Any]) -> Any:
            batch = super()._compute_old_log_prob(batch, metrics)
            names = self._comppo_fields()
            if not names:
                return batch
            tq = trainer_base.tq
            data = tq.kv_batch_get(
                keys=batch.keys, partition_id=batch.partition_id, select_fields=[*names, "response_mask"]
            )
            for name in names:
                data[name] = response_from_nested(data.pop(name), data["response_mask"])
            return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=data.select(*names))

        def _comppo_fields(self) -> list[str]:
            """The engine's per-token outputs the arm reads, moved to the response layout."""
            names = []
            if self.comppo.probe_old_log_prob and self.comppo.spec.gate_source.gated:
                names.append("comp_gates")
            if self.comppo.has_tac:
                names.append("values")
            return names

        def _compute_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
            comppo = self.comppo
            if not comppo.spec.uses_gae:
                return super()._compute_advantage(batch, metrics)  # grpo: verl's own
            tq = trainer_base.tq
            fields = ["uid", "response_mask", "rm_scores", "rollout_log_probs", "old_log_probs", "ref_log_prob"]
            fields.append("values")
            if comppo.spec.gate_source.gated:
                fields.append("comp_gates")
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)

            response_mask = data["response_mask"]
            data = DataProto(batch=data.to_padded_tensor())
            data.batch["token_level_scores"] = data.batch["rm_scores"]
            data.non_tensor_batch["uid"] = np.array(data.batch.pop("uid").tolist(), dtype=object)

            # 1. the KL penalty in the rewards, as verl's _compute_advantage
            algorithm = self.config.algorithm
            if algorithm.use_kl_in_reward:
                data, kl_metrics = trainer_base.apply_kl_penalty(
                    data, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=algorithm.kl_penalty
                )
                metrics.update(kl_metrics)
            else:
                data.batch["token_level_rewards"] = data.batch["token_level_scores"]

            # 2. rollout correction (decoupled mode), as verl's
            rollout_corr_config = algorithm.get("rollout_correction", None)
            bypass = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
            rollout_correction = rollout_corr_config is not None and "rollout_log_probs" in data.batch and not bypass
            if rollout_correction:
                data, is_metrics = trainer_base.compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)
                metrics.update(is_metrics)

            # 3. the arm's advantages
            gates = data.batch["comp_gates"] if "comp_gates" in data.batch.keys() else None
            adv, ret = comppo_advantages(
                comppo,
                data.batch["token_level_rewards"],
                data.batch["response_mask"],
                values=data.batch["values"],
                gates=gates,
                gamma=float(algorithm.gamma),
                lam=float(algorithm.lam),
                step=int(getattr(self, "global_steps", 0)),
            )
            data.batch["advantages"], data.batch["returns"] = adv, ret
            if gates is not None:
                m = data.batch["response_mask"].to(torch.bool)
                used = arm_gates(comppo, gates, m, step=int(getattr(self, "global_steps", 0)))
                if used is not None and bool(m.any()):
                    gv = used[m].double()
                    metrics.update(
                        {
                            "comppo/gate_mean": float(gv.mean()),
                            "comppo/gate_min": float(gv.min()),
                            "comppo/gate_max": float(gv.max()),
                        }
                    )

            # 4. nested advantages and returns back to the TransferQueue, as verl's
            out_fields = ["advantages", "returns"]
            if algorithm.use_kl_in_reward:
                out_fields.append("token_level_rewards")
            if rollout_correction:
                out_fields.append("response_mask")
                if "rollout_is_weights" in data.batch:
                    out_fields.append("rollout_is_weights")
            output = {name: response_to_nested(data.batch[name], response_mask) for name in out_fields}
            return tq.kv_batch_put(
                keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(output, batch_size=len(batch))
            )

    CompPOTrainer.__module__ = __name__
    CompPOTrainer.__qualname__ = "CompPOTrainer"
    return CompPOTrainer


def __getattr__(name: str) -> Any:
    """``CompPOTrainer`` as a module attribute (built on first use)."""
    if name == "CompPOTrainer":
        return trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
