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
    reasoning_gym:NAME  ReasoningGymTask task_options (reasoning-gym's dataset NAME; needs config.model)

A task is built as ``cls(**sizes, split_seed=..., heldout_fraction=..., validation_fraction=...)``
(a file task gets the path first, and ``max_new_tokens``). A new task is a module of this
package with its class, and here its import and one :class:`TaskEntry` in :data:`TASKS`.

**Families.** An entry with ``family=True`` (``reasoning_gym``) stands for many tasks,
``config.task = "reasoning_gym:NAME"``: :func:`task_entry` (and ``TASKS.get``,
``TASKS[...]``, ``in TASKS``) gives the **member** entry of that name, the same object
each time, named ``"reasoning_gym:NAME"`` (its task's ``to_dict`` name) and building
``cls(NAME, **sizes, ...)``; :func:`task_entry` also checks that NAME exists
(``check_member``). Iterating :data:`TASKS` gives the family entry itself. A task that
takes options (``config.task_options``, ``--task-option KEY=VALUE``) names the field
``task_options`` among its sizes, and its entry's ``check_options`` checks them when the
config is made; every other task refuses options.

Importing this package imports no torch (the task modules need NumPy alone; the
reasoning-gym package is imported only for a ``reasoning_gym:NAME`` task), so the command
line reads the registry for ``--help``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import ParameterError
from .addition import AdditionTask
from .base import PivotalTask, Problem, Task, TaskSettings, Tokenizer
from .chain import ChainTask
from .filler_addition import FillerAdditionTask
from .hf_dataset import HFDatasetTask
from .jsonl import JsonlTask
from .reasoning_gym import ReasoningGymTask, check_name, check_options

__all__ = [
    "TASKS",
    "PivotalTask",
    "Registry",
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
      family: stands for the tasks ``f"{name}:MEMBER"`` (module docstring); ``cls`` takes
        MEMBER as its first argument.
      member: a family's member entry: the MEMBER it builds (None otherwise).
      check_member: a family's check of a MEMBER name (a ParameterError naming ``task``).
      check_options: a task taking ``task_options``: their check (a ParameterError naming
        ``task_option``), given the MEMBER (None) and the options.
    """

    name: str
    about: str
    cls: Callable[..., Task]
    sizes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    file_suffix: str | None = None
    needs_model: bool = False
    carries: bool = False
    family: bool = False
    member: str | None = None
    check_member: Callable[[str], Any] | None = None
    check_options: Callable[[str | None, Mapping[str, Any]], Any] | None = None

    @property
    def takes_options(self) -> bool:
        """Whether the task reads ``config.task_options``."""
        return "task_options" in self.sizes.values()

    @property
    def spelling(self) -> str:
        """How ``config.task`` names it: the name, ``*.jsonl``, ``reasoning_gym:NAME``."""
        if self.file_suffix is not None:
            return "*" + self.file_suffix
        return f"{self.name}:NAME" if self.family else self.name

    def build(self, config: TaskSettings) -> Task:
        """The task of ``config``: its size fields and split settings."""
        args: dict[str, Any] = {arg: getattr(config, field) for arg, field in self.sizes.items()}
        split = {
            "split_seed": config.split_seed,
            "heldout_fraction": config.heldout_fraction,
            "validation_fraction": config.validation_fraction,
        }
        if self.file_suffix is not None:
            return self.cls(config.task, max_new_tokens=config.max_new_tokens, **args, **split)
        if self.family:
            raise ParameterError(
                f"task: expected {self.spelling} (a member of the {self.name} family), got {config.task!r}",
                argument="task",
            )
        return self.cls(**args, **split)


#: The member entries made so far: (family, member) → entry.
_MEMBERS: dict[tuple[str, str], TaskEntry] = {}


def _member(family: TaskEntry, member: str) -> TaskEntry:
    """The member entry ``family.name:member`` (one object per name)."""
    key = (family.name, member)
    if key not in _MEMBERS:
        _MEMBERS[key] = dataclasses.replace(
            family,
            name=f"{family.name}:{member}",
            cls=functools.partial(family.cls, member),
            family=False,
            member=member,
            check_member=None,
        )
    return _MEMBERS[key]


class Registry(dict[str, TaskEntry]):
    """The registry's dict (:data:`TASKS`): a family's member name (``"reasoning_gym:NAME"``)
    reads as its member entry in ``get``, ``[...]`` and ``in``, unchecked (:func:`task_entry`
    checks NAME); iterating gives the registered entries."""

    def member(self, task: object) -> TaskEntry | None:
        """The member entry ``task`` names (``"family:NAME"``), or None."""
        if not isinstance(task, str):
            return None
        family, sep, name = task.partition(":")
        entry = dict.get(self, family)
        if not sep or not name or entry is None or not entry.family:
            return None
        return _member(entry, name)

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        found = dict.get(self, key)
        if found is not None:
            return found
        member = self.member(key)
        return default if member is None else member

    def __getitem__(self, key: str) -> TaskEntry:
        found = self.get(key)
        if found is None:
            raise KeyError(key)
        return found  # type: ignore[no-any-return]

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or self.member(key) is not None


def _filler(prefix: str) -> dict[str, str]:
    return {name: f"{prefix}_{name}" for name in ("filler_min", "filler_max", "tail_min", "tail_max")}


def _check_reasoning_gym_options(member: str | None, options: Mapping[str, Any]) -> None:
    assert member is not None
    check_options(member, options)


#: The registry: name → entry (the order of ``--help``).
TASKS: Registry = Registry(
    (e.name, e)
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
        TaskEntry(
            "reasoning_gym",
            "reasoning-gym's dataset NAME, its settings as --task-option KEY=VALUE "
            '(comppo_core.rl.tasks.reasoning_gym; needs model and pip install "comppo-core[reasoning-gym]")',
            ReasoningGymTask,
            {"options": "task_options"},
            needs_model=True,
            family=True,
            check_member=check_name,
            check_options=_check_reasoning_gym_options,
        ),
    )
)


def task_entry(task: str) -> TaskEntry:
    """The entry ``config.task`` selects: a name, a family's member (``reasoning_gym:NAME``,
    NAME checked: the family's ``check_member``), or a path with an entry's ``file_suffix``;
    anything else is a :class:`~comppo_core.errors.ParameterError` naming ``task``."""
    if isinstance(task, str):
        member = TASKS.member(task)
        if member is not None:
            name, _, rest = task.partition(":")
            family = dict.get(TASKS, name)
            if family is not None and family.check_member is not None:
                family.check_member(rest)
            return member
        entry = dict.get(TASKS, task)
        if entry is not None and entry.file_suffix is None and not entry.family:
            return entry
        for entry in TASKS.values():
            if entry.file_suffix is not None and task.endswith(entry.file_suffix):
                return entry
    names = [e.spelling for e in TASKS.values() if e.file_suffix is None]
    files = [f"a path to a {e.file_suffix} file" for e in TASKS.values() if e.file_suffix is not None]
    raise ParameterError(f"task: expected {' or '.join([', '.join(names), *files])}, got {task!r}", argument="task")


def build_task(config: TaskSettings) -> Task:
    """The task of ``config`` (:meth:`TaskEntry.build` of its entry), as the trainer and
    ``comppo-core evaluate`` build it. Imports no torch."""
    return task_entry(config.task).build(config)


def size_fields() -> tuple[str, ...]:
    """Every TrainConfig field that sizes a registered task, once each, in registry order."""
    return tuple(dict.fromkeys(field for e in TASKS.values() for field in e.sizes.values()))
