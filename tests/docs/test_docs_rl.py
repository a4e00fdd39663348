"""docs/rl.md says what the code does: its ```python blocks run and check their claims, and
the signatures, tables and numbers it quotes are the code's (and docs/training.md's settings
table is TrainConfig's help)."""

from __future__ import annotations

import ast
import inspect
import math
import re
from pathlib import Path
from typing import Any

import pytest
from test_readme import python_blocks, skip_unless_importable

DOC = Path(__file__).resolve().parents[2] / "docs" / "rl.md"
TEXT = DOC.read_text(encoding="utf-8")
BLOCKS = python_blocks(TEXT)
#: ``name(arguments)`` in backquotes, as the doc's tables and signature write a call
CALL = re.compile(r"`(?:rl\.)?([a-z_]+)\(([^`]*)\)`")


def _arguments(text: str) -> tuple[list[str], dict[str, str]]:
    """The positional names and the ``name=default`` pairs of ``a, b, *, c=1, d=`` (an
    empty default: the doc names the keyword without its value)."""
    positional: list[str] = []
    keywords: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part or part == "*":
            continue
        name, eq, default = part.partition("=")
        if eq:
            keywords[name.strip()] = default.strip()
        else:
            positional.append(name)
    return positional, keywords


def _check_keywords(function: Any, keywords: dict[str, str], where: str) -> None:
    parameters = inspect.signature(function).parameters
    for name, default in keywords.items():
        assert name in parameters, f"docs/rl.md ({where}): {function.__name__} has no parameter {name!r}"
        if default:
            assert ast.literal_eval(default) == parameters[name].default, (
                f"docs/rl.md ({where}): {function.__name__}({name}={default}), "
                f"the code's default is {parameters[name].default!r}"
            )


def _section(title: str) -> str:
    start = TEXT.index(title)
    end = TEXT.find("\n## ", start + len(title))
    return TEXT[start : end if end != -1 else len(TEXT)]


@pytest.mark.parametrize("line, source", BLOCKS, ids=[f"docs/rl.md:{line}" for line, _ in BLOCKS])
def test_rl_doc_block_runs_and_checks_its_claims(
    line: int, source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert any(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(source))), (
        f"docs/rl.md:{line}: the example asserts nothing; state what it shows as an assert"
    )
    skip_unless_importable(source)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "rl_doc_block"}
    exec(compile("\n" * line + source, str(DOC), "exec"), namespace)  # noqa: S102 - running the doc is the point
    if "rl.policy_loss" in source:
        # the PPO step prints one line per epoch: epoch, policy loss, both clip fractions
        printed = [row.split() for row in capsys.readouterr().out.splitlines()]
        assert [row[0] for row in printed] == ["0", "1"], printed
        for row in printed:
            assert len(row) == 4 and all(math.isfinite(float(x)) for x in row[1:]), row
            assert 0.0 <= float(row[2]) <= 1.0 and 0.0 <= float(row[3]) <= 1.0, row


def test_rl_doc_has_the_ppo_step() -> None:
    assert any("rl.policy_loss" in s and "cc.gae" in s and "rl.forward" in s for _, s in BLOCKS)


def test_rl_doc_says_the_critic_never_reads_a_gates_override() -> None:
    """The block that shows it: values and critic gates equal with and without ``gates=``."""
    assert any("gates=constant" in s and "torch.equal(fixed.values, own.values)" in s for _, s in BLOCKS)
    assert "the critic then reads those gates" not in TEXT
    assert "read as given" not in TEXT


def test_rl_forward_signature_in_the_doc_is_the_codes() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from comppo_core import rl

    match = re.search(r"^rl\.forward\((.*?)\)\n\s*-> ForwardOutput\((.*?)\)$", TEXT, flags=re.MULTILINE | re.DOTALL)
    assert match, "docs/rl.md: no rl.forward signature block"
    positional, keywords = _arguments(" ".join(match.group(1).split()))
    parameters = list(inspect.signature(rl.forward).parameters)
    assert positional == parameters[: len(positional)]
    _check_keywords(rl.forward, keywords, "rl.forward")
    fields = [f.strip() for f in match.group(2).split(",")]
    assert tuple(fields) == rl.ForwardOutput._fields


def test_rl_step_table_names_the_step_functions() -> None:
    pytest.importorskip("torch")
    from comppo_core import rl

    rows = re.findall(r"^\| [a-z]+ \| `([a-z_]+)\(([^`]*)\)` \|", _section("## The step as plain functions"), re.M)
    assert [name for name, _ in rows] == [
        "step_gates",
        "score",
        "rewards_with_kl",
        "compute_advantages",
        "minibatch_loss",
    ]
    for name, arguments in rows:
        function = getattr(rl.step, name)
        positional, keywords = _arguments(arguments)
        assert len(positional) <= len(inspect.signature(function).parameters), name
        _check_keywords(function, keywords, "the step table")


def test_loss_table_defaults_are_the_codes() -> None:
    pytest.importorskip("torch")
    from comppo_core import rl

    rows = CALL.findall(_section("## Losses"))
    named = {name for name, _ in rows}
    assert {"aggregate", "policy_loss", "value_loss", "kl_penalty"} <= named
    for name, arguments in rows:
        if name in {"aggregate", "policy_loss", "value_loss", "kl_penalty"}:
            _check_keywords(getattr(rl, name), _arguments(arguments)[1], "the losses table")


def test_default_taps_as_the_doc_states() -> None:
    pytest.importorskip("torch")
    from comppo_core import rl

    match = re.search(r"`rl\.default_taps\((\d+)\) == (\([\d, ]+\))`", TEXT)
    assert match, "docs/rl.md: the default taps example is gone"
    assert rl.default_taps(int(match.group(1))) == ast.literal_eval(match.group(2))


def test_training_doc_settings_table_says_what_help_says() -> None:
    """docs/training.md's "Every setting" rows carry each field's help text (the defaults
    are checked by tests/commands/test_rl_cli.py), so a list such as --arm's cannot drift."""
    import dataclasses

    from comppo_core.rl.config import TrainConfig

    training = (DOC.parent / "training.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `--([a-z0-9-]+)` \| `[^`]*` \| (.*) \|$", training, flags=re.MULTILINE))
    for f in dataclasses.fields(TrainConfig):
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))[2:]
        assert rows.get(flag) == f.metadata["help"], f"docs/training.md: --{flag}'s meaning is not its help text"
