"""``TrainConfig``: every setting of a :func:`comppo_core.rl.train` run, as one dataclass.

One source for three uses: the dataclass (a run is ``train(TrainConfig(arm="comppo"))``),
the JSON saved with each run and its checkpoints (:meth:`TrainConfig.to_json`,
:meth:`TrainConfig.from_json`), and the command line (:meth:`TrainConfig.add_arguments`
makes every field a ``--flag``; :meth:`TrainConfig.from_args` reads them back). Each
field's help text lives in its ``metadata["help"]`` and is appended to the class
docstring, so ``help(TrainConfig)`` lists them all.

Names follow what RL engineers know from verl and TRL: ``ppo_epochs``, ``clip_low`` /
``clip_high`` (verl's ``clip_ratio_low`` / ``clip_ratio_high``), ``dual_clip``
(``clip_ratio_c``), ``value_clip`` (``cliprange_value``), ``vf_coef``, ``kl_coef``,
``kl_kind`` (verl's ``kl_penalty``), ``kl_mode="loss"`` (verl's ``use_kl_loss``),
``critic_warmup``, ``lam`` / ``lam_critic`` (decoupled GAE), ``loss_agg`` (verl's
``loss_agg_mode``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import types
import typing
import warnings
from typing import Any

from ..errors import ParameterError
from ..gate_params import GateParams
from ..options import (
    AGG_MODES,
    ARM_NAMES,
    DTYPES,
    EVAL_SPLITS,
    GROUP_METHODS,
    KL_KINDS,
    KL_MODES,
    NORMALIZE_MODES,
    REPORT_TO,
    STATISTICS,
    TEMPORAL_MIXERS,
    check_choice,
)
from .gate_direction import (
    DEFAULT_GATE_DIRECTION,
    check_diagnosis_task,
    checked_gate_direction,
    config_task_record,
    direction_of_gate_invert,
    given_gate_direction,
    recommended_direction,
    upgrade_fields,
)
from .runs.run_dir import absolute
from .tasks import TASKS, size_fields, task_entry

__all__ = [
    "KL_MODES",
    "PRESETS",
    "RESUMABLE_CHANGES",
    "TrainConfig",
    "field_types",
    "recommended_direction",
    "upgrade_fields",
]

# This module imports no torch (nor transformers): every closed set a field is checked
# against comes from comppo_core.options (KL_MODES is re-exported from there), so that
# reading, validating and parsing a TrainConfig (``comppo-core train --help``) stays light.

#: The registered tasks' size settings (:data:`comppo_core.rl.tasks.TASKS`) beyond ``digits``,
#: the one several tasks share, which the users of this tuple list on its own.
TASK_SIZES = tuple(field for field in size_fields() if field != "digits")
#: Critic warm-up rounds of an arm with a critic when ``critic_warmup`` is None.
DEFAULT_CRITIC_WARMUP = 10


#: The fields a resumed run may change (every other field must equal the checkpoint's).
RESUMABLE_CHANGES = (
    "out",
    "steps",
    "resume",
    "progress",
    "save_every",
    "eval_every",
    "num_threads",
    "device",
    "report_to",
)


def _f(default: Any, help: str, **kw: Any) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, **kw})


@dataclasses.dataclass
class TrainConfig:
    """Settings of one training run (fields below; every one is a CLI flag ``--field-name``).

    Invalid values raise :class:`~comppo_core.errors.ParameterError` naming the field.
    """

    # ---- the run
    arm: str = _f(
        "comppo",
        f"which advantage estimator and critic (see comppo_core.rl.core.arms: {', '.join(ARM_NAMES)})",
    )
    seed: int = _f(0, "seeds the model initialisation, the warm start, the rollouts and the updates")
    out: str | None = _f(
        None,
        "output directory (metrics.jsonl, config.json, summary.json, warmstart/, checkpoint/); None writes nothing",
    )
    steps: int = _f(60, "PPO steps (one rollout batch each)")
    resume: bool = _f(
        False,
        "continue from OUT/checkpoint (the saved config must agree except " + ", ".join(RESUMABLE_CHANGES) + ")",
    )
    save_every: int = _f(10, "write OUT/checkpoint every this many steps and after the last (0: only after the last)")
    eval_every: int = _f(
        10,
        "held-out greedy accuracy at the start of every step that is a multiple of this "
        "(step 0 included) and after the last step; 0 turns it off",
    )
    eval_size: int = _f(
        2048,
        "held-out problems in the evaluation set (fewer if the split has fewer: 2024 for "
        "2-digit addition, all of them)",
    )
    progress: bool = _f(True, "show a tqdm progress bar with reward and accuracy")
    num_threads: int | None = _f(
        None,
        "torch threads of each process (None: 1 on CPU, so that processes sharing a machine do not "
        "oversubscribe its cores; torch's own choice on CUDA)",
    )
    report_to: str = _f(
        "none",
        "where the metrics go besides metrics.jsonl: none, tensorboard (OUT/tensorboard; the "
        "[tensorboard] extra) or wandb (the [wandb] extra; WANDB_MODE=offline works without a login)",
    )

    # ---- the task
    task: str = _f(
        "addition",
        "a registered task (comppo_core.rl.tasks): " + "; ".join(f"{e.spelling}: {e.about}" for e in TASKS.values()),
    )
    task_options: dict[str, Any] = dataclasses.field(
        default_factory=dict,
        metadata={
            "help": "settings of a task that takes them (reasoning_gym:NAME: its dataset's config fields, and "
            "answer_format final, plain or tag), on the command line --task-option KEY=VALUE, once per setting, the value "
            "read as JSON when it parses, else as a string (--task-option min_terms=2 --task-option "
            'operators=\'["+", "-"]\'); {}: none',
            "flag": "--task-option",
        },
    )
    digits: int = _f(2, "addition's difficulty (and filler_addition's): operands below 10**digits")
    addition_filler_min: int = _f(0, "filler_addition: shortest filler before the worked addition (symbols of abcd)")
    addition_filler_max: int = _f(
        16, "filler_addition: longest filler (a response: filler, separator, worked addition, separator, tail)"
    )
    addition_tail_min: int = _f(0, "filler_addition: shortest tail (the filler after the second separator)")
    addition_tail_max: int = _f(16, "filler_addition: longest tail (0: no tail and no second separator)")
    chain_digits: int = _f(8, "chain: digits in the prompt, one of which the response recalls (2 to 10)")
    chain_steps: int = _f(8, "chain: digits counted on after the recalled one; the last one is verified (1 to 32)")
    chain_filler_min: int = _f(0, "chain: shortest filler before the separator (symbols of abcd)")
    chain_filler_max: int = _f(
        32, "chain: longest filler (a response: filler, separator, the recalled digit, the chain, separator, tail)"
    )
    chain_tail_min: int = _f(0, "chain: shortest tail (the filler after the chain and a second separator)")
    chain_tail_max: int = _f(32, "chain: longest tail (0: no tail and no second separator)")
    split_seed: int = _f(0, "fixes which problems are held out (independent of seed)")
    heldout_fraction: float = _f(0.2, "share of problems held out for evaluation")
    validation_fraction: float = _f(
        0.0,
        "share of problems in a validation split, disjoint from the held-out split and from training "
        "(0: none, the training problems as without it; compare --grid tunes on it)",
    )
    eval_split: str = _f(
        "heldout",
        f"the split the periodic evaluation reads: {', '.join(EVAL_SPLITS)} (needs validation_fraction > 0)",
    )

    # ---- the model and its warm start
    init_from: str | None = _f(
        None,
        "start the policy from this save_pretrained directory instead of a "
        "randomly initialised model and the SFT warm start",
    )
    model_hidden: int = _f(64, "hidden size of the built-in Llama policy")
    model_layers: int = _f(4, "decoder layers of the built-in policy")
    model_heads: int = _f(4, "attention heads of the built-in policy")
    model_kv_heads: int = _f(2, "key/value heads of the built-in policy")
    model_intermediate: int = _f(256, "MLP width of the built-in policy")
    warmup_sft_steps: int = _f(180, "supervised steps on worked solutions before RL (0: none)")
    sft_batch_size: int = _f(64, "sequences per SFT step")
    sft_lr: float = _f(3e-3, "peak SFT learning rate (linear warm-up over 50 steps, linear decay to 0)")
    sft_carry_noise: float = _f(
        0.0,
        "share of the SFT demonstrations of carrying problems that forget every carry (right format, "
        "wrong answer): a warm start that hesitates at the pivotal carry tokens, which RL then corrects "
        "(the demo's setting)",
    )

    # ---- rollout
    prompts_per_step: int = _f(32, "prompts per rollout batch")
    group_size: int = _f(8, "samples per prompt (G); the batch is prompts_per_step * group_size sequences")
    temperature: float = _f(0.7, "sampling temperature")
    top_p: float = _f(1.0, "nucleus sampling threshold (1: off)")
    max_new_tokens: int | None = _f(None, "response budget in tokens (None: the task's longest response)")

    # ---- advantages
    gamma: float = _f(1.0, "discount γ")
    lam: float = _f(0.95, "GAE λ of the actor's advantages")
    lam_critic: float | None = _f(1.0, "λ of the critic's returns (decoupled GAE; None: lam)")
    whiten_advantages: bool = _f(True, "masked_whiten the GAE advantages over the batch (critic arms; verl's GAE)")
    group_method: str = _f("grpo", f"outcome baseline of the grpo arm ({', '.join(GROUP_METHODS)})")
    statistic: str = _f("entropy", f"attention concentration statistic read by the probe ({', '.join(STATISTICS)})")
    gate_low: float = _f(0.9, "lowest gate of the concentration → gate mapping (GateParams.low)")
    gate_high: float = _f(1.0, "highest gate (GateParams.high)")
    gate_sharpness: float = _f(1.0, "slope of the gate sigmoid (GateParams.sharpness)")
    gate_min_spread: float = _f(
        0.0,
        "floor on the spread the gates' z-score divides by, in the concentration's units: z = (c − μ)/max(σ, "
        "floor) (GateParams.min_spread; 0: none; 1e-3 keeps a random-init policy's near-constant "
        "concentration at the mid gate and moved no trained warm start's gates, benches/lab/gate_spread.py)",
    )
    gate_normalize: str = _f(
        "sequence",
        "z-score of the concentration: sequence, batch, none or causal (GateParams.normalize; gate_causal replaces "
        "it by the running z-score)",
    )
    gate_direction: str = _f(
        DEFAULT_GATE_DIRECTION,
        "the gate mapping's direction: as_is (a high concentration, a high gate; with the policy_entropy and "
        "token_nll gates, an uncertain token, a low gate), inverted (the mirror image, GateParams.invert), "
        "none (only for an arm whose gates have no direction: a constant gate, the oracle, none), or the path "
        "of a diagnosis.json (comppo-core diagnose) of the run's task whose recommended direction for the arm's "
        "gates is applied (the direction only, not its gate range; a diagnosis of another task is refused; recorded "
        "with the file's SHA-256: keep the file with the runs; a changed file is refused)",
    )
    fixed_gate: float | None = _f(
        None,
        "the constant gate of tac_fixed and ppo_fixed (None: the batch mean of the concentration gates, "
        "cc.controls.constant)",
    )
    gate_causal: bool = _f(
        True,
        "Comp-GAE's gates from the row's running z-score of the concentration, so the gate at a token reads "
        "the response up to it (False: the whole row's z-score, the earlier default)",
    )
    gate_in_bootstrap: bool = _f(
        True,
        "the gates enter Comp-GAE's one-step bootstrap δ = r + γ·g·V' − V as well as its trace (the paper); "
        "False: the trace only, δ = r + γ·V' − V (an ablation: a state-dependent λ)",
    )

    # ---- the PPO update
    ppo_epochs: int = _f(2, "passes over each rollout batch")
    num_minibatches: int = _f(2, "minibatches per epoch (the batch is split evenly)")
    actor_lr: float = _f(
        3e-5,
        "actor learning rate (AdamW; on the built-in task, without a KL anchor, 3e-5 and up "
        "lowered held-out accuracy: docs/training.md)",
    )
    critic_lr: float = _f(1e-3, "critic learning rate (AdamW)")
    weight_decay: float = _f(0.0, "AdamW weight decay of both optimizers")
    max_grad_norm: float = _f(1.0, "gradient clipping of the actor's and the critic's gradients, each on its own")
    clip_low: float = _f(0.2, "PPO ratio clip below, ε_low (verl clip_ratio_low)")
    clip_high: float | None = _f(None, "PPO ratio clip above, ε_high (None: clip_low)")
    dual_clip: float | None = _f(3.0, "dual-clip constant c > 1 (verl clip_ratio_c; None: off)")
    value_clip: float | None = _f(0.5, "value clip ε (verl cliprange_value; None: off)")
    vf_coef: float = _f(0.5, "weight of the value loss")
    loss_agg: str = _f("token-mean", "loss aggregation (verl loss_agg_mode)")
    critic_warmup: int | None = _f(
        None,
        "rounds of critic-only training on rollouts of the warm-started policy before the first PPO step "
        f"(None: {DEFAULT_CRITIC_WARMUP} for an arm with a critic, 0 for grpo)",
    )
    kl_coef: float = _f(
        1.0,
        "weight of the KL to the frozen reference (the policy after the warm start); on the "
        "built-in task it keeps update noise from eroding the warm start (docs/training.md)",
    )
    kl_kind: str = _f("k2", f"KL estimator: {', '.join(dict.fromkeys(KL_KINDS.values()))} (verl kl_penalty)")
    kl_mode: str = _f(
        "loss",
        "reward: −kl_coef·KL per token in the rewards (TRL); loss: kl_coef·KL added to the loss (verl use_kl_loss)",
    )
    log_kl: bool = _f(True, "keep the reference even with kl_coef = 0 to log the KL (one no-grad forward a step)")

    # ---- critics
    tac_width: int = _f(64, "width of the transport-aligned critic")
    tac_temporal: str = _f("none", f"TAC's causal mixer: {', '.join(TEMPORAL_MIXERS)}")
    trunk_grad: float = _f(0.0, "fraction of the value gradient TAC lets into the actor's hidden states")

    # ---- devices, a user's model and data, LoRA (rl.engine.distributed, rl.models, rl.tasks.jsonl)
    device: str = _f(
        "auto",
        "where each process computes: auto (cuda:LOCAL_RANK when CUDA is available, else cpu), "
        "cpu, cuda, cuda:N; under torchrun the ranks talk over NCCL on CUDA and gloo on CPU",
    )
    dtype: str = _f(
        "float32",
        "float32, or bfloat16: the RL forwards (rollouts, scoring, update, evaluation) under bfloat16 "
        "autocast, the weights the optimisers step kept float32 (their master copy), the frozen ones (the "
        "KL reference; with LoRA the base model) stored in bfloat16",
    )
    fsdp: bool = _f(
        False,
        "under torchrun, shard the policy, its KL reference and a standard critic with FSDP2 (fully_shard on "
        "each decoder layer and the model) instead of holding them whole on every process; the TAC stays replicated",
    )
    model: str | None = _f(
        None,
        "a local Hugging Face model directory: the policy (AutoModelForCausalLM) and its "
        "tokenizer (AutoTokenizer) instead of the built-in Llama, character tokenizer and SFT warm start",
    )
    chat_template: bool = _f(
        False, "with model: each prompt as one user turn of the tokenizer's chat template, if it has one"
    )
    lora_rank: int = _f(
        0,
        "LoRA rank through peft (0: train every weight); the KL reference is then the base model "
        "with the adapter disabled, and checkpoints hold the adapter",
    )
    lora_alpha: float = _f(16.0, "LoRA alpha (the adapter's output is scaled by lora_alpha / lora_rank)")
    lora_target_modules: str = _f(
        "all-linear",
        "the layers LoRA adapts: all-linear (every linear layer but the output "
        "head) or comma-separated module names such as q_proj,v_proj",
    )

    #: replaced by ``gate_direction`` (True: ``"inverted"``); accepted with a DeprecationWarning
    gate_invert: dataclasses.InitVar[bool | None] = None

    def __post_init__(self, gate_invert: bool | None) -> None:
        check_choice("arm", self.arm, ARM_NAMES)
        if gate_invert is not None:
            warnings.warn(
                "TrainConfig(gate_invert=...) is replaced by gate_direction='inverted' or 'as_is'",
                DeprecationWarning,
                stacklevel=3,
            )
            # the default is not a direction given (an explicit "as_is" beside gate_invert=True is refused)
            self.gate_direction = direction_of_gate_invert(gate_invert, given_gate_direction(self.gate_direction))
        task = task_entry(self.task)  # the registry's entry, or a ParameterError naming task
        self.task_options = _task_options(self.task_options, task)
        check_choice("group_method", self.group_method, GROUP_METHODS)
        check_choice("statistic", self.statistic, STATISTICS)
        check_choice("loss_agg", self.loss_agg, AGG_MODES)
        check_choice("kl_kind", self.kl_kind, KL_KINDS)
        check_choice("kl_mode", self.kl_mode, KL_MODES)
        check_choice("tac_temporal", self.tac_temporal, TEMPORAL_MIXERS)
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("gate_normalize", self.gate_normalize, NORMALIZE_MODES)
        for name in (
            "steps",
            "eval_size",
            "model_hidden",
            "model_layers",
            "model_heads",
            "model_kv_heads",
            "model_intermediate",
            "sft_batch_size",
            "prompts_per_step",
            "group_size",
            "ppo_epochs",
            "num_minibatches",
            "tac_width",
        ):
            _integer(name, getattr(self, name), 1)
        for name in ("seed", "save_every", "eval_every", "split_seed", "warmup_sft_steps"):
            _integer(name, getattr(self, name), 0)
        _integer("digits", self.digits, 1, 6)
        _integer("chain_digits", self.chain_digits, 2, 10)
        _integer("chain_steps", self.chain_steps, 1, 32)
        _integer("chain_filler_min", self.chain_filler_min, 0, 256)
        _integer("chain_filler_max", self.chain_filler_max, self.chain_filler_min, 256)
        _integer("chain_tail_min", self.chain_tail_min, 0, 256)
        _integer("chain_tail_max", self.chain_tail_max, self.chain_tail_min, 256)
        _integer("addition_filler_min", self.addition_filler_min, 0, 256)
        _integer("addition_filler_max", self.addition_filler_max, self.addition_filler_min, 256)
        _integer("addition_tail_min", self.addition_tail_min, 0, 256)
        _integer("addition_tail_max", self.addition_tail_max, self.addition_tail_min, 256)
        if self.sft_carry_noise and not task.carries and not task.needs_model:
            raise ParameterError(
                f"sft_carry_noise: expected 0 for the task {self.task!r} (carries are addition's), "
                f"got {self.sft_carry_noise!r}",
                argument="sft_carry_noise",
            )
        for name in ("num_threads", "max_new_tokens"):
            if getattr(self, name) is not None:
                _integer(name, getattr(self, name), 1)
        for name in ("gamma", "lam", "gate_low", "gate_high", "trunk_grad", "sft_carry_noise"):
            _number(name, getattr(self, name), 0.0, 1.0)
        for name in ("lam_critic", "fixed_gate"):
            if getattr(self, name) is not None:
                _number(name, getattr(self, name), 0.0, 1.0)
        _number("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _number("heldout_fraction", self.heldout_fraction, 0.0, 1.0, low_open=True, high_open=True)
        _number("validation_fraction", self.validation_fraction, 0.0, 1.0 - self.heldout_fraction, high_open=True)
        check_choice("eval_split", self.eval_split, EVAL_SPLITS)
        if self.eval_split == "validation" and not self.validation_fraction:
            raise ParameterError(
                "eval_split: expected 'heldout' without a validation split (validation_fraction = 0), got 'validation'",
                argument="eval_split",
            )
        for name in ("temperature", "sft_lr", "actor_lr", "critic_lr", "max_grad_norm"):
            _number(name, getattr(self, name), 0.0, math.inf, low_open=True)
        for name in ("weight_decay", "clip_low", "vf_coef", "kl_coef", "gate_min_spread"):
            _number(name, getattr(self, name), 0.0, math.inf)
        for name in ("clip_high", "value_clip"):
            if getattr(self, name) is not None:
                _number(name, getattr(self, name), 0.0, math.inf)
        if self.dual_clip is not None:
            _number("dual_clip", self.dual_clip, 1.0, math.inf, low_open=True)
        for name in ("out", "init_from", "model"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise ParameterError(f"{name}: expected a path string or None, got {v!r}", argument=name)
            if v is not None:  # stored absolute: a run resumes from any directory, with any spelling
                setattr(self, name, absolute(v))
        if task.file_suffix is not None:
            self.task = absolute(self.task)
        check_choice("report_to", self.report_to, REPORT_TO)
        for name in (
            "resume",
            "progress",
            "whiten_advantages",
            "gate_causal",
            "gate_in_bootstrap",
            "log_kl",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ParameterError(f"{name}: expected a bool, got {getattr(self, name)!r}", argument=name)
        if self.model_hidden % self.model_heads or self.model_heads % self.model_kv_heads:
            raise ParameterError(
                f"model_heads: expected a divisor of model_hidden={self.model_hidden} and a multiple of "
                f"model_kv_heads={self.model_kv_heads}, got {self.model_heads}",
                argument="model_heads",
            )
        batch = self.prompts_per_step * self.group_size
        if self.num_minibatches > batch:
            raise ParameterError(
                f"num_minibatches: expected at most the batch size prompts_per_step * group_size = {batch}, "
                f"got {self.num_minibatches}",
                argument="num_minibatches",
            )
        if self.resume and self.out is None:
            raise ParameterError("resume: expected an out directory to resume from, got out=None", argument="resume")
        # devices, a user's model and data, LoRA
        _integer("lora_rank", self.lora_rank, 0)
        _number("lora_alpha", self.lora_alpha, 0.0, math.inf, low_open=True)
        if self.fsdp and self.lora_rank:
            raise ParameterError(
                "fsdp: expected False with lora_rank > 0 (sharding a LoRA run is not wired: its reference is the "
                "base model with the adapter disabled, and its trained weights are small), got True",
                argument="fsdp",
            )
        for name in ("device", "lora_target_modules"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ParameterError(f"{name}: expected a non-empty string, got {getattr(self, name)!r}", argument=name)
        if not isinstance(self.chat_template, bool):
            raise ParameterError(
                f"chat_template: expected a bool, got {self.chat_template!r}", argument="chat_template"
            )
        if task.needs_model and self.model is None:
            raise ParameterError(
                f"model: expected a local model directory for the task {self.task!r} (its tokenizer "
                "encodes the prompts), got None",
                argument="model",
            )
        if self.model is not None and self.init_from is not None:
            raise ParameterError(
                f"init_from: expected None with model={self.model!r} (the policy is the model's), got "
                f"{self.init_from!r}",
                argument="init_from",
            )
        from .core.arms import ARMS  # torch-free; arms imports nothing from here (the modules stay one-way)

        if self.critic_warmup is not None:
            _integer("critic_warmup", self.critic_warmup, 0)
        if ARMS[self.arm].critic is None and self.critic_warmup:
            raise ParameterError(
                f"critic_warmup: expected 0 for the {self.arm} arm, which has no critic, got {self.critic_warmup}",
                argument="critic_warmup",
            )
        # a diagnosis: stored absolute, with its contents' hash
        self.gate_direction = checked_gate_direction(self.gate_direction)
        _ = self.applied_gate_direction  # the file's recommendation for this arm and task, or a ParameterError
        try:  # low <= high etc., named as this config's fields
            _ = self.gate_params
        except ParameterError as exc:
            field = f"gate_{exc.argument}"
            raise ParameterError(f"{field}: {str(exc).removeprefix(f'{exc.argument}: ')}", argument=field) from None

    # ---- derived values

    @property
    def gate_params(self) -> GateParams:
        """The concentration → gate mapping of the run (validated)."""
        return GateParams(
            low=self.gate_low,
            high=self.gate_high,
            sharpness=self.gate_sharpness,
            normalize=self.gate_normalize,
            min_spread=self.gate_min_spread,
            invert=self.applied_gate_direction == "inverted",
        )

    @property
    def applied_gate_direction(self) -> str:
        """The direction this run's gates use: ``gate_direction`` itself, or the recommendation
        of the diagnosis.json it names for this arm's gate source
        (:func:`recommended_direction`), a diagnosis of this run's task
        (:func:`~comppo_core.rl.gate_direction.check_diagnosis_task`); a
        :class:`~comppo_core.errors.ParameterError` naming ``gate_direction`` for an unreadable
        file, a diagnosis of another task, or ``"none"`` on an arm whose gates have a
        direction. The diagnosis's recommended gate range is not applied (``gate_low`` and
        ``gate_high`` are the run's: :mod:`~comppo_core.rl.gate_direction`)."""
        task = config_task_record(self)
        key = (self.gate_direction, self.arm, self.statistic, json.dumps(task, sort_keys=True, default=str))
        cached = self.__dict__.get("_applied_gate_direction")
        if cached is not None and cached[0] == key:
            return str(cached[1])
        check_diagnosis_task(self.gate_direction, task)
        direction = recommended_direction(self.gate_direction, self.arm, self.statistic)
        self.__dict__["_applied_gate_direction"] = (key, direction)
        return direction

    @property
    def critic_warmup_rounds(self) -> int:
        """``critic_warmup``, with None resolved: :data:`DEFAULT_CRITIC_WARMUP` rounds for an
        arm with a critic, 0 for one without."""
        if self.critic_warmup is not None:
            return self.critic_warmup
        from .core.arms import ARMS

        return DEFAULT_CRITIC_WARMUP if ARMS[self.arm].critic is not None else 0

    @property
    def batch_size(self) -> int:
        """Sequences per rollout batch, ``prompts_per_step * group_size``."""
        return self.prompts_per_step * self.group_size

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_preset(cls, name: str, **changes: Any) -> TrainConfig:
        """The settings of preset ``name`` (:data:`PRESETS`) with ``changes`` on top."""
        return cls(**{**PRESETS[check_choice("preset", name, PRESETS)], **changes})

    # ---- JSON

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The config as indented JSON (every field)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """From a dict of fields; missing fields take their defaults, unknown ones are an error."""
        if not isinstance(data, dict):
            raise ParameterError(
                f"config: expected a JSON object of fields, got {type(data).__name__}", argument="config"
            )
        data = upgrade_fields(data)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ParameterError(
                f"{unknown[0]}: expected a TrainConfig field, got an unknown one (known: {', '.join(sorted(names))})",
                argument=unknown[0],
            )
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        """Inverse of :meth:`to_json`."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ParameterError(
                f"config: expected JSON, got a parse error at line {exc.lineno}: {exc.msg}", argument="config"
            ) from None
        return cls.from_dict(data)

    # ---- command line

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one ``--field-name`` flag per field (defaults: the dataclass's; booleans get
        ``--flag/--no-flag``; optional fields accept ``none``; a dict field, its
        ``metadata["flag"]`` given once per ``KEY=VALUE``: :class:`KeyValueAction`)."""
        hints = field_types(cls)
        group = parser.add_argument_group("training (TrainConfig)")
        for f in dataclasses.fields(cls):
            flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
            tp, optional = _unwrap(hints[f.name])
            help_ = f.metadata["help"] + " (default: %(default)s)"
            if typing.get_origin(tp) is dict:
                group.add_argument(
                    flag, dest=f.name, action=KeyValueAction, default=field_default(f), metavar="KEY=VALUE", help=help_
                )
            elif tp is bool:
                group.add_argument(
                    flag, dest=f.name, action=argparse.BooleanOptionalAction, default=field_default(f), help=help_
                )
            else:
                group.add_argument(
                    flag,
                    dest=f.name,
                    type=_parser(tp, optional),
                    default=field_default(f),
                    metavar=tp.__name__.upper(),
                    help=help_,
                )
        return parser

    @classmethod
    def from_args(cls, namespace: argparse.Namespace) -> TrainConfig:
        """The config from a namespace parsed with :meth:`add_arguments` (other attributes are ignored)."""
        return cls(
            **{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)}
        )


