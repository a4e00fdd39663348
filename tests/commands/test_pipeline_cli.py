"""``comppo-core advantages IN.parquet -o OUT.parquet``: streamed Comp-GAE over Parquet files.

Parquet files are generated here, with several row groups so that row indices in error
messages must be counted across row-group boundaries.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from comppo_core import GateParams, arrow, cli  # noqa: E402

ROWS = 60
GROUP = 7  # rows per row group: 9 row groups, the last one short


def make_table(seed: int = 0, rows: int = ROWS, nan_at: tuple[int, int] | None = None) -> pa.Table:
    """Responses with passthrough columns (id, prompt), list columns rewards / values /
    mask / concentration / gates and a last_values column. Every row has >= 2 tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 30, size=rows)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    n = int(cu[-1])
    mask = rng.random(n) > 0.15
    rewards = np.zeros(n, np.float32)
    last = cu[1:] - 1
    mask[last] = True
    rewards[last] = rng.choice([-1.0, 1.0], size=rows)
    values = rng.uniform(-1, 1, n).astype(np.float32)
    if nan_at is not None:
        row, pos = nan_at
        mask[cu[row] + pos] = True
        values[cu[row] + pos] = np.nan

    def lists(x: np.ndarray) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array(cu.astype(np.int32)), pa.array(x))

    return pa.table(
        {
            "id": np.arange(rows),
            "prompt": [f"prompt {i // 4}" for i in range(rows)],
            "rewards": lists(rewards),
            "values": lists(values),
            "mask": lists(mask),
            "concentration": lists(rng.random(n).astype(np.float32)),
            "gates": lists(rng.uniform(0.6, 1.0, n).astype(np.float32)),
            "last_values": rng.uniform(-0.5, 0.5, rows),
        }
    )


def write(path: Path, table: pa.Table, group: int = GROUP) -> Path:
    pq.write_table(table, path, row_group_size=group)
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_no_leftovers(directory: Path, *keep: str) -> None:
    assert sorted(p.name for p in directory.iterdir()) == sorted(keep)


# --------------------------------------------------------------------------- #
# Results
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "options, kwargs",
    [
        ([], {}),
        (["--gates-col", "gates", "--lam-critic", "1.0"], {"gates_col": "gates", "lam_critic": 1.0}),
        (
            ["--concentration-col", "concentration", "--low", "0.4", "--high", "0.95", "--sharpness", "2", "--invert"],
            {
                "concentration_col": "concentration",
                "gate_params": GateParams(low=0.4, high=0.95, sharpness=2.0, invert=True),
            },
        ),
        (
            ["--no-mask", "--no-last-values", "--masked-rewards", "drop"],
            {"mask_col": None, "last_values_col": None, "masked_rewards": "drop"},
        ),
    ],
)
def test_output_equals_the_in_memory_computation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], kwargs: dict[str, Any]
) -> None:
    table = make_table()
    src = write(tmp_path / "in.parquet", table)
    dst = tmp_path / "out.parquet"
    code, out, err = run_cli(capsys, "advantages", src, "-o", dst, "--gamma", "0.99", "--lam", "0.95", *options)
    assert code == 0, err
    assert err == ""  # no progress bar when stderr is not a terminal
    assert f"wrote {dst}: {ROWS} rows" in out
    got = pq.read_table(dst)
    want = arrow.compute_advantages(pq.read_table(src), gamma=0.99, lam=0.95, **kwargs)
    assert got.column_names == [*table.column_names, "advantages", "returns"]
    for name in got.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    # one output row group per input row group
    assert pq.ParquetFile(dst).num_row_groups == pq.ParquetFile(src).num_row_groups == 9
    # the result is real Comp-GAE: it differs from plain GAE when gates are used
    if "gates_col" in kwargs or "concentration_col" in kwargs:
        plain = arrow.compute_advantages(pq.read_table(src), gamma=0.99, lam=0.95)
        assert got.column("advantages").to_pylist() != plain.column("advantages").to_pylist()
    assert_no_leftovers(tmp_path, "in.parquet", "out.parquet")


