"""Plain-NumPy reference implementations ("oracles") of the comppo-core API.

This module is the executable specification of ``comppo_core``: every fast
(Rust) kernel in the package is tested against the function of the same name
here. It is written for readability, not speed: one sequence at a time, with
plain Python loops over token positions. It depends on NumPy, the standard
library and the package's pure-Python :mod:`~comppo_core.errors`,
:mod:`~comppo_core.options` and :mod:`~comppo_core.gate_params` only, so its code
needs no compiled kernel.

Layouts (docs/design.md §2). Every per-token function accepts either:

* **padded**: 2-D arrays ``[B, T]`` and an optional ``mask`` ``[B, T]``
  (bool, int or float; nonzero = valid token). No mask = every token valid.
* **packed**: 1-D arrays ``[N]`` plus ``cu_seqlens`` ``[B+1]`` (integers,
  starting at 0, non-decreasing, ending at N), as in flash-attention "varlen";
  an optional ``mask`` ``[N]`` marks tokens inside a sequence as invalid
  (multi-turn: tool/observation tokens inside a response).

Internally both layouts are reduced to the same thing: for each sequence ``b``
the flat indices of its positions and a boolean validity vector (see
``_sequences``). Each function is then written once over "a sequence = 1-D
arrays + validity".

Numerics. All arithmetic is done in float64 (Python floats or float64 NumPy
arrays) and the result is cast once at the end. Outputs keep the dtype of the
primary array argument when it is float16, float32 or float64; any other dtype
(ints, bools, ...) gives float64 (``masked_whiten`` and the gate controls
included). ``broadcast`` and ``group_advantages`` always return float64.

Validation. The oracle assumes well-formed input (shapes, dtypes, ranges of
gamma/lambda/gates are not checked) except where a docstring says it raises.
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterator

import numpy as np
from numpy.typing import ArrayLike

from .gate_params import GateParams, as_gate_params
from .options import GROUP_METHODS, MASKED_REWARD_MODES, SINGLETON_MODES, check_choice

__all__ = [
    "GATE_STD_EPS",
    "gae",
    "td_targets",
    "gates_from_concentration",
    "shuffle_gates",
    "by_position_gates",
    "constant_gates",
    "controls",
    "group_advantages",
    "broadcast",
    "masked_whiten",
    "credit_stats",
]

#: Epsilon added to the population standard deviation in the z-score of
#: :func:`gates_from_concentration`: ``z = (c - mean) / (std + GATE_STD_EPS)``.
GATE_STD_EPS = 1e-8

_FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


# --------------------------------------------------------------------------- #
# Private helpers
# --------------------------------------------------------------------------- #


def _result_dtype(x: np.ndarray) -> np.dtype:
    """float16/float32/float64 keep their dtype; anything else -> float64."""
    return x.dtype if x.dtype in _FLOAT_DTYPES else np.dtype(np.float64)


def _sequences(
    shape: tuple[int, ...], mask: ArrayLike | None, cu_seqlens: ArrayLike | None
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yields ``(b, idx, valid)`` for each sequence ``b`` in order.

    ``idx`` are the flat indices (into ``arr.reshape(-1)``) of all positions of
    sequence ``b``, in order (padded: row ``b``; packed:
    ``cu_seqlens[b]:cu_seqlens[b+1]``), and ``valid`` is a bool array of the same
    length (``mask != 0`` at those positions; all True without a mask).
    The position of ``idx[k]`` inside its sequence is ``k``.

    Args:
      shape: shape of the per-token arrays: ``(B, T)`` padded or ``(N,)`` packed.
      mask: ``None`` or an array of that shape; nonzero = valid.
      cu_seqlens: ``None`` (padded layout) or ``[B+1]`` integer offsets (packed).
    """
    shape = tuple(shape)
    if mask is None:
        valid_flat = np.ones(int(np.prod(shape)), dtype=bool)
    else:
        valid_flat = (np.asarray(mask) != 0).reshape(-1)

    if cu_seqlens is None:
        if len(shape) != 2:
            raise ValueError(
                f"padded layout expects 2-D [B, T] arrays, got shape {shape}; "
                "pass cu_seqlens for the packed (1-D) layout"
            )
        n_rows, n_cols = shape
        for b in range(n_rows):
            idx = np.arange(b * n_cols, (b + 1) * n_cols)
            yield b, idx, valid_flat[idx]
    else:
        if len(shape) != 1:
            raise ValueError(f"packed layout (cu_seqlens given) expects 1-D [N] arrays, got shape {shape}")
        cu = np.asarray(cu_seqlens).astype(np.int64).reshape(-1)
        for b in range(len(cu) - 1):
            idx = np.arange(int(cu[b]), int(cu[b + 1]))
            yield b, idx, valid_flat[idx]


