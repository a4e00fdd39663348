"""Pull attention concentration off a Hugging Face model during a forward pass (docs/design.md §7).

How it hooks in (transformers ≥ 5): this module registers one attention function under
the name :data:`IMPLEMENTATION` with ``transformers.AttentionInterface`` **and**
transformers' own ``sdpa_mask`` under the same name with ``AttentionMaskInterface``, so
the model builds exactly the boolean masks it builds for ``"sdpa"`` (causal ∩ padding
∩ sliding window). While a :class:`ConcentrationProbe` is active, the model's attention
implementation is set to :data:`IMPLEMENTATION`; the function runs transformers'
``sdpa_attention_forward`` unchanged (so the model's outputs are those of its SDPA
path, bit for bit) and, for the selected layers and only with gradients disabled, adds
the layer's head-mean statistic (:func:`~comppo_core.hf.statistics.head_mean_concentration`)
into a ``[B, T]`` float32 accumulator. On exit, also after an exception, every config's
attention implementation is put back as it was.

Policies:

* **Gradients**: by default passes run with gradients enabled are not recorded (the
  statistic is a detached quantity of the behaviour policy; computing it on a training
  pass would cost time and memory for nothing). Reading
  :attr:`ConcentrationProbe.concentration` when no pass was recorded raises
  :class:`ProbeError`, saying how many attention calls ran with gradients enabled. With
  ``record_with_grad=True`` they are recorded too (a PPO update forward reading the
  concentration of the pass it trains on): the statistic is computed under
  ``torch.no_grad()`` from detached queries and keys, so it carries no gradient and adds
  nothing to the model's autograd graph; its transient memory adds to the pass's peak.
* **Backward passes**: attention calls made while autograd runs a backward pass (the
  recomputation of activation checkpointing) are never recorded, so a pass recorded in
  the forward is not replaced by its recomputation.
* **Per layer**: with ``per_layer=True`` the probe also keeps each selected layer's
  head-mean statistic, :attr:`ConcentrationProbe.per_layer` ``[B, T, L]`` (an O(B·T·L)
  buffer filled during the pass); the mean over layers is computed as without it.
* **Cached decoding** (``generate`` steps, where the queries are fewer than the keys) is
  not recorded either: a probe records full-sequence passes (``use_cache=False`` or a
  prefill with an empty cache).
* **Several passes**: the probe keeps the last complete pass; :attr:`passes` counts them.
* **Non-finite values**: a layer whose statistic is NaN or ±inf at a real token (NaN or
  inf activations, e.g. corrupted weights or an overflow) raises
  :class:`~comppo_core.errors.NonFiniteError` at the end of the pass, naming the layer and
  the first ``(row, position)``; the pass is not recorded. Only queries that see no key
  (``n_t = 0``, e.g. left padding) and padded queries are 0 whatever their value.
* **Shared configs**: the implementation is switched on the model's config objects. A
  model sharing one of them (e.g. a reference model built from ``policy.config``) runs
  the probe's attention function too while a probe is active; it is not recorded, and
  its outputs are its SDPA outputs.
* **Nesting**: probes may be nested on one model (for instance one per statistic); each
  records independently from the same forward pass. The first to enter saves the
  model's attention implementation, the last to exit restores it, in any exit order.
  One probe object cannot be entered twice at once.
* **Packed rows** (several sequences end to end in a row, ``position_ids`` restarting at
  each: verl's ``NO_PADDING`` layout): transformers keeps the sequences apart with a
  block-diagonal causal mask when the model is called with ``attention_mask=None`` and
  no cache (``use_cache=False``), and the probe's statistics then read that mask, so a
  query's visible keys, and ``n_t``, are its own sequence's: each sequence's
  concentration equals its own forward's. Called with an ``attention_mask`` or a cache,
  transformers lets each sequence attend to the previous ones, silently; with a probe
  active that call raises :class:`~comppo_core.errors.ParameterError` naming the
  argument (checked on the call's arguments before the forward, and on each attention
  call's mask, which also catches ``use_cache`` left to the config's default).
* The probe computes attention through SDPA whatever the model was set to (``"eager"``,
  flash, ...): outputs then equal the model's SDPA outputs, which differ from eager ones
  by kernel rounding only.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..errors import ComppoError, DTypeError, NonFiniteError, ParameterError
from ._memory import STATISTIC_RANGE
from .lm import sequence_starts
from .statistics import (
    DEFAULT_QUERY_CHUNK,
    check_method,
    check_precision,
    check_statistic,
    head_mean_concentration,
)

try:
    from transformers import PreTrainedModel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface
except ImportError as exc:  # pragma: no cover - depends on the installed transformers
    raise ImportError(
        "comppo_core.hf needs transformers >= 5 (AttentionInterface, AttentionMaskInterface, "
        f"sdpa_attention_forward): pip install 'comppo-core[hf]' ({exc})"
    ) from exc
except Exception as exc:  # pragma: no cover - transformers itself fails at import
    import importlib.util

    hint = ""
    if importlib.util.find_spec("kernels") is not None:
        hint = (
            "; a known cause: an environment downgraded from a newer transformers to 5.10 keeps the `kernels` "
            "package (0.19), which transformers 5.10's hub_kernels cannot load: pip uninstall kernels"
        )
    raise ImportError(f"comppo_core.hf: importing transformers failed ({type(exc).__name__}: {exc}){hint}") from exc

__all__ = ["IMPLEMENTATION", "ConcentrationProbe", "ProbeError", "UnsupportedModelError", "unwrap_model"]

#: The attention implementation name a probed model runs under.
IMPLEMENTATION = "comppo_probe_sdpa"


class ProbeError(ComppoError):
    """A probe used in a way that cannot give a result (nothing recorded, re-entered, ...)."""


class UnsupportedModelError(DTypeError):
    """A model the probe cannot attach to (no AttentionInterface/SDPA support, no layer index, ...)."""


# --------------------------------------------------------------------------- #
# Per-model state shared by the probes attached to it
# --------------------------------------------------------------------------- #


class _ModelState:
    """The probes active on one model and the attention implementations to restore."""

    def __init__(self, model: Any) -> None:
        self.model_ref = weakref.ref(model)
        self.saved: list[tuple[Any, Any]] = []  # (config, _attn_implementation_internal)
        self.probes: list[ConcentrationProbe] = []
        self.modules: list[weakref.ReferenceType[Any]] = []
        self.hooks: list[Any] = []
        #: whether the last call of the model gave an attention mask / a cache (for the messages)
        self.call_mask = False
        #: the position_ids of the pass checked for packed rows and the masks checked with them
        #: (weak references: a pass's layers share them, several masks when windows alternate)
        self.checked_positions: weakref.ReferenceType[torch.Tensor] | None = None
        self.checked_masks: list[weakref.ReferenceType[torch.Tensor] | None] = []

    def check_call(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Forward pre-hook on the probed model: a packed row (restarting ``position_ids``)
        called with an attention mask or a cache is a :class:`ParameterError`."""
        if not self.probes:
            return
        am = kwargs.get("attention_mask")
        self.call_mask = am is not None
        pos = kwargs.get("position_ids")
        if not isinstance(pos, torch.Tensor) or pos.dim() != 2 or pos.shape[1] < 2:
            return
        if am is not None and not (isinstance(am, torch.Tensor) and am.dim() == 2 and am.shape[-1] == pos.shape[-1]):
            return  # a prepared mask (4-D): the attention calls check what it lets each token see
        mask2 = am
        if mask2 is not None and pos.shape[0] not in (1, mask2.shape[0]):
            return
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        if am is None and cache is None and kwargs.get("use_cache") is not True:
            return  # the attention calls check the rest (use_cache left to the config)
        where = torch.nonzero(sequence_starts(pos, mask2))
        if not where.numel():
            return
        row, position = (int(i) for i in where[0])
        argument = "attention_mask" if am is not None else "use_cache"
        given = "an attention_mask" if am is not None else "a cache (use_cache=True or past_key_values)"
        raise ParameterError(
            f"{argument}: position_ids restart at (row {row}, position {position}), a packed row (several "
            f"sequences end to end), but the model was called with {given}: transformers keeps packed sequences "
            "apart (a block-diagonal mask) only with attention_mask=None and no cache, so they would attend to "
            "each other. Call the model with attention_mask=None and use_cache=False for packed rows",
            argument=argument,
            row=row,
            position=position,
        )

    def check_packed_mask(self, layer: int, mask: torch.Tensor | None, kwargs: dict[str, Any], b: int, t: int) -> None:
        """The attention call's own evidence: where ``position_ids`` restart, the first token
        of a sequence must not see the token before it (a :class:`ParameterError` if it
        does, e.g. ``use_cache`` left on, whose cache turns transformers' packed mask off).
        Checked once per mask of a pass (its layers share ``position_ids`` and masks)."""
        pos = kwargs.get("position_ids")
        if not isinstance(pos, torch.Tensor) or pos.dim() != 2 or pos.shape[1] != t or pos.shape[0] not in (1, b):
            return
        if self.checked_positions is None or self.checked_positions() is not pos:
            self.checked_positions, self.checked_masks = weakref.ref(pos), []
        elif any((ref() if ref is not None else None) is mask for ref in self.checked_masks):
            return
        valid = _query_validity(mask, b, t, pos.device)
        starts = sequence_starts(pos.to(valid.device), valid)
        if mask is None:
            where = torch.nonzero(starts)
        else:
            # the real token before each start: is it visible from the start?
            idx = torch.where(valid, torch.arange(t, device=valid.device), -1)
            prev = torch.full_like(idx, -1)
            prev[:, 1:] = idx[:, :-1].cummax(dim=1).values
            m = mask[:, 0] if mask.shape[0] == b else mask[:, 0].expand(b, t, mask.shape[-1])
            sees_prev = m.gather(2, prev.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            where = torch.nonzero(starts & sees_prev)
        if not where.numel():
            self.checked_masks.append(None if mask is None else weakref.ref(mask))
            return
        row, position = (int(i) for i in where[0])
        argument = "attention_mask" if self.call_mask else "use_cache"
        raise ParameterError(
            f"{argument}: position_ids restart at (row {row}, position {position}), a packed row, but layer "
            f"{layer}'s attention lets that token see the previous sequence: transformers builds the block-diagonal "
            "mask of packed rows only when the model is called with attention_mask=None and no cache (use_cache "
            "left on builds one). Call the model with attention_mask=None and use_cache=False for packed rows",
            argument=argument,
            row=row,
            position=position,
        )

    def observe(self, module: Any, query: torch.Tensor, key: torch.Tensor, mask: Any, kwargs: dict[str, Any]) -> None:
        """Called by the attention function after the real attention ran."""
        if not self.probes:
            return
        if _in_backward():  # activation-checkpointing recomputation: never recorded
            for p in self.probes:
                p._backward_calls += 1
            return
        recording = self.probes
        if torch.is_grad_enabled():
            recording = [p for p in self.probes if p.record_with_grad]
            for p in self.probes:
                if not p.record_with_grad:
                    p._grad_calls += 1
            if not recording:
                return
        layer = getattr(module, "layer_idx", None)
        if not isinstance(layer, int):
            raise UnsupportedModelError(
                f"model: attention module {type(module).__name__} has no integer layer_idx "
                f"(got {layer!r}); the probe needs it to know which layer it is in",
                argument="model",
            )
        wanted = [p for p in recording if layer in p._layer_set]
        if not wanted:
            return
        if kwargs.get("position_bias") is not None:
            raise UnsupportedModelError(
                f"model: {type(module).__name__} adds a position bias to its attention scores; "
                "the probe supports plain scaled-dot-product attention only",
                argument="model",
            )
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 4):
            raise UnsupportedModelError(
                f"attention_mask: the probe reads transformers' 4-D boolean SDPA masks, got "
                f"{type(mask).__name__}{'' if not isinstance(mask, torch.Tensor) else f' {mask.dtype} {tuple(mask.shape)}'}; "
                "pass a 2-D padding mask to the model, not a prepared 4-D mask",
                argument="attention_mask",
            )
        q_len = query.shape[2]
        is_causal = kwargs.get("is_causal")
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        causal = q_len > 1 and mask is None and causal
        if causal and key.shape[2] > q_len:  # as sdpa_attention_forward: crop to the queries
            key = key[:, :, :q_len]
        if key.shape[2] != q_len:  # cached decoding: not recorded
            for p in wanted:
                p._skipped_calls += 1
            return
        self.check_packed_mask(layer, mask, kwargs, query.shape[0], q_len)
        valid = _query_validity(mask, query.shape[0], q_len, query.device)
        scaling = kwargs.get("scaling")
        done: dict[tuple[str, str, int, str], torch.Tensor] = {}
        # no_grad: the statistic is detached and must add nothing to a grad-enabled pass's graph
        with torch.no_grad(), torch.profiler.record_function(STATISTIC_RANGE):
            for p in wanted:
                cfg = (p.statistic, p.method, p.query_chunk, p.precision)
                if cfg not in done:
                    done[cfg] = head_mean_concentration(
                        query.detach(),
                        key.detach(),
                        mask,
                        scale=scaling,
                        is_causal=causal,
                        statistic=p.statistic,
                        method=p.method,
                        query_chunk=p.query_chunk,
                        precision=p.precision,
                    )
                p._record(layer, done[cfg], valid)


