"""The JSONL task on a local Hugging Face model: the file, the verifier, the tokenizer and the errors.

A tiny Llama and a character-level tokenizer (``tokenizers`` WordLevel over single
characters, wrapped in ``PreTrainedTokenizerFast``) are saved to a temporary directory,
so nothing is downloaded. What is pinned: the verifier's extraction and comparison rules;
the file's split; every arm runs two steps on ``model=DIR, task=FILE``, also with LoRA and
resumed; a malformed file names the file and the line; a model directory without a
tokenizer names the directory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("tqdm")

from comppo_core.errors import ParameterError
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.core.arms import ARMS
from comppo_core.rl.engine.trainer import METRIC_KEYS, Trainer, train
from comppo_core.rl.models.pretrained import HFTokenizer, load_tokenizer
from comppo_core.rl.tasks.jsonl import JsonlTask, answers_match, extract_answer, parse_number, verify

CHARS = "0123456789+-*= abcdefghijklmnopqrstuvwxyz:#?."


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def save_tokenizer(path: Path, *, bos: bool = True) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate(CHARS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    if bos:
        tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.save_pretrained(path)


def save_model(path: Path, vocab_size: int) -> None:
    """A tiny random Llama with this tokenizer's special ids (pad 0, bos 1, eos 2), saved."""
    from conftest import tiny_lm

    special = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    tiny_lm("llama", vocab=vocab_size, init=None, special_tokens=False, **special).save_pretrained(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: Any) -> Path:
    path = tmp_path_factory.mktemp("model")
    save_tokenizer(path)
    save_model(path, 4 + len(CHARS))
    return path


def write_task(path: Path, n: int = 40) -> Path:
    rng = np.random.default_rng(0)
    with open(path, "w") as fh:
        for i in range(n):
            a, b = (int(x) for x in rng.integers(0, 10, size=2))
            fh.write(json.dumps({"prompt": f"what is {a}+{b}? ({i})", "answer": a + b, "id": i}) + "\n")
            if i == 3:
                fh.write("\n")  # blank lines are skipped
    return path


def tiny(model_dir: Path, task: Path, **changes: Any) -> TrainConfig:
    base: dict[str, Any] = {
        "model": str(model_dir),
        "task": str(task),
        "prompts_per_step": 4,
        "group_size": 2,
        "eval_size": 6,
        "steps": 2,
        "eval_every": 2,
        "save_every": 0,
        "max_new_tokens": 6,
        "tac_width": 16,
        "progress": False,
        "device": "cpu",
    }
    base.update(changes)
    return TrainConfig(**base)


def rows(out: Path) -> list[dict[str, Any]]:
    """The step rows of ``metrics.jsonl`` (without the final evaluation's row)."""
    rs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rs if r["reward_mean"] is not None]


# ---------------------------------------------------------------------------------------------------------
# the verifier


@pytest.mark.parametrize(
    ("response", "extracted"),
    [
        ("so 3+4 is 7 #### 7", " 7"),
        ("#### 5, answer: 9", " 9"),  # the last marker wins
        ("Answer: 12 apples", " 12 apples"),
        ("3 then 4 then 12.", "12"),  # no marker: the last number
        ("it is -1,250.5 or 3", "3"),
        ("no digits here", "no digits here"),  # no marker, no number: the whole response
    ],
)
def test_extract_answer(response: str, extracted: str) -> None:
    assert extract_answer(response) == extracted


def test_numbers_compare_exactly_and_text_after_normalising() -> None:
    assert parse_number(" 1,234.50 ") == parse_number("1234.5") and parse_number("$72") == 72
    assert parse_number("144/2") == 72 and parse_number("1e3") == 1000 and parse_number("-$3") == -3
    assert parse_number("72 apples") is None and parse_number("nan") is None and parse_number("") is None
    assert answers_match(" 72.0 ", "72") and answers_match("72.", "72") and not answers_match("72.1", "72")
    assert answers_match("Paris", " Paris ") and answers_match("new  york", "new york")
    assert not answers_match("paris", "Paris")  # text is compared exactly
    assert verify("the sum is 7 #### 7", "7", True) == 1.0
    assert verify("the sum is 7 #### 7", "7", False) == 0.0  # no EOS: truncated
    assert verify("3 + 4 = 7", "7.0", True) == 1.0 and verify("3 + 4 = 8", "7", True) == 0.0


# ---------------------------------------------------------------------------------------------------------
# the file and the tokenizer


