"""What ``comppo-core diagnose`` writes: ``diagnosis.json``, ``diagnosis.md`` (the report in
words and one table) and ``diagnosis.png`` (a layer × statistic heatmap of every AUC beside the
few rows that decide, with their intervals; the same size for 2 layers or 30), from
the report :func:`comppo_core.experiments.diagnose.diagnose` returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..options import STATISTICS

__all__ = ["deciding_rows", "layer_grid", "render_markdown", "write_outputs"]


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
        *([f"Next: {rec['next']}.", ""] if rec.get("next") else []),
        *[f"**Warning:** {w}." for w in report.get("warnings", [])],
        *([""] if report.get("warnings") else []),
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


def deciding_rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """The few AUCs a user acts on, in the figure's order: ``(label, auc entry, is it the one the
    recommendation reads)``. First the recommendation's own (the recommended statistic's layer
    average mapped to gates per response), then each other statistic's as gates, each statistic's
    raw layer average, and the baselines (as gates where they are a gate source)."""
    rec_stat = report["recommendation"]["statistic"]
    stats = [rec_stat, *(s for s in report["auc"] if s != rec_stat)]
    rows: list[tuple[str, dict[str, Any], bool]] = []
    for stat in stats:
        rows.append((f"{stat}, layer average as gates", report["auc"][stat]["gates"]["auc"], stat == rec_stat))
    for stat in stats:
        rows.append((f"{stat}, layer average", report["auc"][stat]["mean"]["auc"], False))
    for name, entry in report["baselines"].items():
        shown = entry["gates"]["auc"] if "gates" in entry else entry["auc"]
        rows.append((f"baseline: {name}" + (" as gates" if "gates" in entry else ""), shown, False))
    return rows


def layer_grid(report: dict[str, Any]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Every single layer's AUC: ``(statistics, auc [layers, statistics], interval excludes 0.5
    [layers, statistics])``; NaN (and False) where a layer's AUC is undefined."""
    stats = list(report["auc"])
    layers = sorted(
        {int(k.removeprefix("layer")) for by_layer in report["auc"].values() for k in by_layer if k.startswith("layer")}
    )
    auc = np.full((len(layers), len(stats)), np.nan)
    clear = np.zeros((len(layers), len(stats)), dtype=bool)
    for j, stat in enumerate(stats):
        for i, layer in enumerate(layers):
            entry = report["auc"][stat].get(f"layer{layer}", {}).get("auc", {})
            e, (lo, hi) = entry.get("estimate"), entry.get("ci", (None, None))
            if e is not None:
                auc[i, j] = e
                clear[i, j] = lo is not None and hi is not None and (lo > 0.5 or hi < 0.5)
    return stats, auc, clear


def _plot(report: dict[str, Any], path: Path) -> None:
    """Two panels of a fixed size whatever the depth of the model: left, every layer ×
    statistic AUC as a heatmap around 0.5 (a dot: its interval excludes 0.5); right, the rows
    that decide (:func:`deciding_rows`) with their intervals, the one the recommendation reads
    drawn first, in red, and named so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats, auc, clear = layer_grid(report)
    rows = deciding_rows(report)
    fig, (ax_grid, ax_rows) = plt.subplots(1, 2, figsize=(11, 5.2), gridspec_kw={"width_ratios": [1, 2.2]})
    spread = float(np.nanmax(np.abs(auc - 0.5))) if np.isfinite(auc).any() else 0.0
    half = max(0.05, spread)
    image = ax_grid.imshow(auc, aspect="auto", cmap="RdBu_r", vmin=0.5 - half, vmax=0.5 + half, interpolation="nearest")
    ys, xs = np.nonzero(clear)
    ax_grid.plot(xs, ys, "k.", ms=3)
    ax_grid.set_xticks(range(len(stats)))
    ax_grid.set_xticklabels(stats, fontsize=8)
    n_layers = auc.shape[0]
    step = max(1, n_layers // 15)
    ax_grid.set_yticks(range(0, n_layers, step))
    ax_grid.set_yticklabels([f"layer {i}" for i in range(0, n_layers, step)], fontsize=7)
    ax_grid.set_title("AUC of each layer\n(dot: its interval excludes 0.5)", fontsize=9)
    fig.colorbar(image, ax=ax_grid, fraction=0.08, pad=0.04).ax.tick_params(labelsize=7)

    y = np.arange(len(rows))[::-1]
    for yi, (name, e, decides) in zip(y, rows):
        if e.get("estimate") is None:
            continue
        lo, hi = e["ci"]
        color = "tab:red" if decides else ("tab:gray" if name.startswith("baseline") else "tab:blue")
        ax_rows.plot([e["estimate"]], [yi], "o", color=color, ms=7 if decides else 5)
        if lo is not None:
            ax_rows.plot([lo, hi], [yi, yi], "-", color=color, lw=2.5 if decides else 1.2)
    ax_rows.axvline(0.5, color="k", lw=0.8, ls="--")
    ax_rows.set_yticks(y)
    ax_rows.set_yticklabels([f"{name} (recommendation)" if decides else name for name, _, decides in rows], fontsize=8)
    for label, (_, _, decides) in zip(ax_rows.get_yticklabels(), rows):
        if decides:
            label.set_color("tab:red")
            label.set_fontweight("bold")
    ax_rows.set_xlim(0, 1)
    ax_rows.set_xlabel("AUC, pivotal vs other tokens (0.5: chance; < 0.5: inverted)", fontsize=8)
    rec = report["recommendation"]
    ax_rows.set_title(
        f"recommendation: {rec['direction']}, gate range {rec['gate_range']}\n(read from the red row: the "
        f"{rec['statistic']} layer average as gates)",
        fontsize=9,
    )
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
