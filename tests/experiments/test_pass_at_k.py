"""pass@k by the unbiased estimator (issue 43, item 3): :mod:`comppo_core.experiments.pass_at_k`.

What is pinned: ``1 − C(n−c, k)/C(n, k)`` against hand-computed fractions (c = 0, c = n,
k = n, k = 1 among them), against Chen et al.'s numerically stable product form on random
cases, its exactness for large n, the k reported for n samples, a task's mean over its
problems, the macro average over tasks, and bad n/c/k refused naming the argument. No torch.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from comppo_core.errors import ParameterError
from comppo_core.experiments.pass_at_k import (
    macro,
    pass_at_k,
    pass_at_k_exact,
    pass_ks,
    passed,
    task_summary,
)

# (n, c, k, pass@k), each worked by hand: 1 − C(n−c, k)/C(n, k)
HAND = [
    (4, 1, 2, Fraction(1, 2)),  # 1 − C(3,2)/C(4,2) = 1 − 3/6
    (4, 1, 1, Fraction(1, 4)),  # k = 1: c/n
    (4, 2, 2, Fraction(5, 6)),  # 1 − C(2,2)/C(4,2) = 1 − 1/6
    (4, 3, 2, Fraction(1, 1)),  # C(1,2) = 0: any 2 of the 4 include a pass
    (5, 2, 3, Fraction(9, 10)),  # 1 − C(3,3)/C(5,3) = 1 − 1/10
    (10, 3, 4, Fraction(5, 6)),  # 1 − C(7,4)/C(10,4) = 1 − 35/210
    (8, 1, 4, Fraction(1, 2)),  # 1 − C(7,4)/C(8,4) = 1 − 35/70
    (6, 0, 1, Fraction(0)),  # c = 0
    (6, 0, 4, Fraction(0)),
    (6, 0, 6, Fraction(0)),  # c = 0 and k = n
    (6, 6, 1, Fraction(1)),  # c = n
    (6, 6, 4, Fraction(1)),
    (6, 1, 6, Fraction(1)),  # k = n: one pass among all n is enough
    (6, 5, 6, Fraction(1)),
    (1, 0, 1, Fraction(0)),  # n = 1
    (1, 1, 1, Fraction(1)),
]


@pytest.mark.parametrize(("n", "c", "k", "expected"), HAND)
def test_hand_computed_cases(n: int, c: int, k: int, expected: Fraction) -> None:
    assert pass_at_k_exact(n, c, k) == expected
    assert pass_at_k(n, c, k) == float(expected)


def chen_product(n: int, c: int, k: int) -> float:
    """Chen et al. (2021)'s numerically stable form: ``1 − Π_{i=n−c+1}^{n} (1 − k/i)`` (1 if n − c < k)."""
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


@given(data=st.data(), n=st.integers(1, 64))
def test_agrees_with_the_product_form(data: st.DataObject, n: int) -> None:
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    assert pass_at_k(n, c, k) == pytest.approx(chen_product(n, c, k), rel=1e-12, abs=1e-12)


