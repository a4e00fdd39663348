"""``comppo-core compare``: the 2×2 interaction, the critic's explained variance, and the
tuning protocol of ``--grid`` (the validation split, the grid's syntax, the choice rule,
the collapse criterion, the runs' layout and ``--resume``).

The statistics and the rules are checked against hand computations; the end-to-end runs
are the tiny ones of ``rl_tiny`` (a second each), with the verifier replaced by a parity
rule so that accuracies differ between runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rl_tiny import TINY_SETTINGS, as_flags

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from comppo_core import cli
from comppo_core.errors import ParameterError
from comppo_core.experiments import report as compare_report
from comppo_core.experiments import runs as compare_runs
from comppo_core.experiments import statistics as compare_stats
from comppo_core.experiments import tuning
from comppo_core.experiments.grid import NOT_TUNABLE, POLICY_FIELDS, Grid, parse_grid
from comppo_core.experiments.tuning import Outcome, choose, collapsed, objective, stability
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.tasks.addition import AdditionTask
from comppo_core.rl.tasks.jsonl import JsonlTask

T975_2 = 4.302652730  # t_{0.975, 2}, from a printed table


# ---------------------------------------------------------------------------------------------------------
# the interaction and the critic's fit


def test_interaction_against_a_hand_computation() -> None:
    final = {
        "comppo": {0: 0.60, 1: 0.50, 2: 0.70},
        "tac_fixed": {0: 0.50, 1: 0.45, 2: 0.55},
        "comp_gae": {0: 0.52, 1: 0.40, 2: 0.50},
        "ppo_fixed": {0: 0.50, 1: 0.42, 2: 0.45},
        "grpo": {0: 0.1, 1: 0.1, 2: 0.1},
    }
    # per seed: (0.10 − 0.02), (0.05 − (−0.02)), (0.15 − 0.05) = 0.08, 0.07, 0.10
    per_seed = [0.08, 0.07, 0.10]
    mean = sum(per_seed) / 3
    s = math.sqrt(sum((v - mean) ** 2 for v in per_seed) / 2)
    got = compare_stats.interaction(final)
    assert got is not None
    assert got["arms"] == ["comppo", "tac_fixed", "comp_gae", "ppo_fixed"] and got["seeds"] == [0, 1, 2]
    assert got["per_seed"] == pytest.approx(per_seed, abs=1e-15)
    assert got["mean"] == pytest.approx(0.25 / 3, abs=1e-15)
    assert got["ci"] == pytest.approx(T975_2 * s / math.sqrt(3), rel=1e-9)
    line = compare_report.interaction_line(got)
    lo, hi = 100 * (mean - got["ci"]), 100 * (mean + got["ci"])
    assert f"= +8.3 points, 95% CI [{lo:+.1f}, {hi:+.1f}] (3 seeds; per seed: +8.0, +7.0, +10.0): " in line
    assert line.rstrip().endswith(": interaction > 0.")  # [+4.5, +12.1]: the interval excludes 0
    null = compare_stats.interaction({**final, "comppo": {0: 0.40, 1: 0.60, 2: 0.50}})
    assert null is not None and compare_report.interaction_line(null).rstrip().endswith(
        f": {compare_stats.reading('interaction', '0', null['mean'], null['ci'])}."
    )
    assert "no difference detected (within ±" in compare_report.interaction_line(null)


def test_interaction_needs_all_four_cells_and_a_common_seed() -> None:
    four = {arm: {0: 0.5, 1: 0.4} for arm in compare_stats.INTERACTION}
    assert compare_stats.interaction(four) is not None
    assert compare_stats.interaction({k: v for k, v in four.items() if k != "ppo_fixed"}) is None
    assert compare_stats.interaction({**four, "comppo": {7: 0.5}}) is None
    one = compare_stats.interaction({**four, "comppo": {1: 0.9}})
    assert one is not None and one["seeds"] == [1] and one["ci"] is None
    assert one["mean"] == pytest.approx(0.5)


def test_contrasts_against_a_hand_computation() -> None:
    final = {
        "ppo": {0: 0.50, 1: 0.40, 2: 0.45},
        "grpo": {0: 0.40, 1: 0.35, 2: 0.30},
        "comppo_oracle": {0: 0.5, 1: 0.5},
        "tac_fixed": {1: 0.4, 2: 0.1},
    }
    got = compare_stats.contrasts(final)
    # only the contrasts whose arms both ran, in CONTRASTS' order; seeds in common only
    assert [(c["a"], c["b"]) for c in got] == [("ppo", "grpo"), ("comppo_oracle", "tac_fixed")]
    ppo = got[0]
    per_seed = [0.10, 0.05, 0.15]
    mean = sum(per_seed) / 3
    s = math.sqrt(sum((v - mean) ** 2 for v in per_seed) / 2)
    assert ppo["seeds"] == [0, 1, 2] and ppo["per_seed"] == pytest.approx(per_seed, abs=1e-15)
    assert ppo["mean"] == pytest.approx(0.10) and ppo["ci"] == pytest.approx(T975_2 * s / math.sqrt(3), rel=1e-9)
    oracle = got[1]
    assert oracle["seeds"] == [1] and oracle["per_seed"] == pytest.approx([0.1]) and oracle["ci"] is None
    assert compare_stats.contrasts({"ppo": {0: 0.5}, "grpo": {1: 0.5}}) == []
    table = compare_report.contrasts_table(got)
    assert md_row(table, "ppo − grpo")[1:] == [
        "does a learned critic beat the group baseline",
        "+10.0",
        compare_report.ci_cell(ppo["mean"], ppo["ci"], True),
        "no difference detected (within ±22.4)",  # 0.10 ± 4.3027 · 0.05 / √3 = [−2.4, +22.4] points
    ]
    assert md_row(table, "comppo_oracle − tac_fixed")[3:] == ["—", "one seed: no interval"]
    assert compare_report.contrasts_table([]) == ""


@pytest.mark.parametrize(
    ("mean", "half", "expected"),
    [
        (0.05, 0.02, "a > b"),
        (-0.05, 0.02, "a < b"),
        (0.01, 0.03, "no difference detected (within ±4.0)"),
        (-0.02, 0.03, "no difference detected (within ±5.0)"),
        (0.0, 0.0, "no difference detected (within ±0.0)"),
        (0.02, None, "one seed: no interval"),
    ],
)
def test_reading_words_what_the_interval_allows(mean: float, half: float | None, expected: str) -> None:
    assert compare_stats.reading("a", "b", mean, half) == expected


def test_window_means() -> None:
    values = [0.1, None, 0.3, 0.5, 0.7]
    assert compare_stats.window_means(values, 2) == (pytest.approx(0.1), pytest.approx(0.6))
    assert compare_stats.window_means(values, 10) == (pytest.approx(0.4), pytest.approx(0.4))
    assert compare_stats.window_means([None, None], 1) == (None, None)
    table = compare_report.explained_variance_table({"grpo": None, "ppo": (0.25, 0.5)}, 10)
    assert "| grpo | — | — |" in table and "| ppo | 0.250 | 0.500 |" in table


# ---------------------------------------------------------------------------------------------------------
# the protocol's rules


def ok(initial: float, final: float) -> Outcome:
    return Outcome(initial, final)


NONFINITE = Outcome(None, None, nonfinite="loss: non-finite at step 3")


def test_the_collapse_criterion() -> None:
    assert tuning.COLLAPSE_MARGIN == 0.05
    assert not collapsed(ok(0.50, 0.45))  # exactly the margin: not "more than"
    assert collapsed(ok(0.50, 0.449))
    assert not collapsed(ok(0.50, 0.90)) and not collapsed(ok(0.2, 0.16))
    assert collapsed(NONFINITE)
    by_point = [[ok(0.5, 0.6), ok(0.5, 0.3)], [NONFINITE, ok(0.5, 0.5)], [ok(0.4, 0.41), ok(0.4, 0.38)]]
    assert stability(by_point) == (4, 6)


def test_the_objective_counts_a_nonfinite_stop_as_zero() -> None:
    assert objective([ok(0.5, 0.6), ok(0.5, 0.4)]) == pytest.approx(0.5)
    assert objective([ok(0.5, 0.6), NONFINITE]) == pytest.approx(0.3)


def test_the_choice_rule_and_its_ties() -> None:
    # the best mean final validation accuracy wins, whatever its start
    assert choose([[ok(0.5, 0.50)], [ok(0.1, 0.55)], [ok(0.5, 0.52)]]) == 1
    # a tie in the objective goes to the point with more stable runs (p0 has a collapse: 0.6 -> 0.4)
    tie = [[ok(0.6, 0.4), ok(0.3, 0.6)], [ok(0.5, 0.5), ok(0.5, 0.5)]]
    assert objective(tie[0]) == objective(tie[1]) and choose(tie) == 1
    # then to the earlier point
    assert choose([[ok(0.5, 0.4)], [ok(0.5, 0.5)], [ok(0.5, 0.5)]]) == 1
    assert choose([[ok(0.5, 0.5)], [ok(0.5, 0.5)]]) == 0
    # a point whose runs stopped on non-finite values is not chosen over a finite one
    assert choose([[NONFINITE], [ok(0.5, 0.01)]]) == 1


def test_tuning_seeds_are_disjoint_from_the_reporting_seeds() -> None:
    assert tuning.tuning_seeds(2) == [1000, 1001]
    assert not set(tuning.tuning_seeds(3)) & set(range(tuning.DEFAULT_REPORTING_SEEDS))


# ---------------------------------------------------------------------------------------------------------
# the grid


def test_grid_syntax_and_points() -> None:
    grid = parse_grid(["actor_lr=1e-4,3e-4", "kl-coef=0,0.1", "lam=1.0", "clip_high=none,0.3", "log_kl=false"])
    assert grid.fields == ("actor_lr", "kl_coef", "lam", "clip_high", "log_kl")
    assert grid.values == ((1e-4, 3e-4), (0.0, 0.1), (1.0,), (None, 0.3), (False,))
    points = grid.points
    assert len(points) == 8 and [grid.name(i) for i in (0, 7)] == ["p0", "p7"]
    assert points[0] == {"actor_lr": 1e-4, "kl_coef": 0.0, "lam": 1.0, "clip_high": None, "log_kl": False}
    assert points[1]["clip_high"] == 0.3 and points[2]["kl_coef"] == 0.1 and points[4]["actor_lr"] == 3e-4
    assert grid.to_dict()["actor_lr"] == [1e-4, 3e-4]


def test_grid_from_a_json_file(tmp_path: Path) -> None:
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"actor_lr": [1e-4, 3e-4], "kl_coef": [0, 0.1], "ppo_epochs": 1}))
    grid = parse_grid([str(path)])
    assert grid.to_dict() == {"actor_lr": [1e-4, 3e-4], "kl_coef": [0.0, 0.1], "ppo_epochs": [1]}
    assert isinstance(grid.values[1][0], float)  # 0 for a float field is 0.0: one setting, one record
    assert grid.points == parse_grid(["actor_lr=1e-4,3e-4", "kl_coef=0,0.1", "ppo_epochs=1"]).points


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (["actor_lr"], r"expected FIELD=V1,V2,\.\.\. tokens or a JSON file, got 'actor_lr', which is not a file"),
        (["actor_lr=1e-4", "kl"], r"expected FIELD=V1,V2,\.\.\. \(or one JSON file\), got 'kl' \(token 2\)"),
        (["speed=1,2"], r"expected TrainConfig fields, got 'speed'"),
        (["actor_lr=fast"], r"expected actor_lr's values to be a number, got 'fast'"),
        (["ppo_epochs=1.5"], r"expected ppo_epochs's values to be an integer, got '1.5'"),
        (["actor_lr=1e-4,1e-4"], r"expected each value of actor_lr once, got 0.0001 twice"),
        (["lam=1", "lam=0.9"], r"expected each field once, got lam twice"),
        (["seed=1,2"], r"seed cannot vary in a grid: compare sets it per run"),
        (["sft_lr=1e-3,3e-3"], r"sft_lr cannot vary in a grid: every point and arm of a seed starts from the same"),
        (["eval_size=8,16"], r"eval_size cannot vary in a grid: every point is scored on the same validation"),
    ],
)
def test_a_bad_grid_is_named(tokens: list[str], message: str) -> None:
    with pytest.raises(ParameterError, match="grid: " + message) as info:
        parse_grid(tokens)
    assert info.value.argument == "grid"


def test_every_point_is_checked_by_trainconfig_with_every_arm() -> None:
    grid = parse_grid(["actor_lr=1e-4,-1"])
    with pytest.raises(ParameterError, match=r"grid: point p1 \(actor_lr=-1.0\) with arm grpo: actor_lr: expected"):
        grid.check(TrainConfig(), ["grpo"])
    with pytest.raises(ParameterError, match="with arm grpo: critic_warmup: expected 0 for the grpo arm"):
        parse_grid(["critic_warmup=0,1"]).check(TrainConfig(), ["comppo", "grpo"])
    Grid(("lam",), ((0.9, 1.0),)).check(TrainConfig(), ["grpo", "comppo"])


def test_the_grids_exclusions_are_trainconfig_fields() -> None:
    import dataclasses

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(NOT_TUNABLE) <= names and set(POLICY_FIELDS) <= set(NOT_TUNABLE)


# ---------------------------------------------------------------------------------------------------------
# the validation split


def pair(p: Any) -> tuple[int, int]:
    a, b = p.prompt[:-1].split("+")
    return int(a), int(b)


def test_the_validation_split_is_disjoint_from_the_heldout_split_and_training() -> None:
    task = AdditionTask(2, validation_fraction=0.1)
    valid = task.validation(10_000)
    held = task.heldout(10_000)
    assert 850 < len(valid) < 1150 and len({p.prompt for p in valid}) == len(valid)  # all of them, once each
    assert not {p.prompt for p in valid} & {p.prompt for p in held}
    assert all(task.is_validation(*pair(p)) and not task.is_heldout(*pair(p)) for p in valid)
    drawn = task.sample(np.random.default_rng(0), 5000)
    assert not {p.prompt for p in drawn} & ({p.prompt for p in valid} | {p.prompt for p in held})
    # the held-out split is the same as without a validation split
    assert [p.prompt for p in held] == [p.prompt for p in AdditionTask(2).heldout(10_000)]
    assert [p.prompt for p in task.validation(50)] == [p.prompt for p in valid[:50]]  # a fixed list
    assert [p.prompt for p in task.validation(50, seed=1)] != [p.prompt for p in valid[:50]]
    # 4 digits: drawn, not listed
    big = AdditionTask(4, validation_fraction=0.1)
    listed = big.validation(200)
    assert len({p.prompt for p in listed}) == 200 and all(big.is_validation(*pair(p)) for p in listed)
    with pytest.raises(ParameterError, match="validation_fraction: expected a validation split") as info:
        AdditionTask(2).validation(10)
    assert info.value.argument == "validation_fraction"
    with pytest.raises(ParameterError, match=r"validation_fraction: expected a number in \[0, 1 − heldout_fraction\)"):
        AdditionTask(2, heldout_fraction=0.5, validation_fraction=0.5)
    with pytest.raises(ParameterError, match="validation_fraction: .* leaves no validation pair"):
        AdditionTask(1, validation_fraction=1e-6)


def test_training_draws_are_bit_identical_without_a_validation_split() -> None:
    """validation_fraction=0 draws what the task drew before it had a validation split:
    the plain rule, pairs drawn uniformly and kept when their hash is past the held-out share."""
    task = AdditionTask(2, validation_fraction=0.0)
    threshold = int(0.2 * 2**64)
    rng = np.random.default_rng(5)
    expected = []
    while len(expected) < 300:
        a, b = (int(x) for x in rng.integers(0, 100, size=2))
        h = int.from_bytes(hashlib.blake2b(f"0:{a}:{b}".encode(), digest_size=8).digest(), "little")
        if h >= threshold:
            expected.append(f"{a}+{b}=")
    assert [p.prompt for p in task.sample(np.random.default_rng(5), 300)] == expected
    assert [p.prompt for p in AdditionTask(2).sample(np.random.default_rng(5), 300)] == expected
    assert "validation_fraction" not in AdditionTask(2).to_dict()  # task.json as before
    assert AdditionTask(2, validation_fraction=0.1).to_dict()["validation_fraction"] == 0.1


def test_the_jsonl_validation_split(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}?", "answer": i}) + "\n" for i in range(200)))
    plain = JsonlTask(path)
    task = JsonlTask(path, validation_fraction=0.2)
    valid = {p.prompt for p in task.validation(1000)}
    held = {p.prompt for p in task.heldout(1000)}
    assert 20 < len(valid) < 60 and not valid & held
    assert held == {p.prompt for p in plain.heldout(1000)}
    assert not valid & {p.prompt for p in task.train_rows}
    assert {p.prompt for p in task.train_rows} == {p.prompt for p in plain.train_rows} - valid
    assert JsonlTask(path, validation_fraction=0.0).train_rows == plain.train_rows
    draws = [p.prompt for p in JsonlTask(path, validation_fraction=0.0).sample(np.random.default_rng(3), 50)]
    assert draws == [p.prompt for p in plain.sample(np.random.default_rng(3), 50)]
    assert [p.prompt for p in task.validation(5)] == [p.prompt for p in task.validation(1000)[:5]]
    with pytest.raises(ParameterError, match="validation_fraction: expected a validation split"):
        plain.validation(5)


def test_trainconfig_eval_split() -> None:
    assert TrainConfig().eval_split == "heldout" and TrainConfig().validation_fraction == 0.0
    with pytest.raises(ParameterError, match=r"eval_split: expected one of 'heldout', 'validation', got 'test'"):
        TrainConfig(eval_split="test", validation_fraction=0.1)
    with pytest.raises(ParameterError, match="eval_split: expected 'heldout' without a validation split"):
        TrainConfig(eval_split="validation")
    with pytest.raises(ParameterError, match=r"validation_fraction: expected a number in \[0.0, 0.8"):
        TrainConfig(validation_fraction=0.8)


# ---------------------------------------------------------------------------------------------------------
# end to end (tiny runs)

TINY = as_flags({**TINY_SETTINGS, "eval_size": 8, "eval_every": 1})


@pytest.fixture
def signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Score an even response length as correct: accuracies that vary between runs."""

    def parity(self: AdditionTask, problem: Any, response: str, finished: bool) -> float:
        return float(len(response) % 2 == 0)

    monkeypatch.setattr(AdditionTask, "reward", parity)


