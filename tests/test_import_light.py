"""``import comppo_core`` needs only NumPy: torch, transformers and the rl layer load on demand."""

from __future__ import annotations

import subprocess
import sys

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
    loaded = loaded_after("from comppo_core import rl")
    assert {"torch", "transformers"} <= loaded
