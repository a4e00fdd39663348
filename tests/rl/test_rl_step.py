"""The step's maths (comppo_core.rl.core.step) on hand-made batches: no trainer, no warm start, no generate.

Each phase is pinned against its definition: the gates an arm's data decides, the scoring
forward against ``hf.score`` and the gate mapping, the rewards and KL, the advantages
against the NumPy oracles of ``comppo_core.reference``, and the minibatch loss against
verl's terms from ``rl.losses``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import comppo_core as cc  # noqa: E402
from comppo_core import controls, hf, reference  # noqa: E402
from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.rl import losses, step  # noqa: E402
from comppo_core.rl.core.arms import ARMS, CRITICS, GATE_SOURCES, Arm  # noqa: E402
from comppo_core.rl.core.gate_sources import get_gate_source  # noqa: E402
from comppo_core.rl.critics.standard import StandardCritic  # noqa: E402
from comppo_core.rl.critics.tac import TransportAlignedCritic, causal_gates  # noqa: E402

B, T = 4, 12
TAU = 0.7
SCORING = step.ScoringSettings(statistic="entropy", gate_params=cc.GateParams(low=0.5), temperature=TAU)


@pytest.fixture(scope="module")
def actor(tiny_lm: Any) -> Any:
    return tiny_lm("llama", layers=4)


@pytest.fixture(scope="module")
def rollout() -> dict[str, Any]:
    """Left-padded prompts, responses of different lengths right-padded after them."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 32, (B, T), generator=g)
    am = torch.ones(B, T, dtype=torch.bool)
    am[1, :2] = False  # a shorter prompt
    am[3, :3] = False
    am[2, 10:] = False  # a shorter response
    ids = ids.masked_fill(~am, 2)
    resp = torch.zeros(B, T - 1, dtype=torch.bool)
    resp[:, 5:] = True  # prompt width 6: columns 5.. score the response tokens 6..
    resp &= am[:, :-1] & am[:, 1:]
    return {
        "ids": ids,
        "am": am,
        "resp": resp,
        "scores": torch.tensor([1.0, 0.0, 1.0, 0.5]),
        "groups": torch.tensor([0, 0, 1, 1]),
    }


def test_the_package_names_are_the_functions_after_their_modules_load() -> None:
    # importing rl.step loads rl.policy_forward; rl.forward must still be the function
    assert cc.rl.forward is step.forward and callable(cc.rl.forward)
    assert cc.rl.step is step and cc.rl.Trainer.__name__ == "Trainer"


def test_every_arm_is_a_critic_and_a_gate_source() -> None:
    for arm in ARMS.values():
        assert arm.critic in (None, *CRITICS) and arm.gates in GATE_SOURCES, arm
        assert arm.uses_gae == (arm.critic is not None)
        uncertainty = arm.gates in ("policy_entropy", "token_nll")  # the policy's own statistics need no probe
        assert arm.reads_routing == ((arm.gates != "none" and not uncertainty) or arm.critic == "tac")
        assert arm.replaces_gates == (arm.gates not in ("none", "concentration"))
        assert arm.diagnostic == (arm.gates == "oracle")
        assert arm.critic_reads_routing == (arm.critic == "tac")
        assert arm.control == (arm.gates in ("constant", "shuffle", "by_position"))
    # the 2x2 of the paper plus the controls
    assert {(a.critic, a.gates) for a in ARMS.values()} >= {
        ("standard", "none"),
        ("standard", "concentration"),
        ("tac", "constant"),
        ("tac", "concentration"),
    }


def _expected_gates(name: str, own: torch.Tensor, resp: torch.Tensor, low: float, high: float) -> Any:
    """What each gate source's replacing gates must be, written from its definition."""
    return {
        "none": None,
        "concentration": None,
        "constant": torch.as_tensor(controls.constant(own, mask=resp)),
        "shuffle": torch.as_tensor(controls.shuffle(own, mask=resp, seed=5 * 1_000_003 + 3)),
        "by_position": torch.as_tensor(controls.by_position(own, mask=resp)),
        "inverted": torch.where(resp, (low + high) - own, 1.0).clamp(0.0, 1.0),
        "oracle": "pivotal",
        # the mapping of the policy's own statistic: the scoring forward's own gates, nothing to replace
        # (tests/rl/test_gate_sources.py pins them against the full logits)
        "policy_entropy": None,
        "token_nll": None,
    }[name]


