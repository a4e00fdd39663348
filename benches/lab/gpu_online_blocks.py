"""GPU: the online concentration kernel's tile sizes, timed against the model's own attention.

    python benches/lab/gpu_online_blocks.py                  # B = 8, H = 16 (8 KV heads), T = 4096, d = 64, bf16
    python benches/lab/gpu_online_blocks.py 64,64,4 128,64,4 # only these (BLOCK_M, BLOCK_N, num_warps)

One layer of the ~0.5B Qwen3-style model of ``benches/gpu_probe.py``. For each
``tiles = (BLOCK_M, BLOCK_N, num_warps)`` the kernel (``hf.online.raw_statistics``) is timed with
CUDA events, median of 20 calls after 3 warm-ups, on a causal batch (no mask) and on the
boolean mask a left-padded batch makes (row 0 padded by T/8); beside it, the layer's own
attention (``F.scaled_dot_product_attention``, causal, GQA) on the same Q, K, V.
"""

from __future__ import annotations

import statistics
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

from comppo_core.hf import online


def cuda_ms(fn: Callable[[], Any], reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


SURVEY = ((64, 64, 4), (64, 64, 8), (128, 64, 4), (128, 64, 8), (64, 32, 4), (128, 32, 4), (128, 128, 8))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # optional: the tiles to survey, e.g. 64,64,4 128,64,4 (default SURVEY)
    surveyed = [tuple(int(x) for x in a.split(",")) for a in args] or list(SURVEY)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    b, h, hkv, t, d = 8, 16, 8, 4096, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, t, h, d, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(b, t, hkv, d, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
    v = torch.randn_like(k)
    i = torch.arange(t, device="cuda")
    keep = torch.ones(b, t, dtype=torch.bool, device="cuda")
    keep[0, : t // 8] = False
    mask = (i[None, :] <= i[:, None])[None, None] & keep[:, None, None, :]
    scale = d**-0.5
    sdpa = cuda_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
    sdpa_mask = cuda_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
    print(f"B={b} H={h}/{hkv} T={t} d={d} bf16; model's attention (SDPA): causal {sdpa:.3f} ms, with the padded mask {sdpa_mask:.3f} ms")
    print(f"{'BLOCK_M':>8} {'BLOCK_N':>8} {'warps':>6} {'stat':>8} {'causal ms':>10} {'/sdpa':>6} {'mask ms':>9} {'/sdpa':>6}")
    best: dict[str, tuple[float, tuple[int, int, int]]] = {}
    for tiles in surveyed:
        bm, bn, warps = tiles
        for stat in ("entropy", "max", "l2"):
            try:
                c = cuda_ms(lambda: online.raw_statistics(q, k, None, scale, True, stat, tiles))
                m = cuda_ms(lambda: online.raw_statistics(q, k, mask, scale, False, stat, tiles))
            except Exception as exc:  # noqa: BLE001 (report and go on: this is a survey)
                print(f"{bm:>8} {bn:>8} {warps:>6} {stat:>8}  failed: {exc!r}"[:300])
                continue
            print(f"{bm:>8} {bn:>8} {warps:>6} {stat:>8} {c:>10.3f} {c / sdpa:>6.2f} {m:>9.3f} {m / sdpa_mask:>6.2f}")
            if stat not in best or c + m < best[stat][0]:
                best[stat] = (c + m, tiles)
    for stat, (_, tiles) in best.items():
        print(f"best tiles for {stat} (causal + mask time): {','.join(map(str, tiles))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
