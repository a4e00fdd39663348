"""The paper's arms: which critic a run trains and which gates its advantages use.

Every arm runs the same step (:mod:`comppo_core.rl.core.step`); an arm is data, two fields:
its ``critic`` (none, ``"standard"`` or ``"tac"``) and the source of its transport
``gates`` (Comp-GAE's γ·λ·g_t); the step reads them through the properties of
:class:`Arm` and decides a step's gates once (:func:`comppo_core.rl.core.step.step_gates`).
The table of the arms, with what each one's critic and advantages are, is in
docs/training.md ("Arms"); it is the one list, and this docstring does not repeat it. The
names are :data:`comppo_core.options.ARM_NAMES`; :data:`ARMS` maps each to its
:class:`Arm`.

The four cells ``ppo_fixed``, ``comp_gae``, ``tac_fixed``, ``comppo`` are the paper's 2×2
{standard critic, TAC} × {constant gate, concentration gates}; ``ppo_fixed`` and
``tac_fixed`` use the same constant gate, chosen the same way. ``comppo_policy_entropy``
and ``comppo_token_nll`` are the ``comppo`` cell with the policy's uncertainty in place of
the concentration (GACA's signal; :mod:`~comppo_core.rl.core.gate_sources` says how it maps
to gates and why uncertain tokens get low gates): "is the concentration better than plain
uncertainty?" is ``compare --arms comppo,comppo_policy_entropy,comppo_token_nll``. They are
baselines, not part of ``compare``'s default arms (:attr:`Arm.in_default_compare`).

**The critic is a baseline in every arm: it reads only the prefix.** An arm's gate
source changes Comp-GAE's gates and nothing else. A TAC reads, in every arm, the causal
gate features of the concentration (:func:`comppo_core.rl.critics.tac.causal_gates`: the gate
mapping with the row's running z-score, so ``V_t`` depends on tokens ``≤ t`` only) and the
actor's hidden states; a ``StandardCritic`` reads the tokens. A control, a constant or an
oracle gate is a function of the whole batch or response, so it never reaches a critic.

``gates`` names where Comp-GAE's gates come from: an entry of the gate-source registry
(:data:`comppo_core.rl.core.gate_sources.GATE_SOURCES`, which says what each one computes);
an arm with a name the registry lacks is refused.
"""

from __future__ import annotations

import dataclasses

from ...options import ARM_NAMES, check_choice
from .gate_sources import GATE_SOURCES, GateSource, get_gate_source

__all__ = ["ARMS", "CRITICS", "GATE_SETTINGS", "GATE_SOURCES", "Arm", "get_arm"]


#: The TrainConfig fields of the concentration and its gates: read only by an arm that
#: reads routing (:attr:`Arm.reads_routing`); ``grpo`` and ``ppo`` never do.
GATE_SETTINGS = (
    "statistic",
    "gate_low",
    "gate_high",
    "gate_sharpness",
    "gate_min_spread",
    "gate_normalize",
    "gate_direction",
    "gate_causal",
    "fixed_gate",
)

#: The critics an arm may train (None: no critic).
CRITICS = ("standard", "tac")


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: its critic (``None``, ``"standard"`` or ``"tac"``) and its gate source
    (:data:`GATE_SOURCES`)."""

    name: str
    critic: str | None
    gates: str
    description: str

    def __post_init__(self) -> None:
        if self.critic is not None:
            check_choice("critic", self.critic, CRITICS)
        get_gate_source(self.gates)  # an unknown source is an error, never a silent default

    @property
    def gate_source(self) -> GateSource:
        """The registry entry of :attr:`gates`."""
        return GATE_SOURCES[self.gates]

    @property
    def uses_gae(self) -> bool:
        """Token-level advantages from a critic (else group-relative outcomes)."""
        return self.critic is not None

    @property
    def reads_routing(self) -> bool:
        """Whether the scoring pass needs the probe: gates from the concentration (or the
        oracle's, which replace them) or a TAC's routing features; gates of the policy's own
        statistics need none."""
        source = self.gate_source
        return (source.gated and source.policy_statistic is None) or self.critic == "tac"

    def ignores(self, field: str) -> bool:
        """Whether a run of this arm never reads the TrainConfig ``field`` (a gate setting
        of an arm with no gates that reads no routing), so that two settings differing only
        there are the same run."""
        return field in GATE_SETTINGS and not self.reads_routing and not self.gate_source.gated

    @property
    def critic_reads_routing(self) -> bool:
        """Whether the critic reads the actor's taps and routing (TAC), so that the update's
        forward needs the probe too."""
        return self.critic == "tac"

    @property
    def control(self) -> bool:
        """Whether the gates are a control computed from the concentration gates."""
        return self.gate_source.control

    @property
    def replaces_gates(self) -> bool:
        """Whether Comp-GAE's gates replace the concentration gates (a control, the
        reversed mapping, the oracle)."""
        return self.gate_source.replaces

    @property
    def diagnostic(self) -> bool:
        """A diagnostic arm, not a method (its gates read what a policy cannot know)."""
        return self.gate_source.pivotal

    @property
    def in_default_compare(self) -> bool:
        """Whether ``compare`` runs the arm by default: every arm but the diagnostics and the
        baselines of other gate sources (the policy's uncertainty), which ``--arms`` names."""
        return not self.diagnostic and not self.gate_source.baseline

    @property
    def constant_gate_arm(self) -> str | None:
        """The arm with the same critic and a constant gate (``tac_fixed``, ``ppo_fixed``):
        what to run when a diagnosis finds no direction for the gates; None without a critic."""
        return {"tac": "tac_fixed", "standard": "ppo_fixed"}.get(self.critic or "")


#: Every arm by name (the ``arm`` setting of :class:`~comppo_core.rl.TrainConfig`).
ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("grpo", None, "none", "GRPO: group-relative outcome advantages, no critic"),
        Arm("ppo", "standard", "none", "PPO: GAE with a standard critic"),
        Arm("ppo_fixed", "standard", "constant", "PPO with a constant gate"),
        Arm("comp_gae", "standard", "concentration", "Comp-GAE with a standard critic"),
        Arm("tac_fixed", "tac", "constant", "TAC with a constant gate"),
        Arm("comppo", "tac", "concentration", "CompPO: Comp-GAE with TAC"),
        Arm("comppo_shuffle", "tac", "shuffle", "CompPO with each row's gates shuffled"),
        Arm("comppo_position", "tac", "by_position", "CompPO with gates replaced by their per-position batch mean"),
        Arm("comppo_inverted", "tac", "inverted", "CompPO with the gate mapping reversed"),
        Arm("comppo_oracle", "tac", "oracle", "diagnostic: gates high on the task's pivotal tokens"),
        Arm("comppo_policy_entropy", "tac", "policy_entropy", "CompPO with gates from the policy's entropy"),
        Arm("comppo_token_nll", "tac", "token_nll", "CompPO with gates from the sampled token's NLL"),
    )
}


assert tuple(ARMS) == ARM_NAMES  # the registry and the vocabulary name the same arms, in order


def get_arm(name: str) -> Arm:
    """The arm called ``name``, or a :class:`~comppo_core.errors.ParameterError` naming ``arm``."""
    return ARMS[check_choice("arm", name, ARM_NAMES)]
