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
undoes them; with ``torch.cpu.set_rng_state``, which verl's checkpoint loading calls on
the CPU); :func:`new_engine` builds an engine (:func:`comppo_engine_with` a CompPO one);
:func:`tiny_llama` and :func:`rollout` the model and a batch as verl's trainer holds it
(prompts left-padded, responses right-padded); :func:`as_no_padding` and
:func:`transfer_queue_batch` the TensorDicts the legacy and the v1 trainer hand the actor.
"""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Iterator
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
    def device_module(self) -> Any:
        return torch.cpu  # verl tests `device == torch.cpu` (memory logging)

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
    # verl's checkpoint manager restores the device RNG with device_module.set_rng_state when the device
    # name is a key of the saved RNG state, which "cpu" always is; torch.cpu has no set_rng_state
    added_rng = not hasattr(torch.cpu, "set_rng_state")
    if added_rng:
        torch.cpu.set_rng_state = torch.set_rng_state  # type: ignore[attr-defined]
    started = not torch.distributed.is_initialized()
    if started:
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        if started:
            torch.distributed.destroy_process_group()
        platform_manager._current_platform = previous  # as it was (None: detected again on the next call)
        if added_rng:
            del torch.cpu.set_rng_state  # type: ignore[attr-defined]
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


def new_engine(
    path: str,
    model_type: str = "language_model",
    *,
    mixed_precision: str = "fp32",
    optimizer: dict[str, Any] | None = None,
    save_contents: tuple[str, ...] = ("model", "optimizer", "extra"),
    attention: str = "sdpa",
    gradient_checkpointing: bool = True,
) -> Any:
    """verl's FSDP2 engine on the model saved at ``path``, initialised: float32 weights, and
    ``mixed_precision`` ("fp32", or "bf16": verl's default bf16 parameters and autocast, float32
    reductions); AdamW lr 1e-2 without weight decay or clipping unless ``optimizer`` (keyword
    arguments of ``FSDPOptimizerConfig``) says otherwise; ``save_contents`` of the checkpoint;
    the model's ``attention`` implementation (verl's default is flash_attention_2, which needs a
    GPU) and verl's ``enable_gradient_checkpointing`` (on by default, as verl's)."""
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config.engine import FSDPEngineConfig
    from verl.workers.config.model import HFModelConfig
    from verl.workers.config.optimizer import FSDPOptimizerConfig
    from verl.workers.engine import EngineRegistry

    engine = EngineRegistry.new(
        model_type=model_type,
        backend="fsdp2",
        model_config=HFModelConfig(
            path=path,
            load_tokenizer=False,
            override_config={"attn_implementation": attention},
            use_remove_padding=True,
            enable_gradient_checkpointing=gradient_checkpointing,
        ),
        engine_config=FSDPEngineConfig(
            strategy="fsdp2",
            mixed_precision={"param_dtype": mixed_precision, "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
            use_torch_compile=False,
            model_dtype="fp32",
            forward_only=False,
        ),
        optimizer_config=FSDPOptimizerConfig(
            **({"lr": 1e-2, "weight_decay": 0.0, "clip_grad": 1e9} | (optimizer or {}))
        ),
        checkpoint_config=CheckpointConfig(save_contents=list(save_contents), load_contents=list(save_contents)),
    )
    engine.initialize()
    return engine


def comppo_engine_with(path: str, settings: Any, head_seed: int | None = 3, **engine_kwargs: Any) -> Any:
    """A CompPO engine (``comppo_core.integrations.verl.engine``) with ``settings``; with a TAC and
    ``head_seed``, its value head randomised with that seed (a fresh TAC's values are all 0)."""
    from torch.distributed.tensor import distribute_tensor

    from comppo_core.integrations.verl import engine as comppo_engine

    comppo_engine.register_engine()
    comppo_engine.configure_engine(settings)
    engine = new_engine(path, model_type=comppo_engine.MODEL_TYPE, **engine_kwargs)
    tac = getattr(engine.module, "comppo_tac", None)
    if tac is not None and head_seed is not None:
        g = torch.Generator().manual_seed(head_seed)
        with torch.no_grad():
            for p in tac.head.parameters():
                full = torch.randn(tuple(p.shape), generator=g)
                p.copy_(distribute_tensor(full, p.device_mesh, p.placements))
    return engine


def full_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s state dict, full tensors (DTensors gathered), detached copies."""
    return {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
        for k, v in module.state_dict().items()
    }


def plain_tac(hf_model: Any, engine: Any, tac_kwargs: dict[str, Any]) -> Any:
    """A TransportAlignedCritic with the engine's TAC's weights, outside FSDP (eval mode)."""
    from comppo_core import rl

    tac = rl.TransportAlignedCritic.for_model(hf_model, **tac_kwargs)
    tac.load_state_dict(full_state(engine.module.comppo_tac))
    return tac.eval()


def response_lengths(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each sequence's real response length (its right padding left out)."""
    r = batch["responses"].shape[1]
    return batch["attention_mask"][:, -r:].sum(1)


def per_column(x: torch.Tensor, cu: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A ``[B, R]`` per-response-token tensor in the packed ``[1, N−1]`` columns (0 elsewhere): response
    token k of sequence i (``r_i`` real response tokens) is scored by column ``cu[i+1] − r_i − 1 + k``."""
    lengths = response_lengths(batch)
    out = torch.zeros(1, int(cu[-1]) - 1, dtype=x.dtype)
    for i in range(x.shape[0]):
        k = torch.arange(int(lengths[i]))
        out[0, int(cu[i + 1]) - int(lengths[i]) - 1 + k] = x[i, k]
    return out


def per_response(columns: torch.Tensor, cu: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The inverse of :func:`per_column`: packed ``[1, N−1]`` columns → ``[B, R]`` (0 on the padding)."""
    lengths = response_lengths(batch)
    out = torch.zeros(batch["responses"].shape, dtype=columns.dtype)
    for i in range(out.shape[0]):
        k = torch.arange(int(lengths[i]))
        out[i, k] = columns[0, int(cu[i + 1]) - int(lengths[i]) - 1 + k]
    return out


def transfer_queue_batch(batch: dict[str, torch.Tensor], **meta: Any) -> Any:
    """The TensorDict verl's v1 trainer hands the actor's ``update_actor`` from its TransferQueue: every
    field nested, one unpadded row per sequence (``prompts``, ``responses``, ``input_ids``,
    ``position_ids``; ``response_mask`` = ``loss_mask`` and any other ``[B, R]`` field of ``batch``
    response-long), no ``attention_mask``; ``meta`` as its non-tensor data."""
    from verl.utils import tensordict_utils as tu

    p, r = batch["prompts"].shape[1], batch["responses"].shape[1]
    mask = batch["attention_mask"] != 0
    prompt_rows = [mask[i, :p] for i in range(mask.shape[0])]
    response_rows = [mask[i, p:] for i in range(mask.shape[0])]

    def nested(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    fields: dict[str, Any] = {
        "prompts": nested([batch["prompts"][i, m] for i, m in enumerate(prompt_rows)]),
        "responses": nested([batch["responses"][i, m] for i, m in enumerate(response_rows)]),
        "input_ids": nested([batch["input_ids"][i, mask[i]] for i in range(mask.shape[0])]),
        "position_ids": nested([batch["position_ids"][i, mask[i]] for i in range(mask.shape[0])]),
    }
    for name, value in batch.items():
        if name not in fields and name != "attention_mask" and value.shape[1] == r:
            fields[name] = nested([value[i, m] for i, m in enumerate(response_rows)])
    fields["loss_mask"] = fields["response_mask"]
    td = tu.get_tensordict(fields)
    tu.assign_non_tensor(td, **meta)
    return td


#: the non-tensor data of an actor update's TensorDict (verl's worker and trainer set them): 2 micro-batches of 2,
#: τ = TAU, the minibatch's 4 rows as the seq-mean modes' global_batch_size
UPDATE_META: dict[str, Any] = {
    "use_remove_padding": True,
    "use_dynamic_bsz": False,
    "micro_batch_size_per_gpu": 2,
    "use_fused_kernels": False,
    "calculate_entropy": False,
    "temperature": TAU,
    "global_batch_size": 4,
}


def update_fields(batch: dict[str, torch.Tensor], seed: int = 9) -> dict[str, torch.Tensor]:
    """Random ``[B, R]`` old log-probs, advantages, returns and old values for an update of ``batch``."""
    g = torch.Generator().manual_seed(seed)
    shape = batch["responses"].shape
    return {
        "old_log_probs": -1.0 + 0.1 * torch.randn(shape, generator=g),
        "advantages": torch.randn(shape, generator=g),
        "returns": torch.randn(shape, generator=g),
        "values": torch.randn(shape, generator=g),
    }


def update_batch(batch: dict[str, torch.Tensor], seed: int = 9, **meta: Any) -> Any:
    """An actor update's TensorDict of ``batch`` and its :func:`update_fields` (``as_no_padding``,
    :data:`UPDATE_META`, ``comppo_probe``, then ``meta``)."""
    return as_no_padding({**batch, **update_fields(batch, seed)}, **(UPDATE_META | {"comppo_probe": True} | meta))


def actor_config(**overrides: Any) -> Any:
    """verl's FSDP actor config (``actor_rollout_ref.actor``) of the tests' update (a minibatch of 4 in
    micro-batches of 2, ratio clip 0.2/0.28, dual clip 3, no entropy bonus), with ``overrides``."""
    from verl.workers.config.actor import FSDPActorConfig

    fields: dict[str, Any] = {
        "strategy": "fsdp2",
        "rollout_n": 1,
        "ppo_mini_batch_size": 4,
        "ppo_micro_batch_size_per_gpu": 2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "clip_ratio_c": 3.0,
        "entropy_coeff": 0.0,
    }
    return FSDPActorConfig(**(fields | overrides))


def padded_to_packed(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A padded ``[B, T−1]`` column output (``rl.forward`` on the padded batch) in the packed ``[1, N−1]``
    layout of the same sequences (each sequence's boundary column 0)."""
    parts = []
    for i in range(x.shape[0]):
        idx = torch.nonzero(attention_mask[i]).flatten()
        parts.append(torch.cat([x[i, idx[:-1]], x.new_zeros(1)]))
    return torch.cat(parts)[:-1].unsqueeze(0)
