"""A user's task: a Hugging Face dataset saved to disk and a reward function named by the user.

**Spec file** (``config.task``, a path ending ``.hf.json``)::

    {"dataset": "gsm8k_saved",              a directory datasets.save_to_disk wrote
     "reward": "my_rewards:correct",         module:function, or path/to/file.py:function
     "prompt_column": "question",            optional, default "prompt"
     "answer_column": "answer",              optional, default "answer" (may be absent)
     "split": "train"}                       optional: which split of a saved DatasetDict

Relative paths (the dataset, a ``.py`` file of the reward) are read from the spec file's
folder. In Python the task is also ``HFDatasetTask(DIR, reward="module:function", ...)``
with the dataset directory itself; ``config.task`` takes spec files only.

**Rows.** ``datasets.load_from_disk(dataset)`` (a ``DatasetDict``: its ``split``, or its only
split); each row is a problem whose prompt is the row's prompt column (a non-empty string)
and whose answer is ``str`` of its answer column ("" without one). Rows are keyed by their
prompt: two rows with the same prompt but other columns different are refused (the reward
function could not tell them apart).

**Split** exactly as the JSONL task's (:mod:`comppo_core.rl.tasks.jsonl`): by
``blake2b(f"{split_seed}:{prompt}")``, held-out rows in a fixed shuffled order, a validation
split with ``validation_fraction > 0``, training rows drawn uniformly with replacement.

**Verifier.** 0.0 for a response that did not stop at EOS; the others get the named reward
function's value, called once per batch, the same way on both engines (the package's
trainer and ``comppo_core.integrations.trl``)::

    reward(completions=[response text, ...], prompts=[prompt text, ...], **columns) -> [number, ...]

``columns``: every column of the dataset but the prompt column, one value per response, as
TRL passes a dataset's columns to its reward functions. A function written for TRL
(``def f(completions, answer, **kwargs)``) is such a function: it reads text completions
and must accept ``**kwargs``. It returns one number per response (an error otherwise).

The task compares no answers itself. **A built-in reward** for a dataset with an answer
column named ``answer``: ``"reward": "comppo_core.rl.tasks.answers:math_answer"`` gives 1.0
where the response's final answer is the row's answer by math-verify (the hand rule
without it; :mod:`comppo_core.rl.tasks.answers`, the JSONL task's check), else 0.0; a
GSM8K-style answer ``"... #### 72"`` reads as ``72``.

Loading the dataset needs the ``datasets`` package (in the ``[trl]`` extra).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ParameterError
from .base import HashSplit, Problem

__all__ = ["SPEC_SUFFIX", "HFDatasetTask", "load_reward"]

#: A spec file's name ends so (``config.task``).
SPEC_SUFFIX = ".hf.json"
#: Response budget when the config gives none (a dataset states no response length).
DEFAULT_MAX_NEW_TOKENS = 256
#: The keys of a spec file.
SPEC_KEYS = ("dataset", "reward", "prompt_column", "answer_column", "split")


def load_reward(name: str, base: Path | None = None) -> Callable[..., Any]:
    """The function ``name`` names: ``"module:function"`` (imported) or ``"file.py:function"``
    (the file, relative to ``base``, loaded as a module). A ParameterError naming ``task``
    when it cannot be found."""
    module_name, sep, attr = name.rpartition(":") if isinstance(name, str) else ("", "", "")
    if not sep or not module_name or not attr:
        raise ParameterError(
            f"task: reward: expected 'module:function' or 'file.py:function', got {name!r}", argument="task"
        )
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            path = path if path.is_absolute() or base is None else base / path
            spec = importlib.util.spec_from_file_location(f"comppo_reward_{path.stem}", path)
            if spec is None or spec.loader is None or not path.is_file():
                raise ParameterError(f"task: reward: expected a Python file, got {str(path)!r}", argument="task")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # picklable by reference, as an imported module's functions
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[spec.name]
                raise
        else:
            module = importlib.import_module(module_name)
    except ParameterError:
        raise
    except Exception as exc:  # an import error, or any error the module raises while loading
        raise ParameterError(
            f"task: reward: cannot load {module_name!r}: {type(exc).__name__}: {exc}", argument="task"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ParameterError(
            f"task: reward: expected a function {attr!r} in {module_name!r}, found none", argument="task"
        )
    return fn  # type: ignore[no-any-return]


class HFDatasetTask:
    """The rows of a saved Hugging Face dataset, verified by a named reward function (module docstring).

    Args:
      path: a ``.hf.json`` spec file, or (with ``reward``) the dataset directory itself.
      reward, prompt_column, answer_column, split: the spec's keys, with a dataset directory.
      split_seed, heldout_fraction, validation_fraction: the split, as the JSONL task's.
      max_new_tokens: the response budget (:data:`DEFAULT_MAX_NEW_TOKENS` when None).
    """

    name = "hf_dataset"

    def __init__(
        self,
        path: str | Path,
        *,
        reward: str | None = None,
        prompt_column: str = "prompt",
        answer_column: str = "answer",
        split: str | None = None,
        split_seed: int = 0,
        heldout_fraction: float = 0.2,
        max_new_tokens: int | None = None,
        validation_fraction: float = 0.0,
    ) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            if reward is None:
                raise ParameterError(
                    f"task: {str(self.path)!r}: expected reward='module:function' with a dataset directory, got None",
                    argument="task",
                )
            spec: dict[str, Any] = {"dataset": str(self.path), "reward": reward, "split": split}
            spec.update(prompt_column=prompt_column, answer_column=answer_column)
            base = Path.cwd()
        else:
            given = {"reward": reward is not None, "split": split is not None}
            given.update(prompt_column=prompt_column != "prompt", answer_column=answer_column != "answer")
            named = [key for key, value in given.items() if value]
            if named:
                raise ParameterError(
                    f"task: {str(self.path)!r}: expected {named[0]} in the spec file, got it as an argument too "
                    "(arguments name a dataset directory's settings)",
                    argument="task",
                )
            spec = read_spec(self.path)
            base = self.path.parent
        self.dataset = str(Path(spec["dataset"]) if Path(spec["dataset"]).is_absolute() else base / spec["dataset"])
        self.reward_name = str(spec["reward"])
        self.prompt_column = str(spec.get("prompt_column") or "prompt")
        self.answer_column = str(spec.get("answer_column") or "answer")
        self.dataset_split = spec.get("split")
        self.reward_fn = load_reward(self.reward_name, base)
        #: the train / validation / held-out split of the rows (key: the prompt)
        self.split = HashSplit(split_seed, heldout_fraction, validation_fraction)
        self.split_seed = self.split.split_seed
        self.heldout_fraction = self.split.heldout_fraction
        self.validation_fraction = self.split.validation_fraction
        self.max_new_tokens = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
        #: a user's model brings the tokenizer (``config.model``)
        self.tokenizer = None
        #: the rows' other columns, by prompt (what the reward function reads)
        self.columns: dict[str, dict[str, Any]] = {}
        self.rows = self._read()
        sides = self.split.split_file_rows(self.rows, str(self.path))
        self.train_rows, self.heldout_rows, self.validation_rows = sides["train"], sides["heldout"], sides["validation"]

    def _read(self) -> list[Problem]:
        where = str(self.path)
        try:
            import datasets
        except ImportError:
            raise ParameterError(
                f"task: {where!r}: a saved Hugging Face dataset needs the datasets package: "
                "pip install 'comppo-core[trl]' (or datasets)",
                argument="task",
            ) from None
        try:
            loaded = datasets.load_from_disk(self.dataset)
        except Exception as exc:  # datasets raises FileNotFoundError and others of its own
            raise ParameterError(
                f"task: {where!r}: expected a dataset saved by save_to_disk in {self.dataset!r}: {exc}", argument="task"
            ) from None
        if isinstance(loaded, datasets.DatasetDict):
            names = list(loaded)
            if self.dataset_split is None and len(names) == 1:
                self.dataset_split = names[0]
            if self.dataset_split not in loaded:
                raise ParameterError(
                    f"task: {where!r}: split: expected one of {names}, got {self.dataset_split!r}", argument="task"
                )
            loaded = loaded[self.dataset_split]
        if self.prompt_column not in loaded.column_names:
            raise ParameterError(
                f"task: {where!r}: expected a column {self.prompt_column!r} of prompts, got columns "
                f"{loaded.column_names}",
                argument="task",
            )
        out: list[Problem] = []
        for k, row in enumerate(loaded.to_list()):
            prompt = row.pop(self.prompt_column)
            if not isinstance(prompt, str) or not prompt:
                raise ParameterError(
                    f"task: {where!r} row {k}: expected {self.prompt_column} to be a non-empty string, got {prompt!r}",
                    argument="task",
                    row=k,
                )
            seen = self.columns.setdefault(prompt, row)
            if seen != row:
                raise ParameterError(
                    f"task: {where!r} row {k}: expected one row per prompt (or identical repeats), got a second row "
                    f"with other columns for the prompt {prompt!r}",
                    argument="task",
                    row=k,
                )
            answer = row.get(self.answer_column)
            out.append(Problem(prompt, "" if answer is None else str(answer), ""))
        if not out:
            raise ParameterError(f"task: {where!r}: expected at least one row, got an empty dataset", argument="task")
        return out

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` training rows drawn uniformly with replacement with ``rng``."""
        return [self.train_rows[int(i)] for i in rng.integers(0, len(self.train_rows), size=n)]

    def heldout(self, n: int) -> list[Problem]:
        """The first ``n`` held-out rows of the fixed order (all of them if fewer)."""
        return self.heldout_rows[:n]

    def validation(self, n: int, seed: int = 0) -> list[Problem]:
        """The first ``n`` validation rows in a fixed order, as the JSONL task's; a
        ParameterError naming ``validation_fraction`` without a validation split."""
        self.split.require_validation()
        order = self.split.rng(seed, 8).permutation(len(self.validation_rows))
        return [self.validation_rows[i] for i in order[:n]]

    def reward(self, problem: Problem, response: str, finished: bool) -> float:
        """:meth:`rewards` of one response."""
        return self.rewards([problem], [response], [finished])[0]

    def rewards(self, problems: Sequence[Problem], responses: Sequence[str], finished: Sequence[bool]) -> list[float]:
        """The named function's rewards of the batch (module docstring), 0.0 where not finished."""
        if not problems:
            return []
        missing = [p.prompt for p in problems if p.prompt not in self.columns]
        if missing:
            raise ParameterError(
                f"problems: expected prompts of the dataset {self.dataset!r}, got {missing[0]!r}", argument="problems"
            )
        rows = [self.columns[p.prompt] for p in problems]
        columns = {key: [row[key] for row in rows] for key in rows[0]}
        values = self.reward_fn(completions=list(responses), prompts=[p.prompt for p in problems], **columns)
        values = list(values)
        if len(values) != len(problems):
            raise ParameterError(
                f"task: reward: {self.reward_name} returned {len(values)} rewards for {len(problems)} responses",
                argument="task",
            )
        out = []
        for v, fin in zip(values, finished):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(float(v)):
                raise ParameterError(
                    f"task: reward: {self.reward_name} returned {v!r}, expected a number", argument="task"
                )
            out.append(float(v) if fin else 0.0)
        return out

    def describe(self) -> str:
        """The dataset directory's name."""
        return Path(self.dataset).name

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "dataset": self.dataset,
            "reward": self.reward_name,
            "rows": len(self.rows),
            "split_seed": self.split_seed,
            "heldout_fraction": self.heldout_fraction,
            **({"validation_fraction": self.validation_fraction} if self.validation_fraction else {}),
        }


def read_spec(path: Path) -> dict[str, Any]:
    """The spec file's object (module docstring); clear errors naming the file."""
    where = str(path)
    if not path.is_file():
        raise ParameterError(
            f"task: expected a {SPEC_SUFFIX} file, got {where!r}, which is not a file", argument="task"
        )
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ParameterError(
            f"task: {where!r}: expected a JSON object, got an unreadable file: {exc}", argument="task"
        ) from None
    if not isinstance(spec, dict):
        raise ParameterError(f"task: {where!r}: expected a JSON object, got {type(spec).__name__}", argument="task")
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise ParameterError(
            f"task: {where!r}: expected the keys {list(SPEC_KEYS)}, got {unknown[0]!r}", argument="task"
        )
    for key in ("dataset", "reward"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise ParameterError(
                f"task: {where!r}: expected {key} to be a non-empty string, got {spec.get(key)!r}", argument="task"
            )
    for key in ("prompt_column", "answer_column", "split"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise ParameterError(f"task: {where!r}: expected {key} to be a string, got {spec[key]!r}", argument="task")
    return spec
