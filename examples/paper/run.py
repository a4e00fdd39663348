"""The paper's protocol at scale on TRL: tuned arms × 5 seeds on a math JSONL task, then frozen evaluation.

    python examples/paper/run.py --model /models/Qwen3-4B --task data/math.jsonl --out runs/paper
    python examples/paper/run.py --tiny --out /tmp/paper-tiny        # the whole recipe on CPU, a tiny model

Three stages (each prints the command it runs and is a plain ``comppo-core`` command; the
script calls them in this process):

1. ``comppo-core compare --engine trl``: every arm of :data:`ARMS` tuned on ``grid.json``
   (tuning seeds 1000, 1001 on the validation split), then 5 reporting seeds at each arm's
   chosen point, each run a CompPOTrainer run under ``accelerate launch`` (ZeRO-3, vLLM
   colocate: ``accelerate_zero3.yaml``, ``ds_zero3.json``, ``trl_config.yaml``) →
   ``OUT/results.md`` (greedy held-out accuracy per arm, paired 95 % CIs, the 2×2 interaction);
2. ``comppo-core evaluate --samples N`` of every reporting run's final policy
   (``OUT/<arm>/seed<s>/model``) on the held-out split → ``OUT/frozen/<arm>_seed<s>.json``;
3. the frozen evaluation per arm over the seeds: mean and 95 % CI (Student's t) of greedy
   pass@1 and pass@k, and the paired difference to ``grpo`` and ``comppo`` →
   ``OUT/frozen/summary.md`` and ``summary.json``.

Rerunning the same command continues (``--resume`` is passed when ``OUT`` holds the
compare; finished runs and frozen evaluations are reused).

``--tiny`` substitutes a tiny random Llama with a character tokenizer (built here, nothing
downloaded), a 200-problem arithmetic JSONL in the task format, settings of a few seconds a
run, one reporting seed per arm and no grid, no launcher, float32 on CPU and the CPU-safe
part of ``trl_config.yaml`` (no vLLM, no gradient checkpointing): every stage runs as at
scale, the numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: The paper's arms: tuned GRPO, PPO, the 2×2 (critic × gates) and the two gate controls.
ARMS = ("grpo", "ppo", "ppo_fixed", "comp_gae", "tac_fixed", "comppo", "comppo_shuffle", "comppo_position")

#: compare's settings for Qwen3-4B on a math task (one PPO step: 128 prompts × 8 samples).
PAPER: dict[str, Any] = {
    "steps": 200,
    "prompts_per_step": 128,
    "group_size": 8,
    "ppo_epochs": 1,
    "num_minibatches": 4,
    "max_new_tokens": 1024,
    "temperature": 1.0,
    "kl_coef": 0.0,
    "critic_lr": 1e-5,
    "tac_width": 256,
    "eval_every": 20,
    "eval_size": 500,
    "heldout_fraction": 0.1,
    "validation_fraction": 0.05,
    "save_every": 10,
    "dtype": "bfloat16",
}
PAPER_FLAGS = ["--chat-template", "--no-progress"]

#: The --tiny stand-in: seconds a run on one CPU thread.
TINY: dict[str, Any] = {
    "steps": 2,
    "prompts_per_step": 4,
    "group_size": 2,
    "ppo_epochs": 1,
    "num_minibatches": 1,
    "max_new_tokens": 6,
    "critic_warmup": 0,
    "tac_width": 16,
    "eval_every": 1,
    "eval_size": 8,
    "heldout_fraction": 0.2,
    "kl_coef": 0.0,
    "num_threads": 1,
}
TINY_FLAGS = ["--no-progress"]

#: trl_config.yaml's fields that need a GPU (left out with --tiny).
GPU_ONLY = ("use_vllm", "vllm_mode", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "vllm_max_model_length",
            "vllm_importance_sampling_correction", "ds3_gather_for_generation", "gradient_checkpointing",
            "model_init_kwargs")  # fmt: skip

#: The characters of the tiny task (its tokenizer's alphabet).
TINY_ALPHABET = "".join(sorted(set("What is +? Answer: 0123456789#.-")))


def flags(settings: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, value in settings.items():
        out += ["--" + name.replace("_", "-"), str(value)]
    return out


def write_tiny_task(path: Path) -> None:
    """A math-style JSONL task of 200 sums (the format of a real one: ``{"prompt", "answer"}``)."""
    import numpy as np

    rng = np.random.default_rng(0)
    with path.open("w") as fh:
        for _ in range(200):
            a, b = (int(x) for x in rng.integers(0, 50, size=2))
            fh.write(json.dumps({"prompt": f"What is {a}+{b}? Answer: ", "answer": str(a + b)}) + "\n")


def write_tiny_model(directory: Path) -> None:
    """A 2-layer width-32 Llama with random weights and a character tokenizer, saved with ``save_pretrained``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from comppo_core.rl.tasks.addition import CharTokenizer

    tokenizer = CharTokenizer(TINY_ALPHABET)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.to_hf().save_pretrained(directory)


