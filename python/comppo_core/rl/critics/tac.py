"""The transport-aligned critic (TAC): a small causal value head on the actor's own computation.

The CompPO abstract fixes only that TAC "reuses the actor's hidden states and routing
information without a second same-scale Transformer". The design below is this
package's reading of it (docs/rl.md). For column j (the prefix ``ids[:, :j+1]``):

::

    x_j  = Σ_k softmax(w)_k · W_k · RMSNorm_k(h_j^{(k)})          taps k = 1..K, [d] → [width]
    f_j  = [c_j^{(1)}, …, c_j^{(L)}, g̃_j, Σ_{s≤j} log g̃_s, 1[j ∈ response]]   routing features
    u_j  = x_j + MLP_route(f_j)
    u_j  = u_j + MLP(RMSNorm(u_j))                                  one residual block
    u    = Mix(u)                                                   "none" | "gru" | "attention", causal
    V_j  = w_v · u_j + b_v                                          float32 head, w_v = 0 at init

``h^{(k)}`` is the residual stream after tap layer k, ``c^{(l)}`` the per-layer
attention concentration at query position j, ``g̃`` the gates the critic reads: always
:func:`causal_gates`, the gate mapping with the row's *running* statistics up to j in
place of the whole-row z-score, computed from the forward's own concentration (defined in
:mod:`comppo_core.rl.critics.inputs`, what every critic reads, and re-exported here).
:func:`comppo_core.rl.forward`'s ``gates=`` (constant gates, controls, an oracle) changes
Comp-GAE's gates only and never reaches the critic: with or without it the values are
the same, bit for bit. Everything V_j reads is a function of tokens ≤ j, so V stays a
baseline: a critic that saw later tokens would bias the policy gradient.

The actor's hidden states enter detached unless ``trunk_grad > 0``, which lets that
fraction of the value gradient into the trunk (``sg(h) + α·(h − sg(h))``: the same value,
``α`` times the gradient). Gates and concentration are never differentiated.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ...errors import ParameterError, ShapeError
from ...options import TEMPORAL_MIXERS, check_choice
from .inputs import CriticInputs, causal_gates, running_zscore
from .taps import normalize_taps

__all__ = ["TEMPORAL_MIXERS", "TransportAlignedCritic", "causal_gates", "running_zscore"]

# TEMPORAL_MIXERS, the causal temporal mixers TAC offers, is defined in comppo_core.options (re-exported).


class _RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) · w`` over the last axis, computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.weight.dtype)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _left_align(valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the column order that puts valid columns first (stable) and their count.

    A causal mixer run over the left-aligned sequence sees exactly the valid columns
    before each one, whatever padding the row had."""
    order = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)
    return order, valid.sum(-1)


