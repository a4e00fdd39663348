"""CompPO inside TRL (comppo_core.integrations.trl): one CompPOTrainer step is one step of
comppo_core.rl.Trainer on the same rollout, for TAC and value-model arms, with and without
critic warm-up; accumulation, epochs, checkpoints, LoRA, KL, gradient checkpointing, bf16;
what is refused. Several processes: test_trl_backends.py."""

from __future__ import annotations

import copy
import inspect
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("datasets")

from rl_tiny import TINY_SETTINGS  # noqa: E402
from trl_tiny import make_trainer, synthetic_rows, tiny_llama  # noqa: E402

from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.integrations import trl as cctrl  # noqa: E402
from comppo_core.rl import Trainer  # noqa: E402
from comppo_core.rl.config import TrainConfig  # noqa: E402
from comppo_core.rl.core.arms import ARMS  # noqa: E402
from comppo_core.rl.critics.warmup import warm_up_critic  # noqa: E402
from comppo_core.rl.tasks.addition import CharTokenizer  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # transformers 5 renames inside TRL 1.16
    pytest.mark.filterwarnings("ignore:You are using 'rollout_func':UserWarning"),
    pytest.mark.usefixtures("one_torch_thread"),
]

ROOT = Path(__file__).resolve().parents[2]
TOK = CharTokenizer()


def params(module: Any) -> list[Any]:
    return [p.detach().clone() for p in module.parameters()]


def max_diff(a: list[Any], b: list[Any]) -> float:
    assert len(a) == len(b)
    return max(float((x.detach().float() - y.detach().float()).abs().max()) for x, y in zip(a, b))


def run_fixed(out: Path, rows: Any, scores: Any, *, seed: int = 0, **config: Any) -> Any:
    """A CompPOTrainer on the synthetic rows, trained; returns the trainer."""
    settings = {"per_device_train_batch_size": 8, "num_generations": 2, "max_steps": 1, "learning_rate": 1e-3}
    settings.update(tac_width=16, max_completion_length=8, critic_lr=1e-3)
    settings.update(config)
    trainer = make_trainer(tiny_llama(TOK.vocab_size, seed), TOK.to_hf(), rows, scores, str(out), **settings)
    trainer.train()
    return trainer


# ---- the pinned TRL internals and the configuration


def test_the_overridden_private_methods_have_trl_1_16_signatures() -> None:
    from trl import GRPOTrainer

    for name, recorded in cctrl.PINNED_SIGNATURES.items():
        assert str(inspect.signature(getattr(GRPOTrainer, name))) == recorded, name
    sources = "".join(
        inspect.getsource(c) for c in GRPOTrainer.__mro__ if c.__module__.split(".")[0] in ("trl", "transformers")
    )
    for attribute in cctrl.PINNED_ATTRIBUTES:  # each one set by GRPOTrainer or transformers' Trainer
        assert f"self.{attribute} =" in sources or f"self.{attribute}:" in sources, attribute
    overridden = {n for n, v in vars(cctrl.CompPOTrainer).items() if callable(v) and n.startswith("_")}
    overridden -= {
        "__init__",
        "_base_model",
        "_reduce_actor_gradients",
        "_reference_logprobs",
        "_gather",
        "_pad_to_global_widths",
    }
    overridden -= {"_score", "_set_shares", "_log_entries", "_step_critic", "_critic_backward", "_update_forward"}
    overridden -= {"_scoring_columns", "_step_gates", "_fused_forward", "_log_stats"}
    assert overridden <= set(cctrl.PINNED_SIGNATURES), overridden - set(cctrl.PINNED_SIGNATURES)


def test_the_arms_are_grpo_and_every_arm_with_a_critic() -> None:
    assert cctrl.ARM_CHOICES == ("grpo", *(n for n, a in ARMS.items() if a.critic is not None))
    for arm in ("ppo", "ppo_fixed", "comp_gae", "tac_fixed", "comppo", "comppo_inverted", "comppo_oracle"):
        assert arm in cctrl.ARM_CHOICES  # the 2×2, PPO, a control, the oracle (tests/integrations/test_trl_tasks.py)
    with pytest.raises(ParameterError, match="arm") as e:
        cctrl.CompPOConfig(output_dir="unused", arm="no_such_arm", use_cpu=True)
    assert e.value.argument == "arm"