#: Named settings (fields changed from the defaults) for ``TrainConfig.from_preset`` and the CLI's
#: ``--preset``. ``default`` is the defaults: sized so that ``comppo-core compare`` of the seven arms
#: of the time × 3 seeds fitted an hour on a 2-core CPU (before the critic warm-up and three more arms); ``quick`` is one arm, warm start included, in under 3 minutes
#: there. Both were chosen by the held-out accuracy gain averaged over the arms (docs/training.md).
#: ``demo`` is ``comppo-core demo``'s: a longer warm start on demonstrations half of which forget the
#: carries, so that the policy starts confident in the format but unsure at the pivotal carry tokens,
#: which the verifier's reward fixes within 40 steps (docs/training.md, "Presets").
#: ``pretrained`` is for a pretrained ``model`` (the command line applies it when ``--model`` is given
#: without ``--preset``): a 3× smaller actor step and one update a batch, since the toy's 3e-5 with
#: 2 epochs × 2 minibatches eroded SmolLM2-135M's accuracy in three steps, while 1e-5 × 1 × 1 (the KL
#: anchor kept) raised it on a validation split for both arms measured (docs/experiments/pretrained-defaults.md).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {"steps": 40},
    "demo": {"steps": 40, "warmup_sft_steps": 240, "sft_carry_noise": 0.5},
    "pretrained": {"actor_lr": 1e-5, "ppo_epochs": 1, "num_minibatches": 1},
}
#: The preset a command applies when ``--preset`` is not given, with ``--model`` and without it.
MODEL_PRESET, DEFAULT_PRESET = "pretrained", "default"


