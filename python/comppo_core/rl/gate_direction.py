"""The direction of a run's gates (``TrainConfig.gate_direction``): a keyword, or a diagnosis.

``gate_direction`` is ``"as_is"`` (the gate source's own mapping), ``"inverted"`` (its mirror
image, ``GateParams.invert``), ``"none"`` (no direction: only an arm whose gates have none may
run), or the path of a ``diagnosis.json`` written by ``comppo-core diagnose``, whose
recommendation for the arm's gate source applies (:func:`recommended_direction`). A config
records such a path as ``PATH#sha256=HEX`` (:func:`pinned_diagnosis`), so that a file rewritten
since the settings were made is refused instead of changing the gates' direction silently.
The field replaces ``gate_invert``: :func:`upgrade_fields` reads a record written with it,
and :data:`DEFAULT_GATE_DIRECTION` (the field's default, ``"as_is"``) is told apart from an
``"as_is"`` given explicitly, so that ``gate_invert=True`` beside an explicit ``"as_is"`` is
refused as the contradiction it is.

**A diagnosis applies to the task it measured.** :func:`check_diagnosis_task` compares the
task a diagnosis.json records (``"settings"["task"]``, the task's ``to_dict``) with the run's
(:func:`config_task_record`): a different task is a ParameterError; a diagnosis that records
no task, or a run whose task is not known (a TRL trainer without a task's reward function),
cannot be compared and gets a :class:`DiagnosisTaskWarning`. Only the task's identity is
compared (:func:`task_identity`: its name and sizes, a file task's file name), not its split
(which problems are held out) nor the policy: a diagnosis of another warm start of the same
task applies (the direction can differ between warm starts: docs/experiments/diagnose.md).

**Only the direction applies, not the recommended gate range.** The diagnosis does not tune
the range: with a direction it recommends the package default (the ``GateParams`` defaults
the diagnosis was made with) and with ``none`` the constant gate ``[1, 1]``, which an arm
whose gates have a direction refuses anyway (naming the constant-gate arm to run instead).
Applying it would only reset a run's ``gate_low`` / ``gate_high`` to those defaults, so a
run's range is its own settings'.

Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from ..errors import ParameterError
from .core.gate_sources import GATE_DIRECTIONS
from .runs.run_dir import absolute

if TYPE_CHECKING:
    from .tasks.base import TaskSettings

__all__ = [
    "DEFAULT_GATE_DIRECTION",
    "DIAGNOSIS_DIGEST",
    "DiagnosisTaskWarning",
    "check_diagnosis_task",
    "checked_gate_direction",
    "config_task_record",
    "direction_of_gate_invert",
    "given_gate_direction",
    "pinned_diagnosis",
    "recommended_direction",
    "task_identity",
    "upgrade_fields",
]


class _DefaultDirection(str):
    """``"as_is"`` as a config's default ``gate_direction``: equal to ``"as_is"`` and written
    as it, but told apart from an ``"as_is"`` the user gave (:func:`given_gate_direction`)."""

    __slots__ = ()


#: The default of ``TrainConfig.gate_direction`` and ``CompPOConfig.gate_direction``: the
#: string ``"as_is"``, of a type of its own so that an explicit ``"as_is"`` is not mistaken
#: for it (``gate_invert=True`` with an explicit ``"as_is"`` is a contradiction, refused).
DEFAULT_GATE_DIRECTION: str = _DefaultDirection("as_is")


def given_gate_direction(value: Any) -> Any:
    """``value`` (a config's ``gate_direction``), or None when it is the default
    :data:`DEFAULT_GATE_DIRECTION` rather than a value the user gave."""
    return None if isinstance(value, _DefaultDirection) else value


def direction_of_gate_invert(
    invert: Any,
    direction: Any,
    *,
    argument: str = "gate_invert",
    shown: str = "",
    instead: str = "gate_invert is replaced by gate_direction: give that alone",
) -> str:
    """The ``gate_direction`` an old ``gate_invert`` value means, or a ParameterError naming
    ``argument`` when it is not a bool or contradicts ``direction``, a ``gate_direction``
    given too (None: not given; :func:`given_gate_direction`). ``shown`` prefixes the value
    in the message and ``instead`` says what to do (``CompPOConfig`` checks
    ``gate_params.invert`` so: ``argument="gate_params"``, ``shown="invert="``)."""
    if not isinstance(invert, bool):
        raise ParameterError(
            f"{argument}: expected a bool (replaced by gate_direction), got {shown}{invert!r}", argument=argument
        )
    old = "inverted" if invert else "as_is"
    if direction is not None and direction != old:
        raise ParameterError(
            f"{argument}: {shown}{invert!r} means gate_direction={old!r}, but gate_direction={str(direction)!r} is "
            f"given too ({instead})",
            argument=argument,
        )
    return old


def checked_gate_direction(value: Any) -> str:
    """A config's ``gate_direction`` as it records it: a keyword of
    :data:`~comppo_core.rl.core.gate_sources.GATE_DIRECTIONS` as it is (the default kept as
    :data:`DEFAULT_GATE_DIRECTION`), the path of a diagnosis.json pinned
    (:func:`pinned_diagnosis`); anything else (not a string, blank) is a ParameterError
    naming ``gate_direction``."""
    if not isinstance(value, str) or not value.strip():
        raise ParameterError(
            f"gate_direction: expected one of {', '.join(map(repr, GATE_DIRECTIONS))} or the path of a "
            f"diagnosis.json, got {value!r}",
            argument="gate_direction",
        )
    if value in GATE_DIRECTIONS:
        return value
    return pinned_diagnosis(value)


def upgrade_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A saved config's fields (a ``config.json``, a compare's recorded settings) as this
    version names them, in a new dict: ``gate_invert`` (before ``gate_direction``) becomes
    ``gate_direction`` ``"inverted"`` (True) or ``"as_is"`` (False). Anything else is kept
    as it is (:meth:`TrainConfig.from_dict` then checks it)."""
    out = dict(data)
    if "gate_invert" in out:
        invert = out.pop("gate_invert")
        out["gate_direction"] = direction_of_gate_invert(invert, out.get("gate_direction"))
    return out


def recommended_direction(gate_direction: str, arm: str, statistic: str | None = None) -> str:
    """The direction (:data:`~comppo_core.rl.core.gate_sources.GATE_DIRECTIONS`) that
    ``gate_direction`` gives the gates of ``arm``.

    ``"as_is"``, ``"inverted"`` or ``"none"`` is itself; anything else is the path of a
    ``diagnosis.json`` written by ``comppo-core diagnose`` (a JSON object), read now:

    * an arm whose gates map the concentration (and ``tac_fixed``/``ppo_fixed``, whose constant
      is the concentration gates' batch mean) takes its ``"direction"``, the recommendation
      for the attention statistic the diagnosis names (``"statistic"``, or
      ``"recommendation"["statistic"]``), which must be ``statistic`` (the run's) when given;
    * an arm whose gates map a policy statistic (``comppo_policy_entropy``,
      ``comppo_token_nll``) takes ``"directions"[statistic]`` (``"policy_entropy"``,
      ``"token_nll"``), in that source's own orientation (``as_is``: an uncertain token, a low
      gate); a diagnosis without it is refused, not read as the concentration's;
    * an arm with no gates reads nothing from it (the file must still be a diagnosis).

    ``"none"`` (no direction: the interval covers chance) is refused for an arm whose gates
    have a direction (:attr:`~comppo_core.rl.core.gate_sources.GateSource.directed`), naming
    the arm with the same critic and a constant gate to run instead. Every refusal is a
    :class:`~comppo_core.errors.ParameterError` naming ``gate_direction``."""
    from .core.arms import ARMS  # torch-free, one-way (arms imports nothing from here)

    name = "gate_direction"
    spec = ARMS[arm]
    source = spec.gate_source
    direction: Any
    if gate_direction in GATE_DIRECTIONS:
        direction, where = gate_direction, f"gate_direction={gate_direction!r}"
    else:
        path = gate_direction.partition(DIAGNOSIS_DIGEST)[0]
        data = _read_diagnosis(path)
        where = f"the diagnosis {path!r}"
        if source.policy_statistic is None:
            direction = data.get("direction")
            key = "'direction'"
            recommendation = data.get("recommendation")
            measured = data.get(
                "statistic", recommendation.get("statistic") if isinstance(recommendation, dict) else None
            )
            if source.reads_concentration and statistic is not None and measured not in (None, statistic):
                raise ParameterError(
                    f"{name}: {where} recommends a direction for the concentration statistic {measured!r}, but the "
                    f"{arm} arm's gates read statistic={statistic!r}; diagnose with --statistic {statistic} or run "
                    f"with --statistic {measured}",
                    argument=name,
                )
        else:
            directions = data.get("directions")
            if not isinstance(directions, dict) or source.policy_statistic not in directions:
                raise ParameterError(
                    f"{name}: {where} recommends no direction for the {source.policy_statistic} gates of the {arm} "
                    f"arm (expected 'directions': {{{source.policy_statistic!r}: ...}}; its 'direction' is the "
                    "concentration's); pass --gate-direction as_is or inverted",
                    argument=name,
                )
            direction = directions[source.policy_statistic]
            key = f"'directions'[{source.policy_statistic!r}]"
        if direction not in GATE_DIRECTIONS:
            raise ParameterError(
                f"{name}: {where}: expected {key} to be one of {', '.join(map(repr, GATE_DIRECTIONS))}, "
                f"got {direction!r}",
                argument=name,
            )
    if direction == "none" and source.directed:
        what = source.policy_statistic or "concentration"
        instead = spec.constant_gate_arm
        raise ParameterError(
            f"{name}: {where} gives the {what} gates no direction, so the {arm} arm's gates would order tokens "
            f"by noise; run {instead} (the same critic with a constant gate) instead, or pass --gate-direction "
            "as_is or inverted to override",
            argument=name,
        )
    return str(direction)


class DiagnosisTaskWarning(UserWarning):
    """A diagnosis.json given as ``gate_direction`` whose task cannot be compared with the
    run's (:func:`check_diagnosis_task`): its direction is applied unchecked."""


#: The keys of a task's ``to_dict`` that say which of its problems a run holds out, not what
#: the task is (a file task's ``rows`` follow from its file): :func:`task_identity` drops them.
_SPLIT_KEYS = ("split_seed", "heldout_fraction", "validation_fraction", "rows")

#: The keys of a task's ``to_dict`` that hold a path: compared by the file's name alone (a
#: diagnosis records the path as it was given to ``diagnose``, perhaps relative to another
#: directory).
_PATH_KEYS = ("path", "dataset")


def task_identity(record: Mapping[str, Any]) -> dict[str, Any]:
    """What makes a task the task it is, from its ``to_dict`` (``record``): every key but the
    split's (``split_seed``, ``heldout_fraction``, ``validation_fraction``, a file's
    ``rows``), a path (``path``, ``dataset``) by its file name::

        {"name": "chain", "digits": 8, "steps": 8, "filler_min": 0, ...}
        {"name": "jsonl", "path": "addition2.jsonl"}"""
    return {
        key: (PurePath(str(value)).name if key in _PATH_KEYS else value)
        for key, value in record.items()
        if key not in _SPLIT_KEYS
    }


def config_task_record(config: TaskSettings) -> dict[str, Any]:
    """The task of ``config`` as its ``to_dict`` would name it, without building it (a file
    task's file is not read): ``name`` and the sizes of a registered task (the keys of
    :attr:`~comppo_core.rl.tasks.TaskEntry.sizes`, the TrainConfig fields' values), or
    ``name`` and ``path`` of a file task."""
    from .tasks import task_entry  # torch-free

    entry = task_entry(config.task)
    if entry.file_suffix is not None:
        return {"name": entry.name, "path": config.task}
    return {"name": entry.name, **{arg: getattr(config, field) for arg, field in entry.sizes.items()}}


def _describe_task(identity: Mapping[str, Any]) -> str:
    rest = ", ".join(f"{k}={v!r}" for k, v in identity.items() if k != "name")
    return f"{identity.get('name')!s}" + (f" ({rest})" if rest else "")


def check_diagnosis_task(gate_direction: str, task: Mapping[str, Any] | None, *, run: str = "this run") -> None:
    """Refuse a diagnosis made on another task than the run's.

    ``gate_direction`` a keyword: nothing to check. Otherwise the diagnosis.json it names
    (``PATH`` or ``PATH#sha256=HEX``) is read, and its task (``"settings"["task"]``, what
    ``comppo-core diagnose`` records) is compared with ``task``, the run's task record (a
    task's ``to_dict``, or :func:`config_task_record`), by :func:`task_identity`, over the
    keys both hold (``name`` always):

    * a difference is a :class:`~comppo_core.errors.ParameterError` naming ``gate_direction``
      (which keys differ, and what to do: diagnose the run's task, or give the direction as
      a keyword);
    * a diagnosis that records no task, or ``task`` None or without a ``name`` (the run's task
      is not known: a TRL trainer whose ``reward_funcs`` hold no task's reward function),
      cannot be compared:
      a :class:`DiagnosisTaskWarning`, and the direction applies unchecked.

    ``run`` names the run in the messages."""
    if gate_direction in GATE_DIRECTIONS:
        return
    path = gate_direction.partition(DIAGNOSIS_DIGEST)[0]
    data = _read_diagnosis(path)
    settings = data.get("settings")
    recorded = settings.get("task") if isinstance(settings, dict) else None
    if not isinstance(recorded, dict) or "name" not in recorded:
        warnings.warn(
            f"gate_direction: the diagnosis {path!r} records no task (no 'settings'->'task' with a 'name'), so "
            f"nothing checks that it measured {run}'s task; its direction is applied unchecked",
            DiagnosisTaskWarning,
            stacklevel=3,
        )
        return
    theirs = task_identity(recorded)
    if task is None or "name" not in task:
        warnings.warn(
            f"gate_direction: the diagnosis {path!r} measured the task {_describe_task(theirs)}, but {run}'s task "
            "is not known (no task's reward function among reward_funcs: integrations.trl.dataset_and_rewards or "
            "task_reward_function give one), so nothing checks that they are the same; its direction is applied "
            "unchecked",
            DiagnosisTaskWarning,
            stacklevel=3,
        )
        return
    ours = task_identity(task)
    differ = [k for k in ours if k in theirs and ours[k] != theirs[k]]
    if differ:
        shown = "; ".join(f"{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in differ)
        raise ParameterError(
            f"gate_direction: the diagnosis {path!r} measured another task than {run}'s ({shown}): it measured "
            f"{_describe_task(theirs)}, {run} trains {_describe_task(ours)}, and a gate's direction is a property "
            f"of the task (docs/diagnose.md); diagnose this task (comppo-core diagnose --task ...), or pass "
            "--gate-direction as_is or inverted",
            argument="gate_direction",
        )


#: What follows a diagnosis.json's path in ``gate_direction`` once a config has read it: the
#: SHA-256 of the file's bytes then (:func:`pinned_diagnosis`).
DIAGNOSIS_DIGEST = "#sha256="


def pinned_diagnosis(gate_direction: str) -> str:
    """``gate_direction`` naming a diagnosis.json, as a config records it: the absolute path
    and the SHA-256 of the file's bytes, ``PATH#sha256=HEX``. Given that form (a config read
    back, a compare's ``replace``), the file must still hash the same: a diagnosis rewritten
    since the run's settings were made would change its gates' direction silently (a resumed
    run, the later runs of a compare), so it is a
    :class:`~comppo_core.errors.ParameterError` naming ``gate_direction``."""
    path, _, recorded = gate_direction.partition(DIAGNOSIS_DIGEST)
    path = absolute(path)
    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise ParameterError(
            f"gate_direction: expected one of {', '.join(map(repr, GATE_DIRECTIONS))} or the path of a readable "
            f"diagnosis.json, got {path!r} ({exc.strerror or exc})",
            argument="gate_direction",
        ) from None
    if recorded and recorded != digest:
        raise ParameterError(
            f"gate_direction: the diagnosis {path!r} changed since these settings were made (sha256 {recorded[:12]}… "
            f"then, {digest[:12]}… now), which would change the gates' direction silently; restore it, or start "
            "a new run (another --out) with it",
            argument="gate_direction",
        )
    return f"{path}{DIAGNOSIS_DIGEST}{digest}"


def _read_diagnosis(path: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a diagnosis.json), or a ParameterError naming ``gate_direction``."""
    name = "gate_direction"
    expected = f"expected one of {', '.join(map(repr, GATE_DIRECTIONS))} or the path of a diagnosis.json"
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise ParameterError(f"{name}: {expected}, got {path!r} (no such file)", argument=name) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParameterError(f"{name}: {expected}, got {path!r}, which cannot be read ({exc})", argument=name) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParameterError(
            f"{name}: {path!r}: expected a diagnosis.json (JSON), got a parse error at line {exc.lineno}: {exc.msg}",
            argument=name,
        ) from None
    if not isinstance(data, dict):
        raise ParameterError(
            f"{name}: {path!r}: expected a diagnosis.json (a JSON object with 'direction'), got {type(data).__name__}",
            argument=name,
        )
    return data
