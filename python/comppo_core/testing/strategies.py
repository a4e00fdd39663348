"""Hypothesis strategies that draw realistic advantage-estimation batches.

Two kinds of example, each a small frozen dataclass with a readable ``repr``:

* :class:`GAEExample`, drawn by :func:`gae_examples` (short rows, every array drawn
  element by element so that Hypothesis shrinks failures to small, readable numbers) and
  :func:`long_gae_examples` (rows of thousands of tokens, drawn from a seeded NumPy
  generator, for float32 accumulation drift);
* :class:`GroupExample`, drawn by :func:`group_examples` (outcome scores and group ids).

What a GAE example contains (docs/design.md §2):

* **padded** layout: ``[B, T]`` arrays. Each row holds one response of ``L_b ≤ T``
  tokens, placed at the start of the row (``padding="right"``) or at its end
  (``padding="left"``); the rest of the row is padding.
* **packed** layout: ``[N]`` arrays, the responses concatenated, with ``cu_seqlens``
  ``[B+1]`` (int32, flash-attention "varlen").
* **multi-turn**: inside a response, spans of observation/tool tokens are masked out.
* ``mask`` has the dtype of the rewards: 1.0 on valid tokens, 0.0 on padding and
  observation tokens (verl's and OpenRLHF's loops multiply by it; ``example.valid`` is
  the boolean version).
* rewards at masked positions are 0 (``masked_rewards="zero"``, what the contract
  requires of inputs) or nonzero junk that a correct implementation must ignore
  (``masked_rewards="junk"``). Values at masked positions are always arbitrary finite
  numbers (a critic outputs something everywhere); gates there lie in [0, 1].
* gates (``gated=True``) in [0, 1], exact 0 and 1 included; ``last_values`` ``[B]``
  (``truncation=True``) bootstrap truncated responses; γ and λ in [0, 1], exact 0 and
  1 included.

Lengths run from ``min_len`` (default 0: empty responses) to ``max_len``.

This module needs Hypothesis (``pip install 'comppo-core[testing]'``); importing
``comppo_core`` alone does not import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..errors import ParameterError
from ..options import check_choice

__all__ = [
    "ARRAY_KINDS",
    "DTYPES",
    "GAEExample",
    "GROUPINGS",
    "GroupExample",
    "LAYOUTS",
    "MASKED_REWARDS",
    "PADDINGS",
    "gae_examples",
    "group_examples",
    "long_gae_examples",
    "to_numpy",
]

#: Array kinds an example can be converted to (:meth:`GAEExample.to`).
ARRAY_KINDS = ("numpy", "torch")
#: Layouts of docs/design.md §2.
LAYOUTS = ("padded", "packed")
#: Where the padding of a padded row goes.
PADDINGS = ("right", "left")
#: Float dtypes drawn.
DTYPES = ("float32", "float64")
#: What rewards at masked positions hold.
MASKED_REWARDS = ("zero", "junk")
#: How group ids are laid out in a :class:`GroupExample`.
GROUPINGS = ("any", "contiguous", "uniform")

#: γ and λ values drawn often (the endpoints and common settings), besides any float
#: in [0, 1]. Hypothesis shrinks towards the first one.
COMMON_DISCOUNTS = (1.0, 0.0, 0.5, 0.9, 0.95, 0.99)

#: Largest number of grid cells (rows × columns) drawn element by element; larger
#: grids would exceed Hypothesis' per-example data budget.
MAX_ELEMENTWISE_CELLS = 1024


# --------------------------------------------------------------------------- #
# Array kinds
# --------------------------------------------------------------------------- #


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is installed in the test env
        raise ImportError(
            "array='torch' needs PyTorch: pip install 'comppo-core[torch]' (or pass array='numpy')"
        ) from exc
    return torch


def _to_kind(x: Any, kind: str) -> Any:
    """A copy of array ``x`` (NumPy array or torch tensor, or None) as ``kind``."""
    if x is None:
        return None
    if kind == "numpy":
        return to_numpy(x).copy()
    return _torch().from_numpy(to_numpy(x).copy())


def to_numpy(x: Any) -> np.ndarray:
    """``x`` as a NumPy array: torch tensors (any device, with or without grad,
    bfloat16 included) through ``detach().cpu()``, anything else through
    ``np.asarray`` (JAX arrays, lists, ...)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        t = x.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return np.asarray(t.numpy())
    return np.asarray(x)


