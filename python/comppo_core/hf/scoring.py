"""The scoring forward: ``(model, input_ids, attention_mask)`` → per-token log-probs, and
the attention concentration on request, from one forward pass (docs/design.md §7, §10).

::

    logprobs[b, j]       = log softmax(logits[b, j] / τ)[input_ids[b, j+1]]      float32
    concentration[b, j]  = the probe's statistic at query position j             (detached)
    per_layer[b, j, l]   = the same, layer l alone                               (detached)

All ``[B, T−1]`` (``per_layer`` ``[B, T−1, L]``): column j scores token ``input_ids[:, j+1]``
from query position j, and every value is 0 in a column whose query or target token is
padding. :func:`score` is the one path from ids to log-probs: the probe's
:func:`logprobs_and_concentration`, :func:`comppo_core.hf.comp_gae_batch`,
:func:`comppo_core.rl.forward` (which adds gates and a critic's values) and the trainer
(old, new and reference log-probs) all call it.

**Memory-bounded log-probs.** The ``[B, T, V]`` logits are never materialised: a forward
pre-hook on the LM head (``get_output_embeddings()``) keeps its input, the final hidden
states ``[B, T, H]``, and hands the head only the last position, so the model's own head
computes ``[B, 1, V]``. The log-probs of the scored columns are then computed from the
hidden states by :func:`~comppo_core.hf.lm.head_logprobs`, ``logprob_chunk`` tokens at a
time (default ``max(1, 2^24 // V)``: 64 MiB of float32 logits per chunk), with each
chunk's logits recomputed in the backward when ``grad=True`` (never saved). What the
model does to the head's output (Gemma's ``final_logit_softcapping``, Cohere's
``logit_scale``, Granite's ``logits_scaling``) is applied per chunk, and every call checks
that the model's own logits at the last position equal the chunked path's there
(:class:`~comppo_core.hf.UnsupportedModelError` otherwise: score with
``logprob_chunk=0``, the model's full logits and :func:`~comppo_core.hf.lm.token_logprobs`).

**Packed rows.** Several sequences end to end in one ``[1, N]`` row (verl's
``NO_PADDING`` layout), given by ``cu_seqlens`` ``[S+1]`` or by ``position_ids`` that
restart at each sequence (:mod:`comppo_core.hf.lm`, "Packed rows"), score as the separate
sequences would: transformers keeps the sequences apart (a block-diagonal causal mask)
when the model is called with ``attention_mask=None`` and no cache, which is how this
function calls it. The outputs stay in the packed layout, ``[1, N−1]``: column j scores
token j+1, as verl's rolled log-probs, and is 0 (``columns`` False) where token j+1 starts
the next sequence; the concentration's visible keys are the sequence's own.
A packed row with an ``attention_mask`` would let each sequence attend to the previous
ones, silently: it is a :class:`~comppo_core.errors.ParameterError` instead.

**Wrapped models.** ``model`` may be wrapped by DDP, DeepSpeed, accelerate or PEFT: the
forward is called through the wrapper (its hooks and collectives run, e.g. DDP's gradient
all-reduce), and the probe, the LM-head hook and the critic taps attach to the inner
Hugging Face model (:func:`~comppo_core.hf.probe.unwrap_model`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch

from ..errors import ParameterError, ShapeError
from .lm import (
    check_cu_seqlens,
    check_ids,
    default_position_ids,
    head_logprobs,
    logprob_chunk_tokens,
    packed_position_ids,
    scored_columns,
    sequence_starts,
    token_logprobs,
)
from .probe import ConcentrationProbe, UnsupportedModelError, unwrap_model
from .statistics import DEFAULT_QUERY_CHUNK

__all__ = [
    "LogprobsAndConcentration",
    "LogprobsAndConcentrationPerLayer",
    "Scores",
    "logprobs_and_concentration",
    "logprobs_and_concentration_per_layer",
    "score",
]


class Scores(NamedTuple):
    """What :func:`score` returns: ``[B, T−1]`` float32 per token (``per_layer`` ``[B, T−1, L]``)."""

    logprobs: torch.Tensor
    #: None unless asked for (``concentration=True`` or ``per_layer=True``)
    concentration: torch.Tensor | None
    #: None unless ``per_layer=True``
    per_layer: torch.Tensor | None
    #: ``[B, T−1]`` bool, the scored columns (query and target token real; in a packed row,
    #: also the target not the first token of the next sequence)
    columns: torch.Tensor


class LogprobsAndConcentration(NamedTuple):
    """``[B, T−1]`` float32 each: column j scores token ``input_ids[:, j+1]`` from query position j."""

    logprobs: torch.Tensor
    concentration: torch.Tensor


class LogprobsAndConcentrationPerLayer(NamedTuple):
    """:class:`LogprobsAndConcentration` plus each layer's statistic.

    ``logprobs`` and ``concentration`` ``[B, T−1]``, ``per_layer`` ``[B, T−1, L]``, float32;
    column j scores token ``input_ids[:, j+1]`` and comes from query position j;
    ``per_layer[:, :, i]`` is layer ``probe.layers[i]`` (ascending)."""

    logprobs: torch.Tensor
    concentration: torch.Tensor
    per_layer: torch.Tensor


class _HeadInput:
    """Forward pre-hook on the LM head: keeps its ``[B, T, H]`` input and hands the head
    only the last position, so the model computes ``[B, 1, V]`` logits instead of
    ``[B, T, V]``. A call whose input is not ``[B, T, H]`` is left alone (not captured)."""

    def __init__(self, head: torch.nn.Module, shape: tuple[int, int]) -> None:
        self.head, self.shape = head, shape
        self.hidden: torch.Tensor | None = None
        self.calls = 0
        self._handle: Any = None

    def _hook(self, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self.calls += 1
        x = args[0] if args else None
        if self.calls == 1 and isinstance(x, torch.Tensor) and x.dim() == 3 and tuple(x.shape[:2]) == self.shape:
            self.hidden = x
            return (x[:, -1:], *args[1:])
        return None

    def __enter__(self) -> _HeadInput:
        self._handle = self.head.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()


def _text_config(model: Any) -> Any:
    get_text = getattr(model.config, "get_text_config", None)
    return get_text() if callable(get_text) else model.config


def _post_head(model: Any) -> Any:
    """What ``model`` does to its LM head's output before returning logits, as a function
    (None: nothing), in the model's order and dtype: a scale (Cohere ``logit_scale``,
    Granite ``/ logits_scaling``), then Gemma's ``final_logit_softcapping``."""
    cfg = _text_config(model)
    softcap = getattr(cfg, "final_logit_softcapping", None)
    scale = getattr(model, "logit_scale", None)  # Cohere keeps config.logit_scale on the model
    scale = scale if isinstance(scale, (int, float)) and not isinstance(scale, bool) else None
    divide = getattr(cfg, "logits_scaling", None)  # Granite
    divide = divide if isinstance(divide, (int, float)) and not isinstance(divide, bool) and divide != 1 else None
    if softcap is None and scale is None and divide is None:
        return None

    def post(z: torch.Tensor) -> torch.Tensor:
        if scale is not None:
            z = z * scale
        if divide is not None:
            z = z / divide
        if softcap is not None:
            z = torch.tanh(z / softcap) * softcap
        return z

    return post


