"""The version is written once, in Cargo.toml: ``comppo_core.__version__`` is compiled in
from it, and pyproject.toml's version is dynamic (maturin takes Cargo.toml's)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

import comppo_core as cc

ROOT = Path(__file__).resolve().parents[2]


def cargo_version() -> str:
    """``version`` of Cargo.toml's ``[package]`` table."""
    text = (ROOT / "Cargo.toml").read_text()
    package = re.search(r"^\[package\]\n(.*?)(?=^\[)", text, flags=re.S | re.M)
    assert package is not None, "Cargo.toml has no [package] table"
    version = re.search(r'^version\s*=\s*"([^"]+)"', package.group(1), flags=re.M)
    assert version is not None, "Cargo.toml's [package] has no version"
    return version.group(1)


def test_version_is_cargo_tomls() -> None:
    assert cc.__version__ == cargo_version()


def test_pyproject_takes_the_version_from_cargo_toml() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    project = re.search(r"^\[project\]\n(.*?)(?=^\[)", text, flags=re.S | re.M)
    assert project is not None
    assert re.search(r"^version\s*=", project.group(1), flags=re.M) is None, "a second copy of the version"
    assert re.search(r'^dynamic\s*=\s*\[[^]]*"version"', project.group(1), flags=re.M)


def test_installed_distribution_has_the_same_version() -> None:
    try:
        installed = importlib.metadata.version("comppo-core")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("comppo-core is not installed as a distribution (sources on the path only)")
    assert installed == cargo_version()
