"""Attention concentration of one attention layer, without an ``O(T²)`` tensor (docs/design.md §7).

For query t of sequence b and head h, with attention distribution ``p`` over the ``n_t``
keys it may see (causal ∩ not padding ∩ sliding window, i.e. the layer's attention
mask) and scores ``s_k = scale·⟨q_t, k_k⟩``::

    LSE       = log Σ_k exp(s_k)                        (visible keys only)
    p_k       = exp(s_k − LSE)
    "entropy":  1 − H(p)/log(n_t),   H(p) = −Σ_k p_k log p_k = LSE − Σ_k p_k s_k
                (n_t = 1 → 1: a single visible key is a fully concentrated head)
    "max":      max_k p_k            = exp(max_k s_k − LSE)
    "l2":       Σ_k p_k²             = exp(LSE₂ − 2·LSE),   LSE₂ = log Σ_k exp(2·s_k)

:func:`head_mean_concentration` returns the mean over heads, ``[B, Tq]`` float32, and 0
for a query that sees no key. Two exact methods:

* ``"fused"`` (``"entropy"`` and ``"l2"``, CPU and CUDA): an attention kernel that
  returns its log-sum-exp (``_scaled_dot_product_flash_attention_for_cpu`` on CPU;
  ``_scaled_dot_product_efficient_attention`` on CUDA, or FlashAttention-2's
  ``_scaled_dot_product_flash_attention`` for a half-precision pass without a mask).
  Entropy uses one pass with values := centred keys::

      o_t = Σ_k p_k (k_k − k̄) = Attn(Q, K, V := K − k̄)      (k̄: any fixed vector; the key mean)
      H_t = LSE_t − scale·⟨q_t, o_t⟩ − scale·⟨q_t, k̄⟩

  (centring shrinks the two terms whose difference is H, so less cancellation); ``l2``
  uses two passes, at scale and at 2·scale. The kernels never materialise the scores.
  ``precision="float32"`` (default, as docs/design.md §7 asks) runs the pass on float32 copies
  of Q and K whatever the model's dtype; ``precision="model"`` runs it in the model's
  dtype (bfloat16: the GPU's fast kernels, at bfloat16 accuracy for ``o``). LSE and the
  final combination are float32 either way.
* ``"chunked"`` (every statistic, any device, always float32): queries in chunks of
  ``C`` rows, the chunk's scores ``[B, H, C, hi − lo]``, where ``[lo, hi)`` ⊆ ``[0, Tk)``
  is the smallest key range holding every key visible from the chunk (so a causal mask
  halves the work and a sliding window bounds it by ``C + window``).

* ``"online"`` (every statistic, CUDA with Triton): one pass of a Triton kernel over the
  scores, keeping FlashAttention-style running sums in float32 (``hf.online``); the
  scores are the exact products of the model's Q and K, accumulated in float32, and no
  ``V := K`` pass is needed (``H = log l − u/l``, nothing cancels). About the cost of the
  model's own attention kernel, where the fused float32 pass costs several times it.

``"auto"`` picks online on CUDA when Triton is installed; otherwise fused for entropy and
l2 on CPU and CUDA, chunked for ``"max"`` (which has no log-sum-exp form).

Kernel fallbacks (process-wide, keyed by ``(device type, device index, dtype of the
pass, head_dim)``, since kernel support depends on all four):

* If the fused kernel raises a ``RuntimeError`` under ``"auto"`` (e.g. no kernel for that
  GPU, dtype or head size), a ``RuntimeWarning`` is issued first, and only then is the key
  added to the fallback cache; that call and later ones with the same key use the chunked
  method (same values). Under ``-W error`` the warning is raised and the cache is left
  untouched, so every call fails visibly. ``method="fused"`` never falls back.
* The online kernel likewise, under ``"auto"``: if it raises (a Triton compile or launch
  error), the warning comes first, then the key is cached and the fused/chunked choice
  above is taken. ``method="online"`` never falls back.
* Out-of-memory errors (``torch.OutOfMemoryError``) and device errors
  (``torch.AcceleratorError``, or an older torch's ``RuntimeError`` whose message says
  "CUDA error") are re-raised, never turned into a fallback: a fallback that allocates
  more, or runs on a device in an undefined state, would hide the real failure.
* On CUDA, FlashAttention-2 (half precision, no mask, head_dim ≤ 256) falls back to the
  memory-efficient kernel the same way: warned once per key, then cached; fatal errors
  are re-raised.

Non-finite values: a query that sees no key (``n_t = 0``, e.g. a left-padded query) gets
0. Every other query's value is computed, never hidden: non-finite queries or keys give
NaN there (a ±inf statistic becomes NaN, so clipping to [0, 1] cannot turn it into a
plausible 0 or 1). :class:`~comppo_core.hf.ConcentrationProbe` raises
:class:`~comppo_core.errors.NonFiniteError` when that happens at a real token.

Memory: the query chunk ``C`` is at most ``query_chunk`` (default
:data:`DEFAULT_QUERY_CHUNK`) whatever ``T``, so the transient memory is
``O(B·H·C·T)`` (chunked) or ``O(B·C·T + B·H·T·d)`` (fused: a mask bias per chunk plus
copies of Q and K), linear in ``T``: never a ``T × T`` tensor. With no mask (a causal
batch without padding) the fused method runs one kernel call on the whole sequence.
Visible-key counts ``n_t`` and key ranges are read from the boolean mask chunk by chunk.

Packed rows: transformers' mask of a packed row is block-diagonal (causal within each
sequence), so every method, the online kernel's mask mode included, sees and counts a
query's own sequence's keys only (``n_t`` ≤ its position in its sequence + 1; fewer under a
sliding window), and each sequence's statistics are those of its own forward.
"""