def test_the_trainer_evaluates_on_the_split_asked_for() -> None:
    from comppo_core.rl.engine.trainer import Trainer

    settings = {**TINY_SETTINGS, "eval_size": 8, "validation_fraction": 0.3}
    task = AdditionTask(1, validation_fraction=0.3)
    for split, problems in (("validation", task.validation(8)), ("heldout", task.heldout(8))):
        trainer = Trainer(TrainConfig(**settings, eval_split=split))
        try:
            assert trainer.eval_problems == problems, split
        finally:
            trainer.dist.close()
    assert not {p.prompt for p in task.validation(8)} & {p.prompt for p in task.heldout(8)}


def md_row(text: str, first: str) -> list[str]:
    """The cells of the markdown row of ``text`` whose first cell is ``first``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r}")


@pytest.mark.usefixtures("one_torch_thread", "signal")
def test_compare_reports_the_interaction_and_the_critics_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ppo stands in for ppo_fixed (not an arm on this branch); EV over the first and the last step."""
    monkeypatch.setattr(compare_stats, "INTERACTION", ("comppo", "tac_fixed", "comp_gae", "ppo"))
    monkeypatch.setattr(compare_report, "EV_WINDOW", 1)
    out = tmp_path / "cmp"
    arms = ("ppo", "comp_gae", "tac_fixed", "comppo")
    assert cli.main(["compare", "--arms", ",".join(arms), "--seeds", "2", *TINY, "--out", str(out)]) == 0
    acc = {
        (arm, s): json.loads((out / arm / f"seed{s}" / "summary.json").read_text())["final_eval_accuracy"]
        for arm in arms
        for s in (0, 1)
    }
    per_seed = [(acc["comppo", s] - acc["tac_fixed", s]) - (acc["comp_gae", s] - acc["ppo", s]) for s in (0, 1)]
    results = json.loads((out / "results.json").read_text())
    assert results["interaction"]["per_seed"] == pytest.approx(per_seed, abs=1e-12)
    mean, half = compare_stats.mean_ci(per_seed)
    assert results["interaction"]["mean"] == pytest.approx(mean) and results["interaction"]["ci"] == pytest.approx(half)
    text = (out / "results.md").read_text()
    assert "(comppo − tac_fixed) − (comp_gae − ppo) = " + compare_report.pct(mean, True) + " points" in text
    # the named contrasts whose two arms ran, from the same summaries
    found = {(c["a"], c["b"]): c for c in results["contrasts"]}
    assert set(found) == {("comppo", "tac_fixed")}
    diff = [acc["comppo", s] - acc["tac_fixed", s] for s in (0, 1)]
    assert found["comppo", "tac_fixed"]["per_seed"] == pytest.approx(diff, abs=1e-12)
    dm, dh = compare_stats.mean_ci(diff)
    assert md_row(text, "comppo − tac_fixed")[2:] == [
        compare_report.pct(dm, True),
        compare_report.ci_cell(dm, dh, True),
        compare_stats.reading("comppo", "tac_fixed", dm, dh),
    ]
    for arm in arms:
        evs = {
            s: [
                r["value_explained_var"]
                for r in map(json.loads, (out / arm / f"seed{s}" / "metrics.jsonl").read_text().splitlines())
                if r["reward_mean"] is not None
            ]
            for s in (0, 1)
        }
        first = (evs[0][0] + evs[1][0]) / 2
        last = (evs[0][-1] + evs[1][-1]) / 2
        assert results["explained_variance"][arm]["first"] == pytest.approx(first)
        assert results["explained_variance"][arm]["last"] == pytest.approx(last)
        assert md_row(text.split("critic's explained variance")[1], arm)[1:] == [f"{first:.3f}", f"{last:.3f}"]
    monkeypatch.setattr(compare_stats, "INTERACTION", ("comppo", "tac_fixed", "comp_gae", "ppo_fixed"))
    assert compare_stats.interaction({arm: {0: 0.5} for arm in arms}) is None


