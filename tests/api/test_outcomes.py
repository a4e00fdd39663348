"""Outcome advantages (docs/design.md §5): ``group_advantages`` for GRPO, Dr.GRPO, RLOO and
REINFORCE++-baseline, and ``broadcast`` of per-sequence values to tokens.

Pinned against (a) worked examples, (b) faithful NumPy ports of verl's
``compute_grpo_outcome_advantage``, ``compute_rloo_outcome_advantage`` and
``compute_reinforce_plus_plus_baseline_outcome_advantage`` (verl/trainer/ppo/core_algos.py)
and (c) the oracle ``comppo_core.reference``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import comppo_core as cc
from comppo_core import reference
from comppo_core.testing.strategies import RaggedLayout, assert_unchanged, ragged_layouts

METHODS = ("grpo", "drgrpo", "rloo", "reinforce_baseline")
THREADS = (1, 2, 3)


# --------------------------------------------------------------------------- #
# NumPy ports of verl's outcome estimators (float64 instead of torch tensors)
# --------------------------------------------------------------------------- #


def _verl_groups(scores: np.ndarray, index: Any) -> dict[Any, list[float]]:
    id2score: dict[Any, list[float]] = defaultdict(list)
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    return id2score


def verl_grpo(
    token_level_rewards: np.ndarray,
    response_mask: np.ndarray,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> np.ndarray:
    """verl ``compute_grpo_outcome_advantage``: a group of one gets mean 0, std 1."""
    scores = token_level_rewards.sum(axis=-1).astype(np.float64)
    id2score = _verl_groups(scores, index)
    id2mean: dict[Any, float] = {}
    id2std: dict[Any, float] = {}
    for idx, vals in id2score.items():
        if len(vals) == 1:
            id2mean[idx], id2std[idx] = 0.0, 1.0
        else:
            arr = np.asarray(vals, dtype=np.float64)
            id2mean[idx] = float(np.mean(arr))
            id2std[idx] = float(np.std(arr, ddof=1))  # torch.std is unbiased
    for i in range(scores.shape[0]):
        if norm_adv_by_std_in_grpo:
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        else:
            scores[i] = scores[i] - id2mean[index[i]]
    return scores[:, None] * response_mask


def verl_rloo(token_level_rewards: np.ndarray, response_mask: np.ndarray, index: Any) -> np.ndarray:
    """verl ``compute_rloo_outcome_advantage``: a group of one keeps its raw score."""
    scores = token_level_rewards.sum(axis=-1).astype(np.float64)
    id2score = _verl_groups(scores, index)
    id2mean = {idx: (0.0 if len(v) == 1 else float(np.mean(np.asarray(v)))) for idx, v in id2score.items()}
    for i in range(scores.shape[0]):
        n = len(id2score[index[i]])
        if n > 1:
            scores[i] = scores[i] * n / (n - 1) - id2mean[index[i]] * n / (n - 1)
    return scores[:, None] * response_mask


def verl_masked_mean(values: np.ndarray, mask: np.ndarray) -> float:
    return float((values * mask).sum() / mask.sum())


def verl_masked_var(values: np.ndarray, mask: np.ndarray) -> float:
    mean = verl_masked_mean(values, mask)
    variance = verl_masked_mean((values - mean) ** 2, mask)
    mask_sum = mask.sum()
    assert mask_sum >= 2
    return float(variance * (mask_sum / (mask_sum - 1)))


def verl_masked_whiten(values: np.ndarray, mask: np.ndarray, shift_mean: bool = True) -> np.ndarray:
    mean, var = verl_masked_mean(values, mask), verl_masked_var(values, mask)
    whitened = (values - mean) * (1.0 / np.sqrt(var + 1e-8))
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def verl_reinforce_pp_baseline(token_level_rewards: np.ndarray, response_mask: np.ndarray, index: Any) -> np.ndarray:
    """verl ``compute_reinforce_plus_plus_baseline_outcome_advantage``."""
    response_length = token_level_rewards.shape[-1]
    scores = token_level_rewards.sum(axis=-1).astype(np.float64)
    id2score = _verl_groups(scores, index)
    id2mean = {idx: (0.0 if len(v) == 1 else float(np.mean(np.asarray(v)))) for idx, v in id2score.items()}
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - id2mean[index[i]]
    tokens = np.tile(scores[:, None], (1, response_length)) * response_mask
    return verl_masked_whiten(tokens, response_mask) * response_mask


# --------------------------------------------------------------------------- #
# Strategies
# --------------------------------------------------------------------------- #

#: ids that exercise both id paths of the kernel (a direct table for compact ranges,
#: a hash map for sparse ones): negatives, huge values, the int64 extremes.
SPECIAL_IDS = [0, 1, -1, 7, 3, -5, 2**62, -(2**62), 2**62 + 1, -(2**62) - 1, 2**63 - 1, -(2**63), 10**12, 12345]


@st.composite
def id_pools(draw: st.DrawFn, max_groups: int = 6) -> list[int]:
    """Distinct integer ids, in no particular order."""
    k = draw(st.integers(1, max_groups))
    elem = st.one_of(st.sampled_from(SPECIAL_IDS), st.integers(-(2**63), 2**63 - 1), st.integers(-20, 20))
    return draw(st.lists(elem, min_size=k, max_size=k, unique=True))


def grid_scores(n: int) -> st.SearchStrategy[np.ndarray]:
    """Scores on a 1/8 grid (sums are exact, so "all equal" is exact in every port);
    a few common levels often, so that equal-score groups happen."""
    elem = st.one_of(st.integers(-80, 80), st.sampled_from([0, 8, -8]))
    return hnp.arrays(np.int64, (n,), elements=elem).map(lambda a: a / 8.0)


@st.composite
def grouped(draw: st.DrawFn, b_max: int = 24, min_size: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, groups)``: B sequences assigned to groups drawn from an id pool.

    ``min_size=2`` makes every group have at least two members."""
    pool = draw(id_pools())
    if min_size <= 1:
        b = draw(st.integers(0, b_max))
        picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=b, max_size=b))
    else:
        sizes = draw(st.lists(st.integers(min_size, 5), min_size=len(pool), max_size=len(pool)))
        picks = [g for g, s in enumerate(sizes) for _ in range(s)]
        picks = draw(st.permutations(picks))
    groups = np.asarray([pool[p] for p in picks], dtype=np.int64)
    scores = draw(grid_scores(len(picks)))
    return scores, groups


