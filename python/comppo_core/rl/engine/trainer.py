"""``train(config)``: PPO for a causal LM with the paper's arms, on one process or under ``torchrun``.

The orchestration of a run: building or resuming it, the loop over steps (1. rollout:
``group_size`` samples per prompt, keyed draws, :mod:`comppo_core.rl.engine.rollout`; 2. score,
3. advantages, 4. ``ppo_epochs`` × ``num_minibatches`` updates: the maths in
:mod:`comppo_core.rl.core.step`, one equation per function), evaluation and logging. What a
run is built from is :mod:`comppo_core.rl.engine.build`; the optimisers :mod:`comppo_core.rl.engine.optimize`;
checkpoints :mod:`comppo_core.rl.engine.checkpoint`; the rows it logs :mod:`comppo_core.rl.runs.metrics`.
Every log-prob (old, new, reference) is of ``logits / temperature``, the distribution sampled
from, as verl and TRL score; columns are ``[B, T−1]`` (column j scores token ``ids[:, j+1]``).

**Scale.** Under ``torchrun --nproc-per-node N`` the same step runs on every rank
(:mod:`comppo_core.rl.engine.distributed`): the prompts are sharded, every batch-wide statistic
is computed over the gathered global batch, gradients are all-reduced, and rank 0 writes
the outputs; the parameters after k steps are those of one process on the same global
batch, up to float rounding. On CPU each process uses one torch thread unless
``num_threads`` says otherwise.

**Models and data.** The built-in policy is a small Llama with the task's character
tokenizer and an SFT warm start; ``config.model`` is a local Hugging Face directory instead
(:mod:`comppo_core.rl.models.pretrained`), ``config.task`` a JSONL file (:mod:`comppo_core.rl.tasks.jsonl`),
``config.lora_rank > 0`` a peft LoRA adapter (:mod:`comppo_core.rl.models.lora`).

**Outputs** under ``config.out`` (:mod:`comppo_core.rl.runs.run_dir`; a directory that holds a
run is refused unless ``resume`` or ``overwrite``): ``config.json``, ``inputs.json``,
``metrics.jsonl``, ``summary.json``, ``warmstart/``, ``checkpoint/`` (after the first step,
every ``save_every`` steps and after the last, atomically). ``config.resume`` continues
bit for bit on CPU. A non-finite loss or gradient stops the run with a
:class:`~comppo_core.errors.NonFiniteError` naming the step; ``train(stop=...)`` stops on
request (:mod:`comppo_core.rl.runs.interrupts`); either way the last checkpoint is kept.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ...errors import ParameterError
from ...hf.scoring import score as score_tokens
from ..config import TrainConfig
from ..core import oracle, step
from ..core.arms import Arm, get_arm
from ..core.step import Batch, terminal_rewards
from ..critics.standard import StandardCritic
from ..critics.warmup import warm_up_critic
from ..models import lora
from ..models.pretrained import load_policy
from ..runs import metrics, run_dir
from ..runs.interrupts import TrainingInterrupted
from ..runs.metrics import METRIC_KEYS, Timer
from ..tasks.base import Problem, Task, Tokenizer
from . import checkpoint
from . import rollout as rollouts
from .build import build_policy, initial_policy, make_critic, make_reference, make_task, sft_warm_start
from .distributed import Dist, is_sharded, shard_bounds, shard_model
from .evaluation import heldout_rewards
from .optimize import Optimizers
from .rollout import Rollout
from .sampling import row_keys

__all__ = [
    "METRIC_KEYS",
    "Batch",
    "Rollout",
    "Trainer",
    "TrainingInterrupted",
    "build_policy",
    "make_task",
    "sft_warm_start",
    "terminal_rewards",
    "train",
]


logger = logging.getLogger("comppo_core.rl")


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
    #: the run's task (:func:`comppo_core.rl.tasks.build_task`) and the tokenizer of its prompts and responses
    task: Task
    tokenizer: Tokenizer

    def __init__(self, config: TrainConfig, *, overwrite: bool = False) -> None:
        if not isinstance(config, TrainConfig):
            raise ParameterError(f"config: expected a TrainConfig, got {type(config).__name__}", argument="config")
        self.config = config
        self.arm: Arm = get_arm(config.arm)
        if config.out is not None:  # before anything is loaded: never replace a run unasked
            run_dir.check_out(config.out, resume=config.resume, overwrite=overwrite)
        self.dist = Dist.setup(config.device)
        #: torch threads of this process: num_threads, else 1 on CPU (None: torch's own, on CUDA)
        self.threads = 1 if config.num_threads is None and self.dist.device.type == "cpu" else config.num_threads
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            if overwrite and config.out is not None and self.dist.is_main:
                run_dir.clear_run(Path(config.out))
            self.dist.barrier()
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
        if self.arm.gate_source.pivotal:
            oracle.check_task(self.task, self.arm.name)
        self.max_new_tokens = config.max_new_tokens or self.task.max_new_tokens
        split = self.task.validation if config.eval_split == "validation" else self.task.heldout
        self.eval_problems = split(config.eval_size)
        self.out = None if config.out is None else Path(config.out)
        self.warm_start: dict[str, Any] = {}
        self.start_step = 0
        self._saved_at: int | None = None  # the step the last checkpoint continues at
        self.lora_model = None
        self.uses_reference = config.kl_coef != 0.0 or config.log_kl
        #: bfloat16 with ``dtype="bfloat16"``: the RL forwards' autocast dtype and the frozen
        #: weights' storage (the optimisers' weights stay float32); None: float32 throughout
        self.low_precision = torch.bfloat16 if config.dtype == "bfloat16" else None
        #: FSDP2 holds the policy, its reference and a standard critic sharded over the ranks
        #: (``fsdp`` under torchrun; rl.engine.distributed)
        self.sharded = bool(config.fsdp) and self.dist.distributed
        local = config.batch_size // self.dist.world_size
        #: this rank's share of the global rollout batch: its sequences (``local``, a slice of
        #: the global batch's) and how to gather every rank's (``gather``), which the step's
        #: batch-wide statistics read
        self.batch_shard = step.Rows(
            self.dist.gather_rows, slice(self.dist.rank * local, (self.dist.rank + 1) * local), self.dist.distributed
        )
        self.scoring = step.ScoringSettings.from_config(config)
        self.advantage_settings = step.AdvantageSettings.from_config(config)
        self.loss_settings = step.LossSettings.from_config(config, self.max_new_tokens)
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
        actor, self.warm_start = initial_policy(cfg, self.task, self.tokenizer.vocab_size, self.device)
        self.dist.broadcast_module(actor)  # one set of weights, whatever each rank's warm start did
        if self.out is not None and self.dist.is_main:  # config.json, inputs.json, warmstart/, metrics.jsonl
            warm = actor if cfg.model is None else None  # a user's model is its own warm start
            checkpoint.start_run(self.out, cfg, warm, self.tokenizer, self._task_record())
        self.dist.barrier()
        self.reference = self._make_reference(actor) if self._keeps_reference_copy() else None
        # the critic and the RL stream get their own seeds, so every arm of a seed starts
        # its rollouts from the same RNG state (paired comparisons)
        torch.manual_seed(cfg.seed * 1000 + 1)
        self.critic = make_critic(self.arm, actor, cfg)
        self.dist.broadcast_module(self.critic)
        self._attach_actor(actor, None)
        torch.manual_seed(cfg.seed * 1000 + 2)
        self.rng = np.random.default_rng([cfg.seed, 2])
        if cfg.critic_warmup_rounds:  # the critic learns before it is used (rl.critic_warmup)
            self.warm_start["critic_warmup"] = warm_up_critic(self, cfg.critic_warmup_rounds)

    def _load_actor(self, path: Any) -> Any:
        return load_policy(path, argument="init_from").to(self.device)

    def _initial_policy(self) -> Any:
        """The policy the run started from (the base of an adapter, the KL reference)."""
        if self.config.model is not None:
            return load_policy(self.config.model).to(self.device)
        assert self.out is not None
        return self._load_actor(self.out / "warmstart")

    def _keeps_reference_copy(self) -> bool:
        """A KL is used or logged, without LoRA (whose reference is the adapter disabled)."""
        return self.uses_reference and not self.config.lora_rank

    def _make_reference(self, actor: Any) -> Any:
        """The frozen KL reference: a copy of ``actor`` (stored in bfloat16 under
        ``dtype="bfloat16"``), sharded like the policy under ``fsdp``."""
        reference = make_reference(actor, self.low_precision)
        return shard_model(reference) if self.sharded else reference

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The RL forwards' precision: bfloat16 autocast with ``dtype="bfloat16"`` (the
        weights the optimisers step stay float32, their master copy), else nothing."""
        if self.low_precision is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.low_precision)

    def _attach_actor(self, actor: Any, adapter: Path | None) -> None:
        """Make ``actor`` the policy (with LoRA: inject a new adapter, or load ``adapter``)
        and build the optimisers: AdamW over the actor's trainable weights (every weight,
        or the adapter's) and over the critic's."""
        cfg = self.config
        self.actor = actor
        if cfg.lora_rank:
            self.lora_model = (
                lora.add_adapter(
                    actor,
                    rank=cfg.lora_rank,
                    alpha=cfg.lora_alpha,
                    modules=cfg.lora_target_modules,
                    seed=cfg.seed * 1000 + 4,
                )
                if adapter is None
                else lora.load_adapter(actor, adapter)
            )
            self.actor = self.lora_model.get_base_model()
            if self.low_precision is not None:  # the frozen base in bfloat16; the adapter trains in float32
                for p in self.lora_model.parameters():
                    if not p.requires_grad:
                        p.data = p.data.to(self.low_precision)
        if self.sharded:  # before the optimisers: they step the sharded (DTensor) parameters
            shard_model(self.actor)
            if isinstance(self.critic, StandardCritic):
                shard_model(self.critic)
        owner = self.actor if self.lora_model is None else self.lora_model
        self.optim = Optimizers(
            [p for p in owner.parameters() if p.requires_grad],
            [] if self.critic is None else [p for p in self.critic.parameters() if p.requires_grad],
            actor_lr=cfg.actor_lr,
            critic_lr=cfg.critic_lr,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            has_critic=self.critic is not None,
        )
        #: what the actor's optimiser trains (every weight, or the adapter's), and the critic's
        self.actor_params, self.critic_params = self.optim.actor_params, self.optim.critic_params
        self.actor_opt, self.critic_opt = self.optim.actor, self.optim.critic

    # ---- checkpoints

    @property
    def checkpoint_dir(self) -> Path | None:
        return None if self.out is None else self.out / "checkpoint"

    def save_checkpoint(self, next_step: int) -> None:
        """Write ``OUT/checkpoint`` for a run that continues at ``next_step`` (rank 0;
        :func:`comppo_core.rl.engine.checkpoint.save_checkpoint`; under ``fsdp`` every rank
        first gathers the full state dicts with rank 0)."""
        self._saved_at = next_step
        if self.out is None:
            return
        states = self._full_states() if self.sharded else None  # a collective
        if not self.dist.is_main:
            return
        checkpoint.save_checkpoint(
            self.out,
            next_step=next_step,
            actor=self.actor if self.lora_model is None else self.lora_model,
            tokenizer=self.tokenizer,
            task=self._task_record(),
            actor_opt=self.actor_opt,
            critic=self.critic,
            critic_opt=self.critic_opt,
            torch_rng=self.torch_rng,
            rng=self.rng,
            config=self.config,
            warm_start=self.warm_start,
            states=states,
        )

    def _full_states(self) -> dict[str, Any]:
        """The full (unsharded) state dicts of the actor, the critic and their optimisers, on
        CPU on rank 0 (``torch.distributed.checkpoint.state_dict``: every rank calls it)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        states = {
            "actor": get_model_state_dict(self.actor, options=options),
            "actor_opt": get_optimizer_state_dict(self.actor, self.actor_opt, options=options),
        }
        if self.critic is not None and self.critic_opt is not None:
            states["critic"] = get_model_state_dict(self.critic, options=options)
            states["critic_opt"] = get_optimizer_state_dict(self.critic, self.critic_opt, options=options)
        return states

    def _load_optimizer_states(self, state: dict[str, Any]) -> None:
        """The optimisers' states from a checkpoint (under ``fsdp``: full state dicts, sharded
        again over the ranks)."""
        if not self.sharded:
            self.actor_opt.load_state_dict(state["actor_opt"])
            if self.critic_opt is not None:
                self.critic_opt.load_state_dict(state["critic_opt"])
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(self.actor, self.actor_opt, state["actor_opt"], options=options)
        if self.critic is not None and self.critic_opt is not None:
            set_optimizer_state_dict(self.critic, self.critic_opt, state["critic_opt"], options=options)

    def _resume(self) -> None:
        assert self.out is not None
        cfg = self.config
        ckpt = checkpoint.find_checkpoint(self.out)
        checkpoint.check_resumable(ckpt, cfg)
        base = self._initial_policy().eval() if cfg.lora_rank else self._load_actor(ckpt / "actor").eval()
        self.reference = self._make_reference(self._initial_policy()) if self._keeps_reference_copy() else None
        self.critic = make_critic(self.arm, base, cfg)
        state, self.rng, self.warm_start = checkpoint.load_state(ckpt)
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self._attach_actor(base, ckpt / "actor" if cfg.lora_rank else None)
        self._load_optimizer_states(state)
        torch.set_rng_state(state["torch_rng"])
        self.start_step = self._saved_at = int(state["next_step"])
        self.dist.barrier()  # every rank has read the checkpoint before rank 0 rewrites the outputs
        if self.dist.is_main:
            checkpoint.keep_metrics_before(self.out, self.start_step)  # the rows of the steps before it
            run_dir.write_text_atomic(self.out / "config.json", cfg.to_json())

    # ---- phase 1: rollout

    def generate(
        self,
        problems: Sequence[Problem],
        sample: bool,
        *,
        keys: torch.Tensor | None = None,
        prompt_width: int | None = None,
    ) -> rollouts.Generated:
        """:func:`comppo_core.rl.engine.rollout.generate` with this run's actor, tokenizer and sampling settings."""
        with self.autocast():
            return self._generate(problems, sample, keys=keys, prompt_width=prompt_width)

    def _generate(
        self, problems: Sequence[Problem], sample: bool, *, keys: torch.Tensor | None, prompt_width: int | None
    ) -> rollouts.Generated:
        cfg = self.config
        return rollouts.generate(
            self.actor,
            self.tokenizer,
            problems,
            max_new_tokens=self.max_new_tokens,
            device=self.device,
            sample=sample,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            keys=keys,
            width=prompt_width,
            synced=self.sharded,
        )

    def _prompt_width(self, problems: Sequence[Problem]) -> int:
        return rollouts.prompt_width(self.tokenizer, problems)

    def rollout(self, step: int = 0, *, rng: np.random.Generator | None = None) -> Rollout:
        """Phase 1: ``prompts_per_step`` training problems (this rank's share, drawn with
        ``rng``, default the run's), ``group_size`` samples each, drawn with the keys of
        ``(seed, step, prompt index, sample index)``."""
        cfg = self.config
        prompts = self.task.sample(self.rng if rng is None else rng, cfg.prompts_per_step)  # the same on every rank
        lo, hi = shard_bounds(cfg.prompts_per_step, self.dist.rank, self.dist.world_size)
        problems = [p for p in prompts[lo:hi] for _ in range(cfg.group_size)]
        keys = row_keys(cfg.seed, step, [(i, g) for i in range(lo, hi) for g in range(cfg.group_size)])
        generated = self.generate(problems, sample=True, keys=keys, prompt_width=self._prompt_width(prompts))
        # right-pad to the longest response of the global batch: the one-process layout
        generated = rollouts.pad_right(generated, self.dist.max_int(generated[0].shape[1]), self.tokenizer.pad_token_id)
        groups = torch.arange(lo, hi, device=self.device).repeat_interleave(cfg.group_size)
        return rollouts.rewarded(self.task, self.tokenizer, problems, generated, groups)

    def answer(self, problems: Sequence[Problem]) -> Rollout:
        """Greedy responses to ``problems`` (one each, this process alone), rewarded by the
        task's verifier, as a :class:`Rollout` whose ``groups`` are the row indices."""
        problems = list(problems)
        groups = torch.arange(len(problems), device=self.device)
        return rollouts.rewarded(self.task, self.tokenizer, problems, self.generate(problems, sample=False), groups)

    # ---- phases 2 and 3: scoring and advantages (the maths: comppo_core.rl.core.step)

    @torch.no_grad()
    def reference_logprobs(
        self, ids: torch.Tensor, mask: torch.Tensor, response_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Log-probs under the frozen reference: the warm-start copy, or with LoRA the actor
        with its adapter disabled (the base model); with ``response_mask`` ``[B, T−1]`` at
        those columns alone (0 elsewhere: the LM head skips the prompt), as the scoring pass
        has them."""
        if self.reference is None and self.lora_model is None:
            raise ParameterError(
                "reference: this run keeps no reference (kl_coef = 0 and log_kl off)", argument="reference"
            )
        model = self.actor if self.reference is None else self.reference
        context = lora.adapter_disabled(self.lora_model) if self.reference is None else contextlib.nullcontext()
        with context, self.autocast():
            scored = score_tokens(model, ids, mask, temperature=self.config.temperature, logprob_columns=response_mask)
            return scored.logprobs.float()

    def _forward(self, b: Rollout | Batch, *, grad: bool, gates: Any) -> step.Scored:
        """One forward pass of this run's actor and critic over ``b``'s sequences
        (:func:`comppo_core.rl.core.step.score`): phase 2's without gradients, each
        minibatch's of the update with them."""
        args = (self.actor, self.critic, b.input_ids, b.attention_mask, b.response_mask)
        with self.autocast():
            return step.score(*args, arm=self.arm, settings=self.scoring, grad=grad, gates=gates, rows=self.batch_shard)

    def score(self, r: Rollout, step_index: int) -> Batch:
        """Phase 2, the scoring pass: old log-probs, values and gates of the rollout, and the
        reference's log-probs (advantages filled in by phase 3)."""
        b, columns = r.response_mask.shape
        gates = step.step_gates(
            self.arm,
            self.scoring,
            step=step_index,
            seed=self.config.seed,
            shape=(b, columns),
            device=self.device,
            rows=self.batch_shard,
            pivotal=oracle.pivotal_columns(self.task, self.tokenizer, r) if self.arm.gate_source.pivotal else None,
        )
        s = self._forward(r, grad=False, gates=gates)
        ref = self.reference_logprobs(r.input_ids, r.attention_mask, r.response_mask) if self.uses_reference else None
        return Batch(
            r.input_ids,
            r.attention_mask,
            r.response_mask,
            s.logprobs,
            torch.zeros_like(s.logprobs),
            old_values=s.values,
            ref_logprobs=ref,
            gates=s.gates,
        )

    def compute_advantages(self, r: Rollout, batch: Batch) -> dict[str, Any]:
        """Phase 3: per-token rewards (the verifier's at the last response token, the KL penalty), then the arm's
        advantages (and returns); fills ``batch`` and returns its statistics, all over the
        global batch."""
        rewards, kl = step.rewards_with_kl(
            batch.response_mask, r.rewards, batch.old_logprobs, batch.ref_logprobs, self.advantage_settings
        )
        batch.advantages, batch.returns, all_adv = step.compute_advantages(
            self.arm,
            rewards,
            batch.response_mask,
            values=batch.old_values,
            gates=batch.gates,
            groups=r.groups,
            settings=self.advantage_settings,
            rows=self.batch_shard,
        )
        return step.advantage_statistics(batch, kl, all_adv, self.batch_shard)

    # ---- phase 4: the PPO update

    def update(self, batch: Batch, step_index: int, *, train_actor: bool = True) -> dict[str, Any]:
        """Phase 4: ``ppo_epochs`` × ``num_minibatches`` optimiser steps (of the critic alone
        with ``train_actor=False``: the critic warm-up); mean statistics.

        Minibatch k of an epoch is the same set of global rows on every rank (one
        permutation of the global batch, from the run's torch stream); each rank's loss is
        its rows' share of that minibatch's loss (:func:`~comppo_core.rl.core.step.minibatch_loss`),
        and the gradients are summed over the ranks (:meth:`Dist.all_reduce_gradients`)
        before clipping and stepping."""
        cfg, dist = self.config, self.dist
        keys = ["pg_loss", "clipfrac", "approx_kl"]
        if self.critic is not None:
            keys += ["value_loss", "value_clipfrac"]
        if self.loss_settings.kl_in_loss(train_actor):
            keys.append("kl_loss")
        sums = torch.zeros(len(keys), dtype=torch.float64)
        norm_sums: dict[str, float] = {}
        count = 0
        n_local = batch.input_ids.shape[0]
        lo = self.batch_shard.local.start
        tokens = dist.gather_rows(batch.response_mask.sum(-1)).cpu()  # response tokens of every global row
        n = tokens.shape[0]
        for epoch in range(cfg.ppo_epochs):
            for k, index in enumerate(torch.tensor_split(torch.randperm(n), cfg.num_minibatches)):
                mine = index[(index >= lo) & (index < lo + n_local)]
                share, token_share = step.loss_shares(tokens, index, mine, cfg.loss_agg)
                self.optim.zero_grad()
                entries = dict.fromkeys(keys, 0.0)
                loss: torch.Tensor | None = None
                if mine.numel():
                    mb = batch.select((mine - lo).to(self.device))
                    s = self._forward(mb, grad=True, gates=None)
                    loss, got = step.minibatch_loss(
                        mb,
                        s.logprobs,
                        s.values,
                        self.loss_settings,
                        train_actor=train_actor,
                        share=share,
                        token_share=token_share,
                    )
                    entries.update(got)
                elif self.sharded:  # FSDP's collectives sit in the forward and the backward: join them
                    loss = self._zero_loss(batch, train_actor=train_actor)
                norms = self.optim.step(loss, dist=dist, train_actor=train_actor, where=f"epoch {epoch}, minibatch {k}")
                sums += torch.tensor([entries[key] for key in keys], dtype=torch.float64)
                for name, norm in norms.items():
                    norm_sums[name] = norm_sums.get(name, 0.0) + norm
                count += 1
        self.actor.eval()
        if self.sharded and not train_actor:  # the actor ran forwards without a backward: free its gathered weights
            self.actor.reshard()
        totals = dist.sum(sums).tolist()  # each rank's shares of the minibatch statistics, summed
        out: dict[str, Any] = {}
        if count:
            out = {key: total / count for key, total in zip(keys, totals)}
            out.update({name: total / count for name, total in norm_sums.items()})
        out["actor_updated"] = train_actor
        return out

    def _zero_loss(self, batch: Batch, *, train_actor: bool) -> torch.Tensor | None:
        """The minibatch loss of one of this rank's rows at share 0: the forward and the
        backward, through the same modules as the other ranks' losses (so FSDP's collectives
        match), that a sharded rank runs for a minibatch it holds no row of; its gradients
        are 0."""
        mb = batch.select(torch.zeros(1, dtype=torch.long, device=self.device))
        s = self._forward(mb, grad=True, gates=None)
        settings = self.loss_settings
        loss, _ = step.minibatch_loss(
            mb, s.logprobs, s.values, settings, train_actor=train_actor, share=0.0, token_share=0.0
        )
        return loss

    # ---- evaluation

    def _heldout_rewards(self, problems: Sequence[Problem], **kw: Any) -> list[float]:
        with self.autocast():
            return heldout_rewards(self.actor, self.tokenizer, self.task, problems, **kw)

    def evaluate(self) -> float:
        """Held-out accuracy of greedy decoding on the fixed evaluation set (split across ranks;
        :func:`comppo_core.rl.engine.evaluation.heldout_rewards`, as ``comppo-core evaluate``)."""
        problems = self.eval_problems
        lo, hi = shard_bounds(len(problems), self.dist.rank, self.dist.world_size)
        width = self._prompt_width(problems)
        kw: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "device": self.device, "width": width}
        if hi <= lo and self.sharded:  # every rank runs generate's collectives: answer one, discard it
            self._heldout_rewards(problems[:1], **kw)
        correct = float(sum(self._heldout_rewards(problems[lo:hi], **kw))) if hi > lo else 0.0
        total = self.dist.sum(torch.tensor([correct], dtype=torch.float64))
        return float(total.item()) / len(problems)

    def _task_record(self) -> dict[str, Any]:
        """``task.json`` beside a saved actor: the task, tokenizer and evaluation of its run."""
        evaluation = {"eval_size": self.config.eval_size, "max_new_tokens": self.max_new_tokens}
        return {**self.task.to_dict(), "tokenizer": self.tokenizer.to_dict(), "evaluation": evaluation}

    # ---- one step and the loop

    def step(self, step_index: int) -> dict[str, Any]:
        """One PPO step (rollout → score → advantages → update); its metrics row (over the
        global batch)."""
        cfg, dist = self.config, self.dist
        metric_row: dict[str, Any] = {key: None for key in METRIC_KEYS}
        metric_row.update(step=step_index, arm=cfg.arm, seed=cfg.seed)
        if cfg.eval_every and step_index % cfg.eval_every == 0:
            with Timer() as t:
                metric_row["eval_accuracy"] = self.evaluate()
            metric_row["time_eval_s"] = t.seconds
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.torch_rng)
            with Timer() as t_rollout:
                r = self.rollout(step_index)
            with Timer() as t_score:
                batch = self.score(r, step_index)
            with Timer() as t_adv:
                metric_row.update(self.compute_advantages(r, batch))
            with Timer() as t_update:
                metric_row.update(self.update(batch, step_index))
            self.torch_rng = torch.get_rng_state()
        m = dist.gather_rows(batch.response_mask)
        rewards = dist.gather_rows(r.rewards)
        metric_row.update(
            reward_mean=float(rewards.double().mean()),
            train_accuracy=float((rewards == 1.0).double().mean()),
            rewards_all_equal=bool(rewards.min() == rewards.max()),
            response_length=float(m.sum(-1).double().mean()),
            entropy=-step.masked_mean(dist.gather_rows(batch.old_logprobs), m),
            time_rollout_s=t_rollout.seconds,
            time_score_s=t_score.seconds,
            time_advantages_s=t_adv.seconds,
            time_update_s=t_update.seconds,
        )
        return metrics.finite_row(metric_row)

    def train(self, stop: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Run steps ``start_step … steps − 1``; write the outputs (rank 0); return the summary.

        ``stop``: polled before each step (and after the last); when it returns True on any
        process, the run writes a checkpoint of the steps completed and raises
        :class:`TrainingInterrupted` (the command line's Ctrl-C). A fresh run also writes a
        checkpoint after its first step, so a run that completed a step can be resumed
        whatever stops it. An exception on one rank stops every rank at once, the others
        raising :class:`~comppo_core.rl.runs.interrupts.RankFailed` (:meth:`Dist.stop_all`)."""
        cfg = self.config
        main = self.dist.is_main
        metric_rows: list[dict[str, Any]] = []  # one per step of this call, as metrics.jsonl's
        log = metrics.RunLog(cfg, self.out if main else None, start_step=self.start_step, enabled=main)
        at = self.start_step  # the step under way, for a failure's message
        try:
            for at in range(self.start_step, cfg.steps):
                self._stop_if_asked(stop, at)
                metric_row = self.step(at)
                metric_rows.append(metric_row)
                log.step(metric_row, max_new_tokens=self.max_new_tokens)
                first = at == self.start_step == 0
                if (first or (cfg.save_every and (at + 1) % cfg.save_every == 0)) and at + 1 < cfg.steps:
                    self.save_checkpoint(at + 1)
            at = max(cfg.steps, self.start_step)
            if self.start_step < cfg.steps or self.checkpoint_dir is None or not self.checkpoint_dir.exists():
                self.save_checkpoint(at)
            self._stop_if_asked(stop, at)
            final_eval = self.evaluate() if cfg.eval_every else None
            if final_eval is not None:
                log.final(at, final_eval)
            summary = self._summary(metric_rows, final_eval)
            self.dist.barrier()  # the outputs are complete when any rank returns
        except TrainingInterrupted:
            raise
        except BaseException as exc:  # on every rank, at once: announced, the group broken
            failure = self.dist.stop_all(exc, step=at, kept=checkpoint.describe_kept(self.out))
            if failure is exc:
                raise
            raise failure from exc
        finally:
            log.close()
        return summary

    def _stop_if_asked(self, stop: Callable[[], bool] | None, next_step: int) -> None:
        """Raise :class:`TrainingInterrupted` (after a checkpoint at ``next_step``) when
        ``stop()`` is True on any process (every process polls, so all stop together)."""
        if stop is None or not self.dist.max_int(int(bool(stop()))):
            return
        if self._saved_at != next_step:
            self.save_checkpoint(next_step)
        self.dist.barrier()
        raise TrainingInterrupted(next_step, self.checkpoint_dir)

    def _summary(self, metric_rows: list[dict[str, Any]], final_eval: float | None) -> dict[str, Any]:
        cfg = self.config
        parameters = {
            "actor": sum(p.numel() for p in self.actor.parameters()),
            "actor_trainable": sum(p.numel() for p in self.actor_params),
            "critic": 0 if self.critic is None else sum(p.numel() for p in self.critic.parameters()),
        }
        run = {"arm": cfg.arm, "seed": cfg.seed, "steps": cfg.steps, "parameters": parameters}
        run.update(world_size=self.dist.world_size, warm_start=self.warm_start, fsdp=self._fsdp_record())
        out = self.out if self.dist.is_main else None
        return metrics.summarize(
            metric_rows, out=out, final_step=max(cfg.steps, self.start_step), final_eval=final_eval, run=run
        )

    def _fsdp_record(self) -> dict[str, Any] | None:
        """Under ``fsdp``, what FSDP2 holds sharded (DTensor) at the end of the run: the
        parameters of the actor, its reference and the critic, sharded / all; else None.
        (The sharded modules are resharded first: FSDP2 keeps the root's own weights, the
        embeddings and the head, gathered after a forward.)"""
        if not self.sharded:
            return None
        modules = {"actor": self.actor, "reference": self.reference, "critic": self.critic}
        for m in modules.values():
            if hasattr(m, "reshard"):
                m.reshard()
        return {
            name: [sum(is_sharded(p) for p in m.parameters()), sum(1 for _ in m.parameters())]
            for name, m in modules.items()
            if m is not None
        }


def train(config: TrainConfig, *, overwrite: bool = False) -> dict[str, Any]:
    """Train one run (module docstring); returns the summary (also ``OUT/summary.json``).
    ``overwrite`` replaces a run already in ``config.out`` (else that is refused).

    Keys: ``arm, seed, steps, initial_eval_accuracy`` (step 0, the warm start),
    ``final_eval_accuracy`` (after the last step), ``eval`` (``[step, accuracy]`` pairs),
    ``final_reward_mean``, ``mean_step_s`` (per phase, over the run's steps),
    ``parameters`` (actor, its trainable part, critic), ``world_size``, ``warm_start``
    (SFT steps, seconds, final loss) and ``fsdp`` (under ``fsdp``: ``[sharded, all]``
    parameters of the actor, its reference and the critic; else None). Under ``torchrun`` every rank calls it and gets the
    summary; a process group it initialised is destroyed before it returns."""
    trainer = Trainer(config, overwrite=overwrite)
    try:
        return trainer.train()
    finally:
        trainer.dist.close()