def test_every_gate_source_has_a_definition_here() -> None:
    # a source added to the registry must say here what it computes
    names = (
        "none",
        "concentration",
        "constant",
        "shuffle",
        "by_position",
        "inverted",
        "oracle",
        "policy_entropy",
        "token_nll",
    )
    assert tuple(GATE_SOURCES) == names


@pytest.mark.parametrize("name", list(GATE_SOURCES))
def test_step_gates_follow_the_gate_source_registry(name: str, rollout: dict[str, Any]) -> None:
    shape = tuple(rollout["resp"].shape)
    kw: dict[str, Any] = dict(step=3, seed=5, shape=shape, device=torch.device("cpu"))
    arm = Arm(f"test_{name}", "tac", name, "a test arm")
    own = torch.rand(shape, generator=torch.Generator().manual_seed(0)) * 0.5 + 0.5
    resp, conc = rollout["resp"], torch.rand(shape)
    params = SCORING.gate_params
    want = _expected_gates(name, own, resp, params.low, params.high)
    if want is None:
        assert step.step_gates(arm, SCORING, **kw) is None
        return
    if want == "pivotal":
        with pytest.raises(ParameterError, match="pivotal"):
            step.step_gates(arm, SCORING, **kw)
        pivotal = torch.zeros(shape, dtype=torch.bool)
        pivotal[:, -1] = True
        g = step.step_gates(arm, SCORING, **kw, pivotal=pivotal)
        assert isinstance(g, torch.Tensor)
        assert torch.equal(g, torch.where(pivotal, params.high, params.low).to(torch.float32))
        return
    f = step.step_gates(arm, SCORING, **kw)
    assert callable(f) and not isinstance(f, torch.Tensor)
    assert torch.equal(f(own, conc, resp), want)
    if name == "shuffle":  # a shuffle is keyed by the step: another step permutes differently
        other = step.step_gates(arm, SCORING, **{**kw, "step": 4})
        assert callable(other) and not torch.equal(other(own, conc, resp), want)
    fixed = step.ScoringSettings(gate_params=params, fixed_gate=0.93)
    g = step.step_gates(arm, fixed, **kw)
    if GATE_SOURCES[name].takes_fixed_gate:  # a given fixed_gate is the constant itself
        assert isinstance(g, torch.Tensor) and g.shape == shape and torch.all(g == 0.93)
    else:
        assert callable(g)


def test_an_unknown_gate_source_is_an_error() -> None:
    with pytest.raises(ParameterError, match="gates: expected one of 'none', 'concentration'"):
        Arm("mine", "tac", "entropy_of_my_choice", "an arm whose source nobody registered")
    with pytest.raises(ParameterError, match="critic"):
        Arm("mine", "value_net", "none", "an unknown critic")
    with pytest.raises(ParameterError, match="gates"):
        get_gate_source("inverse")


def test_the_arms_step_gates_are_their_sources(rollout: dict[str, Any]) -> None:
    shape = tuple(rollout["resp"].shape)
    kw: dict[str, Any] = dict(step=3, seed=5, shape=shape, device=torch.device("cpu"))
    for name in ("grpo", "ppo", "comp_gae", "comppo"):
        assert step.step_gates(ARMS[name], SCORING, **kw) is None, name
    own = torch.rand(shape, generator=torch.Generator().manual_seed(0)) * 0.5 + 0.5
    resp, conc = rollout["resp"], torch.rand(shape)
    for name in ("tac_fixed", "ppo_fixed", "comppo_shuffle", "comppo_position", "comppo_inverted"):
        f = step.step_gates(ARMS[name], SCORING, **kw)
        want = _expected_gates(ARMS[name].gates, own, resp, SCORING.gate_params.low, SCORING.gate_params.high)
        assert callable(f) and torch.equal(f(own, conc, resp), want), name


