"""``comppo_core.hf.comp_gae_batch``: probe → gates → Comp-GAE, with the paper's controls."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import comppo_core as cc  # noqa: E402
from comppo_core import GateParams, hf, reference  # noqa: E402
from comppo_core.errors import ComppoError, MaskedRewardError, ParameterError, ShapeError  # noqa: E402

VOCAB = 64
B, T = 4, 20


@pytest.fixture(scope="module")
def model(tiny_lm: Any) -> Any:
    return tiny_lm("qwen3", vocab=VOCAB, head_dim=8, max_positions=64)


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    """Left-padded prompts followed by right-padded responses, as a rollout batch looks."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    am = torch.ones(B, T, dtype=torch.long)
    tm = torch.zeros(B, T, dtype=torch.long)  # the response tokens
    prompt_start = [0, 2, 4, 1]  # left padding before the prompt
    response_start = [6, 7, 8, 6]
    response_end = [20, 15, 18, 9]  # exclusive; right padding after
    for b in range(B):
        am[b, : prompt_start[b]] = 0
        am[b, response_end[b] :] = 0
        tm[b, response_start[b] : response_end[b]] = 1
    ids = torch.where(am.bool(), ids, torch.full_like(ids, 2))
    scores = torch.tensor([1.0, -1.0, 0.5, -0.25])
    values = torch.randn(B, T, generator=g) * 0.3 * am  # the critic's output at each position
    rm = tm[:, 1:]  # the response columns [B, T-1]: column j is token j+1
    return dict(ids=ids, am=am, tm=tm, rm=rm, scores=scores, values=values, ends=response_end, starts=response_start)


def run(model: Any, data: dict[str, Any], **kw: Any) -> hf.CompPOBatch:
    kw.setdefault("rewards", data["scores"])
    kw.setdefault("gamma", 0.99)
    kw.setdefault("lam", 0.95)
    return hf.comp_gae_batch(model, data["ids"], data["am"], data["rm"], **kw)


def test_shapes_mask_and_rewards(model: Any, data: dict[str, Any]) -> None:
    out = run(model, data, values=data["values"])
    for name in (
        "logprobs",
        "concentration",
        "gates",
        "advantages",
        "returns",
        "gae_advantages",
        "gae_returns",
        "rewards",
        "values",
        "mask",
    ):
        assert getattr(out, name).shape == (B, T - 1), name
    # column j is token j+1: the response columns are [start-1, end-1)
    for b in range(B):
        expected = torch.zeros(T - 1, dtype=torch.bool)
        expected[data["starts"][b] - 1 : data["ends"][b] - 1] = True
        assert torch.equal(out.mask[b], expected)
        # the outcome sits on the last response token
        r = torch.zeros(T - 1)
        r[data["ends"][b] - 2] = data["scores"][b]
        assert torch.equal(out.rewards[b], r)
    assert torch.equal(out.values, data["values"][:, :-1])  # column j: V(state after token j)
    lp, conc = hf.logprobs_and_concentration(model, data["ids"], data["am"])
    assert torch.equal(out.logprobs, lp) and torch.equal(out.concentration, conc)


def test_gates_and_advantages_follow_the_library(model: Any, data: dict[str, Any]) -> None:
    out = run(model, data, values=data["values"], gate_params=GateParams(low=0.5, high=1.0, sharpness=2.0))
    m = out.mask
    gates = cc.gates_from_concentration(out.concentration, mask=m, params=GateParams(low=0.5, high=1.0, sharpness=2.0))
    assert torch.equal(out.gates, gates)
    assert torch.all(out.gates[~m] == 1) and torch.all((out.gates[m] >= 0.5) & (out.gates[m] <= 1.0))
    assert out.gates[m].std() > 0.05  # concentration-driven gates vary
    comp = cc.gae(out.rewards, out.values, mask=m, gates=gates, gamma=0.99, lam=0.95)
    plain = cc.gae(out.rewards, out.values, mask=m, gamma=0.99, lam=0.95)
    assert torch.equal(out.advantages, comp.advantages) and torch.equal(out.returns, comp.returns)
    assert torch.equal(out.gae_advantages, plain.advantages) and torch.equal(out.gae_returns, plain.returns)
    # and against the NumPy oracle of Comp-GAE
    ref_adv, ref_ret = reference.gae(
        out.rewards.numpy(), out.values.numpy(), mask=m.numpy(), gates=gates.numpy(), gamma=0.99, lam=0.95
    )
    np.testing.assert_allclose(out.advantages.numpy(), ref_adv, atol=1e-6)
    np.testing.assert_allclose(out.returns.numpy(), ref_ret, atol=1e-6)
    assert not torch.allclose(out.advantages, out.gae_advantages)