def test_critic_warmup_defaults_to_the_package_trainers() -> None:
    from comppo_core.rl.config import DEFAULT_CRITIC_WARMUP

    assert (
        cctrl.CompPOConfig(output_dir="unused", arm="comp_gae", use_cpu=True).critic_warmup_rounds
        == DEFAULT_CRITIC_WARMUP
    )
    assert cctrl.CompPOConfig(output_dir="unused", arm="grpo", use_cpu=True).critic_warmup_rounds == 0
    assert (
        cctrl.CompPOConfig(output_dir="unused", arm="comppo", critic_warmup=2, use_cpu=True).critic_warmup_rounds == 2
    )
    for arm, value in (("grpo", 3), ("comppo", -1), ("comppo", 1.5)):
        with pytest.raises(ParameterError, match="critic_warmup") as e:
            cctrl.CompPOConfig(output_dir="unused", arm=arm, critic_warmup=value, use_cpu=True)
        assert e.value.argument == "critic_warmup"


def test_import_comppo_core_imports_no_trl() -> None:
    code = "import sys, comppo_core, comppo_core.integrations; print('trl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "False"


def test_the_config_writes_gate_params_as_a_dict() -> None:
    import comppo_core as cc

    c = cctrl.CompPOConfig(output_dir="unused", gate_params=cc.GateParams(low=0.5), report_to=[], use_cpu=True)
    assert c.to_dict()["gate_params"]["low"] == 0.5
    assert "0.5" in c.to_json_string()


def test_the_advantage_settings_are_the_configs(tmp_path: Path) -> None:
    """CompPOConfig's Comp-GAE fields reach the step module's AdvantageSettings."""
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    fields = {"gamma": 0.99, "lam": 0.8, "lam_critic": 0.9, "whiten_advantages": False, "gate_in_bootstrap": False}
    trainer = make_trainer(tiny_llama(TOK.vocab_size), TOK.to_hf(), rows, scores, str(tmp_path), **fields)
    s = trainer.advantage_settings
    assert (s.gamma, s.lam, s.lam_critic, s.whiten, s.gate_in_bootstrap) == (0.99, 0.8, 0.9, False, False)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("importance_sampling_level", "sequence"),
        ("loss_type", "cispo"),
        ("top_entropy_quantile", 0.5),
        ("entropy_coef", 0.01),
        ("delta", 2.0),
        ("off_policy_mask_threshold", 0.5),
        ("steps_per_generation", 3),
    ],
)
def test_what_a_tac_arm_cannot_honour_is_refused_by_name(tmp_path: Path, option: str, value: Any) -> None:
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    extra = {"gradient_accumulation_steps": 2} if option == "steps_per_generation" else {}
    with pytest.raises(ParameterError, match=option) as e:
        make_trainer(tiny_llama(TOK.vocab_size), TOK.to_hf(), rows, scores, str(tmp_path), **{option: value}, **extra)
    assert e.value.argument == option


