"""Residual-stream taps: the hidden states a critic reads, captured with forward hooks.

A *tap* at layer k is the output of decoder layer k, the residual stream after it
(``[B, T, d]``, before the model's final norm for the last layer). :class:`TapRecorder`
registers a forward hook on each tapped decoder layer for the length of one forward
pass, so a pass that runs anyway (the scoring or update forward) hands them over
without ``output_hidden_states=True`` (which keeps every layer's states alive).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from ...errors import ParameterError
from ...hf.probe import UnsupportedModelError, _num_layers, unwrap_model

__all__ = ["TapRecorder", "decoder_layers", "default_taps", "normalize_taps"]


def decoder_layers(model: Any) -> nn.ModuleList:
    """The model's decoder layers: the ``nn.ModuleList`` with ``num_hidden_layers`` blocks.

    Llama/Qwen keep it at ``model.model.layers``, GPT-2 at ``model.transformer.h``; any
    model whose stack is one such list is found. A wrapped model (DDP, DeepSpeed,
    accelerate, PEFT) is searched inside :func:`~comppo_core.hf.probe.unwrap_model`'s
    inner model."""
    model = unwrap_model(model)
    n = _num_layers(model)
    found = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == n]
    if not found:
        raise UnsupportedModelError(
            f"model: found no nn.ModuleList of num_hidden_layers={n} decoder layers in {type(model).__name__}",
            argument="model",
        )
    return found[0]


def default_taps(num_layers: int, k: int = 4) -> tuple[int, ...]:
    """``k`` layers spread evenly over depth, the last included: layer ``round((i+1)·n/k) − 1``.

    For 28 layers and k = 4: (6, 13, 20, 27)."""
    k = max(1, min(k, num_layers))
    return tuple(sorted({round((i + 1) * num_layers / k) - 1 for i in range(k)}))


def normalize_taps(taps: Iterable[int] | None, num_layers: int) -> tuple[int, ...]:
    """Tap indices in ``[0, num_layers)`` (negative ones count from the end), ascending, unique."""
    if taps is None:
        return default_taps(num_layers)
    if isinstance(taps, int) and not isinstance(taps, bool):
        taps = [taps]
    out: list[int] = []
    for t in taps:
        if isinstance(t, bool) or not isinstance(t, int):
            raise ParameterError(f"taps: expected integer layer indices, got {t!r}", argument="taps")
        if not -num_layers <= t < num_layers:
            raise ParameterError(
                f"taps: layer {t} is out of range for a model with {num_layers} layers", argument="taps"
            )
        i = t % num_layers
        if i in out:
            raise ParameterError(f"taps: layer {i} is tapped twice", argument="taps")
        out.append(i)
    if not out:
        raise ParameterError("taps: expected at least one layer", argument="taps")
    return tuple(sorted(out))


class TapRecorder:
    """Context manager: records the output of the given decoder layers during a forward.

    ::

        with TapRecorder(model, (6, 13, 20, 27)) as taps:
            model(input_ids=ids, attention_mask=am)
        taps.hidden[27]            # [B, T, d], the residual stream after layer 27

    ``model`` may be wrapped (DDP, DeepSpeed, accelerate, PEFT): the hooks go on the
    inner model's layers, so a forward run through the wrapper is recorded.
    The recorded tensors are the model's own (no copy): they carry the autograd graph of
    the forward when it ran with gradients on, so the caller decides what to detach."""

    def __init__(self, model: Any, layers: Sequence[int]) -> None:
        self.model = model
        self.layers = tuple(layers)
        self.hidden: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> TapRecorder:
        blocks = decoder_layers(self.model)
        self.hidden = {}
        for i in self.layers:
            self._handles.append(blocks[i].register_forward_hook(self._hook(i)))
        return self

    def _hook(self, layer: int) -> Any:
        def record(module: nn.Module, args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, (tuple, list)) else output
            if not isinstance(out, torch.Tensor) or out.dim() != 3:
                raise UnsupportedModelError(
                    f"model: decoder layer {layer} ({type(module).__name__}) returned "
                    f"{type(out).__name__}, expected a [B, T, d] hidden-state tensor",
                    argument="model",
                )
            self.hidden[layer] = out

        return record

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
