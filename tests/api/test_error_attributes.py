"""Errors carry their structure (``comppo_core.errors``): ``argument``, the first offending
``row`` and ``position`` (or ``index`` for a 1-D argument, and the flat index of a packed
location), for every layer: the kernels (through ``rust/bindings.rs``), the Python
checks, Arrow (column names, rows of the column), the CLI, ``hf`` and ``rl``; ``str(e)``
is the message alone and the errors pickle with their attributes."""

from __future__ import annotations

import ast
import copy
import doctest
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ERROR_CLASSES

import comppo_core as cc
from comppo_core import errors

PACKAGE = Path(cc.__file__).parent


def raised(fn: Callable[[], Any], cls: type[cc.ComppoError]) -> cc.ComppoError:
    with pytest.raises(cls) as info:
        fn()
    assert type(info.value) is cls, f"expected {cls.__name__}, got {type(info.value).__name__}: {info.value}"
    return info.value


def attrs(e: cc.ComppoError) -> tuple[Any, ...]:
    return (e.argument, e.row, e.position, e.index)


# --------------------------------------------------------------------------- #
# The classes
# --------------------------------------------------------------------------- #


def test_the_module_example_runs() -> None:
    result = doctest.testmod(errors, raise_on_error=False)
    assert result.attempted >= 2 and result.failed == 0


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_message_alone_and_attributes_default_to_none(cls: type[cc.ComppoError]) -> None:
    e = cls("rewards: expected finite values, got NaN at (row 0, position 1)", argument="rewards", row=0, position=1)
    assert str(e) == "rewards: expected finite values, got NaN at (row 0, position 1)"
    assert e.args == ("rewards: expected finite values, got NaN at (row 0, position 1)",)
    assert attrs(e) == ("rewards", 0, 1, None)
    assert attrs(cls("gamma: bad")) == (None, None, None, None)
    with pytest.raises(TypeError):
        cls("x: y", "extra")  # type: ignore[misc]  # attributes are keywords only


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_pickle_and_copy_keep_class_message_and_attributes(cls: type[cc.ComppoError]) -> None:
    e = cls("rewards: got NaN at (row 1, position 0) [flat index 2]", argument="rewards", row=1, position=0, index=2)
    for back in (pickle.loads(pickle.dumps(e)), copy.copy(e), copy.deepcopy(e)):
        assert type(back) is cls and str(back) == str(e) and attrs(back) == ("rewards", 1, 0, 2)
    if cls is cc.DTypeError:
        assert isinstance(pickle.loads(pickle.dumps(e)), TypeError)


def test_location_is_the_kernels_format() -> None:
    assert errors.location(3, 4) == "(row 3, position 4)"
    assert errors.location(3, 4, 17) == "(row 3, position 4) [flat index 17]"


# --------------------------------------------------------------------------- #
# The kernels' errors, mapped in rust/bindings.rs
# --------------------------------------------------------------------------- #

Z = np.zeros((2, 3))


def test_kernel_nan_in_rewards_padded() -> None:
    r = np.zeros((2, 3))
    r[0, 1] = np.nan
    e = raised(lambda: cc.gae(r, Z), cc.NonFiniteError)
    assert attrs(e) == ("rewards", 0, 1, None)
    assert str(e) == "rewards: expected finite values at valid positions, got NaN at (row 0, position 1)"


def test_kernel_nan_in_rewards_packed_has_the_flat_index() -> None:
    cu = np.array([0, 3, 5])
    r = np.zeros(5)
    r[1] = np.nan  # row 0, position 1
    e = raised(lambda: cc.gae(r, np.zeros(5), cu_seqlens=cu), cc.NonFiniteError)
    assert attrs(e) == ("rewards", 0, 1, 1)
    v = np.zeros(5)
    v[4] = np.inf  # row 1, position 1
    e = raised(lambda: cc.gae(np.zeros(5), v, cu_seqlens=cu), cc.NonFiniteError)
    assert attrs(e) == ("values", 1, 1, 4)
    assert str(e).endswith("got inf at (row 1, position 1) [flat index 4]")


def test_kernel_layout_error_has_the_index() -> None:
    e = raised(lambda: cc.gae(np.zeros(5), np.zeros(5), cu_seqlens=np.array([0, 4, 3, 5])), cc.LayoutError)
    assert attrs(e) == ("cu_seqlens", None, None, 2)
    assert "first offending index 2" in str(e)