def test_tools_are_refused(tmp_path: Path) -> None:
    from trl import GRPOTrainer

    args = cctrl.CompPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True)

    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: a number.
            b: a number.
        """
        return a + b

    with pytest.raises(ParameterError, match="tools"):
        cctrl.CompPOTrainer(model=tiny_llama(TOK.vocab_size), reward_funcs=[], args=args, tools=[add])
    with pytest.raises(ParameterError, match="CompPOConfig"):
        cctrl.CompPOTrainer(model=tiny_llama(TOK.vocab_size), args=GRPOTrainer and None)


# ---- one step equals comppo_core.rl.Trainer's


def package_step(arm: str, beta: float, warmup: int = 0) -> tuple[Any, ...]:
    cfg = TrainConfig(
        **{**TINY_SETTINGS, "eval_size": 8, "eval_every": 0, "device": "cpu", "arm": arm, "seed": 1},
        ppo_epochs=1,
        num_minibatches=1,
        kl_coef=beta,
        kl_kind="k3",
        kl_mode="loss",
        log_kl=beta > 0,
        dual_clip=None,
        temperature=0.7,
        actor_lr=1e-3,
        critic_lr=1e-3,
        loss_agg="token-mean",
    )
    tr = Trainer(cfg)
    actor0, critic0 = copy.deepcopy(tr.actor), copy.deepcopy(tr.critic.state_dict())
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(tr.torch_rng)
        r = tr.rollout(0)
        # the warm start of 3 SFT steps answers nothing right: fixed mixed scores give a signal
        r.rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
        if warmup:  # the package's warm-up, every round on this rollout (as TRL's fixed rollout_func gives)
            tr.rollout = lambda key, rng=None: copy.deepcopy(r)  # type: ignore[method-assign]
            tr.warm_start["critic_warmup"] = warm_up_critic(tr, warmup)
        batch = tr.score(r, 0)
        tr.compute_advantages(r, batch)
        update = tr.update(batch, 0)
    return tr, cfg, actor0, critic0, r, batch, update


@pytest.mark.parametrize(
    ("arm", "beta", "warmup"),
    [
        ("comppo", 0.0, 0),
        ("comppo_shuffle", 0.0, 0),
        ("comppo", 0.05, 0),
        ("comppo_shuffle", 0.0, 2),
        ("comp_gae", 0.0, 0),
        ("comp_gae", 0.05, 2),
        ("ppo", 0.0, 0),
        ("ppo", 0.0, 2),
    ],
)
def test_one_step_equals_the_package_trainer_step(tmp_path: Path, arm: str, beta: float, warmup: int) -> None:
    """One step on an injected rollout, after ``warmup`` critic-only rounds on it, equals
    comppo_core.rl.Trainer's: the TAC arms, and the standard critic as a value model."""
    tr, cfg, actor0, critic0, r, batch, update = package_step(arm, beta, warmup)
    p = int(r.response_mask[0].nonzero()[0]) + 1  # every row's first response column is P − 1
    rows = []
    for ids, m in zip(r.input_ids, r.attention_mask):
        rows.append((ids[:p][m[:p]].tolist(), ids[p:][m[p:]].tolist()))
    start = params(actor0)
    model: Any = actor0
    if beta:
        actor0.save_pretrained(tmp_path / "init")  # TRL loads its reference from the policy's path
        model = str(tmp_path / "init")
    trainer = make_trainer(
        model,
        tr.tokenizer.to_hf(),
        rows,
        r.rewards.tolist(),
        str(tmp_path / "trl"),
        arm=arm,
        seed=cfg.seed,
        per_device_train_batch_size=len(rows),
        num_generations=cfg.group_size,
        max_steps=1,
        learning_rate=cfg.actor_lr,
        critic_lr=cfg.critic_lr,
        max_grad_norm=cfg.max_grad_norm,
        epsilon=cfg.clip_low,
        beta=beta,
        temperature=cfg.temperature,
        tac_width=cfg.tac_width,
        gamma=cfg.gamma,
        lam=cfg.lam,
        lam_critic=cfg.lam_critic,
        gate_params=cfg.gate_params,
        value_clip=cfg.value_clip,
        vf_coef=cfg.vf_coef,
        loss_agg=cfg.loss_agg,
        max_completion_length=tr.max_new_tokens,
        critic_warmup=warmup,
    )
    trainer.critic.load_state_dict(critic0)
    seen: list[Any] = []
    score = trainer._score
    trainer._score = lambda *a, **k: seen.append(score(*a, **k)) or seen[-1]
    trainer.train()
    got, _ = seen[warmup]  # the PPO step's scoring pass, after the warm-up rounds'

    assert got.input_ids.shape == batch.input_ids.shape
    assert torch.equal(got.response_mask, batch.response_mask)
    figures = {
        "old_logprobs": float((got.old_logprobs - batch.old_logprobs).abs().max()),
        "old_values": float((got.old_values - batch.old_values).abs().max()),
        "advantages": float((got.advantages - batch.advantages).abs().max()),
        "returns": float((got.returns - batch.returns).abs().max()),
        "actor": max_diff(params(trainer.model), params(tr.actor)),
        "critic": max_diff(params(trainer.critic), params(tr.critic)),
    }
    logged = trainer.state.log_history[warmup]  # after one row per warm-up round
    for key in ("pg_loss", "value_loss") + (("kl_loss",) if beta else ()):
        figures[key] = abs(logged["comppo/" + key] - update[key])
    rounds = [e for e in trainer.state.log_history if "comppo/warmup/round" in e]
    assert [e["comppo/warmup/round"] for e in rounds] == list(range(warmup))
    for ours, theirs in zip(trainer.critic_warmup_log, tr.warm_start.get("critic_warmup", [])):
        for key in ("value_loss", "value_explained_var"):
            figures[f"warmup {ours['round']} {key}"] = abs(ours[key] - theirs[key])
    # Adam's first step moves each weight by about lr whatever its gradient's size, so where a
    # gradient is small (a sum that nearly cancels, or near Adam's ε), float32 rounding of the
    # warmed-up critic (~1e-7 in the values and advantages, within 1e-6 below) shows in the
    # weight: up to 1.7e-5 of a 1e-3 step (comp_gae, β = 0.05, causal gates)
    print(arm, beta, warmup, figures)
    weights = 5e-5 if warmup else 1e-6
    assert max(v for k, v in figures.items() if k not in ("actor", "critic")) < 1e-6, figures
    assert max(figures["actor"], figures["critic"]) < weights, figures
    assert max_diff(params(tr.actor), start) > 1e-4  # the step moved the weights


