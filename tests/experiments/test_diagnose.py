"""The gate diagnostic's parts (comppo_core.experiments.rank_statistics, .pivotality, .diagnose).

Pinned: the vectorised rank statistics equal their plain references (ties included); the
cluster bootstrap is seeded and resamples whole responses; the positions and the shared
boundaries of the Monte-Carlo estimator; the estimator recovers the one pivotal token of
a scripted policy whose success is decided by that token, with the value the script
implies; the analysis turns a concentration that ranks the pivotal tokens high, low or
not at all into ``as_is``, ``inverted`` or ``none``; and the whole diagnostic on a tiny
warm-started Llama (slow) gives the report's schema.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from comppo_core.errors import ParameterError, ShapeError
from comppo_core.experiments import pivotality as mc
from comppo_core.experiments.diagnose import (
    CostEstimate,
    DiagnoseSettings,
    TokenTable,
    analyse,
    batch_steps,
    recommend,
    seconds_range,
    token_class,
    warnings_of,
)
from comppo_core.experiments.rank_statistics import (
    auc,
    auc_reference,
    average_ranks,
    cluster_bootstrap,
    spearman,
    spearman_reference,
)
from comppo_core.rl.tasks.base import Problem

# ---------------------------------------------------------------------------------------------------------
# rank statistics


def test_average_ranks_give_ties_the_mean_of_their_ranks() -> None:
    assert average_ranks([5.0, 1.0, 5.0, 3.0]).tolist() == [3.5, 1.0, 3.5, 2.0]
    assert average_ranks([2.0, 2.0, 2.0]).tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("seed", range(6))
def test_auc_and_spearman_equal_their_references_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    x = rng.integers(0, 4, size=n).astype(float)  # few values: many ties
    y = rng.integers(0, 5, size=n).astype(float) + (x if seed % 2 else 0.0)
    labels = rng.random(n) < 0.4
    labels[0], labels[1] = True, False
    assert auc(x, labels) == pytest.approx(auc_reference(x.tolist(), labels.tolist()), abs=1e-12)
    assert spearman(x, y) == pytest.approx(spearman_reference(x.tolist(), y.tolist()), abs=1e-12)


def test_hand_computed_values() -> None:
    # positives 3, 2 against negatives 1, 2: pairs (3>1, 3>2, 2>1, 2=2) -> (1 + 1 + 1 + 0.5) / 4
    assert auc([3.0, 2.0, 1.0, 2.0], [True, True, False, False]) == 0.875
    assert spearman([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]) == pytest.approx(1.0)
    assert spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    # no ties: 1 − 6Σd²/(n(n²−1)) with d = (0, 1, −1, 0): 1 − 12/60
    assert spearman([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(0.8)
    assert spearman_reference([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0]) == pytest.approx(0.8)


def test_undefined_statistics_are_none_and_bad_input_is_named() -> None:
    assert auc([1.0, 2.0], [True, True]) is None
    assert spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None
    with pytest.raises(ShapeError, match="positive: expected one flag per score"):
        auc([1.0, 2.0], [True])
    with pytest.raises(ParameterError, match=r"scores: expected finite numbers, got nan at index 1"):
        auc([1.0, math.nan], [True, False])


def test_cluster_bootstrap_is_seeded_and_resamples_whole_clusters() -> None:
    values = np.array([0.0, 0.0, 1.0, 1.0, 1.0, 5.0])
    clusters = [np.array([0, 1]), np.array([2, 3, 4]), np.array([5])]
    seen: list[int] = []

    def mean(idx: np.ndarray) -> float:
        seen.append(idx.size)
        return float(values[idx].mean())

    a = cluster_bootstrap(mean, clusters, resamples=200, rng=np.random.default_rng(1))
    b = cluster_bootstrap(mean, clusters, resamples=200, rng=np.random.default_rng(1))
    assert a == b
    assert a.estimate == pytest.approx(values.mean())
    assert a.low is not None and a.high is not None and 0.0 <= a.low <= a.estimate <= a.high <= 5.0
    # every resample is 3 whole clusters: its size is a sum of three of (2, 3, 1)
    sums = {x + y + z for x in (2, 3, 1) for y in (2, 3, 1) for z in (2, 3, 1)}
    assert set(seen[1:]) <= sums
    none = cluster_bootstrap(mean, clusters, resamples=0, rng=np.random.default_rng(1))
    assert (none.low, none.high) == (None, None)


# ---------------------------------------------------------------------------------------------------------
# the Monte-Carlo estimator


def test_positions_and_shared_boundaries() -> None:
    rng = np.random.default_rng(0)
    assert mc.choose_positions(5, None, "even", rng).tolist() == [0, 1, 2, 3, 4]
    assert mc.choose_positions(5, 9, "random", rng).tolist() == [0, 1, 2, 3, 4]
    assert mc.choose_positions(9, 3, "even", rng).tolist() == [0, 4, 8]
    r = mc.choose_positions(20, 5, "random", np.random.default_rng(3))
    assert r.tolist() == mc.choose_positions(20, 5, "random", np.random.default_rng(3)).tolist()
    assert len(set(r.tolist())) == 5 and r.tolist() == sorted(r.tolist())
    w = mc.choose_positions(20, 4, "window", rng)
    assert np.diff(w).tolist() == [1, 1, 1]
    # contiguous tokens share boundaries: 4 tokens need 5 (4 + 1), minus the last when it is L
    assert mc.needed_boundaries(np.array([3, 4, 5, 6]), 10).tolist() == [3, 4, 5, 6, 7]
    assert mc.needed_boundaries(np.array([0, 9]), 10).tolist() == [0, 1, 9]  # V_10 is the reward
    with pytest.raises(ParameterError, match="positions: expected an integer >= 1"):
        mc.choose_positions(5, 0, "even", rng)
    with pytest.raises(ParameterError, match="position_choice: expected one of even, random, window"):
        mc.choose_positions(5, 2, "spread", rng)


def _scripted(pivot: int, p_good: float) -> mc.ContinuationRewards:
    """A policy whose success is decided by the token at ``pivot`` alone: token value 1
    there succeeds, anything else fails; a continuation from before ``pivot`` draws that
    token as 1 with probability ``p_good`` (its own seeded coin), one from after it keeps
    the response's token."""

    def rewards(responses: list[mc.Response], jobs: list[mc.Continuation]) -> tuple[list[float], int]:
        out = []
        for j in jobs:
            r = responses[j.response]
            if j.boundary > pivot:
                out.append(float(r.response_ids[pivot] == 1))
            else:
                coin = np.random.default_rng([j.response, j.boundary, j.sample]).random()
                out.append(float(coin < p_good))
        return out, len(jobs)

    return rewards


