"""``train(config)``: PPO for a causal LM with the paper's arms, one process.

One step, in the shape of TRL's PPO step (names as verl and TRL use them)::

    1. rollout      G = group_size samples per prompt with model.generate (temperature, top_p,
                    max_new_tokens, stop at EOS; grad off; prompts left-padded); the task's
                    verifier scores each response; score → rewards at its last token
    2. score        rl.forward: old log-probs, concentration → gates, old values (one actor
                    forward; a control arm first runs one more to get the gates it permutes);
                    the frozen reference's log-probs when a KL is used or logged
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

Outputs under ``config.out``: ``config.json``; ``metrics.jsonl`` (one row per step, keys
:data:`METRIC_KEYS`); ``summary.json``; ``warmstart/`` (the policy after the SFT warm start,
also the KL reference); ``checkpoint/`` (the actor via ``save_pretrained``, the critic's
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

from .. import controls
from ..advantages import gae
from ..diagnostics import credit_stats
from ..errors import NonFiniteError, ParameterError
from ..hf.probe import default_position_ids, token_logprobs
from ..outcomes import broadcast, group_advantages
from ..whitening import masked_whiten
from . import losses
from .arms import Arm, get_arm
from .config import TrainConfig
from .critic_inputs import CriticInputs
from .forward import forward
from .standard_critic import StandardCritic
from .tac import TransportAlignedCritic
from .tasks import AdditionTask, Problem

__all__ = ["METRIC_KEYS", "Batch", "Rollout", "Trainer", "sft_warm_start", "train"]

#: The keys of each ``metrics.jsonl`` row (None where a quantity does not apply to the arm or step).
METRIC_KEYS = (
    "step", "arm", "seed", "reward_mean", "train_accuracy", "eval_accuracy", "kl", "kl_loss", "approx_kl", "clipfrac",
    "pg_loss", "value_loss", "value_clipfrac", "value_explained_var", "gate_mean", "gate_min", "gate_max",
    "adv_gini", "adv_effective_token_ratio", "response_length", "entropy", "grad_norm_actor", "grad_norm_critic",
    "actor_updated", "time_rollout_s", "time_score_s", "time_advantages_s", "time_update_s", "time_eval_s",
)

#: Config fields a resumed run may change.
RESUMABLE_CHANGES = ("steps", "resume", "progress", "save_every", "eval_every", "num_threads")


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

    def select(self, index: torch.Tensor) -> Batch:
        """The rows ``index`` (a minibatch)."""
        rows: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            rows[f.name] = None if v is None else v[index]
        return Batch(**rows)


# ---------------------------------------------------------------------------------------------------------
# building blocks


def _left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = True
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
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.0, 1.0 - s / steps))
    model.train()
    out: list[float] = []
    for _ in range(steps):
        seqs = [(tok.encode(p.prompt, add_bos=True), tok.encode(p.solution, add_eos=True)) for p in task.sample(rng, batch_size)]
        width = max(len(a) + len(b) for a, b in seqs)
        ids = torch.full((batch_size, width), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        mask = torch.zeros((batch_size, width), dtype=torch.long)
        for i, (a, b) in enumerate(seqs):
            ids[i, : len(a) + len(b)] = torch.tensor(a + b)
            labels[i, len(a): len(a) + len(b)] = torch.tensor(b)
            mask[i, : len(a) + len(b)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
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


@contextlib.contextmanager
def _quiet_transformers() -> Any:
    """transformers' own progress bars ("Writing model shards", "Loading weights") off while
    saving and loading checkpoints, then back as they were."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


class _Timer:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> _Timer:  # noqa: PYI034 (typing.Self needs Python 3.11)
        self._t = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t


# ---------------------------------------------------------------------------------------------------------
# the trainer


