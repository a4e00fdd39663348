"""The attention concentration probe (``comppo_core.hf``) against eager attention weights.

Tiny randomly initialised Llama, Qwen2, Qwen3, Mistral and GPT-2 models built from
configs (no download). The reference statistic is computed from the same model's eager
``output_attentions=True`` weights with a visibility mask built here from scratch
(causal ∩ not padding ∩ sliding window), in float64.
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from comppo_core import hf  # noqa: E402
from comppo_core.errors import ComppoError, ParameterError  # noqa: E402
from comppo_core.hf._memory import STATISTIC_RANGE, peak_memory  # noqa: E402
from comppo_core.hf.statistics import head_mean_concentration  # noqa: E402

VOCAB = 96
B, T = 3, 24
ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gpt2")
SLIDING = {"qwen2": 5, "qwen3": 6, "mistral": 7}  # window < T: the window must matter
PADDINGS = ("none", "left", "right", "both")
STATS = ("entropy", "max", "l2")
#: bfloat16 tolerance against eager bfloat16 weights: 4 units of bfloat16 roundoff at 1
#: (2^-8). Eager rounds its scores (a bf16 matmul) and its probabilities to bfloat16, each a
#: relative error up to 2^-8 (2^-9 per rounding, twice), and its bf16 hidden states drift
#: from SDPA's; every statistic lies in [0, 1] and moves by at most about that relative
#: error. Measured worst case over the architectures, paddings and statistics: 5.3e-3.
BF16_ATOL = 4 * 2.0**-8


def build(arch: str, dtype: Any = torch.float32, attn: str = "sdpa", seed: int = 0) -> Any:
    """A tiny model with random weights, std 0.25 so that heads are visibly concentrated."""
    torch.manual_seed(seed)
    common: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.25,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif arch == "qwen2":  # layer 0 full attention, layer 1 sliding window
        cfg = transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=SLIDING[arch], max_window_layers=1)
        cls = transformers.Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(
            **common, head_dim=16, use_sliding_window=True, sliding_window=SLIDING[arch], max_window_layers=1
        )
        cls = transformers.Qwen3ForCausalLM
    elif arch == "mistral":  # every layer sliding window
        cfg = transformers.MistralConfig(**common, sliding_window=SLIDING[arch])
        cls = transformers.MistralForCausalLM
    elif arch == "gpt2":  # multi-head attention, learned positions, Conv1D projections
        cfg = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128, initializer_range=0.25, bos_token_id=0, eos_token_id=1
        )
        cls = transformers.GPT2LMHeadModel
    else:
        raise AssertionError(arch)
    cfg._attn_implementation = attn
    return cls(cfg).to(dtype).eval()


def batch(padding: str, seed: int = 1) -> tuple[Any, Any]:
    """``[B, T]`` token ids and attention mask with the given padding pattern."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    am = torch.ones(B, T, dtype=torch.long)
    if padding == "left":
        am[0, :5] = 0
        am[1, :2] = 0
    elif padding == "right":
        am[0, -4:] = 0
        am[2, -7:] = 0
    elif padding == "both":
        am[0, :3] = 0
        am[0, -2:] = 0
        am[1, :1] = 0
        am[2, -5:] = 0
    ids = torch.where(am.bool(), ids, torch.full_like(ids, 2))
    return ids, am


def forward_kwargs(ids: Any, am: Any) -> dict[str, Any]:
    return dict(input_ids=ids, attention_mask=am, position_ids=hf.default_position_ids(am), use_cache=False)


def visibility(model: Any, am: Any, layer: int, window: bool = True) -> Any:
    """``[B, 1, T, T]`` bool, built from scratch: causal ∩ key not padding ∩ sliding window."""
    t = am.shape[1]
    q = torch.arange(t)[:, None]
    k = torch.arange(t)[None, :]
    vis = (k <= q)[None] & (am[:, None, :] != 0)
    cfg = model.config
    sw = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if window and sw is not None and (types is None or types[layer] == "sliding_attention"):
        vis = vis & ((q - k) < sw)[None]
    return vis[:, None]


def reference_from_weights(weights: Any, vis: Any, statistic: str) -> Any:
    """Head-mean statistic ``[B, T]`` float64 from attention weights ``[B, H, T, T]``."""
    w = torch.where(vis, weights.double(), 0.0)
    n = vis.sum(-1).double()
    if statistic == "entropy":
        ent = -torch.where(w > 0, w * torch.log(w), 0.0).sum(-1)
        c = torch.where(n > 1, 1.0 - ent / torch.log(n.clamp(min=2)), 1.0)
    elif statistic == "max":
        c = w.amax(-1)
    else:
        c = (w * w).sum(-1)
    return c.mean(1)