def test_plain_arms_score_with_hf_score(actor: Any, rollout: dict[str, Any]) -> None:
    r = rollout
    s = step.score(actor, None, r["ids"], r["am"], r["resp"], arm=ARMS["grpo"], settings=SCORING)
    every = hf.score(actor, r["ids"], r["am"], temperature=TAU).logprobs
    # the response columns' log-probs, bit for bit; 0 at the prompt's (the LM head skips them)
    want = torch.where(r["resp"], every, 0.0)
    assert torch.equal(s.logprobs, want) and bool((every[~r["resp"] & (every != 0)]).numel())
    assert torch.equal(want, hf.score(actor, r["ids"], r["am"], temperature=TAU, logprob_columns=r["resp"]).logprobs)
    assert s.values is None and s.gates is None
    assert not s.logprobs.requires_grad
    with_grad = step.score(actor, None, r["ids"], r["am"], r["resp"], arm=ARMS["grpo"], settings=SCORING, grad=True)
    assert with_grad.logprobs.requires_grad and torch.equal(with_grad.logprobs.detach(), want)


def test_concentration_arms_gate_the_response(actor: Any, rollout: dict[str, Any]) -> None:
    r = rollout
    torch.manual_seed(0)
    critic = TransportAlignedCritic.for_model(actor, width=16)
    s = step.score(actor, critic, r["ids"], r["am"], r["resp"], arm=ARMS["comppo"], settings=SCORING)
    scored = hf.score(actor, r["ids"], r["am"], temperature=TAU, concentration=True)
    assert torch.equal(s.logprobs, torch.where(r["resp"], scored.logprobs, 0.0))
    assert scored.concentration is not None
    g = torch.as_tensor(cc.gates_from_concentration(scored.concentration, mask=r["resp"], params=SCORING.gate_params))
    assert s.gates is not None and torch.equal(s.gates, g)
    assert torch.all(s.gates[~r["resp"]] == 1) and float(s.gates[r["resp"]].min()) < 0.9
    assert s.values is not None and s.values.shape == (B, T - 1)
    # the values are TAC's on the causal gates of the same forward
    out = cc.rl.forward(
        actor, r["ids"], r["am"], critic=critic, response_mask=r["resp"], gate_params=SCORING.gate_params
    )
    assert out.critic_gates is not None
    assert torch.equal(out.critic_gates, causal_gates(scored.concentration, r["resp"], SCORING.gate_params))
    assert torch.equal(s.values, out.values)


def test_a_control_replaces_the_gates_of_gae_not_the_critics_features(actor: Any, rollout: dict[str, Any]) -> None:
    r = rollout
    torch.manual_seed(0)
    critic = TransportAlignedCritic.for_model(actor, width=16)
    arm = ARMS["comppo_position"]
    gates = step.step_gates(arm, SCORING, step=0, seed=0, shape=tuple(r["resp"].shape), device=torch.device("cpu"))
    s = step.score(actor, critic, r["ids"], r["am"], r["resp"], arm=arm, settings=SCORING, gates=gates)
    plain = step.score(actor, critic, r["ids"], r["am"], r["resp"], arm=ARMS["comppo"], settings=SCORING)
    assert plain.gates is not None and s.gates is not None
    want = torch.where(r["resp"], torch.as_tensor(controls.by_position(plain.gates, mask=r["resp"])), 1.0)
    assert torch.equal(s.gates, want)
    assert s.values is not None and plain.values is not None and torch.equal(s.values, plain.values)  # causal features
    # a standard critic's arm with gates: Comp-GAE reads them, the critic reads the ids
    torch.manual_seed(0)
    standard = StandardCritic.from_actor(actor, generator=torch.Generator().manual_seed(1))
    c = step.score(actor, standard, r["ids"], r["am"], r["resp"], arm=ARMS["comp_gae"], settings=SCORING)
    assert c.gates is not None and torch.equal(c.gates, plain.gates) and c.values is not None
    p = step.score(actor, standard, r["ids"], r["am"], r["resp"], arm=ARMS["ppo"], settings=SCORING)
    assert p.gates is None and p.values is not None and torch.equal(p.values, c.values)


