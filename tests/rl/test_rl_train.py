"""``comppo_core.rl.train``: the PPO trainer, its arms, task, config, checkpoints and errors.

Runs are tiny (a 2-layer width-32 Llama, 1-digit addition, 8 sequences a step) so each
takes about a second on one CPU thread. What is pinned: every arm runs two steps and
writes every metric; each arm's gates are what its table says (a control is a function
of the concentration gates); a run is a function of its seed; k steps straight equal
k/2 steps and a resume, parameter for parameter; a non-finite loss stops the run naming
the step and leaves the last checkpoint as it was; bad settings name the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rl_tiny import TINY_SETTINGS

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tqdm")

from comppo_core import rl
from comppo_core.errors import NonFiniteError, ParameterError
from comppo_core.rl import losses, step
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.core.arms import ARMS, get_arm
from comppo_core.rl.engine.trainer import METRIC_KEYS, Trainer, train
from comppo_core.rl.tasks.addition import AdditionTask, CharTokenizer, worked_solution

TIMES = tuple(k for k in METRIC_KEYS if k.startswith("time_"))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny(**changes: Any) -> TrainConfig:
    """The shared tiny run (:mod:`rl_tiny`), evaluated on 8 problems at steps 0 and 2, on CPU."""
    # device: resume is bit-identical on CPU
    return TrainConfig(**{**TINY_SETTINGS, "eval_size": 8, "eval_every": 2, "device": "cpu", **changes})


def rows(out: Path) -> list[dict[str, Any]]:
    """The step rows of ``metrics.jsonl`` (without the final evaluation's row)."""
    rs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rs if r["reward_mean"] is not None]


def without_times(rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMES} for r in rs]


def params(trainer: Trainer) -> dict[str, Any]:
    out = {f"actor.{k}": v.clone() for k, v in trainer.actor.state_dict().items()}
    if trainer.critic is not None:
        out.update({f"critic.{k}": v.clone() for k, v in trainer.critic.state_dict().items()})
    return out


def assert_same_params(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k, value in a.items():
        assert torch.equal(value, b[k]), k


# ---------------------------------------------------------------------------------------------------------
# the task


def test_worked_solution_and_verifier() -> None:
    assert worked_solution(23, 45) == "3+5=8,2+4=6;68"
    assert worked_solution(27, 45) == "7+5=12,2+4+1=7;72"
    assert worked_solution(5, 45) == "5+5=10,0+4+1=5;50"
    assert worked_solution(99, 99) == "9+9=18,9+9+1=19;198"
    task = AdditionTask(2)
    p = task.problem(27, 45)
    assert task.reward(p, p.solution, True) == 1.0
    assert task.reward(p, p.solution, False) == 0.0  # no EOS: truncated
    assert task.reward(p, "7+5=12;72", True) == 1.0  # the answer is what is verified
    assert task.reward(p, "7+5=12,2+4+1=7;71", True) == 0.0
    assert task.reward(p, "72", True) == 0.0
    assert task.reward(p, "1;72;72", True) == 0.0


def test_responses_have_at_least_eight_tokens_and_fit_the_budget() -> None:
    for digits in (1, 2, 3):
        task = AdditionTask(digits)
        probs = task.sample(np.random.default_rng(0), 200)
        lengths = [len(task.tokenizer.encode(p.solution, add_eos=True)) for p in probs]
        assert min(lengths) >= 8
        assert max(lengths) <= task.max_new_tokens
        assert max(len(task.tokenizer.encode(p.prompt, add_bos=True)) for p in probs) <= task.max_prompt_tokens


def test_split_is_disjoint_and_fixed_by_split_seed() -> None:
    task = AdditionTask(2, split_seed=3)
    held = task.heldout(100)
    assert len({p.prompt for p in held}) == 100
    assert all(task.is_heldout(*map(int, p.prompt[:-1].split("+"))) for p in held)
    train_probs = task.sample(np.random.default_rng(1), 500)
    assert not any(task.is_heldout(*map(int, p.prompt[:-1].split("+"))) for p in train_probs)
    assert [p.prompt for p in AdditionTask(2, split_seed=3).heldout(100)] == [p.prompt for p in held]
    assert [p.prompt for p in AdditionTask(2, split_seed=4).heldout(100)] != [p.prompt for p in held]
    share = np.mean([task.is_heldout(a, b) for a in range(100) for b in range(100)])
    assert 0.17 < share < 0.23


@pytest.mark.parametrize(
    ("settings", "side"),
    [
        ({"digits": 1, "heldout_fraction": 0.99}, "training"),
        ({"digits": 2, "heldout_fraction": 0.99999}, "training"),
        ({"digits": 1, "heldout_fraction": 0.001}, "held-out"),
        ({"digits": 6, "heldout_fraction": 1e-13}, "held-out"),
    ],
)
def test_a_split_with_an_empty_side_is_an_error(settings: dict[str, Any], side: str) -> None:
    """Drawing from an empty side would never end: the split is refused when it is made."""
    with pytest.raises(ParameterError, match=f"heldout_fraction: .* leaves no {side} pair") as info:
        AdditionTask(**settings)
    assert info.value.argument == "heldout_fraction"


def test_heldout_lists_a_small_split_and_refuses_too_much_of_a_large_one() -> None:
    few = AdditionTask(3, heldout_fraction=0.001)  # about 1000 held-out pairs of 10⁶
    held = few.heldout(4096)
    assert 900 < len(held) < 1200 and len({p.prompt for p in held}) == len(held)  # all of them, once each
    assert all(few.is_heldout(*map(int, p.prompt[:-1].split("+"))) for p in held)
    assert [p.prompt for p in AdditionTask(3).heldout(50)] == [p.prompt for p in AdditionTask(3).heldout(50)]
    with pytest.raises(ParameterError, match="eval_size: expected at most half of the about 10 held-out") as info:
        AdditionTask(4, heldout_fraction=1e-7).heldout(2048)
    assert info.value.argument == "eval_size"


def test_char_tokenizer() -> None:
    tok = CharTokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok.encode("27+45=", add_bos=True, add_eos=True)
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == 8
    assert tok.decode(ids) == "27+45="
    assert tok.decode(ids, skip_special_tokens=False) == "<bos>27+45=<eos>"
    with pytest.raises(ParameterError, match=r"text: .*'x' at index 2"):
        tok.encode("12x")


# ---------------------------------------------------------------------------------------------------------
# the config


def test_config_json_round_trip() -> None:
    cfg = tiny(arm="ppo", clip_high=0.28, lam_critic=None)
    assert TrainConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ParameterError, match="^nope: expected a TrainConfig field") as info:
        TrainConfig.from_json(json.dumps({"nope": 1}))
    assert info.value.argument == "nope"


