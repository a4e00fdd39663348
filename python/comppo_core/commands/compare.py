"""``comppo-core compare``: every arm × seed on the same settings, paired, with a results table.

For each seed ``s`` in ``0 … seeds−1`` the command warms the policy up once (the SFT warm
start of :func:`comppo_core.rl.train`, into ``OUT/warmstart/seed<s>/``), then runs every
arm from that checkpoint (``init_from``) with the same settings and seed, so the arms of a
seed differ only in their critic and advantages: the same initial policy, the same
prompts, the same evaluation set (a paired comparison). With ``--model`` or
``--init-from`` there is no warm start: every run starts from that model.

**A tuning protocol** (``--grid``; :mod:`comppo_core.commands.grid` for the syntax,
:mod:`comppo_core.commands.tuning` for the rules). Every arm runs every point of the grid
on the tuning seeds ``1000, 1001, …`` (``--tuning-seeds``, default 2), evaluated on the
validation split (``validation_fraction``, default 0.1 with a grid); each arm's setting
is the point with the best mean final validation accuracy (ties: more stable runs, then
the earlier point); then every arm runs the reporting seeds ``0 … n−1`` (``--seeds``,
default 5 with a grid) at its own chosen setting, evaluated on the held-out split. Each
arm's stability over the grid ("k/n stable", a collapse criterion fixed in advance) and
its chosen setting are reported.

Outputs under ``OUT``::

    warmstart/seed<s>/      the warm start (its warmstart/ is every arm's init_from)
    <arm>/seed<s>/          each run's config.json, metrics.jsonl, summary.json, checkpoint/
    grid/p<k>/point.json    with --grid: point k's settings
    grid/p<k>/<arm>/seed<t>/  the tuning runs (seed t ≥ 1000, validation split)
    grid/nonfinite.json     tuning runs stopped by a non-finite value (a collapse)
    grid/choice.json        each arm's chosen point, once the tuning is done
    results.md              the table below, per-seed accuracies, the settings
    results.json            the same numbers, machine-readable
    timings.json            the seconds each warm start and run took when it ran
    curves.png              held-out accuracy vs step: mean and 95% CI band per arm

    compare.json            the settings every run here shares (checked by --resume)

The table gives, per arm, the final held-out (greedy) accuracy: its mean over seeds and
a 95% confidence interval ``mean ± t_{0.975, n−1} · s / √n`` (Student's t, ``s`` the
sample standard deviation over the ``n`` seeds), and the same for the paired differences
``acc(arm, s) − acc(ref, s)`` to the warm start, to ``grpo`` and to ``comppo``; when the
four cells of the 2×2 are compared, their interaction
``(comppo − tac_fixed) − (comp_gae − ppo_fixed)`` with its paired CI
(:mod:`comppo_core.commands.compare_stats`); and per arm with a critic its explained
variance over the first and the last 10 steps (:mod:`comppo_core.commands.compare_report`).

**Never mixing runs.** An ``OUT`` that already holds a compare (or any run) is refused
unless ``--resume`` or ``--overwrite``. ``--resume`` continues it with the same settings
(``compare.json``, the grid and the tuning seeds included; a differing setting is
refused, named): finished runs are reused, interrupted ones resume from their
checkpoint, and ``--arms`` / ``--seeds`` may add runs; ``results.md`` covers the arms and
seeds asked for. ``--overwrite`` deletes the compare's own files (the entries above) and
starts again. Ctrl-C finishes the current step, keeps the checkpoints and prints the
``--resume`` command (exit status 130).

Exit status: 0 on success, 2 on a bad flag (an unknown arm, a bad preset, a setting out
of range, a bad grid, a refused ``--out``: the message names the flag), 1 on a failure
while training (a non-finite value in a reporting run), 130/143 when interrupted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import NonFiniteError, ParameterError
from ..options import ARM_NAMES
from ..rl import run_dir
from ..rl.arms import ARMS
from ..rl.config import TrainConfig
from . import compare_report as report
from .compare_report import REFERENCES, plot_curves, results_table
from .compare_stats import mean_ci, t_cdf, t_quantile
from .grid import Grid, parse_grid
from .train import (
    _Default,
    add_config_arguments,
    check_paths,
    config_from_args,
    require_rl_extra,
    show_log_lines,
    usage_error,
)
from .tuning import (
    DEFAULT_REPORTING_SEEDS,
    DEFAULT_TUNING_SEEDS,
    DEFAULT_VALIDATION_FRACTION,
    FIRST_TUNING_SEED,
    Outcome,
    choose,
    stability,
    tuning_seeds,
)

__all__ = ["REFERENCES", "add_parser", "mean_ci", "plot_curves", "results_table", "run", "t_cdf", "t_quantile"]

#: TrainConfig flags compare sets itself, and what to use instead.
_OWN_FLAGS = {
    "arm": "the arms are --arms",
    "seed": "the seeds are 0 … --seeds − 1",
    "eval_split": "compare evaluates its reported runs on the held-out split and --grid's tuning runs on the "
    "validation split",
}

#: The settings a resumed compare may change (the runs' other settings must be the same).
_RESUMABLE = ("progress", "num_threads", "device", "report_to", "save_every")

#: What compare writes directly under OUT (with the <arm>/seed<s>/ run directories).
_OWN_ENTRIES = (
    "compare.json",
    "results.md",
    "results.json",
    "timings.json",
    "curves.png",
    "warmstart",
    "grid",
)

# --------------------------------------------------------------------------- #
# The command line
# --------------------------------------------------------------------------- #


#: The arms ``compare`` runs by default: every arm but the diagnostics (``comppo_oracle``
#: needs a task that marks its pivotal tokens).
DEFAULT_ARMS = tuple(name for name in ARM_NAMES if not ARMS[name].diagnostic)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``compare`` command on the ``comppo-core`` parser."""
    cmd = subparsers.add_parser(
        "compare",
        help="run every arm x seed from paired warm starts; results.md (mean, 95%% CI, paired differences) and "
        "curves.png; --grid tunes each arm first (needs [rl])",
        description=(
            "For each seed, warm-start once and run every arm from that checkpoint with the same settings "
            "(paired); write each run under --out, results.md (final held-out accuracy per arm: mean and 95%% "
            "CI over seeds, paired differences to the warm start, grpo and comppo, the critic x gates "
            "interaction), results.json and curves.png. With --grid, each arm's setting is first chosen on "
            "tuning seeds 1000, 1001, ... by validation accuracy (docs/training.md, compare). Settings: the "
            "flags given, then --preset, then the TrainConfig defaults."
        ),
    )
    cmd.add_argument(
        "--arms",
        default=",".join(DEFAULT_ARMS),
        metavar="A,B,...",
        help=(
            f"comma-separated arms to compare (default: every arm but the diagnostics, {','.join(DEFAULT_ARMS)}; "
            "add comppo_oracle on a task that marks its pivotal tokens)"
        ),
    )
    cmd.add_argument(
        "--seeds",
        default=None,
        metavar="N",
        help=f"reporting seeds 0 … N−1 (default: 3; {DEFAULT_REPORTING_SEEDS} with --grid)",
    )
    cmd.add_argument(
        "--grid",
        nargs="+",
        default=None,
        metavar="FIELD=V1,V2",
        help="tune each arm over this grid first: FIELD=V1,V2,... per TrainConfig field (e.g. actor_lr=1e-4,3e-4 "
        "kl_coef=0,0.1 lam=0.95,1.0), or one JSON file {field: [values]}",
    )
    cmd.add_argument(
        "--tuning-seeds",
        default=None,
        metavar="N",
        help=f"with --grid: tuning seeds {FIRST_TUNING_SEED} … {FIRST_TUNING_SEED}+N−1 "
        f"(default: {DEFAULT_TUNING_SEEDS})",
    )
    cmd.add_argument(
        "--jobs",
        default=None,
        metavar="N",
        help="runs at once, each in its own process of one torch thread (default 1: one after another, in this "
        "process); on a 2-core CPU, --jobs 2",
    )
    add_config_arguments(cmd)
    cmd.set_defaults(run=run, command_parser=cmd)
    return cmd


