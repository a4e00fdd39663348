"""The settings grid of ``comppo-core compare --grid``: its syntax, its points, their names.

A grid gives each of some :class:`~comppo_core.rl.TrainConfig` fields a list of values;
its points are every combination (the Cartesian product, in the order the fields were
given, the last field varying fastest), numbered ``p0, p1, …`` in that order. Two ways
to write one:

* on the command line, one ``FIELD=V1,V2,...`` per field::

      --grid actor_lr=1e-4,3e-4 kl_coef=0,0.1 lam=0.95,1.0     (2 × 2 × 2 = 8 points)

  ``FIELD`` is a TrainConfig field (``actor_lr`` or ``actor-lr``); each value is parsed
  as the field's type (``none`` for an optional field; ``true`` / ``false`` for a
  boolean);
* a JSON file, ``--grid grid.json``, holding an object of lists (a single value stands
  for a list of one): ``{"actor_lr": [1e-4, 3e-4], "kl_coef": [0, 0.1]}``; an integer
  for a float field is that float.

Every point is then checked by TrainConfig itself (with every arm compared), so a value
out of range is refused before anything runs, naming ``--grid``, the field and the value.
A field may be given once, a value once per field.

**What a grid may vary.** Any field of the RL phase (the optimiser, the PPO update, the
advantages, the critic, the KL, the rollouts, ``steps``, LoRA). Not
(:data:`NOT_TUNABLE`, each with its reason): what ``compare`` sets itself (the arm, the
seed, the output, the split evaluated), what fixes the problems and the evaluation (the
task, its sizes and its splits, ``eval_size``, ``eval_every``): every point must be scored on the
same validation set of the same task; what makes the warm start (the built-in model's shape and its SFT,
``init_from``, ``model``): every point and arm of a seed starts from the same warm start,
as in the paired comparison; and the settings of a run's handling (threads, device,
progress, checkpoints, logging), which are not settings of the method.

**Repeats.** A point that differs from an earlier one only in fields an arm never reads
(the gate settings, for ``grpo`` and ``ppo``: :data:`comppo_core.rl.core.arms.GATE_SETTINGS`)
is the same run for that arm: :meth:`Grid.first_alike` names the earlier point, and
``compare`` runs it once and counts its outcome at both points, so every arm is scored on
every point and no arm spends budget rerunning an identical run.

Imports no torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from ..rl.config import TASK_SIZES, TrainConfig, field_types
from ..rl.core.arms import get_arm

__all__ = ["NOT_TUNABLE", "POLICY_FIELDS", "Grid", "parse_grid"]

#: The fields that make a seed's starting policy (the model and its supervised warm-up),
#: beyond the task and its split: the policy every arm of the seed starts from.
POLICY_FIELDS = (
    "init_from",
    "model",
    "model_hidden",
    "model_layers",
    "model_heads",
    "model_kv_heads",
    "model_intermediate",
    "warmup_sft_steps",
    "sft_batch_size",
    "sft_lr",
    "sft_carry_noise",
)

_WHY_OWN = "compare sets it per run"
_WHY_SPLIT = "every point is scored on the same validation problems and trained on the same problems"
_WHY_TASK = "every point is a setting of the method on one task"
_WHY_WARM = "every point and arm of a seed starts from the same warm start"
_WHY_HANDLING = "a setting of how a run is handled, not of the method"

#: The fields a grid may not vary, each with the reason (module docstring).
NOT_TUNABLE: dict[str, str] = {
    **dict.fromkeys(("arm", "seed", "out", "resume", "eval_split"), _WHY_OWN),
    **dict.fromkeys(
        (
            "task",
            "digits",
            "split_seed",
            "heldout_fraction",
            "validation_fraction",
            "eval_size",
            "eval_every",
            "chat_template",
            "max_new_tokens",
        ),
        _WHY_SPLIT,
    ),
    **dict.fromkeys(TASK_SIZES, _WHY_TASK),
    **dict.fromkeys(POLICY_FIELDS, _WHY_WARM),
    **dict.fromkeys(("progress", "num_threads", "device", "report_to", "save_every"), _WHY_HANDLING),
}


@dataclasses.dataclass(frozen=True)
class Grid:
    """A grid: ``fields[i]`` takes the values ``values[i]`` (module docstring)."""

    fields: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]

    @property
    def points(self) -> list[dict[str, Any]]:
        """Every combination, ``p0`` first: ``[{field: value, ...}, ...]``, the last field varying fastest."""
        return [dict(zip(self.fields, combo)) for combo in itertools.product(*self.values)]

    @staticmethod
    def name(index: int) -> str:
        """The name of point ``index`` (its directory under ``OUT/grid/``): ``p<index>``."""
        return f"p{index}"

    def to_dict(self) -> dict[str, list[Any]]:
        """``{field: [values]}`` in the grid's order (what ``compare.json`` records)."""
        return {f: list(v) for f, v in zip(self.fields, self.values)}

    def first_alike(self, arm: str) -> list[int]:
        """For each point, the first point that is the same run for ``arm``: the same
        values in every field the arm reads (:meth:`comppo_core.rl.core.arms.Arm.ignores`; for
        ``grpo`` and ``ppo`` the gate settings do not count). ``result[i] == i`` for a point
        the arm runs; another index for a *repeat*, which ``compare`` does not run again
        (its outcome is that point's)."""
        who = get_arm(arm)
        keys = [tuple((k, v) for k, v in point.items() if not who.ignores(k)) for point in self.points]
        return [keys.index(key) for key in keys]

    @staticmethod
    def describe(point: dict[str, Any]) -> str:
        """``"actor_lr=0.0001, kl_coef=0.0"``."""
        return ", ".join(f"{k}={v!r}" for k, v in point.items())

    def check(self, base: TrainConfig, arms: Sequence[str]) -> None:
        """Every point with every arm is a valid TrainConfig on top of ``base``; else a
        ParameterError naming ``grid``, the point and TrainConfig's message."""
        for i, point in enumerate(self.points):
            for arm in arms:
                try:
                    base.replace(arm=arm, **point)
                except ParameterError as exc:
                    raise ParameterError(
                        f"grid: point {self.name(i)} ({self.describe(point)}) with arm {arm}: {exc}", argument="grid"
                    ) from None


