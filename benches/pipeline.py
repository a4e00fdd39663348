"""Side-by-side benchmark of the Parquet pipeline: the streaming CLI against the
in-memory kernel and against the pandas/NumPy loop a user would write.

Run:  python benches/pipeline.py                         (20,000 responses, lengths 1..4,096)
      python benches/pipeline.py --responses 2000 --rounds 1   (a quick run)

Needs pyarrow and pandas. The data: a Parquet file generated here (in a temporary
directory) of ``--responses`` rows, each with a length uniform in ``[1, --max-length]``
and float32 list columns ``rewards`` (an outcome ±1 on the last token), ``values`` and
``concentration``, written in row groups of ``--row-group`` rows (snappy, no
dictionary). Workloads (γ = 1, λ = 0.95):

    gae        plain GAE from rewards and values
    comp-gae   Comp-GAE: gates from the concentration (low 0.5, z-score per sequence)

Candidates, each run in its own process (so its peak RSS is its own; ``os.wait4``),
interleaved round by round, medians reported:

    kernel      comppo_core.gae (and gates_from_concentration) on the packed arrays,
                already loaded in memory: the time of the calls only (median of 3)
    CLI         `comppo-core advantages IN -o OUT` end to end: process start, imports,
                streaming read, compute and write of every row group
    in-memory   pq.read_table + comppo_core.arrow.compute_advantages + pq.write_table in
                one go (what one writes without streaming), end to end
    I/O floor   the same read and write with no compute (the values column written twice
                in place of the two outputs): the Parquet cost alone, end to end
    pandas loop pd.read_parquet, then per row: vectorised δ (and gates), the backward
                recursion as a Python loop over tokens, then df.to_parquet. Read and
                write are timed on the whole file; the loop on the first rows up to
                --loop-tokens tokens and scaled per token to the file (labelled)

Ratios: CLI time over each other candidate's (the target is CLI ≤ 2× the in-memory
kernel). Peak RSS of the CLI is shown next to the file size and, unless --no-half,
for a file of half the rows, to show that it does not grow with the file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

GAMMA, LAM, LOW = 1.0, 0.95, 0.5
WORKLOADS = ("gae", "comp-gae")


# --------------------------------------------------------------------------- #
# Data
# --------------------------------------------------------------------------- #


def generate(path: str, responses: int, max_length: int, row_group: int, seed: int) -> dict[str, int]:
    """Writes the benchmark file row group by row group; returns its row and token counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    schema = pa.schema([(name, pa.list_(pa.float32())) for name in ("rewards", "values", "concentration")])
    tokens = 0
    with pq.ParquetWriter(path, schema, compression="snappy", use_dictionary=False) as w:
        for start in range(0, responses, row_group):
            b = min(row_group, responses - start)
            lengths = rng.integers(1, max_length, size=b, endpoint=True)
            cu = np.zeros(b + 1, np.int32)
            np.cumsum(lengths, out=cu[1:])
            n = int(cu[-1])
            rewards = np.zeros(n, np.float32)
            rewards[cu[1:] - 1] = rng.choice(np.array([-1.0, 1.0], np.float32), size=b)
            values = rng.uniform(-1.0, 1.0, n).astype(np.float32)
            conc = rng.beta(2.0, 5.0, n).astype(np.float32)
            offsets = pa.array(cu)
            w.write_table(
                pa.table(
                    [pa.ListArray.from_arrays(offsets, pa.array(x)) for x in (rewards, values, conc)],
                    schema=schema,
                )
            )
            tokens += n
    return {"rows": responses, "tokens": tokens}


# --------------------------------------------------------------------------- #
# Workers (each runs in its own process and prints one JSON line)
# --------------------------------------------------------------------------- #


def _packed(path: str) -> tuple[np.ndarray, ...]:
    import pyarrow.parquet as pq

    t = pq.read_table(path).combine_chunks()
    r = t.column("rewards").chunk(0)
    cu = np.asarray(r.offsets).astype(np.int64)
    cols = [np.asarray(t.column(k).chunk(0).values) for k in ("rewards", "values", "concentration")]
    return (cu, *cols)


