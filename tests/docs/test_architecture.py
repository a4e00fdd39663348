"""docs/architecture.md names only code that exists.

The map names code in two forms, each in backticks: a file path (``rl/engine/trainer.py``,
relative to ``python/comppo_core/`` or to the repository) optionally followed by the names
it defines (``rl/core/step.py: step_gates, score``; ``Class.method`` for a method), and a
dotted module path (``comppo_core.rl.tasks``). Every path must be a file or package, every
name a top-level definition (``def``, ``class`` or assignment) of that file, or a method
or attribute of a class there. A rename that forgets the map fails here.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "comppo_core"
DOC = ROOT / "docs" / "architecture.md"

#: `path.py` or `path.py: name, name` inside backticks
FILE_REF = re.compile(r"`((?:[\w.]+/)*[\w]+\.(?:py|rs|pyi))(?::\s*([\w.,\s]+))?`")
#: `comppo_core.a.b` inside backticks
MODULE_REF = re.compile(r"`(comppo_core(?:\.\w+)+)`")


def _resolve(path: str) -> Path | None:
    for base in (PACKAGE, ROOT, ROOT / "rust"):
        if (base / path).is_file():
            return base / path
    return None


def _definitions(source: Path) -> dict[str, set[str]]:
    """Top-level names of a Python file -> the names defined inside each class."""
    tree = ast.parse(source.read_text(encoding="utf-8"))
    names: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = set()
        elif isinstance(node, ast.ClassDef):
            inner = set()
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    inner.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    inner.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    inner |= {t.id for t in item.targets if isinstance(t, ast.Name)}
            names[node.name] = inner
        elif isinstance(node, ast.Assign):
            names.update({t.id: set() for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
    return names


def _file_refs() -> list[tuple[str, list[str]]]:
    text = DOC.read_text(encoding="utf-8")
    refs = []
    for m in FILE_REF.finditer(text):
        names = [n.strip() for n in (m.group(2) or "").split(",") if n.strip()]
        refs.append((m.group(1), names))
    return refs


def test_the_map_names_code() -> None:
    # the map is not empty of references (a reformatting that broke the patterns fails here)
    assert len(_file_refs()) >= 30
    assert len(MODULE_REF.findall(DOC.read_text(encoding="utf-8"))) >= 1


@pytest.mark.parametrize("path, names", _file_refs(), ids=lambda x: x if isinstance(x, str) else ",".join(x))
def test_every_file_and_name_exists(path: str, names: list[str]) -> None:
    source = _resolve(path)
    assert source is not None, f"docs/architecture.md names {path}, which is not a file"
    if not names or source.suffix != ".py":
        return
    defined = _definitions(source)
    for name in names:
        owner, _, member = name.partition(".")
        assert owner in defined, f"docs/architecture.md: {path} defines no {owner}"
        if member:
            assert member in defined[owner], f"docs/architecture.md: {path}: {owner} has no {member}"


def _find(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent that is a module, not a package
        return None
    return None if spec is None or spec.origin is None else Path(spec.origin)


@pytest.mark.parametrize("module", sorted(set(MODULE_REF.findall(DOC.read_text(encoding="utf-8")))))
def test_every_module_exists(module: str) -> None:
    parts = module.split(".")
    # the longest prefix that is a module; the next part must be a name defined in it
    for i in range(len(parts), 0, -1):
        source = _find(".".join(parts[:i]))
        if source is not None:
            break
    else:
        pytest.fail(f"docs/architecture.md names {module}, which is no module")
    if i < len(parts):
        defined = _definitions(source)
        assert parts[i] in defined, f"docs/architecture.md: {'.'.join(parts[:i])} defines no {parts[i]}"
