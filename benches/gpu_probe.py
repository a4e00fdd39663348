"""GPU benchmark: the attention concentration probe on a ~0.5B Qwen3-style model.

Run on a CUDA machine (the [hf] extra installed):

    python benches/gpu_probe.py                          # B = 8, T = 4096, bfloat16
    python benches/gpu_probe.py --device cpu --small     # dry run anywhere (tiny sizes)

Model: ``Qwen3ForCausalLM`` from a config, random bfloat16 weights built on the device:
hidden 1024, 28 layers, 16 heads / 8 KV heads, head_dim 64, intermediate 3072, vocab
151936, tied embeddings (≈ 0.5B parameters; the count is printed). Batch B = 8 of
T = 4096 random tokens.

Each variant is a full forward pass (``torch.no_grad()``, ``use_cache=False``, logits
included, as the PPO loop's scoring pass) with the probe off and on:

    entropy          the default: fused kernel, float32 pass (DESIGN §7)
    entropy/model    the fused kernel in the model's dtype (precision="model", bfloat16)
    l2, max          the other statistics (max is chunked: 256-query score blocks)
    entropy/padded   entropy with row 0 left-padded by T/8 (the model builds a boolean
                     mask; the probe runs its fused kernel per 256-query chunk)

Times: ``torch.cuda.synchronize()`` around each call, rounds interleaved (off, on, off,
...), median of ``--rounds``. Peak memory: ``torch.cuda.max_memory_allocated`` during
the call above what was allocated before it. Targets (issue 5): time ≤ 1.3×, peak
memory ≤ 1.05× with the probe on (default variant). Before timing, the probe's CUDA
statistic is checked against the chunked float32 method on a small slice (2 × 512
tokens), since CUDA cannot be tested without a GPU.

Exit status: 0 when the check passes (targets are reported; ``--strict`` exits 3 on a
miss), 1 when the check fails, 2 when CUDA was asked for and is missing. Runs in well
under 5 minutes on one GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable

try:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from comppo_core import hf
except ImportError as exc:  # pragma: no cover
    sys.exit(f"benches/gpu_probe.py needs the [hf] extra (torch, transformers): {exc}")

TIME_TARGET = 1.3
MEMORY_TARGET = 1.05


def config(small: bool) -> Any:
    if small:
        return Qwen3Config(
            vocab_size=1024,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=2,
        )
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=64,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )


def build(cfg: Any, device: torch.device, dtype: torch.dtype) -> Any:
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak(fn: Callable[[], None], device: torch.device) -> int:
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    from comppo_core.hf._memory import peak_memory

    return peak_memory(fn, device)


def check_statistic(model: Any, device: torch.device, vocab: int) -> float:
    """max |fused − chunked| of the entropy concentration on a 2 × 512 slice (both paddings)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (2, 512), generator=g).to(device)
    worst = 0.0
    for am in (torch.ones(2, 512, dtype=torch.long), torch.ones(2, 512, dtype=torch.long).index_fill_(1, torch.arange(40), 0)):
        am = am.to(device)
        res = {}
        for method in ("fused", "chunked"):
            with torch.no_grad(), hf.ConcentrationProbe(model, "entropy", method=method) as p:
                model(input_ids=ids, attention_mask=am, use_cache=False)
            res[method] = p.concentration
        worst = max(worst, float((res["fused"] - res["chunked"]).abs().max()))
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny config, B = 2, T = 256 (dry run)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--length", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--strict", action="store_true", help="exit 3 when a target is missed")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available (use --device cpu --small for a dry run)", file=sys.stderr)
        return 2
    b = args.batch or (2 if args.small else 8)
    t = args.length or (256 if args.small else 4096)
    dtype = torch.bfloat16
    t0 = time.perf_counter()
    cfg = config(args.small)
    model = build(cfg, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"{name}; torch {torch.__version__}; Qwen3-style model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_attention_heads} heads / {cfg.num_key_value_heads} KV heads, vocab {cfg.vocab_size}, "
        f"{n_params / 1e9:.3f}B ({n_params:,}) parameters, bfloat16; B = {b}, T = {t}; built in {time.perf_counter() - t0:.1f} s"
    )

    err = check_statistic(model, device, cfg.vocab_size)
    ok = err <= 1e-3
    print(f"check: fused vs chunked entropy concentration on 2 × 512 tokens: max |Δ| = {err:.2e} ({'ok' if ok else 'FAILED'})")

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (b, t), generator=g).to(device)
    full = torch.ones(b, t, dtype=torch.long, device=device)
    padded = full.clone()
    padded[0, : t // 8] = 0

    def forward(am: Any) -> Callable[[], None]:
        def f() -> None:
            with torch.no_grad():
                model(input_ids=ids, attention_mask=am, use_cache=False)
            sync(device)

        return f

    def probed(am: Any, **kw: Any) -> Callable[[], None]:
        def f() -> None:
            with torch.no_grad(), hf.ConcentrationProbe(model, **kw) as p:
                model(input_ids=ids, attention_mask=am, use_cache=False)
            sync(device)
            assert p.passes == 1

        return f

    variants: list[tuple[str, Any, dict[str, Any]]] = [
        ("entropy", full, {"statistic": "entropy"}),
        ("entropy/model", full, {"statistic": "entropy", "precision": "model"}),
        ("l2", full, {"statistic": "l2"}),
        ("max", full, {"statistic": "max"}),
        ("entropy/padded", padded, {"statistic": "entropy"}),
    ]
    header = f"{'variant':>15}  {'off ms':>9}  {'on ms':>9}  {'time':>7}  {'peak off':>10}  {'peak on':>10}  {'memory':>7}"
    print(header)
    print("-" * len(header))
    met = True
    for label, am, kw in variants:
        off, on = forward(am), probed(am, **kw)
        off()
        on()  # warm-up
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            for key, fn in (("off", off), ("on", on)):
                sync(device)
                s = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - s)
        t_off, t_on = statistics.median(times["off"]), statistics.median(times["on"])
        p_off, p_on = peak(off, device), peak(on, device)
        r_time, r_mem = t_on / t_off, p_on / p_off
        mark = ""
        if label == "entropy":
            hit = r_time <= TIME_TARGET and r_mem <= MEMORY_TARGET
            met = met and hit
            mark = f"   targets ≤ {TIME_TARGET}x time, ≤ {MEMORY_TARGET}x memory: {'met' if hit else 'MISSED'}"
        print(
            f"{label:>15}  {t_off * 1e3:>9.1f}  {t_on * 1e3:>9.1f}  {r_time:>6.2f}x  {p_off / 2**30:>8.2f}G  "
            f"{p_on / 2**30:>8.2f}G  {r_mem:>6.3f}x{mark}"
        )
    print(f"total: {time.perf_counter() - t0:.1f} s")
    if not ok:
        return 1
    if args.strict and not met:
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
