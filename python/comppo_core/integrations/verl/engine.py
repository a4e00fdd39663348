"""CompPO inside verl's FSDP actor engine: the gates and the TAC's values from the actor's own forward.

:func:`register_engine` registers ``CompPOEngine``, a subclass of verl 0.9.1's
``FSDPEngineWithLMHead``, as ``model_type="comppo_language_model"`` (backends ``fsdp`` and
``fsdp2``). verl is imported only when it is called, so ``import
comppo_core.integrations.verl`` works without verl. What the subclass changes:

* ``_build_module``: with a TAC configured (:class:`EngineSettings.tac`), the actor gets a
  ``comppo_tac`` submodule (:meth:`comppo_core.rl.TransportAlignedCritic.for_model`, seeded
  with ``EngineSettings.tac_seed``) before FSDP wraps it: sharded with the actor, in its
  optimiser and its state dict (so in verl's checkpoints), initialised on every rank from
  rank 0's copy (verl broadcasts the full state dict). FSDP2 only (``strategy="fsdp2"``).
* ``_build_fsdp_module``: the TAC is its own FSDP2 unit with a float32
  ``MixedPrecisionPolicy`` (the actor's units keep verl's ``mixed_precision``, bf16 by
  default): it unshards on its own call, after the actor's forward, and computes in float32.
* ``_build_optimizer``: with ``EngineSettings.critic_lr``, the TAC's parameters are a
  second param group of the actor's optimiser with that learning rate (verl's schedulers
  scale every group's rate by the same factor); otherwise one group, the actor's rate.
* ``forward_step``: when the micro-batch's non-tensor data has ``comppo_probe=True``, the
  module's forward runs inside a :class:`~comppo_core.hf.ConcentrationProbe` (every layer's
  statistic) and a :class:`~comppo_core.rl.critics.taps.TapRecorder` (the TAC's taps).
* ``prepare_model_outputs``: then adds three per-token nested outputs (verl's layout, entry
  t scores token t+1; :mod:`~comppo_core.integrations.verl.layout`) to the log-probs::

      concentration  the probe's statistic, 0 at each sequence's boundary entry
      comp_gates     Comp-GAE's gates on the response columns, 1 elsewhere
      values         the TAC's values (only with a TAC), 0 at the boundary

  computed on the packed row by the code :func:`comppo_core.rl.forward` with ``cu_seqlens``
  runs after its actor forward
  (:func:`~comppo_core.rl.core.policy_forward.forward_from_recorded`, one row per
  sequence), so they equal ``rl.forward``'s on the same rows. They are computed with
  autocast off, the TAC's taps cast to float32: under verl's bf16 autocast the values are
  the float32 TAC applied to the float32-cast taps. verl's ``postprocess_batch_func``
  concatenates every output key over the micro-batches, so they come back from
  ``infer_batch`` (the old-log-prob pass) next to ``log_probs``.
* ``get_per_tensor_param`` and ``get_per_tensor_param_shard`` (the rollout's weight sync)
  leave out the ``comppo_tac.`` parameters: the inference engine knows only the LM.
* ``save_checkpoint``: verl's checkpoint (``model``/``optimizer``/``extra``) holds the TAC
  with the actor; the Hugging Face export (``checkpoint.save_contents`` with ``hf_model``)
  leaves the ``comppo_tac.`` keys out of the HF model and writes the TAC next to it,
  ``huggingface/comppo_tac.safetensors`` (its ``for_model`` keyword arguments in the
  metadata; :func:`load_hf_tac` rebuilds it).

Needs verl's packed layout (``use_remove_padding=True``, the default). The engine is built
with ``model_type`` ``"language_model"`` or :data:`MODEL_TYPE` (what verl's
``TrainingWorker`` writes into the model config). Gates are computed per micro-batch, so
``GateParams(normalize="batch")`` (a z-score over the whole batch) is refused unless
``causal=True`` (per sequence). A TAC needs ``strategy="fsdp2"`` and no LoRA.

The settings are per process (:func:`configure_engine`, read when an engine is built):
the worker that builds the actor's engine sets them from its config first.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from ...errors import ParameterError
from ...gate_params import GateParams

__all__ = [
    "MODEL_TYPE",
    "TAC_FILE",
    "TAC_PREFIX",
    "EngineSettings",
    "configure_engine",
    "engine_settings",
    "load_hf_tac",
    "register_engine",
]

#: the ``model_type`` the CompPO engine is registered under in verl's ``EngineRegistry``
MODEL_TYPE = "comppo_language_model"
#: the state-dict prefix of the TAC inside the actor's module
TAC_PREFIX = "comppo_tac."
#: the TAC's file next to the Hugging Face export of a checkpoint (``<checkpoint>/huggingface/``)
TAC_FILE = "comppo_tac.safetensors"


@dataclass(frozen=True)
class EngineSettings:
    """What the CompPO engine computes.

    Attributes:
      tac: keyword arguments of :meth:`comppo_core.rl.TransportAlignedCritic.for_model`
        (``taps``, ``width``, ``temporal``, ...), or None (no TAC: no ``values``).
      gate_params: the concentration → gate mapping of Comp-GAE's gates.
      causal: Comp-GAE's gates with each sequence's running z-score
        (:func:`~comppo_core.rl.critics.tac.causal_gates`), as ``rl.forward(causal=True)``.
      statistic, layers: the probe's (as :func:`comppo_core.rl.forward`).
      critic_lr: the TAC's learning rate, a second param group of the actor's optimiser;
        None: the TAC shares the actor's group (and rate).
      tac_seed: the seed of the TAC's initialisation (rank 0's; the others receive it), or
        None (the process's random state at engine construction).
    """

    tac: Mapping[str, Any] | None = None
    gate_params: GateParams = field(default_factory=GateParams)
    causal: bool = False
    statistic: str = "entropy"
    layers: Any = None
    critic_lr: float | None = None
    tac_seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.gate_params, GateParams):
            raise ParameterError(
                f"gate_params: expected a comppo_core.GateParams, got {type(self.gate_params).__name__}",
                argument="gate_params",
            )
        if self.gate_params.normalize == "batch" and not self.causal:
            raise ParameterError(
                "gate_params: normalize='batch' z-scores the whole batch, but the engine computes gates per "
                "micro-batch; use 'causal' or 'sequence', or causal=True (per sequence)",
                argument="gate_params",
            )
        if self.tac is not None and not isinstance(self.tac, Mapping):
            raise ParameterError(
                f"tac: expected the keyword arguments of TransportAlignedCritic.for_model (a mapping) or None, "
                f"got {type(self.tac).__name__}",
                argument="tac",
            )
        if self.critic_lr is not None:
            lr = self.critic_lr
            if isinstance(lr, bool) or not isinstance(lr, Real) or not (math.isfinite(lr) and lr > 0):
                raise ParameterError(
                    f"critic_lr: expected a positive finite number or None, got {lr!r}", argument="critic_lr"
                )
            if self.tac is None:
                raise ParameterError(
                    "critic_lr: the TAC's learning rate needs a TAC (tac=...); got tac=None", argument="critic_lr"
                )
        if self.tac_seed is not None and (isinstance(self.tac_seed, bool) or not isinstance(self.tac_seed, int)):
            raise ParameterError(f"tac_seed: expected an integer or None, got {self.tac_seed!r}", argument="tac_seed")


_settings = EngineSettings()
_lock = threading.Lock()
#: held while a verl module attribute is swapped for the length of one call (_tac_sharded_first, _hf_state_without_tac)
_patch_lock = threading.Lock()


def configure_engine(settings: EngineSettings) -> None:
    """Sets what the CompPO engines built from now on in this process compute."""
    global _settings
    if not isinstance(settings, EngineSettings):
        raise ParameterError(
            f"settings: expected an EngineSettings, got {type(settings).__name__}", argument="settings"
        )
    _settings = settings


def engine_settings() -> EngineSettings:
    """The settings the next CompPO engine built in this process will use."""
    return _settings


def register_engine() -> type:
    """Registers ``CompPOEngine`` in verl's ``EngineRegistry`` (once per process) and returns it.

    Raises:
      ImportError: verl is not installed.
    """
    with _lock:
        from verl.workers.engine import EngineRegistry  # type: ignore[import-not-found]

        registered = EngineRegistry._engines.get(MODEL_TYPE, {}).get("fsdp2", {}).get("cuda")
        if registered is not None:
            return registered  # type: ignore[no-any-return]
        cls = _engine_class()
        EngineRegistry.register(model_type=MODEL_TYPE, backend=["fsdp", "fsdp2"], device=["cuda", "npu"])(cls)
        return cls


def _engine_class() -> type:
    import torch
    from verl.utils import tensordict_utils as tu  # type: ignore[import-not-found]
    from verl.workers.engine.fsdp.transformer_impl import (  # type: ignore[import-not-found]
        FSDPEngineWithLMHead,
    )

    from ...hf.lm import packed_position_ids
    from ...hf.probe import ConcentrationProbe
    from ...rl.core.policy_forward import forward_from_recorded
    from ...rl.critics.tac import TransportAlignedCritic
    from ...rl.critics.taps import TapRecorder
    from .layout import response_columns, to_nested_columns

    class CompPOEngine(FSDPEngineWithLMHead):  # type: ignore[misc]
        """verl's FSDP actor engine that also returns CompPO's gates and the TAC's values
        (:mod:`comppo_core.integrations.verl.engine`)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.comppo_settings = engine_settings()
            self._comppo_pass: tuple[Any, Any] | None = None
            self._comppo_held: tuple[Any, Any] | None = None  # an update's probe, held through its backward
            super().__init__(*args, **kwargs)

        def _build_module(self) -> Any:
            # verl's TrainingWorker writes the registry's model_type into the model config, and verl's
            # _build_module builds a language model only for "language_model"
            model_type = self.model_config.model_type
            if model_type == MODEL_TYPE:
                self.model_config.model_type = "language_model"
            try:
                module = super()._build_module()
            finally:
                self.model_config.model_type = model_type
            settings = self.comppo_settings
            if settings.tac is not None:
                if self.engine_config.strategy != "fsdp2":
                    raise ParameterError(
                        "strategy: the CompPO engine's TAC is its own float32 FSDP2 unit; expected 'fsdp2' "
                        f"(actor_rollout_ref.actor.strategy=fsdp2), got {self.engine_config.strategy!r}",
                        argument="strategy",
                    )
                if self.model_config.lora_rank > 0:
                    raise ParameterError(
                        "lora_rank: LoRA would freeze the TAC and rename its weights; expected 0 with a TAC, got "
                        f"{self.model_config.lora_rank}",
                        argument="lora_rank",
                    )
                # rank 0's TAC is every rank's: verl loads rank 0's full state dict into the sharded module
                with torch.random.fork_rng(devices=[]):
                    if settings.tac_seed is not None:
                        torch.manual_seed(settings.tac_seed)
                    module.comppo_tac = TransportAlignedCritic.for_model(module, **dict(settings.tac))
            return module

        def _build_fsdp_module(self, module: Any) -> Any:
            tac = getattr(module, "comppo_tac", None)
            if tac is None:
                return super()._build_fsdp_module(module)
            with _tac_sharded_first(tac):
                return super()._build_fsdp_module(module)

        def _build_optimizer(self, module: Any) -> Any:
            tac = getattr(module, "comppo_tac", None)
            critic_lr = self.comppo_settings.critic_lr
            if tac is None or critic_lr is None:
                return super()._build_optimizer(module)
            from verl.workers.config.optimizer import build_optimizer  # type: ignore[import-not-found]

            critic = {id(p) for p in tac.parameters()}
            groups = [
                {"params": [p for p in module.parameters() if id(p) not in critic]},
                {"params": [p for p in module.parameters() if id(p) in critic], "lr": critic_lr},
            ]
            return build_optimizer(groups, self.optimizer_config)

        def forward_backward_batch(self, data: Any, loss_function: Any, forward_only: bool = False) -> Any:
            if forward_only or not tu.get_non_tensor_data(data=data, key="comppo_probe", default=False):
                return super().forward_backward_batch(data, loss_function, forward_only)
            # An update: verl runs each micro-batch's backward after forward_step returns. The
            # probe (its attention function) stays installed until the last backward, so that a
            # checkpointed layer recomputes its attention as its forward ran it: through the probe
            # (not recorded), not through the model's own attention (flash_attention_2 on GPUs,
            # which saves other tensors: CheckpointError, or other numbers).
            self._check_probed_pass(data)
            probe, recorder, recording = self._new_probe()
            with probe, recording:
                self._comppo_held = (probe, recorder)
                try:
                    return super().forward_backward_batch(data, loss_function, forward_only)
                finally:
                    self._comppo_held = None

        def forward_step(self, micro_batch: Any, loss_function: Any, forward_only: bool) -> Any:
            if not tu.get_non_tensor_data(data=micro_batch, key="comppo_probe", default=False):
                return super().forward_step(micro_batch, loss_function, forward_only)
            self._check_probed_pass(micro_batch)
            if self._comppo_held is not None:  # an update: installed for the whole batch
                self._comppo_pass = self._comppo_held
                try:
                    return super().forward_step(micro_batch, loss_function, forward_only)
                finally:
                    self._comppo_pass = None
            probe, recorder, recording = self._new_probe()
            with probe, recording:
                self._comppo_pass = (probe, recorder)
                try:
                    return super().forward_step(micro_batch, loss_function, forward_only)
                finally:
                    self._comppo_pass = None

        def _new_probe(self) -> tuple[Any, Any, Any]:
            """The probe (every layer's statistic), the TAC's tap recorder and the context that records
            (the recorder; without a TAC, nothing: it records no layer)."""
            settings = self.comppo_settings
            tac = getattr(self.module, "comppo_tac", None)
            taps = tuple(tac.taps) if tac is not None else ()
            probe = ConcentrationProbe(
                self.module, settings.statistic, settings.layers, per_layer=True, record_with_grad=True
            )
            recorder = TapRecorder(self.module, taps)
            return probe, recorder, recorder if taps else contextlib.nullcontext()

        def _check_probed_pass(self, data: Any) -> None:
            """What a probed pass cannot run under: padded rows, sequence parallelism (the probe
            would see a slice of each sequence, and verl's Ulysses attention patch is not the
            probe's), rows padded to a fixed length (the outputs' columns would not be the
            sequences')."""
            if not tu.get_non_tensor_data(data=data, key="use_remove_padding", default=True):
                raise ParameterError(
                    "use_remove_padding: the CompPO engine computes gates and values on verl's packed rows; "
                    "expected True (actor_rollout_ref.model.use_remove_padding=True), got False",
                    argument="use_remove_padding",
                )
            if self.ulysses_sequence_parallel_size > 1:
                raise ParameterError(
                    "ulysses_sequence_parallel_size: the CompPO engine's probe needs each sequence whole on one "
                    "rank; expected 1 (actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=1), got "
                    f"{self.ulysses_sequence_parallel_size}",
                    argument="ulysses_sequence_parallel_size",
                )
            if self.pad_to_length:
                raise ParameterError(
                    "pad_to_length: the CompPO engine computes gates and values on verl's packed rows as they "
                    "are; expected False (actor_rollout_ref.actor.fsdp_config.pad_to_length=False), got True",
                    argument="pad_to_length",
                )

        def prepare_model_outputs(
            self, output: Any, output_args: Any, micro_batch: Any, logits_processor_func: Any
        ) -> Any:
            out = super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
            if self._comppo_pass is None:
                return out
            probe, recorder = self._comppo_pass
            device_type = micro_batch["input_ids"].values().device.type
            # float32, whatever verl's autocast (bf16 by default): as rl.step.score's float32 values
            with torch.autocast(device_type=device_type, enabled=False):
                out.update(self._comppo_outputs(probe, recorder, micro_batch))
            return out

        def _comppo_outputs(self, probe: Any, recorder: Any, micro_batch: Any) -> dict[str, Any]:
            """rl.forward's packed path on what the engine's forward recorded (``forward_from_recorded``)."""
            settings = self.comppo_settings
            nested_ids = micro_batch["input_ids"]
            ids = nested_ids.values().unsqueeze(0)
            cu = nested_ids.offsets().to(torch.long)
            columns = (packed_position_ids(cu)[:, 1:] != 0).to(ids.device)
            # the probe's statistics at the scored columns, as hf.score returns them
            conc = torch.where(columns, probe.concentration[:, :-1].float(), 0.0)
            per = probe.per_layer[:, :-1].float().masked_fill(~columns.unsqueeze(-1), 0.0)
            attention_mask = micro_batch.get("attention_mask", None)
            resp = response_columns(cu, micro_batch["response_mask"], attention_mask).to(ids.device) & columns
            tac = getattr(self.module, "comppo_tac", None)
            recorded = forward_from_recorded(
                ids,
                conc,
                per,
                resp,
                cu_seqlens=cu,
                taps={layer: h.float() for layer, h in recorder.hidden.items()},
                critic=tac,
                gate_params=settings.gate_params,
                causal=settings.causal,
                gate_statistic=conc,
                critic_grad=torch.is_grad_enabled(),
            )
            assert recorded.gates is not None
            result = {
                "concentration": to_nested_columns(conc, cu),
                "comp_gates": to_nested_columns(recorded.gates, cu, fill=1.0),
            }
            if recorded.values is not None:
                result["values"] = to_nested_columns(recorded.values.float(), cu)
            return result

        def get_per_tensor_param(self, *args: Any, **kwargs: Any) -> Any:
            params, peft_config = super().get_per_tensor_param(*args, **kwargs)
            return _without_tac(params), peft_config

        def get_per_tensor_param_shard(self, *args: Any, **kwargs: Any) -> Any:
            params, extra = super().get_per_tensor_param_shard(*args, **kwargs)
            return _without_tac(params), extra

        def save_checkpoint(
            self,
            local_path: str,
            hdfs_path: str | None = None,
            global_step: int = 0,
            max_ckpt_to_keep: int | None = None,
            **kwargs: Any,
        ) -> None:
            tac = getattr(self.module, "comppo_tac", None)
            if tac is None or local_path is None or not self.checkpoint_manager.should_save_hf_model:
                return super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep, **kwargs)
            captured: dict[str, Any] = {}
            with _hf_state_without_tac(self.module, captured):
                super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep, **kwargs)
            if captured:  # rank 0 (verl gathers the full state dict there)
                _save_tac(
                    os.path.join(local_path, "huggingface", TAC_FILE), captured, dict(self.comppo_settings.tac or {})
                )
            torch.distributed.barrier()
            return None

    CompPOEngine.__module__ = __name__
    CompPOEngine.__qualname__ = "CompPOEngine"
    return CompPOEngine