def _check_last_position(model: Any, logits: Any, head: Any, post: Any, hidden: torch.Tensor) -> None:
    """The model's own logits at the last position must equal the chunked path's there."""
    b = hidden.shape[0]
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or logits.shape[:2] != (b, 1):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise UnsupportedModelError(
            f"model: {type(model).__name__} returned logits {got} for an LM head given [B, 1, H] = [{b}, 1, ...]; "
            "the chunked log-probs cannot be checked against it (score with logprob_chunk=0)",
            argument="model",
        )
    with torch.no_grad():
        ours = head(hidden[:, -1:].detach())
        ours = (post(ours) if post is not None else ours).float()
        theirs = logits.detach().float()
        tol = 1e-5 if hidden.dtype in (torch.float32, torch.float64) else 2e-2
        if ours.shape != theirs.shape or not torch.allclose(ours, theirs, rtol=tol, atol=tol):
            diff = float((ours - theirs).abs().max()) if ours.shape == theirs.shape else float("nan")
            raise UnsupportedModelError(
                f"model: {type(model).__name__}'s logits are not its LM head's output (max abs difference {diff:.3g} "
                "at the last position); it transforms them in a way the chunked log-probs do not know, so score "
                "with logprob_chunk=0 (or COMPPO_LOGPROB_CHUNK=0): the model's full logits",
                argument="model",
            )


