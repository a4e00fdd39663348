"""Memory-bounded scoring: ``hf.score`` computes log-probs from the final hidden states in
chunks of tokens, never the ``[B, T, V]`` logits, and gives the plain computation's values
and gradients (``log_softmax(model(ids).logits / τ)`` gathered at the next token)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from conftest import tiny_lm  # noqa: E402

from comppo_core import hf, rl  # noqa: E402
from comppo_core.errors import ParameterError, ShapeError  # noqa: E402
from comppo_core.hf.lm import LOGPROB_CHUNK_ELEMENTS, LOGPROB_CHUNK_ENV, head_logprobs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

B, T, V = 3, 11, 53  # B·(T−1) = 30 scored positions at most


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and a mask padded on both sides (row 0 left, row 1 right, row 2 both ends)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, :3] = 0
    mask[1, -4:] = 0
    mask[2, :1] = 0
    mask[2, -2:] = 0
    return ids, mask


def _plain_logprobs(model: Any, ids: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """The reference: the model's full float32 logits, log_softmax, gather; 0 off the scored columns."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    lp = lp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    columns = (mask[:, :-1] != 0) & (mask[:, 1:] != 0)
    return torch.where(columns, lp, torch.zeros_like(lp))


def _assert_close(got: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """Equal within 1e-6 of the tensor's scale: ``max|got − ref| ≤ 1e-6·max(1, max|ref|)``
    (a float32 log-prob near −10 has an ulp of 9.5e-7, so this is float32 rounding)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype, what
    err = float((got - ref).abs().max()) if got.numel() else 0.0
    scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
    assert err <= 1e-6 * scale, f"{what}: max abs difference {err:.3g} > 1e-6 × {scale:.3g}"


def _model(arch: str, *, bias: bool = False) -> Any:
    m = tiny_lm(arch, vocab=V, seed=1)
    if bias:  # an LM head with a bias: the chunked path must use the module, bias included
        head = torch.nn.Linear(m.config.hidden_size, V, bias=True)
        torch.nn.init.normal_(head.weight, std=0.3)
        torch.nn.init.normal_(head.bias, std=1.0)
        m.lm_head = head
    return m


@pytest.fixture
def no_chunk_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(LOGPROB_CHUNK_ENV, raising=False)
    yield


@pytest.mark.usefixtures("no_chunk_env")
@pytest.mark.parametrize(("arch", "bias"), [("llama", False), ("llama", True), ("qwen2", False), ("gpt2", False)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_equal_the_full_logits_ones(arch: str, bias: bool, temperature: float) -> None:
    model = _model(arch, bias=bias)
    ids, mask = _batch()
    with torch.no_grad():
        ref = _plain_logprobs(model, ids, mask, temperature)
    assert float(ref.abs().max()) > 1.0  # real numbers, not zeros
    for chunk in (1, 4, 7, 13, 29, 30, 1000, None, 0):  # 4, 7, 13, 29 divide no count of scored tokens here
        got = hf.score(model, ids, mask, temperature=temperature, logprob_chunk=chunk).logprobs
        assert got.dtype == torch.float32 and got.shape == (B, T - 1)
        _assert_close(got, ref, f"logprob_chunk={chunk}")


@pytest.mark.usefixtures("no_chunk_env")
@pytest.mark.parametrize(("arch", "bias"), [("llama", False), ("llama", True), ("gpt2", False)])
def test_chunked_gradients_equal_the_full_logits_ones(arch: str, bias: bool) -> None:
    """Gradients of a weighted sum of log-probs w.r.t. every parameter (τ = 0.7)."""
    model = _model(arch, bias=bias)
    ids, mask = _batch(1)
    w = torch.randn(B, T - 1, generator=torch.Generator().manual_seed(2))

    def grads(lp: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        (lp * w).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    with torch.enable_grad():
        ref = grads(_plain_logprobs(model, ids, mask, 0.7))
    assert len(ref) == len(list(model.parameters()))
    for chunk in (1, 7, 13, None):
        s = hf.score(model, ids, mask, temperature=0.7, grad=True, logprob_chunk=chunk)
        got = grads(s.logprobs)
        assert got.keys() == ref.keys()
        for name in ref:
            _assert_close(got[name], ref[name], f"{name}, chunk {chunk}")


class _HeadRows:
    """Records the number of token rows of every LM-head call (forward and recomputation)."""

    def __init__(self, model: Any) -> None:
        self.rows: list[int] = []
        self.handle = model.get_output_embeddings().register_forward_hook(self._hook)

    def _hook(self, module: Any, args: Any, output: torch.Tensor) -> None:
        self.rows.append(output.numel() // output.shape[-1])


@pytest.mark.usefixtures("no_chunk_env")
@pytest.mark.parametrize("grad", [False, True])
def test_the_full_logits_are_never_materialised(grad: bool) -> None:
    """With a chunk smaller than T, no LM-head call sees more than max(chunk, B) tokens
    (B: the model's own call, which the hook cuts to the last position), so no tensor of
    [B, T, V] or even [T, V] logits exists; with grad the backward's recomputation too."""
    model = _model("llama")
    ids, mask = _batch()
    chunk = 5
    assert chunk < T and B <= chunk
    rows = _HeadRows(model)
    try:
        s = hf.score(model, ids, mask, temperature=0.9, grad=grad, logprob_chunk=chunk, concentration=True)
        if grad:
            s.logprobs.sum().backward()
    finally:
        rows.handle.remove()
    n = int(s.columns.sum())
    assert max(rows.rows) <= chunk
    # the model's call (B rows), the last-position check (B rows), the chunks; with grad the chunks again
    chunks = -(-n // chunk)
    assert len(rows.rows) == 2 + chunks * (2 if grad else 1)
    # the unchunked path does run the head over every position (the test can fail)
    rows = _HeadRows(model)
    try:
        hf.score(model, ids, mask, logprob_chunk=0)
    finally:
        rows.handle.remove()
    assert rows.rows == [B * T]


@pytest.mark.usefixtures("no_chunk_env")
@pytest.mark.parametrize("chunk", [4, None, 0])
def test_logprob_columns_run_the_head_on_those_columns_alone(chunk: int | None) -> None:
    """``logprob_columns``: the chosen columns' log-probs (the head's matmul on other row
    blocks: float32 rounding), exactly 0 at every other column, the LM head's rows those
    columns alone (chunked path), the concentration and ``columns`` unchanged."""
    model = _model("llama")
    ids, mask = _batch(4)
    every = hf.score(model, ids, mask, temperature=0.7, logprob_chunk=chunk, concentration=True)
    wanted = torch.zeros(B, T - 1, dtype=torch.bool)
    wanted[:, 5:] = True  # the "response": the last columns, some of them padding
    rows = _HeadRows(model)
    try:
        got = hf.score(model, ids, mask, temperature=0.7, logprob_chunk=chunk, concentration=True,
                       logprob_columns=wanted)  # fmt: skip
    finally:
        rows.handle.remove()
    inside = wanted & every.columns
    assert bool(inside.any()) and bool((~wanted & every.columns).any())
    _assert_close(got.logprobs, torch.where(inside, every.logprobs, 0.0), f"logprob_chunk={chunk}")
    assert bool((got.logprobs[inside] != 0).all()) and bool((got.logprobs[~inside] == 0).all())
    assert torch.equal(got.columns, every.columns) and torch.equal(got.concentration, every.concentration)
    if chunk:  # the model's call, the last-position check, then the chunks of the chosen columns only
        assert sum(rows.rows[2:]) == int(inside.sum())
    with torch.enable_grad():
        grad = hf.score(model, ids, mask, temperature=0.7, logprob_chunk=chunk, grad=True, logprob_columns=wanted)
    assert grad.logprobs.requires_grad and torch.equal(grad.logprobs.detach(), got.logprobs)
    with pytest.raises(ShapeError, match="logprob_columns") as e:
        hf.score(model, ids, mask, logprob_columns=wanted[:, 1:])
    assert e.value.argument == "logprob_columns"


@pytest.mark.usefixtures("no_chunk_env")
def test_rl_forward_scores_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rl.forward`` (and so the trainer) goes through the chunked path; the environment
    variable sets its chunk."""
    model = _model("llama")
    ids, mask = _batch(3)
    ref = hf.score(model, ids, mask, logprob_chunk=0).logprobs
    monkeypatch.setenv(LOGPROB_CHUNK_ENV, "4")
    rows = _HeadRows(model)
    try:
        out = rl.forward(model, ids, mask, routing=False)
    finally:
        rows.handle.remove()
    assert max(rows.rows) <= 4 and len(rows.rows) > 3
    _assert_close(out.logprobs, ref, "rl.forward")


@pytest.mark.usefixtures("no_chunk_env")
def test_default_chunk_is_the_element_cap_over_the_vocabulary() -> None:
    model = _model("llama")
    ids, mask = _batch()
    rows = _HeadRows(model)
    try:
        hf.score(model, ids, mask)
    finally:
        rows.handle.remove()
    n = int(((mask[:, :-1] != 0) & (mask[:, 1:] != 0)).sum())
    assert LOGPROB_CHUNK_ELEMENTS // V > n
    assert rows.rows == [B, B, n]  # one chunk holds them all


def test_softcapped_model_gives_the_full_logits_logprobs(no_chunk_env: None) -> None:
    """Gemma 2 soft-caps its logits after the head; the chunked path applies the same cap."""
    cfg = transformers.Gemma2Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, final_logit_softcapping=2.0, max_position_embeddings=64,
        pad_token_id=2, bos_token_id=0, eos_token_id=1, initializer_range=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma2ForCausalLM(cfg).eval()
    ids, mask = _batch()
    with torch.no_grad():
        ref = _plain_logprobs(model, ids, mask, 0.8)
        uncapped = hf.score(model, ids, mask, temperature=0.8, logprob_chunk=0).logprobs
    _assert_close(uncapped, ref, "unchunked")
    got = hf.score(model, ids, mask, temperature=0.8, logprob_chunk=7).logprobs
    _assert_close(got, ref, "chunked")


def test_a_logit_transform_the_chunks_do_not_know_is_an_error(no_chunk_env: None) -> None:
    """A config that claims a soft-cap the model does not apply (Llama ignores it): the
    last-position check sees the chunked logits differ from the model's and raises."""
    model = tiny_lm("llama", vocab=V, seed=1, final_logit_softcapping=0.5)
    ids, mask = _batch()
    with pytest.raises(hf.UnsupportedModelError, match="logprob_chunk=0"):
        hf.score(model, ids, mask, logprob_chunk=4)
    ref = _plain_logprobs(model, ids, mask, 1.0).detach()
    _assert_close(hf.score(model, ids, mask, logprob_chunk=0).logprobs, ref, "unchunked")


@pytest.mark.parametrize("bad", [-1, 1.5, "8", True])
def test_bad_chunk_is_a_parameter_error(bad: Any, no_chunk_env: None) -> None:
    model = _model("llama")
    ids, mask = _batch()
    with pytest.raises(ParameterError, match="logprob_chunk"):
        hf.score(model, ids, mask, logprob_chunk=bad)


def test_bad_chunk_environment_variable_is_a_parameter_error(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model("llama")
    ids, mask = _batch()
    monkeypatch.setenv(LOGPROB_CHUNK_ENV, "lots")
    with pytest.raises(ParameterError, match=LOGPROB_CHUNK_ENV):
        hf.score(model, ids, mask)


def test_head_logprobs_equal_token_logprobs_and_check_arguments() -> None:
    g = torch.Generator().manual_seed(5)
    head = torch.nn.Linear(8, 17, bias=True)
    hidden = torch.randn(23, 8, generator=g)
    y = torch.randint(0, 17, (23,), generator=g)
    with torch.no_grad():
        ref = hf.token_logprobs(head(hidden)[None], y[None], temperature=1.3)[0]
        for chunk in (1, 5, 23, 64):
            got = head_logprobs(hidden, head, y, temperature=1.3, chunk_tokens=chunk)
            _assert_close(got, ref, f"chunk {chunk}")
        assert head_logprobs(hidden[:0], head, y[:0], chunk_tokens=4).shape == (0,)
    with pytest.raises(ShapeError, match="hidden"):
        head_logprobs(hidden[None], head, y, chunk_tokens=4)
    with pytest.raises(ShapeError, match="targets"):
        head_logprobs(hidden, head, y[:-1], chunk_tokens=4)
    with pytest.raises(ParameterError, match="chunk_tokens"):
        head_logprobs(hidden, head, y, chunk_tokens=0)
    with pytest.raises(ParameterError, match="temperature"):
        head_logprobs(hidden, head, y, chunk_tokens=4, temperature=0.0)


@pytest.mark.parametrize("bias", [False, True])
def test_the_reused_block_path_equals_the_module_path_bit_for_bit(bias: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without gradients a bare float32 ``nn.Linear`` head writes each chunk into one reused
    block and reduces it in place: the same values, bit for bit, as calling the module and
    ``torch.logsumexp`` (chunks of 7 rows over 30: the last one shorter)."""
    from comppo_core.hf import lm

    g = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(16, 50, bias=bias)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    hidden = torch.randn(30, 16, generator=g)
    targets = torch.randint(0, 50, (30,), generator=g)
    calls: list[int] = []
    real = lm._chunk_logprobs_in_place
    monkeypatch.setattr(lm, "_chunk_logprobs_in_place", lambda z, t, y: calls.append(1) or real(z, t, y))
    with torch.no_grad():
        fast = lm.head_logprobs(hidden, head, targets, temperature=0.7, chunk_tokens=7)
        slow = torch.cat(
            [lm._chunk_logprobs(head, None, 0.7, hidden[i : i + 7], targets[i : i + 7]) for i in range(0, 30, 7)]
        )
    assert len(calls) == 5 and torch.equal(fast, slow)
    handle = head.register_forward_hook(lambda *_: None)  # a hooked head goes through the module
    calls.clear()
    with torch.no_grad():
        hooked = lm.head_logprobs(hidden, head, targets, temperature=0.7, chunk_tokens=7)
    handle.remove()
    assert not calls and torch.equal(hooked, slow)