def parse_grid(tokens: Sequence[str]) -> Grid:
    """The grid of ``--grid`` (module docstring): ``FIELD=V1,V2,...`` tokens, or one JSON
    file. A ParameterError naming ``grid`` and the offending token or field otherwise."""
    if not tokens:
        raise ParameterError("grid: expected FIELD=V1,V2,... tokens or a JSON file, got nothing", argument="grid")
    if len(tokens) == 1 and "=" not in tokens[0]:
        return _from_file(Path(tokens[0]))
    fields: list[str] = []
    values: list[tuple[Any, ...]] = []
    for k, token in enumerate(tokens):
        name, sep, text = token.partition("=")
        if not sep or not name.strip() or not text.strip():
            raise ParameterError(
                f"grid: expected FIELD=V1,V2,... (or one JSON file), got {token!r} (token {k + 1})", argument="grid"
            )
        field = _field(name.strip())
        kind, optional = _field_type(field)
        parsed = tuple(_parse_value(field, v.strip(), kind, optional) for v in text.split(","))
        fields.append(field)
        values.append(parsed)
    return _grid(fields, values)


def _from_file(path: Path) -> Grid:
    if not path.is_file():
        raise ParameterError(
            f"grid: expected FIELD=V1,V2,... tokens or a JSON file, got {str(path)!r}, which is not a file",
            argument="grid",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ParameterError(
            f"grid: {str(path)!r}: expected a JSON object of lists, got {exc}", argument="grid"
        ) from None
    if not isinstance(data, dict) or not data:
        raise ParameterError(
            f"grid: {str(path)!r}: expected a non-empty JSON object of lists, got {type(data).__name__}",
            argument="grid",
        )
    fields, values = [], []
    for name, raw in data.items():
        field = _field(str(name))
        kind, _ = _field_type(field)
        items = raw if isinstance(raw, list) else [raw]
        if not items:
            raise ParameterError(f"grid: {str(path)!r}: expected values for {field}, got []", argument="grid")
        for v in items:
            if isinstance(v, (dict, list)):
                raise ParameterError(
                    f"grid: {str(path)!r}: expected {field}'s values to be numbers, strings, booleans or null, got {v!r}",
                    argument="grid",
                )
        # an integer for a float field is that float (1 and 1.0 are one setting)
        fields.append(field)
        values.append(
            tuple(float(v) if kind is float and isinstance(v, int) and not isinstance(v, bool) else v for v in items)
        )
    return _grid(fields, values)


def _grid(fields: list[str], values: list[tuple[Any, ...]]) -> Grid:
    for i, field in enumerate(fields):
        if field in fields[:i]:
            raise ParameterError(f"grid: expected each field once, got {field} twice", argument="grid")
        for j, v in enumerate(values[i]):
            if any(v == w and type(v) is type(w) for w in values[i][:j]):
                raise ParameterError(f"grid: expected each value of {field} once, got {v!r} twice", argument="grid")
    return Grid(tuple(fields), tuple(values))


def _field(name: str) -> str:
    field = name.replace("-", "_")
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    if field not in known:
        raise ParameterError(f"grid: expected TrainConfig fields, got {name!r}, which is not one", argument="grid")
    if field in NOT_TUNABLE:
        raise ParameterError(f"grid: {field} cannot vary in a grid: {NOT_TUNABLE[field]}", argument="grid")
    return field


def _field_type(field: str) -> tuple[type, bool]:
    hint = field_types(TrainConfig)[field]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return inner, True
    return hint, False


def _parse_value(field: str, text: str, kind: type, optional: bool) -> Any:
    if optional and text.lower() in ("none", "null"):
        return None
    if kind is bool:
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
    else:
        try:
            value = kind(text)
        except ValueError:
            pass
        else:
            if not (isinstance(value, float) and math.isnan(value)):
                return value
    what = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind, kind.__name__)
    raise ParameterError(
        f"grid: expected {field}'s values to be {what}{' or none' if optional else ''}, got {text!r}", argument="grid"
    )
