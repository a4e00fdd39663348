# Transcribed from verl 0.9.1 (https://github.com/verl-project/verl, formerly volcengine/verl):
#   verl/trainer/ppo/core_algos.py   (agg_loss, compute_policy_loss_vanilla, compute_value_loss,
#                                     kl_penalty_forward)
#   verl/utils/torch_functional.py   (masked_sum, masked_mean, clip_by_value)
# as shipped in the PyPI wheel verl-0.9.1-py3-none-any.whl (sha256 db6e6f2a8d9d5808d9ec32d357a42319
# fdc6967df688ff9d9810050f49bfdd14, verl/version/version = "0.9.1"). The git repository has no v0.9.1
# tag; these functions are character for character those of tag v0.9.0 (commit 483b8a009ba3a97563edee
# 3a19887e4862b8094a) and of branch release/v0.9.0 (commit 88512193628b95f24916c0898d51a8a877d09203):
# the wheel's core_algos.py differs from v0.9.0's only in compute_policy_loss_gspo, its
# torch_functional.py not at all. agg_loss took this form in commit b8d91ef8d9f9ac09f6c885e380f656237a
# 1de698 (PR #5417, "seq mean and default scale factor loss_mask.shape[-1] as in
# seq-mean-token-sum-norm").
#
# Original copyright notices of those files:
#   Copyright 2024 Bytedance Ltd. and/or its affiliates
#   Copyright 2022 The HuggingFace Team. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Changes from the original: docstrings shortened; type annotations loosened to Any; verl's
# ``config`` (an ActorConfig) of compute_policy_loss_vanilla replaced by its fields as keyword
# arguments (clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c, global_batch_info); the
# rollout-correction weights and the metric dictionary's detach() calls kept as in verl. Statements,
# their order and their torch operations are unchanged.
"""verl 0.9.1's loss code, transcribed as a test reference for :mod:`comppo_core.rl.core.losses`.

verl is not a dependency; the tests compare the package against these functions bit for bit. The
single-process semantics are the default arguments (``dp_size=1``, no global counts); the
multi-process arguments are kept, as verl passes them (``**config.global_batch_info``).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

# --------------------------------------------------------------------------------------------------
# verl/utils/torch_functional.py


def masked_sum(values: Any, mask: Any, axis: Any = None) -> Any:
    # If NaNs exist out of mask, replace NaNs in values with a value that
    # won't affect the sum (e.g., 0 for masked regions)
    valid_values = torch.where(mask.bool(), values, 0.0)
    return (valid_values * mask).sum(axis=axis)


def masked_mean(values: Any, mask: Any, axis: Any = None) -> Any:
    s = masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) + 1e-8)


def clip_by_value(x: Any, tensor_min: Any, tensor_max: Any) -> Any:
    clipped = torch.max(torch.min(x, tensor_max), tensor_min)
    return clipped


# --------------------------------------------------------------------------------------------------
# verl/trainer/ppo/core_algos.py


def agg_loss(
    loss_mat: Any,
    loss_mask: Any,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: Optional[int] = None,  # noqa: UP045 (verl's spelling)
    global_batch_size: Optional[int] = None,  # noqa: UP045
    loss_scale_factor: Optional[int] = None,  # noqa: UP045
) -> Any:
    """verl's docstring: "Aggregate the loss across global batch to ensure the loss is invariant to
    fsdp/megatron parallelism." ``batch_num_tokens``: number of valid tokens in the global batch;
    ``global_batch_size``: global batch size; ``loss_scale_factor``: scale factor for
    "seq-mean-token-sum-norm" mode, ``loss_mask.shape[-1]`` if None."""
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
            batch_num_tokens = loss_mask.sum()
        loss = masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    elif loss_agg_mode == "token-sum":
        # DDP/FSDP average gradients across data-parallel ranks. Scaling each
        # rank's local token sum by dp_size makes the reduced gradient equal to
        # the sum over all valid tokens in the global batch.
        loss = masked_sum(loss_mat, loss_mask) * dp_size
    elif loss_agg_mode in ["seq-mean-token-sum", "seq-mean-token-sum-norm"]:
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)  # token-sum
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size  # seq-mean
        if loss_agg_mode == "seq-mean-token-sum-norm":
            if loss_scale_factor is None:
                horizon = loss_mask.shape[-1]
                loss_scale_factor = horizon
            loss /= loss_scale_factor
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)  # per-sequence token count
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)  # token-mean
        seq_mask = (seq_mask > 0).float()  # exclude fully masked sequences
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("global_batch_size is required when dp_size > 1")
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size * dp_size  # seq-mean
    else:
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")

    return loss


def compute_policy_loss_vanilla(
    old_log_prob: Any,
    log_prob: Any,
    advantages: Any,
    response_mask: Any,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: Any = None,
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    global_batch_info: dict[str, Any] | None = None,
) -> tuple[Any, dict[str, float]]:
    """``compute_policy_loss_vanilla`` with its ``config``'s fields as keyword arguments
    (``global_batch_info``: verl's ``config.global_batch_info``, ``{}`` by default)."""
    global_batch_info = {} if global_batch_info is None else global_batch_info
    clip_ratio_low = clip_ratio_low if clip_ratio_low is not None else clip_ratio
    clip_ratio_high = clip_ratio_high if clip_ratio_high is not None else clip_ratio

    cliprange = clip_ratio
    cliprange_low = clip_ratio_low
    cliprange_high = clip_ratio_high

    assert clip_ratio_c > 1.0, (
        "The lower bound of the clip_ratio_c for dual-clip PPO should be greater than 1.0,"
        + f" but get the value: {clip_ratio_c}."
    )

    negative_approx_kl = log_prob - old_log_prob
    # Clamp negative_approx_kl for stability
    negative_approx_kl = torch.clamp(negative_approx_kl, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    if cliprange_low is None:
        cliprange_low = cliprange
    if cliprange_high is None:
        cliprange_high = cliprange
    pg_losses2 = -advantages * torch.clamp(
        ratio, 1 - cliprange_low, 1 + cliprange_high
    )  # - clip(ratio, 1-cliprange, 1+cliprange) * A
    clip_pg_losses1 = torch.maximum(
        pg_losses1, pg_losses2
    )  # max(-ratio * A, -clip(ratio, 1-cliprange, 1+cliprange) * A)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).float(), response_mask)

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)

    # Apply rollout correction weights if provided
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **global_batch_info)

    pg_metrics = {
        "actor/pg_clipfrac": pg_clipfrac.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
        "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach().item(),
    }
    return pg_loss, pg_metrics


def compute_value_loss(
    vpreds: Any,
    returns: Any,
    values: Any,
    response_mask: Any,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: Optional[int] = None,  # noqa: UP045
    global_batch_size: Optional[int] = None,  # noqa: UP045
    loss_scale_factor: Optional[int] = None,  # noqa: UP045
) -> tuple[Any, Any]:
    vpredclipped = clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    clipped_vf_losses = torch.max(vf_losses1, vf_losses2)
    vf_loss = 0.5 * agg_loss(
        loss_mat=clipped_vf_losses,
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac


def kl_penalty_forward(logprob: Any, ref_logprob: Any, kl_penalty: str) -> Any:
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob

    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()

    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()

    # J. Schulman. Approximating kl divergence, 2020.
    # # URL http://joschu.net/blog/kl-approx.html.
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        # For numerical stability
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)

    if kl_penalty == "full":
        # so, here logprob and ref_logprob should contain the logits for every token in vocabulary
        raise NotImplementedError

    raise NotImplementedError
