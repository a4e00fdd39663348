"""verl 0.9.1's FSDP2 actor engine on the CPU, in this process, for the verl recipe's tests (test-only code).

verl runs its engines on CUDA or NPU only. Three things start its FSDP2 engine on the CPU
in one gloo process (found in issue 45; none of them is part of the package):

* :class:`CPUPlatform`, verl's platform interface for the CPU (device ``"cpu"``, gloo),
  set with ``verl.plugin.platform.platform_manager.set_platform`` before anything asks
  verl for its platform;
* ``VERL_ENGINE_DEVICE=cuda``: the engines are registered for ``cuda``/``npu`` only, and
  ``EngineRegistry.get_engine_cls`` reads the device from this variable;
* ``override_config={"attn_implementation": "sdpa"}`` (verl's default is
  flash_attention_2), and float32 parameters and mixed precision (verl's bf16 autocast
  moves log-probs by ~1e-2).

:func:`cpu_process_group` does the first two and a world-size-1 gloo process group (and
undoes them); :func:`new_engine` builds an engine; :func:`tiny_llama` and :func:`rollout`
the model and a batch as verl's trainer holds it (prompts left-padded, responses
right-padded).
"""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

# verl warns at import about the optional engines it cannot load (torchtitan, ...), which the suite's
# filterwarnings=error would turn into errors: import what the tests use once, here, quietly
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import verl.trainer.config.config
    import verl.utils.tensordict_utils
    import verl.workers.config.engine
    import verl.workers.config.model
    import verl.workers.config.optimizer
    import verl.workers.engine
    import verl.workers.engine.fsdp.transformer_impl
    import verl.workers.utils.padding  # noqa: F401
    from verl.plugin.platform.platform_base import PlatformBase

#: the tiny Llama's vocabulary
VOCAB = 64
#: the rollout's sampling temperature the tests score with
TAU = 0.7


class CPUPlatform(PlatformBase):  # type: ignore[misc]
    """verl's platform interface on the CPU: device "cpu", gloo, no profiler."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return torch.cpu

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:
        return "cpu"  # a string: verl moves micro-batches with .to(get_device_id())

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return (None, None)

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def nvtx_range(self, msg: str) -> Any:
        return contextlib.nullcontext()

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def cpu_process_group() -> Iterator[None]:
    """verl on the CPU in this process: the platform, ``VERL_ENGINE_DEVICE=cuda`` and a gloo
    process group of one; all undone on exit (the environment variables as they were)."""
    from verl.plugin.platform import platform_manager

    names = ("VERL_ENGINE_DEVICE", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(
        VERL_ENGINE_DEVICE="cuda",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
    )
    previous = platform_manager._current_platform
    platform_manager.set_platform(CPUPlatform())
    started = not torch.distributed.is_initialized()
    if started:
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        if started:
            torch.distributed.destroy_process_group()
        platform_manager._current_platform = previous  # as it was (None: detected again on the next call)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def tiny_llama(path: str, seed: int = 0) -> Any:
    """A 3-layer width-32 Llama with random weights (std 0.25: visibly concentrated heads), saved to ``path``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.25,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    return model


def rollout(
    seed: int = 1, prompt_lens: tuple[int, ...] = (6, 3, 5, 4), response_lens: tuple[int, ...] = (5, 2, 4, 3)
) -> dict[str, torch.Tensor]:
    """Prompts left-padded, responses right-padded (pad id 2), as verl's trainer holds a rollout;
    ``response_mask`` has one interior 0 (a tool token) in the first response."""
    g = torch.Generator().manual_seed(seed)
    b, p, r = len(prompt_lens), max(prompt_lens), max(response_lens)
    prompts = torch.full((b, p), 2, dtype=torch.long)
    responses = torch.full((b, r), 2, dtype=torch.long)
    attention_mask = torch.zeros(b, p + r, dtype=torch.long)
    for i, (lp, lr) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompts[i, p - lp :] = torch.randint(3, VOCAB, (lp,), generator=g)
        responses[i, :lr] = torch.randint(3, VOCAB, (lr,), generator=g)
        attention_mask[i, p - lp : p + lr] = 1
    response_mask = attention_mask[:, p:].clone()
    response_mask[0, 1] = 0
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
    }


def as_no_padding(batch: dict[str, torch.Tensor], **meta: Any) -> Any:
    """The TensorDict verl's trainer hands the actor's ``compute_log_prob`` (``left_right_2_no_padding``),
    with ``meta`` as its non-tensor data."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = tu.get_tensordict({k: v.clone() for k, v in batch.items()})
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, **meta)
    return td


def old_log_prob_batch(batch: dict[str, torch.Tensor], **meta: Any) -> Any:
    """:func:`as_no_padding` with what the old-log-prob pass sets (2 micro-batches of 2, τ = :data:`TAU`)."""
    settings: dict[str, Any] = {
        "use_remove_padding": True,
        "use_dynamic_bsz": False,
        "micro_batch_size_per_gpu": 2,
        "use_fused_kernels": False,
        "calculate_entropy": False,
        "compute_loss": False,
        "temperature": TAU,
    }
    return as_no_padding(batch, **(settings | meta))


def new_engine(path: str, model_type: str = "language_model") -> Any:
    """verl's FSDP2 engine on the model saved at ``path``, float32, initialised."""
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config.engine import FSDPEngineConfig
    from verl.workers.config.model import HFModelConfig
    from verl.workers.config.optimizer import FSDPOptimizerConfig
    from verl.workers.engine import EngineRegistry

    engine = EngineRegistry.new(
        model_type=model_type,
        backend="fsdp2",
        model_config=HFModelConfig(
            path=path, load_tokenizer=False, override_config={"attn_implementation": "sdpa"}, use_remove_padding=True
        ),
        engine_config=FSDPEngineConfig(
            strategy="fsdp2",
            mixed_precision={"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
            use_torch_compile=False,
            model_dtype="fp32",
            forward_only=False,
        ),
        optimizer_config=FSDPOptimizerConfig(lr=1e-2, weight_decay=0.0, clip_grad=1e9),
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    return engine


def padded_to_packed(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A padded ``[B, T−1]`` column output (``rl.forward`` on the padded batch) in the packed ``[1, N−1]``
    layout of the same sequences (each sequence's boundary column 0)."""
    parts = []
    for i in range(x.shape[0]):
        idx = torch.nonzero(attention_mask[i]).flatten()
        parts.append(torch.cat([x[i, idx[:-1]], x.new_zeros(1)]))
    return torch.cat(parts)[:-1].unsqueeze(0)
