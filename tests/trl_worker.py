"""torchrun worker of tests/integrations/test_trl.py: 2 CompPOTrainer steps on the synthetic global batch
(16 rows, gradient accumulation 2 on one process, 1 on each of two), saving per rank the
critic after each step and the actor at the end to ``OUT/rank<r>.pt``."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import TrainerCallback
from trl_tiny import make_trainer, synthetic_rows, tiny_llama

from comppo_core.rl.tasks.addition import CharTokenizer


def main(out: Path) -> None:
    torch.set_num_threads(1)
    tok = CharTokenizer()
    rows, scores = synthetic_rows(16, tok.vocab_size, seed=4)
    import os

    world = int(os.environ.get("WORLD_SIZE", "1"))
    accumulation = 2 // world
    critics: list[list[torch.Tensor]] = []

    class Record(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            critics.append([p.detach().clone() for p in trainer.critic.parameters()])

    trainer = make_trainer(
        tiny_llama(tok.vocab_size),
        tok.to_hf(),
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
        arm="comppo_position",
        ddp_backend="gloo" if world > 1 else None,
    )
    trainer.add_callback(Record())
    trainer.train()
    actor = [p.detach().clone() for p in trainer.accelerator.unwrap_model(trainer.model).parameters()]
    out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "critic": critics,
            "actor": actor,
            "log": trainer.state.log_history,
            # what really ran: accelerate's backend, the process count, DDP around the policy
            "backend": str(trainer.accelerator.distributed_type),
            "processes": trainer.accelerator.num_processes,
            "group": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
            "ddp": type(trainer.model_wrapped).__name__,
        },
        out / f"rank{trainer.accelerator.process_index}.pt",
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