@functools.lru_cache(maxsize=None)
def eager_run(arch: str, padding: str, dtype_name: str = "float32") -> tuple[Any, Any, Any, Any]:
    """(model, ids, am, eager outputs) for one architecture and padding pattern."""
    model = build(arch, getattr(torch, dtype_name))
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    ids, am = batch(padding)
    with torch.no_grad():
        out = eager(**forward_kwargs(ids, am), output_attentions=True)
    return model, ids, am, out


def reference(arch: str, padding: str, statistic: str, layers: Any = None, dtype_name: str = "float32", window: bool = True) -> Any:
    model, _, am, out = eager_run(arch, padding, dtype_name)
    chosen = range(len(out.attentions)) if layers is None else layers
    acc = sum(reference_from_weights(out.attentions[i], visibility(model, am, i, window), statistic) for i in chosen)
    acc = acc / len(chosen)
    return torch.where(am != 0, acc, 0.0)


def probe_run(model: Any, ids: Any, am: Any, statistic: str = "entropy", **kw: Any) -> Any:
    with torch.no_grad(), hf.ConcentrationProbe(model, statistic, **kw) as probe:
        model(**forward_kwargs(ids, am))
    return probe.concentration


# --------------------------------------------------------------------------- #
# Equality with eager attention weights
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("arch", ARCHS)
def test_matches_eager_attention_weights(arch: str, padding: str) -> None:
    model, ids, am, _ = eager_run(arch, padding)
    for statistic in STATS:
        ref = reference(arch, padding, statistic)
        got = probe_run(model, ids, am, statistic)
        assert got.dtype == torch.float32 and got.shape == (B, T)
        err = (got.double() - ref).abs().max().item()
        assert err <= 1e-4, (arch, padding, statistic, err)
        assert torch.all(got[am == 0] == 0)  # padded query positions
        assert ref[am != 0].std() > 0.05  # the statistic varies: the comparison is not vacuous


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3"])
def test_sliding_window_is_honoured(arch: str) -> None:
    model, ids, am, _ = eager_run(arch, "both")
    got = probe_run(model, ids, am, "entropy")
    with_window = reference(arch, "both", "entropy")
    without = reference(arch, "both", "entropy", window=False)
    assert (got.double() - with_window).abs().max() <= 1e-4
    assert (got.double() - without).abs().max() > 1e-2  # ignoring the window would be caught


@pytest.mark.parametrize("layers", [[1], [0], slice(1, None), [-1], (0, 1)])
def test_layer_subset(layers: Any) -> None:
    model, ids, am, _ = eager_run("qwen3", "left")
    chosen = list(range(2)[layers]) if isinstance(layers, slice) else [i % 2 for i in layers]
    got = probe_run(model, ids, am, "max", layers=layers)
    ref = reference("qwen3", "left", "max", layers=chosen)
    assert (got.double() - ref).abs().max() <= 1e-4
    if chosen == [1]:
        other = reference("qwen3", "left", "max", layers=[0])
        assert (got.double() - other).abs().max() > 1e-2


@pytest.mark.parametrize("statistic", ["entropy", "l2"])
@pytest.mark.parametrize("padding", ["none", "both"])
def test_fused_and_chunked_agree(statistic: str, padding: str) -> None:
    model, ids, am, _ = eager_run("mistral", padding)
    fused = probe_run(model, ids, am, statistic, method="fused", query_chunk=5)
    chunked = probe_run(model, ids, am, statistic, method="chunked", query_chunk=3)
    whole = probe_run(model, ids, am, statistic, method="chunked", query_chunk=1000)
    assert (fused - chunked).abs().max() <= 1e-5
    assert (whole - chunked).abs().max() <= 1e-6


