"""verl's packed ``NO_PADDING`` layout and comppo_core's packed columns, both ways (torch only).

verl's FSDP engine with ``use_remove_padding`` runs the actor on one packed row
``input_ids = nested_ids.values()[None]`` ``[1, N]``, ``S`` sequences end to end,
``cu_seqlens = nested_ids.offsets()`` ``[S+1]``, no attention mask, positions restarting
at 0 per sequence: exactly the row :func:`comppo_core.rl.forward` scores with
``cu_seqlens``. The two per-token conventions differ by one entry::

    verl per-token nested  out[t]        t in [0, N)      (entry t scores token t+1, rolled labels)
    comppo_core packed     col[0, j]     j in [0, N−1)    (column j scores token j+1)

    col[0, j] = out[j]     except at a sequence's last entry j = cu[i+1] − 1, whose target
                           would be the next sequence's first token: there verl holds garbage
                           and comppo_core a boundary column (0, outside every response)

Responses end their sequences (verl's rollouts are right-padded, the padding removed), so
response token k of sequence i (``r_i`` real response tokens) is packed token
``cu[i+1] − r_i + k`` and is scored by column ``cu[i+1] − r_i + k − 1``: the entry verl's
``response_from_nested`` reads for it.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import ShapeError

__all__ = ["from_nested_columns", "response_columns", "response_layout", "to_nested_columns"]


def _offsets(cu_seqlens: torch.Tensor) -> torch.Tensor:
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        got = tuple(cu_seqlens.shape) if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
        raise ShapeError(f"cu_seqlens: expected a 1-D tensor of S+1 >= 2 offsets, got {got}", argument="cu_seqlens")
    return cu_seqlens.to(torch.long)


def _response_rows(response_mask: Any, attention_mask: torch.Tensor | None, s: int) -> tuple[torch.Tensor, list[Any]]:
    """``(r, flags)``: each sequence's real response length ``r_i`` and its ``r_i`` response-mask
    flags (bool), from verl's nested ``[S, r_i]`` response mask, or a padded ``[S, R]`` one with
    the padded ``[S, P + R]`` ``attention_mask`` (its last ``R`` columns give ``r_i``)."""
    if isinstance(response_mask, torch.Tensor) and response_mask.is_nested:
        offsets = response_mask.offsets().to(torch.long)  # type: ignore[attr-defined]
        lengths = offsets.diff()
        flat = response_mask.values() != 0
        flags = [flat[int(offsets[i]) : int(offsets[i + 1])] for i in range(len(lengths))]
    else:
        if not isinstance(response_mask, torch.Tensor) or response_mask.dim() != 2:
            got = (
                tuple(response_mask.shape) if isinstance(response_mask, torch.Tensor) else type(response_mask).__name__
            )
            raise ShapeError(
                f"response_mask: expected verl's nested [S, r_i] or padded [S, R] response mask, got {got}",
                argument="response_mask",
            )
        if attention_mask is None or attention_mask.dim() != 2 or attention_mask.shape[0] != response_mask.shape[0]:
            found = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else None
            raise ShapeError(
                f"attention_mask: a padded response_mask [S, R] = {list(response_mask.shape)} needs the padded "
                f"attention_mask [S, P + R] to find each response's real length, got {found}",
                argument="attention_mask",
            )
        width = response_mask.shape[1]
        lengths = (attention_mask[:, -width:] != 0).sum(1).to(torch.long)
        flags = [response_mask[i, : int(lengths[i])] != 0 for i in range(response_mask.shape[0])]
    if len(lengths) != s:
        raise ShapeError(
            f"response_mask: expected one row per packed sequence ({s}), got {len(lengths)}", argument="response_mask"
        )
    return lengths, flags


def response_columns(
    cu_seqlens: torch.Tensor, response_mask: Any, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``[1, N−1]`` bool: the packed columns that score a response token whose response-mask flag is set.

    ``response_mask`` is verl's nested ``[S, r_i]`` (the v1 trainer's) or padded ``[S, R]`` one
    (then ``attention_mask`` ``[S, P + R]``, padded, gives ``r_i``); column
    ``cu[i+1] − r_i + k − 1`` for each set flag k of sequence i (module docstring).

    Raises:
      ShapeError: a response longer than its sequence minus one token (it would have no prompt
        token to be scored from), or a mask that does not fit the offsets.
    """
    cu = _offsets(cu_seqlens)
    s = cu.numel() - 1
    lengths, flags = _response_rows(response_mask, attention_mask, s)
    n = int(cu[-1])
    out = torch.zeros(1, max(n - 1, 0), dtype=torch.bool, device=cu.device)
    seq_lengths = cu.diff()
    for i in range(s):
        r = int(lengths[i])
        if r > int(seq_lengths[i]) - 1:
            raise ShapeError(
                f"response_mask: expected at most L_i − 1 = {int(seq_lengths[i]) - 1} response tokens in sequence {i} "
                f"(at least one prompt token before them), got {r}",
                argument="response_mask",
                row=i,
            )
        k = torch.nonzero(flags[i].to(cu.device)).flatten()
        out[0, int(cu[i + 1]) - r - 1 + k] = True
    return out


