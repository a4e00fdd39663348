"""Monte-Carlo pivotality of response tokens: how much a token moves the policy's chance of success.

For a response ``r_0 … r_{L−1}`` to a prompt ``x`` (``r_{L−1}`` the EOS when it stopped
there), the value of the prefix that holds the first ``s`` response tokens is the policy's
expected reward from there on, estimated VinePPO-style from ``K`` continuations sampled from
the policy itself::

    V_s   = E_{y ~ π(· | x, r_<s)} [ R(x, r_<s · y) ]  ≈  (1/K) Σ_k R(x, r_<s · y_k),   s = 0 … L−1
    V_L   = R(x, r)                                       (the response's own reward: nothing to sample)
    piv_t = | V_{t+1} − V_t |                             t = 0 … L−1 (token t moves the value by that much)

``R`` is the task's verifier (1 right, 0 wrong for every built-in task, so ``V`` is a
success probability); a continuation ``y`` gets the response budget that the prefix leaves
(``max_new_tokens − s`` tokens) and stops at EOS. The standard error of ``V̂_s`` is
``sqrt(V̂_s(1 − V̂_s)/K)`` for a 0/1 reward (:func:`values_from_rewards`), so ``piv_t``'s is
at most ``sqrt(2 · 0.25/K)`` (0.18 at K = 16): a pivotality below that is within the noise.

**Sharing.** ``V_{t+1}`` is the value *after* token ``t`` and *before* token ``t+1``, so the
boundaries to estimate for the chosen tokens ``T`` are ``B = (T ∪ (T + 1)) \\ {L}``
(:func:`needed_boundaries`): one batch of ``K`` continuations per boundary serves both
tokens beside it, and contiguous tokens cost one boundary each instead of two.

**Which tokens** (:func:`choose_positions`): all of them, or ``n`` per response, spread
evenly (``"even"``: ``round(linspace(0, L−1, n))``), drawn at random without replacement
(``"random"``), or a contiguous window at a random start (``"window"``, the cheapest per token:
``n + 1`` boundaries for ``n`` tokens); the random choices come from the caller's seeded generator.

**Batching and keys.** :func:`continuation_jobs` lists the ``(response, boundary, sample)``
rows, longest expected continuation first (``L − s``), so a batch's rows end together;
:class:`PolicyContinuations` generates a batch of them with the package's keyed inverse-CDF
sampler (:mod:`comppo_core.rl.engine.sampling`), each row's draws keyed by
``SeedSequence([seed, 0x9D, response, boundary, sample])``: the same continuations whatever
the batch size or order. Importing this module imports no torch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ParameterError
from ..rl.tasks.base import Problem, Task

__all__ = [
    "POSITION_CHOICES",
    "Continuation",
    "ContinuationRewards",
    "PolicyContinuations",
    "Response",
    "choose_positions",
    "continuation_jobs",
    "needed_boundaries",
    "pivotality_of",
    "values_from_rewards",
]

#: How ``n`` positions per response are chosen (module docstring).
POSITION_CHOICES = ("even", "random", "window")
#: The word of the continuation keys that sets them apart from the rollout's.
_KEY_STREAM = 0x9D


@dataclasses.dataclass(frozen=True)
class Response:
    """One sampled response: its problem, the prompt's token ids, the response's (EOS
    included when it stopped there), whether it stopped at EOS, and its reward."""

    problem: Problem
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    finished: bool
    reward: float

    @property
    def length(self) -> int:
        """``L``: the response's tokens, EOS included."""
        return len(self.response_ids)


@dataclasses.dataclass(frozen=True)
class Continuation:
    """One Monte-Carlo row: sample ``sample`` from the prefix with ``boundary`` tokens of response ``response``."""

    response: int
    boundary: int
    sample: int


#: ``rewards(responses, jobs) -> (one reward per job, tokens generated)``.
ContinuationRewards = Callable[[Sequence[Response], Sequence[Continuation]], tuple[list[float], int]]