class _CausalAttention(nn.Module):
    """One pre-norm causal self-attention block over left-aligned columns."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = _RMSNorm(width, 1e-6)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        b, t, w = u.shape
        q, k, v = self.qkv(self.norm(u)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return u + self.out(a.transpose(1, 2).reshape(b, t, w))


class TransportAlignedCritic(nn.Module):
    """TAC: values ``[B, T−1]`` from the actor's taps and routing (module docstring).

    Args:
      hidden_size: the actor's residual width d.
      num_layers: the actor's number of decoder layers (to resolve ``taps``).
      routing_layers: L, the number of per-layer concentration features (the probe's
        selected layers; all of the actor's by default).
      taps: decoder layers to read (default: 4 spread over depth, the last included).
      width: the critic's width.
      temporal: ``"none"`` (default), ``"gru"`` or ``"attention"``: a causal mixer over
        the response after the per-column features (docs/rl.md says how the default was
        chosen).
      trunk_grad: fraction in ``[0, 1]`` of the value gradient let into the actor's
        hidden states (0: detached).
      routing: read the routing features (False: the taps alone, an ablation).
      route_hidden: hidden width of the routing MLP.
      eps: RMSNorm epsilon (the actor's ``rms_norm_eps`` when built by :meth:`for_model`).
      heads: heads of the attention mixer (must divide ``width``).
    """

    def __init__(
        self,
        hidden_size: int,
        num_layers: int,
        *,
        routing_layers: int | None = None,
        taps: Iterable[int] | None = None,
        width: int = 256,
        temporal: str = "none",
        trunk_grad: float = 0.0,
        routing: bool = True,
        route_hidden: int = 64,
        eps: float = 1e-6,
        heads: int = 4,
    ) -> None:
        super().__init__()
        for name, v in (
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
            ("width", width),
            ("route_hidden", route_hidden),
            ("heads", heads),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParameterError(f"{name}: expected an integer >= 1, got {v!r}", argument=name)
        check_choice("temporal", temporal, TEMPORAL_MIXERS)
        if isinstance(trunk_grad, bool) or not isinstance(trunk_grad, (int, float)) or not 0.0 <= trunk_grad <= 1.0:
            raise ParameterError(f"trunk_grad: expected a number in [0, 1], got {trunk_grad!r}", argument="trunk_grad")
        if temporal == "attention" and width % heads:
            raise ParameterError(f"heads: expected a divisor of width={width}, got {heads}", argument="heads")
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.routing_layers = num_layers if routing_layers is None else int(routing_layers)
        self.taps = normalize_taps(taps, num_layers)
        self.width = width
        self.temporal = temporal
        self.trunk_grad = float(trunk_grad)
        self.routing = bool(routing)
        self.tap_norms = nn.ModuleList(_RMSNorm(hidden_size, eps) for _ in self.taps)
        self.tap_proj = nn.ModuleList(nn.Linear(hidden_size, width) for _ in self.taps)
        self.tap_logits = nn.Parameter(torch.zeros(len(self.taps)))
        self.route: nn.Sequential | None = None
        if self.routing:
            self.route = nn.Sequential(
                nn.Linear(self.routing_layers + 3, route_hidden), nn.SiLU(), nn.Linear(route_hidden, width)
            )
        self.block_norm = _RMSNorm(width, 1e-6)
        self.block = nn.Sequential(nn.Linear(width, 2 * width), nn.SiLU(), nn.Linear(2 * width, width))
        self.gru: nn.GRU | None = nn.GRU(width, width, batch_first=True) if temporal == "gru" else None
        self.attention: _CausalAttention | None = _CausalAttention(width, heads) if temporal == "attention" else None
        self.head = nn.Linear(width, 1, dtype=torch.float32)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.zero_()

    @classmethod
    def for_model(
        cls,
        model: Any,
        taps: Iterable[int] | None = None,
        width: int = 256,
        temporal: str = "none",
        **kwargs: Any,
    ) -> TransportAlignedCritic:
        """A TAC sized for a Hugging Face model (reads ``model.config``), on the model's
        device; works on the ``meta`` device, so a large config can be counted without
        allocating. Routing reads all of the actor's layers unless ``routing_layers``."""
        cfg = model.config
        get_text = getattr(cfg, "get_text_config", None)
        text = get_text() if callable(get_text) else cfg
        d = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None)
        n = getattr(text, "num_hidden_layers", None)
        if not isinstance(d, int) or not isinstance(n, int):
            raise ParameterError(
                f"model: expected a config with hidden_size and num_hidden_layers, got {type(cfg).__name__}",
                argument="model",
            )
        eps = getattr(text, "rms_norm_eps", None) or getattr(text, "layer_norm_epsilon", None) or 1e-6
        try:
            device = next(model.parameters()).device
        except StopIteration:
            device = torch.device("cpu")
        with torch.device(device):
            return cls(d, n, taps=taps, width=width, temporal=temporal, eps=float(eps), **kwargs)

    # ---- the forward ----------------------------------------------------------

    def _trunk(self, h: torch.Tensor) -> torch.Tensor:
        if self.trunk_grad == 0.0:
            return h.detach()
        if self.trunk_grad == 1.0:
            return h
        base = h.detach()
        return base + self.trunk_grad * (h - base)  # exactly h (h − base = 0), gradient trunk_grad

    def routing_features(self, inputs: CriticInputs) -> torch.Tensor:
        """``[B, T−1, L + 3]``: per-layer concentration, gate, running log-gate, in-response flag."""
        if inputs.per_layer is None:
            raise ParameterError(
                "per_layer: TAC reads per-layer concentration; run rl.forward with this critic", argument="per_layer"
            )
        per = inputs.per_layer.detach().float()
        if per.shape[-1] != self.routing_layers:
            raise ShapeError(
                f"per_layer: expected {self.routing_layers} per-layer features (the critic's routing_layers), "
                f"got {per.shape[-1]}; probe the same layers the critic was built for",
                argument="per_layer",
            )
        resp = inputs.response_mask.to(torch.bool)
        g = torch.where(resp, inputs.gates.detach().float(), torch.ones_like(per[..., 0]))
        log_g = torch.log(g.clamp(min=1e-12)).cumsum(-1)
        return torch.cat([per, g.unsqueeze(-1), log_g.unsqueeze(-1), resp.float().unsqueeze(-1)], dim=-1)

    def forward(self, inputs: CriticInputs) -> torch.Tensor:
        """Values ``[B, T−1]`` float32; 0 outside ``inputs.columns``."""
        weights = torch.softmax(self.tap_logits, dim=0)
        u: torch.Tensor | None = None
        for i, layer in enumerate(self.taps):
            if layer not in inputs.taps:
                raise ParameterError(
                    f"taps: the critic reads decoder layer {layer}, which rl.forward did not record", argument="taps"
                )
            h = self._trunk(inputs.taps[layer][:, :-1])
            x = weights[i] * self.tap_proj[i](self.tap_norms[i](h))
            u = x if u is None else u + x
        assert u is not None
        if self.route is not None:
            u = u + self.route(self.routing_features(inputs))
        u = u + self.block(self.block_norm(u))
        u = self._mix(u, inputs.attention_mask[:, :-1].to(torch.bool))
        v = self.head(u.float()).squeeze(-1)
        return torch.where(inputs.columns, v, torch.zeros_like(v))

    def _mix(self, u: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        if self.temporal == "none":
            return u
        order, lengths = _left_align(valid)
        idx = order.unsqueeze(-1).expand_as(u)
        aligned = u.gather(1, idx)
        if self.gru is not None:
            packed = nn.utils.rnn.pack_padded_sequence(
                aligned, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False
            )
            out, _ = self.gru(packed)
            mixed, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=u.shape[1])
            mixed = aligned + mixed
        else:
            assert self.attention is not None
            mixed = self.attention(aligned)
        return torch.zeros_like(u).scatter(1, idx, mixed)

    def extra_repr(self) -> str:
        return (
            f"taps={self.taps}, width={self.width}, temporal={self.temporal!r}, routing={self.routing}, "
            f"routing_layers={self.routing_layers}, trunk_grad={self.trunk_grad}"
        )


def parameter_count(module: nn.Module) -> int:
    """Number of parameters (works on the meta device)."""
    return sum(math.prod(p.shape) for p in module.parameters())