def test_default_gates_are_causal(model: Any, data: dict[str, Any]) -> None:
    """gate_params=None is GateParams(): the running z-score of each row's response columns
    (the trainers' causal gates); "sequence" stays available by name. Rewriting the end of
    a response moves no earlier gate: the probe's concentration at a column reads only the
    tokens up to it, and so does the gate."""
    from comppo_core.rl.critics.tac import causal_gates

    out = run(model, data)
    m = out.mask
    want = cc.gates_from_concentration(out.concentration, mask=m, params=GateParams(normalize="causal"))
    assert torch.equal(out.gates, want)
    assert torch.allclose(out.gates, causal_gates(out.concentration, m, GateParams()), atol=1e-6, rtol=0)
    whole = run(model, data, gate_params=GateParams(normalize="sequence"))
    assert torch.equal(
        whole.gates, cc.gates_from_concentration(whole.concentration, mask=m, params=GateParams(normalize="sequence"))
    )
    assert not torch.allclose(whole.gates, out.gates)

    cut = 12  # token 12 on: inside the response of rows 0 and 2 (columns 11 on)
    ids = data["ids"].clone()
    ids[:, cut:] = torch.where(data["am"][:, cut:].bool(), (ids[:, cut:] + 7) % (VOCAB - 3) + 3, ids[:, cut:])
    later = hf.comp_gae_batch(model, ids, data["am"], data["rm"], data["scores"], gamma=0.99, lam=0.95)
    assert not torch.allclose(later.concentration[:, cut - 1 :], out.concentration[:, cut - 1 :])
    torch.testing.assert_close(later.gates[:, : cut - 1], out.gates[:, : cut - 1], atol=1e-6, rtol=0)
    torch.testing.assert_close(later.concentration[:, : cut - 1], out.concentration[:, : cut - 1], atol=1e-6, rtol=0)
    # the whole-row z-score reads ahead: the same change moves row 0's earlier gates
    seq = GateParams(normalize="sequence")
    later_whole = hf.comp_gae_batch(
        model, ids, data["am"], data["rm"], data["scores"], gamma=0.99, lam=0.95, gate_params=seq
    )
    assert not torch.allclose(later_whole.gates[0, : cut - 1], whole.gates[0, : cut - 1], atol=1e-4)


def test_unit_gate_is_gae(model: Any, data: dict[str, Any]) -> None:
    out = run(model, data, values=data["values"], gate_params=GateParams.constant(1.0))
    assert torch.all(out.gates == 1)
    assert torch.equal(out.advantages, out.gae_advantages) and torch.equal(out.returns, out.gae_returns)


def test_constant_gate_is_discounted_gae(model: Any, data: dict[str, Any]) -> None:
    out = run(model, data, values=data["values"], gate_params=GateParams.constant(0.8))
    plain = cc.gae(out.rewards, out.values, mask=out.mask, gamma=0.99 * 0.8, lam=0.95)
    assert torch.allclose(out.advantages, plain.advantages, atol=1e-6)