def test_writer_options_skip_float_dictionaries_and_statistics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write(tmp_path / "in.parquet", make_table())
    dst = tmp_path / "out.parquet"
    assert run_cli(capsys, "advantages", src, "-o", dst, "-q", "--compression", "zstd")[0] == 0
    rg = pq.ParquetFile(dst).metadata.row_group(0)
    cols = {rg.column(j).path_in_schema: rg.column(j) for j in range(rg.num_columns)}
    for path in ("rewards.list.element", "values.list.element", "advantages.list.element", "returns.list.element"):
        assert cols[path].statistics is None or not cols[path].statistics.has_min_max, path
        assert "RLE_DICTIONARY" not in cols[path].encodings, path
        assert cols[path].compression == "ZSTD"
    assert "RLE_DICTIONARY" in cols["prompt"].encodings and cols["prompt"].statistics.has_min_max
    assert cols["id"].statistics.has_min_max


def test_batch_normalization_spans_the_whole_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--normalize batch z-scores over every valid token of the file (a first pass), not
    per row group: equal, to rounding, to one in-memory call on the whole table."""
    src = write(tmp_path / "in.parquet", make_table(1))
    dst = tmp_path / "out.parquet"
    code, _, err = run_cli(
        capsys,
        "advantages",
        src,
        "-o",
        dst,
        "--concentration-col",
        "concentration",
        "--normalize",
        "batch",
        "--low",
        "0.2",
        "--sharpness",
        "3",
        "-q",
    )
    assert code == 0, err
    whole = pq.read_table(src).combine_chunks()
    kw: dict[str, Any] = dict(
        concentration_col="concentration", gate_params=GateParams(normalize="batch", low=0.2, sharpness=3.0)
    )
    want = arrow.compute_advantages(whole, **kw)  # one chunk: the kernel's own batch z-score
    got = pq.read_table(dst)
    a = np.asarray(got.column("advantages").combine_chunks().flatten())
    b = np.asarray(want.column("advantages").combine_chunks().flatten())
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    per_group = pa.concat_tables(
        [arrow.compute_advantages(pq.ParquetFile(src).read_row_group(i), **kw) for i in range(9)]
    )
    c = np.asarray(per_group.column("advantages").combine_chunks().flatten())
    assert np.max(np.abs(c - b)) > 1e-3  # per-row-group statistics would differ


def test_streams_row_group_by_row_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is read only through read_row_group, one group at a time, and a group
    is read only once the group before it has been written."""
    src = write(tmp_path / "in.parquet", make_table(2, rows=100), group=5)  # 20 row groups
    dst = tmp_path / "out.parquet"
    events: list[tuple[str, int]] = []
    written = [0]
    real_read, real_write = pq.ParquetFile.read_row_group, pq.ParquetWriter.write_table

    def read_row_group(self: Any, i: int, *a: Any, **kw: Any) -> Any:
        events.append(("read", i))
        assert written[0] == i, f"row group {i} read with {written[0]} written"
        return real_read(self, i, *a, **kw)

    def write_table(self: Any, table: Any, *a: Any, **kw: Any) -> None:
        assert table.num_rows == 5
        real_write(self, table, *a, **kw)
        written[0] += 1

    def forbidden(*a: Any, **kw: Any) -> None:
        raise AssertionError("the whole file must not be read")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", read_row_group)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    monkeypatch.setattr(pq.ParquetFile, "read", forbidden)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", forbidden)
    monkeypatch.setattr(pq, "read_table", forbidden)
    code, _, err = run_cli(capsys, "advantages", src, "-o", dst, "-q")
    assert code == 0, err
    assert events == [("read", i) for i in range(20)]
    assert written[0] == 20


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write(tmp_path / "in.parquet", make_table(3))
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert cli.main(["advantages", str(src), "-o", str(tmp_path / "a.parquet")]) == 0
    text = term.getvalue()
    assert text.count("\r") == 9 and text.endswith("\n")
    last = text.rstrip("\n").split("\r")[-1]
    assert "100.0%" in last and "row group 9/9" in last and f"{ROWS:,} rows" in last and "tokens/s" in last
    term2 = _Terminal()
    monkeypatch.setattr(sys, "stderr", term2)
    assert cli.main(["advantages", str(src), "-o", str(tmp_path / "b.parquet"), "--quiet"]) == 0
    assert term2.getvalue() == ""
    assert capsys.readouterr().out.count("wrote") == 1  # the summary of the first run only


