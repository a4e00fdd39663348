"""Comp-GAE advantages, λ-returns and one-step TD targets (docs/design.md §3).

For one sequence, over its valid positions ``i = 0..n-1`` only (masked positions are
skipped: the recursion passes straight through them, as verl's multi-turn GAE does)::

    V_n = last_values[b] if given (truncated response) else 0 (terminal)
    δ_i = r_i + γ·g_i·V_{i+1} − V_i                     one-step gated bootstrap
    A_i = δ_i + γ·λ·g_i·A_{i+1},   A_n = 0               Comp-GAE advantage
    R_i = A^c_i + V_i                                    λ-return (A^c uses λ_critic)
    y_i = r_i + γ·g_i·V_{i+1}                            one-step TD target

``g ≡ 1`` (no gates) is exactly GAE(γ, λ); ``g ≡ c`` is GAE(γ·c, λ).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import _core
from ._arrays import (
    Layout,
    Outputs,
    as_numpy,
    check_unit,
    float_dtypes,
    kernel_result,
    layout_of,
    per_row,
    token_array,
)
from ._torch import tensor_io
from .options import MASKED_REWARD_MODES, check_choice

__all__ = ["GAEResult", "gae", "td_targets"]


class GAEResult(NamedTuple):
    """``(advantages, returns)``, each shaped like ``rewards``."""

    advantages: np.ndarray
    returns: np.ndarray


class _Inputs(NamedTuple):
    """The arrays of a GAE-family call in canonical form (see :mod:`._arrays`)."""

    originals: tuple[Any, ...]  # as given (NumPy views where they are arrays)
    compute: np.dtype
    output: np.dtype
    layout: Layout
    rewards: np.ndarray
    values: np.ndarray
    gates: np.ndarray | None
    last_values: np.ndarray | None
    gamma: float


def _prepare(
    rewards: Any, values: Any, mask: Any, cu_seqlens: Any, gates: Any, last_values: Any, gamma: Any
) -> _Inputs:
    r = as_numpy(rewards, "rewards")
    v = as_numpy(values, "values")
    compute, output = float_dtypes(r, "rewards")
    lay = layout_of(r, "rewards", mask, cu_seqlens)
    return _Inputs(
        originals=(r, v, mask, cu_seqlens, gates, last_values),
        compute=compute,
        output=output,
        layout=lay,
        rewards=token_array(r, "rewards", lay.shape, compute),
        values=token_array(v, "values", lay.shape, compute),
        gates=None if gates is None else token_array(gates, "gates", lay.shape, compute),
        last_values=per_row(last_values, "last_values", lay.rows),
        gamma=check_unit("gamma", gamma),
    )


def gae(
    rewards: Any,
    values: Any,
    *,
    mask: Any = None,
    cu_seqlens: Any = None,
    gates: Any = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    lam_critic: float | None = None,
    last_values: Any = None,
    masked_rewards: str = "error",
    out: tuple[np.ndarray, np.ndarray] | None = None,
) -> GAEResult:
    """Comp-GAE advantages and λ-returns in one pass.

    Args:
      rewards: ``[B, T]`` (padded) or ``[N]`` (packed, with ``cu_seqlens``) per-token rewards.
      values: critic values V, shaped like ``rewards``.
      mask: optional validity mask shaped like ``rewards`` (nonzero = valid token); masked
        positions are skipped by the recursion and get advantage and return 0.
      cu_seqlens: ``[B+1]`` offsets of the packed layout.
      gates: optional retention gates g in [0, 1] shaped like ``rewards`` (default 1: GAE).
      gamma: discount γ in [0, 1].
      lam: trace parameter λ in [0, 1] of the advantages.
      lam_critic: λ of the returns (decoupled GAE); defaults to ``lam``.
      last_values: optional ``[B]`` bootstrap values V_n of truncated sequences (default 0).
      masked_rewards: ``"error"`` (default) rejects a nonzero reward on a masked token,
        ``"drop"`` ignores it.
      out: optional ``(advantages, returns)`` preallocated arrays of the output dtype and
        shape, C-contiguous; they are filled and returned. On error their contents are
        unspecified.

    Returns:
      ``GAEResult(advantages, returns)`` shaped like ``rewards``, in its dtype (float16
      is computed in float32; accumulation is float64 whatever the dtype).
    """
    # Arguments in canonical form (see _arrays) are computed at once; for anything else
    # (tensors, other dtypes or layouts, bad arguments) the entry returns None and
    # _gae converts the arguments, or names the bad one, and makes the same call.
    result = _core.gae(
        rewards, values, mask, cu_seqlens, gates, last_values, out, gamma, lam, lam_critic, masked_rewards
    )
    if result is not None:
        return GAEResult(*result)
    return _gae(
        rewards,
        values,
        mask=mask,
        cu_seqlens=cu_seqlens,
        gates=gates,
        gamma=gamma,
        lam=lam,
        lam_critic=lam_critic,
        last_values=last_values,
        masked_rewards=masked_rewards,
        out=out,
    )


@tensor_io("rewards", "values", "mask", "cu_seqlens", "gates", "last_values")
def _gae(
    rewards: Any,
    values: Any,
    *,
    mask: Any,
    cu_seqlens: Any,
    gates: Any,
    gamma: float,
    lam: float,
    lam_critic: float | None,
    last_values: Any,
    masked_rewards: str,
    out: tuple[np.ndarray, np.ndarray] | None,
) -> GAEResult:
    """:func:`gae` for any arguments: puts them in canonical form (tensors, other dtypes,
    strided arrays) or raises the error that names the first bad one."""
    x = _prepare(rewards, values, mask, cu_seqlens, gates, last_values, gamma)
    lam_ = check_unit("lam", lam)
    lam_c = lam_ if lam_critic is None else check_unit("lam_critic", lam_critic)
    choice = check_choice("masked_rewards", masked_rewards, MASKED_REWARD_MODES)
    lay = x.layout
    inputs = (*x.originals, x.rewards, x.values, x.gates, lay.mask, lay.cu_seqlens, x.last_values)
    outs = Outputs(("advantages", "returns"), lay.shape, x.compute, x.output, out, inputs)
    result = _core.gae(
        x.rewards, x.values, lay.mask, lay.cu_seqlens, x.gates, x.last_values, outs.kernel, x.gamma, lam_, lam_c, choice
    )
    return GAEResult(*outs.finish(kernel_result(result, "gae")))


def td_targets(
    rewards: Any,
    values: Any,
    *,
    mask: Any = None,
    cu_seqlens: Any = None,
    gates: Any = None,
    gamma: float = 1.0,
    last_values: Any = None,
) -> np.ndarray:
    """One-step gated bootstrap targets ``y_i = r_i + γ·g_i·V_{i+1}``.

    ``V_{i+1}`` is the value of the next *valid* position of the sequence, or
    ``last_values[b]`` (default 0) after its last one. Masked positions get 0. Shapes,
    layouts and dtypes as :func:`gae`.
    """
    # As in gae: canonical arguments are computed at once, anything else is converted first.
    result = _core.td_targets(rewards, values, mask, cu_seqlens, gates, last_values, gamma)
    if result is not None:
        return result
    return _td_targets(
        rewards, values, mask=mask, cu_seqlens=cu_seqlens, gates=gates, gamma=gamma, last_values=last_values
    )


@tensor_io("rewards", "values", "mask", "cu_seqlens", "gates", "last_values")
def _td_targets(
    rewards: Any, values: Any, *, mask: Any, cu_seqlens: Any, gates: Any, gamma: float, last_values: Any
) -> np.ndarray:
    """:func:`td_targets` for any arguments: puts them in canonical form or raises the
    error that names the first bad one."""
    x = _prepare(rewards, values, mask, cu_seqlens, gates, last_values, gamma)
    lay = x.layout
    result = _core.td_targets(x.rewards, x.values, lay.mask, lay.cu_seqlens, x.gates, x.last_values, x.gamma)
    return Outputs(("targets",), lay.shape, x.compute, x.output, None, ()).finish(
        (kernel_result(result, "td_targets"),)
    )[0]
