"""reasoning-gym's procedural tasks: ``--task reasoning_gym:NAME``, its generator's questions and its verifier.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ (the ``[reasoning-gym]``
extra) generates about a hundred seeded RLVR tasks (``basic_arithmetic``, ``chain_sum``,
``leg_counting``, ``spell_backward``, ``gsm_symbolic``, …), each dataset an indexable
generator of entries ``{"question", "answer", "metadata"}`` with its own verifier
``dataset.score_answer(answer, entry)`` in ``[0, 1]``. Nothing is downloaded.

**Options** (``config.task_options``, on the command line ``--task-option KEY=VALUE``, the
value parsed as JSON when it parses, else a string): the fields of the dataset's config
dataclass (``--task-option min_terms=2 --task-option max_terms=3`` for ``chain_sum``;
``seed`` is not one: the split fixes the generators' seeds), checked by the dataset's own
``validate``, plus ``answer_format`` (below). ``size`` (:data:`DEFAULT_SIZE` unless given)
is the number of entries each generator holds: the pool the training problems are drawn
from, and the most a validation or held-out list can search. An unknown option, or a
value the dataset refuses, is a :class:`~comppo_core.errors.ParameterError` naming
``task_option`` that lists the dataset's settings.

**Splits.** Three generators, one per side, each the dataset built with ``seed`` drawn from
``default_rng([split_seed, 11, side])`` and ``size`` entries (entry ``i`` of a generator is
a fixed function of its seed and ``i``). Every entry is placed by
:class:`~comppo_core.rl.tasks.base.HashSplit` on its **question text**, whichever generator
made it: a question is trained on only when it hashes to the train side, listed for
validation or held out only when it hashes to that side, so the three splits are disjoint
whatever is drawn, and a question two generators both make lands on one side.

* :meth:`ReasoningGymTask.sample`: entries of the train generator at indices drawn with
  ``rng`` (with replacement), those whose question is on the train side;
* :meth:`~ReasoningGymTask.validation` / :meth:`~ReasoningGymTask.heldout`: the first ``n``
  distinct questions on that side of its own generator, in index order: a fixed function
  of ``split_seed`` and the options (fewer when the generator's ``size`` entries hold fewer).

**Prompt.** The dataset's question, a blank line, and the answer format's instruction; with
``--chat-template`` the tokenizer renders that text as one user turn (the trainer does, as
for every task of a user's model). The answer formats (``answer_format``):

* ``"plain"``: ``"Answer with just the final answer."``; the answer is the whole response,
  stripped of surrounding whitespace (reasoning-gym's verifiers compare it as it is);
* ``"final"`` (the default): the same instruction, and two readings of the response, the
  better scored: the whole response stripped (``plain``'s) and its final answer as the
  JSONL task's hand rule reads it (:func:`comppo_core.rl.tasks.answers.extract_answer`: the
  text after the last ``"answer:"`` or ``"####"``, else the last number, else the whole
  response), normalised (:func:`~comppo_core.rl.tasks.answers.normalize`: whitespace runs to
  one space, one trailing ``.`` dropped). ``"5 - 2 = 3"`` answers ``3``; ``"Final answer:
  tfab."`` answers ``tfab``; a list such as ``"['1', '2']"`` still scores as the whole
  response (its last number alone would not). A small model that answers in a sentence is
  scored on its answer, not its wording;
* ``"tag"`` (reasoning-gym's own convention, for a model that reasons first): ``"Give the
  final answer between <answer> and </answer> tags."``; the answer is the last tag's content
  (``reasoning_gym.utils.extract_answer``), none without a tag.

``final`` is the default: on SmolLM2-135M-Instruct's validation problems it scored the same
samples higher than ``plain`` on five of six reasoning-gym tasks and as high on the sixth, and
``tag`` scored 0 on all six (docs/experiments/smollm2-task-accuracy.md).

**Reward.** 0 unless the response stopped at EOS (as every task); else
``score_answer(answer, entry)``, the dataset's verifier on the entry the problem came from,
of the answer read from the response (the best of ``final``'s two readings; a reading the
verifier raises on scores 0). Scores may be **partial**
(``basic_arithmetic``'s default verifier gives ``len(answer)/len(response)`` to a response
that contains the right answer among other text: read whole, ``"The answer is 42"`` scores
0.125, and ``"-111"`` for ``-11`` 0.75). The
group baselines treat a fractional score as any reward: GRPO z-scores the scores of a
group, so within a group a partial answer gets an advantage between a wrong and a right
one, and the critic arms' value targets are the same scores. The pass@k of
``comppo-core evaluate --samples`` counts a sample **correct when its score is 1**
(:data:`~comppo_core.experiments.pass_at_k.PASS_REWARD`); the printed accuracy is the mean
greedy score, partial scores included.

The verifier may read the entry's metadata, so every question drawn is remembered with its
entry, per process, for the dataset and settings that made it (:data:`_ENTRIES`): a task
scores the problems that it, or another task of the same dataset and settings (another
answer format, a second ``dataset_and_rewards`` call), drew; a problem none drew is a
:class:`~comppo_core.errors.ParameterError` naming ``problem``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import ParameterError
from .base import HashSplit, Problem, Side, rewards_of

__all__ = [
    "ANSWER_FORMATS",
    "DEFAULT_ANSWER_FORMAT",
    "DEFAULT_SIZE",
    "INSTALL",
    "ReasoningGymTask",
    "check_name",
    "check_options",
    "dataset_names",
    "dataset_settings",
    "readings",
]

#: What a missing package asks for.
INSTALL = 'pip install "comppo-core[reasoning-gym]"'
#: The answer formats: the instruction that follows the question.
ANSWER_FORMATS: dict[str, str] = {
    "plain": "Answer with just the final answer.",
    "final": "Answer with just the final answer.",
    "tag": "Give the final answer between <answer> and </answer> tags.",
}
#: The answer format without the option (measured: docs/experiments/smollm2-task-accuracy.md).
DEFAULT_ANSWER_FORMAT = "final"
#: Response budget per answer format when the config gives none.
MAX_NEW_TOKENS = {"plain": 32, "final": 32, "tag": 128}
#: Entries of each generator without the ``size`` option.
DEFAULT_SIZE = 10_000
#: The options the package adds to a dataset's settings.
OWN_OPTIONS = ("answer_format",)
#: The dataset settings that are not options: the split seeds the generators.
FIXED_SETTINGS = ("seed",)
#: (dataset, its settings as JSON) → question → the entry that asked it: every entry drawn in this
#: process (entries are a fixed function of the dataset, its settings, a seed and an index).
_ENTRIES: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
#: Side → the stream of its generator's seed.
_STREAM: dict[Side, int] = {"train": 0, "validation": 1, "heldout": 2}


def _reasoning_gym() -> Any:
    """The ``reasoning_gym`` package, or a ParameterError naming ``task`` saying how to install it."""
    try:
        import reasoning_gym  # type: ignore[import-untyped]
    except ImportError:
        raise ParameterError(
            f"task: a reasoning_gym:NAME task needs the reasoning-gym package: {INSTALL}", argument="task"
        ) from None
    return reasoning_gym


def _registry() -> dict[str, Any]:
    """reasoning-gym's datasets: name → (dataset class, config class)."""
    _reasoning_gym()
    from reasoning_gym.factory import DATASETS  # type: ignore[import-untyped]

    return dict(DATASETS)


