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
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from ..errors import ParameterError, ShapeError

__all__ = [
    "HEAD_CHUNK_ELEMENTS",
    "LOGPROB_CHUNK_ELEMENTS",
    "LOGPROB_CHUNK_ENV",
    "check_ids",
    "default_position_ids",
    "head_logprobs",
    "logprob_chunk_tokens",
    "scored_columns",
    "token_logprobs",
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
