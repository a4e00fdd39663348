"""CHANGELOG.md has a section per version: ``## [Unreleased]`` first, then
``## [X.Y.Z] - YYYY-MM-DD`` (or ``- unreleased``) newest first, one of them Cargo.toml's
version, so that a version bump without its changelog section fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = re.compile(r"^## (.*)$", re.M)
VERSION_HEADING = re.compile(r"^\[(\d+)\.(\d+)\.(\d+)(?:-[0-9A-Za-z.]+)?\] - (\d{4}-\d{2}-\d{2}|unreleased)$")


def cargo_version() -> str:
    package = re.search(r"^\[package\]\n(.*?)(?=^\[)", (ROOT / "Cargo.toml").read_text(), re.S | re.M)
    assert package is not None
    version = re.search(r'^version\s*=\s*"([^"]+)"', package.group(1), re.M)
    assert version is not None
    return version.group(1)


def headings() -> list[str]:
    return HEADING.findall((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))


def test_unreleased_comes_first_then_versions_newest_first() -> None:
    found = headings()
    assert found and found[0] == "[Unreleased]", f"the first section must be [Unreleased], not {found[:1]}"
    versions = []
    for heading in found[1:]:
        match = VERSION_HEADING.match(heading)
        assert match, f"CHANGELOG.md: {heading!r} is not `[X.Y.Z] - YYYY-MM-DD` (or `- unreleased`)"
        versions.append(tuple(int(part) for part in match.groups()[:3]))
    assert versions == sorted(versions, reverse=True), "versions must be newest first"
    assert len(set(versions)) == len(versions), "a version has two sections"


def test_cargo_tomls_version_has_a_section() -> None:
    version = cargo_version()
    assert any(h.startswith(f"[{version}] - ") for h in headings()), (
        f"CHANGELOG.md has no `## [{version}] - ...` section for Cargo.toml's version"
    )