def score(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    concentration: bool = False,
    per_layer: bool = False,
    statistic: str = "entropy",
    layers: None | int | slice | Iterable[int] = None,
    method: str = "auto",
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    precision: str = "float32",
    grad: bool = False,
    position_ids: torch.Tensor | None = None,
    logprob_chunk: int | None = None,
    cu_seqlens: Any = None,
    logprob_columns: torch.Tensor | None = None,
) -> Scores:
    """One forward of ``model``; per-token log-probs, and the concentration on request.

    Args:
      model: a causal LM (``...ForCausalLM``); with ``concentration`` or ``per_layer``, one
        supported by :class:`~comppo_core.hf.ConcentrationProbe`. It may be wrapped (DDP,
        DeepSpeed, accelerate, PEFT): the forward goes through the wrapper.
      input_ids: ``[B, T]`` token ids, ``T >= 2``.
      attention_mask: optional ``[B, T]`` (nonzero = real token); any padding side.
      temperature: ``τ``: the log-probs are of ``softmax(logits / τ)`` (the rollout's
        sampling temperature, as verl and TRL score).
      concentration: run the probe and return the concentration.
      per_layer: also each selected layer's statistic (implies ``concentration``).
      statistic, layers, method, query_chunk, precision: the probe's.
      grad: run with gradients (the PPO update): the log-probs carry them; the probe
        records the pass anyway and its statistics never do.
      position_ids: optional ``[B, T]``; by default ``cumsum(attention_mask) − 1`` clamped
        at 0, the positions ``generate`` gives a left-padded prompt (no mask: the model's
        default ``0..T−1``). Positions that restart (a real token whose position is not
        the previous real token's + 1) make a packed row: then ``attention_mask`` must be
        None. Only ``[B, T]`` (or ``[1, T]``) positions are checked; others (e.g. 3-D
        multimodal positions) go to the model as given.
      cu_seqlens: optional ``[S+1]`` int offsets: ``input_ids`` is ``[1, N]``, S sequences
        end to end (the package's packed layout); the positions are derived from them
        (``position_ids``, if also given, must equal them) and ``attention_mask`` must be
        None. Offsets that do not start at 0, decrease or do not end at N raise
        :class:`~comppo_core.errors.LayoutError` with the first offending index.
      logprob_chunk: tokens per LM-head chunk (module docstring); None: the
        ``COMPPO_LOGPROB_CHUNK`` environment variable if set, else ``max(1, 2^24 // V)``;
        0: no chunking (the model's full ``[B, T, V]`` logits, as before). The log-probs do
        not depend on it beyond float32 rounding of the head's matmul.
      logprob_columns: optional ``[B, T−1]`` bool, the columns whose log-probs are wanted
        (a PPO step reads the response's alone): the LM head runs on those of them that are
        scored, and every other column's log-prob is 0. Each computed value is the one
        without it up to the float32 rounding of the head's matmul on other blocks of rows
        (none where it rounds each row alone: SmolLM2's head at the default chunk). The
        concentration and ``columns`` do not change. None: every scored column.

    Returns:
      :class:`Scores` on the model's device; for a packed row ``[1, N−1]`` (module docstring).

    Raises:
      ParameterError: a packed row (``cu_seqlens``, or restarting ``position_ids``) with
        an ``attention_mask`` (``argument="attention_mask"``), or ``position_ids`` that
        disagree with ``cu_seqlens``.
      LayoutError: malformed ``cu_seqlens``.
    """
    ids, mask = check_ids(input_ids, attention_mask)
    position_ids, starts = _packed_positions(ids, mask, position_ids, cu_seqlens)
    kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": False}
    if mask is not None:
        kwargs["attention_mask"] = mask.long()
        kwargs["position_ids"] = default_position_ids(mask) if position_ids is None else position_ids
    elif position_ids is not None:
        kwargs["position_ids"] = position_ids
    probing = concentration or per_layer
    probe = (
        ConcentrationProbe(
            model,
            statistic,
            layers,
            per_layer=per_layer,
            record_with_grad=grad,
            method=method,
            query_chunk=query_chunk,
            precision=precision,
        )
        if probing
        else None
    )
    inner = unwrap_model(model)
    head = inner.get_output_embeddings() if callable(getattr(inner, "get_output_embeddings", None)) else None
    chunk = 0
    if isinstance(head, torch.nn.Module):
        weight = getattr(head, "weight", None)
        vocab = int(weight.shape[0]) if isinstance(weight, torch.Tensor) else int(_text_config(inner).vocab_size)
        chunk = logprob_chunk_tokens(logprob_chunk, vocab)
    else:
        logprob_chunk_tokens(logprob_chunk, 1)  # still checks the argument
    tap = _HeadInput(head, (ids.shape[0], ids.shape[1])) if chunk and head is not None else None
    columns = torch.ones(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool, device=ids.device)
    if mask is not None:
        columns = scored_columns(mask)
    if starts is not None:  # a packed row: a column whose target starts the next sequence scores nothing
        columns = columns & ~starts[:, 1:]
    wanted = columns  # the columns whose log-probs are computed
    if logprob_columns is not None:
        if not isinstance(logprob_columns, torch.Tensor) or tuple(logprob_columns.shape) != tuple(columns.shape):
            got = tuple(logprob_columns.shape) if isinstance(logprob_columns, torch.Tensor) else type(logprob_columns)
            raise ShapeError(
                f"logprob_columns: expected a tensor [B, T−1] = {list(columns.shape)} (column j scores token j+1), "
                f"got {got}",
                argument="logprob_columns",
            )
        wanted = columns & (logprob_columns.to(columns.device) != 0)
    partial = mask is not None or starts is not None or logprob_columns is not None  # some columns get no log-prob
    with (
        torch.enable_grad() if grad else torch.no_grad(),
        probe if probe is not None else contextlib.nullcontext(),
    ):
        with tap if tap is not None else contextlib.nullcontext():  # off again before the chunks call the head
            out = model(**kwargs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        del out
        if tap is not None and tap.calls > 1:
            raise UnsupportedModelError(
                f"model: {type(inner).__name__} called its LM head {tap.calls} times in one forward; the chunked "
                "log-probs expect one call (score with logprob_chunk=0)",
                argument="model",
            )
        if tap is not None and tap.hidden is not None and head is not None:
            hidden, post = tap.hidden, _post_head(inner)
            tap.hidden = None
            _check_last_position(inner, logits, head, post, hidden)
            del logits
            cols = wanted.to(hidden.device)
            h = hidden[:, :-1][cols] if partial else hidden[:, :-1].reshape(-1, hidden.shape[-1])
            y = ids[:, 1:].to(hidden.device)[cols] if partial else ids[:, 1:].reshape(-1)
            del hidden
            vals = head_logprobs(h, head, y, temperature=temperature, chunk_tokens=chunk, post=post)
            lp = torch.zeros(columns.shape, dtype=torch.float32, device=vals.device).masked_scatter(
                wanted.to(vals.device), vals
            )
        else:  # unchunked (logprob_chunk=0, or a head the hook cannot see): the model's full logits
            lp = token_logprobs(logits[:, :-1], ids[:, 1:], temperature=temperature)
            del logits
    conc = per = None
    if probe is not None:
        conc = torch.where(columns, probe.concentration[:, :-1], 0.0)
        if per_layer:
            per = probe.per_layer[:, :-1].masked_fill(~columns.unsqueeze(-1), 0.0)
    if partial:
        lp = torch.where(wanted.to(lp.device), lp, torch.zeros_like(lp))
    return Scores(lp, conc, per, columns)


def _packed_positions(
    ids: torch.Tensor, mask: torch.Tensor | None, position_ids: Any, cu_seqlens: Any
) -> tuple[Any, torch.Tensor | None]:
    """``(position_ids, starts)``: the positions to run with (from ``cu_seqlens`` when given)
    and, for a packed row, the ``[B, T]`` sequence starts (None when no row is packed), or
    the error a packed row with an attention mask is."""
    if cu_seqlens is not None:
        if ids.shape[0] != 1:
            raise ShapeError(
                f"input_ids: with cu_seqlens expected one packed row [1, N], got {tuple(ids.shape)}",
                argument="input_ids",
            )
        if mask is not None:
            raise ParameterError(
                "attention_mask: expected None with cu_seqlens (a packed row has no padding; transformers keeps its "
                "sequences apart only without a mask), got a mask",
                argument="attention_mask",
            )
        derived = packed_position_ids(check_cu_seqlens(cu_seqlens, ids.shape[1], ids.device))
        if position_ids is not None:
            given = position_ids.to(derived.device) if isinstance(position_ids, torch.Tensor) else position_ids
            if not isinstance(given, torch.Tensor) or tuple(given.shape) not in ((1, ids.shape[1]),):
                got = tuple(given.shape) if isinstance(given, torch.Tensor) else type(given).__name__
                raise ShapeError(
                    f"position_ids: expected [1, N] = [1, {ids.shape[1]}] like input_ids, got {got}",
                    argument="position_ids",
                )
            bad = torch.nonzero(given.long() != derived)
            if bad.numel():
                i = int(bad[0, 1])
                raise ParameterError(
                    f"position_ids: expected the positions cu_seqlens gives (0 at each sequence's first token), got "
                    f"{int(given[0, i])} instead of {int(derived[0, i])} (first offending index {i})",
                    argument="position_ids",
                    index=i,
                )
        position_ids = derived
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2:
        return position_ids, None
    if position_ids.shape[1] != ids.shape[1] or position_ids.shape[0] not in (1, ids.shape[0]):
        raise ShapeError(
            f"position_ids: expected [B, T] = {list(ids.shape)} (or [1, T]) like input_ids, got "
            f"{tuple(position_ids.shape)}",
            argument="position_ids",
        )
    starts = sequence_starts(position_ids.to(ids.device), mask).expand(ids.shape)
    where = torch.nonzero(starts)
    if not where.numel():
        return position_ids, None
    if mask is not None:
        row, pos = (int(i) for i in where[0])
        raise ParameterError(
            f"attention_mask: position_ids restart at (row {row}, position {pos}), a packed row (several sequences "
            "end to end), but an attention mask was given: transformers keeps packed sequences apart (a "
            "block-diagonal mask) only when attention_mask is None, so they would attend to each other. Pass "
            "attention_mask=None (or cu_seqlens=...) for packed rows, or unpack them into padded rows",
            argument="attention_mask",
            row=row,
            position=pos,
        )
    return position_ids, starts


def logprobs_and_concentration(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    statistic: str = "entropy",
    layers: None | int | slice | Iterable[int] = None,
    position_ids: torch.Tensor | None = None,
    method: str = "auto",
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    precision: str = "float32",
    cu_seqlens: Any = None,
) -> LogprobsAndConcentration:
    """Token log-probs and attention concentration from one forward pass (no grad).

    ::

        logprobs[b, j]      = log π(input_ids[b, j+1] | input_ids[b, :j+1])
        concentration[b, j] = the probe's statistic at query position j

    Column j scores token j+1 and its concentration comes from query position j, the
    position whose logits score that token (docs/design.md §7: the off-by-one to avoid). Both
    are 0 in a column whose query or target token is padding.

    Args:
      model: a causal LM (``...ForCausalLM``) supported by :class:`ConcentrationProbe`.
      input_ids: ``[B, T]`` token ids, ``T >= 2``.
      attention_mask: optional ``[B, T]`` (nonzero = real token); left, right or
        both-ends padding.
      statistic, layers, method, query_chunk, precision: as :class:`ConcentrationProbe`.
      position_ids: optional ``[B, T]``; by default ``cumsum(attention_mask) − 1``
        clamped at 0, the positions ``generate`` gives a left-padded prompt (no mask:
        the model's default ``0..T−1``).
      cu_seqlens: optional ``[S+1]`` offsets of a packed ``[1, N]`` row (as :func:`score`).

    Returns:
      ``LogprobsAndConcentration(logprobs, concentration)``, ``[B, T−1]`` float32 each,
      on the model's device.
    """
    probe: dict[str, Any] = {"statistic": statistic, "layers": layers, "method": method, "query_chunk": query_chunk}
    s = score(
        model,
        input_ids,
        attention_mask,
        concentration=True,
        position_ids=position_ids,
        precision=precision,
        cu_seqlens=cu_seqlens,
        **probe,
    )
    assert s.concentration is not None
    return LogprobsAndConcentration(s.logprobs, s.concentration)


def logprobs_and_concentration_per_layer(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    statistic: str = "entropy",
    layers: None | int | slice | Iterable[int] = None,
    position_ids: torch.Tensor | None = None,
    method: str = "auto",
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    precision: str = "float32",
    cu_seqlens: Any = None,
) -> LogprobsAndConcentrationPerLayer:
    """:func:`logprobs_and_concentration` plus each selected layer's statistic (no grad).

    ::

        logprobs[b, j]       = log π(input_ids[b, j+1] | input_ids[b, :j+1])
        concentration[b, j]  = (1/L) Σ_i per_layer[b, j, i]   (up to float32 rounding)
        per_layer[b, j, i]   = head-mean statistic of layer layers[i] at query position j

    Same column convention as :func:`logprobs_and_concentration` (column j scores token
    j+1, its statistics come from query position j; 0 in a column whose query or target
    token is padding), and ``logprobs`` and ``concentration`` are the values it returns,
    bit for bit. A separate function because a third field would break the two-way
    unpacking ``lp, conc = logprobs_and_concentration(...)``.

    Args: as :func:`logprobs_and_concentration`.

    Returns:
      ``LogprobsAndConcentrationPerLayer(logprobs, concentration, per_layer)``: ``[B, T−1]``,
      ``[B, T−1]`` and ``[B, T−1, L]`` float32 on the model's device, ``L`` the number of
      selected layers, in ascending layer order (``ConcentrationProbe(...).layers``).
    """
    probe: dict[str, Any] = {"statistic": statistic, "layers": layers, "method": method, "query_chunk": query_chunk}
    s = score(
        model,
        input_ids,
        attention_mask,
        per_layer=True,
        position_ids=position_ids,
        precision=precision,
        cu_seqlens=cu_seqlens,
        **probe,
    )
    assert s.concentration is not None and s.per_layer is not None
    return LogprobsAndConcentrationPerLayer(s.logprobs, s.concentration, s.per_layer)
