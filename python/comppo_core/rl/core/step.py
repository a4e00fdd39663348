"""The maths of one PPO step, as plain functions that any engine calls (docs/architecture.md).

A step of every arm, after the rollout (sampled ``input_ids``, the response columns and
the verifier's ``scores``)::

    2. score        out = score(actor, critic, ids, mask, response_mask, gates=step_gates(...))
                      log-probs at the sampling temperature τ, the arm's transport gates,
                      the critic's values (one actor forward); the reference's log-probs
    3. rewards      r_t = scores[b]·[t = last response column] (− kl_coef·KL_t, kl_mode="reward")
       advantages   critic arms: A, R = cc.gae(r, V, gates, γ, λ, λ_critic), A whitened over
                    the global batch (verl's GAE); grpo: cc.group_advantages(Σ_t r_t) broadcast
    4. loss         per minibatch: policy_loss + vf_coef·value_loss (+ kl_coef·KL, kl_mode="loss"),
                    each term scaled by this process's share of the minibatch

An arm (:mod:`comppo_core.rl.core.arms`) is data: its critic and the source of its transport
gates; :func:`step_gates` turns that into the gates of a step, once. Everything per token
is ``[B, T−1]``: column j scores token ``ids[:, j+1]``. Batch-wide statistics (group
baselines, whitening, controls, metrics) run over the global batch through a
:class:`Rows` (the identity on one process), so one process and ``N`` processes on the
same global batch compute the same numbers. The trainer (:mod:`comppo_core.rl.engine.trainer`)
only orchestrates: rollout, the loop over minibatches and optimisers, evaluation, logging.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ... import gating
from ...advantages import gae
from ...diagnostics import credit_stats
from ...errors import ParameterError
from ...gate_params import GateParams
from ...outcomes import broadcast, group_advantages
from ...whitening import masked_whiten
from . import losses
from .arms import Arm
from .gate_sources import GateContext
from .policy_forward import GatesFromConcentration, forward

__all__ = [
    "AdvantageSettings",
    "Batch",
    "LossSettings",
    "Rows",
    "ScoringSettings",
    "advantage_statistics",
    "compute_advantages",
    "explained_variance",
    "loss_shares",
    "masked_mean",
    "minibatch_loss",
    "next_values",
    "oracle_gates",
    "rewards_with_kl",
    "score",
    "step_gates",
    "terminal_rewards",
    "trace_only_rewards",
]


# ---------------------------------------------------------------------------------------------------------
# the data of a step and its settings


@dataclasses.dataclass
class Batch:
    """What the PPO update reads (phases 2–3), ``[B, T−1]`` per token (``groups`` ``[B]``)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    #: Comp-GAE's gates (1 outside the response); None for the arms without gates
    gates: torch.Tensor | None = None

    def select(self, index: torch.Tensor) -> Batch:
        """The rows ``index`` (a minibatch)."""
        rows: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            rows[f.name] = None if v is None else v[index]
        return Batch(**rows)


@dataclasses.dataclass(frozen=True)
class Rows:
    """This process's rows of the global batch and how to see every process's rows.

    ``gather(x)`` concatenates ``x`` ``[B_local, ...]`` over the processes in rank order
    (``[B, ...]``); ``local`` is this process's slice of the result. One process:
    :data:`LOCAL` (``gather`` is the identity)."""

    gather: Callable[[torch.Tensor], torch.Tensor]
    local: slice
    distributed: bool = False


#: The rows of a single process: the global batch is its own.
LOCAL = Rows(gather=lambda x: x, local=slice(None), distributed=False)


@dataclasses.dataclass(frozen=True)
class ScoringSettings:
    """How phase 2 scores: the probe's statistic, the gate mapping, τ, the constant gate of
    ``tac_fixed`` and ``ppo_fixed`` (None: the batch mean of the concentration gates), and
    whether Comp-GAE's gates use the row's running z-score (``causal``) instead of the
    whole row's."""

    statistic: str = "entropy"
    gate_params: GateParams = dataclasses.field(default_factory=GateParams)
    temperature: float = 1.0
    fixed_gate: float | None = None
    causal: bool = False

    @classmethod
    def from_config(cls, config: Any) -> ScoringSettings:
        """From a :class:`~comppo_core.rl.TrainConfig` (or anything with its field names)."""
        return cls(config.statistic, config.gate_params, config.temperature, config.fixed_gate, config.gate_causal)


