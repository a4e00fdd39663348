"""Training with CompPO: critics, PPO losses, the scoring forward and the trainer (docs/design.md §10).

Needs the ``[rl]`` extra (torch, transformers, tqdm, matplotlib); ``import comppo_core``
alone imports none of them.

Everything per token here is ``[B, T−1]`` in the column convention of
:func:`comppo_core.hf.logprobs_and_concentration`: column j scores token ``ids[:, j+1]``
from query position j, and ``values[:, j]`` is the value of the prefix ``ids[:, :j+1]``.
"""

from __future__ import annotations

from ..gate_params import GateParams
from . import arms, losses, tasks, trainer
from .arms import ARMS, Arm
from .config import TrainConfig
from .critic_inputs import CriticInputs
from .forward import ForwardOutput, forward
from .losses import aggregate, kl_penalty, policy_loss, value_loss
from .standard_critic import StandardCritic
from .tac import (
    TEMPORAL_MIXERS,
    TransportAlignedCritic,
    causal_gates,
    parameter_count,
    running_zscore,
)
from .taps import TapRecorder, decoder_layers, default_taps
from .trainer import Trainer, train

__all__ = [
    "ARMS",
    "TEMPORAL_MIXERS",
    "Arm",
    "CriticInputs",
    "ForwardOutput",
    "GateParams",
    "StandardCritic",
    "TapRecorder",
    "TrainConfig",
    "Trainer",
    "TransportAlignedCritic",
    "aggregate",
    "arms",
    "causal_gates",
    "decoder_layers",
    "default_taps",
    "forward",
    "kl_penalty",
    "losses",
    "parameter_count",
    "policy_loss",
    "running_zscore",
    "tasks",
    "train",
    "trainer",
    "value_loss",
]
