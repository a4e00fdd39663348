"""The scoring forward with TAC on a GPU, against the issue's targets.

Run (CUDA):  python benches/gpu_critic.py                     (Qwen3-0.6B shape, bfloat16, B = 8, T = 2048)
Dry run:     python benches/gpu_critic.py --device cpu --tiny (the same code on a tiny Qwen3, float32, on CPU)

Prints `benches/critic.py`'s cost table for a Qwen3-0.6B-shaped bfloat16 model with
random weights (hidden 1024, 28 layers, vocabulary 151936) and checks the targets:
``rl.forward`` with TAC (forward + probe + critic) at most 1.25× a plain forward's time
and 1.05× its peak memory. The StandardCritic's cost is printed beside it. Exit status
0 when both targets are met, 1 otherwise; the dry run prints the verdicts without
judging them.
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

#: the dry run's model and batch: critic.py's code on a model small enough for a CPU
critic.PRESETS.setdefault("tiny", dict(hidden=64, layers=2, heads=4, vocab=512, batch=2, length=64))


def main(argv: list[str] | None = None) -> int:
    args = list(argv or [])
    tiny = "--tiny" in args
    args = [x for x in args if x != "--tiny"]
    defaults = ["--device", "cuda", "--preset", "qwen3-0.6b", "--dtype", "bfloat16", "--part", "cost"]
    if tiny:
        defaults = ["--device", "cuda", "--preset", "tiny", "--dtype", "float32", "--part", "cost", "--rounds", "2"]
    a = critic.parser().parse_args([*defaults, *args])
    if a.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit("benches/gpu_critic.py needs a CUDA device (or --device cpu --tiny for a dry run)")
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        torch.set_num_threads(a.threads)
    result = critic.cost(a)
    t, m = result["rl.forward+TAC"]
    ok = t <= TARGETS["time"] and m <= TARGETS["memory"]
    print(f"\ntargets: rl.forward+TAC time {t:.3f} (<= {TARGETS['time']}), peak memory {m:.3f} (<= {TARGETS['memory']}): "
          f"{'met' if ok else 'NOT met'}")  # fmt: skip
    if tiny:
        print("\n(dry run: a tiny model, so the verdicts say nothing about the targets)")
        return 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
