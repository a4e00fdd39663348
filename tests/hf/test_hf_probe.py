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
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import tiny_lm  # noqa: E402

from comppo_core import hf  # noqa: E402
from comppo_core.errors import ComppoError, NonFiniteError, ParameterError, ShapeError  # noqa: E402
from comppo_core.hf import statistics as hf_statistics  # noqa: E402
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


def build(arch: str, dtype: Any = None, attn: str = "sdpa", seed: int = 0, layers: int = 2) -> Any:
    """A tiny model (``conftest.tiny_lm``: random weights with std 0.25, so that heads are
    visibly concentrated) with the windows of ``SLIDING``: Qwen2 and Qwen3 layer 0 full
    attention and the later layers a sliding window, Mistral every layer a sliding window."""
    window: dict[str, Any] = {}
    if arch == "mistral":
        window = {"sliding_window": SLIDING[arch]}
    elif arch in SLIDING:
        window = {"use_sliding_window": True, "sliding_window": SLIDING[arch], "max_window_layers": 1}
    return tiny_lm(arch, vocab=VOCAB, layers=layers, dtype=dtype, attn=attn, seed=seed, **window)


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


@functools.cache
def eager_run(arch: str, padding: str, dtype_name: str = "float32") -> tuple[Any, Any, Any, Any]:
    """(model, ids, am, eager outputs) for one architecture and padding pattern."""
    model = build(arch, getattr(torch, dtype_name))
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    ids, am = batch(padding)
    with torch.no_grad():
        out = eager(**forward_kwargs(ids, am), output_attentions=True)
    return model, ids, am, out


def reference(
    arch: str, padding: str, statistic: str, layers: Any = None, dtype_name: str = "float32", window: bool = True
) -> Any:
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


