"""Training with CompPO: critics, PPO losses, the step's maths and the trainer (docs/design.md §10).

Needs the ``[rl]`` extra (torch, transformers, tqdm, matplotlib, peft); ``import comppo_core``
alone imports none of them, and neither does reading a config:
``from comppo_core.rl.config import TrainConfig`` imports no torch. The names below are
loaded on first use.

Everything per token here is ``[B, T−1]`` in the column convention of
:func:`comppo_core.hf.score`: column j scores token ``ids[:, j+1]`` from query position
j, and ``values[:, j]`` is the value of the prefix ``ids[:, :j+1]``. The map of the
modules is docs/architecture.md.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..gate_params import GateParams
    from ..options import TEMPORAL_MIXERS
    from . import arms, losses, step, tasks, trainer
    from .arms import ARMS, Arm
    from .config import TrainConfig
    from .critic_inputs import CriticInputs
    from .losses import aggregate, kl_penalty, policy_loss, value_loss
    from .policy_forward import ForwardOutput, forward
    from .standard_critic import StandardCritic
    from .tac import TransportAlignedCritic, causal_gates, parameter_count, running_zscore
    from .taps import TapRecorder, decoder_layers, default_taps
    from .trainer import Trainer, train

#: public name -> the module (relative to this package) that defines it; a module maps to itself
_WHERE = {
    "GateParams": "..gate_params",
    "ARMS": ".arms",
    "Arm": ".arms",
    "TrainConfig": ".config",
    "CriticInputs": ".critic_inputs",
    "ForwardOutput": ".policy_forward",
    "forward": ".policy_forward",
    "aggregate": ".losses",
    "kl_penalty": ".losses",
    "policy_loss": ".losses",
    "value_loss": ".losses",
    "StandardCritic": ".standard_critic",
    "TEMPORAL_MIXERS": "..options",
    "TransportAlignedCritic": ".tac",
    "causal_gates": ".tac",
    "parameter_count": ".tac",
    "running_zscore": ".tac",
    "TapRecorder": ".taps",
    "decoder_layers": ".taps",
    "default_taps": ".taps",
    "Trainer": ".trainer",
    "train": ".trainer",
    "arms": ".arms",
    "losses": ".losses",
    "step": ".step",
    "tasks": ".tasks",
    "trainer": ".trainer",
}

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
    "step",
    "tasks",
    "train",
    "trainer",
    "value_loss",
]


assert set(__all__) == set(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(where, __name__)
    value = module if where == f".{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