@dataclasses.dataclass(frozen=True)
class AdvantageSettings:
    """Phase 3: γ, λ (actor) and λ_critic (returns), whitening, the outcome baseline,
    where the KL to the reference enters (``kl_mode="reward"``: ``r_t −= kl_coef·KL_t``), and
    whether the gates enter the one-step bootstrap (``gate_in_bootstrap``, the paper: yes;
    :func:`compute_advantages`)."""

    gamma: float = 1.0
    lam: float = 0.95
    lam_critic: float | None = None
    whiten: bool = True
    group_method: str = "grpo"
    kl_coef: float = 0.0
    kl_kind: str = "k1"
    kl_mode: str = "loss"
    gate_in_bootstrap: bool = True

    @classmethod
    def from_config(cls, config: Any) -> AdvantageSettings:
        c = config
        return cls(
            c.gamma,
            c.lam,
            c.lam_critic,
            c.whiten_advantages,
            c.group_method,
            c.kl_coef,
            c.kl_kind,
            c.kl_mode,
            c.gate_in_bootstrap,
        )


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """Phase 4: verl's clipping constants, the value loss's weight and clip, the
    aggregation (``loss_scale_factor``: the horizon L of ``seq-mean-token-sum-norm``, the response budget), and
    the KL as a loss term (``kl_mode="loss"``)."""

    clip_low: float = 0.2
    clip_high: float | None = None
    dual_clip: float | None = None
    value_clip: float | None = None
    vf_coef: float = 0.5
    agg: str = "token-mean"
    loss_scale_factor: float | None = None
    kl_coef: float = 0.0
    kl_kind: str = "k1"
    kl_mode: str = "loss"

    @classmethod
    def from_config(cls, config: Any, max_new_tokens: int) -> LossSettings:
        """From a TrainConfig; ``seq-mean-token-sum-norm`` divides by verl's response length,
        the fixed response budget ``max_new_tokens`` (the ``[B, T−1]`` width would also count
        the prompt columns and vary with the batch)."""
        c = config
        loss_scale_factor = cls.horizon(c.loss_agg, max_new_tokens)
        return cls(
            c.clip_low,
            c.clip_high,
            c.dual_clip,
            c.value_clip,
            c.vf_coef,
            c.loss_agg,
            loss_scale_factor,
            c.kl_coef,
            c.kl_kind,
            c.kl_mode,
        )

    @staticmethod
    def horizon(agg: str, max_new_tokens: int | None) -> float | None:
        """``loss_scale_factor`` of aggregation ``agg``: the response budget for
        ``seq-mean-token-sum-norm`` (verl's L), None for the other modes or without a budget."""
        return float(max_new_tokens) if agg == "seq-mean-token-sum-norm" and max_new_tokens is not None else None

    def kl_in_loss(self, train_actor: bool) -> bool:
        """Whether the minibatch loss has the KL term (the actor trains and kl_mode="loss")."""
        return self.kl_mode == "loss" and self.kl_coef > 0.0 and train_actor


# ---------------------------------------------------------------------------------------------------------
# phase 2: scoring and the transport gates


def _batch_gates(
    gates: torch.Tensor,
    concentration: torch.Tensor,
    response_mask: torch.Tensor,
    settings: ScoringSettings,
    rows: Rows,
) -> torch.Tensor:
    """The gates of a statistic as the global batch defines them: with ``normalize="batch"``
    the z-score is over every process's rows (recomputed from the gathered statistic, the
    concentration or the mapped policy statistic); otherwise (or with causal gates, which
    are per row) each row's own (``gates`` as they are)."""
    params = settings.gate_params
    if params.normalize != "batch" or settings.causal or not rows.distributed:  # the batch is its rows
        return gates
    g = gating.gates_from_concentration(rows.gather(concentration), mask=rows.gather(response_mask), params=params)
    return torch.as_tensor(g).to(torch.float32)[rows.local]


def oracle_gates(pivotal: torch.Tensor, params: GateParams) -> torch.Tensor:
    """The oracle's ``[B, T−1]`` float32 gates: ``params.high`` where ``pivotal`` (the
    response columns the task marks pivotal), ``params.low`` elsewhere (the scoring forward
    sets the gates outside the response to 1)."""
    p = pivotal.to(torch.bool)
    return torch.where(p, float(params.high), float(params.low)).to(torch.float32)