def test_kernel_masked_reward_and_gate_out_of_range() -> None:
    r = np.array([[0.0, 1.0, 0.0]])
    e = raised(lambda: cc.gae(r, np.zeros((1, 3)), mask=np.array([[True, False, True]])), cc.MaskedRewardError)
    assert attrs(e) == ("rewards", 0, 1, None)
    g = np.ones((2, 3))
    g[1, 2] = 1.5
    e = raised(lambda: cc.gae(Z, Z, gates=g), cc.OutOfRangeError)
    assert attrs(e) == ("gates", 1, 2, None)


def test_kernel_nonfinite_score_has_the_index() -> None:
    scores = np.array([1.0, 0.0, np.nan, 2.0])
    e = raised(lambda: cc.group_advantages(scores, np.array([0, 0, 1, 1])), cc.NonFiniteError)
    assert attrs(e) == ("scores", None, None, 2)


def test_kernel_nan_last_value_has_the_row() -> None:
    e = raised(lambda: cc.gae(Z, Z, last_values=np.array([0.0, np.nan])), cc.ParameterError)
    assert e.argument == "last_values" and e.row == 1 and e.position is None
    assert str(e) == "last_values: expected finite values, got NaN at row 1"


def test_kernel_set_num_threads() -> None:
    e = raised(lambda: cc.set_num_threads(0), cc.ParameterError)
    assert attrs(e) == ("n", None, None, None)


# --------------------------------------------------------------------------- #
# Python-side errors of the array API
# --------------------------------------------------------------------------- #


def test_python_side_shape_parameter_and_dtype_errors() -> None:
    assert raised(lambda: cc.gae(Z, np.zeros((2, 4))), cc.ShapeError).argument == "values"
    assert raised(lambda: cc.gae(Z, Z, gamma=2.0), cc.ParameterError).argument == "gamma"
    assert raised(lambda: cc.gae(Z, Z, masked_rewards="keep"), cc.ParameterError).argument == "masked_rewards"
    assert raised(lambda: cc.gae(np.full((2, 3), "a"), Z), cc.DTypeError).argument == "rewards"
    gates = cc.gates_from_concentration
    assert raised(lambda: gates(Z, params=cc.GateParams(normalize="z")), cc.ParameterError).argument == "normalize"
    assert raised(lambda: gates(Z, params=cc.GateParams(low=0.9, high=0.5)), cc.ParameterError).argument == "low"
    assert raised(lambda: gates(Z, params={"low": 0.5}), cc.ParameterError).argument == "params"  # type: ignore[arg-type]
    assert (
        raised(lambda: cc.gae(np.zeros(5), np.zeros(5), cu_seqlens=np.zeros((2, 2), np.int64)), cc.ShapeError).argument
        == "cu_seqlens"
    )
    assert raised(lambda: cc.group_advantages(np.zeros(3), np.zeros(2, np.int64)), cc.ShapeError).argument == "groups"
    assert raised(lambda: cc.masked_whiten(Z, eps=-1.0), cc.ParameterError).argument == "eps"
    g = np.ones((2, 3))
    g[1, 1] = np.nan
    e = raised(lambda: cc.controls.shuffle(g), cc.NonFiniteError)
    assert attrs(e) == ("gates", 1, 1, None)


def test_torch_errors() -> None:
    torch = pytest.importorskip("torch")
    e = raised(lambda: cc.gae(np.zeros((2, 3)), torch.zeros(2, 3)), cc.DTypeError)
    assert e.argument == "values"  # a tensor among NumPy arrays
    e = raised(
        lambda: cc.gae(torch.zeros(2, 3), torch.zeros(2, 3), out=(np.zeros((2, 3)), np.zeros((2, 3)))), cc.DTypeError
    )
    assert e.argument == "out"
    r = torch.zeros(2, 3)
    r[1, 2] = float("nan")
    e = raised(lambda: cc.gae(r, torch.zeros(2, 3)), cc.NonFiniteError)
    assert attrs(e) == ("rewards", 1, 2, None)