def tiny_trl_config(path: Path) -> None:
    """trl_config.yaml without the fields that need a GPU."""
    import yaml

    settings = yaml.safe_load((HERE / "trl_config.yaml").read_text())
    path.write_text(yaml.safe_dump({k: v for k, v in settings.items() if k not in GPU_ONLY}))


def run(argv: list[str]) -> None:
    """Print and run one ``comppo-core`` command in this process; exit with its status on failure."""
    from comppo_core import cli

    print("$ comppo-core " + shlex.join(argv), flush=True)
    status = cli.main(argv)
    if status != 0:
        sys.exit(status)


def frozen_summary(out: Path, arms: list[str], seeds: int, samples: int) -> dict[str, Any]:
    """Per arm, over the reporting seeds: mean and 95% CI of greedy pass@1 and pass@k
    (the macro over the tasks evaluated), and the paired differences to grpo and comppo."""
    from comppo_core.experiments.report import ci_cell, pct
    from comppo_core.experiments.statistics import mean_ci

    numbers: dict[str, dict[int, dict[str, float]]] = {}
    for arm in arms:
        numbers[arm] = {}
        for s in range(seeds):
            report = json.loads((out / "frozen" / f"{arm}_seed{s}.json").read_text())
            numbers[arm][s] = report["macro"]
    keys = [k for k in next(iter(numbers[arms[0]].values())) if k == "greedy_pass@1" or k.startswith("pass@")]
    table: dict[str, Any] = {}
    lines = [
        "# Frozen evaluation",
        "",
        f"Each arm's final policy per reporting seed, held-out split, greedy and {samples} samples per problem "
        "(pass@k by the unbiased estimator); mean over seeds with a 95% CI (Student's t), in percent.",
        "",
        "| arm | " + " | ".join(f"{k} | 95% CI" for k in keys) + " |",
        "|---|" + "---|---|" * len(keys),
    ]
    for arm in arms:
        row, entry = [arm], {}
        for k in keys:
            m, h = mean_ci([numbers[arm][s][k] for s in range(seeds)])
            entry[k] = [m, h]
            row += [pct(m), ci_cell(m, h)]
        for ref in ("grpo", "comppo"):
            if ref in numbers and ref != arm:
                for k in keys:
                    m, h = mean_ci([numbers[arm][s][k] - numbers[ref][s][k] for s in range(seeds)])
                    entry[f"{k}_vs_{ref}"] = [m, h]
        table[arm] = entry
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Paired differences, arm − reference per seed (points; same starting model and problems), mean and 95% CI:",
        "",
        "| arm − reference | " + " | ".join(f"{k} | 95% CI" for k in keys) + " |",
        "|---|" + "---|---|" * len(keys),
    ]
    for arm, entry in table.items():
        for ref in ("grpo", "comppo"):
            if f"{keys[0]}_vs_{ref}" in entry:
                cells = [
                    c
                    for k in keys
                    for c in (pct(entry[f"{k}_vs_{ref}"][0], True), ci_cell(*entry[f"{k}_vs_{ref}"], True))
                ]
                lines.append(f"| {arm} − {ref} | " + " | ".join(cells) + " |")
    from comppo_core.experiments.report import interaction_line
    from comppo_core.experiments.statistics import interaction

    inter = {k: interaction({arm: {s: numbers[arm][s][k] for s in range(seeds)} for arm in arms}) for k in keys}
    for k, value in inter.items():
        if value is not None:
            lines += ["", f"The 2×2 interaction on frozen {k}:", "", interaction_line(value).rstrip()]
    (out / "frozen" / "summary.md").write_text("\n".join(lines) + "\n")
    result = {
        "arms": table,
        "interaction": inter,
        "seeds": seeds,
        "samples": samples,
        "ci": "95% Student's t over seeds",
    }
    (out / "frozen" / "summary.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="local Hugging Face model directory (e.g. Qwen3-4B)")
    parser.add_argument("--task", help='math JSONL task file ({"prompt", "answer"} rows; README)')
    parser.add_argument("--out", required=True)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tuning-seeds", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8, help="samples per problem of the frozen evaluation")
    parser.add_argument(
        "--launcher",
        default=f"accelerate launch --config_file {HERE / 'accelerate_zero3.yaml'}",
        help="what each run starts under ('' for none)",
    )
    parser.add_argument("--tiny", action="store_true", help="the whole recipe on CPU with a tiny random model")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    arms = args.arms.split(",")
    trl_config = HERE / "trl_config.yaml"
    launcher: str | None = args.launcher or None
    if args.tiny:
        model, task = out / "tiny_model", out / "tiny_task.jsonl"
        if not (model / "config.json").is_file():
            write_tiny_model(model)
        if not task.is_file():
            write_tiny_task(task)
        trl_config = out / "trl_config_tiny.yaml"
        tiny_trl_config(trl_config)
        settings, extra, grid = TINY, TINY_FLAGS, []
        seeds, launcher = (1 if args.seeds == 5 else args.seeds), None
    else:
        if args.model is None or args.task is None:
            parser.error("--model and --task are required (or --tiny)")
        model, task = Path(args.model), Path(args.task)
        settings, extra = PAPER, PAPER_FLAGS
        grid = ["--grid", str(HERE / "grid.json"), "--tuning-seeds", str(args.tuning_seeds)]
        seeds = args.seeds
    compare = ["compare", "--engine", "trl", "--model", str(model), "--task", str(task), "--arms", ",".join(arms)]
    compare += ["--seeds", str(seeds), *grid, *flags(settings), *extra, "--trl-config", str(trl_config)]
    compare += [] if launcher is None else ["--launcher", launcher]
    compare += ["--out", str(out / "compare")]
    if (out / "compare" / "compare.json").is_file():
        compare.append("--resume")
    run(compare)

    (out / "frozen").mkdir(exist_ok=True)
    for arm in arms:
        for s in range(seeds):
            target = out / "frozen" / f"{arm}_seed{s}.json"
            if target.is_file():
                continue
            evaluate = ["evaluate", "--model", str(out / "compare" / arm / f"seed{s}" / "model"), "--task", str(task)]
            evaluate += ["--eval-size", str(settings["eval_size"]), "--max-new-tokens", str(settings["max_new_tokens"])]
            evaluate += ["--heldout-fraction", str(settings["heldout_fraction"]), "--samples", str(args.samples)]
            evaluate += ["--chat-template"] if "--chat-template" in extra else []
            evaluate += ["--json", str(target)]
            run(evaluate)
    frozen_summary(out, arms, seeds, args.samples)
    print((out / "frozen" / "summary.md").read_text())
    print(f"wrote {out / 'compare' / 'results.md'} and {out / 'frozen' / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
