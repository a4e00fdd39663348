"""``comppo-core diagnose`` (comppo_core.commands.diagnose).

Pinned: bad flags exit with status 2 and one line naming the flag, before torch is needed;
an existing non-empty ``--out`` is refused (and kept) unless ``--overwrite``; end to end on
a tiny built-in warm start (slow) the command writes diagnosis.json with the documented
keys, diagnosis.md and diagnosis.png, and prints the cost before the recommendation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rl_tiny import TINY_SETTINGS, as_flags

from comppo_core import cli

TINY = as_flags(
    {
        **{k: v for k, v in TINY_SETTINGS.items() if k not in ("steps", "prompts_per_step", "group_size")},
        "task": "chain",
        "chain_digits": 2,
        "chain_steps": 1,
        "chain_filler_max": 2,
        "chain_tail_max": 0,
        "warmup_sft_steps": 20,
    }
)
BUDGET = ["--prompts", "3", "--samples-per-prefix", "2", "--positions", "3", "--bootstrap", "20"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--prompts", "0"], "--prompts: expected an integer >= 1, got 0"),
        (["--positions", "some"], "--positions: expected 'all' or an integer >= 1, got 'some'"),
        (["--samples-per-prefix", "x"], "--samples-per-prefix: expected an integer"),
        (["--pivotal-threshold", "2"], "--pivotal-threshold: expected a number in [0, 1], got 2"),
        (["--pivotal-threshold", "0"], "--pivotal-threshold: expected a number in (0.0, 1.0]"),
        (["--position-choice", "spread"], "--position-choice: invalid choice: 'spread'"),
        (["--temperature", "0"], "--temperature: expected"),
        (["--resume"], "--resume: diagnose starts nothing to resume"),
    ],
)
def test_bad_flags_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert cli.main(["diagnose", "--out", str(tmp_path / "d"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "d").exists()


def test_out_is_required_and_an_existing_directory_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["diagnose", "--task", "chain"]) == 2
    assert "--out: expected the directory to write diagnosis.json" in capsys.readouterr().err
    out = tmp_path / "d"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli.main(["diagnose", "--out", str(out)]) == 2
    assert "--out: expected a new or empty directory" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"
    (tmp_path / "f").write_text("x")
    assert cli.main(["diagnose", "--out", str(tmp_path / "f")]) == 2
    assert "--out: expected a directory, got" in capsys.readouterr().err


def test_help_lists_what_diagnose_reads_and_every_train_flag_is_still_accepted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert cli.main(["diagnose", "--help"]) == 0
    shown = capsys.readouterr().out
    flags = re.findall(r"^  (--[a-z0-9-]+)", shown, flags=re.MULTILINE)
    assert {"--prompts", "--samples-per-prefix", "--model", "--task", "--task-option", "--out", "--seed"} <= set(flags)
    assert "--actor-lr" not in flags and "--ppo-epochs" not in flags and len(flags) <= 45, flags  # was ~150
    assert "comppo-core train --help lists them" in shown
    args = cli._build_parser().parse_args(["diagnose", "--actor-lr", "1e-5", "--out", str(tmp_path / "d")])
    assert args.actor_lr == 1e-5  # accepted, read where it applies
    (tmp_path / "file").write_text("x")
    assert cli.main(["diagnose", "--out", str(tmp_path / "file" / "under")]) == 2
    assert "--out: expected a directory that can be made" in capsys.readouterr().err


def test_a_model_directory_that_is_not_one_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["diagnose", "--model", str(tmp_path / "nowhere"), "--out", str(tmp_path / "d")]) == 2
    assert "--model:" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_diagnose_end_to_end_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    out = tmp_path / "diags" / "tiny" / "seed1"  # its parents are made, as train makes --out's
    assert cli.main(["diagnose", *TINY, *BUDGET, "--seed", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.index("continuations, at most") < printed.index("direction")
    report = json.loads((out / "diagnosis.json").read_text())
    assert report["direction"] in ("as_is", "inverted", "none")
    assert {"direction", "recommendation", "auc", "baselines", "auc_vs_marks", "cost", "settings", "pivotal"} <= set(
        report
    )
    for entry in [*report["auc"]["entropy"].values(), *report["baselines"].values()]:
        assert set(entry) >= {"auc", "spearman"} and set(entry["auc"]) == {"estimate", "ci", "undefined_resamples"}
    assert report["settings"]["samples_per_prefix"] == 2 and report["settings"]["positions"] == 3
    assert report["settings"]["train_config"]["seed"] == 1 and report["settings"]["seed"] == 1
    assert report["cost"]["generated_tokens"] > 0 and report["cost"]["seconds"]["total"] > 0
    assert (out / "diagnosis.md").read_text().startswith("# Gate diagnosis")
    assert (out / "diagnosis.png").read_bytes()[:4] == b"\x89PNG"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left
    # a second run is refused; --overwrite replaces the three files and gives the same report (seeded)
    assert cli.main(["diagnose", *TINY, *BUDGET, "--seed", "1", "--out", str(out)]) == 2
    capsys.readouterr()
    assert cli.main(["diagnose", *TINY, *BUDGET, "--seed", "1", "--out", str(out), "--overwrite"]) == 0
    again = json.loads((out / "diagnosis.json").read_text())
    assert again["auc"] == report["auc"] and again["direction"] == report["direction"]


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_a_runs_critic_is_compared_with_the_monte_carlo_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    run = tmp_path / "run"
    train = ["train", "--arm", "ppo", *TINY, "--steps", "1", "--prompts-per-step", "2", "--group-size", "2"]
    assert cli.main([*train, "--save-every", "1", "--eval-size", "4", "--out", str(run)]) == 0
    out = tmp_path / "diag"
    assert cli.main(["diagnose", "--critic", str(run), *BUDGET, "--out", str(out)]) == 0
    report = json.loads((out / "diagnosis.json").read_text())
    critic = report["critic"]
    assert critic["prefixes"] > 0 and critic["mse"] >= 0.0
    assert set(critic["explained_variance"]) == {"estimate", "ci", "undefined_resamples"}
    assert report["source"].endswith(f"with the critic of {run}")
    capsys.readouterr()
    # a grpo run has no critic; --model with --critic is refused
    grpo = tmp_path / "grpo"
    assert cli.main([*train, "--arm", "grpo", "--save-every", "1", "--eval-size", "4", "--out", str(grpo)]) == 0
    capsys.readouterr()
    assert cli.main(["diagnose", "--critic", str(grpo), "--out", str(tmp_path / "d2")]) == 2
    assert "--critic: expected a run whose arm has a critic, got" in capsys.readouterr().err
    assert cli.main(["diagnose", "--critic", str(run), "--model", str(run), "--out", str(tmp_path / "d3")]) == 2
    assert "--model: expected no policy with --critic" in capsys.readouterr().err
    assert cli.main(["diagnose", "--critic", str(tmp_path), "--out", str(tmp_path / "d4")]) == 2
    assert "--critic: expected a train run with a checkpoint" in capsys.readouterr().err
