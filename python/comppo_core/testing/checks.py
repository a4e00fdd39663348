"""Property-based conformance checks of users' own advantage code.

:func:`check_gae` and :func:`check_group_advantages` run a Hypothesis property test of a
user's function against the plain-NumPy oracles of :mod:`comppo_core.reference`. On
failure they raise :class:`ConformanceError` (an ``AssertionError``) for the *shrunk*
counterexample, with a per-token table of the first row that differs.

Expected values (all in float64, from the example's arrays converted exactly to float64):

* ``semantics="skip"`` (verl, ``comppo_core.gae``): masked tokens are skipped, so for
  each row keep its valid positions ``i = 0..n-1`` and::

      V_n = last_values[b] if truncation else 0
      δ_i = r_i + γ·g_i·V_{i+1} − V_i
      A_i = δ_i + γ·λ·g_i·A_{i+1},   A_n = 0
      R_i = A_i + V_i

  = ``reference.gae(rewards, values, mask=mask, gates=gates, last_values=last_values,
  masked_rewards="drop")``.
* ``semantics="decay"`` (OpenRLHF's ``get_advantages_and_returns``): rewards and values
  are multiplied by the mask and *every* position of the row (or packed sequence) is
  stepped, so a masked token inside a response contributes ``V = r = 0`` but still
  decays the trace by ``γ·λ·g``: ``reference.gae(rewards·mask, values·mask,
  gates=gates)`` with no mask. There is no bootstrap value (``truncation=False``).
* ``whiten=True`` (verl's ``compute_gae_advantage_return``): the expected advantages are
  ``reference.masked_whiten(A, mask=mask)`` — ``(A − μ)/sqrt(σ² + 1e-8)`` with μ and the
  unbiased σ² over all valid tokens of the batch — and the returns stay unwhitened.

Only valid positions (``mask != 0``) are compared; what a function writes at masked
positions is free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from .. import reference
from ..errors import ParameterError
from ..options import GROUP_METHODS, SINGLETON_MODES, check_choice
from .strategies import (
    ARRAY_KINDS,
    DTYPES,
    GROUPINGS,
    LAYOUTS,
    MASKED_REWARDS,
    PADDINGS,
    GAEExample,
    GroupExample,
    _check_bool,
    _check_int,
    _check_subset,
    _torch,
    gae_examples,
    group_examples,
    long_gae_examples,
    to_numpy,
)

__all__ = [
    "GROUP_METHODS",
    "RTOL_ULPS",
    "SEMANTICS",
    "ConformanceError",
    "check_gae",
    "check_group_advantages",
    "default_gae_call",
    "default_group_call",
    "expected_gae",
    "expected_group_advantages",
]

#: GAE semantics: ``"skip"`` (verl, comppo-core) and ``"decay"`` (OpenRLHF).
SEMANTICS = ("skip", "decay")
#: Tolerances are this many units of roundoff of the output dtype (u = 2⁻²⁴ for
#: float32, 2⁻⁵³ for float64) times a magnitude; see :func:`check_gae`.
RTOL_ULPS = 8.0
#: Whitening epsilon of verl's ``masked_whiten`` (and comppo-core's).
WHITEN_EPS = 1e-8

_U64 = float(np.finfo(np.float64).eps) / 2


class ConformanceError(AssertionError):
    """A user's function disagrees with the reference (or crashed, or returned the wrong
    shape, or modified its inputs) on ``example``.

    Attributes:
      example: the (shrunk) :class:`GAEExample` or :class:`GroupExample`, NumPy arrays.
      output: ``"advantages"`` or ``"returns"`` (GAE), ``"advantages"`` (groups), or None
        when the failure is not a numeric difference.
      row, position: of the first difference (GAE), else None. ``position`` is the
        column for the padded layout and the offset inside the sequence for packed.
      index: of the first difference (groups), else None.
    """

    def __init__(
        self,
        message: str,
        *,
        example: Any = None,
        output: str | None = None,
        row: int | None = None,
        position: int | None = None,
        index: int | None = None,
    ) -> None:
        super().__init__(message)
        self.example = example
        self.output = output
        self.row = row
        self.position = position
        self.index = index


# --------------------------------------------------------------------------- #
# Calling conventions
# --------------------------------------------------------------------------- #


def default_gae_call(example: GAEExample, fn: Callable[..., Any]) -> Any:
    """The default calling convention of :func:`check_gae` (that of ``comppo_core.gae``)::

        fn(rewards, values, mask=mask, gamma=gamma, lam=lam
           [, gates=gates]            # gated=True
           [, last_values=last_values]  # truncation=True
           [, cu_seqlens=cu_seqlens])   # packed layout

    Keywords that do not apply are not passed.
    """
    kwargs: dict[str, Any] = {"mask": example.mask, "gamma": example.gamma, "lam": example.lam}
    if example.gates is not None:
        kwargs["gates"] = example.gates
    if example.last_values is not None:
        kwargs["last_values"] = example.last_values
    if example.cu_seqlens is not None:
        kwargs["cu_seqlens"] = example.cu_seqlens
    return fn(example.rewards, example.values, **kwargs)


def default_group_call(example: GroupExample, fn: Callable[..., Any]) -> Any:
    """The default calling convention of :func:`check_group_advantages`:
    ``fn(scores, groups)``."""
    return fn(example.scores, example.groups)


def _describe_gae_call(example: GAEExample) -> str:
    parts = ["rewards", "values", "mask=mask", f"gamma={example.gamma!r}", f"lam={example.lam!r}"]
    if example.gates is not None:
        parts.append("gates=gates")
    if example.last_values is not None:
        parts.append("last_values=last_values")
    if example.cu_seqlens is not None:
        parts.append("cu_seqlens=cu_seqlens")
    return f"fn({', '.join(parts)})"


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn))


# --------------------------------------------------------------------------- #
# Expected values and tolerances
# --------------------------------------------------------------------------- #


@dataclass
class _GAEReference:
    """Flat float64 expectations, tolerances and what is compared."""

    advantages: np.ndarray
    returns: np.ndarray
    tol_advantages: np.ndarray
    tol_returns: np.ndarray
    compared: np.ndarray  # bool, the valid positions


def _unit_roundoff(dtype: str) -> float:
    return float(np.finfo(np.dtype(dtype)).eps) / 2


def _gae_reference(example: GAEExample, semantics: str, whiten: bool) -> _GAEReference:
    ex = example.numpy()
    shape = tuple(ex.rewards.shape)
    r = np.asarray(ex.rewards, dtype=np.float64).reshape(-1)
    v = np.asarray(ex.values, dtype=np.float64).reshape(-1)
    m = np.asarray(ex.mask, dtype=np.float64).reshape(-1)
    valid = m != 0
    g = None if ex.gates is None else np.asarray(ex.gates, dtype=np.float64).reshape(-1)
    lv = None if ex.last_values is None else np.asarray(ex.last_values, dtype=np.float64).reshape(-1)
    cu = None if ex.cu_seqlens is None else np.asarray(ex.cu_seqlens, dtype=np.int64)
    if semantics == "skip":
        r_e, v_e, stepped = r, v, valid
    else:
        if lv is not None:
            raise ParameterError(
                "last_values: semantics='decay' (OpenRLHF) has no bootstrap value; draw examples with truncation=False",
                argument="last_values",
            )
        r_e, v_e, stepped = r * m, v * m, np.ones_like(valid)
    mask_arg = stepped.reshape(shape) if semantics == "skip" else None
    gates_arg = None if g is None else g.reshape(shape)

    adv, ret = reference.gae(
        r_e.reshape(shape),
        v_e.reshape(shape),
        mask=mask_arg,
        cu_seqlens=cu,
        gates=gates_arg,
        gamma=ex.gamma,
        lam=ex.lam,
        last_values=lv,
        masked_rewards="drop",
    )
    a = np.asarray(adv, dtype=np.float64).reshape(-1)
    rt = np.asarray(ret, dtype=np.float64).reshape(-1)

    # Magnitudes of the terms of the last recursion step that produced each output:
    # m_i = |r_i| + γ·g_i·|V_{i+1}| + |V_i| + γ·λ·g_i·|A_{i+1}| (next *stepped* position).
    v_next = np.zeros_like(a)
    a_next = np.zeros_like(a)
    n_steps = np.zeros_like(a)
    for b, seq in enumerate(ex.sequences()):
        pos = seq[stepped[seq]]
        if pos.size == 0:
            continue
        v_next[pos[:-1]] = v_e[pos[1:]]
        v_next[pos[-1]] = 0.0 if (lv is None or semantics == "decay") else lv[b]
        a_next[pos[:-1]] = a[pos[1:]]
        n_steps[pos] = pos.size
    gg = ex.gamma * (np.ones_like(a) if g is None else g)
    terms = np.abs(r_e) + gg * np.abs(v_next) + np.abs(v_e)
    local = terms + gg * ex.lam * np.abs(a_next)
    # S_i = Σ_k (Π γλg) · terms_{i+k}: the whole sum's magnitude, for a float64 floor.
    s_all = np.asarray(
        reference.gae(
            terms.reshape(shape),
            np.zeros(shape),
            mask=mask_arg,
            cu_seqlens=cu,
            gates=gates_arg,
            gamma=ex.gamma,
            lam=ex.lam,
            masked_rewards="drop",
        )[0],
        dtype=np.float64,
    ).reshape(-1)
    rtol = RTOL_ULPS * _unit_roundoff(ex.dtype)
    # + the dtype's smallest normal number: results below it underflow (flush to 0).
    tol_a = rtol * local + RTOL_ULPS * _U64 * n_steps * s_all + float(np.finfo(np.dtype(ex.dtype)).tiny)
    tol_r = tol_a + rtol * np.abs(rt)  # R = A + V: A's error plus one rounding

    if whiten:
        n_valid = int(valid.sum())
        if n_valid < 2:
            raise ParameterError(
                f"whiten=True needs at least 2 valid tokens (unbiased variance), the example has {n_valid}",
                argument="whiten",
            )
        w = np.asarray(
            reference.masked_whiten(a.reshape(shape), mask=valid.reshape(shape), cu_seqlens=cu, eps=WHITEN_EPS),
            dtype=np.float64,
        ).reshape(-1)
        vals = a[valid]
        mu = float(vals.sum() / n_valid)
        var = float(((vals - mu) ** 2).sum() / (n_valid - 1))
        scale = 1.0 / math.sqrt(var + WHITEN_EPS)
        spread = 2.0 * math.sqrt(float(np.mean(tol_a[valid] ** 2)))
        tol_w = scale * (tol_a + spread * (1.0 + np.abs(w))) + rtol * (
            np.abs(w) + scale * (np.abs(a) + abs(mu) + float(np.mean(np.abs(vals))))
        )
        a, tol_a = w, tol_w

    return _GAEReference(advantages=a, returns=rt, tol_advantages=tol_a, tol_returns=tol_r, compared=valid)


def expected_gae(
    example: GAEExample, *, semantics: str = "skip", whiten: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The reference ``(advantages, returns)`` of ``example`` in float64, shaped like its
    rewards, 0 at masked positions (see the module docstring for the equations).

    Raises:
      ValueError: unknown ``semantics``; ``last_values`` with ``semantics="decay"``;
        ``whiten=True`` with fewer than 2 valid tokens.
    """
    check_choice("semantics", semantics, SEMANTICS)
    _check_bool("whiten", whiten)
    ref = _gae_reference(example, semantics, whiten)
    shape = tuple(to_numpy(example.rewards).shape)
    adv = np.where(ref.compared, ref.advantages, 0.0).reshape(shape)
    ret = np.where(ref.compared, ref.returns, 0.0).reshape(shape)
    return adv, ret