# the oracle reads a task's pivotal marks: tests/integrations/test_trl_tasks.py trains it on one
@pytest.mark.parametrize("arm", [a for a in cctrl.ARM_CHOICES if a not in ("grpo", "comppo_oracle")])
def test_every_arm_with_a_critic_trains_its_critic_and_the_actor(tmp_path: Path, arm: str) -> None:
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    actor = tiny_llama(TOK.vocab_size)
    start = params(actor)
    trainer = make_trainer(actor, TOK.to_hf(), rows, scores, str(tmp_path), arm=arm, critic_warmup=1,
                           per_device_train_batch_size=8, num_generations=2, max_steps=1, learning_rate=1e-3,
                           tac_width=16, max_completion_length=8, critic_lr=1e-3)  # fmt: skip
    critic0 = params(trainer.critic)
    trainer.train()
    assert max_diff(params(trainer.model), start) > 1e-5
    assert max_diff(params(trainer.critic), critic0) > 1e-5
    logged = trainer.state.log_history[1]
    assert all(
        torch.isfinite(torch.tensor(logged["comppo/" + k])) for k in ("pg_loss", "value_loss", "grad_norm_critic")
    )
    assert (ARMS[arm].gate_source.gated) == ("comppo/gate_mean" in logged)


@pytest.mark.parametrize("arm", ["comppo", "comppo_shuffle", "tac_fixed", "comppo_policy_entropy"])
def test_one_micro_batch_scores_in_the_update_forward_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arm: str
) -> None:
    """With one optimiser step per generation on one micro-batch, a TAC arm runs one actor
    forward a step (the scoring pass inside the update's, with gradients), and the step is
    the two-forward path's bit for bit: the gates of a control drawn over the generation
    order, the loss over TRL's shuffled rows."""
    from comppo_core.rl.core import step as step_module

    calls: list[tuple[bool, bool]] = []
    score = step_module.score

    def counted(*args: Any, **kwargs: Any) -> Any:
        grad = bool(kwargs.get("grad", False))
        calls.append((grad, bool(kwargs.get("scoring", not grad))))
        return score(*args, **kwargs)

    monkeypatch.setattr(step_module, "score", counted)
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    config = {"arm": arm, "max_steps": 2}
    one = run_fixed(tmp_path / "one", rows, scores, **config)
    assert calls == [(True, True)] * 2  # one forward a step, with gradients, giving the scoring pass's outputs
    calls.clear()
    monkeypatch.setattr(cctrl.CompPOTrainer, "_fused_scoring", property(lambda self: False))
    two = run_fixed(tmp_path / "two", rows, scores, **config)
    assert calls == [(False, True), (True, False)] * 2
    assert max_diff(params(one.model), params(two.model)) == 0.0
    assert max_diff(params(one.critic), params(two.critic)) == 0.0
    for a, b in zip(one.state.log_history, two.state.log_history):
        assert {k: v for k, v in a.items() if k.startswith("comppo/")} == {
            k: v for k, v in b.items() if k.startswith("comppo/")
        }