def test_head_mean_concentration_direct() -> None:
    """The per-layer function on its own: GQA, a per-batch mask, no mask = causal."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 9, 8, generator=g) * 2
    k = torch.randn(2, 2, 9, 8, generator=g) * 2
    kr = k.repeat_interleave(2, dim=1)
    s = (q @ kr.transpose(-1, -2)) / math.sqrt(8)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    mask = causal[None, None].repeat(2, 1, 1, 1)
    mask[1, :, :, :3] = False  # row 1: the first three keys are padding
    for m in (None, mask):
        vis = causal[None, None].expand(2, 1, 9, 9) if m is None else m
        w = torch.softmax(s.masked_fill(~vis, -math.inf), dim=-1).nan_to_num(0.0)
        for statistic in STATS:
            ref = reference_from_weights(w, vis, statistic)
            for method in ("chunked", "fused") if statistic != "max" else ("chunked",):
                got = head_mean_concentration(q, k, m, statistic=statistic, method=method, query_chunk=4)
                valid = vis.any(-1)[:, 0]
                assert (got.double() - ref)[valid].abs().max() <= 1e-5, (statistic, method)
                assert torch.all(got[~valid] == 0)


# --------------------------------------------------------------------------- #
# Log-probs and concentration: alignment
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("padding", ["left", "right", "both"])
def test_logprobs_and_concentration_alignment(arch: str, padding: str) -> None:
    model, ids, am, out = eager_run(arch, padding)
    lp, conc = hf.logprobs_and_concentration(model, ids, am, statistic="entropy")
    assert lp.shape == conc.shape == (B, T - 1)
    cols = (am[:, :-1] != 0) & (am[:, 1:] != 0)

    # column j: log-prob of token j+1 under the logits of position j
    with torch.no_grad():
        logits = model(**forward_kwargs(ids, am)).logits.double()
    expected_lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    assert (lp.double() - expected_lp)[cols].abs().max() <= 1e-5
    # ... and its concentration comes from query position j (not j+1)
    ref = reference(arch, padding, "entropy")
    assert (conc.double() - ref[:, :-1])[cols].abs().max() <= 1e-4
    assert (conc.double() - ref[:, 1:])[cols].abs().max() > 1e-2  # the off-by-one would be caught
    assert torch.all(lp[~cols] == 0) and torch.all(conc[~cols] == 0)


def test_alignment_by_intervention() -> None:
    """Changing token j+1 changes log-prob column j but not concentration column j, whose
    query (position j) cannot see it; changing token j changes concentration column j."""
    model, ids, am, _ = eager_run("llama", "none")
    lp0, c0 = hf.logprobs_and_concentration(model, ids, am)
    j = 10
    ids2 = ids.clone()
    ids2[:, j + 1] = (ids2[:, j + 1] + 7 - 3) % (VOCAB - 3) + 3
    lp1, c1 = hf.logprobs_and_concentration(model, ids2, am)
    # (equal up to float rounding: the entropy pass centres the values on the mean of all keys)
    assert (c1[:, : j + 1] - c0[:, : j + 1]).abs().max() <= 1e-6  # queries 0..j do not see token j+1
    assert (lp1[:, :j] - lp0[:, :j]).abs().max() <= 1e-6
    assert torch.all((lp1[:, j] - lp0[:, j]).abs() > 1e-3)  # column j scores token j+1
    assert torch.all((c1[:, j + 1] - c0[:, j + 1]).abs() > 1e-3)  # query j+1 sees token j+1


def test_logits_unchanged_and_implementation_restored() -> None:
    for arch in ARCHS:
        model, ids, am, _ = eager_run(arch, "both")
        with torch.no_grad():
            plain = model(**forward_kwargs(ids, am)).logits
            with hf.ConcentrationProbe(model) as probe:
                assert model.config._attn_implementation == hf.IMPLEMENTATION
                probed = model(**forward_kwargs(ids, am)).logits
        assert torch.equal(plain, probed), arch
        assert model.config._attn_implementation == "sdpa"
        assert probe.passes == 1


def test_eager_model_restored_to_eager() -> None:
    model = build("llama", attn="eager")
    ids, am = batch("left")
    conc = probe_run(model, ids, am)
    assert model.config._attn_implementation == "eager"
    assert torch.all(conc[am != 0] > 0)


# --------------------------------------------------------------------------- #
# Restoring, nesting, failures, gradients
# --------------------------------------------------------------------------- #


def test_exception_restores() -> None:
    model, ids, am, _ = eager_run("qwen2", "right")
    with pytest.raises(RuntimeError, match="boom"):
        with torch.no_grad(), hf.ConcentrationProbe(model):
            model(**forward_kwargs(ids, am))
            raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
    # an exception inside the forward pass itself (bad token id)
    bad = ids.clone()
    bad[0, 3] = 10 * VOCAB
    with pytest.raises(IndexError):
        probe_run(model, bad, am)
    assert model.config._attn_implementation == "sdpa"
    # the model still works and a new probe records normally
    assert torch.allclose(probe_run(model, ids, am).double(), reference("qwen2", "right", "entropy"), atol=1e-4)


def test_nested_probes_record_independently_and_restore_in_any_order() -> None:
    model, ids, am, _ = eager_run("llama", "left")
    outer = hf.ConcentrationProbe(model, "entropy")
    inner = hf.ConcentrationProbe(model, "max", layers=[1])
    with torch.no_grad():
        outer.__enter__()
        inner.__enter__()
        model(**forward_kwargs(ids, am))
        outer.__exit__(None, None, None)  # out of order: the model stays probed for `inner`
        assert model.config._attn_implementation == hf.IMPLEMENTATION
        model(**forward_kwargs(ids, am))
        inner.__exit__(None, None, None)
    assert model.config._attn_implementation == "sdpa"
    assert outer.passes == 1 and inner.passes == 2
    assert torch.allclose(outer.concentration.double(), reference("llama", "left", "entropy"), atol=1e-4)
    assert torch.allclose(inner.concentration.double(), reference("llama", "left", "max", layers=[1]), atol=1e-4)


def test_probe_cannot_be_entered_twice() -> None:
    model, _, _, _ = eager_run("llama", "none")
    probe = hf.ConcentrationProbe(model)
    with probe:
        with pytest.raises(hf.ProbeError, match="already active"):
            probe.__enter__()
    assert model.config._attn_implementation == "sdpa"


def test_grad_enabled_records_nothing() -> None:
    model, ids, am, _ = eager_run("gpt2", "left")
    with hf.ConcentrationProbe(model) as probe:
        out = model(**forward_kwargs(ids, am))
    assert out.logits.requires_grad  # the pass itself ran normally, with grad
    assert probe.passes == 0
    with pytest.raises(hf.ProbeError, match="gradients enabled"):
        probe.concentration
    # inference mode counts as no-grad
    with torch.inference_mode(), hf.ConcentrationProbe(model) as probe2:
        model(**forward_kwargs(ids, am))
    assert probe2.passes == 1


def test_cached_decoding_is_not_recorded() -> None:
    model, ids, am, _ = eager_run("llama", "left")
    with hf.ConcentrationProbe(model) as probe:
        model.generate(input_ids=ids[:, :12], attention_mask=am[:, :12], max_new_tokens=3, do_sample=False, pad_token_id=2)
    assert probe.passes == 1  # the prefill
    assert probe.concentration.shape == (B, 12)
    assert probe._skipped_calls > 0
    assert model.config._attn_implementation == "sdpa"


def test_no_pass_recorded_error() -> None:
    model, _, _, _ = eager_run("llama", "none")
    with hf.ConcentrationProbe(model) as probe:
        pass
    with pytest.raises(hf.ProbeError, match="no forward pass was recorded"):
        probe.concentration


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"statistic": "kurtosis"}, "statistic: expected one of 'entropy', 'max', 'l2', got 'kurtosis'"),
        ({"layers": [2]}, "layers: index 2 is out of range for a model with 2 layers"),
        ({"layers": [-3]}, "layers: index -3 is out of range"),
        ({"layers": []}, "layers: expected at least one layer index"),
        ({"layers": [1, -1]}, "layers: layer 1 is selected twice"),
        ({"layers": slice(5, None)}, "selects no layer"),
        ({"layers": ["0"]}, "layers: expected integer layer indices"),
        ({"statistic": "max", "method": "fused"}, "method: 'fused' computes 'entropy' and 'l2' only"),
        ({"method": "magic"}, "method: expected one of"),
        ({"query_chunk": 0}, "query_chunk: expected an integer >= 1"),
        ({"precision": "fp8"}, "precision: expected one of"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    model, _, _, _ = eager_run("llama", "none")
    with pytest.raises(ParameterError, match=match):
        hf.ConcentrationProbe(model, **kwargs)


def test_unsupported_models() -> None:
    with pytest.raises(hf.UnsupportedModelError, match="expected a transformers PreTrainedModel"):
        hf.ConcentrationProbe(torch.nn.Linear(2, 2))
    assert issubclass(hf.UnsupportedModelError, TypeError) and issubclass(hf.UnsupportedModelError, ComppoError)

    class NoSdpaLlama(transformers.LlamaForCausalLM):
        _supports_sdpa = False

    model = NoSdpaLlama(build("llama", attn="eager").config)
    with pytest.raises(hf.UnsupportedModelError, match="cannot run the probe's SDPA-based attention"):
        with hf.ConcentrationProbe(model):
            pass
    assert model.config._attn_implementation == "eager"

    class FixedAttentionLlama(transformers.LlamaForCausalLM):
        _can_set_attn_implementation_cached_value = False  # as transformers marks legacy models

    model2 = FixedAttentionLlama(build("llama").config)
    with pytest.raises(hf.UnsupportedModelError, match="does not support setting its attention implementation"):
        with hf.ConcentrationProbe(model2):
            pass
    assert model2.config._attn_implementation == "sdpa"


def test_prepared_float_mask_is_rejected() -> None:
    model, ids, am, _ = eager_run("llama", "none")
    float_mask = torch.zeros(B, 1, T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -1e9)
    with pytest.raises(hf.UnsupportedModelError, match="4-D boolean SDPA masks"):
        with torch.no_grad(), hf.ConcentrationProbe(model):
            model(input_ids=ids, attention_mask=float_mask, use_cache=False)
    assert model.config._attn_implementation == "sdpa"


def test_input_checks() -> None:
    model, ids, am, _ = eager_run("llama", "none")
    with pytest.raises(ComppoError, match="input_ids: expected a 2-D integer tensor"):
        hf.logprobs_and_concentration(model, ids.float(), am)
    with pytest.raises(ComppoError, match="input_ids: expected T >= 2"):
        hf.logprobs_and_concentration(model, ids[:, :1], am[:, :1])
    with pytest.raises(ComppoError, match="attention_mask: expected a tensor shaped like input_ids"):
        hf.logprobs_and_concentration(model, ids, am[:, 1:])


# --------------------------------------------------------------------------- #
# bfloat16
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral", "gpt2"])
def test_bfloat16(arch: str) -> None:
    model, ids, am, out = eager_run(arch, "both", "bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    for statistic in STATS:
        got = probe_run(model, ids, am, statistic)
        assert got.dtype == torch.float32
        ref = reference(arch, "both", statistic, dtype_name="bfloat16")
        assert (got.double() - ref).abs().max() <= BF16_ATOL, statistic
        assert torch.all(got[am == 0] == 0)
        if statistic != "max":  # the probe's own arithmetic is float32: both methods agree closely
            chunked = probe_run(model, ids, am, statistic, method="chunked")
            assert (got - chunked).abs().max() <= 1e-5
            fast = probe_run(model, ids, am, statistic, method="fused", precision="model")
            assert (fast.double() - ref).abs().max() <= BF16_ATOL
    with torch.no_grad():
        plain = model(**forward_kwargs(ids, am)).logits
        with hf.ConcentrationProbe(model):
            probed = model(**forward_kwargs(ids, am)).logits
    assert torch.equal(plain, probed)


# --------------------------------------------------------------------------- #
# Memory: linear, not quadratic, in T
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("method", "padding"), [("chunked", "none"), ("chunked", "both"), ("fused", "both")])
def test_probe_memory_grows_linearly_in_t(method: str, padding: str) -> None:
    """Peak bytes allocated inside the probe's statistic computation (every CPU allocation,
    kernel workspaces included, via torch.profiler), at T, 2T and 4T. With a fixed query
    chunk the growth per doubling is ~2; a T×T computation (query_chunk ≥ T) gives ~4."""
    model = build("llama")

    def extra(t: int, chunk: int) -> int:
        g = torch.Generator().manual_seed(t)
        ids = torch.randint(3, VOCAB, (2, t), generator=g)
        am = torch.ones(2, t, dtype=torch.long)
        if padding == "both":
            am[0, :5] = 0
            am[1, -7:] = 0

        def run() -> None:
            with torch.no_grad(), hf.ConcentrationProbe(model, "entropy", method=method, query_chunk=chunk):
                model(input_ids=ids, attention_mask=am, use_cache=False)

        return peak_memory(run, within=STATISTIC_RANGE)

    lengths = (64, 128, 256)
    linear = [extra(t, 16) for t in lengths]
    assert all(x > 0 for x in linear)
    growth = [linear[i + 1] / linear[i] for i in range(2)]
    assert all(1.5 <= g <= 2.5 for g in growth), (linear, growth)
    if method == "chunked":  # the measurement would catch a T×T implementation
        quadratic = [extra(t, 10**6) for t in lengths]
        growth_q = [quadratic[i + 1] / quadratic[i] for i in range(2)]
        assert all(g >= 3.5 for g in growth_q), (quadratic, growth_q)