def test_random_cases_agree_with_the_product_form_and_the_definition() -> None:
    """The definition itself: the share of the C(n, k) subsets of k samples that hold a pass."""
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 12)
        c, k = rng.randint(0, n), rng.randint(1, n)
        subsets_with_a_pass = math.comb(n, k) - math.comb(n - c, k)
        assert pass_at_k_exact(n, c, k) == Fraction(subsets_with_a_pass, math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(chen_product(n, c, k), rel=1e-12, abs=1e-12)


def test_exact_where_floats_would_round() -> None:
    """Large n: the binomials overflow a float, the fraction does not; k = 1 is exactly c/n."""
    assert pass_at_k(2000, 1, 1) == 1 / 2000
    assert pass_at_k(2000, 1999, 1000) == 1.0
    assert pass_at_k(2000, 0, 1000) == 0.0
    assert pass_at_k_exact(1024, 3, 512) == 1 - Fraction(math.comb(1021, 512), math.comb(1024, 512))
    assert 0.87 < pass_at_k(1024, 3, 512) < 0.88  # 1 − (1/2)(511/1023)(510/1022) ≈ 0.8753


@given(n=st.integers(1, 40), data=st.data())
def test_monotone_in_k_and_c(n: int, data: st.DataObject) -> None:
    c = data.draw(st.integers(0, n))
    values = [pass_at_k_exact(n, c, k) for k in range(1, n + 1)]
    assert values == sorted(values) and values[0] == Fraction(c, n)
    if c < n:
        assert all(pass_at_k_exact(n, c, k) <= pass_at_k_exact(n, c + 1, k) for k in range(1, n + 1))


@pytest.mark.parametrize(
    ("n", "c", "k", "named"),
    [
        (0, 0, 1, r"^n: expected an integer >= 1, got 0"),
        (4, 5, 1, r"^c: expected an integer in \[0, 4\] \(the passing samples of n\), got 5"),
        (4, -1, 1, r"^c: expected an integer in \[0, 4\]"),
        (4, 1, 5, r"^k: expected an integer in \[1, 4\] \(at most the samples n\), got 5"),
        (4, 1, 0, r"^k: expected an integer in \[1, 4\]"),
        (4.0, 1, 1, r"^n: expected an integer >= 1, got 4.0"),
        (True, 1, 1, r"^n: expected an integer >= 1, got True"),
        (4, 1, 1.5, r"^k: expected an integer"),
    ],
)
def test_bad_arguments_are_named(n: object, c: object, k: object, named: str) -> None:
    with pytest.raises(ParameterError, match=named) as info:
        pass_at_k(n, c, k)  # type: ignore[arg-type]
    assert info.value.argument == named[1]


def test_the_ks_reported() -> None:
    assert pass_ks(1) == (1,)
    assert pass_ks(2) == (1, 2)
    assert pass_ks(3) == (1, 2)
    assert pass_ks(4) == (1, 2, 4)
    assert pass_ks(7) == (1, 2, 4)
    assert pass_ks(16) == (1, 2, 4, 8, 16)
    with pytest.raises(ParameterError, match=r"^n: expected an integer >= 1, got 0"):
        pass_ks(0)


def test_a_task_is_the_mean_over_its_problems() -> None:
    """n = 4, c = (0, 1, 4): pass@1 = (0 + 1/4 + 1)/3, pass@2 = (0 + 1/2 + 1)/3, pass@4 = (0 + 1 + 1)/3."""
    summary = task_summary(4, [0, 1, 4])
    assert list(summary) == ["pass@1", "pass@2", "pass@4"]
    assert summary["pass@1"] == float(Fraction(5, 12))
    assert summary["pass@2"] == 0.5
    assert summary["pass@4"] == float(Fraction(2, 3))
    assert task_summary(3, [3, 3]) == {"pass@1": 1.0, "pass@2": 1.0}
    with pytest.raises(ParameterError, match=r"^correct: expected the passing samples of at least one problem"):
        task_summary(4, [])
    with pytest.raises(ParameterError, match=r"^c: expected an integer in \[0, 4\]"):
        task_summary(4, [1, 5])


def test_macro_is_the_unweighted_mean_over_tasks() -> None:
    a = {"greedy_pass@1": 0.5, "pass@1": 0.25, "pass@2": 0.5}
    b = {"greedy_pass@1": 1.0, "pass@1": 0.75, "pass@2": 1.0}
    assert macro([a, b]) == {"greedy_pass@1": 0.75, "pass@1": 0.5, "pass@2": 0.75}
    assert macro([a]) == a
    assert macro([a, {"greedy_pass@1": 0.0}]) == {"greedy_pass@1": 0.25}  # only what every task reports
    with pytest.raises(ParameterError, match=r"^tasks: expected at least one"):
        macro([])


def test_a_response_passes_at_full_marks() -> None:
    assert passed(1.0) and passed(1) and not passed(0.0) and not passed(0.999)