def _in_backward() -> bool:
    """Whether autograd is running a backward pass on this thread (e.g. recomputing a
    checkpointed layer)."""
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


def _query_validity(mask: torch.Tensor | None, b: int, t: int, device: torch.device) -> torch.Tensor:
    """``[B, T]`` bool: a query is a real token iff it may attend to itself (the mask's
    diagonal is padding ∩ causal ∩ window at key = query, and the window holds the query)."""
    if mask is None:
        return torch.ones(b, t, dtype=torch.bool, device=device)
    diag = torch.diagonal(mask[:, 0], dim1=-2, dim2=-1)  # [Bm, T]
    return diag.expand(b, t)


#: attention module → the state of the probed model that contains it
_MODULE_STATE: weakref.WeakKeyDictionary[Any, _ModelState] = weakref.WeakKeyDictionary()
#: probed model → its state
_MODEL_STATE: weakref.WeakKeyDictionary[Any, _ModelState] = weakref.WeakKeyDictionary()


def _probe_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any, **kwargs: Any
) -> Any:
    """The registered attention function: SDPA, then the active probes' statistics."""
    out = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    state = _MODULE_STATE.get(module)
    if state is not None:
        state.observe(module, query, key, attention_mask, kwargs)
    return out


AttentionInterface.register(IMPLEMENTATION, _probe_attention)
AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def _configs(model: Any) -> list[Any]:
    """The model's config, its sub-configs (any depth) and every sub-model's config, once each."""
    seen: dict[int, Any] = {}
    stack = [model.config]
    stack += [m.config for m in model.modules() if isinstance(m, PreTrainedModel)]
    while stack:
        cfg = stack.pop()
        if cfg is None or id(cfg) in seen:
            continue
        seen[id(cfg)] = cfg
        for key in getattr(cfg, "sub_configs", {}) or {}:
            stack.append(getattr(cfg, key, None))
    return list(seen.values())


