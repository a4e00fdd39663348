"""Test your own advantage code against comppo-core's exact reference.

``comppo_core.testing`` turns the plain-NumPy oracles of :mod:`comppo_core.reference` into
a testing tool for advantage code you keep yourself (a verl fork, a custom PPO loop, JAX
or torch)::

    from comppo_core.testing import check_gae, check_group_advantages

    def test_my_gae():
        check_gae(my_gae, array="torch")                   # fn(rewards, values, mask=, gamma=, lam=)

    def test_my_grpo():
        check_group_advantages(my_grpo, method="grpo")     # fn(scores, groups)

* :func:`check_gae` / :func:`check_group_advantages`: Hypothesis property tests; on failure
  a :class:`ConformanceError` (an ``AssertionError``) shows the shrunk counterexample as a
  per-token table and names the first differing (row, position).
* :mod:`comppo_core.testing.strategies`: the strategies they draw from
  (:func:`~strategies.gae_examples`, :func:`~strategies.long_gae_examples`,
  :func:`~strategies.group_examples`), for your own properties, with
  :func:`expected_gae` and :func:`expected_group_advantages` as the expected values;
  and strategies for a kernel's input handling (:func:`~strategies.ragged_batches`,
  :func:`~strategies.concentration_batches`: masks of any dtype, junk at masked
  positions, both layouts), with :func:`assert_unchanged` for inputs left alone.

Needs Hypothesis: ``pip install 'comppo-core[testing]'``. ``import comppo_core`` alone does
not import this module or Hypothesis.
"""

from __future__ import annotations

try:
    import hypothesis  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError("comppo_core.testing needs Hypothesis: pip install 'comppo-core[testing]'") from exc

from . import strategies
from .checks import (
    GROUP_METHODS,
    RTOL_ULPS,
    SEMANTICS,
    ConformanceError,
    check_gae,
    check_group_advantages,
    default_gae_call,
    default_group_call,
    expected_gae,
    expected_group_advantages,
)
from .strategies import ConcentrationBatch, GAEExample, GroupExample, RaggedBatch, RaggedLayout, assert_unchanged

__all__ = [
    "GROUP_METHODS",
    "RTOL_ULPS",
    "SEMANTICS",
    "ConcentrationBatch",
    "ConformanceError",
    "GAEExample",
    "GroupExample",
    "RaggedBatch",
    "RaggedLayout",
    "assert_unchanged",
    "check_gae",
    "check_group_advantages",
    "default_gae_call",
    "default_group_call",
    "expected_gae",
    "expected_group_advantages",
    "strategies",
]