def _arms(text: str, cmd: argparse.ArgumentParser) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    if not arms:
        cmd.error(f"--arms: expected a comma-separated list of arms among {', '.join(ARM_NAMES)}, got {text!r}")
    for i, a in enumerate(arms):
        if a not in ARM_NAMES:
            cmd.error(f"--arms: expected arms among {', '.join(ARM_NAMES)}, got {a!r}")
        if a in arms[:i]:
            cmd.error(f"--arms: expected each arm once, got {a!r} twice")
    return arms


def _count(flag: str, text: str | None, default: int, cmd: argparse.ArgumentParser) -> int:
    if text is None:
        return default
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        what = {"--seeds": "seeds", "--tuning-seeds": "tuning seeds"}.get(flag, "processes")
        cmd.error(f"{flag}: expected a number of {what} >= 1, got {text!r}")
    return n


# --------------------------------------------------------------------------- #
# The output directory
# --------------------------------------------------------------------------- #


def _settings(config: TrainConfig) -> dict[str, Any]:
    """The settings every run of a compare shares: the config without what differs per run
    (arm, seed, out, init_from, resume) or may change on --resume (:data:`_RESUMABLE`)."""
    skip = {"arm", "seed", "out", "init_from", "resume", *_RESUMABLE}
    return {k: v for k, v in config.to_dict().items() if k not in skip}


