"""CompPO with TRL: ``CompPOTrainer`` used exactly as a ``GRPOTrainer`` (docs/trl.md).

A tiny randomly initialised Llama learns to answer additions (nothing is downloaded: the
model is built from a config and the tokenizer is the package's character tokenizer).
For a real model, pass its name or directory as ``model=`` and its tokenizer as
``processing_class=``; for several GPUs, ``accelerate launch --config_file
examples/accelerate/ddp.yaml examples/trl_comppo.py``.

    pip install "comppo-core[trl]"
    python examples/trl_comppo.py
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# transformers 5 renames (gradient_checkpointing → activation_checkpointing) that TRL 1.16 still uses
warnings.filterwarnings("ignore", category=FutureWarning)

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import comppo_core as cc  # noqa: E402
from comppo_core.integrations.trl import CompPOConfig, CompPOTrainer  # noqa: E402
from comppo_core.rl.tasks.addition import CharTokenizer  # noqa: E402

# ---- data: an HF dataset with a "prompt" column (and any columns the reward reads)
pairs = [(a, b) for a in range(10) for b in range(10)]
dataset = Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]})


def correct(completions: list[str], answer: list[str], **kwargs: object) -> list[float]:
    """1 for the right sum, 0.5 for another number, else 0 (TRL passes dataset columns by name)."""
    return [
        1.0 if re.match(rf"{a}(?!\d)", c) else 0.5 if re.match(r"\d", c) else 0.0 for c, a in zip(completions, answer)
    ]


# ---- model and tokenizer: built locally
tokenizer = CharTokenizer().to_hf()
torch.manual_seed(0)
model = LlamaForCausalLM(
    LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
)

gpu = torch.cuda.is_available()
with tempfile.TemporaryDirectory() as out:
    args = CompPOConfig(
        output_dir=out,
        arm="comppo",  # or any TAC arm (tac_fixed, comppo_shuffle, ...), or "grpo" for plain GRPO
        # CompPO's settings
        gamma=1.0,
        lam=0.95,
        lam_critic=1.0,
        gate_params=cc.GateParams(low=0.9, high=1.0),
        tac_width=16,
        critic_lr=1e-3,
        value_clip=0.5,
        vf_coef=0.5,
        loss_agg="token-mean",
        # TRL's: 4 prompts × 4 completions per step, two PPO epochs (num_iterations)
        per_device_train_batch_size=16,
        num_generations=4,
        num_iterations=2,
        max_completion_length=4,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        beta=0.0,
        max_steps=4,
        logging_steps=2,
        report_to=[],  # "tensorboard" or "wandb": the comppo/* metrics go there
        save_strategy="no",
        use_cpu=not gpu,
        bf16=gpu and torch.cuda.is_bf16_supported(),
        disable_tqdm=True,
    )
    trainer = CompPOTrainer(
        model=model, reward_funcs=correct, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.train()
    logged = [row for row in trainer.state.log_history if "comppo/value_loss" in row]
    for row in logged:
        print(
            f"step {row['step']}: reward {row['reward']:.3f}, value loss {row['comppo/value_loss']:.4f}, "
            f"gate mean {row['comppo/gate_mean']:.3f}, critic explained variance {row.get('comppo/value_explained_var')}"
        )
    print("CompPOTrainer trained: critic parameters", sum(p.numel() for p in trainer.critic.parameters()))