@pytest.mark.parametrize("statistic", ["entropy", "l2"])
def test_fused_batch_slicing_changes_nothing(statistic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused pass works on a slice of batch rows at a time (to bound its float32
    copies). Without a mask each row's value is the same bit for bit for any slicing.
    With a per-row or shared mask it agrees to float32 rounding: the key range a query
    chunk visits is the one visible from the rows of its slice, so the kernel sums over
    a different (fully masked) stretch of keys."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(5, 4, 33, 8, generator=g) * 2
    k = torch.randn(5, 2, 33, 8, generator=g) * 2
    causal = torch.ones(33, 33, dtype=torch.bool).tril()
    per_row = causal[None, None].repeat(5, 1, 1, 1)
    per_row[2, :, :, :7] = False  # row 2: left padding
    for m in (None, per_row, causal[None, None]):
        results = []
        for slices, copy_bytes in ((1, 1 << 40), (8, 1 << 40), (2, 1 << 40), (1, 1)):
            monkeypatch.setattr(hf_statistics, "FUSED_BATCH_SLICES", slices)
            monkeypatch.setattr(hf_statistics, "FUSED_COPY_BYTES", copy_bytes)
            results.append(head_mean_concentration(q, k, m, statistic=statistic, method="fused", query_chunk=8))
        whole = results[0]
        assert whole.shape == (5, 33)
        for got in results[1:]:
            if m is None:
                assert torch.equal(got, whole)
            else:
                assert (got - whole).abs().max() <= 1e-6


@pytest.mark.parametrize("method", ["fused", "chunked"])
def test_empty_queries_or_keys(method: str) -> None:
    """No query (T = 0) gives an empty [B, 0]; no key gives 0 for every query; no
    attention kernel is called on empty inputs (torch's CPU kernel faults there)."""
    q0, k0 = torch.zeros(3, 4, 0, 8), torch.zeros(3, 2, 0, 8)
    q5, k5 = torch.randn(3, 4, 5, 8), torch.randn(3, 2, 5, 8)
    for statistic in ("entropy", "l2"):
        for q, k, m, causal in (
            (q0, k0, None, True),
            (q0, k0, torch.ones(3, 4, 0, 0, dtype=torch.bool), False),
            (q0, k5, None, False),
            (q5, k0, None, False),
            (q5, k0, torch.ones(3, 1, 5, 0, dtype=torch.bool), False),
        ):
            got = head_mean_concentration(q, k, m, statistic=statistic, method=method, is_causal=causal)
            assert got.shape == (3, q.shape[2]) and torch.all(got == 0)


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
        model.generate(
            input_ids=ids[:, :12], attention_mask=am[:, :12], max_new_tokens=3, do_sample=False, pad_token_id=2
        )
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
        """A model transformers deems legacy: ``set_attn_implementation`` leaves it as it is.
        The classmethod is what every transformers 5 asks (5.10 reads the model's source
        file, 5.25 caches the answer in ``_can_set_attn_implementation_cached_value``)."""

        @classmethod
        def _can_set_attn_implementation(cls) -> bool:
            return False

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


# --------------------------------------------------------------------------- #
# Kernel fallbacks: fused → chunked, FlashAttention-2 → memory-efficient
# --------------------------------------------------------------------------- #


@pytest.fixture
def fallback_caches() -> Iterator[None]:
    """Empty process-wide fallback caches for the test, restored afterwards."""
    saved = (set(hf_statistics._FUSED_BROKEN), set(hf_statistics._FLASH_BROKEN))
    hf_statistics._FUSED_BROKEN.clear()
    hf_statistics._FLASH_BROKEN.clear()
    yield
    hf_statistics._FUSED_BROKEN.clear()
    hf_statistics._FUSED_BROKEN.update(saved[0])
    hf_statistics._FLASH_BROKEN.clear()
    hf_statistics._FLASH_BROKEN.update(saved[1])


def failing_kernel(monkeypatch: pytest.MonkeyPatch, exc: BaseException, head_dims: Any = None) -> list[int]:
    """Make the fused kernel raise ``exc`` (for the given head_dims, else always); returns
    the list of head_dims it was called with."""
    calls: list[int] = []
    real = hf_statistics._lse_attention

    def kernel(q: Any, *args: Any) -> Any:
        calls.append(int(q.shape[-1]))
        if head_dims is None or q.shape[-1] in head_dims:
            raise exc
        return real(q, *args)

    monkeypatch.setattr(hf_statistics, "_lse_attention", kernel)
    return calls


def test_fused_failure_warns_once_and_falls_back(monkeypatch: pytest.MonkeyPatch, fallback_caches: None) -> None:
    model, ids, am, _ = eager_run("llama", "both")  # head_dim 8
    expected = probe_run(model, ids, am, "entropy", method="chunked")
    calls = failing_kernel(monkeypatch, RuntimeError("no kernel image is available for execution on the device"), {8})
    with pytest.warns(
        RuntimeWarning, match=r"fused attention kernel failed on cpu, float32, head_dim 8 \(no kernel image"
    ) as rec:
        got = probe_run(model, ids, am, "entropy")
    assert len([w for w in rec if issubclass(w.category, RuntimeWarning)]) == 1  # once, not once per layer
    assert calls == [8]  # layer 1 did not retry the kernel
    assert torch.equal(got, expected)  # the chunked method, exactly
    assert (got.double() - reference("llama", "both", "entropy")).abs().max() <= 1e-4
    assert hf_statistics._FUSED_BROKEN == {("cpu", None, torch.float32, 8)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        again = probe_run(model, ids, am, "entropy")
    assert torch.equal(again, expected) and calls == [8]
    # the cache is per (device, index, dtype, head_dim): another head size still runs fused
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 6, 16, generator=g), torch.randn(1, 2, 6, 16, generator=g)
    fused = head_mean_concentration(q, k, None, statistic="entropy")
    assert calls == [8, 16]
    assert (fused - head_mean_concentration(q, k, None, method="chunked")).abs().max() <= 1e-5
    # the model's dtype matters with precision="model": bfloat16 is another key
    qb, kb = q[..., :8].bfloat16(), k[..., :8].bfloat16()
    with pytest.warns(RuntimeWarning, match="cpu, bfloat16, head_dim 8"):
        head_mean_concentration(qb, kb, None, precision="model")
    assert ("cpu", None, torch.bfloat16, 8) in hf_statistics._FUSED_BROKEN
    # method="fused" never falls back
    with pytest.raises(RuntimeError, match="no kernel image"):
        probe_run(model, ids, am, "entropy", method="fused")


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: device-side assert triggered"),  # an older torch's device error
    ],
    ids=["oom", "accelerator", "cuda-message"],
)
def test_fatal_kernel_errors_are_reraised(
    exc: BaseException, monkeypatch: pytest.MonkeyPatch, fallback_caches: None
) -> None:
    model, ids, am, _ = eager_run("llama", "left")
    failing_kernel(monkeypatch, exc)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no fallback warning
        with pytest.raises(type(exc), match=str(exc)[:20]):
            probe_run(model, ids, am, "entropy")
    assert not hf_statistics._FUSED_BROKEN
    assert model.config._attn_implementation == "sdpa"