def test_every_raise_site_names_its_argument() -> None:
    """Every ``raise <package error>(...)`` in the package passes ``argument=`` (None
    where no argument is at fault), so no error leaves its attributes to chance."""
    names = {c.__name__ for c in ERROR_CLASSES} | {"ProbeError", "UnsupportedModelError"}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in names and not any(k.arg == "argument" for k in node.keywords):
                missing.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    assert not missing, "raise sites without argument=:\n" + "\n".join(missing)


# --------------------------------------------------------------------------- #
# Arrow: the column's name and the column's rows
# --------------------------------------------------------------------------- #


def _list(pa: Any, rows: list[list[float]]) -> Any:
    return pa.array(rows, pa.list_(pa.float64()))


def test_arrow_kernel_error_names_the_column_and_its_row() -> None:
    pa = pytest.importorskip("pyarrow")
    from comppo_core import arrow

    rows = [[0.0, 0.0]] * 6
    bad = [list(r) for r in rows]
    bad[4] = [0.0, float("nan")]  # row 4 of the column: chunk 2 (rows 4..5), its row 0
    t = pa.Table.from_batches(pa.table({"rewards": _list(pa, rows), "V": _list(pa, bad)}).to_batches(max_chunksize=2))
    assert t.column("V").num_chunks == 3
    e = raised(lambda: arrow.compute_advantages(t, values_col="V", row_offset=100), cc.NonFiniteError)
    assert attrs(e) == ("V", 104, 1, None)  # the chunk's flat index means nothing for the column
    assert str(e) == "column 'V' (values): expected finite values at valid positions, got NaN at (row 104, position 1)"
    assert attrs(pickle.loads(pickle.dumps(e))) == ("V", 104, 1, None)
    g = pa.chunked_array([_list(pa, [[1.0], [1.0]]), _list(pa, [[1.0], [2.0]])])
    r = _list(pa, [[0.0]] * 4)
    e = raised(lambda: arrow.gae(r, r, gates=g), cc.OutOfRangeError)
    assert attrs(e) == ("gates", 3, 0, None) and "got 2 at (row 3, position 0)" in str(e)


def test_arrow_checks_of_its_own() -> None:
    pa = pytest.importorskip("pyarrow")
    from comppo_core import arrow

    r = _list(pa, [[0.0, 0.0], [0.0, 1.0], [1.0]])
    e = raised(lambda: arrow.gae(r, _list(pa, [[0.0, 0.0], [0.0, 1.0, 2.0], [1.0]]), row_offset=10), cc.ShapeError)
    assert attrs(e) == ("values", 11, None, None)
    e = raised(lambda: arrow.gae(pa.array([[0.0], None, [1.0]], pa.list_(pa.float64())), r), cc.NonFiniteError)
    assert attrs(e) == ("rewards", 1, None, None)
    e = raised(
        lambda: arrow.gae(r, pa.array([[0.0, 0.0], [0.0, None], [1.0]], pa.list_(pa.float64()))), cc.NonFiniteError
    )
    assert attrs(e) == ("values", 1, 1, None)
    m = pa.array([[1, 1], [1, 1], [3]], pa.list_(pa.int8()))
    e = raised(lambda: arrow.gae(r, r, mask=m), cc.OutOfRangeError)
    assert attrs(e) == ("mask", 2, 0, None)
    offsets = pa.py_buffer(np.array([0, 4, 2, 6], np.int32))
    bad = pa.Array.from_buffers(pa.list_(pa.float64()), 3, [None, offsets], children=[pa.array(np.zeros(6))])
    e = raised(lambda: arrow.gae(bad, bad), cc.LayoutError)
    assert attrs(e) == ("rewards", 1, None, None)
    t = pa.table({"rewards": r, "values": r, "lv": [0.0, 0.0, float("inf")]})
    e = raised(lambda: arrow.compute_advantages(t, last_values_col="lv", row_offset=7), cc.ParameterError)
    assert attrs(e) == ("lv", 9, None, None)
    assert str(e) == "column 'lv' (last_values): expected finite values, got inf at row 9"
    e = raised(lambda: arrow.compute_advantages(pa.table({"rewards": r, "v": r})), cc.ParameterError)
    assert e.argument == "values" and e.row is None  # the missing column's name
    c = pa.chunked_array([_list(pa, [[0.1, 0.2]]), _list(pa, [[0.3], [float("nan")]])])
    e = raised(lambda: arrow.gates_from_concentration(c, params=cc.GateParams(normalize="batch")), cc.NonFiniteError)
    assert attrs(e) == ("concentration", 2, 0, None)