# --------------------------------------------------------------------------- #
# Errors: exit status 1 (2 for usage), a clear message, no partial output
# --------------------------------------------------------------------------- #


def test_nan_names_the_row_of_the_file_across_row_groups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # row 30 lies in row group 4 (rows 28..34): its index within the group is 2
    src = write(tmp_path / "in.parquet", make_table(4, nan_at=(30, 1)))
    dst = tmp_path / "out.parquet"
    code, _, err = run_cli(capsys, "advantages", src, "-o", dst)
    assert code == 2
    assert err.strip() == (
        f"comppo-core advantages: error: {src}: column 'values': expected finite values at valid positions, got NaN at (row 30, position 1)"
    )
    assert_no_leftovers(tmp_path, "in.parquet")


def test_nan_in_concentration_during_the_batch_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = make_table(5)
    conc = t.column("concentration").combine_chunks()
    vals = np.asarray(conc.flatten()).copy()
    vals[int(conc.offsets[45].as_py())] = np.inf
    t = t.set_column(
        t.schema.get_field_index("concentration"),
        "concentration",
        pa.ListArray.from_arrays(conc.offsets, pa.array(vals)),
    )
    src = write(tmp_path / "in.parquet", t)
    m = np.asarray(t.column("mask").combine_chunks().flatten())
    if not m[int(conc.offsets[45].as_py())]:  # make sure it sits on a valid token
        pytest.skip("masked")  # pragma: no cover - seed 5 puts it on a valid token
    code, _, err = run_cli(
        capsys,
        "advantages",
        src,
        "-o",
        tmp_path / "o.parquet",
        "--concentration-col",
        "concentration",
        "--normalize",
        "batch",
    )
    assert code == 2
    assert "column 'concentration': expected finite values at valid positions, got inf at (row 45, position 0)" in err
    assert_no_leftovers(tmp_path, "in.parquet")


def test_missing_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path / "in.parquet", make_table().drop_columns(["values"]))
    code, _, err = run_cli(capsys, "advantages", src, "-o", tmp_path / "out.parquet")
    assert code == 2
    assert err.strip() == (
        f"comppo-core advantages: error: column 'values' (values) not found in {src} "
        "(columns: id, prompt, rewards, mask, concentration, gates, last_values)"
    )
    code, _, err = run_cli(
        capsys, "advantages", src, "-o", tmp_path / "out.parquet", "--values-col", "gates", "--gates-col", "G"
    )
    assert code == 2 and "column 'G' (gates) not found" in err
    assert_no_leftovers(tmp_path, "in.parquet")


def test_schema_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = make_table()
    strings = pa.array([[str(x) for x in row] for row in t.column("values").to_pylist()])
    bad = write(tmp_path / "in.parquet", t.set_column(3, "values", strings))
    code, _, err = run_cli(capsys, "advantages", bad, "-o", tmp_path / "out.parquet")
    assert code == 2
    assert f"column 'values' (values) in {bad}: expected a list of float32 or float64" in err
    assert "got list<element: string>" in err
    assert_no_leftovers(tmp_path, "in.parquet")


