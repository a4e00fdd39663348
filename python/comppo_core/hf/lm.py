"""Language-model helpers: token log-probs, id checks and positions (docs/design.md §7, §10).

The pieces every forward over ``(model, input_ids, attention_mask)`` shares, with no
probe and no critic: :func:`comppo_core.hf.score` (the one scoring forward), the probe's
:func:`~comppo_core.hf.logprobs_and_concentration`, :func:`comppo_core.rl.forward` and
the trainer's rollouts all use them.

Two ways to per-token log-probs: :func:`token_logprobs` from logits a caller already has,
and :func:`head_logprobs` from the final hidden states and the LM head, in chunks of
tokens, so that the ``[N, V]`` logits never exist at once (the scoring forward's path).

Columns: a ``[B, T]`` batch gives ``[B, T−1]`` per-token values; column j scores token
``input_ids[:, j+1]`` from query position j.

**Packed rows** (several sequences end to end in one row, as verl's ``NO_PADDING`` layout
and flash-attention's varlen kernels take them): the sequences are described by
``cu_seqlens`` ``[S+1]`` (the offsets of the package's packed layout, README "packed
layout": sequence i is tokens ``cu_seqlens[i] .. cu_seqlens[i+1]−1`` of a ``[1, N]`` row)
or by ``position_ids`` that restart::

    position_ids[0, t] = t − cu_seqlens[i]        for cu_seqlens[i] <= t < cu_seqlens[i+1]
    starts[b, t]       = real token t whose position is not the previous real token's + 1
    columns[b, j]      = query j and target j+1 real, and j+1 not a start

A column whose target starts the next sequence scores nothing (0), so sequence i keeps
its ``L_i − 1`` columns ``cu_seqlens[i] .. cu_seqlens[i+1]−2``: :func:`column_cu_seqlens`
gives their offsets among the scored columns, the ``cu_seqlens`` of
``comppo_core.gae(x[columns], cu_seqlens=...)``. :func:`unpack_columns` and
:func:`pack_columns` move per-column values between a packed row and one right-padded
row per sequence.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from ..errors import LayoutError, ParameterError, ShapeError

__all__ = [
    "HEAD_CHUNK_ELEMENTS",
    "LOGPROB_CHUNK_ELEMENTS",
    "LOGPROB_CHUNK_ENV",
    "check_cu_seqlens",
    "check_ids",
    "column_cu_seqlens",
    "default_position_ids",
    "head_logprobs",
    "logprob_chunk_tokens",
    "pack_columns",
    "packed_position_ids",
    "scored_columns",
    "sequence_starts",
    "token_logprobs",
    "unpack_columns",
    "unpack_tokens",
]

#: Most logits elements :func:`token_logprobs` converts to float32 at once (2^26: 256 MiB
#: of float32 logits; one position's whole vocabulary row if that is larger).
LOGPROB_CHUNK_ELEMENTS = 1 << 26
#: The default size of :func:`head_logprobs`' chunks, in logits elements (2^24: 64 MiB of
#: float32 logits, 110 tokens at V = 151936): on CPU a smaller block is reused from cache,
#: a larger one costs memory traffic (1.18× a plain logits forward at hidden 512, against
#: 1.22× at 2^26: benches/score_memory.py).
HEAD_CHUNK_ELEMENTS = 1 << 24

#: Environment variable: tokens per chunk of the scoring forward's LM head when
#: ``score(..., logprob_chunk=None)`` (an integer ≥ 1, or 0 for the model's full logits).
LOGPROB_CHUNK_ENV = "COMPPO_LOGPROB_CHUNK"


def logprob_chunk_tokens(chunk: int | None, vocab: int) -> int:
    """Tokens per LM-head chunk: ``chunk`` if given, else ``$COMPPO_LOGPROB_CHUNK`` if set,
    else ``max(1, HEAD_CHUNK_ELEMENTS // vocab)`` (110 tokens for V = 151936: 64 MiB
    of float32 logits). 0 means no chunking (the model's own full logits)."""
    name = "logprob_chunk"
    if chunk is None:
        env = os.environ.get(LOGPROB_CHUNK_ENV, "").strip()
        if not env:
            return max(1, HEAD_CHUNK_ELEMENTS // max(1, vocab))
        name = LOGPROB_CHUNK_ENV
        try:
            chunk = int(env)
        except ValueError:
            raise ParameterError(
                f"{LOGPROB_CHUNK_ENV}: expected an integer >= 0 (tokens per chunk, 0 = unchunked), got {env!r}",
                argument=LOGPROB_CHUNK_ENV,
            ) from None
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
        raise ParameterError(
            f"{name}: expected None or an integer >= 0 (tokens per chunk, 0 = unchunked), got {chunk!r}", argument=name
        )
    return chunk


def _check_temperature(temperature: Any) -> float:
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise ParameterError(f"temperature: expected a finite float > 0, got {temperature!r}", argument="temperature")
    return float(temperature)


def _chunk_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    post: Callable[[torch.Tensor], torch.Tensor] | None,
    temperature: float,
    hidden: torch.Tensor,
    targets: torch.Tensor,
) -> torch.Tensor:
    """``[n]`` float32 log-probs of one chunk: ``z = float32(post(head(hidden))) / τ``,
    ``z[y] − logsumexp(z)``, as :func:`token_logprobs` computes each position (so the two
    agree bit for bit where the head's matmul rounds each row the same way)."""
    z = head(hidden)
    if post is not None:
        z = post(z)
    z = z.float()
    if temperature != 1.0:
        z = z.div_(temperature) if not z.requires_grad else z / temperature
    return z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def _chunk_logprobs_in_place(z: torch.Tensor, temperature: float, targets: torch.Tensor) -> torch.Tensor:
    """:func:`_chunk_logprobs` after the head, without gradients, overwriting ``z`` (a
    float32 block this chunk owns): the same operations as ``torch.logsumexp``
    (``log Σ exp(z − max) + max``, a non-finite max counted as 0), done in place, so a
    chunk allocates no second ``[n, V]`` block; bit for bit the same values."""
    if temperature != 1.0:
        z.div_(temperature)
    picked = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    top = z.amax(-1, keepdim=True)
    top.masked_fill_(top.abs() == math.inf, 0.0)
    total = z.sub_(top).exp_().sum(-1)
    return picked - total.log_().add_(top.squeeze(-1))


def _plain_linear(head: Any) -> bool:
    """Whether ``head`` is a bare ``nn.Linear`` with no hooks (its output is ``x @ Wᵀ + b``
    and nothing else may run), so a chunk can write it into a reused block."""
    return (
        type(head) is torch.nn.Linear
        and not head._forward_hooks
        and not head._forward_pre_hooks
        and not torch.nn.modules.module._global_forward_hooks
        and not torch.nn.modules.module._global_forward_pre_hooks
    )


def head_logprobs(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int,
    post: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``log softmax(post(head(hidden)) / τ)[n, targets[n]]`` in float32, ``chunk_tokens`` rows at a time.

    ::

        z[n, v] = float32(post(head(hidden[n]))[v]) / τ                 τ = temperature
        out[n]  = z[n, y] − log Σ_v exp(z[n, v]),                       y = targets[n]

    ``head`` is the model's LM head (``model.get_output_embeddings()``: its bias, LoRA
    layers and hooks are the module's own) and ``post`` what the model does to the head's
    output before returning logits (a final logit soft-capping or scale), so ``out`` equals
    :func:`token_logprobs` of the model's logits at those positions. The ``[N, V]`` logits
    never exist at once: each chunk's ``[chunk_tokens, V]`` block is computed, reduced to
    ``[chunk_tokens]`` and freed. With gradients enabled each chunk runs under
    :func:`torch.utils.checkpoint.checkpoint` (non-reentrant), which keeps only its input
    rows for the backward and recomputes the chunk's logits there, so no logits are saved
    either. Peak transient memory: about three ``[chunk_tokens, V]`` float32 blocks (the
    head's output and ``logsumexp``'s temporaries).

    Args:
      hidden: ``[N, H]`` final hidden states (the LM head's input).
      head: the LM head, ``[n, H] → [n, V]``.
      targets: ``[N]`` integer token ids in ``[0, V)``.
      temperature: ``τ``, a finite float > 0.
      chunk_tokens: rows per chunk (integer ≥ 1).
      post: optional elementwise map applied to the head's output (in its dtype).
    """
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2 or not hidden.is_floating_point():
        got = f"{hidden.dtype} {tuple(hidden.shape)}" if isinstance(hidden, torch.Tensor) else type(hidden).__name__
        raise ShapeError(f"hidden: expected a 2-D float tensor [N, H], got {got}", argument="hidden")
    n = hidden.shape[0]
    if (
        not isinstance(targets, torch.Tensor)
        or tuple(targets.shape) != (n,)
        or targets.dtype not in (torch.int64, torch.int32)
    ):
        got = f"{targets.dtype} {tuple(targets.shape)}" if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise ShapeError(f"targets: expected an integer tensor [N] = [{n}], got {got}", argument="targets")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ParameterError(f"chunk_tokens: expected an integer >= 1, got {chunk_tokens!r}", argument="chunk_tokens")
    tau = _check_temperature(temperature)
    targets = targets.to(device=hidden.device, dtype=torch.int64)
    parts = []
    grad = torch.is_grad_enabled()
    # without gradients a plain float32 head writes each chunk into one reused block and the
    # log-sum-exp runs in place on it: no [n, V] allocation per chunk (each would be fresh
    # pages to fault in), the same values bit for bit
    linear = head if isinstance(head, torch.nn.Linear) and _plain_linear(head) else None
    reuse = not grad and post is None and linear is not None and linear.weight.dtype == torch.float32
    block: torch.Tensor | None = None
    for i in range(0, max(n, 1), chunk_tokens):  # N = 0 still runs the head once: the graph stays connected
        h, y = hidden[i : i + chunk_tokens], targets[i : i + chunk_tokens]
        if grad:
            parts.append(checkpoint(_chunk_logprobs, head, post, tau, h, y, use_reentrant=False))
        elif reuse and linear is not None and h.dtype == torch.float32 and h.shape[0]:
            if block is None or block.shape[0] < h.shape[0]:
                block = torch.empty((h.shape[0], linear.weight.shape[0]), dtype=torch.float32, device=h.device)
            z = block[: h.shape[0]]
            if linear.bias is None:
                torch.mm(h, linear.weight.t(), out=z)
            else:
                torch.addmm(linear.bias, h, linear.weight.t(), out=z)
            parts.append(_chunk_logprobs_in_place(z, tau, y))
        else:
            parts.append(_chunk_logprobs(head, post, tau, h, y))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_elements: int = LOGPROB_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """``log softmax(logits / τ)[b, i, targets[b, i]]`` in float32: ``[B, L]`` from ``[B, L, V]``.

    ::

        z[b, i, v] = float32(logits[b, i, v]) / τ                      τ = temperature
        out[b, i]  = z[b, i, y] − log Σ_v exp(z[b, i, v]),              y = targets[b, i]

    With ``τ`` the sampling temperature these are the log-probs of the distribution the
    tokens were drawn from, as verl (``logits.div_(temperature)``) and TRL
    (``logits /= temperature``) score rollouts; ``τ = 1`` divides by nothing.

    computed on float32 copies of blocks of at most ``max(chunk_elements, V)`` logits
    (``P = max(1, chunk_elements // V)`` positions of one row, or whole rows when
    ``P ≥ L``), so the transient memory is bounded whatever B and L: with the default cap
    2^26, 256 MiB (+ logsumexp's temporary of the same size), where a float32 copy of
    all B = 8, L = 4096, V = 151936 logits would be 18.5 GiB. On CPU a position's value does
    not depend on the block it falls in (bit for bit); on CUDA, ``logsumexp``'s reduction
    order may depend on the block shape (last-bit differences).

    Args:
      logits: ``[B, L, V]`` logits, any float dtype.
      targets: ``[B, L]`` integer token ids in ``[0, V)``.
      temperature: ``τ``, a finite float > 0.
      chunk_elements: the cap on logits elements per block (integer ≥ 1).
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or not logits.is_floating_point():
        got = f"{logits.dtype} {tuple(logits.shape)}" if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ShapeError(f"logits: expected a 3-D float tensor [B, L, V], got {got}", argument="logits")
    b, length, vocab = logits.shape
    if (
        not isinstance(targets, torch.Tensor)
        or tuple(targets.shape) != (b, length)
        or targets.dtype not in (torch.int64, torch.int32)
    ):
        got = f"{targets.dtype} {tuple(targets.shape)}" if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise ShapeError(f"targets: expected an integer tensor [B, L] = [{b}, {length}], got {got}", argument="targets")
    if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int) or chunk_elements < 1:
        raise ParameterError(
            f"chunk_elements: expected an integer >= 1, got {chunk_elements!r}", argument="chunk_elements"
        )
    _check_temperature(temperature)
    out = torch.empty(b, length, dtype=torch.float32, device=logits.device)
    positions = max(1, min(length, chunk_elements // max(1, vocab)))
    rows = max(1, min(b, chunk_elements // max(1, length * vocab))) if positions == length else 1
    targets = targets.to(device=logits.device, dtype=torch.int64)
    for b0 in range(0, b, rows):
        for i in range(0, length, positions):
            chunk = logits[b0 : b0 + rows, i : i + positions].float()
            if temperature != 1.0:
                chunk = chunk / float(temperature)
            y = targets[b0 : b0 + rows, i : i + positions].unsqueeze(-1)
            out[b0 : b0 + rows, i : i + positions] = chunk.gather(-1, y).squeeze(-1) - torch.logsumexp(chunk, dim=-1)
            del chunk
    return out


def check_ids(input_ids: Any, attention_mask: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``input_ids`` ``[B, T]`` (integer, ``T >= 2``) and ``attention_mask`` as a bool tensor
    on the ids' device (or None), or a :class:`~comppo_core.errors.ShapeError` naming the argument."""
    if (
        not isinstance(input_ids, torch.Tensor)
        or input_ids.dim() != 2
        or input_ids.dtype not in (torch.int64, torch.int32)
    ):
        got = (
            f"{input_ids.dtype} {tuple(input_ids.shape)}"
            if isinstance(input_ids, torch.Tensor)
            else type(input_ids).__name__
        )
        raise ShapeError(f"input_ids: expected a 2-D integer tensor [B, T], got {got}", argument="input_ids")
    if input_ids.shape[1] < 2:
        raise ShapeError(
            f"input_ids: expected T >= 2 tokens per row (log-probs score tokens 1..T-1), got T={input_ids.shape[1]}",
            argument="input_ids",
        )
    if attention_mask is None:
        return input_ids, None
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != tuple(input_ids.shape):
        got_mask = (
            str(tuple(attention_mask.shape))
            if isinstance(attention_mask, torch.Tensor)
            else type(attention_mask).__name__
        )
        raise ShapeError(
            f"attention_mask: expected a tensor shaped like input_ids {tuple(input_ids.shape)}, got {got_mask}",
            argument="attention_mask",
        )
    return input_ids, attention_mask.to(device=input_ids.device) != 0


def default_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, as ``generate`` does: ``cumsum(mask) − 1``,
    clamped at 0 (so a left-padded row's first real token has position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


def scored_columns(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T−1]`` bool: the columns whose query token ``j`` and target token ``j+1`` are
    both real (``mask[:, :-1] & mask[:, 1:]``); per-token values are 0 outside them."""
    m = attention_mask.to(torch.bool)
    return m[:, :-1] & m[:, 1:]


# --------------------------------------------------------------------------- #
# Packed rows
# --------------------------------------------------------------------------- #


def check_cu_seqlens(cu_seqlens: Any, total: int, device: Any = None) -> torch.Tensor:
    """``cu_seqlens`` as an int64 tensor ``[S+1]`` on ``device``, or a
    :class:`~comppo_core.errors.LayoutError` (``argument="cu_seqlens"``, ``index`` its first
    offending entry), the checks and messages of ``comppo_core.gae(cu_seqlens=...)``:
    1-D integer offsets, ``S >= 1``, starting at 0, non-decreasing, ending at ``total``
    (the packed row's length N). Empty sequences (equal offsets) are allowed. Accepts a
    tensor, a NumPy array or a sequence of ints; the input is not modified."""
    if isinstance(cu_seqlens, torch.Tensor):
        cu = cu_seqlens.detach()
    else:
        try:
            cu = torch.as_tensor(np.asarray(cu_seqlens))
        except (TypeError, ValueError, RuntimeError):
            raise LayoutError(
                f"cu_seqlens: expected a 1-D array of S+1 integer offsets, got {type(cu_seqlens).__name__}",
                argument="cu_seqlens",
            ) from None
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise LayoutError(
            f"cu_seqlens: expected a 1-D array of S+1 >= 2 offsets, got shape {tuple(cu.shape)}", argument="cu_seqlens"
        )
    if cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool:
        raise LayoutError(f"cu_seqlens: expected integer offsets, got dtype {cu.dtype}", argument="cu_seqlens")
    cu = cu.to(device="cpu", dtype=torch.int64)
    if int(cu[0]) != 0:
        raise LayoutError(
            f"cu_seqlens: expected to start at 0, got {int(cu[0])} (first offending index 0)",
            argument="cu_seqlens",
            index=0,
        )
    decreasing = torch.nonzero(cu[1:] < cu[:-1])
    if decreasing.numel():
        i = int(decreasing[0, 0]) + 1
        raise LayoutError(
            f"cu_seqlens: expected non-decreasing offsets, got {int(cu[i])} after {int(cu[i - 1])} "
            f"(first offending index {i})",
            argument="cu_seqlens",
            index=i,
        )
    if int(cu[-1]) != total:
        i = int(cu.shape[0]) - 1
        raise LayoutError(
            f"cu_seqlens: expected to end at N = {total} (the packed row's length, input_ids [1, N]), got "
            f"{int(cu[-1])} (first offending index {i})",
            argument="cu_seqlens",
            index=i,
        )
    return cu if device is None else cu.to(device)


def packed_position_ids(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[1, N]`` int64: each packed sequence's positions ``0 .. L_i − 1`` (module docstring),
    on ``cu_seqlens``' device; ``cu_seqlens`` as :func:`check_cu_seqlens` returns it."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    n = int(cu_seqlens[-1])
    t = torch.arange(n, device=cu_seqlens.device)
    starts = torch.repeat_interleave(cu_seqlens[:-1], lengths, output_size=n)
    return (t - starts).unsqueeze(0)


def sequence_starts(position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, T]`` bool: the real tokens that start a packed sequence after the row's first one.

    A real token starts a sequence when its position is not the previous real token's
    position + 1 (transformers' rule for packed rows, ``find_packed_sequence_indices``,
    over real tokens only, so the positions ``generate`` gives padded rows start
    nothing). The row's first real token is never marked.

    Args:
      position_ids: ``[B, T]`` or ``[1, T]`` integer positions.
      attention_mask: optional ``[B, T]`` (nonzero = real token); None: every token real.
    """
    pos = position_ids.long()
    if attention_mask is None:
        out = torch.zeros(pos.shape, dtype=torch.bool, device=pos.device)
        out[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
        return out
    real = attention_mask.to(device=pos.device) != 0
    pos = pos.expand(real.shape)
    t = real.shape[1]
    idx = torch.where(real, torch.arange(t, device=pos.device), -1)
    prev = torch.full_like(idx, -1)
    prev[:, 1:] = idx[:, :-1].cummax(dim=1).values  # the last real token before t (-1: none)
    prev_pos = pos.gather(1, prev.clamp(min=0))
    return real & (prev >= 0) & (pos != prev_pos + 1)


def column_cu_seqlens(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[S+1]`` int64 offsets of each packed sequence's scored columns among a packed row's
    scored columns: sequence i has ``max(L_i − 1, 0)`` of them. ``x[columns]`` of a packed
    :func:`comppo_core.hf.score` output (``columns`` its :attr:`~comppo_core.hf.Scores.columns`)
    is then the packed layout of ``comppo_core.gae(..., cu_seqlens=column_cu_seqlens(cu))``."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1] - 1).clamp(min=0)
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


def _gather_rows(x: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``[S, width, ...]``: row i holds ``x[0, starts[i] : starts[i] + lengths[i]]``, then zeros."""
    s = starts.shape[0]
    j = torch.arange(width, device=x.device)
    valid = j[None, :] < lengths[:, None].to(x.device)  # [S, width]
    idx = (starts[:, None].to(x.device) + j[None, :]).clamp(max=max(x.shape[1] - 1, 0))
    flat = x[0].index_select(0, idx.reshape(-1)) if x.shape[1] else x.new_zeros((s * width, *x.shape[2:]))
    rows = flat.reshape(s, width, *x.shape[2:])
    keep = valid.reshape(s, width, *([1] * (x.dim() - 2)))
    return torch.where(keep, rows, torch.zeros((), dtype=x.dtype, device=x.device))


def _check_packed(x: Any, name: str, width: int, what: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[0] != 1 or x.shape[1] != width:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ShapeError(f"{name}: expected a packed row [1, {width}, ...] ({what}), got {got}", argument=name)


def unpack_tokens(x: torch.Tensor, cu_seqlens: torch.Tensor, name: str = "x") -> torch.Tensor:
    """A packed row of per-token values ``[1, N, ...]`` → one right-padded row per sequence,
    ``[S, T', ...]`` with ``T' = max(2, max L_i)``: row i is tokens ``cu[i] .. cu[i+1]−1``,
    then zeros. Differentiable (an index gather)."""
    n = int(cu_seqlens[-1])
    _check_packed(x, name, n, "one entry per token")
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    width = max(2, int(lengths.max()) if lengths.numel() else 0)
    return _gather_rows(x, cu_seqlens[:-1], lengths, width)


def unpack_columns(x: torch.Tensor, cu_seqlens: torch.Tensor, name: str = "x") -> torch.Tensor:
    """A packed row of per-column values ``[1, N−1, ...]`` → ``[S, T'−1, ...]``: row i is
    sequence i's ``L_i − 1`` columns ``cu[i] .. cu[i+1]−2`` (the columns a separate
    ``[1, L_i]`` row would have), then zeros; ``T'`` as :func:`unpack_tokens`."""
    n = int(cu_seqlens[-1])
    _check_packed(x, name, n - 1, "one entry per column: column j scores token j+1")
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1] - 1).clamp(min=0)
    width = max(2, int(lengths.max()) + 1 if lengths.numel() else 0) - 1
    return _gather_rows(x, cu_seqlens[:-1], lengths, width)


def pack_columns(x: torch.Tensor, cu_seqlens: torch.Tensor, name: str = "x") -> torch.Tensor:
    """The inverse of :func:`unpack_columns`: ``[S, W, ...]`` (``W >= max L_i − 1``) →
    ``[1, N−1, ...]``, 0 in the columns that score no token of their sequence (a target
    that starts the next one). Differentiable."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1] - 1).clamp(min=0)
    n = int(cu_seqlens[-1])
    s = int(cu_seqlens.shape[0]) - 1
    need = int(lengths.max()) if lengths.numel() else 0
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[0] != s or x.shape[1] < need:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ShapeError(
            f"{name}: expected one row per sequence [S, >= max L_i − 1, ...] = [{s}, >= {need}, ...], got {got}",
            argument=name,
        )
    width = x.shape[1]
    j = torch.arange(width, device=x.device)
    valid = j[None, :] < lengths[:, None].to(x.device)  # [S, W]
    target = (cu_seqlens[:-1, None].to(x.device) + j[None, :])[valid]
    out = x.new_zeros((max(n - 1, 0), *x.shape[2:]))
    out = out.index_put((target,), x[valid])
    return out.unsqueeze(0)