# --------------------------------------------------------------------------- #
# The CLI reports the error the Arrow layer raised for the file's row
# --------------------------------------------------------------------------- #


def test_cli_reports_the_row_of_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from comppo_core import arrow, cli

    rows = [[0.0, 0.0, 1.0]] * 20
    values = [list(r) for r in rows]
    values[13] = [0.0, float("nan"), 0.0]  # row group 2 (rows 10..14), its row 3
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"rewards": _list(pa, rows), "values": _list(pa, values)}), src, row_group_size=5)
    assert cli.main(["advantages", str(src), "-o", str(tmp_path / "out.parquet")]) == 2
    err = capsys.readouterr().err
    group = pq.ParquetFile(src).read_row_group(2)
    e = raised(lambda: arrow.compute_advantages(group, row_offset=10), cc.NonFiniteError)
    assert attrs(e) == ("values", 13, 1, None)
    assert err.strip() == f"comppo-core advantages: error: {src}: {e}"
    assert errors.location(e.row, e.position) in err  # type: ignore[arg-type]


def test_cli_gate_flags_are_one_gate_params(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from comppo_core import cli

    src = tmp_path / "in.parquet"
    r = _list(pa, [[0.0, 1.0]])
    pq.write_table(pa.table({"rewards": r, "values": r, "c": r}), src)
    argv = ["advantages", str(src), "-o", str(tmp_path / "o.parquet"), "--concentration-col", "c"]
    # a combination GateParams rejects is a usage error naming the flag of its .argument
    assert cli.main([*argv, "--normalize", "none", "--scale", "0"]) == 2
    assert "--scale: expected a finite number > 0, got 0.0" in capsys.readouterr().err
    assert cli.main([*argv, "--low", "0.9", "--high", "0.5"]) == 2
    assert "--low: expected low <= high (high = 0.5), got 0.9" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()


# --------------------------------------------------------------------------- #
# hf and rl
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def tiny_model(tiny_lm: Any) -> Any:
    return tiny_lm("llama", hidden=16, intermediate=32, heads=2, kv_heads=1, max_positions=32, init=None)


def test_hf_errors(tiny_model: Any) -> None:
    import torch

    from comppo_core import hf

    e = raised(lambda: hf.ConcentrationProbe(torch.nn.Linear(2, 2)), hf.UnsupportedModelError)
    assert e.argument == "model" and isinstance(e, TypeError)
    with hf.ConcentrationProbe(tiny_model) as probe:
        pass
    e = raised(lambda: probe.concentration, hf.ProbeError)
    assert attrs(e) == ("concentration", None, None, None)
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is hf.ProbeError and str(back) == str(e) and back.argument == "concentration"
    e = raised(lambda: hf.ConcentrationProbe(tiny_model, layers=[5]), cc.ParameterError)
    assert e.argument == "layers"
    ids = torch.randint(3, 32, (2, 6))
    tokens = torch.zeros(2, 6, dtype=torch.long)
    tokens[:, 3:] = 1
    e = raised(lambda: hf.comp_gae_batch(tiny_model, ids, None, tokens, torch.ones(2)), cc.ShapeError)
    assert attrs(e) == ("response_mask", None, None, None)  # a token mask; the columns are tokens[:, 1:]
    rm = tokens[:, 1:]
    rewards = torch.zeros(2, 6)
    rewards[1, 0] = 1.0  # per token: token 0 has no column
    e = raised(lambda: hf.comp_gae_batch(tiny_model, ids, None, rm, rewards), cc.MaskedRewardError)
    assert attrs(e) == ("rewards", 1, 0, None)
    e = raised(lambda: hf.comp_gae_batch(tiny_model, ids, None, rm, torch.ones(2), control="random"), cc.ParameterError)
    assert e.argument == "control"


def test_rl_errors() -> None:
    torch = pytest.importorskip("torch")
    from comppo_core.rl import losses

    x = torch.zeros(2, 3)
    e = raised(lambda: losses.policy_loss(x, x, torch.zeros(2, 4), torch.ones(2, 3)), cc.ShapeError)
    assert e.argument == "advantages"
    e = raised(lambda: losses.kl_penalty(x, x, kind="k9"), cc.ParameterError)
    assert e.argument == "kind"
