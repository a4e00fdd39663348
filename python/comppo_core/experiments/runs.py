"""The runs of ``comppo-core compare``: warm starts, runs and tuning runs, one after another
or ``--jobs`` at once in worker processes, each made, resumed or reused.

A run in ``OUT/<rel>/`` is **reused** when it finished with the same shared settings
(:func:`settings_of`, compared by :func:`differing`), **resumed** when it holds a
checkpoint (:func:`continues`) and made otherwise. A seed's warm start is reused the same
way, else copied from another compare's directory (``--warm-starts DIR``,
:func:`copy_warm_start`) when that one was made with the same :data:`WARM_START_FIELDS`,
else made. With ``--jobs N`` every warm start and
run goes to one of N spawned worker processes (a fresh interpreter, one torch thread per
run: :func:`train_job`); the results are recorded (``timings.json``,
``grid/nonfinite.json``) and printed as they arrive.

**On TRL** (``engine``, :mod:`comppo_core.experiments.trl_engine`): each run is a process
of its own (:meth:`Runner._train_on_trl`), reused when finished with the same settings and engine
record, resumed from its last TRL checkpoint, made otherwise; a stop sends it one SIGTERM
(it finishes its PPO step and checkpoints). No warm starts: every run starts from
``base.model``.

**Stopping.** A stop reaches every worker however it was asked for: Ctrl-C in a terminal
(which signals the whole process group), SIGTERM to the compare process alone, or a
worker's own signal. The compare then sets a stop event that every worker reads at its
run's step boundaries (:func:`_init_worker`); each running run finishes its step and
checkpoints, the runs not started are cancelled (or skipped by a worker that already took
them), and the compare stops with the ``--resume`` hint (:class:`Stopped`). An idle
worker ignores Ctrl-C itself (the compare decides). A second signal stops the compare at
once, and a worker whose compare process is gone (that, SIGKILL, a crash) exits within
:data:`PARENT_POLL_S`, its run resumable from its last checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..errors import NonFiniteError, ParameterError
from ..rl.config import TASK_SIZES, TrainConfig, upgrade_fields
from ..rl.runs import run_dir
from . import report
from .grid import POLICY_FIELDS, Grid
from .tuning import Outcome

__all__ = [
    "RESUMABLE",
    "Runner",
    "Stopped",
    "check_warm_starts",
    "continues",
    "differing",
    "say",
    "finished",
    "saved_config",
    "settings_of",
    "train_job",
    "tune",
    "warm_start",
]

#: The settings a resumed compare may change (the runs' other settings must be the same).
RESUMABLE = ("progress", "num_threads", "device", "report_to", "save_every")


def settings_of(config: TrainConfig) -> dict[str, Any]:
    """The settings every run of a compare shares: the config without what differs per run
    (arm, seed, out, init_from, resume) or may change on --resume (:data:`RESUMABLE`)."""
    skip = {"arm", "seed", "out", "init_from", "resume", *RESUMABLE}
    return {k: v for k, v in config.to_dict().items() if k not in skip}


def differing(saved: dict[str, Any], config: TrainConfig) -> ParameterError | None:
    """The first shared setting (:func:`settings_of`) on which a saved config (dict) and
    ``config`` differ, as a ParameterError naming it (returned, not raised; ``str()``:
    ``"steps: the runs in --out have steps=2, got 3"``), or None when they agree."""
    want = settings_of(config)
    for key, value in want.items():
        if key in saved and saved[key] != value:
            return ParameterError(f"{key}: the runs in --out have {key}={saved[key]!r}, got {value!r}", argument=key)
    return None


def say(line: str) -> None:
    """Print one line of an experiment's progress on stdout, at once (what a
    :class:`Runner` and :func:`~comppo_core.experiments.protocol.run_experiment` print by default)."""
    print(line, flush=True)


def saved_config(out: Path) -> dict[str, Any] | None:
    """The ``config.json`` of the run in ``out`` as a dict, or None (absent, unreadable)."""
    try:
        saved: dict[str, Any] = json.loads((out / "config.json").read_text())
        # a field renamed since (gate_invert → gate_direction) reads as the setting it meant
        return upgrade_fields(saved) if isinstance(saved, dict) else None
    except (OSError, ValueError, ParameterError):
        return None


def finished(out: Path, config: TrainConfig) -> dict[str, Any] | None:
    """The summary of a run finished in ``out`` with ``config``'s settings, or None."""
    saved = saved_config(out)
    if saved is None or differing(saved, config) is not None or saved.get("steps") != config.steps:
        return None
    try:
        summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
        return summary
    except (OSError, ValueError):
        return None


