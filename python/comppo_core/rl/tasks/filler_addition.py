"""Addition between random fillers: worked addition whose place in the response varies.

The problems, prompts, splits and worked steps are those of
:class:`~comppo_core.rl.tasks.addition.AdditionTask`; the response wraps the worked solution in
random fillers (:mod:`comppo_core.rl.tasks.fillers`)::

    prompt    "27+45="
    response  "cabdbbac|7+5=12,2+4+1=7;72|cbabca" <eos>
               └ N ───┘│└─ worked addition ──┘│└ M ─┘

So the decisions that earn the reward, the column sums and the answer, are the ones the
warm-started policy already gets right part of the time and that RL is known to improve
on this policy (the addition task learns at 32 prompts × 8 samples), while about half the
response's tokens are fillers that change nothing, placed at random: the setting in which
a good critic and well-placed gates have something to do, and GRPO's one advantage for
every token does not. Unlike the chain task's recall of an indexed digit, every lookup
the worked steps need can be made by content (the digits next to ``+`` and ``=``), so the
filler does not make the warm start's task harder by itself.

**Verifier** (:meth:`FillerAdditionTask.reward`): 1.0 iff the response stopped at EOS,
has the format ``[abcd]{N} | body | [abcd]{M}`` (lengths in range; without a tail,
nothing after the body), and the body, a string of ``0-9+=,;``, has exactly one ``;``
followed by exactly ``str(a + b)``; 0.0 otherwise (worked steps are not checked, as in
the addition task).

**Pivotal** tokens (:meth:`FillerAdditionTask.pivotal`): the body, every character
between the two separators; not the fillers or the separators.

**Demonstrations.** :attr:`Problem.solution` wraps the worked solution in fillers drawn
from the problem's hash (the same each time); :meth:`FillerAdditionTask.demonstration`
draws fresh fillers for each SFT use, so the warm-started policy samples varied fillers.

**Tokenizer.** A :class:`~comppo_core.rl.tasks.addition.CharTokenizer` over
:data:`FILLER_ADDITION_ALPHABET`: one token per character.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ParameterError
from .addition import ALPHABET, AdditionTask, CharTokenizer, Problem, worked_solution
from .fillers import FILLER, SEPARATOR, FillerRange, body_pattern, pivotal_body, wrap

__all__ = ["FILLER_ADDITION_ALPHABET", "FillerAdditionTask"]

#: Addition's characters, then the filler's symbols and the separator.
FILLER_ADDITION_ALPHABET = ALPHABET + FILLER + SEPARATOR


class FillerAdditionTask(AdditionTask):
    """Worked addition between random fillers (module docstring).

    Args:
      digits, split_seed, heldout_fraction, validation_fraction: as
        :class:`~comppo_core.rl.tasks.addition.AdditionTask` (the same pairs on each side).
      filler_min, filler_max: the filler's length range before the worked addition,
        ``0 ≤ filler_min ≤ filler_max ≤ 256``.
      tail_min, tail_max: the tail's after it, the same way (``tail_max = 0``: no tail and
        no second ``|``).
    """

    name = "filler_addition"

    def __init__(
        self,
        digits: int = 2,
        *,
        filler_min: int = 0,
        filler_max: int = 16,
        tail_min: int = 0,
        tail_max: int = 16,
        split_seed: int = 0,
        heldout_fraction: float = 0.2,
        validation_fraction: float = 0.0,
    ) -> None:
        super().__init__(
            digits, split_seed=split_seed, heldout_fraction=heldout_fraction, validation_fraction=validation_fraction
        )
        self._sizes = FillerRange(filler_min, filler_max, tail_min, tail_max)
        self.filler_min, self.filler_max, self.tail_min, self.tail_max = filler_min, filler_max, tail_min, tail_max
        self.tokenizer = CharTokenizer(FILLER_ADDITION_ALPHABET)
        self._format = body_pattern(r"[0-9+=,;]*", self._sizes)

    @property
    def max_new_tokens(self) -> int:
        """Tokens the longest response needs, EOS included: the addition task's, plus the
        fillers and separators at their longest."""
        return super().max_new_tokens + self._sizes.extra_tokens

    def problem(self, a: int, b: int) -> Problem:
        """The problem ``a + b``: prompt ``f"{a}+{b}="``, answer ``str(a + b)``, solution the
        worked solution wrapped in fillers drawn from the problem's hash (the same every time)."""
        rng = np.random.default_rng(self._hash(a, b))
        return Problem(f"{a}+{b}=", str(a + b), wrap(worked_solution(a, b), rng, self._sizes))

    def parse(self, problem: Problem) -> tuple[int, int]:
        """``(a, b)`` of a problem built by :meth:`problem`."""
        a, plus, b = problem.prompt[:-1].partition("+")
        if not (plus and problem.prompt.endswith("=") and a.isascii() and a.isdigit() and b.isascii() and b.isdigit()):
            raise ParameterError(
                f"problem: expected a prompt of the form 'a+b=', got {problem.prompt!r}", argument="problem"
            )
        return int(a), int(b)

    def demonstration(self, problem: Problem, rng: np.random.Generator, *, carries: bool = True) -> str:
        """A correct response to ``problem`` with fresh random fillers drawn with ``rng``,
        without EOS: the SFT warm start's target (:func:`comppo_core.rl.engine.build.sft_warm_start`).
        ``carries=False``: the worked solution that forgets every carry
        (:func:`~comppo_core.rl.tasks.addition.worked_solution`; ``sft_carry_noise``'s noisy
        demonstrations), consistent but wrong whenever a column carries."""
        return wrap(worked_solution(*self.parse(problem), carries=carries), rng, self._sizes)

    def reward(self, problem: Problem, response: str, finished: bool) -> float:
        """The verifier (module docstring): 1.0 iff finished, in format and the body's text
        after its single ``;`` is exactly ``problem.answer``."""
        match = self._format.fullmatch(response) if finished else None
        if match is None:
            return 0.0
        return super().reward(problem, match.group(1), True)

    def pivotal(self, problem: Problem, response: str) -> list[bool]:
        """Which characters of ``response`` are pivotal: the body between the separators
        (:func:`~comppo_core.rl.tasks.fillers.pivotal_body`); ``problem`` is not read."""
        del problem
        return pivotal_body(response)

    def describe(self) -> str:
        """``"2-digit addition between fillers (0-16, tail 0-16)"``."""
        return (
            f"{self.digits}-digit addition between fillers ({self.filler_min}-{self.filler_max}, "
            f"tail {self.tail_min}-{self.tail_max})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **super().to_dict(),
            "filler_min": self.filler_min,
            "filler_max": self.filler_max,
            "tail_min": self.tail_min,
            "tail_max": self.tail_max,
        }
