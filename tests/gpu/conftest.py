"""Tests that need a CUDA device: each file here is marked ``gpu``, and the ``device``
fixture skips its tests when ``torch.cuda.is_available()`` is false.

Run them on a GPU machine with ``python -m pytest tests/gpu -q``.
``COMPPO_GPU_TESTS_DEVICE=cpu python -m pytest tests/gpu -q`` runs the same tests with
the "device" tensors on the CPU: a dry run of the tests themselves, anywhere.

The checks reuse the CPU suite's models, batches and reference loops
(``tests/hf/test_hf_probe.py``, ``tests/integrations/test_integrations.py``), so the CPU and CUDA
comparisons cannot drift apart; this file puts ``tests/`` on ``sys.path`` for that.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
for _folder in (TESTS, TESTS / "hf", TESTS / "integrations"):  # the helpers; the CPU suites the GPU tests rerun
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

DEVICE_ENV = "COMPPO_GPU_TESTS_DEVICE"


@pytest.fixture(scope="session")
def device() -> Any:
    """The device under test: the current CUDA device (skip without CUDA), or the CPU
    for a dry run when ``COMPPO_GPU_TESTS_DEVICE=cpu``."""
    torch = pytest.importorskip("torch")
    name = os.environ.get(DEVICE_ENV, "cuda")
    if name == "cpu":
        return torch.device("cpu")
    if name != "cuda":
        pytest.fail(f"{DEVICE_ENV}: expected 'cuda' or 'cpu', got {name!r}")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (torch.cuda.is_available() is False)")
    # tensors report their index: compare against "cuda:0", not "cuda"
    return torch.device("cuda", torch.cuda.current_device())
