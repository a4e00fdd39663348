"""``CompPOConfig``: TRL's ``GRPOConfig`` plus the arm and the CompPO settings.

The fields added to ``GRPOConfig`` (each named as in :class:`comppo_core.rl.TrainConfig`):

``arm``                 ``grpo`` (plain GRPO: the trainer is then exactly ``GRPOTrainer``) or
                        any arm of :data:`comppo_core.rl.core.arms.ARMS` with a critic: the TAC
                        (``comppo``, ``tac_fixed``, the controls) or the standard critic, a value
                        model (``ppo``, ``ppo_fixed``, ``comp_gae``; :mod:`.value_model`)
``critic_warmup``       rounds of critic-only training before the first PPO step (None: the
                        package trainer's default for an arm with a critic; :mod:`.warmup`)
``gamma, lam, lam_critic``  Comp-GAE's γ, the actor's λ and the returns' λ (decoupled GAE)
``gate_params``         the concentration → gate mapping, one :class:`~comppo_core.GateParams`
``gate_direction``      its direction, as ``TrainConfig.gate_direction``: ``as_is``, ``inverted``,
                        ``none`` (an arm whose gates have no direction) or the path of a
                        diagnosis.json (recorded as ``PATH#sha256=HEX``; the trainer refuses a
                        diagnosis of another task than its reward function's:
                        :mod:`comppo_core.rl.gate_direction`); the gates map with
                        :attr:`CompPOConfig.applied_gate_params`
``fixed_gate``          the constant gate of ``tac_fixed`` and ``ppo_fixed`` (None: the batch mean of the gates)
``statistic``           the probe's attention-concentration statistic
``gate_causal``         Comp-GAE's gates from the running z-score of the row, tokens up to t
                        (the default; False: the whole row's z-score)
``gate_in_bootstrap``   the gates enter Comp-GAE's bootstrap as well as its trace (False: the
                        trace only, an ablation)
``whiten_advantages``   whiten the advantages over the global batch (verl's GAE)
``tac_width, tac_temporal, critic_lr, trunk_grad``  the transport-aligned critic
``value_clip, vf_coef`` the value loss's clip ε and weight
``dual_clip``           verl's dual-clip constant c > 1 (None: off; TRL has none)
``loss_agg``            the loss aggregation (verl's ``loss_agg_mode``) of the policy,
                        KL and value terms, over the optimiser step's whole batch

TRL's own fields keep their meaning: ``epsilon`` / ``epsilon_high`` are the PPO clip
(``clip_low`` / ``clip_high``), ``beta`` the KL to the reference (the k3 estimator, as a
loss term: ``kl_coef = beta, kl_kind = "k3", kl_mode = "loss"``), ``temperature`` the τ
of every log-prob, ``num_iterations`` the PPO epochs and ``steps_per_generation /
gradient_accumulation_steps`` the minibatches per generation. :func:`unsupported` names
the TRL settings a CompPO arm refuses (docs/trl.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trl.trainer.grpo_config import GRPOConfig

from ...errors import ParameterError
from ...gate_params import GateParams
from ...options import AGG_MODES, ARM_NAMES, STATISTICS, TEMPORAL_MIXERS, check_choice
from ...rl.config import DEFAULT_CRITIC_WARMUP
from ...rl.core.arms import ARMS
from ...rl.gate_direction import (
    DEFAULT_GATE_DIRECTION,
    checked_gate_direction,
    direction_of_gate_invert,
    given_gate_direction,
    recommended_direction,
)

__all__ = ["ARM_CHOICES", "CompPOConfig", "critic_arms", "tac_arms", "unsupported"]


def tac_arms() -> tuple[str, ...]:
    """The arms of :data:`~comppo_core.rl.core.arms.ARMS` whose critic is the TAC, in registry order."""
    return tuple(name for name, arm in ARMS.items() if arm.critic == "tac")


def critic_arms() -> tuple[str, ...]:
    """Every arm with a critic, standard or TAC, in registry order."""
    return tuple(name for name, arm in ARMS.items() if arm.critic is not None)


#: What ``CompPOConfig.arm`` accepts: every arm (:data:`comppo_core.options.ARM_NAMES`), that
#: is plain GRPO and every arm with a critic (the paper's 2×2 ``ppo_fixed``, ``comp_gae``,
#: ``tac_fixed``, ``comppo``; ``ppo``; the gate controls; the uncertainty baselines; the
#: diagnostic ``comppo_oracle``, which needs a task's reward function among ``reward_funcs``:
#: :func:`~comppo_core.integrations.trl.tasks.pivotal_task`).
ARM_CHOICES: tuple[str, ...] = ARM_NAMES

#: TRL's loss types that are not the PPO clip objective (a CompPO arm's loss is verl's).
_OTHER_OBJECTIVES = ("cispo", "sapo", "vespo", "luspo")


@dataclasses.dataclass
class CompPOConfig(GRPOConfig):  # type: ignore[misc]  # trl ships no type hints
    """``GRPOConfig`` with the CompPO arm and its settings (module docstring)."""

    arm: str = dataclasses.field(
        default="comppo", metadata={"help": f"grpo (plain GRPO) or an arm with a critic: {', '.join(critic_arms())}"}
    )
    critic_warmup: int | None = dataclasses.field(
        default=None,
        metadata={
            "help": "rounds of critic-only training on rollouts of the initial policy before the first PPO step "
            f"(None: {DEFAULT_CRITIC_WARMUP} for an arm with a critic, 0 for grpo)"
        },
    )
    gamma: float = dataclasses.field(default=1.0, metadata={"help": "discount γ of Comp-GAE"})
    lam: float = dataclasses.field(default=0.95, metadata={"help": "GAE λ of the actor's advantages"})
    lam_critic: float | None = dataclasses.field(
        default=1.0, metadata={"help": "λ of the critic's returns (decoupled GAE; None: lam)"}
    )
    gate_params: GateParams = dataclasses.field(
        # the whole-row z-score, which gate_causal=True replaces by the running one: so
        # gate_causal=False means the whole row's, as the trainer's TrainConfig does
        default_factory=lambda: GateParams(normalize="sequence"),
        metadata={
            "help": "concentration → gate mapping (comppo_core.GateParams; normalize='sequence', which "
            "gate_causal=True replaces by the running z-score)"
        },
    )
    gate_direction: str = dataclasses.field(
        default=DEFAULT_GATE_DIRECTION,
        metadata={
            "help": "the gate mapping's direction, as TrainConfig.gate_direction: as_is, inverted (the mirror image; "
            "gate_params.invert=True says the same), none (only for an arm whose gates have no direction), or the "
            "path of a diagnosis.json (comppo-core diagnose) of the trainer's task whose recommended direction for "
            "the arm's gates is applied (the direction only; recorded with the file's SHA-256)"
        },
    )
    fixed_gate: float | None = dataclasses.field(
        default=None,
        metadata={
            "help": "the constant gate of tac_fixed and ppo_fixed (None: the batch mean of the concentration gates)"
        },
    )
    gate_causal: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "Comp-GAE's gates from the row's running z-score of the concentration (tokens up to t; False: the whole row's)"
        },
    )
    gate_in_bootstrap: bool = dataclasses.field(
        default=True,
        metadata={"help": "the gates enter Comp-GAE's bootstrap as well as its trace (False: the trace only)"},
    )
    statistic: str = dataclasses.field(
        default="entropy", metadata={"help": f"attention concentration statistic ({', '.join(STATISTICS)})"}
    )
    whiten_advantages: bool = dataclasses.field(
        default=True, metadata={"help": "whiten the advantages over the global batch (verl's GAE)"}
    )
    tac_width: int = dataclasses.field(default=64, metadata={"help": "width of the transport-aligned critic"})
    tac_temporal: str = dataclasses.field(
        default="none", metadata={"help": f"TAC's causal mixer ({', '.join(TEMPORAL_MIXERS)})"}
    )
    critic_lr: float = dataclasses.field(default=1e-3, metadata={"help": "learning rate of the critic's AdamW"})
    trunk_grad: float = dataclasses.field(
        default=0.0, metadata={"help": "fraction of the value gradient TAC lets into the actor's hidden states"}
    )
    value_clip: float | None = dataclasses.field(
        default=0.5, metadata={"help": "value clip ε (verl cliprange_value; None: off)"}
    )
    vf_coef: float = dataclasses.field(default=0.5, metadata={"help": "weight of the value loss"})
    dual_clip: float | None = dataclasses.field(
        default=None, metadata={"help": "dual-clip constant c > 1 (verl clip_ratio_c; None: off)"}
    )
    loss_agg: str = dataclasses.field(
        default="token-mean", metadata={"help": f"loss aggregation ({', '.join(AGG_MODES)})"}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("arm", self.arm, ARM_CHOICES)
        check_choice("statistic", self.statistic, STATISTICS)
        check_choice("tac_temporal", self.tac_temporal, TEMPORAL_MIXERS)
        check_choice("loss_agg", self.loss_agg, AGG_MODES)
        if isinstance(self.gate_params, dict):  # a config read back from JSON (to_dict writes a dict)
            self.gate_params = GateParams(**self.gate_params)
        if not isinstance(self.gate_params, GateParams):
            raise ParameterError(
                f"gate_params: expected a comppo_core.GateParams, got {type(self.gate_params).__name__}",
                argument="gate_params",
            )
        self.gate_direction = checked_gate_direction(self.gate_direction)  # a diagnosis: pinned by its hash
        if self.gate_params.invert:  # GateParams.invert is the switch gate_direction names: "inverted"
            self.gate_direction = direction_of_gate_invert(
                True,
                given_gate_direction(self.gate_direction),
                argument="gate_params",
                shown="invert=",
                instead="GateParams.invert is the switch gate_direction names: give gate_direction alone, with "
                "GateParams(invert=False)",
            )
        _ = self.applied_gate_direction  # the diagnosis's recommendation for this arm, or a ParameterError
        for name in ("gamma", "lam"):
            _unit(name, getattr(self, name))
        if self.lam_critic is not None:
            _unit("lam_critic", self.lam_critic)
        if self.fixed_gate is not None:
            _unit("fixed_gate", self.fixed_gate)
        _unit("trunk_grad", self.trunk_grad)
        if not isinstance(self.tac_width, int) or self.tac_width < 1:
            raise ParameterError(f"tac_width: expected an integer >= 1, got {self.tac_width!r}", argument="tac_width")
        for name in ("critic_lr", "vf_coef"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value >= 0.0:
                raise ParameterError(f"{name}: expected a number >= 0, got {value!r}", argument=name)
        if self.critic_warmup is not None and (
            isinstance(self.critic_warmup, bool) or not isinstance(self.critic_warmup, int) or self.critic_warmup < 0
        ):
            raise ParameterError(
                f"critic_warmup: expected None or an integer >= 0, got {self.critic_warmup!r}", argument="critic_warmup"
            )
        if ARMS[self.arm].critic is None and self.critic_warmup:
            raise ParameterError(
                f"critic_warmup: expected 0 for the {self.arm} arm, which has no critic, got {self.critic_warmup}",
                argument="critic_warmup",
            )
        if self.value_clip is not None and not self.value_clip > 0.0:
            raise ParameterError(f"value_clip: expected None or > 0, got {self.value_clip!r}", argument="value_clip")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ParameterError(f"dual_clip: expected None or > 1, got {self.dual_clip!r}", argument="dual_clip")

    @property
    def applied_gate_direction(self) -> str:
        """The direction the arm's gates use: ``gate_direction``, or the recommendation of the
        diagnosis.json it names for this arm's gate source and ``statistic``
        (:func:`comppo_core.rl.gate_direction.recommended_direction`, as ``TrainConfig``'s)."""
        key = (self.gate_direction, self.arm, self.statistic)
        cached = self.__dict__.get("_applied_gate_direction")
        if cached is not None and cached[0] == key:
            return str(cached[1])
        direction = recommended_direction(self.gate_direction, self.arm, self.statistic)
        self.__dict__["_applied_gate_direction"] = (key, direction)
        return direction

    @property
    def applied_gate_params(self) -> GateParams:
        """The mapping the trainer's gates use: ``gate_params`` with ``invert`` set by
        :attr:`applied_gate_direction` (``"inverted"``: True), as ``TrainConfig.gate_params``."""
        return dataclasses.replace(self.gate_params, invert=self.applied_gate_direction == "inverted")

    @property
    def critic_warmup_rounds(self) -> int:
        """The warm-up rounds this config means (``critic_warmup``, its None resolved)."""
        if ARMS[self.arm].critic is None:
            return 0
        return DEFAULT_CRITIC_WARMUP if self.critic_warmup is None else int(self.critic_warmup)

    def to_dict(self) -> dict[str, Any]:
        """TRL's dict (what ``report_to`` logs), with ``gate_params`` as a plain dict."""
        d: dict[str, Any] = super().to_dict()
        d["gate_params"] = dataclasses.asdict(self.gate_params)
        return d


def _unit(name: str, value: Any) -> None:
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ParameterError(f"{name}: expected a number in [0, 1], got {value!r}", argument=name)


def unsupported(args: Any, *, tools: Any = None, environment_factory: Any = None) -> list[tuple[str, str]]:
    """``(option, why)`` for each TRL setting a CompPO arm with a critic cannot honour (docs/trl.md)."""
    out: list[tuple[str, str]] = []
    if getattr(args, "use_liger_kernel", False):
        out.append(("use_liger_kernel", "Liger's fused GRPO loss computes its own loss; the arm's is verl's"))
    if args.importance_sampling_level != "token":
        out.append(("importance_sampling_level", "sequence-level importance sampling is not PPO's token-level ratio"))
    if args.loss_type in _OTHER_OBJECTIVES:
        out.append(("loss_type", f"{args.loss_type!r} is another objective; the arm's loss is the PPO clip loss"))
    if args.delta is not None:
        out.append(("delta", "the two-sided ratio cap is not part of the arm's clip loss (dual_clip is)"))
    if args.top_entropy_quantile < 1.0:
        out.append(("top_entropy_quantile", "entropy masking of the policy loss is not part of the arm's loss"))
    if args.off_policy_mask_threshold is not None:
        out.append(("off_policy_mask_threshold", "off-policy sequence masking is not part of the arm's loss"))
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        out.append(("entropy_coef", "an entropy bonus is not part of the arm's loss"))
    if args.use_vllm and args.vllm_mode == "server":
        out.append(("vllm_mode", "vLLM server mode is not supported (use vllm_mode='colocate')"))
    if args.use_vllm and args.vllm_importance_sampling_correction:
        out.append(
            (
                "vllm_importance_sampling_correction",
                "the arm re-scores every rollout with the training model; set it to False",
            )
        )
    if args.steps_per_generation % args.gradient_accumulation_steps:
        out.append(
            (
                "steps_per_generation",
                f"expected a multiple of gradient_accumulation_steps={args.gradient_accumulation_steps} (one "
                f"optimiser step is one PPO minibatch of a generation), got {args.steps_per_generation}",
            )
        )
    if args.multi_objective_aggregation != "sum_then_normalize":
        out.append(("multi_objective_aggregation", "the arm's score is the weighted sum of the raw rewards"))
    parallel = getattr(args, "parallelism_config", None)
    for size in ("cp_size", "sp_size", "tp_size"):
        if parallel is not None and (getattr(parallel, size, None) or 1) > 1:
            kind = {"cp_size": "context", "sp_size": "sequence", "tp_size": "tensor"}[size]
            out.append((f"parallelism_config.{size}", f"{kind} parallelism splits the rows the probe and TAC read"))
    if tools:
        out.append(("tools", "multi-turn tool calls put non-policy tokens inside the response"))
    if environment_factory is not None:
        out.append(("environment_factory", "environments put non-policy tokens inside the response"))
    return out