def _next_valid_values(v_flat: np.ndarray, positions: np.ndarray, v_end: float) -> list[float]:
    """``V_{i+1}`` for each valid position ``i`` of one sequence.

    ``positions`` are the flat indices of the sequence's valid positions in
    order; the successor of the last one is ``v_end`` (``last_values[b]`` or 0).
    """
    values = [float(v_flat[j]) for j in positions]
    return values[1:] + [v_end]


def _causal_zscore(vals: np.ndarray, min_spread: float = 0.0) -> np.ndarray:
    """``z_t = _zscore(vals[: t + 1], min_spread)[-1]``: each value's z-score among the
    values up to and including it (the first value, and any value whose prefix has zero
    spread, get 0).
    """
    vals = np.asarray(vals, dtype=np.float64)
    return np.array([_zscore(vals[: t + 1], min_spread)[-1] for t in range(vals.size)], dtype=np.float64)


def _zscore(vals: np.ndarray, min_spread: float = 0.0) -> np.ndarray:
    """``(c - mean) / (max(std, min_spread) + GATE_STD_EPS)`` in float64, population std
    (ddof 0); ``min_spread = 0`` is the plain ``(c - mean) / (std + GATE_STD_EPS)``.

    A single value, or values that are all equal (``max == min``), give 0
    exactly. An empty input gives an empty output.
    """
    vals = np.asarray(vals, dtype=np.float64)
    if vals.size <= 1 or vals.max() == vals.min():
        return np.zeros_like(vals)
    mean = vals.mean()
    std = vals.std()  # ddof=0
    if min_spread > 0.0:
        std = max(std, min_spread)
    return (vals - mean) / (std + GATE_STD_EPS)


# --------------------------------------------------------------------------- #
# Comp-GAE and one-step targets (docs/design.md §3)
# --------------------------------------------------------------------------- #


