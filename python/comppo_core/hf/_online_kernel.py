"""The Triton kernels behind :mod:`comppo_core.hf.online` (imported only when they run:
importing Triton costs about half a second, and under ``TRITON_INTERPRET=1`` it must
happen after that variable is set).

Two kernels:

* :func:`key_ranges` (mask only): for each query block of each mask row and mask head,
  the smallest key range ``[lo, hi)`` holding every visible key, and the whole tiles in
  it that the block sees entirely; one read of the mask.
* :func:`statistics` : one program per (batch row, query block, head), heads adjacent so
  that the programs sharing a key head or a mask tile run together. It walks the key
  tiles of its range once (the online recursion is documented in ``online``):

  - no mask, not causal: every key tile;
  - causal: the tiles below the diagonal without a causal test, then the diagonal ones;
  - mask: the tiles of ``[lo, hi)``, with the mask tile read beside the scores except
    in the tiles seen entirely.

  No data-dependent branch sits in the loops, so Triton pipelines the key loads, and
  the tiles known to be fully visible skip every visibility test.
"""

from __future__ import annotations

import triton  # type: ignore[import-untyped]
import triton.language as tl  # type: ignore[import-untyped]


@triton.jit
def key_ranges(
    M, RANGES,  # noqa: N803
    smb, smh, smq, smk,
    HM, TQ, TK,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """``RANGES`` ``[Bm, Hm, ⌈Tq/BLOCK_M⌉, 4]`` int32 for each query block of each mask row
    and head: ``lo, hi``, the first visible key and the last + 1 (``0, 0`` if none), and
    ``flo, fhi``, a range of whole key tiles in which every key is visible from every
    query of the block (empty, ``flo = fhi``, unless such tiles exist and are contiguous):
    the statistics kernel reads no mask there. Causal masks with padding have one: the
    tiles between the padding and the diagonal."""
    n_m = tl.cdiv(TQ, BLOCK_M)
    pid = tl.program_id(0)
    bh = pid // n_m
    blk = pid % n_m
    b = (bh // HM).to(tl.int64)
    hm = (bh % HM).to(tl.int64)
    offs_m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < TQ
    rows = M + b * smb + hm * smh + offs_m[:, None].to(tl.int64) * smq
    big = 2147483647
    first = tl.full([BLOCK_M], big, tl.int32)
    last = tl.zeros([BLOCK_M], tl.int32)
    full_first = big
    full_last = 0
    full_count = 0
    for start in range(0, TK, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        ok = row_ok[:, None] & (offs_n < TK)[None, :]
        vis = (tl.load(rows + offs_n[None, :].to(tl.int64) * smk, mask=ok, other=0) != 0) & ok
        first = tl.minimum(first, tl.min(tl.where(vis, offs_n[None, :], big), 1))
        last = tl.maximum(last, tl.max(tl.where(vis, offs_n[None, :] + 1, 0), 1))
        # every key of the tile exists and is visible from every query of the block
        whole = (tl.min(tl.where(row_ok[:, None], vis, 1).to(tl.int32)) > 0) & (start + BLOCK_N <= TK)
        full_first = tl.minimum(full_first, tl.where(whole, start, big))
        full_last = tl.maximum(full_last, tl.where(whole, start + BLOCK_N, 0))
        full_count += whole.to(tl.int32)
    hi = tl.max(last, 0)
    lo = tl.where(hi > 0, tl.min(first, 0), 0)
    lo_tile = lo - lo % BLOCK_N
    contiguous = (full_count > 0) & (full_count * BLOCK_N == full_last - full_first)
    flo = tl.where(contiguous, full_first, lo_tile)
    fhi = tl.where(contiguous, full_last, lo_tile)
    tl.store(RANGES + 4 * pid, lo)
    tl.store(RANGES + 4 * pid + 1, hi)
    tl.store(RANGES + 4 * pid + 2, flo)
    tl.store(RANGES + 4 * pid + 3, fhi)


@triton.jit
def _tile(
    q, k_base, m_rows, offs_m, start, row_ok,
    TK, D, skt, skd, smk, scale,
    m_i, l_i, u_i, q2_i, n_i,
    STAT: tl.constexpr, VIS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One key tile of the online recursion. ``VIS``: which keys of the tile are visible:
    0 all (the caller guarantees ``start + BLOCK_N <= TK``, and rows past ``TQ`` are never
    stored), 1 causal and ``< TK``, 2 the mask tile, 3 ``< TK``.

    A non-finite score at a visible key makes ``l`` NaN: a NaN score's ``e`` is NaN (or,
    if the maximum takes it, every ``e``), and +inf gives ``exp(inf − inf)``; a −inf score
    is a zero probability, as in the chunked method."""
    offs_n = start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    key_ok = offs_n < TK
    k = tl.load(
        k_base + offs_n[:, None].to(tl.int64) * skt + offs_d[None, :] * skd,
        mask=key_ok[:, None] & (offs_d < D)[None, :],
        other=0.0,
    )
    if IEEE:  # float32 inputs (or the interpreter's float32 copy): no TF32
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = s * scale
    if VIS != 0:
        vis = row_ok[:, None] & key_ok[None, :]
        if VIS == 1:
            vis = vis & (offs_n[None, :] <= offs_m[:, None])
        if VIS == 2:
            tile = tl.load(m_rows + offs_n[None, :].to(tl.int64) * smk, mask=vis, other=0)
            vis = vis & (tile != 0)
            n_i += tl.sum(vis.to(tl.int32), 1)
        s = tl.where(vis, s, -float("inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)  # 0 while no key was seen (m_i = −inf)
    t = s - m_safe[:, None]  # ≤ 0; −inf where not visible
    e = tl.exp(t)
    if STAT == 0:
        m_prev = tl.where(l_i > 0, m_i, m_safe)  # m_i = −inf only while l_i = 0
        if VIS != 0:  # e = 0 there; the clamp keeps 0·(−inf) out (exp(−200) is 0 in float32)
            t = tl.maximum(t, -200.0)
        u_i = alpha * (u_i + l_i * (m_prev - m_safe)) + tl.sum(e * t, 1)
    if STAT == 2:
        q2_i = alpha * alpha * q2_i + tl.sum(e * e, 1)
    l_i = alpha * l_i + tl.sum(e, 1)
    return m_new, l_i, u_i, q2_i, n_i


@triton.jit
def statistics(
    Q, K, M, RANGES, RAW, N,  # noqa: N803
    sqb, sqh, sqt, sqd,
    skb, skh, skt, skd,
    smb, smh, smq, smk,
    H, MB, HM, GROUP, TQ, TK, D, scale,
    STAT: tl.constexpr, MODE: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """``RAW``, ``N`` ``[B, H, Tq]`` float32. ``MODE``: 0 every key, 1 causal, 2 mask."""
    n_m = tl.cdiv(TQ, BLOCK_M)
    pid = tl.program_id(0)
    h = pid % H
    rest = pid // H
    blk = n_m - 1 - rest % n_m  # the longest causal rows first
    b = rest // n_m
    hk = (h // GROUP).to(tl.int64)
    b64 = b.to(tl.int64)
    offs_m = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < TQ
    q = tl.load(
        Q + b64 * sqb + h.to(tl.int64) * sqh + offs_m[:, None].to(tl.int64) * sqt + offs_d[None, :] * sqd,
        mask=row_ok[:, None] & (offs_d < D)[None, :],
        other=0.0,
    )
    if IEEE:
        q = q.to(tl.float32)
    k_base = K + b64 * skb + hk * skh
    m_rows = M + b64 * smb + h.to(tl.int64) * smh + offs_m[:, None].to(tl.int64) * smq  # stride 0: broadcast

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    u_i = tl.zeros([BLOCK_M], tl.float32)
    q2_i = tl.zeros([BLOCK_M], tl.float32)
    n_i = tl.zeros([BLOCK_M], tl.int32)
    # Three runs of key tiles [a0, a1), [a1, a2), [a2, a3), each with its own visibility
    # test (VIS of _tile), chosen by MODE at compile time:
    #   MODE 0 (every key)  whole tiles [0, full) with none, then the ragged tile with "< TK"
    #   MODE 1 (causal)     tiles before the block's first query with none (BLOCK_M is a
    #                       multiple of BLOCK_N), then the diagonal tiles with the causal test
    #   MODE 2 (mask)       the mask at the edges of the visible range [lo, hi), none in the
    #                       tiles every query of the block sees entirely [flo, fhi)
    full = TK - TK % BLOCK_N  # key tiles [0, full) hold no key past TK
    if MODE == 0:
        a0, a1, a2, a3 = 0, full, TK, TK
        n_i = n_i + TK
    elif MODE == 1:
        a0 = 0
        a1 = tl.minimum(blk * BLOCK_M, full)
        a2 = tl.minimum(TK, (blk + 1) * BLOCK_M)
        a3 = a2
        n_i = tl.minimum(offs_m + 1, TK)
    else:
        r = 4 * (((b % MB) * HM + h % HM) * n_m + blk)  # the mask's batch row and head (1 or all)
        lo = tl.load(RANGES + r)
        a0, a1, a2, a3 = lo - lo % BLOCK_N, tl.load(RANGES + r + 2), tl.load(RANGES + r + 3), tl.load(RANGES + r + 1)
        n_i = n_i + (a2 - a1)  # the entirely seen tiles' keys; _tile counts the others
    for start in range(a0, a1, BLOCK_N):
        m_i, l_i, u_i, q2_i, n_i = _tile(
            q, k_base, m_rows, offs_m, start, row_ok, TK, D, skt, skd, smk, scale,
            m_i, l_i, u_i, q2_i, n_i, STAT, 2 if MODE == 2 else 0, IEEE, BLOCK_N, BLOCK_D,
        )  # fmt: skip
    for start in range(a1, a2, BLOCK_N):
        m_i, l_i, u_i, q2_i, n_i = _tile(
            q, k_base, m_rows, offs_m, start, row_ok, TK, D, skt, skd, smk, scale,
            m_i, l_i, u_i, q2_i, n_i, STAT, 3 if MODE == 0 else (1 if MODE == 1 else 0), IEEE, BLOCK_N, BLOCK_D,
        )  # fmt: skip
    for start in range(a2, a3, BLOCK_N):
        m_i, l_i, u_i, q2_i, n_i = _tile(
            q, k_base, m_rows, offs_m, start, row_ok, TK, D, skt, skd, smk, scale,
            m_i, l_i, u_i, q2_i, n_i, STAT, 2, IEEE, BLOCK_N, BLOCK_D,
        )  # fmt: skip

    l_safe = tl.where(l_i > 0, l_i, 1.0)
    if STAT == 0:
        raw = tl.log(l_safe) - u_i / l_safe
    elif STAT == 1:
        raw = 1.0 / l_safe
    else:
        raw = q2_i / (l_safe * l_safe)
    raw = tl.where(l_i == l_i, raw, float("nan"))  # l is NaN: a non-finite score
    out = (b64 * H + h) * TQ + offs_m
    tl.store(RAW + out, raw, mask=row_ok)
    tl.store(N + out, n_i.to(tl.float32), mask=row_ok)
