"""``comppo-core train`` and the command line of ``comppo-core compare``
(comppo_core.commands.train / .compare).

Runs are tiny (1-digit addition, a 2-layer width-32 Llama, 8 sequences a step, 2 steps),
about a second each on one thread. What is pinned: ``train`` writes its config and one
metrics row per step, lists every file it wrote, presets sit under the flags given,
``--resume`` continues a run, a stop during the critic warm-up is answered at once; bad
input exits with status 2 naming the flag; compare's help offers no flag compare refuses;
building the parser imports no torch. The experiment compare runs (its tables, its
runs, its resume) is tested in tests/experiments.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rl_tiny import TINY_SETTINGS, as_flags

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tqdm")
pytest.importorskip("matplotlib")

from comppo_core import cli
from comppo_core.rl.config import PRESETS, TrainConfig
from comppo_core.rl.runs import run_dir

TINY = as_flags({**TINY_SETTINGS, "eval_size": 8, "eval_every": 1})


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rows(path: Path) -> list[dict[str, Any]]:
    """The step rows of a ``metrics.jsonl`` (without the final evaluation's row)."""
    rs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rs if r["reward_mean"] is not None]


# ---------------------------------------------------------------------------------------------------------
# train


def test_train_writes_metrics_and_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert cli.main(["train", "--arm", "grpo", "--seed", "3", *TINY, "--actor-lr", "2e-5", "--out", str(out)]) == 0
    config = TrainConfig.from_json((out / "config.json").read_text())
    assert (config.arm, config.seed, config.actor_lr, config.steps, config.digits) == ("grpo", 3, 2e-5, 2, 1)
    rs = rows(out / "metrics.jsonl")
    assert [r["step"] for r in rs] == [0, 1]
    assert all(r["arm"] == "grpo" and r["seed"] == 3 for r in rs)
    summary = json.loads((out / "summary.json").read_text())
    printed = capsys.readouterr().out
    assert f"held-out accuracy {100 * summary['initial_eval_accuracy']:.1f}%" in printed
    assert str(out) in printed


def test_train_lists_every_file_and_folder_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The closing "wrote" line names what the run wrote: inputs.json, warmstart/ and, for an
    arm that warms its critic up, critic_warmup.jsonl too; nothing it did not write."""
    out = tmp_path / "critic"
    assert cli.main(["train", "--arm", "comppo", *TINY, "--critic-warmup", "1", "--out", str(out)]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("wrote ")]
    listed = line.removeprefix(f"wrote {out}: ").split(", ")
    expected = [
        "config.json",
        "inputs.json",
        "metrics.jsonl",
        "critic_warmup.jsonl",
        "summary.json",
        "warmstart/",
        "checkpoint/",
    ]
    assert listed == expected, line
    assert sorted(p.name + "/" * p.is_dir() for p in out.iterdir()) == sorted(expected)  # every entry, listed
    # everything a run writes is one of its entries, so --overwrite replaces all of it
    assert {p.name for p in out.iterdir()} <= set(run_dir.RUN_ENTRIES)
    out = tmp_path / "grpo"
    assert cli.main(["train", "--arm", "grpo", *TINY, "--out", str(out)]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("wrote ")]
    assert "critic_warmup.jsonl" not in line and "inputs.json, " in line and "warmstart/" in line
    listed = line.removeprefix(f"wrote {out}: ").split(", ")
    assert sorted(listed) == sorted(p.name + "/" * p.is_dir() for p in out.iterdir())


def test_a_stop_during_the_critic_warmup_is_answered_at_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Ctrl-C in the first of three warm-up rounds: the notice is on stderr at once (before
    the round's update, not once the warm-up is over), once; the run then stops before
    step 0 with a checkpoint, as before."""
    from comppo_core.rl.critics import warmup
    from comppo_core.rl.engine.trainer import Trainer
    from comppo_core.rl.runs.interrupts import GracefulStop, TrainingInterrupted

    seen: list[str] = []  # stderr at the start of each warm-up round's update, and right after the signal
    original = Trainer.update

    def update(self: Trainer, batch: Any, step_index: int, *, train_actor: bool = True) -> dict[str, Any]:
        if not train_actor:
            seen.append(capsys.readouterr().err)
            if len(seen) == 1:
                signal.raise_signal(signal.SIGINT)
                seen.append(capsys.readouterr().err)
        return original(self, batch, step_index, train_actor=train_actor)

    monkeypatch.setattr(Trainer, "update", update)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        config = TrainConfig(**{**TINY_SETTINGS, "arm": "comppo", "critic_warmup": 3, "out": str(tmp_path / "r")})
        with GracefulStop() as stop:
            trainer = Trainer(config)
            with pytest.raises(TrainingInterrupted) as info:
                trainer.train(stop=stop)
    finally:
        signal.signal(signal.SIGINT, previous)
    notice = warmup.STOP_NOTICE.format(round=1, rounds=3)
    assert notice not in seen[0]  # nothing before the stop
    assert seen[1].strip() == notice  # at once, in the round the stop came in
    assert len(seen) == 4 and all("warm-up" not in err for err in seen[2:])  # the rounds went on; said once
    assert info.value.next_step == 0 and (tmp_path / "r" / "checkpoint" / "progress.json").is_file()
    # without a stop there is no notice
    monkeypatch.setattr(Trainer, "update", original)
    with GracefulStop():
        Trainer(config.replace(out=None, critic_warmup=1))
    assert "warm-up" not in capsys.readouterr().err


