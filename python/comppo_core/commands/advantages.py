"""``comppo-core advantages IN.parquet -o OUT.parquet``: Comp-GAE over a Parquet file, streamed.

One row per response, list columns of per-token rewards and values (and optionally a
mask, gates or a concentration to map to gates, and a per-row last value). The command
reads the file one row group at a time, computes the advantages and λ-returns of that
row group with :func:`comppo_core.arrow.compute_advantages` (the packed layout of the
Arrow list columns, no copies), and writes the row group, with every input column plus
``advantages`` and ``returns``, to the output before reading the next one. Peak memory
is one row group (its input columns, the two new ones and pyarrow's decode and encode
buffers, about 10× the row group's raw float data), not the file; the output keeps the
input's row groups.

Per row b, over its valid tokens ``i = 0..n-1`` (docs/design.md §3)::

    δ_i = r_i + γ·g_i·V_{i+1} − V_i,   A_i = δ_i + γ·λ·g_i·A_{i+1},   R_i = A^c_i + V_i

``--normalize batch`` (with ``--concentration-col``) z-scores the concentration over
**every valid token of the file**: a first streaming pass reads only the concentration
and mask columns to get their mean and std, so results do not depend on row-group
boundaries.

The output is written to a temporary file next to ``OUT`` and renamed when complete: on
any error no partial ``OUT`` is left behind. Exit status 0 on success, 2 on bad input: a
usage error, or a missing column, a schema mismatch, bad values (the message names the
column and the first offending row of the file) or an unreadable file, each printed as
``comppo-core advantages: error: ...`` (the prefix and status of every command's bad input).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, TextIO

from .. import errors
from ..gate_params import DEFAULTS as _GATE_DEFAULTS
from ..gate_params import GateParams
from ..options import MASKED_REWARD_MODES, NORMALIZE_MODES
from ._argtypes import finite_float, gate_params, unit_float

__all__ = ["add_parser", "run", "writer_options"]

_COMPRESSIONS = ("snappy", "zstd", "lz4", "gzip", "brotli", "none")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None and False (those options say what they default to)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action) or ""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``advantages`` command on the ``comppo-core`` parser."""
    cmd = subparsers.add_parser(
        "advantages",
        help="GAE / Comp-GAE advantages and returns of a Parquet file of responses, streamed row group by row group (needs pyarrow)",
        description=(
            "Read IN.parquet (one row per response; list columns of per-token rewards and values, "
            "optionally a mask, gates or a concentration, and a per-row last value), compute "
            "Comp-GAE advantages and λ-returns row group by row group, and write OUT.parquet with "
            "every input column plus the advantages and returns columns. Memory stays at a few "
            "row groups whatever the file size."
        ),
        formatter_class=_HelpFormatter,
    )
    cmd.add_argument("input", metavar="IN.parquet", help="input Parquet file")
    cmd.add_argument(
        "-o", "--output", metavar="OUT.parquet", required=True, help="output Parquet file (replaced if it exists)"
    )

    g = cmd.add_argument_group("GAE")
    g.add_argument("--gamma", type=unit_float, default=1.0, help="discount γ")
    g.add_argument("--lam", type=unit_float, default=1.0, help="GAE λ of the advantages")
    g.add_argument(
        "--lam-critic", type=unit_float, default=None, help="λ of the returns (decoupled GAE; default: --lam)"
    )
    g.add_argument(
        "--masked-rewards",
        choices=MASKED_REWARD_MODES,
        default="error",
        help="a nonzero reward on a masked token: an error, or dropped",
    )

    c = cmd.add_argument_group("input columns")
    c.add_argument("--rewards-col", default="rewards", metavar="NAME", help="list column of per-token rewards")
    c.add_argument("--values-col", default="values", metavar="NAME", help="list column of per-token critic values")
    m = c.add_mutually_exclusive_group()
    m.add_argument(
        "--mask-col",
        default=None,
        metavar="NAME",
        help="list column of bool/0-1 token masks (default: 'mask' if IN has it)",
    )
    m.add_argument("--no-mask", action="store_true", help="ignore any mask column: every token is valid")
    lv = c.add_mutually_exclusive_group()
    lv.add_argument(
        "--last-values-col",
        default=None,
        metavar="NAME",
        help="numeric column of bootstrap values of truncated responses (default: 'last_values' if IN has it)",
    )
    lv.add_argument(
        "--no-last-values", action="store_true", help="ignore any last-values column: every response is terminal"
    )
    gsrc = c.add_mutually_exclusive_group()
    gsrc.add_argument("--gates-col", default=None, metavar="NAME", help="list column of gates in [0, 1] (Comp-GAE)")
    gsrc.add_argument(
        "--concentration-col",
        default=None,
        metavar="NAME",
        help="list column of attention concentration, mapped to gates with the options below (Comp-GAE)",
    )

    gm = cmd.add_argument_group(
        "gate mapping (with --concentration-col): g = low + (high - low) * sigmoid(sharpness * z)"
    )
    gm.add_argument("--low", type=unit_float, default=None, help=f"lowest gate (default: {_GATE_DEFAULTS['low']})")
    gm.add_argument("--high", type=unit_float, default=None, help=f"highest gate (default: {_GATE_DEFAULTS['high']})")
    gm.add_argument("--sharpness", type=finite_float, default=None, help="slope of the sigmoid (default: 1)")
    gm.add_argument(
        "--normalize",
        choices=NORMALIZE_MODES,
        default=None,
        help="z-score of each token against its response up to it ('causal', default), over the whole response "
        "('sequence'), over every valid token of the file ('batch': one extra streaming pass over the "
        "concentration column), or (c - center)/scale ('none')",
    )
    gm.add_argument("--center", type=finite_float, default=None, help="center with --normalize none (default: 0)")
    gm.add_argument("--scale", type=finite_float, default=None, help="scale > 0 with --normalize none (default: 1)")
    gm.add_argument("--invert", action="store_true", default=None, help="high concentration -> low gate")
    gm.add_argument(
        "--min-spread",
        type=finite_float,
        default=None,
        help="floor on the spread the z-score divides by, in the concentration's units: "
        "z = (c - mean)/max(std, MIN_SPREAD) (default: 0, no floor; not used by --normalize none)",
    )

    o = cmd.add_argument_group("output")
    o.add_argument("--advantages-col", default="advantages", metavar="NAME", help="name of the advantages column")
    o.add_argument("--returns-col", default="returns", metavar="NAME", help="name of the returns column")
    o.add_argument("--replace", action="store_true", help="overwrite output columns that IN already has")
    o.add_argument("--compression", choices=_COMPRESSIONS, default="snappy", help="Parquet compression of OUT")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress line and no summary")
    cmd.set_defaults(run=run)
    return cmd


