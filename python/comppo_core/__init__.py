"""comppo-core: exact, fast GAE and Comp-GAE advantages for PPO-style RL of LLMs.

The backend of CompPO: a detached statistic of the policy's attention
("concentration") becomes a bounded per-token retention gate, and the gate steers how
credit travels back through a response (Comp-GAE). A constant gate is plain GAE.

Every function takes the padded layout (``[B, T]`` + optional ``mask``) or the packed
layout (``[N]`` + ``cu_seqlens``); :mod:`comppo_core.reference` holds plain NumPy
versions of all of them.
"""

from __future__ import annotations

from . import controls, errors, options, reference
from ._core import __version__ as __version__  # Cargo.toml's, compiled into the extension
from ._core import get_num_threads, set_num_threads
from .advantages import GAEResult, gae, td_targets
from .diagnostics import credit_stats
from .errors import (
    ComppoError,
    DTypeError,
    LayoutError,
    MaskedRewardError,
    NonFiniteError,
    OutOfRangeError,
    ParameterError,
    ShapeError,
)
from .gate_params import GateParams
from .gating import gates_from_concentration
from .outcomes import broadcast, group_advantages
from .whitening import masked_whiten

__all__ = [
    "ComppoError",
    "DTypeError",
    "GAEResult",
    "GateParams",
    "LayoutError",
    "MaskedRewardError",
    "NonFiniteError",
    "OutOfRangeError",
    "ParameterError",
    "ShapeError",
    "broadcast",
    "controls",
    "credit_stats",
    "errors",
    "gae",
    "gates_from_concentration",
    "get_num_threads",
    "group_advantages",
    "masked_whiten",
    "options",
    "reference",
    "set_num_threads",
    "td_targets",
]