def step_gates(
    arm: Arm,
    settings: ScoringSettings,
    *,
    step: int,
    seed: int,
    shape: tuple[int, int],
    device: torch.device,
    rows: Rows = LOCAL,
    pivotal: torch.Tensor | None = None,
) -> torch.Tensor | GatesFromConcentration | None:
    """The gates of a step that replace Comp-GAE's concentration gates, decided once from the arm:

    * None: the arm uses the concentration gates (``comppo``, ``comp_gae``) or none at all;
    * a ``[B, T−1]`` tensor of ``settings.fixed_gate`` (a constant gate given as a number);
    * the oracle's gates (:func:`oracle_gates` of ``pivotal``, ``[B, T−1]`` bool: the
      response columns the task marks pivotal; required by the ``oracle`` source);
    * a function of the scoring pass's own concentration gates ``g``, which
      :func:`~comppo_core.rl.forward` calls after the actor's forward (no second actor
      forward), computed over the global batch: a control (``cc.controls``: the batch mean
      for ``constant``, each row's gates permuted with seed ``seed·1_000_003 + step`` for
      ``shuffle``, the per-position batch mean for ``by_position``), or the reversed
      mapping ``low + high − g`` for ``inverted`` (the sigmoid's mirror image: high
      concentration gives a low gate).

    A source of the policy's uncertainty (``policy_entropy``, ``token_nll``) gives None too:
    its gates are the scoring forward's own, the mapping of that statistic
    (:func:`score` passes it as ``policy_statistic``).

    Each source's computation is its entry in
    :data:`~comppo_core.rl.core.gate_sources.GATE_SOURCES`. A replacing gate is what
    Comp-GAE reads; no critic reads it (the critic is causal)."""
    source = arm.gate_source
    if not source.replaces or source.policy_statistic is not None:
        return None
    params = settings.gate_params
    if source.pivotal:
        if pivotal is None:
            raise ParameterError(
                f"pivotal: the {arm.name} arm's gates need the task's pivotal response columns", argument="pivotal"
            )
        return oracle_gates(pivotal.to(device), params)
    if source.takes_fixed_gate and settings.fixed_gate is not None:
        return torch.full(shape, float(settings.fixed_gate), device=device)
    mapping = source.mapping
    assert mapping is not None  # a replacing source that is not the oracle maps the gates
    context = GateContext(low=params.low, high=params.high, seed=seed, step=step)

    def replace(own: torch.Tensor, concentration: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        g = rows.gather(_batch_gates(own, concentration, response_mask, settings, rows))
        return mapping(g, rows.gather(response_mask), context)[rows.local]

    return replace


@dataclasses.dataclass
class Scored:
    """Phase 2's output: ``[B, T−1]`` float32 each (None where the arm has no such thing)."""

    logprobs: torch.Tensor
    values: torch.Tensor | None
    #: Comp-GAE's gates (1 outside the response); None for the arms without gates
    gates: torch.Tensor | None


def score(
    actor: Any,
    critic: nn.Module | None,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    arm: Arm,
    settings: ScoringSettings,
    grad: bool = False,
    gates: torch.Tensor | GatesFromConcentration | None = None,
    rows: Rows = LOCAL,
    critic_grad: bool | None = None,
    cu_seqlens: Any = None,
    scoring: bool | None = None,
) -> Scored:
    """Log-probs (at τ), values and the arm's gates of a batch, from one actor forward.

    The log-probs are the response columns' (0 at the prompt's, which no step reads: the
    LM head runs on the response alone, :func:`~comppo_core.rl.forward`'s
    ``response_logprobs``).

    ``grad=False`` is phase 2 (old log-probs and values; ``gates`` from :func:`step_gates`;
    Comp-GAE's gates as the global batch defines them, a collective under ``rows``);
    ``grad=True`` is the update's forward on this process's rows alone (``gates`` None:
    the update reads no Comp-GAE gates); ``grad=False, critic_grad=True`` trains the critic
    alone (a critic warm-up). ``scoring`` (default ``not grad``) asks for the scoring
    pass's outputs, the arm's gates as phase 2 computes them: ``grad=True, scoring=True``
    is phase 2 and the update's forward in one pass, for an update that trains on the
    rollout it scores with the weights that scored it (one optimiser step per rollout
    batch, one minibatch: CompPOTrainer with ``num_iterations=1`` and
    ``steps_per_generation=1``); its detached outputs are phase 2's. The critic reads the
    prefix only, in every arm (:func:`~comppo_core.rl.forward`). The probe runs only when
    the pass needs routing:
    the scoring pass of an arm with gates or a TAC, the update of a TAC arm; the others
    score with a plain forward, at the baseline's own cost. The scoring pass of an arm whose
    gates map a policy statistic (``policy_entropy``, ``token_nll``) computes it and maps it
    (:func:`~comppo_core.rl.forward`'s ``policy_statistic``); the update's forward does not
    (unless ``scoring``).

    ``cu_seqlens`` scores a packed row (``input_ids`` ``[1, N]``, ``attention_mask`` None,
    ``response_mask`` and every output ``[1, N−1]``; :func:`~comppo_core.rl.forward`), on
    this process's rows alone: a ``gates`` function then reads one row per sequence."""
    if cu_seqlens is not None and rows.distributed:
        raise ParameterError(
            "cu_seqlens: expected the process's own rows (rows=LOCAL) with a packed row; the global batch's gates "
            "are gathered from padded rows",
            argument="cu_seqlens",
        )
    scoring = not grad if scoring is None else bool(scoring)
    statistic = arm.gate_source.policy_statistic if scoring else None
    routing = arm.critic_reads_routing or (scoring and arm.reads_routing)
    out = forward(
        actor,
        input_ids,
        attention_mask,
        critic=critic,
        response_mask=response_mask,
        statistic=settings.statistic,
        gate_params=settings.gate_params,
        gates=gates if routing else None,
        grad=grad,
        temperature=settings.temperature,
        routing=routing,
        causal=settings.causal,
        critic_grad=critic_grad,
        policy_statistic=statistic,
        cu_seqlens=cu_seqlens,
        response_logprobs=True,
    )
    comp_gates = out.gates
    if scoring and gates is None and comp_gates is not None and out.gate_statistic is not None:
        comp_gates = _batch_gates(comp_gates, out.gate_statistic, response_mask, settings, rows)
    values = None if out.values is None else out.values.float()  # float32 under a bfloat16 autocast too
    return Scored(logprobs=out.logprobs.float(), values=values, gates=comp_gates if arm.gate_source.gated else None)


# ---------------------------------------------------------------------------------------------------------
# phase 3: rewards and advantages


def terminal_rewards(response_mask: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``[B, T−1]`` float32 rewards: ``scores[b]`` at row b's last response column, 0 elsewhere
    (a row without a response column gets its score at column 0, which no mask selects)."""
    m = response_mask
    last = (m.long() * torch.arange(m.shape[1], device=m.device)).argmax(-1)
    rewards = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    rewards[torch.arange(m.shape[0], device=m.device), last] = scores.to(device=m.device, dtype=torch.float32)
    return rewards


def rewards_with_kl(
    response_mask: torch.Tensor,
    scores: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    settings: AdvantageSettings,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(rewards, kl)``: :func:`terminal_rewards`, minus ``kl_coef·KL_t`` per response token
    when ``kl_mode="reward"`` (TRL); ``kl`` is ``KL_t`` (``kl_kind``, 0 outside the response)
    when a reference is given, else None."""
    rewards = terminal_rewards(response_mask, scores)
    kl = None
    if ref_logprobs is not None:
        kl = torch.where(response_mask, losses.kl_penalty(old_logprobs, ref_logprobs, settings.kl_kind), 0.0)
        if settings.kl_mode == "reward" and settings.kl_coef > 0.0:
            rewards = rewards - settings.kl_coef * kl
    return rewards, kl


def next_values(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: at each position, ``values`` at the row's next valid position (``mask``),
    0 where no valid position follows (the terminal ``V_n = 0`` of docs/design.md §3)."""
    m = mask.to(torch.bool)
    t = m.shape[1]
    index = torch.where(m, torch.arange(t, device=m.device), t)
    # the first valid index strictly after each position: a suffix minimum, shifted by one
    after = torch.cat([index[:, 1:], torch.full_like(index[:, :1], t)], dim=1)
    following = after.flip(1).cummin(1).values.flip(1)
    picked = values.gather(1, following.clamp(max=t - 1))
    return torch.where(following < t, picked, torch.zeros_like(picked))


def trace_only_rewards(
    rewards: torch.Tensor, values: torch.Tensor, gates: torch.Tensor, mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """``r_i + γ·(1 − g_i)·V_{i+1}`` on valid positions (``V_{i+1}``: :func:`next_values`), so
    that Comp-GAE's gated bootstrap ``r'_i + γ·g_i·V_{i+1} − V_i`` is the plain
    ``r_i + γ·V_{i+1} − V_i`` while its trace keeps ``γ·λ·g_i``; ``[B, T]``, new tensor."""
    shift = gamma * (1.0 - gates) * next_values(values, mask)
    return rewards + torch.where(mask.to(torch.bool), shift, torch.zeros_like(shift))


def compute_advantages(
    arm: Arm,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None,
    gates: torch.Tensor | None,
    groups: torch.Tensor,
    settings: AdvantageSettings,
    rows: Rows = LOCAL,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``(advantages, returns, global advantages)`` of this process's rows.

    Critic arms (docs/design.md §3): ``A, R = cc.gae(rewards, values, gates, γ, λ, λ_critic)``
    per row (``gates`` None: plain GAE), then ``A`` whitened over the global batch
    (``cc.masked_whiten``, verl) when ``settings.whiten``.

    ``settings.gate_in_bootstrap=False`` (an ablation) keeps the gates in the trace only::

        δ_i = r_i + γ·V_{i+1} − V_i,   A_i = δ_i + γ·λ·g_i·A_{i+1}

    a state-dependent λ (Sutton & Barto 2018, §12.8): the critic's expected target is the
    undiscounted value whatever the gates, and the gates only decide how far back each
    δ travels. It runs through the same kernel on shifted rewards
    ``r_i + γ·(1 − g_i)·V_{i+1}`` (:func:`trace_only_rewards`), in float64.

    ``grpo``: the outcome
    ``Σ_t r_t`` of each row, ``cc.group_advantages(outcome, groups, method)`` over the
    global batch, broadcast to the response tokens; ``returns`` is None."""
    all_m = rows.gather(response_mask)
    returns = None
    if arm.uses_gae:
        if values is None:
            raise ParameterError(f"values: the {arm.name} arm's advantages need the critic's values", argument="values")
        dtype = values.dtype
        if gates is not None and not settings.gate_in_bootstrap:
            values, gates = values.double(), gates.double()
            rewards = trace_only_rewards(rewards.double(), values, gates, response_mask, settings.gamma)
        # GAE is a recursion along each row: this process's rows alone
        result = gae(
            rewards,
            values,
            mask=response_mask,
            gates=gates,
            gamma=settings.gamma,
            lam=settings.lam,
            lam_critic=settings.lam_critic,
        )
        # tensors in, tensors out (as_tensor: for the type checker)
        adv = torch.as_tensor(result.advantages).to(dtype)
        all_adv = rows.gather(adv)
        if settings.whiten:
            all_adv = torch.as_tensor(masked_whiten(all_adv, mask=all_m))
            adv = all_adv[rows.local]
        returns = torch.as_tensor(result.returns).to(dtype)
    else:
        outcome = rows.gather(rewards.double().sum(-1))
        seq = torch.as_tensor(group_advantages(outcome, rows.gather(groups), method=settings.group_method))
        adv = torch.as_tensor(broadcast(seq[rows.local].float(), mask=response_mask))
        all_adv = rows.gather(adv)
    return adv, returns, all_adv


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """The float64 mean of ``x`` over ``mask`` (NaN when the mask is empty)."""
    m = mask.to(torch.bool)
    return float(x[m].double().mean()) if bool(m.any()) else math.nan


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float | None:
    """``1 − Var(R − V)/Var(R)`` over the response tokens (population variances); None when
    Var(R) <= 1e-10 (e.g. a batch without reward, whose returns are 0 up to rounding)."""
    m = mask.to(torch.bool)
    r, v = returns[m].double(), values[m].double()
    var_r = float(r.var(unbiased=False)) if r.numel() else 0.0
    if var_r <= 1e-10:
        return None
    return 1.0 - float((r - v).var(unbiased=False)) / var_r


def advantage_statistics(
    batch: Batch, kl: torch.Tensor | None, all_advantages: torch.Tensor, rows: Rows = LOCAL
) -> dict[str, Any]:
    """Phase 3's metrics over the global batch: the mean KL to the reference, the
    advantages' Gini and effective token ratio (``cc.credit_stats``), the critic's
    explained variance and the gates' mean, min and max over the response tokens."""
    all_m = rows.gather(batch.response_mask)
    credit = credit_stats(all_advantages, mask=all_m)
    explained = None
    if batch.returns is not None and batch.old_values is not None:
        explained = explained_variance(rows.gather(batch.old_values), rows.gather(batch.returns), all_m)
    stats: dict[str, Any] = {
        "kl": None if kl is None else masked_mean(rows.gather(kl), all_m),
        "adv_gini": credit["gini"],
        "adv_effective_token_ratio": credit["effective_token_ratio"],
        "value_explained_var": explained,
    }
    stats.update(gate_mean=None, gate_min=None, gate_max=None)
    if batch.gates is not None:
        gv = rows.gather(batch.gates)[all_m]
        stats.update(gate_mean=float(gv.double().mean()), gate_min=float(gv.min()), gate_max=float(gv.max()))
    return stats


# ---------------------------------------------------------------------------------------------------------
# phase 4: the loss of one minibatch


def loss_shares(tokens: torch.Tensor, index: torch.Tensor, mine: torch.Tensor, agg: str) -> tuple[float, float]:
    """``(loss share, token share)`` of this process in a minibatch of global rows ``index``
    (its own: ``mine``), given every global row's response-token count ``tokens``: its part
    of the minibatch's denominator (tokens for token-mean, non-empty rows for the three
    seq-mean modes: seq-mean-token-sum-norm's horizon L is the same budget on every
    process) and of its tokens. Both 1 on one process."""
    t_all, t_mine = tokens[index], tokens[mine]
    n_all, n_mine = int(t_all.sum()), int(t_mine.sum())
    token_share = n_mine / n_all if n_all else 0.0
    if agg == "token-mean":
        return token_share, token_share
    s_all, s_mine = int((t_all > 0).sum()), int((t_mine > 0).sum())
    return (s_mine / s_all if s_all else 0.0), token_share


def minibatch_loss(
    mb: Batch,
    logprobs: torch.Tensor,
    values: torch.Tensor | None,
    settings: LossSettings,
    *,
    train_actor: bool,
    share: float = 1.0,
    token_share: float = 1.0,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The loss of one minibatch (this process's rows ``mb``, the update forward's
    ``logprobs`` and ``values``) and its statistics, each scaled by this process's shares::

        loss = share · (policy_loss [if train_actor] + kl_coef · KL [kl_mode="loss"]
                        + vf_coef · value_loss [a critic])

    with verl's definitions (:mod:`comppo_core.rl.core.losses`). Returns ``(None, stats)`` when
    nothing trains (no actor update and no critic)."""
    s = settings
    pg_loss, pg = losses.policy_loss(
        logprobs,
        mb.old_logprobs,
        mb.advantages,
        mb.response_mask,
        clip_low=s.clip_low,
        clip_high=s.clip_high,
        dual_clip=s.dual_clip,
        agg=s.agg,
        loss_scale_factor=s.loss_scale_factor,
    )
    entries = {
        "pg_loss": pg["pg_loss"] * share,
        "clipfrac": pg["clipfrac"] * token_share,
        "approx_kl": pg["approx_kl"] * token_share,
    }
    loss: torch.Tensor | None = None
    if train_actor:
        loss = pg_loss * share
    if s.kl_in_loss(train_actor):
        if mb.ref_logprobs is None or loss is None:
            raise ParameterError("ref_logprobs: the KL loss needs the reference's log-probs", argument="ref_logprobs")
        kl_loss = losses.aggregate(
            losses.kl_penalty(logprobs, mb.ref_logprobs, s.kl_kind),
            mb.response_mask,
            s.agg,
            loss_scale_factor=s.loss_scale_factor,
        )
        loss = loss + s.kl_coef * (kl_loss * share)
        entries["kl_loss"] = float(kl_loss.detach()) * share
    if values is not None:
        if mb.old_values is None or mb.returns is None:
            raise ParameterError(
                "old_values: the value loss needs the batch's old values and returns", argument="old_values"
            )
        vf_loss, vf = losses.value_loss(
            values,
            mb.old_values,
            mb.returns,
            mb.response_mask,
            clip=s.value_clip,
            agg=s.agg,
            loss_scale_factor=s.loss_scale_factor,
        )
        term = s.vf_coef * (vf_loss * share)
        loss = term if loss is None else loss + term
        entries.update(value_loss=vf["vf_loss"] * share, value_clipfrac=vf["clipfrac"] * token_share)
    return loss, entries
