"""The package's exceptions: one family rooted in :class:`ComppoError`.

``ComppoError`` subclasses ``ValueError`` so ``except ValueError`` keeps working; wrong
kinds of input (an unsupported dtype, a non-array) raise :class:`DTypeError`, which is
also a ``TypeError``. Every message names the argument, what was expected, what was
got and, for per-token problems, the first offending ``(row, position)``.

The same facts are attributes, so code that handles an error never parses its message
(every class here, and the subclasses defined elsewhere such as
:class:`comppo_core.hf.ProbeError`, has them; ``None`` where one does not apply):

``argument``
    the offending argument, as the caller named it (``"rewards"``, ``"gamma"``,
    ``"cu_seqlens"``; in :mod:`comppo_core.arrow` the column's name). The message starts
    with it. An error about two arguments together names the first one the message
    names.
``row``, ``position``
    the first offending token, in row-major order: sequence ``row`` (row of ``[B, T]``,
    or the row-th sequence of a packed batch), token ``position`` inside it, in both
    layouts. A per-sequence value (``last_values[b]``) has a ``row`` and no
    ``position``. In :mod:`comppo_core.arrow` the row counts from the start of the
    column (plus ``row_offset``).
``index``
    the first offending entry of a 1-D argument (``scores[i]``, ``cu_seqlens[i]``); for a
    per-token array of the packed layout, the flat index into ``[N]`` next to ``row`` and
    ``position`` (the message says ``(row r, position p) [flat index k]``).

For example a NaN in ``rewards`` at row 0, position 1::

    >>> import numpy as np, comppo_core as cc
    >>> try:
    ...     cc.gae(np.array([[0.0, np.nan]]), np.zeros((1, 2)))
    ... except cc.NonFiniteError as e:
    ...     print(e.argument, e.row, e.position, e.index)
    rewards 0 1 None

The attributes are keyword arguments of every constructor
(``NonFiniteError(message, argument="rewards", row=0, position=1)``); ``str(e)`` is the
message alone, and the errors pickle with their attributes (they cross process
boundaries, e.g. Ray workers, intact).
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
    "location",
]


def location(row: int, position: int, index: int | None = None) -> str:
    """The text messages give a token location: ``(row r, position p)``, followed by
    `` [flat index k]`` when ``index`` is given (the kernels' format, ``rust/error.rs``)."""
    text = f"(row {row}, position {position})"
    return text if index is None else f"{text} [flat index {index}]"


class ComppoError(ValueError):
    """Root of every error raised by comppo-core.

    Args:
      message: the whole message; ``str(error)`` returns it unchanged.
      argument, row, position, index: the attributes of the same names (module
        docstring); ``None`` where they do not apply.
    """

    argument: str | None
    row: int | None
    position: int | None
    index: int | None

    def __init__(
        self,
        message: str,
        *,
        argument: str | None = None,
        row: int | None = None,
        position: int | None = None,
        index: int | None = None,
    ) -> None:
        # args == (message,): str() is the message, and pickling (BaseException's
        # __reduce__: the class, args and __dict__) rebuilds it with its attributes.
        super().__init__(message)
        self.argument = argument
        self.row = row
        self.position = position
        self.index = index


class ShapeError(ComppoError):
    """Arrays whose shapes, lengths or number of dimensions do not fit together."""


class LayoutError(ShapeError):
    """A malformed ``cu_seqlens`` (not starting at 0, decreasing, not ending at N);
    ``index`` is its first offending entry."""


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