def test_controls(model: Any, data: dict[str, Any]) -> None:
    base = run(model, data, gate_params=GateParams(low=0.5))
    m = base.mask
    shuffled = run(model, data, gate_params=GateParams(low=0.5), control="shuffle", seed=3)
    assert torch.equal(shuffled.gates, cc.controls.shuffle(base.gates, mask=m, seed=3))
    for b in range(B):  # same multiset per row, new order
        assert torch.equal(torch.sort(shuffled.gates[b][m[b]]).values, torch.sort(base.gates[b][m[b]]).values)
    assert not torch.equal(shuffled.gates, base.gates)
    assert not torch.equal(
        run(model, data, gate_params=GateParams(low=0.5), control="shuffle", seed=4).gates, shuffled.gates
    )

    by_pos = run(model, data, gate_params=GateParams(low=0.5), control="by_position")
    k = torch.cumsum(m.long(), dim=1) - 1  # valid-position index of each response token
    for idx in range(int(k.max()) + 1):
        sel = m & (k == idx)
        assert torch.allclose(
            by_pos.gates[sel], base.gates[sel].double().mean().float().expand(int(sel.sum())), atol=1e-6
        )

    const = run(model, data, gate_params=GateParams(low=0.5), control="constant")
    assert torch.allclose(const.gates[m], base.gates[m].double().mean().float().expand(int(m.sum())), atol=1e-6)
    for out in (shuffled, by_pos, const):
        assert torch.all(out.gates[~m] == 1)
        assert torch.equal(out.gae_advantages, base.gae_advantages)  # GAE does not see the gates
        expected = cc.gae(out.rewards, out.values, mask=m, gates=out.gates, gamma=0.99, lam=0.95)
        assert torch.equal(out.advantages, expected.advantages)
        assert not torch.allclose(out.advantages, base.advantages)


def test_invert_and_statistic_options(model: Any, data: dict[str, Any]) -> None:
    base = run(model, data, gate_params=GateParams(low=0.2))
    inv = run(model, data, gate_params=GateParams(low=0.2, invert=True))
    m = base.mask
    # inverting the z-score mirrors each gate about the midpoint (low + high)/2
    assert torch.allclose(inv.gates[m] + base.gates[m], torch.full_like(base.gates[m], 1.2), atol=1e-6)
    mx = run(model, data, statistic="max", layers=[1])
    _, conc = hf.logprobs_and_concentration(model, data["ids"], data["am"], statistic="max", layers=[1])
    assert torch.equal(mx.concentration, conc)


def test_reward_layouts(model: Any, data: dict[str, Any]) -> None:
    per_seq = run(model, data)
    tok = torch.zeros(B, T)
    for b in range(B):
        tok[b, data["ends"][b] - 1] = data["scores"][b]  # token coordinates
    per_token = run(model, data, rewards=tok)
    per_col = run(model, data, rewards=tok[:, 1:])
    assert torch.equal(per_token.advantages, per_seq.advantages)
    assert torch.equal(per_col.advantages, per_seq.advantages)
    # dense per-token rewards
    dense = torch.rand(B, T) * data["tm"]
    out = run(model, data, rewards=dense)
    assert torch.equal(out.rewards, dense[:, 1:])


def test_errors(model: Any, data: dict[str, Any]) -> None:
    with pytest.raises(ParameterError, match="control: expected one of 'none', 'shuffle', 'by_position', 'constant'"):
        run(model, data, control="random")
    with pytest.raises(ShapeError, match=r"rewards: expected \[B\] = \[4\] outcome scores"):
        run(model, data, rewards=torch.ones(3))
    with pytest.raises(ShapeError, match=r"rewards: expected \[B\] \(per sequence\), \[B, T\] = \[4, 20\]"):
        run(model, data, rewards=torch.ones(B, 7))
    with pytest.raises(
        ShapeError, match=r"values: expected \[B, T\] = \[4, 20\] or \[B, T-1\] = \[4, 19\], got \(4, 5\)"
    ):
        run(model, data, values=torch.ones(B, 5))
    with pytest.raises(MaskedRewardError, match="rewards: token 0 has no log-prob column"):
        run(model, data, rewards=torch.ones(B, T))
    # a reward on a prompt token is the classic padding bug: cc.gae rejects it
    bad = torch.zeros(B, T)
    bad[1, 4] = 1.0
    with pytest.raises(MaskedRewardError):
        run(model, data, rewards=bad)
    empty = data["rm"].clone()
    empty[2] = 0
    with pytest.raises(MaskedRewardError, match="rewards: row 2 has outcome 0.5 but no response token"):
        hf.comp_gae_batch(model, data["ids"], data["am"], empty, data["scores"])
    # a token mask [B, T] (the convention before 0.2) is refused, saying how to convert it
    with pytest.raises(
        ShapeError, match=r"response_mask: expected a tensor \[B, T−1\] = \[4, 19\] of response columns"
    ):
        hf.comp_gae_batch(model, data["ids"], data["am"], data["tm"], data["scores"])
    with pytest.raises(ComppoError, match="gamma"):
        hf.comp_gae_batch(model, data["ids"], data["am"], data["rm"], data["scores"], gamma=1.5)
    with pytest.raises(ComppoError, match="low"):
        hf.comp_gae_batch(
            model, data["ids"], data["am"], data["rm"], data["scores"], gate_params=GateParams(low=0.9, high=0.5)
        )