from __future__ import annotations

import math
import warnings

import torch

from ..errors import ParameterError
from ..options import PRECISIONS, STATISTIC_METHODS, STATISTICS, check_choice
from . import online

__all__ = [
    "DEFAULT_QUERY_CHUNK",
    "METHODS",
    "PRECISIONS",
    "STATISTICS",
    "check_method",
    "check_precision",
    "check_statistic",
    "head_mean_concentration",
]

#: The statistics, the ways to compute them and the fused pass's dtypes: :mod:`comppo_core.options`.
METHODS = STATISTIC_METHODS
#: Largest number of query rows whose scores (chunked) or mask bias (fused) exist at once.
DEFAULT_QUERY_CHUNK = 256
#: Cap on the elements of one chunk's float32 score block ``[B, H, C, K]`` (chunked method):
#: C shrinks below ``query_chunk`` when ``B·H·C·K`` would exceed it (at least one row).
CHUNK_ELEMENTS = 1 << 25

_FUSED_STATISTICS = ("entropy", "l2")
#: The fused pass works on at most this fraction of the batch at once (1/8: one row at a
#: time up to B = 8), and on fewer rows when their float32 copies of Q, K and V would
#: exceed :data:`FUSED_COPY_BYTES`. Its copies are repeated to every query head, so for
#: the whole batch they can outgrow the model's own activations of that layer and raise
#: the forward's peak memory (measured on a bfloat16 model on CPU: 1.20–1.23× the peak
#: without the probe for the whole batch at once, 1.00× one row at a time).
FUSED_BATCH_SLICES = 8
FUSED_COPY_BYTES = 64 << 20

#: ``(device type, device index, dtype, head_dim)``: what decides whether a kernel runs.
CapabilityKey = tuple[str, int | None, torch.dtype, int]
#: Keys on which the fused kernel failed under ``method="auto"``: chunked from then on.
_FUSED_BROKEN: set[CapabilityKey] = set()
#: Keys on which FlashAttention-2 failed (CUDA): the memory-efficient kernel from then on.
_FLASH_BROKEN: set[CapabilityKey] = set()
#: Keys on which the online kernel failed under ``method="auto"``: fused or chunked from then on.
_ONLINE_BROKEN: set[CapabilityKey] = set()
#: Device types on which ``method="auto"`` takes the online kernel.
_ONLINE_DEVICES = ("cuda",)


def _capability_key(t: torch.Tensor, dtype: torch.dtype) -> CapabilityKey:
    """The fallback caches' key of a pass over ``t`` (``[..., d]``) run in ``dtype``."""
    return (t.device.type, t.device.index, dtype, int(t.shape[-1]))


