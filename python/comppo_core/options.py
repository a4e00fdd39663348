"""Every closed set of option values in comppo-core, each defined once, and the one check.

A function that takes one of a fixed set of strings (``method="grpo"``,
``normalize="batch"``, ``agg="token-mean"``, ``--arm comppo``) reads the set from here
and checks the value with :func:`check_choice`, so the names and the error message are
the same in the array API, Arrow, Hugging Face, ``rl`` and the command line. The
modules that offered a set before keep their public name for it, as the same object
(``comppo_core.outcomes.GROUP_METHODS is options.GROUP_METHODS``).

This module imports only the standard library and :mod:`comppo_core.errors`, so reading
a set (or a :class:`~comppo_core.rl.TrainConfig`, which validates its fields against
these sets) needs neither NumPy's kernels nor torch.

The sets, by what they name:

==========================  ===============================================================
``GROUP_METHODS``           outcome baselines of :func:`comppo_core.group_advantages`
                            (``method=``) and of the grpo arm (``TrainConfig.group_method``)
``SINGLETON_MODES``         what :func:`comppo_core.group_advantages` gives a group of one
                            (``singleton=``): 0, or the raw score
``MASKED_REWARD_MODES``     a nonzero reward on a masked token (``masked_rewards=`` of
                            :func:`comppo_core.gae`): an error, or dropped
``NORMALIZE_MODES``         the z-score of the gate mapping (``GateParams.normalize``)
``GATE_CONTROLS``           the controls of the concentration gates (:mod:`comppo_core.controls`)
``CONTROLS``                the ``control=`` of :func:`comppo_core.hf.comp_gae_batch`: no
                            control (``"none"``) or one of ``GATE_CONTROLS``
``STATISTICS``              attention-concentration statistics of the probe
                            (``statistic=``, ``TrainConfig.statistic``)
``STATISTIC_METHODS``       how the probe computes them (``method=`` of :mod:`comppo_core.hf`)
``PRECISIONS``              the probe's arithmetic (``precision=``)
``AGG_MODES``               loss aggregations (verl's ``loss_agg_mode``; ``TrainConfig.loss_agg``)
``KL_KINDS``                KL estimator names (verl's ``kl_penalty``, aliases included),
                            mapped to the estimator each one is (``TrainConfig.kl_kind``)
``KL_MODES``                where the KL to the reference enters (``TrainConfig.kl_mode``):
                            a per-token reward penalty (TRL) or a loss term (verl)
``TEMPORAL_MIXERS``         the transport-aligned critic's causal mixer (``TrainConfig.tac_temporal``)
``ARM_NAMES``               the paper's arms (:mod:`comppo_core.rl.core.arms`; ``TrainConfig.arm``)
``EVAL_SPLITS``             the split a run's periodic evaluation reads (``TrainConfig.eval_split``)
==========================  ===============================================================
"""

from __future__ import annotations

from collections.abc import Collection
from types import MappingProxyType
from typing import Any

from .errors import ParameterError

__all__ = [
    "AGG_MODES",
    "ARM_NAMES",
    "CONTROLS",
    "DTYPES",
    "EVAL_SPLITS",
    "GATE_CONTROLS",
    "GROUP_METHODS",
    "KL_KINDS",
    "KL_MODES",
    "MASKED_REWARD_MODES",
    "NORMALIZE_MODES",
    "PRECISIONS",
    "REPORT_TO",
    "SINGLETON_MODES",
    "STATISTICS",
    "STATISTIC_METHODS",
    "TEMPORAL_MIXERS",
    "check_choice",
]

#: Outcome baselines (docs/design.md §6): GRPO's z-score, Dr. GRPO's mean, RLOO's
#: leave-one-out mean, REINFORCE with the group mean.
GROUP_METHODS = ("grpo", "drgrpo", "rloo", "reinforce_baseline")
#: A group of one sequence gets advantage 0 (``"zero"``) or its raw score (``"raw"``).
SINGLETON_MODES = ("zero", "raw")
#: A nonzero reward on a masked token is an error (``"error"``) or ignored (``"drop"``).
MASKED_REWARD_MODES = ("error", "drop")

#: The gate mapping's normalisation of the concentration (docs/design.md §4): the row's
#: running z-score over its valid tokens up to each token (the default), the z-score over
#: each row's valid tokens, over the batch's, or ``(c − center)/scale``.
NORMALIZE_MODES = ("causal", "sequence", "batch", "none")
#: Controls of the gates: each row's gates permuted, the batch mean gate at each
#: response position, the batch mean gate everywhere.
GATE_CONTROLS = ("shuffle", "by_position", "constant")
#: ``control=`` of the Hugging Face pipeline: the gates themselves, or one of :data:`GATE_CONTROLS`.
CONTROLS = ("none", *GATE_CONTROLS)

#: Attention-concentration statistics of a query's attention distribution p (per head,
#: then averaged over heads; docs/design.md §7): ``1 − H(p)/log n``, ``max p``, ``Σ p²``.
STATISTICS = ("entropy", "max", "l2")
#: How a layer's statistic is computed: the fastest that applies (``"auto"``), one Triton
#: pass (CUDA), an attention kernel's log-sum-exp (``"fused"``), scores in query chunks.
STATISTIC_METHODS = ("auto", "online", "fused", "chunked")
#: Dtype of the fused kernel's pass: float32 copies of Q and K, or the model's own dtype.
PRECISIONS = ("float32", "model")

#: Loss aggregations of verl's ``agg_loss``.
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
#: KL estimator names (verl's, aliases included) and the estimator each one is.
KL_KINDS = MappingProxyType(
    {"k1": "k1", "kl": "k1", "abs": "abs", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
)
#: Where a KL to the reference enters: a per-token reward penalty (TRL) or a loss term (verl's use_kl_loss).
KL_MODES = ("reward", "loss")

#: The package trainer's compute dtype: float32, or bfloat16 autocast over float32 master weights.
DTYPES = ("float32", "bfloat16")
#: The transport-aligned critic's causal temporal mixer: none, a GRU, causal attention.
TEMPORAL_MIXERS = ("none", "gru", "attention")
#: Where a run's metrics go besides ``metrics.jsonl``: nowhere, TensorBoard event files
#: (``OUT/tensorboard``), or Weights & Biases (its own settings; ``WANDB_MODE=offline`` works).
REPORT_TO = ("none", "tensorboard", "wandb")
#: The arms of :mod:`comppo_core.rl.core.arms`, in the order the docs and ``compare`` list them.
ARM_NAMES = (
    "grpo",
    "ppo",
    "ppo_fixed",
    "comp_gae",
    "tac_fixed",
    "comppo",
    "comppo_shuffle",
    "comppo_position",
    "comppo_inverted",
    "comppo_oracle",
    "comppo_policy_entropy",
    "comppo_token_nll",
)
#: The split a run's periodic evaluation reads: the held-out problems (what a result
#: reports) or the validation problems (what a tuning protocol selects settings on); each
#: is the name of the task's method that lists them.
EVAL_SPLITS = ("heldout", "validation")


def check_choice(name: str, value: Any, choices: Collection[str]) -> str:
    """``value`` if it is one of ``choices`` (a string), else a
    :class:`~comppo_core.errors.ParameterError` whose ``argument`` is ``name``.

    The message is ``"{name}: expected one of 'a', 'b', got {value!r}"``; ``name`` is the
    caller's name for the argument (a keyword, a config field). ``choices`` is one of
    this module's sets (the keys of a mapping such as :data:`KL_KINDS`).
    """
    if not isinstance(value, str) or value not in choices:
        raise ParameterError(f"{name}: expected one of {', '.join(map(repr, choices))}, got {value!r}", argument=name)
    return value
