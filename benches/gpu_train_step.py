"""The seven arms' PPO step on a GPU, against the issue's targets.

Run (CUDA):  python benches/gpu_train_step.py                    (Qwen3-0.6B shape, bfloat16, random weights)
Dry run:     python benches/gpu_train_step.py --device cpu --tiny   (the same code on a tiny Qwen3, on CPU)

Prints `benches/train_step.py`'s table (same method: one trainer per arm on copies of one
model, one fixed batch, arms alternated over rounds, medians of per-round ratios) for a
Qwen3-0.6B-shaped model (28 layers, hidden 1024, 16 heads / 8 KV heads of 128, MLP 3072,
vocabulary 151936, tied embeddings: 596M parameters) in bfloat16 with random weights, on
8 prompts x 4 samples of 256 prompt and 256 response tokens, and checks the targets:

* ``comppo`` step <= 1.15 x the ``grpo`` step;
* ``comppo`` step <= 0.70 x the ``ppo`` step (the standard critic), and peak memory <= 0.75 x;
* the advantages phase <= 1 % of the ``comppo`` step.

Each time target is checked twice: on the **train step** (score + advantages + update:
what the arm changes; the exit status follows these) and on the full **step** with the
rollout, which is the same ``generate`` call in every arm and dominates a step with
Hugging Face generation (a serving engine shortens it), so it moves every ratio towards 1.
Exit status 0 when the train-step and memory targets are met, 1 otherwise; the dry run
checks that everything runs and prints the verdicts without judging them.
"""

from __future__ import annotations

import sys

try:
    import torch
except ImportError as exc:  # pragma: no cover
    sys.exit(f"benches/gpu_train_step.py needs torch: {exc}")

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import train_step  # noqa: E402

#: target → bound on the measured ratio (``comppo`` against the arm named).
TARGETS = {
    "comppo / grpo time": 1.15,
    "comppo / ppo time": 0.70,
    "comppo / ppo peak memory": 0.75,
    "advantages / comppo step": 0.01,
}


def verdicts(result: dict[str, object], with_rollout: bool) -> dict[str, tuple[float, bool]]:
    """``{target: (measured, met)}`` from :func:`train_step.measure`'s result."""
    ratio: dict[str, dict[str, float]] = result["ratio"]  # type: ignore[assignment]
    cp: dict[str, float] = result["comppo_vs_ppo"]  # type: ignore[assignment]
    ms: dict[str, dict[str, float]] = result["ms"]  # type: ignore[assignment]
    key = "step" if with_rollout else "train"
    phases = ms["comppo"]
    denominator = sum(phases.values()) if with_rollout else sum(v for k, v in phases.items() if k != "rollout")
    measured = {
        "comppo / grpo time": ratio["comppo"][key],
        "comppo / ppo time": cp[key],
        "comppo / ppo peak memory": cp["peak"],
        "advantages / comppo step": phases["advantages"] / denominator,
    }
    return {name: (value, value <= TARGETS[name]) for name, value in measured.items()}


def main(argv: list[str] | None = None) -> int:
    args = list(argv or [])
    tiny = "--tiny" in args
    if tiny:
        args.remove("--tiny")
    ap = train_step.parser()
    ap.set_defaults(device="cuda", preset="tiny" if tiny else "qwen3-0.6b", dtype="bfloat16", rounds=1 if tiny else 3)
    a = ap.parse_args(args)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("benches/gpu_train_step.py needs a CUDA device (or --device cpu --tiny for a dry run)")
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    result = train_step.measure(a)
    ok = True
    for with_rollout in (False, True):
        print(
            f"\ntargets on the {'step (rollout included)' if with_rollout else 'train step (score + advantages + update)'}:"
        )
        for name, (value, met) in verdicts(result, with_rollout).items():
            bound = TARGETS[name]
            shown = (
                f"{100 * value:.2f} % (<= {100 * bound:g} %)"
                if name.startswith("advantages")
                else f"{value:.3f} (<= {bound})"
            )
            print(f"  {name}: {shown}: {'met' if met else 'NOT met'}")
            if not with_rollout:
                ok = ok and met
    if tiny:
        print("\n(dry run: a tiny model, so the verdicts say nothing about the targets)")
        return 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
