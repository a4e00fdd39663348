"""Critic warm-up on TRL, with the package trainer's meaning and default.

A fresh run of an arm with a critic first trains the critic alone for
``CompPOConfig.critic_warmup`` rounds (None: :data:`~comppo_core.rl.config.DEFAULT_CRITIC_WARMUP`,
as :mod:`comppo_core.rl.critics.warmup` does in :class:`comppo_core.rl.Trainer`), before the
first PPO step::

    for i in 0 … rounds−1:
        generation batch of the initial policy     (TRL's generation and reward functions, on
                                                    prompts from a sampler of its own)
        score, advantages                          (as a PPO step: the same functions)
        num_iterations × steps_per_generation / gradient_accumulation_steps
            critic-only optimiser steps            (the actor does not move)

The rounds are extra: the PPO steps that follow make ``max_steps`` actor updates, as in
every arm. Their prompts come from a ``RepeatSampler`` seeded ``seed·1000 + 3`` (the main
sampler is seeded ``seed``), their generation and shuffles run under a forked torch RNG
seeded ``seed·1000 + 3``, gates that draw (the controls) draw as at step ``2³² + i``
(:data:`~comppo_core.rl.critics.warmup.WARMUP_STEP_KEYS`, as the package's), and TRL's metrics, completion logs and token count are put back
afterwards: the PPO steps see the prompts, randomness and logs of a run without warm-up.
Each round is logged (``trainer.log``, keys ``comppo/warmup/*``, at step 0) and kept in
:attr:`CompPOTrainer.critic_warmup_log`: ``round``, ``reward_mean``,
``value_explained_var`` (before the round's update) and ``value_loss``.

The actor scores without gradients in these rounds (``critic_grad=True``): the critic's
values carry gradients, the actor's hidden states none, so a TAC with ``trunk_grad > 0``
leaves the actor untouched, as the package's warm-up does. A resumed run does not warm up
again: its checkpoint holds the warmed-up critic.
"""

from __future__ import annotations

import collections
import copy
from typing import Any

import torch

from ...rl import step
from ...rl.critics.warmup import WARMUP_STEP_KEYS

__all__ = ["warm_up_critic", "warmup_seed"]


def warmup_seed(seed: int) -> int:
    """The warm-up's sampler and torch seed for a run seeded ``seed`` (the package's ``seed·1000 + 3``)."""
    return seed * 1000 + 3


def _warmup_batches(trainer: Any) -> Any:
    """Endless local generation batches of the warm-up (its own ``RepeatSampler``)."""
    from trl.trainer.utils import RepeatSampler

    args = trainer.args

    def sampler(dataset: Any) -> Any:
        return RepeatSampler(
            data_source=dataset,
            mini_repeat_count=trainer.num_generations,
            batch_size=args.generation_batch_size // trainer.num_generations,
            repeat_count=1,
            shuffle=trainer.shuffle_dataset,
            seed=warmup_seed(args.seed),
        )

    while True:
        loader = trainer._get_dataloader(
            dataset=trainer.train_dataset,
            description="Critic warm-up",
            batch_size=trainer._train_batch_size * args.steps_per_generation,
            sampler_fn=sampler,
            is_training=True,
        )
        yield from loader


def _critic_round(trainer: Any, out: dict[str, Any]) -> float:
    """The critic-only optimiser steps on one scored generation batch; the value loss
    (the mean over optimiser steps of the step's whole-batch value loss)."""
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    args = trainer.args
    shuffled: Any = shuffle_sequence_dict(out)
    chunks = split_tensor_dict(shuffled, args.steps_per_generation)
    trainer._set_shares(chunks)
    world = trainer.accelerator.num_processes
    accumulation = args.gradient_accumulation_steps
    total, steps = 0.0, 0
    for _ in range(args.num_iterations):
        for w in range(0, len(chunks), accumulation):
            window = 0.0
            for k in range(w, w + accumulation):
                chunk: dict[str, Any] = chunks[k]
                mb, s = trainer._update_forward(chunk, critic_only=True)
                loss, entries = step.minibatch_loss(
                    mb,
                    s.logprobs,
                    s.values,
                    trainer.loss_settings,
                    train_actor=False,
                    share=float(chunk["comppo_share"]),
                    token_share=float(chunk["comppo_token_share"]),
                )
                assert loss is not None
                trainer._critic_backward(loss * world, boundary=k == w + accumulation - 1)
                window += entries["value_loss"]
            trainer._step_critic()
            if world > 1:
                window = float(trainer.accelerator.reduce(torch.tensor([window], device=trainer.accelerator.device)))
            total += window
            steps += 1
    return total / max(steps, 1)


def warm_up_critic(trainer: Any, rounds: int) -> list[dict[str, Any]]:
    """Run ``rounds`` critic-only rounds of a :class:`~comppo_core.integrations.trl.CompPOTrainer`
    (module docstring); return one row per round."""
    args = trainer.args
    metrics, logs = trainer._metrics, copy.deepcopy(trainer._logs)
    tokens_seen = trainer.state.num_input_tokens_seen
    batches = _warmup_batches(trainer)
    rows: list[dict[str, Any]] = []
    devices = [trainer.accelerator.device] if trainer.accelerator.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(warmup_seed(args.seed))
            for i in range(rounds):
                trainer._metrics = {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)}
                trainer._gate_step = WARMUP_STEP_KEYS + i  # the package's warm-up gate draws
                out = trainer._generate_and_score_completions(next(batches))
                trainer._gate_step = None
                seen = trainer._metrics["train"]
                explained = seen.get("comppo/value_explained_var") or [None]
                value_loss = _critic_round(trainer, out)
                rows.append(
                    {
                        "round": i,
                        "reward_mean": seen["reward"][-1] if seen.get("reward") else None,
                        "value_explained_var": explained[-1],
                        "value_loss": value_loss,
                    }
                )
    finally:
        trainer._gate_step = None
        trainer._metrics, trainer._logs = metrics, logs
        trainer.state.num_input_tokens_seen = tokens_seen
    from transformers import Trainer

    for row in rows:  # transformers' log: TRL's would fold in (and clear) the PPO steps' metrics
        Trainer.log(trainer, {f"comppo/warmup/{key}": value for key, value in row.items()})
    return rows