def gae(
    rewards: ArrayLike,
    values: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    cu_seqlens: ArrayLike | None = None,
    gates: ArrayLike | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    lam_critic: float | None = None,
    last_values: ArrayLike | None = None,
    masked_rewards: str = "error",
) -> tuple[np.ndarray, np.ndarray]:
    """Comp-GAE (gated generalized advantage estimation) and lambda-returns.

    For each sequence keep only its valid positions, in order ``i = 0..n-1``
    (masked positions are skipped: the recursion passes straight through them,
    as in verl's multi-turn GAE). With ``g_i`` the gates (1 when ``gates`` is
    None)::

      V_n    = last_values[b] if last_values is given else 0
      δ_i    = r_i + γ g_i V_{i+1} − V_i
      A_i    = δ_i + γ λ g_i A_{i+1},          A_n = 0
      A^c_i  = δ_i + γ λ_critic g_i A^c_{i+1}, A^c_n = 0
      R_i    = A^c_i + V_i

    Closed form: ``A_i = Σ_k (Π_{j=i}^{i+k-1} γ λ g_j) δ_{i+k}``. With ``g ≡ 1``
    this is standard GAE(γ, λ); with ``g ≡ c`` it is GAE(γ c, λ).

    Operation order (float64, every input element converted with ``float()``;
    ``a_next = ac_next = 0`` and ``v_next = V_n`` before the last valid
    position), iterating ``i = n-1 .. 0``::

      gg    = gamma * g
      delta = r + gg * v_next - v          # i.e. (r + (gg * v_next)) - v
      a     = delta + (gg * lam) * a_next
      ac    = delta + (gg * lam_critic) * ac_next
      ret   = ac + v
      a_next, ac_next, v_next = a, ac, v

    The final float64 values are cast to the output dtype once.

    The Rust kernel computes the same terms but evaluates the recursion over blocks
    of four consecutive valid positions (``A_k = S_k + P_k·A'``, ``A'`` the advantage
    just after the block; see ``rust/gae.rs``), so it agrees with this loop to float64
    rounding of the reassociated sums, not bit for bit.

    Args:
      rewards: ``[B, T]`` (padded) or ``[N]`` (packed) per-token rewards r.
      values: same shape, critic values V.
      mask: optional, same shape; nonzero = valid token.
      cu_seqlens: ``[B+1]`` sequence offsets for the packed layout, else None.
      gates: optional, same shape, retention gates g (1 when None). Only valid
        positions are read.
      gamma: discount γ.
      lam: trace parameter λ of the actor's advantages.
      lam_critic: trace parameter of the critic's returns (defaults to ``lam``).
      last_values: optional ``[B]``; bootstrap value V_n after each sequence's
        last valid token (truncated responses). None = terminal (V_n = 0).
      masked_rewards: ``"error"``: a nonzero reward (NaN included) at a masked
        position raises ValueError naming the first offending (row, position),
        where position is the index inside the sequence (column for padded,
        offset from ``cu_seqlens[b]`` for packed); ``"drop"``: such rewards are
        ignored.

    Returns:
      ``(advantages, returns)``, both shaped like ``rewards``, 0 at masked
      positions. dtype: that of ``rewards`` if float16/32/64, else float64.

    Raises:
      ValueError: unknown ``masked_rewards`` (a ``ParameterError``,
        :func:`comppo_core.options.check_choice`), or a masked nonzero reward when
        ``masked_rewards="error"``.
    """
    check_choice("masked_rewards", masked_rewards, MASKED_REWARD_MODES)
    rewards = np.asarray(rewards)
    r_flat = rewards.reshape(-1)
    v_flat = np.asarray(values).reshape(-1)
    g_flat = None if gates is None else np.asarray(gates).reshape(-1)
    lv = None if last_values is None else np.asarray(last_values).reshape(-1)
    gamma = float(gamma)
    lam = float(lam)
    lam_critic = lam if lam_critic is None else float(lam_critic)

    adv = np.zeros(r_flat.shape, dtype=np.float64)
    ret = np.zeros(r_flat.shape, dtype=np.float64)

    for b, idx, valid in _sequences(rewards.shape, mask, cu_seqlens):
        if masked_rewards == "error":
            for k in np.flatnonzero(~valid):
                r = r_flat[idx[k]]
                if r != 0:  # NaN != 0 is True as well
                    raise ValueError(
                        f"rewards: nonzero reward {r!r} at masked position "
                        f"(row {b}, position {int(k)}); rewards on masked/padding "
                        "tokens would be silently dropped. Pass "
                        "masked_rewards='drop' to allow it."
                    )

        positions = idx[valid]
        a_next = 0.0
        ac_next = 0.0
        v_next = 0.0 if lv is None else float(lv[b])
        for j in positions[::-1]:
            r = float(r_flat[j])
            v = float(v_flat[j])
            g = 1.0 if g_flat is None else float(g_flat[j])
            gg = gamma * g
            delta = r + gg * v_next - v
            a = delta + (gg * lam) * a_next
            ac = delta + (gg * lam_critic) * ac_next
            adv[j] = a
            ret[j] = ac + v
            a_next, ac_next, v_next = a, ac, v

    dtype = _result_dtype(rewards)
    return (
        adv.astype(dtype).reshape(rewards.shape),
        ret.astype(dtype).reshape(rewards.shape),
    )


