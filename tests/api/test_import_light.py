"""``import comppo_core`` needs only NumPy: torch, transformers and the rl layer load on
demand. Reading a training config, and the ``train``/``compare`` commands' flags, help and
errors, need no torch either; a run without the ``[rl]`` extra stops with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "tqdm", "matplotlib", "pyarrow", "ray")


def loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return {name.split(".")[0] for name in out.split()}


def test_import_comppo_core_loads_no_heavy_dependency() -> None:
    loaded = loaded_after("import comppo_core as cc; cc.gae([[1.0, 0.0]], [[0.5, 0.5]])")
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_the_rl_layer_loads_torch_and_transformers() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    loaded = loaded_after("from comppo_core import rl; rl.Trainer")
    assert {"torch", "transformers"} <= loaded


def test_a_training_config_needs_no_torch() -> None:
    """TrainConfig validates every field against comppo_core.options, not the torch
    modules that use the values."""
    loaded = loaded_after(
        "from comppo_core.rl.config import TrainConfig\n"
        "c = TrainConfig.from_json(TrainConfig(arm='grpo', kl_kind='low_var_kl').to_json())\n"
        "assert c.gate_params.low == 0.9"
    )
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def cli_after(argv: list[str], block: tuple[str, ...] = ()) -> tuple[int, str, set[str]]:
    """``comppo_core.cli.main(argv)`` in a fresh interpreter where the modules ``block``
    cannot be imported: its exit status, its stderr and the top-level modules loaded."""
    code = (
        "import sys\n"
        f"for name in {block!r}: sys.modules[name] = None  # import name -> ImportError\n"
        "from comppo_core import cli\n"
        f"status = cli.main({argv!r})\n"
        "print(status, ' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    status, _, modules = done.stdout.strip().rpartition("\n")[2].partition(" ")
    return int(status), done.stderr, {name.split(".")[0] for name in modules.split()}


@pytest.mark.parametrize(
    ("argv", "status", "says"),
    [
        (["train", "--help"], 0, ""),
        (["compare", "--help"], 0, ""),
        (["train", "--arm", "foo"], 2, "--arm: expected one of 'grpo', 'ppo', "),
        (
            ["train", "--gate-normalize", "rows"],
            2,
            "--gate-normalize: expected one of 'causal', 'sequence', 'batch', 'none'",
        ),
        (["compare", "--arms", "grpo,foo", "--out", "X"], 2, "--arms: expected arms among grpo, "),
        (["synthetic", "--help"], 0, ""),
    ],
)
def test_the_training_commands_parse_and_check_without_torch(argv: list[str], status: int, says: str) -> None:
    got, err, loaded = cli_after(argv)
    assert got == status, err
    assert says in err
    assert "torch" not in loaded and "transformers" not in loaded, sorted(loaded & set(HEAVY))


@pytest.mark.parametrize("command", ["train", "compare"])
def test_without_the_rl_extra_a_run_stops_with_one_line(command: str, tmp_path: Path) -> None:
    """Flags are still checked first (exit 2); a valid run without torch exits 1 with the
    one-line install hint, before writing anything."""
    out = str(tmp_path / "run")
    status, err, _ = cli_after([command, "--out", out], block=("torch", "transformers"))
    assert status == 1, err
    assert err == f"comppo-core: error: comppo-core {command} needs the [rl] extra: pip install 'comppo-core[rl]'\n"
    assert not (tmp_path / "run").exists()
    status, err, _ = cli_after([command, "--steps", "0", "--out", out], block=("torch",))
    assert status == 2 and "--steps: expected an integer >= 1, got 0" in err
    status, _, _ = cli_after(["synthetic", "--help"], block=("torch", "transformers"))
    assert status == 0
