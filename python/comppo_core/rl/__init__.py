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
    from . import tasks
    from .config import TrainConfig
    from .core import arms, losses, step
    from .core.arms import ARMS, Arm
    from .core.losses import aggregate, kl_penalty, policy_loss, value_loss
    from .core.policy_forward import ForwardOutput, forward
    from .critics.inputs import CriticInputs
    from .critics.standard import StandardCritic
    from .critics.tac import TransportAlignedCritic, causal_gates, parameter_count, running_zscore
    from .critics.taps import TapRecorder, decoder_layers, default_taps
    from .engine import trainer
    from .engine.trainer import Trainer, train

#: public name -> the module (relative to this package) that defines it; a module maps to itself
_WHERE = {
    "GateParams": "..gate_params",
    "ARMS": ".core.arms",
    "Arm": ".core.arms",
    "TrainConfig": ".config",
    "CriticInputs": ".critics.inputs",
    "ForwardOutput": ".core.policy_forward",
    "forward": ".core.policy_forward",
    "aggregate": ".core.losses",
    "kl_penalty": ".core.losses",
    "policy_loss": ".core.losses",
    "value_loss": ".core.losses",
    "StandardCritic": ".critics.standard",
    "TEMPORAL_MIXERS": "..options",
    "TransportAlignedCritic": ".critics.tac",
    "causal_gates": ".critics.tac",
    "parameter_count": ".critics.tac",
    "running_zscore": ".critics.tac",
    "TapRecorder": ".critics.taps",
    "decoder_layers": ".critics.taps",
    "default_taps": ".critics.taps",
    "Trainer": ".engine.trainer",
    "train": ".engine.trainer",
    "arms": ".core.arms",
    "losses": ".core.losses",
    "step": ".core.step",
    "tasks": ".tasks",
    "trainer": ".engine.trainer",
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
    value = module if where.rsplit(".", 1)[-1] == name else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
