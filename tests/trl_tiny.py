"""A fixed rollout fed to ``CompPOTrainer`` through TRL's ``rollout_func``: the tests of
``comppo_core.integrations.trl`` and their multi-process worker (tests/trl_sharded_worker.py) share it.

``make_trainer(actor, tokenizer, rows, scores, out, **config)`` returns a CompPOTrainer
whose every generation is ``rows`` (``(prompt ids, completion ids)`` per row, the global
batch in order; each process gets its consecutive share) scored ``scores``.
"""

from __future__ import annotations

from typing import Any

import torch

from comppo_core.integrations.trl import CompPOConfig, CompPOTrainer

#: Settings that make one CompPOTrainer step one step of comppo_core.rl.Trainer (docs/trl.md).
EXACT: dict[str, Any] = {
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "optim": "adamw_torch",
    "weight_decay": 0.0,
    "num_iterations": 1,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": 1,
    "beta": 0.0,
    "dual_clip": None,
    "report_to": [],
    "save_strategy": "no",
    "logging_steps": 1,
    "use_cpu": True,
    "bf16": False,
    "disable_tqdm": True,
    "dataloader_num_workers": 0,
    "seed": 0,
    "critic_warmup": 0,
}


def synthetic_rows(n: int, vocab: int, seed: int = 0) -> tuple[list[tuple[list[int], list[int]]], list[float]]:
    """``n`` rows of random prompts (3–5 tokens) and completions (1–6 tokens, EOS=2 at the
    end of some) over ids ``3 … vocab−1``, and random 0/1 scores."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        p = int(torch.randint(3, 6, (1,), generator=g))
        c = int(torch.randint(1, 7, (1,), generator=g))
        prompt = torch.randint(3, vocab, (p,), generator=g).tolist()
        completion = torch.randint(3, vocab, (c,), generator=g).tolist()
        if bool(torch.rand(1, generator=g) < 0.5):
            completion[-1] = 2
        rows.append(([1, *prompt], completion))
    scores = (torch.rand(n, generator=g) < 0.5).float().tolist()
    return rows, scores


def make_trainer(
    actor: Any,
    tokenizer: Any,
    rows: list[tuple[list[int], list[int]]],
    scores: list[float],
    out: str,
    *,
    peft_config: Any = None,
    value_model: Any = None,
    **config: Any,
) -> CompPOTrainer:
    from datasets import Dataset

    settings = {**EXACT, **config}
    args = CompPOConfig(output_dir=out, **settings)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        n = len(prompts)
        lo = trainer.accelerator.process_index * n
        # the step's rows: the generation counter picks the same fixed batch every time
        mine = rows[lo : lo + n]
        return {
            "prompt_ids": [p for p, _ in mine],
            "completion_ids": [c for _, c in mine],
            "logprobs": None,
            "fixed_score": scores[lo : lo + n],
        }

    def reward(completions: list[Any], fixed_score: list[float], **kwargs: Any) -> list[float]:
        return list(fixed_score)

    dataset = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(64)]})
    return CompPOTrainer(
        model=actor,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout_func,
        peft_config=peft_config,
        **({} if value_model is None else {"value_model": value_model}),
    )


def tiny_llama(vocab: int, seed: int = 0) -> Any:
    """A 2-layer width-32 Llama with random weights (nothing downloaded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg)