def _differing(saved: dict[str, Any], config: TrainConfig) -> str | None:
    """The first shared setting on which a saved config (dict) and ``config`` differ."""
    want = _settings(config)
    for key, value in want.items():
        if key in saved and saved[key] != value:
            return f"--{key.replace('_', '-')}: the runs in --out have {key}={saved[key]!r}, got {value!r}"
    return None


def _saved_config(out: Path) -> dict[str, Any] | None:
    try:
        saved: dict[str, Any] = json.loads((out / "config.json").read_text())
        return saved
    except (OSError, ValueError):
        return None


def _holds_compare(out: Path) -> bool:
    """Whether ``out`` holds a compare's files or any run."""
    return run_dir.holds_run(out) or any((out / name).exists() for name in (*_OWN_ENTRIES, *ARM_NAMES))


def _clear_compare(out: Path) -> None:
    """Delete a compare's own files in ``out``: :data:`_OWN_ENTRIES` and the runs in
    ``<arm>/seed<s>/`` (their run files only; a directory left empty goes too)."""
    for name in _OWN_ENTRIES:
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    for arm in ARM_NAMES:
        if not (out / arm).is_dir():
            continue
        for seed_dir in (out / arm).glob("seed*"):
            if seed_dir.is_dir():
                run_dir.clear_run(seed_dir)
                with contextlib.suppress(OSError):
                    seed_dir.rmdir()
        with contextlib.suppress(OSError):
            (out / arm).rmdir()


def _check_out(
    out: Path,
    base: TrainConfig,
    configs: dict[str, TrainConfig],
    resume: bool,
    overwrite: bool,
    protocol: dict[str, Any],
) -> str | None:
    """Why ``out`` cannot take this compare (a message naming the flag), or None.
    ``configs`` maps each run's directory under ``out`` to its config; ``protocol`` is the
    grid and the tuning seeds (``compare.json`` must have the same)."""
    if out.exists() and not out.is_dir():
        return f"--out: expected a directory, got {str(out)!r}, a file"
    if resume and overwrite:
        return "--overwrite: expected --resume or --overwrite, not both"
    if (out / "config.json").is_file() and not (out / "compare.json").is_file():
        return f"--out: {str(out)!r} holds a run of comppo-core train ({run_dir.describe_run(out)}), not a compare"
    if overwrite or not _holds_compare(out):
        return None
    if not resume:
        return (
            f"--out: {str(out)!r} already holds a compare (or a run); continue it with --resume (same settings) or "
            "replace it with --overwrite"
        )
    try:
        record = json.loads((out / "compare.json").read_text())
        saved = record["settings"]
    except (OSError, ValueError, KeyError, TypeError):
        record, saved = {}, None
    if saved is not None and (why := _differing(saved, base)):
        return why
    if "init_from" in record and record["init_from"] != base.init_from:  # every run's starting policy
        return f"--init-from: the runs in --out started from {record['init_from']!r}, got {base.init_from!r}"
    for key, flag in (("grid", "--grid"), ("tuning_seeds", "--tuning-seeds")):
        if saved is not None and record.get(key) != protocol[key]:
            return f"{flag}: the compare in --out has {key} {record.get(key)!r}, got {protocol[key]!r}"
    for rel, config in configs.items():  # the runs themselves (also a compare without compare.json)
        saved_run = _saved_config(out / rel)
        if saved_run is not None and (why := _differing(saved_run, config)):
            return f"{why} ({rel})"
    return None


