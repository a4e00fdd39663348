"""``comppo-core demo``: a short CompPO training run (needs the [rl] extra).

One ``--quick`` run serves the module: the outputs it prints and writes are checked
against the trainer's own files and against :func:`demo.credit` recomputed on the saved
checkpoint. The credit arithmetic is checked on its own with a critic whose values are
not zero and a verifier that scores some responses 1."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from comppo_core import cli
from comppo_core.commands import demo

HEADER = re.compile(r"^\s*position\s+token\s+log-prob\s+concentration\s+gate\s+value\s+GAE adv\s+Comp-GAE adv\s*$")
RESPONSE = re.compile(r"^response (\d+): '(.*)' -> '(.*)' \(answer (\d+)\), reward ([01])( |$)", re.MULTILINE)
#: in percent with one decimal, as ``comppo-core train`` prints accuracies
ACCURACY = re.compile(r"^held-out accuracy \(greedy, (\d+) problems\): (\d+\.\d%) -> (\d+\.\d%) ")
STEPS = 2


def parse_table(out: str) -> tuple[int, list[tuple[int, str, list[float]]]]:
    """The printed response's index and rows ``(position, token, [log-prob, conc, gate, value, GAE, Comp-GAE])``."""
    lines = out.splitlines()
    starts = [i for i, line in enumerate(lines) if RESPONSE.match(line)]
    assert len(starts) == 1, starts
    i = starts[0]
    m = RESPONSE.match(lines[i])
    assert m is not None
    assert HEADER.match(lines[i + 2]), lines[i + 2]
    assert set(lines[i + 3]) == {"-"}
    rows = []
    i += 4
    while i < len(lines) and lines[i].strip():
        fields = lines[i].split()
        assert len(fields) == 8, lines[i]
        rows.append((int(fields[0]), fields[1], [float(f) for f in fields[2:]]))
        i += 1
    return int(m.group(1)), rows


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``comppo-core demo --quick --steps 2`` without ``--out``: it must make and print a temporary directory."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("tqdm")
    pytest.importorskip("matplotlib")
    base = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(base))  # where mkdtemp makes the default --out
        # capsys is function-scoped: capture by hand
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            status = cli.main(["demo", "--quick", "--steps", str(STEPS), "--no-progress"])
    out = stdout.getvalue()
    m = re.search(r"output in (\S+)$", out.splitlines()[0])
    assert m is not None, out
    return {"status": status, "out": out, "err": stderr.getvalue(), "dir": Path(m.group(1)), "base": base}


def _reloaded_trainer(run_dir: Path) -> Any:
    """A trainer holding the run's final actor and critic (from its checkpoint)."""
    import torch

    from comppo_core import rl

    cfg = rl.TrainConfig.from_json((run_dir / "config.json").read_text())
    trainer = rl.Trainer(
        cfg.replace(init_from=str(run_dir / "checkpoint" / "actor"), out=None, progress=False, num_threads=None)
    )
    state = torch.load(run_dir / "checkpoint" / "state.pt", weights_only=True)
    critic: Any = trainer.critic
    critic.load_state_dict(state["critic"])
    return trainer