def _num_layers(model: Any) -> int:
    cfg = model.config
    get_text = getattr(cfg, "get_text_config", None)
    text = get_text() if callable(get_text) else cfg
    n = getattr(text, "num_hidden_layers", None)
    if not isinstance(n, int) or n < 1:
        raise UnsupportedModelError(
            f"model: expected a config with num_hidden_layers >= 1, got {n!r} on {type(cfg).__name__}",
            argument="model",
        )
    return n


def _attach(model: Any, probe: ConcentrationProbe) -> None:
    state = _MODEL_STATE.get(model)
    if state is None:
        for m in model.modules():
            other = _MODULE_STATE.get(m)
            if other is not None:
                raise ProbeError(
                    "model: a probe is already active on another model that shares its module "
                    f"{type(m).__name__}; probe the outer model only",
                    argument="model",
                )
        state = _ModelState(model)
        state.saved = [(cfg, getattr(cfg, "_attn_implementation_internal", None)) for cfg in _configs(model)]
        try:
            model.set_attn_implementation(IMPLEMENTATION)
        except (ValueError, ImportError, KeyError) as exc:
            _restore(state)
            raise UnsupportedModelError(
                f"model: {type(model).__name__} cannot run the probe's SDPA-based attention function ({exc})",
                argument="model",
            ) from exc
        except BaseException:
            _restore(state)
            raise
        if model.config._attn_implementation != IMPLEMENTATION:
            _restore(state)
            raise UnsupportedModelError(
                f"model: {type(model).__name__} does not support setting its attention implementation "
                "through transformers' AttentionInterface, so the probe cannot attach to it",
                argument="model",
            )
        for m in model.modules():
            _MODULE_STATE[m] = state
            state.modules.append(weakref.ref(m))
        # the model and its base model (what a PEFT wrapper's forward calls through __call__)
        for target in {id(m): m for m in (model, getattr(model, "base_model", model))}.values():
            if isinstance(target, torch.nn.Module):
                state.hooks.append(target.register_forward_pre_hook(state.check_call, with_kwargs=True))
        _MODEL_STATE[model] = state
    state.probes.append(probe)