@pytest.mark.usefixtures("one_torch_thread", "signal")
def test_compare_grid_tunes_each_arm_then_reports_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cmp"
    grid = ["--grid", "actor_lr=1e-5,3e-3", "--tuning-seeds", "1", "--seeds", "2"]
    argv = ["compare", "--arms", "grpo,comppo", *grid, *TINY, "--out", str(out)]
    assert cli.main(argv) == 0
    record = json.loads((out / "compare.json").read_text())
    assert record["grid"] == {"actor_lr": [1e-5, 3e-3]} and record["tuning_seeds"] == [1000]
    assert record["settings"]["validation_fraction"] == tuning.DEFAULT_VALIDATION_FRACTION
    outcomes: dict[str, list[list[Outcome]]] = {"grpo": [], "comppo": []}
    for i, lr in enumerate((1e-5, 3e-3)):
        point = json.loads((out / "grid" / f"p{i}" / "point.json").read_text())
        assert point == {"point": f"p{i}", "settings": {"actor_lr": lr}}
        for arm in ("grpo", "comppo"):
            run = out / "grid" / f"p{i}" / arm / "seed1000"
            config = TrainConfig.from_json((run / "config.json").read_text())
            assert (config.arm, config.seed, config.actor_lr, config.eval_split) == (arm, 1000, lr, "validation")
            assert config.init_from == str(out / "warmstart" / "seed1000" / "warmstart")
            summary = json.loads((run / "summary.json").read_text())
            outcomes[arm].append([Outcome(summary["initial_eval_accuracy"], summary["final_eval_accuracy"])])
    chosen = {arm: choose(outcomes[arm]) for arm in outcomes}
    choice = json.loads((out / "grid" / "choice.json").read_text())
    assert choice == {arm: {"point": f"p{i}", "settings": {"actor_lr": (1e-5, 3e-3)[i]}} for arm, i in chosen.items()}
    for arm, i in chosen.items():
        for s in (0, 1):
            config = TrainConfig.from_json((out / arm / f"seed{s}" / "config.json").read_text())
            assert (config.seed, config.eval_split, config.actor_lr) == (s, "heldout", (1e-5, 3e-3)[i])
            assert config.validation_fraction == tuning.DEFAULT_VALIDATION_FRACTION
    results = json.loads((out / "results.json").read_text())
    tuned = results["tuning"]
    assert tuned["tuning_seeds"] == [1000] and tuned["points"] == {"p0": {"actor_lr": 1e-5}, "p1": {"actor_lr": 3e-3}}
    text = (out / "results.md").read_text()
    assert "## Tuning" in text and "collapses when" in text
    for arm, i in chosen.items():
        k, n = stability(outcomes[arm])
        assert tuned["arms"][arm]["chosen"] == f"p{i}" and tuned["arms"][arm]["stable"] == [k, n]
        assert md_row(text.split("## Tuning")[1], arm)[1:] == [
            f"p{i}",
            f"actor_lr={(1e-5, 3e-3)[i]!r}",
            compare_report.pct(objective(outcomes[arm][i])),
            f"{k}/2",
        ]
    assert md_row(text.split("critic's explained variance")[1], "grpo")[1:] == ["—", "—"]
    timings = json.loads((out / "timings.json").read_text())
    assert set(timings) == {
        *(f"warmstart/seed{s}" for s in (1000, 0, 1)),
        *(f"grid/p{i}/{arm}/seed1000" for i in (0, 1) for arm in ("grpo", "comppo")),
        *(f"{arm}/seed{s}" for arm in ("grpo", "comppo") for s in (0, 1)),
    }

    # --resume reuses every warm start and run; a different grid is refused
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("(reused)") == 3 + 4 + 4 and "s, resumed)" not in printed
    assert json.loads((out / "timings.json").read_text()) == timings
    assert json.loads((out / "results.json").read_text())["tuning"] == tuned
    other = ["compare", "--arms", "grpo,comppo", "--grid", "actor_lr=1e-5", "--tuning-seeds", "1", "--seeds", "2"]
    assert cli.main([*other, *TINY, "--out", str(out), "--resume"]) == 2
    assert re.search(r"--grid: the compare in --out has grid \{'actor_lr': \[1e-05, 0.003\]\}", capsys.readouterr().err)