def test_fallback_warning_as_error_leaves_state_untouched(
    monkeypatch: pytest.MonkeyPatch, fallback_caches: None
) -> None:
    """Under -W error the warning is raised before the cache changes, so every call fails
    visibly instead of the first failing and the later ones silently falling back."""
    model, ids, am, _ = eager_run("llama", "none")
    calls = failing_kernel(monkeypatch, RuntimeError("unsupported"))
    for attempt in (1, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeWarning, match="fused attention kernel failed"):
                probe_run(model, ids, am, "l2")
        assert not hf_statistics._FUSED_BROKEN
        assert len(calls) == attempt
    assert model.config._attn_implementation == "sdpa"


def test_flash_attention_failure_is_cached_not_swallowed(
    monkeypatch: pytest.MonkeyPatch, fallback_caches: None
) -> None:
    """The CUDA dispatch (run here on CPU tensors with stand-in kernels): a FlashAttention-2
    failure warns once and is cached per key; fatal errors propagate."""
    flash_calls: list[int] = []
    eff_calls: list[int] = []
    failure: list[BaseException] = [RuntimeError("FlashAttention only supports Ampere GPUs or newer.")]

    def flash(q: Any, k: Any, v: Any, causal: bool, scale: float) -> Any:
        flash_calls.append(int(q.shape[-1]))
        raise failure[0]

    def efficient(q: Any, k: Any, v: Any, bias: Any, causal: bool, scale: float) -> Any:
        eff_calls.append(int(q.shape[-1]))
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=bias, scale=scale
        )[:2]
        return out, lse

    monkeypatch.setattr(hf_statistics, "_flash_attention", flash)
    monkeypatch.setattr(hf_statistics, "_efficient_attention", efficient)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 5, 8, generator=g).bfloat16() for _ in range(2))
    with pytest.warns(
        RuntimeWarning, match=r"FlashAttention-2 failed on cpu, bfloat16, head_dim 8 \(FlashAttention only"
    ):
        out, lse = hf_statistics._cuda_lse_attention(q, k, k, None, True, 0.3)
    ref_out, ref_lse = efficient(q, k, k, None, True, 0.3)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
    assert flash_calls == [8] and hf_statistics._FLASH_BROKEN == {("cpu", None, torch.bfloat16, 8)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf_statistics._cuda_lse_attention(q, k, k, None, True, 0.3)
        hf_statistics._cuda_lse_attention(q.float(), k.float(), k.float(), None, True, 0.3)  # float32: never flash
        bias = torch.zeros(1, 2, 5, 5, dtype=torch.bfloat16)
        hf_statistics._cuda_lse_attention(q, k, k, bias, False, 0.3)  # a bias: never flash
    assert flash_calls == [8]  # not retried on every call
    assert eff_calls == [8, 8, 8, 8, 8]
    # fatal errors propagate, and are not cached
    for fatal in (
        torch.OutOfMemoryError("CUDA out of memory"),
        torch.AcceleratorError("CUDA error: misaligned address"),
    ):
        failure[0] = fatal
        q16, k16 = q.repeat(1, 1, 1, 2), k.repeat(1, 1, 1, 2)
        with pytest.raises(type(fatal)):
            hf_statistics._cuda_lse_attention(q16, k16, k16, None, True, 0.3)
        assert ("cpu", None, torch.bfloat16, 16) not in hf_statistics._FLASH_BROKEN


# --------------------------------------------------------------------------- #
# Non-finite values: zero only where a query sees no key, otherwise an error
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("statistic", STATS)
def test_non_finite_queries_give_nan_not_zero(statistic: str) -> None:
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 4, 9, 8, generator=g)
    k = torch.randn(2, 2, 9, 8, generator=g)
    q[0, 1, 4, 2] = math.nan  # one head of query (0, 4)
    q[1, :, 6, 0] = math.inf  # every head of query (1, 6)
    q[1, :, 2] = math.nan  # query (1, 2) sees no key: 0 whatever its values
    mask = torch.ones(9, 9, dtype=torch.bool).tril()[None, None].repeat(2, 1, 1, 1)
    mask[1, :, 2, :] = False
    for m in (None, mask):
        for method in ("chunked", "fused") if statistic != "max" else ("chunked",):
            got = head_mean_concentration(q, k, m, statistic=statistic, method=method, query_chunk=4)
            assert torch.isnan(got[0, 4]) and torch.isnan(got[1, 6]), (m is None, method)  # not 0, not clipped to 0/1
            bad = torch.zeros(2, 9, dtype=torch.bool)
            bad[0, 4] = bad[1, 6] = True
            if m is None:
                bad[1, 2] = True  # without the mask, query (1, 2) sees keys 0..2
            else:
                assert got[1, 2] == 0
            assert torch.isfinite(got[~bad]).all() and (got[~bad] >= 0).all()


