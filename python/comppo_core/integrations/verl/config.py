"""The ``comppo`` block of the verl recipe's config: the arm, its gates, its TAC, and what it implies for verl.

A verl run of the recipe (``python -m comppo_core.integrations.verl.main_ppo``) has, next to
verl's own blocks, a top-level ``comppo`` block (defaults in
``integrations/verl/conf/comppo_trainer.yaml``)::

    comppo:
      arm: comppo                # grpo ppo ppo_fixed comp_gae tac_fixed comppo comppo_shuffle
                                 # comppo_position comppo_inverted (comppo_core.rl.core.arms)
      statistic: entropy         # the probe's attention statistic
      layers: null               # the probe's layers (null: all)
      gate:                      # GateParams: g = low + (high − low)·sigmoid(sharpness·z)
        low: 0.9
        high: 1.0
        sharpness: 1.0
        normalize: causal        # causal | sequence | none  (batch: only with causal=true)
        center: 0.0
        scale: 1.0
        min_spread: 0.0          # a floor on the z-score's spread (GateParams.min_spread)
        causal: false            # the running z-score per sequence over any normalize
      gate_direction: as_is      # as_is | inverted | none | a diagnosis.json
      fixed_gate: null           # tac_fixed / ppo_fixed: the constant gate (null: the batch mean)
      seed: 0                    # the controls' seed (shuffle: seed·1_000_003 + global step), the TAC's init seed
      lam_critic: 1.0            # λ of the returns (null: algorithm.lam)
      whiten: true               # whiten the advantages over the batch
      tac: {width: 64, temporal: none, trunk_grad: 0.0, taps: null}
      vf_coef: 0.5               # the TAC's value-loss weight in the actor's loss
      value_clip: 0.5            # the TAC's value clip (null: off)
      critic_lr: 1.0e-3          # the TAC's learning rate, as the package's (null: the actor's)

:func:`parse` turns it into a :class:`CompPOConfig` (a bad key or value is a
:class:`~comppo_core.errors.ParameterError` naming ``comppo.<key>``); an arm means what it
means in the package's trainer (:data:`comppo_core.rl.core.arms.ARMS`: its critic and its
gate source). :meth:`CompPOConfig.engine_settings` is what the actor's CompPO engine
computes; :meth:`CompPOConfig.verl_settings` the verl settings the arm implies, which
:func:`prepare_verl_config` applies to a verl config (refusing a contradiction).

Imports neither torch nor verl.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

from ...errors import ParameterError
from ...gate_params import GateParams
from ...options import ARM_NAMES, STATISTICS, TEMPORAL_MIXERS, check_choice
from ...rl.core.arms import ARMS, Arm

__all__ = [
    "RECIPE_ARMS",
    "TRAINER_MODE",
    "CompPOConfig",
    "GateConfig",
    "TACConfig",
    "parse",
    "prepare_verl_config",
]

#: ``trainer.v1.trainer_mode`` of the recipe's trainer (:mod:`~comppo_core.integrations.verl.trainer`)
TRAINER_MODE = "comppo"

#: The arms the recipe runs: every arm whose gates come from the concentration gates of the actor's
#: old-log-prob pass (or none). The oracle needs the task's pivotal marks and the policy-statistic arms
#: a gate mapping the engine does not compute; neither is available inside verl.
RECIPE_ARMS = tuple(a for a in ARM_NAMES if a not in ("comppo_oracle", "comppo_policy_entropy", "comppo_token_nll"))

_PREFIX = "comppo"


def _name(key: str) -> str:
    return f"{_PREFIX}.{key}"


def _number(key: str, value: Any, low: float = -math.inf, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ParameterError(f"{_name(key)}: expected a finite number, got {value!r}", argument=_name(key))
    if not low <= float(value) <= high:
        raise ParameterError(f"{_name(key)}: expected a number in [{low}, {high}], got {value!r}", argument=_name(key))
    return float(value)


def _optional_number(key: str, value: Any, low: float = -math.inf, high: float = math.inf) -> float | None:
    return None if value is None else _number(key, value, low, high)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ParameterError(f"{_name(key)}: expected true or false, got {value!r}", argument=_name(key))
    return value


def _integer(key: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < low:
        raise ParameterError(f"{_name(key)}: expected an integer >= {low}, got {value!r}", argument=_name(key))
    return int(value)


def _int_list(key: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ParameterError(
            f"{_name(key)}: expected a list of layer indices or null, got {value!r}", argument=_name(key)
        )
    items = list(value)
    if not items:
        raise ParameterError(
            f"{_name(key)}: expected at least one layer index (null: all), got []", argument=_name(key)
        )
    for i, v in enumerate(items):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ParameterError(
                f"{_name(key)}: expected integer layer indices, got {v!r} at index {i}", argument=_name(key)
            )
    return tuple(int(v) for v in items)


def _mapping(key: str, value: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    """``value`` as a plain dict whose keys are among ``fields`` (an unknown key names itself)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ParameterError(f"{_name(key)}: expected a mapping, got {type(value).__name__}", argument=_name(key))
    out = {str(k): v for k, v in value.items()}
    for k in out:
        if k not in fields:
            where = f"{key}.{k}" if key else k
            raise ParameterError(
                f"{_name(where)}: unknown key; expected one of {', '.join(fields)}", argument=_name(where)
            )
    return out


