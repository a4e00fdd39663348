"""``comppo_core.rl``: the one-pass forward, TAC and the standard critic.

Tiny randomly initialised Llama, Qwen3 and GPT-2 models built from configs (no
download). What is pinned: the forward's log-probs and concentration equal
``hf.logprobs_and_concentration``; values are causal (a column's value does not move
when later tokens change, and the test catches a non-causal gate); the actor gets no
gradient from the value loss by default, and exactly ``trunk_grad`` times the full
gradient otherwise; padding does not change a row's values; sizes at a Qwen3-0.6B shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import tiny_lm  # noqa: E402

import comppo_core as cc  # noqa: E402
from comppo_core import hf, rl  # noqa: E402
from comppo_core.errors import OutOfRangeError, ParameterError, ShapeError  # noqa: E402

VOCAB = 48
B, T = 3, 16
MIXERS = rl.TEMPORAL_MIXERS


def build(arch: str = "llama", *, dtype: Any = None, layers: int = 4) -> Any:
    """``conftest.tiny_lm`` with 4 layers (taps to spread over) and the architecture's own
    special tokens."""
    return tiny_lm(arch, vocab=VOCAB, layers=layers, max_positions=64, dtype=dtype, special_tokens=False)


def batch(padding: str = "left", seed: int = 1) -> tuple[Any, Any, Any]:
    """ids, attention mask and a response mask (the last 8 scored columns of each row)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    am = torch.ones(B, T, dtype=torch.long)
    if padding == "left":
        am[0, :3] = 0
        am[2, :1] = 0
    elif padding == "right":
        am[1, -4:] = 0
    cols = (am[:, :-1] * am[:, 1:]).bool()
    resp = torch.zeros(B, T - 1, dtype=torch.bool)
    for b in range(B):
        real = torch.nonzero(cols[b]).flatten()
        resp[b, real[-8:]] = True
    return ids, am, resp


def randomize_head(critic: Any, seed: int = 7) -> None:
    """The head starts at zero (every value 0): give it weights so values depend on inputs."""
    g = torch.Generator().manual_seed(seed)
    head = critic.head if hasattr(critic, "head") else critic.value_head
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g))


def tac(model: Any, **kw: Any) -> Any:
    torch.manual_seed(3)
    critic = rl.TransportAlignedCritic.for_model(model, width=32, **kw)
    randomize_head(critic)
    return critic


# --------------------------------------------------------------------------- #
# the forward pass
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_forward_matches_logprobs_and_concentration(arch: str, padding: str) -> None:
    model = build(arch)
    ids, am, resp = batch(padding)
    out = rl.forward(model, ids, am, critic=tac(model), response_mask=resp)
    ref = hf.logprobs_and_concentration_per_layer(model, ids, am)
    torch.testing.assert_close(out.logprobs, ref.logprobs, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.concentration, ref.concentration, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.per_layer, ref.per_layer, rtol=0, atol=1e-6)
    assert out.per_layer.shape == (B, T - 1, model.config.num_hidden_layers)
    for name in ("logprobs", "concentration", "gates", "values", "critic_gates"):
        x = getattr(out, name)
        assert x.shape == (B, T - 1) and x.dtype == torch.float32, name
        assert not x.requires_grad, name
    # gates: the package's mapping over the response columns, 1 elsewhere
    expected = cc.gates_from_concentration(out.concentration, mask=resp)
    torch.testing.assert_close(out.gates, expected, rtol=0, atol=0)
    assert torch.all(out.gates[~resp] == 1)
    cols = (am[:, :-1] * am[:, 1:]).bool()
    assert torch.all(out.values[~cols] == 0) and torch.all(out.logprobs[~cols] == 0)


def test_forward_default_response_mask_is_every_scored_column() -> None:
    model = build()
    ids, am, _ = batch("left")
    out = rl.forward(model, ids, am)
    assert torch.equal(out.response_mask, (am[:, :-1] * am[:, 1:]).bool())
    assert out.values is None and out.critic_gates is None


