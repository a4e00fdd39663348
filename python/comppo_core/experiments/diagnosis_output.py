"""What ``comppo-core diagnose`` writes: ``diagnosis.json``, ``diagnosis.md`` (the report in
words and one table) and ``diagnosis.png`` (every AUC with its interval and the 0.5 line), from
the report :func:`comppo_core.experiments.diagnose.diagnose` returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..options import STATISTICS

__all__ = ["render_markdown", "write_outputs"]


def _fmt(entry: dict[str, Any]) -> str:
    e = entry["estimate"]
    lo, hi = entry["ci"]
    if e is None:
        return "n/a"
    return f"{e:.3f}" + ("" if lo is None else f" [{lo:.3f}, {hi:.3f}]")


def render_markdown(report: dict[str, Any], source: str) -> str:
    """The short ``diagnosis.md`` of a report."""
    s = report["settings"]
    rec = report["recommendation"]
    r = report["responses"]
    c = report["cost"]
    lines = [
        "# Gate diagnosis",
        "",
        f"Policy: {source}; task: {s['task'].get('name')} ({report['settings']['task'].get('path', '')}).".replace(
            " ()", ""
        ),
        f"{r['count']} {r['decoding']} responses (mean reward {r['mean_reward']:.3f}, {r['mean_tokens']:.1f} tokens); "
        f"K = {s['samples_per_prefix']} continuations per prefix; pivotal = |ΔV| ≥ {s['pivotal_threshold']} "
        f"({report['pivotal']['pivotal_tokens']} of {report['pivotal']['tokens']} scored tokens); "
        f"{int(100 * s['level'])}% intervals from {s['bootstrap']} bootstrap resamples over responses.",
        "",
        f"**Recommendation: `{rec['direction']}`**, gate range {rec['gate_range']} ({rec['why']}; as gates, per response, the layer-average "
        f"`{rec['statistic']}` concentration).",
        "",
        "| score | AUC (pivotal vs rest) | Spearman ρ vs pivotality |",
        "|---|---|---|",
    ]
    for stat, by_layer in report["auc"].items():
        for key, entry in by_layer.items():
            shown = {"mean": "layer average", "gates": "layer average as gates (per response)"}.get(key, key)
            lines.append(f"| concentration {stat} {shown} | {_fmt(entry['auc'])} | {_fmt(entry['spearman'])} |")
    for name, entry in report["baselines"].items():
        lines.append(f"| baseline {name} | {_fmt(entry['auc'])} | {_fmt(entry['spearman'])} |")
    if "auc_vs_marks" in report:
        m = report["auc_vs_marks"]
        lines += [
            "",
            f"Against the task's marks ({m['marked_tokens']} marked of {m['text_tokens']} text tokens): "
            f"MC pivotality AUC {_fmt(m['pivotality'])}; concentration "
            + ", ".join(f"{stat} {_fmt(m[stat])}" for stat in STATISTICS)
            + f"; position {_fmt(m['position'])}.",
        ]
    if report.get("critic"):
        lines += ["", f"Critic: explained variance against the MC values {_fmt(report['critic']['explained_variance'])} "
                  f"over {report['critic']['prefixes']} prefixes."]  # fmt: skip
    lines += [
        "",
        f"Cost: {c['generated_tokens']} generated tokens ({c['continuation_rows']} continuations), "
        f"{c['seconds']['total']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, entries = [], []
    for stat, by_layer in report["auc"].items():
        for key, entry in by_layer.items():
            names.append(f"{stat} {({'mean': 'layer average', 'gates': 'as gates'}).get(key, key)}")
            entries.append(entry["auc"])
    for name, entry in report["baselines"].items():
        names.append(f"baseline: {name}")
        entries.append(entry["auc"])
    y = np.arange(len(names))[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(names) + 1.5))
    for yi, name, e in zip(y, names, entries):
        if e["estimate"] is None:
            continue
        lo, hi = e["ci"]
        color = "tab:gray" if name.startswith("baseline") else ("tab:blue" if "average" in name else "tab:cyan")
        ax.plot([e["estimate"]], [yi], "o", color=color)
        if lo is not None:
            ax.plot([lo, hi], [yi, yi], "-", color=color)
    ax.axvline(0.5, color="k", lw=0.8, ls="--")
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_xlabel("AUC, pivotal vs other tokens (0.5: chance; < 0.5: inverted)")
    rec = report["recommendation"]
    ax.set_title(f"direction: {rec['direction']} (from the {rec['statistic']} layer average as gates)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def write_outputs(out: Path, report: dict[str, Any], source: str) -> list[Path]:
    """``diagnosis.json``, ``diagnosis.md`` and ``diagnosis.png`` in ``out`` (made if
    absent), each written to a temporary file and renamed into place."""
    import os
    import tempfile

    from ..rl.runs.run_dir import write_json_atomic, write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "diagnosis.json", out / "diagnosis.md", out / "diagnosis.png"]
    write_json_atomic(paths[0], report)
    write_text_atomic(paths[1], render_markdown(report, source))
    fd, tmp = tempfile.mkstemp(dir=out, prefix=".diagnosis.png.", suffix=".tmp")
    os.close(fd)
    try:
        _plot(report, Path(tmp))
        os.replace(tmp, paths[2])
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return paths
