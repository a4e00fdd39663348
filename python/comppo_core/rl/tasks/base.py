"""What the trainer needs from a task, and the one split every task's problems come from.

**The protocol.** :class:`Task` is everything the engine reads of a task (the trainer, the
SFT warm start, the evaluation, ``comppo-core evaluate``):

==========================  ===========================================================
``name``                    the registry's name (:mod:`comppo_core.rl.tasks`), in ``to_dict``
``tokenizer``               its :class:`Tokenizer`, or None for a task that takes the
                            user model's (``config.model``)
``max_new_tokens``          the response budget when the config gives none
``sample(rng, n)``          ``n`` **train** problems drawn with ``rng`` (with replacement)
``validation(n)``           a fixed list of ``n`` distinct **validation** problems (an
                            error naming ``validation_fraction`` when there is none)
``heldout(n)``              a fixed list of ``n`` distinct **held-out** problems (fewer
                            when the split has fewer)
``reward(p, text, fin)``    the verifier: the reward of a response (its text before EOS,
                            whether it stopped at EOS), 1.0 right, 0.0 wrong
``rewards(ps, texts, fin)`` the same for a batch
``describe()``              a few words for a report (``"2-digit addition"``)
``to_dict()``               the task and its settings as JSON (``task.json``)
==========================  ===========================================================

A task's :attr:`Problem.solution` is a correct response (its SFT demonstration; a task
may instead offer ``demonstration(problem, rng)``, fresh each use). A task that knows
which response tokens decide the reward is a :class:`PivotalTask`: ``pivotal(problem,
response)`` gives one flag per character of the response text (the ``comppo_oracle``
arm's gates, :mod:`comppo_core.rl.core.oracle`).

**The split.** :class:`HashSplit` places every problem by a key of its own (addition's
``"a:b"``, the chain task's ``"x:q"``, a JSONL row's prompt): the problem falls at
``u = blake2b(f"{split_seed}:{key}", 8 bytes, little-endian) / 2⁶⁴`` and is

* **heldout** when ``u < heldout_fraction``;
* **validation** when ``heldout_fraction ≤ u < heldout_fraction + validation_fraction``
  (none with ``validation_fraction = 0``);
* **train** otherwise.

So the three splits are disjoint and a fixed function of ``split_seed``, whatever is
sampled. The fixed lists of a split too large to hold are drawn or listed by
:func:`distinct_problems`, each from its own generator (:meth:`HashSplit.rng`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

import numpy as np

from ...errors import ParameterError

__all__ = [
    "ENUMERABLE",
    "SPLITS",
    "SPLIT_WORDS",
    "HashSplit",
    "PivotalTask",
    "Problem",
    "Side",
    "Task",
    "TaskSettings",
    "Tokenizer",
    "distinct_problems",
]

#: The name of a split.
Side = Literal["train", "validation", "heldout"]
#: The three splits: a task trains on ``train``, tunes on ``validation``, reports ``heldout``.
SPLITS: tuple[Side, ...] = ("train", "validation", "heldout")
#: How a message names each split.
SPLIT_WORDS: dict[Side, str] = {"train": "training", "validation": "validation", "heldout": "held-out"}

#: A problem's key in its task's space (addition's ``(a, b)``, the chain task's ``(x, q)``).
K = TypeVar("K")

#: The largest problem space :func:`distinct_problems` lists a side of (addition's 3
#: digits: 10⁶ pairs).
ENUMERABLE = 10**6


class Problem(NamedTuple):
    """One problem: its prompt text, the exact answer and a worked response for SFT."""

    prompt: str
    answer: str
    solution: str


class Tokenizer(Protocol):
    """What the engine reads of a tokenizer: the built-in
    :class:`~comppo_core.rl.tasks.addition.CharTokenizer` and a user model's
    :class:`~comppo_core.rl.models.pretrained.HFTokenizer` both are one."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def pad_token_id(self) -> int: ...
    @property
    def bos_token_id(self) -> int | None: ...
    @property
    def eos_token_id(self) -> int: ...
    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...
    def encode_prompt(self, text: str) -> list[int]: ...
    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str: ...
    def to_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class Task(Protocol):
    """What the trainer needs from a task (module docstring)."""

    @property
    def name(self) -> str: ...
    @property
    def tokenizer(self) -> Tokenizer | None: ...
    @property
    def max_new_tokens(self) -> int: ...
    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]: ...
    def validation(self, n: int) -> list[Problem]: ...
    def heldout(self, n: int) -> list[Problem]: ...
    def reward(self, problem: Problem, response: str, finished: bool) -> float: ...
    def rewards(
        self, problems: Sequence[Problem], responses: Sequence[str], finished: Sequence[bool]
    ) -> list[float]: ...
    def describe(self) -> str: ...
    def to_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class PivotalTask(Task, Protocol):
    """A task that marks the response tokens that decide its reward (module docstring)."""

    def pivotal(self, problem: Problem, response: str) -> list[bool]: ...