def _restore(state: _ModelState) -> None:
    for cfg, impl in state.saved:
        cfg._attn_implementation_internal = impl


def _detach(model: Any, probe: ConcentrationProbe) -> None:
    state = _MODEL_STATE.get(model)
    if state is None or probe not in state.probes:
        return
    state.probes.remove(probe)
    if state.probes:
        return
    _restore(state)
    for handle in state.hooks:
        handle.remove()
    state.hooks = []
    for ref in state.modules:
        m = ref()
        if m is not None:
            _MODULE_STATE.pop(m, None)
    _MODEL_STATE.pop(model, None)


def _normalize_layers(layers: None | int | slice | Iterable[int], n: int) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(n))
    if isinstance(layers, slice):
        out = tuple(range(n)[layers])
        if not out:
            raise ParameterError(f"layers: the slice {layers} selects no layer of the model's {n}", argument="layers")
        return out
    if isinstance(layers, bool):
        raise ParameterError(f"layers: expected None, a slice or layer indices, got {layers!r}", argument="layers")
    items: Sequence[Any] = [layers] if isinstance(layers, int) else list(layers)
    if not items:
        raise ParameterError("layers: expected at least one layer index, got an empty selection", argument="layers")
    out_list: list[int] = []
    for x in items:
        if isinstance(x, bool) or not isinstance(x, int):
            raise ParameterError(f"layers: expected integer layer indices, got {x!r}", argument="layers")
        if not -n <= x < n:
            raise ParameterError(
                f"layers: index {x} is out of range for a model with {n} layers (expected {-n} <= i < {n})",
                argument="layers",
            )
        i = x % n
        if i in out_list:
            raise ParameterError(f"layers: layer {i} is selected twice", argument="layers")
        out_list.append(i)
    return tuple(sorted(out_list))