@pytest.mark.parametrize("good", [True, False])
def test_the_estimator_recovers_the_one_pivotal_token(good: bool) -> None:
    pivot, length, k, p_good = 6, 12, 400, 0.3
    ids = [5] * length
    ids[pivot] = 1 if good else 0
    responses = [mc.Response(Problem("q", "a", "s"), (9,), tuple(ids), True, float(good))]
    chosen = [mc.choose_positions(length, None, "even", np.random.default_rng(0))]
    jobs = mc.continuation_jobs(responses, chosen, k)
    assert len(jobs) == length * k  # boundaries 0..L−1 (V_L is the reward)
    rewards, _ = _scripted(pivot, p_good)(responses, jobs)
    values, errors = mc.values_from_rewards(responses, jobs, rewards)
    piv = mc.pivotality_of(values[0], chosen[0])
    assert int(np.argmax(piv)) == pivot
    # the pivotal token moves the value from p_good to 1 (or 0): |1 − 0.3| or |0 − 0.3|
    assert piv[pivot] == pytest.approx(1 - p_good if good else p_good, abs=4 * math.sqrt(p_good * (1 - p_good) / k))
    assert np.all(piv[pivot + 1 :] == 0.0)  # after it, the outcome is fixed
    assert np.all(piv[:pivot] < 0.15)  # before it, differences of two estimates of p_good
    assert errors[0][0] == pytest.approx(math.sqrt(values[0][0] * (1 - values[0][0]) / k))
    assert errors[0][length] == 0.0 and values[0][length] == float(good)


def test_values_need_both_boundaries() -> None:
    responses = [mc.Response(Problem("q", "a", "s"), (9,), (1, 2, 3), True, 1.0)]
    jobs = [mc.Continuation(0, 0, 0)]
    values, _ = mc.values_from_rewards(responses, jobs, [1.0])
    with pytest.raises(ParameterError, match="before and after token 1"):
        mc.pivotality_of(values[0], np.array([1]))


