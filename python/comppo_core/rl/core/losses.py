"""PPO losses with verl's definitions: the clipped policy loss, the clipped value loss, the KL estimators
and the four ways of aggregating a per-token loss into a scalar.

Everything per token is ``[B, T]`` (in ``comppo_core.rl`` that is the ``[B, T−1]`` column convention of
:func:`comppo_core.hf.logprobs_and_concentration`); ``mask`` marks the tokens that count (response
tokens) and may be bool, integer or float, read as ``mask != 0``. With ``r = exp(clamp(lp − lp_old, −20, 20))``::

    policy   ℓ_t = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))     then min(ℓ_t, −A·c) where A < 0 (dual clip)
    value    ℓ_t = ½·max((V − R)², (clip(V, V_old − ε_v, V_old + ε_v) − R)²)
    KL       k1 = lp − ref,  abs = |lp − ref|,  k2 = ½(lp − ref)²,  k3 = e^{ref−lp} − (ref − lp) − 1 (clamped)
    scalar   agg(ℓ, mask) in one of "token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
             "seq-mean-token-sum-norm"

Each function transcribes its verl counterpart in ``verl/trainer/ppo/core_algos.py`` (``agg_loss``,
``compute_policy_loss_vanilla``, ``compute_value_loss``, ``kl_penalty_forward``) and the ``masked_sum`` /
``masked_mean`` / ``clip_by_value`` helpers of ``verl/utils/torch_functional.py``, as of verl 0.9.1 (the
PyPI release; in verl-project/verl these functions are those of tag v0.9.0, commit 483b8a0), with the same
torch operations in the same order, so values and gradients agree with verl's bit for bit on finite inputs
with a bool or integer mask (and a 0/1 float32 mask). The test reference is ``tests/verl_agg_loss.py``.
The computation stays in the inputs' dtype except where verl's promotes it (the three seq-mean modes
multiply by a float32 row mask, so bfloat16/float16 losses come out float32). verl 0.9.1's fifth
aggregation mode, "token-sum" (``Σ m·ℓ``), is not offered.

Since verl PR #5417 (February 2026, in every release from v0.7.1 on), "seq-mean-token-sum-norm" is the
row mean of the token sums divided by ``loss_scale_factor``, ``Σ_{b∈S} Σ_t m·ℓ / |S| / L``; v0.7.0 and
earlier computed ``Σ_bt m·ℓ / L``, without the row mean that Dr. GRPO's 1/G asks for.

Where this module departs from verl, always at positions or batches where verl's answer is NaN or depends
on the mask's dtype:

* **Masked positions never reach the result**, whatever they hold: inputs are replaced by 0 there before
  anything is computed, so a NaN or ±inf at a masked position (a −inf log-probability on padding) gives
  neither a NaN loss nor a NaN gradient (verl's seq-mean modes compute ``sum(loss · mask)``, which is NaN
  there, and every mode back-propagates NaN into the inputs). Masked positions get zero gradient, as in verl.
* **A batch without a valid token gives a zero loss** (connected to the graph, so ``backward()`` gives zero
  gradients) and zero statistics; verl divides 0 by its count 0 there and returns NaN in every mode (unless
  a global count is passed).
* **A float mask is a mask, not a weight**: 0.5 counts as 1 (verl multiplies by the mask's value, which is
  the same thing for 0/1 masks). verl's ``masked_mean`` adds 1e-8 to the mask's sum, which vanishes in
  float32 but not in a float64 mask's sum; here the count is always that of the bool mask ``mask != 0``
  (an int64 count, plus 1e-8 in torch's default dtype, exactly as verl computes it for a bool/integer mask).

The NaN-free forms need no host synchronisation; :func:`policy_loss` and :func:`value_loss` synchronise once
to turn their statistics into Python floats, as verl's metrics do. A NaN or ±inf at a *valid* position is
not checked for (that would synchronise every call): it gives a NaN loss, as in verl.
"""

from __future__ import annotations

import dataclasses
import math
from numbers import Real
from typing import Any

import torch

from ...errors import DTypeError, ParameterError, ShapeError
from ...options import AGG_MODES, KL_KINDS, check_choice

__all__ = ["AGG_MODES", "KL_KINDS", "aggregate", "kl_penalty", "policy_loss", "value_loss"]

# AGG_MODES (the aggregation modes of verl's ``agg_loss``) and KL_KINDS (the KL estimator
# names :func:`kl_penalty` accepts, verl's aliases included, and the estimator each one is)
# are defined in comppo_core.options and re-exported here.