def _describe(key: CapabilityKey) -> str:
    dev_type, index, dtype, head_dim = key
    dev = dev_type if index is None else f"{dev_type}:{index}"
    return f"{dev}, {str(dtype).replace('torch.', '')}, head_dim {head_dim}"


def _fatal_types() -> tuple[type, ...]:
    names = ("OutOfMemoryError", "AcceleratorError")
    return tuple(t for t in (getattr(torch, n, None) for n in names) if isinstance(t, type))


_FATAL = _fatal_types()


def _is_fatal(exc: BaseException) -> bool:
    """Whether a kernel failure must propagate rather than trigger a fallback: out of
    memory, or a device error (the device may be left in an undefined state)."""
    if isinstance(exc, _FATAL):
        return True
    msg = str(exc)
    return "CUDA error" in msg or "CUDA out of memory" in msg  # older torch: plain RuntimeError


def _fall_back(cache: set[CapabilityKey], key: CapabilityKey, failed: str, why: str, instead: str) -> None:
    """A kernel failed under ``method="auto"``: warn, then add ``key`` to the fallback
    ``cache``. Warn first, cache second: under ``-W error`` the warning is raised here, the
    cache stays untouched, and the next call fails the same way instead of silently
    taking the fallback. The warning points at the caller of the function that calls this
    one, where each site's own ``warnings.warn(..., stacklevel=2)`` used to point."""
    warnings.warn(
        f"comppo_core.hf: {failed} failed on {_describe(key)} ({why}); {instead} for this device, dtype and "
        "head_dim from now on",
        RuntimeWarning,
        stacklevel=3,
    )
    cache.add(key)


def check_statistic(statistic: object) -> str:
    """``statistic`` if it is one of :data:`STATISTICS`, else a :class:`ParameterError`."""
    return check_choice("statistic", statistic, STATISTICS)


def check_method(method: object, statistic: str) -> str:
    """``method`` if it is one of :data:`METHODS` and can compute ``statistic``."""
    method = check_choice("method", method, METHODS)
    if method == "online" and not online.available():
        raise ParameterError(
            "method: 'online' needs Triton, which is not installed; use method='auto'", argument="method"
        )
    if method == "fused" and statistic not in _FUSED_STATISTICS:
        raise ParameterError(
            f"method: 'fused' computes {' and '.join(map(repr, _FUSED_STATISTICS))} only, got statistic={statistic!r}; "
            "use method='chunked' or 'auto'",
            argument="method",
        )
    return method


