"""The verl recipe's ``comppo`` block (comppo_core.integrations.verl.config) and its Hydra config.

Parsing and validation (every error names ``comppo.<key>``), the mapping to the CompPO
engine's settings and to the verl settings an arm implies, the refusals of a verl config
that contradicts the arm, and the recipe's yaml composed with Hydra on top of verl's own
``ppo_trainer`` (then accepted by verl's own ``validate_config``). Skipped without verl.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from comppo_core import GateParams  # noqa: E402
from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.integrations.verl import config as recipe_config  # noqa: E402
from comppo_core.integrations.verl.config import RECIPE_ARMS, CompPOConfig, parse, prepare_verl_config  # noqa: E402
from comppo_core.integrations.verl.engine import EngineSettings  # noqa: E402
from comppo_core.integrations.verl.main_ppo import CONFIG_DIR, CONFIG_NAME  # noqa: E402
from comppo_core.rl.core.arms import ARMS  # noqa: E402


def test_defaults_are_the_packages() -> None:
    c = parse(None)
    assert c == CompPOConfig() == parse({})
    assert c.arm == "comppo" and c.statistic == "entropy" and c.gate_direction == "as_is"
    # the gate mapping's own defaults (GateParams(): causal normalisation), the TAC's as TrainConfig names them
    assert c.gate_params == GateParams()
    from comppo_core.rl import TrainConfig

    t = TrainConfig()
    assert (c.tac.width, c.tac.temporal, c.tac.trunk_grad) == (t.tac_width, t.tac_temporal, t.trunk_grad)
    assert (c.vf_coef, c.value_clip, c.lam_critic, c.whiten) == (t.vf_coef, t.value_clip, t.lam_critic, True)
    assert parse(c.as_dict()) == c


def test_the_yaml_defaults_equal_the_dataclass() -> None:
    raw = OmegaConf.load(Path(CONFIG_DIR) / f"{CONFIG_NAME}.yaml")
    assert parse(raw.comppo) == CompPOConfig()
    assert set(raw.comppo.keys()) == {f.name for f in dataclasses.fields(CompPOConfig)}
    assert set(raw.comppo.gate.keys()) == {f.name for f in dataclasses.fields(recipe_config.GateConfig)}
    assert set(raw.comppo.tac.keys()) == {f.name for f in dataclasses.fields(recipe_config.TACConfig)}


@pytest.mark.parametrize(
    ("block", "key"),
    [
        ({"arm": "comppo_oracle"}, "comppo.arm"),
        ({"arm": "nope"}, "comppo.arm"),
        ({"armm": "comppo"}, "comppo.armm"),
        ({"gate": {"loww": 0.5}}, "comppo.gate.loww"),
        ({"gate": {"low": 1.5}}, "comppo.gate.low"),
        ({"gate": {"low": 0.95, "high": 0.9}}, "comppo.gate.low"),
        ({"gate": {"normalize": "zscore"}}, "comppo.gate.normalize"),
        ({"gate": {"normalize": "batch"}}, "comppo.gate.normalize"),
        ({"gate": {"causal": "yes"}}, "comppo.gate.causal"),
        ({"gate": {"min_spread": -1.0}}, "comppo.gate.min_spread"),
        ({"statistic": "kurtosis"}, "comppo.statistic"),
        ({"layers": []}, "comppo.layers"),
        ({"layers": [0, 1.5]}, "comppo.layers"),
        ({"gate_direction": "sideways"}, "comppo.gate_direction"),
        ({"gate_direction": "none"}, "comppo.gate_direction"),
        ({"fixed_gate": 2.0}, "comppo.fixed_gate"),
        ({"seed": -1}, "comppo.seed"),
        ({"lam_critic": 1.5}, "comppo.lam_critic"),
        ({"whiten": 1}, "comppo.whiten"),
        ({"tac": {"width": 0}}, "comppo.tac.width"),
        ({"tac": {"temporal": "lstm"}}, "comppo.tac.temporal"),
        ({"tac": {"trunk_grad": 2.0}}, "comppo.tac.trunk_grad"),
        ({"tac": {"taps": "0,1"}}, "comppo.tac.taps"),
        ({"tac": {"depth": 2}}, "comppo.tac.depth"),
        ({"vf_coef": -0.1}, "comppo.vf_coef"),
        ({"value_clip": -0.5}, "comppo.value_clip"),
        ({"critic_lr": 0.0}, "comppo.critic_lr"),
        ({"gate": 3}, "comppo.gate"),
    ],
)
def test_bad_values_name_their_key(block: dict[str, Any], key: str) -> None:
    with pytest.raises(ParameterError) as info:
        parse(block)
    assert info.value.argument == key
    assert str(info.value).startswith(f"{key}:")


def test_gate_direction_none_is_allowed_for_a_constant_gate() -> None:
    # as the package: "none" refuses an arm whose gates have a direction, names the constant-gate arm
    with pytest.raises(ParameterError, match="tac_fixed"):
        parse({"arm": "comppo", "gate_direction": "none"})
    assert parse({"arm": "tac_fixed", "gate_direction": "none"}).direction == "none"
    assert parse({"arm": "comppo", "gate_direction": "inverted"}).gate_params.invert


@pytest.mark.parametrize("arm", RECIPE_ARMS)
def test_engine_settings_follow_the_arm(arm: str) -> None:
    c = parse(
        {
            "arm": arm,
            "statistic": "max",
            "layers": [0, 2],
            "gate": {"low": 0.5, "sharpness": 2.0, "normalize": "sequence", "causal": True},
            "tac": {"width": 16, "temporal": "gru", "taps": [0, 2], "trunk_grad": 0.25},
            "critic_lr": 3e-4,
            "seed": 7,
        }
    )
    s = c.engine_settings()
    assert isinstance(s, EngineSettings)
    assert s.gate_params == GateParams(low=0.5, sharpness=2.0, normalize="sequence")
    assert (s.causal, s.statistic, s.layers) == (True, "max", [0, 2])
    spec = ARMS[arm]
    if spec.critic == "tac":
        assert s.tac == {"width": 16, "temporal": "gru", "trunk_grad": 0.25, "taps": (0, 2), "routing_layers": 2}
        assert (s.critic_lr, s.tac_seed) == (3e-4, 7)
    else:
        assert s.tac is None and s.critic_lr is None
    assert c.probe_old_log_prob == spec.reads_routing
    assert c.probe_update == (spec.critic == "tac")
    v = c.verl_settings()
    assert v["algorithm.adv_estimator"] == ("grpo" if arm == "grpo" else "gae")
    assert v["critic.enable"] == (spec.critic == "standard")
    assert (v["trainer.use_v1"], v["trainer.v1.trainer_mode"]) == (True, "comppo")


def test_the_recipe_arms_are_the_packages() -> None:
    # every package arm but the oracle and the policy-statistic ones, each with the package's critic and gates
    excluded = {n for n, a in ARMS.items() if a.gate_source.pivotal or a.gate_source.policy_statistic}
    assert set(RECIPE_ARMS) == set(ARMS) - excluded
    for name in excluded:
        with pytest.raises(ParameterError, match="comppo.arm"):
            parse({"arm": name})


def compose_recipe(overrides: list[str]) -> Any:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=CONFIG_NAME, overrides=overrides)


@pytest.mark.slow
def test_the_recipe_yaml_composes_on_verls_ppo_trainer() -> None:
    cfg = compose_recipe(["comppo.arm=comppo_shuffle", "comppo.tac.width=16", "comppo.gate.low=0.8"])
    # verl's own blocks are there, with the recipe's defaults on top
    assert cfg.algorithm.adv_estimator == "comppo" and cfg.trainer.v1.trainer_mode == "comppo"
    assert cfg.actor_rollout_ref.model.use_remove_padding is True and cfg.critic.enable is None
    c = prepare_verl_config(cfg)
    assert c == parse({"arm": "comppo_shuffle", "tac": {"width": 16}, "gate": {"low": 0.8}})
    assert (cfg.algorithm.adv_estimator, cfg.critic.enable, cfg.trainer.use_v1) == ("gae", False, True)
    assert parse(cfg.actor_rollout_ref.comppo) == c  # where the actor's worker reads it
    assert prepare_verl_config(cfg) == c  # idempotent
    # a key the block does not have is Hydra's error; a bad value is the block's
    with pytest.raises(Exception, match="comppo.gate.lowest|lowest"):
        compose_recipe(["comppo.gate.lowest=0.5"])
    with pytest.raises(ParameterError, match="comppo.tac.width"):
        prepare_verl_config(compose_recipe(["comppo.tac.width=0"]))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["comppo.arm=comppo", "algorithm.adv_estimator=grpo"], "algorithm.adv_estimator"),
        (["comppo.arm=grpo", "algorithm.adv_estimator=gae"], "algorithm.adv_estimator"),
        (["comppo.arm=ppo", "algorithm.adv_estimator=comp_gae"], "algorithm.adv_estimator"),
        (["comppo.arm=comppo", "critic.enable=true"], "critic.enable"),
        (["comppo.arm=comp_gae", "critic.enable=false"], "critic.enable"),
        (["trainer.v1.trainer_mode=sync"], "trainer.v1.trainer_mode"),
        (["trainer.use_v1=false"], "trainer.use_v1"),
        (["actor_rollout_ref.model.use_remove_padding=false"], "actor_rollout_ref.model.use_remove_padding"),
        (["algorithm.rollout_correction.bypass_mode=true"], "algorithm.rollout_correction.bypass_mode"),
        (["distillation.enabled=true"], "distillation.enabled"),
        (["comppo.arm=tac_fixed", "trainer.critic_warmup=2"], "trainer.critic_warmup"),
        (["comppo.arm=ppo", "algorithm.use_pf_ppo=true"], "algorithm.use_pf_ppo"),
    ],
)
def test_contradictions_with_the_arm_are_refused(overrides: list[str], key: str) -> None:
    cfg = compose_recipe(overrides)
    before = OmegaConf.to_container(cfg)
    with pytest.raises(ParameterError) as info:
        prepare_verl_config(cfg)
    assert info.value.argument == key
    assert OmegaConf.to_container(cfg) == before  # a refused config is left as it was


@pytest.mark.slow
def test_a_diagnosis_is_read_once_and_its_direction_is_what_the_workers_get(tmp_path: Path) -> None:
    """The workers run elsewhere (other nodes, other working directories): they get the direction
    the diagnosis recommends for the arm, not its path; the file may go after preparing. A critic
    warm-up is fine for an arm whose critic is verl's."""
    import json

    path = tmp_path / "diagnosis.json"
    path.write_text(json.dumps({"direction": "inverted", "auc": {}}))
    cfg = compose_recipe(["comppo.arm=comp_gae", f"comppo.gate_direction={path}", "trainer.critic_warmup=2"])
    c = prepare_verl_config(cfg)
    assert (c.gate_direction, c.direction, c.gate_params.invert) == ("inverted", "inverted", True)
    assert cfg.comppo.gate_direction == cfg.actor_rollout_ref.comppo.gate_direction == "inverted"
    path.unlink()
    assert parse(cfg.actor_rollout_ref.comppo).gate_params.invert
    assert prepare_verl_config(cfg) == c  # idempotent


@pytest.mark.slow
def test_consistent_verl_settings_are_accepted() -> None:
    for overrides in (
        ["comppo.arm=comp_gae", "algorithm.adv_estimator=comp_gae", "critic.enable=true"],
        ["comppo.arm=grpo", "algorithm.adv_estimator=grpo"],
        ["comppo.arm=tac_fixed", "algorithm.adv_estimator=gae", "critic.enable=false"],
        ["comppo.arm=grpo", "actor_rollout_ref.model.use_remove_padding=false"],  # grpo runs no probe
    ):
        cfg = compose_recipe(overrides)
        prepare_verl_config(cfg)
        assert cfg.algorithm.adv_estimator == ("grpo" if "comppo.arm=grpo" in overrides else "gae")


@pytest.mark.slow
def test_verls_own_validation_accepts_the_recipes_config(tmp_path: Path) -> None:
    """verl's validate_config and its dataclass conversions of actor_rollout_ref's blocks tolerate
    the comppo block copied into actor_rollout_ref (a tiny model and tokenizer on disk)."""
    import warnings

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from verl_cpu import tiny_llama

    path = str(tmp_path / "tiny")
    tiny_llama(path)
    vocab = {t: i for i, t in enumerate(["<s>", "</s>", "<pad>", *"0123456789"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>").save_pretrained(
        path
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config
    for arm in ("comppo", "comp_gae", "grpo"):
        cfg = compose_recipe(
            [
                f"comppo.arm={arm}",
                f"actor_rollout_ref.model.path={path}",
                f"critic.model.path={path}",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
                "critic.ppo_micro_batch_size_per_gpu=2",
                "trainer.n_gpus_per_node=1",
                "data.train_batch_size=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "critic.ppo_mini_batch_size=4",
            ]
        )
        prepare_verl_config(cfg)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
            omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
            omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
        assert need_critic(cfg) == (arm == "comp_gae")


@pytest.mark.slow
def test_the_gpu_example_composes() -> None:
    """examples/verl/run_comppo.sh's overrides (its shell variables given values) are keys of the recipe's
    config, and the config they make passes prepare_verl_config for every arm."""
    import re

    script = (Path(__file__).resolve().parents[3] / "examples" / "verl" / "run_comppo.sh").read_text()
    overrides = re.findall(r"^\s+([a-z_.]+=\S+) \\$", script, flags=re.MULTILINE)
    assert len(overrides) > 20
    values = {"$ARM": "comppo", "$MODEL": "Qwen/Qwen3-0.6B", "$DATA": "/data", "$GPUS": "8"}
    for arm in RECIPE_ARMS:
        resolved = []
        for item in overrides:
            for name, value in {**values, "$ARM": arm}.items():
                item = item.replace(f'"{name}', f'"{value}').replace(name, value)
            resolved.append(item.replace('"', "").replace("'", ""))
        cfg = compose_recipe(resolved)
        assert prepare_verl_config(cfg).arm == arm
