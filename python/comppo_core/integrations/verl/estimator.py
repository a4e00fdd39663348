"""Comp-GAE on the gates and values that travel in verl's batch (what the CompPO trainer calls).

verl 0.9.1 calls a registered advantage estimator with rewards, masks and its config only
(no values, no extra batch keys), so the recipe's trainer computes the advantages itself,
from the fields the CompPO engine's old-log-prob pass put in the batch (``comp_gates`` and
``values``, per token, nested; :func:`~comppo_core.integrations.verl.layout.response_layout`
turns them into the ``[B, R]`` layout of ``token_level_rewards``)::

    (A, R) = cc.gae(token_level_rewards, values, mask=response_mask, gates=gates,
                    gamma=γ, lam=λ, masked_rewards="drop")
    A      = masked_whiten(A, response_mask)          (whiten=True: what verl's GAE branch returns)

``gates=None`` is plain GAE (the ``tac_fixed`` arm: the TAC's values, gates of 1). Masked
positions are 0 in both outputs; ``R`` is never whitened.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._torch import tensor_io
from ...advantages import gae
from ...whitening import masked_whiten

__all__ = ["compute_comp_gae_advantage_return"]


@tensor_io("token_level_rewards", "values", "response_mask", "gates")
def compute_comp_gae_advantage_return(
    token_level_rewards: Any,
    values: Any,
    response_mask: Any,
    gates: Any,
    gamma: float,
    lam: float,
    *,
    whiten: bool = True,
) -> tuple[Any, Any]:
    """``(advantages, returns)``, each ``[B, R]`` like ``token_level_rewards`` (module docstring).

    Args:
      token_level_rewards: ``[B, R]`` per-token rewards (verl's ``token_level_rewards``).
      values: ``[B, R]`` the critic's value of the state before each response token (the
        engine's ``values``, :func:`~comppo_core.integrations.verl.layout.response_layout`).
      response_mask: ``[B, R]`` nonzero on the tokens that count.
      gates: ``[B, R]`` in ``[0, 1]`` (the engine's ``comp_gates``), or None (GAE).
      gamma, lam: γ and λ (``algorithm.gamma``, ``algorithm.lam``).
      whiten: whiten the advantages over the response tokens, as verl's GAE does.

    Torch tensors in, torch tensors out (same dtype and device); NumPy arrays in, NumPy out.
    Inputs are never modified; bad input raises the errors of :func:`comppo_core.gae`.
    """
    mask = np.asarray(response_mask)
    if mask.dtype != np.bool_:
        mask = mask != 0
    adv, ret = gae(
        token_level_rewards, values, mask=mask, gates=gates, gamma=float(gamma), lam=float(lam), masked_rewards="drop"
    )
    if whiten:
        adv = masked_whiten(adv, mask=mask, out=adv)
    return adv, ret
