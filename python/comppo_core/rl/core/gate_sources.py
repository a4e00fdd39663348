"""Where an arm's transport gates come from: one registry entry per gate source.

An arm (:mod:`comppo_core.rl.core.arms`) names its gate source; the step
(:func:`comppo_core.rl.core.step.step_gates`, :func:`comppo_core.rl.core.step.score`) looks
the name up here and nothing else decides what the source does. With ``g`` the scoring
pass's concentration gates ``[B, T−1]`` (``low + (high − low)·sigmoid(sharpness·z)``, ``z``
the row's running z-score of the attention concentration, or the whole row's with
``gate_causal=False``), ``m`` the response mask, ``low``/``high`` the gate range, the
sources are:

==================  =====================================================================
source              Comp-GAE's gates
==================  =====================================================================
``none``            none (plain GAE with a critic, group-relative outcomes without one)
``concentration``   ``g`` itself
``constant``        the batch mean of ``g`` over the response (``cc.controls.constant``), or
                    the setting ``fixed_gate`` when it is given
``shuffle``         each row's ``g`` permuted, seeded ``seed·1_000_003 + step``
                    (``cc.controls.shuffle``)
``by_position``     the batch mean of ``g`` at each response position (``cc.controls.by_position``)
``inverted``        ``low + high − g``: the sigmoid's mirror image within ``[low, high]``
``oracle``          ``high`` on the response columns the task marks pivotal, ``low``
                    elsewhere (a diagnostic: it reads what a policy cannot know)
``policy_entropy``  the gate mapping of ``−H_t``, ``H_t = −Σ_v π_τ(v|prefix)·log π_τ(v|prefix)``
                    the behaviour policy's next-token entropy at response column t
``token_nll``       the gate mapping of ``log π_τ(a_t|prefix) = −NLL_t``, the sampled token's
                    log-probability (the scoring pass's own, detached)
==================  =====================================================================

**The policy's uncertainty as a gate** (``policy_entropy``, ``token_nll``: sources to
compare the concentration against, :attr:`GateSource.baseline`). Each is a per-token
statistic ``u_t`` of the scoring pass at the sampling temperature τ, detached, mapped to
a gate by the concentration's own mapping (the same ``low``, ``high``, ``sharpness``,
normalisation and causal running z-score) applied to ``−u_t``::

    g_t = low + (high − low)·sigmoid(sharpness·z(−u)_t)          (as_is)
    g_t = low + (high − low)·sigmoid(sharpness·z(u)_t)           (gate_direction="inverted")

so by default **the more uncertain the token, the lower its gate**. Why that direction:
GACA mixes two advantage streams per token, the fine-grained (step-level) one where the
step's NLL is above average and the episode-level one elsewhere. In Comp-GAE,
``A_t = δ_t + γ·λ·g_t·A_{t+1}``: a gate near ``low`` cuts the trace at t, so ``A_t`` leans
on the token's own TD error ``δ_t`` (the fine-grained signal), and a gate near ``high``
passes the downstream outcome through t (toward the episode-level return ``R − V_t``).
GACA's rule in Comp-GAE's terms is therefore "uncertain token: low gate, confident token:
high gate", the same orientation as the concentration (``1 − H(attention)/log n``: a
peaked attention, a high gate), here for a peaked next-token distribution. It is not
the package's oracle convention (``oracle``: the pivotal tokens get *high* gates): on a
task whose pivotal tokens are the uncertain ones, the oracle's direction is
``gate_direction="inverted"``; ``comppo-core diagnose`` measures which holds. Both
statistics are functions of the prefix up to the token (``H_t`` of ``ids[:, :t+1]``,
``NLL_t`` of ``ids[:, :t+2]``, the token itself), so with the running z-score a gate
reads no later token. ``H_t`` needs the whole next-token distribution: it is computed
from the scoring forward's final hidden states and the model's own LM head, a chunk of
response tokens at a time (:func:`comppo_core.rl.core.policy_forward.policy_entropy`;
one more LM-head matmul over the response tokens, never the ``[B, T, V]`` logits).

A replacing source (every one but ``none`` and ``concentration``) is computed over the
global batch (the controls) or per row (the mappings of the policy's statistics) and is
what Comp-GAE reads; no critic ever reads it (a critic is a baseline and reads the prefix
only: a TAC reads the concentration's causal gate features in every arm).

Adding a source is one :class:`GateSource` in :data:`GATE_SOURCES` (its name then becomes
valid for :class:`~comppo_core.rl.core.arms.Arm`); ``tests/rl/test_rl_step.py`` runs every
entry. This module imports no torch: the mappings import it when they run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from ... import controls
from ...options import GATE_CONTROLS, check_choice

if TYPE_CHECKING:
    import torch

__all__ = ["GATE_DIRECTIONS", "GATE_SOURCES", "POLICY_STATISTICS", "GateContext", "GateSource", "get_gate_source"]


#: The per-token statistics of the policy a gate source may map instead of the concentration
#: (:attr:`GateSource.policy_statistic`): the next-token entropy ``H_t`` and the sampled token's
#: negative log-likelihood ``−log π_τ(a_t|prefix)``, both at the sampling temperature τ.
POLICY_STATISTICS = ("policy_entropy", "token_nll")

#: The directions of a gate mapping (``TrainConfig.gate_direction``): the source's own
#: (``as_is``), its mirror image (``inverted``: ``sigmoid(−sharpness·z)``), or none (a
#: diagnosis that found no direction: only an arm whose gates take none may run).
GATE_DIRECTIONS = ("as_is", "inverted", "none")


@dataclasses.dataclass(frozen=True)
class GateContext:
    """What a mapping may read besides the gates: the gate range and the step's keys."""

    low: float
    high: float
    seed: int
    step: int


