"""What a critic reads: one calling convention for every critic in :mod:`comppo_core.rl`.

:func:`comppo_core.rl.forward` runs the actor once and hands each critic a
:class:`CriticInputs`; a critic maps it to ``values`` ``[B, T−1]`` float32, where
``values[:, j]`` is the value of the prefix ``input_ids[:, :j+1]`` (docs/design.md §10).
:class:`~comppo_core.rl.TransportAlignedCritic` reads the actor's taps and routing
features (its gate features are always the causal gates of the forward's own
concentration, whatever gates the caller gave Comp-GAE);
:class:`~comppo_core.rl.StandardCritic` runs its own transformer on the ids. Swapping one
for the other is one argument.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["CriticInputs"]


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
        :func:`~comppo_core.rl.critics.tac.causal_gates` of its own concentration (gates of
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
