"""Per-layer attention concentration (``ConcentrationProbe(per_layer=True)``) and recording
passes run with gradients enabled (``record_with_grad=True``).

Tiny randomly initialised Llama, Qwen3 and GPT-2 models with three layers (no download),
so that a layer subset can leave a layer out between two selected ones. Each layer's
reference statistic is computed from the same model's eager ``output_attentions=True``
weights with the visibility mask of ``test_hf_probe`` (causal ∩ not padding ∩ sliding
window), in float64.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_hf_probe import (
    BF16_ATOL,
    STATS,
    B,
    T,
    batch,
    build,
    forward_kwargs,
    nan_token_model,
    reference_from_weights,
    visibility,
)

from comppo_core import hf
from comppo_core.errors import NonFiniteError, ParameterError

ARCHS = ("llama", "qwen3", "gpt2")
PADDINGS = ("left", "right", "both")
LAYERS = 3
#: (layers argument, the layers it selects in ascending order): all, a subset with a
#: negative index given out of order and skipping layer 1, a single negative index
SELECTIONS = ((None, (0, 1, 2)), ([-1, 0], (0, 2)), ([-2], (1,)))


def build3(arch: str, dtype: Any = None) -> Any:
    """``test_hf_probe``'s tiny model with three layers: Qwen3's layer 0 is full attention
    and layers 1, 2 a sliding window of 6 < T."""
    return build(arch, dtype, layers=LAYERS)


@functools.cache
def eager3(arch: str, padding: str, dtype_name: str = "float32") -> tuple[Any, Any, Any, Any]:
    """(model, ids, am, eager attention weights per layer) for one architecture and padding."""
    model = build3(arch, getattr(torch, dtype_name))
    assert model.config._attn_implementation == "sdpa"
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    ids, am = batch(padding)
    with torch.no_grad():
        out = eager(**forward_kwargs(ids, am), output_attentions=True)
    assert len(out.attentions) == LAYERS
    return model, ids, am, out.attentions


def reference_per_layer(
    arch: str, padding: str, statistic: str, layers: tuple[int, ...], dtype_name: str = "float32"
) -> Any:
    """``[B, T, len(layers)]`` float64 head-mean statistic of each layer, 0 at padding."""
    model, _, am, attentions = eager3(arch, padding, dtype_name)
    cols = [reference_from_weights(attentions[i], visibility(model, am, i), statistic) for i in layers]
    ref = torch.stack(cols, dim=-1)
    return torch.where((am != 0)[..., None], ref, 0.0)


def run(model: Any, ids: Any, am: Any, statistic: str = "entropy", **kw: Any) -> Any:
    with torch.no_grad(), hf.ConcentrationProbe(model, statistic, per_layer=True, **kw) as probe:
        model(**forward_kwargs(ids, am))
    return probe


# --------------------------------------------------------------------------- #
# Each layer's statistic against eager attention weights
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("arch", ARCHS)
def test_per_layer_matches_eager_attention_weights(arch: str, padding: str) -> None:
    model, ids, am, _ = eager3(arch, padding)
    for statistic in STATS:
        for layers, chosen in SELECTIONS:
            probe = run(model, ids, am, statistic, layers=layers)
            assert probe.layers == chosen
            per = probe.per_layer
            assert per.shape == (B, T, len(chosen)) and per.dtype == torch.float32
            assert per.device == next(model.parameters()).device and not per.requires_grad
            ref = reference_per_layer(arch, padding, statistic, chosen)
            err = (per.double() - ref).abs().max().item()
            assert err <= 1e-4, (arch, padding, statistic, layers, err)
            assert torch.all(per[am == 0] == 0)  # padded query positions, every layer
            # the mean over layers is the probe's concentration, which is unchanged by per_layer
            conc = probe.concentration
            assert torch.allclose(per.mean(-1), conc, rtol=0, atol=1e-6)
            with torch.no_grad(), hf.ConcentrationProbe(model, statistic, layers=layers) as plain:
                model(**forward_kwargs(ids, am))
            assert torch.equal(plain.concentration, conc)
        # not vacuous: the layers differ from each other, so a column mix-up would be caught
        ref = reference_per_layer(arch, padding, statistic, (0, 1, 2))
        real = am != 0
        for i in range(LAYERS):
            for j in range(i):
                assert (ref[..., i] - ref[..., j])[real].abs().max() > 1e-2, (arch, statistic, i, j)


def test_columns_follow_ascending_layer_order() -> None:
    """``layers=[2, 0]`` and ``[0, 2]`` give the same tensor, column 0 = layer 0."""
    model, ids, am, _ = eager3("llama", "both")
    a = run(model, ids, am, "max", layers=[2, 0]).per_layer
    b = run(model, ids, am, "max", layers=[0, 2]).per_layer
    full = run(model, ids, am, "max").per_layer
    assert torch.equal(a, b)
    assert torch.equal(a[..., 0], full[..., 0]) and torch.equal(a[..., 1], full[..., 2])


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_bfloat16_model(arch: str) -> None:
    model, ids, am, _ = eager3(arch, "both", "bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    for statistic in STATS:
        probe = run(model, ids, am, statistic, layers=[0, -1])
        per = probe.per_layer
        assert per.dtype == torch.float32 and per.shape == (B, T, 2)
        ref = reference_per_layer(arch, "both", statistic, (0, 2), "bfloat16")
        assert (per.double() - ref).abs().max() <= BF16_ATOL, statistic
        assert torch.all(per[am == 0] == 0)
        assert torch.allclose(per.mean(-1), probe.concentration, rtol=0, atol=1e-6)


@pytest.mark.parametrize("padding", ["right", "both"])
def test_methods_agree(padding: str) -> None:
    """Every method available on CPU gives the same per-layer statistics ("fused"
    computes entropy and l2; "max" has the chunked method only)."""
    model, ids, am, _ = eager3("qwen3", padding)
    for statistic in STATS:
        chunked = run(model, ids, am, statistic, method="chunked", query_chunk=5).per_layer
        whole = run(model, ids, am, statistic, method="chunked", query_chunk=1000).per_layer
        auto = run(model, ids, am, statistic).per_layer
        assert (whole - chunked).abs().max() <= 1e-6, statistic
        assert (auto - chunked).abs().max() <= 1e-5, statistic
        if statistic != "max":
            fused = run(model, ids, am, statistic, method="fused", query_chunk=7).per_layer
            assert (fused - chunked).abs().max() <= 1e-5, statistic


# --------------------------------------------------------------------------- #
# Recording policy: passes, nesting, errors, non-finite values
# --------------------------------------------------------------------------- #


def test_last_pass_and_nesting() -> None:
    """per_layer is that of the last complete pass; a nested probe without per_layer
    records the same mean from the same pass."""
    model, ids, am, _ = eager3("llama", "left")
    ids2, am2 = batch("right", seed=5)
    with (
        torch.no_grad(),
        hf.ConcentrationProbe(model, "l2", per_layer=True) as probe,
        hf.ConcentrationProbe(model, "l2") as plain,
    ):
        model(**forward_kwargs(ids, am))
        first = probe.per_layer
        model(**forward_kwargs(ids2, am2))
    assert probe.passes == plain.passes == 2
    assert torch.equal(probe.concentration, plain.concentration)
    assert torch.equal(first, run(model, ids, am, "l2").per_layer)
    assert not torch.equal(probe.per_layer, first)
    assert torch.equal(probe.per_layer, run(model, ids2, am2, "l2").per_layer)


def test_errors() -> None:
    model, ids, am, _ = eager3("llama", "none")
    with torch.no_grad(), hf.ConcentrationProbe(model) as probe:
        model(**forward_kwargs(ids, am))
    assert probe.concentration.shape == (B, T)
    with pytest.raises(hf.ProbeError, match=r"per_layer: .* pass per_layer=True"):
        _ = probe.per_layer
    with hf.ConcentrationProbe(model, per_layer=True) as empty:
        pass
    with pytest.raises(hf.ProbeError, match="per_layer: no forward pass was recorded"):
        _ = empty.per_layer
    for name in ("per_layer", "record_with_grad"):
        with pytest.raises(ParameterError, match=f"{name}: expected True or False, got 1"):
            hf.ConcentrationProbe(model, **{name: 1})


def test_non_finite_statistic_raises_and_records_nothing() -> None:
    model, ids, am = nan_token_model()
    probe = hf.ConcentrationProbe(model, "entropy", per_layer=True, method="chunked")
    with pytest.raises(NonFiniteError, match=r"first in layer 0 at \(row 1, position 7\)"), torch.no_grad(), probe:
        model(**forward_kwargs(ids, am))
    assert probe.passes == 0
    with pytest.raises(hf.ProbeError, match="per_layer: no forward pass was recorded.*raised NonFiniteError"):
        _ = probe.per_layer


# --------------------------------------------------------------------------- #
# Passes run with gradients enabled
# --------------------------------------------------------------------------- #


def grads_of(model: Any, ids: Any, am: Any) -> tuple[Any, dict[str, Any]]:
    """(logits, parameter gradients) of a backward through a fixed function of the logits."""
    model.zero_grad(set_to_none=True)
    logits = model(**forward_kwargs(ids, am)).logits
    weights = torch.linspace(-1.0, 1.0, logits.shape[-1])
    (logits.float().log_softmax(-1) * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logits.detach(), grads


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_record_with_grad(arch: str) -> None:
    model, ids, am, _ = eager3(arch, "both")
    model = copy.deepcopy(model)  # gradients are written into it
    for p in model.parameters():
        p.requires_grad_(True)
    expected = run(model, ids, am, "entropy")
    plain_logits, plain_grads = grads_of(model, ids, am)
    assert plain_grads and all(g.abs().sum() > 0 for g in plain_grads.values())
    with hf.ConcentrationProbe(model, "entropy", per_layer=True, record_with_grad=True) as probe:
        assert torch.is_grad_enabled()
        logits, grads = grads_of(model, ids, am)
    assert probe.passes == 1 and probe._grad_calls == 0
    for got, want in ((probe.concentration, expected.concentration), (probe.per_layer, expected.per_layer)):
        assert not got.requires_grad and got.grad_fn is None
        assert torch.allclose(got, want, rtol=0, atol=1e-6)
    # the model's forward and its autograd graph are those of the pass without a probe
    assert torch.equal(logits, plain_logits)
    assert grads.keys() == plain_grads.keys()
    for name, g in grads.items():
        assert torch.equal(g, plain_grads[name]), name
    # without record_with_grad the same pass is counted and skipped
    with hf.ConcentrationProbe(model, per_layer=True) as skipped:
        grads_of(model, ids, am)
    assert skipped.passes == 0 and skipped._grad_calls > 0
    with pytest.raises(hf.ProbeError, match="gradients enabled .*record_with_grad=True"):
        _ = skipped.per_layer


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputation_is_not_recorded(reentrant: bool) -> None:
    """With activation checkpointing the backward pass reruns each layer's attention; those
    calls are not recorded, so the pass the probe keeps is the forward's."""
    model, ids, am, _ = eager3("llama", "left")
    model = copy.deepcopy(model)
    expected = run(model, ids, am, "l2")
    _, plain_grads = grads_of(model, ids, am)
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    else:  # transformers 5.10 (5.2x keeps this name as a deprecated alias that warns)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()  # transformers checkpoints in training mode only; this model has no dropout
    with hf.ConcentrationProbe(model, "l2", per_layer=True, record_with_grad=True) as probe:
        _, grads = grads_of(model, ids, am)
    assert probe.passes == 1
    assert probe._backward_calls == LAYERS  # one recomputation per layer, skipped
    assert torch.allclose(probe.per_layer, expected.per_layer, rtol=0, atol=1e-6)
    assert torch.allclose(probe.concentration, expected.concentration, rtol=0, atol=1e-6)
    for name, g in grads.items():
        assert torch.allclose(g, plain_grads[name], rtol=1e-5, atol=1e-6), name


