"""The CompPO actor's loss in verl 0.9.1: verl's PPO loss plus the TAC's value loss.

The TAC lives in the actor's engine (:mod:`comppo_core.integrations.verl.engine`), so the
actor's update trains it: the actor's ``loss_fn`` is::

    loss = ppo_loss(config, model_output, data, dp_group)          verl's, unchanged
           + vf_coef · ½ · agg(ℓ_V, response_mask)                  the TAC's value loss

    ℓ_V = (V − R)²                                                  cliprange_value None
    ℓ_V = max((V − R)², (clip(V, V_old − ε, V_old + ε) − R)²)       cliprange_value ε (verl's critic)

with ``V`` the engine's ``model_output["values"]`` (the update's forward, with gradients
into the TAC), ``R = data["returns"]`` and ``V_old = data["values"]`` (the old-log-prob
pass's values) on the response tokens, and ``agg`` verl's ``agg_loss`` with the actor's
``loss_agg_mode`` and the same global denominators ``ppo_loss`` uses (``dp_size``,
``batch_num_tokens``, ``global_batch_size``, ``config.loss_scale_factor``): the value
loss of verl's own critic (``verl.workers.utils.losses.value_loss``,
``core_algos.compute_value_loss``) on the actor's micro-batch. ``ppo_loss`` is verl's
policy loss with its entropy and KL terms exactly as verl computes them
(``actor_rollout_ref.actor.*``: ``policy_loss.loss_mode``, ``clip_ratio_*``,
``loss_agg_mode``, ``entropy_coeff``, ``use_kl_loss``, ...).

The same definitions as :func:`comppo_core.rl.step.minibatch_loss` (which transcribes
verl's): verl's ``clip_ratio_low/high/c`` are the package's ``clip_low/clip_high/dual_clip``,
``cliprange_value`` its ``value_clip``, ``loss_agg_mode`` and ``loss_scale_factor`` its
``agg`` and ``loss_scale_factor``, ``use_kl_loss`` with ``kl_loss_coef`` / ``kl_loss_type``
its ``kl_mode="loss"`` with ``kl_coef`` / ``kl_kind``; tests/integrations/verl_recipe pins
one update equal within 1e-5.

verl's per-token layouts are handled as ``ppo_loss`` handles them: the model output is
verl's packed per-token nested tensor (:func:`verl.workers.utils.padding.no_padding_2_padding`
takes its response entries), the batch's ``returns`` and ``values`` are response-length
tensors, padded ``[B, R]`` or nested (the v1 trainer's TransferQueue layout).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

from ...errors import ParameterError

__all__ = ["comppo_actor_loss", "tac_value_loss"]


def _coefficient(name: str, value: Any, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    x = float(value) if isinstance(value, Real) and not isinstance(value, bool) else math.nan
    if not (math.isfinite(x) and x >= 0):
        expected = "a finite number ≥ 0" + (" or None" if optional else "")
        raise ParameterError(f"{name}: expected {expected}, got {value!r}", argument=name)
    return x


def tac_value_loss(
    config: Any, model_output: Any, data: Any, *, cliprange_value: float | None = None
) -> tuple[Any, dict[str, Any]]:
    """The TAC's value loss on one micro-batch, as verl's critic computes it (module docstring).

    Args:
      config: the actor's config (``loss_agg_mode``, ``loss_scale_factor``: verl's ``ActorConfig``).
      model_output: the CompPO engine's outputs; ``values`` is verl's packed per-token nested tensor.
      data: the micro-batch (a TensorDict): ``returns`` (and ``values``, the old values, when
        ``cliprange_value`` is given), ``response_mask``, ``prompts``/``responses`` (or
        ``attention_mask``) as ``ppo_loss`` reads them, and the engine's ``dp_size``,
        ``batch_num_tokens`` and the trainer's ``global_batch_size``.
      cliprange_value: ε of verl's clipped value loss, or None (unclipped, ``(V − R)²``).

    Returns:
      ``(loss, metrics)``: the 0-dim loss (½ included, ``vf_coef`` not) and verl's critic
      metrics ``critic/vf_loss``, ``critic/vf_clipfrac``, ``critic/vpred_mean``.

    Raises:
      ParameterError: no ``values`` in ``model_output`` (the update ran without
        ``comppo_probe=True`` or the engine has no TAC), no ``returns`` (or no old ``values``
        with ``cliprange_value``) in ``data``, a bad ``cliprange_value``.
    """
    import torch
    from verl.trainer.ppo.core_algos import agg_loss, compute_value_loss  # type: ignore[import-not-found]
    from verl.utils.metric import AggregationType, Metric  # type: ignore[import-not-found]
    from verl.utils.torch_functional import masked_mean  # type: ignore[import-not-found]
    from verl.workers.utils.padding import no_padding_2_padding  # type: ignore[import-not-found]

    clip = _coefficient("cliprange_value", cliprange_value, optional=True)
    if "values" not in model_output:
        raise ParameterError(
            "model_output: expected the TAC's per-token 'values' (the CompPO engine with EngineSettings.tac, and "
            "comppo_probe=True in the update's TensorDict), got the keys " + str(sorted(model_output.keys())),
            argument="model_output",
        )
    needed = ["returns", "response_mask"] + (["values"] if clip is not None else [])
    missing = [k for k in needed if k not in data.keys()]
    if missing:
        raise ParameterError(
            f"data: expected {needed} in the micro-batch (the advantage step's returns; the old-log-prob pass's "
            f"values for a clipped value loss), missing {missing}",
            argument="data",
        )
    vpreds = no_padding_2_padding(model_output["values"], data)  # [B, R], response entries

    dp_size = data["dp_size"]
    batch_num_tokens = data["batch_num_tokens"]
    global_batch_size = data["global_batch_size"]
    loss_scale_factor = config.loss_scale_factor
    # as verl's critic: global denominators make each micro-batch a partial sum (metrics summed)
    if dp_size > 1 or batch_num_tokens is not None or global_batch_size is not None or loss_scale_factor is not None:
        metric_aggregation = AggregationType.SUM
    else:
        metric_aggregation = AggregationType.MEAN

    padded = data.select(*needed).to_padded_tensor()
    returns = padded["returns"]
    response_mask = padded["response_mask"].to(bool)
    totals = {
        "dp_size": dp_size,
        "batch_num_tokens": batch_num_tokens,
        "global_batch_size": global_batch_size,
        "loss_scale_factor": loss_scale_factor,
    }
    if clip is None:
        vf_loss = 0.5 * agg_loss(
            loss_mat=(vpreds - returns) ** 2, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode, **totals
        )
        vf_clipfrac = 0.0
    else:
        vf_loss, clipfrac = compute_value_loss(
            vpreds=vpreds,
            values=padded["values"],
            returns=returns,
            response_mask=response_mask,
            cliprange_value=clip,
            loss_agg_mode=config.loss_agg_mode,
            **totals,
        )
        vf_clipfrac = float(clipfrac.detach().item())
    with torch.no_grad():
        vpred_mean = float(masked_mean(vpreds, response_mask).item())
    metrics = {
        "critic/vf_loss": Metric(value=vf_loss, aggregation=metric_aggregation),
        "critic/vf_clipfrac": vf_clipfrac,
        "critic/vpred_mean": vpred_mean,
    }
    return vf_loss, metrics


def comppo_actor_loss(
    config: Any,
    model_output: Any,
    data: Any,
    dp_group: Any = None,
    *,
    vf_coef: float = 1.0,
    cliprange_value: float | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The CompPO actor's loss: verl's ``ppo_loss`` + ``vf_coef`` × :func:`tac_value_loss` (module docstring).

    The signature of verl's ``loss_fn`` (``functools.partial(comppo_actor_loss, config=actor_config,
    vf_coef=..., cliprange_value=...)`` is the actor worker's ``loss_fn``).

    Returns:
      ``(loss, metrics)``: ``ppo_loss``'s, the value loss added to both (``critic/vf_loss``,
      ``critic/vf_clipfrac``, ``critic/vpred_mean``).

    Raises:
      ParameterError: a bad ``vf_coef`` or ``cliprange_value``; see :func:`tac_value_loss`.
    """
    from verl.workers.utils.losses import ppo_loss  # type: ignore[import-not-found]

    coef = _coefficient("vf_coef", vf_coef, optional=False)
    vf_loss, vf_metrics = tac_value_loss(config, model_output, data, cliprange_value=cliprange_value)
    policy_loss, metrics = ppo_loss(config, model_output, data, dp_group)
    metrics.update(vf_metrics)
    return policy_loss + coef * vf_loss, metrics