def test_every_field_is_a_cli_flag() -> None:
    parser = TrainConfig.add_arguments(argparse.ArgumentParser())
    ns = parser.parse_args([])
    assert TrainConfig.from_args(ns) == TrainConfig()
    ns = parser.parse_args(
        [
            "--arm",
            "ppo",
            "--no-progress",
            "--clip-high",
            "none",
            "--dual-clip",
            "2.5",
            "--actor-lr",
            "1e-5",
            "--ppo-epochs",
            "3",
            "--out",
            "/tmp/x",
            "--kl-mode",
            "loss",
            "--whiten-advantages",
        ]
    )
    cfg = TrainConfig.from_args(ns)
    assert (
        cfg.arm,
        cfg.progress,
        cfg.clip_high,
        cfg.dual_clip,
        cfg.actor_lr,
        cfg.ppo_epochs,
        cfg.out,
        cfg.kl_mode,
    ) == ("ppo", False, None, 2.5, 1e-5, 3, "/tmp/x", "loss")
    flags = {a.dest for a in parser._actions}
    assert {f for f in TrainConfig().to_dict()} <= flags
    assert "arm" in (TrainConfig.__doc__ or "") and "kl_mode" in (TrainConfig.__doc__ or "")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"arm": "reinforce"}, "arm"),
        ({"steps": 0}, "steps"),
        ({"lam": 1.5}, "lam"),
        ({"kl_kind": "k9"}, "kl_kind"),
        ({"kl_mode": "both"}, "kl_mode"),
        ({"dual_clip": 1.0}, "dual_clip"),
        ({"gate_low": 0.95, "gate_high": 0.9}, "gate_low"),  # GateParams' check, named as the field
        ({"gate_sharpness": float("nan")}, "gate_sharpness"),
        ({"arm": "grpo", "critic_warmup": 1}, "critic_warmup"),
        ({"temperature": 0.0}, "temperature"),
        ({"num_minibatches": 1000}, "num_minibatches"),
        ({"resume": True}, "resume"),
        ({"model_heads": 3}, "model_heads"),
        ({"progress": "yes"}, "progress"),
    ],
)
def test_bad_settings_name_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ParameterError, match=rf"^{field}: expected") as info:
        TrainConfig(**changes)
    assert info.value.argument == field


def test_unknown_arm_lists_the_arms() -> None:
    with pytest.raises(
        ParameterError, match=r"arm: expected one of 'grpo', 'ppo', 'ppo_fixed', 'comp_gae', .*got 'gae'"
    ):
        get_arm("gae")
    with pytest.raises(ParameterError, match=r"^arm: "):
        train(tiny(arm="gae"))


def test_critic_warmup_needs_a_critic() -> None:
    with pytest.raises(ParameterError, match="critic_warmup: expected 0 for the grpo arm, which has no critic"):
        Trainer(tiny(arm="grpo", critic_warmup=1))


def test_resume_without_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="resume: expected a checkpoint"):
        Trainer(tiny(out=str(tmp_path), resume=True))


# ---------------------------------------------------------------------------------------------------------
# the arms


def parity_reward(self: AdditionTask, problem: Any, response: str, finished: bool) -> float:
    """A stand-in verifier with signal for an untrained policy: 1 for an even response length."""
    return float(len(response) % 2 == 0)