def check_precision(precision: object) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else a :class:`ParameterError`."""
    return check_choice("precision", precision, PRECISIONS)


def _check_chunk(query_chunk: object) -> int:
    if isinstance(query_chunk, bool) or not isinstance(query_chunk, int) or query_chunk < 1:
        raise ParameterError(f"query_chunk: expected an integer >= 1, got {query_chunk!r}", argument="query_chunk")
    return query_chunk


# --------------------------------------------------------------------------- #
# Key ranges and visible-key counts, one query chunk at a time
# --------------------------------------------------------------------------- #


def _key_range(vis: torch.Tensor | None, q0: int, q1: int, tk: int, causal: bool) -> tuple[int, int]:
    """Smallest ``[lo, hi)`` holding every key visible from queries ``q0..q1-1``."""
    if vis is None:
        return (0, min(q1, tk)) if causal else (0, tk)
    cols = vis.any(dim=2).any(dim=1).any(dim=0)  # [K]
    idx = torch.nonzero(cols).flatten()
    if idx.numel() == 0:
        return (0, 0)
    return int(idx[0]), int(idx[-1]) + 1


def _causal_block(q0: int, q1: int, lo: int, hi: int, device: torch.device) -> torch.Tensor:
    """``[C, K]`` bool: key ``lo + j`` is visible from query ``q0 + i`` iff ``lo + j <= q0 + i``."""
    qi = torch.arange(q0, q1, device=device)[:, None]
    kj = torch.arange(lo, hi, device=device)[None, :]
    return kj <= qi


def _counts(vis: torch.Tensor | None, q0: int, q1: int, tk: int, causal: bool, device: torch.device) -> torch.Tensor:
    """Visible keys per query of the chunk, float32, broadcastable to ``[B, H, C]``."""
    if vis is None:
        if causal:
            return torch.arange(q0 + 1, q1 + 1, device=device, dtype=torch.float32).clamp_(max=tk)
        return torch.full((q1 - q0,), float(tk), device=device, dtype=torch.float32)
    return vis.sum(dim=-1, dtype=torch.float32)  # [Bm, Hm, C]


def _normalize(stat: torch.Tensor, n: torch.Tensor, statistic: str) -> torch.Tensor:
    """Per-head raw statistic (entropy in nats, max p, Σp²) → concentration in [0, 1].

    ``n_t = 0`` (no visible key) → 0, whatever the kernel left there. Otherwise a finite
    value is clipped to [0, 1] (rounding) and a non-finite one becomes NaN: never 0, and
    never clipped to 0 or 1. ``n_t = 1`` → 1 (``1 + 0·stat``, so a non-finite stat stays
    visible)."""
    n = torch.broadcast_to(n, stat.shape)
    if statistic == "entropy":
        log_n = torch.log(n.clamp(min=2.0))
        conc = torch.where(n > 1.5, 1.0 - stat / log_n, 1.0 + 0.0 * stat)
    else:
        conc = stat
    conc = torch.where(torch.isfinite(conc), conc.clamp(0.0, 1.0), torch.full_like(conc, math.nan))
    return torch.where(n > 0.5, conc, torch.zeros_like(conc))


# --------------------------------------------------------------------------- #
# Chunked: the chunk's scores in float32
# --------------------------------------------------------------------------- #


def _grouped_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale·q kᵀ`` ``[B, H, C, K]`` for ``q`` ``[B, H, C, d]``, ``k`` ``[B, Hkv, K, d]``
    (GQA: query heads ``g·r .. g·r + r − 1`` read key head g), without repeating K."""
    b, h, c, d = q.shape
    hkv = k.shape[1]
    r = h // hkv
    qg = q.reshape(b, hkv, r * c, d)
    s = torch.matmul(qg, k.transpose(-1, -2))  # [B, Hkv, r·C, K]
    s = s.view(b, h, c, k.shape[2])
    return s.mul_(scale)


def _chunk_statistic(s: torch.Tensor, statistic: str) -> torch.Tensor:
    """Per-head raw statistic from masked float32 scores (−inf = not visible), ``[B, H, C]``.
    ``s`` is overwritten."""
    lse = torch.logsumexp(s, dim=-1)
    # −inf only on a row with no visible key (its value is zeroed later); NaN or +inf
    # (non-finite scores) are kept so that they reach the result
    lse = lse.masked_fill(lse == -math.inf, 0.0)
    if statistic == "max":
        return torch.exp(s.amax(dim=-1) - lse)
    if statistic == "l2":
        lse2 = torch.logsumexp(s.mul_(2.0), dim=-1)
        return torch.exp(lse2 - 2.0 * lse)
    # entropy: H = −Σ p log p
    logp = s.sub_(lse.unsqueeze(-1))  # log p, −inf where not visible
    p = torch.exp(logp)
    logp.masked_fill_(logp == -math.inf, 0.0)  # p = 0 there: 0·log 0 = 0 (a NaN stays NaN)
    return -(p.mul_(logp)).sum(dim=-1)