def worker_kernel(path: str, workload: str) -> dict[str, Any]:
    import comppo_core as cc

    cu, r, v, c = _packed(path)

    def call() -> None:
        gates = (
            cc.gates_from_concentration(c, cu_seqlens=cu, params=cc.GateParams(low=LOW))
            if workload == "comp-gae"
            else None
        )
        cc.gae(r, v, cu_seqlens=cu, gates=gates, gamma=GAMMA, lam=LAM)

    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "tokens": int(cu[-1])}


def worker_inmemory(path: str, out: str, workload: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    import comppo_core as cc
    from comppo_core import arrow
    from comppo_core.commands.advantages import writer_options

    t0 = time.perf_counter()
    table = pq.read_table(path)
    gate = cc.GateParams(low=LOW)
    kw: dict[str, Any] = {"concentration_col": "concentration", "gate_params": gate} if workload == "comp-gae" else {}
    result = arrow.compute_advantages(table, gamma=GAMMA, lam=LAM, **kw)
    pq.write_table(result, out, **writer_options(pq.ParquetFile(path).schema))  # the CLI's options
    return {"seconds": time.perf_counter() - t0}


def worker_floor(path: str, out: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from comppo_core.commands.advantages import writer_options

    t0 = time.perf_counter()
    table = pq.read_table(path)
    v = table.column("values")
    result = table.append_column("advantages", v).append_column("returns", v)
    pq.write_table(result, out, **writer_options(pq.ParquetFile(path).schema))
    return {"seconds": time.perf_counter() - t0}


def _loop_row(r: np.ndarray, v: np.ndarray, c: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """GAE / Comp-GAE of one response as a user writes it: δ (and the gates) with NumPy,
    the backward recursion as a Python loop."""
    if c is not None:
        x = c.astype(np.float64)
        z = (x - x.mean()) / (x.std() + 1e-8) if x.size > 1 and x.std() > 0 else np.zeros_like(x)
        g = LOW + (1.0 - LOW) / (1.0 + np.exp(-z))
    else:
        g = np.ones(r.size)
    v_next = np.append(v[1:].astype(np.float64), 0.0)
    delta = (r + GAMMA * g * v_next - v).tolist()
    decay = (GAMMA * LAM * g).tolist()
    adv = [0.0] * r.size
    last = 0.0
    for t in range(r.size - 1, -1, -1):
        last = delta[t] + decay[t] * last
        adv[t] = last
    a = np.array(adv, dtype=np.float32)
    return a, (a + v).astype(np.float32)


def worker_pandas(path: str, out: str, workload: str, loop_tokens: int) -> dict[str, Any]:
    import pandas as pd

    import comppo_core as cc

    t0 = time.perf_counter()
    df = pd.read_parquet(path)
    read_s = time.perf_counter() - t0
    lengths = df["rewards"].map(len).to_numpy()
    total = int(lengths.sum())
    comp = workload == "comp-gae"
    t0 = time.perf_counter()
    done, rows = 0, 0
    results = []
    for r, v, c in zip(df["rewards"], df["values"], df["concentration"]):
        results.append(_loop_row(r, v, c if comp else None))
        done += r.size
        rows += 1
        if done >= loop_tokens:
            break
    loop_s = time.perf_counter() - t0
    # Untimed: the kernel on the whole file, to check the loop's rows and to stand in
    # for the rows the loop was not run on in the write below (same sizes, same bytes).
    cu = np.concatenate([[0], np.cumsum(lengths)])
    r = np.concatenate(df["rewards"].to_list())
    v = np.concatenate(df["values"].to_list())
    c = np.concatenate(df["concentration"].to_list())
    g = cc.gates_from_concentration(c, cu_seqlens=cu, params=cc.GateParams(low=LOW)) if comp else None
    want = cc.gae(r, v, cu_seqlens=cu, gates=g, gamma=GAMMA, lam=LAM)
    looped = np.concatenate([a for a, _ in results])
    diff = float(np.max(np.abs(looped - want.advantages[: looped.size])))
    split = cu[1:-1]
    advs = [a for a, _ in results] + np.split(want.advantages, split)[rows:]
    rets = [b for _, b in results] + np.split(want.returns, split)[rows:]
    t0 = time.perf_counter()
    df["advantages"] = advs
    df["returns"] = rets
    df.to_parquet(out)
    write_s = time.perf_counter() - t0
    loop_scaled = loop_s * total / done
    return {
        "read_seconds": read_s,
        "loop_seconds_measured": loop_s,
        "loop_tokens_measured": done,
        "loop_seconds_scaled": loop_scaled,
        "write_seconds": write_s,
        "seconds": read_s + loop_scaled + write_s,
        "max_abs_diff_vs_kernel": diff,
    }


# --------------------------------------------------------------------------- #
# Driver
# --------------------------------------------------------------------------- #


def _run(argv: list[str]) -> tuple[float, float, str]:
    """Runs argv with os.wait4 on its pid: (wall seconds, peak RSS MB, stdout)."""
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out_f, stderr=err_f, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(argv)}\n{err}")
    return wall, usage.ru_maxrss / 1024.0, out  # ru_maxrss is in KiB on Linux


def _worker_argv(kind: str, *args: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--worker", kind, *args]


def _cli_argv(src: str, dst: str, workload: str) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "comppo_core.cli",
        "advantages",
        src,
        "-o",
        dst,
        "--gamma",
        str(GAMMA),
        "--lam",
        str(LAM),
        "-q",
    ]
    if workload == "comp-gae":
        argv += ["--concentration-col", "concentration", "--low", str(LOW)]
    return argv


def _fmt_rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds / 1e6:8.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--responses", type=int, default=20_000, help="rows (responses) in the file")
    ap.add_argument("--max-length", type=int, default=4096, help="longest response; lengths are uniform in [1, this]")
    ap.add_argument("--row-group", type=int, default=1000, help="rows per Parquet row group")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians are reported)")
    ap.add_argument("--loop-tokens", type=int, default=300_000, help="tokens the pandas loop is timed on")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: gae, comp-gae")
    ap.add_argument("--no-half", action="store_true", help="skip the CLI run on a half-size file (RSS check)")
    ap.add_argument("--dir", default=None, help="working directory (default: a temporary one, removed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()

    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if args.worker:
        kind, *rest = args.worker
        if kind == "kernel":
            res = worker_kernel(rest[0], rest[1])
        elif kind == "inmemory":
            res = worker_inmemory(rest[0], rest[1], rest[2])
        elif kind == "floor":
            res = worker_floor(rest[0], rest[1])
        elif kind == "pandas":
            res = worker_pandas(rest[0], rest[1], rest[2], int(rest[3]))
        else:
            raise SystemExit(f"unknown worker {kind}")
        print(json.dumps(res))
        return

    import pyarrow as pa

    import comppo_core as cc

    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"--workloads: unknown {w!r} (choose from {', '.join(WORKLOADS)})")
    work = args.dir or tempfile.mkdtemp(prefix="comppo-pipeline-")
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "rollouts.parquet")
    half = os.path.join(work, "rollouts_half.parquet")
    dst = os.path.join(work, "out.parquet")
    try:
        t0 = time.perf_counter()
        info = generate(src, args.responses, args.max_length, args.row_group, args.seed)
        if not args.no_half:
            generate(half, args.responses // 2, args.max_length, args.row_group, args.seed)
        gen_s = time.perf_counter() - t0
        size_mb = os.path.getsize(src) / 1e6
        n = info["tokens"]
        print(
            f"comppo-core {cc.__version__}, pyarrow {pa.__version__}, threads={cc.get_num_threads()}, "
            f"cpus={os.cpu_count()}, python {sys.version.split()[0]}"
        )
        print(
            f"file: {args.responses:,} responses, lengths 1..{args.max_length}, {n:,} tokens, "
            f"row groups of {args.row_group} rows, {size_mb:.0f} MB (generated in {gen_s:.1f} s)"
        )
        print(
            f"gamma={GAMMA}, lam={LAM}; comp-gae gates: low={LOW}, z-score per sequence; {args.rounds} interleaved rounds"
        )
        print(flush=True)

        times: dict[tuple[str, str], list[float]] = {}
        rss: dict[tuple[str, str], list[float]] = {}

        def record(key: tuple[str, str], seconds: float, peak: float) -> None:
            times.setdefault(key, []).append(seconds)
            rss.setdefault(key, []).append(peak)

        for rnd in range(args.rounds):
            for w in workloads:
                _, peak, out = _run(_worker_argv("kernel", src, w))
                record((w, "kernel"), json.loads(out)["seconds"], peak)
                wall, peak, _ = _run(_cli_argv(src, dst, w))
                record((w, "CLI"), wall, peak)
                os.remove(dst)
                wall, peak, _ = _run(_worker_argv("inmemory", src, dst, w))
                record((w, "in-memory"), wall, peak)
                os.remove(dst)
            wall, peak, _ = _run(_worker_argv("floor", src, dst))
            record(("io", "I/O floor"), wall, peak)
            os.remove(dst)
            print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)

        pandas: dict[str, dict[str, Any]] = {}
        for w in workloads:
            _, peak, out = _run(_worker_argv("pandas", src, dst, w, str(args.loop_tokens)))
            os.remove(dst)
            pandas[w] = json.loads(out)
            pandas[w]["rss"] = peak

        half_rss = None
        if not args.no_half:
            _, half_rss, _ = _run(_cli_argv(half, dst, workloads[0]))
            os.remove(dst)

        med = {k: statistics.median(v) for k, v in times.items()}
        io_floor = med[("io", "I/O floor")]
        head = f"{'workload':10} {'candidate':13} {'seconds':>9} {'Mtok/s':>8} {'peak RSS MB':>12}  {'CLI / this':>10}"
        print("time (median of rounds; end to end for CLI, in-memory and I/O floor), throughput, peak RSS")
        print(head)
        print("-" * len(head))
        for w in workloads:
            cli_s = med[(w, "CLI")]
            for cand in ("kernel", "CLI", "in-memory"):
                s = med[(w, cand)]
                peak = max(rss[(w, cand)])
                print(f"{w:10} {cand:13} {s:9.3f} {_fmt_rate(n, s)} {peak:12.0f}  {cli_s / s:10.2f}")
            p = pandas[w]
            print(
                f"{w:10} {'pandas loop*':13} {p['seconds']:9.1f} {_fmt_rate(n, p['seconds'])} {p['rss']:12.0f}  {cli_s / p['seconds']:10.4f}"
            )
        peak_io = max(rss[("io", "I/O floor")])
        print(f"{'(any)':10} {'I/O floor':13} {io_floor:9.3f} {_fmt_rate(n, io_floor)} {peak_io:12.0f}  {'':>10}")
        print()
        for w in workloads:
            p = pandas[w]
            print(
                f"* pandas loop, {w}: read_parquet {p['read_seconds']:.2f} s + loop "
                f"{p['loop_seconds_measured']:.2f} s measured on {p['loop_tokens_measured']:,} tokens, scaled per token "
                f"to {p['loop_seconds_scaled']:.1f} s + to_parquet {p['write_seconds']:.2f} s; "
                f"max |adv - kernel| on the looped rows {p['max_abs_diff_vs_kernel']:.2e}; peak RSS includes an "
                "untimed kernel pass used for checking"
            )
        print()
        print("ratios")
        for w in workloads:
            k, c_, m = med[(w, "kernel")], med[(w, "CLI")], med[(w, "in-memory")]
            p = pandas[w]["seconds"]
            verdict = "met" if c_ / k <= 2.0 else "NOT met"
            print(
                f"  {w:9} CLI / in-memory kernel {c_ / k:6.2f}x (target <= 2: {verdict}); "
                f"CLI / in-memory with Parquet I/O {c_ / m:5.2f}x; "
                f"CLI / I/O floor {c_ / io_floor:5.2f}x; "
                f"pandas loop / CLI {p / c_:6.1f}x"
            )
        print(
            f"  I/O floor / in-memory kernel: {io_floor / med[(workloads[0], 'kernel')]:.1f}x ({workloads[0]}): "
            "reading and writing the Parquet alone, with no compute, costs this much more than the kernel"
        )
        if half_rss is not None:
            print()
            print(
                f"streaming: CLI peak RSS {max(rss[(workloads[0], 'CLI')]):.0f} MB on the {size_mb:.0f} MB file, "
                f"{half_rss:.0f} MB on a file of half the rows ({os.path.getsize(half) / 1e6:.0f} MB); "
                f"in-memory with Parquet I/O: {max(rss[(workloads[0], 'in-memory')]):.0f} MB"
            )
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