def test_jsonl_task_split_and_sampling(tmp_path: Path) -> None:
    task = JsonlTask(write_task(tmp_path / "t.jsonl"), heldout_fraction=0.25)
    assert len(task.rows) == 40 and task.rows[0].answer == str(
        json.loads((tmp_path / "t.jsonl").read_text().split("\n")[0])["answer"]
    )
    held = {p.prompt for p in task.heldout_rows}
    assert held and not held & {p.prompt for p in task.train_rows}
    assert {p.prompt for p in task.heldout(100)} == held and len(task.heldout(2)) == 2
    assert [p.prompt for p in JsonlTask(tmp_path / "t.jsonl", heldout_fraction=0.25).heldout(5)] == [
        p.prompt for p in task.heldout(5)
    ]
    drawn = task.sample(np.random.default_rng(1), 50)
    assert len(drawn) == 50 and all(p.prompt not in held for p in drawn)


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": \n', 2, "expected a JSON object, got a parse error"),
        (
            '{"prompt": "a", "answer": 1}\n\n{"prompt": "b"}\n',
            3,
            "expected the keys prompt and answer, missing 'answer'",
        ),
        ('{"answer": 1}\n', 1, "expected the keys prompt and answer, missing 'prompt'"),
        ("[1, 2]\n", 1, "expected a JSON object with prompt and answer, got list"),
        ('{"prompt": 3, "answer": 1}\n', 1, "expected prompt to be a non-empty string, got 3"),
        ('{"prompt": "a", "answer": null}\n', 1, "expected answer to be a string or a number, got None"),
    ],
)
def test_a_malformed_task_file_names_the_file_and_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(
        ParameterError, match=rf"^task: '{re.escape(str(path))}' line {line}: {re.escape(message)}"
    ) as info:
        JsonlTask(path)
    assert (info.value.argument, info.value.row) == ("task", line)


