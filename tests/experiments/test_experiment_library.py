"""The experiment machinery as a library (comppo_core.experiments): typed settings, the
package's errors instead of a parser's, no torch on import, and an experiment run by a
call, without the command line.

The refusals are checked without torch (they come before anything trains); the one run
is the tiny run of ``rl_tiny`` (a second or two).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rl_tiny import TINY_SETTINGS

from comppo_core.errors import ParameterError
from comppo_core.experiments import protocol, settings, tuning
from comppo_core.experiments.grid import parse_grid
from comppo_core.experiments.protocol import Experiment, run_experiment
from comppo_core.experiments.settings import CompareSettings
from comppo_core.rl.config import TrainConfig

#: every module of the package, as the directory lists them
MODULES = tuple(sorted(f.stem for f in Path(protocol.__file__).parent.glob("*.py") if f.stem != "__init__"))
ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_library_imports_no_torch_and_no_command() -> None:
    """Every module of comppo_core.experiments imports without torch (it is imported when a
    run trains) and without the command line (comppo_core.commands, argparse's parsers)."""
    code = (
        "import sys\n"
        + "".join(f"import comppo_core.experiments.{m}\n" for m in MODULES)
        + "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'comppo_core.commands', "
        "'comppo_core.cli'))]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    package = ROOT / "python" / "comppo_core" / "experiments"
    assert sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__") == sorted(MODULES)
    for path in package.glob("*.py"):
        source = path.read_text(encoding="utf-8")
        assert "import argparse" not in source and "from ..commands" not in source, path.name


def tiny(out: Path | None, **changes: object) -> TrainConfig:
    return TrainConfig(
        **{**TINY_SETTINGS, "eval_size": 8, "eval_every": 1, "out": None if out is None else str(out)}
    ).replace(**changes)


@pytest.mark.parametrize(
    ("given", "base", "argument", "message"),
    [
        ({"arms": ("grpo", "reinforce")}, {}, "arms", "arms: expected arms among grpo, "),
        ({"arms": ("grpo", "grpo")}, {}, "arms", "arms: expected each arm once, got 'grpo' twice"),
        ({"arms": ()}, {}, "arms", "arms: expected at least one arm"),
        ({"seeds": 0}, {}, "seeds", "seeds: expected a number of seeds >= 1, got 0"),
        ({"jobs": 0}, {}, "jobs", "jobs: expected a number of processes >= 1, got 0"),
        ({"tuning_seeds": 2}, {}, "tuning_seeds", "tuning_seeds: only with --grid"),
        ({"grid": "lam=1", "seeds": 1001}, {}, "seeds", "seeds: expected at most 1000 with --grid"),
        ({"grid": "lam=1", "tuning_seeds": 0}, {}, "tuning_seeds", "tuning_seeds: expected a number of tuning"),
        ({"grid": "lam=1", "validation_fraction": 0.0}, {}, "validation_fraction", "validation_fraction: expected > 0"),
        ({}, {"eval_every": 0}, "eval_every", "eval_every: expected >= 1 (compare reports"),
        ({}, {"out": None}, "out", "out: expected the output directory DIR, got none"),
        ({"arms": ("comppo", "grpo")}, {"critic_warmup": 1}, "critic_warmup", "expected 0 for the grpo arm"),
        ({"grid": "actor_lr=1e-4,-1"}, {}, "grid", "grid: point p1 (actor_lr=-1.0) with arm grpo: actor_lr: expected"),
    ],
)
def test_a_bad_setting_is_a_parameter_error_naming_it(
    tmp_path: Path, given: dict[str, object], base: dict[str, object], argument: str, message: str
) -> None:
    """No parser, no SystemExit: a ParameterError whose ``argument`` names the setting
    and whose message starts with it; nothing is written."""
    out = tmp_path / "cmp"
    given = {"arms": ("grpo",), **given}
    if isinstance(given.get("grid"), str):
        given["grid"] = parse_grid([str(given["grid"])])
    arms = given["arms"]
    first = arms[0] if arms and arms[0] != "reinforce" else "grpo"  # type: ignore[index]
    config = tiny(out, arm=first).replace(**base)
    with pytest.raises(ParameterError) as info:
        Experiment(CompareSettings(base=config, **given))  # type: ignore[arg-type]
    assert info.value.argument == argument
    assert message in str(info.value), str(info.value)
    assert not out.exists()


def test_the_protocol_defaults_are_resolved() -> None:
    plain = CompareSettings(base=tiny(Path("x")), arms=("ppo", "grpo")).resolved()
    assert plain.n_seeds == settings.DEFAULT_SEEDS and plain.tuning_seed_list == []
    assert (plain.base.arm, plain.base.seed, plain.base.validation_fraction) == ("ppo", 0, 0.0)
    grid = CompareSettings(base=tiny(Path("x")), grid=parse_grid(["lam=1"])).resolved()
    assert grid.n_seeds == tuning.DEFAULT_REPORTING_SEEDS
    assert grid.tuning_seed_list == tuning.tuning_seeds(tuning.DEFAULT_TUNING_SEEDS)
    assert grid.base.validation_fraction == tuning.DEFAULT_VALIDATION_FRACTION
    given = CompareSettings(base=tiny(Path("x")), grid=parse_grid(["lam=1"]), validation_fraction=0.2).resolved()
    assert given.base.validation_fraction == 0.2
    assert settings.parse_arms(" grpo, comppo ") == ("grpo", "comppo")
    assert "comppo_oracle" not in settings.DEFAULT_ARMS and set(settings.OWN_FIELDS) == {"arm", "seed", "eval_split"}
    # the uncertainty gates are baselines a user names: the default compare stays the paper's nine arms
    assert not {"comppo_policy_entropy", "comppo_token_nll"} & set(settings.DEFAULT_ARMS)
    assert len(settings.DEFAULT_ARMS) == 9


def test_an_out_that_cannot_take_the_experiment_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(ParameterError, match="out: expected a directory, got") as info:
        Experiment(CompareSettings(base=tiny(file), arms=("grpo",)))
    assert info.value.argument == "out"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"arm": "grpo", "seed": 0, "steps": 2}))
    with pytest.raises(ParameterError, match="holds a run of comppo-core train"):
        Experiment(CompareSettings(base=tiny(run), arms=("grpo",)))
    cmp = tmp_path / "cmp"
    cmp.mkdir()
    (cmp / "compare.json").write_text(json.dumps({"settings": protocol.runs.settings_of(tiny(cmp))}))
    with pytest.raises(ParameterError, match="already holds a compare") as info:
        Experiment(CompareSettings(base=tiny(cmp), arms=("grpo",)))
    assert info.value.argument == "out"
    with pytest.raises(ParameterError, match="overwrite: expected --resume or --overwrite, not both"):
        Experiment(CompareSettings(base=tiny(cmp), arms=("grpo",), resume=True, overwrite=True))
    with pytest.raises(ParameterError, match="steps: the runs in --out have steps=2, got 3") as info:
        Experiment(CompareSettings(base=tiny(cmp, steps=3), arms=("grpo",), resume=True))
    assert info.value.argument == "steps"
    Experiment(CompareSettings(base=tiny(cmp), arms=("grpo",), resume=True))  # the same settings: taken
    Experiment(CompareSettings(base=tiny(cmp, steps=3), arms=("grpo",), overwrite=True))
    with pytest.raises(ParameterError, match="warm_starts: expected the directory of a compare") as info:
        Experiment(CompareSettings(base=tiny(tmp_path / "new"), arms=("grpo",), warm_starts=tmp_path / "nowhere"))
    assert info.value.argument == "warm_starts"
    assert not (tmp_path / "new").exists()