# ---------------------------------------------------------------------------------------------------------
# the analysis and the recommendation


def _table(concentration: list[np.ndarray], marks: bool = False) -> TokenTable:
    scores = {}
    for stat in ("entropy", "max", "l2"):
        for key in ("mean", "layer0"):
            scores[f"concentration/{stat}/{key}"] = concentration
    scores["position"] = [np.arange(c.size, dtype=float) for c in concentration]
    scores["policy_entropy"] = [np.ones(c.size) for c in concentration]
    scores["token_nll"] = [np.zeros(c.size) for c in concentration]
    classes = [["other"] * c.size for c in concentration]
    table_marks = [[bool(x > 0.5) for x in c] for c in concentration] if marks else None
    return TokenTable(scores, classes, table_marks, layers=1)


@pytest.mark.parametrize("sign, direction", [(1.0, "as_is"), (-1.0, "inverted"), (0.0, "none")])
def test_the_direction_follows_the_concentrations_ranking(sign: float, direction: str) -> None:
    rng = np.random.default_rng(0)
    piv = [np.where(rng.random(15) < 0.3, rng.uniform(0.4, 1.0, 15), rng.uniform(0.0, 0.1, 15)) for _ in range(30)]
    conc = [sign * p + (rng.normal(0.0, 1.0, p.size) if sign == 0.0 else 0.0) for p in piv]
    chosen = [np.arange(15) for _ in piv]
    settings = DiagnoseSettings(bootstrap=200, pivotal_threshold=0.25)
    report = analyse(_table(conc), chosen, piv, settings)
    rec = recommend(report["auc"]["entropy"]["gates"]["auc"], "entropy")
    assert rec["direction"] == direction
    entry = report["auc"]["entropy"]["mean"]
    if sign != 0.0:
        assert entry["auc"]["estimate"] == (1.0 if sign > 0 else 0.0)
        assert entry["spearman"]["estimate"] == pytest.approx(sign)
        assert rec["gate_range"] == [0.9, 1.0]
    else:
        assert rec["gate_range"] == [1.0, 1.0]
    assert report["baselines"]["policy_entropy"]["auc"]["estimate"] == 0.5  # a constant score: chance
    assert set(report["baselines"]) == {"position", "policy_entropy", "token_nll", "token_class"}


def test_the_direction_is_that_of_the_gates_not_of_the_pooled_concentration() -> None:
    """Responses at different concentration levels: pooled over responses the raw
    concentration ranks the pivotal tokens high (the high-level responses hold more of them),
    but within each response, as the gates see it, the pivotal tokens have the lower
    concentration; the recommendation follows the gates."""
    rng = np.random.default_rng(1)
    piv, conc = [], []
    for b in range(80):
        level, share = (5.0, 0.7) if b % 2 else (0.0, 0.05)
        p = np.where(rng.random(12) < share, 0.8, 0.0)
        p[0] = 0.0  # a row's first gate is its midpoint whatever the statistic
        piv.append(p)
        conc.append(level - p + rng.normal(0.0, 0.05, 12))  # pivotal: lower within the row
    chosen = [np.arange(12) for _ in piv]
    report = analyse(_table(conc), chosen, piv, DiagnoseSettings(bootstrap=200))
    assert recommend(report["auc"]["entropy"]["mean"]["auc"], "entropy")["direction"] == "as_is"  # pooled raw
    assert recommend(report["auc"]["entropy"]["gates"]["auc"], "entropy")["direction"] == "inverted"


def test_marks_section_and_no_pivotal_token() -> None:
    piv = [np.array([0.0, 0.9, 0.0, 0.8]) for _ in range(10)]
    conc = [p.copy() for p in piv]
    chosen = [np.arange(4) for _ in piv]
    report = analyse(_table(conc, marks=True), chosen, piv, DiagnoseSettings(bootstrap=50))
    assert report["auc_vs_marks"]["pivotality"]["estimate"] == 1.0
    assert report["auc_vs_marks"]["entropy"]["estimate"] == 1.0
    assert report["auc_vs_marks"]["marked_tokens"] == 20
    flat = [np.zeros(4) for _ in piv]
    none = analyse(_table(conc), chosen, flat, DiagnoseSettings(bootstrap=50))
    rec = recommend(none["auc"]["entropy"]["gates"]["auc"], "entropy")
    assert rec["direction"] == "none" and "no interval" in rec["why"]