def _finished(out: Path, config: TrainConfig) -> dict[str, Any] | None:
    """The summary of a run finished in ``out`` with ``config``'s settings, or None."""
    saved = _saved_config(out)
    if saved is None or _differing(saved, config) or saved.get("steps") != config.steps:
        return None
    try:
        summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
        return summary
    except (OSError, ValueError):
        return None


def _warm_start(base: TrainConfig, seed: int, out: Path) -> tuple[str, bool]:
    """Warm-start seed ``seed`` into ``out`` (reusing one made there with the same settings);
    the path of the policy every arm of the seed starts from, and whether it was made now."""
    from ..rl.trainer import Trainer

    config = base.replace(seed=seed, out=str(out), init_from=None, progress=False)
    policy = out / "warmstart"
    saved = _saved_config(out)
    if saved is not None and not _differing(saved, config) and (policy / "task.json").is_file():
        return str(policy), False  # task.json: written after the weights
    Trainer(config, overwrite=True)  # this compare's own warm start, unfinished or absent
    return str(policy), True


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #


class _Stopped(Exception):
    """Asked to stop between two runs (the one named is finished)."""


def _continues(run_out: Path) -> bool:
    """Whether ``run_out`` holds an unfinished run to resume (a checkpoint and its config)."""
    return run_dir.saved_checkpoint(run_out) is not None and _saved_config(run_out) is not None


def _train_job(config: TrainConfig, resume: bool) -> tuple[str, Any]:
    """One run in a worker process (``compare --jobs``): ``("done", summary)``,
    ``("nonfinite", the NonFiniteError)`` or ``("stopped", next step)`` after Ctrl-C / SIGTERM (which
    reach the workers of a terminal's process group too: each finishes its step and
    checkpoints)."""
    from ..rl.interrupts import GracefulStop, TrainingInterrupted
    from ..rl.trainer import Trainer

    with GracefulStop() as stop:
        trainer = Trainer(config.replace(resume=resume), overwrite=not resume)
        try:
            return "done", trainer.train(stop=stop)
        except NonFiniteError as exc:
            return "nonfinite", exc
        except TrainingInterrupted as exc:
            return "stopped", exc.next_step
        finally:
            trainer.dist.close()