#: The settings a warm start reads: its seed, the task and its split, the built-in policy
#: and its supervised warm-up (``rl.build.initial_policy``). Every other setting is the
#: RL's, so two compares that agree on these make the same warm start, bit for bit, and
#: ``compare --warm-starts DIR`` copies DIR's instead of making it again.
WARM_START_FIELDS = (
    "seed",
    "task",
    "digits",
    *TASK_SIZES,
    "split_seed",
    "heldout_fraction",
    "validation_fraction",
    "chat_template",
    *POLICY_FIELDS,
    "device",
)


def warm_start(base: TrainConfig, seed: int, out: Path, source: Path | None = None) -> tuple[str, str]:
    """Warm-start seed ``seed`` into ``out``: the path of the policy every arm of the seed
    starts from, and how it got there: ``"reused"`` (made there before with the same
    settings), ``"copied"`` (from ``source``, another compare's directory, whose warm start
    of the seed has the same :data:`WARM_START_FIELDS`) or ``"made"`` (now)."""
    from ..rl.engine.trainer import Trainer

    config = warm_start_config(base, seed, out)
    policy = out / "warmstart"
    saved = saved_config(out)
    if saved is not None and differing(saved, config) is None and (policy / "task.json").is_file():
        return str(policy), "reused"  # task.json: written after the weights
    if source is not None and (source / "warmstart" / f"seed{seed}" / "warmstart" / "task.json").is_file():
        copy_warm_start(source / "warmstart" / f"seed{seed}", out, config)
        return str(policy), "copied"
    Trainer(config, overwrite=True)  # this compare's own warm start, unfinished or absent
    return str(policy), "made"


def warm_start_config(base: TrainConfig, seed: int, out: Path) -> TrainConfig:
    """The config of seed ``seed``'s warm start in ``out``: the policy alone, no critic
    warm-up (each run warms its own critic up)."""
    return base.replace(seed=seed, out=str(out), init_from=None, progress=False, critic_warmup=0)


def warm_start_mismatch(src: Path, config: TrainConfig) -> str | None:
    """Why the warm start in ``src`` is not the one ``config`` would make: a message naming
    the first of :data:`WARM_START_FIELDS` it was made with differently, or None."""
    saved = saved_config(src) or {}
    want = config.to_dict()
    for key in WARM_START_FIELDS:
        if saved.get(key) != want[key]:
            return (
                f"warm_starts: the warm start in {str(src)!r} was made with {key}={saved.get(key)!r}, this "
                f"compare's would be made with {key}={want[key]!r}"
            )
    return None


def check_warm_starts(source: Path, base: TrainConfig, seeds: Iterable[int]) -> None:
    """A :class:`ParameterError` naming ``warm_starts`` if a warm start of ``seeds`` that
    ``source`` holds is not the one this compare would make (checked before anything is
    written, so a refused ``--warm-starts`` leaves ``--out`` as it was)."""
    for seed in seeds:
        src = source / "warmstart" / f"seed{seed}"
        if (src / "warmstart" / "task.json").is_file():
            why = warm_start_mismatch(src, warm_start_config(base, seed, src))
            if why is not None:
                raise ParameterError(why, argument="warm_starts")


def copy_warm_start(src: Path, out: Path, config: TrainConfig) -> None:
    """Copy the warm start in ``src`` (another compare's ``warmstart/seedN``) into ``out``
    as if made there with ``config``; a :class:`ParameterError` naming ``warm_starts`` and
    the first setting the warm start would read differently. ``src`` is only read; what
    ``out`` held (this compare's own unfinished warm start) is replaced, its
    ``config.json`` last, so an interrupted copy is copied again on ``--resume``."""
    why = warm_start_mismatch(src, config)
    if why is not None:
        raise ParameterError(why, argument="warm_starts")
    saved = saved_config(src) or {}
    want = config.to_dict()
    tmp = out.parent / f".{out.name}.copy"
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(src, tmp, symlinks=True)
    out.mkdir(parents=True, exist_ok=True)
    run_dir.clear_run(out)
    for entry in sorted(p.name for p in tmp.iterdir()):
        if entry != "config.json":
            os.replace(tmp / entry, out / entry)
    run_dir.write_json_atomic(out / "config.json", {**saved, **want})
    shutil.rmtree(tmp)


