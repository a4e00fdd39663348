"""CPU benchmark: a forward pass with the attention concentration probe on vs off.

Run:  python benches/probe.py                 (T = 512 and 2048; needs the [hf] extra)
      python benches/probe.py --quick         (fewer rounds)
      python benches/probe.py --threads 1     (one intra-op thread: steadier on a busy machine)

Model: a tiny Llama-style causal LM from a config (random weights, float32): hidden 128,
4 layers, 4 heads / 2 KV heads, intermediate 256, vocab 512. Batch B = 2; row 0 left-
padded by T/8 tokens (so the model builds a boolean mask), row 1 unpadded; a second
variant runs without padding (no mask: SDPA's is_causal path, and the probe's fused
kernel on the whole sequence).

Columns, per T and variant, for each statistic:

    time     median forward time (torch.no_grad, use_cache=False) with the probe on,
             divided by the median with it off; rounds are interleaved (off, on, off,
             on, ...) so that load on a shared machine hits both alike
    peak     peak bytes allocated during the forward (every CPU allocation, kernel
             workspaces included, through torch.profiler's memory events), probe on
             divided by probe off
    probe    the largest transient the probe itself allocates inside one layer's
             statistic computation (same profiler, inside the probe's record_function
             range), in MiB, and divided by the B·T·4 bytes of one [B, T] float32 row
             of the result, to show it is linear in T (a T×T float32 block per layer
             would be 4·B·H·T² bytes)

"entropy" and "l2" use the fused kernel (CPU flash attention with log-sum-exp, float32),
"max" the chunked method (256-query score blocks). Timing noise on a shared machine is
real: compare ratios, not bare times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

try:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from comppo_core import hf
    from comppo_core.hf._memory import STATISTIC_RANGE, peak_memory
except ImportError as exc:  # pragma: no cover
    sys.exit(f"benches/probe.py needs the [hf] extra (torch, transformers): {exc}")


def build() -> Any:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    return LlamaForCausalLM(cfg).eval()


def inputs(b: int, t: int, padded: bool) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(t)
    ids = torch.randint(3, 512, (b, t), generator=g)
    am = torch.ones(b, t, dtype=torch.long)
    if padded:
        am[0, : t // 8] = 0
    return ids, am


def interleaved(fns: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    """Median seconds of each function, the functions taking turns round by round."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():  # warm-up
        f()
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="3 rounds")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rounds = 3 if args.quick else args.rounds
    model = build()
    stats = ("entropy", "l2", "max")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; tiny Llama (hidden 128, 4 layers, "
        f"4 heads / 2 KV heads), float32, B = {args.batch}, {rounds} interleaved rounds (median)"
    )
    header = f"{'T':>5}  {'padding':>8}  {'statistic':>9}  {'off ms':>8}  {'on ms':>8}  {'time':>6}  {'peak off':>9}  {'peak on':>9}  {'peak':>6}  {'probe MiB':>9}  {'/ B·T·4':>8}"
    print(header)
    print("-" * len(header))
    for t in args.lengths:
        for padded in (True, False):
            ids, am = inputs(args.batch, t, padded)

            def plain(ids: torch.Tensor = ids, am: torch.Tensor = am) -> None:
                with torch.no_grad():
                    model(input_ids=ids, attention_mask=am, use_cache=False)

            def probed(statistic: str, ids: torch.Tensor = ids, am: torch.Tensor = am) -> Callable[[], None]:
                def f() -> None:
                    with torch.no_grad(), hf.ConcentrationProbe(model, statistic):
                        model(input_ids=ids, attention_mask=am, use_cache=False)

                return f

            fns: dict[str, Callable[[], None]] = {"off": plain}
            fns.update({s: probed(s) for s in stats})
            med = interleaved(fns, rounds)
            peak_off = peak_memory(plain)
            for s in stats:
                peak_on = peak_memory(fns[s])
                transient = peak_memory(fns[s], within=STATISTIC_RANGE)
                print(
                    f"{t:>5}  {'left 1/8' if padded else 'none':>8}  {s:>9}  {med['off'] * 1e3:>8.1f}  {med[s] * 1e3:>8.1f}  "
                    f"{med[s] / med['off']:>5.2f}x  {peak_off / 2**20:>8.1f}M  {peak_on / 2**20:>8.1f}M  "
                    f"{peak_on / peak_off:>5.2f}x  {transient / 2**20:>9.2f}  {transient / (args.batch * t * 4):>8.1f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