@pytest.fixture
def signal(monkeypatch: Any) -> None:
    """The untrained tiny policy never solves a problem, and with no reward PPO has nothing to
    do; tests that check what an update does score responses by :func:`parity_reward`."""
    monkeypatch.setattr(AdditionTask, "reward", parity_reward)


def answer_is_pivotal(self: AdditionTask, problem: Any, response: str) -> list[bool]:
    """A test oracle for the addition task: the characters after the response's ``;``."""
    cut = response.find(";")
    return [0 <= cut < k for k in range(len(response))]


@pytest.mark.parametrize("arm", list(ARMS))
def test_two_steps_of_every_arm(arm: str, tmp_path: Path, signal: None, monkeypatch: Any) -> None:
    monkeypatch.setattr(AdditionTask, "pivotal", answer_is_pivotal, raising=False)
    trainer = Trainer(tiny(arm=arm, out=str(tmp_path)))
    before = params(trainer)
    summary = trainer.train()
    rs = rows(tmp_path)
    assert [r["step"] for r in rs] == [0, 1]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])  # the final evaluation, after the last update
    assert len(lines) == 3 and last["step"] == 2 and last["eval_accuracy"] == summary["final_eval_accuracy"]
    assert set(last) == set(METRIC_KEYS) and last["reward_mean"] is None and last["arm"] == arm
    for r in rs:
        assert set(r) == set(METRIC_KEYS)
        assert r["rewards_all_equal"] is bool(r["reward_mean"] in (0.0, 1.0))
        assert r["arm"] == arm and r["seed"] == 0
        for key in (
            "reward_mean",
            "train_accuracy",
            "kl",
            "clipfrac",
            "pg_loss",
            "adv_gini",
            "adv_effective_token_ratio",
            "response_length",
            "entropy",
            *TIMES[:-1],
        ):
            assert isinstance(r[key], float), key
        assert r["actor_updated"] is True
    assert rs[0]["eval_accuracy"] is not None and rs[1]["eval_accuracy"] is None
    spec = ARMS[arm]
    for r in rs:
        if spec.critic is None:
            assert r["value_loss"] is None and r["grad_norm_critic"] is None
        else:
            assert isinstance(r["value_loss"], float)
        if spec.gates == "none":
            assert r["gate_mean"] is None
        else:
            assert 0.9 - 1e-6 <= r["gate_min"] <= r["gate_mean"] <= r["gate_max"] <= 1.0
        if spec.gates == "constant":
            assert r["gate_min"] == pytest.approx(r["gate_max"], abs=1e-6)
    after = params(trainer)
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("actor."))
    if spec.critic is not None:
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("critic."))
    assert summary["initial_eval_accuracy"] == rs[0]["eval_accuracy"]
    assert [e[0] for e in summary["eval"]] == [0, 2]
    assert json.loads((tmp_path / "summary.json").read_text())["arm"] == arm
    assert TrainConfig.from_json((tmp_path / "config.json").read_text()).arm == arm
    assert (tmp_path / "checkpoint" / "actor").is_dir() and (tmp_path / "warmstart").is_dir()


def test_each_arm_gets_its_gates(monkeypatch: Any) -> None:
    """An arm's gate source replaces Comp-GAE's gates, computed from the concentration gates
    over the response columns; the critic reads the same causal features in every arm."""
    monkeypatch.setattr(AdditionTask, "pivotal", answer_is_pivotal, raising=False)
    trainer = Trainer(tiny(arm="comppo"))
    r = trainer.rollout()
    m = r.response_mask
    base = trainer.score(r, 0)
    conc, values = base.gates, base.old_values
    assert conc is not None and values is not None
    assert torch.all(conc[~m] == 1.0)
    low, high = trainer.config.gate_low, trainer.config.gate_high
    for arm in ("comppo_shuffle", "comppo_position", "tac_fixed", "ppo_fixed", "comppo_inverted", "comppo_oracle"):
        trainer.arm = ARMS[arm]
        batch = trainer.score(r, 0)
        g = batch.gates
        assert g is not None and torch.all(g[~m] == 1.0)
        if ARMS[arm].critic == "tac":  # the same critic on the same prefix features: the same values
            assert batch.old_values is not None and torch.equal(batch.old_values, values)
        if arm == "comppo_shuffle":
            for b in range(m.shape[0]):
                assert torch.equal(torch.sort(g[b][m[b]]).values, torch.sort(conc[b][m[b]]).values)
            assert not torch.equal(g[m], conc[m])
        elif arm == "comppo_position":
            for j in range(m.shape[1]):
                col = g[:, j][m[:, j]]
                if col.numel():
                    assert torch.allclose(col, conc[:, j][m[:, j]].double().mean().float().expand_as(col))
        elif arm == "comppo_inverted":
            torch.testing.assert_close(g[m], (low + high) - conc[m], rtol=0, atol=1e-6)
        elif arm == "comppo_oracle":
            pivotal = torch.zeros_like(m)
            for b, response in enumerate(r.responses):
                flags = answer_is_pivotal(trainer.task, r.problems[b], response)
                columns = torch.nonzero(m[b]).flatten()[: len(flags)]  # one character per token, then EOS
                pivotal[b, columns] = torch.tensor(flags, dtype=torch.bool)
            assert bool(pivotal.any()) and bool((m & ~pivotal).any())
            assert torch.all(g[pivotal] == high) and torch.all(g[m & ~pivotal] == torch.tensor(low, dtype=g.dtype))
        else:  # the constant gate of tac_fixed and ppo_fixed: the batch mean
            assert torch.allclose(g[m], conc[m].double().mean().float().expand_as(g[m]))
    trainer.arm = ARMS["tac_fixed"]
    trainer.scoring = step.ScoringSettings.from_config(trainer.config.replace(fixed_gate=0.97))
    fixed = step.step_gates(trainer.arm, trainer.scoring, step=0, seed=0, shape=tuple(m.shape), device=m.device)
    assert isinstance(fixed, torch.Tensor) and torch.all(fixed[m] == 0.97)
    scored = trainer.score(r, 0)
    assert scored.gates is not None and torch.all(scored.gates[m] == 0.97)
    assert scored.old_values is not None and torch.equal(scored.old_values, values)