def td_targets(
    rewards: ArrayLike,
    values: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    cu_seqlens: ArrayLike | None = None,
    gates: ArrayLike | None = None,
    gamma: float = 1.0,
    last_values: ArrayLike | None = None,
) -> np.ndarray:
    """One-step gated bootstrap (TD(0)) targets.

    On the valid positions ``i = 0..n-1`` of each sequence (masked positions
    skipped, as in :func:`gae`)::

      y_i = r_i + γ g_i V_{i+1},   V_n = last_values[b] if given else 0

    where ``V_{i+1}`` is the value at the next *valid* position.

    Operation order (float64, elements converted with ``float()``)::

      gg = gamma * g
      y  = r + gg * v_next

    Args:
      rewards: ``[B, T]`` or ``[N]`` rewards r.
      values: same shape, values V.
      mask: optional, same shape; nonzero = valid.
      cu_seqlens: ``[B+1]`` offsets for the packed layout, else None.
      gates: optional, same shape, gates g (1 when None).
      gamma: discount γ.
      last_values: optional ``[B]`` bootstrap values after each sequence.

    Returns:
      ``y`` shaped like ``rewards``, 0 at masked positions; dtype as :func:`gae`.
      Rewards at masked positions are ignored (no check).
    """
    rewards = np.asarray(rewards)
    r_flat = rewards.reshape(-1)
    v_flat = np.asarray(values).reshape(-1)
    g_flat = None if gates is None else np.asarray(gates).reshape(-1)
    lv = None if last_values is None else np.asarray(last_values).reshape(-1)
    gamma = float(gamma)

    y = np.zeros(r_flat.shape, dtype=np.float64)
    for b, idx, valid in _sequences(rewards.shape, mask, cu_seqlens):
        positions = idx[valid]
        v_end = 0.0 if lv is None else float(lv[b])
        v_nexts = _next_valid_values(v_flat, positions, v_end)
        for j, v_next in zip(positions, v_nexts):
            r = float(r_flat[j])
            g = 1.0 if g_flat is None else float(g_flat[j])
            gg = gamma * g
            y[j] = r + gg * v_next

    return y.astype(_result_dtype(rewards)).reshape(rewards.shape)


# --------------------------------------------------------------------------- #
# Gate mapping and controls (docs/design.md §4)
# --------------------------------------------------------------------------- #