def test_row_lengths_differing_from_the_rewards(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = make_table(6)
    rows = t.column("values").to_pylist()
    rows[38] = rows[38] + [0.5]  # row 38: row group 5, index 3 within it
    src = write(tmp_path / "in.parquet", t.set_column(3, "values", pa.array(rows, pa.list_(pa.float32()))))
    code, _, err = run_cli(capsys, "advantages", src, "-o", tmp_path / "out.parquet")
    n = len(rows[38]) - 1
    assert code == 2
    assert f"column 'values': row 38 has {n + 1} values but column 'rewards' has {n}" in err
    assert_no_leftovers(tmp_path, "in.parquet")


def test_existing_output_columns_need_replace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path / "in.parquet", make_table(7))
    first = tmp_path / "first.parquet"
    assert run_cli(capsys, "advantages", src, "-o", first, "--lam", "0.9")[0] == 0
    code, _, err = run_cli(capsys, "advantages", first, "-o", tmp_path / "second.parquet", "--lam", "0.5")
    assert code == 2 and "column 'advantages' (advantages) already exists" in err
    code, _, err = run_cli(capsys, "advantages", first, "-o", tmp_path / "second.parquet", "--lam", "0.5", "--replace")
    assert code == 0, err
    again = pq.read_table(tmp_path / "second.parquet")
    want = arrow.compute_advantages(pq.read_table(src), lam=0.5)
    assert again.column_names == want.column_names
    assert again.column("advantages").to_pylist() == want.column("advantages").to_pylist()


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path / "in.parquet", make_table(8))
    code, _, err = run_cli(capsys, "advantages", src, "-o", tmp_path / "o.parquet", "--low", "0.5")
    assert code == 2 and "--low: used only with --concentration-col" in err
    code, _, err = run_cli(
        capsys,
        "advantages",
        src,
        "-o",
        tmp_path / "o.parquet",
        "--gates-col",
        "gates",
        "--concentration-col",
        "concentration",
    )
    assert code == 2 and "not allowed with argument" in err
    code, _, err = run_cli(capsys, "advantages", src, "-o", tmp_path / "o.parquet", "--gamma", "nan")
    assert code == 2 and "expected a number in [0, 1]" in err
    code, _, err = run_cli(capsys, "advantages", src, "-o", src)
    assert code == 2 and "is the input file" in err
    code, _, err = run_cli(
        capsys,
        "advantages",
        src,
        "-o",
        tmp_path / "o.parquet",
        "--concentration-col",
        "concentration",
        "--low",
        "0.9",
        "--high",
        "0.5",
    )
    assert (
        code == 2 and "--low: expected low <= high (high = 0.5), got 0.9" in err
    )  # GateParams' check, as a usage error
    assert_no_leftovers(tmp_path, "in.parquet")


def test_unreadable_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("hello")
    code, _, err = run_cli(capsys, "advantages", not_parquet, "-o", tmp_path / "o.parquet")
    assert code == 2 and err.startswith(f"comppo-core advantages: error: cannot read {not_parquet} as Parquet:")
    code, _, err = run_cli(capsys, "advantages", tmp_path / "missing.parquet", "-o", tmp_path / "o.parquet")
    assert code == 2 and "cannot read" in err
    code, _, err = run_cli(capsys, "advantages", not_parquet, "-o", tmp_path / "x.parquet")
    assert code == 2
    good = write(tmp_path / "good.parquet", make_table(10))
    code, _, err = run_cli(capsys, "advantages", good, "-o", tmp_path / "no" / "such" / "dir" / "o.parquet")
    assert code == 2 and err.startswith(f"comppo-core advantages: error: cannot write {tmp_path / 'no'}")
    assert_no_leftovers(tmp_path, "x.parquet", "good.parquet")


def test_without_pyarrow_the_message_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    code, _, err = run_cli(capsys, "advantages", tmp_path / "in.parquet", "-o", tmp_path / "o.parquet")
    assert code == 2
    assert (
        err.strip()
        == "comppo-core advantages: error: the advantages command needs pyarrow: pip install 'comppo-core[arrow]'"
    )


def test_installed_command_end_to_end(tmp_path: Path) -> None:
    """The real entry point in a subprocess: exit statuses and output file."""
    src = write(tmp_path / "in.parquet", make_table(9, nan_at=(12, 0)))
    exe = [sys.executable, "-c", "import sys; from comppo_core.cli import main; sys.exit(main())"]
    bad = subprocess.run(
        [*exe, "advantages", str(src), "-o", str(tmp_path / "o.parquet")], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2
    assert "column 'values': expected finite values at valid positions, got NaN at (row 12, position 0)" in bad.stderr
    good = write(tmp_path / "good.parquet", make_table(9))
    ok = subprocess.run(
        [*exe, "advantages", str(good), "-o", str(tmp_path / "o.parquet"), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "" and ok.stderr == ""
    assert pq.read_table(tmp_path / "o.parquet").num_rows == ROWS
    mode = os.stat(tmp_path / "o.parquet").st_mode & 0o777
    assert mode == os.stat(good).st_mode & 0o777  # a plain file's mode, not mkstemp's 0600