def test_token_classes_and_settings_checks() -> None:
    assert [token_class(t, False) for t in ("7", " 12", "+", "=", "a", "|")] == [
        "digit", "digit", "operator", "operator", "other", "other",
    ]  # fmt: skip
    assert token_class("", True) == "eos"
    with pytest.raises(ParameterError, match="samples_per_prefix: expected an integer >= 1"):
        DiagnoseSettings(samples_per_prefix=0)
    with pytest.raises(ParameterError, match="pivotal_threshold: expected a number in"):
        DiagnoseSettings(pivotal_threshold=0.0)
    with pytest.raises(ParameterError, match="statistic: expected one of"):
        DiagnoseSettings(statistic="mean")


# ---------------------------------------------------------------------------------------------------------
# the whole diagnostic on a tiny warm-started Llama


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_diagnose_on_a_tiny_warm_start_gives_the_report() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("tqdm")
    from rl_tiny import TINY_SETTINGS

    from comppo_core.experiments.diagnose import diagnose
    from comppo_core.rl.config import TrainConfig
    from comppo_core.rl.engine.build import initial_policy, make_task

    config = TrainConfig(**{**TINY_SETTINGS, "task": "chain", "chain_digits": 2, "chain_steps": 1,
                            "chain_filler_max": 2, "chain_tail_max": 0, "warmup_sft_steps": 20})  # fmt: skip
    task, tok = make_task(config)
    torch.manual_seed(0)
    actor, _ = initial_policy(config, task, tok.vocab_size, torch.device("cpu"))
    settings = DiagnoseSettings(prompts=3, samples_per_prefix=3, positions=3, bootstrap=20, batch_size=7)
    lines: list[str] = []
    report = diagnose(actor, tok, task, settings, device=torch.device("cpu"), say=lines.append, progress=False)
    assert report["direction"] in ("as_is", "inverted", "none")
    assert set(report["auc"]) == {"entropy", "max", "l2"}
    assert set(report["auc"]["entropy"]) == {"mean", "layer0", "layer1", "gates"}
    assert "auc_vs_marks" in report and "pivotality" in report["auc_vs_marks"]
    rows, tokens = report["cost"]["continuation_rows"], report["pivotal"]["tokens"]
    assert rows % 3 == 0 and 0 < rows <= 2 * tokens * 3  # K per boundary, at most two boundaries per token
    assert (
        report["cost"]["generated_tokens"] == report["cost"]["response_tokens"] + report["cost"]["continuation_tokens"]
    )
    assert report["cost"]["continuation_tokens"] <= report["cost"]["continuation_tokens_upper_bound"]
    assert lines and "continuations" in lines[0]
    # K = 3 is too few for the default threshold: said before the continuations, kept in the report
    assert lines[1 : 1 + len(report["warnings"])] == [f"diagnose: warning: {w}" for w in report["warnings"]]
    assert any("--samples-per-prefix 3" in w for w in report["warnings"])
    assert lines[-1].startswith(f"diagnose: {report['direction']}: ") and "; next: " in lines[-1]
    # the continuations are keyed: the same report again
    again = diagnose(actor, tok, task, settings, device=torch.device("cpu"), say=lambda _: None, progress=False)
    assert again["auc"] == report["auc"] and again["pivotal"] == report["pivotal"]


def test_explained_variance_of_a_critic() -> None:
    from comppo_core.experiments.diagnose import explained_variance_section

    rng = np.random.default_rng(0)
    values = [np.append(rng.random(6), 1.0) for _ in range(8)]  # [L + 1], V_L the reward
    values[0][2] = np.nan  # a prefix not estimated is left out
    settings = DiagnoseSettings(bootstrap=50)
    perfect = explained_variance_section(values, [v[:-1] for v in values], settings)
    assert perfect["explained_variance"]["estimate"] == pytest.approx(1.0)
    assert perfect["prefixes"] == 8 * 6 - 1 and perfect["mse"] == pytest.approx(0.0)
    shifted = explained_variance_section(values, [v[:-1] + 0.3 for v in values], settings)
    assert shifted["explained_variance"]["estimate"] == pytest.approx(1.0)  # a constant offset is not variance
    assert shifted["mse"] == pytest.approx(0.09)
    flat = explained_variance_section(values, [np.zeros(6) for _ in values], settings)
    assert flat["explained_variance"]["estimate"] == pytest.approx(0.0, abs=1e-12)


