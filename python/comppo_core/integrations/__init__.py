"""Drop-in replacements for the advantage functions of existing RL frameworks.

* :mod:`comppo_core.integrations.verl`: ``compute_gae_advantage_return`` and a
  ``"comp_gae"`` estimator for verl's registry.
* :mod:`comppo_core.integrations.openrlhf`: ``get_advantages_and_returns``.
* :mod:`comppo_core.integrations.trl` (the ``[trl]`` extra, imported only on request):
  ``CompPOConfig`` and ``CompPOTrainer``, a ``trl.GRPOTrainer`` running the CompPO arms
  with :mod:`comppo_core.rl.core.step`'s maths (docs/trl.md).

Each takes the original's exact signature (plus an optional ``gates=`` keyword, which
turns GAE into Comp-GAE) and reproduces the original's outputs on valid positions.
"""

from . import openrlhf, verl

__all__ = ["openrlhf", "verl"]
