"""The recipe's actor worker: verl's ``ActorRolloutRefWorker`` with the CompPO engine in the actor.

:func:`worker_classes` builds (once per process; verl imported then) two subclasses of
verl 0.9.1's workers (``verl/workers/engine_workers.py``):

* ``CompPOTrainingWorker(TrainingWorker)``: builds its engine as
  ``model_type=`` :data:`~comppo_core.integrations.verl.engine.MODEL_TYPE` (the CompPO engine,
  registered on the spot), with the :class:`~comppo_core.integrations.verl.engine.EngineSettings`
  configured in this process (:func:`~comppo_core.integrations.verl.engine.configure_engine`).
* ``CompPOActorRolloutRefWorker(ActorRolloutRefWorker)``: ``actor_worker_cls`` is the one
  above (the reference model keeps verl's ``TrainingWorker``). It reads the ``comppo`` block
  from its config (``actor_rollout_ref.comppo``, copied there by
  :func:`~comppo_core.integrations.verl.config.prepare_verl_config`) and

  - ``init_model``: configures the engine from the block, then verl's ``init_model``; with a
    TAC (the arm's critic), the actor's loss becomes
    ``partial(comppo_actor_loss, config=actor_config, vf_coef=, cliprange_value=)``
    (:mod:`~comppo_core.integrations.verl.losses`: verl's ``ppo_loss`` plus ``vf_coef`` × the
    TAC's value loss), in place of verl's ``partial(ppo_loss, config=actor_config)``;
  - ``compute_log_prob`` (the old-log-prob pass): sets ``comppo_probe=True`` in the batch's
    non-tensor data when the arm reads routing (gates or a TAC), so the engine also returns
    ``concentration``, ``comp_gates`` and ``values``; not for the reference's pass of a LoRA
    actor (``no_lora_adapter``), whose outputs would overwrite the actor's in the TransferQueue;
  - ``update_actor``: sets ``comppo_probe=True`` when the arm has a TAC (its values train).

Both re-register the overridden methods with verl's ``@register`` (the same dispatch as
verl's), so the Ray worker group dispatches them as verl's.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from ...errors import ParameterError
from .config import CompPOConfig, parse

__all__ = ["comppo_config_of", "worker_classes"]

_lock = threading.Lock()
_classes: tuple[type, type] | None = None


def comppo_config_of(config: Any) -> CompPOConfig:
    """The ``comppo`` block of an ``actor_rollout_ref`` config (an OmegaConf mapping), validated;
    a config without one is refused (the trainer copies it there)."""
    block = config.get("comppo", None) if hasattr(config, "get") else None
    if block is None:
        raise ParameterError(
            "actor_rollout_ref.comppo: the CompPO actor worker reads its comppo block there (the recipe's trainer "
            "copies the top-level comppo block: prepare_verl_config); got none",
            argument="actor_rollout_ref.comppo",
        )
    return parse(block)


def worker_classes() -> tuple[type, type]:
    """``(CompPOTrainingWorker, CompPOActorRolloutRefWorker)`` (module docstring), built once."""
    global _classes
    with _lock:
        if _classes is None:
            _classes = _build()
        return _classes


def _build() -> tuple[type, type]:
    from verl.single_controller.base.decorator import (  # type: ignore[import-not-found]
        Dispatch,
        make_nd_compute_dataproto_dispatch_fn,
        register,
    )
    from verl.utils import tensordict_utils as tu  # type: ignore[import-not-found]
    from verl.workers.engine_workers import (  # type: ignore[import-not-found]
        ActorRolloutRefWorker,
        TrainingWorker,
    )
    from verl.workers.utils.losses import ppo_loss  # type: ignore[import-not-found]

    from .engine import MODEL_TYPE, configure_engine, register_engine

    class CompPOTrainingWorker(TrainingWorker):  # type: ignore[misc]
        """verl's ``TrainingWorker`` whose engine is the CompPO engine (:mod:`~comppo_core.integrations.verl.worker`)."""

        def __init__(self, config: Any) -> None:
            import dataclasses

            register_engine()
            super().__init__(dataclasses.replace(config, model_type=MODEL_TYPE))

    class CompPOActorRolloutRefWorker(ActorRolloutRefWorker):  # type: ignore[misc]
        """verl's actor/rollout/ref worker with the CompPO engine in the actor
        (:mod:`~comppo_core.integrations.verl.worker`)."""

        actor_worker_cls = CompPOTrainingWorker
        comppo: CompPOConfig
        loss_fn: Any

        def __init__(self, config: Any, role: str, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, role, *args, **kwargs)
            self.comppo = comppo_config_of(config)

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self) -> None:
            configure_engine(self.comppo.engine_settings())
            super().init_model()
            if self.actor is not None and self.comppo.has_tac:
                self.loss_fn = comppo_loss(self.loss_fn, self.comppo)
                self.actor.set_loss_fn(self.loss_fn)

        @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
        def compute_log_prob(self, data: Any) -> Any:
            # the reference's pass of a LoRA actor (no_lora_adapter) comes here too: it must not write the gates
            reference = tu.get_non_tensor_data(data=data, key="no_lora_adapter", default=False)
            if self.comppo.probe_old_log_prob and not reference:
                tu.assign_non_tensor(data, comppo_probe=True)
            return super().compute_log_prob(data)

        @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
        def update_actor(self, data: Any) -> Any:
            if self.comppo.probe_update:
                tu.assign_non_tensor(data, comppo_probe=True)
            return super().update_actor(data)

    def comppo_loss(loss_fn: Any, comppo: CompPOConfig) -> Any:
        """verl's actor loss ``partial(ppo_loss, config=actor_config)`` as the TAC arm's loss."""
        if not isinstance(loss_fn, functools.partial) or loss_fn.func is not ppo_loss:
            got = getattr(getattr(loss_fn, "func", loss_fn), "__name__", type(loss_fn).__name__)
            raise ParameterError(
                f"loss_fn: the comppo.arm={comppo.arm} arm adds the TAC's value loss to verl's ppo_loss, but the "
                f"actor's loss is {got} (distillation?)",
                argument="loss_fn",
            )
        from .losses import comppo_actor_loss  # type: ignore[import-not-found, unused-ignore]

        return functools.partial(
            comppo_actor_loss,
            config=loss_fn.keywords["config"],
            vf_coef=comppo.vf_coef,
            cliprange_value=comppo.value_clip,
        )

    for cls in (CompPOTrainingWorker, CompPOActorRolloutRefWorker):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    CompPOActorRolloutRefWorker.comppo_loss = staticmethod(comppo_loss)
    return CompPOTrainingWorker, CompPOActorRolloutRefWorker


def __getattr__(name: str) -> Any:
    """``CompPOTrainingWorker`` and ``CompPOActorRolloutRefWorker`` as module attributes (built on first
    use; Ray pickles the classes by this module and name)."""
    if name == "CompPOTrainingWorker":
        return worker_classes()[0]
    if name == "CompPOActorRolloutRefWorker":
        return worker_classes()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