def _check_subset(name: str, given: str | Iterable[Any], allowed: Sequence[str]) -> tuple[str, ...]:
    """``given`` (one name or several) as a non-empty tuple of names from ``allowed``."""
    items = (given,) if isinstance(given, (str, np.dtype, type)) else tuple(given)
    out: list[str] = []
    for item in items:
        key = np.dtype(item).name if name == "dtypes" and not isinstance(item, str) else item
        if key not in allowed:
            raise ParameterError(f"{name}: expected values from {allowed}, got {item!r}", argument=name)
        if key not in out:
            out.append(key)
    if not out:
        raise ParameterError(f"{name}: expected at least one of {allowed}, got none", argument=name)
    return tuple(out)


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ParameterError(f"{name}: expected True or False, got {value!r}", argument=name)
    return bool(value)


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < low:
        raise ParameterError(f"{name}: expected an integer >= {low}, got {value!r}", argument=name)
    return int(value)


def _check_unit(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ParameterError(f"{name}: expected None or a number in [0, 1], got {value!r}", argument=name)
    v = float(value)
    if not 0.0 <= v <= 1.0:
        raise ParameterError(f"{name}: expected None or a number in [0, 1], got {value!r}", argument=name)
    return v


def _fmt_array(name: str, a: Any) -> str:
    if a is None:
        return f"{name}=None"
    arr = to_numpy(a)
    prefix = f"{name}="
    body = np.array2string(arr, separator=", ", threshold=64, edgeitems=4, max_line_width=110, prefix="    " + prefix)
    return prefix + body


def _pretty_lines(p: Any, text: str) -> None:
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if i:
            p.break_()
        p.text(line)


# --------------------------------------------------------------------------- #
# GAE examples
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, eq=False, repr=False)
class GAEExample:
    """One drawn GAE batch: arrays (NumPy arrays or torch tensors) and parameters.

    Shapes: padded layout ``rewards``, ``values``, ``mask``, ``gates`` are ``[B, T]``;
    packed layout they are ``[N]`` and ``cu_seqlens`` is ``[B+1]``. ``last_values`` is
    ``[B]``. Float arrays have dtype :attr:`dtype`; ``cu_seqlens`` is int32.

    Attributes:
      rewards: per-token rewards r (0, or junk, at masked positions; see module doc).
      values: critic values V (arbitrary finite numbers at masked positions).
      mask: 1.0 on valid tokens, 0.0 on padding and observation tokens (dtype of
        ``rewards``).
      gamma: discount γ in [0, 1].
      lam: trace parameter λ in [0, 1].
      gates: retention gates g in [0, 1], or None (ungated: g ≡ 1).
      last_values: bootstrap values ``V_n`` of truncated rows, or None (terminal rows).
      cu_seqlens: ``[B+1]`` offsets of the packed layout, or None (padded).
      layout: ``"padded"`` or ``"packed"``.
      padding: ``"right"`` or ``"left"`` (padded layout), None (packed).
      dtype: ``"float32"`` or ``"float64"``.
      kind: ``"numpy"`` or ``"torch"``: the kind of the arrays (see :meth:`to`).
    """

    rewards: Any
    values: Any
    mask: Any
    gamma: float
    lam: float
    gates: Any = None
    last_values: Any = None
    cu_seqlens: Any = None
    layout: str = "padded"
    padding: str | None = "right"
    dtype: str = "float64"
    kind: str = "numpy"

    # -- derived ---------------------------------------------------------- #

    @property
    def valid(self) -> Any:
        """Boolean validity (``mask != 0``), in the example's array kind."""
        return self.mask != 0

    @property
    def num_rows(self) -> int:
        """Number of sequences B."""
        if self.layout == "packed":
            return int(to_numpy(self.cu_seqlens).shape[0]) - 1
        return int(to_numpy(self.rewards).shape[0])

    def sequences(self) -> list[np.ndarray]:
        """For each sequence ``b``, the flat indices (into ``rewards.reshape(-1)``) of its
        positions in order: row ``b`` of the padded grid, or
        ``cu_seqlens[b]:cu_seqlens[b+1]``. Position ``k`` of sequence ``b`` is flat index
        ``sequences()[b][k]``."""
        if self.layout == "packed":
            cu = to_numpy(self.cu_seqlens).astype(np.int64)
            return [np.arange(cu[b], cu[b + 1]) for b in range(cu.shape[0] - 1)]
        rows, cols = to_numpy(self.rewards).shape
        return [np.arange(b * cols, (b + 1) * cols) for b in range(rows)]

    # -- conversion ------------------------------------------------------- #

    def to(self, kind: str) -> GAEExample:
        """A copy whose arrays are of ``kind`` (``"numpy"`` or ``"torch"``; torch tensors
        are made with ``torch.from_numpy`` on CPU). γ and λ stay Python floats."""
        check_choice("kind", kind, ARRAY_KINDS)
        return dataclasses.replace(
            self,
            rewards=_to_kind(self.rewards, kind),
            values=_to_kind(self.values, kind),
            mask=_to_kind(self.mask, kind),
            gates=_to_kind(self.gates, kind),
            last_values=_to_kind(self.last_values, kind),
            cu_seqlens=_to_kind(self.cu_seqlens, kind),
            kind=kind,
        )

    def numpy(self) -> GAEExample:
        """Shorthand for ``to("numpy")``."""
        return self.to("numpy")

    # -- display ---------------------------------------------------------- #

    def __repr__(self) -> str:
        shape = tuple(to_numpy(self.rewards).shape)
        head = (
            f"GAEExample(layout={self.layout!r}, padding={self.padding!r}, dtype={self.dtype!r}, "
            f"kind={self.kind!r}, shape={shape}, gamma={self.gamma!r}, lam={self.lam!r},"
        )
        lines = [head]
        for name in ("mask", "rewards", "values", "gates", "last_values", "cu_seqlens"):
            lines.append("    " + _fmt_array(name, getattr(self, name)) + ",")
        lines[-1] = lines[-1][:-1] + ")"
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis' pretty printer
        _pretty_lines(p, repr(self))