def nan_token_model() -> tuple[Any, Any, Any]:
    """A Llama whose embedding of token 90 is NaN, and a batch with token 90 only at
    (row 1, position 7): a real token whose activations are NaN from layer 0 on."""
    model = copy.deepcopy(eager_run("llama", "none")[0])
    with torch.no_grad():
        model.model.embed_tokens.weight[90] = math.nan
    ids, am = batch("both")
    ids = torch.where(ids == 90, torch.full_like(ids, 91), ids)
    ids[1, 7] = 90
    return model, ids, am


def test_non_finite_statistic_at_a_real_token_raises() -> None:
    model, ids, am = nan_token_model()
    with pytest.raises(
        NonFiniteError, match=r"not finite .* layer\(s\) \[0, 1\]; first in layer 0 at \(row 1, position 7\)"
    ):
        probe_run(model, ids, am, "entropy", method="chunked")
    assert model.config._attn_implementation == "sdpa"
    probe = hf.ConcentrationProbe(model, "max", layers=[1])
    with pytest.raises(NonFiniteError, match=r"'max' statistic is not finite .* first in layer 1 at \(row 1,"):
        with torch.no_grad(), probe:
            model(**forward_kwargs(ids, am))
    assert probe.passes == 0
    with pytest.raises(hf.ProbeError, match="raised NonFiniteError"):
        probe.concentration
    # the default (fused) method raises too; the rows without the token are unaffected
    with pytest.raises(NonFiniteError, match=r"first in layer 0 at \(row 1, position \d+\)"):
        probe_run(model, ids, am, "entropy")
    keep = torch.tensor([0, 2])
    got = probe_run(model, ids[keep], am[keep], "entropy")
    assert torch.isfinite(got).all() and torch.all(got[am[keep] == 0] == 0)


# --------------------------------------------------------------------------- #
# token_logprobs: bounded chunks, same values
# --------------------------------------------------------------------------- #


