"""verl drop-ins: the GAE function and the ``"comp_gae"`` registry estimator.

``compute_gae_advantage_return`` replaces
``verl.trainer.ppo.core_algos.compute_gae_advantage_return``. verl's loop::

    for t in reversed(range(T)):
        delta = r[:, t] + γ·nextvalues − V[:, t]
        lastgaelam_ = delta + γ·λ·lastgaelam
        nextvalues = V[:, t]·m[:, t] + (1 − m[:, t])·nextvalues      # skip masked tokens
        lastgaelam = lastgaelam_·m[:, t] + (1 − m[:, t])·lastgaelam
    returns = advantages + values                                     # unwhitened
    advantages = masked_whiten(advantages, response_mask)

is exactly GAE over the valid tokens (masked tokens skipped), so this function is
``comppo_core.gae`` with ``masked_rewards="drop"`` (verl, too, silently drops rewards
on masked tokens) followed by ``masked_whiten``. Outputs agree with verl's on valid
positions; masked positions are 0 here (verl leaves carried values there, which its
losses mask out).

verl calls estimators other than GAE with rewards and masks only (no values), so the
``"comp_gae"`` estimator that :func:`register` adds reads values and gates from
:func:`set_inputs`, which the trainer code calls with the batch's tensors before
``compute_advantage``.

These drop-ins take gates, not concentration: map the probe's concentration with
``cc.gates_from_concentration(c, mask=response_mask)`` first, whose default
(``GateParams()``, ``normalize="causal"``) makes the gate at a token read the response
up to it only; ``params=cc.GateParams(normalize="sequence")`` z-scores the whole response.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..._torch import tensor_io
from ...advantages import gae
from ...errors import ParameterError
from ...whitening import masked_whiten

__all__ = ["compute_comp_gae_advantage", "compute_gae_advantage_return", "register", "set_inputs"]


@tensor_io("token_level_rewards", "values", "response_mask", "gates")
def compute_gae_advantage_return(
    token_level_rewards: Any,
    values: Any,
    response_mask: Any,
    gamma: Any,
    lam: Any,
    gates: Any = None,
) -> tuple[Any, Any]:
    """verl's ``compute_gae_advantage_return``: ``(whitened advantages, returns)``, each
    ``[B, T]`` like ``token_level_rewards`` (torch tensors in, torch tensors out, same
    device). With ``gates`` ``[B, T]`` in [0, 1] it is Comp-GAE."""
    # verl's masks are int64 or float: one bool copy (1 byte a token) is cheaper than
    # reading 4-8 bytes a token in each of the three passes that follow
    mask = np.asarray(response_mask)
    if mask.dtype != np.bool_ and mask.shape == np.shape(token_level_rewards):
        mask = mask != 0
    adv, ret = gae(
        token_level_rewards,
        values,
        mask=mask,
        gates=gates,
        gamma=float(gamma),
        lam=float(lam),
        masked_rewards="drop",
    )
    # adv is ours (a fresh NumPy array here): whiten it in place, no third buffer
    return masked_whiten(adv, mask=mask, out=adv), ret


_pending = threading.local()


def set_inputs(*, values: Any, gates: Any = None) -> None:
    """Hands the next ``"comp_gae"`` estimator call the batch's ``values`` (and
    ``gates``): verl passes estimators only rewards and masks."""
    _pending.inputs = {"values": values, "gates": gates}


def compute_comp_gae_advantage(
    token_level_rewards: Any,
    response_mask: Any,
    config: Any = None,
    values: Any = None,
    gates: Any = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """The ``"comp_gae"`` estimator: Comp-GAE with γ and λ from verl's algorithm config
    (``config.gamma``, ``config.lam``; default 1.0), values and gates from the call or
    from :func:`set_inputs`."""
    pending = getattr(_pending, "inputs", None) or {}
    _pending.inputs = None  # one call only: stale values must not leak into the next step
    values = pending.get("values") if values is None else values
    gates = pending.get("gates") if gates is None else gates
    if values is None:
        raise ParameterError(
            "values: comp_gae needs the critic's values; call "
            "comppo_core.integrations.verl.set_inputs(values=..., gates=...) before compute_advantage",
            argument="values",
        )
    gamma = getattr(config, "gamma", 1.0) if config is not None else 1.0
    lam = getattr(config, "lam", 1.0) if config is not None else 1.0
    return compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, gates=gates)


def register(name: str = "comp_gae") -> bool:
    """Registers :func:`compute_comp_gae_advantage` as ``name`` in verl's advantage
    estimator registry. Returns False (and does nothing) when verl is not installed."""
    try:
        from verl.trainer.ppo.core_algos import register_adv_est  # type: ignore[import-not-found]
    except ImportError:
        return False
    register_adv_est(name)(compute_comp_gae_advantage)
    return True
