"""Shared pytest configuration for the comppo-core test suite.

* ``HF_HUB_OFFLINE=1`` for the whole suite (nothing is downloaded; a test that tried
  would fail at once instead of waiting on the network);
* ``TRITON_INTERPRET=1`` for the whole suite on a machine without CUDA (Triton's CPU
  interpreter for the online kernel's tests);
* a Hypothesis profile (no deadline: the first call of a kernel builds the thread pool,
  and CI machines are noisy; we never time anything);
* a fixture that restores the kernels' thread count after a test changes it;
* :data:`ERROR_CLASSES`, the package's error classes (from ``comppo_core.errors.__all__``);
* :func:`tolerance`, the kernel-vs-reference tolerance of GAE and TD outputs;
* :class:`DLPackProducer`, an array that speaks only the DLPack protocol;
* :func:`tiny_lm`, the one builder of the tiny randomly initialised causal LMs the
  ``hf`` and ``rl`` tests run (nothing is downloaded), also a fixture of that name.

The tests draw their batches from the shipped ``comppo_core.testing.strategies``
(``ragged_batches``, ``concentration_batches``, ...). Test modules import the plain
functions here with ``from conftest import ...`` (``tests/gpu`` is a package, so its own
conftest does not take the name).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import comppo_core as cc
from comppo_core import errors

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _interpret_triton_without_cuda() -> None:
    """``TRITON_INTERPRET=1`` for the session on a machine without CUDA, where no compiled
    Triton kernel can run, so that tests/hf/test_hf_online.py runs the online kernel under
    Triton's CPU interpreter in this process. Triton reads the variable when it decorates
    its functions (its own library's at its first import), hence here, before anything
    imports it; a session where triton is already imported, or that sets the variable
    itself, is left as it is."""
    if "triton" in sys.modules or "TRITON_INTERPRET" in os.environ:
        return
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_interpret_triton_without_cuda()

settings.register_profile(
    "default",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
# A quicker profile for local iteration: HYPOTHESIS_PROFILE=fast pytest
settings.register_profile("fast", parent=settings.get_profile("default"), max_examples=25)
# A deeper one for occasional bug hunting: HYPOTHESIS_PROFILE=thorough pytest
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


#: The error classes of ``comppo_core.errors`` (``ComppoError`` and its subclasses),
#: taken from its ``__all__``: the one list the error tests iterate over.
ERROR_CLASSES: tuple[type[cc.ComppoError], ...] = tuple(
    getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)
)


@pytest.fixture
def restore_threads() -> Iterator[int]:
    """Yields the current thread count and puts it back after the test."""
    original = cc.get_num_threads()
    try:
        yield original
    finally:
        cc.set_num_threads(original)


def tolerance(dtype: Any) -> dict[str, float]:
    """assert_allclose tolerances for GAE / TD outputs of ``dtype`` (kernel vs reference).

    Kernel and reference compute in float64; the kernel reassociates the GAE recursion
    over blocks of four positions, so they differ by float64 rounding of the partial
    sums (~1e-16 of the largest term; the drawn values are in [-10, 10], rows ≤ 12 long),
    and float32 is that float64 value rounded once. float16 is
    computed in float32 (f64 → f32 → f16, a double rounding), so allow one f16 ulp.
    """
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return {"rtol": 1e-12, "atol": 1e-12}
    if dtype == np.float32:
        return {"rtol": 1e-6, "atol": 1e-6}
    return {"rtol": 2e-3, "atol": 2e-3}


class DLPackProducer:
    """A minimal non-torch, non-NumPy ``__dlpack__`` producer delegating to a NumPy array."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._a.__dlpack_device__()


def tiny_lm(
    arch: str = "llama",
    *,
    vocab: int = 32,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 64,
    max_positions: int | None = 128,
    init: float | None = 0.25,
    seed: int = 0,
    dtype: Any = None,
    attn: str | None = None,
    special_tokens: bool = True,
    **config: Any,
) -> Any:
    """A tiny causal LM with random weights, in eval mode (torch's global RNG seeded with ``seed``).

    ``arch``: ``llama``, ``qwen2``, ``qwen3`` (``head_dim`` 16 unless given), ``mistral`` or
    ``gpt2`` (multi-head, learned positions; ``kv_heads`` and ``intermediate`` unused).
    ``init``: the initializer range (std 0.25 makes the heads visibly concentrated) and
    ``max_positions``: None for the architecture's default. ``special_tokens``: bos 0,
    eos 1, pad 2 (gpt2: bos and eos; False: the architecture's defaults).
    ``attn``: the attention implementation (None: the library's default). ``config``:
    more fields of the architecture's config (sliding windows, ...). Tests that skip
    without torch call ``pytest.importorskip("transformers")`` first."""
    import torch
    import transformers

    torch.manual_seed(seed)
    extra: dict[str, Any] = {} if init is None else {"initializer_range": init}
    if attn is not None:
        extra["attn_implementation"] = attn
    if arch == "gpt2":
        tokens = {"bos_token_id": 0, "eos_token_id": 1} if special_tokens else {}
        if max_positions is not None:
            extra["n_positions"] = max_positions
        cfg: Any = transformers.GPT2Config(
            vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, **tokens, **extra, **config,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(cfg)
    else:
        tokens = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2} if special_tokens else {}
        if max_positions is not None:
            extra["max_position_embeddings"] = max_positions
        common = dict(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv_heads, **tokens, **extra,
        )  # fmt: skip
        classes = {
            "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
            "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
            "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        }
        if arch not in classes:
            raise AssertionError(f"tiny_lm: unknown arch {arch!r}")
        if arch == "qwen3":
            config.setdefault("head_dim", 16)
        config_cls, model_cls = classes[arch]
        model = model_cls(config_cls(**common, **config))
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


@pytest.fixture(name="tiny_lm", scope="session")
def tiny_lm_fixture() -> Callable[..., Any]:
    """:func:`tiny_lm`, for a test that takes it as an argument (skips without transformers)."""
    pytest.importorskip("transformers")
    return tiny_lm


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread for the test (the trainer's own choice on CPU; timings and float
    reductions do not depend on the machine's cores), torch's setting back after it.
    A module of training tests uses it with ``pytestmark = pytest.mark.usefixtures(...)``."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
