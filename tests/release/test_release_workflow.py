"""The release workflow (.github/workflows/release.yml) builds what RELEASING.md says it
builds, tests every wheel it builds, and publishes only from a tag, by trusted publishing.

The workflow cannot run here; these tests read it. They pin: the wheel matrix equals
RELEASING.md's platform table and covers the promised platforms; each wheel and the sdist
is installed and tested; a ``v*`` tag triggers the ``publish`` job, which needs every
build, holds the only ``id-token: write`` and stores no token; the version the tag is
checked against, and the one scripts/build_wheels.sh names its files by, is Cargo.toml's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
RELEASING = ROOT / "RELEASING.md"
BUILD_SCRIPT = ROOT / "scripts" / "build_wheels.sh"

#: what the project promises wheels for: (platform, target, wheel tag)
PROMISED = {
    ("linux-x86_64", "x86_64", "manylinux2014"),
    ("linux-aarch64", "aarch64", "manylinux2014"),
    ("musllinux-x86_64", "x86_64", "musllinux_1_2"),
    ("musllinux-aarch64", "aarch64", "musllinux_1_2"),
    ("macos-x86_64", "x86_64", "macosx"),
    ("macos-arm64", "aarch64", "macosx"),
    ("windows-x86_64", "x64", "win_amd64"),
}


def workflow() -> dict[Any, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def triggers(wf: dict[Any, Any]) -> dict[str, Any]:
    """The ``on:`` table (YAML 1.1 reads the bare key ``on`` as True)."""
    on = wf.get("on", wf.get(True))
    assert isinstance(on, dict), "release.yml has no `on:` table"
    return on


def wheel_tag(entry: dict[str, str]) -> str:
    """The platform tag a matrix entry's wheel gets."""
    manylinux = entry.get("manylinux")
    if manylinux is not None:
        return f"manylinux{manylinux}" if manylinux.isdigit() else manylinux
    if entry["runner"].startswith("macos"):
        return "macosx"
    if entry["runner"].startswith("windows"):
        return "win_amd64" if entry["target"] == "x64" else f"win_{entry['target']}"
    raise AssertionError(f"{entry}: a Linux runner without a manylinux/musllinux tag")


def matrix() -> list[dict[str, str]]:
    entries = workflow()["jobs"]["wheels"]["strategy"]["matrix"]["include"]
    assert isinstance(entries, list) and entries
    return entries


def documented_platforms() -> set[tuple[str, str, str, str]]:
    """RELEASING.md's table: (platform, runner, target, wheel tag) rows."""
    text = RELEASING.read_text(encoding="utf-8")
    header = "| platform | runner | target | wheel tag |"
    assert header in text, f"RELEASING.md has no table headed {header!r}"
    rows = set()
    for line in text.split(header, 1)[1].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == 4, f"RELEASING.md: malformed row {line!r}"
        rows.add((cells[0], cells[1], cells[2], cells[3]))
    return rows


def run_lines(job: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_the_wheel_matrix_is_the_documented_table() -> None:
    built = {(e["platform"], e["runner"], e["target"], wheel_tag(e)) for e in matrix()}
    assert len(built) == len(matrix()), "a platform appears twice in the matrix"
    assert built == documented_platforms()


def test_every_promised_platform_has_a_wheel() -> None:
    built = {(e["platform"], e["target"], wheel_tag(e)) for e in matrix()}
    assert PROMISED <= built, f"no wheel for {sorted(PROMISED - built)}"


def test_every_wheel_and_the_sdist_is_installed_and_tested() -> None:
    jobs = workflow()["jobs"]
    steps = jobs["wheels"]["steps"]
    for entry in matrix():
        tested = [s for s in steps if s.get("if") == f"matrix.test == '{entry['test']}'" and "run" in s]
        assert tested, f"{entry['platform']}: no test step runs for test={entry['test']!r}"
        script = "\n".join(s["run"] for s in tested)
        assert "--no-index --find-links dist comppo-core" in script, "the test must install the built wheel"
        assert "python -m pytest" in script
        assert "site-packages" in script, "the test must check that comppo_core is the installed one"
    sdist = run_lines(jobs["sdist"])
    assert "pip install dist/*.tar.gz" in sdist and "python -m pytest" in sdist
    # at the lowest supported Python: pyproject.toml's requires-python
    lowest = re.search(r'^requires-python\s*=\s*">=(\d+\.\d+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert lowest is not None
    assert workflow()["env"]["TEST_PYTHON"] == lowest.group(1)


def test_a_tag_publishes_with_trusted_publishing_after_every_build() -> None:
    wf = workflow()
    assert "v*" in triggers(wf)["push"]["tags"]
    assert wf["permissions"] == {"contents": "read"}, "the workflow's default token must be read-only"
    jobs = wf["jobs"]
    publish = jobs["publish"]
    assert publish["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert set(publish["needs"]) == set(jobs) - {"publish"}, "publish must wait for every build"
    assert publish["permissions"] == {"id-token": "write"}
    assert publish["environment"]["name"] == "pypi"
    uses = [s for s in publish["steps"] if str(s.get("uses", "")).startswith("pypa/gh-action-pypi-publish@")]
    assert len(uses) == 1
    assert not set(uses[0].get("with") or {}) & {"password", "user"}, "trusted publishing stores no token"
    others = [name for name, job in jobs.items() if name != "publish" and "id-token" in (job.get("permissions") or {})]
    assert not others, f"only publish may mint an OIDC token, not {others}"
    assert "secrets." not in WORKFLOW.read_text(encoding="utf-8")


def cargo_version() -> str:
    package = re.search(r"^\[package\]\n(.*?)(?=^\[)", (ROOT / "Cargo.toml").read_text(), re.S | re.M)
    assert package is not None
    version = re.search(r'^version\s*=\s*"([^"]+)"', package.group(1), re.M)
    assert version is not None
    return version.group(1)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("where", ["publish", "build_wheels.sh"])
def test_the_shell_reads_cargo_tomls_version(where: str) -> None:
    """The tag check in ``publish`` and the file names in scripts/build_wheels.sh read the
    version with the same ``sed``; run it on the real Cargo.toml."""
    if where == "publish":
        text = run_lines(workflow()["jobs"]["publish"])
    else:
        text = BUILD_SCRIPT.read_text(encoding="utf-8")
    line = re.search(r"^\s*(?:version|VERSION)=(\$\(sed .*\))$", text, re.M)
    assert line is not None, f"{where}: no version=$(sed ...) line"
    out = subprocess.run(["bash", "-c", f"echo {line.group(1)}"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == cargo_version()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_build_script_parses() -> None:
    subprocess.run(["bash", "-n", str(BUILD_SCRIPT)], check=True)
    if shutil.which("shellcheck") is not None:
        out = subprocess.run(["shellcheck", str(BUILD_SCRIPT)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout
