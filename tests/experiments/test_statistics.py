"""The statistics of an experiment (comppo_core.experiments.statistics) against printed
tables and closed forms, and the results table built from them (.report); torch-free."""

from __future__ import annotations

import math

import pytest
from compare_tables import interval, parse_table

from comppo_core.experiments import report, statistics


@pytest.mark.parametrize(
    ("df", "expected"),
    [(3, 3.182446305), (4, 2.776445105), (10, 2.228138852), (30, 2.042272456)],  # printed t tables
)
def test_t_quantile_matches_the_table(df: int, expected: float) -> None:
    assert statistics.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-8)
    assert statistics.t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-8)


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_closed_forms(p: float) -> None:
    """df = 1 (Cauchy): t = tan(π(p − ½)); df = 2: t = (2p − 1) / √(2p(1 − p))."""
    assert statistics.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
    assert statistics.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)
    assert statistics.t_cdf(math.tan(math.pi * (p - 0.5)), 1) == pytest.approx(p, abs=1e-13)


def test_t_quantile_tends_to_the_normal() -> None:
    assert statistics.t_quantile(0.975, 1e7) == pytest.approx(1.959963985, abs=1e-6)
    assert statistics.t_quantile(0.5, 5) == pytest.approx(0.0, abs=1e-12)


def test_mean_ci() -> None:
    mean, half = statistics.mean_ci([1.0, 2.0, 3.0])  # s = 1, n = 3
    assert mean == 2.0
    assert half == pytest.approx(4.302652730 / math.sqrt(3), abs=1e-9)
    assert statistics.mean_ci([0.4]) == (0.4, None)
    assert statistics.mean_ci([0.5, 0.5]) == (0.5, 0.0)


def test_results_table_numbers() -> None:
    final = {"grpo": {0: 0.50, 1: 0.40}, "comppo": {0: 0.60, 1: 0.44}}
    warm = {0: 0.45, 1: 0.35}
    text, numbers = report.results_table(final, warm)
    table = parse_table(text)
    assert list(table) == ["grpo", "comppo"]
    half = math.tan(0.475 * math.pi) * math.sqrt(0.005) / math.sqrt(2)  # s of (0.5, 0.4) = sqrt(0.005)
    assert table["grpo"]["accuracy %"] == "45.0"
    assert interval(table["grpo"]["95% CI"]) == (round(100 * (0.45 - half), 1), round(100 * (0.45 + half), 1))
    assert table["grpo"]["vs warm start"] == "+5.0" and table["grpo"]["vs warm start 95% CI"] == "[+5.0, +5.0]"
    assert table["comppo"]["vs grpo"] == "+7.0"  # paired: (0.10 + 0.04) / 2
    assert table["grpo"]["vs comppo"] == "-7.0"
    assert table["grpo"]["vs grpo"] == "—" and table["comppo"]["vs comppo"] == "—"
    assert numbers["comppo"]["vs_grpo"][0] == pytest.approx(0.07)