#: ``mapping(g, m, context)``: the global batch's concentration gates ``g`` ``[B, T−1]``
#: float32 and response mask ``m`` ``[B, T−1]`` bool → Comp-GAE's gates ``[B, T−1]``.
Mapping = Callable[["torch.Tensor", "torch.Tensor", GateContext], "torch.Tensor"]


@dataclasses.dataclass(frozen=True)
class GateSource:
    """One source of Comp-GAE's gates.

    ``mapping`` is None for the sources that replace nothing (``none``,
    ``concentration``), for ``oracle``, whose gates come from the task's pivotal marks
    (:func:`comppo_core.rl.core.step.oracle_gates`), and for the policy's statistics, whose
    gates the scoring forward maps itself (:func:`comppo_core.rl.forward`'s
    ``policy_statistic``); none of those come from the concentration gates."""

    name: str
    description: str
    mapping: Mapping | None = None
    #: a control of the concentration gates (``cc.controls``): the paper's checks that gains
    #: come from trajectory-specific alignment
    control: bool = False
    #: the gates come from the task's pivotal marks (a diagnostic arm)
    pivotal: bool = False
    #: a given ``fixed_gate`` setting replaces the mapping by that constant
    takes_fixed_gate: bool = False
    #: the policy's per-token statistic ``u`` (:data:`POLICY_STATISTICS`): Comp-GAE's gates are
    #: the gate mapping of ``−u`` (an uncertain token, a low gate) instead of the concentration's
    policy_statistic: str | None = None
    #: a source from outside the paper to compare the concentration against (not in
    #: ``compare``'s default arms)
    baseline: bool = False

    def __post_init__(self) -> None:
        if self.policy_statistic is not None:
            check_choice("policy_statistic", self.policy_statistic, POLICY_STATISTICS)

    @property
    def gated(self) -> bool:
        """Whether Comp-GAE reads gates at all."""
        return self.name != "none"

    @property
    def replaces(self) -> bool:
        """Whether the source replaces the concentration gates (a mapping, the oracle, or
        the mapping of a policy statistic)."""
        return self.mapping is not None or self.pivotal or self.policy_statistic is not None

    @property
    def reads_concentration(self) -> bool:
        """Whether Comp-GAE's gates are computed from the attention concentration (every
        gated source but the oracle and the policy's statistics)."""
        return self.gated and not self.pivotal and self.policy_statistic is None

    @property
    def directed(self) -> bool:
        """Whether the gates vary by token along a statistic with a direction (``as_is`` or
        ``inverted``): every gated source but a constant and the oracle. An arm of such a
        source refuses ``gate_direction="none"``."""
        return self.gated and not self.pivotal and not self.takes_fixed_gate


def _constant(g: torch.Tensor, m: torch.Tensor, _: GateContext) -> torch.Tensor:
    import torch

    return torch.as_tensor(controls.constant(g, mask=m))


def _shuffle(g: torch.Tensor, m: torch.Tensor, ctx: GateContext) -> torch.Tensor:
    import torch

    return torch.as_tensor(controls.shuffle(g, mask=m, seed=ctx.seed * 1_000_003 + ctx.step))


def _by_position(g: torch.Tensor, m: torch.Tensor, _: GateContext) -> torch.Tensor:
    import torch

    return torch.as_tensor(controls.by_position(g, mask=m))


def _inverted(g: torch.Tensor, m: torch.Tensor, ctx: GateContext) -> torch.Tensor:
    import torch

    return torch.where(m, (ctx.low + ctx.high) - g, 1.0).clamp(0.0, 1.0)


#: Every gate source by name, in the order the docs list them.
GATE_SOURCES: dict[str, GateSource] = {
    s.name: s
    for s in (
        GateSource("none", "no gates"),
        GateSource("concentration", "the gate mapping of the scoring pass's concentration"),
        GateSource(
            "constant",
            "the batch mean of the concentration gates, or fixed_gate",
            _constant,
            control=True,
            takes_fixed_gate=True,
        ),
        GateSource("shuffle", "each row's concentration gates permuted", _shuffle, control=True),
        GateSource("by_position", "the per-position batch mean of the concentration gates", _by_position, control=True),
        GateSource("inverted", "the gate mapping reversed: low + high − g", _inverted),
        GateSource("oracle", "high on the task's pivotal tokens, low elsewhere", pivotal=True),
        GateSource(
            "policy_entropy",
            "the gate mapping of the policy's negated next-token entropy (uncertain: low gate)",
            policy_statistic="policy_entropy",
            baseline=True,
        ),
        GateSource(
            "token_nll",
            "the gate mapping of the sampled token's log-probability (uncertain: low gate)",
            policy_statistic="token_nll",
            baseline=True,
        ),
    )
}

assert {n for n, s in GATE_SOURCES.items() if s.control} == set(GATE_CONTROLS)  # one vocabulary of controls


def get_gate_source(name: str) -> GateSource:
    """The gate source called ``name``, or a :class:`~comppo_core.errors.ParameterError`."""
    return GATE_SOURCES[check_choice("gates", name, tuple(GATE_SOURCES))]