def test_demo_trains_and_writes_its_outputs(quick_run: dict[str, Any]) -> None:
    assert quick_run["status"] == 0, quick_run["err"]
    out, run_dir = quick_run["out"], quick_run["dir"]
    assert run_dir.parent == quick_run["base"] and run_dir.name.startswith("comppo-core-demo-")
    for name in ("config.json", "metrics.jsonl", "summary.json", "heatmap.html", "curve.png"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoint" / "actor").is_dir() and (run_dir / "warmstart").is_dir()
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["arm"] == "comppo" and cfg["steps"] == STEPS and cfg["seed"] == 0
    for key, value in demo.QUICK.items():
        assert cfg[key] == value, key
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == STEPS and rows[-1]["reward_mean"] is None  # the final evaluation
    assert [r["step"] for r in rows[:-1]] == list(range(STEPS)) and {r["arm"] for r in rows} == {"comppo"}

    # before -> after is the trainer's step-0 and final held-out accuracy
    summary = json.loads((run_dir / "summary.json").read_text())
    (line,) = [ln for ln in out.splitlines() if ACCURACY.match(ln)]
    m = ACCURACY.match(line)
    assert m is not None
    assert int(m.group(1)) == demo.QUICK["eval_size"]
    assert m.group(2) == f"{100 * summary['initial_eval_accuracy']:.1f}%"
    assert m.group(3) == f"{100 * summary['final_eval_accuracy']:.1f}%"
    assert not re.search(r"\b0\.\d{3} -> ", out)  # no fraction is printed as an accuracy
    assert rows[0]["eval_accuracy"] == summary["initial_eval_accuracy"]
    assert f"warm start: {demo.QUICK['warmup_sft_steps']} SFT steps" in out
    for text in ("HTML credit heatmap: ", "learning curve: ", "metrics: "):
        assert text + str(run_dir) in out, text


def test_table_and_heatmap_show_the_trained_policy_credit(quick_run: dict[str, Any]) -> None:
    import torch

    assert quick_run["status"] == 0, quick_run["err"]
    run_dir = quick_run["dir"]
    trainer = _reloaded_trainer(run_dir)
    c = demo.credit(trainer, trainer.eval_problems[:8])  # --responses defaults to 8
    b, rows = parse_table(quick_run["out"])
    correct = [i for i in range(8) if float(c.rewards[i]) == 1.0]
    assert b == (correct[0] if correct else 0)
    m = RESPONSE.search(quick_run["out"])
    assert m is not None, "the response line"
    assert (m.group(2), m.group(3), m.group(4)) == (c.problems[b].prompt, c.responses[b], c.problems[b].answer)
    cols = c.response_mask[b].nonzero().flatten()
    assert len(rows) == len(cols) >= 1
    assert [r[0] for r in rows] == (cols + 1).tolist()  # token positions in input_ids
    assert [r[1] for r in rows] == [demo.token_text(trainer, int(c.input_ids[b, j + 1])) for j in cols]
    got = torch.tensor([r[2] for r in rows], dtype=torch.float64)
    fields = (c.logprobs, c.concentration, c.gates, c.values, c.gae_advantages, c.advantages)
    expected = torch.stack([f[b, cols] for f in fields], dim=1).double()
    assert (got - expected).abs().max() <= 5.1e-5  # printed with 4 decimals
    # the last response token: δ = r − V, and neither estimator has anything ahead to carry back
    assert abs(rows[-1][2][4] - (float(c.rewards[b]) - rows[-1][2][3])) <= 1.1e-4
    assert rows[-1][2][4] == rows[-1][2][5]

    # the HTML: self-contained, one span per response token in each view, the same numbers
    page = (run_dir / "heatmap.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "http://" not in page and "https://" not in page and "<script" not in page and "<link" not in page
    assert page.count('<div class="resp">') == 8
    mask = c.response_mask
    for view, values in (("gate", c.gates), ("advantage", c.advantages), ("gae", c.gae_advantages)):
        spans = re.findall(rf'<span class="tok" data-view="{view}" data-pos="(\d+)" data-value="([^"]+)"', page)
        where = [(i, int(j)) for i in range(mask.shape[0]) for j in mask[i].nonzero().flatten()]
        assert [int(p) for p, _ in spans] == [j + 1 for _, j in where], view
        assert max(abs(float(v) - float(values[i, j])) for (_, v), (i, j) in zip(spans, where)) <= 1e-6


def test_learning_curve_is_a_png(quick_run: dict[str, Any]) -> None:
    from matplotlib import image

    assert quick_run["status"] == 0, quick_run["err"]
    path = quick_run["dir"] / "curve.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (640, 400)
    pixels = image.imread(path)
    assert pixels.shape[:2] == (400, 640) and float(pixels[..., :3].std()) > 0.0  # decodes, and is not blank


@pytest.mark.slow
def test_credit_is_gae_and_comp_gae_of_the_scoring_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a critic that predicts something and a verifier that scores rows 0 and 2,
    the fields of ``credit`` follow the recursion of the module docstring exactly."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from comppo_core import rl

    trainer = rl.Trainer(rl.TrainConfig(arm="comppo", warmup_sft_steps=0, eval_size=8, progress=False))
    critic: Any = trainer.critic  # a TransportAlignedCritic
    with torch.no_grad():
        critic.head.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(3))
        critic.head.bias.fill_(0.2)
    scored = {0, 2}
    monkeypatch.setattr(
        trainer.task,
        "rewards",
        lambda problems, responses, finished: [1.0 if i in scored else 0.0 for i in range(len(problems))],
    )
    problems = trainer.eval_problems[:4]
    c = demo.credit(trainer, problems)
    cfg = trainer.config
    assert [float(x) for x in c.rewards] == [1.0, 0.0, 1.0, 0.0]
    prompt_width = max(len(p.prompt) + 1 for p in problems)  # BOS + prompt, left-padded
    for b in range(4):
        cols = c.response_mask[b].nonzero().flatten().tolist()
        assert cols[0] == prompt_width - 1 and cols == list(range(cols[0], cols[-1] + 1))
        outside = ~c.response_mask[b]
        for f in (c.logprobs, c.gates, c.values, c.advantages, c.gae_advantages):
            assert bool((f[b][outside] == 0).all())
        g = c.gates[b, cols].double()
        assert bool(((g >= cfg.gate_low) & (g <= cfg.gate_high)).all()) and float(g.std()) > 0
        v = c.values[b, cols].double()
        assert float(v.abs().max()) > 0.01
        r = torch.zeros(len(cols), dtype=torch.float64)
        r[-1] = float(c.rewards[b])
        for gates, adv in ((torch.ones_like(g), c.gae_advantages), (g, c.advantages)):
            a, expected = 0.0, []
            for t in reversed(range(len(cols))):
                v_next = float(v[t + 1]) if t + 1 < len(cols) else 0.0
                delta = float(r[t]) + cfg.gamma * float(gates[t]) * v_next - float(v[t])
                a = delta + cfg.gamma * cfg.lam * float(gates[t]) * a
                expected.append(a)
            assert torch.allclose(adv[b, cols].double(), torch.tensor(expected[::-1], dtype=torch.float64), atol=1e-5)
    assert not torch.allclose(c.advantages, c.gae_advantages)  # gates below 1 change the credit


@pytest.mark.parametrize(
    "extra",
    [
        ["--steps", "0"],
        ["--responses", "0"],
        ["--steps", "x"],
        ["--seed", "-1"],
        ["--num-threads", "0"],
        ["--threads", "0"],
        ["--arm", "ppo"],
    ],
)
def test_bad_arguments_return_2(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", *extra]) == 2
    assert "error" in capsys.readouterr().err


def test_missing_rl_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    assert cli.main(["demo", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert (
        "comppo-core demo needs the [rl] extra (torch, transformers, tqdm, matplotlib): pip install 'comppo-core[rl]'"
        in err
    )
    assert "`comppo-core synthetic` runs with NumPy only" in err
    assert not (tmp_path / "run").exists()


def test_help_lists_demo_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.index("demo") < text.index("synthetic")
    assert cli.main(["demo", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--out", "--steps", "--seed", "--quick", "--responses", "--num-threads", "--no-progress"):
        assert flag in text, flag


def test_demo_help_states_each_default_once(capsys: pytest.CaptureFixture[str]) -> None:
    """No "(default: True)" for --no-progress, no "(default: None)" after a default said in
    words: each flag's help gives its default once, as it is."""
    assert cli.main(["demo", "--help"]) == 0
    out = capsys.readouterr().out
    text = " ".join(out.split())
    for wrong in ("(default: True)", "(default: False)", "(default: None)", ") (default:"):
        assert wrong not in text, wrong
    helps: dict[str, str] = {}  # each option's help, its wrapped lines joined
    flag = ""
    for line in out.split("\noptions:\n")[1].splitlines():
        if line.startswith("  -"):
            flag, _, rest = line.strip().partition(" ")
            flag = flag.rstrip(",")
            rest = rest.strip()
            if rest[:1].isupper():  # the metavar
                rest = rest.partition(" ")[2].strip()
            helps[flag] = rest
        else:
            helps[flag] = f"{helps[flag]} {line.strip()}".strip()
    assert "(default: the demo preset's, 40; 3 with --quick)" in helps["--steps"]
    assert helps["--seed"].endswith("(default: 0)") and helps["--responses"].endswith("(default: 8)")
    assert "(default: a new temporary directory, printed)" in helps["--out"]
    assert helps["--no-progress"] == "hide the progress bar (default: shown)"
    assert "(default: the trainer's choice" in helps["--num-threads"]
    assert all(h.count("default") <= 1 for h in helps.values()), helps
    assert "--threads" not in text.replace("--num-threads", "")  # the alias is not offered


def test_threads_is_an_alias_of_num_threads(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's thread flag is train's, --num-threads; --threads still works, saying so."""
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["demo", "--num-threads", "2"]).num_threads == 2
    assert capsys.readouterr().err == ""
    assert parser.parse_args(["demo", "--threads", "3"]).num_threads == 3
    assert capsys.readouterr().err == demo.THREADS_ALIAS_NOTE + "\n"
    assert "--threads is an alias of --num-threads" in demo.THREADS_ALIAS_NOTE
    assert parser.parse_args(["demo"]).num_threads is None


def test_the_demo_is_the_demo_preset_of_comppo() -> None:
    """Without --steps the demo is ``comppo-core train --arm comppo --preset demo`` (its
    steps, as the help says); --steps, --num-threads and --quick change only what they name."""
    pytest.importorskip("torch")
    from comppo_core import rl

    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers(dest="command"))

    def config(*flags: str) -> Any:
        return demo.config_for(parser.parse_args(["demo", *flags]), "out")

    preset = rl.TrainConfig.from_preset("demo")
    expected = preset.replace(arm="comppo", seed=0, out="out", progress=True, num_threads=None)
    assert config() == expected and expected.steps == 40 != rl.TrainConfig().steps
    assert expected.sft_carry_noise == 0.5 and expected.warmup_sft_steps == 240
    assert config("--steps", "7") == expected.replace(steps=7)
    assert config("--num-threads", "2") == expected.replace(num_threads=2)
    assert config("--threads", "2") == expected.replace(num_threads=2)
    assert config("--quick") == expected.replace(steps=demo.QUICK_STEPS, **demo.QUICK)
    assert config("--quick", "--steps", "5").steps == 5


def test_forgetting_the_carries_is_a_consistent_wrong_procedure() -> None:
    from comppo_core.rl.tasks.addition import has_carry, worked_solution

    carrying = 0
    for a in range(100):
        for b in range(100):
            right, forgot = worked_solution(a, b), worked_solution(a, b, carries=False)
            assert right.endswith(f";{a + b}")
            if not has_carry(a, b):
                assert forgot == right
                continue
            carrying += 1
            steps, answer = forgot.split(";")
            assert all(c.count("+") == 1 for c in steps.split(",")) and int(answer) != a + b  # no carry, wrong
            assert steps.count(",") == right.split(";")[0].count(",")  # the same columns
    assert carrying == 4455  # 2-digit pairs whose columns carry


def test_the_noisy_warm_start_forgets_the_carries_of_the_share_asked() -> None:
    pytest.importorskip("torch")
    import numpy as np

    from comppo_core.rl.config import TrainConfig
    from comppo_core.rl.engine import build
    from comppo_core.rl.tasks.addition import AdditionTask

    task = AdditionTask(2)
    seen: list[str] = []  # the demonstrations the warm start trained on
    encode = task.tokenizer.encode

    def spy(text: str, **kw: Any) -> list[int]:
        if kw.get("add_eos"):
            seen.append(text)
        return encode(text, **kw)

    task.tokenizer.encode = spy  # type: ignore[method-assign]
    model = build.build_policy(TrainConfig(), task.tokenizer.vocab_size)
    build.sft_warm_start(model, task, steps=2, batch_size=400, lr=1e-4, rng=np.random.default_rng(0), carry_noise=0.5)
    assert len(seen) == 800

    # a column before the last that reaches 10 carries: its right demonstration adds "+1" next
    def carries(d: str) -> bool:
        return any(int(c.split("=")[1]) >= 10 for c in d.split(";")[0].split(",")[:-1])

    def writes_a_carry(d: str) -> bool:
        return any(c.count("+") == 2 for c in d.split(";")[0].split(","))

    carrying = [d for d in seen if carries(d)]
    forgetting = [d for d in carrying if not writes_a_carry(d)]
    assert 0.4 < len(forgetting) / len(carrying) < 0.6, (len(forgetting), len(carrying))
    seen.clear()
    build.sft_warm_start(model, task, steps=1, batch_size=400, lr=1e-4, rng=np.random.default_rng(0))
    assert all(writes_a_carry(d) for d in seen if carries(d))  # without noise every carry is written