def test_rewards_sit_on_the_last_response_column_with_the_kl(rollout: dict[str, Any]) -> None:
    r = rollout
    resp, scores = r["resp"], r["scores"]
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(B, T - 1, generator=g)
    ref = -torch.rand(B, T - 1, generator=g)
    rewards, kl = step.rewards_with_kl(resp, scores, old, None, step.AdvantageSettings())
    assert kl is None
    last = [int(torch.nonzero(resp[b])[-1]) for b in range(B)]
    want = torch.zeros(B, T - 1)
    for b in range(B):
        want[b, last[b]] = scores[b]
    assert torch.equal(rewards, want)
    k2 = 0.5 * (old - ref) ** 2
    in_loss = step.AdvantageSettings(kl_coef=0.1, kl_kind="k2", kl_mode="loss")
    rewards, kl = step.rewards_with_kl(resp, scores, old, ref, in_loss)
    assert torch.equal(rewards, want) and kl is not None
    assert torch.allclose(kl, torch.where(resp, k2, 0.0)) and torch.all(kl[~resp] == 0)
    in_reward = step.AdvantageSettings(kl_coef=0.1, kl_kind="k2", kl_mode="reward")
    rewards, _ = step.rewards_with_kl(resp, scores, old, ref, in_reward)
    assert torch.allclose(rewards, want - 0.1 * torch.where(resp, k2, 0.0))