def test_task_file_errors_without_a_line(tmp_path: Path, model_dir: Path) -> None:
    with pytest.raises(
        ParameterError, match=r"^task: expected a JSONL file, got '.*missing.jsonl', which is not a file"
    ):
        Trainer(tiny(model_dir, tmp_path / "missing.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ParameterError, match=r"^task: '.*empty.jsonl': expected at least one row"):
        JsonlTask(tmp_path / "empty.jsonl")
    write_task(tmp_path / "one.jsonl", n=1)
    with pytest.raises(
        ParameterError, match=r"^task: '.*one.jsonl': expected rows on both sides of the held-out split"
    ):
        JsonlTask(tmp_path / "one.jsonl")
    with pytest.raises(
        ParameterError,
        match=r"^task: expected addition, chain, filler_addition, reasoning_gym:NAME or a path to a .jsonl file or a path "
        r"to a .hf.json "
        r"file, got 'data.csv'",
    ):
        TrainConfig(task="data.csv", model=str(model_dir))
    with pytest.raises(ParameterError, match=r"^model: expected a local model directory for the task"):
        TrainConfig(task=str(tmp_path / "one.jsonl"))


def test_a_model_directory_without_a_tokenizer_names_it(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    save_model(bare, 50)
    task = write_task(tmp_path / "t.jsonl")
    with pytest.raises(
        ParameterError, match=rf"^model: expected a tokenizer in the model directory '{re.escape(str(bare))}'"
    ) as info:
        Trainer(tiny(bare, task))
    assert info.value.argument == "model"
    with pytest.raises(ParameterError, match=r"^model: expected a local Hugging Face model directory, got '.*nowhere'"):
        Trainer(tiny(tmp_path / "nowhere", task))
    with pytest.raises(ParameterError, match=r"^init_from: expected None with model="):
        tiny(bare, task, init_from=str(bare))


def test_hf_tokenizer_wrapper(model_dir: Path, tmp_path: Path) -> None:
    tok = load_tokenizer(model_dir)
    assert isinstance(tok, HFTokenizer)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok.encode_prompt("what is 2+3?")
    assert ids[0] == 1 and len(ids) == 1 + len("what is 2+3?")
    assert tok.decode(ids) == "what is 2+3?" and tok.decode([*ids[1:], 2]) == "what is 2+3?"
    assert tok.encode("12", add_eos=True) == [*tok.encode("12"), 2]
    chat = tmp_path / "chat"
    save_tokenizer(chat)
    config = json.loads((chat / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}q: {{ m['content'] }} {% endfor %}a: "
    (chat / "tokenizer_config.json").write_text(json.dumps(config))
    wrapped = load_tokenizer(chat, chat_template=True)
    assert wrapped.chat_template and wrapped.decode(wrapped.encode_prompt("2+3?")) == "q: 2+3? a: "
    assert not load_tokenizer(chat).chat_template  # off unless asked for
    with pytest.raises(ParameterError, match="chat_template: the tokenizer in .* has no chat template") as info:
        load_tokenizer(model_dir, chat_template=True)  # a tokenizer without one: asked for, refused
    assert info.value.argument == "chat_template"
    no_bos = tmp_path / "nobos"
    save_tokenizer(no_bos, bos=False)
    assert load_tokenizer(no_bos).encode_prompt("12") == load_tokenizer(model_dir).encode("12")


# ---------------------------------------------------------------------------------------------------------
# training on the file


@pytest.mark.parametrize("arm", [name for name, a in ARMS.items() if not a.diagnostic])  # no oracle on a file
def test_two_steps_of_every_arm_on_a_jsonl_task(arm: str, model_dir: Path, tmp_path: Path) -> None:
    task = write_task(tmp_path / "t.jsonl")
    trainer = Trainer(tiny(model_dir, task, arm=arm, out=str(tmp_path / "out")))
    assert isinstance(trainer.task, JsonlTask) and isinstance(trainer.tokenizer, HFTokenizer)
    assert trainer.max_new_tokens == 6 and len(trainer.eval_problems) == 6
    summary = trainer.train()
    rs = rows(tmp_path / "out")
    assert [r["step"] for r in rs] == [0, 1] and all(set(r) == set(METRIC_KEYS) for r in rs)
    assert all(isinstance(r["reward_mean"], float) and isinstance(r["pg_loss"], float) for r in rs)
    assert summary["warm_start"]["model"] == str(model_dir) and summary["warm_start"]["sft_steps"] == 0
    assert not (tmp_path / "out" / "warmstart").exists()  # the model directory is the warm start
    assert (tmp_path / "out" / "checkpoint" / "actor" / "model.safetensors").is_file()


def test_jsonl_rewards_come_from_the_verifier(model_dir: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """The score of a response is verify(response, answer, finished), whatever the policy says."""
    task = write_task(tmp_path / "t.jsonl")
    trainer = Trainer(tiny(model_dir, task, arm="grpo"))
    seen: list[tuple[str, str, bool]] = []
    real = JsonlTask.reward

    def spy(self: JsonlTask, problem: Any, response: str, finished: bool) -> float:
        seen.append((response, problem.answer, finished))
        return real(self, problem, response, finished)

    monkeypatch.setattr(JsonlTask, "reward", spy)
    r = trainer.rollout(0)
    assert len(seen) == 8
    assert r.rewards.tolist() == [verify(*s) for s in seen]
    assert r.responses == [s[0] for s in seen]


def test_jsonl_with_lora_resumes_bit_for_bit(model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("peft")
    task = write_task(tmp_path / "t.jsonl")
    cfg = tiny(model_dir, task, arm="comppo", lora_rank=4, kl_coef=0.05, steps=4, save_every=2, actor_lr=1e-3)
    straight = Trainer(cfg.replace(out=str(tmp_path / "a")))
    straight.train()
    train(cfg.replace(steps=2, out=str(tmp_path / "b")))
    resumed = Trainer(cfg.replace(out=str(tmp_path / "b"), resume=True))
    resumed.train()
    a, b = straight.lora_model.state_dict(), resumed.lora_model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    drop = {k for k in METRIC_KEYS if k.startswith("time_")}
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows(tmp_path / "a")] == [
        {k: v for k, v in r.items() if k not in drop} for r in rows(tmp_path / "b")
    ]


def test_compare_on_a_local_model_and_task_file(model_dir: Path, tmp_path: Path) -> None:
    """``compare --model DIR --task FILE``: every run starts from the model (no warm start),
    on the file's prompts, and the table holds each arm."""
    from comppo_core import cli

    task = write_task(tmp_path / "task.jsonl")
    out = tmp_path / "cmp"
    flags = ["--model", str(model_dir), "--task", str(task), "--prompts-per-step", "4", "--group-size", "2"]
    flags += ["--eval-size", "6", "--steps", "2", "--eval-every", "1", "--save-every", "0", "--max-new-tokens", "6"]
    flags += ["--tac-width", "16", "--no-progress", "--device", "cpu"]
    assert cli.main(["compare", "--arms", "grpo,comppo", "--seeds", "2", *flags, "--out", str(out)]) == 0
    assert not (out / "warmstart").exists()
    for arm in ("grpo", "comppo"):
        for s in (0, 1):
            run = out / arm / f"seed{s}"
            config = TrainConfig.from_json((run / "config.json").read_text())
            assert (config.model, config.task, config.init_from) == (str(model_dir), str(task), None)
            assert (config.arm, config.seed) == (arm, s)
            assert [r["step"] for r in rows(run)] == [0, 1]
    results = json.loads((out / "results.json").read_text())
    assert set(results["arms"]) == {"grpo", "comppo"}
    text = (out / "results.md").read_text()
    assert re.search(r"^\| grpo \| 2 \|", text, re.MULTILINE) and re.search(r"^\| comppo \| 2 \|", text, re.MULTILINE)


def test_a_saved_generation_config_does_not_change_the_sampled_distribution(tmp_path: Path) -> None:
    """A model's generation_config.json (here a repetition penalty) would be applied by
    ``generate`` before the sampler: ``load_policy`` drops it, so the sampler sees the raw logits."""
    from transformers import GenerationConfig, LogitsProcessor

    from comppo_core.rl.models.pretrained import load_policy

    save_model(tmp_path, 4 + len(CHARS))
    GenerationConfig(repetition_penalty=1.5, bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(tmp_path)
    model = load_policy(tmp_path)

    class Spy(LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            self.scores = scores.clone()
            return scores

    ids = torch.tensor([[1, 5, 6, 5, 6, 5]])
    spy = Spy()
    config = GenerationConfig(do_sample=False, max_new_tokens=1, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config, logits_processor=[spy])
    with torch.no_grad():
        raw = model(input_ids=ids).logits[:, -1]
    assert float((spy.scores - raw).abs().max()) < 1e-5
    assert model.generation_config.repetition_penalty in (None, 1.0)
