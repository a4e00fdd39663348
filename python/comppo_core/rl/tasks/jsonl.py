"""A user's task: a JSONL file of ``{"prompt": ..., "answer": ...}`` rows and a verifier.

**File.** One JSON object per line with a string ``"prompt"`` and an ``"answer"`` (a
string or a number; other keys are ignored); blank lines are skipped. A line that is
not JSON, not an object, or lacks a key is a :class:`~comppo_core.errors.ParameterError`
naming the file and the line (1-based), with ``argument="task"`` and ``row`` the line.

**Split.** A row is held out when ``blake2b(f"{split_seed}:{prompt}")`` falls in the first
``heldout_fraction`` of its range (a fixed function of the prompt, so duplicates of a
prompt land on the same side); both sides must be non-empty. Training prompts are drawn
uniformly with replacement (:meth:`JsonlTask.sample`); the evaluation set is the held-out
rows in a fixed order (:meth:`JsonlTask.heldout`). With ``validation_fraction`` ``v > 0``
the rows whose hash falls in ``[heldout_fraction, heldout_fraction + v)`` of the range are
a **validation** split (:meth:`JsonlTask.validation`), disjoint from the held-out rows and
never sampled for training; ``v = 0`` (the default) has none and leaves the training rows
exactly as without it.

**Verifier** (:func:`verify`): 0 unless the response stopped at EOS; then 1 when the
response's final answer is the row's answer by :func:`comppo_core.rl.tasks.answers.is_correct`
(``method="auto"``): math-verify when it is installed (the ``[rl]`` extra installs it),
else the hand rule — the text after the last ``"####"`` or ``"answer:"``, else the last
number, else the whole response (:func:`extract_answer`), compared as exact numbers
(``"72" == "72.0" == "$72" == "144/2"``) or as normalised text (:func:`answers_match`).
A row's answer written ``"... #### 72"`` reads as ``72``. ``docs/answers.md`` tables where
the two comparisons agree and differ. :func:`normalize`, :func:`parse_number`,
:func:`extract_answer` and :func:`answers_match` are the hand rule's steps, re-exported
from :mod:`~comppo_core.rl.tasks.answers`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ParameterError
from .answers import answer_check, answers_match, extract_answer, is_correct, normalize, parse_number
from .base import HashSplit, Problem, rewards_of

__all__ = ["JsonlTask", "answers_match", "extract_answer", "normalize", "parse_number", "verify"]

#: Response budget when the config gives none (a JSONL file states no response length).
DEFAULT_MAX_NEW_TOKENS = 256


def verify(response: str, answer: str, finished: bool) -> float:
    """1.0 when the response stopped at EOS and its final answer is ``answer``
    (:func:`~comppo_core.rl.tasks.answers.is_correct`), else 0.0."""
    if not finished:
        return 0.0
    return 1.0 if is_correct(response, answer) else 0.0


class JsonlTask:
    """The rows of a JSONL file (module docstring) as a task of the trainer.

    Args:
      path: the ``.jsonl`` file.
      split_seed, heldout_fraction: the held-out split.
      max_new_tokens: the response budget (:data:`DEFAULT_MAX_NEW_TOKENS` when None).
      validation_fraction: share of the hash range in the validation split (0: none).
    """

    name = "jsonl"

    def __init__(
        self,
        path: str | Path,
        *,
        split_seed: int = 0,
        heldout_fraction: float = 0.2,
        max_new_tokens: int | None = None,
        validation_fraction: float = 0.0,
    ) -> None:
        self.path = Path(path)
        #: the train / validation / held-out split of the rows (key: the prompt)
        self.split = HashSplit(split_seed, heldout_fraction, validation_fraction)
        self.split_seed = self.split.split_seed
        self.heldout_fraction = self.split.heldout_fraction
        self.validation_fraction = self.split.validation_fraction
        self.max_new_tokens = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
        #: a user's model brings the tokenizer (``config.model``)
        self.tokenizer = None
        self.rows = read_rows(self.path)
        sides = self.split.split_file_rows(self.rows, str(self.path))
        self.train_rows, self.heldout_rows, self.validation_rows = sides["train"], sides["heldout"], sides["validation"]

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` training rows drawn uniformly with replacement with ``rng``."""
        return [self.train_rows[int(i)] for i in rng.integers(0, len(self.train_rows), size=n)]

    def heldout(self, n: int) -> list[Problem]:
        """The first ``n`` held-out rows of the fixed order (all of them if fewer)."""
        return self.heldout_rows[:n]

    def validation(self, n: int, seed: int = 0) -> list[Problem]:
        """The first ``n`` validation rows in a fixed order (a function of ``split_seed`` and
        ``seed``; all of them if fewer): disjoint from :meth:`heldout` and never drawn by
        :meth:`sample`. A :class:`~comppo_core.errors.ParameterError` naming
        ``validation_fraction`` when the task has no validation split."""
        self.split.require_validation()
        order = self.split.rng(seed, 8).permutation(len(self.validation_rows))
        return [self.validation_rows[i] for i in order[:n]]

    def reward(self, problem: Problem, response: str, finished: bool) -> float:
        """:func:`verify` against the row's answer."""
        return verify(response, problem.answer, finished)

    def rewards(self, problems: Sequence[Problem], responses: Sequence[str], finished: Sequence[bool]) -> list[float]:
        """:meth:`reward` of each response."""
        return rewards_of(self.reward, problems, responses, finished)

    def describe(self) -> str:
        """The file's name."""
        return self.path.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "rows": len(self.rows),
            "split_seed": self.split_seed,
            "heldout_fraction": self.heldout_fraction,
            **({"validation_fraction": self.validation_fraction} if self.validation_fraction else {}),
            # the rewards depend on it: math-verify's verdicts and the hand rule's differ (docs/answers.md)
            "answer_check": answer_check(),
        }


def read_rows(path: Path) -> list[Problem]:
    """The file's rows as problems (``solution`` empty); clear errors naming the line."""
    where = str(path)
    if not path.is_file():
        raise ParameterError(f"task: expected a JSONL file, got {where!r}, which is not a file", argument="task")
    out: list[Problem] = []
    with open(path, encoding="utf-8") as fh:
        for k, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:  # without the newline, an error at the end of the line is at its last column, not line 2
                row = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                raise ParameterError(
                    f"task: {where!r} line {k}: expected a JSON object, got a parse error at column {exc.colno}: {exc.msg}",
                    argument="task",
                    row=k,
                ) from None
            if not isinstance(row, dict):
                raise ParameterError(
                    f"task: {where!r} line {k}: expected a JSON object with prompt and answer, got {type(row).__name__}",
                    argument="task",
                    row=k,
                )
            missing = [key for key in ("prompt", "answer") if key not in row]
            if missing:
                raise ParameterError(
                    f"task: {where!r} line {k}: expected the keys prompt and answer, missing {missing[0]!r}",
                    argument="task",
                    row=k,
                )
            prompt, answer = row["prompt"], row["answer"]
            if not isinstance(prompt, str) or not prompt:
                raise ParameterError(
                    f"task: {where!r} line {k}: expected prompt to be a non-empty string, got {prompt!r}",
                    argument="task",
                    row=k,
                )
            if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
                raise ParameterError(
                    f"task: {where!r} line {k}: expected answer to be a string or a number, got {answer!r}",
                    argument="task",
                    row=k,
                )
            out.append(Problem(prompt, str(answer), ""))
    if not out:
        raise ParameterError(f"task: {where!r}: expected at least one row, got an empty file", argument="task")
    return out