def choose_positions(length: int, positions: int | None, how: str, rng: np.random.Generator) -> np.ndarray:
    """The response tokens (``0 … length−1``) whose pivotality is estimated, ascending (module
    docstring): all with ``positions`` None or ``>= length``; else ``positions`` of them."""
    if how not in POSITION_CHOICES:
        raise ParameterError(
            f"position_choice: expected one of {', '.join(POSITION_CHOICES)}, got {how!r}", argument="position_choice"
        )
    if positions is not None and (isinstance(positions, bool) or not isinstance(positions, int) or positions < 1):
        raise ParameterError(
            f"positions: expected an integer >= 1 or None (all), got {positions!r}", argument="positions"
        )
    if length < 1:
        return np.zeros(0, dtype=np.int64)
    if positions is None or positions >= length:
        return np.arange(length, dtype=np.int64)
    if how == "even":
        return np.unique(np.round(np.linspace(0, length - 1, positions)).astype(np.int64))
    if how == "random":
        return np.sort(rng.choice(length, size=positions, replace=False)).astype(np.int64)
    start = int(rng.integers(0, length - positions + 1))
    return np.arange(start, start + positions, dtype=np.int64)


def needed_boundaries(chosen: np.ndarray, length: int) -> np.ndarray:
    """``(chosen ∪ (chosen + 1)) \\ {length}``, ascending: the prefixes to estimate (module docstring)."""
    c = np.asarray(chosen, dtype=np.int64)
    both = np.union1d(c, c + 1)
    return both[both < length]


def continuation_jobs(responses: Sequence[Response], chosen: Sequence[np.ndarray], samples: int) -> list[Continuation]:
    """Every ``(response, boundary, sample)`` row, the longest expected continuation
    (``L − boundary``) first, then by response, boundary and sample."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ParameterError(
            f"samples_per_prefix: expected an integer >= 1, got {samples!r}", argument="samples_per_prefix"
        )
    jobs = [
        Continuation(i, int(s), k)
        for i, (r, c) in enumerate(zip(responses, chosen))
        for s in needed_boundaries(c, r.length)
        for k in range(samples)
    ]
    jobs.sort(key=lambda j: (-(responses[j.response].length - j.boundary), j.response, j.boundary, j.sample))
    return jobs


def values_from_rewards(
    responses: Sequence[Response], jobs: Sequence[Continuation], rewards: Sequence[float]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(values, standard_errors)``: per response ``[L + 1]`` float64, ``V̂_s`` the mean reward of
    the boundary's continuations and its standard error ``sqrt(var/K)`` (population variance
    of the rewards: ``V̂(1 − V̂)`` for 0/1 rewards), NaN at boundaries not estimated;
    ``V_L`` is the response's reward, with standard error 0."""
    if len(jobs) != len(rewards):
        raise ParameterError(f"rewards: expected one per job ({len(jobs)}), got {len(rewards)}", argument="rewards")
    sums = [np.zeros(r.length + 1) for r in responses]
    squares = [np.zeros(r.length + 1) for r in responses]
    counts = [np.zeros(r.length + 1) for r in responses]
    for job, reward in zip(jobs, rewards):
        sums[job.response][job.boundary] += reward
        squares[job.response][job.boundary] += reward * reward
        counts[job.response][job.boundary] += 1
    values, errors = [], []
    for r, s, q, n in zip(responses, sums, squares, counts):
        with np.errstate(invalid="ignore", divide="ignore"):
            v = np.where(n > 0, s / n, np.nan)
            var = np.where(n > 0, np.maximum(q / n - v * v, 0.0), np.nan)
            se = np.sqrt(var / n)
        v[r.length] = r.reward
        se[r.length] = 0.0
        values.append(v)
        errors.append(se)
    return values, errors


