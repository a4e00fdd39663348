"""docs/architecture.md and docs/claims.md name only code and tests that exist.

The map names code in two forms, each in backticks: a file path (``rl/engine/trainer.py``,
relative to ``python/comppo_core/`` or to the repository) optionally followed by the names
it defines (``rl/core/step.py: step_gates, score``; ``Class.method`` for a method), and a
dotted module path (``comppo_core.rl.tasks``). Every path must be a file or package, every
name a top-level definition (``def``, ``class`` or assignment) of that file, or a method
or attribute of a class there. A test named ``tests/x/test_y.py::test_z`` must be a
top-level test function of that file. A rename that forgets the map or the claims fails here.
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
#: the documents whose references are checked (the map, and the abstract's claims against the code)
DOCS = (DOC, ROOT / "docs" / "claims.md")

#: `path.py` or `path.py: name, name` inside backticks
FILE_REF = re.compile(r"`((?:[\w.]+/)*[\w]+\.(?:py|rs|pyi))(?::\s*([\w.,\s]+))?`")
#: `comppo_core.a.b` inside backticks
MODULE_REF = re.compile(r"`(comppo_core(?:\.\w+)+)`")
#: `tests/.../test_x.py::test_name` inside backticks
TEST_REF = re.compile(r"`(tests/(?:[\w.]+/)*test_\w+\.py)::(\w+)`")


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


def _file_refs(doc: Path | None = None) -> list[tuple[str, list[str]]]:
    refs = []
    for d in DOCS if doc is None else (doc,):
        for m in FILE_REF.finditer(d.read_text(encoding="utf-8")):
            names = [n.strip() for n in (m.group(2) or "").split(",") if n.strip()]
            refs.append((m.group(1), names))
    return refs


def _test_refs() -> list[tuple[str, str]]:
    return sorted({(m.group(1), m.group(2)) for d in DOCS for m in TEST_REF.finditer(d.read_text(encoding="utf-8"))})


def test_the_map_names_code() -> None:
    # each document is not empty of references (a reformatting that broke the patterns fails here)
    for doc in DOCS:
        assert len(_file_refs(doc)) >= 30, doc.name
    assert len(MODULE_REF.findall(DOC.read_text(encoding="utf-8"))) >= 1
    assert len(_test_refs()) >= 30


@pytest.mark.parametrize(("path", "name"), _test_refs(), ids=lambda x: x)
def test_every_named_test_exists(path: str, name: str) -> None:
    source = ROOT / path
    assert source.is_file(), f"the docs name {path}, which is not a file"
    assert name in _definitions(source), f"the docs name {path}::{name}, which that file does not define"


@pytest.mark.parametrize("path, names", _file_refs(), ids=lambda x: x if isinstance(x, str) else ",".join(x))
def test_every_file_and_name_exists(path: str, names: list[str]) -> None:
    source = _resolve(path)
    assert source is not None, f"the docs name {path}, which is not a file"
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


# -- the layers: architecture.md's tables against the import-linter contracts of pyproject.toml --------

#: `path.py` or `folder/` at the start of a backticked span (a layer's module or package)
LAYER_PATH = re.compile(r"`((?:\w+/)*\w+(?:\.py|/))")


def _contracts() -> dict[str, dict]:
    """pyproject.toml's import-linter contracts by id (tomllib: Python >= 3.11)."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def _layers(contract: dict) -> list[set[str]]:
    """A layers contract's layers, top first, each the set of its module names (relative to the container)."""
    return [{m.strip().strip("()") for m in re.split(r"[:|]", layer)} for layer in contract["layers"]]


def _table(heading: str) -> list[list[str]]:
    """The cells of the rows of the Markdown table whose header row starts with ``heading``."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _modules(cell: str) -> set[str]:
    """The modules and packages of comppo_core a table cell names, as dotted names relative to the
    package, without those inside another one it names (``hf/`` and ``hf/lm.py``: ``hf``)."""
    found = set()
    for path in LAYER_PATH.findall(cell):
        if (PACKAGE / path).exists():
            found.add(path.removesuffix("/").removesuffix(".py").replace("/", "."))
    return {m for m in found if not any(m.startswith(other + ".") for other in found)}


def test_the_import_contracts_hold() -> None:
    """lint-imports on the contracts of pyproject.toml (CI runs the command too)."""
    pytest.importorskip("importlinter")
    import importlinter.api  # noqa: F401  (configures import-linter, as its command does)
    from importlinter.application.use_cases import lint_imports

    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True), (
        "an import breaks the layers of docs/architecture.md (the report above)"
    )


def test_the_layer_table_is_the_contracts_layers() -> None:
    """Each row of the layer table (lowest first) names exactly the modules of one layer of the
    `layers` contract (top first), and the array API's row is what the torch-free contract covers."""
    contracts = _contracts()
    layers = _layers(contracts["layers"])
    rows = [(row[0], _modules(row[1])) for row in _table("| layer | where |")]
    python_rows = [(name, modules) for name, modules in rows if modules]  # not the Rust kernels
    assert [name for name, _ in rows if not _] == ["Rust kernels"]
    assert [modules for _, modules in python_rows] == layers[::-1], (
        "docs/architecture.md's layer table and pyproject.toml's `layers` contract list different layers"
    )
    array_api = dict(python_rows)["array API"]
    torch_free = {m.removeprefix("comppo_core.") for m in contracts["array-api-torch-free"]["source_modules"]}
    assert torch_free == array_api


def test_the_rl_table_follows_the_rl_layers() -> None:
    """The rl table names every module of rl/ and lists the folders bottom-up in the order of the
    `rl-layers` contract (an independent pair in either order)."""
    layers = _layers(_contracts()["rl-layers"])[::-1]
    rank = {name: i for i, layer in enumerate(layers) for name in layer}
    named = [path for row in _table("| folder | module |") for path in LAYER_PATH.findall(row[1])]
    children = list(dict.fromkeys(path.split("/")[1].removesuffix(".py") for path in named))
    assert set(children) == set(rank), "the rl table and the rl-layers contract name different parts of rl"
    ranks = [rank[c] for c in children]
    assert ranks == sorted(ranks), f"the rl table's order {children} is not the rl-layers contract's, bottom-up"
    modules = {p.relative_to(PACKAGE).as_posix() for p in (PACKAGE / "rl").rglob("*.py") if p.name != "__init__.py"}
    assert modules <= set(named), f"the rl table omits {sorted(modules - set(named))}"
