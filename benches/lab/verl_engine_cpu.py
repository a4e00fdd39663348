"""verl 0.9.1's FSDP2 actor engine on CPU (one gloo process) against comppo_core, on a tiny random Llama.

Not part of the package: the exploration behind the verl recipe (issue 45; findings in the
session notes). Run it in the verl environment, with the repository's Python on the path::

    OMP_NUM_THREADS=1 PYTHONPATH=python nice -n 10 /work/venv-verl/bin/python benches/lab/verl_engine_cpu.py

What it does, each step printing its largest difference:

1. starts verl's FSDP2 engine (``EngineRegistry.new("language_model", "fsdp2", ...)``) on CPU:
   a CPU platform registered with ``verl.plugin.platform.set_platform`` (device "cpu",
   gloo), ``VERL_ENGINE_DEVICE=cuda`` (the engines are registered for cuda/npu only) and
   ``override_config={"attn_implementation": "sdpa"}`` (the default is flash_attention_2);
   float32 parameters (``mixed_precision`` fp32: the default bf16 autocast changes the
   log-probs by ~1e-2, issue 45 measured 2.65e-2);
2. a rollout batch as verl's trainer holds it (prompts left-padded, responses
   right-padded), converted by ``left_right_2_no_padding`` (the packed ``NO_PADDING``
   layout), scored by ``engine.infer_batch`` with ``use_remove_padding`` True (one packed
   row, ``cu_seqlens`` = the nested ids' offsets) and False (padded micro-batches);
   against ``comppo_core.rl.forward`` on the Hugging Face model (packed, ``cu_seqlens``);
3. ``CompPOEngine`` (``register_comppo_engine``), a subclass of verl's ``FSDPEngineWithLMHead``
   registered as ``model_type="comppo_language_model"``: the probe and a ``TapRecorder``
   around the engine's module forward (``forward_step``), the gates and the TAC's values
   computed in ``prepare_model_outputs`` on the packed row (the pieces of
   ``comppo_core.rl.forward``'s packed path), returned as extra nested keys of
   ``infer_batch``'s output (``concentration``, ``comp_gates``, ``values``); against
   ``comppo_core.rl.forward`` on the same rows, packed and padded (step 2);
4. the TAC as a submodule of the actor (``module.comppo_tac``, added in ``_build_module``,
   its own FSDP2 unit through ``_no_split_modules``): sharded, in the optimiser, in the
   state dict (and in the rollout's weight sync, which the recipe must filter); one
   ``forward_backward_batch`` + ``optimizer_step`` with a loss that adds the TAC's value
   loss, against the same update by hand (``rl.forward(grad=True)`` + torch's AdamW) (step 3).

``--steps 13`` runs a subset (about 12 s for all on one thread).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from types import ModuleType
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["VERL_ENGINE_DEVICE"] = "cuda"  # engines are registered for cuda/npu only
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from verl.plugin.platform.platform_base import PlatformBase  # noqa: E402


class CPUPlatform(PlatformBase):
    """verl's platform interface on the CPU: device "cpu", gloo, no profiler (test-only)."""

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
        return "cpu"

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
        import contextlib

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


def start() -> None:
    from verl.plugin.platform import platform_manager

    platform_manager.set_platform(CPUPlatform())
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)


# --------------------------------------------------------------------------- #
# the model and the rollout
# --------------------------------------------------------------------------- #

VOCAB = 64


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


def rollout(seed: int = 1) -> dict[str, torch.Tensor]:
    """4 prompts (left-padded to 6) and responses (right-padded to 5), as verl's trainer holds them."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens, response_lens = [6, 3, 5, 4], [5, 2, 4, 3]
    b, p, r = len(prompt_lens), 6, 5
    prompts = torch.full((b, p), 2, dtype=torch.long)
    responses = torch.full((b, r), 2, dtype=torch.long)
    attention_mask = torch.zeros(b, p + r, dtype=torch.long)
    for i, (lp, lr) in enumerate(zip(prompt_lens, response_lens)):
        prompts[i, p - lp :] = torch.randint(3, VOCAB, (lp,), generator=g)
        responses[i, :lr] = torch.randint(3, VOCAB, (lr,), generator=g)
        attention_mask[i, p - lp : p + lr] = 1
    input_ids = torch.cat([prompts, responses], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = attention_mask[:, p:].clone()
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
    }


def as_no_padding(batch: dict[str, torch.Tensor], **meta: Any) -> Any:
    """The TensorDict verl's trainer hands ``compute_log_prob`` (``left_right_2_no_padding``)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = tu.get_tensordict({k: v.clone() for k, v in batch.items()})
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, **meta)
    return td


