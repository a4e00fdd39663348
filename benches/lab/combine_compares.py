"""Several compares on the same warm starts, read as one experiment.

For an experiment whose arms ran in separate ``comppo-core compare`` invocations that
share their warm starts (``--warm-starts``), for example each arm at the setting a
grid chose for it: one table of final accuracies, the 2×2 interaction and the named
contrasts, paired per seed by the library's own statistics
(:mod:`comppo_core.experiments.statistics`, :mod:`comppo_core.experiments.report`), and
optionally one figure of the curves::

    python benches/lab/combine_compares.py DIR_A DIR_B [--figure curves.png --title T]

Refuses compares whose warm starts differ (their runs are not paired then).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from comppo_core.experiments.report import contrasts_table, interaction_line, plot_curves, results_table
from comppo_core.experiments.statistics import contrasts, interaction
from comppo_core.options import ARM_NAMES


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("compares", nargs="+", type=Path, help="the compares' directories")
    parser.add_argument("--figure", type=Path, default=None, help="write the curves of every arm here (PNG)")
    parser.add_argument("--title", default="", help="the figure's title")
    args = parser.parse_args()
    final: dict[str, dict[int, float]] = {}
    curves: dict[str, dict[int, list[tuple[int, float]]]] = {}
    warm: dict[int, float] | None = None
    for d in args.compares:
        r: dict[str, Any] = json.loads((d / "results.json").read_text())
        w = {int(s): a for s, a in r["warm_start"].items()}
        if warm is not None and w != warm:
            print(f"{d}: its warm starts differ from the first compare's; the runs are not paired", file=sys.stderr)
            return 2
        warm = w
        for arm, e in r["arms"].items():
            final[arm] = dict(zip(e["seeds"], e["accuracy"]))
        for arm, by_seed in r["curves"].items():
            curves[arm] = {int(s): [(int(p[0]), float(p[1])) for p in pts] for s, pts in by_seed.items()}
    assert warm is not None
    order = [a for a in ARM_NAMES if a in final]
    final = {a: final[a] for a in order}
    table, _ = results_table(final, warm)
    print(table)
    print(interaction_line(interaction(final)))
    print()
    print(contrasts_table(contrasts(final)))
    print("warm start per seed (%):", ", ".join(f"{100 * warm[s]:.1f}" for s in sorted(warm)))
    for arm, by_seed in final.items():
        print(f"{arm} per seed (%):", ", ".join(f"{100 * by_seed[s]:.1f}" for s in sorted(by_seed)))
    if args.figure is not None:
        plot_curves({a: curves[a] for a in order if a in curves}, warm, args.figure, args.title)
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