class _GAEConfig:
    """Validated arguments shared by the GAE strategies."""

    def __init__(
        self,
        *,
        dtypes: Any,
        layouts: Any,
        padding: Any,
        multi_turn: Any,
        gated: Any,
        truncation: Any,
        masked_rewards: Any,
    ) -> None:
        self.dtypes = _check_subset("dtypes", dtypes, DTYPES)
        self.layouts = _check_subset("layouts", layouts, LAYOUTS)
        self.padding = _check_subset("padding", padding, PADDINGS)
        self.multi_turn = _check_bool("multi_turn", multi_turn)
        self.gated = _check_bool("gated", gated)
        self.truncation = _check_bool("truncation", truncation)
        self.masked_rewards = check_choice("masked_rewards", masked_rewards, MASKED_REWARDS)


@dataclass
class _Row:
    """One drawn sequence on a row of ``width`` cells (padded: the grid's T; packed: its
    own length). Its response is ``length`` cells at ``start``; ``observation`` marks
    masked cells inside it."""

    start: int
    length: int
    observation: np.ndarray  # [width] bool
    rewards: np.ndarray  # [width]
    values: np.ndarray  # [width]
    gates: np.ndarray | None  # [width]
    junk: np.ndarray  # [width]: rewards for masked cells when masked_rewards="junk"
    last_value: float | None

    @property
    def width(self) -> int:
        return int(self.rewards.shape[0])

    @property
    def in_response(self) -> np.ndarray:
        cols = np.arange(self.width)
        return (cols >= self.start) & (cols < self.start + self.length)


