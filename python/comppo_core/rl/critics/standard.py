"""The baselines' critic: a second transformer with a value head, as verl and OpenRLHF build it.

::

    V_j = w · h_j^{last},     h^{last} = the critic transformer's last hidden state (after its final norm)

``values[:, j]`` reads position j, the prefix ``ids[:, :j+1]`` (verl takes
``values[:, -response_length-1:-1]``, OpenRLHF ``value_head(h)[:, :-1]``: the same
columns). The transformer has the actor's architecture and starts from the actor's
weights (:meth:`StandardCritic.from_actor`, verl's default of initialising the critic
from the policy checkpoint) or from any local model (:meth:`StandardCritic.from_pretrained`).
The head is OpenRLHF's: ``Linear(d, 1, bias=False)`` with weights ``N(0, 1/(d+1))``,
kept in float32. It reads the same :class:`~comppo_core.rl.CriticInputs` as TAC, so a
run swaps critics with one argument; it ignores the actor's taps and routing.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ...errors import ParameterError
from .inputs import CriticInputs

__all__ = ["StandardCritic"]


class StandardCritic(nn.Module):
    """A transformer backbone (``...Model``, no LM head) and a float32 value head.

    Args:
      backbone: a transformers base model (e.g. ``LlamaModel``) whose output has
        ``last_hidden_state`` ``[B, T, d]``.
      generator: seeds the value head's initialisation (None: torch's global RNG).
    """

    #: decoder layers of the actor this critic reads (none: it runs its own transformer)
    taps: tuple[int, ...] = ()
    #: per-layer concentration features it reads (none)
    routing_layers: int | None = None

    def __init__(self, backbone: nn.Module, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        cfg = getattr(backbone, "config", None)
        get_text = getattr(cfg, "get_text_config", None)
        text = get_text() if callable(get_text) else cfg
        d = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None)
        if not isinstance(d, int):
            raise ParameterError(
                f"backbone: expected a transformers model with a config.hidden_size, got {type(backbone).__name__}",
                argument="backbone",
            )
        self.backbone = backbone
        device = next(backbone.parameters()).device
        self.value_head = nn.Linear(d, 1, bias=False, dtype=torch.float32, device=device)
        with torch.no_grad():
            w = torch.randn(self.value_head.weight.shape, generator=generator, dtype=torch.float32)
            self.value_head.weight.copy_(w * (1.0 / (d + 1)))

    @classmethod
    def from_actor(cls, model: Any, *, generator: torch.Generator | None = None) -> StandardCritic:
        """A critic whose transformer is a copy of the actor's (weights included)."""
        base = getattr(model, "base_model", None)
        if not isinstance(base, nn.Module) or base is model:
            raise ParameterError(
                f"model: expected a ...ForCausalLM with a base model (model.base_model), got {type(model).__name__}",
                argument="model",
            )
        return cls(copy.deepcopy(base), generator=generator)

    @classmethod
    def from_pretrained(cls, path: str, *, generator: torch.Generator | None = None, **kwargs: Any) -> StandardCritic:
        """A critic whose transformer is loaded from a local model directory (``AutoModel``)."""
        from transformers import AutoModel

        return cls(AutoModel.from_pretrained(path, **kwargs), generator=generator)

    def forward(self, inputs: CriticInputs) -> torch.Tensor:
        """Values ``[B, T−1]`` float32 from the critic's own forward; 0 outside ``inputs.columns``."""
        out = self.backbone(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask.long(),
            position_ids=inputs.position_ids,
            use_cache=False,
        )
        h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        v = self.value_head(h[:, :-1].float()).squeeze(-1)
        return torch.where(inputs.columns, v, torch.zeros_like(v))