def gates_from_concentration(
    conc: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    cu_seqlens: ArrayLike | None = None,
    params: GateParams | None = None,
) -> np.ndarray:
    """Maps per-token concentration to a bounded retention gate.

    On valid tokens, in float64::

      z = normalize(c)
            "causal":   (c_t - mean_{s<=t}) / (max(std_{s<=t}, min_spread) + GATE_STD_EPS)
            "sequence": (c - mean_row) / (max(std_row, min_spread) + GATE_STD_EPS)
            "batch":    (c - mean_all) / (max(std_all, min_spread) + GATE_STD_EPS)
            "none":     (c - center) / scale                (min_spread not used)
      z = -z                       if invert
      g = low + (high - low) * (1 / (1 + exp(-sharpness * z)))

    mean/std are over the valid tokens s <= t of the row ("causal": token t's
    prefix, so its gate depends on nothing after it), over the valid tokens of
    the row ("sequence") or of the whole batch ("batch"); std is the population
    std (ddof 0); ``min_spread`` (default 0: no floor) is a floor on the spread
    the z-score divides by, so values that vary by much less than it keep
    ``|z|`` small. A row (or batch, or prefix) with a single valid token, or
    whose valid values are all equal (max == min), gets ``z = 0`` exactly, i.e.
    ``g = low + (high - low) / 2``.
    ``low == high`` gives a constant gate. Masked positions get ``g = 1``.

    Args:
      conc: ``[B, T]`` or ``[N]`` concentration c.
      mask: optional, same shape; nonzero = valid.
      cu_seqlens: ``[B+1]`` offsets for the packed layout, else None.
      params: the mapping, a :class:`~comppo_core.GateParams` (None: ``GateParams()``),
        as in :func:`comppo_core.gates_from_concentration`; its fields are:
        ``low``, ``high``: gate range, ``0 <= low <= high <= 1``;
        ``sharpness``: slope of the sigmoid;
        ``normalize``: "causal" (the default), "sequence", "batch" or "none";
        ``center``, ``scale``: used only by ``normalize="none"``;
        ``invert``: flip the sign of z (high concentration -> low gate);
        ``min_spread``: floor on the z-score's std (not used by ``"none"``).
        (GateParams validates them; the oracle does not check them again.)

    Returns:
      ``g`` shaped like ``conc``; dtype of ``conc`` if float16/32/64, else
      float64.

    Raises:
      ValueError: ``params`` not a GateParams (a ``ParameterError`` naming ``params``).
    """
    p = as_gate_params(params)
    low, high, sharpness, normalize = p.low, p.high, p.sharpness, p.normalize
    center, scale, invert, floor = p.center, p.scale, p.invert, p.min_spread
    conc = np.asarray(conc)
    c_flat = conc.reshape(-1)
    seqs = list(_sequences(conc.shape, mask, cu_seqlens))

    z = np.zeros(c_flat.shape, dtype=np.float64)
    if normalize == "causal":
        for _, idx, valid in seqs:
            positions = idx[valid]
            z[positions] = _causal_zscore(c_flat[positions], floor)
    elif normalize == "sequence":
        for _, idx, valid in seqs:
            positions = idx[valid]
            z[positions] = _zscore(c_flat[positions], floor)
    elif normalize == "batch":
        positions = np.concatenate([idx[valid] for _, idx, valid in seqs] + [np.zeros(0, dtype=np.int64)])
        z[positions] = _zscore(c_flat[positions], floor)
    else:  # "none"
        for _, idx, valid in seqs:
            positions = idx[valid]
            z[positions] = (c_flat[positions].astype(np.float64) - center) / scale

    if invert:
        z = -z

    g = np.ones(c_flat.shape, dtype=np.float64)  # masked positions: 1
    with np.errstate(over="ignore"):  # exp overflow -> inf -> sigmoid 0, as intended
        for _, idx, valid in seqs:
            positions = idx[valid]
            sig = 1.0 / (1.0 + np.exp(-sharpness * z[positions]))
            g[positions] = low + (high - low) * sig

    return g.astype(_result_dtype(conc)).reshape(conc.shape)


def shuffle_gates(
    gates: ArrayLike, *, mask: ArrayLike | None = None, cu_seqlens: ArrayLike | None = None, seed: int = 0
) -> np.ndarray:
    """Control: permutes each row's valid gates among that row's valid positions.

    Deterministic definition: one random key per valid token, drawn once for the
    whole batch in row-major order, and each row's valid gates reordered by key::

      keys = np.random.default_rng(seed).random(total number of valid tokens)
      for b in 0..B-1:
          keys_b = the next n_valid_b keys
          new_valid_b = valid_values_b[argsort(keys_b)]

    Keeps each row's multiset of gates but destroys their alignment with the
    trajectory. Masked positions keep their input value.

    Args:
      gates: ``[B, T]`` or ``[N]`` gates.
      mask: optional, same shape; nonzero = valid.
      cu_seqlens: ``[B+1]`` offsets for the packed layout, else None.
      seed: seed of ``np.random.default_rng``.

    Returns:
      Array shaped like ``gates``; dtype of ``gates`` if float16/32/64, else
      float64.
    """
    gates = np.asarray(gates)
    out = gates.astype(_result_dtype(gates), copy=True).reshape(-1)
    seqs = list(_sequences(gates.shape, mask, cu_seqlens))
    keys = np.random.default_rng(seed).random(sum(int(valid.sum()) for _, _, valid in seqs))
    used = 0
    for _, idx, valid in seqs:
        positions = idx[valid]
        keys_b = keys[used : used + len(positions)]
        used += len(positions)
        out[positions] = out[positions][np.argsort(keys_b, kind="stable")]
    return out.reshape(gates.shape)


