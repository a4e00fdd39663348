"""What a run is built from: its task, its initial policy (the built-in one and its SFT
warm start, a user's model, or another run's), the critic an arm asks for, and the frozen KL reference.

Every function here is called once per run by :class:`comppo_core.rl.Trainer` (and can be
called on its own: a test of the step's maths builds a policy and a critic without a
trainer). Randomness comes from torch's global RNG (model initialisations) and the
NumPy generator passed in (the SFT batches), so the trainer fixes both.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from ...errors import NonFiniteError, ParameterError
from ..config import TrainConfig
from ..core.arms import Arm
from ..critics.standard import StandardCritic
from ..critics.tac import TransportAlignedCritic
from ..models.pretrained import load_policy, load_tokenizer
from ..tasks import build_task
from ..tasks.addition import AdditionTask, worked_solution
from ..tasks.base import Problem, Task, Tokenizer

__all__ = [
    "build_policy",
    "demonstrations",
    "initial_policy",
    "make_critic",
    "make_reference",
    "make_task",
    "sft_warm_start",
]


def make_task(config: TrainConfig) -> tuple[Task, Tokenizer]:
    """The run's task (:func:`comppo_core.rl.tasks.build_task`) and tokenizer: the model's
    with ``config.model``, else the task's own (a built-in task's character tokenizer)."""
    task = build_task(config)
    if config.model is not None:
        return task, load_tokenizer(config.model, chat_template=config.chat_template)
    return task, _own_tokenizer(task)


def _own_tokenizer(task: Task) -> Tokenizer:
    """``task.tokenizer``, or a :class:`~comppo_core.errors.ParameterError` naming ``model``
    for a task without one (which the config refuses without a model)."""
    if task.tokenizer is None:
        raise ParameterError(
            f"model: expected a local model directory for the task {task.name!r} (it has no tokenizer of its own), "
            "got None",
            argument="model",
        )
    return task.tokenizer


def build_policy(config: TrainConfig, vocab_size: int) -> Any:
    """The built-in policy: a randomly initialised Llama (from torch's global RNG)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.model_hidden,
        intermediate_size=config.model_intermediate,
        num_hidden_layers=config.model_layers,
        num_attention_heads=config.model_heads,
        num_key_value_heads=config.model_kv_heads,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg)


def demonstrations(
    task: Task, problems: list[Problem], rng: np.random.Generator, carry_noise: float = 0.0
) -> list[str]:
    """The SFT targets of ``problems``, without EOS.

    A task with a ``demonstration(problem, rng)`` method gives one per problem, drawn with
    ``rng`` each time (the chain task's random filler); any other task gives each
    ``problem.solution``. ``carry_noise > 0`` (the addition tasks only; another task is a
    :class:`~comppo_core.errors.ParameterError`) replaces each solution, with probability
    ``carry_noise`` drawn per sequence with ``rng``, by the one that forgets every carry
    (between fillers: the draws of who forgets come first, then each demonstration's
    fillers); 0 draws nothing."""
    if carry_noise > 0.0 and not isinstance(task, AdditionTask):
        raise ParameterError(
            f"carry_noise: expected 0 for the task {task.name!r} (carries are addition's), got {carry_noise!r}",
            argument="carry_noise",
        )
    demo = getattr(task, "demonstration", None)
    if callable(demo) and carry_noise > 0.0:  # addition between fillers: who forgets first, then the fillers
        forget = rng.random(len(problems)) < carry_noise
        return [demo(p, rng, carries=not f) for p, f in zip(problems, forget)]
    if callable(demo):
        return [demo(p, rng) for p in problems]
    solutions = [p.solution for p in problems]
    if carry_noise > 0.0:
        forget = rng.random(len(problems)) < carry_noise
        solutions = [
            worked_solution(*map(int, p.prompt[:-1].split("+")), carries=False) if f else sol
            for p, sol, f in zip(problems, solutions, forget)
        ]
    return solutions