def _assemble(
    cfg: _GAEConfig, dtype: str, layout: str, padding: str, rows: list[_Row], gamma: float, lam: float
) -> GAEExample:
    """Builds an example from drawn rows: stacked ``[B, T]`` (padded) or concatenated
    ``[N]`` with ``cu_seqlens`` (packed; every cell of a packed row is in its response)."""
    valid = [r.in_response & ~r.observation for r in rows]
    rewards = []
    for r, ok in zip(rows, valid):
        x = r.rewards.copy()
        x[~ok] = r.junk[~ok] if cfg.masked_rewards == "junk" else 0
        rewards.append(x)
    last_values = np.asarray([r.last_value for r in rows], dtype=dtype) if cfg.truncation else None

    def join(parts: list[np.ndarray]) -> np.ndarray:
        if layout == "padded":
            return np.ascontiguousarray(np.stack(parts).astype(dtype, copy=False))
        return np.ascontiguousarray(np.concatenate(parts).astype(dtype, copy=False))

    gates = None if not cfg.gated else join([r.gates for r in rows if r.gates is not None])
    cu = None
    if layout == "packed":
        cu = np.concatenate([[0], np.cumsum([r.width for r in rows])]).astype(np.int32)
    return GAEExample(
        rewards=join(rewards),
        values=join([r.values for r in rows]),
        mask=join([ok.astype(dtype) for ok in valid]),
        gamma=gamma,
        lam=lam,
        gates=gates,
        last_values=last_values,
        cu_seqlens=cu,
        layout=layout,
        padding=padding if layout == "padded" else None,
        dtype=dtype,
    )


def _discount(fixed: float | None) -> st.SearchStrategy[float]:
    if fixed is not None:
        return st.just(fixed)
    return st.one_of(st.sampled_from(COMMON_DISCOUNTS), st.floats(0.0, 1.0))


def _width(dtype: str) -> int:
    return 32 if dtype == "float32" else 64


def _number_elements(dtype: str, bound: float) -> st.SearchStrategy[float]:
    # Hypothesis draws 0, ±1, 0.5 and the bounds often and shrinks towards them.
    return st.floats(-bound, bound, width=_width(dtype), allow_subnormal=False)  # type: ignore[arg-type]


def _gate_elements(dtype: str) -> st.SearchStrategy[float]:
    # the bounds 0 and 1 are drawn often (checked by the test suite)
    return st.floats(0.0, 1.0, width=_width(dtype), allow_subnormal=False)  # type: ignore[arg-type]


def _junk_elements(dtype: str) -> st.SearchStrategy[float]:
    return st.floats(1.0, 10.0, width=_width(dtype), allow_subnormal=False)  # type: ignore[arg-type]


