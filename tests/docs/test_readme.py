"""Every ```python block of README.md runs, as written.

Each block is executed on its own, in a fresh namespace and an empty working
directory. A block that defines ``test_*`` functions is a complete pytest file (the
README says so), so those functions are called too. A block that imports an optional
dependency (torch, transformers, pyarrow, ray, hypothesis), directly or through the
``comppo_core`` module that needs it, is skipped when that dependency is missing.
Shell blocks (```bash) and output listings (```) are not run.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
OPTIONAL = frozenset({"torch", "transformers", "pyarrow", "ray", "hypothesis"})
MAX_LINES = 350
BLOCK_MODULE = "readme_block"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line of the opening fence, source)`` of every ```python block, in order."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        fence = lines[i].rstrip("\n")
        if fence.startswith("```"):
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].rstrip("\n") != "```":
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise AssertionError(f"README.md:{start}: the code block opened here is never closed")
            if fence == "```python":
                blocks.append((start, "".join(body)))
        i += 1
    return blocks


def imported_modules(source: str) -> list[str]:
    """The dotted names a block imports, including ``from pkg import submodule``."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            for alias in node.names:
                try:
                    spec = importlib.util.find_spec(f"{node.module}.{alias.name}")
                except (ImportError, ValueError):
                    spec = None
                if spec is not None:
                    names.append(f"{node.module}.{alias.name}")
    return names


def missing_optional(exc: BaseException) -> str | None:
    """The optional dependency whose absence caused ``exc``, if any (following the
    chain: ``comppo_core.testing`` re-raises a missing Hypothesis with install advice)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ModuleNotFoundError) and (seen.name or "").split(".")[0] in OPTIONAL:
            return (seen.name or "").split(".")[0]
        seen = seen.__cause__ or seen.__context__
    return None


def skip_unless_importable(source: str) -> None:
    """Imports what the code imports; skips when an optional dependency is missing."""
    for name in imported_modules(source):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = missing_optional(exc)
            if missing is None:
                raise
            pytest.skip(f"needs {missing}, which is not installed (importing {name})")


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


@pytest.mark.parametrize("line, source", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_block_runs(line: int, source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_unless_importable(source)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": BLOCK_MODULE}
    # The block's own line numbers in tracebacks: pad so line k of the file is line k.
    code = compile("\n" * line + source, str(README), "exec")
    exec(code, namespace)  # noqa: S102 - running the README is the point
    for name, obj in list(namespace.items()):
        if name.startswith("test_") and inspect.isfunction(obj) and obj.__module__ == BLOCK_MODULE:
            assert not inspect.signature(obj).parameters, (
                f"README.md:{line}: {name} takes arguments (fixtures are not supported)"
            )
            obj()


def test_readme_has_python_blocks() -> None:
    """The extraction finds the README's examples (a broken fence would hide them all)."""
    assert len(BLOCKS) >= 4, f"found {len(BLOCKS)} ```python blocks in README.md"
    assert any("def test_" in source for _, source in BLOCKS), "no complete pytest file among the README's blocks"


def test_readme_stays_short() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; at most {MAX_LINES} (details belong in docs/)"


def test_python_blocks_finds_blocks_and_their_lines() -> None:
    text = "intro\n```bash\necho hi\n```\n```python\nx = 1\n```\n```\noutput\n```\n```python\ny = 2\nz = 3\n```\n"
    assert python_blocks(text) == [(5, "x = 1\n"), (11, "y = 2\nz = 3\n")]
    with pytest.raises(AssertionError, match="never closed"):
        python_blocks("```python\nx = 1\n")
