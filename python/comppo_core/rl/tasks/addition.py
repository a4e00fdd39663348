"""The built-in task: addition with worked steps, a verifier and a character tokenizer.

A problem is two non-negative integers below ``10**digits``; the prompt is ``"27+45="``
and the response works the columns from the least significant digit, carrying, then
gives the answer after ``;``::

    prompt    "27+45="
    response  "7+5=12,2+4+1=7;72" <eos>

    column i:  f"{a_i}+{b_i}" + (f"+{c_i}" if c_i else "") + f"={s_i}",
               s_i = a_i + b_i + c_i,  c_{i+1} = s_i // 10     (a_i = 0 past a's last digit)
    answer:    str(a + b)

Every response has at least 8 tokens (``"3+4=7;7"`` and its EOS), and a wrong column
early on usually makes the answer wrong, so which tokens earned the reward matters:
the setting token-level credit assignment is about.

**Verifier** (:meth:`AdditionTask.reward`): 1.0 when the response stopped at EOS and its
text after the single ``;`` is exactly ``str(a + b)``; 0.0 otherwise (worked steps are
not checked; a right answer reached by wrong steps still earns the reward).

**Split** (:class:`~comppo_core.rl.tasks.base.HashSplit`, the key ``"a:b"``). A pair
``(a, b)`` is held out when ``blake2b(f"{split_seed}:{a}:{b}")`` falls
in the first ``heldout_fraction`` of its range, so the split is a fixed function of
``split_seed`` whatever is sampled; training problems are drawn from the rest, and the
evaluation set is a fixed list of distinct held-out pairs. With ``validation_fraction``
``v > 0`` the pairs whose hash falls in the next ``v`` of the range,
``[heldout_fraction, heldout_fraction + v)``, form a **validation** split
(:meth:`AdditionTask.validation`, what a tuning protocol selects settings on), disjoint
from the held-out split and excluded from training; ``v = 0`` (the default) has none, and
the training draws are then exactly those of a task without the argument.

**Tokenizer.** :class:`CharTokenizer`: one id per character, ``<pad>`` = 0, ``<bos>`` = 1,
``<eos>`` = 2; nothing to download. :meth:`CharTokenizer.to_hf` is the same tokenizer as a
``transformers`` fast tokenizer, which ``save_pretrained`` writes beside a model
(:func:`comppo_core.rl.models.pretrained.save_tokenizer`) so the model can be loaded back as
``model=DIR``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ParameterError
from .base import ENUMERABLE, SPLIT_WORDS, HashSplit, Problem, Side, distinct_problems, rewards_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["ALPHABET", "ENUMERABLE", "AdditionTask", "CharTokenizer", "Problem", "distinct_problems", "worked_solution"]


#: The characters of the built-in task.
ALPHABET = "0123456789+=,;"


class CharTokenizer:
    """One token per character of ``alphabet``, after the specials ``<pad> <bos> <eos>``.

    ``pad_token_id = 0``, ``bos_token_id = 1``, ``eos_token_id = 2``; character k of
    ``alphabet`` is id ``3 + k``. :meth:`encode` rejects a character outside the
    alphabet with a :class:`~comppo_core.errors.ParameterError` naming it and its index.
    """

    SPECIALS = ("<pad>", "<bos>", "<eos>")
    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2

    def __init__(self, alphabet: str = ALPHABET) -> None:
        if not isinstance(alphabet, str) or not alphabet or len(set(alphabet)) != len(alphabet):
            raise ParameterError(
                f"alphabet: expected a non-empty string of distinct characters, got {alphabet!r}", argument="alphabet"
            )
        self.alphabet = alphabet
        self._ids = {ch: 3 + i for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        """Number of ids: the three specials and one per character."""
        return 3 + len(self.alphabet)

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """The ids of ``text``, optionally after ``<bos>`` and before ``<eos>``."""
        ids = [self.bos_token_id] if add_bos else []
        for i, ch in enumerate(text):
            tok = self._ids.get(ch)
            if tok is None:
                raise ParameterError(
                    f"text: expected characters of {self.alphabet!r}, got {ch!r} at index {i}", argument="text", index=i
                )
            ids.append(tok)
        if add_eos:
            ids.append(self.eos_token_id)
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        """The ids the policy reads for a prompt: ``<bos>`` then the text."""
        return self.encode(text, add_bos=True)

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """The text of ``ids``; specials are dropped (or written as ``<pad>`` etc.)."""
        out = []
        for k, i in enumerate(ids):
            i = int(i)
            if 0 <= i < 3:
                if not skip_special_tokens:
                    out.append(self.SPECIALS[i])
            elif 3 <= i < self.vocab_size:
                out.append(self.alphabet[i - 3])
            else:
                raise ParameterError(
                    f"ids: expected ids in [0, {self.vocab_size}), got {i} at index {k}", argument="ids", index=k
                )
        return "".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "char", "alphabet": self.alphabet}

    def to_hf(self) -> PreTrainedTokenizerFast:
        """This tokenizer as a ``transformers.PreTrainedTokenizerFast``, built offline.

        A ``tokenizers`` WordLevel model over the specials then one token per character
        (the same ids), a pre-tokenizer that splits every character, a post-processor
        that puts ``<bos>`` in front of a sequence when special tokens are added, and a
        decoder that joins the characters; ``pad``, ``bos`` and ``eos`` tokens set.
        Wrapped in :class:`comppo_core.rl.models.pretrained.HFTokenizer` it gives the same
        ``vocab_size``, special ids, ``encode_prompt``, ``encode`` and ``decode`` as this
        tokenizer; it differs only on bad input (a character outside the alphabet is an
        ``Exception`` of the ``tokenizers`` library; an id out of range decodes to "").

        An alphabet that can spell ``<pad>``, ``<bos>`` or ``<eos>`` is a
        :class:`~comppo_core.errors.ParameterError`: a fast tokenizer reads those names
        in a text as the special tokens, this one as characters. Needs ``transformers``.
        """
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
        from transformers import PreTrainedTokenizerFast

        for special in self.SPECIALS:
            if set(special) <= set(self.alphabet):
                raise ParameterError(
                    f"alphabet: expected an alphabet that cannot spell the special token {special!r} (a Hugging Face "
                    f"tokenizer would read it in a text as the token), got {self.alphabet!r}",
                    argument="alphabet",
                )
        vocab = {name: i for i, name in enumerate(self.SPECIALS)}
        vocab.update(self._ids)
        tok = Tokenizer(models.WordLevel(vocab))  # no unknown token: a foreign character is an error
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
        bos = self.SPECIALS[self.bos_token_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, self.bos_token_id)]
        )
        tok.decoder = decoders.Fuse()  # the characters, joined without spaces
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            pad_token=self.SPECIALS[self.pad_token_id],
            bos_token=bos,
            eos_token=self.SPECIALS[self.eos_token_id],
            clean_up_tokenization_spaces=False,
        )


def worked_solution(a: int, b: int, *, carries: bool = True) -> str:
    """The worked response for ``a + b`` (module docstring), without EOS.

    ``carries=False`` is the same procedure with every carry forgotten: each column is
    ``a_i + b_i`` alone and the answer is its last digits read back (``"7+5=12,2+4=6;62"``
    for 27+45), a consistent but wrong response whenever a column carries (the noisy
    demonstrations of :func:`comppo_core.rl.engine.build.sft_warm_start`'s ``carry_noise``)."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, value, carry, s = [], 0, 0, 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}" + (f"+{carry}" if carry else "") + f"={s}")
        value += (s % 10) * 10**i
        carry = s // 10 if carries else 0
    value += (s // 10) * 10 ** len(steps)  # the last column's own overflow (a + b with carries)
    return ",".join(steps) + ";" + str(value)


def has_carry(a: int, b: int) -> bool:
    """Whether some column of ``a + b`` carries (its worked response writes a ``+1``)."""
    return worked_solution(a, b) != worked_solution(a, b, carries=False)


class AdditionTask:
    """Addition of two numbers below ``10**digits`` with worked steps (module docstring).

    Args:
      digits: the difficulty knob, 1 to 6 (operands in ``[0, 10**digits)``).
      split_seed: fixes which pairs are held out.
      heldout_fraction: share of pairs held out, in (0, 1).
      validation_fraction: share of pairs in the validation split, in [0, 1 − heldout_fraction).
    """

    name = "addition"

    def __init__(
        self, digits: int = 2, *, split_seed: int = 0, heldout_fraction: float = 0.2, validation_fraction: float = 0.0
    ) -> None:
        if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 6:
            raise ParameterError(f"digits: expected an integer in [1, 6], got {digits!r}", argument="digits")
        #: the train / validation / held-out split of the pairs (key ``"a:b"``)
        self.split = HashSplit(split_seed, heldout_fraction, validation_fraction)
        self.digits = digits
        self.split_seed = self.split.split_seed
        self.heldout_fraction = self.split.heldout_fraction
        self.validation_fraction = self.split.validation_fraction
        self.tokenizer = CharTokenizer(ALPHABET)
        pairs = 10 ** (2 * digits)
        sides: dict[Side, float] = {"heldout": 0, "validation": 0, "train": 0}
        if digits <= 2:  # count exactly (10⁴ hashes at most)
            for a, b in self._pairs():
                sides[self._side(a, b)] += 1
        else:  # too many pairs to count: the expected sizes
            sides = {side: self.split.share(side) * pairs for side in sides}
        if self.validation_fraction == 0.0:
            del sides["validation"]
        for side, count in sides.items():
            if count < 1:
                blamed = side == "validation" or (side == "train" and self.validation_fraction)
                name = "validation_fraction" if blamed else "heldout_fraction"
                kinds = "training, held-out and validation" if self.validation_fraction else "training and held-out"
                raise ParameterError(
                    f"{name}: expected a split with {kinds} pairs, got {getattr(self, name)!r}, which leaves no "
                    f"{SPLIT_WORDS[side]} pair of the {pairs} {digits}-digit pairs (split_seed {self.split_seed})",
                    argument=name,
                )

    def _pairs(self) -> Iterator[tuple[int, int]]:
        hi = 10**self.digits
        return ((a, b) for a in range(hi) for b in range(hi))

    def _draw(self, rng: np.random.Generator, n: int, side: Side) -> Iterator[tuple[int, int]]:
        """Pairs drawn uniformly from one side of the split, with replacement; at most
        ``100·n/p + 10⁴`` draws (p the side's share), far beyond what any split needs."""
        hi = 10**self.digits
        share = self.split.share(side)
        for _ in range(int(100 * n / share) + 10_000):
            a, b = (int(x) for x in rng.integers(0, hi, size=2))
            if self._side(a, b) == side:
                yield a, b
        raise ParameterError(  # pragma: no cover - a share below 1/hi² is refused in __init__
            f"heldout_fraction: the {SPLIT_WORDS[side]} side of the split is too rare to draw from ({share!r} of "
            "the pairs)",
            argument="heldout_fraction",
        )

    @property
    def max_new_tokens(self) -> int:
        """Tokens the longest response needs, EOS included (``9…9+9…9``)."""
        top = 10**self.digits - 1
        return len(self.tokenizer.encode(worked_solution(top, top))) + 1

    @property
    def max_prompt_tokens(self) -> int:
        """Tokens of the longest prompt, BOS included."""
        return 1 + 2 * self.digits + 2

    def _hash(self, a: int, b: int) -> int:
        return self.split.hash(f"{a}:{b}")

    def _side(self, a: int, b: int) -> Side:
        """``"heldout"``, ``"validation"`` or ``"train"``: where ``(a, b)`` falls."""
        return self.split.side(f"{a}:{b}")

    def is_heldout(self, a: int, b: int) -> bool:
        """Whether ``(a, b)`` belongs to the held-out split."""
        return self._side(a, b) == "heldout"

    def is_validation(self, a: int, b: int) -> bool:
        """Whether ``(a, b)`` belongs to the validation split (never with ``validation_fraction=0``)."""
        return self._side(a, b) == "validation"

    def problem(self, a: int, b: int) -> Problem:
        return Problem(f"{a}+{b}=", str(a + b), worked_solution(a, b))

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` training problems (pairs outside the held-out and validation splits), drawn with ``rng``."""
        draws = self._draw(rng, n, "train")
        return [self.problem(*next(draws)) for _ in range(n)]

    def heldout(self, n: int, seed: int = 0) -> list[Problem]:
        """A fixed list of ``n`` distinct held-out problems (fewer if the split has fewer).

        Up to 10⁶ pairs (3 digits) and whenever ``n`` is over half the held-out pairs
        expected, the held-out pairs are listed and shuffled; otherwise distinct pairs are
        drawn. More than half of a split too large to list is an error naming ``eval_size``."""
        return self._fixed_list(n, "heldout", self.split.rng(seed, 7))

    def validation(self, n: int, seed: int = 0) -> list[Problem]:
        """A fixed list of ``n`` distinct validation problems (fewer if the split has fewer),
        as :meth:`heldout` lists held-out ones: disjoint from the held-out split and from
        every :meth:`sample`. A :class:`~comppo_core.errors.ParameterError` naming
        ``validation_fraction`` when the task has no validation split."""
        self.split.require_validation()
        return self._fixed_list(n, "validation", self.split.rng(seed, 8))

    def _fixed_list(self, n: int, side: Side, rng: np.random.Generator) -> list[Problem]:
        return distinct_problems(
            n,
            rng,
            share=self.split.share(side),
            total=10 ** (2 * self.digits),
            keys=self._pairs,
            on_side=lambda pair: self._side(*pair) == side,
            draws=lambda r: self._draw(r, 4 * n, side),
            problem=lambda pair: self.problem(*pair),
            what=f"{SPLIT_WORDS[side]} {self.digits}-digit pairs",
            fraction="heldout_fraction" if side == "heldout" else "validation_fraction",
            list_always=self.digits <= 2,
        )

    def reward(self, problem: Problem, response: str, finished: bool) -> float:
        """The verifier: 1.0 iff the response ``finished`` at EOS and its text after its
        single ``;`` is exactly ``problem.answer``."""
        if not finished or response.count(";") != 1:
            return 0.0
        return 1.0 if response.split(";", 1)[1] == problem.answer else 0.0

    def rewards(self, problems: Sequence[Problem], responses: Sequence[str], finished: Sequence[bool]) -> list[float]:
        """:meth:`reward` of each response."""
        return rewards_of(self.reward, problems, responses, finished)

    def describe(self) -> str:
        """``"2-digit addition"``."""
        return f"{self.digits}-digit addition"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "digits": self.digits,
            "split_seed": self.split_seed,
            "heldout_fraction": self.heldout_fraction,
            **({"validation_fraction": self.validation_fraction} if self.validation_fraction else {}),
        }
