"""``comppo-core synthetic``: GAE vs Comp-GAE on a synthetic batch, and a speed check.

The command builds a synthetic batch of LLM-style responses (sparse outcome reward on
the last token, a critic's values, a per-token attention concentration), maps the
concentration to retention gates, computes plain GAE and Comp-GAE, prints one
response's final tokens side by side, and times the Rust kernel against the NumPy
reference (:mod:`comppo_core.reference`). NumPy only.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from .. import __version__, gae, gates_from_concentration, get_num_threads, reference
from ..errors import ParameterError
from ._argtypes import gate_params, nonnegative_int, positive_int, unit_float

__all__ = ["SyntheticBatch", "add_parser", "run", "synthetic_batch"]

#: Number of valid tokens the (slow, pure-Python) reference is timed on.
REFERENCE_TOKENS = 200_000

# Concentration bursts: a two-state Markov chain per row (enter / stay probabilities).
_BURST_ENTER = 0.03
_BURST_STAY = 0.85
# Step size of the values' reflected random walk.
_VALUE_STEP = 0.05


class SyntheticBatch(NamedTuple):
    """A padded ``[B, T]`` batch (float32 arrays, bool mask) and the ``[B]`` lengths."""

    rewards: np.ndarray
    values: np.ndarray
    mask: np.ndarray
    concentration: np.ndarray
    lengths: np.ndarray


def synthetic_batch(seed: int = 0, batch: int = 256, length: int = 2048) -> SyntheticBatch:
    """A deterministic synthetic batch of ``batch`` responses right-padded to ``length``.

    * lengths: uniform integers in ``[max(1, length // 2), length]``;
    * mask: ``True`` on each row's first ``lengths[b]`` positions;
    * rewards: 0 everywhere except the last valid token of each row, which holds the
      outcome ``+1`` (correct, probability 1/2) or ``-1``;
    * values: a random walk reflected into ``[-1, 1]`` (0 at masked positions);
    * concentration: in ``[0, 1]``, ``Beta(2, 5)`` noise with bursts of ``Beta(8, 2)``
      (a per-row two-state Markov chain), 0 at masked positions.

    Same ``(seed, batch, length)``, same arrays (``numpy.random.default_rng(seed)``).
    """
    for name, n in (("batch", batch), ("length", length)):
        if n < 1:
            raise ParameterError(f"{name}: expected an integer >= 1, got {n}", argument=name)
    rng = np.random.default_rng(seed)
    lo = max(1, length // 2)
    lengths = rng.integers(lo, length, size=batch, endpoint=True)
    pos = np.arange(length)
    mask = pos[None, :] < lengths[:, None]
    rows = np.arange(batch)

    correct = rng.random(batch) < 0.5
    rewards = np.zeros((batch, length), dtype=np.float32)
    rewards[rows, lengths - 1] = np.where(correct, 1.0, -1.0)

    walk = rng.uniform(-1.0, 1.0, size=(batch, 1)) + np.cumsum(
        rng.normal(0.0, _VALUE_STEP, size=(batch, length)), axis=1
    )
    # Reflect R onto [-1, 1] (continuous triangle wave; identity on [-1, 1]).
    values = np.abs(np.mod(walk - 1.0, 4.0) - 2.0) - 1.0
    values = np.where(mask, values, 0.0).astype(np.float32)

    u = rng.random((batch, length))
    burst = np.empty((batch, length), dtype=bool)
    state = rng.random(batch) < _BURST_ENTER / (_BURST_ENTER + 1.0 - _BURST_STAY)
    for t in range(length):
        state = np.where(state, u[:, t] < _BURST_STAY, u[:, t] < _BURST_ENTER)
        burst[:, t] = state
    quiet = rng.beta(2.0, 5.0, size=(batch, length))
    loud = rng.beta(8.0, 2.0, size=(batch, length))
    conc = np.where(mask, np.where(burst, loud, quiet), 0.0).astype(np.float32)

    return SyntheticBatch(rewards, values, mask, conc, lengths)


# --------------------------------------------------------------------------- #
# Argument parsing
# --------------------------------------------------------------------------- #


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``synthetic`` command on the ``comppo-core`` parser."""
    cmd = subparsers.add_parser(
        "synthetic",
        help="GAE vs Comp-GAE on a synthetic batch, and a speed check against the NumPy reference (NumPy only)",
        description=(
            "Build a deterministic synthetic batch (sparse +1/-1 outcome reward on each "
            "response's last token, random-walk values, bursty attention concentration), "
            "map concentration to gates, compute GAE and Comp-GAE, print the last tokens "
            "of one response, and time comppo_core.gae against comppo_core.reference.gae."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    cmd.add_argument("--seed", type=int, default=0, help="seed of numpy.random.default_rng")
    cmd.add_argument("--batch", type=positive_int, default=256, help="number of responses B")
    cmd.add_argument("--length", type=positive_int, default=2048, help="padded length T")
    cmd.add_argument("--row", type=nonnegative_int, default=0, help="response to print")
    cmd.add_argument("--tokens", type=positive_int, default=24, help="how many final tokens of it to print")
    cmd.add_argument("--gamma", type=unit_float, default=1.0, help="discount γ")
    cmd.add_argument("--lam", type=unit_float, default=0.95, help="GAE λ")
    cmd.add_argument("--low", type=unit_float, default=0.5, help="lowest gate")
    cmd.add_argument("--high", type=unit_float, default=1.0, help="highest gate")
    cmd.add_argument(
        "--repeats", type=positive_int, default=5, help="timing repetitions of comppo_core.gae (best is kept)"
    )
    cmd.set_defaults(run=run)
    return cmd


# --------------------------------------------------------------------------- #
# The command
# --------------------------------------------------------------------------- #


def _best_time(fn: Callable[[], object], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _rate(tokens: int, seconds: float) -> str:
    if seconds <= 0.0:
        return "inf tokens/s"
    r = tokens / seconds
    if r >= 1e9:
        return f"{r / 1e9:.2f} G tokens/s"
    if r >= 1e6:
        return f"{r / 1e6:.2f} M tokens/s"
    if r >= 1e3:
        return f"{r / 1e3:.1f} k tokens/s"
    return f"{r:.0f} tokens/s"


def _seconds(s: float) -> str:
    if s >= 1.0:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


#: Table columns: (header, width, number format); the first column is the position.
TABLE_COLUMNS: tuple[tuple[str, int, str], ...] = (
    ("position", 8, "d"),
    ("reward", 8, "+.4f"),
    ("value", 8, "+.4f"),
    ("concentration", 13, ".4f"),
    ("gate", 8, ".4f"),
    ("GAE adv", 9, "+.4f"),
    ("Comp-GAE adv", 12, "+.4f"),
)


def _table(columns: Sequence[np.ndarray], positions: np.ndarray) -> list[str]:
    header = "  ".join(name.rjust(width) for name, width, _ in TABLE_COLUMNS)
    lines = [header, "-" * len(header)]
    for k, p in enumerate(positions):
        cells = [format(int(p), TABLE_COLUMNS[0][2]).rjust(TABLE_COLUMNS[0][1])]
        for (_, width, fmt), col in zip(TABLE_COLUMNS[1:], columns):
            cells.append(format(float(col[k]), fmt).rjust(width))
        lines.append("  ".join(cells))
    return lines


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core synthetic``; returns the exit status."""
    if args.row >= args.batch:
        parser.error(f"--row {args.row} is out of range for --batch {args.batch}")
    gate = gate_params(args, parser)  # --low, --high; the mapping's other defaults

    t_start = time.perf_counter()
    data = synthetic_batch(args.seed, args.batch, args.length)
    rewards, values, mask, conc, lengths = data
    n_tokens = int(mask.sum())
    print(
        f"comppo-core {__version__} synthetic: batch B={args.batch}, T={args.length}, "
        f"seed={args.seed}; {n_tokens} valid tokens (response lengths "
        f"{int(lengths.min())}..{int(lengths.max())}); "
        f"{int((rewards > 0).sum())} correct (+1) / {int((rewards < 0).sum())} incorrect (-1)"
    )
    print(
        f"gamma={args.gamma:g}  lam={args.lam:g}  gates from concentration: "
        f"low={gate.low:g} high={gate.high:g} ({gate.normalize} z-score, sharpness {gate.sharpness:g})"
    )

    gates = gates_from_concentration(conc, mask=mask, params=gate)
    plain = gae(rewards, values, mask=mask, gamma=args.gamma, lam=args.lam)
    comp = gae(rewards, values, mask=mask, gates=gates, gamma=args.gamma, lam=args.lam)

    # ---- one response, its final tokens -------------------------------------
    b = args.row
    n_b = int(lengths[b])
    shown = min(args.tokens, n_b)
    pos = np.arange(n_b - shown, n_b)
    print()
    print(
        f"response {b}: length {n_b} of {args.length}, outcome reward "
        f"{float(rewards[b, n_b - 1]):+g} on its last token (position {n_b - 1}); "
        f"its last {shown} tokens:"
    )
    cols = [
        rewards[b, pos],
        values[b, pos],
        conc[b, pos],
        gates[b, pos],
        plain.advantages[b, pos],
        comp.advantages[b, pos],
    ]
    for line in _table(cols, pos):
        print(line)
    valid_gates = gates[mask]
    print(
        f"gates over the batch: min {float(valid_gates.min()):.4f}, mean "
        f"{float(valid_gates.mean()):.4f}, max {float(valid_gates.max()):.4f}"
    )

    # ---- timing -------------------------------------------------------------
    def fast() -> object:
        return gae(rewards, values, mask=mask, gates=gates, gamma=args.gamma, lam=args.lam)

    fast_s = _best_time(fast, args.repeats)

    cum = np.cumsum(lengths)
    k = min(args.batch, int(np.searchsorted(cum, REFERENCE_TOKENS)) + 1)
    sub_tokens = int(cum[k - 1])
    t0 = time.perf_counter()
    ref_adv, ref_ret = reference.gae(
        rewards[:k], values[:k], mask=mask[:k], gates=gates[:k], gamma=args.gamma, lam=args.lam
    )
    ref_s = time.perf_counter() - t0
    diff_adv = float(np.max(np.abs(comp.advantages[:k].astype(np.float64) - ref_adv)))
    diff_ret = float(np.max(np.abs(comp.returns[:k].astype(np.float64) - ref_ret)))
    ref_rate = sub_tokens / ref_s if ref_s > 0 else math.inf
    fast_rate = n_tokens / fast_s if fast_s > 0 else math.inf
    ref_full_s = n_tokens / ref_rate if ref_rate > 0 else math.inf

    print()
    print(f"timing Comp-GAE (advantages + returns) on the whole batch, {n_tokens} valid tokens:")
    print(
        f"  comppo_core.gae            {_seconds(fast_s):>10}  {_rate(n_tokens, fast_s):>20}   (best of {args.repeats})"
    )
    if k == args.batch:
        how = "Python loop: timed once on the whole batch"
    else:
        how = (
            f"Python loop: timed once on the first {k} row{'s' if k != 1 else ''}, "
            f"{sub_tokens} tokens, in {_seconds(ref_s)}; scaled per token to the batch"
        )
    print(f"  comppo_core.reference.gae  {_seconds(ref_full_s):>10}  {_rate(sub_tokens, ref_s):>20}   ({how})")
    speedup = fast_rate / ref_rate if ref_rate > 0 else math.inf
    print(f"  speedup                    {speedup:>9.0f}x")
    print(
        f"  agreement on those {k} row{'s' if k != 1 else ''}: max |Δ advantages| = {diff_adv:.3e}, "
        f"max |Δ returns| = {diff_ret:.3e}"
    )
    print(f"comppo_core.get_num_threads() = {get_num_threads()}")
    print(f"total: {_seconds(time.perf_counter() - t_start)}")
    return 0
