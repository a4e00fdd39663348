"""The worker of tests/integrations/test_trl_backends.py, launched per backend by
``trl_backends.launch``: for each arm given, 2 CompPOTrainer steps on the synthetic global
batch (``trl_tiny.synthetic_rows``: 16 rows; gradient accumulation 2 on one process, 1 on each of
two), saving per rank to ``OUT/<arm>/rank<r>.pt``:

* ``actor``: the actor's full parameters at the end; ``actors`` and ``critic``: the actor's
  and the critic's full parameters after each step (``trl_backends.full_parameters``: gathered under ZeRO-3 and
  FSDP2);
* ``facts``: ``trl_backends.backend_facts`` (what really ran);
* with ``--resume``: the uninterrupted run saves a checkpoint at each step, and a fresh
  trainer resumes from ``checkpoint-1`` to step 2: ``resumed`` holds its actor and critic.

Usage: ``trl_sharded_worker.py OUT ARM[,ARM...] [--resume]``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from trl_backends import backend_facts, full_parameters, use_fsdp_on_cpu

use_fsdp_on_cpu()  # before anything builds an Accelerator (only under ACCELERATE_USE_FSDP=true)

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl_tiny import make_trainer, synthetic_rows, tiny_llama  # noqa: E402

from comppo_core.integrations.trl import CompPOConfig  # noqa: E402
from comppo_core.rl.tasks.addition import CharTokenizer  # noqa: E402

TOK = CharTokenizer()

#: The actor's AdamW ε. AdamW's first step moves each weight by lr·g/(|g|+ε): a gradient
#: element of the order of ε (one o_proj element with |g| ≈ 1.6e-8 here) moves by a fraction
#: of lr that rounding changes at the percent level, which alone put ZeRO-3's comp_gae actor
#: at 9.9e-6 from one process (the bound is 1e-5). With ε = 1e-6 the most sensitive weight is
#: 100 times less so (all actors within ~1e-6), and a gradient off by a constant factor
#: (reduced twice, say), to which Adam is blind but for ε, moves more weights.
ADAM_EPSILON = 1e-6


def run(arm: str, out: Path, *, save: bool, resume_from: Path | None = None) -> dict[str, Any]:
    """Train ``arm`` to step 2 (from ``resume_from`` when given); the critic after each step,
    the actor at the end and the backend facts."""
    rows, scores = synthetic_rows(16, TOK.vocab_size, seed=4)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    accumulation = 2 // world
    critics: list[list[torch.Tensor]] = []
    actors: list[list[torch.Tensor]] = []
    holder: dict[str, Any] = {}

    class Record(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            critics.append(full_parameters(holder["trainer"].critic))
            actors.append(full_parameters(holder["trainer"].model_wrapped))

    extra: dict[str, Any] = {}
    if "critic_warmup" in CompPOConfig.__dataclass_fields__:
        extra["critic_warmup"] = 0
    if save:
        extra.update(save_strategy="steps", save_steps=1)
    trainer = make_trainer(
        tiny_llama(TOK.vocab_size),
        TOK.to_hf(),
        rows,
        scores,
        str(out),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,
        num_generations=2,
        max_steps=2,
        learning_rate=1e-3,
        tac_width=16,
        max_completion_length=8,
        critic_lr=1e-3,
        arm=arm,
        adam_epsilon=ADAM_EPSILON,
        ddp_backend="gloo" if world > 1 else None,
        **extra,
    )
    holder["trainer"] = trainer
    trainer.add_callback(Record())
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
    return {
        "actor": full_parameters(trainer.model_wrapped),
        "critic": critics,
        "actors": actors,
        "facts": backend_facts(trainer),
        "log": trainer.state.log_history,
    }


def main(out: Path, arms: list[str], resume: bool) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    for arm in arms:
        result = run(arm, out / arm / "run", save=resume)
        if resume:
            again = run(arm, out / arm / "resumed", save=False, resume_from=out / arm / "run" / "checkpoint-1")
            result["resumed"] = {"actor": again["actor"], "critic": again["critic"], "facts": again["facts"]}
        (out / arm).mkdir(parents=True, exist_ok=True)
        torch.save(result, out / arm / f"rank{rank}.pt")
    sys.stdout.flush()
    sys.stderr.flush()
    # fully_shard's processes sometimes abort in their teardown after the work is done
    # ("terminate called without an active exception"): the results are written, so leave
    os._exit(0)


if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    positional = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(Path(positional[0]), positional[1].split(","), "--resume" in flags)