def test_token_logprobs_chunk_cap_gives_identical_results() -> None:
    g = torch.Generator().manual_seed(2)
    b, length, vocab = 3, 37, 50
    logits = torch.randn(b, length, vocab, generator=g) * 4
    targets = torch.randint(0, vocab, (b, length), generator=g)
    expected = torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None])[..., 0]
    default = hf.token_logprobs(logits, targets)
    assert (default.double() - expected).abs().max() <= 1e-5
    # one position per block, a few positions, whole rows, a few whole rows
    for cap in (1, vocab, 3 * vocab + 7, length * vocab, 2 * length * vocab + 1):
        assert torch.equal(hf.token_logprobs(logits, targets, chunk_elements=cap), default), cap
    bf16 = logits.bfloat16()
    assert torch.equal(hf.token_logprobs(bf16, targets, chunk_elements=vocab), hf.token_logprobs(bf16, targets))
    # a non-contiguous view, as logprobs_and_concentration passes logits[:, :-1]
    shifted = hf.token_logprobs(logits[:, :-1], targets[:, 1:], chunk_elements=2 * vocab)
    assert torch.equal(shifted, hf.token_logprobs(logits[:, :-1], targets[:, 1:]))
    assert torch.equal(shifted, hf.token_logprobs(logits[:, :-1].contiguous(), targets[:, 1:], chunk_elements=1))
    ref = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, targets[:, 1:, None])[..., 0]
    assert (shifted.double() - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("temperature", [0.7, 1.3, 2])
def test_token_logprobs_at_a_temperature_are_those_of_the_tempered_softmax(temperature: float) -> None:
    """verl and TRL score a rollout with ``log_softmax(logits / τ)``; so does ``temperature=τ``,
    whatever the block size, and the logits are left as they were."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 11, 30, generator=g) * 3
    before = logits.clone()
    targets = torch.randint(0, 30, (2, 11), generator=g)
    expected = torch.log_softmax(logits.double() / temperature, -1).gather(-1, targets[..., None])[..., 0]
    got = hf.token_logprobs(logits, targets, temperature=temperature)
    assert (got.double() - expected).abs().max() <= 1e-5
    assert (got - hf.token_logprobs(logits, targets)).abs().max() > 1e-2  # τ is not ignored
    assert torch.equal(hf.token_logprobs(logits, targets, temperature=temperature, chunk_elements=1), got)
    assert torch.equal(logits, before)
    assert torch.equal(hf.token_logprobs(logits, targets, temperature=1.0), hf.token_logprobs(logits, targets))


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf"), True, "0.7"])
def test_token_logprobs_rejects_a_bad_temperature(temperature: Any) -> None:
    with pytest.raises(ParameterError, match="temperature: expected a finite float > 0"):
        hf.token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), temperature=temperature)


def test_token_logprobs_memory_is_bounded_by_the_cap() -> None:
    """Peak bytes (every CPU allocation) of token_logprobs on bfloat16 logits: the float32
    blocks stay within a few caps, where one block of 1024 positions × B rows would be the
    whole B·L·V float32 copy (1.5 MiB here)."""
    b, length, vocab = 4, 96, 1024
    logits = torch.randn(b, length, vocab).bfloat16()
    targets = torch.randint(0, vocab, (b, length))
    cap = 4 * vocab  # 16 KiB of float32 per block
    small = peak_memory(lambda: hf.token_logprobs(logits, targets, chunk_elements=cap))
    whole = b * length * vocab * 4
    assert small <= 4 * cap * 4 + b * length * 4 + 4096, small  # blocks + logsumexp temporaries + the [B, L] result
    assert peak_memory(lambda: hf.token_logprobs(logits, targets, chunk_elements=whole)) >= whole


def test_token_logprobs_argument_checks() -> None:
    logits = torch.zeros(2, 3, 5)
    with pytest.raises(
        ShapeError, match=r"targets: expected an integer tensor \[B, L\] = \[2, 3\], got torch.int64 \(2, 4\)"
    ):
        hf.token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ShapeError, match=r"logits: expected a 3-D float tensor \[B, L, V\]"):
        hf.token_logprobs(logits[0], torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ParameterError, match="chunk_elements: expected an integer >= 1, got 0"):
        hf.token_logprobs(logits, torch.zeros(2, 3, dtype=torch.long), chunk_elements=0)


def test_model_sharing_the_config_is_switched_too() -> None:
    """Documented: the switch is on config objects, so a reference model built from the
    policy's config runs the probe's (SDPA) attention while a probe is active; its passes
    are not recorded, and its implementation comes back on exit."""
    policy = build("llama", attn="eager")
    ref = transformers.LlamaForCausalLM(policy.config).eval()
    assert ref.config is policy.config
    ids, am = batch("left")
    with torch.no_grad():
        ref_sdpa = copy.deepcopy(ref)
        ref_sdpa.set_attn_implementation("sdpa")
        expected = ref_sdpa(**forward_kwargs(ids, am)).logits
        with hf.ConcentrationProbe(policy) as probe:
            assert ref.config._attn_implementation == hf.IMPLEMENTATION
            got = ref(**forward_kwargs(ids, am)).logits
            assert probe.passes == 0  # the reference model's pass is not recorded
            policy(**forward_kwargs(ids, am))
        assert probe.passes == 1
    assert torch.equal(got, expected)
    assert ref.config._attn_implementation == "eager"
