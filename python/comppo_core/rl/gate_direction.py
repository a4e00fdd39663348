"""The direction of a run's gates (``TrainConfig.gate_direction``): a keyword, or a diagnosis.

``gate_direction`` is ``"as_is"`` (the gate source's own mapping), ``"inverted"`` (its mirror
image, ``GateParams.invert``), ``"none"`` (no direction: only an arm whose gates have none may
run), or the path of a ``diagnosis.json`` written by ``comppo-core diagnose``, whose
recommendation for the arm's gate source applies (:func:`recommended_direction`). A config
records such a path as ``PATH#sha256=HEX`` (:func:`pinned_diagnosis`), so that a file rewritten
since the settings were made is refused instead of changing the gates' direction silently.
The field replaces ``gate_invert``: :func:`upgrade_fields` reads a record written with it.

Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from .core.gate_sources import GATE_DIRECTIONS
from .runs.run_dir import absolute

__all__ = [
    "DIAGNOSIS_DIGEST",
    "direction_of_gate_invert",
    "pinned_diagnosis",
    "recommended_direction",
    "upgrade_fields",
]


def direction_of_gate_invert(invert: Any, direction: Any) -> str:
    """The ``gate_direction`` an old ``gate_invert`` value means, or a ParameterError naming
    ``gate_invert`` when it is not a bool or contradicts ``direction``, a ``gate_direction``
    given too (None: not given)."""
    if not isinstance(invert, bool):
        raise ParameterError(
            f"gate_invert: expected a bool (replaced by gate_direction), got {invert!r}", argument="gate_invert"
        )
    old = "inverted" if invert else "as_is"
    if direction is not None and direction != old:
        raise ParameterError(
            f"gate_invert: {invert!r} means gate_direction={old!r}, but gate_direction={direction!r} is given too "
            "(gate_invert is replaced by gate_direction: give that alone)",
            argument="gate_invert",
        )
    return old


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
