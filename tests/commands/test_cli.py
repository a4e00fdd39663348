"""The ``comppo-core`` command line (``comppo_core.cli``)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import comppo_core
from comppo_core import cli
from comppo_core.commands import synthetic

HEADER = re.compile(r"^\s*position\s+reward\s+value\s+concentration\s+gate\s+GAE adv\s+Comp-GAE adv\s*$")


def _table_rows(out: str) -> np.ndarray:
    """The synthetic command's table data rows as a float array [n, 7]."""
    lines = out.splitlines()
    starts = [i for i, line in enumerate(lines) if HEADER.match(line)]
    assert len(starts) == 1, out
    i = starts[0]
    assert set(lines[i + 1]) == {"-"}
    rows = []
    for line in lines[i + 2 :]:
        fields = line.split()
        if len(fields) != 7 or not fields[0].isdigit():
            break
        rows.append([float(f) for f in fields])
    return np.array(rows)


def test_synthetic_batch_is_well_formed() -> None:
    data = synthetic.synthetic_batch(3, 16, 50)
    rewards, values, mask, conc, lengths = data
    assert rewards.shape == values.shape == mask.shape == conc.shape == (16, 50)
    assert mask.dtype == np.bool_
    assert lengths.shape == (16,)
    assert np.all((lengths >= 25) & (lengths <= 50))
    np.testing.assert_array_equal(mask.sum(axis=1), lengths)
    np.testing.assert_array_equal(mask, np.arange(50)[None, :] < lengths[:, None])  # right padding
    assert np.all(rewards[~mask] == 0)
    rows = np.arange(16)
    assert set(np.unique(rewards[rows, lengths - 1])) <= {-1.0, 1.0}
    assert np.count_nonzero(rewards) == 16  # one outcome reward per response, nowhere else
    assert np.all(np.abs(values) <= 1.0)
    assert np.all((conc >= 0) & (conc <= 1))
    assert conc[mask].std() > 0.1  # the gates must vary visibly
    for a in data:
        assert np.all(np.isfinite(a))


def test_synthetic_batch_is_deterministic() -> None:
    a = synthetic.synthetic_batch(7, 5, 40)
    b = synthetic.synthetic_batch(7, 5, 40)
    c = synthetic.synthetic_batch(8, 5, 40)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.values, c.values)


def test_synthetic_batch_tiny() -> None:
    rewards, _, mask, _, lengths = synthetic.synthetic_batch(0, 3, 1)
    np.testing.assert_array_equal(lengths, [1, 1, 1])
    assert mask.all()
    assert np.all(np.abs(rewards) == 1)


def test_synthetic_table_matches_library(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["synthetic", "--batch", "8", "--length", "64", "--tokens", "5"]) == 0
    out = capsys.readouterr().out
    table = _table_rows(out)
    assert table.shape == (5, 7)

    rewards, values, mask, conc, lengths = synthetic.synthetic_batch(0, 8, 64)
    n0 = int(lengths[0])
    assert f"length {n0} of 64" in out
    pos = table[:, 0].astype(int)
    np.testing.assert_array_equal(pos, np.arange(n0 - 5, n0))  # the last 5 valid tokens

    gates = comppo_core.gates_from_concentration(conc, mask=mask, params=comppo_core.GateParams(low=0.5, high=1.0))
    plain = comppo_core.gae(rewards, values, mask=mask, gamma=1.0, lam=0.95)
    comp = comppo_core.gae(rewards, values, mask=mask, gates=gates, gamma=1.0, lam=0.95)
    expected = np.stack(
        [
            rewards[0, pos],
            values[0, pos],
            conc[0, pos],
            gates[0, pos],
            plain.advantages[0, pos],
            comp.advantages[0, pos],
        ],
        axis=1,
    )
    np.testing.assert_allclose(table[:, 1:], expected, rtol=0, atol=6e-5)
    gate_col = table[:, 4]
    assert np.all((gate_col >= 0.5 - 1e-4) & (gate_col <= 1.0 + 1e-4))
    assert table[-1, 1] in (-1.0, 1.0)  # the outcome reward sits on the last token
    np.testing.assert_array_equal(table[:-1, 1], 0.0)

    assert "tokens/s" in out and "speedup" in out
    m = re.search(r"max \|Δ advantages\| = (\S+), max \|Δ returns\| = (\S+)", out)
    assert m is not None
    assert float(m.group(1)) < 1e-5 and float(m.group(2)) < 1e-5
    assert f"get_num_threads() = {comppo_core.get_num_threads()}" in out


def test_synthetic_options(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["synthetic", "--batch", "3", "--length", "20", "--row", "2", "--tokens", "100"]
    argv += ["--gamma", "0.9", "--lam", "1", "--low", "0.2", "--high", "0.3", "--seed", "5", "--repeats", "1"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    table = _table_rows(out)
    lengths = synthetic.synthetic_batch(5, 3, 20).lengths
    assert table.shape == (int(lengths[2]), 7)  # --tokens larger than the response: all of it
    assert np.all((table[:, 4] >= 0.2 - 1e-4) & (table[:, 4] <= 0.3 + 1e-4))


def test_no_subcommand_prints_help_and_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    captured = capsys.readouterr()
    assert "demo" in captured.err and "usage" in captured.err


def test_help_returns_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
    assert cli.main(["synthetic", "--help"]) == 0
    assert "--batch" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["synthetic", "--batch", "0"],
        ["synthetic", "--batch", "4", "--row", "4"],
        ["synthetic", "--gamma", "1.5"],
        ["synthetic", "--lam", "nan"],
        ["synthetic", "--low", "0.9", "--high", "0.5"],
        ["bogus"],
    ],
)
def test_bad_arguments_return_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_module_runs_as_script() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "comppo_core.cli", "synthetic", "--batch", "4", "--length", "32"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert any(HEADER.match(line) for line in proc.stdout.splitlines())
    assert "speedup" in proc.stdout
