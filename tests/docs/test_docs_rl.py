"""Every ```python block of docs/rl.md runs as written (the PPO step from one's own loop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_readme import python_blocks, skip_unless_importable

DOC = Path(__file__).resolve().parents[2] / "docs" / "rl.md"
BLOCKS = python_blocks(DOC.read_text(encoding="utf-8"))


@pytest.mark.parametrize("line, source", BLOCKS, ids=[f"docs/rl.md:{line}" for line, _ in BLOCKS])
def test_rl_doc_block_runs(line: int, source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_unless_importable(source)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "rl_doc_block"}
    exec(compile("\n" * line + source, str(DOC), "exec"), namespace)  # noqa: S102 - running the doc is the point


def test_rl_doc_has_the_ppo_step() -> None:
    assert any("rl.policy_loss" in s and "cc.gae" in s and "rl.forward" in s for _, s in BLOCKS)