# --------------------------------------------------------------------------- #
# Running
# --------------------------------------------------------------------------- #


def _timed_warm_start(base: TrainConfig, seed: int, out: Path, source: Path | None) -> tuple[str, str, float]:
    """:func:`warm_start` in a worker, with its own seconds (not its wait in the queue)."""
    t0 = time.perf_counter()
    init_from, how = warm_start(base, seed, out, source)
    return init_from, how, time.perf_counter() - t0


class Stopped(Exception):
    """Asked to stop between two runs (the one named is finished)."""


def _never() -> bool:
    return False


def continues(run_out: Path) -> bool:
    """Whether ``run_out`` holds an unfinished run to resume (a checkpoint and its config)."""
    return run_dir.saved_checkpoint(run_out) is not None and saved_config(run_out) is not None


#: In a worker process: the compare's stop event (:func:`_init_worker`); None in the compare itself.
_STOP_EVENT: Any = None


def train_job(config: TrainConfig, resume: bool) -> tuple[str, Any, float]:
    """One run in a worker process (``compare --jobs``): ``("done", summary, seconds)``,
    ``("nonfinite", the NonFiniteError, seconds)``, ``("stopped", next step, seconds)``
    after a stop (a signal to this worker, or the compare's stop event: the run finishes
    its step and checkpoints), or ``("skipped", None, 0.0)`` for a run not started because
    the compare is stopping; ``seconds`` is the run's own time, not its wait in the queue."""
    from ..rl.engine.trainer import Trainer
    from ..rl.runs.interrupts import GracefulStop, TrainingInterrupted

    event = _STOP_EVENT
    if event is not None and event.is_set():
        return "skipped", None, 0.0
    t0 = time.perf_counter()
    with GracefulStop() as signalled:

        def stop() -> bool:
            return signalled() or (event is not None and event.is_set())

        trainer = Trainer(config.replace(resume=resume), overwrite=not resume)
        try:
            return "done", trainer.train(stop=stop), time.perf_counter() - t0
        except NonFiniteError as exc:
            return "nonfinite", exc, time.perf_counter() - t0
        except TrainingInterrupted as exc:
            return "stopped", exc.next_step, time.perf_counter() - t0
        finally:
            trainer.dist.close()


#: How often a worker checks that the compare process is still alive (seconds).
PARENT_POLL_S = 0.5