# --------------------------------------------------------------------------- #
# Log-probs, concentration and per-layer statistics in one pass
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("padding", PADDINGS)
def test_logprobs_and_concentration_per_layer(arch: str, padding: str) -> None:
    model, ids, am, _ = eager3(arch, padding)
    out = hf.logprobs_and_concentration_per_layer(model, ids, am, statistic="max", layers=[-1, 1])
    assert isinstance(out, hf.LogprobsAndConcentrationPerLayer)
    lp, conc, per = out
    assert lp.shape == conc.shape == (B, T - 1) and per.shape == (B, T - 1, 2)
    assert per.dtype == torch.float32
    # the first two fields are logprobs_and_concentration's, bit for bit (and it still unpacks in two)
    lp2, conc2 = hf.logprobs_and_concentration(model, ids, am, statistic="max", layers=[-1, 1])
    assert torch.equal(lp, lp2) and torch.equal(conc, conc2)
    cols = (am[:, :-1] != 0) & (am[:, 1:] != 0)
    assert torch.all(per[~cols] == 0)
    # column j comes from query position j, not j+1
    ref = reference_per_layer(arch, padding, "max", (1, 2))
    assert (per.double() - ref[:, :-1])[cols].abs().max() <= 1e-4
    assert (per.double() - ref[:, 1:])[cols].abs().max() > 1e-2
    assert torch.allclose(per.mean(-1), conc, rtol=0, atol=1e-6)