def test_critic_arm_advantages_are_gae_then_whitening(rollout: dict[str, Any]) -> None:
    r = rollout
    resp = r["resp"]
    rewards = step.terminal_rewards(resp, r["scores"])
    values = torch.randn(B, T - 1, generator=torch.Generator().manual_seed(2)) * resp
    gates = torch.where(resp, torch.rand(B, T - 1, generator=torch.Generator().manual_seed(4)) * 0.5 + 0.5, 1.0)
    settings = step.AdvantageSettings(gamma=0.99, lam=0.9, lam_critic=1.0)
    adv, ret, all_adv = step.compute_advantages(
        ARMS["comppo"], rewards, resp, values=values, gates=gates, groups=r["groups"], settings=settings
    )
    m = resp.numpy()
    a_ref, r_ref = reference.gae(
        rewards.numpy(), values.numpy(), mask=m, gates=gates.numpy(), gamma=0.99, lam=0.9, lam_critic=1.0
    )
    assert ret is not None
    np.testing.assert_allclose(ret.numpy()[m], r_ref[m], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(adv.numpy()[m], reference.masked_whiten(a_ref, mask=m)[m], rtol=1e-4, atol=1e-5)
    assert torch.equal(adv, all_adv)  # one process: the global batch is its own
    raw, _, _ = step.compute_advantages(
        ARMS["ppo"], rewards, resp, values=values, gates=None, groups=r["groups"],
        settings=step.AdvantageSettings(gamma=0.99, lam=0.9, lam_critic=1.0, whiten=False),
    )  # fmt: skip
    a_plain, _ = reference.gae(rewards.numpy(), values.numpy(), mask=m, gamma=0.99, lam=0.9, lam_critic=1.0)
    np.testing.assert_allclose(raw.numpy()[m], a_plain[m], rtol=1e-5, atol=1e-6)
    with pytest.raises(ParameterError, match="values: the ppo arm's advantages need the critic's values"):
        step.compute_advantages(
            ARMS["ppo"], rewards, resp, values=None, gates=None, groups=r["groups"], settings=settings
        )


def _trace_only_gae(
    r: np.ndarray, v: np.ndarray, g: np.ndarray, m: np.ndarray, gamma: float, lam: float, lam_c: float
) -> tuple[np.ndarray, np.ndarray]:
    """The definition, one row at a time over the valid positions (float64):
    ``δ_i = r_i + γ·V_{i+1} − V_i``, ``A_i = δ_i + γ·λ·g_i·A_{i+1}``, ``R_i = A^c_i + V_i``."""
    adv, ret = np.zeros(r.shape), np.zeros(r.shape)
    for b in range(r.shape[0]):
        idx = np.flatnonzero(m[b])
        a = ac = 0.0
        for k in range(len(idx) - 1, -1, -1):
            i = idx[k]
            v_next = float(v[b, idx[k + 1]]) if k + 1 < len(idx) else 0.0
            delta = float(r[b, i]) + gamma * v_next - float(v[b, i])
            a = delta + gamma * lam * float(g[b, i]) * a
            ac = delta + gamma * lam_c * float(g[b, i]) * ac
            adv[b, i], ret[b, i] = a, ac + float(v[b, i])
    return adv, ret


def test_gates_kept_out_of_the_bootstrap_shape_the_trace_alone(rollout: dict[str, Any]) -> None:
    r = rollout
    resp = r["resp"].clone()
    resp[0, 7] = False  # a hole: the recursion passes straight through it (docs/design.md §3)
    rewards = step.terminal_rewards(resp, r["scores"])
    values = torch.randn(B, T - 1, generator=torch.Generator().manual_seed(2)) * resp
    gates = torch.where(resp, torch.rand(B, T - 1, generator=torch.Generator().manual_seed(4)) * 0.5 + 0.5, 1.0)
    m = resp.numpy()
    for lam_c in (1.0, 0.8):
        settings = step.AdvantageSettings(gamma=0.99, lam=0.9, lam_critic=lam_c, whiten=False, gate_in_bootstrap=False)
        before = (rewards.clone(), values.clone(), gates.clone())
        adv, ret, _ = step.compute_advantages(
            ARMS["comppo"], rewards, resp, values=values, gates=gates, groups=r["groups"], settings=settings
        )
        assert all(torch.equal(x, y) for x, y in zip(before, (rewards, values, gates), strict=True))
        a_ref, r_ref = _trace_only_gae(rewards.numpy(), values.numpy(), gates.numpy(), m, 0.99, 0.9, lam_c)
        assert ret is not None and adv.dtype == ret.dtype == torch.float32
        np.testing.assert_allclose(adv.numpy()[m], a_ref[m], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(ret.numpy()[m], r_ref[m], rtol=1e-6, atol=1e-7)
        assert torch.all(adv[~resp] == 0) and torch.all(ret[~resp] == 0)
        # the paper's gated bootstrap differs wherever a gate is below 1 and a value follows
        gated, _, _ = step.compute_advantages(
            ARMS["comppo"], rewards, resp, values=values, gates=gates, groups=r["groups"],
            settings=dataclasses.replace(settings, gate_in_bootstrap=True),
        )  # fmt: skip
        assert float((gated - adv).abs().max()) > 1e-2
    # unit gates: both are plain GAE
    ones = torch.ones_like(gates)
    plain = [
        step.compute_advantages(
            ARMS["comppo"], rewards, resp, values=values, gates=ones, groups=r["groups"],
            settings=step.AdvantageSettings(gamma=0.99, lam=0.9, whiten=False, gate_in_bootstrap=flag),
        )[0]
        for flag in (True, False)
    ]  # fmt: skip
    torch.testing.assert_close(plain[0], plain[1], rtol=1e-6, atol=1e-7)


def test_next_values_skip_masked_positions_and_end_at_zero() -> None:
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0]])
    mask = torch.tensor([[False, True, False, True, True], [True, False, False, False, False]])
    want = torch.tensor([[2.0, 4.0, 4.0, 5.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(step.next_values(values, mask), want)


def test_grpo_advantages_are_group_relative_outcomes(rollout: dict[str, Any]) -> None:
    r = rollout
    resp = r["resp"]
    rewards = step.terminal_rewards(resp, r["scores"])
    for method in ("grpo", "drgrpo", "rloo", "reinforce_baseline"):
        settings = step.AdvantageSettings(group_method=method)
        adv, ret, _ = step.compute_advantages(
            ARMS["grpo"], rewards, resp, values=None, gates=None, groups=r["groups"], settings=settings
        )
        assert ret is None
        seq = reference.group_advantages(r["scores"].double().numpy(), r["groups"].numpy(), method=method)
        want = reference.broadcast(seq.astype(np.float32), mask=resp.numpy())
        np.testing.assert_allclose(adv.numpy(), want, rtol=1e-6, atol=1e-7, err_msg=method)


def test_loss_shares_split_the_minibatch_denominator() -> None:
    tokens = torch.tensor([3, 0, 5, 2])  # response tokens of the four global rows
    index = torch.tensor([0, 1, 2, 3])
    mine = torch.tensor([0, 1])  # this process holds rows 0 and 1
    assert step.loss_shares(tokens, index, mine, "token-mean") == (0.3, 0.3)
    assert step.loss_shares(tokens, index, mine, "seq-mean-token-mean") == (1 / 3, 0.3)  # non-empty rows
    assert step.loss_shares(tokens, index, mine, "seq-mean-token-sum-norm") == (1 / 3, 0.3)  # verl 0.9.1: rows too
    assert step.loss_shares(tokens, index, index, "token-mean") == (1.0, 1.0)


def _minibatch(rollout: dict[str, Any], critic: bool) -> tuple[step.Batch, Any, Any]:
    g = torch.Generator().manual_seed(7)
    resp = rollout["resp"]
    shape = (B, T - 1)
    batch = step.Batch(
        rollout["ids"],
        rollout["am"],
        resp,
        old_logprobs=-torch.rand(shape, generator=g),
        advantages=torch.randn(shape, generator=g),
        old_values=torch.randn(shape, generator=g) if critic else None,
        returns=torch.randn(shape, generator=g) if critic else None,
        ref_logprobs=-torch.rand(shape, generator=g),
    )
    logprobs = (batch.old_logprobs + 0.1 * torch.randn(shape, generator=g)).requires_grad_()
    values = (torch.randn(shape, generator=g)).requires_grad_() if critic else None
    return batch, logprobs, values


def test_minibatch_loss_is_the_sum_of_verl_terms(rollout: dict[str, Any]) -> None:
    batch, lp, values = _minibatch(rollout, critic=True)
    m = batch.response_mask
    s = step.LossSettings(clip_low=0.2, dual_clip=3.0, value_clip=0.5, vf_coef=0.5, kl_coef=0.1, kl_kind="k3")
    loss, stats = step.minibatch_loss(batch, lp, values, s, train_actor=True, share=0.25, token_share=0.5)
    pg, pg_stats = losses.policy_loss(lp, batch.old_logprobs, batch.advantages, m, clip_low=0.2, dual_clip=3.0)
    kl = losses.aggregate(losses.kl_penalty(lp, batch.ref_logprobs, "k3"), m, "token-mean")
    vf, vf_stats = losses.value_loss(values, batch.old_values, batch.returns, m, clip=0.5)
    assert loss is not None
    torch.testing.assert_close(loss, 0.25 * pg + 0.1 * (0.25 * kl) + 0.5 * (0.25 * vf), rtol=0, atol=1e-7)
    assert stats["pg_loss"] == pg_stats["pg_loss"] * 0.25 and stats["clipfrac"] == pg_stats["clipfrac"] * 0.5
    assert stats["value_loss"] == vf_stats["vf_loss"] * 0.25 and stats["kl_loss"] == float(kl.detach()) * 0.25
    loss.backward()
    assert lp.grad is not None and values is not None and values.grad is not None
    # the critic alone while the actor waits (critic_warmup): the value term only, no KL
    batch, lp, values = _minibatch(rollout, critic=True)
    loss, stats = step.minibatch_loss(batch, lp, values, s, train_actor=False)
    vf, _ = losses.value_loss(values, batch.old_values, batch.returns, m, clip=0.5)
    assert loss is not None and torch.equal(loss, 0.5 * (vf * 1.0)) and "kl_loss" not in stats
    # no critic and no actor update: nothing to train
    batch, lp, _ = _minibatch(rollout, critic=False)
    loss, stats = step.minibatch_loss(batch, lp, None, s, train_actor=False)
    assert loss is None and set(stats) == {"pg_loss", "clipfrac", "approx_kl"}
    # the KL as a reward (TRL) adds no loss term
    in_reward = step.LossSettings(kl_coef=0.1, kl_mode="reward")
    loss, stats = step.minibatch_loss(batch, lp, None, in_reward, train_actor=True)
    pg, _ = losses.policy_loss(lp, batch.old_logprobs, batch.advantages, m, dual_clip=None)
    assert loss is not None and torch.equal(loss, pg * 1.0) and "kl_loss" not in stats


def test_loss_settings_normalize_seq_mean_token_sum_norm_by_the_budget() -> None:
    from comppo_core.rl.config import TrainConfig

    assert step.LossSettings.from_config(TrainConfig(loss_agg="seq-mean-token-sum-norm"), 17).loss_scale_factor == 17.0
    assert step.LossSettings.from_config(TrainConfig(), 17).loss_scale_factor is None


def test_explained_variance() -> None:
    m = torch.tensor([[True, True, True, False]])
    r = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    assert step.explained_variance(r, r, m) == 1.0
    assert step.explained_variance(torch.zeros_like(r), r, m) == 0.0  # Var(R − 0) = Var(R)
    half = step.explained_variance(torch.tensor([[2.0, 2.0, 2.0, 0.0]]), r, m)
    assert half == pytest.approx(0.0)  # a constant baseline explains none of the variance
    assert step.explained_variance(0.5 * r, r, m) == pytest.approx(0.75)
    assert step.explained_variance(r, torch.ones_like(r), m) is None  # constant returns
    assert np.isnan(step.masked_mean(r, torch.zeros_like(m)))