def gae_examples(
    *,
    max_len: int = 16,
    min_len: int = 0,
    max_rows: int = 4,
    dtypes: str | Iterable[Any] = DTYPES,
    layouts: str | Iterable[str] = LAYOUTS,
    padding: str | Iterable[str] = PADDINGS,
    multi_turn: bool = True,
    gated: bool = False,
    truncation: bool = False,
    masked_rewards: str = "zero",
    gamma: float | None = None,
    lam: float | None = None,
    min_valid: int = 0,
) -> st.SearchStrategy[GAEExample]:
    """Strategy for short, realistic GAE batches (:class:`GAEExample`, NumPy arrays).

    Every number is drawn by Hypothesis, row by row, so failures shrink to few rows of
    simple numbers (0, ±1, 0.5 first).

    Args:
      max_len: largest response length (tokens per row; padded rows have ``T ≤ max_len``
        columns). At most ``max_rows * max_len = 1024`` cells.
      min_len: smallest response length (0 = empty responses occur).
      max_rows: largest number of sequences B (at least 1 is drawn).
      dtypes: ``"float32"`` and/or ``"float64"``.
      layouts: ``"padded"`` and/or ``"packed"``.
      padding: ``"right"`` and/or ``"left"`` (padded layout).
      multi_turn: draw observation spans (masked tokens) inside responses.
      gated: draw ``gates`` (else None).
      truncation: draw ``last_values`` (else None).
      masked_rewards: ``"zero"`` or ``"junk"`` (nonzero rewards on masked tokens).
      gamma, lam: a fixed value, or None to draw (0 and 1 included).
      min_valid: draw only batches with at least this many valid tokens (whitening
        needs 2).
    """
    cfg = _GAEConfig(
        dtypes=dtypes,
        layouts=layouts,
        padding=padding,
        multi_turn=multi_turn,
        gated=gated,
        truncation=truncation,
        masked_rewards=masked_rewards,
    )
    max_len = _check_int("max_len", max_len, 1)
    min_len = _check_int("min_len", min_len, 0)
    max_rows = _check_int("max_rows", max_rows, 1)
    min_valid = _check_int("min_valid", min_valid, 0)
    if min_len > max_len:
        raise ParameterError(f"min_len: expected at most max_len={max_len}, got {min_len}", argument="min_len")
    if max_rows * max_len > MAX_ELEMENTWISE_CELLS:
        raise ParameterError(
            f"max_len: max_rows * max_len must be at most {MAX_ELEMENTWISE_CELLS} for element-wise "
            f"drawing, got {max_rows} * {max_len}; use long_gae_examples for long rows",
            argument="max_len",
        )
    if min_valid > max_rows * max_len:
        raise ParameterError(
            f"min_valid: expected at most max_rows * max_len = {max_rows * max_len}, got {min_valid}",
            argument="min_valid",
        )
    g_fixed = _check_unit("gamma", gamma)
    l_fixed = _check_unit("lam", lam)

    @st.composite
    def draw_row(draw: st.DrawFn, dtype: str, width: int | None, pad: str) -> _Row:
        if width is None:  # packed: the row is the response
            length = draw(st.integers(min_len, max_len))
            width = length
        else:
            length = draw(st.one_of(st.just(width), st.integers(min_len, width)))
        start = width - length if pad == "left" else 0
        observation = np.zeros(width, dtype=bool)
        if cfg.multi_turn and length >= 2:
            for _ in range(draw(st.integers(0, 2))):
                first = draw(st.integers(0, length - 1))
                span = draw(st.integers(1, length - first))
                observation[start + first : start + first + span] = True
        numbers = _number_elements(dtype, 10.0)
        return _Row(
            start=start,
            length=length,
            observation=observation,
            rewards=draw(hnp.arrays(dtype, (width,), elements=numbers)),
            values=draw(hnp.arrays(dtype, (width,), elements=numbers)),
            gates=draw(hnp.arrays(dtype, (width,), elements=_gate_elements(dtype))) if cfg.gated else None,
            junk=(
                draw(hnp.arrays(dtype, (width,), elements=_junk_elements(dtype)))
                if cfg.masked_rewards == "junk"
                else np.zeros(width, dtype=dtype)
            ),
            last_value=draw(numbers) if cfg.truncation else None,
        )

    @st.composite
    def draw_example(draw: st.DrawFn) -> GAEExample:
        dtype = draw(st.sampled_from(cfg.dtypes))
        layout = draw(st.sampled_from(cfg.layouts))
        pad = draw(st.sampled_from(cfg.padding)) if layout == "padded" else "right"
        width = draw(st.integers(max(1, min_len), max_len)) if layout == "padded" else None
        # a list of whole rows: shrinking deletes the rows a failure does not need
        rows = draw(st.lists(draw_row(dtype, width, pad), min_size=1, max_size=max_rows))
        return _assemble(cfg, dtype, layout, pad, rows, draw(_discount(g_fixed)), draw(_discount(l_fixed)))

    strategy = draw_example()
    if min_valid:
        strategy = strategy.filter(lambda ex: int(np.count_nonzero(to_numpy(ex.mask))) >= min_valid)
    return strategy


