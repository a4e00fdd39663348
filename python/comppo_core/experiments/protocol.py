"""An experiment, end to end: every arm × seed from paired warm starts, tuned on a grid
first if asked, with its results: :func:`run_experiment` (``comppo-core compare``).

For each reporting seed ``s`` in ``0 … n−1`` the seed's policy is warmed up once (the SFT
warm start of :class:`~comppo_core.rl.Trainer`, into ``OUT/warmstart/seed<s>/``), then every
arm runs from that checkpoint (``init_from``) with the same settings and seed, so the arms
of a seed differ only in their critic and advantages: the same initial policy, the same
prompts, the same evaluation set (a paired comparison). With ``base.model`` or
``base.init_from`` there is no warm start: every run starts from that model.

**With a grid** (:mod:`comppo_core.experiments.grid`, :mod:`comppo_core.experiments.tuning`):
every arm runs every point on the tuning seeds ``1000, 1001, …``, evaluated on the
validation split; each arm's setting is the point with the best mean final validation
accuracy (:func:`~comppo_core.experiments.tuning.choose`); then every arm runs the
reporting seeds at its chosen setting, evaluated on the held-out split.

Outputs under ``OUT`` (:data:`OWN_ENTRIES` and the runs)::

    compare.json            the settings every run shares (checked on resume)
    warmstart/seed<s>/      the warm starts
    <arm>/seed<s>/          each run's config.json, metrics.jsonl, summary.json, checkpoint/
    grid/p<k>/point.json    with a grid: point k's settings, and its tuning runs <arm>/seed<t>/
    grid/nonfinite.json     tuning runs stopped by a non-finite value (a collapse)
    grid/choice.json        each arm's chosen point
    results.md, results.json, curves.png   (:func:`comppo_core.experiments.report.write_results`)
    timings.json            the seconds each warm start and run took when it ran

**Never mixing runs** (:func:`check_out`). A directory that already holds an experiment
(or any run) is refused unless ``resume`` or ``overwrite``. ``resume`` continues it with
the same settings (``compare.json``, the grid and the tuning seeds included; a differing
setting is refused, named): finished runs are reused, interrupted ones resume from their
checkpoint, and more arms or seeds may be added. ``overwrite`` deletes the experiment's own
files (:func:`clear_compare`) and starts again.

**On TRL** (``settings.engine == "trl"``): every run starts from ``base.model`` (no warm
starts), each a process of its own (:mod:`comppo_core.experiments.trl_engine`);
``compare.json`` records the engine, the launcher and the ``--trl-config`` (its settings and
hash), and ``resume`` refuses another, naming ``engine``, ``launcher`` or ``trl_config``.

Everything that can be refused is refused by :class:`Experiment` (its constructor) before
anything is written or torch is imported: a :class:`~comppo_core.errors.ParameterError`
whose ``argument`` names the setting (:mod:`comppo_core.experiments.settings`).
:meth:`Experiment.run` then trains; it polls ``stop`` between steps, raising
:class:`~comppo_core.experiments.runs.Stopped` (between runs) or
:class:`~comppo_core.rl.runs.interrupts.TrainingInterrupted` (within one) when it returns
True, the checkpoints kept for a resume.

Imports no torch (it is imported when :meth:`Experiment.run` trains).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from ..options import ARM_NAMES
from ..rl.config import TrainConfig, upgrade_fields
from ..rl.paths import check_paths
from ..rl.runs import run_dir
from . import report, runs, trl_engine
from .grid import Grid
from .settings import CompareSettings
from .tuning import Outcome, choose, stability

__all__ = [
    "OWN_ENTRIES",
    "Experiment",
    "ExperimentResult",
    "check_out",
    "clear_compare",
    "holds_compare",
    "run_experiment",
]

#: What an experiment writes directly under OUT (with the <arm>/seed<s>/ run directories).
OWN_ENTRIES = (
    "compare.json",
    "results.md",
    "results.json",
    "timings.json",
    "curves.png",
    "warmstart",
    "grid",
)


def holds_compare(out: Path) -> bool:
    """Whether ``out`` holds an experiment's files or any run."""
    return run_dir.holds_run(out) or any((out / name).exists() for name in (*OWN_ENTRIES, *ARM_NAMES))


def clear_compare(out: Path) -> None:
    """Delete an experiment's own files in ``out``: :data:`OWN_ENTRIES` and the runs in
    ``<arm>/seed<s>/`` (their run files only; a directory left empty goes too)."""
    for name in OWN_ENTRIES:
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
                trl_engine.clear_trl_run(seed_dir)
                with contextlib.suppress(OSError):
                    seed_dir.rmdir()
        with contextlib.suppress(OSError):
            (out / arm).rmdir()


