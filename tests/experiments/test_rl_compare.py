"""``comppo-core compare`` end to end (comppo_core.experiments, through the command):
each seed is warmed up once and every arm of it starts from those parameters (or from
``--init-from``), another compare's warm starts are copied bit for bit, the results table's
numbers are the runs' own (mean and Student-t CI over seeds, paired differences), a PNG is
drawn, a rerun reuses every run, and a setting invalid for one arm is refused before
anything trains.

Runs are tiny (1-digit addition, a 2-layer width-32 Llama, 8 sequences a step, 2 steps),
about a second each on one thread, with the verifier replaced by a parity rule so that
accuracies differ between runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from compare_tables import interval, parse_table
from rl_tiny import TINY_SETTINGS, as_flags

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tqdm")
pytest.importorskip("matplotlib")

from comppo_core import cli
from comppo_core.experiments import statistics
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.tasks.addition import AdditionTask

TINY = as_flags({**TINY_SETTINGS, "eval_size": 8, "eval_every": 1})


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny policy never solves a problem; scoring an even response length as correct
    gives the rollouts and the held-out accuracy numbers that vary between runs."""

    def parity(self: AdditionTask, problem: Any, response: str, finished: bool) -> float:
        return float(len(response) % 2 == 0)

    monkeypatch.setattr(AdditionTask, "reward", parity)


def rows(path: Path) -> list[dict[str, Any]]:
    """The step rows of a ``metrics.jsonl`` (without the final evaluation's row)."""
    rs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rs if r["reward_mean"] is not None]


