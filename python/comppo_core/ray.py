"""Comp-GAE advantages on a Ray Dataset (Ray Data), block by block, with the Arrow path.

Each block of the dataset is an Arrow table; :func:`advantages_batch` runs
:func:`comppo_core.arrow.compute_advantages` on it (the list columns' offsets are the
packed ``cu_seqlens``, their values buffers go to the kernels without copies) and
returns the table plus ``advantages`` and ``returns``. Rows are independent, so the
result does not depend on how the dataset is split into blocks or batches, and it
equals the single-process :func:`comppo_core.arrow.compute_advantages` row for row.

Two ways to use it::

    import ray
    import comppo_core as cc
    from comppo_core import ray as cc_ray

    ds = ray.data.read_parquet("rollouts/")                  # one row per response
    out = cc_ray.compute_advantages(ds, gamma=1.0, lam=0.95, concentration_col="concentration",
                                    gate_params=cc.GateParams(low=0.5))
    out.write_parquet("rollouts_with_advantages/")

    # or, as a plain map_batches function (what compute_advantages does):
    out = ds.map_batches(cc_ray.advantages_batch, batch_format="pyarrow", batch_size=None,
                         zero_copy_batch=True, fn_kwargs={"lam": 0.95})

The default mapping, ``GateParams()`` (``normalize="causal"``: each token's z-score against
its row's valid tokens up to it), and ``"sequence"`` and ``"none"`` work row by row, so
blocks change nothing. ``GateParams.normalize="batch"`` (z-scores of the concentration over
all valid tokens) is global:
:func:`compute_advantages` first runs a pass over the concentration and mask columns
to get their moments (:func:`dataset_moments`), then hands them to every block. With
``map_batches`` directly, "batch" would mean each batch; pass ``batch_moments=`` there.

The gate mapping, one ``gate_params=`` :class:`~comppo_core.GateParams`, is checked on
the driver and reaches every block as that value.

Errors raised inside a block (NaN, a row with the wrong length, ...) reach the driver
wrapped by Ray; their message is the :mod:`comppo_core.arrow` one. By default Ray Data
wraps them in its ``UserCodeException``, which keeps only the text; with
``ray.data.DataContext.get_current().raise_original_map_exception = True`` (set before
the dataset is built) the driver gets the package's error itself: Ray's exception is an
instance of its class (``except cc.NonFiniteError`` works) and forwards its attributes
(``argument``, ``row``, ``position``; the errors pickle with them). Row indices (``row``
and the message's) count from the start of the failing *block*, as Ray does not tell a
block where it starts in the dataset.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from . import arrow
from .errors import DTypeError, ParameterError
from .gate_params import as_gate_params

if TYPE_CHECKING:  # pragma: no cover
    import ray.data

__all__ = ["advantages_batch", "compute_advantages", "dataset_moments"]


def advantages_batch(batch: pa.Table | pa.RecordBatch, **options: Any) -> pa.Table:
    """The ``map_batches`` function: ``batch`` plus advantages and returns.

    Use with ``batch_format="pyarrow"``; ``options`` are those of
    :func:`comppo_core.arrow.compute_advantages` (pass them as ``fn_kwargs``).
    """
    if not isinstance(batch, (pa.Table, pa.RecordBatch)):
        raise DTypeError(
            f"batch: expected a pyarrow Table (map_batches(..., batch_format='pyarrow')), got {type(batch).__name__}",
            argument="batch",
        )
    return arrow.compute_advantages(batch, **options)


def _moments_batch(
    batch: pa.Table, *, concentration_col: str = "concentration", mask_col: str | None = None
) -> pa.Table:
    m = arrow.concentration_moments(batch, concentration_col=concentration_col, mask_col=mask_col)
    return pa.table({"n": [m.n], "mean": [m.mean], "m2": [m.m2], "min": [m.min], "max": [m.max]})


def dataset_moments(
    dataset: ray.data.Dataset, *, concentration_col: str = "concentration", mask_col: str | None = None
) -> arrow.ConcentrationMoments:
    """The :class:`~comppo_core.arrow.ConcentrationMoments` of a dataset's valid
    concentration values (one pass over two columns; executes the dataset)."""
    cols = [concentration_col] + ([mask_col] if mask_col else [])
    parts = dataset.select_columns(cols).map_batches(
        _moments_batch,
        batch_format="pyarrow",
        batch_size=None,
        zero_copy_batch=True,
        fn_kwargs={"concentration_col": concentration_col, "mask_col": mask_col},
    )
    total = arrow.ConcentrationMoments()
    for row in parts.take_all():
        total = total.merge(
            arrow.ConcentrationMoments(
                int(row["n"]), float(row["mean"]), float(row["m2"]), float(row["min"]), float(row["max"])
            )
        )
    return total


def _arrow_schema(dataset: Any) -> pa.Schema | None:
    try:
        schema = dataset.schema()
    except Exception:  # a dataset whose schema needs execution: resolve per block instead
        return None
    base = getattr(schema, "base_schema", schema)
    return base if isinstance(base, pa.Schema) else None


def compute_advantages(
    dataset: ray.data.Dataset,
    *,
    batch_size: int | None = None,
    map_batches_kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> ray.data.Dataset:
    """``dataset`` plus the columns ``advantages`` and ``returns`` (lazy, like any
    ``map_batches``).

    Args:
      dataset: a Ray Dataset with one row per response (e.g. ``ray.data.read_parquet``).
      batch_size: rows per call; None (default) processes whole blocks, which needs no
        re-batching copy. The result does not depend on it.
      map_batches_kwargs: extra arguments of ``Dataset.map_batches`` (``concurrency``,
        ``num_cpus``, ...).
      options: those of :func:`comppo_core.arrow.compute_advantages` (column names,
        ``gamma``, ``lam``, ``gate_params``, ...).

    The column options are checked against the dataset's schema up front (a missing
    column fails here, not in a worker). ``gate_params.normalize="batch"`` with a concentration
    column runs :func:`dataset_moments` first (this executes a pass over the data) so
    the z-scores span the whole dataset.
    """
    try:  # unknown or misspelt options fail here, not in a worker
        inspect.signature(arrow.compute_advantages).bind(None, **options)
    except TypeError as e:
        raise TypeError(
            f"compute_advantages: {e} (options are those of comppo_core.arrow.compute_advantages)"
        ) from None
    if options.get("gate_params") is not None:  # one GateParams, checked here (not in a worker), for every block
        options["gate_params"] = as_gate_params(options["gate_params"], "gate_params")
    schema = _arrow_schema(dataset)
    if schema is not None:
        names = {
            k: options[k]
            for k in (
                "rewards_col",
                "values_col",
                "mask_col",
                "last_values_col",
                "gates_col",
                "concentration_col",
                "advantages_col",
                "returns_col",
                "replace",
            )
            if k in options
        }
        cols = arrow.resolve_columns(schema, **names)
        # Every block uses the same columns, whatever the optional ones it happens to hold.
        options = {**options, "mask_col": cols.mask, "last_values_col": cols.last_values}
        gate = options.get("gate_params")
        if (
            cols.concentration is not None
            and gate is not None
            and gate.normalize == "batch"
            and options.get("batch_moments") is None
        ):
            options["batch_moments"] = dataset_moments(
                dataset, concentration_col=cols.concentration, mask_col=cols.mask
            )
    elif (
        options.get("gate_params") is not None
        and options["gate_params"].normalize == "batch"
        and options.get("concentration_col")
        and options.get("batch_moments") is None
    ):
        raise ParameterError(
            "normalize='batch': the dataset's Arrow schema is unknown, so the columns for the "
            "batch statistics cannot be resolved; pass batch_moments=dataset_moments(dataset, ...)",
            argument="normalize",
        )
    return dataset.map_batches(
        advantages_batch,
        batch_format="pyarrow",
        batch_size=batch_size,
        zero_copy_batch=True,
        fn_kwargs=options,
        **(map_batches_kwargs or {}),
    )
