"""Phase 1 of a step: sample responses to prompts with ``model.generate`` and reward them
with the task's verifier.

Layout (the one the step reads, docs/design.md §10): prompts left-padded to a common
width ``P``, responses right-padded after their first EOS; ``input_ids`` ``[B, T]``,
``attention_mask`` ``[B, T]`` (the real tokens: prompt and each response up to and
including its first EOS), ``response_mask`` ``[B, T−1]`` in the column convention
(column j scores token j+1, so the response columns are ``P−1 … P+L−2`` for a response
of L tokens). Sampling draws each row's tokens with the inverse-CDF sampler of
:mod:`comppo_core.rl.engine.sampling` (uniforms keyed by ``(seed, step, prompt, sample)``);
greedy decoding otherwise. A model's saved ``generation_config`` never shapes the draws.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from ...errors import ParameterError
from ..tasks.base import Problem, Task
from .sampling import sampling_processors

__all__ = ["Generated", "Rollout", "decode", "generate", "left_pad", "pad_right", "prompt_width", "rewarded"]

#: ``generate``'s output: ``(ids [B, T], attention_mask [B, T], prompt width P, in_response [B, T−P])``.
Generated = tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]


@dataclasses.dataclass
class Rollout:
    """Sampled responses and their rewards.

    Attributes:
      input_ids: ``[B, T]`` left-padded prompt then response (right-padded after EOS).
      attention_mask: ``[B, T]`` bool, the real tokens.
      response_mask: ``[B, T−1]`` bool, the response columns (each token up to the first EOS).
      groups: ``[B]`` int64, the prompt each sample answers.
      rewards: ``[B]`` float32, the verifier's reward of each response (the outcome the
        advantages are computed from).
      finished: ``[B]`` bool, whether the response stopped at EOS.
      problems, responses: the problems and the decoded responses (text before EOS).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    groups: torch.Tensor
    rewards: torch.Tensor
    finished: torch.Tensor
    problems: list[Problem]
    responses: list[str]


def left_pad(rows: Sequence[Sequence[int]], pad: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, width]`` ids and mask, each row right-aligned (``width``: default the longest row)."""
    width = max(len(r) for r in rows) if width is None else width
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = True
    return ids, mask


def prompt_width(tokenizer: Any, problems: Sequence[Problem]) -> int:
    """The widest encoded prompt of ``problems``, in tokens."""
    return max(len(tokenizer.encode_prompt(p.prompt)) for p in problems)


def _generation_config(tokenizer: Any, max_new_tokens: int) -> Any:
    """Greedy decoding; sampling is the inverse-CDF sampler of :mod:`comppo_core.rl.engine.sampling`."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


@torch.no_grad()
def generate(
    actor: Any,
    tokenizer: Any,
    problems: Sequence[Problem],
    *,
    max_new_tokens: int,
    device: torch.device,
    sample: bool,
    temperature: float = 1.0,
    top_p: float = 1.0,
    keys: torch.Tensor | None = None,
    width: int | None = None,
    synced: bool = False,
) -> Generated:
    """Prompts left-padded to ``width`` (default: the widest) →
    ``(ids, attention_mask, width, in_response)``; the response is each token up to and
    including the first EOS (``in_response`` ``[B, R]``). ``sample`` draws at
    ``temperature`` and ``top_p`` with the rows' ``keys``
    (:func:`~comppo_core.rl.engine.sampling.row_keys`), else greedy. ``synced``: every
    process keeps stepping until all are done (``synced_gpus``; FSDP2's all-gathers sit in
    each forward, so a process that stopped early would leave the others waiting)."""
    prompt_ids, prompt_mask = left_pad(
        [tokenizer.encode_prompt(p.prompt) for p in problems], tokenizer.pad_token_id, width
    )
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    width = prompt_ids.shape[1]
    processors = None
    if sample:
        if keys is None:
            raise ParameterError("keys: expected row keys to sample with, got None", argument="keys")
        processors = sampling_processors(temperature, top_p, keys.to(device), width)
    actor.eval()
    ids = actor.generate(
        input_ids=prompt_ids,
        attention_mask=prompt_mask.long(),
        generation_config=_generation_config(tokenizer, max_new_tokens),
        logits_processor=processors,
        **({"synced_gpus": True} if synced else {}),
    )
    is_eos = ids[:, width:] == tokenizer.eos_token_id
    in_response = (is_eos.long().cumsum(-1) - is_eos.long()) == 0
    return ids, torch.cat([prompt_mask, in_response], dim=1), width, in_response


def pad_right(generated: Generated, total: int, pad: int) -> Generated:
    """:func:`generate`'s output right-padded to ``total`` tokens (padding, not response)."""
    ids, mask, width, in_response = generated
    extra = total - ids.shape[1]
    if extra <= 0:
        return generated
    ids = torch.cat([ids, ids.new_full((ids.shape[0], extra), pad)], dim=1)
    mask = torch.cat([mask, mask.new_zeros((mask.shape[0], extra))], dim=1)
    in_response = torch.cat([in_response, in_response.new_zeros((in_response.shape[0], extra))], dim=1)
    return ids, mask, width, in_response


def decode(tokenizer: Any, ids: torch.Tensor, width: int, in_response: torch.Tensor) -> tuple[list[str], torch.Tensor]:
    """``(texts, finished)``: each response's text before EOS and whether it stopped at EOS."""
    eos = tokenizer.eos_token_id
    finished = ((ids[:, width:] == eos) & in_response).any(-1)
    texts = [tokenizer.decode(row[m].tolist()) for row, m in zip(ids[:, width:], in_response)]
    return texts, finished


def rewarded(
    task: Task, tokenizer: Any, problems: list[Problem], generated: Generated, groups: torch.Tensor
) -> Rollout:
    """The :class:`Rollout` of :func:`generate`'s output: decoded, its response columns, the verifier's rewards."""
    ids, mask, width, in_response = generated
    texts, finished = decode(tokenizer, ids, width, in_response)
    response_mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool, device=ids.device)
    response_mask[:, width - 1 :] = in_response
    rewards = torch.tensor(task.rewards(problems, texts, finished.tolist()), dtype=torch.float32, device=ids.device)
    return Rollout(ids, mask, response_mask, groups, rewards, finished, problems, texts)
