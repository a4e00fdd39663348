"""Where an arm's transport gates come from: one registry entry per gate source.

An arm (:mod:`comppo_core.rl.core.arms`) names its gate source; the step
(:func:`comppo_core.rl.core.step.step_gates`) looks the name up here and nothing else
decides what the source does. With ``g`` the scoring pass's concentration gates
``[B, T−1]`` (``low + (high − low)·sigmoid(sharpness·z)``), ``m`` the response mask,
``low``/``high`` the gate range, the sources are:

==================  =====================================================================
source              Comp-GAE's gates
==================  =====================================================================
``none``            none (plain GAE with a critic, group-relative outcomes without one)
``concentration``   ``g`` itself
``constant``        the batch mean of ``g`` over the response (``cc.controls.constant``), or
                    the setting ``fixed_gate`` when it is given
``shuffle``         each row's ``g`` permuted, seeded ``seed·1_000_003 + step``
                    (``cc.controls.shuffle``)
``by_position``     the batch mean of ``g`` at each response position (``cc.controls.by_position``)
``inverted``        ``low + high − g``: the sigmoid's mirror image within ``[low, high]``
``oracle``          ``high`` on the response columns the task marks pivotal, ``low``
                    elsewhere (a diagnostic: it reads what a policy cannot know)
==================  =====================================================================

A replacing source (every one but ``none`` and ``concentration``) is computed over the
global batch and is what Comp-GAE reads; no critic ever reads it (a critic is a baseline
and reads the prefix only).

Adding a source is one :class:`GateSource` in :data:`GATE_SOURCES` (its name then becomes
valid for :class:`~comppo_core.rl.core.arms.Arm`); ``tests/rl/test_rl_step.py`` runs every
entry. This module imports no torch: the mappings import it when they run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from ... import controls
from ...options import GATE_CONTROLS, check_choice

if TYPE_CHECKING:
    import torch

__all__ = ["GATE_SOURCES", "GateContext", "GateSource", "get_gate_source"]


@dataclasses.dataclass(frozen=True)
class GateContext:
    """What a mapping may read besides the gates: the gate range and the step's keys."""

    low: float
    high: float
    seed: int
    step: int


#: ``mapping(g, m, context)``: the global batch's concentration gates ``g`` ``[B, T−1]``
#: float32 and response mask ``m`` ``[B, T−1]`` bool → Comp-GAE's gates ``[B, T−1]``.
Mapping = Callable[["torch.Tensor", "torch.Tensor", GateContext], "torch.Tensor"]


@dataclasses.dataclass(frozen=True)
class GateSource:
    """One source of Comp-GAE's gates.

    ``mapping`` is None for the sources that replace nothing (``none``,
    ``concentration``) and for ``oracle``, whose gates come from the task's pivotal marks
    (:func:`comppo_core.rl.core.step.oracle_gates`), not from the concentration."""

    name: str
    description: str
    mapping: Mapping | None = None
    #: a control of the concentration gates (``cc.controls``): the paper's checks that gains
    #: come from trajectory-specific alignment
    control: bool = False
    #: the gates come from the task's pivotal marks (a diagnostic arm)
    pivotal: bool = False
    #: a given ``fixed_gate`` setting replaces the mapping by that constant
    takes_fixed_gate: bool = False

    @property
    def gated(self) -> bool:
        """Whether Comp-GAE reads gates at all."""
        return self.name != "none"

    @property
    def replaces(self) -> bool:
        """Whether the source replaces the concentration gates (a mapping or the oracle)."""
        return self.mapping is not None or self.pivotal


def _constant(g: torch.Tensor, m: torch.Tensor, _: GateContext) -> torch.Tensor:
    import torch

    return torch.as_tensor(controls.constant(g, mask=m))


def _shuffle(g: torch.Tensor, m: torch.Tensor, ctx: GateContext) -> torch.Tensor:
    import torch

    return torch.as_tensor(controls.shuffle(g, mask=m, seed=ctx.seed * 1_000_003 + ctx.step))


def _by_position(g: torch.Tensor, m: torch.Tensor, _: GateContext) -> torch.Tensor:
    import torch

    return torch.as_tensor(controls.by_position(g, mask=m))


def _inverted(g: torch.Tensor, m: torch.Tensor, ctx: GateContext) -> torch.Tensor:
    import torch

    return torch.where(m, (ctx.low + ctx.high) - g, 1.0).clamp(0.0, 1.0)


#: Every gate source by name, in the order the docs list them.
GATE_SOURCES: dict[str, GateSource] = {
    s.name: s
    for s in (
        GateSource("none", "no gates"),
        GateSource("concentration", "the gate mapping of the scoring pass's concentration"),
        GateSource(
            "constant",
            "the batch mean of the concentration gates, or fixed_gate",
            _constant,
            control=True,
            takes_fixed_gate=True,
        ),
        GateSource("shuffle", "each row's concentration gates permuted", _shuffle, control=True),
        GateSource("by_position", "the per-position batch mean of the concentration gates", _by_position, control=True),
        GateSource("inverted", "the gate mapping reversed: low + high − g", _inverted),
        GateSource("oracle", "high on the task's pivotal tokens, low elsewhere", pivotal=True),
    )
}

assert {n for n, s in GATE_SOURCES.items() if s.control} == set(GATE_CONTROLS)  # one vocabulary of controls


def get_gate_source(name: str) -> GateSource:
    """The gate source called ``name``, or a :class:`~comppo_core.errors.ParameterError`."""
    return GATE_SOURCES[check_choice("gates", name, tuple(GATE_SOURCES))]