def _group_members(groups: np.ndarray) -> dict[Any, np.ndarray]:
    """Group id -> the indices of its members, in order."""
    members: dict[Any, list[int]] = {}
    for i, gid in enumerate(groups.tolist()):
        members.setdefault(gid, []).append(i)
    return {k: np.asarray(v, dtype=np.int64) for k, v in members.items()}


def expected_group_advantages(
    example: GroupExample, *, method: str = "grpo", eps: float = 1e-6, singleton: str = "zero"
) -> np.ndarray:
    """The reference per-sequence advantages of ``example`` in float64:
    ``reference.group_advantages(scores, groups, method=method, eps=eps, singleton=singleton)``::

        "grpo":               (s − μ_G)/(σ_G + eps)     σ unbiased (ddof 1)
        "drgrpo":             s − μ_G
        "rloo":               s − (Σ_G s − s)/(n − 1)
        "reinforce_baseline": s − μ_G

    A group of one gets 0 (``singleton="zero"``) or its score (``"raw"``); a group of
    equal scores gets 0.
    """
    check_choice("method", method, GROUP_METHODS)
    check_choice("singleton", singleton, SINGLETON_MODES)
    ex = example.numpy()
    return np.asarray(
        reference.group_advantages(
            np.asarray(ex.scores, dtype=np.float64),
            np.asarray(ex.groups),
            method=method,
            eps=float(eps),
            singleton=singleton,
        ),
        dtype=np.float64,
    )