def test_default_gates_are_the_running_mapping_and_read_only_the_prefix() -> None:
    """By default (``gate_causal``) Comp-GAE's gates are the gate mapping of the row's
    running z-score (``rl.tac.causal_gates``), so g_t does not move when later tokens
    change; the whole-row gates (``gate_causal=False``) do."""
    from comppo_core.rl.critics.tac import causal_gates

    assert TrainConfig().gate_causal is True
    trainer = Trainer(tiny(arm="comppo", gate_low=0.2, prompts_per_step=8))
    whole = Trainer(tiny(arm="comppo", gate_causal=False, gate_low=0.2, prompts_per_step=8))
    r = trainer.rollout()
    m = r.response_mask
    out = rl.forward(
        trainer.actor, r.input_ids, r.attention_mask, response_mask=m, gate_params=trainer.config.gate_params
    )
    assert out.concentration is not None
    g = trainer.score(r, 0).gates
    assert g is not None
    torch.testing.assert_close(g, causal_gates(out.concentration, m, trainer.config.gate_params), rtol=0, atol=0)
    k = int(torch.nonzero(m.any(0)).min()) + 2
    changed = r.input_ids.clone()
    tail = torch.zeros_like(m)
    tail[:, k:] = True
    tail &= m
    changed[:, 1:][tail] = torch.tensor(trainer.tokenizer.encode("7"))[0]
    other = dataclasses.replace(r, input_ids=changed)
    before_k = m.clone()
    before_k[:, k:] = False
    g2 = trainer.score(other, 0).gates
    assert g2 is not None and float((g - g2)[before_k].abs().max()) <= 1e-6
    w1, w2 = whole.score(r, 0).gates, whole.score(other, 0).gates
    assert w1 is not None and w2 is not None and float((w1 - w2)[before_k].abs().max()) > 1e-4