def packed_from(td: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed row ``[1, N]`` and ``cu_seqlens`` of a NO_PADDING TensorDict's nested ids."""
    ids = td["input_ids"]
    return ids.values().unsqueeze(0), ids.offsets().to(torch.long)


def response_columns(batch: dict[str, torch.Tensor], cu: torch.Tensor) -> torch.Tensor:
    """``[1, N−1]`` bool: the packed columns that score a response token (column j scores token j+1)."""
    p = batch["prompts"].shape[1]
    prompt_lens = batch["attention_mask"][:, :p].sum(1)
    resp = torch.zeros(1, int(cu[-1]) - 1, dtype=torch.bool)
    for i in range(len(prompt_lens)):
        k = torch.nonzero(batch["response_mask"][i]).flatten()
        resp[0, int(cu[i]) + int(prompt_lens[i]) - 1 + k] = True
    return resp


def nested_columns(x: torch.Tensor, cu: torch.Tensor, fill: float = 0.0) -> Any:
    """A packed ``[1, N−1]`` column tensor as verl's per-token nested layout ``[N]`` (entry t = column t;
    each sequence's last entry, whose target would be the next sequence's first token, is ``fill``)."""
    n = int(cu[-1])
    out = torch.full((n,), fill, dtype=x.dtype)
    out[: n - 1] = x[0]
    out[cu[1:] - 1] = fill
    return torch.nested.nested_tensor_from_jagged(out, cu)


def verl_columns(nested: Any, cu: torch.Tensor) -> torch.Tensor:
    """verl's per-token nested output ``[N]`` as comppo_core's packed ``[1, N−1]`` columns (boundaries 0)."""
    v = nested.values().float().clone()
    v[cu[1:] - 1] = 0.0
    return v[:-1].unsqueeze(0)


def max_diff(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor | None = None) -> float:
    if where is not None:
        a, b = a[where], b[where]
    return float((a.double() - b.double()).abs().max())


# --------------------------------------------------------------------------- #
# the engine
# --------------------------------------------------------------------------- #


def engine_configs(path: str, *, remove_padding: bool = True, fp32: bool = True) -> dict[str, Any]:
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config.engine import FSDPEngineConfig
    from verl.workers.config.model import HFModelConfig
    from verl.workers.config.optimizer import FSDPOptimizerConfig

    model_config = HFModelConfig(
        path=path,
        load_tokenizer=False,
        override_config={"attn_implementation": "sdpa"},
        use_remove_padding=remove_padding,
    )
    mp = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"} if fp32 else None
    engine_config = FSDPEngineConfig(
        strategy="fsdp2", mixed_precision=mp, use_torch_compile=False, model_dtype="fp32", forward_only=False
    )
    optimizer_config = FSDPOptimizerConfig(lr=1e-2, weight_decay=0.0, clip_grad=1e9)
    return {
        "model_config": model_config,
        "engine_config": engine_config,
        "optimizer_config": optimizer_config,
        "checkpoint_config": CheckpointConfig(),
    }


def new_engine(path: str, model_type: str = "language_model", **kwargs: Any) -> Any:
    from verl.workers.engine import EngineRegistry

    engine = EngineRegistry.new(model_type=model_type, backend="fsdp2", **engine_configs(path, **kwargs))
    engine.initialize()
    return engine


def infer(engine: Any, batch: dict[str, torch.Tensor], remove_padding: bool = True) -> Any:
    td = as_no_padding(
        batch,
        use_remove_padding=remove_padding,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=2,
        use_fused_kernels=False,
        calculate_entropy=False,
        compute_loss=False,
        temperature=TAU,
    )
    with engine.eval_mode():
        out = engine.infer_batch(td, loss_function=None)
    return out, td


TAU = 0.7


def step_log_probs(hf_model: Any, engine: Any, batch: dict[str, torch.Tensor]) -> None:
    from comppo_core import rl

    for remove_padding in (True, False):
        out, td = infer(engine, batch, remove_padding)
        ids, cu = packed_from(td)
        lp = verl_columns(out["model_output"]["log_probs"], cu)
        ours = rl.forward(hf_model, ids, None, cu_seqlens=cu, temperature=TAU, routing=False)
        cols = ours.response_mask
        print(
            f"[1] infer_batch log-probs (use_remove_padding={remove_padding}) vs rl.forward(cu_seqlens): "
            f"max |diff| = {max_diff(lp, ours.logprobs, cols):.2e} over {int(cols.sum())} scored columns"
        )


def padded_to_packed(x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A padded ``[B, T−1]`` column output (``rl.forward`` on the padded batch) as the packed ``[1, N−1]`` layout."""
    parts = []
    for i in range(x.shape[0]):
        idx = torch.nonzero(attention_mask[i]).flatten()
        parts.append(torch.cat([x[i, idx[:-1]], x.new_zeros(1)]))  # the boundary column: 0
    return torch.cat(parts)[:-1].unsqueeze(0)


# --------------------------------------------------------------------------- #
# CompPO inside the engine: the probe around the module's forward, the TAC a submodule
# --------------------------------------------------------------------------- #

#: what the CompPO engine computes (the recipe would read it from the actor's config)
COMPPO: dict[str, Any] = {"tac": None, "gate_params": None, "causal": False}


def register_comppo_engine() -> type:
    """``CompPOEngine``: verl's ``FSDPEngineWithLMHead`` with the probe and the TAC, registered as
    ``model_type="comppo_language_model"`` (HFModelConfig.model_type selects it in ``TrainingWorker``)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    # EngineRegistry.register asserts on a second registration of the same key: register once per process
    registered = EngineRegistry._engines.get("comppo_language_model", {}).get("fsdp2", {}).get("cuda")
    if registered is not None:
        return registered

    from comppo_core import hf, rl
    from comppo_core.hf.lm import pack_columns, packed_position_ids, unpack_columns
    from comppo_core.rl.critics.inputs import packed_critic_inputs
    from comppo_core.rl.critics.tac import causal_gates
    from comppo_core.rl.critics.taps import TapRecorder

    @EngineRegistry.register(model_type="comppo_language_model", backend=["fsdp", "fsdp2"], device=["cuda", "npu"])
    class CompPOEngine(FSDPEngineWithLMHead):
        def _build_module(self) -> Any:
            module = super()._build_module()
            tac = COMPPO.get("tac")
            if tac is not None:  # a submodule before FSDP2 wraps: sharded, optimised, checkpointed with the actor
                torch.manual_seed(3)
                module.comppo_tac = rl.TransportAlignedCritic.for_model(module, **tac)
                with torch.no_grad():
                    module.comppo_tac.head.weight.normal_()
                    module.comppo_tac.head.bias.normal_()
                # its own FSDP2 unit (apply_fsdp2 wraps the classes named in _no_split_modules): called after the
                # actor's forward, it unshards and reshards itself (as a part of the root unit its parameters
                # would be sharded DTensors by then)
                module._no_split_modules = [*(module._no_split_modules or []), "TransportAlignedCritic"]
            return module

        def forward_step(self, micro_batch: Any, loss_function: Any, forward_only: bool) -> Any:
            if not tu.get_non_tensor_data(data=micro_batch, key="comppo_probe", default=False):
                return super().forward_step(micro_batch, loss_function, forward_only)
            tac = getattr(self.module, "comppo_tac", None)
            recorder = TapRecorder(self.module, tac.taps if tac is not None else ())
            with hf.ConcentrationProbe(self.module, per_layer=True, record_with_grad=True) as probe, recorder:
                self._comppo = (probe, recorder)
                try:
                    return super().forward_step(micro_batch, loss_function, forward_only)
                finally:
                    self._comppo = None

        def prepare_model_outputs(self, output: Any, output_args: Any, micro_batch: Any, logits_processor_func: Any):
            out = super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
            state = getattr(self, "_comppo", None)
            if state is None:
                return out
            probe, recorder = state
            ids_nested = micro_batch["input_ids"]
            ids, cu = ids_nested.values().unsqueeze(0), ids_nested.offsets().to(torch.long)
            columns = packed_position_ids(cu)[:, 1:] != 0
            conc = torch.where(columns, probe.concentration[:, :-1], 0.0)
            per = probe.per_layer[:, :-1].masked_fill(~columns.unsqueeze(-1), 0.0)
            resp = response_columns({k: micro_batch[k] for k in ("prompts", "attention_mask", "response_mask")}, cu)
            params = COMPPO["gate_params"]
            conc_rows, resp_rows = unpack_columns(conc, cu), unpack_columns(resp, cu)
            if COMPPO["causal"]:
                rows = causal_gates(conc_rows, resp_rows, params)
            else:
                import comppo_core as cc

                rows = torch.as_tensor(cc.gates_from_concentration(conc_rows, mask=resp_rows, params=params))
            gates = torch.where(resp, pack_columns(rows.float(), cu), 1.0)
            out["concentration"] = nested_columns(conc, cu)
            out["comp_gates"] = nested_columns(gates, cu, fill=1.0)
            tac = getattr(self.module, "comppo_tac", None)
            if tac is not None:
                inputs = packed_critic_inputs(
                    ids,
                    cu,
                    taps=recorder.hidden,
                    per_layer=per,
                    concentration=conc,
                    response_mask=resp,
                    gate_params=params,
                )
                values = pack_columns(tac(inputs), cu)
                out["values"] = nested_columns(values, cu)
            return out

    return CompPOEngine


def step_gates_and_values(hf_model: Any, path: str, batch: dict[str, torch.Tensor]) -> None:
    import comppo_core as cc
    from comppo_core import rl

    register_comppo_engine()
    COMPPO.update(tac={"taps": (0, 2), "width": 16, "temporal": "gru"}, gate_params=cc.GateParams(low=0.2))
    for normalize in ("causal", "sequence"):
        causal = False
        COMPPO["gate_params"] = cc.GateParams(low=0.2, normalize=normalize)
        engine = new_engine(path, model_type="comppo_language_model")
        tac_full = {
            k: (v.full_tensor() if hasattr(v, "full_tensor") else v)
            for k, v in engine.module.comppo_tac.state_dict().items()
        }
        td = as_no_padding(
            batch,
            use_remove_padding=True,
            use_dynamic_bsz=False,
            micro_batch_size_per_gpu=2,
            use_fused_kernels=False,
            calculate_entropy=False,
            compute_loss=False,
            temperature=TAU,
            comppo_probe=True,
        )
        with engine.eval_mode():
            out = engine.infer_batch(td, loss_function=None)["model_output"]
        ids, cu = packed_from(td)
        resp = response_columns(batch, cu)
        plain_tac = rl.TransportAlignedCritic.for_model(hf_model, taps=(0, 2), width=16, temporal="gru")
        plain_tac.load_state_dict(tac_full)
        ours = rl.forward(
            hf_model,
            ids,
            None,
            cu_seqlens=cu,
            response_mask=resp,
            temperature=TAU,
            critic=plain_tac,
            gate_params=COMPPO["gate_params"],
            causal=causal,
        )
        padded = rl.forward(
            hf_model,
            batch["input_ids"],
            batch["attention_mask"],
            temperature=TAU,
            critic=plain_tac,
            gate_params=COMPPO["gate_params"],
            causal=causal,
            response_mask=torch.cat([torch.zeros_like(batch["prompts"][:, 1:]), batch["response_mask"]], 1) != 0,
        )
        cols = ours.response_mask
        mode = f"GateParams(normalize={normalize!r})"
        for name, got, want, pad in (
            ("log-probs", verl_columns(out["log_probs"], cu), ours.logprobs, padded.logprobs),
            ("concentration", verl_columns(out["concentration"], cu), ours.concentration, padded.concentration),
            ("gates", verl_columns(out["comp_gates"], cu), ours.gates, padded.gates),
            ("TAC values", verl_columns(out["values"], cu), ours.values, padded.values),
        ):
            print(
                f"[2] {mode}: engine {name} vs rl.forward packed {max_diff(got, want, cols):.2e}, "
                f"vs rl.forward padded {max_diff(got, padded_to_packed(pad, batch['attention_mask']), cols):.2e} "
                f"({int(cols.sum())} response columns; gates < 1: {int((ours.gates[cols] < 0.999).sum())})"
            )


def comppo_loss(model_output: Any, data: Any, dp_group: Any = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """A test loss in verl's ``loss_function`` convention: ``Σ_resp [−A·logπ + ½(V − R)²] / n_resp``
    (``n_resp``: the global batch's response tokens, verl's ``batch_num_tokens``), with A and R fixed
    per token (``advantages``, ``returns`` in the batch, ``[B, R]``)."""
    from verl.utils import tensordict_utils as tu

    ids = data["input_ids"]
    cu = ids.offsets().to(torch.long)
    resp = response_columns({k: data[k] for k in ("prompts", "attention_mask", "response_mask")}, cu)
    lp = model_output["log_probs"].values()[:-1].unsqueeze(0)
    v = model_output["values"].values()[:-1].unsqueeze(0)
    adv = per_column(data["advantages"], data, cu)
    ret = per_column(data["returns"], data, cu)
    n = tu.get_non_tensor_data(data=data, key="batch_num_tokens", default=None)
    loss = ((-adv * lp + 0.5 * (v - ret) ** 2) * resp).sum() / n
    return loss, {}


def per_column(x: torch.Tensor, data: Any, cu: torch.Tensor) -> torch.Tensor:
    """A ``[B, R]`` per-response-token tensor in the packed ``[1, N−1]`` column layout (0 elsewhere)."""
    p = data["prompts"].shape[1]
    prompt_lens = data["attention_mask"][:, :p].sum(1)
    out = torch.zeros(1, int(cu[-1]) - 1, dtype=torch.float32)
    for i in range(x.shape[0]):
        k = torch.nonzero(data["response_mask"][i]).flatten()
        out[0, int(cu[i]) + int(prompt_lens[i]) - 1 + k] = x[i, k].float()
    return out


def step_update(hf_model: Any, path: str, batch: dict[str, torch.Tensor]) -> None:
    """One ``train_batch`` of the CompPO engine (actor + its TAC submodule) against the same update by hand."""
    import copy

    import comppo_core as cc
    from comppo_core import rl

    register_comppo_engine()
    COMPPO.update(tac={"taps": (0, 2), "width": 16, "temporal": "gru"}, gate_params=cc.GateParams(low=0.2))
    engine = new_engine(path, model_type="comppo_language_model")
    names = [n for n, _ in engine.module.named_parameters()]
    tac_names = [n for n in names if n.startswith("comppo_tac.")]
    print(
        f"[3] the actor's module has {len(names)} parameters, {len(tac_names)} of them the TAC's "
        f"(types: {sorted({type(p).__name__ for p in engine.module.parameters()})}); "
        f"optimiser holds {sum(len(g['params']) for g in engine.optimizer.param_groups)}"
    )
    state = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
        for k, v in engine.module.state_dict().items()
    }
    print(
        f"[3] module.state_dict() (the checkpoint's model part) has the TAC: "
        f"{sum(k.startswith('comppo_tac.') for k in state)} keys"
    )
    synced, _ = engine.get_per_tensor_param()
    synced_names = [name for name, _ in synced]
    print(
        f"[3] get_per_tensor_param (what the rollout's weight sync sends): {len(synced_names)} tensors, "
        f"{sum(n.startswith('comppo_tac.') for n in synced_names)} of them the TAC's (the recipe must filter them)"
    )
    g = torch.Generator().manual_seed(9)
    b, r = batch["responses"].shape
    extra = {"advantages": torch.randn(b, r, generator=g), "returns": torch.randn(b, r, generator=g)}
    td = as_no_padding(
        {**batch, **extra},
        use_remove_padding=True,
        use_dynamic_bsz=False,
        micro_batch_size_per_gpu=2,
        use_fused_kernels=False,
        calculate_entropy=False,
        temperature=TAU,
        comppo_probe=True,
    )
    # by hand: the same weights, rl.forward on the packed row (grad), the same loss, torch's AdamW
    actor = copy.deepcopy(hf_model).train()
    tac = rl.TransportAlignedCritic.for_model(actor, taps=(0, 2), width=16, temporal="gru")
    tac.load_state_dict({k[len("comppo_tac.") :]: v for k, v in state.items() if k.startswith("comppo_tac.")})
    ids, cu = packed_from(td)
    resp = response_columns(batch, cu)
    out = rl.forward(
        actor,
        ids,
        None,
        cu_seqlens=cu,
        response_mask=resp,
        temperature=TAU,
        critic=tac,
        grad=True,
        gate_params=COMPPO["gate_params"],
    )
    adv, ret = per_column(extra["advantages"], batch, cu), per_column(extra["returns"], batch, cu)
    loss = ((-adv * out.logprobs + 0.5 * (out.values - ret) ** 2) * resp).sum() / resp.sum()
    loss.backward()
    opt_cfg = engine.optimizer.defaults
    params = dict(actor.named_parameters()) | {"comppo_tac." + k: v for k, v in tac.named_parameters()}
    hand = torch.optim.AdamW(
        [params[n] for n in names],
        lr=opt_cfg["lr"],
        betas=opt_cfg["betas"],
        eps=opt_cfg["eps"],
        weight_decay=opt_cfg["weight_decay"],
    )
    # the engine: forward_backward_batch (grads), then optimizer_step
    with engine.train_mode():
        engine.optimizer_zero_grad()
        engine.forward_backward_batch(td, comppo_loss, forward_only=False)
        grads = {n: p.grad.full_tensor() for n, p in engine.module.named_parameters() if p.grad is not None}
        engine.optimizer_step()
    hand.step()
    gd = {
        n: float((grads[n] - params[n].grad).abs().max() / max(1.0, float(params[n].grad.abs().max()))) for n in names
    }
    after = {n: p.full_tensor().detach().clone() for n, p in engine.module.named_parameters()}
    pd = {n: float((after[n] - params[n].detach()).abs().max()) for n in names}
    worst_tac = max(tac_names, key=lambda n: gd[n])
    worst_actor = max((n for n in names if n not in tac_names), key=lambda n: gd[n])
    print(
        f"[3] gradients, engine vs by hand (relative to max(1, |grad|)): actor {gd[worst_actor]:.2e} "
        f"({worst_actor}), TAC {gd[worst_tac]:.2e} ({worst_tac}); "
        f"{sum(n in grads for n in tac_names)}/{len(tac_names)} TAC parameters got gradients"
    )
    moved = max(float((after[n] - state[n]).abs().max()) for n in names)
    print(
        f"[3] parameters after one AdamW step, engine vs by hand: max |diff| {max(pd.values()):.2e} "
        f"(the step moved them by up to {moved:.2e})"
    )


def rl_padded_log_probs(hf_model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    from comppo_core import rl

    out = rl.forward(hf_model, batch["input_ids"], batch["attention_mask"], temperature=TAU, routing=False)
    return padded_to_packed(out.logprobs, batch["attention_mask"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="1234", help="which steps to run (digits)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny-llama")
        hf_model = tiny_llama(path)
        batch = rollout()
        engine = new_engine(path)
        print(f"engine: {type(engine).__name__}, module {type(engine.module).__name__}")
        if "1" in args.steps:
            step_log_probs(hf_model, engine, batch)
            lp = rl_padded_log_probs(hf_model, batch)
            out, td = infer(engine, batch, True)
            ids, cu = packed_from(td)
            cols = response_columns(batch, cu)
            got = verl_columns(out["model_output"]["log_probs"], cu)
            print(f"[1] infer_batch log-probs (packed) vs rl.forward padded batch: {max_diff(got, lp, cols):.2e}")
        if "2" in args.steps:
            step_gates_and_values(hf_model, path, batch)
        if "3" in args.steps:
            step_update(hf_model, path, batch)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