def test_a_preset_sits_under_the_flags_given() -> None:
    parser = cli._build_parser()
    quick = PRESETS["quick"]
    assert quick, "the quick preset changes some defaults"
    args = parser.parse_args(["train", "--preset", "quick"])
    from comppo_core.commands.train import config_from_args

    assert config_from_args(args, args.command_parser) == TrainConfig(**quick)
    name = next(iter(quick))
    default = getattr(TrainConfig(), name)
    flag = "--" + name.replace("_", "-")
    args = parser.parse_args(["train", "--preset", "quick", flag, str(default)])
    assert getattr(config_from_args(args, args.command_parser), name) == default  # given, though equal to the default
    args = parser.parse_args(["train"])
    assert config_from_args(args, args.command_parser) == TrainConfig()
    assert TrainConfig.from_preset("default") == TrainConfig()


def test_train_resume_continues_the_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert cli.main(["train", "--arm", "comppo", *TINY, "--out", str(out)]) == 0
    assert cli.main(["train", "--resume", "--out", str(out), "--steps", "4"]) == 0
    assert [r["step"] for r in rows(out / "metrics.jsonl")] == [0, 1, 2, 3]
    assert TrainConfig.from_json((out / "config.json").read_text()).steps == 4


# ---------------------------------------------------------------------------------------------------------
# compare: the command line (the experiment itself: tests/experiments)


def test_compare_names_the_flag_of_a_bad_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", "--arms", "grpo", *TINY, "--init-from", str(tmp_path / "nowhere"), "--out", str(tmp_path / "c")]
    assert cli.main(argv) == 2
    assert re.search(r"--init-from: ", capsys.readouterr().err)


