"""comppo_core on verl (0.9.1): the GAE drop-in, Comp-GAE, and the pieces of the CompPO recipe.

* :mod:`.dropin`: ``compute_gae_advantage_return`` (verl's GAE, ``gates=`` makes it
  Comp-GAE) and the ``"comp_gae"`` registry estimator (:func:`register`, :func:`set_inputs`);
  re-exported here, importable as before.
* :mod:`.estimator`: :func:`~.estimator.compute_comp_gae_advantage_return`, Comp-GAE on the
  gates and values the CompPO engine puts in the batch (what the recipe's trainer calls).
* :mod:`.layout`: verl's packed ``NO_PADDING`` per-token layout ↔ comppo_core's packed
  columns (torch only).
* :mod:`.engine` (needs verl, imported on request): ``CompPOEngine``, verl's FSDP actor
  engine whose forward also gives the concentration, Comp-GAE's gates and the TAC's values,
  with the TAC sharded, optimised and checkpointed as part of the actor.
* :mod:`.losses` (needs verl): ``comppo_actor_loss``, verl's PPO loss plus the TAC's value loss.
* The recipe (need verl, imported on request; docs/verl.md): :mod:`.config` (the ``comppo``
  config block), :mod:`.worker` (the actor worker on the CompPO engine), :mod:`.trainer` (the
  ``comppo`` trainer mode: each arm's advantages), :mod:`.plugin` (registers both in every verl
  process), :mod:`.main_ppo` (``python -m comppo_core.integrations.verl.main_ppo``).

Importing this package needs neither verl nor torch.
"""

from .dropin import compute_comp_gae_advantage, compute_gae_advantage_return, register, set_inputs

__all__ = ["compute_comp_gae_advantage", "compute_gae_advantage_return", "register", "set_inputs"]