def test_given_gates_replace_comp_gaes_gates_not_the_critics() -> None:
    model = build()
    ids, am, resp = batch("left")
    const = torch.full((B, T - 1), 0.95)
    critic = tac(model)
    out = rl.forward(model, ids, am, critic=critic, response_mask=resp, gates=const)
    own = rl.forward(model, ids, am, critic=critic, response_mask=resp)
    assert torch.all(out.gates[resp] == 0.95) and torch.all(out.gates[~resp] == 1)
    assert out.concentration is not None and out.critic_gates is not None
    assert torch.equal(out.critic_gates, rl.causal_gates(out.concentration, resp, rl.GateParams()))
    assert torch.equal(out.values, own.values)  # the critic reads the prefix, whatever Comp-GAE's gates


def test_gates_as_a_function_of_the_concentration_gates_equal_two_passes() -> None:
    """``gates=f`` (a control) gets this forward's concentration gates, concentration and
    response mask, and gives what passing ``f``'s output from a first forward gives."""
    model = build()
    ids, am, resp = batch("left")
    critic = tac(model)
    seen: list[tuple[Any, ...]] = []

    def reverse(own: Any, conc: Any, m: Any) -> Any:
        seen.append((own.clone(), conc.clone(), m.clone()))
        return torch.where(m, 1.0 - 0.5 * own, 1.0)

    one = rl.forward(model, ids, am, critic=critic, response_mask=resp, gates=reverse, temperature=0.7)
    first = rl.forward(model, ids, am, response_mask=resp)
    ((own, conc, m),) = seen
    assert torch.equal(own, first.gates) and torch.equal(conc, first.concentration) and torch.equal(m, resp)
    two = rl.forward(model, ids, am, critic=critic, response_mask=resp, gates=reverse(own, conc, m), temperature=0.7)
    for name in ("logprobs", "concentration", "per_layer", "gates", "values", "critic_gates"):
        assert torch.equal(getattr(one, name), getattr(two, name)), name
    assert not torch.equal(one.gates, first.gates)
    with pytest.raises(OutOfRangeError, match="gates: expected values in"):
        rl.forward(model, ids, am, response_mask=resp, gates=lambda own, conc, m: own + 1.0)


def test_gate_params_are_used() -> None:
    model = build()
    ids, am, resp = batch("left")
    params = rl.GateParams(low=0.5, high=0.8, sharpness=3.0)
    out = rl.forward(model, ids, am, response_mask=resp, gate_params=params)
    expected = cc.gates_from_concentration(out.concentration, mask=resp, params=params)
    torch.testing.assert_close(out.gates, expected, rtol=0, atol=0)
    assert float(out.gates[resp].min()) >= 0.5 and float(out.gates[resp].max()) <= 0.8


# --------------------------------------------------------------------------- #
# causality
# --------------------------------------------------------------------------- #


def _values_after_changing_tail(model: Any, critic: Any, k: int, gates_fn: Any = None) -> tuple[Any, Any]:
    ids, am, resp = batch("none", seed=5)
    ids2 = ids.clone()
    ids2[:, k:] = torch.randint(3, VOCAB, (B, T - k), generator=torch.Generator().manual_seed(9))
    outs = []
    for x in (ids, ids2):
        gates = None if gates_fn is None else gates_fn(model, x, am, resp)
        outs.append(rl.forward(model, x, am, critic=critic, response_mask=resp, gates=gates).values)
    return outs[0], outs[1]


