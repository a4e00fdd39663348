"""Critic warm-up: rounds of value-only training before the first PPO step.

A critic is a baseline; one that has learned nothing turns PPO into REINFORCE with a
near-constant baseline (explained variance 0.00–0.03 over the first 15 steps of a cold
TAC on the built-in task). So a fresh run of an arm with a critic first trains the critic
alone for ``TrainConfig.critic_warmup`` rounds (default
:data:`~comppo_core.rl.config.DEFAULT_CRITIC_WARMUP`; 0 for ``grpo``)::

    for i in 0 … rounds−1:
        rollout of the warm-started policy        (its own prompt stream and sampling keys)
        score, advantages                          (as a PPO step: the same functions)
        ppo_epochs × num_minibatches updates of the critic alone (the actor does not move)

The rounds are extra: every arm still makes ``steps`` PPO steps of the actor, so an arm
with a critic and ``grpo`` spend the same actor budget. The rounds draw prompts from
``default_rng([seed, 3])`` and sample with the keys of steps ``2³² + i`` (disjoint from
the PPO steps'), under their own torch RNG (``seed·1000 + 3``), so the PPO steps that
follow see the same prompts, keys and permutations in every arm of a seed (paired
comparisons). The critic's explained variance ``1 − Var(R − V)/Var(R)`` before each
round's update is logged per round (``critic_warmup.jsonl``, and ``warm_start`` in the
summary and checkpoint); after the warm-up, it is logged every step as
``value_explained_var``.

**Stopping.** The warm-up runs before the first PPO step, where a stop request (Ctrl-C,
SIGTERM: :class:`~comppo_core.rl.runs.interrupts.GracefulStop`) is acted on; it is not
cut short (the checkpoint at step 0 holds the warmed-up critic, so a resumed run is the
run never interrupted), but a request made during it is answered at once with a line on
stderr saying the run stops when the warm-up is done (:data:`STOP_NOTICE`,
:func:`~comppo_core.rl.runs.interrupts.notice_on_stop`).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from ..runs.interrupts import notice_on_stop
from ..runs.run_dir import write_text_atomic

__all__ = ["STOP_NOTICE", "WARMUP_STEP_KEYS", "warm_up_critic"]

#: The sampling key of warm-up round i is that of step ``WARMUP_STEP_KEYS + i``.
WARMUP_STEP_KEYS = 2**32

#: What a stop requested during the warm-up prints at once (round ``done + 1`` of ``rounds`` under way).
STOP_NOTICE = (
    "comppo-core: stopping once the critic warm-up is done (round {round} of {rounds} under way), before step 0, "
    "with a checkpoint to resume from; Ctrl-C again stops at once"
)


def warm_up_critic(trainer: Any, rounds: int) -> list[dict[str, Any]]:
    """Run ``rounds`` critic-only rounds of ``trainer`` (a :class:`~comppo_core.rl.Trainer`);
    return one row per round: ``round``, ``reward_mean``, ``value_explained_var`` (before
    the round's update; None when the returns do not vary), ``value_loss``; rank 0 writes
    them to ``OUT/critic_warmup.jsonl``."""
    cfg = trainer.config
    rows: list[dict[str, Any]] = []

    def notice() -> str:
        return STOP_NOTICE.format(round=min(len(rows) + 1, rounds), rounds=rounds)

    with torch.random.fork_rng(devices=[]), notice_on_stop(notice):
        torch.manual_seed(cfg.seed * 1000 + 3)
        rng = np.random.default_rng([cfg.seed, 3])
        for i in range(rounds):
            key = WARMUP_STEP_KEYS + i
            r = trainer.rollout(key, rng=rng)
            batch = trainer.score(r, key)
            stats = trainer.compute_advantages(r, batch)
            update = trainer.update(batch, key, train_actor=False)
            rewards = trainer.dist.gather_rows(r.rewards)
            rows.append(
                {
                    "round": i,
                    "reward_mean": float(rewards.double().mean()),
                    "value_explained_var": stats["value_explained_var"],
                    "value_loss": update.get("value_loss"),
                }
            )
    if trainer.out is not None and trainer.dist.is_main:
        write_text_atomic(trainer.out / "critic_warmup.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return rows