def _chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
    statistic: str,
    query_chunk: int,
) -> torch.Tensor:
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    out = torch.zeros(b, tq, dtype=torch.float32, device=q.device)
    rows = max(1, min(query_chunk, CHUNK_ELEMENTS // max(1, b * h * tk)))
    k32 = k if k.dtype == torch.float32 else k.float()
    for q0 in range(0, tq, rows):
        q1 = min(tq, q0 + rows)
        vis = None if mask is None else mask[:, :, q0:q1, :]
        lo, hi = _key_range(vis, q0, q1, tk, causal)
        if hi <= lo:
            continue
        vis_c = None if vis is None else vis[..., lo:hi]
        s = _grouped_scores(q[:, :, q0:q1].float(), k32[:, :, lo:hi], scale)
        if vis_c is not None:
            s.masked_fill_(~vis_c, -math.inf)
        elif causal:
            s.masked_fill_(~_causal_block(q0, q1, lo, hi, q.device), -math.inf)
        raw = _chunk_statistic(s, statistic)
        del s
        n = _counts(vis_c, q0, q1, tk, causal, q.device)
        out[:, q0:q1] = _normalize(raw, n, statistic).mean(dim=1)
    return out


# --------------------------------------------------------------------------- #
# Fused: an attention kernel that returns its log-sum-exp
# --------------------------------------------------------------------------- #


def _lse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Attn(q, k, v), LSE)`` with an additive float bias or an upper-left causal mask.

    LSE is float32 ``[B, H, Tq]`` (natural log of the scaled scores' exp-sum)."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=bias, scale=scale
        )
        return out, lse
    if q.device.type == "cuda":
        return _cuda_lse_attention(q, k, v, bias, causal, scale)
    raise RuntimeError(f"no fused attention kernel with log-sum-exp on {q.device.type}")


def _flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """CUDA FlashAttention-2: half precision, head_dim ≤ 256, causal or full, no bias."""
    res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return res[0], res[1]


def _efficient_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """CUDA memory-efficient attention (any float dtype, optional additive bias)."""
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, 0.0, causal, scale=scale
    )
    return out, lse[..., : q.shape[2]]  # the kernel pads LSE's length to a multiple of 32