def dataset_names() -> list[str]:
    """reasoning-gym's dataset names, sorted (imports reasoning-gym)."""
    return sorted(_registry())


def check_name(name: str) -> str:
    """``name`` when reasoning-gym has that dataset; else a ParameterError naming ``task`` that
    lists a few (and the install line when reasoning-gym is missing)."""
    names = dataset_names()
    if name not in names:
        close = [n for n in names if name and (name in n or n in name)][:5]
        some = close or ["basic_arithmetic", "chain_sum", "leg_counting", "letter_counting", "spell_backward"]
        raise ParameterError(
            f"task: expected reasoning_gym:NAME with one of reasoning-gym's {len(names)} datasets (for example "
            f"{', '.join(some)}; reasoning_gym.factory.DATASETS lists them), got {f'reasoning_gym:{name}'!r}",
            argument="task",
        )
    return name


def dataset_settings(name: str) -> dict[str, Any]:
    """The options of dataset ``name``: its config's fields (but ``seed``) with their defaults,
    and the package's own (``answer_format``)."""
    _, config_cls = _registry()[check_name(name)]
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config_cls):
        if f.name in FIXED_SETTINGS:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = None
    out["size"] = DEFAULT_SIZE
    out["answer_format"] = DEFAULT_ANSWER_FORMAT
    return out


def _describe_settings(settings: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in settings.items())


