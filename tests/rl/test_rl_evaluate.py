"""A saved actor holds its tokenizer, and ``comppo-core evaluate`` scores it (issue 30, item 6).

What is pinned: the built-in :class:`CharTokenizer` as a Hugging Face tokenizer
(``to_hf``) behaves exactly like it in the trainer's interface (ids, prompts, decoding),
before and after ``save_tokenizer`` + ``load_tokenizer``; ``save_tokenizer`` replaces
files whole, leaving nothing behind; a tiny Llama saved with its tokenizer loads back
(``AutoModelForCausalLM`` + ``load_tokenizer``) and generates what it generated before;
``comppo-core evaluate`` prints and writes the held-out accuracy the trainer computes on
the same model, task and evaluation set (``task.json`` of a run's warm start included);
bad input is one line naming the flag, exit status 2, before torch is imported.

Frozen evaluation (issue 43, item 3): ``--task`` several times and ``--samples N`` on a
plain Hugging Face directory (a TRL output: ``save_pretrained`` of the model and of the
tokenizer): the JSON's schema, pass@k recomputed from the per-problem counts by the
estimator, the macro the mean of the tasks, pass@k monotone in k, the same samples for a
seed whatever the batch size or the other tasks (and the documented keys), the one-task
report's keys kept, task.json's settings for its own task alone, and the sampling flags
refused naming the flag.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("tqdm")

from comppo_core import cli
from comppo_core.errors import ParameterError
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.engine.evaluation import heldout_accuracy, heldout_rewards
from comppo_core.rl.engine.rollout import generate
from comppo_core.rl.engine.trainer import Trainer, train
from comppo_core.rl.models import pretrained
from comppo_core.rl.models import tokenizer as tokenizer_module
from comppo_core.rl.models.pretrained import HFTokenizer, load_policy, load_tokenizer, save_tokenizer
from comppo_core.rl.tasks import build_task
from comppo_core.rl.tasks.addition import ALPHABET, AdditionTask, CharTokenizer
from comppo_core.rl.tasks.filler_addition import FillerAdditionTask

CHAR = CharTokenizer()
#: the HF tokenizer in memory, and as saved and loaded back (same interface)
AS_HF = HFTokenizer(CHAR.to_hf())
LINE = re.compile(
    r"comppo-core evaluate: (?P<model>.+): held-out accuracy (?P<pct>\d+\.\d)% \((?P<correct>\d+) of "
    r"(?P<n>\d+) problems, (?P<task>[^)]+)\) in \d+ s"
)
#: a task's line with --samples: the greedy part, then pass@k of the samples
SAMPLED = re.compile(
    r"comppo-core evaluate: (?P<model>.+): held-out accuracy (?P<pct>\d+\.\d)% \((?P<correct>\d+) of "
    r"(?P<n>\d+) problems, (?P<task>.+)\), sampled (?P<passes>pass@1 .+) \((?P<samples>\d+) samples\) in \d+ s"
)
MACRO = re.compile(
    r"comppo-core evaluate: (?P<model>.+): macro over (?P<tasks>\d+) tasks: held-out accuracy (?P<pct>\d+\.\d)%"
    r"(, sampled (?P<passes>pass@1 .+) \((?P<samples>\d+) samples\))? in \d+ s"
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny random policy never adds correctly; score a response by the parity of its
    characters' code points, so accuracies are neither 0 nor 1 and depend on the text."""

    def parity(self: AdditionTask, problem: Any, response: str, finished: bool) -> float:
        return float(sum(map(ord, response)) % 2 == 0)

    monkeypatch.setattr(AdditionTask, "reward", parity)
    monkeypatch.setattr(FillerAdditionTask, "reward", parity)


