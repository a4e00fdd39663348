"""Hugging Face integration: attention concentration and CompPO end to end (docs/design.md §7, §9).

Needs the ``[hf]`` extra (torch and transformers >= 5); ``import comppo_core`` alone does
not import torch.

* :class:`ConcentrationProbe`: a context manager that records the policy's attention
  concentration ``[B, T]`` during any forward pass run with gradients disabled.
* :func:`score`: the one scoring forward, ``(model, input_ids, attention_mask)`` →
  ``[B, T−1]`` token log-probs (at a temperature, with or without gradients) and, on
  request, the concentration; column j scores token j+1 from query position j.
  :func:`logprobs_and_concentration` is its no-grad form with the probe. The log-probs
  come from the final hidden states in chunks of tokens (never the ``[B, T, V]``
  logits), and a model wrapped by DDP, DeepSpeed, accelerate or PEFT is accepted
  (:func:`unwrap_model` finds the inner model the probe attaches to).
* :func:`comp_gae_batch`: forward with the probe → response log-probs and concentration
  → gates → Comp-GAE (and plain GAE) advantages and returns, with the paper's controls.
"""

from __future__ import annotations

from .lm import LOGPROB_CHUNK_ELEMENTS, default_position_ids, token_logprobs
from .pipeline import CONTROLS, CompPOBatch, comp_gae_batch
from .probe import IMPLEMENTATION, ConcentrationProbe, ProbeError, UnsupportedModelError, unwrap_model
from .scoring import (
    LogprobsAndConcentration,
    LogprobsAndConcentrationPerLayer,
    Scores,
    logprobs_and_concentration,
    logprobs_and_concentration_per_layer,
    score,
)
from .statistics import DEFAULT_QUERY_CHUNK, METHODS, STATISTICS, head_mean_concentration

__all__ = [
    "CONTROLS",
    "DEFAULT_QUERY_CHUNK",
    "IMPLEMENTATION",
    "LOGPROB_CHUNK_ELEMENTS",
    "METHODS",
    "STATISTICS",
    "CompPOBatch",
    "ConcentrationProbe",
    "LogprobsAndConcentration",
    "LogprobsAndConcentrationPerLayer",
    "ProbeError",
    "Scores",
    "UnsupportedModelError",
    "comp_gae_batch",
    "default_position_ids",
    "head_mean_concentration",
    "logprobs_and_concentration",
    "logprobs_and_concentration_per_layer",
    "score",
    "token_logprobs",
    "unwrap_model",
]
