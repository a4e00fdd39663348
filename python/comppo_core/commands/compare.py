"""``comppo-core compare``: every arm × seed on the same settings, paired, with a results table.

For each seed ``s`` in ``0 … seeds−1`` the command warms the policy up once (the SFT warm
start of :func:`comppo_core.rl.train`, into ``OUT/warmstart/seed<s>/``), then runs every
arm from that checkpoint (``init_from``) with the same settings and seed, so the arms of a
seed differ only in their critic and advantages: the same initial policy, the same
prompts, the same evaluation set (a paired comparison). With ``--model`` or
``--init-from`` there is no warm start: every run starts from that model.

Outputs under ``OUT``::

    warmstart/seed<s>/      the warm start (its warmstart/ is every arm's init_from)
    <arm>/seed<s>/          each run's config.json, metrics.jsonl, summary.json, checkpoint/
    results.md              the table below, per-seed accuracies, the settings
    results.json            the same numbers, machine-readable
    timings.json            the seconds each warm start and run took when it ran
    curves.png              held-out accuracy vs step: mean and 95% CI band per arm

    compare.json            the settings every run here shares (checked by --resume)

The table gives, per arm, the final held-out (greedy) accuracy: its mean over seeds and
a 95% confidence interval ``mean ± t_{0.975, n−1} · s / √n`` (Student's t, ``s`` the
sample standard deviation over the ``n`` seeds), and the same for the paired differences
``acc(arm, s) − acc(ref, s)`` to the warm start, to ``grpo`` and to ``comppo``.

**Never mixing runs.** An ``OUT`` that already holds a compare (or any run) is refused
unless ``--resume`` or ``--overwrite``. ``--resume`` continues it with the same settings
(``compare.json``; a differing setting is refused, named): finished runs are reused,
interrupted ones resume from their checkpoint, and ``--arms`` / ``--seeds`` may add runs;
``results.md`` covers the arms and seeds asked for. ``--overwrite`` deletes the compare's
own files (the entries above) and starts again. Ctrl-C finishes the current step, keeps
the checkpoints and prints the ``--resume`` command (exit status 130).

Exit status: 0 on success, 2 on a bad flag (an unknown arm, a bad preset, a setting out
of range, a refused ``--out``: the message names the flag), 1 on a failure while
training, 130/143 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ParameterError
from ..options import ARM_NAMES
from ..rl import run_dir
from ..rl.config import TrainConfig
from .train import (
    _Default,
    add_config_arguments,
    check_paths,
    config_from_args,
    require_rl_extra,
    show_log_lines,
    usage_error,
)

__all__ = ["add_parser", "mean_ci", "plot_curves", "results_table", "run", "t_quantile"]

#: The arms the paired differences are taken against (when they are compared).
REFERENCES = ("grpo", "comppo")

#: TrainConfig flags compare sets itself, and what to use instead.
_OWN_FLAGS = {
    "arm": "the arms are --arms",
    "seed": "the seeds are 0 … --seeds − 1",
}

#: The settings a resumed compare may change (the runs' other settings must be the same).
_RESUMABLE = ("progress", "num_threads", "device", "report_to", "save_every")

#: What compare writes directly under OUT (with the <arm>/seed<s>/ run directories).
_OWN_ENTRIES = ("compare.json", "results.md", "results.json", "timings.json", "curves.png", "warmstart")


# --------------------------------------------------------------------------- #
# Statistics
# --------------------------------------------------------------------------- #


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function: ``P(T ≤ t) = 1 − ½·I_{df/(df+t²)}(df/2, ½)`` for ``t ≥ 0``."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``t_cdf`` inverted by
    bisection to double precision); ``t_quantile(0.975, 2) = 4.3027``."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile: expected 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi)


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float | None]:
    """``(mean, half-width)`` of the ``level`` confidence interval of the mean of ``values``:
    ``t_{(1+level)/2, n−1} · s / √n`` with ``s`` the sample standard deviation (``n − 1`` in
    the denominator); the half-width is None for a single value."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci: expected at least one value, got none")
    mean = math.fsum(values) / n
    if n == 1:
        return mean, None
    s = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile(0.5 + level / 2.0, n - 1) * s / math.sqrt(n)


# --------------------------------------------------------------------------- #
# Results
# --------------------------------------------------------------------------- #


def _pct(x: float, signed: bool = False) -> str:
    v = round(100 * x, 1) + 0.0  # + 0.0: no "-0.0"
    return f"{v:+.1f}" if signed else f"{v:.1f}"


def _ci(mean: float, half: float | None, signed: bool = False) -> str:
    if half is None:
        return "—"
    return f"[{_pct(mean - half, signed)}, {_pct(mean + half, signed)}]"


