"""What a critic reads: one calling convention for every critic in :mod:`comppo_core.rl`.

:func:`comppo_core.rl.forward` runs the actor once and hands each critic a
:class:`CriticInputs`; a critic maps it to ``values`` ``[B, T−1]`` float32, where
``values[:, j]`` is the value of the prefix ``input_ids[:, :j+1]`` (docs/design.md §10).
:class:`~comppo_core.rl.TransportAlignedCritic` reads the actor's taps and routing
features (its gate features are always the causal gates of the forward's own
concentration, whatever gates the caller gave Comp-GAE);
:class:`~comppo_core.rl.StandardCritic` runs its own transformer on the ids. Swapping one
for the other is one argument.

**Gate features.** :func:`causal_gates` (the gate mapping on the row's running z-score,
:func:`running_zscore`) is what a critic reads as ``CriticInputs.gates``; it is defined
here, beside the inputs it fills, so that :func:`packed_critic_inputs` and the TAC
(:mod:`comppo_core.rl.critics.tac`, which re-exports both) import it from one place below
them.

**Packed rows.** A critic reads one row per sequence: its causal features (the running
z-score of :func:`causal_gates`, the running log-gate, the
temporal mixer) run along the row, so a packed row (several sequences end to end, verl's
``NO_PADDING`` layout) would carry one sequence's statistics into the next.
:func:`packed_critic_inputs` turns the actor's packed forward (its taps ``[1, N, d]``, its
packed :func:`comppo_core.hf.score` outputs ``[1, N−1]``) into the :class:`CriticInputs` of
the separate sequences, one right-padded row each, with the gate features computed per
sequence, exactly as :func:`comppo_core.rl.forward` computes them for those sequences;
:func:`~comppo_core.hf.lm.pack_columns` puts the critic's ``[S, T'−1]`` values back into
the packed row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ... import gating
from ...errors import ShapeError
from ...gate_params import GateParams, as_gate_params
from ...hf.lm import check_cu_seqlens, default_position_ids, scored_columns, unpack_columns, unpack_tokens

__all__ = ["CriticInputs", "causal_gates", "packed_critic_inputs", "running_zscore"]


#: ε added to the running σ, as the gate mapping's z-score does.
_STD_EPS = 1e-8


def running_zscore(x: torch.Tensor, mask: torch.Tensor, min_spread: float = 0.0) -> torch.Tensor:
    """Causal z-score of each row: ``z_t = (x_t − μ_t)/(S(σ_t) + 1e-8)`` over the valid s ≤ t,
    ``S(σ) = max(σ, min_spread)`` (``σ`` itself for ``min_spread = 0``:
    :attr:`comppo_core.GateParams.min_spread`).

    ``μ_t`` and ``σ_t`` (population, ddof 0) are the mean and spread of the row's valid
    entries up to and including t, so ``z_t`` depends on nothing after t. A row's first
    valid entry, and any entry whose running spread is zero, gets 0 (as the gate
    mapping's z-score does for a single token or a constant row). Masked entries are 0.
    Computed in float64 on differences to the row's first valid entry, so a constant row
    is exactly 0. Shapes ``[B, T]``; returns float64."""
    m = mask.to(torch.bool)
    xd = x.detach().to(torch.float64)
    first_idx = torch.argmax(m.to(torch.int8), dim=-1, keepdim=True)
    d = torch.where(m, xd - xd.gather(-1, first_idx), torch.zeros_like(xd))
    n = m.to(torch.float64).cumsum(-1)
    s1 = d.cumsum(-1)
    s2 = (d * d).cumsum(-1)
    safe_n = n.clamp(min=1.0)
    mean = s1 / safe_n
    var = (s2 / safe_n - mean * mean).clamp(min=0.0)
    std = var.sqrt()
    spread = std.clamp(min=min_spread) if min_spread > 0.0 else std
    z = (d - mean) / (spread + _STD_EPS)
    return torch.where(m & (n > 1) & (std > 0), z, torch.zeros_like(z))


def causal_gates(concentration: torch.Tensor, mask: torch.Tensor, params: GateParams) -> torch.Tensor:
    """The gate mapping with causal normalisation: ``[B, T]`` float32, 1 outside ``mask``.

    ``normalize="sequence"`` or ``"batch"`` use the row's running z-score
    (:func:`running_zscore`) instead of a statistic over the whole row or batch;
    ``"none"`` is already pointwise, so it equals :func:`comppo_core.gates_from_concentration`.
    The sigmoid and bounds are the package's kernel's (``normalize="none"`` on z)."""
    m = mask.to(torch.bool)
    if params.normalize == "none":
        z = concentration.detach().to(torch.float64)
        pointwise = params
    else:
        z = running_zscore(concentration, m, params.min_spread)
        pointwise = dataclasses.replace(params, normalize="none", center=0.0, scale=1.0)
    # a tensor in gives a tensor out (on its own device)
    return torch.as_tensor(gating.gates_from_concentration(z, mask=m, params=pointwise), dtype=torch.float32)


@dataclasses.dataclass
class CriticInputs:
    """The actor's forward pass, as a critic sees it.

    Attributes:
      input_ids: ``[B, T]`` token ids.
      attention_mask: ``[B, T]`` bool (True = real token).
      position_ids: ``[B, T]`` the positions the actor ran with.
      columns: ``[B, T−1]`` bool, columns whose query and target tokens are both real;
        values outside them are 0.
      response_mask: ``[B, T−1]`` bool, the response columns (a subset of ``columns``).
      taps: decoder layer → its output ``[B, T, d]`` as recorded during the actor's
        forward (not detached: the critic decides how much gradient reaches the trunk).
      per_layer: ``[B, T−1, L]`` float32 per-layer concentration, detached, or None.
      gates: ``[B, T−1]`` float32 gate features the critic reads (1 outside the
        response), detached and causal: :func:`comppo_core.rl.forward` fills them with
        :func:`causal_gates` of its own concentration (gates of
        1 when no probe ran), never with its ``gates=`` override, which changes Comp-GAE's
        gates only.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    columns: torch.Tensor
    response_mask: torch.Tensor
    taps: dict[int, torch.Tensor]
    per_layer: torch.Tensor | None
    gates: torch.Tensor


def packed_critic_inputs(
    input_ids: torch.Tensor,
    cu_seqlens: Any,
    *,
    taps: dict[int, torch.Tensor],
    per_layer: torch.Tensor | None,
    concentration: torch.Tensor | None,
    response_mask: torch.Tensor | None = None,
    gate_params: GateParams | None = None,
) -> CriticInputs:
    """The :class:`CriticInputs` of a packed row's sequences, one right-padded row each.

    ::

        row i            = tokens cu_seqlens[i] .. cu_seqlens[i+1]−1 of the packed row, then padding
        taps[k][i]       = taps[k][0, cu[i] : cu[i+1]]                          [S, T', d]
        per_layer[i]     = per_layer[0, cu[i] : cu[i+1]−1]                      [S, T'−1, L]
        gates[i]         = causal_gates(concentration[i], response_mask[i])     per sequence

    ``T' = max(2, max L_i)``. With the actor run once on the packed row (attention kept
    per sequence: :func:`comppo_core.hf.score` with ``cu_seqlens``, a
    :class:`~comppo_core.rl.critics.taps.TapRecorder` around it), every field equals the
    one :func:`comppo_core.rl.forward` builds for the separate sequences, padded on the
    right, up to the attention kernels' rounding; a critic's values ``[S, T'−1]`` go back
    to the packed row with :func:`comppo_core.hf.lm.pack_columns`. The taps are gathered
    with their autograd graph (the critic decides what reaches the trunk).

    Args:
      input_ids: ``[1, N]`` the packed row.
      cu_seqlens: ``[S+1]`` offsets (checked: :func:`~comppo_core.hf.lm.check_cu_seqlens`).
      taps: decoder layer → its output ``[1, N, d]`` recorded during the packed forward.
      per_layer: ``[1, N−1, L]`` the packed forward's per-layer concentration, or None
        (no probe ran).
      concentration: ``[1, N−1]`` its concentration, or None (gate features of 1, as
        :func:`comppo_core.rl.forward` without a probe).
      response_mask: ``[1, N−1]`` response columns of the packed row (None: every scored
        column); columns that score no token of their sequence are ignored.
      gate_params: the concentration → gate mapping (default :class:`GateParams`).
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ShapeError(f"input_ids: expected one packed row [1, N], got {got}", argument="input_ids")
    cu = check_cu_seqlens(cu_seqlens, input_ids.shape[1], input_ids.device)
    params = as_gate_params(gate_params, "gate_params")
    ids = unpack_tokens(input_ids, cu, "input_ids")
    lengths = cu[1:] - cu[:-1]
    mask = torch.arange(ids.shape[1], device=ids.device)[None, :] < lengths[:, None]
    columns = scored_columns(mask)
    resp = columns
    if response_mask is not None:
        resp = unpack_columns(response_mask.to(device=ids.device) != 0, cu, "response_mask") & columns
    unpacked_taps = {layer: unpack_tokens(h, cu, f"taps[{layer}]") for layer, h in taps.items()}
    per = None if per_layer is None else unpack_columns(per_layer.detach(), cu, "per_layer")
    if concentration is None:
        gates = torch.ones(columns.shape, dtype=torch.float32, device=ids.device)
    else:
        conc = unpack_columns(concentration.detach().float(), cu, "concentration")
        gates = causal_gates(conc, resp, params)
    return CriticInputs(
        input_ids=ids,
        attention_mask=mask,
        position_ids=default_position_ids(mask),
        columns=columns,
        response_mask=resp,
        taps=unpacked_taps,
        per_layer=per,
        gates=gates,
    )
