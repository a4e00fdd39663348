"""``CompPOTrainer``'s step against ``GRPOTrainer``'s on a GPU, against the issue's targets.

Run (CUDA):  python benches/gpu_trl_step.py                    (Qwen3-0.6B shape, bfloat16, random weights)
             python benches/gpu_trl_step.py --zero3            (the same, each trainer a 1-process DeepSpeed ZeRO-3 job)
Dry run:     python benches/gpu_trl_step.py --device cpu --tiny   (the same code on a tiny Qwen3, on CPU)
             python benches/gpu_trl_step.py --device cpu --tiny --zero3   (needs deepspeed: ZeRO-3 over gloo on CPU)

Prints `benches/trl_step.py`'s table (same method: ``trl.GRPOTrainer`` and
``CompPOTrainer(arm="comppo")`` each in its own process on the same saved model and
prompts, taking turns step by step, medians of per-round ratios) for a Qwen3-0.6B-shaped
model (28 layers, hidden 1024, 16 heads / 8 KV heads of 128, MLP 3072, vocabulary 151936,
tied embeddings: 596M parameters) in bfloat16 with random weights, 8 prompts x 4
completions of 256 prompt and 256 completion tokens. Generation is vLLM colocate when
``vllm`` is importable (``--no-vllm``: Hugging Face generate; the output says which).
``--critic-arm comp_gae`` adds the standard-critic arm (not run by default: the targets
are the TAC arm's).

``--zero3``: each trainer is an ``accelerate launch`` job of one process under a DeepSpeed
ZeRO-3 config (bfloat16; every parameter partitioned, which on one process means
DeepSpeed's ZeRO-3 engine, parameter gathering and optimiser, not sharding), driven in
turns by ``trl_step.py``'s launched-job machinery, which checks that ZeRO-3 really ran
(accelerate's ``DEEPSPEED`` and stage 3). Generation: Hugging Face generate (vLLM colocate
is the default run's). Targets:

* ``CompPOTrainer`` step <= 1.15 x the ``GRPOTrainer`` step;
* its peak memory (``torch.cuda.max_memory_allocated`` over a step, in its own process)
  <= 1.05 x ``GRPOTrainer``'s, not counting what both hold outside the trainer's own
  state (vLLM's weights and KV cache, allocated when the trainer is built; the absolute
  ratio, which that memory moves towards 1, is printed too).

The step ratio is printed also without the generation (``train step``), the part the arm
changes. Exit status 0 when both targets are met, 1 otherwise; the dry run checks that
everything runs and prints the verdicts without judging them.
"""

from __future__ import annotations

import sys

try:
    import torch
except ImportError as exc:  # pragma: no cover
    sys.exit(f"benches/gpu_trl_step.py needs torch: {exc}")

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import trl_step  # noqa: E402

#: target → bound on the measured ratio (CompPOTrainer / GRPOTrainer).
TARGETS = {"step time": 1.15, "peak memory": 1.05}


def verdicts(result: dict[str, object]) -> dict[str, tuple[float, bool]]:
    """``{target: (measured, met)}`` from :func:`trl_step.measure`'s result (a CPU run has
    no peak memory: it is reported as 0, met)."""
    ratio: dict[str, float] = result["ratio"]  # type: ignore[assignment]
    memory = float(result.get("peak_own_ratio", 0.0))  # type: ignore[arg-type]
    measured = {"step time": ratio["step"], "peak memory": memory}
    return {name: (value, value <= TARGETS[name]) for name, value in measured.items()}


def deepspeed_importable() -> bool:
    try:
        import deepspeed  # noqa: F401
    except Exception:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    args = list(argv or [])
    tiny = "--tiny" in args
    zero3 = "--zero3" in args
    args = [x for x in args if x not in ("--tiny", "--zero3")]
    ap = trl_step.parser()
    ap.set_defaults(device="cuda", preset="tiny" if tiny else "qwen3-0.6b", rounds=1 if tiny else 3, critic_arm="none")
    a = ap.parse_args(args)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("benches/gpu_trl_step.py needs a CUDA device (or --device cpu --tiny for a dry run)")
    if zero3:
        if not deepspeed_importable():
            sys.exit("benches/gpu_trl_step.py --zero3 needs deepspeed (DS_BUILD_OPS=0 pip install deepspeed ninja)")
        print(f"backend: DeepSpeed ZeRO-3, one process per trainer (accelerate launch), {a.device}")
        result = trl_step.measure_zero3_pair(a)
        for name, facts in result["facts"].items():
            problems = trl_step.check_backend("zero3", 1, a.device, facts)
            if problems:  # measure_zero3_pair stops first; this is the table's own word
                sys.exit(f"{name}: ZeRO-3 did not run: {'; '.join(problems)}")
        print("backend check: ZeRO-3 ran in both processes (DEEPSPEED, stage 3)")
    else:
        result = trl_step.measure(a)
    print(f"\ntargets (CompPOTrainer / GRPOTrainer; train step without generation: {result['ratio']['train']:.3f}):")
    ok = True
    for name, (value, met) in verdicts(result).items():
        if name == "peak memory" and not a.device.startswith("cuda"):
            print(f"  {name}: not measured on CPU (<= {TARGETS[name]})")
            continue
        print(f"  {name}: {value:.3f} (<= {TARGETS[name]}): {'met' if met else 'NOT met'}")
        ok = ok and met
    if tiny:
        print("\n(dry run: a tiny model, so the verdicts say nothing about the targets)")
        return 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