def _ignore_interrupts() -> None:
    """A worker between runs ignores Ctrl-C (the compare process decides); during a run,
    :func:`_train_job`'s ``GracefulStop`` handles it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _pool(jobs: int) -> Any:
    """``jobs`` worker processes (spawned: a fresh interpreter each, one torch thread per run)."""
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_ignore_interrupts
    )
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _Runner:
    """Makes (or reuses) the warm starts and runs of one compare, timing them; a tuning
    run stopped by a non-finite value is recorded in ``grid/nonfinite.json`` (a collapse)."""

    def __init__(
        self, cmd: argparse.ArgumentParser, out: Path, base: TrainConfig, total: int, stop: Any, jobs: int = 1
    ) -> None:
        self.cmd, self.out, self.base, self.total, self.stop, self.jobs = cmd, out, base, total, stop, jobs
        self.timings_path = out / "timings.json"
        try:  # seconds each warm start and run took when it ran (kept for the runs a rerun reuses)
            self.timings: dict[str, float] = json.loads(self.timings_path.read_text())
        except (OSError, ValueError):
            self.timings = {}
        self.nonfinite_path = out / "grid" / "nonfinite.json"
        try:
            self.nonfinite: dict[str, Any] = json.loads(self.nonfinite_path.read_text())
        except (OSError, ValueError):
            self.nonfinite = {}
        self.keys: list[str] = []
        self.done = self.reused = 0
        self._init_from: dict[int, str | None] = {}
        self.warm_needed = base.init_from is None and base.model is None

    def init_from(self, seed: int) -> str | None:
        """The policy seed ``seed``'s runs start from: its warm start (made on first use)."""
        if seed in self._init_from:
            return self._init_from[seed]
        init_from = self.base.init_from
        if self.warm_needed:
            t0 = time.perf_counter()
            try:  # a bad path (the task file, say) is found here: a usage error naming its flag
                init_from, made = _warm_start(self.base, seed, self.out / "warmstart" / f"seed{seed}")
            except ParameterError as exc:
                usage_error(self.cmd, exc)
            key = f"warmstart/seed{seed}"
            self.keys.append(key)
            if made:
                self.timings[key] = time.perf_counter() - t0
                run_dir.write_json_atomic(self.timings_path, self.timings)
            status = f"made in {self.timings[key]:.0f} s" if made else "reused"
            print(f"[seed {seed}] warm start {init_from} ({status})", flush=True)
        self._init_from[seed] = init_from
        return init_from

    def run(self, rel: str, config: TrainConfig, label: str) -> dict[str, Any] | None:
        """Run (or reuse) the run in ``OUT/rel``; its summary, or None for a tuning run
        (``eval_split="validation"``) stopped by a non-finite value."""
        from ..rl.trainer import Trainer

        run_out = self.out / rel
        config = config.replace(out=str(run_out), init_from=self.init_from(config.seed))
        tuning = config.eval_split == "validation"
        self.done += 1
        self.keys.append(rel)
        split = "validation" if tuning else "held-out"
        if tuning and rel in self.nonfinite:
            self.reused += 1
            print(f"[{self.done}/{self.total}] {label}: stopped on a non-finite value (reused)", flush=True)
            return self._after(label, None)
        summary = _finished(run_out, config)
        t0 = time.perf_counter()
        status = "reused"
        if summary is None:
            go_on = _continues(run_out)
            try:
                trainer = Trainer(config.replace(resume=go_on), overwrite=not go_on)
            except ParameterError as exc:  # a bad --init-from, --model or --task
                usage_error(self.cmd, exc)
            try:
                summary = trainer.train(stop=self.stop)
            except NonFiniteError as exc:
                if not tuning:
                    raise
                self._nonfinite(rel, str(exc))
            finally:
                trainer.dist.close()
            status = self._timed(rel, time.perf_counter() - t0, go_on)
        else:
            self.reused += 1
        self._print(label, summary, status, split)
        return self._after(label, summary)

    def _nonfinite(self, rel: str, message: str) -> None:
        self.nonfinite[rel] = {"message": message}
        run_dir.write_json_atomic(self.nonfinite_path, self.nonfinite)

    def _timed(self, rel: str, seconds: float, resumed: bool) -> str:
        """Record a run's seconds (added to its earlier part when resumed); its status text."""
        self.timings[rel] = seconds + self.timings.get(rel, 0.0) * resumed
        run_dir.write_json_atomic(self.timings_path, self.timings)
        return f"{self.timings[rel]:.0f} s" + (", resumed" if resumed else "")

    def _print(self, label: str, summary: dict[str, Any] | None, status: str, split: str, done: int = 0) -> None:
        n = done or self.done
        if summary is None:
            print(f"[{n}/{self.total}] {label}: stopped on a non-finite value ({status})", flush=True)
        else:
            first, final = summary["initial_eval_accuracy"], summary["final_eval_accuracy"]
            print(
                f"[{n}/{self.total}] {label}: {split} accuracy {report.pct(first)}% -> {report.pct(final)}% ({status})",
                flush=True,
            )

    def run_all(self, items: list[tuple[str, TrainConfig, str]]) -> dict[str, dict[str, Any] | None]:
        """Every run of ``items`` (``(rel, config, label)``), ``jobs`` at once; the summaries
        by ``rel`` (None: a tuning run stopped by a non-finite value). With ``jobs > 1``
        each run (and each missing warm start, first) runs in a worker process of one
        torch thread; a worker's result is recorded and printed as it arrives."""
        if self.jobs == 1:
            return {rel: self.run(rel, config, label) for rel, config, label in items}
        results: dict[str, dict[str, Any] | None] = {}
        todo: list[tuple[str, TrainConfig, str, bool]] = []
        with _pool(self.jobs) as pool:
            self._warm_starts(pool, sorted({config.seed for _, config, _ in items}))
            for rel, config, label in items:
                run_out = self.out / rel
                config = config.replace(out=str(run_out), init_from=self.init_from(config.seed))
                self.keys.append(rel)
                tuning = config.eval_split == "validation"
                summary = None if tuning and rel in self.nonfinite else _finished(run_out, config)
                if summary is None and not (tuning and rel in self.nonfinite):
                    todo.append((rel, config, label, _continues(run_out)))
                    continue
                self.done += 1
                self.reused += 1
                results[rel] = summary
                self._print(label, summary, "reused", "validation" if tuning else "held-out")
            futures = {
                pool.submit(_train_job, config, go_on): (rel, config, label, go_on, time.perf_counter())
                for rel, config, label, go_on in todo
            }
            stopped: str | None = None
            for future in concurrent.futures.as_completed(futures):
                rel, config, label, go_on, t0 = futures[future]
                try:
                    kind, value = future.result()
                except ParameterError as exc:  # a bad --init-from, --model or --task
                    pool.shutdown(cancel_futures=True)
                    usage_error(self.cmd, exc)
                tuning = config.eval_split == "validation"
                if kind == "stopped":
                    stopped = stopped or f"{label}, stopped after step {value}"
                    continue
                if kind == "nonfinite":
                    if not tuning:
                        pool.shutdown(cancel_futures=True)
                        raise value  # the worker's NonFiniteError, as one process raises it
                    self._nonfinite(rel, str(value))
                    value = None
                self.done += 1
                results[rel] = value
                status = self._timed(rel, time.perf_counter() - t0, go_on)
                self._print(label, value, status, "validation" if tuning else "held-out")
                if self.stop() and stopped is None:
                    stopped = label
                    for f in futures:
                        f.cancel()
            if stopped is not None:
                raise _Stopped(stopped)
        return results

    def _warm_starts(self, pool: concurrent.futures.Executor, seeds: list[int]) -> None:
        """Make (or reuse) the warm starts of ``seeds`` that this compare has not read yet, in ``pool``."""
        missing = [seed for seed in seeds if seed not in self._init_from]
        if not self.warm_needed:
            for seed in missing:
                self._init_from[seed] = self.base.init_from
            return
        t0 = time.perf_counter()
        jobs = {
            seed: pool.submit(_warm_start, self.base, seed, self.out / "warmstart" / f"seed{seed}") for seed in missing
        }
        for seed, job in jobs.items():
            try:
                init_from, made = job.result()
            except ParameterError as exc:
                usage_error(self.cmd, exc)
            key = f"warmstart/seed{seed}"
            self.keys.append(key)
            if made:
                self.timings[key] = time.perf_counter() - t0
                run_dir.write_json_atomic(self.timings_path, self.timings)
            status = f"made in {self.timings[key]:.0f} s" if made else "reused"
            print(f"[seed {seed}] warm start {init_from} ({status})", flush=True)
            self._init_from[seed] = init_from

    def _after(self, label: str, summary: dict[str, Any] | None) -> dict[str, Any] | None:
        if self.stop():  # between two runs: this one is finished
            raise _Stopped(label)
        return summary