def _cuda_lse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2 where it applies and has not failed for this key, else the
    memory-efficient kernel. A non-fatal FlashAttention-2 failure warns, then is cached
    (so it is neither retried nor silently swallowed on every call); out-of-memory and
    device errors propagate."""
    if bias is None and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
        key = _capability_key(q, q.dtype)
        if key not in _FLASH_BROKEN:
            try:
                return _flash_attention(q, k, v, causal, scale)
            except RuntimeError as exc:
                if _is_fatal(exc):
                    raise
                _fall_back(
                    _FLASH_BROKEN, key, "FlashAttention-2", str(exc), "using the memory-efficient attention kernel"
                )
    return _efficient_attention(q, k, v, bias, causal, scale)


def _bias_chunk(vis: torch.Tensor, b: int, h: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive bias ``[B, H, C, K]`` (a broadcast view; 0 visible, −inf not) from a bool
    mask chunk. Stored with its last dimension padded to a multiple of 16 (the alignment
    CUDA's memory-efficient kernel wants), then sliced."""
    bm, hm, c, kk = vis.shape
    padded = -(-kk // 16) * 16
    store = torch.empty(bm, hm, c, padded, dtype=dtype, device=vis.device)
    bias = store[..., :kk]
    bias.zero_().masked_fill_(~vis, -math.inf)
    return bias.expand(b, h, c, kk)


def _repeat_heads(k: torch.Tensor, h: int) -> torch.Tensor:
    b, hkv, t, d = k.shape
    if hkv == h:
        return k
    return k[:, :, None].expand(b, hkv, h // hkv, t, d).reshape(b, h, t, d)


def _fused(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
    statistic: str,
    query_chunk: int,
    precision: str,
) -> torch.Tensor:
    """The fused statistic, ``[B, Tq]``, computed a slice of batch rows at a time (see
    :data:`FUSED_BATCH_SLICES`); each row's value does not depend on the slicing."""
    b, h, tq, d = q.shape
    if tq == 0 or k.shape[2] == 0:
        # nothing to attend (or no query): the chunked loop returns the zeros without
        # calling an attention kernel (torch's CPU kernel faults on an empty query)
        return _chunked(q, k, mask, scale, causal, statistic, query_chunk)
    per_row = 3 * h * max(tq, k.shape[2]) * d * 4
    rows = max(1, min(-(-b // FUSED_BATCH_SLICES), FUSED_COPY_BYTES // per_row))
    if rows >= b:
        return _fused_rows(q, k, mask, scale, causal, statistic, query_chunk, precision)
    parts = []
    for r0 in range(0, b, rows):
        r1 = min(b, r0 + rows)
        m = mask if mask is None or mask.shape[0] == 1 else mask[r0:r1]
        parts.append(_fused_rows(q[r0:r1], k[r0:r1], m, scale, causal, statistic, query_chunk, precision))
    return torch.cat(parts)


def _fused_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
    statistic: str,
    query_chunk: int,
    precision: str,
) -> torch.Tensor:
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    dtype = torch.float32 if precision == "float32" else q.dtype
    k32 = k.float()
    center = k32.mean(dim=2, keepdim=True)  # [B, Hkv, 1, d]: k̄, per key head
    qk = q.to(dtype).contiguous()
    kk = _repeat_heads(k.to(dtype), h).contiguous()
    vv = _repeat_heads((k32 - center).to(dtype), h).contiguous() if statistic == "entropy" else kk
    del k32
    q_center = (q.float() * _repeat_heads(center, h)).sum(dim=-1)  # ⟨q_t, k̄⟩, [B, H, Tq]

    def raw_statistic(
        qc: torch.Tensor,
        kc: torch.Tensor,
        vc: torch.Tensor,
        bias: torch.Tensor | None,
        qcen: torch.Tensor,
        is_causal: bool,
    ) -> torch.Tensor:
        o, lse = _lse_attention(qc, kc, vc, bias, is_causal, scale)
        lse = lse.float()
        if statistic == "entropy":
            # H = LSE − scale·⟨q, o + k̄⟩ with o = Attn(Q, K, K − k̄)
            return lse - scale * (torch.einsum("bhcd,bhcd->bhc", qc.float(), o.float()) + qcen)
        _, lse2 = _lse_attention(qc, kc, vc, bias, is_causal, 2.0 * scale)
        raw = torch.exp(lse2.float() - 2.0 * lse)  # Σ p² = exp(LSE₂ − 2·LSE)
        # torch's CPU kernel (2.15) returns LSE = 0 for a query holding a NaN, which would
        # read as Σ p² = 1: a non-finite query must give NaN (entropy gets it from ⟨q, ·⟩)
        return raw.masked_fill_(~torch.isfinite(qc).all(dim=-1), math.nan)

    if mask is None:
        raw = raw_statistic(qk, kk, vv, None, q_center, causal and tq > 1)
        n = _counts(None, 0, tq, tk, causal, q.device)
        return _normalize(raw, n, statistic).mean(dim=1)

    out = torch.zeros(b, tq, dtype=torch.float32, device=q.device)
    rows = max(1, min(query_chunk, CHUNK_ELEMENTS // max(1, b * tk)))
    for q0 in range(0, tq, rows):
        q1 = min(tq, q0 + rows)
        vis = mask[:, :, q0:q1, :]
        lo, hi = _key_range(vis, q0, q1, tk, causal)
        if hi <= lo:
            continue
        vis_c = vis[..., lo:hi]
        bias = _bias_chunk(vis_c, b, h, dtype)
        raw = raw_statistic(qk[:, :, q0:q1], kk[:, :, lo:hi], vv[:, :, lo:hi], bias, q_center[:, :, q0:q1], False)
        del bias
        n = _counts(vis_c, q0, q1, tk, causal, q.device)
        out[:, q0:q1] = _normalize(raw, n, statistic).mean(dim=1)
    return out


# --------------------------------------------------------------------------- #
# Entry point
# --------------------------------------------------------------------------- #


def head_mean_concentration(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    scale: float | None = None,
    is_causal: bool = True,
    statistic: str = "entropy",
    method: str = "auto",
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    precision: str = "float32",
) -> torch.Tensor:
    """Head-mean attention concentration of one layer, ``[B, Tq]`` float32.

    Args:
      query: ``[B, H, Tq, d]`` queries (any float dtype; computed in float32).
      key: ``[B, Hkv, Tk, d]`` keys, ``H % Hkv == 0`` (grouped-query attention: query
        head h reads key head ``h // (H / Hkv)``, as transformers' ``repeat_kv``).
      mask: ``None`` or a bool ``[B or 1, H or 1, Tq, Tk]`` visibility mask (True = the
        query may attend to the key), e.g. transformers' ``sdpa_mask`` output.
      scale: score scale (default ``1/sqrt(d)``, as SDPA).
      is_causal: with ``mask=None``, whether query i sees keys ``0..i`` (upper-left
        aligned, as SDPA's ``is_causal``) or every key.
      statistic: ``"entropy"``, ``"max"`` or ``"l2"`` (see the module docstring).
      method: ``"auto"`` (online on CUDA with Triton; else fused for entropy and l2 on
        CPU and CUDA, chunked otherwise), ``"online"``, ``"fused"`` or ``"chunked"``.
      query_chunk: most query rows processed at once (bounds the transient memory).
      precision: ``"float32"`` (default: the fused kernel runs on float32 copies of Q and
        K) or ``"model"`` (the fused kernel runs in the inputs' dtype, e.g. bfloat16, on
        the GPU's half-precision kernels; LSE and the final combination stay float32).
        The chunked and online methods are always float32 (and ignore it).

    Returns:
      ``[B, Tq]`` float32: each query's statistic averaged over the H heads, 0 for a query
      that sees no key, NaN for a query that sees keys but whose statistic is not finite
      (non-finite queries or keys; never hidden as 0).

    Raises:
      ParameterError: a bad argument or shape.
      RuntimeError: ``method="fused"`` or ``"online"`` and the kernel failed (a Triton
        compile error may be another ``Exception``); out-of-memory and device errors with
        any method (see the module docstring for the ``"auto"`` fallback).
    """
    statistic = check_statistic(statistic)
    method = check_method(method, statistic)
    query_chunk = _check_chunk(query_chunk)
    precision = check_precision(precision)
    if query.dim() != 4 or key.dim() != 4:
        raise ParameterError(
            f"query, key: expected 4-D [B, H, T, d] tensors, got {tuple(query.shape)} and {tuple(key.shape)}",
            argument="query",
        )
    b, h, tq, d = query.shape
    if key.shape[0] != b or key.shape[3] != d or h % key.shape[1] != 0:
        raise ParameterError(
            f"key: expected [{b}, Hkv, Tk, {d}] with {h} % Hkv == 0, got {tuple(key.shape)}", argument="key"
        )
    tk = key.shape[2]
    if mask is not None:
        if mask.dtype != torch.bool:
            raise ParameterError(f"mask: expected a bool tensor, got {mask.dtype}", argument="mask")
        if mask.dim() != 4 or mask.shape[-2:] != (tq, tk) or mask.shape[0] not in (1, b) or mask.shape[1] not in (1, h):
            raise ParameterError(
                f"mask: expected [{b} or 1, {h} or 1, {tq}, {tk}], got {tuple(mask.shape)}", argument="mask"
            )
    scale_ = 1.0 / math.sqrt(d) if scale is None else float(scale)
    causal = bool(is_causal) and mask is None
    if causal and tk > tq:
        key = key[:, :, :tq]  # upper-left causal: query i sees keys 0..i only

    if method == "online" and query.device.type != "cuda" and not online.interpreting():
        raise ParameterError(
            f"method: 'online' runs on CUDA tensors only, got {query.device.type}; use method='auto'", argument="method"
        )
    online_key = _capability_key(query, query.dtype)
    use_online = method == "online" or (
        method == "auto"
        and query.device.type in _ONLINE_DEVICES
        and online.available()
        and online_key not in _ONLINE_BROKEN
    )
    if use_online:
        try:
            raw, n = online.raw_statistics(query, key, mask, scale_, causal, statistic)
            return _normalize(raw, n, statistic).mean(dim=1)
        except Exception as exc:  # a Triton compile error is not a RuntimeError
            if method == "online" or _is_fatal(exc):
                raise
            _fall_back(
                _ONLINE_BROKEN, online_key, "the online (Triton) kernel", repr(exc), "using the fused or chunked method"
            )

    capability = _capability_key(query, torch.float32 if precision == "float32" else query.dtype)
    use_fused = method == "fused" or (
        method == "auto"
        and statistic in _FUSED_STATISTICS
        and query.device.type in ("cpu", "cuda")
        and capability not in _FUSED_BROKEN
    )
    if use_fused:
        try:
            return _fused(query, key, mask, scale_, causal, statistic, query_chunk, precision)
        except RuntimeError as exc:
            if method == "fused" or _is_fatal(exc):
                raise
            _fall_back(
                _FUSED_BROKEN,
                capability,
                "the fused attention kernel",
                str(exc),
                "computing the statistic with the exact chunked method",
            )
    return _chunked(query, key, mask, scale_, causal, statistic, query_chunk)
