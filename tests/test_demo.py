"""``comppo-core demo``: the CompPO pipeline end to end on a tiny Llama (needs torch, transformers)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from comppo_core import cli
from comppo_core.commands import demo

HEADER = re.compile(r"^\s*position\s+token\s+log-prob\s+concentration\s+gate\s+GAE adv\s+Comp-GAE adv\s*$")
RESPONSE = re.compile(r"^response (\d+): '(.*)' -> '(.*)' \(answer (\d+)\), reward ([+-]\d+)$")


def parse_tables(out: str) -> dict[int, list[tuple[int, str, list[float]]]]:
    """Response index → rows ``(position, token, [log-prob, conc, gate, GAE adv, Comp-GAE adv])``."""
    lines = out.splitlines()
    tables: dict[int, list[tuple[int, str, list[float]]]] = {}
    i = 0
    while i < len(lines):
        m = RESPONSE.match(lines[i])
        if m is None:
            i += 1
            continue
        b = int(m.group(1))
        assert HEADER.match(lines[i + 1]), lines[i + 1]
        assert set(lines[i + 2]) == {"-"}
        rows = []
        i += 3
        while i < len(lines) and lines[i].strip():
            fields = lines[i].split()
            assert len(fields) == 7, lines[i]
            rows.append((int(fields[0]), fields[1], [float(f) for f in fields[2:]]))
            i += 1
        tables[b] = rows
    return tables


def test_tokenizer_and_verifier() -> None:
    tok = demo.CharTokenizer()
    ids = tok.encode("12+7= 3-4*5")
    assert tok.decode(ids) == "12+7= 3-4*5"
    assert tok.decode(ids[:3] + [tok.eos_id] + ids[3:]) == "12+"
    assert tok.decode([tok.bos_id, tok.pad_id] + ids[:2]) == "12"
    assert tok.show(tok.index[" "]) == "␠" and tok.show(tok.eos_id) == "<eos>"
    with pytest.raises(ValueError, match="character 'x' is not in the demo vocabulary"):
        tok.encode("1x")
    assert demo.verify("19", 19) == 1.0
    assert demo.verify(" 19 ", 19) == 1.0
    assert demo.verify("019", 19) == 1.0
    for wrong in ("", "18", "19-", "1 9", "+19", "-"):
        assert demo.verify(wrong, 19) == -1.0, wrong


def test_demo_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from comppo_core import hf

    html_path = tmp_path / "heatmap.html"
    argv = ["demo", "--html", str(html_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"HTML credit heatmap: {html_path}" in out
    tables = parse_tables(out)
    assert sorted(tables) == list(range(6))  # default: 6 prompts, one response each

    # the same pipeline, run here: same model, samples and options (everything is seeded)
    args = cli._build_parser().parse_args(argv)
    batch = demo.prepare(args)
    res = hf.comp_gae_batch(
        batch.model, batch.input_ids, batch.attention_mask, batch.response_mask, batch.rewards, **demo.pipeline_options(args)
    )
    assert torch.all(batch.rewards.abs() == 1)
    assert "-1" in out or "+1" in out
    for b, rows in tables.items():
        cols = res.mask[b].nonzero().flatten()
        assert [r[0] for r in rows] == (cols + 1).tolist()  # token positions in input_ids
        assert [r[1] for r in rows] == [batch.tokenizer.show(int(batch.input_ids[b, j + 1])) for j in cols]
        got = torch.tensor([r[2] for r in rows], dtype=torch.float64)
        expected = torch.stack(
            [res.logprobs[b, cols], res.concentration[b, cols], res.gates[b, cols], res.gae_advantages[b, cols], res.advantages[b, cols]],
            dim=1,
        ).double()
        assert (got - expected).abs().max() <= 5.1e-5  # printed with 4 decimals
        # the outcome reward of the verifier sits on the last response token: A = r there
        assert rows[-1][2][3] == rows[-1][2][4] == float(batch.rewards[b])
    m = re.search(r"verifier: (\d+) correct \(\+1\) / (\d+) wrong \(-1\)", out)
    assert m is not None and int(m.group(1)) == int((batch.rewards > 0).sum())

    # the HTML: self-contained, one span per response token in each view, the same numbers
    page = html_path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "http://" not in page and "https://" not in page and "<script" not in page and "<link" not in page
    n_tokens = int(res.mask.sum())
    for view, values in (("gate", res.gates), ("advantage", res.advantages), ("gae", res.gae_advantages)):
        spans = re.findall(rf'<span class="tok" data-view="{view}" data-pos="(\d+)" data-value="([^"]+)"', page)
        assert len(spans) == n_tokens, view
        expected_values = [float(values[b, j]) for b in range(res.mask.shape[0]) for j in res.mask[b].nonzero().flatten()]
        assert max(abs(float(v) - e) for (_, v), e in zip(spans, expected_values)) <= 1e-6
    assert page.count('<div class="resp">') == 6


def test_demo_is_deterministic_and_controls_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    base = ["demo", "--prompts", "3", "--max-new-tokens", "6", "--seed", "4", "--html", str(tmp_path / "a.html")]
    assert cli.main(base) == 0
    first = parse_tables(capsys.readouterr().out)
    assert cli.main(base) == 0
    assert parse_tables(capsys.readouterr().out) == first
    assert cli.main(base + ["--control", "constant"]) == 0
    const = parse_tables(capsys.readouterr().out)
    gates = {round(row[2][2], 4) for rows in const.values() for row in rows}
    assert len(gates) == 1  # one batch-mean gate
    mean = sum(row[2][2] for rows in first.values() for row in rows) / sum(len(r) for r in first.values())
    assert abs(gates.pop() - mean) <= 1e-4
    for b in first:  # log-probs and concentration do not depend on the control
        assert [r[2][:2] for r in const[b]] == [r[2][:2] for r in first[b]]


@pytest.mark.parametrize(
    "extra",
    [["--low", "0.9", "--high", "0.5"], ["--hidden", "30", "--heads", "4"], ["--heads", "4", "--kv-heads", "3"], ["--prompts", "0"], ["--statistic", "mean"]],
)
def test_bad_arguments_return_2(extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--html", str(tmp_path / "x.html")] + extra) == 2
    assert "error" in capsys.readouterr().err


def test_missing_hf_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    assert cli.main(["demo", "--html", str(tmp_path / "x.html")]) == 1
    out = capsys.readouterr().err
    assert "comppo-core demo needs the [hf] extra: pip install 'comppo-core[hf]'" in out
    assert "`comppo-core synthetic` runs with NumPy only" in out
    assert not (tmp_path / "x.html").exists()


def test_help_lists_demo_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.index("demo") < text.index("synthetic")
    assert cli.main(["demo", "--help"]) == 0
    assert "--control" in capsys.readouterr().out