def _group_tolerance(example: GroupExample, expected: np.ndarray, method: str, eps: float) -> np.ndarray:
    ex = example.numpy()
    s = np.asarray(ex.scores, dtype=np.float64)
    rtol = RTOL_ULPS * _unit_roundoff(ex.dtype)
    tol = np.zeros_like(expected)
    for idx in _group_members(np.asarray(ex.groups)).values():
        n = idx.size
        sg = s[idx]
        mu = float(sg.mean())
        size = float(np.max(np.abs(sg))) + abs(mu)
        e = np.abs(expected[idx])
        if method == "grpo":
            sigma = float(sg.std(ddof=1)) if n > 1 else 0.0
            tol[idx] = rtol * n * (e + (1.0 + e) * size / (sigma + eps)) if sigma + eps > 0 else np.inf
        else:
            tol[idx] = rtol * n * (e + size)
    return tol


# --------------------------------------------------------------------------- #
# Output handling and failure messages
# --------------------------------------------------------------------------- #


def _split_result(result: Any, example: Any, fname: str) -> tuple[Any, Any]:
    if isinstance(result, (tuple, list)):
        if len(result) == 2:
            return result[0], result[1]
        if len(result) == 1:
            return result[0], None
        raise ConformanceError(
            f"{fname} returned a {type(result).__name__} of {len(result)} items; expected advantages or "
            "(advantages, returns). Adapt the call with call=lambda example, fn: ...",
            example=example,
        )
    return result, None


def _as_output(name: str, x: Any, shape: tuple[int, ...], example: Any, fname: str) -> np.ndarray:
    try:
        a = to_numpy(x)
    except Exception as exc:  # noqa: BLE001 - any failure to convert is the user's output's fault
        raise ConformanceError(
            f"{fname}: could not convert its {name} ({type(x).__name__}) to an array: {exc}", example=example
        ) from exc
    if a.dtype.kind not in "biuf":
        raise ConformanceError(f"{fname}: {name} must be real numbers, got dtype {a.dtype}", example=example)
    if tuple(a.shape) != shape:
        raise ConformanceError(
            f"{fname}: {name} must have shape {shape} (like the inputs), got {tuple(a.shape)}\n{example!r}",
            example=example,
        )
    return a.astype(np.float64).reshape(-1)


def _backing(x: Any) -> np.ndarray | None:
    """The NumPy array behind ``x`` (shares memory for CPU tensors)."""
    return None if x is None else to_numpy(x)