def char_lm(tiny_lm: Any, seed: int = 0) -> Any:
    """A tiny Llama over the character tokenizer's 17 ids (pad 0, bos 1, eos 2)."""
    return tiny_lm(
        vocab=CHAR.vocab_size, seed=seed, special_tokens=False, pad_token_id=0, bos_token_id=1, eos_token_id=2
    )


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory: pytest.TempPathFactory, tiny_lm: Any) -> Path:
    """A tiny Llama saved with ``save_pretrained`` and the character tokenizer with
    ``save_tokenizer``, as the trainer saves an actor."""
    path = tmp_path_factory.mktemp("actor")
    char_lm(tiny_lm).save_pretrained(path)
    save_tokenizer(CHAR, path)
    return path


# ---------------------------------------------------------------------------------------------------------
# the character tokenizer as a Hugging Face tokenizer


def test_the_hf_tokenizer_has_the_same_ids(saved_dir: Path) -> None:
    for tok in (AS_HF, load_tokenizer(saved_dir)):
        assert tok.vocab_size == CHAR.vocab_size == 17
        assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
        assert tok.encode_prompt("27+45=") == CHAR.encode_prompt("27+45=") == [1, 5, 10, 13, 7, 8, 14]
        assert tok.decode([1, 5, 10, 13, 7, 8, 14, 2, 0, 0]) == "27+45="


texts = st.text(alphabet=ALPHABET, max_size=40)
ids = st.lists(st.integers(0, CHAR.vocab_size - 1), max_size=40)


@given(text=texts, add_bos=st.booleans(), add_eos=st.booleans())
def test_the_hf_tokenizer_encodes_like_the_char_tokenizer(text: str, add_bos: bool, add_eos: bool) -> None:
    assert AS_HF.encode_prompt(text) == CHAR.encode_prompt(text)
    assert AS_HF.encode(text, add_bos=add_bos, add_eos=add_eos) == CHAR.encode(text, add_bos=add_bos, add_eos=add_eos)


@given(ids=ids, skip=st.booleans())
def test_the_hf_tokenizer_decodes_like_the_char_tokenizer(ids: list[int], skip: bool) -> None:
    assert AS_HF.decode(ids, skip_special_tokens=skip) == CHAR.decode(ids, skip_special_tokens=skip)


def test_every_short_string_and_a_whole_problem_set_agree(saved_dir: Path) -> None:
    """Exhaustive over strings of up to 3 characters, and every prompt and worked solution
    of 2-digit addition, for the tokenizer as saved and loaded back."""
    loaded = load_tokenizer(saved_dir)
    strings = [""] + list(ALPHABET)
    strings += [a + b for a in ALPHABET for b in ALPHABET]
    strings += [a + b + c for a in ALPHABET for b in ALPHABET for c in ALPHABET]
    task = AdditionTask(2)
    strings += [t for p in task.heldout(300) for t in (p.prompt, p.solution)]
    for tok in (AS_HF, loaded):
        for s in strings:
            assert tok.encode_prompt(s) == CHAR.encode_prompt(s), s
            assert tok.encode(s, add_eos=True) == CHAR.encode(s, add_eos=True), s
            full = CHAR.encode(s, add_bos=True, add_eos=True) + [0, 0]
            assert tok.decode(full) == CHAR.decode(full) == s


def test_another_alphabet_with_spaces_newlines_and_unicode(tmp_path: Path) -> None:
    char = CharTokenizer("ab c\né<>xyz")
    hf = load_tokenizer(save_tokenizer(char, tmp_path))
    for s in [" a  b\né c ", "<ab>", "\n\n", ""]:
        assert hf.encode_prompt(s) == char.encode_prompt(s)
        assert hf.decode(char.encode(s, add_bos=True, add_eos=True)) == s
    assert hf.vocab_size == char.vocab_size


def test_an_alphabet_that_spells_a_special_token_is_refused() -> None:
    with pytest.raises(
        ParameterError, match=r"^alphabet: expected an alphabet that cannot spell the special token '<bos>'"
    ):
        CharTokenizer("<bos>0123").to_hf()


# ---------------------------------------------------------------------------------------------------------
# save_tokenizer


