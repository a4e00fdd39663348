"""Every program under examples/ runs to completion, as a user would run it.

Each example runs in its own interpreter (``python -W error examples/X.py``, from an
empty working directory), so it imports only what it says it imports and any warning
fails it. An example that imports an optional dependency (torch, transformers, pyarrow,
ray, hypothesis), directly or through the ``comppo_core`` module that needs it, is
skipped when that dependency is missing. examples/ holds nothing but these programs and
``accelerate/``, the launch configurations of the TRL example (each a YAML mapping), and
``paper/``, the paper-scale recipe (tested by tests/examples/test_paper_recipe.py), and ``verl/``,
the verl recipe's GPU launch script (its overrides composed by tests/integrations/verl_recipe/test_verl_config.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import skip_unless_importable  # the README's blocks follow the same rule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROGRAMS = sorted(EXAMPLES.glob("*.py"))

#: a line each example prints when it has done its job
EXPECTED = {
    "check_my_gae.py": "my_buggy_gae is caught:",
    "pipeline.py": "GRPO per response:",
    "ppo_loop.py": "epoch 1: policy loss",
    "trl_comppo.py": "CompPOTrainer trained",
}
#: the accelerate configurations docs/trl.md launches the TRL example with
ACCELERATE_CONFIGS = ("ddp.yaml", "fsdp2.yaml", "zero3.yaml")


@pytest.mark.slow
@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_example_runs(program: Path, tmp_path: Path) -> None:
    skip_unless_importable(program.read_text(encoding="utf-8"))
    done = subprocess.run(
        [sys.executable, "-W", "error", str(program)], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{program.name} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert EXPECTED[program.name] in done.stdout, done.stdout


def test_examples_are_the_programs_users_copy() -> None:
    names = sorted(p.name for p in EXAMPLES.iterdir() if not p.name.startswith(".") and p.name != "__pycache__")
    assert names == sorted([*EXPECTED, "accelerate", "paper", "verl"]), (
        "examples/ holds only the programs in EXPECTED, accelerate/, paper/ and verl/"
    )
    configs = sorted(p.name for p in (EXAMPLES / "accelerate").iterdir())
    assert configs == sorted(ACCELERATE_CONFIGS)
    yaml = pytest.importorskip("yaml")
    for name in configs:
        config = yaml.safe_load((EXAMPLES / "accelerate" / name).read_text(encoding="utf-8"))
        assert isinstance(config, dict) and "distributed_type" in config, name


def test_the_trl_docs_script_is_the_example_that_runs() -> None:
    """docs/trl.md's "complete script" is examples/trl_comppo.py without its docstring, so the
    script a reader copies is the one test_example_runs runs (on CPU)."""
    doc = (EXAMPLES.parent / "docs" / "trl.md").read_text(encoding="utf-8")
    section = doc[doc.index("## A complete script") :]
    block = section[section.index("```python\n") + len("```python\n") : section.index("\n```\n")] + "\n"
    source = (EXAMPLES / "trl_comppo.py").read_text(encoding="utf-8")
    code = source[source.index('"""', 3) + 3 :].lstrip("\n")
    assert block == code, "docs/trl.md's complete script differs from examples/trl_comppo.py"