def members(groups: np.ndarray) -> dict[Any, np.ndarray]:
    out: dict[Any, list[int]] = defaultdict(list)
    for i, g in enumerate(groups.tolist()):
        out[g].append(i)
    return {g: np.asarray(v) for g, v in out.items()}


def group_sizes(groups: np.ndarray) -> np.ndarray:
    m = members(groups)
    return np.asarray([len(m[g]) for g in groups.tolist()], dtype=np.int64)


# --------------------------------------------------------------------------- #
# Worked examples
# --------------------------------------------------------------------------- #

S = np.array([3.0, 5.0, 1.0, 4.0, 2.0, 5.0])
G = np.array([7, 3, 7, -1, 7, 3])  # 7: [3, 1, 2] (μ 2, σ 1); 3: [5, 5] equal; -1: [4] singleton


def test_worked_example_every_method() -> None:
    k = 1.0 / (1.0 + 1e-6)
    np.testing.assert_array_equal(cc.group_advantages(S, G, method="grpo"), [k, 0.0, -k, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(cc.group_advantages(S, G, method="drgrpo"), [1.0, 0.0, -1.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(
        cc.group_advantages(S, G, method="reinforce_baseline", singleton="raw"), [1.0, 0.0, -1.0, 4.0, 0.0, 0.0]
    )
    np.testing.assert_array_equal(cc.group_advantages(S, G, method="rloo"), [1.5, 0.0, -1.5, 0.0, 0.0, 0.0])
    # default method is grpo, default singleton is "zero"
    np.testing.assert_array_equal(cc.group_advantages(S, G), cc.group_advantages(S, G, method="grpo", singleton="zero"))


@pytest.mark.parametrize("method", METHODS)
def test_worked_example_matches_reference(method: str) -> None:
    for singleton in ("zero", "raw"):
        got = cc.group_advantages(S, G, method=method, singleton=singleton)
        want = reference.group_advantages(S, G, method=method, singleton=singleton)
        np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("method", METHODS)
def test_singleton_zero_by_default_and_raw_on_request(method: str) -> None:
    s = np.array([2.5, -4.0, 1.0, 3.0])
    g = np.array([10, 20, 30, 30])  # 10 and 20 are singletons
    zero = cc.group_advantages(s, g, method=method)
    raw = cc.group_advantages(s, g, method=method, singleton="raw")
    assert zero[0] == 0.0 and zero[1] == 0.0
    assert raw[0] == 2.5 and raw[1] == -4.0
    np.testing.assert_array_equal(zero[2:], raw[2:])
    # all singletons
    np.testing.assert_array_equal(cc.group_advantages(s, [1, 2, 3, 4], method=method), np.zeros(4))
    np.testing.assert_array_equal(cc.group_advantages(s, [1, 2, 3, 4], method=method, singleton="raw"), s)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("value", [0.0, 1.0, -3.25, 0.1, 1e300, 1 / 3])
def test_equal_scores_give_exact_zero_never_nan(method: str, value: float) -> None:
    s = np.full(5, value)
    for eps in (0.0, 1e-6):
        out = cc.group_advantages(s, np.zeros(5, dtype=np.int64), method=method, eps=eps)
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, np.zeros(5))


def test_grpo_eps_zero_distinct_scores_gives_unit_unbiased_std() -> None:
    s = np.array([1.0, 4.0, 2.0, 9.0, -1.0, 3.0, 3.5])
    g = np.array([5, 5, 5, 5, -2, -2, -2])
    out = cc.group_advantages(s, g, method="grpo", eps=0.0)
    for idx in members(g).values():
        assert abs(out[idx].mean()) < 1e-12
        assert abs(out[idx].std(ddof=1) - 1.0) < 1e-12


def test_rloo_is_mean_of_the_others_by_hand() -> None:
    s = np.array([1.0, 2.0, 6.0, 10.0, 0.0])
    g = np.array([4, 4, 4, 9, 9])
    # 1 - (2+6)/2 = -3; 2 - (1+6)/2 = -1.5; 6 - 1.5 = 4.5; 10 - 0 = 10; 0 - 10 = -10
    np.testing.assert_allclose(cc.group_advantages(s, g, method="rloo"), [-3.0, -1.5, 4.5, 10.0, -10.0], rtol=1e-15)


# --------------------------------------------------------------------------- #
# Group ids: any integers in any order, strings
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("method", METHODS)
def test_ids_any_integers_any_order_and_strings(method: str) -> None:
    want = cc.group_advantages(S, np.array([0, 1, 0, 2, 0, 1]), method=method, singleton="raw")
    for ids in (
        G,
        [7, 3, 7, -1, 7, 3],
        np.array([2**62, -(2**62), 2**62, 5, 2**62, -(2**62)]),
        np.array([2**63 - 1, -(2**63), 2**63 - 1, 0, 2**63 - 1, -(2**63)]),
        np.array([-9, 10**15, -9, 3, -9, 10**15], dtype=np.int64),
        np.array([-9, 40000, -9, 3, -9, 40000], dtype=np.int32),
        np.array([5, 2, 5, 0, 5, 2], dtype=np.uint8),
        np.array([2**64 - 1, 2**63, 2**64 - 1, 1, 2**64 - 1, 2**63], dtype=np.uint64),
        ["b", "a", "b", "c", "b", "a"],
        np.array(["uid-7", "uid-3", "uid-7", "uid-x", "uid-7", "uid-3"]),
    ):
        got = cc.group_advantages(S, ids, method=method, singleton="raw")
        np.testing.assert_array_equal(got, want, err_msg=f"ids {ids!r}")


@given(
    data=grouped(),
    method=st.sampled_from(METHODS),
    singleton=st.sampled_from(["zero", "raw"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_relabelling_and_permuting_groups_commute(
    data: tuple[np.ndarray, np.ndarray], method: str, singleton: str, seed: int
) -> None:
    scores, groups = data
    base = cc.group_advantages(scores, groups, method=method, singleton=singleton)
    # any injective relabelling (compact range vs sparse/huge ids) gives bitwise the same result
    uniq = np.unique(groups)
    rng = np.random.default_rng(seed)
    for new in (
        rng.permutation(len(uniq)),  # compact 0..k-1
        rng.choice(np.array(SPECIAL_IDS, dtype=np.int64), size=len(uniq), replace=False),  # sparse, huge
        np.array([f"label{v}" for v in rng.permutation(len(uniq))], dtype=np.str_),
    ):
        relabel = new[np.searchsorted(uniq, groups)] if groups.size else new[:0]
        got = cc.group_advantages(scores, relabel, method=method, singleton=singleton)
        assert got.tobytes() == base.tobytes()
    # permuting sequences permutes the advantages (grid scores: exact sums in any order)
    perm = rng.permutation(scores.shape[0])
    got = cc.group_advantages(scores[perm], groups[perm], method=method, singleton=singleton)
    np.testing.assert_allclose(got, base[perm], rtol=1e-13, atol=1e-13)


# --------------------------------------------------------------------------- #
# Against the reference and against verl
# --------------------------------------------------------------------------- #


@given(
    data=grouped(),
    method=st.sampled_from(METHODS),
    singleton=st.sampled_from(["zero", "raw"]),
    eps=st.sampled_from([0.0, 1e-6, 0.1]),
    dtype=st.sampled_from([np.float64, np.float32, np.int64]),
)
def test_matches_reference_grid(
    data: tuple[np.ndarray, np.ndarray], method: str, singleton: str, eps: float, dtype: Any
) -> None:
    scores, groups = data
    scores = (scores * 8).astype(dtype) if np.dtype(dtype).kind == "i" else scores.astype(dtype)
    before: list[np.ndarray | None] = [scores.copy(), groups.copy()]
    got = cc.group_advantages(scores, groups, method=method, eps=eps, singleton=singleton)
    want = reference.group_advantages(scores, groups, method=method, eps=eps, singleton=singleton)
    # computed in float64, returned in the scores' float dtype (float64 for integers)
    want_dtype = scores.dtype if scores.dtype.kind == "f" else np.dtype(np.float64)
    assert got.dtype == want_dtype and got.shape == scores.shape
    assert np.isfinite(got).all()
    got = got.astype(np.float64)
    want = want.astype(want_dtype).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert_unchanged(before, [scores, groups])


@given(
    b=st.integers(0, 20),
    k=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
    method=st.sampled_from(METHODS),
    singleton=st.sampled_from(["zero", "raw"]),
    scale=st.sampled_from([1.0, 1e-3, 1e3]),
)
def test_matches_reference_random_floats(b: int, k: int, seed: int, method: str, singleton: str, scale: float) -> None:
    """Arbitrary float scores: the kernel sums in index order, the oracle pairwise, so
    allow rounding noise, scaled by 1/(σ + eps) for GRPO."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=b) * scale
    groups = rng.integers(-(2**62), 2**62, size=k)[rng.integers(0, k, size=b)]
    got = cc.group_advantages(scores, groups, method=method, singleton=singleton)
    want = reference.group_advantages(scores, groups, method=method, singleton=singleton)
    atol = np.full(b, 1e-12 * scale)
    if method == "grpo":
        for idx in members(groups).values():
            if len(idx) > 1:
                atol[idx] /= scores[idx].std(ddof=1) + 1e-6
    assert (np.abs(got - want) <= atol + 1e-12 * np.abs(want)).all(), (got, want)


def verl_batch(scores: np.ndarray, t: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """verl's inputs for ``scores``: a ``[B, t]`` response mask (about 70% valid) and
    token-level rewards whose row sums are the scores (an outcome reward on one token)."""
    b = scores.shape[0]
    rng = np.random.default_rng(seed)
    mask = (rng.random((b, t)) < 0.7).astype(np.float64)
    trl = np.zeros((b, t))
    trl[np.arange(b), rng.integers(0, t, size=b)] = scores
    return mask, trl


@given(
    data=grouped(min_size=2),
    t=st.integers(1, 6),
    norm=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    string_ids=st.booleans(),
)
def test_grpo_matches_verl(
    data: tuple[np.ndarray, np.ndarray], t: int, norm: bool, seed: int, string_ids: bool
) -> None:
    """verl's compute_grpo_outcome_advantage, norm_adv_by_std_in_grpo True (grpo) and
    False (drgrpo), on groups of two or more, broadcast over the response mask."""
    scores, groups = data
    mask, trl = verl_batch(scores, t, seed)
    index: Any = np.array([f"uid{g}" for g in groups]) if string_ids else groups
    want = verl_grpo(trl, mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm)
    a = cc.group_advantages(trl.sum(-1), index, method="grpo" if norm else "drgrpo", eps=1e-6)
    got = cc.broadcast(a, mask=mask)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_grpo_verl_singleton_is_raw_score_over_one_plus_eps() -> None:
    """verl gives a group of one mean 0 and std 1: (s − 0)/(1 + eps). With eps = 0 that
    is the raw score, i.e. singleton="raw"."""
    s = np.array([3.0, -2.0, 5.0, 1.0])
    g = np.array([1, 2, 2, 3])
    mask = np.ones((4, 2))
    want = verl_grpo(s[:, None] * np.array([[1.0, 0.0]]), mask, g, epsilon=0.0)[:, 0]
    np.testing.assert_allclose(cc.group_advantages(s, g, eps=0.0, singleton="raw"), want, rtol=1e-15)


@given(data=grouped(), t=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_rloo_matches_verl(data: tuple[np.ndarray, np.ndarray], t: int, seed: int) -> None:
    """verl's compute_rloo_outcome_advantage: s·n/(n−1) − μ·n/(n−1), singletons raw."""
    scores, groups = data
    mask, trl = verl_batch(scores, t, seed)
    want = verl_rloo(trl, mask, groups)
    got = cc.broadcast(cc.group_advantages(trl.sum(-1), groups, method="rloo", singleton="raw"), mask=mask)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@given(data=grouped(), t=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_reinforce_pp_baseline_matches_verl(data: tuple[np.ndarray, np.ndarray], t: int, seed: int) -> None:
    """verl's compute_reinforce_plus_plus_baseline_outcome_advantage (s − μ_g, singletons
    raw, then whitened over the batch) == masked_whiten(broadcast(a, mask=m), mask=m)."""
    scores, groups = data
    mask, trl = verl_batch(scores, t, seed)
    assume(mask.sum() >= 2)
    want = verl_reinforce_pp_baseline(trl, mask, groups)
    a = cc.group_advantages(trl.sum(-1), groups, method="reinforce_baseline", singleton="raw")
    got = cc.masked_whiten(cc.broadcast(a, mask=mask), mask=mask)
    scale = 1.0 + np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * scale)
    assert (got[mask == 0] == 0).all()


@given(data=grouped(min_size=2), method=st.sampled_from(METHODS))
def test_group_identities(data: tuple[np.ndarray, np.ndarray], method: str) -> None:
    """Dr.GRPO == REINFORCE-baseline == s − μ; RLOO == n/(n−1)·(s − μ); advantages of
    a group sum to 0; GRPO == Dr.GRPO / (σ + eps)."""
    scores, groups = data
    dr = cc.group_advantages(scores, groups, method="drgrpo")
    np.testing.assert_array_equal(cc.group_advantages(scores, groups, method="reinforce_baseline"), dr)
    n = group_sizes(groups)
    np.testing.assert_allclose(
        cc.group_advantages(scores, groups, method="rloo"), dr * n / (n - 1), rtol=1e-12, atol=1e-12
    )
    out = cc.group_advantages(scores, groups, method=method)
    for idx in members(groups).values():
        assert abs(out[idx].sum()) <= 1e-12 * (1 + np.abs(out[idx]).sum())
        sd = scores[idx].std(ddof=1)
        if method == "grpo" and sd > 0:
            np.testing.assert_allclose(out[idx], dr[idx] / (sd + 1e-6), rtol=1e-12, atol=1e-12)


def test_empty_batch() -> None:
    for method in METHODS:
        out = cc.group_advantages(np.zeros(0), np.zeros(0, dtype=np.int64), method=method)
        assert out.shape == (0,) and out.dtype == np.float64


def test_empty_python_lists() -> None:
    """An empty batch passed as plain lists (``np.asarray([])`` is float64, but there is
    no float id in it) is still an empty batch."""
    out = cc.group_advantages([], [])
    assert out.shape == (0,) and out.dtype == np.float64


def test_non_contiguous_inputs() -> None:
    rng = np.random.default_rng(9)
    s = rng.normal(size=40)
    g = rng.integers(-3, 3, size=40)
    for method in METHODS:
        got = cc.group_advantages(s[::2], g[::2], method=method)
        np.testing.assert_array_equal(got, cc.group_advantages(s[::2].copy(), g[::2].copy(), method=method))
    a = rng.normal(size=12)[::3]
    m = np.asfortranarray(rng.random((4, 6)) < 0.5)
    np.testing.assert_array_equal(cc.broadcast(a, mask=m), reference.broadcast(a, mask=m))
    m2 = (rng.random((8, 6)) < 0.5)[::2]
    np.testing.assert_array_equal(cc.broadcast(a, mask=m2), reference.broadcast(a, mask=m2))


def test_accepts_lists_and_any_real_score_dtype() -> None:
    want = cc.group_advantages(S, G)
    np.testing.assert_array_equal(cc.group_advantages(S.tolist(), G.tolist()), want)
    np.testing.assert_array_equal(cc.group_advantages(S.astype(np.float32), G), want.astype(np.float32))
    np.testing.assert_array_equal(cc.group_advantages(S.astype(np.int32), G), want)
    b = cc.group_advantages(np.array([True, False, True, True]), np.array([0, 0, 1, 1]), method="drgrpo")
    np.testing.assert_array_equal(b, [0.5, -0.5, 0.0, 0.0])


# --------------------------------------------------------------------------- #
# Errors
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("method", METHODS)
def test_non_finite_score_names_index(bad: float, method: str) -> None:
    s = np.array([1.0, 2.0, 3.0, bad, 5.0, np.nan])
    with pytest.raises(cc.NonFiniteError, match=r"index 3\b") as ei:
        cc.group_advantages(s, [0, 0, 1, 1, 2, 2], method=method)
    assert "scores" in str(ei.value)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, cc.ComppoError)
    # even when the score is alone in its group
    with pytest.raises(cc.NonFiniteError, match=r"index 0\b"):
        cc.group_advantages(np.array([bad, 1.0]), [0, 1], method=method, singleton="raw")


@pytest.mark.parametrize("method", METHODS)
def test_huge_finite_scores_never_give_silent_nan_or_inf(method: str) -> None:
    """Finite scores whose group sum overflows: a clear ComppoError (as masked_whiten
    raises for values too large to square) or finite advantages, never NaN/±inf
    (docs/design.md §8). GRPO is scale-free, so finite answers must be the right ones."""
    for s, g in (
        ([1e308, 1e308, -1e308], [0, 0, 0]),
        ([1e308, -1e308], [5, 5]),
        ([1.7e308, 1.7e308, 1.0, 2.0], [1, 1, 2, 2]),
    ):
        try:
            out = cc.group_advantages(np.array(s), np.array(g), method=method)
        except cc.ComppoError:
            continue
        assert np.isfinite(out).all(), (method, s, out)
        if method == "grpo":
            want = cc.group_advantages(np.array(s) / 1e300, np.array(g), method=method, eps=0.0)
            # eps = 1e-6 in `out` still matters for the ordinary-scale group [1, 2]
            # (σ ≈ 0.71): a relative effect of 1.4e-6
            np.testing.assert_allclose(out, want, rtol=1e-5)


def test_option_errors() -> None:
    with pytest.raises(cc.ParameterError, match="method"):
        cc.group_advantages(S, G, method="ppo")
    with pytest.raises(cc.ParameterError, match="method"):
        cc.group_advantages(S, G, method="GRPO")
    with pytest.raises(cc.ParameterError, match="singleton"):
        cc.group_advantages(S, G, singleton="nan")
    for eps in (-1e-9, -1.0):
        with pytest.raises(cc.ParameterError, match="eps"):
            cc.group_advantages(S, G, eps=eps)
    with pytest.raises(cc.ParameterError, match="eps"):
        cc.group_advantages(S, G, eps=float("nan"))


def test_shape_and_dtype_errors() -> None:
    with pytest.raises(cc.ShapeError, match="scores"):
        cc.group_advantages(S.reshape(2, 3), G)
    with pytest.raises(cc.ShapeError, match="scores"):
        cc.group_advantages(np.float64(1.0), np.array([0]))
    with pytest.raises(cc.ShapeError, match="groups"):
        cc.group_advantages(S, G[:5])
    with pytest.raises(cc.ShapeError, match="groups"):
        cc.group_advantages(S, np.concatenate([G, [1]]))
    with pytest.raises(cc.ShapeError, match="groups"):
        cc.group_advantages(S, G.reshape(2, 3))
    for ids in (G.astype(np.float64), G.astype(np.float32), [7.0, 3.0, 7.0, -1.0, 7.0, 3.0]):
        with pytest.raises(cc.DTypeError, match="groups") as ei:
            cc.group_advantages(S, ids)
        assert isinstance(ei.value, TypeError) and isinstance(ei.value, ValueError)
    with pytest.raises(cc.DTypeError, match="scores"):
        cc.group_advantages(np.array(["a", "b"]), [0, 0])


# --------------------------------------------------------------------------- #
# broadcast
# --------------------------------------------------------------------------- #


def test_broadcast_by_hand() -> None:
    a = np.array([1.5, -2.0, 3.0])
    m = np.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    np.testing.assert_array_equal(cc.broadcast(a, mask=m), [[1.5, 1.5, 0], [0, -2.0, -2.0], [0, 0, 0]])
    # packed: sequences of 2, 0, 3 tokens
    cu = np.array([0, 2, 2, 5])
    np.testing.assert_array_equal(cc.broadcast(a, cu_seqlens=cu), [1.5, 1.5, 3.0, 3.0, 3.0])
    np.testing.assert_array_equal(cc.broadcast(a, cu_seqlens=cu, mask=[1, 0, 0, 1, 1]), [1.5, 0, 0, 3.0, 3.0])


@given(
    lay=ragged_layouts(),
    dtype=st.sampled_from([np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_]),
    seed=st.integers(0, 2**32 - 1),
)
def test_broadcast_matches_reference_both_layouts(lay: RaggedLayout, dtype: Any, seed: int) -> None:
    valid, inner = lay.valid, lay.inner
    b, t = lay.shape
    rng = np.random.default_rng(seed)
    a = (rng.normal(size=b) * 10).astype(dtype)
    mask = valid.copy() if lay.mask is None else lay.mask  # no mask: an all-True bool one
    before: list[np.ndarray | None] = [a.copy(), mask.copy()]
    out_dtype = np.dtype(dtype) if np.dtype(dtype).kind == "f" else np.dtype(np.float64)

    got = cc.broadcast(a, mask=mask)
    want = reference.broadcast(a, mask=mask)
    assert got.shape == (b, t) and got.dtype == out_dtype
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(out_dtype).astype(np.float64))
    assert (got[~valid] == 0).all()
    np.testing.assert_array_equal(got[valid], np.broadcast_to(a.astype(out_dtype)[:, None], (b, t))[valid])

    # packed: the first lengths[b] positions of each row, with or without an inner mask
    cu = lay.cu_seqlens
    p_mask = lay.pack(mask) if inner else None
    got_p = cc.broadcast(a, cu_seqlens=cu, mask=p_mask)
    want_p = reference.broadcast(a, cu_seqlens=cu, mask=p_mask)
    assert got_p.shape == (int(cu[-1]),) and got_p.dtype == out_dtype
    np.testing.assert_array_equal(got_p.astype(np.float64), want_p.astype(out_dtype).astype(np.float64))
    np.testing.assert_array_equal(got_p, lay.pack(got))
    assert_unchanged(before, [a, mask])


def test_broadcast_dtypes() -> None:
    m = np.ones((2, 3), dtype=bool)
    for dt, want in (
        (np.float64, np.float64),
        (np.float32, np.float32),
        (np.float16, np.float16),
        (np.int64, np.float64),
        (np.int8, np.float64),
        (np.bool_, np.float64),
    ):
        out = cc.broadcast(np.array([1, 2]).astype(dt), mask=m)
        assert out.dtype == want, dt
        out = cc.broadcast(np.array([1, 2]).astype(dt), cu_seqlens=np.array([0, 1, 3], dtype=np.int32))
        assert out.dtype == want, dt
    x = cc.broadcast(np.array([0.1], dtype=np.float32), mask=np.ones((1, 2)))
    assert x.dtype == np.float32 and (x == np.float32(0.1)).all()


def test_broadcast_errors() -> None:
    a = np.array([1.0, 2.0])
    with pytest.raises(cc.ShapeError, match="mask"):
        cc.broadcast(a)  # padded needs a mask to know T
    with pytest.raises(cc.ShapeError, match="mask"):
        cc.broadcast(a, mask=np.ones((3, 4)))  # wrong number of rows
    with pytest.raises(cc.ShapeError, match="mask"):
        cc.broadcast(a, mask=np.ones(4))  # 1-D mask without cu_seqlens
    with pytest.raises(cc.ShapeError, match="per_sequence"):
        cc.broadcast(np.ones((2, 1)), mask=np.ones((2, 4)))
    with pytest.raises(cc.ShapeError, match="cu_seqlens"):
        cc.broadcast(a, cu_seqlens=[0, 1, 2, 3])
    with pytest.raises(cc.ShapeError, match="mask"):
        cc.broadcast(a, cu_seqlens=[0, 1, 3], mask=np.ones(4))
    with pytest.raises(cc.ShapeError):
        cc.broadcast(a, cu_seqlens=[0, 3, 1])  # decreasing
    with pytest.raises(cc.DTypeError):
        cc.broadcast(np.array(["x", "y"]), mask=np.ones((2, 1)))


# --------------------------------------------------------------------------- #
# Thread-count invariance
# --------------------------------------------------------------------------- #


def test_thread_count_invariance(restore_threads: int) -> None:
    rng = np.random.default_rng(0)
    b, t = 300, 700
    scores = rng.normal(size=b * 8)
    groups = rng.integers(-(2**62), 2**62, size=b)[rng.integers(0, b, size=b * 8)]
    mask = rng.random((b * 8, t // 7)) < 0.8  # 2400 x 100 tokens: the parallel path
    results: dict[int, list[bytes]] = {}
    for n in THREADS:
        cc.set_num_threads(n)
        outs = [cc.group_advantages(scores, groups, method=m, singleton="raw") for m in METHODS]
        outs.append(cc.broadcast(outs[0], mask=mask))
        results[n] = [o.tobytes() for o in outs]
    for n in THREADS[1:]:
        assert results[n] == results[THREADS[0]], f"results differ between 1 and {n} threads"
