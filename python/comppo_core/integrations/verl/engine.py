"""CompPO inside verl's FSDP actor engine: the gates and the TAC's values from the actor's own forward.

:func:`register_engine` registers ``CompPOEngine``, a subclass of verl 0.9.1's
``FSDPEngineWithLMHead``, as ``model_type="comppo_language_model"`` (backends ``fsdp`` and
``fsdp2``). verl is imported only when it is called, so ``import
comppo_core.integrations.verl`` works without verl. What the subclass changes:

* ``_build_module``: with a TAC configured (:class:`EngineSettings.tac`), the actor gets a
  ``comppo_tac`` submodule (:meth:`comppo_core.rl.TransportAlignedCritic.for_model`) before
  FSDP wraps it, as its own FSDP2 unit (``TransportAlignedCritic`` joins
  ``_no_split_modules``): sharded with the actor, in its optimiser and its state dict.
* ``forward_step``: when the micro-batch's non-tensor data has ``comppo_probe=True``, the
  module's forward runs inside a :class:`~comppo_core.hf.ConcentrationProbe` (every layer's
  statistic) and a :class:`~comppo_core.rl.critics.taps.TapRecorder` (the TAC's taps).
* ``prepare_model_outputs``: then adds three per-token nested outputs (verl's layout, entry
  t scores token t+1; :mod:`~comppo_core.integrations.verl.layout`) to the log-probs::

      concentration  the probe's statistic, 0 at each sequence's boundary entry
      comp_gates     Comp-GAE's gates on the response columns, 1 elsewhere
      values         the TAC's values (only with a TAC), 0 at the boundary

  computed on the packed row exactly as :func:`comppo_core.rl.forward` with ``cu_seqlens``
  computes them (one row per sequence: :func:`~comppo_core.hf.lm.unpack_columns`), so they
  equal ``rl.forward``'s on the same rows. verl's ``postprocess_batch_func`` concatenates
  every output key over the micro-batches, so they come back from ``infer_batch`` (the
  old-log-prob pass) next to ``log_probs``.
* ``get_per_tensor_param`` and ``get_per_tensor_param_shard`` (the rollout's weight sync)
  leave out the ``comppo_tac.`` parameters: the inference engine knows only the LM.

Needs verl's packed layout (``use_remove_padding=True``, the default). Gates are computed
per micro-batch, so ``GateParams(normalize="batch")`` (a z-score over the whole batch) is
refused unless ``causal=True`` (per sequence).

The settings are per process (:func:`configure_engine`, read when an engine is built):
the worker that builds the actor's engine sets them from its config first.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import ParameterError
from ...gate_params import GateParams

__all__ = ["MODEL_TYPE", "TAC_PREFIX", "EngineSettings", "configure_engine", "engine_settings", "register_engine"]

#: the ``model_type`` the CompPO engine is registered under in verl's ``EngineRegistry``
MODEL_TYPE = "comppo_language_model"
#: the state-dict prefix of the TAC inside the actor's module
TAC_PREFIX = "comppo_tac."


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
    """

    tac: Mapping[str, Any] | None = None
    gate_params: GateParams = field(default_factory=GateParams)
    causal: bool = False
    statistic: str = "entropy"
    layers: Any = None

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


_settings = EngineSettings()
_lock = threading.Lock()


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