def test_gate_min_spread_reaches_the_trainers_gates() -> None:
    """``gate_min_spread`` is GateParams.min_spread in the trainer's gates (running and whole-row): a
    floor far above the concentration's spread keeps every gate near the mid gate, and the gates
    are the floored mapping's."""
    from comppo_core.rl.critics.tac import causal_gates

    for causal in (True, False):
        plain = Trainer(tiny(arm="comppo", gate_low=0.2, gate_causal=causal, prompts_per_step=8))
        floored = Trainer(
            tiny(arm="comppo", gate_low=0.2, gate_causal=causal, prompts_per_step=8, gate_min_spread=10.0)
        )
        assert floored.config.gate_params.min_spread == 10.0
        r = plain.rollout()
        m = r.response_mask
        g, gf = plain.score(r, 0).gates, floored.score(r, 0).gates
        assert g is not None and gf is not None
        mid = 0.2 + 0.8 * 0.5
        assert float((g - mid)[m].abs().max()) > 0.1  # the z-score spreads the unfloored gates
        assert float((gf - mid)[m].abs().max()) < 0.02  # the floor keeps them at the midpoint
        if causal:
            out = rl.forward(plain.actor, r.input_ids, r.attention_mask, response_mask=m)
            assert out.concentration is not None
            want = causal_gates(out.concentration, m, floored.config.gate_params)
            torch.testing.assert_close(gf, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("arm", [name for name, a in ARMS.items() if a.critic is not None])
def test_every_arms_critic_reads_only_the_prefix(arm: str, monkeypatch: Any) -> None:
    """A critic is a baseline: through the trainer's own scoring path, changing the tokens
    from column k on (in every row, which moves every batch statistic) leaves every value
    before column k as it was, in every arm (a control or a whole-row z-score in the
    critic's inputs moved them by 1e-2)."""
    monkeypatch.setattr(AdditionTask, "pivotal", answer_is_pivotal, raising=False)
    trainer = Trainer(tiny(arm=arm, gate_low=0.2, prompts_per_step=8))
    assert trainer.critic is not None
    with torch.no_grad():  # a critic that reads its inputs (a fresh TAC's value head starts at 0)
        generator = torch.Generator().manual_seed(0)
        for p in trainer.critic.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    r = trainer.rollout()
    m = r.response_mask
    first = int(torch.nonzero(m.any(0)).min())
    k = first + 2  # the third response column of the longest-prompt rows
    changed = r.input_ids.clone()
    generator = torch.Generator().manual_seed(0)
    digits = torch.tensor(trainer.tokenizer.encode("0123456789"))
    after = torch.zeros_like(changed, dtype=torch.bool)
    after[:, k + 1 :] = True  # the tokens that columns >= k score
    after &= r.attention_mask
    after[:, 1:] &= m  # response tokens only
    new = digits[torch.randint(len(digits), changed.shape, generator=generator)]
    changed = torch.where(after, new, changed)
    assert not torch.equal(changed, r.input_ids)
    responses = [trainer.tokenizer.decode(changed[b, 1:][m[b]].tolist()) for b in range(m.shape[0])]
    other = dataclasses.replace(r, input_ids=changed, responses=responses)
    v0, v1 = trainer.score(r, 0).old_values, trainer.score(other, 0).old_values
    assert v0 is not None and v1 is not None
    before_k = m.clone()
    before_k[:, k:] = False
    assert bool(before_k.any())
    assert float((v0 - v1)[before_k].abs().max()) <= 1e-5
    assert float((v0 - v1)[m & ~before_k].abs().max()) > 1e-5  # the test can see a change


@pytest.mark.parametrize("arm", ["comppo", "comppo_shuffle", "comppo_position", "tac_fixed"])
def test_scoring_runs_the_actor_once(arm: str) -> None:
    """A control arm's gates are a function of the scoring pass's own concentration gates:
    no second actor forward (the reference is a separate model)."""
    trainer = Trainer(tiny(arm=arm))
    r = trainer.rollout()
    calls: list[int] = []
    handle = trainer.actor.register_forward_hook(lambda *_: calls.append(1))
    try:
        trainer.score(r, 0)
    finally:
        handle.remove()
    assert len(calls) == 1


@pytest.mark.parametrize("arm", ["ppo", "comppo"])  # a plain forward and rl.forward
def test_every_logprob_is_of_the_sampling_distribution(arm: str) -> None:
    """Old, new and reference log-probs are ``log_softmax(logits / temperature)`` (verl, TRL):
    the PPO ratio and the KL compare the distributions the tokens were drawn from."""
    cfg = tiny(arm=arm, temperature=0.5, kl_coef=0.1)
    trainer = Trainer(cfg)
    r = trainer.rollout()
    batch = trainer.score(r, 0)
    ids, mask, m = r.input_ids, r.attention_mask, r.response_mask
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)

    def tempered(model: Any) -> Any:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False).logits
        return torch.log_softmax(logits[:, :-1].double() / 0.5, -1).gather(-1, ids[:, 1:, None])[..., 0]

    expected = tempered(trainer.actor)
    assert (batch.old_logprobs.double() - expected)[m].abs().max() <= 1e-5
    assert (batch.ref_logprobs.double() - tempered(trainer.reference))[m].abs().max() <= 1e-5
    new = trainer._forward(batch, grad=True, gates=None).logprobs  # the update's forward
    assert new.requires_grad
    assert (new.detach().double() - expected)[m].abs().max() <= 1e-5


