"""Wrapped models: ``hf.score`` (and so ``rl.forward``) accepts a model wrapped by PEFT or
DDP. The probe, the LM-head hook and the critic taps attach to the inner Hugging Face
model; the forward runs through the wrapper (for DDP, its reducer all-reduces the
gradients)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import tiny_lm  # noqa: E402

from comppo_core import hf, rl  # noqa: E402
from comppo_core.rl.models.lora import add_adapter  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V = 41


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, V, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    mask[1, -3:] = 0  # right padding
    return ids, mask


def _grads(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# --------------------------------------------------------------------------- PEFT


@pytest.fixture
def lora() -> tuple[Any, Any]:
    """A LoRA-wrapped tiny Llama with non-zero adapter weights, and its merged copy."""
    pytest.importorskip("peft")
    base = tiny_lm("llama", vocab=V, seed=3)
    wrapped = add_adapter(base, rank=4, alpha=8.0, modules="q_proj,k_proj,v_proj", seed=1)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:  # B = 0 at init would make the adapter the identity
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    with warnings.catch_warnings():  # peft asks transformers 5 for a deprecated attribute
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        merged = copy.deepcopy(wrapped).merge_and_unload()
    return wrapped.eval(), merged.eval()


def test_unwrap_model_peels_peft_to_the_transformers_model(lora: tuple[Any, Any]) -> None:
    wrapped, _ = lora
    inner = hf.unwrap_model(wrapped)
    assert inner is wrapped.get_base_model()
    assert type(inner).__name__ == "LlamaForCausalLM"
    assert hf.unwrap_model(inner) is inner


@pytest.mark.parametrize("chunk", [3, 0])
def test_peft_model_scores_as_its_merged_model(lora: tuple[Any, Any], chunk: int) -> None:
    wrapped, merged = lora
    ids, mask = _batch()
    got = hf.score(wrapped, ids, mask, per_layer=True, temperature=0.8, logprob_chunk=chunk)
    ref = hf.score(merged, ids, mask, per_layer=True, temperature=0.8, logprob_chunk=0)
    base = hf.score(wrapped.get_base_model(), ids, mask, logprob_chunk=0)
    assert got.concentration is not None and ref.concentration is not None
    torch.testing.assert_close(got.logprobs, ref.logprobs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.concentration, ref.concentration, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.per_layer, ref.per_layer, rtol=1e-5, atol=1e-5)
    # the adapter matters: the same numbers without it are not these (the test can fail)
    with wrapped.disable_adapter():
        off = hf.score(wrapped, ids, mask, temperature=0.8, logprob_chunk=0)
    assert float((off.logprobs - got.logprobs).abs().max()) > 1e-2
    assert base.logprobs.shape == got.logprobs.shape


def test_gradients_reach_the_lora_parameters(lora: tuple[Any, Any]) -> None:
    """Through the PEFT wrapper and the chunked head, the LoRA parameters get the gradients
    the plain full-logits computation gives them; the frozen base weights get none."""
    wrapped, _ = lora
    ids, mask = _batch()
    w = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=torch.Generator().manual_seed(2))
    cols = (mask[:, :-1] != 0) & (mask[:, 1:] != 0)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = wrapped(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    ref_lp = torch.log_softmax(logits[:, :-1].float() / 0.8, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    (torch.where(cols, ref_lp, 0.0) * w).sum().backward()
    ref = _grads(wrapped)
    wrapped.zero_grad(set_to_none=True)
    s = hf.score(wrapped, ids, mask, concentration=True, temperature=0.8, grad=True, logprob_chunk=4)
    (s.logprobs * w).sum().backward()
    got = _grads(wrapped)
    assert got.keys() == ref.keys()
    assert got and all("lora_" in n for n in got)
    for name in ref:
        assert float(got[name].abs().max()) > 0, name
        err, scale = float((got[name] - ref[name]).abs().max()), max(1.0, float(ref[name].abs().max()))
        assert err <= 1e-6 * scale, f"{name}: max abs difference {err:.3g} > 1e-6 × {scale:.3g}"


def test_rl_forward_with_taps_on_a_peft_model(lora: tuple[Any, Any]) -> None:
    wrapped, merged = lora
    ids, mask = _batch()
    with rl.TapRecorder(wrapped, (0, 1)) as taps, torch.no_grad():
        wrapped(input_ids=ids, attention_mask=mask)
    assert sorted(taps.hidden) == [0, 1] and taps.hidden[1].shape == (3, 10, 32)
    out = rl.forward(wrapped, ids, mask)
    ref = rl.forward(merged, ids, mask)
    torch.testing.assert_close(out.logprobs, ref.logprobs, rtol=1e-5, atol=1e-5)
    assert out.concentration is not None and ref.concentration is not None
    torch.testing.assert_close(out.concentration, ref.concentration, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- DDP


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[Any]:
    """A one-process gloo group (FileStore in tmp_path), destroyed after the test."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable or already initialised")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_ddp_model_scores_and_trains_as_the_bare_model(process_group: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    bare = tiny_lm("llama", vocab=V, seed=4)
    ddp = DDP(copy.deepcopy(bare))
    assert hf.unwrap_model(ddp) is ddp.module
    reductions = []

    def counting_allreduce(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations
        reductions.append(bucket.buffer().numel())  # DDP's reducer calls this per bucket
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, counting_allreduce)
    ids, mask = _batch()
    with torch.no_grad():
        got = hf.score(ddp, ids, mask, per_layer=True, temperature=0.9, logprob_chunk=5)
        ref = hf.score(bare, ids, mask, per_layer=True, temperature=0.9, logprob_chunk=0)
    assert got.concentration is not None and ref.concentration is not None
    torch.testing.assert_close(got.logprobs, ref.logprobs, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.concentration, ref.concentration, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.per_layer, ref.per_layer, rtol=0, atol=1e-6)

    w = torch.randn(ids.shape[0], ids.shape[1] - 1, generator=torch.Generator().manual_seed(5))
    (hf.score(bare, ids, mask, temperature=0.9, grad=True, logprob_chunk=0).logprobs * w).sum().backward()
    assert not reductions
    out = rl.forward(ddp, ids, mask, grad=True, temperature=0.9)
    (out.logprobs * w).sum().backward()
    # the backward ran through DDP's reducer: every parameter's gradient went through an all-reduce
    assert sum(reductions) == sum(p.numel() for p in ddp.parameters())
    ref_grads, got_grads = _grads(bare), {n.removeprefix("module."): g for n, g in _grads(ddp).items()}
    assert got_grads.keys() == ref_grads.keys() and len(ref_grads) == len(list(bare.parameters()))
    for name in ref_grads:
        scale = max(1.0, float(ref_grads[name].abs().max()))
        torch.testing.assert_close(got_grads[name], ref_grads[name], rtol=0, atol=1e-6 * scale, msg=name)