@contextlib.contextmanager
def _tac_sharded_first(tac: Any) -> Iterator[None]:
    """While verl's ``_build_fsdp_module`` runs: its ``apply_fsdp2`` first makes ``tac`` an FSDP2 unit
    of its own with a float32 mixed-precision policy (the same mesh, offload and resharding as the
    actor's units), then shards the actor as verl does (the root unit leaves the TAC's parameters
    to it). verl loads rank 0's full state dict afterwards, the TAC's included."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from verl.workers.engine.fsdp import transformer_impl  # type: ignore[import-not-found]

    apply_fsdp2 = transformer_impl.apply_fsdp2

    def apply_with_tac(model: Any, fsdp_kwargs: dict[str, Any], config: Any) -> Any:
        float32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=True)
        fully_shard(tac, **{**fsdp_kwargs, "mp_policy": float32})
        return apply_fsdp2(model, fsdp_kwargs, config)

    with _patch_lock:
        transformer_impl.apply_fsdp2 = apply_with_tac
        try:
            yield
        finally:
            transformer_impl.apply_fsdp2 = apply_fsdp2


@contextlib.contextmanager
def _hf_state_without_tac(module: Any, captured: dict[str, Any]) -> Iterator[None]:
    """While verl's ``FSDPCheckpointManager.save_checkpoint`` runs: the full state dict it gathers for
    the Hugging Face export (``get_fsdp_full_state_dict``) leaves out ``module``'s TAC, whose tensors
    go to ``captured`` (keys without :data:`TAC_PREFIX`; empty off rank 0)."""
    from verl.utils.checkpoint import fsdp_checkpoint_manager  # type: ignore[import-not-found]

    full_state_dict = fsdp_checkpoint_manager.get_fsdp_full_state_dict

    def without_tac(model: Any, *args: Any, **kwargs: Any) -> Any:
        state = full_state_dict(model, *args, **kwargs)
        if model is not module:
            return state
        captured.update({k[len(TAC_PREFIX) :]: v for k, v in state.items() if k.startswith(TAC_PREFIX)})
        return {k: v for k, v in state.items() if not k.startswith(TAC_PREFIX)}

    with _patch_lock:
        fsdp_checkpoint_manager.get_fsdp_full_state_dict = without_tac
        try:
            yield
        finally:
            fsdp_checkpoint_manager.get_fsdp_full_state_dict = full_state_dict


def _save_tac(path: str, state: Mapping[str, Any], tac_kwargs: Mapping[str, Any]) -> None:
    """The TAC's full state dict as safetensors at ``path`` (atomically), its ``for_model`` keyword
    arguments in the metadata."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    tmp = f"{path}.tmp-{os.getpid()}"
    save_file(tensors, tmp, metadata={"comppo_tac": json.dumps(dict(tac_kwargs), default=list)})
    os.replace(tmp, path)


