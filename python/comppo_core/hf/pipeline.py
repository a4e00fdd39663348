"""CompPO credit assignment in one call: probe → gates → Comp-GAE (docs/design.md §3, §4, §7).

:func:`comp_gae_batch` runs, for a batch of prompt+response sequences::

    logprobs, c  = score(model, input_ids, attention_mask, concentration=True)   [B, T−1]
    m            = response_mask ∧ attention_mask[:, 1:] ∧ attention_mask[:, :-1]  [B, T−1]
    g            = gates_from_concentration(c, mask=m, params=gate_params)   (GateParams; causal by default)
    g            = control(g)          "none" | "shuffle" | "by_position" | "constant"
    A, R         = gae(r, V, mask=m, gates=g, γ, λ)                 Comp-GAE
    A⁰, R⁰       = gae(r, V, mask=m, γ, λ)                          plain GAE, for comparison

Every per-token array is in *column* coordinates ``[B, T−1]``, the ``response_mask``
included (the convention of :mod:`comppo_core.rl`): column j is token
``input_ids[:, j+1]``, scored by the logits of query position j, whose attention gives
its concentration (so the gate of a token comes from the position that generated it).

Column j is the action "emit token j+1" taken in state ``s_j = input_ids[:, :j+1]``, so
inputs given in token coordinates ``[B, T]`` map to columns differently:

* ``rewards[b, t]`` is the reward *of token t* (of the action that produced it):
  column j gets ``rewards[:, j+1]``, i.e. ``rewards[:, 1:]``. Token 0 is never an
  action, so a nonzero ``rewards[:, 0]`` is an error.
* ``values[b, t]`` is the critic's output *at position t*, ``V(s_t) = V(input_ids[:, :t+1])``
  (what a value head returns for hidden state t): column j gets ``values[:, j]``, i.e.
  ``values[:, :-1]``. This is verl's ``values[:, -R-1:-1]`` for R response tokens: the first
  response column gets the value at the last prompt token. ``values[:, T−1]``, the state
  after the last token, is no column's state; a truncated row bootstraps from it through
  ``last_values``.

GAE then runs over the response columns m (Comp-GAE with gates g)::

    δ_j = r_j + γ·g_j·V_next(j) − V_j
    V_next(j) = V of the row's next response column, or last_values[b] (default 0, the
                response ended) after its last one
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .. import controls as _controls
from ..advantages import gae
from ..errors import MaskedRewardError, ShapeError, location
from ..gate_params import GateParams, as_gate_params
from ..gating import gates_from_concentration
from ..options import CONTROLS, check_choice
from .lm import check_ids
from .scoring import score
from .statistics import DEFAULT_QUERY_CHUNK

__all__ = ["CONTROLS", "CompPOBatch", "comp_gae_batch"]


@dataclass(frozen=True)
class CompPOBatch:
    """The pipeline's outputs, each ``[B, T−1]`` in column coordinates (column j = token j+1).

    Attributes:
      logprobs: ``log π(token j+1 | tokens ≤ j)``, float32 (0 where the column is padding).
      concentration: the probe's statistic at query position j, float32.
      gates: retention gates after the control; 1 outside ``mask``.
      advantages, returns: Comp-GAE advantages and λ-returns (gates ``gates``).
      gae_advantages, gae_returns: plain GAE with the same rewards, values, γ and λ.
      rewards, values: the per-token rewards and values used (column coordinates:
        ``rewards[:, j]`` is the reward of token j+1, ``values[:, j] = V(input_ids[:, :j+1])``).
      mask: bool, the columns that are response tokens.
    """

    logprobs: torch.Tensor
    concentration: torch.Tensor
    gates: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    gae_advantages: torch.Tensor
    gae_returns: torch.Tensor
    rewards: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor


def _as_float(data: Any, name: str, device: torch.device) -> torch.Tensor:
    x: torch.Tensor = torch.as_tensor(data, device=device)
    if not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64, torch.bool)):
        raise ShapeError(f"{name}: expected a numeric tensor, got {x.dtype}", argument=name)
    return x.to(torch.float32)


def _rewards_to_columns(data: Any, b: int, t: int, device: torch.device) -> torch.Tensor:
    """Per-token rewards → float32 ``[B, T−1]`` columns.

    ``[B, T]``: ``x[b, t]`` is the reward of token t, so column j (token j+1) gets
    ``x[:, j+1]`` (``x[:, 1:]``); a reward on token 0 is an error. ``[B, T−1]``: columns."""
    x = _as_float(data, "rewards", device)
    if x.shape == (b, t):
        if bool((x[:, 0] != 0).any()):
            row = int(torch.nonzero(x[:, 0] != 0)[0, 0])
            raise MaskedRewardError(
                f"rewards: token 0 has no log-prob column and cannot be a response token, "
                f"got reward {float(x[row, 0])} at {location(row, 0)}",
                argument="rewards",
                row=row,
                position=0,
            )
        return x[:, 1:].contiguous()
    if x.shape == (b, t - 1):
        return x.contiguous()
    raise ShapeError(
        f"rewards: expected [B] (per sequence), [B, T] = [{b}, {t}] (per token) or [B, T-1] = [{b}, {t - 1}] "
        f"(per log-prob column), got {tuple(x.shape)}",
        argument="rewards",
    )


def _values_to_columns(data: Any, b: int, t: int, device: torch.device) -> torch.Tensor:
    """Critic values → float32 ``[B, T−1]`` columns.

    ``[B, T]``: ``x[b, t] = V(input_ids[b, :t+1])``, the critic's output at position t, so
    column j (state ``input_ids[:, :j+1]``, action token j+1) gets ``x[:, j]``
    (``x[:, :-1]``; the last position's value is no column's state). ``[B, T−1]``: columns,
    ``x[b, j] = V(input_ids[b, :j+1])``."""
    x = _as_float(data, "values", device)
    if x.shape == (b, t):
        return x[:, :-1].contiguous()
    if x.shape == (b, t - 1):
        return x.contiguous()
    raise ShapeError(
        f"values: expected [B, T] = [{b}, {t}] or [B, T-1] = [{b}, {t - 1}], got {tuple(x.shape)} "
        "([B, T]: the critic's output at each position, values[:, t] = V(input_ids[:, :t+1]); "
        "[B, T-1]: column j = V(input_ids[:, :j+1]))",
        argument="values",
    )


def _outcome_on_last(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` outcome scores placed on each row's last response column."""
    b, cols = mask.shape
    out = torch.zeros(b, cols, dtype=torch.float32, device=mask.device)
    has = mask.any(dim=1)
    bad = (~has) & (scores != 0)
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0, 0])
        raise MaskedRewardError(
            f"rewards: row {row} has outcome {float(scores[row])} but no response token to carry it "
            "(response_mask ∧ attention_mask is empty on that row)",
            argument="rewards",
            row=row,
        )
    last = cols - 1 - torch.flip(mask, dims=[1]).to(torch.int64).argmax(dim=1)
    rows = torch.nonzero(has).flatten()
    out[rows, last[rows]] = scores[rows].to(torch.float32)
    return out


