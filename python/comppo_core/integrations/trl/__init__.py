"""CompPO inside TRL (the ``[trl]`` extra; docs/trl.md).

* :class:`CompPOConfig`: ``trl.GRPOConfig`` plus the arm and the CompPO settings;
* :class:`CompPOTrainer`: ``trl.GRPOTrainer`` whose scoring, advantages and losses are
  :mod:`comppo_core.rl.core.step`'s, with the TAC outside the accelerate-wrapped model;
* :mod:`.tasks`: a registered task's datasets and verifier for TRL (:func:`dataset_and_rewards`,
  :func:`task_dataset`, :func:`task_reward_function`);
* :data:`PINNED_SIGNATURES`: the ``GRPOTrainer`` private methods it overrides or calls,
  as trl 1.16 defines them (a test compares them with the installed trl).

``import comppo_core`` imports none of this (nor trl).
"""

from .config import ARM_CHOICES, CompPOConfig, tac_arms, unsupported
from .pinned import PINNED_ATTRIBUTES, PINNED_SIGNATURES
from .tasks import (
    TASK_COLUMNS,
    TaskData,
    TaskReward,
    dataset_and_rewards,
    pivotal_completion_columns,
    pivotal_task,
    task_dataset,
    task_problems,
    task_reward_function,
    trl_eos_token_ids,
)
from .trainer import CRITIC_FILE, CompPOTrainer

__all__ = [
    "ARM_CHOICES",
    "CRITIC_FILE",
    "PINNED_ATTRIBUTES",
    "PINNED_SIGNATURES",
    "TASK_COLUMNS",
    "CompPOConfig",
    "CompPOTrainer",
    "TaskData",
    "TaskReward",
    "dataset_and_rewards",
    "pivotal_completion_columns",
    "pivotal_task",
    "tac_arms",
    "task_dataset",
    "task_problems",
    "task_reward_function",
    "trl_eos_token_ids",
    "unsupported",
]
