"""OpenRLHF drop-in: ``get_advantages_and_returns``.

OpenRLHF's loop (``ppo_utils/experience_maker.py``)::

    values, rewards = action_mask·values, action_mask·rewards
    for t in reversed(range(T)):
        nextvalues = values[:, t + 1] if t < T − 1 else 0
        delta = rewards[:, t] + γ·nextvalues − values[:, t]
        lastgaelam = delta + γ·λ·lastgaelam
    returns = advantages + values

steps through *every* position: a masked token inside a response contributes value
and reward 0 but still decays the trace by γ·λ (and its "value" 0 is bootstrapped
from). verl instead skips masked tokens. So this drop-in is ``comppo_core.gae`` with
no mask on the masked-multiplied inputs; it returns values at every position, as
OpenRLHF does. With ``gates`` the per-step discount becomes γ·g_t (Comp-GAE); map
concentration to gates with ``cc.gates_from_concentration(c, mask=action_mask)``, causal by
default (the gate at a token reads the response up to it only).
"""

from __future__ import annotations

from typing import Any

from .._torch import is_tensor
from ..advantages import gae

__all__ = ["get_advantages_and_returns"]


def get_advantages_and_returns(
    values: Any,
    rewards: Any,
    action_mask: Any,
    gamma: float,
    lambd: float,
    gates: Any = None,
) -> tuple[Any, Any]:
    """OpenRLHF's GAE: ``(advantages, returns)``, each ``[B, T]`` like ``values``."""
    if action_mask is not None:
        values = action_mask * values
        rewards = action_mask * rewards
    if is_tensor(values):
        values = values.detach()
        rewards = rewards.to(values.dtype)
    adv, ret = gae(rewards, values, gates=gates, gamma=float(gamma), lam=float(lambd))
    return adv, ret
