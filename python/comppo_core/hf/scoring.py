"""The scoring forward: ``(model, input_ids, attention_mask)`` → per-token log-probs, and
the attention concentration on request, from one forward pass (docs/design.md §7, §10).

::

    logprobs[b, j]       = log softmax(logits[b, j] / τ)[input_ids[b, j+1]]      float32
    concentration[b, j]  = the probe's statistic at query position j             (detached)
    per_layer[b, j, l]   = the same, layer l alone                               (detached)

All ``[B, T−1]`` (``per_layer`` ``[B, T−1, L]``): column j scores token ``input_ids[:, j+1]``
from query position j, and every value is 0 in a column whose query or target token is
padding. :func:`score` is the one path from ids to log-probs: the probe's
:func:`logprobs_and_concentration`, :func:`comppo_core.hf.comp_gae_batch`,
:func:`comppo_core.rl.forward` (which adds gates and a critic's values) and the trainer
(old, new and reference log-probs) all call it. Log-probs are computed in float32 by
:func:`~comppo_core.hf.lm.token_logprobs` in bounded chunks of the logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch

from .lm import check_ids, default_position_ids, scored_columns, token_logprobs
from .probe import ConcentrationProbe
from .statistics import DEFAULT_QUERY_CHUNK

__all__ = [
    "LogprobsAndConcentration",
    "LogprobsAndConcentrationPerLayer",
    "Scores",
    "logprobs_and_concentration",
    "logprobs_and_concentration_per_layer",
    "score",
]


class Scores(NamedTuple):
    """What :func:`score` returns: ``[B, T−1]`` float32 per token (``per_layer`` ``[B, T−1, L]``)."""

    logprobs: torch.Tensor
    #: None unless asked for (``concentration=True`` or ``per_layer=True``)
    concentration: torch.Tensor | None
    #: None unless ``per_layer=True``
    per_layer: torch.Tensor | None
    #: ``[B, T−1]`` bool, the scored columns (query and target token real)
    columns: torch.Tensor


class LogprobsAndConcentration(NamedTuple):
    """``[B, T−1]`` float32 each: column j scores token ``input_ids[:, j+1]`` from query position j."""

    logprobs: torch.Tensor
    concentration: torch.Tensor


class LogprobsAndConcentrationPerLayer(NamedTuple):
    """:class:`LogprobsAndConcentration` plus each layer's statistic.

    ``logprobs`` and ``concentration`` ``[B, T−1]``, ``per_layer`` ``[B, T−1, L]``, float32;
    column j scores token ``input_ids[:, j+1]`` and comes from query position j;
    ``per_layer[:, :, i]`` is layer ``probe.layers[i]`` (ascending)."""

    logprobs: torch.Tensor
    concentration: torch.Tensor
    per_layer: torch.Tensor


def score(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    concentration: bool = False,
    per_layer: bool = False,
    statistic: str = "entropy",
    layers: None | int | slice | Iterable[int] = None,
    method: str = "auto",
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    precision: str = "float32",
    grad: bool = False,
    position_ids: torch.Tensor | None = None,
) -> Scores:
    """One forward of ``model``; per-token log-probs, and the concentration on request.

    Args:
      model: a causal LM (``...ForCausalLM``); with ``concentration`` or ``per_layer``, one
        supported by :class:`~comppo_core.hf.ConcentrationProbe`.
      input_ids: ``[B, T]`` token ids, ``T >= 2``.
      attention_mask: optional ``[B, T]`` (nonzero = real token); any padding side.
      temperature: ``τ``: the log-probs are of ``softmax(logits / τ)`` (the rollout's
        sampling temperature, as verl and TRL score).
      concentration: run the probe and return the concentration.
      per_layer: also each selected layer's statistic (implies ``concentration``).
      statistic, layers, method, query_chunk, precision: the probe's.
      grad: run with gradients (the PPO update): the log-probs carry them; the probe
        records the pass anyway and its statistics never do.
      position_ids: optional ``[B, T]``; by default ``cumsum(attention_mask) − 1`` clamped
        at 0, the positions ``generate`` gives a left-padded prompt (no mask: the model's
        default ``0..T−1``).

    Returns:
      :class:`Scores` on the model's device.
    """
    ids, mask = check_ids(input_ids, attention_mask)
    kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": False}
    if mask is not None:
        kwargs["attention_mask"] = mask.long()
        kwargs["position_ids"] = default_position_ids(mask) if position_ids is None else position_ids
    elif position_ids is not None:
        kwargs["position_ids"] = position_ids
    probing = concentration or per_layer
    probe = (
        ConcentrationProbe(
            model,
            statistic,
            layers,
            per_layer=per_layer,
            record_with_grad=grad,
            method=method,
            query_chunk=query_chunk,
            precision=precision,
        )
        if probing
        else None
    )
    with torch.enable_grad() if grad else torch.no_grad(), probe if probe is not None else contextlib.nullcontext():
        out = model(**kwargs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        lp = token_logprobs(logits[:, :-1], ids[:, 1:], temperature=temperature)
        del out, logits
    columns = torch.ones_like(lp, dtype=torch.bool) if mask is None else scored_columns(mask)
    conc = per = None
    if probe is not None:
        conc = torch.where(columns, probe.concentration[:, :-1], 0.0)
        if per_layer:
            per = probe.per_layer[:, :-1].masked_fill(~columns.unsqueeze(-1), 0.0)
    if mask is not None:
        lp = torch.where(columns, lp, torch.zeros_like(lp))
    return Scores(lp, conc, per, columns)


def logprobs_and_concentration(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    statistic: str = "entropy",
    layers: None | int | slice | Iterable[int] = None,
    position_ids: torch.Tensor | None = None,
    method: str = "auto",
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    precision: str = "float32",
) -> LogprobsAndConcentration:
    """Token log-probs and attention concentration from one forward pass (no grad).

    ::

        logprobs[b, j]      = log π(input_ids[b, j+1] | input_ids[b, :j+1])
        concentration[b, j] = the probe's statistic at query position j

    Column j scores token j+1 and its concentration comes from query position j, the
    position whose logits score that token (docs/design.md §7: the off-by-one to avoid). Both
    are 0 in a column whose query or target token is padding.

    Args:
      model: a causal LM (``...ForCausalLM``) supported by :class:`ConcentrationProbe`.
      input_ids: ``[B, T]`` token ids, ``T >= 2``.
      attention_mask: optional ``[B, T]`` (nonzero = real token); left, right or
        both-ends padding.
      statistic, layers, method, query_chunk, precision: as :class:`ConcentrationProbe`.
      position_ids: optional ``[B, T]``; by default ``cumsum(attention_mask) − 1``
        clamped at 0, the positions ``generate`` gives a left-padded prompt (no mask:
        the model's default ``0..T−1``).

    Returns:
      ``LogprobsAndConcentration(logprobs, concentration)``, ``[B, T−1]`` float32 each,
      on the model's device.
    """
    probe: dict[str, Any] = {"statistic": statistic, "layers": layers, "method": method, "query_chunk": query_chunk}
    s = score(
        model, input_ids, attention_mask, concentration=True, position_ids=position_ids, precision=precision, **probe
    )
    assert s.concentration is not None
    return LogprobsAndConcentration(s.logprobs, s.concentration)


def logprobs_and_concentration_per_layer(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    statistic: str = "entropy",
    layers: None | int | slice | Iterable[int] = None,
    position_ids: torch.Tensor | None = None,
    method: str = "auto",
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    precision: str = "float32",
) -> LogprobsAndConcentrationPerLayer:
    """:func:`logprobs_and_concentration` plus each selected layer's statistic (no grad).

    ::

        logprobs[b, j]       = log π(input_ids[b, j+1] | input_ids[b, :j+1])
        concentration[b, j]  = (1/L) Σ_i per_layer[b, j, i]   (up to float32 rounding)
        per_layer[b, j, i]   = head-mean statistic of layer layers[i] at query position j

    Same column convention as :func:`logprobs_and_concentration` (column j scores token
    j+1, its statistics come from query position j; 0 in a column whose query or target
    token is padding), and ``logprobs`` and ``concentration`` are the values it returns,
    bit for bit. A separate function because a third field would break the two-way
    unpacking ``lp, conc = logprobs_and_concentration(...)``.

    Args: as :func:`logprobs_and_concentration`.

    Returns:
      ``LogprobsAndConcentrationPerLayer(logprobs, concentration, per_layer)``: ``[B, T−1]``,
      ``[B, T−1]`` and ``[B, T−1, L]`` float32 on the model's device, ``L`` the number of
      selected layers, in ascending layer order (``ConcentrationProbe(...).layers``).
    """
    probe: dict[str, Any] = {"statistic": statistic, "layers": layers, "method": method, "query_chunk": query_chunk}
    s = score(model, input_ids, attention_mask, per_layer=True, position_ids=position_ids, precision=precision, **probe)
    assert s.concentration is not None and s.per_layer is not None
    return LogprobsAndConcentrationPerLayer(s.logprobs, s.concentration, s.per_layer)