def pivotality_of(values: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """``|V_{t+1} − V_t|`` for each chosen token ``t`` (both boundaries must be estimated)."""
    c = np.asarray(chosen, dtype=np.int64)
    out = np.abs(values[c + 1] - values[c])
    missing = np.flatnonzero(~np.isfinite(out))
    if missing.size:
        t = int(c[missing[0]])
        raise ParameterError(
            f"values: expected the values before and after token {t}, got a boundary not estimated", argument="values"
        )
    return out


def _keys(seed: int, jobs: Sequence[Continuation]) -> Any:
    import torch

    out = np.empty((len(jobs), 2), dtype=np.int64)
    for i, j in enumerate(jobs):
        out[i] = np.random.SeedSequence([seed, _KEY_STREAM, j.response, j.boundary, j.sample]).generate_state(
            2, np.uint32
        )
    return torch.from_numpy(out)


class PolicyContinuations:
    """Sample continuations from a Hugging Face causal LM and reward them with the task's verifier.

    Calling it with the responses and a batch of :class:`Continuation` rows generates each
    row from ``prompt_ids + response_ids[:boundary]`` (left-padded to the batch's widest
    prefix) for at most ``max_new_tokens − boundary`` tokens, at ``temperature`` and ``top_p``
    with the row's keys (module docstring), decodes the response prefix and the continuation
    up to its first EOS and returns ``(task rewards, tokens generated)``.
    """

    def __init__(
        self,
        actor: Any,
        tokenizer: Any,
        task: Task,
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        seed: int,
        device: Any,
    ) -> None:
        self.actor = actor
        self.tokenizer = tokenizer
        self.task = task
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.device = device
        self.last_steps: int | None = None

    def __call__(self, responses: Sequence[Response], jobs: Sequence[Continuation]) -> tuple[list[float], int]:
        import torch
        from transformers import GenerationConfig
        from transformers.utils import logging as hf_logging

        from ..rl.engine.rollout import left_pad
        from ..rl.engine.sampling import sampling_processors

        if not jobs:
            return [], 0
        tok = self.tokenizer
        rows = [
            list(responses[j.response].prompt_ids) + list(responses[j.response].response_ids[: j.boundary])
            for j in jobs
        ]
        budgets = [self.max_new_tokens - j.boundary for j in jobs]
        ids, mask = left_pad(rows, tok.pad_token_id)
        width = ids.shape[1]
        ids, mask = ids.to(self.device), mask.to(self.device)
        processors = sampling_processors(self.temperature, self.top_p, _keys(self.seed, jobs).to(self.device), width)
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max(budgets),
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
        )
        self.actor.eval()
        # a batch's padded width plus its longest budget may pass the model's
        # max_position_embeddings, which transformers warns of; each row's positions come
        # from its attention mask (cumsum − 1), so no real token's position passes its own
        # prompt + budget, and the warning is silenced for this call
        logger = hf_logging.get_logger("transformers.generation.stopping_criteria")
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            with torch.no_grad():
                out = self.actor.generate(
                    input_ids=ids, attention_mask=mask.long(), generation_config=config, logits_processor=processors
                )
        finally:
            logger.setLevel(level)
        new = out[:, width:].tolist()
        #: the decoding steps the last call took (its longest row; diagnose's time estimate reads it)
        self.last_steps = out.shape[1] - width
        problems, texts, finished = [], [], []
        generated = 0
        for j, budget, cont in zip(jobs, budgets, new):
            cont = cont[:budget]
            stop = cont.index(tok.eos_token_id) if tok.eos_token_id in cont else None
            generated += len(cont) if stop is None else stop + 1
            body = cont if stop is None else cont[:stop]
            r = responses[j.response]
            problems.append(r.problem)
            texts.append(tok.decode(list(r.response_ids[: j.boundary]) + body))
            finished.append(stop is not None)
        rewards = [float(x) for x in self.task.rewards(problems, texts, finished)]
        return rewards, generated