# ---------------------------------------------------------------------------------------------------------
# argument checking


def _tensor(x: Any, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise DTypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}", argument=name)
    if not x.is_floating_point():
        raise DTypeError(f"{name}: expected a floating-point tensor, got dtype {x.dtype}", argument=name)
    return x


def _check_like(x: torch.Tensor, name: str, first: torch.Tensor, first_name: str) -> None:
    if x.shape != first.shape:
        raise ShapeError(
            f"{name}: expected shape {tuple(first.shape)} like {first_name}, got {tuple(x.shape)}", argument=name
        )
    if x.device != first.device:
        raise DTypeError(
            f"{name}: expected a tensor on {first.device} like {first_name}, got one on {x.device}", argument=name
        )


def _grid(tensors: dict[str, Any]) -> list[torch.Tensor]:
    """The per-token float inputs, checked: tensors, floating point, 2-D ``[B, T]``, one shape, one device."""
    checked = [_tensor(x, name) for name, x in tensors.items()]
    names = list(tensors)
    first, first_name = checked[0], names[0]
    if first.dim() != 2:
        raise ShapeError(
            f"{first_name}: expected a 2-D [B, T] tensor, got shape {tuple(first.shape)}", argument=first_name
        )
    for x, name in zip(checked[1:], names[1:]):
        _check_like(x, name, first, first_name)
    return checked


def _mask(mask: Any, like: torch.Tensor, like_name: str) -> torch.Tensor:
    """``mask != 0`` as a bool tensor shaped like ``like``."""
    if not isinstance(mask, torch.Tensor):
        raise DTypeError(f"mask: expected a torch.Tensor, got {type(mask).__name__}", argument="mask")
    if mask.is_complex() or not (mask.dtype == torch.bool or mask.is_floating_point() or _is_integer(mask)):
        raise DTypeError(f"mask: expected a bool, integer or float tensor, got dtype {mask.dtype}", argument="mask")
    _check_like(mask, "mask", like, like_name)
    return mask if mask.dtype == torch.bool else mask != 0


def _is_integer(x: torch.Tensor) -> bool:
    return not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool


def _number(name: str, value: Any, expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ParameterError(f"{name}: expected {expected}, got {value!r}", argument=name)
    return float(value)


def _nonnegative(name: str, value: Any) -> float:
    x = _number(name, value, "a number ≥ 0")
    if not x >= 0.0:  # also rejects NaN
        raise ParameterError(f"{name}: expected a number ≥ 0, got {x}", argument=name)
    return x


# ---------------------------------------------------------------------------------------------------------
# verl_F.masked_mean and agg_loss


def _masked_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """verl's ``masked_mean`` (no axis) for a bool mask: ``Σ_valid v / (n + 1e-8)``, 0 when ``n = 0``."""
    return torch.where(valid, values, 0.0).sum() / (valid.sum() + 1e-8)


@dataclasses.dataclass(frozen=True)
class _Denominators:
    """verl's ``agg_loss`` global arguments, checked (None: the micro-batch's own count)."""

    batch_num_tokens: float | None = None
    global_batch_size: float | None = None
    loss_scale_factor: float | None = None


# the argument each mode's old ``normalizer`` stood for
_NORMALIZER_MEANS = {
    "token-mean": "batch_num_tokens",
    "seq-mean-token-mean": "global_batch_size",
    "seq-mean-token-sum": "global_batch_size",
    "seq-mean-token-sum-norm": "loss_scale_factor",
}


def _denominators(
    mode: str,
    batch_num_tokens: Any,
    global_batch_size: Any,
    loss_scale_factor: Any,
    normalizer: Any,
) -> _Denominators:
    """The checked denominators; ``normalizer`` (the old keyword) fills the argument its mode read."""
    given = {
        "batch_num_tokens": _positive("batch_num_tokens", batch_num_tokens),
        "global_batch_size": _positive("global_batch_size", global_batch_size),
        "loss_scale_factor": _positive("loss_scale_factor", loss_scale_factor),
    }
    norm = _positive("normalizer", normalizer)
    if norm is not None:
        target = _NORMALIZER_MEANS[mode]
        if given[target] is not None:
            raise ParameterError(
                f"normalizer: expected None when {target} is given (normalizer is {target}'s old name "
                f"in mode {mode!r}), got {norm}",
                argument="normalizer",
            )
        given[target] = norm
    return _Denominators(**given)


def _positive(name: str, value: Any) -> float | None:
    if value is None:
        return None
    x = _number(name, value, "a positive finite number")
    if not (x > 0.0 and math.isfinite(x)):
        raise ParameterError(f"{name}: expected a positive finite number, got {x}", argument=name)
    return x


def _aggregate(loss_mat: torch.Tensor, valid: torch.Tensor, mode: str, d: _Denominators) -> torch.Tensor:
    """verl 0.9.1's ``agg_loss`` with ``dp_size=1`` and the global arguments ``d``.
    Masked positions of ``loss_mat`` are taken as 0 and an empty count as 1 (see the module docstring)."""
    x = torch.where(valid, loss_mat, 0.0)
    if mode == "token-mean":
        denominator: Any = valid.sum().clamp(min=1) if d.batch_num_tokens is None else d.batch_num_tokens
        return x.sum() / denominator
    counts = valid.sum(dim=-1)  # valid tokens per row, int64
    if mode == "seq-mean-token-mean":  # a fully masked row's token mean is 0 / (0 + 1e-8) = 0, and it is not counted
        seq_losses = x.sum(dim=-1) / (counts + 1e-8)
    else:  # seq-mean-token-sum and seq-mean-token-sum-norm
        seq_losses = x.sum(dim=-1)
    seq_mask = (counts > 0).float()  # verl's float32 row mask: fully masked rows are left out of the mean
    seq_sum = (torch.where(seq_mask.bool(), seq_losses, 0.0) * seq_mask).sum()
    loss = seq_sum / (seq_mask.sum().clamp(min=1.0) if d.global_batch_size is None else d.global_batch_size)
    if mode == "seq-mean-token-sum-norm":  # then divided by the horizon: the mask's width unless given
        loss = loss / (max(loss_mat.shape[-1], 1) if d.loss_scale_factor is None else d.loss_scale_factor)
    return loss


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    loss_scale_factor: float | None = None,
    global_batch_size: float | None = None,
    batch_num_tokens: float | None = None,
    normalizer: float | None = None,
) -> torch.Tensor:
    """A per-token loss ``[B, T]`` aggregated into a scalar, as verl 0.9.1's ``core_algos.agg_loss``.

    With ``m`` the mask (``mask != 0``), ``n_b = Σ_t m_bt`` the valid tokens of row b, ``S`` the rows
    with ``n_b > 0`` (fully masked rows are left out, verl's ``seq_mask``), ``N = Σ_b n_b``, and the
    denominators ``N' = batch_num_tokens`` (default ``N``), ``G = global_batch_size`` (default ``|S|``)
    and ``L = loss_scale_factor`` (default ``T = loss_mat.shape[-1]``, the mask's width)::

        "token-mean"               Σ_bt m·ℓ / N'                            (every valid token weighs the same)
        "seq-mean-token-mean"      Σ_{b∈S} (Σ_t m·ℓ / (n_b + 1e-8)) / G     (every non-empty row weighs the same)
        "seq-mean-token-sum"       Σ_{b∈S} Σ_t m·ℓ / G
        "seq-mean-token-sum-norm"  Σ_{b∈S} Σ_t m·ℓ / G / L                  (Dr. GRPO: 1/G, and a constant L
                                                                            in place of the row length)

    A fully masked row adds nothing to any sum and does not count in ``|S|``. A batch without any valid
    token gives a zero scalar in every mode when the denominator is its own count (verl returns 0/0 =
    NaN), still connected to the graph so ``backward()`` gives zero gradients. Masked positions never
    reach the result, even if they hold NaN or ±inf.

    The three denominators are verl's ``agg_loss`` arguments of the same names with ``dp_size=1``: each
    mode reads only its own (``batch_num_tokens`` token-mean; ``global_batch_size`` the seq-mean modes;
    ``global_batch_size`` and ``loss_scale_factor`` seq-mean-token-sum-norm) and ignores the others, as
    verl does with its ``global_batch_info``. Across processes verl passes the minibatch's global token
    or row count and multiplies by ``dp_size`` (gradients are averaged over ranks); a loop that splits a
    minibatch over processes or micro-batches can equally scale each part's default-count result by its
    share of the count, as ``comppo_core.rl.core.step`` does.

    Args:
      loss_mat: ``[B, T]`` float tensor, the per-token loss.
      mask: ``[B, T]`` bool, integer or float tensor; nonzero marks a valid token.
      mode: one of :data:`AGG_MODES` (verl's ``loss_agg_mode``).
      loss_scale_factor: ``L`` of "seq-mean-token-sum-norm", a positive finite number; set it to a
        constant (the response budget) to keep the scale fixed through training, as verl advises.
      global_batch_size: ``G`` of the seq-mean modes, a positive finite number (the minibatch's rows).
      batch_num_tokens: ``N'`` of "token-mean", a positive finite number (the minibatch's tokens).
      normalizer: the old name of the mode's own argument (``batch_num_tokens`` for token-mean,
        ``global_batch_size`` for seq-mean-token-mean/-sum, ``loss_scale_factor`` for
        seq-mean-token-sum-norm); giving both is an error. Kept for callers not yet moved to the names.

    Returns:
      A 0-dim tensor in ``loss_mat``'s dtype; float32 for a bfloat16/float16 ``loss_mat`` in the three
      ``seq-mean`` modes, where verl's float32 row mask promotes it.

    Raises:
      ShapeError: ``loss_mat`` not 2-D, or ``mask`` not shaped like it.
      DTypeError: a non-tensor, a non-float ``loss_mat``, a mask that is not bool/integer/float, or
        tensors on different devices.
      ParameterError: an unknown ``mode``; a denominator that is not a positive finite number;
        ``normalizer`` together with the argument it names.
    """
    (loss_mat,) = _grid({"loss_mat": loss_mat})
    valid = _mask(mask, loss_mat, "loss_mat")
    mode = check_choice("mode", mode, AGG_MODES)
    d = _denominators(mode, batch_num_tokens, global_batch_size, loss_scale_factor, normalizer)
    return _aggregate(loss_mat, valid, mode, d)


