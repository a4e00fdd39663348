"""``rl.forward`` on a packed row (verl's ``NO_PADDING`` layout) against the same sequences padded.

Three sequences of 5, 7 and 8 tokens end to end in one ``[1, 20]`` row, ``cu_seqlens``
``(0, 5, 12, 20)``, against the same sequences right-padded into a ``[3, 8]`` batch: the
log-probs, the concentration, the per-layer statistics, Comp-GAE's gates (the causal
default, the whole-sequence and the batch z-scores, ``causal=True``, the policy's own
uncertainty, a gate control), the TAC's values (every temporal mixer, and the gradient they
send into the TAC) and a standard critic's values agree within 1e-5 in float32 on a tiny
Llama; a column whose target starts the next sequence is outside the response (log-probs
and values 0, gates 1). The calls that cannot be a packed row raise, naming the argument.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import tiny_lm  # noqa: E402

import comppo_core as cc  # noqa: E402
from comppo_core import rl  # noqa: E402
from comppo_core.errors import LayoutError, ParameterError, ShapeError  # noqa: E402
from comppo_core.hf import lm  # noqa: E402
from comppo_core.rl.core import step  # noqa: E402
from comppo_core.rl.core.arms import ARMS  # noqa: E402

CU = (0, 5, 12, 20)
N = CU[-1]
LENGTHS = [CU[i + 1] - CU[i] for i in range(len(CU) - 1)]
#: the response: the last 3, 4 and 5 scored columns of the sequences
RESPONSE = (3, 4, 5)
TOL = 1e-5


@pytest.fixture(scope="module")
def model() -> Any:
    return tiny_lm("llama", layers=3, attn="sdpa")


@pytest.fixture(scope="module")
def rows() -> dict[str, Any]:
    """The packed row and the same sequences right-padded, with their response columns."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 32, (1, N), generator=g)
    cu = torch.tensor(CU)
    width = max(LENGTHS)
    padded = torch.full((len(LENGTHS), width), 2, dtype=torch.long)
    mask = torch.zeros(len(LENGTHS), width, dtype=torch.long)
    resp_padded = torch.zeros(len(LENGTHS), width - 1, dtype=torch.bool)
    resp = torch.zeros(1, N - 1, dtype=torch.bool)
    for i, (length, k) in enumerate(zip(LENGTHS, RESPONSE)):
        padded[i, :length] = ids[0, CU[i] : CU[i + 1]]
        mask[i, :length] = 1
        resp_padded[i, length - 1 - k : length - 1] = True
        resp[0, CU[i + 1] - 1 - k : CU[i + 1] - 1] = True
    return {"ids": ids, "cu": cu, "resp": resp, "padded": padded, "mask": mask, "resp_padded": resp_padded}


def packed_like(padded_out: Any, cu: Any) -> Any:
    """A padded ``[S, T'−1, ...]`` output in the packed ``[1, N−1, ...]`` layout (0 at the boundaries)."""
    return lm.pack_columns(padded_out, cu)


def max_diff(a: Any, b: Any) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.double() - b.double()).abs().max())


def boundaries() -> Any:
    """``[1, N−1]`` bool: the columns whose target starts the next sequence."""
    b = torch.zeros(1, N - 1, dtype=torch.bool)
    for end in CU[1:-1]:
        b[0, end - 1] = True
    return b


def both(model: Any, rows: dict[str, Any], **kwargs: Any) -> tuple[Any, Any]:
    packed = rl.forward(model, rows["ids"], None, cu_seqlens=rows["cu"], response_mask=rows["resp"], **kwargs)
    padded = rl.forward(model, rows["padded"], rows["mask"], response_mask=rows["resp_padded"], **kwargs)
    return packed, padded


@pytest.mark.parametrize(
    ("normalize", "causal"), [("causal", False), ("sequence", False), ("batch", False), ("sequence", True)]
)
def test_logprobs_concentration_and_gates_equal_the_padded_batch(
    model: Any, rows: dict[str, Any], normalize: str, causal: bool
) -> None:
    params = cc.GateParams(normalize=normalize, low=0.2)
    packed, padded = both(model, rows, gate_params=params, causal=causal, temperature=0.7)
    cu = rows["cu"]
    assert packed.logprobs.shape == packed.gates.shape == (1, N - 1)
    assert packed.per_layer.shape == (1, N - 1, 3)
    assert torch.equal(packed.response_mask, rows["resp"])
    assert max_diff(packed.logprobs, packed_like(padded.logprobs, cu)) <= TOL
    assert max_diff(packed.concentration, packed_like(padded.concentration, cu)) <= TOL
    assert max_diff(packed.per_layer, packed_like(padded.per_layer, cu)) <= TOL
    inside = ~boundaries()
    expect_gates = torch.where(inside, packed_like(padded.gates, cu), 1.0)
    assert max_diff(packed.gates, expect_gates) <= TOL
    assert bool((packed.gates[rows["resp"]] < 0.99).any())  # the gates vary: not vacuous
    assert torch.all(packed.gates[~rows["resp"]] == 1)
    assert torch.all(packed.logprobs[boundaries()] == 0)


