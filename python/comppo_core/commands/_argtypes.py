"""argparse ``type=`` converters shared by the ``comppo-core`` commands, and the one
:class:`~comppo_core.GateParams` of a command's gate flags.

Each converter takes the option's text and returns the value, or raises
``argparse.ArgumentTypeError`` with what was expected (argparse then exits with status 2
and names the option).
"""

from __future__ import annotations

import argparse
import math

from ..errors import ParameterError
from ..gate_params import DEFAULTS, GateParams

__all__ = ["finite_float", "gate_params", "nonnegative_int", "positive_float", "positive_int", "unit_float"]


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def unit_float(text: str) -> float:
    """A number in [0, 1] (NaN is rejected)."""
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return value


def finite_float(text: str) -> float:
    """A finite number."""
    value = _float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _float(text)
    if not (math.isfinite(value) and value > 0.0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def gate_params(args: argparse.Namespace, parser: argparse.ArgumentParser) -> GateParams:
    """The :class:`~comppo_core.GateParams` of the gate flags ``--low``, ``--high``,
    ``--sharpness``, ``--normalize``, ``--center``, ``--scale`` and ``--invert`` in
    ``args`` (those the command has; a flag left at None takes the GateParams default).

    Values each flag accepts on its own are checked by its ``type=``; a combination
    GateParams rejects (``--low`` above ``--high``, ``--scale 0`` with ``--normalize
    none``) is a usage error (exit status 2) naming the flag of the error's ``argument``.
    """
    given = {name: getattr(args, name) for name in DEFAULTS if getattr(args, name, None) is not None}
    try:
        return GateParams(**given)
    except ParameterError as e:
        flag = "--" + (e.argument or "").replace("_", "-")
        parser.error(f"{flag}: {str(e).removeprefix(f'{e.argument}: ')}")