def results_table(final: dict[str, dict[int, float]], warm: dict[int, float]) -> tuple[str, dict[str, Any]]:
    """The markdown table of final accuracies (``final[arm][seed]``, fractions) and paired
    differences to the warm start (``warm[seed]``) and to each of :data:`REFERENCES` that
    is an arm here; also the numbers as a dict (fractions)."""
    refs = [r for r in REFERENCES if r in final]
    header = ["arm", "seeds", "accuracy %", "95% CI", "vs warm start", "95% CI"]
    for r in refs:
        header += [f"vs {r}", "95% CI"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    numbers: dict[str, Any] = {}
    for arm, by_seed in final.items():
        seeds = sorted(by_seed)
        accs = [by_seed[s] for s in seeds]
        m, h = mean_ci(accs)
        dm, dh = mean_ci([by_seed[s] - warm[s] for s in seeds])
        row = [arm, str(len(seeds)), _pct(m), _ci(m, h), _pct(dm, True), _ci(dm, dh, True)]
        entry: dict[str, Any] = {"seeds": seeds, "accuracy": accs, "mean": m, "ci": h, "vs_warm_start": [dm, dh]}
        for r in refs:
            common = [s for s in seeds if s in final[r]]
            if r == arm or not common:
                row += ["—", "—"]
                continue
            rm, rh = mean_ci([by_seed[s] - final[r][s] for s in common])
            row += [_pct(rm, True), _ci(rm, rh, True)]
            entry[f"vs_{r}"] = [rm, rh]
        lines.append("| " + " | ".join(row) + " |")
        numbers[arm] = entry
    return "\n".join(lines) + "\n", numbers


def plot_curves(
    curves: dict[str, dict[int, list[tuple[int, float]]]], warm: dict[int, float], path: Path, title: str
) -> None:
    """``curves[arm][seed]`` = ``[(step, accuracy), …]`` as a PNG (matplotlib, Agg) with two
    panels: the held-out accuracy per arm, mean over seeds and 95% CI band (t-distribution),
    the warm start's mean dashed; and the paired gain over the seed's warm start,
    ``acc(step) − acc(step 0)``, mean and CI band (between-seed spread of the warm start,
    which dominates the first panel's bands, cancels there)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12.0, 4.8), dpi=110)
    FigureCanvasAgg(fig)
    ax_acc, ax_gain = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for arm, by_seed in curves.items():
        runs = {s: dict(c) for s, c in by_seed.items()}
        steps = sorted(set.intersection(*(set(r) for r in runs.values())))
        color = None
        for ax, shift in ((ax_acc, False), (ax_gain, True)):
            stats = [mean_ci([r[st] - (r[steps[0]] if shift else 0.0) for r in runs.values()]) for st in steps]
            mean = [100 * m for m, _ in stats]
            (line,) = ax.plot(steps, mean, marker="o", markersize=3, label=arm, color=color)
            color = line.get_color()
            if all(h is not None for _, h in stats):  # clipped to what an accuracy (or a gain) can be
                floor, ceiling = (-100.0, 100.0) if shift else (0.0, 100.0)
                lo = [max(floor, 100 * (m - (h or 0.0))) for m, h in stats]
                hi = [min(ceiling, 100 * (m + (h or 0.0))) for m, h in stats]
                ax.fill_between(steps, lo, hi, color=color, alpha=0.10, linewidth=0)
    if warm:
        mean_warm = 100 * math.fsum(warm.values()) / len(warm)
        ax_acc.axhline(mean_warm, color="0.4", linestyle="--", linewidth=1, label="warm start")
    ax_gain.axhline(0.0, color="0.4", linestyle="--", linewidth=1)
    ax_acc.set_ylabel("held-out greedy accuracy (%)")
    ax_gain.set_ylabel("gain over the warm start (points, paired)")
    for ax in (ax_acc, ax_gain):
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
    ax_acc.legend(fontsize=8, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)  # a reader never sees half a PNG


# --------------------------------------------------------------------------- #
# The command
# --------------------------------------------------------------------------- #


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``compare`` command on the ``comppo-core`` parser."""
    cmd = subparsers.add_parser(
        "compare",
        help="run every arm x seed from paired warm starts; results.md (mean, 95%% CI, paired differences) and "
        "curves.png (needs [rl])",
        description=(
            "For each seed, warm-start once and run every arm from that checkpoint with the same settings "
            "(paired); write each run under --out, results.md (final held-out accuracy per arm: mean and 95%% "
            "CI over seeds, paired differences to the warm start, grpo and comppo), results.json and "
            "curves.png. Settings: the flags given, then --preset, then the TrainConfig defaults."
        ),
    )
    cmd.add_argument(
        "--arms",
        default=",".join(ARM_NAMES),
        metavar="A,B,...",
        help=f"comma-separated arms to compare (default: all seven: {','.join(ARM_NAMES)})",
    )
    cmd.add_argument("--seeds", default="3", metavar="N", help="seeds 0 … N−1 (default: 3)")
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


def _seeds(text: str, cmd: argparse.ArgumentParser) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        cmd.error(f"--seeds: expected a number of seeds >= 1, got {text!r}")
    return n


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
    out: Path, base: TrainConfig, configs: dict[tuple[str, int], TrainConfig], resume: bool, overwrite: bool
) -> str | None:
    """Why ``out`` cannot take this compare (a message naming the flag), or None."""
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
    for (arm, seed), config in configs.items():  # the runs themselves (also a compare without compare.json)
        saved_run = _saved_config(out / arm / f"seed{seed}")
        if saved_run is not None and (why := _differing(saved_run, config)):
            return f"{why} ({arm}/seed{seed})"
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


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core compare``; returns the exit status."""
    cmd: argparse.ArgumentParser = args.command_parser
    for name, instead in _OWN_FLAGS.items():
        if not isinstance(getattr(args, name), _Default):
            cmd.error(f"--{name}: not a compare flag ({instead})")
    if not isinstance(args.out, str):
        cmd.error("--out: expected the output directory DIR, got none")
    resume = args.resume is True
    arms = _arms(args.arms, cmd)
    n_seeds = _seeds(args.seeds, cmd)
    base = config_from_args(args, cmd, arm=arms[0], seed=0, resume=False)
    if base.eval_every == 0:
        cmd.error("--eval-every: expected >= 1 (compare reports the held-out accuracy), got 0")
    configs = {}
    for arm in arms:
        for seed in range(n_seeds):
            try:
                configs[arm, seed] = base.replace(arm=arm, seed=seed)
            except ParameterError as exc:  # a setting invalid for one arm
                usage_error(cmd, exc)
    assert base.out is not None
    out = Path(base.out)
    refused = _check_out(out, base, configs, resume, args.overwrite)
    if refused:
        cmd.error(refused)
    try:
        check_paths(base.replace(out=None), overwrite=False)
    except ParameterError as exc:
        usage_error(cmd, exc)
    require_rl_extra("compare")
    from ..rl.interrupts import GracefulStop, TrainingInterrupted, exit_status
    from ..rl.trainer import Trainer

    show_log_lines()
    if args.overwrite:
        _clear_compare(out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"settings": _settings(base), "init_from": base.init_from, "arms": arms, "seeds": n_seeds}
    run_dir.write_json_atomic(out / "compare.json", record)
    warm_needed = base.init_from is None and base.model is None

    t_start = time.perf_counter()
    summaries: dict[tuple[str, int], dict[str, Any]] = {}
    # seconds each warm start and run took when it ran (kept for the runs a rerun reuses)
    timings_path = out / "timings.json"
    try:
        timings: dict[str, float] = json.loads(timings_path.read_text())
    except (OSError, ValueError):
        timings = {}
    keys: list[str] = []
    total, done, reused = len(configs), 0, 0
    hint = "rerun the same command with --resume to continue"
    with GracefulStop() as stop:
        try:
            for seed in range(n_seeds):
                init_from = base.init_from
                if warm_needed:
                    t0 = time.perf_counter()
                    ws = out / "warmstart" / f"seed{seed}"
                    try:  # a bad path (the task file, say) is found here: a usage error naming its flag
                        init_from, made = _warm_start(base, seed, ws)
                    except ParameterError as exc:
                        usage_error(cmd, exc)
                    key = f"warmstart/seed{seed}"
                    keys.append(key)
                    if made:
                        timings[key] = time.perf_counter() - t0
                        run_dir.write_json_atomic(timings_path, timings)
                    status = f"made in {timings[key]:.0f} s" if made else "reused"
                    print(f"[seed {seed}] warm start {init_from} ({status})", flush=True)
                for arm in arms:
                    run_out = out / arm / f"seed{seed}"
                    config = configs[arm, seed].replace(out=str(run_out), init_from=init_from)
                    done += 1
                    key = f"{arm}/seed{seed}"
                    keys.append(key)
                    summary = _finished(run_out, config)
                    t0 = time.perf_counter()
                    status = "reused"
                    if summary is None:
                        go_on = run_dir.saved_checkpoint(run_out) is not None and _saved_config(run_out) is not None
                        try:
                            trainer = Trainer(config.replace(resume=bool(go_on)), overwrite=not go_on)
                        except ParameterError as exc:  # a bad --init-from, --model or --task
                            usage_error(cmd, exc)
                        try:
                            summary = trainer.train(stop=stop)
                        finally:
                            trainer.dist.close()
                        timings[key] = time.perf_counter() - t0 + timings.get(key, 0.0) * bool(go_on)
                        run_dir.write_json_atomic(timings_path, timings)
                        status = f"{timings[key]:.0f} s" + (", resumed" if go_on else "")
                    else:
                        reused += 1
                    summaries[arm, seed] = summary
                    first, final = summary["initial_eval_accuracy"], summary["final_eval_accuracy"]
                    print(
                        f"[{done}/{total}] {arm} seed {seed}: held-out accuracy {_pct(first)}% -> {_pct(final)}% "
                        f"({status})",
                        flush=True,
                    )
                    if stop():  # between two runs: this one is finished
                        print(f"comppo-core compare: stopped after {arm} seed {seed}; {hint}", file=sys.stderr)
                        return exit_status(stop.signum or 2)
        except TrainingInterrupted as exc:
            print(f"comppo-core compare: stopped after step {exc.next_step} of a run; {hint}", file=sys.stderr)
            return exit_status(stop.signum or 2)
        except KeyboardInterrupt:
            print(f"comppo-core compare: stopped at once; the checkpoints written are kept; {hint}", file=sys.stderr)
            return exit_status(2)
    seconds = time.perf_counter() - t_start
    timed = [timings[k] for k in keys if k in timings]
    untimed = len(keys) - len(timed)

    final = {arm: {s: summaries[arm, s]["final_eval_accuracy"] for s in range(n_seeds)} for arm in arms}
    starts = {s: [summaries[arm, s]["initial_eval_accuracy"] for arm in arms] for s in range(n_seeds)}
    warm = {s: starts[s][0] for s in range(n_seeds)}
    unpaired = [s for s in range(n_seeds) if len(set(starts[s])) > 1]
    curves = {
        arm: {s: [(int(st), float(a)) for st, a in summaries[arm, s]["eval"]] for s in range(n_seeds)} for arm in arms
    }
    table, numbers = results_table(final, warm)
    wm, wh = mean_ci(list(warm.values()))
    lines = [
        "# comppo-core compare",
        "",
        f"{len(arms)} arm{'s' if len(arms) > 1 else ''} × {n_seeds} seed{'s' if n_seeds > 1 else ''}, "
        f"preset `{args.preset or 'default'}`, "
        f"{base.steps} PPO steps of {base.prompts_per_step} prompts × {base.group_size} samples; final held-out "
        f"greedy accuracy on {_eval_size(base)} problems, in percent. Every arm of a seed starts from the same warm start "
        "(paired differences); 95% CIs from Student's t over seeds.",
        "",
        f"Warm start: {_pct(wm)}% {_ci(wm, wh)} (per seed: {', '.join(_pct(warm[s]) for s in range(n_seeds))}).",
        "",
        table,
        "Final accuracy per seed (%):",
        "",
        "| arm | " + " | ".join(f"seed {s}" for s in range(n_seeds)) + " |",
        "|---|" + "---|" * n_seeds,
    ]
    lines += ["| " + arm + " | " + " | ".join(_pct(final[arm][s]) for s in range(n_seeds)) + " |" for arm in arms]
    if unpaired:
        lines += ["", f"Note: the arms of seed(s) {unpaired} did not start at one accuracy: {starts}."]
    defaults = type(base)()
    changed = {k: v for k, v in base.to_dict().items() if k not in ("arm", "seed", "out") and v != getattr(defaults, k)}
    lines += [
        "",
        f"Time: {math.fsum(timed) / 60:.1f} min for the warm starts and runs, as each took when it ran"
        + (f" ({untimed} not timed)" if untimed else "")
        + f"; this invocation {seconds / 60:.1f} min"
        + (f", reusing {reused} finished runs" if reused else "")
        + " (seconds per run: timings.json).",
        "",
        "Settings changed from the TrainConfig defaults: "
        + (", ".join(f"`{k}={v}`" for k, v in changed.items()) if changed else "none")
        + ".",
        "",
    ]
    run_dir.write_text_atomic(out / "results.md", "\n".join(lines))
    run_dir.write_json_atomic(
        out / "results.json",
        {
            "arms": numbers,
            "warm_start": {str(s): a for s, a in warm.items()},
            "curves": curves,
            "config": base.to_dict(),
            "seconds": seconds,
            "timings": {k: timings.get(k) for k in keys},
        },
    )
    plot_curves(
        curves,
        warm,
        out / "curves.png",
        f"held-out accuracy, mean and 95% CI over {n_seeds} seed{'s' if n_seeds > 1 else ''}",
    )
    print(table, end="")
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'curves.png'} ({seconds / 60:.1f} min)")
    return 0


def _eval_size(config: TrainConfig) -> str:
    """How many held-out problems the runs evaluate on, for the caption."""
    if config.task == "addition":
        from ..rl.tasks import AdditionTask

        task = AdditionTask(config.digits, split_seed=config.split_seed, heldout_fraction=config.heldout_fraction)
        return str(len(task.heldout(config.eval_size)))
    return f"up to {config.eval_size}"