def test_resume_of_a_corrupt_config_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text('{"nope": 1}')
    assert cli.main(["train", "--out", str(tmp_path), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"--resume: {tmp_path / 'config.json'}: nope: expected a TrainConfig field" in err


# ---------------------------------------------------------------------------------------------------------
# bad input, help


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["train", "--arm", "reinforce"], r"--arm: expected one of 'grpo', 'ppo', .*got 'reinforce'"),
        (["train", "--preset", "huge"], r"--preset: invalid choice: 'huge'"),
        (["train", "--steps", "0"], r"--steps: expected an integer >= 1, got 0"),
        (["train", "--actor-lr", "fast"], r"--actor-lr: .*'fast'"),
        (["train", "--resume"], r"--resume: expected --out DIR"),
        (["train", "--arm", "grpo", "--critic-warmup", "1"], r"--critic-warmup: expected 0 for the grpo arm"),
        (["train", "--gate-low", "0.95", "--gate-high", "0.9"], r"--gate-low: "),
        (["compare", "--arms", "grpo,reinforce", "--out", "X"], r"--arms: expected arms among grpo, .*got 'reinforce'"),
        (["compare", "--arms", "grpo,grpo", "--out", "X"], r"--arms: expected each arm once, got 'grpo' twice"),
        (["compare", "--preset", "huge", "--out", "X"], r"--preset: invalid choice: 'huge'"),
        (["compare", "--seeds", "0", "--out", "X"], r"--seeds: expected a number of seeds >= 1, got '0'"),
        (["compare", "--arm", "grpo", "--out", "X"], r"--arm: not a compare flag \(the arms are --arms\)"),
        (["compare", "--seed", "1", "--out", "X"], r"--seed: not a compare flag \(the seeds are 0 … --seeds − 1\)"),
        (["compare", "--eval-split", "heldout", "--out", "X"], r"--eval-split: not a compare flag"),
        (["compare", "--arms", "grpo"], r"--out: expected the output directory"),
        (["compare", "--eval-every", "0", "--out", "X"], r"--eval-every: expected >= 1"),
        (["compare", "--gamma", "2", "--out", "X"], r"--gamma: expected a number in \[0.0, 1.0\], got 2.0"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(
    argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert re.search(named, captured.err), captured.err
    assert captured.out == ""
    assert not (tmp_path / "X").exists()  # nothing written before the settings are checked


def test_help_lists_the_training_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--preset" in text and "--actor-lr" in text and "--kl-coef" in text
    assert cli.main(["compare", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--arms" in text and "--seeds" in text and "--steps" in text


def test_compare_help_offers_no_flag_compare_refuses_and_prints_95_percent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """compare takes every train flag but --arm, --seed and --eval-split: its help lists
    the others and not those (it still refuses them: test_bad_input_exits_2_naming_the_flag);
    "95% CI" is printed as such, in compare's help and in the command list."""

    def flags(text: str) -> set[str]:
        return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))

    assert cli.main(["train", "--help"]) == 0
    train = flags(capsys.readouterr().out)
    assert cli.main(["compare", "--help"]) == 0
    text = capsys.readouterr().out
    usage, options = text.split("\noptions:\n")
    refused = {"--arm", "--seed", "--eval-split"}
    assert refused <= train
    assert not refused & flags(options) and not refused & flags(usage.split("\n\n")[0])
    assert train - refused <= flags(options)
    assert "95% CI" in " ".join(text.split()) and "%%" not in text
    assert cli.main(["--help"]) == 0
    listing = capsys.readouterr().out
    assert "95% CI" in " ".join(listing.split()) and "%%" not in listing


# ---------------------------------------------------------------------------------------------------------
# --task-option KEY=VALUE (TrainConfig.task_options)


@pytest.mark.parametrize("command", ["train", "compare", "diagnose"])
def test_task_options_gather_one_flag_per_setting(command: str) -> None:
    from comppo_core.commands.train import config_fields

    given = ["min_terms=2", "max_terms=3", 'ops=["+", "-"]', "flag=true", "word=x y", "empty=", "min_terms=4"]
    args = cli._build_parser().parse_args([command, *[a for g in given for a in ("--task-option", g)]])
    assert config_fields(args)["task_options"] == {
        "min_terms": 4,  # the later one
        "max_terms": 3,
        "ops": ["+", "-"],  # JSON when it parses
        "flag": True,
        "word": "x y",  # else the string
        "empty": "",
    }
    assert "task_options" not in config_fields(cli._build_parser().parse_args([command]))  # not given: the default


def test_task_options_reach_the_config_and_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("reasoning_gym")
    from comppo_core.commands.train import config_from_args

    argv = ["train", "--task", "reasoning_gym:chain_sum", "--model", str(tmp_path), "--task-option", "min_terms=3"]
    args = cli._build_parser().parse_args(argv)
    config = config_from_args(args, args.command_parser)
    assert config.task_options == {"min_terms": 3}
    assert cli.main([*argv, "--task-option", "min_term=2"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"--task-option: expected a setting of reasoning_gym:chain_sum \(min_terms=2, max_terms=6", err)
    assert cli.main(["train", "--task-option", "min_terms=2"]) == 2
    assert "--task-option: expected none for the task 'addition'" in capsys.readouterr().err
    assert cli.main([*argv[:5], "--task-option", "min_terms"]) == 2
    assert "argument --task-option: expected KEY=VALUE, got 'min_terms'" in capsys.readouterr().err


def test_building_the_parser_imports_no_torch() -> None:
    code = "import sys\nfrom comppo_core import cli\ncli._build_parser()\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "False"


def test_training_doc_lists_every_field_with_its_default() -> None:
    import dataclasses

    doc = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    documented = dict(re.findall(r"^\| `--([a-z0-9-]+)` \| `([^`]*)` \|", doc, flags=re.MULTILINE))
    from comppo_core.rl.config import field_default

    for f in dataclasses.fields(TrainConfig):
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))[2:]
        assert flag in documented, f"docs/training.md: no row for --{flag}"
        assert documented[flag] == repr(field_default(f)), (
            f"docs/training.md: --{flag} default {documented[flag]} != {field_default(f)!r}"
        )


def test_a_model_without_a_preset_starts_from_the_pretrained_preset_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from comppo_core.commands.train import config_from_args

    def config(*flags: str) -> Any:
        args = cli._build_parser().parse_args(["train", *flags, "--out", "o"])
        return config_from_args(args, args.command_parser)

    got = config("--model", "m", "--task", "add.jsonl")
    said = capsys.readouterr().out
    assert (
        (got.actor_lr, got.ppo_epochs, got.num_minibatches)
        == (1e-5, 1, 1)
        == tuple(PRESETS["pretrained"][k] for k in ("actor_lr", "ppo_epochs", "num_minibatches"))
    )
    assert "the pretrained preset, since --model is given without --preset" in said and "--actor-lr 1e-05" in said
    mine = config("--model", "m", "--task", "add.jsonl", "--actor-lr", "3e-6")  # a flag given wins, and is not listed
    assert mine.actor_lr == 3e-6 and mine.ppo_epochs == 1 and "--actor-lr" not in capsys.readouterr().out
    toy = config("--model", "m", "--task", "add.jsonl", "--preset", "default")
    assert (toy.actor_lr, toy.ppo_epochs) == (TrainConfig().actor_lr, TrainConfig().ppo_epochs)
    assert capsys.readouterr().out == ""
    assert config().actor_lr == TrainConfig().actor_lr  # the built-in model: the defaults, nothing said
    assert capsys.readouterr().out == ""