@pytest.mark.parametrize(("agg", "expected"), [("seq-mean-token-sum-norm", "budget"), ("token-mean", None)])
def test_seq_mean_token_sum_norm_divides_by_the_response_budget(agg: str, expected: Any, monkeypatch: Any) -> None:
    """verl divides by its response length; the [B, T−1] columns also hold the prompt and vary
    with the batch, so the trainer passes the fixed budget max_new_tokens to every loss."""
    seen: list[Any] = []
    for name in ("policy_loss", "value_loss", "aggregate"):
        real = getattr(losses, name)

        def spy(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            seen.append(kwargs.get("loss_scale_factor"))
            return _real(*args, **kwargs)

        monkeypatch.setattr(losses, name, spy)
    trainer = Trainer(tiny(arm="ppo", loss_agg=agg, kl_coef=0.1, kl_mode="loss", steps=1, eval_every=0))
    trainer.step(0)
    want = float(trainer.max_new_tokens) if expected == "budget" else None
    assert len(seen) >= 3 and set(seen) == {want}


def test_grpo_advantages_are_group_relative_and_broadcast() -> None:
    trainer = Trainer(tiny(arm="grpo", group_size=4))
    r = trainer.rollout()
    r.rewards = torch.tensor([1.0, 0.0, 0.0, 0.0] * 4)
    batch = trainer.score(r, 0)
    trainer.compute_advantages(r, batch)
    m = batch.response_mask
    a = batch.advantages
    first = a[0][m[0]]
    assert torch.allclose(first, torch.full_like(first, 1.5), atol=1e-4)  # (1 − 0.25)/σ, σ = 0.5 (unbiased)
    second = a[1][m[1]]
    assert torch.allclose(second, torch.full_like(second, -0.5), atol=1e-4)
    assert torch.all(a[~m] == 0)


def test_gae_arm_rewards_sit_on_the_last_response_token() -> None:
    trainer = Trainer(tiny(arm="ppo", kl_coef=0.0, whiten_advantages=False, lam=1.0, lam_critic=1.0))
    r = trainer.rollout()
    r.rewards = torch.arange(8, dtype=torch.float32)
    batch = trainer.score(r, 0)
    batch.old_values = torch.zeros_like(batch.old_values)
    trainer.compute_advantages(r, batch)
    m = batch.response_mask
    # γ = λ = 1 and V = 0: every response token's advantage and return is the row's score
    for b in range(8):
        assert torch.allclose(batch.advantages[b][m[b]], torch.full((int(m[b].sum()),), float(b)))
        assert torch.allclose(batch.returns[b][m[b]], torch.full((int(m[b].sum()),), float(b)))


def test_kl_modes(signal: None) -> None:
    """kl_mode="reward" changes the advantages; kl_mode="loss" changes the update only."""
    runs = {}
    for mode in ("reward", "loss"):
        trainer = Trainer(tiny(arm="ppo", kl_coef=0.5, kl_mode=mode, steps=2, eval_every=0))
        first, second = trainer.step(0), trainer.step(1)
        assert (
            first["kl"] == 0.0 and second["kl"] != 0.0
        )  # the policy moved away from the reference (k1 has either sign)
        assert (second["kl_loss"] is None) == (mode == "reward")
        runs[mode] = params(trainer)
    assert any(not torch.equal(runs["reward"][k], runs["loss"][k]) for k in runs["reward"])


def test_critic_warmup_trains_the_critic_alone_before_the_first_step(tmp_path: Path, signal: None) -> None:
    cold = Trainer(tiny(arm="comppo", critic_warmup=0, steps=1, eval_every=0))
    warm = Trainer(tiny(arm="comppo", critic_warmup=3, steps=1, eval_every=0, out=str(tmp_path / "warm")))
    before, after = params(cold), params(warm)
    # the actor has not moved; the critic has
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("actor."))
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("critic."))
    rounds = warm.warm_start["critic_warmup"]
    assert [r["round"] for r in rounds] == [0, 1, 2]
    assert all(r["value_loss"] is not None and r["value_loss"] >= 0.0 for r in rounds)
    logged = [json.loads(line) for line in (tmp_path / "warm" / "critic_warmup.jsonl").read_text().splitlines()]
    assert logged == rounds
    # the rounds have their own prompts, keys and RNG: step 0 is the same batch in both runs
    assert torch.equal(cold.rollout(0).input_ids, warm.rollout(0).input_ids)
    assert torch.equal(cold.torch_rng, warm.torch_rng)
    # every arm with a critic warms up by default; grpo has nothing to warm up
    assert TrainConfig(arm="ppo").critic_warmup_rounds == rl.config.DEFAULT_CRITIC_WARMUP > 0
    assert TrainConfig(arm="grpo").critic_warmup_rounds == 0


# ---------------------------------------------------------------------------------------------------------
# determinism, resume, non-finite


def test_a_run_is_a_function_of_its_seed(tmp_path: Path, signal: None) -> None:
    a, b, c = (Trainer(tiny(arm="comppo", out=str(tmp_path / n), seed=s)) for n, s in (("a", 0), ("b", 0), ("c", 1)))
    for t in (a, b, c):
        t.train()
    assert without_times(rows(tmp_path / "a")) == without_times(rows(tmp_path / "b"))
    assert without_times(rows(tmp_path / "a")) != without_times(rows(tmp_path / "c"))
    assert_same_params(params(a), params(b))