class TaskSettings(Protocol):
    """The settings a run's task is built from (a :class:`~comppo_core.rl.config.TrainConfig`
    is one): the task's name or file, its split and its response budget, and the size
    fields its registry entry names (:attr:`~comppo_core.rl.tasks.TaskEntry.sizes`, read
    by name). The registry takes this instead of ``TrainConfig`` so that it names no type
    of the config above it (the config imports the registry)."""

    @property
    def task(self) -> str: ...
    @property
    def split_seed(self) -> int: ...
    @property
    def heldout_fraction(self) -> float: ...
    @property
    def validation_fraction(self) -> float: ...
    @property
    def max_new_tokens(self) -> int | None: ...


def rewards_of(
    reward: Callable[[Problem, str, bool], float],
    problems: Sequence[Problem],
    responses: Sequence[str],
    finished: Sequence[bool],
) -> list[float]:
    """``reward`` of each ``(problem, response, finished)``: a task's ``rewards``."""
    return [reward(p, r, f) for p, r, f in zip(problems, responses, finished)]


class HashSplit:
    """The train / validation / held-out split of a task's problems, by the hash of their keys (module docstring).

    Args:
      split_seed: fixes which problems fall on which side.
      heldout_fraction: the held-out share, in (0, 1).
      validation_fraction: the validation share, in ``[0, 1 − heldout_fraction)`` (0: no
        validation split, and the train side is exactly that of a split without it).

    A bad fraction is a :class:`~comppo_core.errors.ParameterError` naming it.
    """

    def __init__(self, split_seed: int = 0, heldout_fraction: float = 0.2, validation_fraction: float = 0.0) -> None:
        hf, vf = heldout_fraction, validation_fraction
        if isinstance(hf, bool) or not isinstance(hf, (int, float)) or not 0.0 < float(hf) < 1.0:
            raise ParameterError(
                f"heldout_fraction: expected a number in (0, 1), got {hf!r}", argument="heldout_fraction"
            )
        if isinstance(vf, bool) or not isinstance(vf, (int, float)) or not 0.0 <= float(vf) < 1.0 - float(hf):
            raise ParameterError(
                f"validation_fraction: expected a number in [0, 1 − heldout_fraction) = [0, {1.0 - float(hf)!r}), "
                f"got {vf!r}",
                argument="validation_fraction",
            )
        self.split_seed = int(split_seed)
        self.heldout_fraction = float(hf)
        self.validation_fraction = float(vf)
        self._heldout_below = int(self.heldout_fraction * 2**64)
        self._validation_below = int((self.heldout_fraction + self.validation_fraction) * 2**64)

    def hash(self, key: str) -> int:
        """``blake2b(f"{split_seed}:{key}")`` as an integer in ``[0, 2⁶⁴)``."""
        h = hashlib.blake2b(f"{self.split_seed}:{key}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "little")

    def side(self, key: str) -> Side:
        """The split ``key`` falls in."""
        u = self.hash(key)
        if u < self._heldout_below:
            return "heldout"
        return "validation" if u < self._validation_below else "train"

    def share(self, side: Side) -> float:
        """The expected share of the problems on ``side``."""
        if side == "heldout":
            return self.heldout_fraction
        if side == "validation":
            return self.validation_fraction
        return 1.0 - self.heldout_fraction - self.validation_fraction

    def require_validation(self) -> None:
        """A :class:`~comppo_core.errors.ParameterError` naming ``validation_fraction`` when
        there is no validation split."""
        if self.validation_fraction == 0.0:
            raise ParameterError(
                "validation_fraction: expected a validation split (validation_fraction > 0), got 0.0",
                argument="validation_fraction",
            )

    def rng(self, *streams: int) -> np.random.Generator:
        """The generator of a fixed list: ``default_rng([split_seed, *streams])``."""
        return np.random.default_rng([self.split_seed, *streams])

    def split(self, keyed: Sequence[tuple[str, K]]) -> dict[Side, list[K]]:
        """The items of ``keyed`` (``(key, item)`` pairs) on each side, in their order."""
        out: dict[Side, list[K]] = {side: [] for side in SPLITS}
        for key, item in keyed:
            out[self.side(key)].append(item)
        return out

    def split_file_rows(self, rows: Sequence[Problem], where: str) -> dict[Side, list[Problem]]:
        """A file task's rows on each side, keyed by prompt (the held-out list shuffled with
        ``rng(7)``); a ParameterError naming ``task`` when a side of the held-out split is
        empty, or ``validation_fraction`` when a requested validation split is."""
        sides = self.split([(p.prompt, p) for p in rows])
        if self.validation_fraction and not sides["validation"]:
            raise ParameterError(
                f"validation_fraction: {where!r}: expected rows in the validation split (validation_fraction="
                f"{self.validation_fraction}), got none of {len(rows)} rows",
                argument="validation_fraction",
            )
        if not sides["train"] or not sides["heldout"]:
            raise ParameterError(
                f"task: {where!r}: expected rows on both sides of the held-out split (heldout_fraction="
                f"{self.heldout_fraction}), got {len(sides['train'])} training and {len(sides['heldout'])} held-out "
                f"of {len(rows)} rows",
                argument="task",
            )
        order = self.rng(7).permutation(len(sides["heldout"]))
        sides["heldout"] = [sides["heldout"][i] for i in order]
        return sides


def distinct_problems(
    n: int,
    rng: np.random.Generator,
    *,
    share: float,
    total: int,
    keys: Callable[[], Iterable[K]],
    on_side: Callable[[K], bool],
    draws: Callable[[np.random.Generator], Iterator[K]],
    problem: Callable[[K], Problem],
    what: str,
    fraction: str,
    list_always: bool = False,
) -> list[Problem]:
    """``n`` distinct problems of one side of a split (a held-out or validation list), fixed by ``rng``.

    A side of about ``share · total`` problems; up to half of it, distinct keys are drawn
    (``draws(rng)``: keys of the side, with replacement; about ``1.4·n`` draws at most half);
    more, or always with ``list_always``, every key of ``keys()`` on the side
    (``on_side``) is listed and shuffled with ``rng`` (all of them when fewer than ``n``),
    when ``total ≤`` :data:`ENUMERABLE`; more than half of a side too large to list is a
    ParameterError naming ``eval_size`` (drawing would take too long or never end), whose
    message says ``what`` the side holds and to raise ``fraction``."""
    if n <= 0:
        return []
    over_half = n > share * total / 2
    if list_always or (over_half and total <= ENUMERABLE):
        side = [k for k in keys() if on_side(k)]
        return [problem(side[int(i)]) for i in rng.permutation(len(side))[:n]]
    if over_half:
        raise ParameterError(
            f"eval_size: expected at most half of the about {share * total:.0f} {what}, got {n}; "
            f"lower eval_size or raise {fraction}",
            argument="eval_size",
        )
    seen: set[K] = set()
    out: list[Problem] = []
    for key in draws(rng):
        if key not in seen:
            seen.add(key)
            out.append(problem(key))
            if len(out) == n:
                break
    return out