def check_out(
    out: Path,
    base: TrainConfig,
    configs: dict[str, TrainConfig],
    resume: bool,
    overwrite: bool,
    protocol: dict[str, Any],
    engine: dict[str, Any] | None = None,
) -> None:
    """Refuse an ``out`` that cannot take this experiment: a ParameterError naming the
    setting at fault (``out``, ``overwrite``, ``init_from``, ``grid``, ``tuning_seeds`` or
    the first shared setting that differs from the runs there). ``configs`` maps each
    run's directory under ``out`` to its config; ``protocol`` is the grid and the tuning
    seeds (``compare.json`` must have the same on resume)."""
    if out.exists() and not out.is_dir():
        raise ParameterError(f"out: expected a directory, got {str(out)!r}, a file", argument="out")
    if resume and overwrite:
        raise ParameterError("overwrite: expected --resume or --overwrite, not both", argument="overwrite")
    if (out / "config.json").is_file() and not (out / "compare.json").is_file():
        raise ParameterError(
            f"out: {str(out)!r} holds a run of comppo-core train ({run_dir.describe_run(out)}), not a compare",
            argument="out",
        )
    if overwrite or not holds_compare(out):
        return
    if not resume:
        raise ParameterError(
            f"out: {str(out)!r} already holds a compare (or a run); continue it with --resume (same settings) or "
            "replace it with --overwrite",
            argument="out",
        )
    try:
        record = json.loads((out / "compare.json").read_text())
        saved = upgrade_fields(record["settings"])  # a field renamed since (gate_invert → gate_direction)
    except (OSError, ValueError, KeyError, TypeError, ParameterError):
        record, saved = {}, None
    if saved is not None and (why := runs.differing(saved, base)) is not None:
        raise why
    if "init_from" in record and record["init_from"] != base.init_from:  # every run's starting policy
        raise ParameterError(
            f"init_from: the runs in --out started from {record['init_from']!r}, got {base.init_from!r}",
            argument="init_from",
        )
    if saved is not None:
        _check_engine(record.get("engine"), engine)
    for key in ("grid", "tuning_seeds"):
        if saved is not None and record.get(key) != protocol[key]:
            raise ParameterError(
                f"{key}: the compare in --out has {key} {record.get(key)!r}, got {protocol[key]!r}", argument=key
            )
    for rel, config in configs.items():  # the runs themselves (also a compare without compare.json)
        saved_run = runs.saved_config(out / rel)
        if saved_run is not None and (why := runs.differing(saved_run, config)) is not None:
            raise ParameterError(f"{why} ({rel})", argument=why.argument)


def _check_engine(recorded: dict[str, Any] | None, engine: dict[str, Any] | None) -> None:
    """Refuse resuming a compare on another engine, launcher or ``--trl-config`` (by its
    settings' hash) than the one it was made with, naming the setting."""
    was = "package" if recorded is None else recorded.get("engine", "trl")
    now = "package" if engine is None else "trl"
    if was != now:
        raise ParameterError(
            f"engine: the compare in --out ran on the {was} engine, got --engine {now}", argument="engine"
        )
    if recorded is None or engine is None:
        return
    if recorded.get("launcher") != engine.get("launcher"):
        raise ParameterError(
            f"launcher: the compare in --out ran its runs under {recorded.get('launcher')!r}, got "
            f"{engine.get('launcher')!r}",
            argument="launcher",
        )

    def digest(r: dict[str, Any]) -> str | None:
        t = r.get("trl_config")
        return None if t is None else t.get("sha256")

    if digest(recorded) != digest(engine):
        was_path = (recorded.get("trl_config") or {}).get("path")
        raise ParameterError(
            f"trl_config: the compare in --out ran with the TRL settings of {was_path!r} (sha256 "
            f"{digest(recorded)}), got {digest(engine)} (a different file or contents)",
            argument="trl_config",
        )


def _as_flag(error: ParameterError) -> str:
    """``error``'s message with its setting spelled as compare's flag (``--actor-lr: …``)."""
    name = error.argument or ""
    return f"--{name.replace('_', '-')}: {str(error).removeprefix(f'{name}: ')}"


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """What :meth:`Experiment.run` made.

    Attributes:
      out: the experiment's directory.
      table: the main markdown table of ``results.md`` (final held-out accuracy per arm,
        mean and 95% CI over seeds, paired differences;
        :func:`~comppo_core.experiments.report.results_table`).
      interaction: the 2×2 interaction (:func:`~comppo_core.experiments.statistics.interaction`),
        None unless its four arms ran.
      summaries: each reporting run's summary, by ``(arm, seed)``.
      chosen: with a grid, each arm's chosen point, ``{"point": "p<k>", "settings": {...}}``
        (``grid/choice.json``); empty without.
      seconds: this invocation's wall time for the warm starts and runs.
    """

    out: Path
    table: str
    interaction: dict[str, Any] | None
    summaries: dict[tuple[str, int], dict[str, Any]]
    chosen: dict[str, dict[str, Any]]
    seconds: float

    @property
    def written(self) -> list[Path]:
        """The result files: ``results.md``, ``results.json`` and ``curves.png``."""
        return [self.out / "results.md", self.out / "results.json", self.out / "curves.png"]