@pytest.mark.parametrize("arm", ["comppo", "ppo", "comppo_shuffle"])
def test_resume_continues_bit_for_bit(arm: str, tmp_path: Path, signal: None) -> None:
    k = 4
    straight = Trainer(tiny(arm=arm, steps=k, save_every=2, eval_every=2, out=str(tmp_path / "straight")))
    straight.train()
    tiny(arm=arm, steps=k // 2, eval_every=2, out=str(tmp_path / "resumed"))
    train(tiny(arm=arm, steps=k // 2, eval_every=2, out=str(tmp_path / "resumed")))
    resumed = Trainer(tiny(arm=arm, steps=k, eval_every=2, out=str(tmp_path / "resumed"), resume=True))
    assert resumed.start_step == k // 2
    resumed.train()
    assert_same_params(params(straight), params(resumed))
    assert without_times(rows(tmp_path / "straight")) == without_times(rows(tmp_path / "resumed"))


def test_resume_must_keep_the_settings(tmp_path: Path) -> None:
    train(tiny(out=str(tmp_path)))
    with pytest.raises(ParameterError, match=r"^actor_lr: a resumed run must keep"):
        Trainer(tiny(out=str(tmp_path), resume=True, actor_lr=1.0))


def test_a_non_finite_loss_stops_the_run_and_keeps_the_checkpoint(
    tmp_path: Path, monkeypatch: Any, signal: None
) -> None:
    cfg = tiny(arm="comppo", steps=4, save_every=1, eval_every=0, out=str(tmp_path))
    calls = {"n": 0}
    real = losses.policy_loss
    per_step = cfg.ppo_epochs * cfg.num_minibatches

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        loss, stats = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] > 2 * per_step:  # the first minibatch of step 2
            loss = loss * float("nan")
        return loss, stats

    monkeypatch.setattr(losses, "policy_loss", poisoned)
    trainer = Trainer(cfg)
    with pytest.raises(
        NonFiniteError,
        match=r"^loss: expected a finite value, got nan \(epoch 0, minibatch 0\) at step 2; "
        r"training stopped, the last good checkpoint \(after 2 steps\) is kept at",
    ) as info:
        trainer.train()
    assert info.value.argument == "loss"
    ckpt = tmp_path / "checkpoint"
    assert torch.load(ckpt / "state.pt", weights_only=True)["next_step"] == 2
    assert not (tmp_path / "checkpoint.tmp").exists()
    assert [r["step"] for r in rows(tmp_path)] == [0, 1]
    # the kept checkpoint resumes once the cause is gone
    monkeypatch.setattr(losses, "policy_loss", real)
    resumed = Trainer(cfg.replace(resume=True))
    resumed.train()
    assert [r["step"] for r in rows(tmp_path)] == [0, 1, 2, 3]


def test_non_finite_values_name_the_step(tmp_path: Path, monkeypatch: Any, signal: None) -> None:
    """A NaN the kernels catch (here the critic's values, in cc.gae) is reported with its step."""
    cfg = tiny(arm="comppo", steps=3, save_every=1, eval_every=0, out=str(tmp_path))
    trainer = Trainer(cfg)
    real = rl.TransportAlignedCritic.forward
    calls = {"n": 0}
    per_step = 1 + cfg.ppo_epochs * cfg.num_minibatches  # the scoring pass and the updates

    def forward(self: Any, inputs: Any) -> Any:
        calls["n"] += 1
        v = real(self, inputs)
        return v * float("nan") if calls["n"] == per_step + 1 else v  # step 1's scoring pass

    monkeypatch.setattr(rl.TransportAlignedCritic, "forward", forward)
    with pytest.raises(
        NonFiniteError,
        match=r"^values: expected finite values.* at step 1; training stopped, "
        r"the last good checkpoint \(after 1 steps\)",
    ) as info:
        trainer.train()
    assert (info.value.argument, info.value.row) == ("values", 0)
    assert torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=True)["next_step"] == 1


def test_sft_warm_start_lowers_the_loss() -> None:
    torch.manual_seed(0)
    cfg = tiny()
    task = AdditionTask(1)
    model = rl.trainer.build_policy(cfg, task.tokenizer.vocab_size)
    curve = rl.trainer.sft_warm_start(model, task, steps=100, batch_size=16, lr=3e-3, rng=np.random.default_rng(0))
    assert len(curve) == 100
    assert np.mean(curve[-5:]) < 0.6 * np.mean(curve[:5])


def test_init_from_a_warm_start(tmp_path: Path) -> None:
    """A run can start from another run's warm start (a paired comparison's arms do)."""
    first = Trainer(tiny(out=str(tmp_path / "a")))
    second = Trainer(tiny(arm="ppo", init_from=str(tmp_path / "a" / "warmstart"), warmup_sft_steps=50))
    assert second.warm_start["sft_steps"] == 0 and second.warm_start["init_from"].endswith("warmstart")
    assert_same_params(
        {k: v for k, v in params(first).items() if k.startswith("actor.")},
        {k: v for k, v in params(second).items() if k.startswith("actor.")},
    )
    with pytest.raises(ParameterError, match="^init_from: expected a save_pretrained directory") as info:
        Trainer(tiny(init_from=str(tmp_path / "missing")))
    assert info.value.argument == "init_from"


def test_train_leaves_the_callers_rng_alone_and_shows_progress(capsys: Any) -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    train(tiny(progress=True))
    assert torch.equal(torch.rand(3), expected)
    err = capsys.readouterr().err
    assert "grpo" not in err and "comppo" in err and "reward=" in err


# ---------------------------------------------------------------------------------------------------------
# LoRA through peft


@pytest.mark.parametrize("arm", ["comppo", "ppo", "grpo"])
def test_lora_trains_the_adapter_and_the_critic_only(arm: str, tmp_path: Path, signal: None) -> None:
    """Two steps with lora_rank=4: the base weights stay, the adapter (and the critic) move;
    the reference is the base model (the warm start) with the adapter disabled; the
    checkpoint holds the adapter; the probe and TAC read the adapted model."""
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from comppo_core.hf.lm import default_position_ids, token_logprobs
    from comppo_core.hf.probe import IMPLEMENTATION, ConcentrationProbe

    trainer = Trainer(tiny(arm=arm, lora_rank=4, actor_lr=1e-3, kl_coef=0.1, out=str(tmp_path)))
    wrapped = trainer.lora_model
    assert wrapped is not None and wrapped.get_base_model() is trainer.actor
    assert rl.decoder_layers(wrapped) is trainer.actor.model.layers  # found through the wrapper
    with ConcentrationProbe(trainer.actor, "entropy"):
        assert trainer.actor.config._attn_implementation == IMPLEMENTATION
    adapter = {id(p) for n, p in wrapped.named_parameters() if "lora_" in n}
    assert adapter and {id(p) for p in trainer.actor_params} == adapter
    before = {n: p.detach().clone() for n, p in wrapped.named_parameters()}
    critic_before = None if trainer.critic is None else params(trainer)
    trainer.train()
    after = dict(wrapped.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all("lora_" in n for n in changed)
    assert any("lora_B" in n for n in changed)  # B starts at 0: the adapter now changes the output
    if critic_before is not None:
        critic_after = params(trainer)
        assert any(not torch.equal(critic_before[k], critic_after[k]) for k in critic_before if k.startswith("critic."))
    files = {p.name for p in (tmp_path / "checkpoint" / "actor").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files and "model.safetensors" not in files

    r = trainer.rollout(7)
    ref = trainer.reference_logprobs(r.input_ids, r.attention_mask)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "warmstart")
    with torch.no_grad():
        logits = base(
            input_ids=r.input_ids,
            attention_mask=r.attention_mask.long(),
            position_ids=default_position_ids(r.attention_mask),
        ).logits
    expected = token_logprobs(logits[:, :-1], r.input_ids[:, 1:], temperature=trainer.config.temperature)
    expected = torch.where(r.attention_mask[:, :-1] & r.attention_mask[:, 1:], expected, torch.zeros_like(expected))
    assert torch.equal(ref, expected)
    batch = trainer.score(r, 7)
    assert float((batch.old_logprobs - ref).abs().max()) > 1e-3  # the adapted policy is not the reference


def test_lora_resume_continues_bit_for_bit(tmp_path: Path, signal: None) -> None:
    pytest.importorskip("peft")
    cfg = tiny(arm="comppo", lora_rank=4, actor_lr=1e-3, steps=4, save_every=2, eval_every=2)
    straight = Trainer(cfg.replace(out=str(tmp_path / "straight")))
    straight.train()
    train(cfg.replace(steps=2, out=str(tmp_path / "resumed")))
    resumed = Trainer(cfg.replace(out=str(tmp_path / "resumed"), resume=True))
    assert resumed.start_step == 2 and resumed.lora_model is not None
    resumed.train()
    a, b = straight.lora_model.state_dict(), resumed.lora_model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert_same_params(
        {k: v for k, v in params(straight).items() if k.startswith("critic.")},
        {k: v for k, v in params(resumed).items() if k.startswith("critic.")},
    )
    assert without_times(rows(tmp_path / "straight")) == without_times(rows(tmp_path / "resumed"))


def test_lora_without_peft_names_lora_rank(monkeypatch: Any) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    with pytest.raises(ParameterError, match=r"^lora_rank: LoRA needs peft, which is not installed") as info:
        Trainer(tiny(lora_rank=4))
    assert info.value.argument == "lora_rank"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"lora_rank": -1}, "lora_rank"),
        ({"lora_alpha": 0.0}, "lora_alpha"),
        ({"lora_target_modules": " "}, "lora_target_modules"),
    ],
)
def test_bad_lora_settings_name_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ParameterError, match=rf"^{field}: expected") as info:
        TrainConfig(**changes)
    assert info.value.argument == field