def _exit_with_parent(parent: int) -> None:
    """Exit this worker at once when the compare process ``parent`` is gone (a second
    signal, SIGKILL, a crash): else it would wait forever for work that never comes,
    holding its memory. Its run keeps its last checkpoint (files are written atomically),
    so ``--resume`` continues it."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _init_worker(event: Any, parent: int) -> None:
    """A worker's start: it ignores Ctrl-C between runs (the compare process decides; during
    a run :func:`train_job`'s ``GracefulStop`` handles it), keeps the compare's stop event
    and exits when the compare process ``parent`` does (:func:`_exit_with_parent`)."""
    global _STOP_EVENT
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _STOP_EVENT = event
    threading.Thread(target=_exit_with_parent, args=(parent,), name="exit-with-parent", daemon=True).start()


class _Pool(concurrent.futures.ProcessPoolExecutor):
    """The workers of a compare and the stop event they read (:func:`_init_worker`)."""

    def __init__(self, jobs: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop_event = context.Event()
        super().__init__(
            max_workers=jobs, mp_context=context, initializer=_init_worker, initargs=(self.stop_event, os.getpid())
        )

    def stop_all(self, futures: Any) -> None:
        """Ask every worker to stop at its next step boundary and cancel the runs not started."""
        self.stop_event.set()
        for future in futures:
            future.cancel()


@contextlib.contextmanager
def _pool(jobs: int) -> Any:
    """``jobs`` worker processes (spawned: a fresh interpreter each, one torch thread per run)."""
    pool = _Pool(jobs)
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class Runner:
    """Makes (or reuses) the warm starts and runs of one compare, timing them; a tuning
    run stopped by a non-finite value is recorded in ``grid/nonfinite.json`` (a collapse).

    ``out`` is the compare's directory, ``base`` the shared settings, ``total`` the number
    of runs it will be asked for (the ``[k/total]`` of its lines), ``stop`` polled between
    steps and runs (None: never), ``jobs`` runs at once (worker processes when > 1),
    ``source`` another compare whose warm starts are copied (``warm_starts``), and ``say``
    prints each line of progress. A bad path or setting found while a run is built (the
    task file, ``init_from``) raises its :class:`~comppo_core.errors.ParameterError`; a
    stop between runs raises :class:`Stopped`, one within a run
    :class:`~comppo_core.rl.runs.interrupts.TrainingInterrupted`; a non-finite value in a
    reporting run raises its :class:`~comppo_core.errors.NonFiniteError`."""

    def __init__(
        self,
        out: Path,
        base: TrainConfig,
        total: int,
        stop: Callable[[], bool] | None = None,
        jobs: int = 1,
        source: Path | None = None,
        say: Callable[[str], None] = say,
        engine: dict[str, Any] | None = None,
    ) -> None:
        self.out, self.base, self.total, self.jobs = out, base, total, jobs
        #: the TRL engine's record (:func:`~comppo_core.experiments.trl_engine.engine_record`), None: the package's
        self.engine = engine
        self.stop: Callable[[], bool] = stop if stop is not None else _never
        self.say = say
        #: another compare whose warm starts this one copies (``--warm-starts``), or None
        self.source = source
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
        #: seconds of each run trained (or resumed) by this Runner, for the time-left estimate
        self.trained_seconds: list[float] = []
        self._init_from: dict[int, str | None] = {}
        self.warm_needed = base.init_from is None and base.model is None

    def init_from(self, seed: int) -> str | None:
        """The policy seed ``seed``'s runs start from: its warm start (made on first use)."""
        if seed in self._init_from:
            return self._init_from[seed]
        init_from = self.base.init_from
        if self.warm_needed:
            t0 = time.perf_counter()
            # a bad path (the task file, say) is found here: a ParameterError naming its setting
            init_from, how = warm_start(self.base, seed, self.out / "warmstart" / f"seed{seed}", self.source)
            self._warm_started(seed, init_from, how, time.perf_counter() - t0)
        self._init_from[seed] = init_from
        return init_from

    def _warm_started(self, seed: int, init_from: str, how: str, seconds: float) -> None:
        """Record (its time, when made now) and print seed ``seed``'s warm start."""
        key = f"warmstart/seed{seed}"
        self.keys.append(key)
        if how == "made":
            self.timings[key] = seconds
        elif how == "copied":  # the seconds it took where it was made, as for one reused
            assert self.source is not None
            self.timings.pop(key, None)
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                self.timings[key] = float(json.loads((self.source / "timings.json").read_text())[key])
        if how != "reused":
            run_dir.write_json_atomic(self.timings_path, self.timings)
        status = {"made": f"made in {seconds:.0f} s", "copied": f"copied from {self.source}"}.get(how, how)
        self.say(f"[seed {seed}] warm start {init_from} ({status})")

    def run(self, rel: str, config: TrainConfig, label: str) -> dict[str, Any] | None:
        """Run (or reuse) the run in ``OUT/rel``; its summary, or None for a tuning run
        (``eval_split="validation"``) stopped by a non-finite value. The package trainer runs
        it in this process (:meth:`_train_here`), the TRL engine in one of its own
        (:meth:`_train_on_trl`)."""
        run_out = self.out / rel
        init_from = None if self.engine is not None else self.init_from(config.seed)  # TRL: base.model
        config = config.replace(out=str(run_out), init_from=init_from)
        tuning = config.eval_split == "validation"
        self.done += 1
        self.keys.append(rel)
        if tuning and rel in self.nonfinite:
            self.reused += 1
            self.say(f"[{self.done}/{self.total}] {label}: stopped on a non-finite value (reused)")
            return self._after(label, None)
        train = self._train_here if self.engine is None else self._train_on_trl
        summary, status = train(rel, run_out, config, label, tuning)
        if status == "reused":
            self.reused += 1
        self._print(label, summary, status, "validation" if tuning else "held-out")
        return self._after(label, summary)

    def _train_here(
        self, rel: str, run_out: Path, config: TrainConfig, label: str, tuning: bool
    ) -> tuple[dict[str, Any] | None, str]:
        """``(summary, status)`` of the run trained (or reused, or resumed) in this process."""
        from ..rl.engine.trainer import Trainer

        summary = finished(run_out, config)
        if summary is not None:
            return summary, "reused"
        go_on = continues(run_out)
        t0 = time.perf_counter()
        # a bad init_from, model or task raises its ParameterError here
        trainer = Trainer(config.replace(resume=go_on), overwrite=not go_on)
        try:
            summary = trainer.train(stop=self.stop)
        except NonFiniteError as exc:
            if not tuning:
                raise
            self._nonfinite(rel, str(exc))
        finally:
            trainer.dist.close()
        return summary, self._timed(rel, time.perf_counter() - t0, go_on)

    def _train_on_trl(
        self, rel: str, run_out: Path, config: TrainConfig, label: str, tuning: bool
    ) -> tuple[dict[str, Any] | None, str]:
        """``(summary, status)`` on the TRL engine: the run is a process of its own
        (:func:`~comppo_core.experiments.trl_engine.run_subprocess`), reused when finished
        with the same settings and engine record, resumed from its last TRL checkpoint,
        made otherwise (its directory's TRL run entries cleared first)."""
        from ..rl.runs.interrupts import TrainingInterrupted
        from . import trl_engine

        assert self.engine is not None
        saved = saved_config(run_out)
        same_engine = saved is not None and trl_engine.same_engine(saved.get("trl"), self.engine)
        summary = finished(run_out, config) if same_engine else None
        if summary is not None:
            return summary, "reused"
        go_on = same_engine and trl_engine.last_checkpoint(run_out) is not None
        if not go_on:
            trl_engine.clear_trl_run(run_out)
        trl_engine.write_run_config(run_out, config, self.engine)
        launcher = trl_engine.parse_launcher(self.engine.get("launcher"))
        how = "resuming from its TRL checkpoint" if go_on else "started"
        self.say(f"[{self.done}/{self.total}] {label}: {how}; its output goes to {run_out / 'run.log'}")
        t0 = time.perf_counter()
        try:
            kind, value = trl_engine.run_subprocess(run_out, launcher, self.stop, config.num_threads)
        except NonFiniteError as exc:
            if not tuning:
                raise
            self._nonfinite(rel, str(exc))
            kind, value = "nonfinite", None
        finally:
            status = self._timed(rel, time.perf_counter() - t0, go_on)
        if kind == "stopped":
            step = None if value is None else int(value.name.removeprefix("checkpoint-"))
            per_rollout = config.ppo_epochs * config.num_minibatches
            raise TrainingInterrupted(0 if step is None else step // per_rollout, value)
        return value, status

    def _nonfinite(self, rel: str, message: str) -> None:
        self.nonfinite[rel] = {"message": message}
        run_dir.write_json_atomic(self.nonfinite_path, self.nonfinite)

    def _timed(self, rel: str, seconds: float, resumed: bool) -> str:
        """Record a run's seconds (added to its earlier part when resumed); its status text."""
        self.timings[rel] = seconds + self.timings.get(rel, 0.0) * resumed
        self.trained_seconds.append(seconds)
        run_dir.write_json_atomic(self.timings_path, self.timings)
        return f"{self.timings[rel]:.0f} s" + (", resumed" if resumed else "")

    def time_left(self, done: int) -> str:
        """``"; about N min left"`` after ``done`` of :attr:`total` runs: the mean seconds of
        the runs trained so far by this Runner times the runs still to go, divided among
        ``jobs`` (reused runs cost nothing); empty when nothing is left or nothing was timed."""
        left = self.total - done
        if left <= 0 or not self.trained_seconds:
            return ""
        seconds = sum(self.trained_seconds) / len(self.trained_seconds) * left / self.jobs
        return f"; about {seconds / 60:.0f} min left" if seconds >= 60 else f"; about {seconds:.0f} s left"

    def _print(self, label: str, summary: dict[str, Any] | None, status: str, split: str, done: int = 0) -> None:
        n = done or self.done
        left = self.time_left(n)
        if summary is None:
            self.say(f"[{n}/{self.total}] {label}: stopped on a non-finite value ({status}{left})")
        else:
            first, final = summary["initial_eval_accuracy"], summary["final_eval_accuracy"]
            self.say(
                f"[{n}/{self.total}] {label}: {split} accuracy {report.pct(first)}% -> {report.pct(final)}% "
                f"({status}{left})"
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
            self.warm_starts(pool, sorted({config.seed for _, config, _ in items}))
            for rel, config, label in items:
                run_out = self.out / rel
                config = config.replace(out=str(run_out), init_from=self.init_from(config.seed))
                self.keys.append(rel)
                tuning = config.eval_split == "validation"
                summary = None if tuning and rel in self.nonfinite else finished(run_out, config)
                if summary is None and not (tuning and rel in self.nonfinite):
                    todo.append((rel, config, label, continues(run_out)))
                    continue
                self.done += 1
                self.reused += 1
                results[rel] = summary
                self._print(label, summary, "reused", "validation" if tuning else "held-out")
            if self.stop():  # asked while the warm starts were made
                raise Stopped("the warm starts")
            futures = {
                pool.submit(train_job, config, go_on): (rel, config, label, go_on) for rel, config, label, go_on in todo
            }
            stopped: str | None = None
            pending = set(futures)
            while pending:
                done, pending = concurrent.futures.wait(pending, timeout=0.5, return_when="FIRST_COMPLETED")
                if self.stop() and not pool.stop_event.is_set():  # a signal to the compare: every worker stops
                    pool.stop_all(pending)
                for future in done:
                    if future.cancelled():
                        continue
                    rel, config, label, go_on = futures[future]
                    try:
                        kind, value, seconds = future.result()
                    except ParameterError:  # a bad init_from, model or task
                        pool.shutdown(cancel_futures=True)
                        raise
                    tuning = config.eval_split == "validation"
                    if kind in ("stopped", "skipped"):
                        if kind == "stopped":
                            stopped = stopped or f"{label}, stopped after step {value}"
                        pool.stop_all(pending)  # a worker's own stop stops the compare too
                        continue
                    if kind == "nonfinite":
                        if not tuning:
                            pool.shutdown(cancel_futures=True)
                            raise value  # the worker's NonFiniteError, as one process raises it
                        self._nonfinite(rel, str(value))
                        value = None
                    self.done += 1
                    results[rel] = value
                    status = self._timed(rel, seconds, go_on)
                    self._print(label, value, status, "validation" if tuning else "held-out")
                    if self.stop() and stopped is None:
                        stopped = label
            if stopped is not None or pool.stop_event.is_set():
                raise Stopped(stopped or "a stop request")
        return results

    def warm_starts(self, pool: concurrent.futures.Executor, seeds: list[int]) -> None:
        """Make (or reuse) the warm starts of ``seeds`` that this compare has not read yet, in ``pool``."""
        missing = [seed for seed in seeds if seed not in self._init_from]
        if not self.warm_needed:
            for seed in missing:
                self._init_from[seed] = self.base.init_from
            return
        jobs = {
            seed: pool.submit(_timed_warm_start, self.base, seed, self.out / "warmstart" / f"seed{seed}", self.source)
            for seed in missing
        }
        for seed, job in jobs.items():
            init_from, how, seconds = job.result()  # a bad path: its ParameterError
            self._warm_started(seed, init_from, how, seconds)
            self._init_from[seed] = init_from

    def _after(self, label: str, summary: dict[str, Any] | None) -> dict[str, Any] | None:
        if self.stop():  # between two runs: this one is finished
            raise Stopped(label)
        return summary


def tune(
    runner: Runner, grid: Grid, arms: list[str], seeds: list[int], configs: dict[str, TrainConfig]
) -> dict[str, list[list[Outcome]]]:
    """Every tuning run (point by point, seed by seed, arm by arm); ``outcomes[arm][point][k]``.

    A point that is the same run as an earlier one for an arm (:meth:`Grid.first_alike`)
    is not run again: its outcome is the earlier point's run's."""
    alike = {arm: grid.first_alike(arm) for arm in arms}
    items = []
    for i, point in enumerate(grid.points):
        name = grid.name(i)
        (runner.out / "grid" / name).mkdir(parents=True, exist_ok=True)
        run_dir.write_json_atomic(runner.out / "grid" / name / "point.json", {"point": name, "settings": point})
        for t in seeds:
            for arm in arms:
                rel = f"grid/{name}/{arm}/seed{t}"
                if alike[arm][i] == i:
                    items.append((rel, configs[rel], f"{arm} {name} seed {t}"))
    summaries = runner.run_all(items)
    outcomes: dict[str, list[list[Outcome]]] = {arm: [[] for _ in grid.points] for arm in arms}
    for i in range(len(grid.points)):
        for t in seeds:
            for arm in arms:
                rel = f"grid/{grid.name(alike[arm][i])}/{arm}/seed{t}"
                summary = summaries[rel]
                if summary is None:
                    outcome = Outcome(None, None, nonfinite=runner.nonfinite[rel]["message"])
                else:
                    outcome = Outcome(summary["initial_eval_accuracy"], summary["final_eval_accuracy"])
                outcomes[arm][i].append(outcome)
    return outcomes
