"""Comp-GAE on the batch's gates and values (integrations.verl.estimator) and verl's packed layout
(integrations.verl.layout).

The estimator equals ``cc.gae`` with the same gates (and ``masked_whiten`` of its advantages,
as verl's GAE branch); the layout helpers equal verl's own conversions where verl has one
(``response_from_nested``; those tests are skipped without verl). The end-to-end test runs
the CompPO engine's old-log-prob pass (verl's FSDP2 engine on the CPU, tests/verl_cpu.py),
turns its ``comp_gates`` and ``values`` into the response layout and checks the advantages
against ``cc.gae`` on :func:`comppo_core.rl.forward`'s gates and values of the padded batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import comppo_core as cc  # noqa: E402
from comppo_core.errors import OutOfRangeError, ParameterError, ShapeError
from comppo_core.integrations.verl.engine import EngineSettings
from comppo_core.integrations.verl.estimator import compute_comp_gae_advantage_return
from comppo_core.integrations.verl.layout import (
    from_nested_columns,
    response_columns,
    response_layout,
    to_nested_columns,
)
from comppo_core.whitening import masked_whiten

TOL = 1e-5


def response_batch(seed: int = 0, b: int = 5, r: int = 7) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, r + 1, (b,), generator=g)
    mask = (torch.arange(r)[None] < lengths[:, None]).to(torch.long)
    mask[0, 0] = 0  # a tool token inside a response
    return {
        "rewards": torch.randn(b, r, generator=g) * mask,
        "values": torch.randn(b, r, generator=g),
        "gates": torch.rand(b, r, generator=g),
        "mask": mask,
    }


# --------------------------------------------------------------------------- #
# the estimator
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("with_gates", [True, False])
@pytest.mark.parametrize("whiten", [True, False])
def test_estimator_equals_cc_gae(with_gates: bool, whiten: bool) -> None:
    x = response_batch()
    gates = x["gates"] if with_gates else None
    adv, ret = compute_comp_gae_advantage_return(x["rewards"], x["values"], x["mask"], gates, 0.99, 0.95, whiten=whiten)
    m = x["mask"].numpy() != 0
    want_adv, want_ret = cc.gae(
        x["rewards"].double().numpy(),
        x["values"].double().numpy(),
        mask=m,
        gates=None if gates is None else gates.double().numpy(),
        gamma=0.99,
        lam=0.95,
        masked_rewards="drop",
    )
    if whiten:
        want_adv = masked_whiten(want_adv, mask=m)
    assert isinstance(adv, torch.Tensor) and adv.dtype == torch.float32 and adv.shape == x["rewards"].shape
    np.testing.assert_allclose(adv.numpy(), want_adv, atol=TOL, rtol=0)
    np.testing.assert_allclose(ret.numpy(), want_ret, atol=TOL, rtol=0)
    assert bool((adv[x["mask"] == 0] == 0).all()) and bool((ret[x["mask"] == 0] == 0).all())


def test_estimator_gates_matter_and_inputs_unchanged() -> None:
    x = response_batch(1)
    before = {k: v.clone() for k, v in x.items()}
    gated, _ = compute_comp_gae_advantage_return(x["rewards"], x["values"], x["mask"], x["gates"], 1.0, 1.0)
    plain, _ = compute_comp_gae_advantage_return(x["rewards"], x["values"], x["mask"], None, 1.0, 1.0)
    ones, _ = compute_comp_gae_advantage_return(
        x["rewards"], x["values"], x["mask"], torch.ones_like(x["gates"]), 1.0, 1.0
    )
    assert torch.equal(plain, ones)
    assert float((gated - plain).abs().max()) > 1e-2
    for k in x:
        assert torch.equal(x[k], before[k])


def test_estimator_bad_gates() -> None:
    x = response_batch()
    bad = x["gates"].clone()
    bad[2, 0] = 1.5
    with pytest.raises(OutOfRangeError) as info:
        compute_comp_gae_advantage_return(x["rewards"], x["values"], x["mask"], bad, 1.0, 1.0)
    assert info.value.argument == "gates"


# --------------------------------------------------------------------------- #
# the layout
# --------------------------------------------------------------------------- #


def packed(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.long)
    values = torch.randn(int(cu[-1]), generator=torch.Generator().manual_seed(seed))
    return torch.nested.nested_tensor_from_jagged(values, cu), cu


def test_nested_columns_round_trip() -> None:
    nested, cu = packed([4, 2, 5])
    cols = from_nested_columns(nested, cu)
    assert cols.shape == (1, 10)
    flat = nested.values()
    # column j = entry j, except each sequence's last entry (3 and 5), the boundary: 0
    assert cols[0, 3] == 0 and cols[0, 5] == 0
    keep = torch.ones(10, dtype=torch.bool)
    keep[[3, 5]] = False
    assert torch.equal(cols[0, keep], flat[:10][keep])
    back = to_nested_columns(cols, cu, fill=1.0)
    assert torch.equal(back.offsets(), cu)
    assert torch.equal(back.values()[cu[1:] - 1], torch.ones(3))
    assert torch.equal(from_nested_columns(back, cu), cols)


def test_response_columns_nested_and_padded_agree() -> None:
    # three sequences: prompts 3, 1, 2 tokens; responses 2, 3, 1 tokens; one tool token
    lengths, responses = [5, 4, 3], [2, 3, 1]
    _, cu = packed(lengths)
    flags = [torch.tensor([1, 1]), torch.tensor([1, 0, 1]), torch.tensor([1])]
    nested_mask = torch.nested.as_nested_tensor(flags, layout=torch.jagged)
    r = max(responses)
    padded_mask = torch.zeros(3, r, dtype=torch.long)
    attention = torch.zeros(3, 3 + r, dtype=torch.long)
    for i, (length, resp) in enumerate(zip(lengths, responses, strict=True)):
        padded_mask[i, :resp] = flags[i]
        attention[i, 3 - (length - resp) : 3 + resp] = 1
    want = torch.zeros(1, 11, dtype=torch.bool)
    want[0, [2, 3]] = True  # sequence 0: tokens 3, 4 scored by columns 2, 3
    want[0, [5, 7]] = True  # sequence 1 (offset 5): tokens 6, 8 (7 is a tool token)
    want[0, [10]] = True  # sequence 2 (offset 9): token 11
    assert torch.equal(response_columns(cu, nested_mask), want)
    assert torch.equal(response_columns(cu, padded_mask, attention), want)


def test_response_columns_errors() -> None:
    _, cu = packed([3, 2])
    too_long = torch.nested.as_nested_tensor([torch.ones(1), torch.ones(2)], layout=torch.jagged)
    with pytest.raises(ShapeError, match="at most") as info:
        response_columns(cu, too_long)
    assert info.value.row == 1
    with pytest.raises(ShapeError) as info:
        response_columns(cu, torch.ones(2, 2))
    assert info.value.argument == "attention_mask"
    with pytest.raises(ShapeError) as info:
        response_columns(cu, torch.nested.as_nested_tensor([torch.ones(1)], layout=torch.jagged))
    assert info.value.argument == "response_mask"


def test_response_layout_equals_verls() -> None:
    pytest.importorskip("verl")
    from verl.workers.utils.padding import response_from_nested

    nested, _ = packed([5, 4, 3], seed=2)
    flags = [torch.tensor([1, 1]), torch.tensor([1, 0, 1]), torch.tensor([1])]
    nested_mask = torch.nested.as_nested_tensor(flags, layout=torch.jagged)
    want = response_from_nested(nested, nested_mask).to_padded_tensor(0.0)
    assert torch.equal(response_layout(nested, nested_mask), want)


def test_engine_settings_errors() -> None:
    with pytest.raises(ParameterError, match="micro-batch") as info:
        EngineSettings(gate_params=cc.GateParams(normalize="batch"))
    assert info.value.argument == "gate_params"
    EngineSettings(gate_params=cc.GateParams(normalize="batch"), causal=True)  # per sequence: fine
    with pytest.raises(ParameterError) as info:
        EngineSettings(tac=("taps", 0))  # type: ignore[arg-type]
    assert info.value.argument == "tac"


# --------------------------------------------------------------------------- #
# end to end: the engine's old-log-prob pass, then the estimator
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def verl_cpu() -> Iterator[None]:
    pytest.importorskip("verl")
    from verl_cpu import cpu_process_group

    torch.set_num_threads(1)
    with cpu_process_group():
        yield


def test_engine_outputs_to_estimator_equal_cc_gae(verl_cpu: None, tmp_path: Any) -> None:
    from verl_cpu import TAU, new_engine, old_log_prob_batch, rollout, tiny_llama

    from comppo_core import rl
    from comppo_core.integrations.verl import engine as comppo_engine

    tac_settings = {"taps": (0, 2), "width": 16, "temporal": "gru"}
    params = cc.GateParams(low=0.2, normalize="sequence")
    saved = comppo_engine.engine_settings()
    try:
        comppo_engine.register_engine()
        comppo_engine.configure_engine(comppo_engine.EngineSettings(tac=tac_settings, gate_params=params))
        hf_model = tiny_llama(str(tmp_path / "tiny"))
        engine = new_engine(str(tmp_path / "tiny"), model_type=comppo_engine.MODEL_TYPE)
    finally:
        comppo_engine.configure_engine(saved)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in engine.module.comppo_tac.head.parameters():
            full = torch.randn(tuple(p.shape), generator=g)
            p.copy_(torch.distributed.tensor.distribute_tensor(full, p.device_mesh, p.placements))
    batch = rollout()
    td = old_log_prob_batch(batch, comppo_probe=True)
    with engine.eval_mode():
        out = engine.infer_batch(td, loss_function=None)["model_output"]
    mask, attention = batch["response_mask"], batch["attention_mask"]
    gates = response_layout(out["comp_gates"], mask, attention)
    values = response_layout(out["values"], mask, attention)
    b, r = mask.shape
    rewards = torch.zeros(b, r)
    last = attention[:, -r:].sum(1) - 1
    rewards[torch.arange(b), last] = torch.tensor([1.0, -0.5, 0.25, 2.0])
    adv, ret = compute_comp_gae_advantage_return(rewards, values, mask, gates, 1.0, 0.95)

    tac = rl.TransportAlignedCritic.for_model(hf_model, **tac_settings)
    tac.load_state_dict({k: v.full_tensor() for k, v in engine.module.comppo_tac.state_dict().items()})
    p = batch["prompts"].shape[1]
    padded_resp = torch.cat([torch.zeros_like(batch["prompts"][:, 1:]), mask], 1) != 0
    ref = rl.forward(
        hf_model,
        batch["input_ids"],
        attention,
        response_mask=padded_resp,
        temperature=TAU,
        critic=tac.eval(),
        gate_params=params,
    )
    # response token k (position p + k) is scored by column p + k − 1
    ref_gates, ref_values = ref.gates[:, p - 1 :], ref.values[:, p - 1 :]
    m = mask != 0
    assert float((gates[m] - ref_gates[m]).abs().max()) <= TOL
    assert float((values[m] - ref_values[m]).abs().max()) <= TOL
    want_adv, want_ret = cc.gae(
        rewards.double().numpy(),
        ref_values.double().numpy(),
        mask=m.numpy(),
        gates=torch.where(m, ref_gates, 1.0).double().numpy(),
        gamma=1.0,
        lam=0.95,
        masked_rewards="drop",
    )
    want_adv = masked_whiten(want_adv, mask=m.numpy())
    np.testing.assert_allclose(adv.numpy(), want_adv, atol=TOL, rtol=0)
    np.testing.assert_allclose(ret.numpy(), want_ret, atol=TOL, rtol=0)
    assert int((gates[m] < 0.99).sum()) >= 3