def test_compare_writes_the_table_curves_and_every_run(
    tmp_path: Path, signal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from matplotlib import image

    out = tmp_path / "cmp"
    argv = ["compare", "--arms", "grpo,comppo", "--seeds", "2", *TINY, "--out", str(out)]
    assert cli.main(argv) == 0
    summaries = {
        (arm, s): json.loads((out / arm / f"seed{s}" / "summary.json").read_text())
        for arm in ("grpo", "comppo")
        for s in (0, 1)
    }
    for arm, s in summaries:
        rs = rows(out / arm / f"seed{s}" / "metrics.jsonl")
        assert [r["step"] for r in rs] == [0, 1] and {r["arm"] for r in rs} == {arm} and {r["seed"] for r in rs} == {s}
        config = TrainConfig.from_json((out / arm / f"seed{s}" / "config.json").read_text())
        assert config.init_from == str(out / "warmstart" / f"seed{s}" / "warmstart")

    text = (out / "results.md").read_text()
    table = parse_table(text)
    assert list(table) == ["grpo", "comppo"]
    warm = {s: summaries["grpo", s]["initial_eval_accuracy"] for s in (0, 1)}
    for arm in ("grpo", "comppo"):
        finals = [summaries[arm, s]["final_eval_accuracy"] for s in (0, 1)]
        mean, half = statistics.mean_ci(finals)
        assert table[arm]["seeds"] == "2"
        assert float(table[arm]["accuracy %"]) == pytest.approx(100 * mean, abs=0.051)
        lo, hi = interval(table[arm]["95% CI"])
        assert half is not None
        assert lo == pytest.approx(100 * (mean - half), abs=0.051)
        assert hi == pytest.approx(100 * (mean + half), abs=0.051)
        gain = statistics.mean_ci([f - warm[s] for s, f in zip((0, 1), finals)])[0]
        assert float(table[arm]["vs warm start"]) == pytest.approx(100 * gain, abs=0.051)
    acc = {key: summary["final_eval_accuracy"] for key, summary in summaries.items()}
    diff = statistics.mean_ci([acc["comppo", s] - acc["grpo", s] for s in (0, 1)])[0]
    assert float(table["comppo"]["vs grpo"]) == pytest.approx(100 * diff, abs=0.051)
    assert "Warm start:" in text

    png = (out / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(out / "curves.png")
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert float(pixels[..., :3].std()) > 0.01  # not a blank image

    results = json.loads((out / "results.json").read_text())
    assert results["arms"]["grpo"]["accuracy"] == [summaries["grpo", s]["final_eval_accuracy"] for s in (0, 1)]

    timings = json.loads((out / "timings.json").read_text())
    assert set(timings) == {f"{name}/seed{s}" for name in ("warmstart", "grpo", "comppo") for s in (0, 1)}
    assert all(t > 0 for t in timings.values())

    # a second invocation reuses the warm starts and finished runs and writes the same table
    capsys.readouterr()
    assert cli.main(argv) == 2  # not without --resume: the runs are kept as they are
    assert "--out: " in capsys.readouterr().err and json.loads((out / "timings.json").read_text()) == timings
    assert cli.main([*argv, "--resume"]) == 0
    assert capsys.readouterr().out.count("(reused)") == 2 + 4
    assert json.loads((out / "timings.json").read_text()) == timings  # as they took when they ran
    assert parse_table((out / "results.md").read_text()) == table


def test_a_resumed_compare_keeps_the_defaults_it_was_made_under(tmp_path: Path, signal: None) -> None:
    """A compare made before a default changed (here gate_causal, causal by default now)
    continues with the settings it recorded when the same command is rerun with --resume;
    a flag given against them is still refused."""
    out = tmp_path / "cmp"
    argv = ["compare", "--arms", "comppo", "--seeds", "1", *TINY, "--out", str(out)]
    assert TrainConfig().gate_causal is True
    assert cli.main([*argv, "--no-gate-causal"]) == 0  # as the earlier default made it
    run = json.loads((out / "comppo" / "seed0" / "config.json").read_text())
    assert run["gate_causal"] is False
    table = (out / "results.md").read_text()
    assert cli.main([*argv, "--resume"]) == 0  # the old command line, under the new default
    assert json.loads((out / "compare.json").read_text())["settings"]["gate_causal"] is False
    assert parse_table((out / "results.md").read_text()) == parse_table(table)  # the runs reused as they were
    assert "`gate_causal=False`" in table  # and the report names the setting that is not today's default
    assert cli.main([*argv, "--resume", "--gate-causal"]) == 2  # given against the record: named, refused


def test_a_compare_recorded_with_gate_invert_resumes_inverted(tmp_path: Path, signal: None) -> None:
    """A compare recorded before ``gate_invert`` became ``gate_direction`` (its compare.json
    and its runs' config.json say ``gate_invert: true``) resumes as the inverted direction
    it meant, reusing its runs, and refuses the other direction given against it."""
    out = tmp_path / "cmp"
    argv = ["compare", "--arms", "comppo", "--seeds", "1", *TINY, "--out", str(out)]
    assert cli.main([*argv, "--gate-direction", "inverted"]) == 0
    for path in (out / "compare.json", out / "comppo" / "seed0" / "config.json"):  # as the old version wrote them
        record = json.loads(path.read_text())
        fields = record["settings"] if path.name == "compare.json" else record
        assert fields.pop("gate_direction") == "inverted"
        fields["gate_invert"] = True
        path.write_text(json.dumps(record))
    table = (out / "results.md").read_text()
    assert cli.main([*argv, "--resume"]) == 0
    assert parse_table((out / "results.md").read_text()) == parse_table(table)  # the run reused, not redone
    assert json.loads((out / "compare.json").read_text())["settings"]["gate_direction"] == "inverted"
    assert cli.main([*argv, "--resume", "--gate-direction", "as_is"]) == 2


def test_compare_starts_every_arm_of_a_seed_from_the_same_parameters(tmp_path: Path, signal: None) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "cmp"
    assert cli.main(["compare", "--arms", "ppo,comppo_shuffle", "--seeds", "2", *TINY, "--out", str(out)]) == 0
    initial = {}
    for s in (0, 1):
        warm = load_file(out / "warmstart" / f"seed{s}" / "warmstart" / "model.safetensors")
        for arm in ("ppo", "comppo_shuffle"):
            # each run saves the policy it started from as its own warmstart/
            start = load_file(out / arm / f"seed{s}" / "warmstart" / "model.safetensors")
            assert start.keys() == warm.keys()
            assert all(torch.equal(start[k], warm[k]) for k in warm), (arm, s)
            steps = rows(out / arm / f"seed{s}" / "metrics.jsonl")
            initial[arm, s] = (steps[0]["eval_accuracy"], steps[0]["reward_mean"])
        assert initial["ppo", s] == initial["comppo_shuffle", s]  # same policy, eval set and first rollout
        initial[s] = warm
    assert any(not torch.equal(initial[0][k], initial[1][k]) for k in initial[0])  # the seeds differ


def test_compare_from_init_from_starts_every_run_there_and_warms_up_nothing(tmp_path: Path, signal: None) -> None:
    """``--init-from DIR``: no warm start is made; every arm and seed starts from DIR."""
    from safetensors.torch import load_file

    first = tmp_path / "first"
    assert cli.main(["train", "--arm", "grpo", *TINY, "--out", str(first)]) == 0
    start = first / "warmstart"
    out = tmp_path / "cmp"
    argv = ["compare", "--arms", "grpo,tac_fixed", "--seeds", "2", *TINY, "--init-from", str(start), "--out", str(out)]
    assert cli.main(argv) == 0
    assert not (out / "warmstart").exists()
    weights = load_file(start / "model.safetensors")
    summaries = {}
    for arm in ("grpo", "tac_fixed"):
        for s in (0, 1):
            run = out / arm / f"seed{s}"
            config = TrainConfig.from_json((run / "config.json").read_text())
            assert config.init_from == str(start) and (config.arm, config.seed) == (arm, s)
            mine = load_file(run / "warmstart" / "model.safetensors")
            assert all(torch.equal(mine[k], weights[k]) for k in weights), (arm, s)
            summaries[arm, s] = json.loads((run / "summary.json").read_text())
    # one initial policy: every run's step-0 held-out accuracy is the same
    assert len({summary["initial_eval_accuracy"] for summary in summaries.values()}) == 1
    table = parse_table((out / "results.md").read_text())
    assert list(table) == ["grpo", "tac_fixed"] and table["grpo"]["seeds"] == "2"


def test_compare_copies_another_compares_warm_starts_made_under_other_rl_settings(
    tmp_path: Path, signal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--warm-starts DIR``: the seeds DIR has are copied (DIR untouched), bit for bit the
    warm starts this compare would make itself; the others are made; a warm start made
    with another SFT setting is refused naming it."""
    from safetensors.torch import load_file

    def weights(cmp: Path, s: int) -> dict[str, Any]:
        return load_file(cmp / "warmstart" / f"seed{s}" / "warmstart" / "model.safetensors")

    first = tmp_path / "first"
    assert cli.main(["compare", "--arms", "grpo", "--seeds", "2", *TINY, "--out", str(first)]) == 0
    before = {p: p.read_bytes() for p in sorted(first.rglob("*")) if p.is_file()}
    rl = ["--actor-lr", "1e-3", "--kl-coef", "0", "--lam", "0.9", "--gate-low", "0.5", "--eval-size", "4"]
    second = tmp_path / "second"
    argv = ["compare", "--arms", "grpo,tac_fixed", "--seeds", "3", *TINY, *rl, "--out", str(second)]
    capsys.readouterr()
    assert cli.main([*argv, "--warm-starts", str(first)]) == 0
    log = capsys.readouterr().out
    assert log.count(f"(copied from {first})") == 2 and "[seed 2] warm start" in log and log.count("(made in") == 1
    assert {p: p.read_bytes() for p in sorted(first.rglob("*")) if p.is_file()} == before
    own = tmp_path / "own"  # the same compare making its own warm starts
    assert cli.main([*argv[:-1], str(own)]) == 0
    for s in (0, 1, 2):
        mine, made = weights(second, s), weights(own, s)
        assert mine.keys() == made.keys() and all(torch.equal(mine[k], made[k]) for k in made), s
        for arm in ("grpo", "tac_fixed"):
            runs = [json.loads((c / arm / f"seed{s}" / "summary.json").read_text()) for c in (second, own)]
            assert [r["final_eval_accuracy"] for r in runs] == [runs[1]["final_eval_accuracy"]] * 2
            steps = [rows(c / arm / f"seed{s}" / "metrics.jsonl") for c in (second, own)]
            untimed = [[{k: v for k, v in r.items() if not k.startswith("time_")} for r in rs] for rs in steps]
            assert untimed[0] == untimed[1], (arm, s)
    assert cli.main([*argv, "--resume"]) == 0  # a copied warm start is this compare's own now
    assert capsys.readouterr().out.count("(reused)") == 3 + 6

    other = ["compare", "--arms", "grpo", *TINY, "--warmup-sft-steps", "4", "--warm-starts", str(first)]
    assert cli.main([*other, "--out", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert f"error: --warm-starts: the warm start in {str(first / 'warmstart' / 'seed0')!r} was made with" in err
    assert "warmup_sft_steps=3" in err and "warmup_sft_steps=4" in err
    assert not (tmp_path / "other").exists()  # refused before anything is written: a rerun needs no --overwrite
    assert cli.main(["compare", "--arms", "grpo", *TINY, "--warm-starts", str(tmp_path / "nowhere"), "--out", "X"]) == 2
    assert "--warm-starts: expected the directory of a compare with warm starts" in capsys.readouterr().err


def test_compare_refuses_a_setting_bad_for_one_arm_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--critic-warmup is invalid for grpo alone: refused up front naming the flag, nothing trained."""
    out = tmp_path / "cmp"
    argv = ["compare", "--arms", "comppo,grpo", *TINY, "--critic-warmup", "1", "--out", str(out)]
    assert cli.main(argv) == 2
    assert "--critic-warmup: expected 0 for the grpo arm" in capsys.readouterr().err
    assert not (out / "comppo").exists()