# ---------------------------------------------------------------------------------------------------------
# losses


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = 3.0,
    agg: str = "token-mean",
    loss_scale_factor: float | None = None,
    global_batch_size: float | None = None,
    batch_num_tokens: float | None = None,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate loss with asymmetric and dual clipping, as verl's
    ``core_algos.compute_policy_loss_vanilla`` (equivalently the older ``compute_policy_loss``).

    Per token, with ``δ = clamp(lp − lp_old, −20, 20)``, ``r = exp(δ)``, ``ε_h = clip_high`` (default
    ``clip_low``) and ``c = dual_clip``::

        ℓ₁ = max(−A·r, −A·clamp(r, 1 − clip_low, 1 + ε_h))       (PPO clip)
        ℓ  = min(ℓ₁, −A·c)  where A < 0,   ℓ₁ elsewhere        (dual clip, arXiv:1912.09729)
        loss = aggregate(ℓ, mask, agg)

    Note the argument order: verl's function takes ``old_log_prob`` first; here the current policy's
    ``logprobs`` come first. Gradients flow into every input that requires them, as in verl (normally only
    ``logprobs``).

    Args:
      logprobs: ``[B, T]`` log-probabilities of the taken tokens under the policy being trained.
      old_logprobs: ``[B, T]`` the same under the policy that sampled them (verl's ``old_log_prob``).
      advantages: ``[B, T]`` advantages A.
      mask: ``[B, T]`` bool, integer or float; nonzero marks a response token (verl's ``response_mask``).
      clip_low: ε_low ≥ 0 (verl's ``clip_ratio_low``, or ``clip_ratio`` when that is unset).
      clip_high: ε_high ≥ 0; None means ``clip_low`` (verl's ``clip_ratio_high``, DAPO's clip-higher).
      dual_clip: c > 1 (verl's ``clip_ratio_c``, whose assertion requires c > 1); None turns dual clipping
        off, which verl cannot do: then ``ℓ = ℓ₁`` everywhere and ``clipfrac_lower`` is 0.
      agg: aggregation mode, see :func:`aggregate` (verl's ``loss_agg_mode``).
      loss_scale_factor, global_batch_size, batch_num_tokens, normalizer: the aggregation's denominators,
        see :func:`aggregate` (verl's ``global_batch_info``, with ``dp_size=1``).

    Returns:
      ``(loss, stats)``: the 0-dim loss (see :func:`aggregate` for its dtype) and a dict of Python floats,
      masked means over the valid tokens (0 when there are none):

      * ``pg_loss``: ``loss`` as a float;
      * ``clipfrac``: fraction with ``−A·clamp(r) > −A·r`` (verl's ``actor/pg_clipfrac``);
      * ``clipfrac_lower``: fraction with A < 0 and ``ℓ₁ > −A·c`` (``actor/pg_clipfrac_lower``);
      * ``approx_kl``: mean of ``−δ`` (``actor/ppo_kl``).

    Raises:
      ShapeError: an input not 2-D or not shaped like ``logprobs``.
      DTypeError: a non-tensor, a non-float input, a bad mask dtype, or tensors on different devices.
      ParameterError: ``clip_low`` or ``clip_high`` < 0, ``dual_clip`` ≤ 1 or not finite, an unknown ``agg``,
        a bad denominator (see :func:`aggregate`).
    """
    logprobs, old_logprobs, advantages = _grid(
        {"logprobs": logprobs, "old_logprobs": old_logprobs, "advantages": advantages}
    )
    valid = _mask(mask, logprobs, "logprobs")
    cliprange_low = _nonnegative("clip_low", clip_low)
    cliprange_high = cliprange_low if clip_high is None else _nonnegative("clip_high", clip_high)
    clip_ratio_c = None
    if dual_clip is not None:
        clip_ratio_c = _number("dual_clip", dual_clip, "a finite number > 1 (or None to turn dual clipping off)")
        if not (clip_ratio_c > 1.0 and math.isfinite(clip_ratio_c)):
            raise ParameterError(
                f"dual_clip: expected a finite number > 1 (or None to turn dual clipping off), got {clip_ratio_c}",
                argument="dual_clip",
            )
    agg = check_choice("agg", agg, AGG_MODES)
    norm = _denominators(agg, batch_num_tokens, global_batch_size, loss_scale_factor, normalizer)

    log_prob = torch.where(valid, logprobs, 0.0)
    old_log_prob = torch.where(valid, old_logprobs, 0.0)
    adv = torch.where(valid, advantages, 0.0)

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    if clip_ratio_c is None:
        pg_losses = clip_pg_losses1
    else:
        pg_losses3 = -adv * clip_ratio_c
        clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
        pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
    loss = _aggregate(pg_losses, valid, agg, norm)

    with torch.no_grad():
        ppo_kl = _masked_mean(-negative_approx_kl, valid)
        pg_clipfrac = _masked_mean(torch.gt(pg_losses2, pg_losses1).float(), valid)
        if clip_ratio_c is None:
            pg_clipfrac_lower = torch.zeros((), dtype=torch.float32, device=loss.device)
        else:
            lower = torch.gt(clip_pg_losses1, pg_losses3) * (adv < 0).float()
            pg_clipfrac_lower = _masked_mean(lower, valid)
        values = torch.stack([t.to(torch.float64) for t in (loss, pg_clipfrac, pg_clipfrac_lower, ppo_kl)])
    pg_loss, clipfrac, clipfrac_lower, approx_kl = values.tolist()  # one host synchronisation
    stats = {"pg_loss": pg_loss, "clipfrac": clipfrac, "clipfrac_lower": clipfrac_lower, "approx_kl": approx_kl}
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.5,
    agg: str = "token-mean",
    loss_scale_factor: float | None = None,
    global_batch_size: float | None = None,
    batch_num_tokens: float | None = None,
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss, as verl's ``core_algos.compute_value_loss``.

    Per token, with ``ε = clip``::

        V_clip = clip_by_value(V, V_old − ε, V_old + ε) = max(min(V, V_old + ε), V_old − ε)
        ℓ      = max((V − R)², (V_clip − R)²)
        loss   = ½ · aggregate(ℓ, mask, agg)

    (verl's ``clip_by_value`` form, which keeps V bit for bit inside the band, rather than
    ``V_old + clamp(V − V_old, −ε, ε)``). ``clip=None`` gives the unclipped ``½·aggregate((V − R)², mask)``
    (verl always clips; ``clip=inf`` gives the same loss and gradient).

    Args:
      values: ``[B, T]`` the critic's current predictions V (verl's ``vpreds``).
      old_values: ``[B, T]`` the predictions when the batch was collected (verl's ``values``).
      returns: ``[B, T]`` the regression targets R (verl's ``returns``).
      mask: ``[B, T]`` bool, integer or float; nonzero marks a valid token (verl's ``response_mask``).
      clip: ε ≥ 0 (verl's ``cliprange_value``), or None for no clipping.
      agg: aggregation mode, see :func:`aggregate`.
      loss_scale_factor, global_batch_size, batch_num_tokens, normalizer: the aggregation's denominators,
        see :func:`aggregate` (verl's ``global_batch_info``, with ``dp_size=1``).

    Returns:
      ``(loss, stats)``: the 0-dim loss and a dict of Python floats: ``vf_loss`` (``loss`` as a float) and
      ``clipfrac``, the masked fraction of tokens with ``(V_clip − R)² > (V − R)²`` (verl's
      ``vf_clipfrac``; 0 without clipping or without valid tokens).

    Raises:
      ShapeError: an input not 2-D or not shaped like ``values``.
      DTypeError: a non-tensor, a non-float input, a bad mask dtype, or tensors on different devices.
      ParameterError: ``clip`` < 0 or NaN, an unknown ``agg``, a bad denominator (see :func:`aggregate`).
    """
    vpreds, old, rets = _grid({"values": values, "old_values": old_values, "returns": returns})
    valid = _mask(mask, vpreds, "values")
    cliprange_value = None if clip is None else _nonnegative("clip", clip)
    agg = check_choice("agg", agg, AGG_MODES)
    norm = _denominators(agg, batch_num_tokens, global_batch_size, loss_scale_factor, normalizer)

    vpreds = torch.where(valid, vpreds, 0.0)
    old = torch.where(valid, old, 0.0)
    rets = torch.where(valid, rets, 0.0)

    vf_losses1 = (vpreds - rets) ** 2
    if cliprange_value is None:
        clipped_vf_losses = vf_losses1
    else:
        vpredclipped = torch.max(torch.min(vpreds, old + cliprange_value), old - cliprange_value)
        vf_losses2 = (vpredclipped - rets) ** 2
        clipped_vf_losses = torch.max(vf_losses1, vf_losses2)
    loss = 0.5 * _aggregate(clipped_vf_losses, valid, agg, norm)

    with torch.no_grad():
        if cliprange_value is None:
            vf_clipfrac = torch.zeros((), dtype=torch.float32, device=loss.device)
        else:
            vf_clipfrac = _masked_mean(torch.gt(vf_losses2, vf_losses1).float(), valid)
        both = torch.stack([loss.to(torch.float64), vf_clipfrac.to(torch.float64)])
    vf_loss, clipfrac = both.tolist()  # one host synchronisation
    return loss, {"vf_loss": vf_loss, "clipfrac": clipfrac}


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token KL estimate between the policy and a reference, as verl's ``core_algos.kl_penalty_forward``
    (J. Schulman, "Approximating KL divergence", 2020)::

        "k1" / "kl"          lp − ref
        "abs"                |lp − ref|
        "k2" / "mse"         ½·(lp − ref)²
        "k3" / "low_var_kl"  clamp(e^{d} − d − 1, −10, 10)  with d = clamp(ref − lp, −20, 20)

    Any shape (``[B, T]`` in practice); no mask: aggregate the result with :func:`aggregate`, or subtract it
    from the rewards. verl's "full" (not implemented there) and its straight-through "+" kinds ("k3+", whose
    forward raises NotImplementedError in verl at b178a3c) are not offered.

    Args:
      logprobs: float tensor, log-probabilities of the taken tokens under the policy.
      ref_logprobs: the same under the reference policy, shaped like ``logprobs``.
      kind: one of the keys of :data:`KL_KINDS`.

    Returns:
      A tensor shaped like ``logprobs``, in the inputs' (promoted) dtype.

    Raises:
      ShapeError: ``ref_logprobs`` not shaped like ``logprobs``.
      DTypeError: a non-tensor, a non-float input, or tensors on different devices.
      ParameterError: an unknown ``kind``.
    """
    logprob = _tensor(logprobs, "logprobs")
    ref_logprob = _tensor(ref_logprobs, "ref_logprobs")
    _check_like(ref_logprob, "ref_logprobs", logprob, "logprobs")
    estimator = KL_KINDS[check_choice("kind", kind, KL_KINDS)]
    if estimator == "k1":
        return logprob - ref_logprob
    if estimator == "abs":
        return (logprob - ref_logprob).abs()
    if estimator == "k2":
        return 0.5 * (logprob - ref_logprob).square()
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    ratio = torch.exp(kl)
    kld = (ratio - kl - 1).contiguous()
    return torch.clamp(kld, min=-10, max=10)
