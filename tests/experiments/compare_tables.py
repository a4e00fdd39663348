"""Reading the tables of ``results.md`` back (shared by the experiment's tests)."""

from __future__ import annotations

import re


def parse_table(text: str) -> dict[str, dict[str, str]]:
    """The first markdown table of ``text`` as {arm: {column: cell}} (duplicate headers get
    the previous header's name as a prefix: "vs grpo 95% CI")."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    names = []
    for i, h in enumerate(header):
        names.append(f"{header[i - 1]} {h}" if h == "95% CI" and i > 3 else h)
    assert set(lines[1].replace("|", "")) <= {"-"}
    table = {}
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) != len(names):
            break
        table[cells[0]] = dict(zip(names, cells))
    return table


def interval(cell: str) -> tuple[float, float]:
    m = re.fullmatch(r"\[([+-]?\d+\.\d), ([+-]?\d+\.\d)\]", cell)
    assert m, cell
    return float(m.group(1)), float(m.group(2))