def long_gae_examples(
    *,
    length: int = 2048,
    max_rows: int = 2,
    dtypes: str | Iterable[Any] = ("float32",),
    layouts: str | Iterable[str] = LAYOUTS,
    padding: str | Iterable[str] = PADDINGS,
    multi_turn: bool = True,
    gated: bool = False,
    truncation: bool = False,
    masked_rewards: str = "zero",
) -> st.SearchStrategy[GAEExample]:
    """Strategy for long rows that expose float32 accumulation drift.

    Rows of ``length`` tokens (padded: ``T = length`` and responses of ``length/2`` to
    ``length`` tokens; packed: responses of that length), γ = λ = 1, gates (if
    ``gated``) exactly 1, an outcome reward ±1 (or 0.5) on each response's last valid
    token and 0 elsewhere, and critic values uniform in [-10, 10]: a sparse-reward RLHF
    batch with a noisy critic. With γλ = 1 nothing damps old rounding errors, so a
    float32 running sum ``A ← δ + A`` random-walks away from the exact value by about
    ``sqrt(length)`` units of float32 roundoff of the summands (measured at 2048
    tokens: 45–160 units at the worst position of a row), while a float64 accumulation
    rounded once to float32 is within one unit.

    The arrays come from ``numpy.random.default_rng(seed)`` with a drawn seed (too many
    numbers to draw one by one), so these examples do not shrink.

    Args mirror :func:`gae_examples`; ``dtypes`` defaults to float32, where drift exists.
    """
    cfg = _GAEConfig(
        dtypes=dtypes,
        layouts=layouts,
        padding=padding,
        multi_turn=multi_turn,
        gated=gated,
        truncation=truncation,
        masked_rewards=masked_rewards,
    )
    length = _check_int("length", length, 2)
    max_rows = _check_int("max_rows", max_rows, 1)

    def make_row(rng: np.random.Generator, dtype: str, layout: str, pad: str) -> _Row:
        width = length
        n = width if (layout == "packed" or rng.random() < 0.5) else int(rng.integers(width // 2, width + 1))
        start = width - n if pad == "left" else 0
        observation = np.zeros(width, dtype=bool)
        if cfg.multi_turn:
            for _ in range(int(rng.integers(0, 4))):
                span = int(rng.integers(1, 65))
                first = int(rng.integers(0, max(1, n - span)))
                observation[start + first : start + min(n, first + span)] = True
        cols = np.arange(width)
        in_response = (cols >= start) & (cols < start + n) & ~observation
        rewards = np.zeros(width, dtype=dtype)
        if in_response.any():
            rewards[np.flatnonzero(in_response)[-1]] = rng.choice([1.0, -1.0, 0.5])
        return _Row(
            start=start,
            length=n,
            observation=observation,
            rewards=rewards,
            values=rng.uniform(-10.0, 10.0, width).astype(dtype),
            gates=np.ones(width, dtype=dtype) if cfg.gated else None,
            junk=rng.uniform(1.0, 10.0, width).astype(dtype),
            last_value=float(rng.uniform(-10.0, 10.0)) if cfg.truncation else None,
        )

    @st.composite
    def draw_example(draw: st.DrawFn) -> GAEExample:
        dtype = draw(st.sampled_from(cfg.dtypes))
        layout = draw(st.sampled_from(cfg.layouts))
        pad = draw(st.sampled_from(cfg.padding)) if layout == "padded" else "right"
        n_rows = draw(st.integers(1, max_rows))
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        rows = [make_row(rng, dtype, layout, pad) for _ in range(n_rows)]
        return _assemble(cfg, dtype, layout, pad, rows, 1.0, 1.0)

    return draw_example()


# --------------------------------------------------------------------------- #
# Group examples
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, eq=False, repr=False)
class GroupExample:
    """One drawn outcome batch: a score and a group id per sequence.

    Attributes:
      scores: ``[B]`` outcome scores (dtype :attr:`dtype`).
      groups: ``[B]`` int64 group ids (layout per :attr:`grouping`).
      dtype: ``"float32"`` or ``"float64"``.
      grouping: ``"any"`` (ids arbitrary non-negative integers, members in any order,
        group sizes differ), ``"contiguous"`` (each group's members adjacent, sizes
        differ) or ``"uniform"`` (ids ``0, 0, …, 1, 1, …``: contiguous groups of one
        size, ``index // group_size``, as TRL's ``view(-1, G)``).
      kind: ``"numpy"`` or ``"torch"``.
    """

    scores: Any
    groups: Any
    dtype: str = "float64"
    grouping: str = "any"
    kind: str = "numpy"

    @property
    def group_size(self) -> int | None:
        """The common group size when ``grouping == "uniform"``, else None."""
        if self.grouping != "uniform":
            return None
        g = to_numpy(self.groups)
        return int(np.count_nonzero(g == g[0])) if g.size else 0

    def to(self, kind: str) -> GroupExample:
        """A copy whose arrays are of ``kind`` (``"numpy"`` or ``"torch"``)."""
        check_choice("kind", kind, ARRAY_KINDS)
        return dataclasses.replace(
            self, scores=_to_kind(self.scores, kind), groups=_to_kind(self.groups, kind), kind=kind
        )

    def numpy(self) -> GroupExample:
        """Shorthand for ``to("numpy")``."""
        return self.to("numpy")

    def __repr__(self) -> str:
        return (
            f"GroupExample(dtype={self.dtype!r}, grouping={self.grouping!r}, kind={self.kind!r},\n"
            f"    {_fmt_array('scores', self.scores)},\n"
            f"    {_fmt_array('groups', self.groups)})"
        )

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis' pretty printer
        _pretty_lines(p, repr(self))


def group_examples(
    *,
    max_groups: int = 6,
    max_group_size: int = 8,
    dtypes: str | Iterable[Any] = DTYPES,
    grouping: str = "any",
) -> st.SearchStrategy[GroupExample]:
    """Strategy for outcome-score batches (:class:`GroupExample`, NumPy arrays).

    Scores per example are binary 0/1 (a verifier; all-equal groups are common),
    small integers, or any float in [-10, 10] of the dtype. Group sizes run from 1
    (singletons) to ``max_group_size``.

    Args:
      max_groups: largest number of groups (at least 1).
      max_group_size: largest group size.
      dtypes: ``"float32"`` and/or ``"float64"``.
      grouping: ``"any"``, ``"contiguous"`` or ``"uniform"`` (see :class:`GroupExample`).
    """
    dts = _check_subset("dtypes", dtypes, DTYPES)
    max_groups = _check_int("max_groups", max_groups, 1)
    max_group_size = _check_int("max_group_size", max_group_size, 1)
    grouping = check_choice("grouping", grouping, GROUPINGS)

    @st.composite
    def draw_example(draw: st.DrawFn) -> GroupExample:
        dtype = draw(st.sampled_from(dts))
        k = draw(st.integers(1, max_groups))
        if grouping == "uniform":
            sizes = [draw(st.integers(1, max_group_size))] * k
        else:
            sizes = [draw(st.integers(1, max_group_size)) for _ in range(k)]
        if grouping == "any":
            ids = draw(st.lists(st.integers(0, 10**6), min_size=k, max_size=k, unique=True))
        else:
            ids = list(range(k))
        groups = np.repeat(np.asarray(ids, dtype=np.int64), sizes)
        if grouping == "any":
            order = draw(st.permutations(list(range(groups.shape[0]))))
            groups = groups[np.asarray(order, dtype=np.int64)]
        w = 32 if dtype == "float32" else 64
        style = draw(st.sampled_from(["binary", "integers", "floats"]))
        if style == "binary":
            elements: st.SearchStrategy[float] = st.sampled_from([0.0, 1.0])
        elif style == "integers":
            elements = st.integers(-3, 3).map(float)
        else:
            elements = st.floats(-10.0, 10.0, width=w, allow_subnormal=False)  # type: ignore[arg-type]
        scores = draw(hnp.arrays(dtype, groups.shape, elements=elements))
        return GroupExample(scores=scores, groups=groups, dtype=dtype, grouping=grouping)

    return draw_example()