def sft_warm_start(
    model: nn.Module,
    task: Task,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    rng: np.random.Generator,
    carry_noise: float = 0.0,
) -> list[float]:
    """Supervised warm start on the task's demonstrations (:func:`demonstrations`); returns the loss per step.

    Cross-entropy on the response tokens (EOS included) of ``bos + prompt + solution +
    eos``, right-padded; AdamW (no weight decay), linear warm-up over 50 steps then
    linear decay to 0, gradients clipped at norm 1. Training problems only.

    ``carry_noise``: the share of the demonstrations of problems that carry which forget
    every carry (:func:`~comppo_core.rl.tasks.addition.worked_solution` with ``carries=False``: right
    format, wrong answer), drawn per sequence with ``rng`` after the batch's problems. The
    warm-started policy then hesitates at the pivotal carry tokens, which the verifier's
    reward can teach (the demo's setting). 0 draws nothing: the stream of problems is the
    same as without the option."""
    tok = _own_tokenizer(task)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.0, 1.0 - s / max(steps, 1)))
    model.train()
    out: list[float] = []
    for _ in range(steps):
        problems = task.sample(rng, batch_size)
        solutions = demonstrations(task, problems, rng, carry_noise)
        seqs = [
            (tok.encode(p.prompt, add_bos=True), tok.encode(sol, add_eos=True)) for p, sol in zip(problems, solutions)
        ]
        width = max(len(a) + len(b) for a, b in seqs)
        ids = torch.full((batch_size, width), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for i, (a, b) in enumerate(seqs):
            ids[i, : len(a) + len(b)] = torch.tensor(a + b)
            labels[i, len(a) : len(a) + len(b)] = torch.tensor(b)
            mask[i, : len(a) + len(b)] = 1
        loss = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
        if not torch.isfinite(loss):
            raise NonFiniteError(
                f"loss: expected a finite SFT loss, got {loss.item()} at warm-start step {len(out)}", argument="loss"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        out.append(float(loss.detach()))
    model.eval()
    return out


def initial_policy(
    config: TrainConfig, task: Task, vocab_size: int, device: torch.device
) -> tuple[Any, dict[str, Any]]:
    """The policy a fresh run starts from, in eval mode, and its ``warm_start`` record: the
    user's ``model``, the run ``init_from`` points at, or the built-in Llama (torch's
    global RNG) after :func:`sft_warm_start` (``default_rng([seed, 1])``)."""
    cfg = config
    t0 = time.perf_counter()
    sft_losses: list[float] = []
    if cfg.model is not None:
        actor = load_policy(cfg.model).to(device)
    elif cfg.init_from is not None:
        actor = load_policy(cfg.init_from, argument="init_from").to(device)
    else:
        actor = build_policy(cfg, vocab_size).to(device)
        sft_rng = np.random.default_rng([cfg.seed, 1])
        sft: dict[str, Any] = {"steps": cfg.warmup_sft_steps, "batch_size": cfg.sft_batch_size, "lr": cfg.sft_lr}
        sft_losses = sft_warm_start(actor, task, rng=sft_rng, carry_noise=cfg.sft_carry_noise, **sft)
    actor.eval()
    warm_start = {
        "sft_steps": len(sft_losses),
        "sft_seconds": time.perf_counter() - t0,
        "sft_final_loss": sft_losses[-1] if sft_losses else None,
        "init_from": cfg.init_from,
        "model": cfg.model,
    }
    return actor, warm_start


def make_critic(arm: Arm, actor: Any, config: TrainConfig) -> nn.Module | None:
    """The arm's critic, sized for ``actor`` (without an adapter): a
    :class:`~comppo_core.rl.TransportAlignedCritic` (initialised from torch's global RNG),
    a :class:`~comppo_core.rl.StandardCritic` copied from the actor (its head from a
    generator seeded ``seed·1000 + 3``), or None."""
    if arm.critic == "tac":
        return TransportAlignedCritic.for_model(
            actor, width=config.tac_width, temporal=config.tac_temporal, trunk_grad=config.trunk_grad
        )
    if arm.critic == "standard":
        return StandardCritic.from_actor(actor, generator=torch.Generator().manual_seed(config.seed * 1000 + 3))
    return None


def make_reference(actor: Any, dtype: torch.dtype | None = None) -> Any:
    """A frozen copy of ``actor`` (eval mode, no gradients): the KL reference, stored in
    ``dtype`` (None: the actor's)."""
    ref = copy.deepcopy(actor).eval()
    if dtype is not None:
        ref = ref.to(dtype)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