class Trainer:
    """The state of one run (policy, reference, critic, optimisers, RNGs) and its step.

    ``Trainer(config)`` builds or resumes everything; :meth:`train` runs the remaining
    steps and returns the summary; :meth:`step` runs one (module docstring)."""

    #: the policy, a transformers causal LM
    actor: Any
    #: the frozen KL reference (the policy after the warm start), or None
    reference: Any
    critic: nn.Module | None

    def __init__(self, config: TrainConfig) -> None:
        if not isinstance(config, TrainConfig):
            raise ParameterError(f"config: expected a TrainConfig, got {type(config).__name__}", argument="config")
        self.config = config
        self.arm: Arm = get_arm(config.arm)
        if self.arm.critic is None and config.critic_warmup:
            raise ParameterError(
                f"critic_warmup: expected 0 for the {config.arm} arm, which has no critic, got {config.critic_warmup}",
                argument="critic_warmup",
            )
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.task = AdditionTask(config.digits, split_seed=config.split_seed, heldout_fraction=config.heldout_fraction)
        self.tokenizer = self.task.tokenizer
        self.max_new_tokens = config.max_new_tokens or self.task.max_new_tokens
        self.eval_problems = self.task.heldout(config.eval_size)
        self.out = None if config.out is None else Path(config.out)
        self.warm_start: dict[str, Any] = {}
        self.start_step = 0
        # the run's own torch RNG stream (generate samples from torch's global RNG): swapped
        # in for each step and out after it, so runs in one process do not disturb each other
        # or the caller's RNG
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
        if cfg.init_from is not None:
            self.actor = self._load_actor(cfg.init_from)
            sft_losses: list[float] = []
        else:
            self.actor = build_policy(cfg, self.tokenizer.vocab_size)
            sft_rng = np.random.default_rng([cfg.seed, 1])
            sft_losses = sft_warm_start(
                self.actor, self.task, steps=cfg.warmup_sft_steps, batch_size=cfg.sft_batch_size, lr=cfg.sft_lr, rng=sft_rng
            )
        self.warm_start = {
            "sft_steps": len(sft_losses),
            "sft_seconds": time.perf_counter() - t0,
            "sft_final_loss": sft_losses[-1] if sft_losses else None,
            "init_from": cfg.init_from,
        }
        self.actor.eval()
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text(cfg.to_json())
            with _quiet_transformers():
                self.actor.save_pretrained(self.out / "warmstart")
            (self.out / "warmstart" / "task.json").write_text(json.dumps({**self.task.to_dict(), "tokenizer": self.tokenizer.to_dict()}))
            (self.out / "metrics.jsonl").write_text("")
        self.reference = self._make_reference(self.actor)
        # the critic and the RL stream get their own seeds, so every arm of a seed starts
        # its rollouts from the same RNG state (paired comparisons)
        torch.manual_seed(cfg.seed * 1000 + 1)
        self.critic = self._make_critic()
        self._make_optimizers()
        torch.manual_seed(cfg.seed * 1000 + 2)
        self.rng = np.random.default_rng([cfg.seed, 2])

    def _load_actor(self, path: Any) -> Any:
        from transformers import AutoModelForCausalLM

        if not Path(path).is_dir():
            raise ParameterError(f"init_from: expected a save_pretrained directory, got {str(path)!r}", argument="init_from")
        with _quiet_transformers():
            return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    def _make_reference(self, actor: Any) -> Any:
        cfg = self.config
        if cfg.kl_coef == 0.0 and not cfg.log_kl:
            return None
        ref = copy.deepcopy(actor).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref

    def _make_critic(self) -> nn.Module | None:
        cfg = self.config
        if self.arm.critic == "tac":
            return TransportAlignedCritic.for_model(
                self.actor, width=cfg.tac_width, temporal=cfg.tac_temporal, trunk_grad=cfg.trunk_grad
            )
        if self.arm.critic == "standard":
            return StandardCritic.from_actor(self.actor, generator=torch.Generator().manual_seed(cfg.seed * 1000 + 3))
        return None

    def _make_optimizers(self) -> None:
        cfg = self.config
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=cfg.actor_lr, weight_decay=cfg.weight_decay)
        self.critic_opt = (
            None
            if self.critic is None
            else torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr, weight_decay=cfg.weight_decay)
        )

    # ---- checkpoints

    @property
    def checkpoint_dir(self) -> Path | None:
        return None if self.out is None else self.out / "checkpoint"

    def save_checkpoint(self, next_step: int) -> None:
        """Write ``OUT/checkpoint`` for a run that continues at ``next_step`` (atomically:
        the new one is written beside the old one, then swapped in)."""
        if self.out is None:
            return
        final, tmp, old = self.out / "checkpoint", self.out / "checkpoint.tmp", self.out / "checkpoint.old"
        shutil.rmtree(tmp, ignore_errors=True)
        with _quiet_transformers():
            self.actor.save_pretrained(tmp / "actor")
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
        ckpt = self.out / "checkpoint"
        if not ckpt.is_dir() and (self.out / "checkpoint.old").is_dir():
            ckpt = self.out / "checkpoint.old"  # a crash between the two renames of save_checkpoint
        if not (ckpt / "state.pt").is_file():
            raise ParameterError(
                f"resume: expected a checkpoint in {str(self.out / 'checkpoint')!r}, found none", argument="resume"
            )
        saved = TrainConfig.from_json((ckpt / "config.json").read_text())
        diff = [f.name for f in dataclasses.fields(TrainConfig)
                if f.name not in RESUMABLE_CHANGES and getattr(saved, f.name) != getattr(self.config, f.name)]
        if diff:
            name = diff[0]
            raise ParameterError(
                f"{name}: a resumed run must keep the checkpoint's settings (only {', '.join(RESUMABLE_CHANGES)} may "
                f"change); the checkpoint has {getattr(saved, name)!r}, got {getattr(self.config, name)!r}",
                argument=name,
            )
        self.warm_start = json.loads((ckpt / "warm_start.json").read_text())
        self.actor = self._load_actor(ckpt / "actor").eval()
        self.reference = None
        if self.config.kl_coef != 0.0 or self.config.log_kl:
            self.reference = self._make_reference(self._load_actor(self.out / "warmstart"))
        self.critic = self._make_critic()
        state = torch.load(ckpt / "state.pt", weights_only=True)
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
        # metrics.jsonl keeps the rows of the steps before the checkpoint
        path = self.out / "metrics.jsonl"
        rows = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
        kept = [ln for ln in rows if json.loads(ln)["step"] < self.start_step]
        path.write_text("".join(ln + "\n" for ln in kept))
        (self.out / "config.json").write_text(self.config.to_json())

    # ---- phase 1: rollout

    def _generation_config(self, sample: bool) -> Any:
        from transformers import GenerationConfig

        tok = self.tokenizer
        common: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "pad_token_id": tok.pad_token_id,
            "eos_token_id": tok.eos_token_id,
            "bos_token_id": tok.bos_token_id,
        }
        if sample:
            return GenerationConfig(do_sample=True, temperature=self.config.temperature, top_p=self.config.top_p,
                                    top_k=0, **common)
        return GenerationConfig(do_sample=False, **common)

    @torch.no_grad()
    def generate(self, problems: Sequence[Problem], sample: bool) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """Left-padded prompts → ``(ids, attention_mask, prompt_width, in_response)``; the
        response is each token up to and including the first EOS (``in_response`` ``[B, R]``)."""
        tok = self.tokenizer
        prompt_ids, prompt_mask = _left_pad([tok.encode(p.prompt, add_bos=True) for p in problems], tok.pad_token_id)
        self.actor.eval()
        ids = self.actor.generate(input_ids=prompt_ids, attention_mask=prompt_mask.long(),
                                  generation_config=self._generation_config(sample))
        width = prompt_ids.shape[1]
        is_eos = ids[:, width:] == tok.eos_token_id
        in_response = (is_eos.long().cumsum(-1) - is_eos.long()) == 0
        return ids, torch.cat([prompt_mask, in_response], dim=1), width, in_response

    def _decode(self, ids: torch.Tensor, width: int, in_response: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        eos = self.tokenizer.eos_token_id
        finished = ((ids[:, width:] == eos) & in_response).any(-1)
        texts = [self.tokenizer.decode(row[m].tolist()) for row, m in zip(ids[:, width:], in_response)]
        return texts, finished

    def rollout(self) -> Rollout:
        """Phase 1: ``prompts_per_step`` training problems, ``group_size`` samples each."""
        cfg = self.config
        prompts = self.task.sample(self.rng, cfg.prompts_per_step)
        problems = [p for p in prompts for _ in range(cfg.group_size)]
        ids, mask, width, in_response = self.generate(problems, sample=True)
        texts, finished = self._decode(ids, width, in_response)
        response_mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
        response_mask[:, width - 1:] = in_response
        scores = torch.tensor(self.task.scores(problems, texts, finished.tolist()), dtype=torch.float32)
        groups = torch.arange(cfg.prompts_per_step).repeat_interleave(cfg.group_size)
        return Rollout(ids, mask, response_mask, groups, scores, finished, problems, texts)

    # ---- phase 2: the scoring pass

    def _policy_forward(self, ids: torch.Tensor, mask: torch.Tensor, response_mask: torch.Tensor, *, grad: bool,
                        gates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``(logprobs, values, gates)`` of the actor (and critic) on a batch.

        Arms that read routing (concentration gates or TAC) run :func:`rl.forward`; the
        others need neither the probe nor the taps and run a plain forward (their cost is
        the baseline's own)."""
        cfg = self.config
        needs_probe = self.arm.critic == "tac" or (not grad and self.arm.gates != "none")
        if needs_probe:
            out = forward(self.actor, ids, mask, critic=self.critic, response_mask=response_mask, statistic=cfg.statistic,
                          gate_params=cfg.gate_params, gates=gates, grad=grad)
            return out.logprobs, out.values, out.gates
        pos = default_position_ids(mask)
        with contextlib.nullcontext() if grad else torch.no_grad():
            logits = self.actor(input_ids=ids, attention_mask=mask.long(), position_ids=pos, use_cache=False).logits
            lp = token_logprobs(logits[:, :-1], ids[:, 1:])
            del logits
            columns = mask[:, :-1] & mask[:, 1:]
            lp = torch.where(columns, lp, torch.zeros_like(lp))
            values = None
            if self.critic is not None:
                inputs = CriticInputs(ids, mask, pos, columns, response_mask, {}, None, torch.ones_like(lp))
                values = self.critic(inputs)
        return lp, values, None

    @torch.no_grad()
    def reference_logprobs(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        assert self.reference is not None
        logits = self.reference(input_ids=ids, attention_mask=mask.long(), position_ids=default_position_ids(mask),
                                use_cache=False).logits
        lp = token_logprobs(logits[:, :-1], ids[:, 1:])
        return torch.where(mask[:, :-1] & mask[:, 1:], lp, torch.zeros_like(lp))

    def _arm_gates(self, r: Rollout, step: int) -> torch.Tensor | None:
        """The gates that replace the concentration gates (a constant or a control), or None."""
        cfg, arm = self.config, self.arm
        if not arm.control:
            return None
        if arm.gates == "constant" and cfg.fixed_gate is not None:
            return torch.full(r.response_mask.shape, float(cfg.fixed_gate))
        g = forward(self.actor, r.input_ids, r.attention_mask, response_mask=r.response_mask, statistic=cfg.statistic,
                    gate_params=cfg.gate_params).gates
        m = r.response_mask
        # the array kernels return tensors for tensors (as_tensor only tells the type checker)
        if arm.gates == "constant":
            return torch.as_tensor(controls.constant(g, mask=m))
        if arm.gates == "shuffle":
            return torch.as_tensor(controls.shuffle(g, mask=m, seed=cfg.seed * 1_000_003 + step))
        return torch.as_tensor(controls.by_position(g, mask=m))

    def score(self, r: Rollout, step: int) -> Batch:
        """Phase 2: old log-probs, values and gates (advantages filled in by phase 3)."""
        override = self._arm_gates(r, step)
        lp, values, gates = self._policy_forward(r.input_ids, r.attention_mask, r.response_mask, grad=False, gates=override)
        ref = self.reference_logprobs(r.input_ids, r.attention_mask) if self.reference is not None else None
        batch = Batch(r.input_ids, r.attention_mask, r.response_mask, lp, torch.zeros_like(lp), old_values=values,
                      ref_logprobs=ref, critic_gates=override)
        self._gates = None if self.arm.gates == "none" else gates
        return batch

    # ---- phase 3: advantages

    def compute_advantages(self, r: Rollout, batch: Batch) -> dict[str, Any]:
        """Phase 3: rewards (score at the last response token, KL penalty), then the arm's
        advantages (and returns); fills ``batch`` and returns its statistics."""
        cfg = self.config
        m = batch.response_mask
        rows = torch.arange(m.shape[0])
        last = (m.long() * torch.arange(m.shape[1])).argmax(-1)
        rewards = torch.zeros(m.shape, dtype=torch.float32)
        rewards[rows, last] = r.scores
        kl = None
        if batch.ref_logprobs is not None:
            kl = torch.where(m, losses.kl_penalty(batch.old_logprobs, batch.ref_logprobs, cfg.kl_kind), 0.0)
            if cfg.kl_mode == "reward" and cfg.kl_coef > 0.0:
                rewards = rewards - cfg.kl_coef * kl
        if self.arm.uses_gae:
            assert batch.old_values is not None
            result = gae(rewards, batch.old_values, mask=m, gates=self._gates, gamma=cfg.gamma, lam=cfg.lam,
                         lam_critic=cfg.lam_critic)
            adv = torch.as_tensor(result.advantages)  # tensors in, tensors out (as_tensor: for the type checker)
            if cfg.whiten_advantages:
                adv = torch.as_tensor(masked_whiten(adv, mask=m))
            batch.returns = torch.as_tensor(result.returns)
        else:
            seq = torch.as_tensor(group_advantages(rewards.double().sum(-1), r.groups, method=cfg.group_method))
            adv = torch.as_tensor(broadcast(seq.float(), mask=m))
        batch.advantages = adv
        credit = credit_stats(adv, mask=m)
        stats: dict[str, Any] = {
            "kl": None if kl is None else _masked_mean(kl, m),
            "adv_gini": credit["gini"],
            "adv_effective_token_ratio": credit["effective_token_ratio"],
            "value_explained_var": None
            if batch.returns is None or batch.old_values is None
            else _explained_variance(batch.old_values, batch.returns, m),
        }
        g = self._gates
        stats.update(gate_mean=None, gate_min=None, gate_max=None)
        if g is not None:
            gv = g[m]
            stats.update(gate_mean=float(gv.double().mean()), gate_min=float(gv.min()), gate_max=float(gv.max()))
        return stats

    # ---- phase 4: the PPO update

    def update(self, batch: Batch, step: int) -> dict[str, Any]:
        """Phase 4: ``ppo_epochs`` × ``num_minibatches`` optimiser steps; mean statistics."""
        cfg = self.config
        train_actor = step >= cfg.critic_warmup
        sums: dict[str, float] = {}
        count = 0
        n = batch.input_ids.shape[0]
        for epoch in range(cfg.ppo_epochs):
            for k, index in enumerate(torch.tensor_split(torch.randperm(n), cfg.num_minibatches)):
                mb = batch.select(index)
                lp, values, _ = self._policy_forward(mb.input_ids, mb.attention_mask, mb.response_mask, grad=True,
                                                     gates=mb.critic_gates)
                pg_loss, pg = losses.policy_loss(lp, mb.old_logprobs, mb.advantages, mb.response_mask,
                                                 clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip,
                                                 agg=cfg.loss_agg)
                loss: torch.Tensor | None = pg_loss if train_actor else None
                if cfg.kl_mode == "loss" and cfg.kl_coef > 0.0 and loss is not None:
                    assert mb.ref_logprobs is not None
                    kl_loss = losses.aggregate(losses.kl_penalty(lp, mb.ref_logprobs, cfg.kl_kind), mb.response_mask, cfg.loss_agg)
                    loss = loss + cfg.kl_coef * kl_loss
                    sums["kl_loss"] = sums.get("kl_loss", 0.0) + float(kl_loss.detach())
                vf: dict[str, float] = {}
                if self.critic is not None:
                    assert values is not None and mb.old_values is not None and mb.returns is not None
                    vf_loss, vf = losses.value_loss(values, mb.old_values, mb.returns, mb.response_mask,
                                                    clip=cfg.value_clip, agg=cfg.loss_agg)
                    loss = cfg.vf_coef * vf_loss if loss is None else loss + cfg.vf_coef * vf_loss
                where = f"epoch {epoch}, minibatch {k}"
                if loss is None:
                    continue
                if not bool(torch.isfinite(loss.detach())):
                    raise NonFiniteError(f"loss: expected a finite value, got {float(loss.detach())} ({where})", argument="loss")
                self.actor_opt.zero_grad(set_to_none=True)
                if self.critic_opt is not None:
                    self.critic_opt.zero_grad(set_to_none=True)
                loss.backward()
                norms = {}
                if train_actor:
                    norms["grad_norm_actor"] = float(torch.nn.utils.clip_grad_norm_(self.actor.parameters(), cfg.max_grad_norm))
                if self.critic is not None:
                    norms["grad_norm_critic"] = float(torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm))
                for name, value in norms.items():
                    if not math.isfinite(value):
                        raise NonFiniteError(
                            f"gradient: expected a finite norm of the {name[10:]}'s gradient, got {value} ({where})",
                            argument="gradient",
                        )
                if train_actor:
                    self.actor_opt.step()
                if self.critic_opt is not None:
                    self.critic_opt.step()
                entries = {"pg_loss": pg["pg_loss"], "clipfrac": pg["clipfrac"], "approx_kl": pg["approx_kl"], **norms}
                if vf:
                    entries.update(value_loss=vf["vf_loss"], value_clipfrac=vf["clipfrac"])
                for key, value in entries.items():
                    sums[key] = sums.get(key, 0.0) + value
                count += 1
        self.actor.eval()
        out: dict[str, Any] = {key: value / count for key, value in sums.items()} if count else {}
        out["actor_updated"] = train_actor
        return out

    # ---- evaluation

    def evaluate(self) -> float:
        """Held-out accuracy of greedy decoding on the fixed evaluation set."""
        ids, _, width, in_response = self.generate(self.eval_problems, sample=False)
        texts, finished = self._decode(ids, width, in_response)
        scores = self.task.scores(self.eval_problems, texts, finished.tolist())
        return float(np.mean(scores))

    # ---- one step and the loop

    def step(self, step: int) -> dict[str, Any]:
        """One PPO step (rollout → score → advantages → update); its metrics row."""
        cfg = self.config
        row: dict[str, Any] = {key: None for key in METRIC_KEYS}
        row.update(step=step, arm=cfg.arm, seed=cfg.seed)
        if cfg.eval_every and step % cfg.eval_every == 0:
            with _Timer() as t:
                row["eval_accuracy"] = self.evaluate()
            row["time_eval_s"] = t.seconds
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.torch_rng)
            with _Timer() as t_rollout:
                r = self.rollout()
            with _Timer() as t_score:
                batch = self.score(r, step)
            with _Timer() as t_adv:
                row.update(self.compute_advantages(r, batch))
            with _Timer() as t_update:
                row.update(self.update(batch, step))
            self.torch_rng = torch.get_rng_state()
        m = batch.response_mask
        row.update(
            reward_mean=float(r.scores.double().mean()),
            train_accuracy=float((r.scores == 1.0).double().mean()),
            response_length=float(m.sum(-1).double().mean()),
            entropy=-_masked_mean(batch.old_logprobs, m),
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
        saved = torch.load(ckpt / "state.pt", weights_only=True)["next_step"]
        return f"the last good checkpoint (continuing at step {saved}) is kept at {str(ckpt)!r}"

    def train(self) -> dict[str, Any]:
        """Run steps ``start_step … steps − 1``; write the outputs; return the summary."""
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        cfg = self.config
        rows: list[dict[str, Any]] = []
        bar = tqdm(total=cfg.steps, initial=self.start_step, desc=cfg.arm, disable=not cfg.progress, leave=False)
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
                if self.out is not None:
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
        return self._summary(rows, final_eval)

    def _summary(self, rows: list[dict[str, Any]], final_eval: float | None) -> dict[str, Any]:
        cfg = self.config
        history: list[dict[str, Any]] = rows
        if self.out is not None:
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
                "critic": 0 if self.critic is None else sum(p.numel() for p in self.critic.parameters()),
            },
            "warm_start": self.warm_start,
        }
        if self.out is not None:
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def train(config: TrainConfig) -> dict[str, Any]:
    """Train one run (module docstring); returns the summary (also ``OUT/summary.json``).

    Keys: ``arm, seed, steps, initial_eval_accuracy`` (step 0, the warm start),
    ``final_eval_accuracy`` (after the last step), ``eval`` (``[step, accuracy]`` pairs),
    ``final_reward_mean``, ``mean_step_s`` (per phase, over this process's steps),
    ``parameters`` (actor, critic) and ``warm_start`` (SFT steps, seconds, final loss)."""
    return Trainer(config).train()