def test_a_point_that_differs_only_in_what_an_arm_ignores_is_a_repeat() -> None:
    grid = parse_grid(["actor_lr=1e-5,3e-5", "gate_low=0.5,0.9"])  # p0..p3: (1e-5, .5) (1e-5, .9) (3e-5, .5) ...
    assert grid.first_alike("grpo") == [0, 0, 2, 2] and grid.first_alike("ppo") == [0, 0, 2, 2]
    for arm in ("ppo_fixed", "comp_gae", "tac_fixed", "comppo", "comppo_oracle"):  # the gates or a TAC read it
        assert grid.first_alike(arm) == [0, 1, 2, 3]
    assert parse_grid(["statistic=entropy,max", "fixed_gate=none,0.9"]).first_alike("grpo") == [0, 0, 0, 0]


@pytest.mark.usefixtures("one_torch_thread")
def test_an_arm_without_routing_runs_the_same_whatever_its_gate_settings(tmp_path: Path) -> None:
    """The premise of a repeat: grpo's and ppo's runs do not change with a gate setting."""
    from comppo_core.rl import train

    for arm in ("grpo", "ppo"):
        rows = []
        for low in (0.5, 0.9):
            out = tmp_path / f"{arm}{low}"
            settings = {**TINY_SETTINGS, "eval_size": 8, "eval_every": 1, "device": "cpu"}
            train(
                TrainConfig(
                    **settings, arm=arm, gate_low=low, statistic="max" if low < 0.9 else "entropy", out=str(out)
                )
            )
            lines = (out / "metrics.jsonl").read_text().splitlines()
            rows.append(
                [
                    {k: v for k, v in json.loads(line).items() if "time" not in k and not k.endswith("_s")}
                    for line in lines
                ]
            )
        assert rows[0] == rows[1]


