"""The oracle gate source: which response columns a task marks pivotal.

A diagnostic, not a method: the ``comppo_oracle`` arm's Comp-GAE gates are ``high`` on
the tokens that decide the reward and ``low`` elsewhere
(:func:`comppo_core.rl.core.step.oracle_gates`), read from the task's own knowledge, which no
policy has. A task offers it with a method ``pivotal(problem, response) -> list[bool]``:
one flag per character of the response text (the decoded response before EOS). A token
is pivotal when any of its characters is; special tokens (EOS) never are. A token's
characters are those the response's decoded text gains with it (the decoding of the tokens
up to it against the decoding of those before it), so a tokenizer whose lone token decodes
otherwise (SentencePiece's leading space, a character split over byte tokens) is read right.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ...errors import ParameterError

__all__ = ["check_task", "pivotal_columns"]


def check_task(task: Any, arm: str) -> None:
    """A :class:`~comppo_core.errors.ParameterError` naming ``arm`` unless ``task`` marks pivotal tokens."""
    if not callable(getattr(task, "pivotal", None)):
        name = getattr(task, "name", type(task).__name__)
        raise ParameterError(
            f"arm: the {arm} arm needs a task that marks its pivotal tokens (a pivotal(problem, response) "
            f"method); the task {name!r} has none",
            argument="arm",
        )


def pivotal_columns(task: Any, tokenizer: Any, rollout: Any) -> torch.Tensor:
    """``[B, T−1]`` bool: the response columns whose token the task marks pivotal.

    Row b's response columns hold the tokens ``input_ids[b, j+1]``. With ``text_k`` the
    decoding (special tokens skipped) of the row's first k response tokens, token k owns the
    characters ``text_{k+1}[p:]``, ``p`` the length of the common prefix of ``text_k`` and
    ``text_{k+1}`` (empty for a special token); ``text_n`` must be the decoded response. A
    task's flags that do not cover the response text exactly are an error naming the row."""
    m = rollout.response_mask.to(torch.bool)
    out = torch.zeros_like(m)
    for b, (problem, response) in enumerate(zip(rollout.problems, rollout.responses)):
        columns = torch.nonzero(m[b]).flatten().tolist()
        flags = list(task.pivotal(problem, response))
        if len(flags) != len(response):
            raise ParameterError(
                f"pivotal: expected one flag per character of the response ({len(response)}), got {len(flags)} "
                f"at row {b}",
                argument="pivotal",
                row=b,
            )
        tokens: list[int] = []
        before = ""
        for j in columns:
            tokens.append(int(rollout.input_ids[b, j + 1]))
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            start = len(os.path.commonprefix([before, text]))
            out[b, j] = any(flags[start : len(text)])
            before = text
        if before != response:
            at = len(os.path.commonprefix([before, response]))
            raise ParameterError(
                f"pivotal: the response tokens of row {b} do not spell its decoded response at character {at}",
                argument="pivotal",
                row=b,
            )
    return out
