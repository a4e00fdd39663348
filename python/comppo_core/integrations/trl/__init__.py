"""CompPO inside TRL (the ``[trl]`` extra; docs/trl.md).

* :class:`CompPOConfig`: ``trl.GRPOConfig`` plus the arm and the CompPO settings;
* :class:`CompPOTrainer`: ``trl.GRPOTrainer`` whose scoring, advantages and losses are
  :mod:`comppo_core.rl.core.step`'s, with the TAC outside the accelerate-wrapped model;
* :data:`PINNED_SIGNATURES`: the ``GRPOTrainer`` private methods it overrides or calls,
  as trl 1.16 defines them (a test compares them with the installed trl).

``import comppo_core`` imports none of this (nor trl).
"""

from .config import ARM_CHOICES, CompPOConfig, tac_arms, unsupported
from .pinned import PINNED_ATTRIBUTES, PINNED_SIGNATURES
from .trainer import CRITIC_FILE, CompPOTrainer

__all__ = [
    "ARM_CHOICES",
    "CRITIC_FILE",
    "PINNED_ATTRIBUTES",
    "PINNED_SIGNATURES",
    "CompPOConfig",
    "CompPOTrainer",
    "tac_arms",
    "unsupported",
]
