"""Checking your own GAE and GRPO code against comppo-core's exact reference.

``comppo_core.testing`` draws batches with Hypothesis (right and left padding,
multi-turn masks, empty rows, float32 and float64, γ and λ anywhere in [0, 1] including
the ends, long float32 rows), calls your function on each, and compares it with the
float64 reference. This script checks:

1. a NumPy GAE loop written the way verl's is (it passes);
2. the same loop with a classic bug, stepping through masked tokens instead of
   skipping them (it fails, and the message shows where);
3. a GRPO function (it passes).

Needs the [testing] extra (hypothesis):  python examples/check_my_gae.py
In a test suite, call the checks from a test function instead; see docs/testing.md.
"""

import numpy as np

from comppo_core.testing import ConformanceError, check_gae, check_group_advantages


def my_gae(rewards, values, mask, gamma, lam):
    """GAE over the valid tokens of [B, T] arrays; masked tokens are skipped (verl's
    multi-turn semantics). Accumulates in float64, returns the input dtype."""
    r, v, m = (np.asarray(x, np.float64) for x in (rewards, values, mask))
    adv = np.zeros_like(r)
    next_value = np.zeros(r.shape[0])
    next_adv = np.zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        valid = m[:, t] > 0
        a = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * next_adv
        adv[:, t] = np.where(valid, a, 0.0)
        next_value = np.where(valid, v[:, t], next_value)  # a masked token passes the value through
        next_adv = np.where(valid, a, next_adv)
    return adv.astype(rewards.dtype), (adv + v).astype(rewards.dtype)


def my_buggy_gae(rewards, values, mask, gamma, lam):
    """The same, but a masked token resets the bootstrap value to its own (zeroed) value."""
    r, v, m = (np.asarray(x, np.float64) for x in (rewards, values, mask))
    adv = np.zeros_like(r)
    next_value = np.zeros(r.shape[0])
    next_adv = np.zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        a = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * next_adv
        adv[:, t] = a * m[:, t]
        next_value = v[:, t] * m[:, t]  # the bug
        next_adv = np.where(m[:, t] > 0, a, next_adv)
    return adv.astype(rewards.dtype), (adv + v).astype(rewards.dtype)


def my_grpo(scores, groups):
    """GRPO: (s − mean of the group) / (unbiased std of the group + 1e-6); 0 for a group of one."""
    scores, groups = np.asarray(scores, np.float64), np.asarray(groups)
    out = np.zeros_like(scores)
    for g in np.unique(groups):
        members = groups == g
        if members.sum() > 1:
            s = scores[members]
            out[members] = (s - s.mean()) / (s.std(ddof=1) + 1e-6)
    return out


check_gae(my_gae)
print("my_gae: agrees with the reference")

try:
    check_gae(my_buggy_gae)
except ConformanceError as failure:  # an AssertionError: pytest reports it as a failed test
    print("my_buggy_gae is caught:")
    print("\n".join(str(failure).splitlines()[:12]))
else:
    raise SystemExit("my_buggy_gae should have failed the check")

check_group_advantages(my_grpo, method="grpo")
print("my_grpo: agrees with the reference")
