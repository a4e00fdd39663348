"""Hypothesis strategies that draw realistic advantage-estimation batches.

Three kinds of example, each a small frozen dataclass:

* :class:`GAEExample`, drawn by :func:`gae_examples` (short rows, every array drawn
  element by element so that Hypothesis shrinks failures to small, readable numbers) and
  :func:`long_gae_examples` (rows of thousands of tokens, drawn from a seeded NumPy
  generator, for float32 accumulation drift): batches as training loops build them;
* :class:`GroupExample`, drawn by :func:`group_examples` (outcome scores and group ids);
* :class:`RaggedBatch` and :class:`ConcentrationBatch`, drawn by :func:`ragged_batches`
  and :func:`concentration_batches` on a :class:`RaggedLayout` (:func:`ragged_layouts`):
  every input a kernel must accept (masks of any dtype or none, float16, int32 or int64
  ``cu_seqlens``, empty batches, junk at masked positions), in both layouts at once.

What a GAE example (:class:`GAEExample`) contains (docs/design.md §2):

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
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..errors import ParameterError
from ..options import check_choice

__all__ = [
    "ARRAY_KINDS",
    "ConcentrationBatch",
    "DTYPES",
    "GAEExample",
    "GROUPINGS",
    "GroupExample",
    "JUNK_GATES",
    "JUNK_VALUES",
    "LAYOUTS",
    "MASKED_REWARDS",
    "MASK_DTYPES",
    "PADDINGS",
    "RAGGED_DTYPES",
    "RaggedBatch",
    "RaggedLayout",
    "assert_unchanged",
    "concentration_batches",
    "discounts",
    "gae_examples",
    "group_examples",
    "long_gae_examples",
    "ragged_batches",
    "ragged_layouts",
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
        key = np.dtype(item).name if name.endswith("dtypes") and not isinstance(item, str) else item
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


def discounts() -> st.SearchStrategy[float]:
    """Strategy for γ or λ: the endpoints 0 and 1 and the common settings of
    ``COMMON_DISCOUNTS`` often (shrinking towards 1), any float in [0, 1] otherwise."""
    return st.one_of(st.sampled_from(COMMON_DISCOUNTS), st.floats(0.0, 1.0))


def _discount(fixed: float | None) -> st.SearchStrategy[float]:
    return discounts() if fixed is None else st.just(fixed)


def _width(dtype: Any) -> int:
    return 8 * np.dtype(dtype).itemsize


def _number_elements(dtype: Any, bound: float) -> st.SearchStrategy[float]:
    # Hypothesis draws 0, ±1, 0.5 and the bounds often and shrinks towards them.
    return st.floats(-bound, bound, width=_width(dtype), allow_subnormal=False)  # type: ignore[arg-type]


def _gate_elements(dtype: Any) -> st.SearchStrategy[float]:
    # the bounds 0 and 1 are drawn often (checked by the test suite)
    return st.floats(0.0, 1.0, width=_width(dtype), allow_subnormal=False)  # type: ignore[arg-type]


def _junk_elements(dtype: Any) -> st.SearchStrategy[float]:
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
        # the number of rows, then the rows: Hypothesis shrinks the count and deletes the
        # rows a failure does not need (from a list of rows it often keeps some)
        rows = [draw(draw_row(dtype, width, pad)) for _ in range(draw(st.integers(1, max_rows)))]
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


# --------------------------------------------------------------------------- #
# Ragged batches: every input a kernel must accept
# --------------------------------------------------------------------------- #

#: Float dtypes :func:`ragged_batches` and :func:`concentration_batches` can draw.
RAGGED_DTYPES = ("float16", "float32", "float64")
#: Mask dtypes :func:`ragged_layouts` draws: what users pass (bool, integers, floats).
MASK_DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint64", "float32", "float64")
#: Junk at masked positions of values and concentrations (``junk=True``).
JUNK_VALUES = (math.nan, math.inf, -math.inf, 7.0)
#: Junk at masked positions of gates: JUNK_VALUES and numbers outside [0, 1].
JUNK_GATES = (*JUNK_VALUES, -3.0, 1.5)


def _mask_entries(dtype: np.dtype) -> tuple[float, ...]:
    """The nonzero values a mask of ``dtype`` holds on valid positions."""
    if dtype.kind == "f":
        return (1.0, 0.5, 2.0, -1.0, 1e-3)
    if dtype.kind == "u":
        return (1, 2, 255 if dtype.itemsize == 1 else 1000)
    return (1, 2, -1, 100)


def _choices(draw: st.DrawFn, values: Sequence[float], dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """A ``shape`` array of ``dtype`` whose entries are drawn from ``values``."""
    picks = draw(hnp.arrays(np.int64, shape, elements=st.integers(0, len(values) - 1)))
    return np.asarray(values, dtype=dtype)[picks]


def _put_junk(draw: st.DrawFn, x: np.ndarray, valid: np.ndarray, junk: Sequence[float]) -> None:
    """Overwrites the masked positions of ``x`` (where ``valid`` is False) with ``junk``."""
    if (~valid).any():
        x[~valid] = _choices(draw, junk, x.dtype, x.shape)[~valid]


def _check_optional_bool(name: str, value: Any) -> bool | None:
    return None if value is None else _check_bool(name, value)


@dataclass(frozen=True, eq=False)
class RaggedLayout:
    """Which positions of a ragged batch are valid, in both layouts of docs/design.md §2.

    Row ``b`` of the padded ``[B, T]`` grid holds ``lengths[b] <= T`` positions at its
    start (the rest of the row is padding); inside that length an inner (multi-turn) mask
    may mark observation tokens invalid, whole rows included. The same positions exist

    * padded: ``[B, T]`` arrays with :attr:`mask` (None only when every position is valid);
    * packed: ``[N]`` arrays, the first ``lengths[b]`` positions of each row concatenated
      (:meth:`pack`), with :attr:`cu_seqlens` and :attr:`packed_mask` (None when there is
      no inner mask).

    Attributes:
      lengths: ``[B]`` int64 row lengths (``B`` may be 0).
      valid: ``[B, T]`` bool, True inside the row's length and not inner-masked.
      inner: whether an inner mask was drawn.
      mask: ``[B, T]`` array of one of :data:`MASK_DTYPES`: 0 where invalid, a nonzero
        value where valid (1, 2, -1, 0.5, 1e-3, 255, ...: anything nonzero means valid);
        None when every position is valid.
      cu_dtype: int32 or int64, the dtype of :attr:`cu_seqlens`.
    """

    lengths: np.ndarray
    valid: np.ndarray
    inner: bool
    mask: np.ndarray | None
    cu_dtype: np.dtype

    @property
    def shape(self) -> tuple[int, int]:
        """``(B, T)``, the padded grid."""
        rows, cols = self.valid.shape
        return int(rows), int(cols)

    @property
    def cu_seqlens(self) -> np.ndarray:
        """``[B+1]`` offsets of the packed layout, of dtype :attr:`cu_dtype`."""
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(self.cu_dtype)

    @property
    def packed_mask(self) -> np.ndarray | None:
        """The packed mask: :attr:`mask` packed when there is an inner mask, else None."""
        return self.pack(self.mask) if self.inner else None

    @overload
    def pack(self, x: np.ndarray) -> np.ndarray: ...
    @overload
    def pack(self, x: None) -> None: ...
    def pack(self, x: np.ndarray | None) -> np.ndarray | None:
        """The packed ``[N]`` version of a padded ``[B, T]`` array (None stays None)."""
        if x is None:
            return None
        parts = [x[b, : self.lengths[b]] for b in range(x.shape[0])]
        return np.concatenate(parts) if parts else x.reshape(-1)[:0].copy()

    def unpack(self, flat: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """A packed ``[N]`` array scattered back to ``[B, T]`` (``fill`` beyond each length)."""
        out = np.full(self.shape, fill, dtype=flat.dtype)
        cu = self.cu_seqlens
        for b in range(self.shape[0]):
            out[b, : self.lengths[b]] = flat[cu[b] : cu[b + 1]]
        return out


def _layout_fields(layout: RaggedLayout) -> dict[str, Any]:
    return {f.name: getattr(layout, f.name) for f in dataclasses.fields(RaggedLayout)}


@dataclass(frozen=True, eq=False)
class RaggedBatch(RaggedLayout):
    """A drawn ragged batch (:func:`ragged_batches`): NumPy arrays on a
    :class:`RaggedLayout`, in the call convention of ``comppo_core.gae``.

    Attributes (besides the layout's):
      dtype: the NumPy float dtype of rewards, values and gates.
      rewards: ``[B, T]``, 0 at masked positions.
      values: ``[B, T]``, junk (NaN, ±inf, 7) at masked positions when drawn with junk.
      gates: ``[B, T]`` in [0, 1] (exactly 0 and 1 often) or None; junk at masked
        positions (NaN, ±inf, numbers outside [0, 1]) when drawn with junk.
      last_values: ``[B]`` float64 bootstrap values, or None.
    """

    dtype: np.dtype
    rewards: np.ndarray
    values: np.ndarray
    gates: np.ndarray | None
    last_values: np.ndarray | None

    def padded(self, **extra: Any) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """``(rewards, values, kwargs)`` of the padded call: ``kwargs`` holds ``mask``,
        ``gates`` and ``last_values``, updated with ``extra``."""
        kw: dict[str, Any] = {"mask": self.mask, "gates": self.gates, "last_values": self.last_values}
        kw.update(extra)
        return self.rewards, self.values, kw

    def packed(self, **extra: Any) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """``(rewards, values, kwargs)`` of the packed call on the same data: ``kwargs``
        holds ``mask`` (:attr:`packed_mask`), packed ``gates``, ``last_values`` and
        ``cu_seqlens``, updated with ``extra``."""
        kw: dict[str, Any] = {
            "mask": self.packed_mask,
            "gates": self.pack(self.gates),
            "last_values": self.last_values,
            "cu_seqlens": self.cu_seqlens,
        }
        kw.update(extra)
        return self.pack(self.rewards), self.pack(self.values), kw

    def arrays(self) -> list[np.ndarray | None]:
        """``[rewards, values, mask, gates, last_values]``, the arrays themselves."""
        return [self.rewards, self.values, self.mask, self.gates, self.last_values]

    def copies(self) -> list[np.ndarray | None]:
        """Copies of :meth:`arrays`, to compare with :func:`assert_unchanged` after a call."""
        return [None if a is None else a.copy() for a in self.arrays()]


@dataclass(frozen=True, eq=False)
class ConcentrationBatch(RaggedLayout):
    """A drawn batch of per-token concentrations (:func:`concentration_batches`).

    Attributes (besides the layout's):
      dtype: the NumPy float dtype of ``conc``.
      conc: ``[B, T]`` concentrations on a 1/1000 grid in [-10, 10]; junk (NaN, ±inf, 7)
        at masked positions when drawn with junk.
    """

    dtype: np.dtype
    conc: np.ndarray


def ragged_layouts(
    *,
    max_rows: int = 6,
    max_len: int = 12,
    mask_dtypes: str | Iterable[Any] = MASK_DTYPES,
    unmasked: bool = True,
) -> st.SearchStrategy[RaggedLayout]:
    """Strategy for validity patterns of ragged batches (:class:`RaggedLayout`).

    ``B`` from 0 (an empty batch) to ``max_rows`` rows of ``T`` from 1 to ``max_len``
    columns. Rows fill the grid or have any length from 0 to ``T``; an inner mask, when
    drawn, masks out positions and sometimes whole rows.

    Args:
      max_rows: largest number of rows B.
      max_len: largest number of columns T.
      mask_dtypes: the mask dtypes to draw, names from :data:`MASK_DTYPES` or NumPy dtypes.
      unmasked: also draw layouts without a mask (about a third of them: every position
        valid, ``mask`` None).
    """
    max_rows = _check_int("max_rows", max_rows, 0)
    max_len = _check_int("max_len", max_len, 1)
    dts = _check_subset("mask_dtypes", mask_dtypes, MASK_DTYPES)
    unmasked = _check_bool("unmasked", unmasked)
    dtype_choice = st.sampled_from([np.dtype(d) for d in dts])

    @st.composite
    def draw_layout(draw: st.DrawFn) -> RaggedLayout:
        B = draw(st.integers(0, max_rows))
        T = draw(st.integers(1, max_len))
        mask_dtype = draw(st.one_of(st.none(), dtype_choice, dtype_choice) if unmasked else dtype_choice)
        cu_dtype = np.dtype(draw(st.sampled_from([np.int32, np.int64])))
        if mask_dtype is None:
            full = np.full(B, T, dtype=np.int64)
            return RaggedLayout(
                lengths=full, valid=np.ones((B, T), dtype=bool), inner=False, mask=None, cu_dtype=cu_dtype
            )
        if draw(st.booleans()):
            lengths = np.full(B, T, dtype=np.int64)
        else:
            lengths = np.asarray(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)), dtype=np.int64)
        valid = np.arange(T)[None, :] < lengths[:, None]
        inner = draw(st.booleans())
        if inner:
            keep = draw(hnp.arrays(np.bool_, (B, T), elements=st.booleans()))
            dead_rows = draw(hnp.arrays(np.bool_, (B,), elements=st.booleans())) & draw(st.booleans())
            valid &= keep & ~dead_rows[:, None]
        if mask_dtype == np.bool_:
            mask = valid.copy()
        else:
            mask = np.zeros((B, T), dtype=mask_dtype)
            mask[valid] = _choices(draw, _mask_entries(mask_dtype), mask_dtype, (B, T))[valid]
        return RaggedLayout(lengths=lengths, valid=valid, inner=inner, mask=mask, cu_dtype=cu_dtype)

    return draw_layout()


def ragged_batches(
    *,
    dtypes: str | Iterable[Any] = DTYPES,
    gates: bool | None = None,
    last_values: bool | None = None,
    junk: bool | None = None,
    max_rows: int = 6,
    max_len: int = 12,
    mask_dtypes: str | Iterable[Any] = MASK_DTYPES,
    unmasked: bool = True,
) -> st.SearchStrategy[RaggedBatch]:
    """Strategy for ragged GAE batches that probe a kernel's input handling
    (:class:`RaggedBatch`, NumPy arrays in both layouts).

    Where :func:`gae_examples` draws batches as training loops build them, these draw
    every input a kernel in the convention of ``comppo_core.gae`` must accept: masks of
    any of :data:`MASK_DTYPES` whose valid entries are any nonzero number, no mask at all,
    ``cu_seqlens`` of int32 or int64, empty batches and rows, and junk at masked
    positions, which the contract says is never read. Rewards and values are in
    [-10, 10].

    Args:
      dtypes: float dtypes to draw, names from :data:`RAGGED_DTYPES` or NumPy dtypes.
      gates, last_values: True or False to always or never draw them, None to draw
        either.
      junk: put junk at masked positions of values (:data:`JUNK_VALUES`) and gates
        (:data:`JUNK_GATES`): True, False, or None for either.
      max_rows, max_len, mask_dtypes, unmasked: as :func:`ragged_layouts`.
    """
    dts = _check_subset("dtypes", dtypes, RAGGED_DTYPES)
    fixed = {name: _check_optional_bool(name, v) for name, v in (("gates", gates), ("last_values", last_values))}
    fixed["junk"] = _check_optional_bool("junk", junk)
    layouts = ragged_layouts(max_rows=max_rows, max_len=max_len, mask_dtypes=mask_dtypes, unmasked=unmasked)

    def flag(draw: st.DrawFn, name: str) -> bool:
        value = fixed[name]
        return draw(st.booleans()) if value is None else value

    @st.composite
    def draw_batch(draw: st.DrawFn) -> RaggedBatch:
        dtype = np.dtype(draw(st.sampled_from(dts)))
        layout = draw(layouts)
        shape, valid = layout.shape, layout.valid
        numbers = _number_elements(dtype, 10.0)
        rewards = draw(hnp.arrays(dtype, shape, elements=numbers))
        rewards[~valid] = 0
        values = draw(hnp.arrays(dtype, shape, elements=numbers))
        g = None
        if flag(draw, "gates"):
            g = draw(hnp.arrays(dtype, shape, elements=st.one_of(st.sampled_from([0.0, 1.0]), _gate_elements(dtype))))
        if flag(draw, "junk"):
            _put_junk(draw, values, valid, JUNK_VALUES)
            if g is not None:
                _put_junk(draw, g, valid, JUNK_GATES)
        lv = None
        if flag(draw, "last_values"):
            lv = draw(hnp.arrays(np.float64, (shape[0],), elements=_number_elements(np.float64, 10.0)))
        return RaggedBatch(
            **_layout_fields(layout), dtype=dtype, rewards=rewards, values=values, gates=g, last_values=lv
        )

    return draw_batch()


def concentration_batches(
    *,
    dtypes: str | Iterable[Any] = DTYPES,
    junk: bool | None = None,
    max_rows: int = 6,
    max_len: int = 12,
    mask_dtypes: str | Iterable[Any] = MASK_DTYPES,
    unmasked: bool = True,
) -> st.SearchStrategy[ConcentrationBatch]:
    """Strategy for ragged batches of per-token concentrations, the input of
    ``comppo_core.gates_from_concentration`` (:class:`ConcentrationBatch`).

    Concentrations lie on a 1/1000 grid in [-10, 10], with a few levels drawn often so
    that flat rows and ties occur. The grid keeps every row's spread (and every prefix's,
    which ``normalize="causal"`` z-scores against) either exactly 0 or at least 1e-3, so a
    z-score computed with sequential (or running) sums and one computed with pairwise sums
    agree to about 1e-12 instead of amplifying the rounding noise of nearly equal values
    by 1/(σ + ε).

    Args:
      dtypes: float dtypes to draw, names from :data:`RAGGED_DTYPES` or NumPy dtypes.
      junk: put junk (:data:`JUNK_VALUES`) at masked positions: True, False, or None for
        either.
      max_rows, max_len, mask_dtypes, unmasked: as :func:`ragged_layouts`.
    """
    dts = _check_subset("dtypes", dtypes, RAGGED_DTYPES)
    use_junk = _check_optional_bool("junk", junk)
    layouts = ragged_layouts(max_rows=max_rows, max_len=max_len, mask_dtypes=mask_dtypes, unmasked=unmasked)
    levels = st.one_of(st.integers(-10_000, 10_000), st.sampled_from([0, 1000, -2500]))

    @st.composite
    def draw_batch(draw: st.DrawFn) -> ConcentrationBatch:
        dtype = np.dtype(draw(st.sampled_from(dts)))
        layout = draw(layouts)
        conc = (draw(hnp.arrays(np.int64, layout.shape, elements=levels)) / 1000.0).astype(dtype)
        if draw(st.booleans()) if use_junk is None else use_junk:
            _put_junk(draw, conc, layout.valid, JUNK_VALUES)
        return ConcentrationBatch(**_layout_fields(layout), dtype=dtype, conc=conc)

    return draw_batch()


def assert_unchanged(before: Sequence[Any], after: Sequence[Any]) -> None:
    """Checks that a function left its inputs alone: each array of ``after`` (NumPy
    arrays or torch tensors) equals the one of ``before`` bit for bit (dtype, shape and
    bytes, NaNs included), and None stays None. ``before`` is copies taken before the call
    (:meth:`RaggedBatch.copies`), ``after`` the arrays passed (:meth:`RaggedBatch.arrays`).

    Raises:
      AssertionError: naming the first array that changed.
    """
    if len(before) != len(after):
        raise AssertionError(f"assert_unchanged: {len(before)} arrays before, {len(after)} after")
    for i, (a, b) in enumerate(zip(before, after)):
        if a is None or b is None:
            if a is not b:
                was, now = ("None", "an array") if a is None else ("an array", "None")
                raise AssertionError(f"input {i}: {was} before, {now} after")
            continue
        a, b = to_numpy(a), to_numpy(b)
        if a.dtype != b.dtype or a.shape != b.shape:
            raise AssertionError(f"input {i}: {a.dtype} {a.shape} before, {b.dtype} {b.shape} after")
        if a.tobytes() != b.tobytes():
            raise AssertionError(f"input {i} was modified in place")