def test_an_experiment_is_checked_before_torch_is_imported(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from comppo_core.errors import ParameterError\n"
        "from comppo_core.experiments.protocol import Experiment\n"
        "from comppo_core.experiments.settings import CompareSettings\n"
        "from comppo_core.rl.config import TrainConfig\n"
        f"e = Experiment(CompareSettings(base=TrainConfig(out={str(tmp_path / 'ok')!r}), arms=('grpo', 'comppo')))\n"
        "assert len(e.configs) == 6 and e.source is None\n"
        "try:\n"
        f"    Experiment(CompareSettings(base=TrainConfig(out={str(tmp_path / 'x')!r}, init_from='/nowhere')))\n"
        "except ParameterError as exc:\n"
        "    assert exc.argument == 'init_from', exc\n"
        "else:\n"
        "    raise AssertionError('not refused')\n"
        "assert 'torch' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "ok").exists()


@pytest.mark.usefixtures("one_torch_thread")
def test_run_experiment_runs_and_writes_the_results_without_the_command_line(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    out = tmp_path / "cmp"
    lines: list[str] = []
    config = CompareSettings(base=tiny(out), arms=("grpo", "ppo"), seeds=1)
    result = run_experiment(config, say=lines.append)
    assert result.out == out and result.chosen == {} and result.interaction is None
    assert set(result.summaries) == {("grpo", 0), ("ppo", 0)}
    assert [p.name for p in result.written] == ["results.md", "results.json", "curves.png"]
    assert all(p.is_file() for p in result.written) and result.table in (out / "results.md").read_text()
    assert lines[0] == "compare: 2 runs of 2 steps, 1 at a time; the time left is estimated after the first run"
    assert lines[1].startswith("[seed 0] warm start ") and lines[2].startswith("[1/2] grpo seed 0: held-out accuracy")
    assert re.search(r"\(\d+ s; about \d+ (s|min) left\)$", lines[2]), lines[2]  # the estimate after a run
    assert not lines[3].endswith("left)"), lines[3]  # none after the last
    record = json.loads((out / "compare.json").read_text())
    assert record["arms"] == ["grpo", "ppo"] and record["seeds"] == 1 and record["grid"] is None
    # a bad task file found only when a run is built is a ParameterError too, not a parser's exit
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1=", "answer": 2\n')
    with pytest.raises(ParameterError) as info:
        run_experiment(CompareSettings(base=tiny(tmp_path / "other", task=str(bad)), arms=("grpo",), seeds=1))
    assert info.value.argument is not None
    # resumed, every run is reused
    lines.clear()
    again = run_experiment(dataclasses.replace(config, resume=True), say=lines.append)
    assert sum("(reused)" in line for line in lines) == 3 and again.table == result.table
