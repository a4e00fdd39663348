"""verl's published GAE and whitening, written once for the benchmarks to time.

``compute_gae_advantage_return`` is ``verl.trainer.ppo.core_algos.compute_gae_advantage_return``
(the loop over tokens with the multi-turn skip of masked tokens, then ``masked_whiten`` of
the advantages, returns left unwhitened); ``masked_whiten`` is
``verl.utils.torch_functional.masked_whiten`` (unbiased variance, shift_mean=True). The
one addition is ``gates`` (not in verl): γ becomes γ·g_t at step t, which makes the loop
Comp-GAE. The test suite keeps its own copy (tests/integrations/test_integrations.py), so that what
the drop-in is checked against does not depend on the benchmarks.
"""

from __future__ import annotations

from typing import Any

import torch


def masked_mean(values: Any, mask: Any) -> Any:
    return (values * mask).sum() / mask.sum()


def masked_whiten(values: Any, mask: Any, eps: float = 1e-8) -> Any:
    """``(x − mean)·rsqrt(var + eps)``, mean and unbiased variance over the mask."""
    mean = masked_mean(values, mask)
    mask_sum = mask.sum()
    var = masked_mean((values - mean) ** 2, mask) * (mask_sum / (mask_sum - 1))
    return (values - mean) * torch.rsqrt(var + eps)


def gae_loop(
    token_level_rewards: Any, values: Any, response_mask: Any, gamma: float, lam: float, gates: Any = None
) -> tuple[Any, Any]:
    """verl's loop: *unwhitened* advantages and ``returns = advantages + values``."""
    with torch.no_grad():
        nextvalues = 0
        lastgaelam = 0
        advantages_reversed = []
        gen_len = token_level_rewards.shape[-1]
        for t in reversed(range(gen_len)):
            g = gamma if gates is None else gamma * gates[:, t]
            delta = token_level_rewards[:, t] + g * nextvalues - values[:, t]
            lastgaelam_ = delta + g * lam * lastgaelam
            nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
            lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
    return advantages, returns


def compute_gae_advantage_return(
    token_level_rewards: Any, values: Any, response_mask: Any, gamma: float, lam: float, gates: Any = None
) -> tuple[Any, Any]:
    """verl's estimator: the loop, then ``masked_whiten`` of the advantages."""
    advantages, returns = gae_loop(token_level_rewards, values, response_mask, gamma, lam, gates)
    with torch.no_grad():
        return masked_whiten(advantages, response_mask), returns