def _full(t: Any) -> Any:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


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

    from ... import gating
    from ...hf.lm import pack_columns, packed_position_ids, unpack_columns
    from ...hf.probe import ConcentrationProbe
    from ...rl.critics.inputs import packed_critic_inputs
    from ...rl.critics.tac import TransportAlignedCritic, causal_gates
    from ...rl.critics.taps import TapRecorder
    from .layout import response_columns, to_nested_columns

    class CompPOEngine(FSDPEngineWithLMHead):  # type: ignore[misc]
        """verl's FSDP actor engine that also returns CompPO's gates and the TAC's values
        (:mod:`comppo_core.integrations.verl.engine`)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.comppo_settings = engine_settings()
            self._comppo_pass: tuple[Any, Any] | None = None
            super().__init__(*args, **kwargs)

        def _build_module(self) -> Any:
            module = super()._build_module()
            tac = self.comppo_settings.tac
            if tac is not None:
                # a submodule before FSDP wraps it, its own FSDP2 unit (apply_fsdp2 wraps the classes in
                # _no_split_modules): called after the actor's forward, it unshards itself; as a part of the
                # root unit its parameters would already be resharded DTensors by then
                module.comppo_tac = TransportAlignedCritic.for_model(module, **dict(tac))
                module._no_split_modules = [*(module._no_split_modules or []), "TransportAlignedCritic"]
            return module

        def forward_step(self, micro_batch: Any, loss_function: Any, forward_only: bool) -> Any:
            if not tu.get_non_tensor_data(data=micro_batch, key="comppo_probe", default=False):
                return super().forward_step(micro_batch, loss_function, forward_only)
            if not tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True):
                raise ParameterError(
                    "use_remove_padding: the CompPO engine computes gates and values on verl's packed rows; "
                    "expected True (actor_rollout_ref.model.use_remove_padding=True), got False",
                    argument="use_remove_padding",
                )
            settings = self.comppo_settings
            tac = getattr(self.module, "comppo_tac", None)
            taps = tuple(tac.taps) if tac is not None else ()
            probe = ConcentrationProbe(
                self.module, settings.statistic, settings.layers, per_layer=True, record_with_grad=True
            )
            recorder = TapRecorder(self.module, taps)
            with probe, recorder if taps else contextlib.nullcontext():
                self._comppo_pass = (probe, recorder)
                try:
                    return super().forward_step(micro_batch, loss_function, forward_only)
                finally:
                    self._comppo_pass = None

        def prepare_model_outputs(
            self, output: Any, output_args: Any, micro_batch: Any, logits_processor_func: Any
        ) -> Any:
            out = super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
            if self._comppo_pass is None:
                return out
            probe, recorder = self._comppo_pass
            out.update(self._comppo_outputs(probe, recorder, micro_batch))
            return out

        def _comppo_outputs(self, probe: Any, recorder: Any, micro_batch: Any) -> dict[str, Any]:
            """rl.forward's packed path (policy_forward.py) on what the engine's forward recorded."""
            settings, params = self.comppo_settings, self.comppo_settings.gate_params
            nested_ids = micro_batch["input_ids"]
            ids = nested_ids.values().unsqueeze(0)
            cu = nested_ids.offsets().to(torch.long)
            columns = (packed_position_ids(cu)[:, 1:] != 0).to(ids.device)
            conc = torch.where(columns, probe.concentration[:, :-1].float(), 0.0)
            per = probe.per_layer[:, :-1].float().masked_fill(~columns.unsqueeze(-1), 0.0)
            attention_mask = micro_batch.get("attention_mask", None)
            resp = response_columns(cu, micro_batch["response_mask"], attention_mask).to(ids.device) & columns
            conc_rows, resp_rows = unpack_columns(conc, cu, "concentration"), unpack_columns(resp, cu, "response_mask")
            if settings.causal:
                rows = causal_gates(conc_rows, resp_rows, params)
            else:
                rows = torch.as_tensor(
                    gating.gates_from_concentration(conc_rows, mask=resp_rows, params=params), dtype=torch.float32
                )
            gates = torch.where(resp, pack_columns(rows.to(ids.device).float(), cu, "gates"), 1.0)
            result = {
                "concentration": to_nested_columns(conc, cu),
                "comp_gates": to_nested_columns(gates, cu, fill=1.0),
            }
            tac = getattr(self.module, "comppo_tac", None)
            if tac is not None:
                inputs = packed_critic_inputs(
                    ids,
                    cu,
                    taps=dict(recorder.hidden),
                    per_layer=per,
                    concentration=conc,
                    response_mask=resp,
                    gate_params=params,
                )
                values = pack_columns(tac(inputs).float(), cu, "values")
                result["values"] = to_nested_columns(values, cu)
            return result

        def get_per_tensor_param(self, *args: Any, **kwargs: Any) -> Any:
            params, peft_config = super().get_per_tensor_param(*args, **kwargs)
            return _without_tac(params), peft_config

        def get_per_tensor_param_shard(self, *args: Any, **kwargs: Any) -> Any:
            params, extra = super().get_per_tensor_param_shard(*args, **kwargs)
            return _without_tac(params), extra

    CompPOEngine.__module__ = __name__
    CompPOEngine.__qualname__ = "CompPOEngine"
    return CompPOEngine


def _without_tac(params: Any) -> Iterator[Any]:
    """The weight-sync stream (``(name, tensor, ...)`` items) without the TAC's parameters."""
    items = params.items() if isinstance(params, Mapping) else params
    return (item for item in items if not str(item[0]).startswith(TAC_PREFIX))