def from_nested_columns(per_token: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """verl's per-token nested output (``[S, L_i]`` jagged, or its ``[N]`` values) as comppo_core's packed
    ``[1, N−1]`` columns, float32, 0 in each sequence's boundary column (module docstring)."""
    cu = _offsets(cu_seqlens)
    flat = per_token.values() if per_token.is_nested else per_token
    n = int(cu[-1])
    if flat.dim() != 1 or flat.shape[0] != n:
        raise ShapeError(
            f"per_token: expected one entry per packed token [N] = [{n}], got {tuple(flat.shape)}",
            argument="per_token",
        )
    v = flat.detach().float().clone()
    v[cu[1:] - 1] = 0.0
    return v[:-1].unsqueeze(0)


def to_nested_columns(columns: torch.Tensor, cu_seqlens: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """The inverse of :func:`from_nested_columns`: packed ``[1, N−1]`` columns as verl's per-token
    nested ``[S, L_i]`` (jagged; entry t = column t, each sequence's last entry ``fill``).
    Differentiable in ``columns``."""
    cu = _offsets(cu_seqlens)
    n = int(cu[-1])
    if columns.dim() != 2 or tuple(columns.shape) != (1, n - 1):
        raise ShapeError(
            f"columns: expected the packed columns [1, N−1] = [1, {n - 1}], got {tuple(columns.shape)}",
            argument="columns",
        )
    boundary = torch.zeros(n, dtype=torch.bool, device=columns.device)
    boundary[cu[1:] - 1] = True
    flat = torch.cat([columns[0], columns.new_zeros(1)])
    flat = torch.where(boundary, torch.full_like(flat, fill), flat)
    return torch.nested.nested_tensor_from_jagged(flat, cu.to(columns.device))


def response_layout(
    per_token: torch.Tensor, response_mask: Any, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """verl's per-token nested output as the padded response layout ``[S, R]`` of ``token_level_rewards``
    (entry ``[i, k]`` = the column that scores response token k; 0 past ``r_i``), what
    ``verl.workers.utils.padding.response_from_nested(...).to_padded_tensor(0)`` gives, padded to
    ``R`` = the response mask's width (padded mask) or ``max r_i`` (nested mask)."""
    if not per_token.is_nested:
        raise ShapeError(
            f"per_token: expected verl's nested per-token output [S, L_i], got a dense {tuple(per_token.shape)}",
            argument="per_token",
        )
    cu = per_token.offsets().to(torch.long)  # type: ignore[attr-defined]
    s = cu.numel() - 1
    lengths, _ = _response_rows(response_mask, attention_mask, s)
    width = (
        int(response_mask.shape[1])
        if isinstance(response_mask, torch.Tensor) and not response_mask.is_nested
        else int(lengths.max())
        if s
        else 0
    )
    flat = per_token.values()
    out = flat.new_zeros(s, width)
    for i in range(s):
        r = int(lengths[i])
        end = int(cu[i + 1])
        out[i, :r] = flat[end - r - 1 : end - 1]
    return out
