"""The tasks the trainer runs, as one registry: ``config.task`` names an entry of :data:`TASKS`.

Each :class:`TaskEntry` is a name, the task class (a :class:`~comppo_core.rl.tasks.base.Task`),
and the :class:`~comppo_core.rl.config.TrainConfig` fields that size it (``sizes``: the
class's argument → the field; the same names are the keys of the task's ``to_dict``, so
``comppo-core evaluate`` reads a saved ``task.json`` back into the fields). The config
checks ``task`` against the registry, :func:`build_task` builds a run's task from it (the
trainer, ``comppo-core evaluate``), and the run's ``task.json`` names it::

    addition         AdditionTask        digits
    chain            ChainTask           chain_digits, chain_steps, chain_filler_*, chain_tail_*
    filler_addition  FillerAdditionTask  digits, addition_filler_*, addition_tail_*
    *.jsonl          JsonlTask           (the file is config.task; needs config.model)
    *.hf.json        HFDatasetTask       (a saved HF dataset and a reward; needs config.model)

A task is built as ``cls(**sizes, split_seed=..., heldout_fraction=..., validation_fraction=...)``
(a file task gets the path first, and ``max_new_tokens``). A new task is a module of this
package with its class, and here its import and one :class:`TaskEntry` in :data:`TASKS`.

Importing this package imports no torch (the task modules need NumPy alone), so the
command line reads the registry for ``--help``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ...errors import ParameterError
from .addition import AdditionTask
from .base import PivotalTask, Problem, Task, Tokenizer
from .chain import ChainTask
from .filler_addition import FillerAdditionTask
from .hf_dataset import HFDatasetTask
from .jsonl import JsonlTask

if TYPE_CHECKING:
    from ..config import TrainConfig

__all__ = [
    "TASKS",
    "PivotalTask",
    "Problem",
    "Task",
    "TaskEntry",
    "Tokenizer",
    "build_task",
    "size_fields",
    "task_entry",
]


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    """One registered task.

    Attributes:
      name: ``config.task`` (a file task: the name in its ``to_dict``).
      about: a few words for ``--help``.
      cls: the task class (any callable that returns a :class:`~comppo_core.rl.tasks.base.Task`).
      sizes: the class's size arguments → the TrainConfig fields that give them (the keys of
        its ``to_dict`` too).
      file_suffix: selected by a ``config.task`` path ending so instead of by ``name``; the
        path is the class's first argument, ``config.max_new_tokens`` its ``max_new_tokens``.
      needs_model: has no tokenizer of its own: ``config.model`` must give one.
      carries: its demonstrations can forget carries (``sft_carry_noise``).
    """

    name: str
    about: str
    cls: Callable[..., Task]
    sizes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    file_suffix: str | None = None
    needs_model: bool = False
    carries: bool = False

    def build(self, config: TrainConfig) -> Task:
        """The task of ``config``: its size fields and split settings."""
        args: dict[str, Any] = {arg: getattr(config, field) for arg, field in self.sizes.items()}
        split = {
            "split_seed": config.split_seed,
            "heldout_fraction": config.heldout_fraction,
            "validation_fraction": config.validation_fraction,
        }
        if self.file_suffix is not None:
            return self.cls(config.task, max_new_tokens=config.max_new_tokens, **args, **split)
        return self.cls(**args, **split)


def _filler(prefix: str) -> dict[str, str]:
    return {name: f"{prefix}_{name}" for name in ("filler_min", "filler_max", "tail_min", "tail_max")}


#: The registry: name → entry (the order of ``--help``).
TASKS: dict[str, TaskEntry] = {
    e.name: e
    for e in (
        TaskEntry(
            "addition",
            "worked addition (comppo_core.rl.tasks.addition)",
            AdditionTask,
            {"digits": "digits"},
            carries=True,
        ),
        TaskEntry(
            "chain",
            "recall a digit after a random filler (comppo_core.rl.tasks.chain)",
            ChainTask,
            {"digits": "chain_digits", "steps": "chain_steps", **_filler("chain")},
        ),
        TaskEntry(
            "filler_addition",
            "worked addition between random fillers (comppo_core.rl.tasks.filler_addition)",
            FillerAdditionTask,
            {"digits": "digits", **_filler("addition")},
            carries=True,
        ),
        TaskEntry(
            "jsonl",
            'a .jsonl file of {"prompt", "answer"} rows (comppo_core.rl.tasks.jsonl; needs model)',
            JsonlTask,
            file_suffix=".jsonl",
            needs_model=True,
        ),
        TaskEntry(
            "hf_dataset",
            "a .hf.json spec: a saved Hugging Face dataset and a reward function (comppo_core.rl.tasks.hf_dataset; "
            "needs model)",
            HFDatasetTask,
            file_suffix=".hf.json",
            needs_model=True,
        ),
    )
}


def task_entry(task: str) -> TaskEntry:
    """The entry ``config.task`` selects: a name, or a path with an entry's ``file_suffix``;
    anything else is a :class:`~comppo_core.errors.ParameterError` naming ``task``."""
    if isinstance(task, str):
        entry = TASKS.get(task)
        if entry is not None and entry.file_suffix is None:
            return entry
        for entry in TASKS.values():
            if entry.file_suffix is not None and task.endswith(entry.file_suffix):
                return entry
    names = [e.name for e in TASKS.values() if e.file_suffix is None]
    files = [f"a path to a {e.file_suffix} file" for e in TASKS.values() if e.file_suffix is not None]
    raise ParameterError(f"task: expected {' or '.join([', '.join(names), *files])}, got {task!r}", argument="task")


def build_task(config: TrainConfig) -> Task:
    """The task of ``config`` (:meth:`TaskEntry.build` of its entry), as the trainer and
    ``comppo-core evaluate`` build it. Imports no torch."""
    return task_entry(config.task).build(config)


def size_fields() -> tuple[str, ...]:
    """Every TrainConfig field that sizes a registered task, once each, in registry order."""
    return tuple(dict.fromkeys(field for e in TASKS.values() for field in e.sizes.values()))
