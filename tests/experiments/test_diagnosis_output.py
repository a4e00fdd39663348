"""diagnosis.png and the rows it shows (experiments/diagnosis_output.py), on synthetic reports: a
figure of one size whatever the model's depth, whose decisive row is the one the recommendation reads."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from comppo_core.experiments.diagnosis_output import deciding_rows, layer_grid, write_outputs

STATS = ("entropy", "max", "l2")


def entry(estimate: float | None, low: float | None, high: float | None) -> dict[str, Any]:
    return {"auc": {"estimate": estimate, "ci": [low, high]}, "spearman": {"estimate": 0.0, "ci": [-0.1, 0.1]}}


def report(layers: int, statistic: str = "max") -> dict[str, Any]:
    rng = np.random.default_rng(layers)
    auc: dict[str, dict[str, Any]] = {}
    for k, stat in enumerate(STATS):
        auc[stat] = {"mean": entry(0.55 + 0.01 * k, 0.5 + 0.01 * k, 0.6 + 0.01 * k)}
        for layer in range(layers):
            e = float(rng.uniform(0.3, 0.7))
            auc[stat][f"layer{layer}"] = entry(e, e - 0.05, e + 0.05)
        auc[stat]["gates"] = entry(0.6 + 0.05 * k, 0.52 + 0.05 * k, 0.68 + 0.05 * k)
    auc["l2"]["layer0"] = entry(None, None, None)  # an undefined layer
    baselines = {
        "position": entry(0.4, 0.3, 0.5),
        "policy_entropy": {**entry(0.7, 0.6, 0.8), "gates": entry(0.71, 0.61, 0.81)},
    }
    return {
        "settings": {
            "task": {"name": "jsonl", "path": "add.jsonl"},
            "samples_per_prefix": 8,
            "pivotal_threshold": 0.25,
            "level": 0.95,
            "bootstrap": 200,
        },
        "recommendation": {"direction": "as_is", "gate_range": [0.9, 1.0], "statistic": statistic, "why": "above"},
        "responses": {"count": 24, "decoding": "sampled", "mean_reward": 0.4, "mean_tokens": 6.0},
        "cost": {"generated_tokens": 1000, "continuation_rows": 100, "seconds": {"total": 12.0}},
        "pivotal": {"pivotal_tokens": 10, "tokens": 100},
        "auc": auc,
        "baselines": baselines,
    }


def test_the_recommendations_row_comes_first_and_only_it_is_marked() -> None:
    rows = deciding_rows(report(4, statistic="max"))
    assert rows[0][0] == "max, layer average as gates" and rows[0][2] is True
    assert rows[0][1] == report(4)["auc"]["max"]["gates"]["auc"]
    assert [decides for _, _, decides in rows].count(True) == 1
    labels = [name for name, _, _ in rows]
    # every statistic as gates and as its layer average, then the baselines (a gate source as gates)
    assert labels[1:3] == ["entropy, layer average as gates", "l2, layer average as gates"]
    assert "baseline: policy_entropy as gates" in labels and "baseline: position" in labels
    assert len(rows) == 2 * len(STATS) + 2


def test_layer_grid_holds_every_layer_and_statistic() -> None:
    r = report(30)
    stats, auc, clear = layer_grid(r)
    assert stats == list(STATS) and auc.shape == (30, 3) == clear.shape
    assert np.isnan(auc[0, 2]) and not clear[0, 2]
    e = r["auc"]["entropy"]["layer7"]["auc"]
    assert auc[7, 0] == e["estimate"] and clear[7, 0] == (e["ci"][0] > 0.5 or e["ci"][1] < 0.5)


def png_size(path: Path) -> tuple[int, int]:
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    return width, height


@pytest.mark.parametrize("layers", [2, 30])
def test_the_figure_has_one_size_whatever_the_depth(tmp_path: Path, layers: int) -> None:
    pytest.importorskip("matplotlib")
    paths = write_outputs(tmp_path / "diag", report(layers), "a policy")
    png = paths[2]
    assert png.read_bytes()[:4] == b"\x89PNG"
    width, height = png_size(png)
    assert 1000 <= width <= 1300 and 450 <= height <= 700, (width, height)  # 30 layers: was 3,245 px tall