def test_whole_sequence_gates_are_not_the_packed_row_s(model: Any, rows: dict[str, Any]) -> None:
    """The z-score runs per sequence: gating the packed row as one row would differ."""
    params = cc.GateParams(normalize="sequence", low=0.2)
    packed, _ = both(model, rows, gate_params=params)
    as_one_row = torch.as_tensor(
        cc.gates_from_concentration(packed.concentration, mask=rows["resp"], params=params), dtype=torch.float32
    )
    assert max_diff(packed.gates, as_one_row) > 1e-3


def test_log_prob_gradients_equal_the_padded_batch(model: Any, rows: dict[str, Any]) -> None:
    grads = []
    for packed in (True, False):
        model.zero_grad()
        if packed:
            out = rl.forward(model, rows["ids"], None, cu_seqlens=rows["cu"], response_mask=rows["resp"], grad=True)
            (out.logprobs * rows["resp"]).sum().backward()
        else:
            out = rl.forward(model, rows["padded"], rows["mask"], response_mask=rows["resp_padded"], grad=True)
            (out.logprobs * rows["resp_padded"]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    model.zero_grad()
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:  # gradients up to ~20 here: 1e-5 relative to their scale
        scale = max(1.0, float(grads[1][name].abs().max()))
        assert max_diff(grads[0][name], grads[1][name]) <= TOL * scale, name


@pytest.mark.parametrize("temporal", ["none", "gru", "attention"])
def test_tac_values_and_gradients_equal_the_padded_batch(model: Any, rows: dict[str, Any], temporal: str) -> None:
    torch.manual_seed(3)
    tac = rl.TransportAlignedCritic.for_model(model, taps=(0, 2), width=16, temporal=temporal, heads=2)
    with torch.no_grad():
        tac.head.weight.normal_()  # the head starts at 0: every value would be 0
        tac.head.bias.normal_()
    cu = rows["cu"]
    outs, grads = [], []
    for packed in (True, False):
        tac.zero_grad()
        if packed:
            out = rl.forward(
                model, rows["ids"], None, cu_seqlens=cu, response_mask=rows["resp"], critic=tac, critic_grad=True
            )
            values = out.values
        else:
            out = rl.forward(
                model, rows["padded"], rows["mask"], response_mask=rows["resp_padded"], critic=tac, critic_grad=True
            )
            values = packed_like(out.values, cu)
        (values * torch.linspace(0.5, 1.5, N - 1)).sum().backward()
        outs.append((values.detach(), out))
        grads.append({n: p.grad.clone() for n, p in tac.named_parameters() if p.grad is not None})
    (packed_values, packed_out), (padded_values, padded_out) = outs
    assert max_diff(packed_values, padded_values) <= TOL
    assert packed_values.std() > 1e-3  # the values vary: the comparison is not vacuous
    assert torch.all(packed_values[boundaries()] == 0)
    expect = torch.where(~boundaries(), packed_like(padded_out.critic_gates, cu), 1.0)
    assert max_diff(packed_out.critic_gates, expect) <= TOL
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        assert max_diff(grads[0][name], grads[1][name]) <= TOL, name


def test_standard_critic_values_equal_the_padded_batch(model: Any, rows: dict[str, Any]) -> None:
    critic = rl.StandardCritic.from_actor(model, generator=torch.Generator().manual_seed(1))
    packed, padded = both(model, rows, critic=critic, routing=False)
    assert max_diff(packed.values, packed_like(padded.values, rows["cu"])) <= TOL
    assert packed.values.std() > 1e-3
    assert packed.gates is None and torch.all(packed.critic_gates == 1)


@pytest.mark.parametrize("statistic", ["token_nll", "policy_entropy"])
@pytest.mark.parametrize("causal", [False, True])
def test_policy_statistic_gates_equal_the_padded_batch(
    model: Any, rows: dict[str, Any], statistic: str, causal: bool
) -> None:
    params = cc.GateParams(normalize="sequence", low=0.2)
    packed, padded = both(model, rows, gate_params=params, causal=causal, policy_statistic=statistic, routing=False)
    cu = rows["cu"]
    assert max_diff(packed.gate_statistic, packed_like(padded.gate_statistic, cu)) <= TOL
    expect = torch.where(~boundaries(), packed_like(padded.gates, cu), 1.0)
    assert max_diff(packed.gates, expect) <= TOL
    assert bool((packed.gates[rows["resp"]] < 0.99).any())


def test_gate_controls_read_one_row_per_sequence(model: Any, rows: dict[str, Any]) -> None:
    """A ``gates`` function sees the rows of the separate sequences; a gates tensor is packed."""
    seen: list[Any] = []

    def reverse(own: Any, concentration: Any, response_mask: Any) -> Any:
        seen.append(own.shape)
        return torch.where(response_mask, 1.2 - own, 1.0)

    packed, padded = both(model, rows, gates=reverse)
    assert seen == [(3, max(LENGTHS) - 1), (3, max(LENGTHS) - 1)]
    assert max_diff(packed.gates, torch.where(~boundaries(), packed_like(padded.gates, rows["cu"]), 1.0)) <= TOL
    fixed = torch.full((1, N - 1), 0.4)
    out = rl.forward(model, rows["ids"], None, cu_seqlens=rows["cu"], response_mask=rows["resp"], gates=fixed)
    assert torch.equal(out.gates, torch.where(rows["resp"], 0.4, 1.0))


def test_step_score_passes_cu_seqlens(model: Any, rows: dict[str, Any]) -> None:
    arm = ARMS["comppo"]
    settings = step.ScoringSettings(gate_params=cc.GateParams(low=0.3), temperature=0.8)
    torch.manual_seed(0)
    tac = rl.TransportAlignedCritic.for_model(model, taps=(1,), width=8)
    with torch.no_grad():
        tac.head.bias.fill_(0.25)
    packed = step.score(model, tac, rows["ids"], None, rows["resp"], arm=arm, settings=settings, cu_seqlens=rows["cu"])
    padded = step.score(model, tac, rows["padded"], rows["mask"], rows["resp_padded"], arm=arm, settings=settings)
    cu = rows["cu"]
    assert max_diff(packed.logprobs, packed_like(padded.logprobs, cu)) <= TOL
    assert max_diff(packed.values, packed_like(padded.values, cu)) <= TOL  # type: ignore[arg-type]
    assert max_diff(packed.gates, torch.where(~boundaries(), packed_like(padded.gates, cu), 1.0)) <= TOL  # type: ignore[arg-type]
    distributed = step.Rows(gather=lambda x: x, local=slice(None), distributed=True)
    with pytest.raises(ParameterError, match="cu_seqlens: expected the process's own rows") as err:
        step.score(
            model, tac, rows["ids"], None, rows["resp"], arm=arm, settings=settings, cu_seqlens=cu, rows=distributed
        )
    assert err.value.argument == "cu_seqlens"


def test_calls_that_cannot_be_a_packed_row_raise(model: Any, rows: dict[str, Any]) -> None:
    ids, cu = rows["ids"], rows["cu"]
    with pytest.raises(ParameterError, match="attention_mask: expected None with cu_seqlens") as err:
        rl.forward(model, ids, torch.ones_like(ids), cu_seqlens=cu)
    assert err.value.argument == "attention_mask"
    with pytest.raises(ShapeError, match=re.escape("input_ids: with cu_seqlens expected one packed row [1, N]")):
        rl.forward(model, rows["padded"], None, cu_seqlens=cu)
    with pytest.raises(LayoutError, match="cu_seqlens: expected to end at N = 20") as layout:
        rl.forward(model, ids, None, cu_seqlens=[0, 5, 19])
    assert layout.value.argument == "cu_seqlens"
    bad_resp = rows["resp"].clone()
    bad_resp[0, CU[1] - 1] = True  # the column whose target is the second sequence's first token
    with pytest.raises(ShapeError, match=re.escape("starts the next sequence at (row 0, position 4)")) as shape:
        rl.forward(model, ids, None, cu_seqlens=cu, response_mask=bad_resp)
    assert shape.value.argument == "response_mask"
    wrong = lm.packed_position_ids(cu).clone()
    wrong[0, 5] = 5
    with pytest.raises(ParameterError, match="position_ids: expected the positions cu_seqlens gives"):
        rl.forward(model, ids, None, cu_seqlens=cu, position_ids=wrong)
    with pytest.raises(ShapeError, match=re.escape("gates: expected a tensor [B, T−1] = [1, 19]")):
        rl.forward(model, ids, None, cu_seqlens=cu, gates=torch.ones(3, 7))
    assert bool(bad_resp[0, CU[1] - 1]) and not bool(rows["resp"][0, CU[1] - 1])  # inputs not modified
