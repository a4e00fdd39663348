"""The paper's arms: which critic a run trains and which gates its advantages use.

Every arm runs the same step (:mod:`comppo_core.rl.step`); an arm is data, two fields:
its ``critic`` (none, ``"standard"`` or ``"tac"``) and the source of its transport
``gates``; the step reads them through the properties of :class:`Arm` and decides a
step's gates once (:func:`comppo_core.rl.step.step_gates`). This table is the one list of
the arms; the docs link here.

================  ================  ==========================================================
arm               critic            advantages
================  ================  ==========================================================
``grpo``          none              group-relative outcome (``cc.group_advantages``, verl's
                                    GRPO) broadcast to the response tokens (``cc.broadcast``)
``ppo``           ``StandardCritic``  GAE (``cc.gae``, no gates), whitened
``comp_gae``      ``StandardCritic``  Comp-GAE, gates from the attention concentration
``tac_fixed``     TAC               GAE with a constant gate, in the critic's inputs too
                                    (``fixed_gate``, default the batch mean of the
                                    concentration gates: ``cc.controls.constant``)
``comppo``        TAC               Comp-GAE, gates from concentration (full CompPO); TAC
                                    reads the causal gates (``rl.causal_gates``)
``comppo_shuffle``  TAC             as ``comppo``, gates by ``cc.controls.shuffle`` (each
                                    row's gates permuted), in the critic's inputs too
``comppo_position`` TAC             as ``comppo``, gates by ``cc.controls.by_position`` (the
                                    batch mean gate at each response position), in the
                                    critic's inputs too
================  ================  ==========================================================

``gates`` names where the gates come from: ``"none"`` (plain GAE, or no GAE at all),
``"concentration"`` (the gate mapping of the scoring pass's concentration), or a control
of those gates (``"constant"``, ``"shuffle"``, ``"by_position"``). A control replaces the
gates wherever they are used: in Comp-GAE and as the critic's gate features.
"""

from __future__ import annotations

import dataclasses

from ..options import ARM_NAMES, GATE_CONTROLS, check_choice

__all__ = ["ARMS", "CONTROLS", "CRITICS", "GATE_SOURCES", "Arm", "get_arm"]

#: The gate sources that are controls of the concentration gates (``cc.controls``).
CONTROLS = GATE_CONTROLS


#: The critics an arm may train (None: no critic).
CRITICS = ("standard", "tac")
#: Where an arm's transport gates come from.
GATE_SOURCES = ("none", "concentration", *CONTROLS)


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: its critic (``None``, ``"standard"`` or ``"tac"``) and its gate source
    (:data:`GATE_SOURCES`)."""

    name: str
    critic: str | None
    gates: str
    description: str

    @property
    def uses_gae(self) -> bool:
        """Token-level advantages from a critic (else group-relative outcomes)."""
        return self.critic is not None

    @property
    def reads_routing(self) -> bool:
        """Whether the scoring pass needs the probe: concentration gates or a TAC's routing features."""
        return self.gates != "none" or self.critic == "tac"

    @property
    def critic_reads_routing(self) -> bool:
        """Whether the critic reads the actor's taps and routing (TAC), so that the update's
        forward needs the probe too."""
        return self.critic == "tac"

    @property
    def control(self) -> bool:
        """Whether the gates are a control computed from the concentration gates."""
        return self.gates in CONTROLS


#: Every arm by name (the ``arm`` setting of :class:`~comppo_core.rl.TrainConfig`).
ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("grpo", None, "none", "GRPO: group-relative outcome advantages, no critic"),
        Arm("ppo", "standard", "none", "PPO: GAE with a standard critic"),
        Arm("comp_gae", "standard", "concentration", "Comp-GAE with a standard critic"),
        Arm("tac_fixed", "tac", "constant", "TAC with a constant gate"),
        Arm("comppo", "tac", "concentration", "CompPO: Comp-GAE with TAC"),
        Arm("comppo_shuffle", "tac", "shuffle", "CompPO with each row's gates shuffled"),
        Arm("comppo_position", "tac", "by_position", "CompPO with gates replaced by their per-position batch mean"),
    )
}


assert tuple(ARMS) == ARM_NAMES  # the registry and the vocabulary name the same arms, in order


def get_arm(name: str) -> Arm:
    """The arm called ``name``, or a :class:`~comppo_core.errors.ParameterError` naming ``arm``."""
    return ARMS[check_choice("arm", name, ARM_NAMES)]