def field_types(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass's fields, without its ``InitVar`` fields (Python
    3.10's ``typing.get_type_hints`` refuses an ``InitVar`` written as a string annotation,
    as ``from __future__ import annotations`` writes every annotation)."""
    fields = {f.name: f.type for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return typing.get_type_hints(type(cls.__name__, (), {"__annotations__": fields, "__module__": cls.__module__}))


def field_default(f: dataclasses.Field[Any]) -> Any:
    """A field's default (a fresh one of a ``default_factory``)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def parse_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as ``(KEY, VALUE)``, VALUE read as JSON when it parses (``2``, ``true``,
    ``[1, 2]``, ``"x"``), else as the string it is; an ``argparse.ArgumentTypeError``
    without ``=`` or with an empty KEY."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


class _Given(dict[str, Any]):
    """The options given on the command line so far (a default is never one)."""


class KeyValueAction(argparse.Action):
    """A flag given once per ``KEY=VALUE`` (:func:`parse_option`), gathered into a dict (a
    later KEY replaces an earlier one); the first one given replaces the default."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: Any = None
    ) -> None:
        try:
            key, value = parse_option(str(values))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        given = getattr(namespace, self.dest, None)
        options = _Given(given) if isinstance(given, _Given) else _Given()
        options[key] = value
        setattr(namespace, self.dest, options)


def _task_options(options: Any, task: Any) -> dict[str, Any]:
    """``task_options`` checked (a dict of JSON values with string keys; only for a task that
    takes options, whose entry checks them) and copied through JSON."""
    if not isinstance(options, dict) or not all(isinstance(k, str) and k for k in options):
        raise ParameterError(
            f"task_option: expected a dict of settings with non-empty string keys, got {options!r}",
            argument="task_option",
        )
    try:
        copied: dict[str, Any] = json.loads(json.dumps(options, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ParameterError(
            f"task_option: expected settings of JSON values, got {options!r} ({exc})", argument="task_option"
        ) from None
    if copied and not task.takes_options:
        raise ParameterError(
            f"task_option: expected none for the task {task.name!r}, which takes no options (reasoning_gym:NAME "
            f"tasks do), got {', '.join(f'{k}={v!r}' for k, v in copied.items())}",
            argument="task_option",
        )
    if task.takes_options and task.check_options is not None:
        task.check_options(task.member, copied)
    return copied


def _unwrap(tp: Any) -> tuple[type, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner, True
    return tp, False


def _parser(tp: type, optional: bool) -> Any:
    def parse(text: str) -> Any:
        if optional and text.lower() in ("none", "null"):
            return None
        try:
            return tp(text)
        except ValueError:
            kind = {"int": "an integer", "float": "a number", "str": "a string"}.get(tp.__name__, tp.__name__)
            raise argparse.ArgumentTypeError(f"expected {kind}{' or none' if optional else ''}, got {text!r}") from None

    parse.__name__ = tp.__name__
    return parse


def _integer(name: str, value: Any, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ParameterError(f"{name}: expected an integer {rng}, got {value!r}", argument=name)


def _number(name: str, value: Any, low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and not math.isnan(float(value))
    if ok:
        v = float(value)
        ok = (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
        ok = ok and (math.isfinite(v) or high == math.inf and v != math.inf)
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open or high == math.inf else "]"
        raise ParameterError(f"{name}: expected a number in {lo}{low}, {high}{hi}, got {value!r}", argument=name)


TrainConfig.__doc__ = (
    (TrainConfig.__doc__ or "")
    + "\n    Fields:\n\n"
    + "\n".join(f"      {f.name} = {field_default(f)!r}: {f.metadata['help']}" for f in dataclasses.fields(TrainConfig))
)
