"""The README's "Test your own advantage code" example, run as a test.

Everything below the marker line is the README's code block, verbatim
(tests/test_testing.py::test_readme_section_matches_the_example_test keeps them equal).
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("hypothesis")

# --- README example ---
import torch

from comppo_core.testing import check_gae


def my_gae(rewards, values, mask, gamma, lam):
    """GAE over the valid tokens of [B, T] tensors (masked tokens are skipped, as in
    verl's multi-turn GAE), accumulated in float64, returned in the input dtype."""
    r, v, m = rewards.double(), values.double(), mask.double()
    B, T = r.shape
    adv = torch.zeros_like(r)
    next_value = torch.zeros(B, dtype=torch.float64)
    next_adv = torch.zeros(B, dtype=torch.float64)
    for t in reversed(range(T)):
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        valid = m[:, t] > 0
        adv[:, t] = torch.where(valid, a, 0.0)
        next_value = torch.where(valid, v[:, t], next_value)
        next_adv = torch.where(valid, a, next_adv)
    return adv.to(rewards.dtype), (adv + v).to(rewards.dtype)


def test_my_gae():
    check_gae(my_gae, array="torch")