@pytest.mark.parametrize("temporal", MIXERS)
def test_tac_values_are_causal_with_default_gates(temporal: str) -> None:
    model = build()
    critic = tac(model, temporal=temporal)
    k = T - 4  # inside the response (the last 8 columns)
    v1, v2 = _values_after_changing_tail(model, critic, k)
    torch.testing.assert_close(v1[:, :k], v2[:, :k], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(v1[:, k:], v2[:, k:])  # the change is visible where it may be


def test_standard_critic_values_are_causal() -> None:
    model = build()
    critic = rl.StandardCritic.from_actor(model)
    randomize_head(critic)
    v1, v2 = _values_after_changing_tail(model, critic, T - 4)
    torch.testing.assert_close(v1[:, : T - 4], v2[:, : T - 4], rtol=1e-5, atol=1e-5)


def test_causality_test_catches_a_row_normalised_gate(monkeypatch: Any) -> None:
    """Feeding TAC the whole-row z-scored gates (what Comp-GAE uses) breaks causality,
    and the check above sees it: the reason TAC normalises causally. Given gates (a
    control, a constant) replace Comp-GAE's gates only, so they cannot do this."""
    params = cc.GateParams(low=0.2, high=1.0, sharpness=4.0, normalize="sequence")

    def row_normalised(model: Any, ids: Any, am: Any, resp: Any) -> Any:
        conc = rl.forward(model, ids, am).concentration
        return cc.gates_from_concentration(conc, mask=resp, params=params)

    model = build()
    critic = tac(model)
    k = T - 4
    v1, v2 = _values_after_changing_tail(model, critic, k, row_normalised)  # Comp-GAE's gates only
    torch.testing.assert_close(v1[:, :k], v2[:, :k], rtol=1e-5, atol=1e-5)

    def whole_row_features(conc: Any, mask: Any, _: Any) -> Any:
        return torch.as_tensor(cc.gates_from_concentration(conc, mask=mask, params=params), dtype=torch.float32)

    monkeypatch.setattr("comppo_core.rl.core.policy_forward.causal_gates", whole_row_features)
    v1, v2 = _values_after_changing_tail(model, critic, k)
    assert float((v1[:, :k] - v2[:, :k]).abs().max()) > 1e-2


# --------------------------------------------------------------------------- #
# causal gates
# --------------------------------------------------------------------------- #


def _running_zscore_reference(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    out = np.zeros_like(x, dtype=np.float64)
    for b in range(x.shape[0]):
        seen: list[float] = []
        for t in range(x.shape[1]):
            if not mask[b, t]:
                continue
            seen.append(float(x[b, t]))
            mu, sd = np.mean(seen), np.std(seen)
            out[b, t] = 0.0 if len(seen) < 2 or sd == 0 else (seen[-1] - mu) / (sd + 1e-8)
    return out


def test_running_zscore_matches_a_loop() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 20))
    mask = rng.random((4, 20)) < 0.7
    x[3] = 0.25  # a constant row: exactly 0
    got = rl.running_zscore(torch.from_numpy(x), torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(got, _running_zscore_reference(x, mask), rtol=1e-9, atol=1e-12)
    assert np.all(got[3] == 0)


def test_causal_gates_end_at_the_row_gate_and_none_is_unchanged() -> None:
    rng = np.random.default_rng(1)
    conc = torch.from_numpy(rng.random((3, 12)).astype(np.float32))
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[1, 8:] = False
    params = rl.GateParams(low=0.5, high=1.0, sharpness=2.0, normalize="sequence")
    causal = rl.causal_gates(conc, mask, params)
    row = cc.gates_from_concentration(conc, mask=mask, params=params)
    # at a row's last valid token the running statistics are the whole row's
    for b, last in ((0, 11), (1, 7), (2, 11)):
        assert abs(float(causal[b, last]) - float(row[b, last])) < 1e-6
    assert torch.all(causal[~mask] == 1)
    pointwise = rl.GateParams(normalize="none", center=0.5, scale=0.2)
    torch.testing.assert_close(
        rl.causal_gates(conc, mask, pointwise), cc.gates_from_concentration(conc, mask=mask, params=pointwise)
    )


# --------------------------------------------------------------------------- #
# gradients
# --------------------------------------------------------------------------- #


def _value_loss_backward(model: Any, critic: Any) -> None:
    ids, am, resp = batch("left")
    out = rl.forward(model, ids, am, critic=critic, response_mask=resp, grad=True)
    returns = torch.linspace(-1, 1, (T - 1) * B).view(B, T - 1)
    loss, _ = rl.value_loss(out.values, out.values.detach(), returns, resp)
    loss.backward()


def test_value_loss_leaves_the_actor_gradient_zero_by_default() -> None:
    model = build()
    critic = tac(model)
    _value_loss_backward(model, critic)
    for name, p in model.named_parameters():
        assert p.grad is None or torch.count_nonzero(p.grad) == 0, name
    assert any(p.grad is not None and torch.count_nonzero(p.grad) > 0 for p in critic.parameters())


def test_trunk_grad_lets_that_fraction_into_the_trunk() -> None:
    grads = {}
    for frac in (1.0, 0.25):
        model = build()
        critic = tac(model, trunk_grad=frac)
        _value_loss_backward(model, critic)
        grads[frac] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads[1.0] and grads[1.0].keys() == grads[0.25].keys()
    for n, g in grads[1.0].items():
        torch.testing.assert_close(grads[0.25][n], 0.25 * g, rtol=1e-4, atol=1e-7)


def test_trunk_grad_leaves_the_values_bit_for_bit() -> None:
    """``trunk_grad`` changes the gradient only: the values equal the detached critic's exactly."""
    model = build()
    ids, am, resp = batch("left")
    values = {}
    for frac in (0.0, 0.3, 0.7, 1.0):
        critic = tac(model, trunk_grad=frac)
        values[frac] = rl.forward(model, ids, am, critic=critic, response_mask=resp, grad=True).values.detach()
    for frac in (0.3, 0.7, 1.0):
        assert torch.equal(values[frac], values[0.0]), frac


def test_grad_forward_logprobs_carry_the_policy_gradient() -> None:
    model = build()
    ids, am, resp = batch("left")
    out = rl.forward(model, ids, am, critic=tac(model), response_mask=resp, grad=True)
    assert out.logprobs.requires_grad and not out.concentration.requires_grad and not out.gates.requires_grad
    (out.logprobs * resp).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    # the same objective from a plain forward with no probe or hooks
    pos = hf.default_position_ids(am.bool())
    logits = model(input_ids=ids, attention_mask=am, position_ids=pos, use_cache=False).logits.float()
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    (lp * resp).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-3, atol=1e-5)
    # the statistics under grad equal those without
    ref = rl.forward(model, ids, am, response_mask=resp)
    torch.testing.assert_close(out.concentration, ref.concentration, rtol=0, atol=1e-6)


