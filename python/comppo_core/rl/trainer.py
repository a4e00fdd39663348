"""``train(config)``: PPO for a causal LM with the paper's arms, on one process or under ``torchrun``.

One step, in the shape of TRL's PPO step (names as verl and TRL use them)::

    1. rollout      G = group_size samples per prompt with model.generate (temperature, top_p,
                    max_new_tokens, stop at EOS; grad off; prompts left-padded); each row's
                    draws are uniforms keyed by (seed, step, prompt, sample)
                    (:mod:`comppo_core.rl.sampling`); the task's verifier scores each
                    response; score → rewards at its last token
    2. score        rl.forward: old log-probs, concentration → gates (a control arm's
                    control of them), old values: one actor forward;
                    the frozen reference's log-probs when a KL is used or logged; every
                    log-prob (old, new, reference) is of logits / temperature, the
                    distribution sampled from, as verl and TRL score
    3. advantages   KL in the rewards (kl_mode="reward": r_t −= kl_coef·KL_t, TRL);
                    critic arms: cc.gae(rewards, values, gates, γ, λ, λ_critic) → advantages and
                    returns, then cc.masked_whiten; grpo: cc.group_advantages(Σ_t r_t) and
                    cc.broadcast; gates from the arm (concentration, cc.controls, or none)
    4. update       ppo_epochs × num_minibatches of
                       loss = policy_loss + vf_coef·value_loss (+ kl_coef·KL loss, kl_mode="loss")
                    each optimiser clipping its own gradient (max_grad_norm), AdamW with actor_lr
                    and critic_lr; the first critic_warmup steps train the critic alone

Columns are ``[B, T−1]`` as everywhere in :mod:`comppo_core.rl`: column j scores token
``ids[:, j+1]``; the response columns are ``P−1 … P+L−2`` for a prompt of width P and a
response of L tokens (its EOS included). Arms differ only in the critic they train and
the gates their advantages use (:mod:`comppo_core.rl.arms`).

**Scale.** Under ``torchrun --nproc-per-node N`` the same step runs on every rank
(:mod:`comppo_core.rl.distributed`): the prompts are sharded, every batch-wide statistic
(group baselines, whitening, the controls, the metrics) is computed over the gathered
global batch, gradients are all-reduced, and rank 0 writes the outputs; the parameters
after k steps are those of one process on the same global batch, up to float rounding.

**Models and data.** The built-in policy is a small Llama with the task's character
tokenizer and an SFT warm start; ``config.model`` is a local Hugging Face directory instead
(:mod:`comppo_core.rl.pretrained`), and ``config.task`` a JSONL file of prompts and answers
(:mod:`comppo_core.rl.jsonl_task`). ``config.lora_rank > 0`` trains a peft LoRA adapter
(:mod:`comppo_core.rl.lora`): the reference is then the model with the adapter disabled,
and checkpoints hold the adapter.

Outputs under ``config.out``: ``config.json``; ``metrics.jsonl`` (one row per step, keys
:data:`METRIC_KEYS`); ``summary.json``; ``warmstart/`` (the policy after the SFT warm start,
also the KL reference; not written for ``config.model``, which is its own); ``checkpoint/``
(the actor via ``save_pretrained``, the adapter alone with LoRA, the critic's
and both optimisers' state, the RNG states, the next step), written every ``save_every``
steps and after the last, atomically (a crash while writing leaves the previous one).
``config.resume`` continues from it, bit for bit on CPU. A non-finite loss or gradient
stops the run with a :class:`~comppo_core.errors.NonFiniteError` naming the step, and the
last good checkpoint is left as it was.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import controls, gating
from ..advantages import gae
from ..diagnostics import credit_stats
from ..errors import NonFiniteError, ParameterError
from ..hf.probe import default_position_ids, token_logprobs
from ..outcomes import broadcast, group_advantages
from ..whitening import masked_whiten
from . import lora, losses
from .arms import Arm, get_arm
from .config import TASKS, TrainConfig
from .critic_inputs import CriticInputs
from .distributed import Dist, shard_bounds
from .forward import GatesFromConcentration, forward
from .jsonl_task import JsonlTask
from .pretrained import load_policy, load_tokenizer, quiet_transformers
from .sampling import row_keys, sampling_processors
from .standard_critic import StandardCritic
from .tac import TransportAlignedCritic
from .tasks import AdditionTask, Problem

__all__ = ["METRIC_KEYS", "Batch", "Rollout", "Trainer", "make_task", "sft_warm_start", "train"]

#: The keys of each ``metrics.jsonl`` row (None where a quantity does not apply to the arm or step).
METRIC_KEYS = (
    "step",
    "arm",
    "seed",
    "reward_mean",
    "train_accuracy",
    "eval_accuracy",
    "kl",
    "kl_loss",
    "approx_kl",
    "clipfrac",
    "pg_loss",
    "value_loss",
    "value_clipfrac",
    "value_explained_var",
    "gate_mean",
    "gate_min",
    "gate_max",
    "adv_gini",
    "adv_effective_token_ratio",
    "response_length",
    "entropy",
    "grad_norm_actor",
    "grad_norm_critic",
    "actor_updated",
    "time_rollout_s",
    "time_score_s",
    "time_advantages_s",
    "time_update_s",
    "time_eval_s",
)

#: Config fields a resumed run may change.
RESUMABLE_CHANGES = ("steps", "resume", "progress", "save_every", "eval_every", "num_threads", "device")


# ---------------------------------------------------------------------------------------------------------
# data of one step


@dataclasses.dataclass
class Rollout:
    """Phase 1: sampled responses and their scores.

    Attributes:
      input_ids: ``[B, T]`` left-padded prompt then response (right-padded after EOS).
      attention_mask: ``[B, T]`` bool, the real tokens.
      response_mask: ``[B, T−1]`` bool, the response columns (each token up to the first EOS).
      groups: ``[B]`` int64, the prompt each sample answers.
      scores: ``[B]`` float32, the verifier's score.
      finished: ``[B]`` bool, whether the response stopped at EOS.
      problems, responses: the problems and the decoded responses (text before EOS).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    groups: torch.Tensor
    scores: torch.Tensor
    finished: torch.Tensor
    problems: list[Problem]
    responses: list[str]