def by_position_gates(
    gates: ArrayLike, *, mask: ArrayLike | None = None, cu_seqlens: ArrayLike | None = None
) -> np.ndarray:
    """Control: replaces each gate by the batch mean gate at its valid-position index.

    For a row's k-th valid token (k = 0 for its first valid token)::

      g'_{b,k} = mean over rows b' that have a k-th valid token of g_{b',k}

    (mean in float64). Keeps the average position profile, drops everything
    trajectory-specific. Masked positions keep their input value.

    Args:
      gates: ``[B, T]`` or ``[N]`` gates.
      mask: optional, same shape; nonzero = valid.
      cu_seqlens: ``[B+1]`` offsets for the packed layout, else None.

    Returns:
      Array shaped like ``gates``; dtype as :func:`shuffle_gates`.
    """
    gates = np.asarray(gates)
    g_flat = gates.reshape(-1)
    out = gates.astype(_result_dtype(gates), copy=True).reshape(-1)
    seqs = list(_sequences(gates.shape, mask, cu_seqlens))

    per_index: list[list[float]] = []  # per_index[k]: gates at valid-position k
    for _, idx, valid in seqs:
        for k, j in enumerate(idx[valid]):
            if k == len(per_index):
                per_index.append([])
            per_index[k].append(float(g_flat[j]))
    means = [float(np.mean(np.asarray(vals, dtype=np.float64))) for vals in per_index]

    for _, idx, valid in seqs:
        for k, j in enumerate(idx[valid]):
            out[j] = means[k]
    return out.reshape(gates.shape)


def constant_gates(
    gates: ArrayLike, *, mask: ArrayLike | None = None, cu_seqlens: ArrayLike | None = None
) -> np.ndarray:
    """Control: replaces every valid gate by the mean of all valid gates in the batch.

    ``g' = mean_{valid (b, i)} g_{b,i}`` (float64). With no valid token the
    input is returned unchanged (as a copy). Masked positions keep their input
    value.

    Args:
      gates: ``[B, T]`` or ``[N]`` gates.
      mask: optional, same shape; nonzero = valid.
      cu_seqlens: ``[B+1]`` offsets for the packed layout, else None.

    Returns:
      Array shaped like ``gates``; dtype as :func:`shuffle_gates`.
    """
    gates = np.asarray(gates)
    g_flat = gates.reshape(-1)
    out = gates.astype(_result_dtype(gates), copy=True).reshape(-1)
    positions = np.concatenate(
        [idx[valid] for _, idx, valid in _sequences(gates.shape, mask, cu_seqlens)] + [np.zeros(0, dtype=np.int64)]
    )
    if positions.size:
        out[positions] = float(np.mean(g_flat[positions].astype(np.float64)))
    return out.reshape(gates.shape)


#: Namespace mirroring ``comppo_core.controls``: ``controls.shuffle``,
#: ``controls.by_position``, ``controls.constant``.
controls = types.SimpleNamespace(
    shuffle=shuffle_gates,
    by_position=by_position_gates,
    constant=constant_gates,
)


# --------------------------------------------------------------------------- #
# Outcome advantages, whitening, diagnostics (docs/design.md §5)
# --------------------------------------------------------------------------- #