def test_standard_critic_value_gradient_stays_in_the_critic() -> None:
    model = build()
    critic = rl.StandardCritic.from_actor(model)
    _value_loss_backward(model, critic)
    assert all(p.grad is None for p in model.parameters())
    assert critic.value_head.weight.grad is not None


# --------------------------------------------------------------------------- #
# padding, dtypes, construction
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("temporal", MIXERS)
def test_values_do_not_depend_on_padding(temporal: str) -> None:
    model = build()
    critic = tac(model, temporal=temporal)
    ids, _, _ = batch("none")
    row = ids[:1, 4:]  # 12 real tokens
    lefts = torch.cat([torch.full((1, 4), 2), row], dim=1)
    rights = torch.cat([row, torch.full((1, 4), 2)], dim=1)
    mask_l = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 12, dtype=torch.long)], dim=1)
    mask_r = mask_l.flip(1)
    plain = rl.forward(model, row, torch.ones_like(row), critic=critic).values
    left = rl.forward(model, lefts, mask_l, critic=critic).values
    right = rl.forward(model, rights, mask_r, critic=critic).values
    torch.testing.assert_close(left[:, 4:], plain, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(right[:, :11], plain, rtol=1e-4, atol=1e-5)


def test_bfloat16_actor_on_cpu() -> None:
    model = build(dtype=torch.bfloat16)
    ids, am, resp = batch("left")
    critic = tac(model, temporal="gru")
    out = rl.forward(model, ids, am, critic=critic, response_mask=resp)
    assert out.values.dtype == torch.float32 and torch.isfinite(out.values).all()
    assert torch.isfinite(out.logprobs).all() and out.per_layer.dtype == torch.float32
    out = rl.forward(model, ids, am, critic=critic, response_mask=resp, grad=True)
    rl.value_loss(out.values, out.values.detach(), torch.zeros(B, T - 1), resp)[0].backward()


def test_head_starts_at_zero_and_taps_default_spread_over_depth() -> None:
    model = build(layers=8)
    critic = rl.TransportAlignedCritic.for_model(model)
    assert critic.taps == (1, 3, 5, 7) and critic.width == 256
    assert rl.default_taps(28) == (6, 13, 20, 27)
    assert torch.count_nonzero(critic.head.weight) == 0 and critic.head.weight.dtype == torch.float32
    ids, am, resp = batch("left")
    assert torch.all(rl.forward(model, ids, am, critic=critic, response_mask=resp).values == 0)
    assert rl.TransportAlignedCritic.for_model(model, taps=[-1, 0]).taps == (0, 7)


def test_size_at_qwen3_0_6b_shape_on_meta() -> None:
    with torch.device("meta"):  # Qwen3-0.6B's config, the architecture's defaults elsewhere
        actor = tiny_lm(
            "qwen3", vocab=151936, hidden=1024, intermediate=3072, layers=28, heads=16, kv_heads=8, head_dim=128,
            tie_word_embeddings=True, max_positions=None, init=None, special_tokens=False,
        )  # fmt: skip
    critic = rl.TransportAlignedCritic.for_model(actor)
    assert next(critic.parameters()).device.type == "meta"
    n_actor = sum(p.numel() for p in actor.parameters())  # tied embeddings counted once
    n_critic = rl.parameter_count(critic)
    assert n_critic <= 0.01 * n_actor, (n_critic, n_actor)
    for temporal in ("gru", "attention"):
        assert rl.parameter_count(rl.TransportAlignedCritic.for_model(actor, temporal=temporal)) <= 0.01 * n_actor


def test_standard_critic_from_actor_and_from_pretrained(tmp_path: Any) -> None:
    model = build()
    critic = rl.StandardCritic.from_actor(model)
    for (n, p), (_, q) in zip(model.base_model.named_parameters(), critic.backbone.named_parameters()):
        assert torch.equal(p, q) and p.data_ptr() != q.data_ptr(), n
    model.base_model.save_pretrained(tmp_path)
    loaded = rl.StandardCritic.from_pretrained(str(tmp_path))
    ids, am, resp = batch("left")
    with torch.no_grad():
        loaded.value_head.weight.copy_(critic.value_head.weight)
    v1 = rl.forward(model, ids, am, critic=critic, response_mask=resp).values
    v2 = rl.forward(model, ids, am, critic=loaded, response_mask=resp).values
    torch.testing.assert_close(v1, v2)


# --------------------------------------------------------------------------- #
# errors
# --------------------------------------------------------------------------- #


def test_bad_inputs_name_the_argument() -> None:
    model = build()
    ids, am, resp = batch("left")
    with pytest.raises(ShapeError, match="response_mask"):
        rl.forward(model, ids, am, response_mask=resp[:, :-1])
    padded = resp.clone()
    padded[0, 0] = True  # row 0 is left-padded: column 0 is padding
    with pytest.raises(ShapeError, match=r"response_mask.*row 0, position 0"):
        rl.forward(model, ids, am, response_mask=padded)
    bad = torch.ones(B, T - 1)
    bad[1, 5] = 1.5
    with pytest.raises(OutOfRangeError, match=r"gates.*row 1, position 5"):
        rl.forward(model, ids, am, gates=bad)
    with pytest.raises(ShapeError, match="per_layer"):
        rl.forward(model, ids, am, critic=tac(model), layers=[0, 1])
    with pytest.raises(ParameterError, match="temporal"):
        rl.TransportAlignedCritic.for_model(model, temporal="lstm")
    with pytest.raises(ParameterError, match="trunk_grad"):
        rl.TransportAlignedCritic.for_model(model, trunk_grad=2.0)
    with pytest.raises(ParameterError, match="taps"):
        rl.TransportAlignedCritic.for_model(model, taps=[9])
    with pytest.raises(ParameterError, match="low"):
        rl.GateParams(low=0.9, high=0.5)
