"""The scoring forward with TAC on a GPU, against the issue's targets.

Run (CUDA):  python benches/gpu_critic.py          (Qwen3-0.6B shape, bfloat16, B = 8, T = 2048)

Prints `benches/critic.py`'s cost table for a Qwen3-0.6B-shaped bfloat16 model with
random weights (hidden 1024, 28 layers, vocabulary 151936) and checks the targets:
``rl.forward`` with TAC (forward + probe + critic) at most 1.25× a plain forward's time
and 1.05× its peak memory. The StandardCritic's cost is printed beside it.
"""

from __future__ import annotations

import sys

try:
    import torch
except ImportError as exc:  # pragma: no cover
    sys.exit(f"benches/gpu_critic.py needs torch: {exc}")

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import critic  # noqa: E402

TARGETS = {"time": 1.25, "memory": 1.05}


def main(argv: list[str] | None = None) -> int:
    if not torch.cuda.is_available():
        sys.exit("benches/gpu_critic.py needs a CUDA device")
    a = critic.parser().parse_args(
        ["--device", "cuda", "--preset", "qwen3-0.6b", "--dtype", "bfloat16", "--part", "cost", *(argv or [])]
    )
    torch.backends.cuda.matmul.allow_tf32 = True
    result = critic.cost(a)
    t, m = result["rl.forward+TAC"]
    ok = t <= TARGETS["time"] and m <= TARGETS["memory"]
    print(f"\ntargets: rl.forward+TAC time {t:.3f} (<= {TARGETS['time']}), peak memory {m:.3f} (<= {TARGETS['memory']}): "
          f"{'met' if ok else 'NOT met'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
