"""Attention concentration in one pass over the scores: a Triton kernel (CUDA).

For each query row ``t`` of each head, the kernel walks the key blocks once, computes the
scores ``s_k = scale·⟨q_t, k_k⟩`` of the visible keys in registers (never stored) and
keeps four running sums, rescaled whenever the running maximum grows, as FlashAttention
keeps its softmax normaliser::

    m  = max_k s_k
    l  = Σ_k e_k                   e_k = exp(s_k − m)
    u  = Σ_k e_k·(s_k − m)         (≤ 0)
    q2 = Σ_k e_k²
    n  = number of visible keys

    on a block whose maximum raises m to m':   α = exp(m − m')
        l ← α·l + Σ e',   u ← α·(u + l·(m − m')) + Σ e'·(s − m'),   q2 ← α²·q2 + Σ e'²

and at the end returns the raw per-head statistic (``statistics._normalize`` then maps it
to a concentration exactly as for the other methods)::

    entropy   H = LSE − Σ p s = log l − u/l      (two terms ≥ 0: nothing cancels)
    max       max_k p_k = exp(m − LSE) = 1/l
    l2        Σ p² = q2 / l²

Precision: the scores come from ``tl.dot`` over the model's own Q and K with float32
accumulation. For bfloat16 or float16 inputs each product is exact in float32, so the
scores are as accurate as the float32 methods'; float32 inputs use IEEE float32 products
(no TF32). Everything after the scores is float32. There is no ``V := K`` pass and no
bfloat16 rounding of probabilities or outputs, so this method is at least as accurate
as ``method="fused"`` with ``precision="float32"``, at about the cost of the model's own
attention kernel (half its matrix products: no ``P·V``).

Masks: ``None`` with ``causal`` (upper-left: query i sees keys 0..i; the tiles below
the diagonal skip the causal test) or without (every key), or a bool
``[B or 1, H or 1, Tq, Tk]`` visibility mask, read tile by tile beside the scores over
each query block's key range ``[lo, hi)`` (from one pass over the mask by a second
kernel, so left padding and the causal upper triangle are skipped); the whole tiles the
block sees entirely (between the padding and the diagonal) are read without the mask. A packed
row's block-diagonal mask takes this mode too (each block's key range spans the sequences its
queries belong to). Grouped-query
attention reads key head ``h // (H / Hkv)``: K is never repeated. Transient memory: the
``[B, H, Tq]`` outputs and the key ranges only.

Non-finite scores at visible keys (NaN or ±inf queries or keys) make that row's
statistic NaN; a row with no visible key gets ``n = 0`` (``_normalize`` returns 0).
The kernels are in ``_online_kernel``.

The kernel needs Triton (a dependency of torch's Linux CUDA wheels). The package calls it
on CUDA tensors only; the tests run it on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, set before triton is imported).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import torch

from ..errors import ParameterError

__all__ = ["available", "interpreting", "raw_statistics"]

#: Statistic codes passed to the kernel as a compile-time constant.
_CODES = {"entropy": 0, "max": 1, "l2": 2}


@functools.cache
def available() -> bool:
    """Whether Triton can be imported (it is not on every platform torch supports)."""
    try:
        import triton  # type: ignore[import-untyped]  # noqa: F401
        import triton.language  # type: ignore[import-untyped]  # noqa: F401
    except Exception:  # ImportError, or a broken install raising anything at import
        return False
    return True


def interpreting() -> bool:
    """Whether Triton's CPU interpreter is on (``TRITON_INTERPRET=1``): then
    ``method="online"`` also takes CPU tensors (for tests; slow)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def _kernels() -> Any:
    """The kernel module (imported on first use; see its docstring)."""
    from . import _online_kernel

    return _online_kernel


#: ``(BLOCK_M, BLOCK_N, num_warps)``: query rows and keys per tile, warps per program.
#: BLOCK_M must be a multiple of BLOCK_N (the causal loop's diagonal split).
TILES = (64, 64, 4)


def raw_statistics(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
    statistic: str,
    tiles: tuple[int, int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head raw statistic and visible-key count, each ``[B, H, Tq]`` float32.

    Args:
      q: ``[B, H, Tq, d]``; k: ``[B, Hkv, Tk, d]`` with ``H % Hkv == 0`` (checked by the
        caller, ``statistics.head_mean_concentration``), float dtypes, any strides.
      mask: ``None`` or bool ``[B or 1, H or 1, Tq, Tk]`` (True = visible), any strides.
      causal: with ``mask=None``, query i sees keys ``0..i`` (else every key).
      statistic: ``"entropy"`` (H in nats), ``"max"`` (max p) or ``"l2"`` (Σ p²).
      tiles: ``(BLOCK_M, BLOCK_N, num_warps)``, default :data:`TILES`.
    """
    block_m, block_n, num_warps = TILES if tiles is None else tiles
    if block_m % block_n:
        raise ParameterError(f"tiles: BLOCK_M ({block_m}) must be a multiple of BLOCK_N ({block_n})", argument="tiles")
    b, h, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    raw = torch.empty(b, h, tq, dtype=torch.float32, device=q.device)
    n = torch.empty_like(raw)
    if raw.numel() == 0:
        return raw, n
    if k.dtype != q.dtype:
        k = k.to(q.dtype)
    kernels = _kernels()
    n_m = math.ceil(tq / block_m)
    if mask is None:
        mode, m, ranges, mb, hm, mstrides = (1 if causal else 0), raw, raw, 1, 1, (0, 0, 0, 0)  # M, RANGES unused
    else:
        mode = 2
        m = mask.view(torch.uint8)
        mb, hm = m.shape[0], m.shape[1]
        mstrides = tuple(0 if m.shape[i] == 1 else m.stride(i) for i in range(4))  # type: ignore[assignment]
        ranges = torch.empty(mb * hm * n_m * 4, dtype=torch.int32, device=q.device)
        kernels.key_ranges[(mb * hm * n_m,)](
            m, ranges, *mstrides, hm, tq, tk, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps
        )
    block_d = max(16, 1 << max(0, d - 1).bit_length())
    kernels.statistics[(b * h * n_m,)](
        q, k, m, ranges, raw, n,
        *q.stride(), *k.stride(), *mstrides,
        h, mb, hm, h // hkv, tq, tk, d, float(scale),
        # Triton's interpreter (CPU tensors) gets half-precision dots wrong: it takes the
        # float32 path there, which gives the same exact products
        STAT=_CODES[statistic], MODE=mode, IEEE=q.dtype == torch.float32 or q.device.type == "cpu",
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=num_warps,
    )  # fmt: skip
    return raw, n