def load_hf_tac(path: str, model: Any) -> Any:
    """The TAC a checkpoint's Hugging Face export carries: :data:`TAC_FILE` (or the
    ``huggingface/`` folder holding it) rebuilt for ``model`` (the exported actor, any
    :meth:`~comppo_core.rl.TransportAlignedCritic.for_model` model of the same shape).

    Raises:
      ParameterError: no TAC file there, or one without the CompPO metadata.
    """
    from safetensors import safe_open

    from ...rl.critics.tac import TransportAlignedCritic

    file = os.path.join(path, TAC_FILE) if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise ParameterError(f"path: expected {TAC_FILE} or a folder holding it, got {path!r}", argument="path")
    with safe_open(file, framework="pt") as f:
        metadata = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has keys(), no __iter__)
    if "comppo_tac" not in metadata:
        raise ParameterError(
            f"path: expected a TAC written by the CompPO engine (metadata 'comppo_tac'), got {file!r}", argument="path"
        )
    tac = TransportAlignedCritic.for_model(model, **json.loads(metadata["comppo_tac"]))
    tac.load_state_dict(state)
    return tac


def _without_tac(params: Any) -> Iterator[Any]:
    """The weight-sync stream (``(name, tensor, ...)`` items) without the TAC's parameters."""
    items = params.items() if isinstance(params, Mapping) else params
    return (item for item in items if not str(item[0]).startswith(TAC_PREFIX))