class Experiment:
    """One experiment of ``settings``, checked (module docstring): the constructor raises a
    :class:`~comppo_core.errors.ParameterError` naming the first setting at fault, having
    written nothing and imported no torch; :meth:`run` trains and writes the results.

    Attributes (after the checks): ``settings`` (resolved:
    :meth:`~comppo_core.experiments.settings.CompareSettings.resolved`), ``base`` (the
    shared TrainConfig), ``out``, ``arms``, ``n_seeds``, ``grid``, ``tuning_seeds`` (a
    list), ``source`` (the directory warm starts are copied from, or None) and
    ``configs`` (each run's TrainConfig by its directory under ``out``: the tuning runs
    with a grid, else the reporting runs)."""

    def __init__(self, settings: CompareSettings) -> None:
        settings = settings.resolved()
        self.settings = settings
        self.base: TrainConfig = settings.base
        self.out: Path = settings.out
        self.arms: list[str] = list(settings.arms)
        self.n_seeds: int = settings.n_seeds
        self.grid: Grid | None = settings.grid
        self.tuning_seeds: list[int] = settings.tuning_seed_list
        self.configs: dict[str, TrainConfig] = self._planned()
        self.protocol: dict[str, Any] = {
            "grid": None if self.grid is None else self.grid.to_dict(),
            "tuning_seeds": self.tuning_seeds or None,
        }
        #: the TRL engine's record (None: the package's engine)
        self.engine: dict[str, Any] | None = None
        if settings.engine == "trl":
            self.engine = trl_engine.engine_record(settings.trl_config, settings.launcher)
            for rel, config in self.configs.items():  # a grid point TRL cannot run (kl_kind=k2, ...)
                try:
                    trl_engine.check_config(config)
                except ParameterError as exc:
                    raise ParameterError(f"grid: {rel}: {exc}", argument="grid") from None
        check_out(self.out, self.base, self.configs, settings.resume, settings.overwrite, self.protocol, self.engine)
        check_paths(self.base.replace(out=None), overwrite=False)
        self.source: Path | None = self._warm_start_source(settings.warm_starts)

    def _planned(self) -> dict[str, TrainConfig]:
        """Every run's config before the tuning: the reporting runs without a grid (a
        setting invalid for one arm is refused here), the tuning runs with one (every
        point checked with every arm; a repeat, :meth:`Grid.first_alike`, is not planned)."""
        base, grid = self.base, self.grid
        configs: dict[str, TrainConfig] = {}
        if grid is None:
            for arm in self.arms:
                for seed in range(self.n_seeds):
                    configs[f"{arm}/seed{seed}"] = base.replace(arm=arm, seed=seed)
            return configs
        grid.check(base, self.arms)
        alike = {arm: grid.first_alike(arm) for arm in self.arms}
        for i, point in enumerate(grid.points):
            for arm in self.arms:
                if alike[arm][i] != i:  # the same run as an earlier point's (grid.py, "Repeats")
                    continue
                for t in self.tuning_seeds:
                    config = base.replace(arm=arm, seed=t, eval_split="validation", **point)
                    configs[f"grid/{grid.name(i)}/{arm}/seed{t}"] = config
        return configs

    def _warm_start_source(self, source: Path | None) -> Path | None:
        """The experiment whose warm starts are copied (``warm_starts``), checked; None for
        none, or for this experiment's own directory (its warm starts are reused as they are)."""
        if source is None:
            return None
        base = self.base
        if base.init_from is not None or base.model is not None:
            raise ParameterError(
                "warm_starts: only without --init-from and --model (those runs make no warm start)",
                argument="warm_starts",
            )
        if not (source / "compare.json").is_file() or not (source / "warmstart").is_dir():
            raise ParameterError(
                f"warm_starts: expected the directory of a compare with warm starts, got {str(source)!r}",
                argument="warm_starts",
            )
        if source.resolve() == self.out.resolve():
            return None
        runs.check_warm_starts(source, base, [*range(self.n_seeds), *self.tuning_seeds])
        return source

    def run(self, stop: Callable[[], bool] | None = None, say: Callable[[str], None] = runs.say) -> ExperimentResult:
        """Make (or reuse) every warm start and run, tuning first with a grid, and write
        the results (module docstring); ``stop`` is polled between steps and runs, ``say``
        prints each line of progress. Raises what :class:`~comppo_core.experiments.runs.Runner`
        raises (a stop, a ParameterError found while a run is built, a reporting run's
        NonFiniteError), and a ParameterError naming ``grid`` when ``out`` holds a
        reporting run at another setting than its arm's chosen one."""
        settings, base, out, grid, arms, n_seeds = (
            self.settings,
            self.base,
            self.out,
            self.grid,
            self.arms,
            self.n_seeds,
        )
        if settings.overwrite:
            clear_compare(out)
        out.mkdir(parents=True, exist_ok=True)
        record = {
            "settings": runs.settings_of(base),
            "init_from": base.init_from,
            "arms": arms,
            "seeds": n_seeds,
            **self.protocol,
            **({} if self.engine is None else {"engine": self.engine}),
        }
        run_dir.write_json_atomic(out / "compare.json", record)

        t_start = time.perf_counter()
        configs = dict(self.configs)
        total = len(configs) + len(arms) * n_seeds * (grid is not None)
        runner = runs.Runner(out, base, total, stop, settings.jobs, self.source, say, engine=self.engine)
        say(plan_line(total, base.steps, settings.jobs, runner.timings))
        outcomes: dict[str, list[list[Outcome]]] = {}
        chosen: dict[str, int] = {}
        choice: dict[str, dict[str, Any]] = {}
        if grid is not None:
            outcomes = runs.tune(runner, grid, arms, self.tuning_seeds, configs)
            chosen = {arm: choose(outcomes[arm]) for arm in arms}
            choice = {arm: {"point": grid.name(i), "settings": grid.points[i]} for arm, i in chosen.items()}
            run_dir.write_json_atomic(out / "grid" / "choice.json", choice)
            for arm, i in chosen.items():
                k, n = stability(outcomes[arm])
                say(f"{arm}: chose {grid.name(i)} ({grid.describe(grid.points[i])}); {k}/{n} stable")
            for arm in arms:
                for seed in range(n_seeds):
                    rel = f"{arm}/seed{seed}"
                    configs[rel] = base.replace(arm=arm, seed=seed, **grid.points[chosen[arm]])
                    saved_run = runs.saved_config(out / rel)
                    if saved_run is not None and (why := runs.differing(saved_run, configs[rel])) is not None:
                        raise ParameterError(
                            f"grid: {rel} in --out holds a run at another setting than {arm}'s chosen one "
                            f"({_as_flag(why)}); replace the compare with --overwrite",
                            argument="grid",
                        )
        items = [
            (f"{arm}/seed{seed}", configs[f"{arm}/seed{seed}"], f"{arm} seed {seed}")
            for seed in range(n_seeds)
            for arm in arms
        ]
        reported = runner.run_all(items)
        summaries: dict[tuple[str, int], dict[str, Any]] = {}
        for seed in range(n_seeds):
            for arm in arms:
                summary = reported[f"{arm}/seed{seed}"]
                assert summary is not None  # a reporting run's non-finite stop is raised
                summaries[arm, seed] = summary
        seconds = time.perf_counter() - t_start
        table, inter = report.write_results(
            out,
            base,
            settings.preset,
            summaries,
            arms,
            n_seeds,
            report.Timing(runner.keys, runner.timings, runner.reused, seconds),
            report.Tuning(grid, outcomes, chosen, self.tuning_seeds) if grid is not None else None,
            self.engine,
        )
        return ExperimentResult(out, table, inter, summaries, choice, seconds)


def plan_line(total: int, steps: int, jobs: int, timings: dict[str, float]) -> str:
    """The line a compare starts with: how many runs of how many steps, and what it will
    take: from ``timings`` (``timings.json``: the seconds of the runs an earlier call of the
    same compare made) when it holds runs, else after the first run."""
    runs_timed = [seconds for key, seconds in timings.items() if not key.startswith("warmstart/")]
    head = f"compare: {total} runs of {steps} steps, {jobs} at a time"
    if runs_timed:
        minutes = sum(runs_timed) / len(runs_timed) * total / jobs / 60
        return f"{head}; about {minutes:.0f} min at the pace of the {len(runs_timed)} runs timed before"
    return f"{head}; the time left is estimated after the first run"


def run_experiment(
    settings: CompareSettings, stop: Callable[[], bool] | None = None, say: Callable[[str], None] = runs.say
) -> ExperimentResult:
    """Check ``settings`` and run the experiment: ``Experiment(settings).run(stop, say)``
    (:class:`Experiment`; module docstring)."""
    return Experiment(settings).run(stop, say)
