"""Tests of comppo_core.testing: the conformance checks users run on their own code.

Three groups:

* the checks pass for the package's own kernels, its verl/OpenRLHF drop-ins, verl's and
  OpenRLHF's original loops, and hand-written correct loops;
* they catch each planted bug, written here as a one-line deviation from a correct
  hand-written loop (so the correct loop passing is the control), with a
  ConformanceError whose message holds the per-token table and names the first
  differing (row, position);
* strategies, argument errors, failure modes (exceptions, shapes, mutated inputs) and
  import hygiene.

Every check runs with a fixed seed (the default), so results are deterministic.
"""

from __future__ import annotations

import functools
import math
import re
import subprocess
import sys
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

import comppo_core as cc
from comppo_core import reference
from comppo_core.integrations import openrlhf, verl
from comppo_core.testing import (
    ConformanceError,
    GAEExample,
    GroupExample,
    check_gae,
    check_group_advantages,
    expected_gae,
    expected_group_advantages,
    strategies,
)

torch = pytest.importorskip("torch")

GAE_HEADER = re.compile(r"position\s+mask\s+reward\s+value\s+gate\s+expected\s+got")
GROUP_HEADER = re.compile(r"index\s+group\s+score\s+expected\s+got")
FAST = settings(max_examples=40, deadline=None, database=None)


# --------------------------------------------------------------------------- #
# Hand-written user code: correct versions and planted bugs
# --------------------------------------------------------------------------- #