@dataclasses.dataclass
class Batch:
    """Phases 2–3: what the PPO update reads, ``[B, T−1]`` per token."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    #: gates the critic reads in the update (a constant or a control); None: the forward's own
    critic_gates: torch.Tensor | None = None
    #: Comp-GAE's gates (1 outside the response); None for the arms without gates
    gates: torch.Tensor | None = None

    def select(self, index: torch.Tensor) -> Batch:
        """The rows ``index`` (a minibatch)."""
        rows: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            rows[f.name] = None if v is None else v[index]
        return Batch(**rows)


# ---------------------------------------------------------------------------------------------------------
# building blocks


def _left_pad(rows: Sequence[Sequence[int]], pad: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, width]`` ids and mask, each row right-aligned (``width``: default the longest row)."""
    width = max(len(r) for r in rows) if width is None else width
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = True
    return ids, mask


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


def sft_warm_start(
    model: nn.Module, task: AdditionTask, *, steps: int, batch_size: int, lr: float, rng: np.random.Generator
) -> list[float]:
    """Supervised warm start on the task's worked solutions; returns the loss per step.

    Cross-entropy on the response tokens (EOS included) of ``bos + prompt + solution +
    eos``, right-padded; AdamW (no weight decay), linear warm-up over 50 steps then
    linear decay to 0, gradients clipped at norm 1. Training problems only."""
    tok = task.tokenizer
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.0, 1.0 - s / max(steps, 1)))
    model.train()
    out: list[float] = []
    for _ in range(steps):
        seqs = [
            (tok.encode(p.prompt, add_bos=True), tok.encode(p.solution, add_eos=True))
            for p in task.sample(rng, batch_size)
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


def terminal_rewards(response_mask: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``[B, T−1]`` float32 rewards: ``scores[b]`` at row b's last response column, 0 elsewhere
    (a row without a response column gets its score at column 0, which no mask selects)."""
    m = response_mask
    last = (m.long() * torch.arange(m.shape[1], device=m.device)).argmax(-1)
    rewards = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    rewards[torch.arange(m.shape[0], device=m.device), last] = scores.to(device=m.device, dtype=torch.float32)
    return rewards


def _logprobs(model: Any, ids: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[B, T−1]`` log-probs at ``temperature`` of a plain forward, 0 outside the scored columns."""
    logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=default_position_ids(mask), use_cache=False)
    lp = token_logprobs(logits.logits[:, :-1], ids[:, 1:], temperature=temperature)
    return torch.where(mask[:, :-1] & mask[:, 1:], lp, torch.zeros_like(lp))


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.to(torch.bool)
    return float(x[m].double().mean()) if bool(m.any()) else math.nan


def _explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float | None:
    """``1 − Var(R − V)/Var(R)`` over the response tokens (population variances); None when
    Var(R) <= 1e-10 (e.g. a batch without reward, whose returns are 0 up to rounding)."""
    m = mask.to(torch.bool)
    r, v = returns[m].double(), values[m].double()
    var_r = float(r.var(unbiased=False)) if r.numel() else 0.0
    if var_r <= 1e-10:
        return None
    return 1.0 - float((r - v).var(unbiased=False)) / var_r


def _finite_or_none(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


class _Timer:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> _Timer:  # noqa: PYI034 (typing.Self needs Python 3.11)
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t


def make_task(config: TrainConfig) -> tuple[Any, Any]:
    """The run's task and tokenizer: the built-in addition task with its character tokenizer,
    or (with ``config.model``) the model's tokenizer; a JSONL file with the model's tokenizer."""
    tokenizer = None if config.model is None else load_tokenizer(config.model, chat_template=config.chat_template)
    if config.task in TASKS:
        task: Any = AdditionTask(config.digits, split_seed=config.split_seed, heldout_fraction=config.heldout_fraction)
        return task, task.tokenizer if tokenizer is None else tokenizer
    task = JsonlTask(
        config.task,
        split_seed=config.split_seed,
        heldout_fraction=config.heldout_fraction,
        max_new_tokens=config.max_new_tokens,
    )
    return task, tokenizer


# ---------------------------------------------------------------------------------------------------------
# the trainer


class Trainer:
    """The state of one run (policy, reference, critic, optimisers, RNGs) and its step.

    ``Trainer(config)`` builds or resumes everything (joining torch.distributed when
    ``torchrun`` started the process); :meth:`train` runs the remaining steps and returns
    the summary; :meth:`step` runs one (module docstring)."""

    #: the policy, a transformers causal LM (with LoRA: the model the adapter is injected into)
    actor: Any
    #: the frozen KL reference (the policy after the warm start), or None (no KL, or LoRA:
    #: then the reference is ``actor`` with the adapter disabled)
    reference: Any
    critic: nn.Module | None
    #: the ``peft.PeftModel`` around ``actor`` when ``lora_rank > 0``, else None
    lora_model: Any

    def __init__(self, config: TrainConfig) -> None:
        if not isinstance(config, TrainConfig):
            raise ParameterError(f"config: expected a TrainConfig, got {type(config).__name__}", argument="config")
        self.config = config
        self.arm: Arm = get_arm(config.arm)
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.dist = Dist.setup(config.device)
        try:
            self._build(config)
        except BaseException:
            self.dist.close()  # a process group this constructor created
            raise

    def _build(self, config: TrainConfig) -> None:
        self.device = self.dist.device
        if config.prompts_per_step % self.dist.world_size:
            raise ParameterError(
                f"prompts_per_step: expected a multiple of the {self.dist.world_size} processes (each rank takes an equal "
                f"share of the prompts), got {config.prompts_per_step}",
                argument="prompts_per_step",
            )
        self.task, self.tokenizer = make_task(config)
        self.max_new_tokens = config.max_new_tokens or self.task.max_new_tokens
        self.eval_problems = self.task.heldout(config.eval_size)
        self.out = None if config.out is None else Path(config.out)
        self.warm_start: dict[str, Any] = {}
        self.start_step = 0
        self.lora_model = None
        self.uses_reference = config.kl_coef != 0.0 or config.log_kl
        local = config.batch_size // self.dist.world_size
        #: this rank's rows of the global batch
        self.rows = slice(self.dist.rank * local, (self.dist.rank + 1) * local)
        # the run's own torch RNG stream (the update's permutations): swapped in for each step
        # and out after it, so runs in one process do not disturb each other or the caller's RNG
        with torch.random.fork_rng(devices=[]):
            if config.resume:
                self._resume()
            else:
                self._fresh()
            self.torch_rng = torch.get_rng_state()

    # ---- construction

    def _fresh(self) -> None:
        cfg = self.config
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        sft_losses: list[float] = []
        if cfg.model is not None:
            actor = load_policy(cfg.model).to(self.device)
        elif cfg.init_from is not None:
            actor = self._load_actor(cfg.init_from)
        else:
            actor = build_policy(cfg, self.tokenizer.vocab_size).to(self.device)
            sft_rng = np.random.default_rng([cfg.seed, 1])
            sft_losses = sft_warm_start(
                actor, self.task, steps=cfg.warmup_sft_steps, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr, rng=sft_rng
            )
        actor.eval()
        self.dist.broadcast_module(actor)  # one set of weights, whatever each rank's warm start did
        self.warm_start = {
            "sft_steps": len(sft_losses),
            "sft_seconds": time.perf_counter() - t0,
            "sft_final_loss": sft_losses[-1] if sft_losses else None,
            "init_from": cfg.init_from,
            "model": cfg.model,
        }
        if self.out is not None and self.dist.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text(cfg.to_json())
            if cfg.model is None:
                with quiet_transformers():
                    actor.save_pretrained(self.out / "warmstart")
                (self.out / "warmstart" / "task.json").write_text(
                    json.dumps({**self.task.to_dict(), "tokenizer": self.tokenizer.to_dict()})
                )
            (self.out / "metrics.jsonl").write_text("")
        self.dist.barrier()
        self.reference = self._make_reference(actor)
        # the critic and the RL stream get their own seeds, so every arm of a seed starts
        # its rollouts from the same RNG state (paired comparisons)
        torch.manual_seed(cfg.seed * 1000 + 1)
        self.critic = self._make_critic(actor)
        self.dist.broadcast_module(self.critic)
        self.actor = actor
        if cfg.lora_rank:
            self.lora_model = lora.add_adapter(
                actor,
                rank=cfg.lora_rank,
                alpha=cfg.lora_alpha,
                modules=cfg.lora_target_modules,
                seed=cfg.seed * 1000 + 4,
            )
            self.actor = self.lora_model.get_base_model()
        self._make_optimizers()
        torch.manual_seed(cfg.seed * 1000 + 2)
        self.rng = np.random.default_rng([cfg.seed, 2])

    def _load_actor(self, path: Any) -> Any:
        return load_policy(path, argument="init_from").to(self.device)

    def _initial_policy(self) -> Any:
        """The policy the run started from (the base of an adapter, the KL reference)."""
        if self.config.model is not None:
            return load_policy(self.config.model).to(self.device)
        assert self.out is not None
        return self._load_actor(self.out / "warmstart")

    def _make_reference(self, actor: Any) -> Any:
        if not self.uses_reference or self.config.lora_rank:
            return None
        ref = copy.deepcopy(actor).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _make_critic(self, actor: Any) -> nn.Module | None:
        """The arm's critic, sized for (a standard critic: copied from) ``actor`` without an adapter."""
        cfg = self.config
        if self.arm.critic == "tac":
            return TransportAlignedCritic.for_model(
                actor, width=cfg.tac_width, temporal=cfg.tac_temporal, trunk_grad=cfg.trunk_grad
            )
        if self.arm.critic == "standard":
            return StandardCritic.from_actor(actor, generator=torch.Generator().manual_seed(cfg.seed * 1000 + 3))
        return None

    def _make_optimizers(self) -> None:
        cfg = self.config
        owner = self.actor if self.lora_model is None else self.lora_model
        #: what the actor's optimiser trains: every weight, or the adapter's
        self.actor_params = [p for p in owner.parameters() if p.requires_grad]
        self.critic_params = [] if self.critic is None else [p for p in self.critic.parameters() if p.requires_grad]
        self.actor_opt = torch.optim.AdamW(self.actor_params, lr=cfg.actor_lr, weight_decay=cfg.weight_decay)
        self.critic_opt = (
            None
            if self.critic is None
            else torch.optim.AdamW(self.critic_params, lr=cfg.critic_lr, weight_decay=cfg.weight_decay)
        )

    # ---- checkpoints

    @property
    def checkpoint_dir(self) -> Path | None:
        return None if self.out is None else self.out / "checkpoint"

    def save_checkpoint(self, next_step: int) -> None:
        """Write ``OUT/checkpoint`` for a run that continues at ``next_step`` (rank 0;
        atomically: the new one is written beside the old one, then swapped in)."""
        if self.out is None or not self.dist.is_main:
            return
        final, tmp, old = self.out / "checkpoint", self.out / "checkpoint.tmp", self.out / "checkpoint.old"
        shutil.rmtree(tmp, ignore_errors=True)
        with quiet_transformers():
            (self.actor if self.lora_model is None else self.lora_model).save_pretrained(tmp / "actor")
        state: dict[str, Any] = {
            "next_step": next_step,
            "torch_rng": self.torch_rng,
            "actor_opt": self.actor_opt.state_dict(),
        }
        if self.critic is not None:
            assert self.critic_opt is not None
            state["critic"] = self.critic.state_dict()
            state["critic_opt"] = self.critic_opt.state_dict()
        torch.save(state, tmp / "state.pt")
        (tmp / "rng.json").write_text(json.dumps(self.rng.bit_generator.state))
        (tmp / "config.json").write_text(self.config.to_json())
        (tmp / "warm_start.json").write_text(json.dumps(self.warm_start))
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)

    def _resume(self) -> None:
        assert self.out is not None
        cfg = self.config
        ckpt = self.out / "checkpoint"
        if not ckpt.is_dir() and (self.out / "checkpoint.old").is_dir():
            ckpt = self.out / "checkpoint.old"  # a crash between the two renames of save_checkpoint
        if not (ckpt / "state.pt").is_file():
            raise ParameterError(
                f"resume: expected a checkpoint in {str(self.out / 'checkpoint')!r}, found none", argument="resume"
            )
        saved = TrainConfig.from_json((ckpt / "config.json").read_text())
        diff = [
            f.name
            for f in dataclasses.fields(TrainConfig)
            if f.name not in RESUMABLE_CHANGES and getattr(saved, f.name) != getattr(cfg, f.name)
        ]
        if diff:
            name = diff[0]
            raise ParameterError(
                f"{name}: a resumed run must keep the checkpoint's settings (only {', '.join(RESUMABLE_CHANGES)} may "
                f"change); the checkpoint has {getattr(saved, name)!r}, got {getattr(cfg, name)!r}",
                argument=name,
            )
        self.warm_start = json.loads((ckpt / "warm_start.json").read_text())
        base = self._initial_policy().eval() if cfg.lora_rank else self._load_actor(ckpt / "actor").eval()
        self.reference = (
            self._make_reference(self._initial_policy()) if self.uses_reference and not cfg.lora_rank else None
        )
        self.critic = self._make_critic(base)
        self.actor = base
        if cfg.lora_rank:
            self.lora_model = lora.load_adapter(base, ckpt / "actor")
            self.actor = self.lora_model.get_base_model()
        state = torch.load(ckpt / "state.pt", weights_only=True, map_location="cpu")
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self._make_optimizers()
        self.actor_opt.load_state_dict(state["actor_opt"])
        if self.critic_opt is not None:
            self.critic_opt.load_state_dict(state["critic_opt"])
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = json.loads((ckpt / "rng.json").read_text())
        torch.set_rng_state(state["torch_rng"])
        self.start_step = int(state["next_step"])
        self.dist.barrier()  # every rank has read the checkpoint before rank 0 rewrites the outputs
        if self.dist.is_main:
            # metrics.jsonl keeps the rows of the steps before the checkpoint
            path = self.out / "metrics.jsonl"
            rows = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
            kept = [ln for ln in rows if json.loads(ln)["step"] < self.start_step]
            path.write_text("".join(ln + "\n" for ln in kept))
            (self.out / "config.json").write_text(cfg.to_json())

    # ---- phase 1: rollout

    def _generation_config(self) -> Any:
        """Greedy decoding; sampling is the inverse-CDF sampler of :mod:`comppo_core.rl.sampling`."""
        from transformers import GenerationConfig

        tok = self.tokenizer
        return GenerationConfig(
            do_sample=False,
            max_new_tokens=self.max_new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
        )

    def _prompt_width(self, problems: Sequence[Problem]) -> int:
        return max(len(self.tokenizer.encode_prompt(p.prompt)) for p in problems)

    @torch.no_grad()
    def generate(
        self,
        problems: Sequence[Problem],
        sample: bool,
        *,
        keys: torch.Tensor | None = None,
        prompt_width: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """Prompts left-padded to ``prompt_width`` (default: the widest) →
        ``(ids, attention_mask, prompt_width, in_response)``; the response is each token up to
        and including the first EOS (``in_response`` ``[B, R]``). ``sample`` draws with the
        rows' ``keys`` (:func:`~comppo_core.rl.sampling.row_keys`), else greedy."""
        tok = self.tokenizer
        prompt_ids, prompt_mask = _left_pad(
            [tok.encode_prompt(p.prompt) for p in problems], tok.pad_token_id, prompt_width
        )
        prompt_ids, prompt_mask = prompt_ids.to(self.device), prompt_mask.to(self.device)
        width = prompt_ids.shape[1]
        processors = None
        if sample:
            if keys is None:
                raise ParameterError("keys: expected row keys to sample with, got None", argument="keys")
            processors = sampling_processors(self.config.temperature, self.config.top_p, keys.to(self.device), width)
        self.actor.eval()
        ids = self.actor.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask.long(),
            generation_config=self._generation_config(),
            logits_processor=processors,
        )
        is_eos = ids[:, width:] == tok.eos_token_id
        in_response = (is_eos.long().cumsum(-1) - is_eos.long()) == 0
        return ids, torch.cat([prompt_mask, in_response], dim=1), width, in_response

    def _decode(self, ids: torch.Tensor, width: int, in_response: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        eos = self.tokenizer.eos_token_id
        finished = ((ids[:, width:] == eos) & in_response).any(-1)
        texts = [self.tokenizer.decode(row[m].tolist()) for row, m in zip(ids[:, width:], in_response)]
        return texts, finished

    def _scored(
        self,
        problems: list[Problem],
        generated: tuple[torch.Tensor, torch.Tensor, int, torch.Tensor],
        groups: torch.Tensor,
    ) -> Rollout:
        """The :class:`Rollout` of :meth:`generate`'s output: decoded, response columns, verifier scores."""
        ids, mask, width, in_response = generated
        texts, finished = self._decode(ids, width, in_response)
        response_mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool, device=self.device)
        response_mask[:, width - 1 :] = in_response
        scores = torch.tensor(
            self.task.scores(problems, texts, finished.tolist()), dtype=torch.float32, device=self.device
        )
        return Rollout(ids, mask, response_mask, groups, scores, finished, problems, texts)

    def rollout(self, step: int = 0) -> Rollout:
        """Phase 1: ``prompts_per_step`` training problems (this rank's share), ``group_size``
        samples each, drawn with the keys of ``(seed, step, prompt index, sample index)``."""
        cfg = self.config
        prompts = self.task.sample(self.rng, cfg.prompts_per_step)  # the global prompts, the same on every rank
        lo, hi = shard_bounds(cfg.prompts_per_step, self.dist.rank, self.dist.world_size)
        problems = [p for p in prompts[lo:hi] for _ in range(cfg.group_size)]
        keys = row_keys(cfg.seed, step, [(i, g) for i in range(lo, hi) for g in range(cfg.group_size)])
        ids, mask, width, in_response = self.generate(
            problems, sample=True, keys=keys, prompt_width=self._prompt_width(prompts)
        )
        # right-pad to the longest response of the global batch: the one-process layout
        total = self.dist.max_int(ids.shape[1])
        if total > ids.shape[1]:
            extra = total - ids.shape[1]
            ids = torch.cat([ids, ids.new_full((ids.shape[0], extra), self.tokenizer.pad_token_id)], dim=1)
            mask = torch.cat([mask, mask.new_zeros((mask.shape[0], extra))], dim=1)
            in_response = torch.cat([in_response, in_response.new_zeros((in_response.shape[0], extra))], dim=1)
        groups = torch.arange(lo, hi, device=self.device).repeat_interleave(cfg.group_size)
        return self._scored(problems, (ids, mask, width, in_response), groups)

    def answer(self, problems: Sequence[Problem]) -> Rollout:
        """Greedy responses to ``problems`` (one each, this process alone), scored by the
        task's verifier, as a :class:`Rollout` whose ``groups`` are the row indices."""
        problems = list(problems)
        groups = torch.arange(len(problems), device=self.device)
        return self._scored(problems, self.generate(problems, sample=False), groups)

    # ---- phase 2: the scoring pass

    def _policy_forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        grad: bool,
        gates: torch.Tensor | GatesFromConcentration | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """``(logprobs, values, gates, concentration)`` of the actor (and critic) on a batch.

        Arms that read routing (concentration gates or TAC) run :func:`rl.forward`; the
        others need neither the probe nor the taps and run a plain forward (their cost is
        the baseline's own)."""
        cfg = self.config
        needs_probe = self.arm.critic == "tac" or (not grad and self.arm.gates != "none")
        if needs_probe:
            out = forward(
                self.actor,
                ids,
                mask,
                critic=self.critic,
                response_mask=response_mask,
                statistic=cfg.statistic,
                gate_params=cfg.gate_params,
                gates=gates,
                grad=grad,
                temperature=cfg.temperature,
            )
            return out.logprobs, out.values, out.gates, out.concentration
        with contextlib.nullcontext() if grad else torch.no_grad():
            lp = _logprobs(self.actor, ids, mask, cfg.temperature)
            values = None
            if self.critic is not None:  # a StandardCritic: its own forward on the ids
                columns = mask[:, :-1] & mask[:, 1:]
                pos = default_position_ids(mask)
                inputs = CriticInputs(ids, mask, pos, columns, response_mask, {}, None, torch.ones_like(lp))
                values = self.critic(inputs)
        return lp, values, None, None

    @torch.no_grad()
    def reference_logprobs(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Log-probs under the frozen reference: the warm-start copy, or with LoRA the actor
        with its adapter disabled (the base model)."""
        if self.reference is None and self.lora_model is None:
            raise ParameterError(
                "reference: this run keeps no reference (kl_coef = 0 and log_kl off)", argument="reference"
            )
        model = self.actor if self.reference is None else self.reference
        context = lora.adapter_disabled(self.lora_model) if self.reference is None else contextlib.nullcontext()
        with context:
            return _logprobs(model, ids, mask, self.config.temperature)

    def _batch_gates(
        self, gates: torch.Tensor, concentration: torch.Tensor, response_mask: torch.Tensor
    ) -> torch.Tensor:
        """The concentration gates as the global batch defines them: with
        ``gate_normalize="batch"`` the z-score is over every rank's rows (recomputed from the
        gathered concentration); otherwise each row's own (``gates`` as they are)."""
        cfg = self.config
        if cfg.gate_normalize != "batch" or not self.dist.distributed:  # one process: the batch is its rows
            return gates
        conc = self.dist.gather_rows(concentration)
        resp = self.dist.gather_rows(response_mask)
        g = gating.gates_from_concentration(conc, mask=resp, **cfg.gate_params.as_kwargs())
        return torch.as_tensor(g).to(torch.float32)[self.rows]

    def _arm_gates(self, r: Rollout, step: int) -> torch.Tensor | GatesFromConcentration | None:
        """What replaces the concentration gates: None (the arm uses them), a constant gate
        tensor (``fixed_gate``), or the arm's control as a function of the scoring pass's own
        concentration gates (:func:`rl.forward` calls it between the actor and the critic,
        so a control costs no second actor forward), computed over the global batch."""
        cfg, arm = self.config, self.arm
        if not arm.control:
            return None
        if arm.gates == "constant" and cfg.fixed_gate is not None:
            return torch.full(r.response_mask.shape, float(cfg.fixed_gate), device=self.device)

        def control(own: torch.Tensor, concentration: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
            g = self.dist.gather_rows(self._batch_gates(own, concentration, response_mask))
            m = self.dist.gather_rows(response_mask)
            # the array kernels return tensors for tensors (as_tensor only tells the type checker)
            if arm.gates == "constant":
                c = torch.as_tensor(controls.constant(g, mask=m))
            elif arm.gates == "shuffle":
                c = torch.as_tensor(controls.shuffle(g, mask=m, seed=cfg.seed * 1_000_003 + step))
            else:
                c = torch.as_tensor(controls.by_position(g, mask=m))
            return c[self.rows]

        return control

    def score(self, r: Rollout, step: int) -> Batch:
        """Phase 2: old log-probs, values and gates (advantages filled in by phase 3)."""
        override = self._arm_gates(r, step)
        lp, values, gates, conc = self._policy_forward(
            r.input_ids, r.attention_mask, r.response_mask, grad=False, gates=override
        )
        if override is None and gates is not None and conc is not None:
            gates = self._batch_gates(gates, conc, r.response_mask)
        ref = self.reference_logprobs(r.input_ids, r.attention_mask) if self.uses_reference else None
        batch = Batch(
            r.input_ids,
            r.attention_mask,
            r.response_mask,
            lp,
            torch.zeros_like(lp),
            old_values=values,
            ref_logprobs=ref,
            # the replacing gates as the scoring pass used them (1 outside the response)
            critic_gates=None if override is None else gates,
            gates=None if self.arm.gates == "none" else gates,
        )
        return batch

    # ---- phase 3: advantages

    def compute_advantages(self, r: Rollout, batch: Batch) -> dict[str, Any]:
        """Phase 3: rewards (score at the last response token, KL penalty), then the arm's
        advantages (and returns); fills ``batch`` and returns its statistics, all over the
        global batch (per-row work on this rank's rows, batch-wide statistics on the rows
        of every rank)."""
        cfg, dist = self.config, self.dist
        m = batch.response_mask
        rewards = terminal_rewards(m, r.scores)
        kl = None
        if batch.ref_logprobs is not None:
            kl = torch.where(m, losses.kl_penalty(batch.old_logprobs, batch.ref_logprobs, cfg.kl_kind), 0.0)
            if cfg.kl_mode == "reward" and cfg.kl_coef > 0.0:
                rewards = rewards - cfg.kl_coef * kl
        all_m = dist.gather_rows(m)
        if self.arm.uses_gae:
            assert batch.old_values is not None
            # GAE is a recursion along each row: this rank's rows alone
            result = gae(
                rewards,
                batch.old_values,
                mask=m,
                gates=batch.gates,
                gamma=cfg.gamma,
                lam=cfg.lam,
                lam_critic=cfg.lam_critic,
            )
            adv = torch.as_tensor(result.advantages)  # tensors in, tensors out (as_tensor: for the type checker)
            all_adv = dist.gather_rows(adv)
            if cfg.whiten_advantages:
                all_adv = torch.as_tensor(masked_whiten(all_adv, mask=all_m))
                adv = all_adv[self.rows]
            batch.returns = torch.as_tensor(result.returns)
        else:
            seq = torch.as_tensor(
                group_advantages(
                    dist.gather_rows(rewards.double().sum(-1)), dist.gather_rows(r.groups), method=cfg.group_method
                )
            )
            adv = torch.as_tensor(broadcast(seq[self.rows].float(), mask=m))
            all_adv = dist.gather_rows(adv)
        batch.advantages = adv
        credit = credit_stats(all_adv, mask=all_m)
        explained = None
        if batch.returns is not None and batch.old_values is not None:
            explained = _explained_variance(dist.gather_rows(batch.old_values), dist.gather_rows(batch.returns), all_m)
        stats: dict[str, Any] = {
            "kl": None if kl is None else _masked_mean(dist.gather_rows(kl), all_m),
            "adv_gini": credit["gini"],
            "adv_effective_token_ratio": credit["effective_token_ratio"],
            "value_explained_var": explained,
        }
        stats.update(gate_mean=None, gate_min=None, gate_max=None)
        if batch.gates is not None:
            gv = dist.gather_rows(batch.gates)[all_m]
            stats.update(gate_mean=float(gv.double().mean()), gate_min=float(gv.min()), gate_max=float(gv.max()))
        return stats

    # ---- phase 4: the PPO update

    def _shares(self, tokens: torch.Tensor, index: torch.Tensor, mine: torch.Tensor) -> tuple[float, float]:
        """``(loss share, token share)`` of this rank in a minibatch of global rows ``index``
        (this rank's: ``mine``): its part of the minibatch's denominator (tokens for
        token-mean, non-empty rows for the seq-mean modes, 1 for seq-mean-token-sum-norm,
        whose denominator is the fixed response budget) and of its tokens. Both 1 on one process."""
        t_all, t_mine = tokens[index], tokens[mine]
        n_all, n_mine = int(t_all.sum()), int(t_mine.sum())
        token_share = n_mine / n_all if n_all else 0.0
        agg = self.config.loss_agg
        if agg == "token-mean":
            return token_share, token_share
        if agg == "seq-mean-token-sum-norm":
            return 1.0, token_share
        s_all, s_mine = int((t_all > 0).sum()), int((t_mine > 0).sum())
        return (s_mine / s_all if s_all else 0.0), token_share

    def update(self, batch: Batch, step: int) -> dict[str, Any]:
        """Phase 4: ``ppo_epochs`` × ``num_minibatches`` optimiser steps; mean statistics.

        Minibatch k of an epoch is the same set of global rows on every rank (one
        permutation of the global batch, from the run's torch stream); each rank's loss is
        its rows' share of that minibatch's loss, and the gradients are summed over the
        ranks (:meth:`Dist.all_reduce_gradients`) before clipping and stepping."""
        cfg, dist = self.config, self.dist
        train_actor = step >= cfg.critic_warmup
        kl_loss_on = cfg.kl_mode == "loss" and cfg.kl_coef > 0.0 and train_actor
        keys = ["pg_loss", "clipfrac", "approx_kl"]
        if self.critic is not None:
            keys += ["value_loss", "value_clipfrac"]
        if kl_loss_on:
            keys.append("kl_loss")
        sums = torch.zeros(len(keys), dtype=torch.float64)
        norm_sums: dict[str, float] = {}
        count = 0
        n_local = batch.input_ids.shape[0]
        lo = self.rows.start
        tokens = dist.gather_rows(batch.response_mask.sum(-1)).cpu()  # response tokens of every global row
        n = tokens.shape[0]
        params = self.actor_params + self.critic_params
        # seq-mean-token-sum-norm divides by verl's response length, the fixed response budget
        # (the [B, T−1] width would also count the prompt columns and vary with the batch)
        loss_normalizer = float(self.max_new_tokens) if cfg.loss_agg == "seq-mean-token-sum-norm" else None
        for epoch in range(cfg.ppo_epochs):
            for k, index in enumerate(torch.tensor_split(torch.randperm(n), cfg.num_minibatches)):
                mine = index[(index >= lo) & (index < lo + n_local)]
                share, token_share = self._shares(tokens, index, mine)
                where = f"epoch {epoch}, minibatch {k}"
                self.actor_opt.zero_grad(set_to_none=True)
                if self.critic_opt is not None:
                    self.critic_opt.zero_grad(set_to_none=True)
                entries = dict.fromkeys(keys, 0.0)
                loss: torch.Tensor | None = None
                if mine.numel():
                    mb = batch.select((mine - lo).to(self.device))
                    lp, values, _, _ = self._policy_forward(
                        mb.input_ids, mb.attention_mask, mb.response_mask, grad=True, gates=mb.critic_gates
                    )
                    pg_loss, pg = losses.policy_loss(
                        lp,
                        mb.old_logprobs,
                        mb.advantages,
                        mb.response_mask,
                        clip_low=cfg.clip_low,
                        clip_high=cfg.clip_high,
                        dual_clip=cfg.dual_clip,
                        agg=cfg.loss_agg,
                        normalizer=loss_normalizer,
                    )
                    entries.update(
                        pg_loss=pg["pg_loss"] * share,
                        clipfrac=pg["clipfrac"] * token_share,
                        approx_kl=pg["approx_kl"] * token_share,
                    )
                    if train_actor:
                        loss = pg_loss * share
                    if kl_loss_on:
                        assert mb.ref_logprobs is not None and loss is not None
                        kl_loss = losses.aggregate(
                            losses.kl_penalty(lp, mb.ref_logprobs, cfg.kl_kind),
                            mb.response_mask,
                            cfg.loss_agg,
                            normalizer=loss_normalizer,
                        )
                        loss = loss + cfg.kl_coef * (kl_loss * share)
                        entries["kl_loss"] = float(kl_loss.detach()) * share
                    if self.critic is not None:
                        assert values is not None and mb.old_values is not None and mb.returns is not None
                        vf_loss, vf = losses.value_loss(
                            values,
                            mb.old_values,
                            mb.returns,
                            mb.response_mask,
                            clip=cfg.value_clip,
                            agg=cfg.loss_agg,
                            normalizer=loss_normalizer,
                        )
                        term = cfg.vf_coef * (vf_loss * share)
                        loss = term if loss is None else loss + term
                        entries.update(value_loss=vf["vf_loss"] * share, value_clipfrac=vf["clipfrac"] * token_share)
                value = math.nan if loss is None else float(loss.detach())
                bad = loss is not None and not math.isfinite(value)
                if bad and not dist.distributed:
                    raise NonFiniteError(f"loss: expected a finite value, got {value} ({where})", argument="loss")
                if loss is not None and not bad:
                    loss.backward()
                if dist.all_reduce_gradients(params, nonfinite=bad):
                    got = f"got {value}" if bad else "got a non-finite value on another rank"
                    raise NonFiniteError(f"loss: expected a finite value, {got} ({where})", argument="loss")
                norms = {}
                if train_actor:
                    norms["grad_norm_actor"] = float(
                        torch.nn.utils.clip_grad_norm_(self.actor_params, cfg.max_grad_norm)
                    )
                if self.critic is not None:
                    norms["grad_norm_critic"] = float(
                        torch.nn.utils.clip_grad_norm_(self.critic_params, cfg.max_grad_norm)
                    )
                for name, norm in norms.items():
                    if not math.isfinite(norm):
                        raise NonFiniteError(
                            f"gradient: expected a finite norm of the {name[10:]}'s gradient, got {norm} ({where})",
                            argument="gradient",
                        )
                if train_actor:
                    self.actor_opt.step()
                if self.critic_opt is not None:
                    self.critic_opt.step()
                sums += torch.tensor([entries[key] for key in keys], dtype=torch.float64)
                for name, norm in norms.items():
                    norm_sums[name] = norm_sums.get(name, 0.0) + norm
                count += 1
        self.actor.eval()
        totals = dist.sum(sums).tolist()  # each rank's shares of the minibatch statistics, summed
        out: dict[str, Any] = {}
        if count:
            out = {key: total / count for key, total in zip(keys, totals)}
            out.update({name: total / count for name, total in norm_sums.items()})
        out["actor_updated"] = train_actor
        return out

    # ---- evaluation

    def evaluate(self) -> float:
        """Held-out accuracy of greedy decoding on the fixed evaluation set (split across ranks)."""
        problems = self.eval_problems
        lo, hi = shard_bounds(len(problems), self.dist.rank, self.dist.world_size)
        correct = 0.0
        if hi > lo:
            ids, _, width, in_response = self.generate(
                problems[lo:hi], sample=False, prompt_width=self._prompt_width(problems)
            )
            texts, finished = self._decode(ids, width, in_response)
            correct = float(np.sum(self.task.scores(problems[lo:hi], texts, finished.tolist())))
        total = self.dist.sum(torch.tensor([correct], dtype=torch.float64))
        return float(total.item()) / len(problems)

    # ---- one step and the loop

    def step(self, step: int) -> dict[str, Any]:
        """One PPO step (rollout → score → advantages → update); its metrics row (over the
        global batch)."""
        cfg, dist = self.config, self.dist
        row: dict[str, Any] = {key: None for key in METRIC_KEYS}
        row.update(step=step, arm=cfg.arm, seed=cfg.seed)
        if cfg.eval_every and step % cfg.eval_every == 0:
            with _Timer() as t:
                row["eval_accuracy"] = self.evaluate()
            row["time_eval_s"] = t.seconds
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.torch_rng)
            with _Timer() as t_rollout:
                r = self.rollout(step)
            with _Timer() as t_score:
                batch = self.score(r, step)
            with _Timer() as t_adv:
                row.update(self.compute_advantages(r, batch))
            with _Timer() as t_update:
                row.update(self.update(batch, step))
            self.torch_rng = torch.get_rng_state()
        m = dist.gather_rows(batch.response_mask)
        scores = dist.gather_rows(r.scores)
        row.update(
            reward_mean=float(scores.double().mean()),
            train_accuracy=float((scores == 1.0).double().mean()),
            response_length=float(m.sum(-1).double().mean()),
            entropy=-_masked_mean(dist.gather_rows(batch.old_logprobs), m),
            time_rollout_s=t_rollout.seconds,
            time_score_s=t_score.seconds,
            time_advantages_s=t_adv.seconds,
            time_update_s=t_update.seconds,
        )
        return {key: _finite_or_none(row[key]) for key in METRIC_KEYS}

    def _kept(self) -> str:
        ckpt = self.checkpoint_dir
        if ckpt is None:
            return "no checkpoint is written without out"
        if not ckpt.is_dir():
            return "no checkpoint had been written yet"
        saved = torch.load(ckpt / "state.pt", weights_only=True, map_location="cpu")["next_step"]
        return f"the last good checkpoint (continuing at step {saved}) is kept at {str(ckpt)!r}"

    def train(self) -> dict[str, Any]:
        """Run steps ``start_step … steps − 1``; write the outputs (rank 0); return the summary."""
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        cfg = self.config
        main = self.dist.is_main
        rows: list[dict[str, Any]] = []
        bar = tqdm(
            total=cfg.steps, initial=self.start_step, desc=cfg.arm, disable=not (cfg.progress and main), leave=False
        )
        try:
            for s in range(self.start_step, cfg.steps):
                try:
                    row = self.step(s)
                except NonFiniteError as exc:
                    raise NonFiniteError(
                        f"{exc} at step {s}; training stopped, {self._kept()}",
                        argument=exc.argument,
                        row=exc.row,
                        position=exc.position,
                        index=exc.index,
                    ) from exc
                rows.append(row)
                if self.out is not None and main:
                    with open(self.out / "metrics.jsonl", "a") as fh:
                        fh.write(json.dumps(row) + "\n")
                postfix = {"reward": f"{row['reward_mean']:.3f}"}
                if row["eval_accuracy"] is not None:
                    postfix["eval"] = f"{row['eval_accuracy']:.3f}"
                bar.set_postfix(postfix)
                bar.update(1)
                if cfg.save_every and (s + 1) % cfg.save_every == 0 and s + 1 < cfg.steps:
                    self.save_checkpoint(s + 1)
        finally:
            bar.close()
        if self.start_step < cfg.steps or self.checkpoint_dir is None or not self.checkpoint_dir.exists():
            self.save_checkpoint(max(cfg.steps, self.start_step))
        final_eval = self.evaluate() if cfg.eval_every else None
        summary = self._summary(rows, final_eval)
        self.dist.barrier()  # the outputs are complete when any rank returns
        return summary

    def _summary(self, rows: list[dict[str, Any]], final_eval: float | None) -> dict[str, Any]:
        cfg = self.config
        history: list[dict[str, Any]] = rows
        if self.out is not None and self.dist.is_main:
            text = (self.out / "metrics.jsonl").read_text()
            history = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
        evals = [[h["step"], h["eval_accuracy"]] for h in history if h["eval_accuracy"] is not None]
        if final_eval is not None:
            evals.append([max(cfg.steps, self.start_step), final_eval])
        phases = ("time_rollout_s", "time_score_s", "time_advantages_s", "time_update_s")
        summary = {
            "arm": cfg.arm,
            "seed": cfg.seed,
            "steps": cfg.steps,
            "initial_eval_accuracy": evals[0][1] if evals and evals[0][0] == 0 else None,
            "final_eval_accuracy": final_eval,
            "eval": evals,
            "final_reward_mean": history[-1]["reward_mean"] if history else None,
            "mean_step_s": {p: float(np.mean([h[p] for h in rows])) if rows else None for p in phases},
            "parameters": {
                "actor": sum(p.numel() for p in self.actor.parameters()),
                "actor_trainable": sum(p.numel() for p in self.actor_params),
                "critic": 0 if self.critic is None else sum(p.numel() for p in self.critic.parameters()),
            },
            "world_size": self.dist.world_size,
            "warm_start": self.warm_start,
        }
        if self.out is not None and self.dist.is_main:
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def train(config: TrainConfig) -> dict[str, Any]:
    """Train one run (module docstring); returns the summary (also ``OUT/summary.json``).

    Keys: ``arm, seed, steps, initial_eval_accuracy`` (step 0, the warm start),
    ``final_eval_accuracy`` (after the last step), ``eval`` (``[step, accuracy]`` pairs),
    ``final_reward_mean``, ``mean_step_s`` (per phase, over this process's steps),
    ``parameters`` (actor, its trainable part, critic), ``world_size`` and ``warm_start``
    (SFT steps, seconds, final loss). Under ``torchrun`` every rank calls it and gets the
    summary; a process group it initialised is destroyed before it returns."""
    trainer = Trainer(config)
    try:
        return trainer.train()
    finally:
        trainer.dist.close()