def test_lora_unknown_target_modules_name_the_field() -> None:
    pytest.importorskip("peft")
    with pytest.raises(ParameterError, match=r"^lora_target_modules: peft could not add the adapter") as info:
        Trainer(tiny(lora_rank=4, lora_target_modules="no_such_proj"))
    assert info.value.argument == "lora_target_modules"


def test_the_oracle_arm_needs_a_task_that_marks_pivotal_tokens(monkeypatch: Any) -> None:
    from comppo_core.rl.core import oracle

    with pytest.raises(ParameterError, match=r"arm: the comppo_oracle arm needs a task that marks its pivotal tokens"):
        Trainer(tiny(arm="comppo_oracle"))
    monkeypatch.setattr(AdditionTask, "pivotal", answer_is_pivotal, raising=False)
    trainer = Trainer(tiny(arm="comppo_oracle"))
    r = trainer.rollout()
    marks = oracle.pivotal_columns(trainer.task, trainer.tokenizer, r)
    assert marks.dtype == torch.bool and not bool((marks & ~r.response_mask).any())
    monkeypatch.setattr(AdditionTask, "pivotal", lambda self, problem, response: [True], raising=False)
    with pytest.raises(
        ParameterError, match=r"pivotal: expected one flag per character of the response \(\d+\), got 1 at row 0"
    ):
        oracle.pivotal_columns(trainer.task, trainer.tokenizer, r)
    monkeypatch.setattr(AdditionTask, "pivotal", answer_is_pivotal, raising=False)
    wrong = dataclasses.replace(r, responses=["x" * len(text) for text in r.responses])
    with pytest.raises(
        ParameterError, match=r"pivotal: the response tokens of row 0 do not spell its decoded response"
    ):
        oracle.pivotal_columns(trainer.task, trainer.tokenizer, wrong)