def _tune(
    runner: _Runner, grid: Grid, arms: list[str], seeds: list[int], configs: dict[str, TrainConfig]
) -> dict[str, list[list[Outcome]]]:
    """Every tuning run (point by point, seed by seed, arm by arm); ``outcomes[arm][point][k]``."""
    items = []
    for i, point in enumerate(grid.points):
        name = grid.name(i)
        (runner.out / "grid" / name).mkdir(parents=True, exist_ok=True)
        run_dir.write_json_atomic(runner.out / "grid" / name / "point.json", {"point": name, "settings": point})
        for t in seeds:
            for arm in arms:
                rel = f"grid/{name}/{arm}/seed{t}"
                items.append((rel, configs[rel], f"{arm} {name} seed {t}"))
    summaries = runner.run_all(items)
    outcomes: dict[str, list[list[Outcome]]] = {arm: [[] for _ in grid.points] for arm in arms}
    for i in range(len(grid.points)):
        for t in seeds:
            for arm in arms:
                rel = f"grid/{grid.name(i)}/{arm}/seed{t}"
                summary = summaries[rel]
                if summary is None:
                    outcome = Outcome(None, None, nonfinite=runner.nonfinite[rel]["message"])
                else:
                    outcome = Outcome(summary["initial_eval_accuracy"], summary["final_eval_accuracy"])
                outcomes[arm][i].append(outcome)
    return outcomes


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core compare``; returns the exit status."""
    cmd: argparse.ArgumentParser = args.command_parser
    for name, instead in _OWN_FLAGS.items():
        if not isinstance(getattr(args, name), _Default):
            cmd.error(f"--{name.replace('_', '-')}: not a compare flag ({instead})")
    if not isinstance(args.out, str):
        cmd.error("--out: expected the output directory DIR, got none")
    resume = args.resume is True
    arms = _arms(args.arms, cmd)
    grid: Grid | None = None
    if args.grid is not None:
        try:
            grid = parse_grid(args.grid)
        except ParameterError as exc:
            usage_error(cmd, exc)
    elif args.tuning_seeds is not None:
        cmd.error("--tuning-seeds: only with --grid (the seeds a grid's settings are chosen on)")
    n_seeds = _count("--seeds", args.seeds, DEFAULT_REPORTING_SEEDS if grid else 3, cmd)
    jobs = _count("--jobs", args.jobs, 1, cmd)
    tseeds = tuning_seeds(_count("--tuning-seeds", args.tuning_seeds, DEFAULT_TUNING_SEEDS, cmd)) if grid else []
    if grid and n_seeds > FIRST_TUNING_SEED:
        cmd.error(
            f"--seeds: expected at most {FIRST_TUNING_SEED} with --grid (disjoint from the tuning seeds), got {n_seeds}"
        )
    fixed: dict[str, Any] = {}
    if grid and isinstance(args.validation_fraction, _Default):
        fixed["validation_fraction"] = DEFAULT_VALIDATION_FRACTION
    base = config_from_args(args, cmd, arm=arms[0], seed=0, resume=False, **fixed)
    if base.eval_every == 0:
        cmd.error("--eval-every: expected >= 1 (compare reports the held-out accuracy), got 0")
    if grid and not base.validation_fraction:
        cmd.error(
            "--validation-fraction: expected > 0 with --grid (the settings are chosen on the validation split), got 0"
        )
    configs: dict[str, TrainConfig] = {}
    if grid is None:
        for arm in arms:
            for seed in range(n_seeds):
                try:
                    configs[f"{arm}/seed{seed}"] = base.replace(arm=arm, seed=seed)
                except ParameterError as exc:  # a setting invalid for one arm
                    usage_error(cmd, exc)
    else:
        try:
            grid.check(base, arms)
        except ParameterError as exc:
            usage_error(cmd, exc)
        for i, point in enumerate(grid.points):
            for arm in arms:
                for t in tseeds:
                    config = base.replace(arm=arm, seed=t, eval_split="validation", **point)
                    configs[f"grid/{grid.name(i)}/{arm}/seed{t}"] = config
    assert base.out is not None
    out = Path(base.out)
    protocol = {"grid": None if grid is None else grid.to_dict(), "tuning_seeds": tseeds or None}
    refused = _check_out(out, base, configs, resume, args.overwrite, protocol)
    if refused:
        cmd.error(refused)
    try:
        check_paths(base.replace(out=None), overwrite=False)
    except ParameterError as exc:
        usage_error(cmd, exc)
    require_rl_extra("compare")
    from ..rl.interrupts import GracefulStop, TrainingInterrupted, exit_status

    show_log_lines()
    if args.overwrite:
        _clear_compare(out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"settings": _settings(base), "init_from": base.init_from, "arms": arms, "seeds": n_seeds, **protocol}
    run_dir.write_json_atomic(out / "compare.json", record)

    t_start = time.perf_counter()
    summaries: dict[tuple[str, int], dict[str, Any]] = {}
    hint = "rerun the same command with --resume to continue"
    outcomes: dict[str, list[list[Outcome]]] = {}
    chosen: dict[str, int] = {}
    with GracefulStop() as stop:
        runner = _Runner(cmd, out, base, len(configs) + len(arms) * n_seeds * (grid is not None), stop, jobs)
        try:
            if grid is not None:
                outcomes = _tune(runner, grid, arms, tseeds, configs)
                chosen = {arm: choose(outcomes[arm]) for arm in arms}
                choice = {arm: {"point": grid.name(i), "settings": grid.points[i]} for arm, i in chosen.items()}
                run_dir.write_json_atomic(out / "grid" / "choice.json", choice)
                for arm, i in chosen.items():
                    k, n = stability(outcomes[arm])
                    print(f"{arm}: chose {grid.name(i)} ({grid.describe(grid.points[i])}); {k}/{n} stable", flush=True)
                for arm in arms:
                    for seed in range(n_seeds):
                        rel = f"{arm}/seed{seed}"
                        configs[rel] = base.replace(arm=arm, seed=seed, **grid.points[chosen[arm]])
                        saved_run = _saved_config(out / rel)
                        if saved_run is not None and (why := _differing(saved_run, configs[rel])):
                            cmd.error(
                                f"--grid: {rel} in --out holds a run at another setting than {arm}'s chosen one "
                                f"({why}); replace the compare with --overwrite"
                            )
            items = [
                (f"{arm}/seed{seed}", configs[f"{arm}/seed{seed}"], f"{arm} seed {seed}")
                for seed in range(n_seeds)
                for arm in arms
            ]
            reported = runner.run_all(items)
            for seed in range(n_seeds):
                for arm in arms:
                    summary = reported[f"{arm}/seed{seed}"]
                    assert summary is not None  # a reporting run's non-finite stop is raised
                    summaries[arm, seed] = summary
        except _Stopped as exc:
            print(f"comppo-core compare: stopped after {exc}; {hint}", file=sys.stderr)
            return exit_status(stop.signum or 2)
        except TrainingInterrupted as exc:
            print(f"comppo-core compare: stopped after step {exc.next_step} of a run; {hint}", file=sys.stderr)
            return exit_status(stop.signum or 2)
        except KeyboardInterrupt:
            print(f"comppo-core compare: stopped at once; the checkpoints written are kept; {hint}", file=sys.stderr)
            return exit_status(2)
    seconds = time.perf_counter() - t_start
    table, inter = report.write_results(
        out,
        base,
        args.preset or "default",
        summaries,
        arms,
        n_seeds,
        report.Timing(runner.keys, runner.timings, runner.reused, seconds),
        report.Tuning(grid, outcomes, chosen, tseeds) if grid is not None else None,
    )
    print(table, end="")
    if inter is not None:
        print(report.interaction_line(inter), end="")
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'curves.png'} ({seconds / 60:.1f} min)")
    return 0
