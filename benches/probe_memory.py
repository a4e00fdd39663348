"""Peak memory of a forward pass without logits, with the probe on and off, on CPU, for
a bfloat16 Qwen3-style model that keeps the GPU benchmark's proportions.

Run:  python benches/probe_memory.py            (B = 8, T = 1024; about half a minute)

`benches/gpu_probe.py` compares peak memory on a 0.5B Qwen3 config at B = 8, T = 4096 on
CUDA. This is the CPU stand-in. The model is scaled down but keeps the proportions that
decide whether the probe's transient raises the peak: H·d = hidden, intermediate =
3 × hidden, bfloat16 activations against the probe's float32 copies. It calls
`model.model(...)`, the hidden states with no `lm_head`, so the logits do not hide the
probe's share. Peak memory covers every CPU allocation, read from `torch.profiler`.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

try:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from comppo_core import hf
    from comppo_core.hf._memory import peak_memory
except ImportError as exc:  # pragma: no cover
    sys.exit(f"benches/probe_memory.py needs the [hf] extra (torch, transformers): {exc}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256, help="hidden size; heads = hidden / 64")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    heads = max(2, a.hidden // 64)
    cfg = Qwen3Config(
        vocab_size=1024,
        hidden_size=a.hidden,
        intermediate_size=3 * a.hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        head_dim=64,
        max_position_embeddings=max(2048, a.length),
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    b, t = a.batch, a.length
    ids = torch.randint(3, cfg.vocab_size, (b, t))
    unpadded = torch.ones(b, t, dtype=torch.long)
    padded = unpadded.clone()
    padded[0, : t // 10] = 0
    cpu = torch.device("cpu")

    def off(mask: Any) -> None:
        with torch.no_grad():
            model.model(input_ids=ids, attention_mask=mask, use_cache=False)

    def on(mask: Any, statistic: str) -> None:
        with torch.no_grad(), hf.ConcentrationProbe(model, statistic=statistic):
            model.model(input_ids=ids, attention_mask=mask, use_cache=False)

    print(f"bfloat16 Qwen3-style, hidden {a.hidden}, {heads} heads of 64, B = {b}, T = {t}, no logits")
    print(
        f"{'padding':<12}{'statistic':<10}{'peak off MiB':>14}{'peak on MiB':>13}{'peak on/off':>13}{'time on/off':>13}"
    )
    for label, mask in (("none", unpadded), ("left row 0", padded)):
        for statistic in ("entropy", "l2", "max"):
            p_off = peak_memory(lambda mask=mask: off(mask), cpu)
            p_on = peak_memory(lambda mask=mask, statistic=statistic: on(mask, statistic), cpu)
            t0 = time.perf_counter()
            off(mask)
            t_off = time.perf_counter() - t0
            t0 = time.perf_counter()
            on(mask, statistic)
            t_on = time.perf_counter() - t0
            print(
                f"{label:<12}{statistic:<10}{p_off / 2**20:>14.1f}{p_on / 2**20:>13.1f}"
                f"{p_on / p_off:>12.2f}x{t_on / t_off:>12.2f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