# --------------------------------------------------------------------------- #
# Progress
# --------------------------------------------------------------------------- #


def _rate(tokens: float, seconds: float) -> str:
    r = tokens / seconds if seconds > 0 else 0.0
    if r >= 1e6:
        return f"{r / 1e6:.1f}M tokens/s"
    if r >= 1e3:
        return f"{r / 1e3:.1f}k tokens/s"
    return f"{r:.0f} tokens/s"


class _Progress:
    """A one-line progress bar with tokens/s on ``stream``, redrawn per row group; silent
    unless enabled (the command enables it when stderr is a terminal)."""

    def __init__(self, stream: TextIO, enabled: bool, label: str, total_groups: int, total_rows: int) -> None:
        self.stream, self.enabled, self.label = stream, enabled, label
        self.total_groups, self.total_rows = total_groups, total_rows
        self.start = time.perf_counter()
        self.width = 0

    def update(self, groups: int, rows: int, tokens: int) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        frac = rows / self.total_rows if self.total_rows else groups / max(self.total_groups, 1)
        frac = min(max(frac, 0.0), 1.0)
        bar = "#" * int(24 * frac)
        line = (
            f"{self.label} [{bar:<24}] {100 * frac:5.1f}%  row group {groups}/{self.total_groups}  "
            f"{rows:,} rows  {tokens:,} tokens  {_rate(tokens, elapsed)}"
        )
        pad = " " * max(self.width - len(line), 0)
        self.width = len(line)
        self.stream.write("\r" + line + pad)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.width:
            self.stream.write("\n")
            self.stream.flush()