@dataclasses.dataclass(frozen=True)
class GateConfig:
    """``comppo.gate``: the concentration → gate mapping (:class:`comppo_core.GateParams`, whose defaults
    these are) and ``causal`` (:class:`~comppo_core.integrations.verl.engine.EngineSettings`)."""

    low: float = 0.9
    high: float = 1.0
    sharpness: float = 1.0
    normalize: str = "causal"
    center: float = 0.0
    scale: float = 1.0
    min_spread: float = 0.0
    causal: bool = False


@dataclasses.dataclass(frozen=True)
class TACConfig:
    """``comppo.tac``: :meth:`comppo_core.rl.TransportAlignedCritic.for_model`'s settings, as
    :class:`~comppo_core.rl.TrainConfig` names them (``tac_width``, ``tac_temporal``, ``trunk_grad``),
    with its defaults; ``taps`` None is the TAC's default (4 layers spread over depth)."""

    width: int = 64
    temporal: str = "none"
    trunk_grad: float = 0.0
    taps: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class CompPOConfig:
    """The ``comppo`` block, validated (module docstring). Build it with :func:`parse`."""

    arm: str = "comppo"
    statistic: str = "entropy"
    layers: tuple[int, ...] | None = None
    gate: GateConfig = dataclasses.field(default_factory=GateConfig)
    gate_direction: str = "as_is"
    fixed_gate: float | None = None
    seed: int = 0
    lam_critic: float | None = 1.0
    whiten: bool = True
    tac: TACConfig = dataclasses.field(default_factory=TACConfig)
    vf_coef: float = 0.5
    value_clip: float | None = 0.5
    critic_lr: float | None = 1e-3  # TrainConfig's and CompPOConfig's: a fresh TAC at the actor's lr barely moves

    def __post_init__(self) -> None:
        check_choice(_name("arm"), self.arm, RECIPE_ARMS)
        check_choice(_name("statistic"), self.statistic, STATISTICS)
        check_choice(_name("tac.temporal"), self.tac.temporal, TEMPORAL_MIXERS)
        _ = self.gate_params  # the mapping's own checks, named as this block's keys
        _ = self.engine_settings_kwargs()  # e.g. normalize='batch' without causal

    # ---- derived

    @property
    def spec(self) -> Arm:
        """The arm (:data:`comppo_core.rl.core.arms.ARMS`)."""
        return ARMS[self.arm]

    @property
    def direction(self) -> str:
        """The direction the arm's gates use (``gate_direction``, or a diagnosis's recommendation:
        :func:`comppo_core.rl.gate_direction.recommended_direction`)."""
        from ...rl.gate_direction import recommended_direction

        try:
            return recommended_direction(self.gate_direction, self.arm, self.statistic)
        except ParameterError as exc:
            message = str(exc).removeprefix("gate_direction: ")
            raise ParameterError(f"{_name('gate_direction')}: {message}", argument=_name("gate_direction")) from None

    @property
    def gate_params(self) -> GateParams:
        """The concentration → gate mapping (``comppo.gate``, ``invert`` from the direction)."""
        g = self.gate
        invert = self.direction == "inverted"
        try:
            return GateParams(
                low=g.low,
                high=g.high,
                sharpness=g.sharpness,
                normalize=g.normalize,
                center=g.center,
                scale=g.scale,
                invert=invert,
                min_spread=g.min_spread,
            )
        except ParameterError as exc:
            key = f"gate.{exc.argument}"
            message = str(exc).removeprefix(f"{exc.argument}: ")
            raise ParameterError(f"{_name(key)}: {message}", argument=_name(key)) from None

    @property
    def probe_old_log_prob(self) -> bool:
        """Whether the actor's old-log-prob pass runs the probe (gates, or the TAC's values)."""
        return self.spec.reads_routing

    @property
    def probe_update(self) -> bool:
        """Whether the actor's update runs the probe (the TAC reads the routing and trains)."""
        return self.spec.critic_reads_routing

    @property
    def has_tac(self) -> bool:
        """Whether the actor's engine carries a TAC (the arm's critic is ``"tac"``)."""
        return self.spec.critic == "tac"

    def engine_settings_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~comppo_core.integrations.verl.engine.EngineSettings`."""
        tac: dict[str, Any] | None = None
        if self.has_tac:
            tac = {"width": self.tac.width, "temporal": self.tac.temporal, "trunk_grad": self.tac.trunk_grad}
            if self.tac.taps is not None:
                tac["taps"] = self.tac.taps
            if self.layers is not None:
                tac["routing_layers"] = len(self.layers)
        params = self.gate_params
        if params.normalize == "batch" and not self.gate.causal:
            raise ParameterError(
                f"{_name('gate.normalize')}: 'batch' z-scores the whole batch, but the actor's engine computes the "
                "gates one micro-batch at a time; use 'causal' or 'sequence', or comppo.gate.causal=true",
                argument=_name("gate.normalize"),
            )
        kwargs: dict[str, Any] = {
            "tac": tac,
            "gate_params": params,
            "causal": self.gate.causal,
            "statistic": self.statistic,
            "layers": None if self.layers is None else list(self.layers),
        }
        if self.has_tac:
            kwargs["critic_lr"] = self.critic_lr
            kwargs["tac_seed"] = self.seed
        return kwargs

    def engine_settings(self) -> Any:
        """:class:`~comppo_core.integrations.verl.engine.EngineSettings` of the actor's engine."""
        from .engine import EngineSettings

        return EngineSettings(**self.engine_settings_kwargs())

    def verl_settings(self) -> dict[str, Any]:
        """The verl settings the arm implies, by dotted key: the advantage estimator verl's own
        machinery sees (``grpo`` for the grpo arm, ``gae`` for every critic arm: the recipe's trainer
        computes their advantages), whether verl's critic worker runs (the standard-critic arms), the
        trainer mode and the v1 trainer."""
        return {
            "algorithm.adv_estimator": "gae" if self.spec.uses_gae else "grpo",
            "critic.enable": self.spec.critic == "standard",
            "trainer.use_v1": True,
            "trainer.v1.trainer_mode": TRAINER_MODE,
        }

    def as_dict(self) -> dict[str, Any]:
        """The block as plain data (what :func:`parse` reads back to an equal config)."""
        out = dataclasses.asdict(self)
        for key in ("layers",):
            out[key] = None if out[key] is None else list(out[key])
        out["tac"]["taps"] = None if out["tac"]["taps"] is None else list(out["tac"]["taps"])
        return out


_TOP = tuple(f.name for f in dataclasses.fields(CompPOConfig))
_GATE = tuple(f.name for f in dataclasses.fields(GateConfig))
_TAC = tuple(f.name for f in dataclasses.fields(TACConfig))


def parse(block: Any) -> CompPOConfig:
    """The ``comppo`` block (a mapping, an OmegaConf ``DictConfig``, None for the defaults) as a
    validated :class:`CompPOConfig`. Missing keys take their defaults; an unknown key or a bad value
    is a :class:`~comppo_core.errors.ParameterError` naming ``comppo.<key>``."""
    if isinstance(block, CompPOConfig):
        return block
    block = _to_container(block)
    top = _mapping("", block, _TOP)
    gate = _mapping("gate", top.pop("gate", None), _GATE)
    tac = _mapping("tac", top.pop("tac", None), _TAC)
    g_default, t_default, c_default = GateConfig(), TACConfig(), CompPOConfig.__dataclass_fields__
    normalize = gate.get("normalize", g_default.normalize)
    if not isinstance(normalize, str):
        raise ParameterError(
            f"{_name('gate.normalize')}: expected a string, got {normalize!r}", argument=_name("gate.normalize")
        )
    gate_config = GateConfig(
        low=_number("gate.low", gate.get("low", g_default.low), 0.0, 1.0),
        high=_number("gate.high", gate.get("high", g_default.high), 0.0, 1.0),
        sharpness=_number("gate.sharpness", gate.get("sharpness", g_default.sharpness)),
        normalize=normalize,
        center=_number("gate.center", gate.get("center", g_default.center)),
        scale=_number("gate.scale", gate.get("scale", g_default.scale)),
        min_spread=_number("gate.min_spread", gate.get("min_spread", g_default.min_spread), 0.0),
        causal=_bool("gate.causal", gate.get("causal", g_default.causal)),
    )
    temporal = tac.get("temporal", t_default.temporal)
    tac_config = TACConfig(
        width=_integer("tac.width", tac.get("width", t_default.width), 1),
        temporal=temporal,
        trunk_grad=_number("tac.trunk_grad", tac.get("trunk_grad", t_default.trunk_grad), 0.0, 1.0),
        taps=_int_list("tac.taps", tac.get("taps", t_default.taps)),
    )

    def get(key: str) -> Any:
        return top.get(key, c_default[key].default)

    direction = get("gate_direction")
    if not isinstance(direction, str) or not direction.strip():
        raise ParameterError(
            f"{_name('gate_direction')}: expected as_is, inverted, none or the path of a diagnosis.json, got "
            f"{direction!r}",
            argument=_name("gate_direction"),
        )
    critic_lr = get("critic_lr")
    if critic_lr is not None:
        critic_lr = _number("critic_lr", critic_lr, 0.0)
        if critic_lr <= 0.0:
            raise ParameterError(
                f"{_name('critic_lr')}: expected a number > 0 or null, got {critic_lr!r}", argument=_name("critic_lr")
            )
    return CompPOConfig(
        arm=get("arm"),
        statistic=get("statistic"),
        layers=_int_list("layers", get("layers")),
        gate=gate_config,
        gate_direction=direction,
        fixed_gate=_optional_number("fixed_gate", get("fixed_gate"), 0.0, 1.0),
        seed=_integer("seed", get("seed"), 0),
        lam_critic=_optional_number("lam_critic", get("lam_critic"), 0.0, 1.0),
        whiten=_bool("whiten", get("whiten")),
        tac=tac_config,
        vf_coef=_number("vf_coef", get("vf_coef"), 0.0),
        value_clip=_optional_number("value_clip", get("value_clip"), 0.0),
        critic_lr=critic_lr,
    )


def _to_container(block: Any) -> Any:
    """An OmegaConf config as plain Python data (anything else as it is)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf  # type: ignore[import-not-found, unused-ignore]
    except ImportError:  # pragma: no cover - verl brings omegaconf
        return block
    if isinstance(block, (DictConfig, ListConfig)):
        return OmegaConf.to_container(block, resolve=True)
    return block


#: What the recipe's yaml sets ``algorithm.adv_estimator`` to: "decided by comppo.arm".
ARM_DECIDES = "comppo"


def prepare_verl_config(config: Any) -> CompPOConfig:
    """Validates ``config.comppo`` (an OmegaConf verl config), applies the verl settings its arm implies
    (:meth:`CompPOConfig.verl_settings`), copies the block into ``config.actor_rollout_ref.comppo`` (the
    actor's worker is built from ``actor_rollout_ref``) and returns it. Idempotent.

    A setting the user gave that contradicts the arm is a :class:`~comppo_core.errors.ParameterError`
    naming the verl key: ``algorithm.adv_estimator`` other than the arm's (``comppo`` in the recipe's
    yaml: the arm decides; ``comp_gae`` is accepted for a gated critic arm), ``critic.enable`` set
    against the arm's critic, ``trainer.v1.trainer_mode`` or ``trainer.use_v1`` other than the
    recipe's, and for the arms whose actor runs the probe: ``actor_rollout_ref.model.use_remove_padding``
    False (the engine computes gates on packed rows), the rollout-correction bypass mode (no
    old-log-prob pass: no gates), distillation with a TAC (its loss would replace the TAC's), and a
    critic warm-up with a TAC (verl skips the actor's update then, so the TAC would not train), and
    PF-PPO (``algorithm.use_pf_ppo``) for a critic arm (it reweights inside verl's GAE path). A
    ``gate_direction`` naming a diagnosis.json is replaced by the direction it recommends for the
    arm (the file is read here, in the driver, not in every worker)."""
    from omegaconf import OmegaConf, open_dict  # type: ignore[import-not-found, unused-ignore]

    comppo = parse(config.get("comppo", None))
    implied = comppo.verl_settings()

    estimator = OmegaConf.select(config, "algorithm.adv_estimator")
    wanted = implied["algorithm.adv_estimator"]
    accepted = {ARM_DECIDES, wanted} | (
        {"comp_gae"} if comppo.spec.uses_gae and comppo.spec.gate_source.gated else set()
    )
    if estimator not in accepted:
        raise ParameterError(
            f"algorithm.adv_estimator: the comppo.arm={comppo.arm} arm computes its advantages as {wanted!r} "
            f"(expected one of {', '.join(map(repr, sorted(accepted)))}), got {estimator!r}; set comppo.arm instead",
            argument="algorithm.adv_estimator",
        )
    enable = OmegaConf.select(config, "critic.enable")
    if enable is not None and bool(enable) != implied["critic.enable"]:
        critic = comppo.spec.critic
        what = "verl's critic worker" if critic == "standard" else ("the TAC in the actor" if critic else "no critic")
        raise ParameterError(
            f"critic.enable: the comppo.arm={comppo.arm} arm's critic is {what}, so critic.enable is "
            f"{implied['critic.enable']}; got {enable!r}",
            argument="critic.enable",
        )
    use_v1 = OmegaConf.select(config, "trainer.use_v1")
    if use_v1 is not None and not use_v1:
        raise ParameterError(
            "trainer.use_v1: the recipe's trainer is a v1 trainer; expected true, got false", argument="trainer.use_v1"
        )
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode")
    if mode not in (None, TRAINER_MODE):
        raise ParameterError(
            f"trainer.v1.trainer_mode: a config with a comppo block runs the recipe's trainer; expected "
            f"{TRAINER_MODE!r}, got {mode!r}",
            argument="trainer.v1.trainer_mode",
        )
    if comppo.probe_old_log_prob:
        if OmegaConf.select(config, "actor_rollout_ref.model.use_remove_padding") is False:
            raise ParameterError(
                f"actor_rollout_ref.model.use_remove_padding: the comppo.arm={comppo.arm} arm's gates and values "
                "are computed on verl's packed rows; expected true, got false",
                argument="actor_rollout_ref.model.use_remove_padding",
            )
        if OmegaConf.select(config, "algorithm.rollout_correction.bypass_mode"):
            raise ParameterError(
                f"algorithm.rollout_correction.bypass_mode: the comppo.arm={comppo.arm} arm's gates come from the "
                "actor's old-log-prob pass, which bypass mode skips; expected false, got true",
                argument="algorithm.rollout_correction.bypass_mode",
            )
    if comppo.has_tac and OmegaConf.select(config, "distillation.enabled"):
        raise ParameterError(
            f"distillation.enabled: the comppo.arm={comppo.arm} arm trains a TAC in the actor's loss, which "
            "distillation's loss replaces; expected false, got true",
            argument="distillation.enabled",
        )
    if comppo.spec.critic and OmegaConf.select(config, "algorithm.use_pf_ppo"):
        raise ParameterError(
            f"algorithm.use_pf_ppo: the comppo.arm={comppo.arm} arm's advantages are the recipe's, which verl's "
            "PF-PPO reweighting (part of verl's GAE path) does not see; expected false, got true",
            argument="algorithm.use_pf_ppo",
        )
    warmup = OmegaConf.select(config, "trainer.critic_warmup")
    if comppo.has_tac and warmup:
        raise ParameterError(
            f"trainer.critic_warmup: the comppo.arm={comppo.arm} arm's TAC trains in the actor's update, which "
            f"verl skips during the critic warm-up (nothing would train); expected 0, got {warmup!r}",
            argument="trainer.critic_warmup",
        )
    # A diagnosis.json is read here, once, and its direction is what the workers get: they run in
    # other processes (other nodes, other working directories), where the path may not resolve.
    block = comppo.as_dict()
    block["gate_direction"] = comppo.direction
    with open_dict(config):
        for key, value in implied.items():
            OmegaConf.update(config, key, value, force_add=True)
        config.comppo = block
        config.actor_rollout_ref.comppo = block
    return parse(block)
