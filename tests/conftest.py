"""Shared pytest configuration for the comppo-core test suite.

* a Hypothesis profile (no deadline: the first call of a kernel builds the thread pool,
  and CI machines are noisy; we never time anything);
* a fixture that restores the kernels' thread count after a test changes it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

import comppo_core as cc

settings.register_profile(
    "default",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
# A quicker profile for local iteration: HYPOTHESIS_PROFILE=fast pytest
settings.register_profile("fast", parent=settings.get_profile("default"), max_examples=25)
# A deeper one for occasional bug hunting: HYPOTHESIS_PROFILE=thorough pytest
settings.register_profile("thorough", parent=settings.get_profile("default"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def restore_threads() -> Iterator[int]:
    """Yields the current thread count and puts it back after the test."""
    original = cc.get_num_threads()
    try:
        yield original
    finally:
        cc.set_num_threads(original)