def test_policy_gate_directions_are_in_their_own_orientation() -> None:
    from comppo_core.experiments.diagnose import policy_gate_directions

    def entry(low: float, high: float) -> dict[str, object]:
        return {"gates": {"auc": {"estimate": (low + high) / 2, "ci": [low, high], "undefined_resamples": 0}}}

    # uncertain tokens pivotal (AUC above 0.5): their gates must be inverted to give them high gates
    got = policy_gate_directions({"policy_entropy": entry(0.6, 0.7), "token_nll": entry(0.3, 0.4)})
    assert got == {"policy_entropy": "inverted", "token_nll": "as_is"}
    assert policy_gate_directions({"policy_entropy": entry(0.4, 0.6), "token_nll": entry(0.45, 0.55)}) == {
        "policy_entropy": "none",
        "token_nll": "none",
    }


def _response(length: int) -> mc.Response:
    return mc.Response(Problem("p", "1", ""), (1, 2), tuple(range(3, 3 + length)), True, 1.0)


def test_the_time_estimate_counts_a_batchs_longest_row_not_its_tokens() -> None:
    # a batch is decoded until its longest row stops: rows of remaining lengths 9 and 1 take
    # 10 steps (9 and EOS) if each is as long as its response's rest, 16 - 0 if one runs to its budget
    responses = [_response(9), _response(9)]
    batch = [mc.Continuation(0, 0, 0), mc.Continuation(1, 8, 0)]
    assert batch_steps(responses, batch, max_new_tokens=16) == (10, 16)
    # the first batch (10 steps) took 2.2 s, the last (2 steps) 0.6 s: 0.2 s of prefill + 0.2 s a step
    low, high = seconds_range([(10, 2.2), (2, 0.6)], [(10, 16), (4, 12), (2, 9)])
    assert math.isclose(low, 3 * 0.2 + 0.2 * 16) and math.isclose(high, 3 * 0.2 + 0.2 * 37)
    assert CostEstimate(3, 40, 20, (low, high)).line().endswith("about 4-8 s")
    # two batches of the same steps: all per step (no prefill can be told apart)
    assert seconds_range([(8, 4.0), (8, 4.0)], [(8, 8), (8, 8)]) == (8.0, 8.0)
    assert CostEstimate(3, 40, 20, (5.0, 5.2)).line().endswith("about 5 s")


def test_a_diagnosis_warns_before_its_continuations_when_it_cannot_inform() -> None:
    zero = [mc.Response(Problem("p", "1", ""), (1,), (2, 3), True, 0.0) for _ in range(4)]
    mixed = [*zero[:2], mc.Response(Problem("q", "1", ""), (1,), (2, 3), True, 1.0)]
    k16, k8 = DiagnoseSettings(samples_per_prefix=16), DiagnoseSettings(samples_per_prefix=8)
    assert warnings_of(mixed, k16) == []
    (all_zero,) = warnings_of(zero, k16)
    assert all_zero.startswith("every sampled response scored 0:")
    # K = 8: sqrt(0.5/8) = 0.25, the default pivotal threshold; K = 9 would be the first below it
    (noise,) = warnings_of(mixed, k8)
    assert "--samples-per-prefix 8" in noise and "up to 0.25" in noise and "to 9 or more" in noise
    assert len(warnings_of(zero, k8)) == 2


@pytest.mark.parametrize("direction", ["as_is", "inverted", "none"])
def test_every_recommendation_says_what_to_do_next(direction: str) -> None:
    ci = {"as_is": (0.6, 0.7), "inverted": (0.3, 0.4), "none": (0.45, 0.55)}[direction]
    rec = recommend({"estimate": sum(ci) / 2, "ci": list(ci)}, "max")
    assert rec["direction"] == direction and rec["next"]
    if direction == "none":
        assert "max layer average" in rec["next"] and "tac_fixed" in rec["next"] and "--prompts" in rec["next"]
    else:
        assert f"--gate-direction {direction}" in rec["next"]