def group_advantages(
    scores: ArrayLike,
    groups: ArrayLike,
    *,
    method: str = "grpo",
    eps: float = 1e-6,
    singleton: str = "zero",
) -> np.ndarray:
    """Group-relative outcome advantages, one per sequence.

    For each group G (the indices with equal id; ids in any order), n = |G|,
    in float64, with μ the group mean and σ the unbiased (ddof 1) group std::

      "grpo":               a_i = (s_i - μ) / (σ + eps)
      "drgrpo":             a_i = s_i - μ
      "rloo":               a_i = s_i - (total - s_i) / (n - 1),  total = Σ_G s
      "reinforce_baseline": a_i = s_i - μ

    Special cases, checked in this order:

    * a group of size 1: ``a = 0`` if ``singleton="zero"``, ``a = s`` if
      ``singleton="raw"`` (every method);
    * a group whose scores are all equal: ``a = 0`` exactly (never NaN), every
      method.

    Args:
      scores: ``[B]`` floats, one outcome score per sequence.
      groups: ``[B]`` integer group ids.
      method: "grpo", "drgrpo", "rloo" or "reinforce_baseline".
      eps: added to σ for "grpo".
      singleton: "zero" or "raw".

    Returns:
      ``[B]`` float64 advantages.

    Raises:
      ValueError: unknown ``method``/``singleton`` (a ``ParameterError``), or a NaN/±inf score (the
        message names the first offending index).
    """
    check_choice("method", method, GROUP_METHODS)
    check_choice("singleton", singleton, SINGLETON_MODES)
    s_all = np.asarray(scores, dtype=np.float64).reshape(-1)
    ids = np.asarray(groups).reshape(-1)
    for i, score in enumerate(s_all):
        if not math.isfinite(score):
            raise ValueError(f"scores: non-finite score {score!r} at index {i}")
    eps = float(eps)

    members: dict[object, list[int]] = {}
    for i, gid in enumerate(ids.tolist()):
        members.setdefault(gid, []).append(i)

    out = np.zeros(s_all.shape, dtype=np.float64)
    for positions in members.values():
        idx = np.asarray(positions, dtype=np.int64)
        s = s_all[idx]
        n = len(idx)
        if n == 1:
            out[idx] = 0.0 if singleton == "zero" else s
            continue
        if np.all(s == s[0]):
            out[idx] = 0.0
            continue
        mean = s.mean()
        if method == "grpo":
            std = s.std(ddof=1)
            out[idx] = (s - mean) / (std + eps)
        elif method in ("drgrpo", "reinforce_baseline"):
            out[idx] = s - mean
        else:  # "rloo"
            total = s.sum()
            out[idx] = s - (total - s) / (n - 1)
    return out


def broadcast(
    per_sequence: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    cu_seqlens: ArrayLike | None = None,
    like: ArrayLike | None = None,
) -> np.ndarray:
    """Broadcasts one value per sequence to that sequence's valid tokens.

    ``x_{b,i} = a_b`` at valid positions, 0 at masked positions.

    The token shape comes from ``mask`` if given, else from ``like`` (any
    array; only its shape is used), else, for the packed layout, from
    ``cu_seqlens`` (``N = cu_seqlens[-1]``, all valid). The padded layout needs
    ``mask`` or ``like``.

    Args:
      per_sequence: ``[B]`` values.
      mask: optional ``[B, T]`` (padded) or ``[N]`` (packed); nonzero = valid.
      cu_seqlens: ``[B+1]`` offsets for the packed layout, else None.
      like: optional array giving the token shape when ``mask`` is None.

    Returns:
      ``[B, T]`` or ``[N]`` float64.

    Raises:
      ValueError: padded layout with neither ``mask`` nor ``like``.
    """
    a = np.asarray(per_sequence, dtype=np.float64).reshape(-1)
    if mask is not None:
        shape = np.shape(mask)
    elif like is not None:
        shape = np.shape(like)
    elif cu_seqlens is not None:
        shape = (int(np.asarray(cu_seqlens).reshape(-1)[-1]),)
    else:
        raise ValueError("broadcast: the padded layout needs `mask` or `like` to know the token shape [B, T]")
    out = np.zeros(int(np.prod(shape)), dtype=np.float64)
    for b, idx, valid in _sequences(shape, mask, cu_seqlens):
        out[idx[valid]] = a[b]
    return out.reshape(shape)


