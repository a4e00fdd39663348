"""``comppo_core.ray``: the Arrow path on a Ray Dataset equals the single-process path.

One local Ray (2 CPUs, no dashboard) serves the whole module; the data is a small
generated Parquet directory (several files, several row groups each) so that Ray's
blocks cut the rows differently from the single-process table.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import comppo_core as cc  # noqa: E402
from comppo_core import arrow  # noqa: E402
from comppo_core import ray as cc_ray  # noqa: E402
from comppo_core.gate_params import GateParams  # noqa: E402

FILES, ROWS = 3, 40


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        object_store_memory=200 * 1024**2,
    )
    # Ray Data's DataContext, built on first use, assigns its own deprecated fields in
    # its constructor and so warns about itself (DeprecationWarning from
    # ray.data.context: `use_push_based_shuffle`, `use_polars`, ...). Build it here, once,
    # with exactly those warnings silenced; pytest turns every other warning into an error.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.data\.context")
        ray.data.DataContext.get_current()
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("rollouts")
    for f in range(FILES):
        lengths = rng.integers(1, 40, size=ROWS)
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        n = int(cu[-1])
        mask = rng.random(n) > 0.1
        mask[cu[1:] - 1] = True
        rewards = np.zeros(n, np.float32)
        rewards[cu[1:] - 1] = rng.choice([-1.0, 1.0], size=ROWS)

        def lists(x: np.ndarray) -> pa.Array:
            return pa.ListArray.from_arrays(pa.array(cu), pa.array(x))

        t = pa.table(
            {
                "id": np.arange(ROWS) + f * ROWS,
                "rewards": lists(rewards),
                "values": lists(rng.uniform(-1, 1, n).astype(np.float32)),
                "mask": lists(mask),
                "concentration": lists(rng.random(n).astype(np.float32)),
                "last_values": rng.uniform(-0.5, 0.5, ROWS),
            }
        )
        pq.write_table(t, root / f"part-{f}.parquet", row_group_size=16)
    return root


@pytest.fixture(scope="module")
def dataset(local_ray: None, parquet_dir: Path) -> Any:
    """The Parquet directory read by Ray once (reading is the slow part of a Ray run
    here, seconds per read), materialized for the tests to map over."""
    return ray.data.read_parquet(str(parquet_dir)).materialize()


def collect(ds: Any) -> pa.Table:
    tables = ray.get(ds.to_arrow_refs())
    return pa.concat_tables(tables).sort_by("id")


def single_process(root: Path, **kw: Any) -> pa.Table:
    return arrow.compute_advantages(pq.read_table(root), **kw).sort_by("id")


def values_of(t: pa.Table, name: str) -> np.ndarray:
    return np.asarray(t.column(name).combine_chunks().flatten())


def test_compute_advantages_equals_the_single_process_path(dataset: Any, parquet_dir: Path) -> None:
    kw: dict[str, Any] = dict(
        gamma=0.99,
        lam=0.95,
        lam_critic=1.0,
        concentration_col="concentration",
        gate_params=GateParams(low=0.5, sharpness=2.0),
    )
    ds = dataset.repartition(5).materialize()  # blocks that are slices of the file's table
    assert ds.num_blocks() == 5
    got = collect(cc_ray.compute_advantages(ds, **kw))
    want = single_process(parquet_dir, **kw)
    assert got.num_rows == FILES * ROWS
    assert (
        got.column_names
        == want.column_names
        == ["id", "rewards", "values", "mask", "concentration", "last_values", "advantages", "returns"]
    )
    for name in got.column_names:  # row for row, bit for bit
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def test_map_batches_function_with_small_batches_and_batch_normalization(dataset: Any, parquet_dir: Path) -> None:
    """advantages_batch as a plain map_batches function, with batches that cut rows
    anywhere, gives the same rows; normalize="batch" through compute_advantages spans the
    whole dataset (moments pass), not each block."""
    ds = dataset
    out = ds.map_batches(
        cc_ray.advantages_batch, batch_format="pyarrow", batch_size=7, fn_kwargs={"lam": 0.9, "gamma": 0.98}
    )
    got = collect(out)
    want = single_process(parquet_dir, lam=0.9, gamma=0.98)
    assert got.column("advantages").to_pylist() == want.column("advantages").to_pylist()
    assert got.column("returns").to_pylist() == want.column("returns").to_pylist()

    kw: dict[str, Any] = dict(
        concentration_col="concentration", gate_params=GateParams(normalize="batch", low=0.2, sharpness=3.0), lam=0.9
    )
    got_b = collect(cc_ray.compute_advantages(ds, **kw))
    whole = pq.read_table(parquet_dir).combine_chunks()
    want_b = arrow.compute_advantages(whole, **kw).sort_by("id")  # the kernel's own batch z-score
    np.testing.assert_allclose(values_of(got_b, "advantages"), values_of(want_b, "advantages"), rtol=1e-5, atol=1e-6)
    per_file = pa.concat_tables(
        [arrow.compute_advantages(pq.read_table(p), **kw) for p in sorted(parquet_dir.iterdir())]
    ).sort_by("id")
    assert np.max(np.abs(values_of(per_file, "advantages") - values_of(want_b, "advantages"))) > 1e-3


def test_errors(dataset: Any, parquet_dir: Path) -> None:
    ds = dataset
    with pytest.raises(cc.ParameterError, match=r"column 'v' \(values\) not found"):
        cc_ray.compute_advantages(ds, values_col="v")  # before any task runs
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'gama'"):
        cc_ray.compute_advantages(ds, gama=0.9)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'low' \(options are those of"):
        cc_ray.compute_advantages(ds, concentration_col="concentration", low=0.5)  # the mapping is gate_params=
    with pytest.raises(cc.ParameterError, match=r"^gate_params: expected a comppo_core.GateParams, got dict"):
        cc_ray.compute_advantages(ds, concentration_col="concentration", gate_params={"low": 0.5})
    with pytest.raises(cc.DTypeError, match=r"batch_format='pyarrow'"):
        cc_ray.advantages_batch({"rewards": np.zeros(3)})
    t = pq.read_table(parquet_dir / "part-1.parquet")
    v = t.column("values").combine_chunks()
    vals = np.asarray(v.flatten()).copy()
    vals[int(v.offsets[5].as_py())] = np.nan
    t = t.set_column(2, "values", pa.ListArray.from_arrays(v.offsets, pa.array(vals)))
    bad = ray.data.from_arrow(t)
    with pytest.raises(
        Exception, match=r"column 'values': expected finite values at valid positions, got NaN at \(row 5, position 0\)"
    ):
        collect(cc_ray.compute_advantages(bad))


def test_errors_cross_to_the_driver_with_their_attributes(dataset: Any, parquet_dir: Path) -> None:
    """With Ray Data raising the map function's own exception, the driver's error is an
    instance of the package's class carrying the block's argument, row and position
    (the error was pickled in the worker and rebuilt here)."""
    t = pq.read_table(parquet_dir / "part-2.parquet")
    c = t.column("concentration").combine_chunks()
    vals = np.asarray(c.flatten()).copy()
    vals[int(c.offsets[7].as_py()) + 1] = np.inf
    m = t.column("mask").combine_chunks()
    masks = np.asarray(m.flatten()).copy()
    masks[int(m.offsets[7].as_py()) + 1] = True
    t = t.set_column(
        t.schema.get_field_index("concentration"), "concentration", pa.ListArray.from_arrays(c.offsets, pa.array(vals))
    )
    t = t.set_column(t.schema.get_field_index("mask"), "mask", pa.ListArray.from_arrays(m.offsets, pa.array(masks)))
    ctx = ray.data.DataContext.get_current()
    saved = ctx.raise_original_map_exception
    ctx.raise_original_map_exception = True
    try:
        bad = ray.data.from_arrow(t)
        with pytest.raises(cc.NonFiniteError) as info:
            collect(
                cc_ray.compute_advantages(
                    bad, concentration_col="concentration", gate_params=GateParams(low=0.5, sharpness=2.0)
                )
            )
    finally:
        ctx.raise_original_map_exception = saved
    e = info.value
    assert (e.argument, e.row, e.position, e.index) == ("concentration", 7, 1, None)
    assert "column 'concentration': expected finite values at valid positions, got inf at (row 7, position 1)" in str(e)