def loop_gae(
    rewards: Any,
    values: Any,
    mask: Any,
    gamma: float,
    lam: float,
    gates: Any = None,
    last_values: Any = None,
    *,
    bug: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A user's padded [B, T] GAE loop with verl's skip semantics, accumulating in float64.

    ``bug`` plants exactly one deviation:

    * ``"gate_next"``: the gate of step t+1 is applied at step t;
    * ``"masked_decay"``: masked tokens still decay the trace by γλ (skip semantics broken);
    * ``"no_bootstrap"``: ``last_values`` ignored (truncated rows treated as terminal);
    * ``"right_padding_only"``: a row's response is assumed to be its first
      ``mask.sum()`` positions, so left-padded rows are read from padded positions;
    * ``"float32"``: accumulates in the input dtype (float32 running sums).
    """
    r, v, m = np.asarray(rewards), np.asarray(values), np.asarray(mask)
    acc = r.dtype.type if bug == "float32" else np.float64
    rows, cols = r.shape
    adv = np.zeros((rows, cols), dtype=acc)
    for b in range(rows):
        a_next = acc(0.0)
        v_next = acc(0.0 if last_values is None or bug == "no_bootstrap" else last_values[b])
        g_later = acc(1.0)
        ts = range(int(np.count_nonzero(m[b]))) if bug == "right_padding_only" else range(cols)
        for t in reversed(ts):
            if m[b, t] == 0 and bug != "right_padding_only":
                if bug == "masked_decay":
                    a_next = a_next * acc(gamma * lam)
                continue
            g = acc(1.0) if gates is None else acc(gates[b, t])
            gg = acc(gamma) * (g_later if bug == "gate_next" else g)
            delta = acc(r[b, t]) + gg * v_next - acc(v[b, t])
            a = delta + gg * acc(lam) * a_next
            adv[b, t] = a
            a_next, v_next, g_later = a, acc(v[b, t]), g
    ret = adv + v
    return adv.astype(r.dtype), ret.astype(r.dtype)


def decay_loop(
    values: Any, rewards: Any, action_mask: Any, gamma: float, lambd: float, *, bug: str | None = None
) -> Any:
    """A user's OpenRLHF-style loop in float64 (torch). ``bug="unmasked_rewards"``: values
    are multiplied by the mask but rewards are not, so rewards on padding are read."""
    v = (values * action_mask).double()
    r = (rewards if bug == "unmasked_rewards" else rewards * action_mask).double()
    steps = r.shape[1]
    last = torch.zeros(r.shape[0], dtype=torch.float64)
    out = []
    for t in reversed(range(steps)):
        nv = v[:, t + 1] if t < steps - 1 else 0.0
        last = r[:, t] + gamma * nv - v[:, t] + gamma * lambd * last
        out.append(last)
    adv = torch.stack(out[::-1], dim=1)
    return adv.to(values.dtype), (adv + v).to(values.dtype)


def verl_original(token_level_rewards: Any, values: Any, response_mask: Any, gamma: float, lam: float) -> Any:
    """verl's ``compute_gae_advantage_return`` (loop and ``masked_whiten``), verbatim in
    substance: it computes in the input dtype."""
    with torch.no_grad():
        nextvalues: Any = 0
        lastgaelam: Any = 0
        advantages_reversed = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam_ = delta + gamma * lam * lastgaelam
            nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
            lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
        n = response_mask.sum()
        mean = (advantages * response_mask).sum() / n
        var = ((advantages - mean) ** 2 * response_mask).sum() / n * (n / (n - 1))
        advantages = (advantages - mean) * torch.rsqrt(var + 1e-8)
    return advantages, returns


def grpo_numpy(scores: Any, groups: Any, *, eps: float = 1e-6, ddof: int = 1) -> np.ndarray:
    """A user's GRPO over group ids (float64). ``ddof=0`` plants the population-std bug."""
    s = np.asarray(scores, dtype=np.float64)
    g = np.asarray(groups)
    out = np.zeros_like(s)
    for gid in np.unique(g):
        idx = g == gid
        if idx.sum() < 2:
            continue  # a singleton has no baseline: 0
        out[idx] = (s[idx] - s[idx].mean()) / (s[idx].std(ddof=ddof) + eps)
    return out


def grpo_torch(scores: Any, groups: Any, *, eps: float = 1e-6, guard_singletons: bool = True) -> Any:
    """A user's GRPO in torch, unbiased std written out. Without ``guard_singletons`` a
    group of one divides 0 by n − 1 = 0: NaN (the planted bug)."""
    s = scores.double()
    out = torch.zeros_like(s)
    for gid in torch.unique(groups):
        idx = groups == gid
        n = int(idx.sum())
        if n == 1 and guard_singletons:
            continue
        x = s[idx]
        std = torch.sqrt(((x - x.mean()) ** 2).sum() / (n - 1))
        out[idx] = (x - x.mean()) / (std + eps)
    return out.to(scores.dtype)


def grpo_view(scores: Any, group_size: int, eps: float = 1e-6) -> Any:
    """TRL-style GRPO on contiguous groups of one size (``view(-1, G)``), float64."""
    if group_size == 1:
        return torch.zeros_like(scores)
    x = scores.double().view(-1, group_size)
    a = (x - x.mean(dim=1, keepdim=True)) / (x.std(dim=1, keepdim=True) + eps)
    return a.reshape(-1).to(scores.dtype)


def bugged(bug: str, base: Any = loop_gae) -> Any:
    fn = functools.partial(base, bug=bug)
    fn.__qualname__ = f"{base.__name__}[{bug}]"  # type: ignore[attr-defined]
    return fn


def verl_call(ex: GAEExample, fn: Any) -> Any:
    return fn(ex.rewards, ex.values, ex.mask, ex.gamma, ex.lam)


def openrlhf_call(ex: GAEExample, fn: Any) -> Any:
    return fn(ex.values, ex.rewards, ex.mask, ex.gamma, ex.lam)


def assert_table_failure(err: ConformanceError, *, output: str = "advantages") -> str:
    """The message has the table, names the first differing (row, position), and that
    position really is the first valid position where the outputs differ."""
    msg = str(err)
    assert GAE_HEADER.search(msg), msg
    assert f"{output} differ first at row {err.row}, position {err.position}" in msg, msg
    assert "<-- first difference" in msg
    assert err.output == output and isinstance(err.example, GAEExample)
    return msg


# --------------------------------------------------------------------------- #
# The checks pass for correct code
# --------------------------------------------------------------------------- #


def test_package_gae_passes_every_feature() -> None:
    check_gae(cc.gae, gated=True, truncation=True, layouts=("padded", "packed"), max_examples=120)


def test_package_gae_passes_ungated_terminal_torch() -> None:
    check_gae(cc.gae, array="torch", layouts=("padded", "packed"), max_examples=40, long_len=0)


def test_package_gae_ignores_junk_rewards_with_drop() -> None:
    def call(ex: GAEExample, fn: Any) -> Any:
        return fn(
            ex.rewards,
            ex.values,
            mask=ex.mask,
            cu_seqlens=ex.cu_seqlens,
            gates=ex.gates,
            gamma=ex.gamma,
            lam=ex.lam,
            masked_rewards="drop",
        )

    check_gae(
        cc.gae, gated=True, masked_rewards="junk", layouts=("padded", "packed"), call=call, max_examples=40, long_len=0
    )


def test_reference_gae_passes() -> None:
    check_gae(reference.gae, gated=True, truncation=True, layouts=("padded", "packed"), max_examples=40, long_len=0)


@pytest.mark.parametrize("gated", [False, True])
def test_verl_dropin_passes_whitened(gated: bool) -> None:
    def call(ex: GAEExample, fn: Any) -> Any:
        return fn(ex.rewards, ex.values, ex.mask, ex.gamma, ex.lam, gates=ex.gates)

    check_gae(
        verl.compute_gae_advantage_return,
        whiten=True,
        gated=gated,
        array="torch",
        masked_rewards="junk",
        call=call,
        max_examples=40,
    )


def test_openrlhf_dropin_passes_decay() -> None:
    def call(ex: GAEExample, fn: Any) -> Any:
        return fn(ex.values, ex.rewards, ex.mask, ex.gamma, ex.lam, gates=ex.gates)

    check_gae(
        openrlhf.get_advantages_and_returns,
        semantics="decay",
        gated=True,
        array="torch",
        masked_rewards="junk",
        call=call,
        max_examples=60,
    )


def test_openrlhf_style_loop_passes_decay() -> None:
    check_gae(decay_loop, semantics="decay", array="torch", call=openrlhf_call, max_examples=25, long_len=0)


def test_correct_hand_written_loop_passes() -> None:
    check_gae(loop_gae, gated=True, truncation=True, max_examples=60)


def test_advantages_only_result_is_accepted() -> None:
    check_gae(lambda *a, **k: cc.gae(*a, **k).advantages, max_examples=20, long_len=0)


def test_verl_original_loop_float64_passes_float32_drifts() -> None:
    check_gae(verl_original, whiten=True, array="torch", call=verl_call, dtypes="float64", max_examples=40)
    # float32 accumulation: the long-row phase catches it (in the unwhitened returns).
    with pytest.raises(ConformanceError) as info:
        check_gae(
            verl_original, whiten=True, array="torch", call=verl_call, dtypes="float32", max_len=1, max_examples=20
        )
    msg = assert_table_failure(info.value, output="returns")
    assert "long-row phase" in msg and "float32 rounding" in msg


def test_float64_accumulation_with_float32_whitening_passes() -> None:
    """Whitening done in float32 torch after a float64 GAE is within the whitened bound."""

    def fn(r: Any, v: Any, m: Any, gamma: float, lam: float) -> Any:
        _, ret = verl_original(r.double(), v.double(), m.double(), gamma, lam)
        a = (ret - v.double()).to(r.dtype)
        n = m.sum()
        mean = (a * m).sum() / n
        var = ((a - mean) ** 2 * m).sum() / n * (n / (n - 1))
        return (a - mean) * torch.rsqrt(var + 1e-8), ret.to(r.dtype)

    check_gae(fn, whiten=True, array="torch", call=verl_call, max_examples=60)


@pytest.mark.parametrize("method", ["grpo", "drgrpo", "rloo", "reinforce_baseline"])
@pytest.mark.parametrize("singleton", ["zero", "raw"])
def test_package_group_advantages_passes(method: str, singleton: str) -> None:
    fn = functools.partial(cc.group_advantages, method=method, singleton=singleton)
    check_group_advantages(fn, method, singleton=singleton, max_examples=40)


def test_package_group_advantages_passes_torch() -> None:
    check_group_advantages(
        functools.partial(cc.group_advantages, method="rloo"), "rloo", array="torch", max_examples=30
    )


def test_hand_written_grpo_passes() -> None:
    check_group_advantages(grpo_numpy, "grpo", max_examples=40)
    check_group_advantages(grpo_torch, "grpo", array="torch", max_examples=40)


def test_uniform_groups_adapter_passes() -> None:
    check_group_advantages(
        grpo_view,
        "grpo",
        grouping="uniform",
        array="torch",
        call=lambda ex, fn: fn(ex.scores, ex.group_size),
        max_examples=40,
    )


# --------------------------------------------------------------------------- #
# Planted bugs are caught
# --------------------------------------------------------------------------- #


def test_catches_gate_applied_at_next_step() -> None:
    with pytest.raises(ConformanceError) as info:
        check_gae(bugged("gate_next"), gated=True, max_len=6, max_examples=60)
    msg = assert_table_failure(info.value)
    ex = info.value.example
    assert ex.gates is not None and "gates=gates" in msg
    assert np.asarray(ex.rewards).size <= 4, "Hypothesis shrinks to a tiny batch"


def test_catches_masked_tokens_decaying_under_skip() -> None:
    with pytest.raises(ConformanceError) as info:
        # the check's default 200 examples: with 60, about one seed in five draws no
        # observation span that shows the bug (the seed is fixed, but the stream moves
        # with the constants Hypothesis collects from the package's source)
        check_gae(bugged("masked_decay"), max_len=6, max_examples=200)
    assert_table_failure(info.value)
    ex = info.value.example
    row = np.asarray(ex.mask)[info.value.row]
    # the first difference sits before an observation token of its row
    assert (row[info.value.position :] == 0).any()
    assert ex.gamma * ex.lam < 1
    # without multi-turn masks (and with right padding) the bug cannot show
    check_gae(bugged("masked_decay"), multi_turn=False, padding="right", max_examples=30, long_len=0)


def test_catches_missing_truncation_bootstrap() -> None:
    with pytest.raises(ConformanceError) as info:
        check_gae(bugged("no_bootstrap"), truncation=True, max_len=6, max_examples=60)
    msg = assert_table_failure(info.value)
    assert "last_value=" in msg and info.value.example.last_values is not None
    # the same code is fine for terminal rows
    check_gae(bugged("no_bootstrap"), max_examples=30, long_len=0)


def test_catches_reward_read_from_padding_with_left_padding() -> None:
    with pytest.raises(ConformanceError) as info:
        check_gae(bugged("right_padding_only"), padding="left", multi_turn=False, max_len=6, max_examples=60)
    msg = assert_table_failure(info.value)
    assert "left padding" in msg
    check_gae(bugged("right_padding_only"), padding="right", multi_turn=False, max_examples=30, long_len=0)


def test_catches_reward_read_from_padding_with_junk_rewards() -> None:
    fn = bugged("unmasked_rewards", decay_loop)
    with pytest.raises(ConformanceError) as info:
        check_gae(
            fn, semantics="decay", array="torch", masked_rewards="junk", call=openrlhf_call, max_len=6, max_examples=60
        )
    assert_table_failure(info.value)
    ex = info.value.example
    assert (np.asarray(ex.rewards)[np.asarray(ex.mask) == 0] != 0).all()
    # with zero rewards on padding the bug is invisible: that is what "junk" is for
    check_gae(fn, semantics="decay", array="torch", call=openrlhf_call, max_examples=30, long_len=0)


def test_catches_float32_accumulation_drift_over_long_rows() -> None:
    fn = bugged("float32")
    # Rows of one token leave nothing to accumulate: the short phase passes, and the
    # long-row phase catches the drift.
    with pytest.raises(ConformanceError) as info:
        check_gae(fn, dtypes="float32", max_len=1, max_examples=20)
    msg = assert_table_failure(info.value)
    assert "long-row phase: 2048-token float32 rows" in msg and "hint:" in msg
    check_gae(fn, dtypes="float32", max_len=1, max_examples=20, long_len=0)
    # float64 inputs accumulate in float64 even in the buggy loop
    check_gae(fn, dtypes="float64", max_examples=30)


def test_catches_population_std_in_grpo() -> None:
    with pytest.raises(ConformanceError) as info:
        check_group_advantages(functools.partial(grpo_numpy, ddof=0), "grpo", max_group_size=4, max_examples=60)
    err = info.value
    msg = str(err)
    assert GROUP_HEADER.search(msg) and "<-- first difference" in msg
    assert f"advantages differ first at index {err.index}" in msg
    groups = np.asarray(err.example.groups)
    assert np.count_nonzero(groups == groups[err.index]) >= 2


def test_catches_singleton_groups_giving_nan() -> None:
    fn = functools.partial(grpo_torch, guard_singletons=False)
    for singleton in ("zero", "raw"):
        with pytest.raises(ConformanceError) as info:
            check_group_advantages(fn, "grpo", singleton=singleton, array="torch", max_group_size=4, max_examples=60)
        err = info.value
        msg = str(err)
        assert GROUP_HEADER.search(msg) and "got nan" in msg
        groups = np.asarray(err.example.groups)
        assert np.count_nonzero(groups == groups[err.index]) == 1, "the first difference is a singleton"


# --------------------------------------------------------------------------- #
# Tolerances: tight enough to matter, loose enough for correct code
# --------------------------------------------------------------------------- #


def _perturbed(rel: float) -> Any:
    def fn(rewards: Any, values: Any, *, mask: Any, gamma: float, lam: float) -> Any:
        ex = GAEExample(rewards=rewards, values=values, mask=mask, gamma=gamma, lam=lam, dtype=rewards.dtype.name)
        adv, ret = expected_gae(ex)
        return (adv * (1 + rel)).astype(rewards.dtype), ret.astype(rewards.dtype)

    return fn


def test_one_rounding_passes_and_small_relative_errors_fail() -> None:
    check_gae(_perturbed(0.0), max_examples=40)
    with pytest.raises(ConformanceError):
        check_gae(_perturbed(1e-5), dtypes="float32", max_len=6, max_examples=40, long_len=0)
    with pytest.raises(ConformanceError):
        check_gae(_perturbed(1e-12), dtypes="float64", max_len=6, max_examples=40, long_len=0)


def test_nan_output_fails() -> None:
    def fn(rewards: Any, values: Any, *, mask: Any, gamma: float, lam: float) -> Any:
        adv, ret = cc.gae(rewards, values, mask=mask, gamma=gamma, lam=lam)
        adv[...] = np.nan
        return adv, ret

    with pytest.raises(ConformanceError) as info:
        check_gae(fn, max_examples=10, long_len=0)
    assert "got nan" in assert_table_failure(info.value)


# --------------------------------------------------------------------------- #
# Failure modes other than wrong numbers
# --------------------------------------------------------------------------- #


def test_exception_in_fn_is_reported_with_the_example() -> None:
    def fn(rewards: Any, values: Any, mask: Any, gamma: float, lam: float) -> Any:  # no last_values
        return cc.gae(rewards, values, mask=mask, gamma=gamma, lam=lam)

    with pytest.raises(ConformanceError) as info:
        check_gae(fn, truncation=True, max_examples=5)
    msg = str(info.value)
    assert "raised TypeError" in msg and "last_values=last_values" in msg and "GAEExample(" in msg
    assert isinstance(info.value.__cause__, TypeError)


def test_wrong_shape_fails() -> None:
    def fn(rewards: Any, values: Any, *, mask: Any, gamma: float, lam: float) -> Any:
        return cc.gae(rewards, values, mask=mask, gamma=gamma, lam=lam).advantages[:, :-1]

    with pytest.raises(ConformanceError, match=r"advantages must have shape \(1, 1\)"):
        check_gae(fn, max_examples=5, long_len=0)


def test_three_outputs_fail() -> None:
    with pytest.raises(ConformanceError, match="tuple of 3 items"):
        check_gae(lambda r, v, **k: (r, r, r), max_examples=5, long_len=0)


def test_modified_input_fails() -> None:
    def fn(rewards: Any, values: Any, *, mask: Any, gamma: float, lam: float) -> Any:
        adv, ret = cc.gae(rewards, values, mask=mask, gamma=gamma, lam=lam)
        values[..., -1] += 1.0  # in place: the batch's values are corrupted
        return adv, ret

    with pytest.raises(ConformanceError, match="modified its input 'values' in place"):
        check_gae(fn, max_len=6, max_examples=20, long_len=0)
    with pytest.raises(ConformanceError, match="modified its input 'values' in place"):
        check_gae(fn, array="torch", max_len=6, max_examples=20, long_len=0)


def test_group_tuple_result_fails() -> None:
    with pytest.raises(ConformanceError, match="expected a \\[B\\] array"):
        check_group_advantages(lambda s, g: (s, s), max_examples=5)


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"semantics": "openrlhf"}, "semantics"),
        ({"array": "jax"}, "array"),
        ({"gated": "yes"}, "gated"),
        ({"whiten": 1}, "whiten"),
        ({"max_examples": 0}, "max_examples"),
        ({"layouts": ("padded", "ragged")}, "layouts"),
        ({"layouts": ()}, "layouts"),
        ({"padding": "middle"}, "padding"),
        ({"dtypes": ("float16",)}, "dtypes"),
        ({"max_len": 0}, "max_len"),
        ({"max_len": 2000}, "max_len"),
        ({"masked_rewards": "nan"}, "masked_rewards"),
        ({"long_len": 1}, "long_len"),
        ({"long_len": -5}, "long_len"),
        ({"seed": -1}, "seed"),
        ({"semantics": "decay", "truncation": True}, "truncation"),
        ({"multi_turn": None}, "multi_turn"),
    ],
)
def test_check_gae_bad_arguments(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: "):
        check_gae(cc.gae, **kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"method": "ppo"}, "method"),
        ({"singleton": "nan"}, "singleton"),
        ({"eps": -1.0}, "eps"),
        ({"eps": math.nan}, "eps"),
        ({"grouping": "sorted"}, "grouping"),
        ({"array": "cupy"}, "array"),
        ({"max_group_size": 0}, "max_group_size"),
    ],
)
def test_check_group_advantages_bad_arguments(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: "):
        check_group_advantages(cc.group_advantages, **kwargs)


def test_non_callables() -> None:
    with pytest.raises(TypeError, match="^fn: "):
        check_gae(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^call: "):
        check_gae(cc.gae, call="fn(rewards)")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^fn: "):
        check_group_advantages(None)  # type: ignore[arg-type]


def test_expected_gae_arguments() -> None:
    ex = GAEExample(
        rewards=np.zeros((1, 3)), values=np.ones((1, 3)), mask=np.array([[1.0, 0.0, 0.0]]), gamma=1.0, lam=1.0
    )
    with pytest.raises(ValueError, match="^semantics: "):
        expected_gae(ex, semantics="both")
    with pytest.raises(ValueError, match="^whiten=True needs at least 2 valid tokens"):
        expected_gae(ex, whiten=True)
    lv = GAEExample(
        rewards=np.zeros((1, 2)),
        values=np.ones((1, 2)),
        mask=np.ones((1, 2)),
        gamma=1.0,
        lam=1.0,
        last_values=np.ones(1),
    )
    with pytest.raises(ValueError, match="^last_values: "):
        expected_gae(lv, semantics="decay")


# --------------------------------------------------------------------------- #
# Expected values
# --------------------------------------------------------------------------- #


def test_expected_gae_by_hand() -> None:
    """One row [v=1, observation, v=2], r on the last token, γ = 1, λ = 0.5."""
    ex = GAEExample(
        rewards=np.array([[0.0, 0.0, 1.0]]),
        values=np.array([[1.0, 5.0, 2.0]]),
        mask=np.array([[1.0, 0.0, 1.0]]),
        gamma=1.0,
        lam=0.5,
        last_values=np.array([0.5]),
    )
    adv, ret = expected_gae(ex)
    # skip: A_2 = 1 + 0.5 − 2 = −0.5; A_0 = (0 + 2 − 1) + 0.5·(−0.5) = 0.75
    np.testing.assert_array_equal(adv, [[0.75, 0.0, -0.5]])
    np.testing.assert_array_equal(ret, [[1.75, 0.0, 1.5]])
    decay = GAEExample(rewards=ex.rewards, values=ex.values, mask=ex.mask, gamma=1.0, lam=0.5)
    adv, _ = expected_gae(decay, semantics="decay")
    # decay: A_2 = 1 − 2 = −1; A_1 = 0 + 2 − 0 + 0.5·(−1) = 1.5; A_0 = 0 + 0 − 1 + 0.5·1.5 = −0.25
    np.testing.assert_array_equal(adv, [[-0.25, 0.0, -1.0]])


@settings(FAST)
@given(strategies.gae_examples(gated=True, layouts=("padded", "packed"), min_valid=2))
def test_expected_gae_agrees_with_kernels(ex: GAEExample) -> None:
    adv, ret = expected_gae(ex)
    kw = {"cu_seqlens": ex.cu_seqlens} if ex.layout == "packed" else {}
    a64, r64 = cc.gae(
        np.asarray(ex.rewards, np.float64),
        np.asarray(ex.values, np.float64),
        mask=ex.mask,
        gates=ex.gates,
        gamma=ex.gamma,
        lam=ex.lam,
        **kw,
    )
    np.testing.assert_allclose(adv, a64, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ret, r64, rtol=1e-12, atol=1e-12)
    w, _ = expected_gae(ex, whiten=True)
    np.testing.assert_allclose(w, cc.masked_whiten(a64, mask=ex.mask, **kw), rtol=1e-9, atol=1e-9)


@settings(FAST)
@given(strategies.gae_examples(gated=True, layouts="padded"))
def test_expected_decay_agrees_with_openrlhf_dropin(ex: GAEExample) -> None:
    adv, ret = expected_gae(ex, semantics="decay")
    a, r = openrlhf.get_advantages_and_returns(
        np.asarray(ex.values, np.float64), np.asarray(ex.rewards, np.float64), ex.mask, ex.gamma, ex.lam, gates=ex.gates
    )
    valid = np.asarray(ex.mask) != 0
    np.testing.assert_allclose(adv[valid], a[valid], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ret[valid], r[valid], rtol=1e-12, atol=1e-12)


def test_expected_group_advantages_by_hand() -> None:
    ex = GroupExample(scores=np.array([1.0, 0.0, 1.0, 3.0]), groups=np.array([5, 5, 5, 9]))
    e = expected_group_advantages(ex, method="rloo")
    np.testing.assert_allclose(e, [0.5, -1.0, 0.5, 0.0])
    e = expected_group_advantages(ex, method="grpo", eps=0.0, singleton="raw")
    np.testing.assert_allclose(e, [1 / math.sqrt(3), -2 / math.sqrt(3), 1 / math.sqrt(3), 3.0])


# --------------------------------------------------------------------------- #
# Strategies
# --------------------------------------------------------------------------- #


@settings(FAST)
@given(
    st.data(),
    st.sampled_from(["zero", "junk"]),
    st.booleans(),
    st.booleans(),
)
def test_gae_examples_are_well_formed(data: st.DataObject, masked: str, gated: bool, truncation: bool) -> None:
    ex = data.draw(
        strategies.gae_examples(
            max_len=6,
            max_rows=3,
            layouts=("padded", "packed"),
            gated=gated,
            truncation=truncation,
            masked_rewards=masked,
        )
    )
    r, v, m = (np.asarray(x) for x in (ex.rewards, ex.values, ex.mask))
    assert r.dtype == v.dtype == m.dtype == np.dtype(ex.dtype)
    assert r.shape == v.shape == m.shape and set(np.unique(m)) <= {0.0, 1.0}
    assert np.isfinite(r).all() and np.isfinite(v).all()
    masked_r = r[m == 0]
    assert (masked_r == 0).all() if masked == "zero" else (masked_r != 0).all()
    assert (ex.gates is not None) == gated and (ex.last_values is not None) == truncation
    if gated:
        g = np.asarray(ex.gates)
        assert g.shape == r.shape and ((g >= 0) & (g <= 1)).all()
    assert 0.0 <= ex.gamma <= 1.0 and 0.0 <= ex.lam <= 1.0
    if ex.layout == "packed":
        cu = np.asarray(ex.cu_seqlens)
        assert r.ndim == 1 and cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == r.shape[0]
        assert (np.diff(cu) >= 0).all() and (np.diff(cu) <= 6).all() and ex.padding is None
    else:
        assert r.ndim == 2 and r.shape[1] <= 6 and ex.cu_seqlens is None and ex.padding in ("right", "left")
    assert ex.num_rows == len(ex.sequences())
    text = repr(ex)
    assert text.startswith("GAEExample(layout=") and "mask=" in text and "gamma=" in text


def test_padding_side_places_the_response() -> None:
    """Without observation spans, right-padded rows are a valid prefix, left-padded a suffix."""

    @settings(FAST)
    @given(strategies.gae_examples(multi_turn=False, layouts="padded", max_len=8))
    def check(ex: GAEExample) -> None:
        for row in np.asarray(ex.mask) != 0:
            n = int(row.sum())
            want = np.arange(row.size) < n if ex.padding == "right" else np.arange(row.size) >= row.size - n
            assert (row == want).all()

    check()


def _find(strategy: Any, condition: Any) -> Any:
    """Hypothesis finds an example with ``condition`` (stopping at the first): the strategy
    draws it. Raises ``NoSuchExample`` if 1000 examples lack it."""
    return find(
        strategy, condition, settings=settings(max_examples=1000, deadline=None, database=None, phases=[Phase.generate])
    )


@pytest.mark.parametrize(
    "feature",
    [
        "gate 0 and 1",
        "gamma 0",
        "gamma 1",
        "lam 0",
        "lam 1",
        "empty row",
        "observation span",
        "left padding",
        "packed empty sequence",
        "float32",
        "float64",
        "max length",
    ],
)
def test_gae_examples_cover(feature: str) -> None:
    conditions = {
        "gate 0 and 1": lambda ex: (np.asarray(ex.gates) == 0).any() and (np.asarray(ex.gates) == 1).any(),
        "gamma 0": lambda ex: ex.gamma == 0.0,
        "gamma 1": lambda ex: ex.gamma == 1.0,
        "lam 0": lambda ex: ex.lam == 0.0,
        "lam 1": lambda ex: ex.lam == 1.0,
        "empty row": lambda ex: ex.layout == "padded" and (np.asarray(ex.mask) == 0).all(axis=1).any(),
        "observation span": lambda ex: (
            ex.layout == "padded"
            and ex.padding == "right"
            and any((np.diff(row) > 0).any() for row in np.asarray(ex.mask))
        ),
        "left padding": lambda ex: ex.padding == "left" and (np.asarray(ex.mask)[:, 0] == 0).any(),
        "packed empty sequence": lambda ex: ex.layout == "packed" and (np.diff(np.asarray(ex.cu_seqlens)) == 0).any(),
        "float32": lambda ex: ex.dtype == "float32",
        "float64": lambda ex: ex.dtype == "float64",
        "max length": lambda ex: ex.layout == "padded" and np.asarray(ex.rewards).shape[1] == 8,
    }
    _find(strategies.gae_examples(gated=True, max_len=8, layouts=("padded", "packed")), conditions[feature])


@pytest.mark.parametrize("grouping", ["any", "contiguous", "uniform"])
def test_group_examples(grouping: str) -> None:
    @settings(FAST)
    @given(strategies.group_examples(grouping=grouping, max_group_size=4))
    def check(ex: GroupExample) -> None:
        s, g = np.asarray(ex.scores), np.asarray(ex.groups)
        assert s.shape == g.shape and s.ndim == 1 and s.size >= 1 and g.dtype == np.int64
        counts = np.unique(g, return_counts=True)[1]
        assert counts.max() <= 4
        if grouping != "any":
            assert (np.diff(g) >= 0).all()
        if grouping == "uniform":
            assert ex.group_size is not None and (counts == ex.group_size).all()
            np.testing.assert_array_equal(g, np.arange(g.size) // ex.group_size)
        else:
            assert ex.group_size is None
        assert repr(ex).startswith("GroupExample(")

    check()
    _find(
        strategies.group_examples(grouping=grouping),
        lambda ex: 1 in np.unique(np.asarray(ex.groups), return_counts=True)[1],
    )
    if grouping == "any":
        _find(strategies.group_examples(), lambda ex: (np.diff(np.asarray(ex.groups)) < 0).any())


def test_long_examples_are_long_float32_and_undamped() -> None:
    @settings(max_examples=5, deadline=None, database=None)
    @given(strategies.long_gae_examples(length=512, layouts=("padded", "packed"), gated=True, truncation=True))
    def check(ex: GAEExample) -> None:
        assert ex.dtype == "float32" and ex.gamma == 1.0 and ex.lam == 1.0
        assert (np.asarray(ex.gates) == 1).all() and ex.last_values is not None
        lengths = (
            np.diff(np.asarray(ex.cu_seqlens)) if ex.layout == "packed" else (np.asarray(ex.mask) != 0).sum(axis=1)
        )
        # responses span length/2..length tokens; up to 3 observation spans of <= 64 tokens are masked out
        assert lengths.max() >= 512 // 2 - 3 * 64

    check()


def test_example_to_torch_and_back() -> None:
    ex = GAEExample(
        rewards=np.zeros(3, np.float32),
        values=np.ones(3, np.float32),
        mask=np.ones(3, np.float32),
        gamma=1.0,
        lam=0.5,
        cu_seqlens=np.array([0, 1, 3], np.int32),
        layout="packed",
        padding=None,
        dtype="float32",
    )
    t = ex.to("torch")
    assert isinstance(t.rewards, torch.Tensor) and t.cu_seqlens.dtype == torch.int32 and t.kind == "torch"
    assert t.valid.dtype == torch.bool and t.num_rows == 2
    back = t.numpy()
    assert isinstance(back.values, np.ndarray) and back.kind == "numpy"
    np.testing.assert_array_equal(back.values, ex.values)
    assert "kind='torch'" in repr(t)
    with pytest.raises(ValueError, match="^kind: "):
        ex.to("jax")


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"max_len": 0}, "max_len"),
        ({"min_len": 9, "max_len": 8}, "min_len"),
        ({"dtypes": "int8"}, "dtypes"),
        ({"gamma": 1.5}, "gamma"),
        ({"lam": "0.9"}, "lam"),
        ({"max_rows": 0}, "max_rows"),
        ({"min_valid": 10_000}, "min_valid"),
    ],
)
def test_strategy_bad_arguments(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: "):
        strategies.gae_examples(**kwargs)


@settings(FAST)
@given(st.data(), st.sampled_from(strategies.RAGGED_DTYPES), st.sampled_from([None, True, False]))
def test_ragged_batches_are_well_formed(data: st.DataObject, dtype: str, junk: bool | None) -> None:
    b = data.draw(strategies.ragged_batches(dtypes=dtype, junk=junk, max_rows=4, max_len=7))
    B, T = b.shape
    assert B <= 4 and 1 <= T <= 7 and b.rewards.shape == b.values.shape == (B, T)
    assert b.dtype == np.dtype(dtype) and b.rewards.dtype == b.values.dtype == b.dtype
    assert b.lengths.shape == (B,) and ((b.lengths >= 0) & (b.lengths <= T)).all()
    assert not (b.valid & (np.arange(T)[None, :] >= b.lengths[:, None])).any()  # valid only inside a row's length
    if b.mask is None:
        assert b.valid.all() and not b.inner
    else:
        assert b.mask.dtype.name in strategies.MASK_DTYPES and ((b.mask != 0) == b.valid).all()
    assert np.isfinite(b.rewards).all() and (b.rewards[~b.valid] == 0).all()
    assert (np.abs(b.values[b.valid]) <= 10).all() and (np.isfinite(b.values).all() or junk is not False)
    if b.gates is not None:
        assert b.gates.dtype == b.dtype and ((b.gates[b.valid] >= 0) & (b.gates[b.valid] <= 1)).all()
    assert b.last_values is None or (b.last_values.shape == (B,) and b.last_values.dtype == np.float64)
    cu = b.cu_seqlens
    assert cu.dtype == b.cu_dtype and cu.dtype in (np.int32, np.int64) and (np.diff(cu) == b.lengths).all()
    r, v, kw = b.packed(gamma=0.5)
    assert r.shape == v.shape == (int(cu[-1]),) and kw["gamma"] == 0.5 and (kw["mask"] is None) == (not b.inner)
    assert kw["cu_seqlens"].dtype == cu.dtype and (kw["gates"] is None) == (b.gates is None)
    in_length = np.arange(T)[None, :] < b.lengths[:, None]
    np.testing.assert_array_equal(b.unpack(v), np.where(in_length, b.values, 0))
    rp, vp, kwp = b.padded()
    assert rp is b.rewards and vp is b.values and kwp["mask"] is b.mask and kwp["gates"] is b.gates
    strategies.assert_unchanged(b.copies(), b.arrays())


def _masked(x: np.ndarray | None, b: strategies.RaggedBatch) -> np.ndarray:
    return np.asarray([]) if x is None else x[~b.valid]


#: What ragged_batches() must draw: every mask dtype, no mask, and every corner of the layout
RAGGED_FEATURES: dict[str, Any] = {
    **{f"{d} mask": (lambda b, d=d: b.mask is not None and b.mask.dtype.name == d) for d in strategies.MASK_DTYPES},
    "no mask": lambda b: b.mask is None and b.shape[0] > 0,
    "empty batch": lambda b: b.shape[0] == 0,
    "empty row": lambda b: (b.lengths == 0).any(),
    "dead row": lambda b: b.inner and ((b.lengths > 0) & ~b.valid.any(axis=1)).any(),
    "inner mask": lambda b: b.inner and (b.lengths > 0).all() and (b.packed_mask == 0).any(),
    "full grid": lambda b: b.mask is not None and b.shape[0] > 0 and (b.lengths == b.shape[1]).all(),
    "int32 cu_seqlens": lambda b: b.cu_seqlens.dtype == np.int32,
    "int64 cu_seqlens": lambda b: b.cu_seqlens.dtype == np.int64,
    "NaN value": lambda b: np.isnan(_masked(b.values, b)).any(),
    "inf gate": lambda b: np.isinf(_masked(b.gates, b)).any(),
    "gate -3": lambda b: (_masked(b.gates, b) == -3).any(),
    "gate 0 and 1": lambda b: b.gates is not None and {0.0, 1.0} <= set(b.gates[b.valid].tolist()),
}


@pytest.mark.parametrize("feature", list(RAGGED_FEATURES))
def test_ragged_batches_cover(feature: str) -> None:
    _find(strategies.ragged_batches(), RAGGED_FEATURES[feature])


@settings(FAST)
@given(st.data(), st.sampled_from([None, True, False]))
def test_concentration_batches_on_a_grid(data: st.DataObject, junk: bool | None) -> None:
    c = data.draw(strategies.concentration_batches(dtypes="float64", junk=junk))
    assert c.conc.shape == c.valid.shape and c.conc.dtype == c.dtype == np.float64
    grid = c.conc[c.valid] * 1000
    np.testing.assert_allclose(grid, np.round(grid), rtol=0, atol=1e-9)  # k/1000 rounded to float64
    assert (np.abs(grid) <= 10_000).all() and (np.isfinite(c.conc).all() or junk is not False)
    assert c.packed_mask is None or c.packed_mask.shape == (int(c.cu_seqlens[-1]),)
    np.testing.assert_array_equal(c.unpack(c.pack(c.conc), fill=np.nan)[c.valid], c.conc[c.valid])


def test_concentration_batches_cover() -> None:
    _find(strategies.concentration_batches(), lambda c: np.isnan(c.conc[~c.valid]).any())
    _find(strategies.concentration_batches(), lambda c: c.valid.sum() > 1 and np.ptp(c.conc[c.valid]) == 0)  # flat
    _find(strategies.concentration_batches(dtypes="float16"), lambda c: c.dtype == np.float16 and c.conc.size > 0)


@settings(FAST)
@given(strategies.ragged_layouts(max_rows=3, max_len=5, mask_dtypes=[np.uint8, "float32"], unmasked=False))
def test_ragged_layouts_options(lay: strategies.RaggedLayout) -> None:
    assert lay.mask is not None and lay.mask.dtype in (np.uint8, np.float32)
    assert lay.shape[0] <= 3 and lay.shape[1] <= 5 and lay.valid.dtype == np.bool_


def test_discounts_draw_the_endpoints() -> None:
    for end in (0.0, 1.0):
        _find(strategies.discounts(), lambda x, end=end: x == end)
    _find(strategies.discounts(), lambda x: 0.0 < x < 1.0 and x not in strategies.COMMON_DISCOUNTS)


def test_assert_unchanged() -> None:
    a, nan = np.arange(3.0), np.array([np.nan, 1.0])
    strategies.assert_unchanged([a.copy(), None, nan.copy()], [a, None, nan])  # NaNs compare bit for bit
    strategies.assert_unchanged([a.copy()], [torch.from_numpy(a)])
    changed = a.copy()
    changed[1] = 7
    for after, message in (
        ([changed, None, nan], "input 0 was modified"),
        ([a, a, nan], "input 1: None before, an array after"),
        ([a, None, nan.astype(np.float32)], "input 2: float64"),
        ([a, None], "3 arrays before, 2 after"),
    ):
        with pytest.raises(AssertionError, match=message):
            strategies.assert_unchanged([a.copy(), None, nan.copy()], after)


@pytest.mark.parametrize(
    "make, kwargs, name",
    [
        (strategies.ragged_batches, {"dtypes": "int8"}, "dtypes"),
        (strategies.ragged_batches, {"mask_dtypes": "complex64"}, "mask_dtypes"),
        (strategies.ragged_batches, {"gates": "yes"}, "gates"),
        (strategies.ragged_batches, {"last_values": 1}, "last_values"),
        (strategies.ragged_batches, {"max_len": 0}, "max_len"),
        (strategies.ragged_batches, {"max_rows": -1}, "max_rows"),
        (strategies.concentration_batches, {"junk": "no"}, "junk"),
        (strategies.concentration_batches, {"dtypes": []}, "dtypes"),
        (strategies.ragged_layouts, {"unmasked": None}, "unmasked"),
    ],
)
def test_ragged_strategy_bad_arguments(make: Any, kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: "):
        make(**kwargs)


# --------------------------------------------------------------------------- #
# Import hygiene (the README's examples run in tests/docs/test_readme.py)
# --------------------------------------------------------------------------- #


def test_import_comppo_core_does_not_import_hypothesis() -> None:
    code = "import sys, comppo_core; assert 'hypothesis' not in sys.modules, 'hypothesis imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_testing_without_hypothesis_says_how_to_install() -> None:
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"
        "try:\n    import comppo_core.testing\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert "pip install 'comppo-core[testing]'" in out


def test_no_warnings_from_a_check() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_gae(cc.gae, max_examples=5, long_len=16)
