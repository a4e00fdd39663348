"""A built-in task where token-level credit matters: recall one digit after a filler, then count.

A problem is ``digits`` decimal digits ``x = x_0 … x_{n−1}`` and a query index ``q``; the
prompt is ``"38472915?3="``. The response is a filler of ``N`` symbols from ``abcd``
(``N`` free in ``[filler_min, filler_max]``), the separator ``|``, the recalled digit
``x_q``, a chain of ``steps`` digits each the previous plus 1 mod 10, then (when
``tail_max > 0``) a second ``|`` and a tail of ``M`` filler symbols (``M`` free in
``[tail_min, tail_max]``), then EOS::

    prompt    "38472915?3="                                   (x_3 = 7)
    response  "cabdbbacaddc|789012345|cbabcadbacbdd" <eos>
               └ filler N ┘│x└chain─┘│└─ tail M ──┘      x = x_q; chain: x_q+1 … x_q+steps (mod 10)

The fillers are free: any symbols, any lengths in range, and none of them changes the
reward. Only the recalled digit decides it (the chain then follows by a rule the warm
start learns), and where it sits in the response varies with ``N`` from one sample to the
next, while the tail keeps the response's length from telling where the chain ended. So
a response has a few *pivotal* tokens (:meth:`ChainTask.pivotal`: the recalled digit and
the chain) among many that do not matter, at a position that a per-position average
cannot know: the setting in which a good critic and well-placed gates have something to
do, and GRPO's one advantage for every token does not. (``tail_max = 0`` is the variant
without a tail, whose chain always ends the response.)

**Verifier** (:meth:`ChainTask.reward`): 1.0 iff the response stopped at EOS, has the
format ``[abcd]{N} | [0-9]{steps+1} | [abcd]{M}`` (``filler_min ≤ N ≤ filler_max``,
``tail_min ≤ M ≤ tail_max``; without a tail, nothing after the digits) and the chain's
last digit is ``(x_q + steps) mod 10``; 0.0 otherwise. The chain's middle digits are not
checked (a wrong recall followed by a skipped step can still earn the reward, as a wrong worked
step can in :class:`~comppo_core.rl.tasks.addition.AdditionTask`).

**Splits.** A problem ``(x, q)`` falls at ``u = blake2b(f"{split_seed}:{x}:{q}")
/ 2⁶⁴``: held out when ``u < heldout_fraction``, validation when ``heldout_fraction ≤ u <
heldout_fraction + validation_fraction``, training otherwise. :meth:`ChainTask.sample`
draws training problems only; :meth:`ChainTask.heldout` and :meth:`ChainTask.validation`
are fixed lists of distinct problems of their side, a function of ``split_seed`` and
their ``seed``. The filler is not part of a problem's identity.

**Demonstrations.** :attr:`Problem.solution` is a correct response with fillers drawn at
random (by the ``rng`` of :meth:`ChainTask.sample`, or from the problem's hash for the
fixed lists); :meth:`ChainTask.demonstration` draws fresh fillers for each SFT use, so the
warm-started policy samples varied filler lengths and symbols.

**Tokenizer.** A :class:`~comppo_core.rl.tasks.addition.CharTokenizer` over :data:`CHAIN_ALPHABET`:
one token per character, so response token ``k`` is character ``k`` of the response text.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ...errors import ParameterError
from .addition import CharTokenizer
from .base import SPLIT_WORDS, HashSplit, Problem, Side, distinct_problems, rewards_of
from .fillers import FILLER, SEPARATOR, FillerRange, body_pattern, pivotal_body, wrap

__all__ = ["CHAIN_ALPHABET", "FILLER", "SEPARATOR", "ChainTask"]

#: The characters of the chain task: digits, filler symbols, ``?`` and ``=`` of the prompt, the separator.
CHAIN_ALPHABET = "0123456789" + FILLER + "?=" + SEPARATOR


class ChainTask:
    """Recall the digit at a queried index after a random filler, count on, add a random tail (module docstring).

    Args:
      digits: digits in the prompt, 2 to 10 (the query index is one digit, ``0 … digits−1``).
      steps: chain digits after the recalled one, 1 to 32.
      filler_min, filler_max: the filler's length range, ``0 ≤ filler_min ≤ filler_max ≤ 256``.
      tail_min, tail_max: the tail's, the same way (``tail_max = 0``: no tail, no second ``|``).
      split_seed: fixes which problems are held out and which are validation.
      heldout_fraction, validation_fraction: the two sides' shares, in (0, 1) and [0, 1)
        (0: no validation split, as the addition task's default), with
        ``heldout_fraction + validation_fraction < 1``.
    """

    name = "chain"

    def __init__(
        self,
        digits: int = 8,
        steps: int = 8,
        *,
        filler_min: int = 0,
        filler_max: int = 32,
        tail_min: int = 0,
        tail_max: int = 32,
        split_seed: int = 0,
        heldout_fraction: float = 0.2,
        validation_fraction: float = 0.0,
    ) -> None:
        for name, value, lo, hi in (
            ("digits", digits, 2, 10),
            ("steps", steps, 1, 32),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ParameterError(f"{name}: expected an integer in [{lo}, {hi}], got {value!r}", argument=name)
        self._sizes = FillerRange(filler_min, filler_max, tail_min, tail_max)
        #: the train / validation / held-out split of the problems (key ``"x:q"``)
        self.split = HashSplit(split_seed, heldout_fraction, validation_fraction)
        self.digits = digits
        self.steps = steps
        self.filler_min = filler_min
        self.filler_max = filler_max
        self.tail_min = tail_min
        self.tail_max = tail_max
        self.split_seed = self.split.split_seed
        self.heldout_fraction = self.split.heldout_fraction
        self.validation_fraction = self.split.validation_fraction
        self.tokenizer = CharTokenizer(CHAIN_ALPHABET)
        self._format = body_pattern(f"[0-9]{{{steps + 1}}}", self._sizes)

    # ---- sizes

    @property
    def max_new_tokens(self) -> int:
        """Tokens the longest response needs, EOS included: ``filler_max + 1 + (steps + 1)``,
        then ``1 + tail_max`` with a tail, then 1."""
        return self._sizes.extra_tokens + self.steps + 2

    @property
    def max_prompt_tokens(self) -> int:
        """Tokens of every prompt, BOS included: ``1 + digits + 3`` (``?``, ``q``, ``=``)."""
        return self.digits + 4

    # ---- problems and splits

    def _hash(self, x: str, q: int) -> int:
        return self.split.hash(f"{x}:{q}")

    def _side(self, x: str, q: int) -> Side:
        return self.split.side(f"{x}:{q}")

    def is_heldout(self, x: str, q: int) -> bool:
        """Whether the problem ``(x, q)`` belongs to the held-out split."""
        return self._side(x, q) == "heldout"

    def is_validation(self, x: str, q: int) -> bool:
        """Whether the problem ``(x, q)`` belongs to the validation split."""
        return self._side(x, q) == "validation"

    def _check(self, x: Any, q: Any) -> None:
        if not isinstance(x, str) or len(x) != self.digits or not x.isascii() or not x.isdigit():
            raise ParameterError(f"x: expected a string of {self.digits} decimal digits, got {x!r}", argument="x")
        if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q < self.digits:
            raise ParameterError(f"q: expected an integer in [0, {self.digits}), got {q!r}", argument="q")

    def chain(self, x: str, q: int) -> str:
        """The response's text after the separator: ``x_q`` then ``steps`` digits counting on mod 10."""
        self._check(x, q)
        d = int(x[q])
        return "".join(str((d + k) % 10) for k in range(self.steps + 1))

    def problem(self, x: str, q: int, rng: np.random.Generator | None = None) -> Problem:
        """The problem ``(x, q)``, ``x`` the prompt's digits as a string: prompt ``f"{x}?{q}="``,
        answer the chain (:meth:`chain`), solution a correct response whose fillers are drawn
        with ``rng`` (None: a generator seeded by the problem's hash, the same every time)."""
        self._check(x, q)
        answer = self.chain(x, q)
        rng = np.random.default_rng(self._hash(x, q)) if rng is None else rng
        return Problem(f"{x}?{q}=", answer, wrap(answer, rng, self._sizes))

    def parse(self, problem: Problem) -> tuple[str, int]:
        """``(x, q)`` of a problem built by :meth:`problem`."""
        x, _, rest = problem.prompt.partition("?")
        q = int(rest[:-1]) if rest.endswith("=") and rest[:-1].isdigit() else -1
        self._check(x, q)
        return x, q

    def demonstration(self, problem: Problem, rng: np.random.Generator) -> str:
        """A correct response to ``problem`` with fresh random fillers (lengths uniform in
        ``[filler_min, filler_max]`` and ``[tail_min, tail_max]``, symbols uniform), without
        EOS: the SFT warm start's target (:func:`comppo_core.rl.engine.build.sft_warm_start`)."""
        return wrap(self.chain(*self.parse(problem)), rng, self._sizes)

    def _draw(self, rng: np.random.Generator, side: Side) -> Iterator[tuple[str, int]]:
        """Problems drawn uniformly from one side, with replacement (rejection sampling;
        every side has a share of at least a few percent in practice)."""
        while True:
            x = "".join(str(int(d)) for d in rng.integers(0, 10, size=self.digits))
            q = int(rng.integers(0, self.digits))
            if self._side(x, q) == side:
                yield x, q

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` training problems (neither held out nor validation), each with random
        fillers in its solution, drawn with ``rng``."""
        draws = self._draw(rng, "train")
        out = []
        for _ in range(n):
            x, q = next(draws)
            out.append(self.problem(x, q, rng))
        return out

    def _fixed(self, n: int, seed: int, side: Side, stream: int) -> list[Problem]:
        """``n`` distinct problems of ``side``, fixed by ``seed``
        (:func:`~comppo_core.rl.tasks.base.distinct_problems`: drawn up to half the side, listed
        beyond that while the problem space is small, refused when it is not)."""
        width = self.digits

        def keys() -> Iterator[tuple[str, int]]:
            return ((f"{i:0{width}d}", q) for i in range(10**width) for q in range(width))

        return distinct_problems(
            n,
            self.split.rng(seed, stream),
            share=self.split.share(side),
            total=10**width * width,
            keys=keys,
            on_side=lambda key: self._side(*key) == side,
            draws=lambda rng: self._draw(rng, side),
            problem=lambda key: self.problem(*key),
            what=f"{SPLIT_WORDS[side]} problems of {width} digits",
            fraction="heldout_fraction" if side == "heldout" else "validation_fraction",
        )

    def heldout(self, n: int, seed: int = 0) -> list[Problem]:
        """A fixed list of ``n`` distinct held-out problems (a function of ``split_seed`` and
        ``seed``; fewer if the split has fewer: :meth:`_fixed`)."""
        return self._fixed(n, seed, "heldout", 7)

    def validation(self, n: int, seed: int = 0) -> list[Problem]:
        """A fixed list of ``n`` distinct validation problems, disjoint from the held-out
        ones and never drawn by :meth:`sample` (for tuning without touching the held-out set).
        A :class:`~comppo_core.errors.ParameterError` naming ``validation_fraction`` when
        the task has no validation split."""
        self.split.require_validation()
        return self._fixed(n, seed, "validation", 11)

    # ---- the verifier and the pivotal tokens

    def reward(self, problem: Problem, response: str, finished: bool) -> float:
        """The verifier (module docstring): 1.0 iff finished, in format and the last digit
        is ``(x_q + steps) mod 10``."""
        if not finished or not self._format.fullmatch(response):
            return 0.0
        return 1.0 if response.split(SEPARATOR)[1][-1] == problem.answer[-1] else 0.0  # the body's last digit

    def rewards(self, problems: Sequence[Problem], responses: Sequence[str], finished: Sequence[bool]) -> list[float]:
        """:meth:`reward` of each response."""
        return rewards_of(self.reward, problems, responses, finished)

    def pivotal(self, problem: Problem, response: str) -> list[bool]:
        """Which tokens of ``response`` are pivotal, one bool per character.

        The char tokenizer has one token per character, so entry ``k`` is response token
        ``k``; the EOS token after the text is not included (a caller that reads it adds
        its own entry). Pivotal: every character after the response's first separator
        ``|`` and before its second one, if any (the recalled digit and the chain, whatever
        they are); not pivotal: the fillers and the separators, and every character of a
        response without a separator. ``problem`` is not read (the split is by format alone); it is in the
        signature so that a task whose pivotal tokens depend on the problem fits it."""
        del problem
        return pivotal_body(response)

    def describe(self) -> str:
        """``"chain recall (8 digits, filler 0-32, 8 steps)"``."""
        return f"chain recall ({self.digits} digits, filler {self.filler_min}-{self.filler_max}, {self.steps} steps)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "digits": self.digits,
            "steps": self.steps,
            "filler_min": self.filler_min,
            "filler_max": self.filler_max,
            "tail_min": self.tail_min,
            "tail_max": self.tail_max,
            "split_seed": self.split_seed,
            "heldout_fraction": self.heldout_fraction,
            "validation_fraction": self.validation_fraction,
        }