def test_row_without_response_and_zero_outcome(model: Any, data: dict[str, Any]) -> None:
    empty = data["rm"].clone()
    empty[2] = 0
    scores = data["scores"].clone()
    scores[2] = 0
    out = hf.comp_gae_batch(model, data["ids"], data["am"], empty, scores)
    assert not out.mask[2].any()
    assert torch.all(out.advantages[2] == 0) and torch.all(out.gates[2] == 1)


def test_values_are_per_position_critic_outputs(model: Any, data: dict[str, Any]) -> None:
    """``values[b, t] = V(input_ids[b, :t+1])``: column j (token j+1, emitted from state
    ``input_ids[:, :j+1]``) uses ``values[:, j]``. With λ = 0 the advantage of a response
    column is its one-step δ_j = r_j + γ·V_{j+1} − V_j, pinned here for values that are a
    function of the position (V = 0.1·(t + 1) at position t)."""
    gamma = 0.9
    pos = torch.arange(T, dtype=torch.float32)
    v_tok = (0.1 * (pos + 1)).expand(B, T).clone()
    out = run(model, data, values=v_tok, gamma=gamma, lam=0.0)
    cols = torch.arange(T - 1, dtype=torch.float32)
    assert torch.equal(out.values, (0.1 * (cols + 1)).expand(B, T - 1))  # not 0.1·(j + 2): x[:, :-1]
    for b in range(B):
        first, last = data["starts"][b] - 1, data["ends"][b] - 2  # response columns [first, last]
        for j in range(first, last + 1):
            v_next = 0.1 * (j + 2) if j < last else 0.0  # terminal: last_values = 0
            r = float(data["scores"][b]) if j == last else 0.0
            expected = r + gamma * v_next - 0.1 * (j + 1)
            assert abs(float(out.gae_advantages[b, j]) - expected) <= 1e-6, (b, j)
            assert abs(float(out.returns[b, j]) - (out.advantages[b, j] + 0.1 * (j + 1))) <= 1e-6
        # the first response column's value is the critic's output at the last prompt token
        assert float(out.values[b, first]) == float(v_tok[b, data["starts"][b] - 1])
    # [B, T-1] values are already in columns: the same result as values[:, :-1]
    same = run(model, data, values=v_tok[:, :-1], gamma=gamma, lam=0.0)
    assert torch.equal(same.values, out.values) and torch.equal(same.advantages, out.advantages)
    # a truncated row bootstraps from the critic's output at its last response token
    # (position end − 1): last_values[b] = values[b, end − 1]
    lv = torch.tensor([float(v_tok[b, data["ends"][b] - 1]) for b in range(B)])
    boot = run(model, data, values=v_tok, gamma=gamma, lam=0.0, last_values=lv)
    for b in range(B):
        last = data["ends"][b] - 2
        expected = float(data["scores"][b]) + gamma * 0.1 * (last + 2) - 0.1 * (last + 1)
        assert abs(float(boot.gae_advantages[b, last]) - expected) <= 1e-6, b
        assert torch.equal(boot.gae_advantages[b, :last], out.gae_advantages[b, :last])


def test_rewards_per_token_are_rewards_of_that_token(model: Any, data: dict[str, Any]) -> None:
    """``rewards[b, t]`` (token coordinates) is the reward of token t: column t − 1."""
    tok = torch.zeros(B, T)
    b, t = 1, data["starts"][1] + 2  # a response token
    tok[b, t] = 0.7
    out = run(model, data, rewards=tok, values=None, lam=0.0)
    assert float(out.rewards[b, t - 1]) == pytest.approx(0.7) and int((out.rewards != 0).sum()) == 1
    assert float(out.gae_advantages[b, t - 1]) == pytest.approx(0.7)
