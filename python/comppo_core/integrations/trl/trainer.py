"""``CompPOTrainer``: TRL's ``GRPOTrainer`` with CompPO's scoring, Comp-GAE, TAC and losses.

Used as a ``GRPOTrainer`` is (docs/trl.md)::

    trainer = CompPOTrainer(model=..., reward_funcs=..., args=CompPOConfig(arm="comppo", ...),
                            train_dataset=..., processing_class=...)
    trainer.train()

With ``arm="grpo"`` every method is ``GRPOTrainer``'s. A TAC arm keeps TRL's generation,
reward functions, reference model, optimiser, accumulation and checkpoints, and takes the
maths from :mod:`comppo_core.rl.core.step` (the functions :class:`comppo_core.rl.Trainer` runs)::

    generation    GRPOTrainer._generate_and_score_completions (completions, rewards); then on
                  the generation batch, padded to the global batch's widths:
    2. score      step.score(actor, critic, ids, mask, response_mask, gates=step.step_gates(...))
    3. advantages r = step.rewards_with_kl(response_mask, scores, ...): score at the last token
                  A, R = step.compute_advantages(...): Comp-GAE, whitened over the global batch
    4. loss       per micro-batch: step.minibatch_loss(..., share=s) · world_size, where s is
                  the micro-batch's share (step.loss_shares) of the optimiser step's batch
                  (every process, every accumulation step): the sum over micro-batches and
                  processes is the loss of the whole batch, so the update does not depend on
                  how the batch is split (DDP averages the actor's gradients over processes,
                  hence the factor world_size; the critic's are all-reduced the same way)

**One forward where one is enough.** With one optimiser step per generation on one
micro-batch (``num_iterations=1``, ``steps_per_generation=1``: TRL's defaults with the
whole generation batch per device), the update's forward runs on the weights that would
score the rollout, so a TAC arm scores in it (``step.score(..., grad=True, scoring=True)``)
instead of in a no-grad forward of its own before it: one forward on the micro-batch in
TRL's shuffled order, whose detached outputs, put back in generation order, are phases
2–3's (the gates drawn over the rows in that order), and whose outputs with gradients
are the loss's. The old log-probs are then the new ones (the ratio is 1, as TRL's
on-policy GRPO has it), and the step is the two-forward path's bit for bit
(``tests/integrations/test_trl.py``). Otherwise (more micro-batches or epochs per
generation, the critic warm-up, evaluation, a standard critic, a ``"batch"`` gate
z-score) the scoring forward runs on the generation batch first.

Columns are ``[B, T−1]`` (column j scores token ``ids[:, j+1]``): the response columns are
``P−1 … P+C−2`` for a prompt of width ``P``. The TAC (:attr:`CompPOTrainer.critic`) lives
outside the model accelerate wraps, with its own AdamW, stepped after the actor's optimiser
step; it is saved in each checkpoint (``comppo_critic.pt``) and restored on resume.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from torch import nn
from trl.trainer.grpo_trainer import GRPOTrainer

from ...errors import ParameterError
from ...hf.scoring import score as score_tokens
from ...rl import step
from ...rl.core.arms import ARMS, Arm
from ...rl.critics.tac import TransportAlignedCritic
from ...rl.engine.distributed import Dist
from ...rl.gate_direction import check_diagnosis_task
from .config import CompPOConfig, unsupported
from .tasks import TaskReward, pivotal_completion_columns, pivotal_task
from .value_model import ValueModel, build_value_model
from .warmup import warm_up_critic

__all__ = ["CRITIC_FILE", "CompPOTrainer"]

#: The file in each TRL checkpoint directory that holds the critic and its optimiser.
CRITIC_FILE = "comppo_critic.pt"

#: The per-row ``[B, T−1]`` fields of a scored generation batch, stored as ``comppo_<name>``.
_BATCH_FIELDS = tuple(f.name for f in dataclasses.fields(step.Batch))


class CompPOTrainer(GRPOTrainer):  # type: ignore[misc]  # trl's hints are partial
    """``GRPOTrainer`` running a CompPO arm (module docstring)."""

    #: the standard critic's value model (None unless the arm's critic is ``"standard"``)
    value: ValueModel | None
    #: the critic warm-up's rows, one per round (:mod:`~comppo_core.integrations.trl.warmup`)
    critic_warmup_log: list[dict[str, Any]]

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: CompPOConfig | None = None,
        *,
        value_model: Any = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(args, CompPOConfig):
            got = type(args).__name__
            raise ParameterError(f"args: expected a CompPOConfig, got {got}", argument="args")
        self.arm: Arm = ARMS[args.arm]
        self._tac: nn.Module | None = None
        self._tac_optimizer: torch.optim.Optimizer | None = None
        self.value = None
        self.critic_warmup_log = []
        self._warmed_up = False
        self._gate_step: int | None = None  # the step whose gate draws a scoring pass uses (None: global_step)
        if value_model is not None and self.arm.critic != "standard":
            raise ParameterError(
                f"value_model: expected None for the {args.arm} arm, which has no standard critic",
                argument="value_model",
            )
        standard = None
        if self.arm.critic is not None:
            refused = unsupported(
                args, tools=kwargs.get("tools"), environment_factory=kwargs.get("environment_factory")
            )
            if refused:
                option, why = refused[0]
                raise ParameterError(f"{option}: not supported by the {args.arm} arm ({why})", argument=option)
        if self.arm.critic == "standard":  # from the policy's weights, before PEFT or DeepSpeed touch them
            with torch.random.fork_rng(devices=[]):
                standard = build_value_model(
                    model,
                    value_model,
                    seed=args.seed,
                    peft_config=kwargs.get("peft_config"),
                    model_init_kwargs=args.model_init_kwargs,
                )
        # a diagnosis.json as gate_direction: of the task of reward_funcs (a warning where none is known)
        check_diagnosis_task(args.gate_direction, _reward_task_record(reward_funcs), run="this trainer")
        #: the task whose pivotal marks the oracle's gates read (the comppo_oracle arm only)
        self._pivotal_task = None
        if self.arm.gate_source.pivotal:
            self._pivotal_task = pivotal_task(reward_funcs)
            if self._pivotal_task is None:
                raise ParameterError(
                    f"reward_funcs: the {args.arm} arm reads a task's pivotal tokens: expected the reward function of "
                    "a task that marks them (integrations.trl.task_reward_function or dataset_and_rewards of chain or "
                    "filler_addition, say)",
                    argument="reward_funcs",
                )
        super().__init__(model, reward_funcs, args, **kwargs)
        self._cfg: Any = args
        if self.arm.critic is None:
            return
        self.scoring = step.ScoringSettings(
            statistic=args.statistic,
            gate_params=args.applied_gate_params,  # gate_direction applied, as TrainConfig.gate_params
            temperature=args.temperature,
            fixed_gate=args.fixed_gate,
            causal=args.gate_causal,
        )
        self.advantage_settings = step.AdvantageSettings(
            gamma=args.gamma,
            lam=args.lam,
            lam_critic=args.lam_critic,
            whiten=args.whiten_advantages,
            kl_coef=args.beta,
            kl_kind="k3",
            kl_mode="loss",
            gate_in_bootstrap=args.gate_in_bootstrap,
        )
        self.loss_settings = step.LossSettings(
            clip_low=args.epsilon,
            clip_high=args.epsilon_high,
            dual_clip=args.dual_clip,
            value_clip=args.value_clip,
            vf_coef=args.vf_coef,
            agg=args.loss_agg,
            loss_scale_factor=step.LossSettings.horizon(args.loss_agg, args.max_completion_length),
            kl_coef=args.beta,
            kl_kind="k3",
            kl_mode="loss",
        )
        self._cc_dist = Dist(self.accelerator.process_index, self.accelerator.num_processes, self.accelerator.device)
        if standard is not None:
            self.value = ValueModel(
                standard, self.accelerator, lr=args.critic_lr, weight_decay=args.weight_decay, clip=args.max_grad_norm
            )
            return
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(args.seed)
            critic = TransportAlignedCritic.for_model(
                self._base_model(), width=args.tac_width, temporal=args.tac_temporal, trunk_grad=args.trunk_grad
            )
        self._tac = critic.to(device=self.accelerator.device, dtype=torch.float32)
        self._cc_dist.broadcast_module(self._tac)
        self._tac_optimizer = torch.optim.AdamW(
            self._tac.parameters(), lr=args.critic_lr, weight_decay=args.weight_decay
        )

    @property
    def critic(self) -> nn.Module | None:
        """The arm's critic: the transport-aligned critic (replicated on every process, outside
        the model accelerate wraps), the standard critic's value model (as accelerate
        prepared it, once training has started), or None for ``arm="grpo"``."""
        return self.value.module if self.value is not None else self._tac

    @property
    def critic_optimizer(self) -> torch.optim.Optimizer | None:
        """The critic's AdamW (the value model's: None until it is prepared)."""
        return self.value.optimizer if self.value is not None else self._tac_optimizer

    @property
    def critic_warmup_rounds(self) -> int:
        """Rounds of critic-only training before the first PPO step (``CompPOConfig.critic_warmup``)."""
        return int(self._cfg.critic_warmup_rounds)

    @property
    def _training(self) -> bool:
        return bool(getattr(self.model, "training", False))

    # ---- the models

    def _base_model(self) -> Any:
        """The unwrapped policy (with PEFT: the base model with the adapter injected)."""
        inner = self.accelerator.unwrap_model(self.model)
        get_base = getattr(inner, "get_base_model", None)
        return get_base() if callable(get_base) else inner

    @torch.no_grad()
    def _reference_logprobs(
        self, ids: torch.Tensor, mask: torch.Tensor, response_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Log-probs at τ under TRL's reference: ``ref_model``, or with PEFT the model with
        its adapter disabled; at the ``response_mask`` columns alone when given (0 elsewhere)."""
        tau = self._cfg.temperature
        if self.ref_model is not None:
            return score_tokens(self.ref_model, ids, mask, temperature=tau, logprob_columns=response_mask).logprobs
        inner = self.accelerator.unwrap_model(self.model)
        with inner.disable_adapter():
            return score_tokens(self._base_model(), ids, mask, temperature=tau, logprob_columns=response_mask).logprobs

    # ---- phase 2 and 3: on each generation batch

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards  # every process's rows, as TRL gathers them
        return rewards

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate ``x`` over the processes in rank order (the identity on one)."""
        if self.accelerator.num_processes == 1:
            return x
        wire = torch.float32 if x.is_floating_point() and x.dtype != torch.float64 else x.dtype
        if x.dtype == torch.bool:
            wire = torch.int64
        return self.accelerator.gather(x.to(wire).contiguous()).to(x.dtype)

    @property
    def _fused_scoring(self) -> bool:
        """Whether a TAC arm scores each generation batch in the update's forward (module
        docstring): training, one optimiser step per generation on one micro-batch, outside
        the critic warm-up, and gates computed row by row (a ``"batch"`` z-score over the
        rows would be summed in the update's row order, not the generation's)."""
        return (
            self._tac is not None
            and self._training
            and self._gate_step is None
            and int(self._cfg.num_iterations) == 1
            and int(self._cfg.steps_per_generation) == 1
            and (self.scoring.gate_params.normalize != "batch" or not self.arm.gate_source.gated)
        )

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        if self.critic is None:
            return super()._generate_and_score_completions(inputs)
        if self.value is not None:
            self.value.prepare()
        beta, self.beta = self.beta, 0.0  # the arm scores the reference itself, at τ
        try:
            out: dict[str, Any] = super()._generate_and_score_completions(inputs)
        finally:
            self.beta = beta
        pivotal = None
        if self._pivotal_task is not None:  # this process's completions, before any padding
            pivotal = pivotal_completion_columns(
                self._pivotal_task, self.processing_class, inputs, out["completion_ids"], out["completion_mask"]
            )
        out = self._pad_to_global_widths(out)
        b = out["prompt_ids"].shape[0]
        rank = self.accelerator.process_index
        weights = self.reward_weights.to(self._rewards_per_func.device)
        scores = (self._rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)[rank * b : (rank + 1) * b]
        if self._fused_scoring:  # scored in the update's forward: what it needs, in generation order
            out["comppo_scores"] = scores
            out["comppo_row"] = torch.arange(b, device=scores.device)
            out["comppo_response_mask"] = self._scoring_columns(out)[2]  # the loss shares' token counts
            if pivotal is not None:
                out["comppo_pivotal"] = pivotal
            return out
        rows = step.Rows(self._gather, slice(rank * b, (rank + 1) * b), self.accelerator.num_processes > 1)
        batch, stats = self._score(out, scores, rows, pivotal)
        self._log_stats(stats)
        p = out["prompt_ids"].shape[1]
        out["advantages"] = batch.advantages[:, p - 1 :]
        out["old_per_token_logps"] = batch.old_logprobs[:, p - 1 :]
        for name in _BATCH_FIELDS:
            out["comppo_" + name] = getattr(batch, name)
        return out

    def _log_stats(self, stats: dict[str, Any]) -> None:
        """Phase 3's statistics of a generation batch, as ``comppo/<name>`` metrics."""
        mode = "train" if self._training else "eval"
        for key, value in stats.items():
            if value is not None:
                self._metrics[mode]["comppo/" + key].append(float(value))

    def _pad_to_global_widths(self, out: dict[str, Any]) -> dict[str, Any]:
        """Prompts left-padded and completions right-padded to the widest of every process,
        so the rows of all processes form one ``[B, T]`` batch (one process: unchanged)."""
        widths = torch.tensor(
            [out["prompt_ids"].shape[1], out["completion_ids"].shape[1]], device=self.accelerator.device
        )
        p, c = (int(w) for w in self._gather(widths.unsqueeze(0)).max(0).values)
        dp, dc = p - out["prompt_ids"].shape[1], c - out["completion_ids"].shape[1]
        if dp == 0 and dc == 0:
            return out
        pad = getattr(self.processing_class, "pad_token_id", None) or 0
        out = dict(out)
        out["prompt_ids"] = torch.nn.functional.pad(out["prompt_ids"], (dp, 0), value=pad)
        out["prompt_mask"] = torch.nn.functional.pad(out["prompt_mask"], (dp, 0), value=0)
        out["completion_ids"] = torch.nn.functional.pad(out["completion_ids"], (0, dc), value=pad)
        for key in ("completion_mask", "tool_mask", "old_per_token_logps", "sampling_per_token_logps"):
            if out.get(key) is not None:
                out[key] = torch.nn.functional.pad(out[key], (0, dc), value=0)
        return out

    @staticmethod
    def _scoring_columns(out: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """``(ids [B, T], mask [B, T], response_mask [B, T−1], P)`` of TRL's generation batch
        (the response: the completion, less tool output)."""
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1).bool()
        loss_mask = (
            out["completion_mask"] if out.get("tool_mask") is None else out["completion_mask"] * out["tool_mask"]
        )
        p = out["prompt_ids"].shape[1]
        response_mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool, device=ids.device)
        response_mask[:, p - 1 :] = loss_mask.bool()
        return ids, mask, response_mask, p

    def _step_gates(self, response_mask: torch.Tensor, p: int, rows: step.Rows, pivotal: torch.Tensor | None) -> Any:
        """``step.step_gates`` of this step on the batch of prompt width ``p``; ``pivotal``
        ``[B, C]``: the completion tokens the task marks pivotal."""
        pivotal_columns = None
        if pivotal is not None:  # completion token k is response column p − 1 + k
            pivotal_columns = torch.zeros_like(response_mask)
            pivotal_columns[:, p - 1 : p - 1 + pivotal.shape[1]] = pivotal.to(response_mask.device)
        return step.step_gates(
            self.arm,
            self.scoring,
            step=self.state.global_step if self._gate_step is None else self._gate_step,
            seed=self._cfg.seed,
            shape=(response_mask.shape[0], response_mask.shape[1]),
            device=response_mask.device,
            rows=rows,
            pivotal=pivotal_columns,
        )

    def _score(
        self,
        out: dict[str, Any],
        scores: torch.Tensor,
        rows: step.Rows,
        pivotal: torch.Tensor | None = None,
        *,
        scored: step.Scored | None = None,
    ) -> tuple[step.Batch, dict[str, Any]]:
        """Phases 2–3 of :class:`comppo_core.rl.Trainer` on TRL's generation batch; ``pivotal``
        ``[B, C]`` bool: the completion tokens the task marks pivotal (the oracle arm).
        ``scored``: the scoring pass's outputs, detached, when the update's forward gave them
        (module docstring); else the scoring forward runs here."""
        ids, mask, response_mask, p = self._scoring_columns(out)
        s = scored
        if s is None:
            gates = self._step_gates(response_mask, p, rows, pivotal)
            with torch.no_grad(), self.accelerator.autocast():
                s = step.score(
                    self._base_model(),
                    self.critic,
                    ids,
                    mask,
                    response_mask,
                    arm=self.arm,
                    settings=self.scoring,
                    grad=False,
                    gates=gates,
                    rows=rows,
                )
        ref = self._reference_logprobs(ids, mask, response_mask) if self.beta != 0.0 else None
        rewards, kl = step.rewards_with_kl(response_mask, scores, s.logprobs, ref, self.advantage_settings)
        groups = torch.arange(ids.shape[0], device=ids.device) // int(
            self.num_generations or 1
        )  # unused by critic arms
        advantages, returns, all_advantages = step.compute_advantages(
            self.arm,
            rewards,
            response_mask,
            values=s.values,
            gates=s.gates,
            groups=groups,
            settings=self.advantage_settings,
            rows=rows,
        )
        batch = step.Batch(
            input_ids=ids,
            attention_mask=mask,
            response_mask=response_mask,
            old_logprobs=s.logprobs,
            advantages=advantages,
            old_values=s.values,
            returns=returns,
            ref_logprobs=ref,
            gates=s.gates,
        )
        return batch, step.advantage_statistics(batch, kl, all_advantages, rows)

    # ---- phase 4: each micro-batch's share of its optimiser step's batch

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        if self.value is not None:
            self.value.prepare()  # accelerate has prepared the policy by now
        if self.critic is not None and self._training and not self._warmed_up:
            self._warmed_up = True  # once per train(); a resumed run's critic is already warm
            if self.state.global_step == 0 and self.critic_warmup_rounds:
                self.critic_warmup_log = warm_up_critic(self, self.critic_warmup_rounds)
        before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self.critic is not None and self._training and self._buffered_inputs is not before:
            self._set_shares(self._buffered_inputs)
        return inputs

    def _set_shares(self, chunks: list[dict[str, Any]]) -> None:
        """``comppo_share`` / ``comppo_token_share`` of each buffered micro-batch: its part of
        the denominator of the optimiser step it belongs to (``gradient_accumulation_steps``
        consecutive chunks on every process; :func:`comppo_core.rl.core.step.loss_shares`)."""
        accumulation = self._cfg.gradient_accumulation_steps
        tokens = torch.stack([c["comppo_response_mask"].sum(-1) for c in chunks])  # [S, b]
        every = self._gather(tokens.unsqueeze(0)).cpu()  # [P, S, b]
        n_proc, _, b = every.shape
        rank = self.accelerator.process_index
        for k, chunk in enumerate(chunks):
            w = k // accumulation
            window = every[:, w * accumulation : (w + 1) * accumulation]  # [P, GA, b]
            flat = window.reshape(-1)
            index = torch.arange(flat.numel())
            start = (rank * accumulation + (k - w * accumulation)) * b
            share, token_share = step.loss_shares(flat, index, index[start : start + b], self._cfg.loss_agg)
            chunk["comppo_share"], chunk["comppo_token_share"] = share, token_share
        del n_proc

    def _update_forward(self, inputs: dict[str, Any], *, critic_only: bool = False) -> tuple[step.Batch, step.Scored]:
        """A micro-batch's ``step.Batch`` (its ``comppo_*`` fields) and the update's forward on
        it; ``critic_only``: the actor without gradients, the critic with them (the warm-up)."""
        fields: dict[str, Any] = {name: inputs.get("comppo_" + name) for name in _BATCH_FIELDS}
        mb = step.Batch(**fields)
        with self.accelerator.autocast():
            s = step.score(
                self._base_model(),
                self.critic,
                mb.input_ids,
                mb.attention_mask,
                mb.response_mask,
                arm=self.arm,
                settings=self.scoring,
                grad=not critic_only,
                critic_grad=True if critic_only else None,
                gates=None,
            )
        return mb, s

    def _fused_forward(self, inputs: dict[str, Any]) -> tuple[step.Batch, step.Scored]:
        """The scoring pass and the update's forward in one (module docstring): one forward
        with gradients on the micro-batch (the whole generation batch, in TRL's shuffled
        order), phases 2–3 on its detached outputs put back in generation order (the gates
        drawn there, as the scoring pass draws them); the micro-batch's ``step.Batch`` (in
        the forward's order) and the forward."""
        row = inputs["comppo_row"]
        n, device = int(row.shape[0]), inputs["prompt_ids"].device
        perm = row.to(device)  # row i here is generation row perm[i]
        inv = torch.argsort(perm)  # generation row j is row inv[j] here
        generation = {
            k: v[inv.to(v.device)] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == n else v
            for k, v in inputs.items()
        }
        rank = self.accelerator.process_index
        rows = step.Rows(self._gather, slice(rank * n, (rank + 1) * n), self.accelerator.num_processes > 1)
        ids, mask, response_mask, p = self._scoring_columns(inputs)
        pivotal = generation.get("comppo_pivotal")
        drawn = self._step_gates(response_mask[inv], p, rows, pivotal)
        gates: Any = drawn
        if callable(drawn):  # computed over the rows in generation order, handed back in this order

            def gates(own: torch.Tensor, statistic: torch.Tensor, resp: torch.Tensor) -> torch.Tensor:
                return drawn(own[inv], statistic[inv], resp[inv])[perm]

        elif isinstance(drawn, torch.Tensor):
            gates = drawn[perm]
        with self.accelerator.autocast():
            s = step.score(
                self._base_model(),
                self.critic,
                ids,
                mask,
                response_mask,
                arm=self.arm,
                settings=self.scoring,
                grad=True,
                scoring=True,
                gates=gates,
                rows=rows,
            )
        detached = step.Scored(
            logprobs=s.logprobs.detach()[inv],
            values=None if s.values is None else s.values.detach()[inv],
            gates=None if s.gates is None else s.gates[inv],
        )
        batch, stats = self._score(generation, generation["comppo_scores"], rows, pivotal, scored=detached)
        self._log_stats(stats)
        return batch.select(perm), s

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        if self.critic is None:
            return super()._compute_loss(model, inputs)
        if inputs.get("comppo_scores") is not None:
            mb, s = self._fused_forward(inputs)
        else:
            mb, s = self._update_forward(inputs)
        shares = {
            "share": float(inputs.get("comppo_share", 1.0)),
            "token_share": float(inputs.get("comppo_token_share", 1.0)),
        }
        world = self.accelerator.num_processes
        if self.value is None:  # the TAC reads the actor's hidden states: one loss, one backward
            loss, entries = step.minibatch_loss(
                mb, s.logprobs, s.values, self.loss_settings, train_actor=True, **shares
            )
            assert loss is not None  # a TAC arm always has a value loss
            self._log_entries(entries)
            return loss * world
        # the value model's graph is its own: its part goes back through its own backward
        # (its DeepSpeed engine, or DDP/FSDP2's hooks on the prepared module), the actor's to TRL
        loss, entries = step.minibatch_loss(mb, s.logprobs, None, self.loss_settings, train_actor=True, **shares)
        value_loss, value_entries = step.minibatch_loss(
            mb, s.logprobs, s.values, self.loss_settings, train_actor=False, **shares
        )
        assert loss is not None and value_loss is not None
        self.value.backward(value_loss * world, boundary=bool(self.accelerator.sync_gradients))
        entries.update(value_loss=value_entries["value_loss"], value_clipfrac=value_entries["value_clipfrac"])
        self._log_entries(entries)
        return loss * world

    def _log_entries(self, entries: dict[str, float]) -> None:
        """The micro-batch's shares of the step's loss statistics, summed over processes and
        scaled by the accumulation steps, so TRL's mean over the step's micro-batches is the
        statistic of the step's whole batch."""
        mode = "train" if self._training else "eval"
        keys = sorted(entries)
        values = torch.tensor([entries[k] for k in keys], dtype=torch.float64, device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            values = self.accelerator.reduce(values.float(), reduction="sum").double()
        scale = self.current_gradient_accumulation_steps if mode == "train" else 1
        for key, value in zip(keys, values.tolist()):
            self._metrics[mode]["comppo/" + key].append(value * scale)

    # ---- the critic's optimiser step

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        loss: torch.Tensor = super().training_step(model, inputs, num_items_in_batch)
        if self.critic is not None and self.accelerator.sync_gradients:
            self._reduce_actor_gradients()
            self._step_critic()
        return loss

    def _critic_backward(self, loss: torch.Tensor, *, boundary: bool) -> None:
        """Backward a critic-only loss (the warm-up's): the value model's own backward, or the TAC's."""
        if self.value is not None:
            self.value.backward(loss, boundary=boundary)
        else:
            loss.backward()

    def _reduce_actor_gradients(self) -> None:
        """Under DDP, the mean of the actor's gradients over processes, once.

        The update's forward runs the unwrapped model (the probe patches its attention and
        the TAC's taps hook its layers; DDP's ``forward`` would hide both), so DDP's reducer,
        which ``DistributedDataParallel.forward`` arms, never fires: this is the one
        reduction. ZeRO-2/3 and FSDP2 reduce in hooks on the parameters and modules
        themselves, which fire whichever object's forward runs, so nothing is added there.
        The value model is called through its prepared wrapper, so its backend reduces it.
        tests/integrations/test_trl_backends.py proves each: 2 processes equal 1."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(self.model_wrapped, DistributedDataParallel):
            return
        params = [p for p in self.model_wrapped.module.parameters() if p.requires_grad]
        self._cc_dist.all_reduce_gradients(params)
        for p in params:
            if p.grad is not None:
                p.grad.div_(self.accelerator.num_processes)

    def _step_critic(self) -> None:
        """Clip to ``max_grad_norm`` and step the critic; log its gradient norm before
        clipping. The TAC's gradients are first all-reduced (the mean over processes, as DDP
        does for the actor); the value model's were reduced by its backend in backward."""
        if self.value is not None:
            self._metrics["train"]["comppo/grad_norm_critic"].append(self.value.step())
            return
        assert self._tac is not None and self._tac_optimizer is not None
        params = [p for p in self._tac.parameters() if p.requires_grad]
        self._cc_dist.all_reduce_gradients(params)
        world = self.accelerator.num_processes
        if world > 1:
            for p in params:
                if p.grad is not None:
                    p.grad.div_(world)
        norm = torch.nn.utils.clip_grad_norm_(params, self._cfg.max_grad_norm)
        self._tac_optimizer.step()
        self._tac_optimizer.zero_grad(set_to_none=True)
        self._metrics["train"]["comppo/grad_norm_critic"].append(float(norm))

    # ---- checkpoints

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.critic is None:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if self.value is not None:
            self.value.prepare()
            state = {"arm": self.arm.name, **self.value.save(folder)}  # every process: a collective when sharded
        else:
            assert self._tac is not None and self._tac_optimizer is not None
            state = {
                "arm": self.arm.name,
                "critic": self._tac.state_dict(),
                "optimizer": self._tac_optimizer.state_dict(),
            }
        if self._cfg.should_save:
            path = os.path.join(folder, CRITIC_FILE)
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)

    def _load_optimizer_and_scheduler(self, checkpoint: Any) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if self.critic is None or checkpoint is None:
            return
        path = os.path.join(checkpoint, CRITIC_FILE)
        if not os.path.exists(path):
            raise ParameterError(
                f"resume_from_checkpoint: expected {CRITIC_FILE} in {checkpoint} (a checkpoint of a {self.arm.name} run)",
                argument="resume_from_checkpoint",
            )
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state["arm"] != self.arm.name:
            raise ParameterError(
                f"resume_from_checkpoint: expected a checkpoint of the {self.arm.name} arm, got {state['arm']}",
                argument="resume_from_checkpoint",
            )
        if self.value is not None:
            self.value.load(checkpoint, state)
            return
        assert self._tac is not None and self._tac_optimizer is not None
        self._tac.load_state_dict(state["critic"])
        self._tac_optimizer.load_state_dict(state["optimizer"])


def _reward_task_record(reward_funcs: Any) -> dict[str, Any] | None:
    """The ``to_dict`` of the task of the first :class:`~.tasks.TaskReward` in ``reward_funcs``
    (one, or a list): the trainer's task as a diagnosis records one; None when none is there."""
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    for fn in funcs:
        if isinstance(fn, TaskReward):
            return dict(fn.task.to_dict())
    return None