def test_save_tokenizer_round_trips_a_char_and_an_hf_tokenizer(tmp_path: Path) -> None:
    first = save_tokenizer(CHAR, tmp_path / "a")  # the directory is created
    again = save_tokenizer(load_tokenizer(first), tmp_path / "b")  # an HFTokenizer: its tokenizer's files
    raw = save_tokenizer(CHAR.to_hf(), tmp_path / "c")  # a transformers tokenizer
    for d in (first, again, raw):
        tok = load_tokenizer(d)
        assert tok.encode_prompt("9+9=") == CHAR.encode_prompt("9+9=")
        assert json.loads((d / "tokenizer_config.json").read_text())["eos_token"] == "<eos>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # no staging directory left
    save_tokenizer(CHAR, first)  # again into the same directory: files replaced
    assert load_tokenizer(first).vocab_size == 17
    with pytest.raises(ParameterError, match=r"^tokenizer: expected a CharTokenizer, an HFTokenizer"):
        save_tokenizer(object(), tmp_path / "d")


def test_a_crash_while_saving_leaves_no_partial_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tokenizer.json is moved in last, whole: a crash before it leaves a directory that
    load_tokenizer refuses with the directory's name, and no temporary files."""
    moved: list[str] = []
    real = os.replace

    def crash_at_tokenizer_json(src: Any, dst: Any) -> None:
        if Path(dst).name == "tokenizer.json":
            raise OSError("disk full")
        moved.append(Path(dst).name)
        real(src, dst)

    monkeypatch.setattr(tokenizer_module.os, "replace", crash_at_tokenizer_json)
    with pytest.raises(OSError, match="disk full"):
        save_tokenizer(CHAR, tmp_path / "actor")
    monkeypatch.undo()
    assert "tokenizer_config.json" in moved
    assert not (tmp_path / "actor" / "tokenizer.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["actor"]
    with pytest.raises(ParameterError, match=r"^model: could not load the tokenizer in '.*actor'"):
        load_tokenizer(tmp_path / "actor")
    save_tokenizer(CHAR, tmp_path / "actor")  # and the next save completes it
    assert load_tokenizer(tmp_path / "actor").encode_prompt("1+2=") == CHAR.encode_prompt("1+2=")


def test_a_saved_actor_loads_back_and_generates_the_same(tiny_lm: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = char_lm(tiny_lm, seed=3)
    model.save_pretrained(tmp_path)
    save_tokenizer(CHAR, tmp_path)
    tok = load_tokenizer(tmp_path)
    problems = AdditionTask(2).heldout(12)
    before = generate(model, CHAR, problems, max_new_tokens=10, device=torch.device("cpu"), sample=False)
    for loaded in (AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval(), load_policy(tmp_path)):
        after = generate(loaded, tok, problems, max_new_tokens=10, device=torch.device("cpu"), sample=False)
        assert torch.equal(before[0], after[0])
        assert after[2] == before[2]
    assert {CHAR.decode(r) for r in before[0][:, before[2] :].tolist()} != {""}  # it did generate something


# ---------------------------------------------------------------------------------------------------------
# comppo-core evaluate


def trainer_accuracy(model: Path, **settings: Any) -> float:
    """The held-out accuracy ``Trainer.evaluate`` reports for ``model``."""
    cfg = TrainConfig(
        model=str(model), arm="grpo", kl_coef=0.0, log_kl=False, steps=1, progress=False, num_threads=1, device="cpu",
        **settings,
    )  # fmt: skip
    trainer = Trainer(cfg)
    try:
        return trainer.evaluate()
    finally:
        trainer.dist.close()


def test_evaluate_prints_and_writes_the_trainers_accuracy(
    saved_dir: Path, tmp_path: Path, signal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "eval.json"
    argv = ["evaluate", "--model", str(saved_dir), "--digits", "1", "--eval-size", "16", "--device", "cpu"]
    assert cli.main([*argv, "--num-threads", "1", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    m = LINE.fullmatch(out.strip())
    assert m, out
    assert m["model"] == str(saved_dir) and m["task"] == "1-digit addition"
    expected = trainer_accuracy(saved_dir, digits=1, eval_size=16)
    n = len(AdditionTask(1).heldout(16))
    assert int(m["n"]) == n == 16
    assert int(m["correct"]) == round(expected * n)
    assert 0 < expected < 1  # the signal makes it a real comparison
    data = json.loads(report.read_text())
    assert data["accuracy"] == pytest.approx(expected, abs=1e-12)
    assert (data["correct"], data["problems"]) == (round(expected * n), n)
    assert data["model"] == str(saved_dir.resolve())
    assert data["task"] == {**AdditionTask(1).to_dict(), "description": "1-digit addition"}
    assert data["settings"]["eval_size_requested"] == 16 and "eval_size" not in data["settings"]
    assert data["settings"]["max_new_tokens"] == AdditionTask(1).max_new_tokens
    assert data["settings"]["device"] == "cpu" and data["settings"]["task_json"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["eval.json"]  # the temporary file was renamed
    # the one-task report's keys beside the frozen evaluation's: the same numbers
    entry = data["tasks"]["addition"]
    assert entry["task"] == data["task"] and entry["problems"] == n
    assert entry["accuracy"] == entry["greedy_pass@1"] == data["accuracy"]
    assert sum(entry["greedy_correct"]) == data["correct"] and set(entry["greedy_correct"]) <= {0, 1}
    assert "n" not in entry and "correct" not in entry and "pass@1" not in entry  # no --samples
    assert data["macro"] == {"accuracy": data["accuracy"], "greedy_pass@1": data["accuracy"]}
    assert data["settings"]["samples"] is None


def test_the_json_reports_the_problems_evaluated_beside_the_size_asked_for(
    saved_dir: Path, tmp_path: Path, signal: None
) -> None:
    """A split smaller than --eval-size is evaluated whole: ``problems`` is what was evaluated
    (2024 for 2-digit addition at the default 2048; here 1-digit addition, 17 of its 100 pairs held out),
    and the size asked for is named as such, not as the size evaluated."""
    report = tmp_path / "eval.json"
    argv = ["evaluate", "--model", str(saved_dir), "--digits", "1", "--eval-size", "2048", "--device", "cpu"]
    assert cli.main([*argv, "--json", str(report)]) == 0
    data = json.loads(report.read_text())
    held = AdditionTask(1).heldout(2048)
    assert data["problems"] == len(held) < 2048
    assert data["settings"]["eval_size_requested"] == 2048 and "eval_size" not in data["settings"]
    assert data["accuracy"] == pytest.approx(data["correct"] / data["problems"], abs=1e-12)


def test_the_shared_function_is_the_trainers_evaluation(saved_dir: Path, signal: None) -> None:
    cfg = TrainConfig(model=str(saved_dir), digits=2, eval_size=24, split_seed=5)
    task = build_task(cfg)
    from comppo_core.rl.engine.build import make_task

    made, _ = make_task(cfg)
    assert task.to_dict() == made.to_dict() and task.heldout(24) == made.heldout(24)
    problems = task.heldout(24)
    actor, tok = load_policy(saved_dir), load_tokenizer(saved_dir)
    acc = heldout_accuracy(actor, tok, task, problems, max_new_tokens=task.max_new_tokens, device=torch.device("cpu"))
    assert acc == trainer_accuracy(saved_dir, digits=2, eval_size=24, split_seed=5)
    # a rank's share scored at the whole set's width gives the same scores
    whole = heldout_rewards(actor, tok, task, problems, max_new_tokens=task.max_new_tokens, device=torch.device("cpu"))
    width = max(len(tok.encode_prompt(p.prompt)) for p in problems)
    part = heldout_rewards(
        actor, tok, task, problems[:9], max_new_tokens=task.max_new_tokens, device=torch.device("cpu"), width=width
    )
    assert part == whole[:9]


def test_a_runs_warm_start_is_evaluated_on_the_runs_heldout_set(
    tmp_path: Path, signal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """OUT/warmstart with its task.json (and the tokenizer the trainer will save there):
    evaluate's defaults are the run's split, and its accuracy is the run's step-0 accuracy."""
    from rl_tiny import TINY_SETTINGS

    out = tmp_path / "run"
    settings = {**TINY_SETTINGS, "steps": 1, "eval_every": 1, "eval_size": 12, "split_seed": 3}
    summary = train(TrainConfig(**settings, arm="grpo", out=str(out), device="cpu", num_threads=1))
    warm = out / "warmstart"
    if not any((warm / name).is_file() for name in pretrained.TOKENIZER_FILES):
        save_tokenizer(CHAR, warm)  # what the trainer does beside save_pretrained once it saves tokenizers
    assert cli.main(["evaluate", "--model", str(warm), "--eval-size", "12", "--device", "cpu"]) == 0
    m = LINE.fullmatch(capsys.readouterr().out.strip())
    assert m and m["task"] == "1-digit addition" and int(m["n"]) == 12
    assert int(m["correct"]) == round(summary["initial_eval_accuracy"] * 12)
    # a flag given overrides task.json: another split, other problems
    report = tmp_path / "other.json"
    argv = ["evaluate", "--model", str(warm), "--eval-size", "12", "--split-seed", "4", "--json", str(report)]
    assert cli.main([*argv, "--device", "cpu"]) == 0
    data = json.loads(report.read_text())
    assert data["task"]["split_seed"] == 4 and data["task"]["digits"] == 1
    assert data["settings"]["task_json"] == str((warm / "task.json").resolve())


def test_evaluate_on_a_jsonl_task(saved_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = tmp_path / "sums.jsonl"
    task.write_text(
        "".join(json.dumps({"prompt": f"{a}+{b}=", "answer": a + b}) + "\n" for a in range(6) for b in range(6))
    )
    argv = ["evaluate", "--model", str(saved_dir), "--task", str(task), "--max-new-tokens", "4", "--device", "cpu"]
    assert cli.main(argv) == 0
    m = LINE.fullmatch(capsys.readouterr().out.strip())
    assert m and m["task"] == "sums.jsonl"
    assert float(m["pct"]) == pytest.approx(
        100 * trainer_accuracy(saved_dir, task=str(task), max_new_tokens=4, eval_size=2048), abs=0.05
    )


# ---------------------------------------------------------------------------------------------------------
# frozen evaluation: several tasks, --samples, pass@k


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory, tiny_lm: Any) -> Path:
    """A TRL-style output directory: the model and a transformers tokenizer, each saved with
    its own ``save_pretrained`` (no task.json)."""
    path = tmp_path_factory.mktemp("trl_output")
    char_lm(tiny_lm, seed=1).save_pretrained(path)
    CHAR.to_hf().save_pretrained(path)
    return path


def evaluate_json(model: Path, path: Path, *flags: str) -> dict[str, Any]:
    argv = ["evaluate", "--model", str(model), "--digits", "1", "--eval-size", "8", "--device", "cpu"]
    assert cli.main([*argv, *flags, "--json", str(path)]) == 0
    return json.loads(path.read_text())


TWO_TASKS = ("--task", "addition", "--task", "filler_addition")


def test_two_tasks_with_samples_write_pass_at_k_per_task_and_their_macro(
    hf_dir: Path, tmp_path: Path, signal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from comppo_core.experiments.pass_at_k import pass_at_k

    data = evaluate_json(hf_dir, tmp_path / "eval.json", *TWO_TASKS, "--samples", "4", "--seed", "3")
    assert list(data) == ["model", "tasks", "macro", "tokenizer", "settings", "seconds"]  # no one-task keys
    assert list(data["tasks"]) == ["addition", "filler_addition"]
    keys = ["greedy_pass@1", "pass@1", "pass@2", "pass@4"]
    for name, entry in data["tasks"].items():
        assert entry["task"]["name"] == name and entry["task"]["digits"] == 1
        assert entry["n"] == 4 and entry["problems"] == len(entry["correct"]) == len(entry["greedy_correct"]) == 8
        assert all(0 <= c <= 4 for c in entry["correct"])
        for k in (1, 2, 4):  # the estimator, per problem, averaged over the problems
            mean = sum(pass_at_k(4, c, k) for c in entry["correct"]) / 8
            assert entry[f"pass@{k}"] == pytest.approx(mean, abs=1e-15)
        assert entry["pass@1"] == pytest.approx(sum(entry["correct"]) / 32, abs=1e-15)
        assert entry["greedy_pass@1"] == sum(entry["greedy_correct"]) / 8 == entry["accuracy"]
        assert entry["pass@1"] <= entry["pass@2"] <= entry["pass@4"]  # monotone in k
        assert "pass@3" not in entry and "pass@8" not in entry
    tasks = data["tasks"].values()
    assert 0 < sum(sum(e["correct"]) for e in tasks) < 64  # the signal makes it a real test
    assert list(data["macro"]) == ["accuracy", *keys]
    for key in ["accuracy", *keys]:
        assert data["macro"][key] == pytest.approx(sum(e[key] for e in tasks) / 2, abs=1e-15)
    assert data["macro"]["pass@1"] <= data["macro"]["pass@2"] <= data["macro"]["pass@4"]
    assert data["settings"]["samples"] == {"samples": 4, "temperature": 1.0, "top_p": 1.0, "seed": 3}
    assert data["settings"]["batch_size"] == 256 and data["model"] == str(hf_dir.resolve())
    # one line per task, then the macro line
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3, lines
    for line, entry in zip(lines, tasks):
        m = SAMPLED.fullmatch(line)
        assert m and m["task"] == entry["task"]["description"] and int(m["samples"]) == 4, line
        assert m["passes"] == ", ".join(f"pass@{k} {100 * entry[f'pass@{k}']:.1f}%" for k in (1, 2, 4))
    m = MACRO.fullmatch(lines[2])
    assert m and int(m["tasks"]) == 2 and m["samples"] == "4", lines[2]
    assert m["pct"] == f"{100 * data['macro']['accuracy']:.1f}"


def test_the_samples_are_the_seeds_whatever_the_batches_or_the_other_tasks(
    hf_dir: Path, tmp_path: Path, signal: None
) -> None:
    def correct(*flags: str) -> dict[str, list[int]]:
        data = evaluate_json(hf_dir, tmp_path / "eval.json", "--samples", "4", *flags)
        return {name: e["correct"] for name, e in data["tasks"].items()}

    both = correct(*TWO_TASKS, "--seed", "5")
    assert correct(*TWO_TASKS, "--seed", "5", "--batch-size", "3") == both  # batches of 3 rows, not 1
    assert correct("--task", "filler_addition", "--seed", "5")["filler_addition"] == both["filler_addition"]
    assert correct(*TWO_TASKS, "--seed", "6") != both  # another seed, other samples


def test_the_samples_are_keyed_as_documented(hf_dir: Path, signal: None) -> None:
    """``row_keys(seed, crc32(task.name), [(problem, sample)])``, drawn by rollout.generate."""
    import zlib

    from comppo_core.rl.engine.evaluation import Sampling, sampled_passes
    from comppo_core.rl.engine.rollout import decode
    from comppo_core.rl.engine.sampling import row_keys

    task, actor, tok = AdditionTask(1), load_policy(hf_dir), load_tokenizer(hf_dir)
    problems, cpu = task.heldout(5), torch.device("cpu")
    sampling = Sampling(3, temperature=0.8, top_p=0.9, seed=11)
    got = sampled_passes(actor, tok, task, problems, sampling, max_new_tokens=10, device=cpu, batch_size=4)
    rows = [(i, j) for i in range(5) for j in range(3)]
    keys = row_keys(11, zlib.crc32(b"addition"), rows)
    ids, _, width, in_response = generate(
        actor, tok, [problems[i] for i, _ in rows], max_new_tokens=10, device=cpu, sample=True, temperature=0.8,
        top_p=0.9, keys=keys,
    )  # fmt: skip
    texts, finished = decode(tok, ids, width, in_response)
    rewards = task.rewards([problems[i] for i, _ in rows], texts, finished.tolist())
    assert got == [sum(int(r >= 1) for r in rewards[3 * i : 3 * i + 3]) for i in range(5)]


def test_task_json_sets_its_own_task_and_the_flags_every_task(
    tmp_path: Path, saved_dir: Path, signal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for f in saved_dir.iterdir():
        (model / f.name).symlink_to(f)
    saved = {"name": "addition", "digits": 1, "split_seed": 3, "heldout_fraction": 0.2}
    (model / "task.json").write_text(json.dumps({**saved, "evaluation": {"eval_size": 6, "max_new_tokens": 7}}))
    argv = ["evaluate", "--model", str(model), "--task", "filler_addition", "--task", "addition", "--device", "cpu"]
    assert cli.main([*argv, "--eval-size", "4", "--json", str(tmp_path / "e.json")]) == 0
    data = json.loads((tmp_path / "e.json").read_text())
    own, other = data["tasks"]["addition"], data["tasks"]["filler_addition"]
    assert (own["task"]["digits"], own["task"]["split_seed"], own["max_new_tokens"]) == (1, 3, 7)  # the run's
    assert (other["task"]["digits"], other["task"]["split_seed"]) == (2, 0)  # TrainConfig's
    assert other["max_new_tokens"] == FillerAdditionTask(2).max_new_tokens
    assert own["problems"] == other["problems"] == 4  # --eval-size: every task's
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and MACRO.fullmatch(lines[2]) and MACRO.fullmatch(lines[2])["passes"] is None


def bad_task_json(d: Path) -> None:
    (d / "task.json").write_text("{not json")


def task_json_with_bad_digits(d: Path) -> None:
    (d / "task.json").write_text(json.dumps({"name": "addition", "digits": 9, "split_seed": 0}))


@pytest.mark.parametrize(
    ("flags", "setup", "named"),
    [
        (["--model", "{nowhere}"], None, r"--model: expected a local Hugging Face model directory, got '.*nowhere'"),
        (["--model", "{file}"], None, r"--model: expected a local Hugging Face model directory"),
        (["--model", "{bare}"], None, r"--model: expected a tokenizer in the model directory '.*bare'"),
        (
            ["--model", "{model}", "--task", "sums.csv"],
            None,
            r"--task: expected addition, chain, filler_addition, reasoning_gym:NAME or a path to a .jsonl file",
        ),
        (["--model", "{model}", "--task", "{nowhere}.jsonl"], None, r"--task: expected a JSONL file, got '.*'"),
        (
            ["--model", "{model}", "--task", "{broken}"],
            None,
            r"--task: '.*broken.jsonl' line 2: expected a JSON object",
        ),
        (["--model", "{model}", "--eval-size", "0"], None, r"--eval-size: expected an integer >= 1, got 0"),
        (["--model", "{model}", "--eval-size", "many"], None, r"--eval-size: expected an integer, got 'many'"),
        (["--model", "{model}", "--digits", "7"], None, r"--digits: expected an integer in \[1, 6\], got 7"),
        (["--model", "{model}", "--heldout-fraction", "1.5"], None, r"--heldout-fraction: expected a number in"),
        (["--model", "{model}", "--json", "{nowhere}/x.json"], None, r"--json: expected a file to write, got '.*'"),
        (["--model", "{model}", "--device", "tpu"], None, r"--device: expected auto, cpu, cuda or cuda:N, got 'tpu'"),
        (["--model", "{model}"], bad_task_json, r"--model: '.*task.json': expected the task the trainer saved"),
        (["--model", "{model}"], task_json_with_bad_digits, r"--model: '.*task.json': digits: expected an integer in"),
        (["--task", "addition"], None, r"the following arguments are required: --model"),
        (["--model", "{model}", "--samples", "0"], None, r"--samples: expected an integer >= 1, got 0"),
        (["--model", "{model}", "--samples", "four"], None, r"--samples: expected an integer, got 'four'"),
        (
            ["--model", "{model}", "--task", "addition", "--task", "nope", "--samples", "4"],
            None,
            r"--task: expected addition, chain, filler_addition, reasoning_gym:NAME or a path to a .jsonl file.*, got 'nope'",
        ),
        (["--model", "{model}", "--task", "chain", "--task", "chain"], None, r"--task: expected each task once"),
        (
            ["--model", "{model}", "--samples", "2", "--temperature", "0"],
            None,
            r"--temperature: expected a number in \(0.0, inf\), got 0.0",
        ),
        (["--model", "{model}", "--samples", "2", "--top-p", "1.5"], None, r"--top-p: expected a number in"),
        (["--model", "{model}", "--samples", "2", "--seed", "-1"], None, r"--seed: expected an integer >= 0, got -1"),
        (["--model", "{model}", "--batch-size", "0"], None, r"--batch-size: expected an integer >= 1, got 0"),
        (["--model", "{model}", "--temperature", "0.7"], None, r"--temperature: expected with --samples N"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(
    flags: list[str], setup: Any, named: str, saved_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for f in saved_dir.iterdir():
        (model / f.name).symlink_to(f)
    (tmp_path / "bare").mkdir()
    (tmp_path / "file").write_text("")
    (tmp_path / "broken.jsonl").write_text('{"prompt": "1+1=", "answer": 2}\n{"prompt": \n')
    if setup is not None:
        setup(model)
    places = {"nowhere": tmp_path / "nowhere", "file": tmp_path / "file", "bare": tmp_path / "bare", "model": model}
    places["broken"] = tmp_path / "broken.jsonl"
    argv = ["evaluate", *(f.format(**places) for f in flags)]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("comppo-core evaluate: error: "), captured.err
    assert re.search(named, errors[0]), captured.err
    assert "Traceback" not in captured.err


def test_bad_paths_are_reported_before_torch_is_imported(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    task = tmp_path / "t.jsonl"
    task.write_text("not json\n")
    (tmp_path / "model").mkdir()
    save_tokenizer(CHAR, tmp_path / "model")
    cases = [
        ["evaluate", "--model", "/nonexistent"],
        ["evaluate", "--model", str(tmp_path / "bare")],
        ["evaluate", "--model", str(tmp_path / "model"), "--task", str(task)],
        ["evaluate", "--model", str(tmp_path / "model"), "--digits", "0"],
        ["evaluate", "--model", str(tmp_path / "model"), "--samples", "0"],
        ["evaluate", "--model", str(tmp_path / "model"), "--task", "addition", "--task", "nope"],
        ["evaluate", "--help"],
    ]
    code = (
        "import sys\n"
        "from comppo_core.cli import main\n"
        f"codes = [main(argv) for argv in {cases!r}]\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
        "assert not loaded, loaded\n"
        "sys.exit(0 if codes == [2, 2, 2, 2, 2, 2, 0] else 1)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--model: expected a local Hugging Face model directory, got '/nonexistent'" in done.stderr
    assert "--task: " in done.stderr and "--digits: " in done.stderr
    assert "--samples: expected an integer >= 1, got 0" in done.stderr and "got 'nope'" in done.stderr
    # the brief's own one-liner
    one = "import sys; from comppo_core.cli import main; rc = main(['evaluate', '--model', '/nonexistent']); "
    one += "assert 'torch' not in sys.modules; sys.exit(rc)"
    assert subprocess.run([sys.executable, "-c", one], capture_output=True, timeout=120).returncode == 2