def masked_whiten(
    x: ArrayLike,
    *,
    mask: ArrayLike | None = None,
    cu_seqlens: ArrayLike | None = None,
    shift_mean: bool = True,
    eps: float = 1e-8,
) -> np.ndarray:
    """Whitens over all valid tokens of the batch (as verl's ``masked_whiten``).

    With μ and the *unbiased* variance σ² (ddof 1) over the valid tokens::

      w = (x - μ) · 1/sqrt(σ² + eps)
      w = w + μ                      if not shift_mean

    Computed in float64: ``μ = Σ x / n``, ``σ² = Σ (x - μ)² / (n - 1)``.
    Masked positions are 0.

    Args:
      x: ``[B, T]`` or ``[N]``.
      mask: optional, same shape; nonzero = valid.
      cu_seqlens: ``[B+1]`` offsets for the packed layout, else None.
      shift_mean: if False, the mean is added back after scaling.
      eps: added to the variance.

    Returns:
      Array shaped like ``x``; dtype of ``x`` if float16/32/64, else float64.

    Raises:
      ValueError: fewer than 2 valid tokens.
    """
    x = np.asarray(x)
    x_flat = x.reshape(-1)
    positions = np.concatenate(
        [idx[valid] for _, idx, valid in _sequences(x.shape, mask, cu_seqlens)] + [np.zeros(0, dtype=np.int64)]
    )
    n = positions.size
    if n < 2:
        raise ValueError(f"masked_whiten needs at least 2 valid tokens for an unbiased variance, got {n}")
    vals = x_flat[positions].astype(np.float64)
    mean = vals.sum() / n
    var = ((vals - mean) ** 2).sum() / (n - 1)
    # verl: * rsqrt(var + eps); zero spread with eps = 0 whitens to 0, not NaN
    scale = 1.0 / math.sqrt(var + float(eps)) if var + float(eps) > 0 else 0.0
    w = (vals - mean) * scale
    if not shift_mean:
        w = w + mean
    out = np.zeros(x_flat.shape, dtype=np.float64)
    out[positions] = w
    return out.astype(_result_dtype(x)).reshape(x.shape)


def credit_stats(
    x: ArrayLike, *, mask: ArrayLike | None = None, cu_seqlens: ArrayLike | None = None
) -> dict[str, float]:
    """Diagnostics of a per-token credit array over its valid tokens.

    With the n valid values x (float64) and a = |x|::

      mean, std (population, ddof 0), min, max
      frac_positive         = #{x > 0} / n
      gini                  = Σ_i Σ_j |a_i - a_j| / (2 n² mean(a))   (0.0 if Σ a = 0)
      effective_token_ratio = exp(H) / n,  p = a / Σ a,  H = -Σ p log p
                              (0 log 0 = 0; 1.0 if Σ a = 0)

    Credit on one of n tokens gives gini = 1 - 1/n and
    effective_token_ratio = 1/n; credit spread evenly gives gini = 0 and
    effective_token_ratio = 1. All-zero credit is treated as "even" for the
    ratio (1.0) and gives gini 0.0.

    The double sum is evaluated with the exact identity, for a sorted
    ascending (0-based index i)::

      Σ_i Σ_j |a_i - a_j| = 2 Σ_i (2 i - n + 1) a_(i)

    Args:
      x: ``[B, T]`` or ``[N]``.
      mask: optional, same shape; nonzero = valid.
      cu_seqlens: ``[B+1]`` offsets for the packed layout, else None.

    Returns:
      dict with keys "mean", "std", "min", "max", "frac_positive", "gini",
      "effective_token_ratio"; plain Python floats.

    Raises:
      ValueError: no valid token.
    """
    x = np.asarray(x)
    x_flat = x.reshape(-1)
    positions = np.concatenate(
        [idx[valid] for _, idx, valid in _sequences(x.shape, mask, cu_seqlens)] + [np.zeros(0, dtype=np.int64)]
    )
    n = positions.size
    if n == 0:
        raise ValueError("credit_stats needs at least 1 valid token, got 0")
    vals = x_flat[positions].astype(np.float64)
    a = np.abs(vals)
    total = float(a.sum())

    if total == 0.0:
        gini = 0.0
        ratio = 1.0
    else:
        a_sorted = np.sort(a)
        ranks = np.arange(n, dtype=np.float64)
        abs_diff_sum = 2.0 * float(((2.0 * ranks - n + 1.0) * a_sorted).sum())
        gini = abs_diff_sum / (2.0 * n * n * (total / n))
        p = a / total
        p = p[p > 0]
        entropy = float(-(p * np.log(p)).sum())
        ratio = math.exp(entropy) / n

    return {
        "mean": float(vals.mean()),
        "std": float(vals.std()),
        "min": float(vals.min()),
        "max": float(vals.max()),
        "frac_positive": float(np.count_nonzero(vals > 0)) / n,
        "gini": float(gini),
        "effective_token_ratio": float(ratio),
    }