def comp_gae_batch(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    response_mask: torch.Tensor,
    rewards: Any,
    values: Any = None,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    lam_critic: float | None = None,
    last_values: Any = None,
    statistic: str = "entropy",
    layers: None | int | slice | Iterable[int] = None,
    gate_params: GateParams | None = None,
    control: str = "none",
    seed: int = 0,
    position_ids: torch.Tensor | None = None,
    method: str = "auto",
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    precision: str = "float32",
    masked_rewards: str = "error",
) -> CompPOBatch:
    """Forward with the probe → log-probs and concentration → gates → Comp-GAE, in one call.

    Args:
      model: a causal LM supported by :class:`~comppo_core.hf.ConcentrationProbe`.
      input_ids: ``[B, T]`` prompt + response token ids.
      attention_mask: ``[B, T]`` (nonzero = real token) or ``None``.
      response_mask: ``[B, T−1]`` response columns, nonzero where column j's token
        ``input_ids[:, j+1]`` is a response token (the policy's actions); from a token mask
        ``m`` ``[B, T]``, ``m[:, 1:]``.
      rewards: ``[B]`` outcome per sequence, placed on the last response token; or
        per-token ``[B, T]`` (``rewards[b, t]`` is the reward of token t; column j gets
        ``rewards[:, j+1]``, so a reward on token 0 is an error) or ``[B, T−1]`` (columns).
      values: critic values; ``None`` = 0 (no critic). ``[B, T]``: the critic's output at
        each position, ``values[b, t] = V(input_ids[b, :t+1])`` (the value of the state
        after reading token t, before emitting token t+1); column j uses ``values[:, j]``,
        i.e. the columns are ``values[:, :-1]`` (verl: ``values[:, -R-1:-1]``), and
        ``values[:, T−1]`` is not used. ``[B, T−1]``: already in columns,
        ``values[b, j] = V(input_ids[b, :j+1])``. With ``V_j`` the column value,
        ``δ_j = r_j + γ·g_j·V_next(j) − V_j`` (module docstring).
      last_values: ``[B]`` value of the state after each row's last response token, used
        as ``V_next`` of its last response column (a truncated response; with ``[B, T]``
        values and the last response token at position p, that is ``values[b, p]``).
        ``None`` = 0: every response ended (terminal), as verl and OpenRLHF.
      gamma, lam, lam_critic, masked_rewards: as :func:`comppo_core.gae`.
      statistic, layers, method, query_chunk, precision, position_ids: as
        :func:`~comppo_core.hf.logprobs_and_concentration`.
      gate_params: the gate mapping of :func:`comppo_core.gates_from_concentration`
        over the response columns (default ``GateParams()``, ``normalize="causal"``: a
        column's gate z-scores its concentration against the row's response columns up to
        it, so it reads nothing after its token; ``GateParams(normalize="sequence")``
        z-scores the whole response); ``GateParams.constant(c)`` is a constant gate
        (Comp-GAE = GAE(γ·c, λ)).
      control: ``"none"``, ``"shuffle"`` (each row's gates permuted, seeded by ``seed``),
        ``"by_position"`` (batch mean gate at each response-position index) or
        ``"constant"`` (batch mean gate), as :mod:`comppo_core.controls`.

    Returns:
      :class:`CompPOBatch`, every field ``[B, T−1]`` on the model's device.
    """
    check_choice("control", control, CONTROLS)
    gate_params = as_gate_params(gate_params, "gate_params")
    ids, am = check_ids(input_ids, attention_mask)
    b, t = ids.shape
    if not isinstance(response_mask, torch.Tensor) or tuple(response_mask.shape) != (b, t - 1):
        got = tuple(response_mask.shape) if isinstance(response_mask, torch.Tensor) else type(response_mask).__name__
        raise ShapeError(
            f"response_mask: expected a tensor [B, T−1] = {[b, t - 1]} of response columns (column j is token "
            f"j+1; from a token mask m [B, T], m[:, 1:]), got {got}",
            argument="response_mask",
        )
    rm = response_mask.to(device=ids.device) != 0

    scored = score(
        model,
        ids,
        attention_mask,
        concentration=True,
        statistic=statistic,
        layers=layers,
        position_ids=position_ids,
        method=method,
        query_chunk=query_chunk,
        precision=precision,
    )
    lp, conc = scored.logprobs, scored.concentration
    assert conc is not None
    device = lp.device
    mask = rm.to(device)
    if am is not None:
        am_d = am.to(device)
        mask = mask & am_d[:, 1:] & am_d[:, :-1]

    r_in = torch.as_tensor(rewards, device=device)
    if r_in.dim() == 1:
        if r_in.shape[0] != b:
            raise ShapeError(
                f"rewards: expected [B] = [{b}] outcome scores, got {tuple(r_in.shape)}", argument="rewards"
            )
        r = _outcome_on_last(r_in.to(torch.float32), mask)
    else:
        r = _rewards_to_columns(r_in, b, t, device)
    v = torch.zeros_like(lp) if values is None else _values_to_columns(values, b, t, device)

    gates: Any = gates_from_concentration(conc, mask=mask, params=gate_params)
    if control == "shuffle":
        gates = _controls.shuffle(gates, mask=mask, seed=seed)
    elif control == "by_position":
        gates = _controls.by_position(gates, mask=mask)
    elif control == "constant":
        gates = _controls.constant(gates, mask=mask)

    lv = None if last_values is None else torch.as_tensor(last_values, device=device, dtype=torch.float32)
    comp: Any = gae(
        r,
        v,
        mask=mask,
        gates=gates,
        gamma=gamma,
        lam=lam,
        lam_critic=lam_critic,
        last_values=lv,
        masked_rewards=masked_rewards,
    )
    plain: Any = gae(
        r, v, mask=mask, gamma=gamma, lam=lam, lam_critic=lam_critic, last_values=lv, masked_rewards=masked_rewards
    )
    return CompPOBatch(
        logprobs=lp,
        concentration=conc,
        gates=gates,
        advantages=comp.advantages,
        returns=comp.returns,
        gae_advantages=plain.advantages,
        gae_returns=plain.returns,
        rewards=r,
        values=v,
        mask=mask,
    )
