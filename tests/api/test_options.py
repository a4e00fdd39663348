"""``comppo_core.options``: every closed set of option values is defined there once, the
modules that offered a set re-export that very object, and one check with one message
(``check_choice``) refuses a value outside a set, wherever it is checked."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

import pytest

import comppo_core as cc
from comppo_core import options

PACKAGE = Path(cc.__file__).parent
SETS = {name: getattr(options, name) for name in options.__all__ if name.isupper()}

#: Re-exports not yet the options' object (each would be an xfail(strict) below); none left.
PENDING: set[tuple[str, str]] = set()

#: (module, public name, the options set it must be)
REEXPORTS = [
    ("comppo_core.outcomes", "GROUP_METHODS", "GROUP_METHODS"),
    ("comppo_core.testing", "GROUP_METHODS", "GROUP_METHODS"),
    ("comppo_core.testing.checks", "GROUP_METHODS", "GROUP_METHODS"),
    ("comppo_core.gate_params", "NORMALIZE_MODES", "NORMALIZE_MODES"),
    ("comppo_core.rl.config", "KL_MODES", "KL_MODES"),
    ("comppo_core.rl.core.losses", "AGG_MODES", "AGG_MODES"),
    ("comppo_core.rl.core.losses", "KL_KINDS", "KL_KINDS"),
    ("comppo_core.rl.critics.tac", "TEMPORAL_MIXERS", "TEMPORAL_MIXERS"),
    ("comppo_core.rl", "TEMPORAL_MIXERS", "TEMPORAL_MIXERS"),
    ("comppo_core.hf.statistics", "STATISTICS", "STATISTICS"),
    ("comppo_core.hf.statistics", "METHODS", "STATISTIC_METHODS"),
    ("comppo_core.hf.statistics", "PRECISIONS", "PRECISIONS"),
    ("comppo_core.hf", "STATISTICS", "STATISTICS"),
    ("comppo_core.hf", "METHODS", "STATISTIC_METHODS"),
    ("comppo_core.hf.pipeline", "CONTROLS", "CONTROLS"),
    ("comppo_core.hf", "CONTROLS", "CONTROLS"),
]

NEEDS_TORCH = ("comppo_core.rl", "comppo_core.hf")


def _module(name: str) -> ModuleType:
    if name.startswith(NEEDS_TORCH):
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    if name.startswith("comppo_core.testing"):
        pytest.importorskip("hypothesis")
    return importlib.import_module(name)


@pytest.mark.parametrize(
    ("module", "name", "option"),
    [
        pytest.param(*r, marks=pytest.mark.xfail(strict=True, reason=f"{r[0]} still defines its own {r[1]}"))
        if r[:2] in PENDING
        else r
        for r in REEXPORTS
    ],
    ids=[f"{m}.{n}" for m, n, _ in REEXPORTS],
)
def test_a_set_offered_elsewhere_is_the_options_object(module: str, name: str, option: str) -> None:
    assert getattr(_module(module), name) is SETS[option]


def _every_module() -> list[ModuleType]:
    """Every module of the package that imports here (the optional dependencies decide)."""
    found = [cc]
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="comppo_core."):
        try:
            found.append(importlib.import_module(info.name))
        except ImportError:  # an optional dependency is missing
            continue
    return found


def test_no_module_defines_a_set_of_its_own() -> None:
    """A tuple (or mapping) equal to one of the options' sets, anywhere in the package, is
    that set itself: no module spells a set out again."""
    copies = set()
    for module in _every_module():
        for name, value in vars(module).items():
            if not isinstance(value, (tuple, MappingProxyType, dict)) or module is options:
                continue
            for the_set in SETS.values():
                if type(value) is type(the_set) and value == the_set and value is not the_set:
                    copies.add((module.__name__, name))
    assert copies <= PENDING, sorted(copies - PENDING)


def test_the_arm_names_are_the_arms() -> None:
    arms = _module("comppo_core.rl.core.arms")
    assert tuple(arms.ARMS) == options.ARM_NAMES


def test_options_imports_only_the_standard_library_and_errors() -> None:
    tree = ast.parse((PACKAGE / "options.py").read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            imported.add("." * node.level + module if node.level else module.split(".")[0])
    assert imported - set(sys.stdlib_module_names) == {".errors"}, imported
    assert cc.options is options and "options" in cc.__all__


def test_every_set_is_a_tuple_of_distinct_strings() -> None:
    for name, the_set in SETS.items():
        members = list(the_set)
        assert members and all(isinstance(m, str) for m in members), name
        assert len(set(members)) == len(members), name
        assert isinstance(the_set, tuple) or name == "KL_KINDS", name
    assert set(options.KL_KINDS.values()) <= set(options.KL_KINDS)  # every estimator is a name too
    assert options.CONTROLS == ("none", *options.GATE_CONTROLS)


def test_check_choice() -> None:
    assert options.check_choice("method", "rloo", options.GROUP_METHODS) == "rloo"
    assert options.check_choice("kind", "mse", options.KL_KINDS) == "mse"  # a mapping: its keys
    for bad in ("RLOO", None, 3, ["grpo"]):
        with pytest.raises(cc.ParameterError) as info:
            options.check_choice("method", bad, options.GROUP_METHODS)
        assert info.value.argument == "method"
        assert str(info.value) == f"method: expected one of 'grpo', 'drgrpo', 'rloo', 'reinforce_baseline', got {bad!r}"


def _refusal(call: Any) -> cc.ParameterError:
    with pytest.raises(cc.ParameterError) as info:
        call()
    return info.value


@pytest.mark.parametrize(
    ("argument", "choices", "call"),
    [
        ("method", "GROUP_METHODS", lambda: cc.group_advantages([1.0, 2.0], [0, 0], method="ppo")),
        ("singleton", "SINGLETON_MODES", lambda: cc.group_advantages([1.0], [0], singleton="one")),
        ("method", "GROUP_METHODS", lambda: cc.reference.group_advantages([1.0, 2.0], [0, 0], method="ppo")),
        ("masked_rewards", "MASKED_REWARD_MODES", lambda: cc.gae([[1.0]], [[0.0]], masked_rewards="keep")),
        ("masked_rewards", "MASKED_REWARD_MODES", lambda: cc.reference.gae([[1.0]], [[0.0]], masked_rewards="keep")),
        ("normalize", "NORMALIZE_MODES", lambda: cc.GateParams(normalize="rows")),
    ],
)
def test_the_array_api_refuses_with_the_one_message(argument: str, choices: str, call: Any) -> None:
    e = _refusal(call)
    allowed = ", ".join(map(repr, SETS[choices]))
    assert e.argument == argument and str(e).startswith(f"{argument}: expected one of {allowed}, got ")


def test_the_training_config_refuses_with_the_one_message() -> None:
    from comppo_core.rl.config import TrainConfig

    for field, choices in (
        ("arm", "ARM_NAMES"),
        ("group_method", "GROUP_METHODS"),
        ("statistic", "STATISTICS"),
        ("loss_agg", "AGG_MODES"),
        ("kl_kind", "KL_KINDS"),
        ("kl_mode", "KL_MODES"),
        ("tac_temporal", "TEMPORAL_MIXERS"),
        ("gate_normalize", "NORMALIZE_MODES"),
    ):
        e = _refusal(lambda field=field: TrainConfig(**{field: "nope"}))
        allowed = ", ".join(map(repr, SETS[choices]))
        assert e.argument == field and str(e) == f"{field}: expected one of {allowed}, got 'nope'"
    e = _refusal(lambda: TrainConfig.from_preset("huge"))
    assert (
        e.argument == "preset"
        and str(e) == "preset: expected one of 'default', 'quick', 'demo', 'pretrained', got 'huge'"
    )


def test_the_torch_layers_refuse_with_the_one_message() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from comppo_core import rl

    x = torch.zeros(2, 3)
    for argument, choices, call in (
        ("mode", "AGG_MODES", lambda: rl.aggregate(x, x > 0, mode="mean")),
        ("kind", "KL_KINDS", lambda: rl.kl_penalty(x, x, kind="k4")),
        ("temporal", "TEMPORAL_MIXERS", lambda: rl.TransportAlignedCritic(8, 2, temporal="lstm")),
    ):
        e = _refusal(call)
        allowed = ", ".join(map(repr, SETS[choices]))
        assert e.argument == argument and str(e).startswith(f"{argument}: expected one of {allowed}, got "), e