def test_more_micro_batches_or_epochs_score_before_the_update(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scoring pass runs on its own when the rollout serves more than one forward of
    the update: several micro-batches per generation, or several epochs."""
    from comppo_core.rl.core import step as step_module

    calls: list[bool] = []
    score = step_module.score
    monkeypatch.setattr(step_module, "score", lambda *a, **k: calls.append(bool(k.get("grad"))) or score(*a, **k))
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    run_fixed(tmp_path / "a", rows, scores, per_device_train_batch_size=4, gradient_accumulation_steps=2,
              steps_per_generation=2)  # fmt: skip
    assert calls == [False, True, True]
    calls.clear()
    run_fixed(tmp_path / "b", rows, scores, num_iterations=2, max_steps=2)
    assert calls == [False, True, True]


# ---- what TRL users turn on


def test_the_grpo_arm_is_grpo_trainer(tmp_path: Path) -> None:
    from trl import GRPOConfig, GRPOTrainer
    from trl_tiny import EXACT

    rows, scores = synthetic_rows(8, TOK.vocab_size)
    ours = run_fixed(tmp_path / "a", rows, scores, arm="grpo")
    assert ours.critic is None
    settings = {k: v for k, v in EXACT.items() if k not in ("dual_clip", "critic_warmup")}
    args = GRPOConfig(
        output_dir=str(tmp_path / "b"), per_device_train_batch_size=8, num_generations=2, max_steps=1,
        learning_rate=1e-3, max_completion_length=8, **settings,
    )  # fmt: skip
    plain = make_trainer.__wrapped__ if hasattr(make_trainer, "__wrapped__") else None
    del plain
    from datasets import Dataset

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return {"prompt_ids": [p for p, _ in rows], "completion_ids": [c for _, c in rows], "logprobs": None,
                "fixed_score": scores}  # fmt: skip

    theirs = GRPOTrainer(
        model=tiny_llama(TOK.vocab_size), reward_funcs=lambda completions, fixed_score, **k: list(fixed_score),
        args=args, train_dataset=Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(64)]}),
        processing_class=TOK.to_hf(), rollout_func=rollout_func,
    )  # fmt: skip
    theirs.train()
    assert max_diff(params(ours.model), params(theirs.model)) == 0.0


def test_gradient_accumulation_does_not_change_the_update(tmp_path: Path) -> None:
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    for agg in ("token-mean", "seq-mean-token-mean"):
        one = run_fixed(tmp_path / f"one{agg}", rows, scores, loss_agg=agg)
        two = run_fixed(
            tmp_path / f"two{agg}", rows, scores, loss_agg=agg, per_device_train_batch_size=4,
            gradient_accumulation_steps=2, steps_per_generation=2,
        )  # fmt: skip
        assert max_diff(params(one.model), params(two.model)) < 1e-6
        assert max_diff(params(one.critic), params(two.critic)) < 1e-6
        assert abs(one.state.log_history[0]["comppo/value_loss"] - two.state.log_history[0]["comppo/value_loss"]) < 1e-6


def test_gradient_checkpointing_does_not_change_the_update(tmp_path: Path) -> None:
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    on = run_fixed(tmp_path / "on", rows, scores, gradient_checkpointing=True, trunk_grad=0.5)
    off = run_fixed(tmp_path / "off", rows, scores, gradient_checkpointing=False, trunk_grad=0.5)
    assert max_diff(params(on.model), params(off.model)) < 1e-6
    assert max_diff(params(on.critic), params(off.critic)) < 1e-6


@pytest.mark.parametrize("arm", ["comppo", "comp_gae"])
def test_epochs_checkpoints_and_resume_continue_the_critic(tmp_path: Path, arm: str) -> None:
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    config = {"num_iterations": 2, "max_steps": 3, "save_strategy": "steps", "save_steps": 2, "arm": arm}
    full = run_fixed(tmp_path / "full", rows, scores, **config)
    ckpt = tmp_path / "full" / "checkpoint-2"
    assert (ckpt / cctrl.CRITIC_FILE).exists()
    settings = {"per_device_train_batch_size": 8, "num_generations": 2, "learning_rate": 1e-3}
    settings.update(tac_width=16, max_completion_length=8, critic_lr=1e-3, **config)
    resumed = make_trainer(tiny_llama(TOK.vocab_size, 5), TOK.to_hf(), rows, scores, str(tmp_path / "r"), **settings)
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert max_diff(params(resumed.critic), params(full.critic)) < 1e-6
    assert max_diff(params(resumed.model), params(full.model)) < 1e-6
    assert resumed.critic_optimizer.state_dict()["state"][0]["step"] == 3
    assert not resumed.critic_warmup_log  # a resumed run's critic is already warm


def test_the_value_model_starts_from_the_policy_or_the_given_model(tmp_path: Path) -> None:
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    policy = tiny_llama(TOK.vocab_size, 0)
    trainer = make_trainer(policy, TOK.to_hf(), rows, scores, str(tmp_path / "a"), arm="ppo", num_generations=2)
    assert max_diff(params(trainer.critic.backbone), params(policy.model)) == 0.0
    assert trainer.critic.backbone is not policy.model  # a copy: the critic trains its own transformer
    other = tiny_llama(TOK.vocab_size, 7)
    given = make_trainer(policy, TOK.to_hf(), rows, scores, str(tmp_path / "b"), arm="ppo", num_generations=2,
                         value_model=other)  # fmt: skip
    assert max_diff(params(given.critic.backbone), params(other.model)) == 0.0
    with pytest.raises(ParameterError, match="value_model") as e:
        make_trainer(policy, TOK.to_hf(), rows, scores, str(tmp_path / "c"), arm="comppo", value_model=other)
    assert e.value.argument == "value_model"


def test_lora_trains_the_adapter_and_the_critic(tmp_path: Path) -> None:
    from peft import LoraConfig

    rows, scores = synthetic_rows(8, TOK.vocab_size)
    actor = tiny_llama(TOK.vocab_size)
    base = params(actor)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    settings = {"per_device_train_batch_size": 8, "num_generations": 2, "max_steps": 1, "learning_rate": 1e-2}
    settings.update(tac_width=16, max_completion_length=8, beta=0.05)
    trainer = make_trainer(actor, TOK.to_hf(), rows, scores, str(tmp_path), peft_config=lora, **settings)
    critic0 = params(trainer.critic)
    adapter0 = [p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n]
    trainer.train()
    adapter = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert max_diff(adapter, adapter0) > 1e-4
    assert max_diff(params(trainer.critic), critic0) > 1e-6
    frozen = [p for n, p in trainer.model.named_parameters() if "lora" not in n]
    assert max_diff(frozen, base) == 0.0
    assert trainer.state.log_history[0]["comppo/kl_loss"] >= 0.0


def test_lora_gives_the_value_model_an_adapter_of_its_own(tmp_path: Path) -> None:
    """With PEFT the value model trains its own LoRA and its head; its transformer stays frozen."""
    from peft import LoraConfig

    rows, scores = synthetic_rows(8, TOK.vocab_size)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    settings = {"per_device_train_batch_size": 8, "num_generations": 2, "max_steps": 1, "learning_rate": 1e-2}
    settings.update(max_completion_length=8, critic_lr=1e-2, arm="comp_gae")
    trainer = make_trainer(tiny_llama(TOK.vocab_size), TOK.to_hf(), rows, scores, str(tmp_path), peft_config=lora,
                           **settings)  # fmt: skip
    critic = trainer.critic
    named = dict(critic.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all("lora_" in n or n == "value_head.weight" for n in trainable), trainable
    before = {n: p.detach().clone() for n, p in named.items()}
    policy_adapter = [p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n]
    trainer.train()
    after = dict(trainer.accelerator.unwrap_model(trainer.critic).named_parameters())
    moved = {n for n in before if float((after[n].detach() - before[n]).abs().max()) > 0.0}
    assert "value_head.weight" in moved and any("lora_B" in n for n in moved), moved
    assert moved <= trainable, moved - trainable  # the value model's transformer did not move
    adapter = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert max_diff(adapter, policy_adapter) > 1e-4  # and the policy trained its own adapter


def test_bf16_autocast_runs(tmp_path: Path) -> None:
    rows, scores = synthetic_rows(8, TOK.vocab_size)
    trainer = run_fixed(tmp_path, rows, scores, bf16=True)
    assert all(torch.isfinite(p).all() for p in trainer.critic.parameters())
    assert abs(trainer.state.log_history[0]["comppo/value_loss"]) < 1e3


# ---- two processes: tests/integrations/test_trl_backends.py (DDP, ZeRO-2, ZeRO-3, FSDP2)


# ---- the accelerate configs (tests/docs/test_examples.py runs examples/trl_comppo.py)


def test_the_accelerate_configs_are_valid_yaml() -> None:
    yaml = pytest.importorskip("yaml")
    kinds = {}
    for path in sorted((ROOT / "examples" / "accelerate").glob("*.yaml")):
        kinds[path.stem] = yaml.safe_load(path.read_text())["distributed_type"]
    assert kinds == {"ddp": "MULTI_GPU", "fsdp2": "FSDP", "zero3": "DEEPSPEED"}
