"""The package's exceptions: one family rooted in :class:`ComppoError`.

``ComppoError`` subclasses ``ValueError`` so ``except ValueError`` keeps working; wrong
kinds of input (an unsupported dtype, a non-array) raise :class:`DTypeError`, which is
also a ``TypeError``. Every message names the argument, what was expected, what was
got and, for per-token problems, the first offending ``(row, position)``.
"""

from __future__ import annotations

__all__ = [
    "ComppoError",
    "DTypeError",
    "LayoutError",
    "MaskedRewardError",
    "NonFiniteError",
    "OutOfRangeError",
    "ParameterError",
    "ShapeError",
]


class ComppoError(ValueError):
    """Root of every error raised by comppo-core."""


class ShapeError(ComppoError):
    """Arrays whose shapes, lengths or number of dimensions do not fit together."""


class LayoutError(ShapeError):
    """A malformed ``cu_seqlens`` (not starting at 0, decreasing, not ending at N)."""


class NonFiniteError(ComppoError):
    """NaN or ±inf at a valid position."""


class OutOfRangeError(ComppoError):
    """A per-token value outside its allowed range (e.g. a gate outside [0, 1])."""


class MaskedRewardError(ComppoError):
    """A nonzero reward on a masked token while ``masked_rewards="error"``."""


class ParameterError(ComppoError):
    """A scalar or option argument that is not allowed (γ outside [0, 1], low > high, ...)."""


class DTypeError(ComppoError, TypeError):
    """An input of a kind or dtype the package does not take."""