@pytest.mark.usefixtures("one_torch_thread", "signal")
def test_compare_grid_runs_a_repeat_once(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", "--arms", "grpo,ppo_fixed", "--grid", "gate_low=0.5,0.9", "--tuning-seeds", "1", "--seeds", "1"]
    assert cli.main([*argv, *TINY, "--out", str(out)]) == 0
    assert (out / "grid" / "p0" / "grpo" / "seed1000" / "summary.json").is_file()
    assert not (out / "grid" / "p1" / "grpo").exists()  # grpo's p1 is its p0
    assert all((out / "grid" / f"p{i}" / "ppo_fixed" / "seed1000" / "summary.json").is_file() for i in (0, 1))
    tuned = json.loads((out / "results.json").read_text())["tuning"]["arms"]
    assert tuned["grpo"]["scores"]["p0"] == tuned["grpo"]["scores"]["p1"] and tuned["grpo"]["stable"][1] == 2
    assert set(json.loads((out / "timings.json").read_text())) >= {
        "grid/p0/grpo/seed1000",
        "grid/p1/ppo_fixed/seed1000",
    }
    assert "grid/p1/grpo/seed1000" not in json.loads((out / "timings.json").read_text())
    text = (out / "results.md").read_text().split("## Tuning")[1]
    assert md_row(text, "grpo")[2] == "(gate_low not read)" and md_row(text, "ppo_fixed")[2].startswith("gate_low=")
    assert md_row(text, "p1")[2].endswith("(= p0)") and "(= p" not in md_row(text, "p1")[3]  # grpo's repeat


@pytest.mark.usefixtures("one_torch_thread")
def test_a_tuning_run_stopped_by_a_nonfinite_value_is_a_collapse_and_is_not_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from comppo_core.errors import NonFiniteError
    from comppo_core.rl.engine.trainer import Trainer

    real = Trainer.train

    def train(self: Trainer, stop: Any = None) -> dict[str, Any]:
        if self.config.actor_lr == 1.0:  # the second point "diverges"
            raise NonFiniteError("loss: expected finite values, got nan")
        return real(self, stop)

    monkeypatch.setattr(Trainer, "train", train)
    out = tmp_path / "cmp"
    argv = ["compare", "--arms", "grpo", "--grid", "actor_lr=1e-5,1.0", "--tuning-seeds", "1", "--seeds", "1"]
    argv += [*TINY, "--out", str(out)]
    assert cli.main(argv) == 0
    stops = json.loads((out / "grid" / "nonfinite.json").read_text())
    assert list(stops) == ["grid/p1/grpo/seed1000"] and "nan" in stops["grid/p1/grpo/seed1000"]["message"]
    tuned = json.loads((out / "results.json").read_text())["tuning"]["arms"]["grpo"]
    assert tuned["chosen"] == "p0" and tuned["stable"][1] == 2 and tuned["stable"][0] <= 1
    assert tuned["runs"]["p1"]["1000"]["nonfinite"] and tuned["runs"]["p1"]["1000"]["collapsed"]
    assert tuned["scores"]["p1"] == 0.0
    capsys.readouterr()
    assert cli.main([*argv, "--resume"]) == 0
    assert "grpo p1 seed 1000: stopped on a non-finite value (reused)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--eval-split", "validation"], r"--eval-split: not a compare flag"),
        (["--tuning-seeds", "2"], r"--tuning-seeds: only with --grid"),
        (["--grid", "bogus=1"], r"--grid: expected TrainConfig fields, got 'bogus'"),
        (["--grid", "sft_lr=1e-3,3e-3"], r"--grid: sft_lr cannot vary in a grid"),
        (["--grid", "actor_lr=1e-4,-1"], r"--grid: point p1 \(actor_lr=-1.0\) with arm grpo: actor_lr: expected"),
        (["--grid", "lam=1", "--validation-fraction", "0"], r"--validation-fraction: expected > 0 with --grid"),
        (["--grid", "lam=1", "--seeds", "1001"], r"--seeds: expected at most 1000 with --grid"),
        (["--grid", "lam=1", "--tuning-seeds", "0"], r"--tuning-seeds: expected a number of tuning seeds >= 1"),
        (["--grid", "lam=1", "--validation-fraction", "0.9"], r"--validation-fraction: expected a number in"),
    ],
)
def test_bad_grid_flags_exit_2_naming_the_flag(
    extra: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["compare", "--arms", "grpo", *extra, "--out", "X"]) == 2
    captured = capsys.readouterr()
    assert re.search(named, captured.err), captured.err
    assert not (tmp_path / "X").exists()


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_compare_jobs_runs_in_workers_and_gives_the_same_runs(tmp_path: Path) -> None:
    """``--jobs 2`` runs each warm start and run in a worker process: the same files and
    numbers as one after another (times aside), and a rerun with --resume reuses them."""

    def without_times(path: Path) -> list[dict[str, Any]]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]

    argv = ["compare", "--arms", "grpo,comppo", "--seeds", "2", *TINY]
    assert cli.main([*argv, "--out", str(tmp_path / "one")]) == 0
    assert cli.main([*argv, "--jobs", "2", "--out", str(tmp_path / "two")]) == 0
    for arm in ("grpo", "comppo"):
        for s in (0, 1):
            rel = Path(arm) / f"seed{s}" / "metrics.jsonl"
            assert without_times(tmp_path / "one" / rel) == without_times(tmp_path / "two" / rel), rel
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert one["arms"] == two["arms"]
    before = (tmp_path / "two" / "timings.json").read_text()
    assert cli.main([*argv, "--jobs", "2", "--out", str(tmp_path / "two"), "--resume"]) == 0
    assert (tmp_path / "two" / "timings.json").read_text() == before  # nothing ran again


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_a_sigterm_to_compare_alone_stops_its_workers_at_a_step(tmp_path: Path) -> None:
    """SIGTERM to the compare process only (not its process group, as ``kill PID`` sends
    it): every worker's run stops at its next step boundary with a checkpoint that
    ``--resume`` continues from, and nothing further starts."""
    import os
    import signal
    import threading
    import time

    out = tmp_path / "cmp"
    many = as_flags({**TINY_SETTINGS, "steps": 3000, "eval_every": 3000, "eval_size": 8})
    argv = ["compare", "--arms", "grpo,ppo", "--seeds", "2", "--jobs", "2", *many, "--out", str(out)]
    runs = [out / arm / f"seed{s}" for s in (0, 1) for arm in ("grpo", "ppo")]

    returned = threading.Event()

    def signal_once_two_runs_are_stepping() -> None:
        while not returned.wait(0.05):
            if sum((run / "config.json").is_file() for run in runs) >= 2:
                time.sleep(1.0)  # well inside their 3000 steps
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=signal_once_two_runs_are_stepping)
    thread.start()
    try:
        status = cli.main(argv)
    finally:
        returned.set()
        thread.join()
    assert status == 143
    started = [run for run in runs if (run / "config.json").is_file()]
    assert len(started) == 2  # the two that were stepping; the other two never started
    for run in started:
        assert not (run / "summary.json").exists() and compare_runs.continues(run)
        assert len((run / "metrics.jsonl").read_text().splitlines()) < 3000


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux ``/proc``)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads the process tree from Linux /proc")
def test_workers_exit_when_the_compare_process_is_killed(tmp_path: Path) -> None:
    """SIGKILL to the compare process (what a second signal amounts to): its workers do
    not linger waiting for work (each held its memory forever); they exit within seconds,
    and the runs they had started resume with ``--resume``."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "cmp"
    many = as_flags({**TINY_SETTINGS, "steps": 3000, "eval_every": 3000, "eval_size": 8})
    argv = ["compare", "--arms", "grpo", "--seeds", "2", "--jobs", "2", *many, "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "stderr.txt"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "comppo_core.cli", *argv],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=Path(__file__).parent,
        )
    try:
        runs = [out / "grpo" / f"seed{s}" / "checkpoint" / "progress.json" for s in (0, 1)]
        deadline = time.monotonic() + 240
        while not all(run.is_file() for run in runs) and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.1)  # both workers past their first step
        workers = [p for p in _children(proc.pid) if "multiprocessing-fork" in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(workers) == 2
    finally:
        proc.kill()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{p}").exists() for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in workers if Path(f"/proc/{p}").exists()]
    for p in left:  # do not leave them behind even when the check fails
        os.kill(p, signal.SIGKILL)
    assert not left, "workers outlived the compare process"
    for s in (0, 1):
        assert compare_runs.continues(out / "grpo" / f"seed{s}")


def test_compare_jobs_must_be_a_positive_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compare", "--jobs", "0", *TINY, "--out", str(tmp_path / "x")]) == 2
    assert "--jobs: expected a number of processes >= 1, got '0'" in capsys.readouterr().err
