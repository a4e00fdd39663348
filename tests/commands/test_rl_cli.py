"""``comppo-core train`` and ``comppo-core compare`` (comppo_core.commands.train / .compare).

Runs are tiny (1-digit addition, a 2-layer width-32 Llama, 8 sequences a step, 2 steps),
about a second each on one thread. What is pinned: ``train`` writes its config and one
metrics row per step, presets sit under the flags given, ``--resume`` continues a run;
``compare`` warms each seed up once and starts every arm of it from those parameters,
writes a results table whose numbers are the runs' own (mean and Student-t CI over
seeds, paired differences) and a PNG; bad input exits with status 2 naming the flag;
building the parser imports no torch.
"""

from __future__ import annotations

import json
import math
import re
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
from comppo_core.commands import compare
from comppo_core.rl.config import PRESETS, TrainConfig
from comppo_core.rl.tasks.addition import AdditionTask

TINY = as_flags({**TINY_SETTINGS, "eval_size": 8, "eval_every": 1})


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny policy never solves a problem; scoring an even response length as correct
    gives the rollouts and the held-out accuracy numbers that vary between runs."""

    def parity(self: AdditionTask, problem: Any, response: str, finished: bool) -> float:
        return float(len(response) % 2 == 0)

    monkeypatch.setattr(AdditionTask, "score", parity)


def rows(path: Path) -> list[dict[str, Any]]:
    """The step rows of a ``metrics.jsonl`` (without the final evaluation's row)."""
    rs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rs if r["reward_mean"] is not None]


def parse_table(text: str) -> dict[str, dict[str, str]]:
    """The first markdown table of ``text`` as {arm: {column: cell}} (duplicate headers get
    the previous header's name as a prefix: "vs grpo 95% CI")."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    names = []
    for i, h in enumerate(header):
        names.append(f"{header[i - 1]} {h}" if h == "95% CI" and i > 3 else h)
    assert set(lines[1].replace("|", "")) <= {"-"}
    table = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) != len(names):
            break
        table[cells[0]] = dict(zip(names, cells))
    return table


def interval(cell: str) -> tuple[float, float]:
    m = re.fullmatch(r"\[([+-]?\d+\.\d), ([+-]?\d+\.\d)\]", cell)
    assert m, cell
    return float(m.group(1)), float(m.group(2))


# ---------------------------------------------------------------------------------------------------------
# statistics


@pytest.mark.parametrize(
    ("df", "expected"),
    [(3, 3.182446305), (4, 2.776445105), (10, 2.228138852), (30, 2.042272456)],  # printed t tables
)
def test_t_quantile_matches_the_table(df: int, expected: float) -> None:
    assert compare.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-8)
    assert compare.t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-8)


@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_closed_forms(p: float) -> None:
    """df = 1 (Cauchy): t = tan(π(p − ½)); df = 2: t = (2p − 1) / √(2p(1 − p))."""
    assert compare.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
    assert compare.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)
    assert compare.t_cdf(math.tan(math.pi * (p - 0.5)), 1) == pytest.approx(p, abs=1e-13)


def test_t_quantile_tends_to_the_normal() -> None:
    assert compare.t_quantile(0.975, 1e7) == pytest.approx(1.959963985, abs=1e-6)
    assert compare.t_quantile(0.5, 5) == pytest.approx(0.0, abs=1e-12)


def test_mean_ci() -> None:
    mean, half = compare.mean_ci([1.0, 2.0, 3.0])  # s = 1, n = 3
    assert mean == 2.0
    assert half == pytest.approx(4.302652730 / math.sqrt(3), abs=1e-9)
    assert compare.mean_ci([0.4]) == (0.4, None)
    assert compare.mean_ci([0.5, 0.5]) == (0.5, 0.0)


def test_results_table_numbers() -> None:
    final = {"grpo": {0: 0.50, 1: 0.40}, "comppo": {0: 0.60, 1: 0.44}}
    warm = {0: 0.45, 1: 0.35}
    text, numbers = compare.results_table(final, warm)
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
# compare


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
        mean, half = compare.mean_ci(finals)
        assert table[arm]["seeds"] == "2"
        assert float(table[arm]["accuracy %"]) == pytest.approx(100 * mean, abs=0.051)
        lo, hi = interval(table[arm]["95% CI"])
        assert half is not None
        assert lo == pytest.approx(100 * (mean - half), abs=0.051)
        assert hi == pytest.approx(100 * (mean + half), abs=0.051)
        gain = compare.mean_ci([f - warm[s] for s, f in zip((0, 1), finals)])[0]
        assert float(table[arm]["vs warm start"]) == pytest.approx(100 * gain, abs=0.051)
    acc = {key: summary["final_eval_accuracy"] for key, summary in summaries.items()}
    diff = compare.mean_ci([acc["comppo", s] - acc["grpo", s] for s in (0, 1)])[0]
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


def test_building_the_parser_imports_no_torch() -> None:
    code = "import sys\nfrom comppo_core import cli\ncli._build_parser()\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "False"


def test_training_doc_lists_every_field_with_its_default() -> None:
    import dataclasses

    doc = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    documented = dict(re.findall(r"^\| `--([a-z0-9-]+)` \| `([^`]*)` \|", doc, flags=re.MULTILINE))
    for f in dataclasses.fields(TrainConfig):
        flag = f.name.replace("_", "-")
        assert flag in documented, f"docs/training.md: no row for --{flag}"
        assert documented[flag] == repr(f.default), (
            f"docs/training.md: --{flag} default {documented[flag]} != {f.default!r}"
        )