def unwrap_model(model: Any) -> Any:
    """The Hugging Face model inside ``model``'s wrappers (``model`` itself if it is one).

    Peels, outermost first: ``.module`` (``DistributedDataParallel``, a DeepSpeed engine,
    accelerate's wrappers, FSDP1), PEFT's ``get_base_model()`` (the transformers model
    with the adapter layers injected) and ``torch.compile``'s ``_orig_mod``, until a
    ``transformers.PreTrainedModel`` (or nothing more to peel) is reached. The probe and
    the critic taps attach to what this returns; a caller still runs the forward through
    the wrapper, so the wrapper's hooks and collectives (DDP's gradient all-reduce) run."""
    m = model
    for _ in range(16):
        if isinstance(m, PreTrainedModel):
            return m
        get_base = getattr(m, "get_base_model", None)
        inner = getattr(m, "module", None)
        if callable(get_base) and isinstance(m, torch.nn.Module):  # peft.PeftModel
            m = get_base()
        elif isinstance(inner, torch.nn.Module):
            m = inner
        elif isinstance(getattr(m, "_orig_mod", None), torch.nn.Module):
            m = m._orig_mod
        else:
            return m
    return m


class ConcentrationProbe:
    """Context manager that records attention concentration during a model's forward pass.

    ::

        with torch.no_grad(), hf.ConcentrationProbe(model, statistic="entropy") as probe:
            model(input_ids=ids, attention_mask=am)
        probe.concentration        # [B, T] float32 on the model's device

    For query position t the statistic of each head's attention distribution over its
    visible keys (see :mod:`comppo_core.hf.statistics`: ``"entropy"`` is
    ``1 − H(p)/log n_t``, ``"max"`` is ``max p``, ``"l2"`` is ``Σ p²``) is averaged over the
    heads, then over the selected layers. Padded query positions are 0::

        per_layer[b, t, i]  = (1/H) Σ_h stat(p_{b,h,t} of layer layers[i])
        concentration[b, t] = (1/L) Σ_i per_layer[b, t, i]          L = len(layers)

    (the mean is accumulated layer by layer in the order the model runs them, with or
    without ``per_layer``, so keeping the layers does not change it by a bit).

    A packed row (several sequences end to end, ``position_ids`` restarting at 0 at each:
    verl's ``NO_PADDING`` layout) is recorded per sequence when the model is called as
    transformers wants it, without a mask and without a cache::

        pos = hf.lm.packed_position_ids(hf.lm.check_cu_seqlens(cu_seqlens, ids.shape[1]))
        with torch.no_grad(), hf.ConcentrationProbe(model) as probe:
            model(input_ids=ids, position_ids=pos, use_cache=False)   # ids [1, N]
        probe.concentration        # [1, N]: each sequence's own, token by token

    (with ``attention_mask`` or a cache the call raises
    :class:`~comppo_core.errors.ParameterError`: the sequences would see each other).

    Args:
      model: a transformers ``PreTrainedModel`` whose attention goes through
        ``AttentionInterface`` (Llama, Qwen2, Qwen3, Mistral, GPT-2, ...), or one wrapped
        by DDP, DeepSpeed, accelerate or PEFT: the probe attaches to
        :func:`unwrap_model`'s inner model (:attr:`model`) and records whichever forward
        runs it, the wrapper's included.
      statistic: ``"entropy"`` (default), ``"max"`` or ``"l2"``.
      layers: ``None`` (all layers), a slice, or layer indices (negative ones count from
        the end).
      method: ``"auto"``, ``"online"`` (CUDA with Triton), ``"fused"`` or ``"chunked"``
        (how each layer's statistic is computed; all are exact, see
        :func:`~comppo_core.hf.statistics.head_mean_concentration`). ``"auto"`` takes
        online on CUDA, fused or chunked elsewhere.
      query_chunk: most query rows whose scores or mask bias exist at once.
      precision: ``"float32"`` (default) or ``"model"``: the dtype of the fused kernel's
        pass (see :func:`~comppo_core.hf.statistics.head_mean_concentration`); the online
        and chunked methods are float32 either way.
      per_layer: also keep each selected layer's head-mean statistic,
        :attr:`per_layer` ``[B, T, L]`` (memory O(B·T·L), filled during the pass).
      record_with_grad: also record passes run with gradients enabled (by default they
        are skipped). The statistic is computed under ``torch.no_grad()`` from detached
        queries and keys: it has ``requires_grad=False``, and the model's outputs, autograd
        graph and parameter gradients are those of its SDPA pass without a probe.
    """

    def __init__(
        self,
        model: Any,
        statistic: str = "entropy",
        layers: None | int | slice | Iterable[int] = None,
        *,
        method: str = "auto",
        query_chunk: int = DEFAULT_QUERY_CHUNK,
        precision: str = "float32",
        per_layer: bool = False,
        record_with_grad: bool = False,
    ) -> None:
        model = unwrap_model(model)
        if not isinstance(model, PreTrainedModel):
            raise UnsupportedModelError(
                f"model: expected a transformers PreTrainedModel, got {type(model).__module__}.{type(model).__name__}",
                argument="model",
            )
        self.model = model
        self.statistic = check_statistic(statistic)
        self.method = check_method(method, self.statistic)
        if isinstance(query_chunk, bool) or not isinstance(query_chunk, int) or query_chunk < 1:
            raise ParameterError(f"query_chunk: expected an integer >= 1, got {query_chunk!r}", argument="query_chunk")
        self.query_chunk = query_chunk
        self.precision = check_precision(precision)
        self.num_layers = _num_layers(model)
        self.layers: tuple[int, ...] = _normalize_layers(layers, self.num_layers)
        self._layer_set = frozenset(self.layers)
        for name, flag in (("per_layer", per_layer), ("record_with_grad", record_with_grad)):
            if not isinstance(flag, bool):
                raise ParameterError(f"{name}: expected True or False, got {flag!r}", argument=name)
        self._keep_per_layer = per_layer
        #: whether passes run with gradients enabled are recorded
        self.record_with_grad = record_with_grad
        #: layer index → its column in :attr:`per_layer`
        self._column = {layer: i for i, layer in enumerate(self.layers)}
        self._active = False
        self.reset()

    # ---- recording ------------------------------------------------------------

    def reset(self) -> None:
        """Forget every recorded pass."""
        self._sum: torch.Tensor | None = None
        self._valid: torch.Tensor | None = None
        self._seen: set[int] = set()
        self._last: torch.Tensor | None = None
        self._layer_buf: torch.Tensor | None = None  # [B, T, L] of the pass in progress
        self._last_per_layer: torch.Tensor | None = None
        self._passes = 0
        self._grad_calls = 0
        self._backward_calls = 0
        self._skipped_calls = 0
        self._nonfinite: list[tuple[int, torch.Tensor]] = []
        self._error: str | None = None

    def _finish_pass(self) -> None:
        complete = self._sum is not None and self._seen == self._layer_set
        sums, valid, nonfinite, buf = self._sum, self._valid, self._nonfinite, self._layer_buf
        self._drop_pass()
        if not complete:
            return
        assert sums is not None and valid is not None
        self._check_finite(nonfinite)
        conc = sums / float(len(self.layers))
        self._last = torch.where(valid, conc, torch.zeros_like(conc))
        if buf is not None:
            self._last_per_layer = buf.masked_fill_(~valid.unsqueeze(-1), 0.0)
        self._passes += 1

    def _drop_pass(self) -> None:
        """Forget the pass in progress."""
        self._sum, self._valid, self._seen, self._nonfinite = None, None, set(), []
        self._layer_buf = None

    def _check_finite(self, nonfinite: list[tuple[int, torch.Tensor]]) -> None:
        """Raise :class:`NonFiniteError` if a layer's statistic is not finite at a real token.

        ``nonfinite`` holds, per layer, the ``[B, T]`` bool mask of real tokens whose value
        is not finite; they are reduced here, so a pass costs one device synchronisation."""
        flags = torch.stack([m.any() for _, m in nonfinite]).tolist()
        bad = [(layer, m) for (layer, m), f in zip(nonfinite, flags) if f]
        if not bad:
            return
        layer, m = min(bad, key=lambda x: x[0])
        row, pos = (int(i) for i in torch.nonzero(m)[0])
        count = int(m.sum())
        self._last = None
        self._last_per_layer = None
        self._error = (
            f"concentration: the {self.statistic!r} statistic is not finite (NaN or inf) at real tokens in "
            f"layer(s) {sorted(x[0] for x in bad)}; first in layer {layer} at (row {row}, position {pos}), "
            f"{count} real token(s) in that layer. The model's queries or keys are not finite there "
            "(NaN/inf activations: corrupted weights or an overflow); the pass was not recorded"
        )
        raise NonFiniteError(self._error, argument="concentration", row=row, position=pos)

    def _record(self, layer: int, stat: torch.Tensor, valid: torch.Tensor) -> None:
        if self._sum is not None and (
            layer in self._seen or self._sum.shape != stat.shape or self._sum.device != stat.device
        ):
            self._finish_pass()
        if self._sum is None:
            self._sum = torch.zeros_like(stat)
            self._valid = valid.clone()
            if self._keep_per_layer:
                self._layer_buf = stat.new_empty((*stat.shape, len(self.layers)))
        self._sum += stat
        if self._layer_buf is not None:  # every column is written before the pass completes
            self._layer_buf[..., self._column[layer]] = stat
        # padded queries are zeroed at the end of the pass; a real token must be finite
        self._nonfinite.append((layer, ~torch.isfinite(stat) & valid))
        self._seen.add(layer)
        if self._seen == self._layer_set:
            self._finish_pass()

    @property
    def passes(self) -> int:
        """Number of complete forward passes recorded."""
        return self._passes

    @property
    def concentration(self) -> torch.Tensor:
        """``[B, T]`` float32 concentration of the last recorded pass, per query position
        (the head mean averaged over the selected layers; 0 at padded positions)."""
        if self._last is None:
            raise self._nothing_recorded("concentration")
        return self._last

    @property
    def per_layer(self) -> torch.Tensor:
        """``[B, T, L]`` float32 head-mean statistic of each selected layer in the last
        recorded pass: ``per_layer[:, :, i]`` is layer ``layers[i]`` (ascending), 0 at padded
        positions; its mean over the last axis is :attr:`concentration` up to float32
        rounding. Needs ``per_layer=True``."""
        if not self._keep_per_layer:
            raise ProbeError(
                "per_layer: this probe keeps only the mean over layers; pass per_layer=True to "
                "ConcentrationProbe to keep each layer's statistic",
                argument="per_layer",
            )
        if self._last_per_layer is None:
            raise self._nothing_recorded("per_layer")
        return self._last_per_layer

    def _nothing_recorded(self, name: str) -> ProbeError:
        """The error for reading ``name`` when no pass was recorded, saying why."""
        why = []
        if self._grad_calls:
            why.append(
                f"{self._grad_calls} attention call(s) ran with gradients enabled (the probe records "
                "them only with record_with_grad=True; else only under torch.no_grad() or "
                "torch.inference_mode())"
            )
        if self._backward_calls:
            why.append(
                f"{self._backward_calls} attention call(s) ran inside a backward pass (activation "
                "checkpointing recomputation; never recorded)"
            )
        if self._skipped_calls:
            why.append(
                f"{self._skipped_calls} attention call(s) were cached decoding steps (the probe records "
                "full-sequence passes; use use_cache=False)"
            )
        if self._seen:
            why.append(f"a pass is incomplete: layers {sorted(self._seen)} of {list(self.layers)} were seen")
        if self._error is not None:
            why.append(f"the last pass raised NonFiniteError ({self._error})")
        return ProbeError(
            f"{name}: no forward pass was recorded"
            + ("; " + "; ".join(why) if why else " (run the model inside the `with` block)"),
            argument=name,
        )

    # ---- context manager ------------------------------------------------------

    def __enter__(self) -> ConcentrationProbe:  # noqa: PYI034 (typing.Self needs Python 3.11)
        if self._active:
            raise ProbeError(
                "ConcentrationProbe: this probe is already active; create another probe to nest", argument=None
            )
        self.reset()
        _attach(self.model, self)
        self._active = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._active = False
        _detach(self.model, self)
        # A pass still in progress (an exception mid-forward) is dropped.
        self._drop_pass()

    def __repr__(self) -> str:
        return (
            f"ConcentrationProbe(statistic={self.statistic!r}, layers={list(self.layers)}, "
            f"method={self.method!r}, per_layer={self._keep_per_layer}, "
            f"record_with_grad={self.record_with_grad}, active={self._active}, passes={self._passes})"
        )