# --------------------------------------------------------------------------- #
# The command
# --------------------------------------------------------------------------- #


def _fail(progress: _Progress | None, message: str) -> int:
    """Ends the progress line (if any), prints ``comppo-core advantages: error: message`` to
    stderr and returns the exit status 2: a file, a column or a value that cannot be used is
    bad input, as a bad flag is, with the prefix and status every command gives bad input."""
    if progress is not None:
        progress.close()
    print(f"comppo-core advantages: error: {message}", file=sys.stderr)
    return 2


class _Failure(Exception):
    """A user-facing failure that is not a ComppoError (unreadable file, ...)."""


def _gate_params(args: argparse.Namespace, parser: argparse.ArgumentParser) -> GateParams:
    """The gate flags as one GateParams; they are a usage error without --concentration-col."""
    given = [name for name in _GATE_DEFAULTS if getattr(args, name) is not None]
    if given and args.concentration_col is None:
        flags = ", ".join("--" + name for name in given)
        parser.error(f"{flags}: used only with --concentration-col (the gate mapping of a concentration column)")
    return gate_params(args, parser)


def writer_options(parquet_schema: Any, compression: str = "snappy") -> dict[str, Any]:
    """``pq.ParquetWriter`` options of the output: dictionary encoding and min/max
    statistics for every leaf column except floating-point ones (``parquet_schema`` is
    the input's ``ParquetFile.schema``; the two new float columns get neither).

    Per-token float lists gain nothing from a dictionary, and their min/max statistics
    prune nothing; skipping the statistics saves about a quarter of the write time. Other columns
    (prompts, ids, token ids) keep them.
    """
    paths = []
    for i in range(len(parquet_schema)):
        col = parquet_schema.column(i)
        if col.physical_type not in ("FLOAT", "DOUBLE") and col.logical_type.type != "FLOAT16":
            paths.append(col.path)
    return {"compression": compression, "use_dictionary": paths, "write_statistics": paths}


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core advantages``; returns the exit status."""
    gate = _gate_params(args, parser)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return _fail(None, "the advantages command needs pyarrow: pip install 'comppo-core[arrow]'")
    from .. import arrow

    src, dst = args.input, args.output
    try:
        pf = pq.ParquetFile(src)
    except (OSError, pa.ArrowException) as e:
        return _fail(None, f"cannot read {src} as Parquet: {e}")
    if os.path.exists(dst) and os.path.samefile(src, dst):
        parser.error(f"-o {dst} is the input file; write to another path")

    schema = pf.schema_arrow
    try:
        cols = arrow.resolve_columns(
            schema,
            rewards_col=args.rewards_col,
            values_col=args.values_col,
            mask_col=None if args.no_mask else (args.mask_col if args.mask_col is not None else arrow.AUTO_MASK),
            last_values_col=None
            if args.no_last_values
            else (args.last_values_col if args.last_values_col is not None else arrow.AUTO_LAST_VALUES),
            gates_col=args.gates_col,
            concentration_col=args.concentration_col,
            advantages_col=args.advantages_col,
            returns_col=args.returns_col,
            replace=args.replace,
            source=src,
        )
    except errors.ComppoError as e:
        return _fail(None, str(e))
    out_type = schema.field(cols.rewards).type
    out_schema = schema
    for name in (cols.advantages, cols.returns):
        idx = out_schema.get_field_index(name)
        field = pa.field(name, out_type)
        out_schema = out_schema.set(idx, field) if idx >= 0 else out_schema.append(field)

    meta = pf.metadata
    n_groups = meta.num_row_groups
    total_rows = meta.num_rows
    show = not args.quiet and sys.stderr.isatty()
    t_start = time.perf_counter()

    kwargs: dict[str, Any] = {
        "rewards_col": cols.rewards,
        "values_col": cols.values,
        "mask_col": cols.mask,
        "last_values_col": cols.last_values,
        "gates_col": cols.gates,
        "concentration_col": cols.concentration,
        "gamma": args.gamma,
        "lam": args.lam,
        "lam_critic": args.lam_critic,
        "masked_rewards": args.masked_rewards,
        "advantages_col": cols.advantages,
        "returns_col": cols.returns,
        "replace": args.replace,
    }
    if cols.concentration is not None:
        kwargs["gate_params"] = gate

    row_starts = [0]
    for i in range(n_groups):
        row_starts.append(row_starts[-1] + meta.row_group(i).num_rows)

    def read_group(i: int, columns: list[str] | None = None) -> Any:
        try:
            return pf.read_row_group(i, columns=columns)
        except (OSError, pa.ArrowException) as e:
            raise _Failure(f"cannot read row group {i} of {src}: {e}") from e

    # ---- pass 1 (normalize="batch" only): moments of the whole file ------------
    if cols.concentration is not None and gate.normalize == "batch":
        progress = _Progress(sys.stderr, show, "pass 1/2 (batch statistics)", n_groups, total_rows)
        moments = arrow.ConcentrationMoments()
        tokens = 0
        read_cols = [cols.concentration] + ([cols.mask] if cols.mask else [])
        try:
            for i in range(n_groups):
                part = read_group(i, read_cols)
                moments = moments.merge(
                    arrow.concentration_moments(
                        part, concentration_col=cols.concentration, mask_col=cols.mask, row_offset=row_starts[i]
                    )
                )
                tokens += sum(_tokens_of(c) for c in part.column(cols.concentration).chunks)
                progress.update(i + 1, row_starts[i + 1], tokens)
        except errors.ComppoError as e:
            return _fail(progress, f"{src}: {e}")
        except _Failure as e:
            return _fail(progress, str(e))
        progress.close()
        kwargs["batch_moments"] = moments

    # ---- pass 2: compute and write, row group by row group --------------------
    out_dir = os.path.dirname(os.path.abspath(dst))
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(dst) + ".", suffix=".partial", dir=out_dir)
    except OSError as e:
        return _fail(None, f"cannot write {dst}: {e}")
    os.close(fd)
    writer = None
    label = "pass 2/2" if "batch_moments" in kwargs else "advantages"
    progress = _Progress(sys.stderr, show, label, n_groups, total_rows)
    done = {"rows": 0, "tokens": 0, "groups": 0}

    ok = False
    try:
        writer = pq.ParquetWriter(tmp, out_schema, **writer_options(pf.schema, args.compression))
        for i in range(n_groups):
            table = read_group(i)
            result = arrow.compute_advantages(table, row_offset=row_starts[i], **kwargs)
            try:
                writer.write_table(result)
            except (OSError, pa.ArrowException) as e:
                raise _Failure(f"cannot write {dst}: {e}") from e
            done["groups"] += 1
            done["rows"] += table.num_rows
            done["tokens"] += sum(_tokens_of(c) for c in table.column(cols.rewards).chunks)
            progress.update(done["groups"], done["rows"], done["tokens"])
            del table, result  # one row group in memory at a time
        writer.close()
        writer = None
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it 0600; give it a plain file's mode
        os.replace(tmp, dst)
        ok = True
    except errors.ComppoError as e:
        return _fail(progress, f"{src}: {e}")
    except _Failure as e:
        return _fail(progress, str(e))
    except (OSError, pa.ArrowException) as e:  # opening or closing the writer, or unexpected data
        return _fail(progress, f"{src} -> {dst}: {e}")
    finally:
        if writer is not None:
            try:
                writer.close()
            except Exception:  # the file is removed below anyway
                pass
        if not ok and os.path.exists(tmp):
            os.remove(tmp)
    progress.close()
    elapsed = time.perf_counter() - t_start
    if not args.quiet:
        print(
            f"comppo-core advantages: wrote {dst}: {done['rows']:,} rows, {done['tokens']:,} tokens, "
            f"{n_groups} row group{'s' if n_groups != 1 else ''} in {elapsed:.2f} s ({_rate(done['tokens'], elapsed)})"
        )
    return 0


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _tokens_of(chunk: Any) -> int:
    """Number of list elements a list-array chunk spans (last offset − first offset)."""
    n = len(chunk)
    if n == 0:
        return 0
    return int(chunk.offsets[n].as_py()) - int(chunk.offsets[0].as_py())