def check_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The dataset config's settings (``options`` over its defaults, without
    ``answer_format``); a ParameterError naming ``task_option`` for an option the dataset
    lacks or a value it refuses (its own ``validate``)."""
    settings = dataset_settings(name)
    for key in options:
        if key in FIXED_SETTINGS:
            raise ParameterError(
                f"task_option: expected a setting of reasoning_gym:{name} other than {key!r} (the split seeds its "
                f"generators: --split-seed), got {key}={options[key]!r}",
                argument="task_option",
            )
        if key not in settings:
            raise ParameterError(
                f"task_option: expected a setting of reasoning_gym:{name} ({_describe_settings(settings)}), got "
                f"{key!r}",
                argument="task_option",
            )
    answer_format = options.get("answer_format", DEFAULT_ANSWER_FORMAT)
    if answer_format not in ANSWER_FORMATS:
        raise ParameterError(
            f"task_option: expected answer_format to be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}",
            argument="task_option",
        )
    size = options.get("size", DEFAULT_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ParameterError(
            f"task_option: expected size (entries of each generator) to be a positive integer, got {size!r}",
            argument="task_option",
        )
    out = {k: v for k, v in settings.items() if k not in OWN_OPTIONS}
    out.update({k: v for k, v in options.items() if k not in OWN_OPTIONS})
    _, config_cls = _registry()[name]
    try:
        config = config_cls(**out, seed=0)
        if callable(getattr(config, "validate", None)):
            config.validate()
    except Exception as exc:  # the dataset's own checks (assertions, ValueError, TypeError)
        raise ParameterError(
            f"task_option: reasoning_gym:{name} refused the settings {_describe_settings(options)}: "
            f"{type(exc).__name__}: {exc} (its settings: {_describe_settings(settings)})",
            argument="task_option",
        ) from None
    return out


def readings(response: str, answer_format: str) -> list[str | None]:
    """The answers ``response`` is read as (module docstring), the best scored: the stripped
    response (``plain``); that and its final answer by the JSONL task's hand rule, normalised
    (``final``; one reading when they agree); the last ``<answer>…</answer>`` tag's stripped
    content, None without one (``tag``)."""
    if answer_format == "tag":
        from reasoning_gym.utils import extract_answer  # type: ignore[import-untyped]

        found: str | None = extract_answer(response)
        return [found]
    whole = response.strip()
    if answer_format == "final":
        from .answers import extract_answer as final_answer
        from .answers import normalize

        last = normalize(final_answer(response))
        return [whole] if last == whole else [whole, last]
    return [whole]


class ReasoningGymTask:
    """A reasoning-gym dataset as a task of the trainer (module docstring).

    Args:
      dataset: the dataset's name in reasoning-gym (``"chain_sum"``).
      options: its settings and ``answer_format`` (``{"min_terms": 2}``; none: the defaults).
      split_seed, heldout_fraction, validation_fraction: the split (:class:`HashSplit`).
    """

    def __init__(
        self,
        dataset: str,
        *,
        options: Mapping[str, Any] | None = None,
        split_seed: int = 0,
        heldout_fraction: float = 0.2,
        validation_fraction: float = 0.0,
    ) -> None:
        self.dataset = check_name(dataset)
        self.name = f"reasoning_gym:{self.dataset}"
        #: the options as given (``to_dict``'s ``options``)
        self.options: dict[str, Any] = dict(options or {})
        #: the dataset config's settings (the options over its defaults)
        self.settings = check_options(self.dataset, self.options)
        self.answer_format: str = self.options.get("answer_format", DEFAULT_ANSWER_FORMAT)
        self.size = int(self.settings.get("size") or DEFAULT_SIZE)
        self.split = HashSplit(split_seed, heldout_fraction, validation_fraction)
        self.split_seed = self.split.split_seed
        self.heldout_fraction = self.split.heldout_fraction
        self.validation_fraction = self.split.validation_fraction
        self.max_new_tokens = MAX_NEW_TOKENS[self.answer_format]
        #: a user's model brings the tokenizer (``config.model``)
        self.tokenizer = None
        self._generators: dict[Side, Any] = {}
        self._drawn: dict[tuple[Side, int], tuple[Problem, Side]] = {}
        self._lists: dict[Side, tuple[list[Problem], int]] = {}
        #: question → the entry that asked it (the verifier's input), shared by the tasks of these settings
        self._entries = _ENTRIES.setdefault((self.dataset, json.dumps(self.settings, sort_keys=True)), {})

    # ---- the generators

    def generator_seed(self, side: Side) -> int:
        """The seed of ``side``'s generator: drawn from ``default_rng([split_seed, 11, stream])``."""
        return int(self.split.rng(11, _STREAM[side]).integers(0, 2**31))

    def _generator(self, side: Side) -> Any:
        if side not in self._generators:
            rg = _reasoning_gym()
            self._generators[side] = rg.create_dataset(
                self.dataset, **{**self.settings, "seed": self.generator_seed(side), "size": self.size}
            )
        return self._generators[side]

    def prompt(self, question: str) -> str:
        """The prompt of a question: the question, a blank line, the answer format's instruction."""
        return f"{question.rstrip()}\n\n{ANSWER_FORMATS[self.answer_format]}"

    def _entry(self, side: Side, index: int) -> tuple[Problem, Side]:
        """Entry ``index`` of ``side``'s generator as a problem, and the side its question hashes to."""
        key = (side, index)
        if key not in self._drawn:
            entry = self._generator(side)[index]
            question = str(entry["question"])
            answer = "" if entry.get("answer") is None else str(entry["answer"])
            solution = f"<answer>{answer}</answer>" if self.answer_format == "tag" else answer
            problem = Problem(self.prompt(question), answer, solution)
            self._entries.setdefault(question.rstrip(), entry)
            self._drawn[key] = (problem, self.split.side(question))
        return self._drawn[key]

    # ---- the splits

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` training problems: entries of the train generator at indices drawn with ``rng``
        whose question is on the train side (with replacement)."""
        out: list[Problem] = []
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 100 * n + 1000:
                raise ParameterError(
                    f"task_option: {self.name}: expected training problems among the {self.size} entries of its "
                    f"generator, found {len(out)} in {tries - 1} draws (raise size, or lower heldout_fraction and "
                    "validation_fraction)",
                    argument="task_option",
                )
            problem, side = self._entry("train", int(rng.integers(0, self.size)))
            if side == "train":
                out.append(problem)
        return out

    def _side_list(self, side: Side, n: int) -> list[Problem]:
        """The first ``n`` distinct questions of ``side``'s generator on that side (cached; a
        longer list extends a shorter one)."""
        found, scanned = self._lists.get(side, ([], 0))
        seen = {p.prompt for p in found}
        while len(found) < n and scanned < self.size:
            problem, on = self._entry(side, scanned)
            scanned += 1
            if on == side and problem.prompt not in seen:
                seen.add(problem.prompt)
                found.append(problem)
        self._lists[side] = (found, scanned)
        return list(found[:n])

    def validation(self, n: int) -> list[Problem]:
        """The first ``n`` distinct validation problems (module docstring); a ParameterError
        naming ``validation_fraction`` when the task has no validation split."""
        self.split.require_validation()
        return self._side_list("validation", n)

    def heldout(self, n: int) -> list[Problem]:
        """The first ``n`` distinct held-out problems (module docstring)."""
        return self._side_list("heldout", n)

    # ---- the verifier

    def entry(self, problem: Problem) -> dict[str, Any]:
        """The reasoning-gym entry ``problem`` came from; a ParameterError naming ``problem``
        for a problem this task did not draw."""
        suffix = f"\n\n{ANSWER_FORMATS[self.answer_format]}"
        prompt = problem.prompt
        found = self._entries.get(prompt[: -len(suffix)]) if prompt.endswith(suffix) else None
        if found is None:
            raise ParameterError(
                f"problem: expected a problem a {self.name} task of these settings drew (sample, validation or "
                f"heldout: its verifier reads the entry), got the prompt {problem.prompt[:80]!r}",
                argument="problem",
            )
        return found

    def score(self, problem: Problem, response: str) -> float:
        """The best ``score_answer(reading, entry)`` over the response's :func:`readings`, whether
        or not it finished (a reading the verifier raises on scores 0)."""
        entry = self.entry(problem)
        best = 0.0
        for answer in readings(response, self.answer_format):
            try:
                value = float(self._generator("train").score_answer(answer, entry))
            except Exception:  # the library's verifier on a model's malformed text: no credit
                continue
            if not math.isfinite(value) or not 0.0 <= value <= 1.0:
                raise ParameterError(
                    f"problem: expected reasoning-gym's score_answer in [0, 1], got {value!r} for {answer!r}",
                    argument="problem",
                )
            best = max(best, value)
        return best

    def reward(self, problem: Problem, response: str, finished: bool) -> float:
        """0 for a response cut short, else :meth:`score` (module docstring)."""
        return self.score(problem, response) if finished else 0.0

    def rewards(self, problems: Sequence[Problem], responses: Sequence[str], finished: Sequence[bool]) -> list[float]:
        """:meth:`reward` of each response."""
        return rewards_of(self.reward, problems, responses, finished)

    # ---- reports

    def describe(self) -> str:
        """``"reasoning-gym chain_sum (min_terms=2)"``."""
        given = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"reasoning-gym {self.dataset}" + (f" ({given})" if given else "")

    def to_dict(self) -> dict[str, Any]:
        """The name, the options as given and the split (nothing else: what identifies the task
        is its name and options, :func:`~comppo_core.rl.gate_direction.task_identity`)."""
        return {
            "name": self.name,
            "options": json.loads(json.dumps(self.options)),
            "split_seed": self.split_seed,
            "heldout_fraction": self.heldout_fraction,
            **({"validation_fraction": self.validation_fraction} if self.validation_fraction else {}),
        }