def _check_unchanged(names: Iterable[str], given: Any, original: Any, fname: str) -> None:
    for name in names:
        before = getattr(original, name)
        after = _backing(getattr(given, name))
        if before is None or after is None:
            continue
        if before.tobytes() != after.tobytes():
            raise ConformanceError(
                f"{fname} modified its input {name!r} in place; inputs must be left unchanged "
                f"(the batch is reused after advantage estimation)\n{original!r}",
                example=original,
            )


def _num(x: float, dtype: str) -> str:
    """A number as its shortest round-trip repr in ``dtype``."""
    if not math.isfinite(x):
        return str(x)
    if dtype == "float32":
        return str(np.float32(x))
    return repr(float(x))


def _out(x: float, dtype: str) -> str:
    if not math.isfinite(x):
        return str(x)
    return f"{x:.9g}" if dtype == "float32" else repr(float(x))


def _table(header: list[str], rows: list[list[str] | None]) -> str:
    body = [r for r in rows if r is not None]
    widths = [max(len(header[c]), *(len(r[c]) for r in body)) if body else len(header[c]) for c in range(len(header))]
    lines = [("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths))).rstrip()]
    for r in rows:
        if r is None:
            lines.append("  " + "...".rjust(widths[0]))
        else:
            cells = [c.rjust(w) for c, w in zip(r[:-1], widths)] + [r[-1]]  # last column: a note
            lines.append(("  " + "  ".join(cells)).rstrip())
    return "\n".join(lines)


def _window(n: int, first: int, edge: int = 3, half: int = 8, limit: int = 40) -> list[int | None]:
    """Positions to show of a row of ``n``: all if short, else the start, a window around
    ``first`` and the end, with None marking elided runs."""
    if n <= limit:
        return list(range(n))
    keep = (
        set(range(min(edge, n)))
        | set(range(max(0, first - half), min(n, first + half + 1)))
        | set(range(max(0, n - edge), n))
    )
    out: list[int | None] = []
    prev = -1
    for k in sorted(keep):
        if k != prev + 1:
            out.append(None)
        out.append(k)
        prev = k
    return out


@dataclass
class _Check:
    """What a check is about, for messages."""

    fname: str
    semantics: str
    gated: bool
    whiten: bool
    array: str
    custom_call: bool
    phase: str


def _gae_failure(
    ctx: _Check,
    ex: GAEExample,
    ref: _GAEReference,
    output: str,
    got: np.ndarray,
    bad: np.ndarray,
) -> ConformanceError:
    expected = ref.advantages if output == "advantages" else ref.returns
    tol = ref.tol_advantages if output == "advantages" else ref.tol_returns
    first = int(np.flatnonzero(bad)[0])
    seqs = ex.sequences()
    row = next(b for b, seq in enumerate(seqs) if seq.size and seq[0] <= first <= seq[-1])
    seq = seqs[row]
    k_first = first - int(seq[0])
    r = np.asarray(ex.rewards).reshape(-1)
    v = np.asarray(ex.values).reshape(-1)
    g = None if ex.gates is None else np.asarray(ex.gates).reshape(-1)
    dt = ex.dtype

    rows: list[list[str] | None] = []
    for k in _window(seq.size, k_first):
        if k is None:
            rows.append(None)
            continue
        j = int(seq[k])
        compared = bool(ref.compared[j])
        mark = "<-- first difference" if j == first else ("<-- differs" if bad[j] else "")
        rows.append(
            [
                str(k),
                "1" if compared else "0",
                _num(float(r[j]), dt),
                _num(float(v[j]), dt),
                "-" if g is None else _num(float(g[j]), dt),
                _out(float(expected[j]), dt) if compared else "-",
                _out(float(got[j]), dt),
                mark,
            ]
        )
    table = _table(["position", "mask", "reward", "value", "gate", "expected", "got", ""], rows)

    n_valid = int(ref.compared[seq].sum())
    n_bad = int(bad[seq].sum())
    diff = abs(float(got[first]) - float(expected[first]))
    where = f"row {row}, position {k_first}" + (f" (flat index {first})" if ex.layout == "packed" else "")
    shape = tuple(np.asarray(ex.rewards).shape)
    layout = (
        f"padded {shape[0]}x{shape[1]}, {ex.padding} padding"
        if ex.layout == "padded"
        else (f"packed N={shape[0]}, cu_seqlens={np.asarray(ex.cu_seqlens).tolist()}")
    )
    lv = "" if ex.last_values is None else f", last_values={[_num(float(x), dt) for x in np.asarray(ex.last_values)]}"
    row_lv = "" if ex.last_values is None else f", last_value={_num(float(np.asarray(ex.last_values)[row]), dt)}"
    called = "through the call= adapter" if ctx.custom_call else _describe_gae_call(ex)
    lines = [
        f"{ctx.fname} disagrees with the reference: {output} differ first at {where}.",
        f"  expected {_out(float(expected[first]), dt)}, got {_out(float(got[first]), dt)} "
        f"(|difference| {diff:.3g} > tolerance {float(tol[first]):.3g}); "
        f"{n_bad} of the row's {n_valid} valid positions differ.",
        f"  check: semantics={ctx.semantics!r}, gated={ctx.gated}, whiten={ctx.whiten}, array={ctx.array!r}"
        + (f"; {ctx.phase}" if ctx.phase else ""),
        f"  example: {layout}, {dt}, gamma={ex.gamma!r}, lam={ex.lam!r}{lv}",
        f"  fn was called {called}",
    ]
    if output == "advantages" and ctx.whiten:
        lines.append("  expected advantages are whitened over all valid tokens of the batch (verl's masked_whiten).")
    small = np.abs(got[bad] - expected[bad]) <= 1e-4 * (
        np.abs(expected[bad]) + tol[bad] / (RTOL_ULPS * _unit_roundoff(dt))
    )
    if dt == "float32" and bool(np.all(small)):
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(bad, np.abs(got - expected) / tol, 0.0)
        worst = int(np.argmax(ratio))
        w_row = next(b for b, sq in enumerate(seqs) if sq.size and sq[0] <= worst <= sq[-1])
        lines.append(
            f"  hint: the differences are tiny, as from float32 rounding (the largest is {float(ratio[worst]):.1f}x its "
            f"tolerance, at row {w_row}, position {worst - int(seqs[w_row][0])}). The contract is float64 accumulation "
            "rounded once to float32; a float32 running sum carries every step's rounding error into all earlier "
            "positions, and the error grows along long rows. Accumulate in float64, or pass dtypes=('float64',) to "
            "check only the logic."
        )
    lines += [
        "",
        f"  row {row} ({seq.size} positions, {n_valid} valid{row_lv}):",
        table,
        "  mask 0 = padding or observation token: not compared (expected '-').",
        "",
        "  full example:",
        "  " + repr(ex).replace("\n", "\n  "),
    ]
    return ConformanceError("\n".join(lines), example=ex, output=output, row=row, position=k_first)


def _group_failure(
    fname: str,
    ex: GroupExample,
    expected: np.ndarray,
    tol: np.ndarray,
    got: np.ndarray,
    bad: np.ndarray,
    method: str,
    eps: float,
    singleton: str,
    array: str,
) -> ConformanceError:
    first = int(np.flatnonzero(bad)[0])
    scores = np.asarray(ex.scores)
    groups = np.asarray(ex.groups)
    gid = groups[first]
    members = np.flatnonzero(groups == gid)
    dt = ex.dtype
    rows: list[list[str] | None] = []
    for i in members:
        mark = "<-- first difference" if i == first else ("<-- differs" if bad[i] else "")
        rows.append(
            [
                str(int(i)),
                str(int(groups[i])),
                _num(float(scores[i]), dt),
                _out(float(expected[i]), dt),
                _out(float(got[i]), dt),
                mark,
            ]
        )
    table = _table(["index", "group", "score", "expected", "got", ""], rows)
    diff = abs(float(got[first]) - float(expected[first]))
    n_groups = len(set(groups.tolist()))
    lines = [
        f"{fname} disagrees with the reference: advantages differ first at index {first} (group {int(gid)}, "
        f"{members.size} member{'s' if members.size != 1 else ''}).",
        f"  expected {_out(float(expected[first]), dt)}, got {_out(float(got[first]), dt)} "
        f"(|difference| {diff:.3g} > tolerance {float(tol[first]):.3g}); {int(bad.sum())} of {bad.size} sequences differ.",
        f"  check: method={method!r}, eps={eps!r}, singleton={singleton!r}, array={array!r}",
        f"  example: B={scores.shape[0]}, {n_groups} groups, grouping={ex.grouping!r}, {dt}",
        "",
        f"  group {int(gid)}:",
        table,
        "",
        "  full example:",
        "  " + repr(ex).replace("\n", "\n  "),
    ]
    return ConformanceError("\n".join(lines), example=ex, output="advantages", index=first)


# --------------------------------------------------------------------------- #
# Running one example
# --------------------------------------------------------------------------- #


def _call_user(
    call: Callable[[Any, Callable[..., Any]], Any],
    given_ex: Any,
    fn: Callable[..., Any],
    original: Any,
    fname: str,
    how: str,
) -> Any:
    try:
        return call(given_ex, fn)
    except Exception as exc:  # noqa: BLE001 - any exception of the user's code is a failure
        raise ConformanceError(
            f"{fname} raised {type(exc).__name__}: {exc}\n  fn was called {how}\n  example:\n  "
            + repr(original).replace("\n", "\n  "),
            example=original,
        ) from exc


def _run_gae_example(
    ex: GAEExample,
    *,
    fn: Callable[..., Any],
    call: Callable[[GAEExample, Callable[..., Any]], Any],
    ctx: _Check,
) -> None:
    ref = _gae_reference(ex, ctx.semantics, ctx.whiten)
    given_ex = ex.to(ctx.array)
    how = "through the call= adapter" if ctx.custom_call else _describe_gae_call(ex)
    result = _call_user(call, given_ex, fn, ex, ctx.fname, how)
    _check_unchanged(("rewards", "values", "mask", "gates", "last_values", "cu_seqlens"), given_ex, ex, ctx.fname)
    adv_x, ret_x = _split_result(result, ex, ctx.fname)
    shape = tuple(np.asarray(ex.rewards).shape)
    adv = _as_output("advantages", adv_x, shape, ex, ctx.fname)
    bad = ref.compared & ~(np.abs(adv - ref.advantages) <= ref.tol_advantages)
    if bad.any():
        raise _gae_failure(ctx, ex, ref, "advantages", adv, bad)
    if ret_x is not None:
        ret = _as_output("returns", ret_x, shape, ex, ctx.fname)
        bad = ref.compared & ~(np.abs(ret - ref.returns) <= ref.tol_returns)
        if bad.any():
            raise _gae_failure(ctx, ex, ref, "returns", ret, bad)


def _settings(max_examples: int, shrink: bool) -> settings:
    phases = (Phase.explicit, Phase.generate, Phase.shrink) if shrink else (Phase.explicit, Phase.generate)
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        print_blob=False,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        phases=phases,
    )


def _run_property(
    strategy: Any, body: Callable[[Any], None], max_examples: int, seed: int | None, shrink: bool = True
) -> None:
    def conformance(example: Any) -> None:
        body(example)

    test = given(example=strategy)(conformance)
    test = _settings(max_examples, shrink)(test)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    test()


def _check_callable(name: str, f: Any) -> None:
    if not callable(f):
        raise TypeError(f"{name}: expected a callable, got {type(f).__name__}")


def _check_seed(seed: Any) -> int | None:
    if seed is None:
        return None
    return _check_int("seed", seed, 0)


# --------------------------------------------------------------------------- #
# Public checks
# --------------------------------------------------------------------------- #


def check_gae(
    fn: Callable[..., Any],
    *,
    semantics: str = "skip",
    gated: bool = False,
    whiten: bool = False,
    array: str = "numpy",
    max_examples: int = 200,
    call: Callable[[GAEExample, Callable[..., Any]], Any] | None = None,
    truncation: bool = False,
    layouts: str | Iterable[str] = ("padded",),
    padding: str | Iterable[str] = PADDINGS,
    multi_turn: bool = True,
    dtypes: str | Iterable[Any] = DTYPES,
    max_len: int = 16,
    masked_rewards: str = "zero",
    long_len: int = 2048,
    seed: int | None = 0,
) -> None:
    """Property-tests a GAE function against :mod:`comppo_core.reference`.

    Draws batches with :func:`~comppo_core.testing.strategies.gae_examples`, calls ``fn``
    on each (arrays of kind ``array``), and compares its outputs on valid positions with
    the float64 reference (equations in the module docstring). Returns None when every
    example agrees; raises :class:`ConformanceError` (an ``AssertionError``) for the
    shrunk counterexample otherwise, with a per-token table (position, mask, reward,
    value, gate, expected, got) of the first row that differs and the (row, position) of
    its first difference. Exceptions raised by ``fn``, outputs of the wrong shape and
    inputs modified in place are failures too.

    **Calling convention.** By default (:func:`default_gae_call`)::

        fn(rewards, values, mask=mask, gamma=gamma, lam=lam
           [, gates=gates][, last_values=last_values][, cu_seqlens=cu_seqlens])

    with ``gates`` passed only when ``gated=True``, ``last_values`` only when
    ``truncation=True`` and ``cu_seqlens`` only for the packed layout. For any other
    signature pass ``call=lambda example, fn: ...``: it gets the drawn
    :class:`~comppo_core.testing.strategies.GAEExample` (already converted to ``array``)
    and ``fn``, and returns ``fn``'s result. E.g. verl's
    ``call=lambda ex, fn: fn(ex.rewards, ex.values, ex.mask, ex.gamma, ex.lam)`` or
    OpenRLHF's ``call=lambda ex, fn: fn(ex.values, ex.rewards, ex.mask, ex.gamma, ex.lam)``.
    The result is ``(advantages, returns)`` (any 2-sequence, e.g. a NamedTuple) or
    ``advantages`` alone (returns are then not checked), shaped like ``rewards``; NumPy
    arrays, torch tensors (any device) or anything ``np.asarray`` takes. ``mask`` has the
    rewards' dtype (1.0 valid, 0.0 masked); ``example.valid`` is the boolean mask.

    **Tolerance.** With u the unit roundoff of the drawn dtype (2⁻²⁴ for float32, 2⁻⁵³
    for float64), position i passes when ``|got − expected| ≤ 8·u·m_i + 8·u64·n·S_i + tiny``
    (tiny: the dtype's smallest normal number, for results that underflow),
    where ``m_i = |r_i| + γg_i|V_{i+1}| + |V_i| + γλg_i|A_{i+1}|`` is the size of the
    terms of the *one* recursion step that produced ``A_i``, ``S_i`` the same sum over
    the whole rest of the row (``Σ_k Π(γλg)·terms``) and n the row's number of steps;
    returns add ``8·u·|R_i|``. A float64 computation rounded once to float32
    is within ``u·|A_i| ≤ u·m_i``, a float32 sum ``A + V`` adds ``u·|R_i|``, and any
    float64 accumulation order stays under the ``n·S_i`` floor. A float32 running sum
    is not: it carries each step's rounding error into every earlier position, never
    damped when γλ = 1, where the errors random-walk to ~sqrt(n) units of the summands
    (measured: 45–160·u·m_i at the worst position of a 2048-token row), well past
    8·u·m_i. That is why float32 examples also run a **long-row phase**: a few
    batches of ``long_len``-token rows
    (:func:`~comppo_core.testing.strategies.long_gae_examples`, γ = λ = 1, sparse
    outcome rewards, a noisy critic). Whitened advantages are compared within the
    propagated bound ``s·(tol_i + 2·rms(tol)·(1 + |w_i|)) + 8·u·(|w_i| + s·(|A_i| + |μ| +
    mean|A|))``, s = 1/sqrt(σ² + 1e-8) (the returns still expose drift).

    Args:
      fn: the function under test.
      semantics: ``"skip"``: masked tokens are skipped (verl's multi-turn GAE,
        ``comppo_core.gae``); ``"decay"``: values and rewards are multiplied by the mask
        and every position is stepped (OpenRLHF).
      gated: pass retention gates g in [0, 1] (Comp-GAE; the per-step discount is γ·g_t).
      whiten: expect verl's whitened advantages (``masked_whiten`` over the batch's valid
        tokens, unbiased variance, eps 1e-8) and unwhitened returns. Examples have at
        least 2 valid tokens.
      array: ``"numpy"`` or ``"torch"`` (CPU tensors via ``torch.from_numpy``). For JAX,
        use ``"numpy"`` and convert in ``call``.
      max_examples: number of examples of the main phase.
      call: calling adapter ``(example, fn) -> result`` (see above).
      truncation: pass ``last_values`` ``[B]``, the bootstrap value after each row's last
        valid token (truncated responses). False (the default) checks terminal rows
        only, for code without a bootstrap such as verl's loop. Not with ``"decay"``.
      layouts: ``"padded"`` (``[B, T]``) and/or ``"packed"`` (``[N]`` + ``cu_seqlens``).
      padding: ``"right"`` and/or ``"left"``: where padded rows are padded.
      multi_turn: draw masked observation spans inside responses.
      dtypes: ``"float32"`` and/or ``"float64"``.
      max_len: longest response of the main phase.
      masked_rewards: ``"zero"`` (default): rewards on masked tokens are 0, as the contract
        requires of inputs; ``"junk"``: they are nonzero and must be ignored (verl and
        OpenRLHF ignore them; ``comppo_core.gae`` needs ``masked_rewards="drop"``). Catches
        code that reads a reward from a padded position.
      long_len: row length of the long-row float32 phase; 0 turns the phase off. It runs
        ``max(2, min(8, max_examples // 50))`` examples, unshrunk.
      seed: Hypothesis seed: the same seed draws the same examples, so a failure
        reproduces; None draws fresh examples each run. Nothing is written to disk (no
        Hypothesis example database).

    Raises:
      ConformanceError: ``fn`` disagrees with the reference (an ``AssertionError``).
      ValueError: a bad argument, named in the message.
      TypeError: ``fn`` or ``call`` is not callable.
      ImportError: ``array="torch"`` without torch.
    """
    _check_callable("fn", fn)
    if call is not None:
        _check_callable("call", call)
    semantics = check_choice("semantics", semantics, SEMANTICS)
    gated = _check_bool("gated", gated)
    whiten = _check_bool("whiten", whiten)
    array = check_choice("array", array, ARRAY_KINDS)
    max_examples = _check_int("max_examples", max_examples, 1)
    truncation = _check_bool("truncation", truncation)
    layouts_ = _check_subset("layouts", layouts, LAYOUTS)
    padding_ = _check_subset("padding", padding, PADDINGS)
    multi_turn = _check_bool("multi_turn", multi_turn)
    dtypes_ = _check_subset("dtypes", dtypes, DTYPES)
    max_len = _check_int("max_len", max_len, 1)
    masked_rewards = check_choice("masked_rewards", masked_rewards, MASKED_REWARDS)
    long_len = _check_int("long_len", long_len, 0)
    if long_len == 1:
        raise ParameterError("long_len: expected 0 (off) or a row length >= 2, got 1", argument="long_len")
    seed_ = _check_seed(seed)
    if truncation and semantics == "decay":
        raise ParameterError(
            "truncation: semantics='decay' (OpenRLHF) has no bootstrap value after the row; pass truncation=False",
            argument="truncation",
        )
    if array == "torch":
        _torch()
    max_rows = max(1, min(4, 1024 // max_len))
    strategy = gae_examples(
        max_len=max_len,
        max_rows=max_rows,
        dtypes=dtypes_,
        layouts=layouts_,
        padding=padding_,
        multi_turn=multi_turn,
        gated=gated,
        truncation=truncation,
        masked_rewards=masked_rewards,
        min_valid=2 if whiten else 0,
    )
    fname = _name(fn)
    call_ = default_gae_call if call is None else call

    def body(phase: str) -> Callable[[GAEExample], None]:
        ctx = _Check(fname, semantics, gated, whiten, array, call is not None, phase)
        return lambda ex: _run_gae_example(ex, fn=fn, call=call_, ctx=ctx)

    _run_property(strategy, body(""), max_examples, seed_)
    if long_len and "float32" in dtypes_:
        long_strategy = long_gae_examples(
            length=long_len,
            dtypes=("float32",),
            layouts=layouts_,
            padding=padding_,
            multi_turn=multi_turn,
            gated=gated,
            truncation=truncation,
            masked_rewards=masked_rewards,
        )
        phase = f"long-row phase: {long_len}-token float32 rows, gamma = lam = 1 (float32 accumulation drift)"
        _run_property(long_strategy, body(phase), max(2, min(8, max_examples // 50)), seed_, shrink=False)


def check_group_advantages(
    fn: Callable[..., Any],
    method: str = "grpo",
    *,
    eps: float = 1e-6,
    singleton: str = "zero",
    array: str = "numpy",
    max_examples: int = 200,
    call: Callable[[GroupExample, Callable[..., Any]], Any] | None = None,
    grouping: str = "any",
    dtypes: str | Iterable[Any] = DTYPES,
    max_group_size: int = 8,
    seed: int | None = 0,
) -> None:
    """Property-tests a group-relative outcome-advantage function against
    :func:`comppo_core.reference.group_advantages`.

    Draws batches with :func:`~comppo_core.testing.strategies.group_examples` (binary,
    integer or float scores; singleton groups; groups of equal scores), calls ``fn`` and
    compares its ``[B]`` per-sequence advantages with the float64 reference (equations in
    :func:`expected_group_advantages`). Raises :class:`ConformanceError` for the shrunk
    counterexample, with a table (index, group, score, expected, got) of the group of the
    first differing sequence; NaN where a number is expected always fails.

    **Calling convention.** By default ``fn(scores, groups)`` (:func:`default_group_call`):
    ``scores`` ``[B]`` of the drawn dtype, ``groups`` ``[B]`` int64 ids. Bind the method
    yourself (``functools.partial(cc.group_advantages, method="rloo")``) or adapt with
    ``call=lambda example, fn: ...``; ``example.group_size`` helps code that reshapes to
    ``[-1, G]`` (with ``grouping="uniform"``). The result is a ``[B]`` array.

    **Tolerance.** Per group G of n members with mean μ and unbiased std σ, u the unit
    roundoff of the dtype: ``8·u·n·(|e| + (1 + |e|)·(max|s| + |μ|)/(σ + eps))`` for GRPO,
    ``8·u·n·(|e| + max|s| + |μ|)`` otherwise: the rounding bound of a two-pass mean and
    std in the input dtype.

    Args:
      fn: the function under test.
      method: ``"grpo"`` (unbiased std, as verl/TRL), ``"drgrpo"``, ``"rloo"`` or
        ``"reinforce_baseline"`` (per-sequence ``s − μ``).
      eps: GRPO's ``eps`` in ``(s − μ)/(σ + eps)``: use your code's value.
      singleton: what a group of one must get: ``"zero"`` or ``"raw"`` (the score, verl).
      array: ``"numpy"`` or ``"torch"``.
      max_examples: number of examples.
      call: calling adapter ``(example, fn) -> advantages``.
      grouping: ``"any"`` (ids in any order, sizes vary), ``"contiguous"`` or
        ``"uniform"`` (contiguous, one size: ``index // G``).
      dtypes: ``"float32"`` and/or ``"float64"``.
      max_group_size: largest group.
      seed: Hypothesis seed (None: fresh examples each run); nothing is written to disk.

    Raises:
      ConformanceError: ``fn`` disagrees with the reference (an ``AssertionError``).
      ValueError: a bad argument, named in the message.
      TypeError: ``fn`` or ``call`` is not callable.
    """
    _check_callable("fn", fn)
    if call is not None:
        _check_callable("call", call)
    method = check_choice("method", method, GROUP_METHODS)
    if (
        isinstance(eps, bool)
        or not isinstance(eps, (int, float, np.floating))
        or not math.isfinite(float(eps))
        or eps < 0
    ):
        raise ParameterError(f"eps: expected a finite number >= 0, got {eps!r}", argument="eps")
    eps_ = float(eps)
    singleton = check_choice("singleton", singleton, SINGLETON_MODES)
    array = check_choice("array", array, ARRAY_KINDS)
    max_examples = _check_int("max_examples", max_examples, 1)
    grouping = check_choice("grouping", grouping, GROUPINGS)
    dtypes_ = _check_subset("dtypes", dtypes, DTYPES)
    max_group_size = _check_int("max_group_size", max_group_size, 1)
    seed_ = _check_seed(seed)
    if array == "torch":
        _torch()
    fname = _name(fn)
    call_ = default_group_call if call is None else call
    how = "through the call= adapter" if call is not None else "fn(scores, groups)"

    def body(ex: GroupExample) -> None:
        expected = expected_group_advantages(ex, method=method, eps=eps_, singleton=singleton)
        tol = _group_tolerance(ex, expected, method, eps_)
        given_ex = ex.to(array)
        result = _call_user(call_, given_ex, fn, ex, fname, how)
        _check_unchanged(("scores", "groups"), given_ex, ex, fname)
        if isinstance(result, (tuple, list)):
            raise ConformanceError(
                f"{fname} returned a {type(result).__name__}; expected a [B] array of advantages. "
                "Adapt the call with call=lambda example, fn: ...",
                example=ex,
            )
        got = _as_output("advantages", result, tuple(np.asarray(ex.scores).shape), ex, fname)
        bad = ~(np.abs(got - expected) <= tol)
        if bad.any():
            raise _group_failure(fname, ex, expected, tol, got, bad, method, eps_, singleton, array)

    strategy = group_examples(max_group_size=max_group_size, dtypes=dtypes_, grouping=grouping)
    _run_property(strategy, body, max_examples, seed_)
