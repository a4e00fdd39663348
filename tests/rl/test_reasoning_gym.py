"""reasoning-gym's datasets as tasks: ``--task reasoning_gym:NAME`` (comppo_core.rl.tasks.reasoning_gym).

What is pinned: the three splits never share a question over a few thousand draws, and
every list is a function of the split seed; the options reach the dataset's generator, and
a bad option or name is refused naming ``task_option`` / ``task`` (a missing package says
how to install it); the reward is the dataset's ``score_answer`` of the extracted answer on
right, wrong, partial and unfinished responses, in both answer formats; the options
survive config.json and task.json; and a tiny random Llama with a character tokenizer
trains one step on ``reasoning_gym:chain_sum``, with and without the chat template, and
``comppo-core evaluate --samples`` reports pass@k of the saved policy on the run's task.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

rg = pytest.importorskip("reasoning_gym")

from comppo_core.errors import ParameterError
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.tasks import TASKS, build_task, task_entry
from comppo_core.rl.tasks.base import HashSplit, Problem
from comppo_core.rl.tasks.reasoning_gym import ANSWER_FORMATS, DEFAULT_SIZE, ReasoningGymTask, readings

CHAIN = {"min_terms": 2, "max_terms": 3, "max_digits": 2, "size": 6000}


def task_of(name: str = "chain_sum", **kw: Any) -> ReasoningGymTask:
    options = kw.pop("options", CHAIN if name == "chain_sum" else {})
    return ReasoningGymTask(name, options=options, **kw)


def question(problem: Problem, task: ReasoningGymTask) -> str:
    return problem.prompt.removesuffix("\n\n" + ANSWER_FORMATS[task.answer_format])


# ---------------------------------------------------------------------------------------------------------
# the splits


def test_the_splits_never_share_a_question_over_thousands_of_draws() -> None:
    task = task_of(split_seed=5, heldout_fraction=0.2, validation_fraction=0.1)
    train = task.sample(np.random.default_rng(0), 3000)
    held, valid = task.heldout(400), task.validation(300)
    q_train = {question(p, task) for p in train}
    q_held, q_valid = {question(p, task) for p in held}, {question(p, task) for p in valid}
    assert len(q_held) == 400 and len(q_valid) == 300  # distinct
    assert len(q_train) > 1000
    assert not q_train & q_held and not q_train & q_valid and not q_held & q_valid
    split = HashSplit(5, 0.2, 0.1)  # each question on the side its hash gives
    assert {split.side(q) for q in q_train} == {"train"}
    assert {split.side(q) for q in q_held} == {"heldout"} and {split.side(q) for q in q_valid} == {"validation"}
    # the generators differ by seed, and each list is its own generator's, in index order
    assert len({task.generator_seed(s) for s in ("train", "validation", "heldout")}) == 3
    gen = rg.create_dataset("chain_sum", **{**CHAIN, "seed": task.generator_seed("heldout")})
    first = [e["question"] for e in (gen[i] for i in range(60)) if split.side(e["question"]) == "heldout"]
    assert [question(p, task) for p in task.heldout(len(first))] == list(dict.fromkeys(first))


def test_the_lists_are_a_function_of_the_split_seed() -> None:
    a, b = task_of(validation_fraction=0.1), task_of(validation_fraction=0.1)
    assert a.heldout(50) == b.heldout(50) and a.validation(40) == b.validation(40)
    assert a.heldout(20) == a.heldout(50)[:20]  # a shorter list is the start of a longer one
    assert a.sample(np.random.default_rng(3), 30) == b.sample(np.random.default_rng(3), 30)
    other = task_of(split_seed=1, validation_fraction=0.1)
    assert {p.prompt for p in other.heldout(50)} != {p.prompt for p in a.heldout(50)}
    with pytest.raises(ParameterError, match="^validation_fraction: expected a validation split") as info:
        task_of().validation(3)
    assert info.value.argument == "validation_fraction"


def test_a_small_generator_gives_fewer_held_out_problems() -> None:
    task = task_of(options={**CHAIN, "size": 50})
    held = task.heldout(100)
    assert 0 < len(held) < 50 and len({p.prompt for p in held}) == len(held)


# ---------------------------------------------------------------------------------------------------------
# options and names


def test_options_reach_the_dataset() -> None:
    task = task_of(options={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    problems = task.sample(np.random.default_rng(0), 40) + task.heldout(20)
    for p in problems:
        entry = task.entry(p)
        assert entry["metadata"]["num_terms"] == 2 and len(entry["metadata"]["expression"].split()) == 3
        assert all(len(t) == 1 for t in entry["metadata"]["expression"].split()[::2])
    gen = task._generator("train")
    assert (gen.config.min_terms, gen.config.max_terms, gen.config.max_digits) == (2, 2, 1)
    assert gen.config.size == DEFAULT_SIZE and task.size == DEFAULT_SIZE
    assert task_of(options={"min_terms": 2, "size": 77}).size == 77


def test_the_config_carries_the_options_to_the_task_and_its_json(tmp_path: Path) -> None:
    config = TrainConfig(task="reasoning_gym:chain_sum", task_options=CHAIN, model=str(tmp_path), split_seed=2)
    task = build_task(config)
    assert isinstance(task, ReasoningGymTask) and task.options == CHAIN and task.split_seed == 2
    record = task.to_dict()
    assert record["name"] == "reasoning_gym:chain_sum" and record["options"] == CHAIN
    assert json.loads(json.dumps(record)) == record
    again = TrainConfig.from_json(config.to_json())
    assert again.task_options == CHAIN and build_task(again).heldout(5) == task.heldout(5)
    old = json.loads(config.to_json())
    del old["task_options"]  # a config.json written before the field: no options
    assert TrainConfig.from_dict(old).task_options == {}
    given = {"min_terms": 2, "operators": ("+",)}
    kept = TrainConfig(task="reasoning_gym:basic_arithmetic", task_options=given, model=str(tmp_path))
    assert kept.task_options == {"min_terms": 2, "operators": ["+"]} and given["operators"] == ("+",)  # a copy


def test_evaluate_reads_the_options_back_from_task_json(tmp_path: Path) -> None:
    from comppo_core.commands.evaluate import saved_task_settings

    config = TrainConfig(task="reasoning_gym:chain_sum", task_options=CHAIN, model=str(tmp_path), split_seed=4)
    (tmp_path / "task.json").write_text(json.dumps({**build_task(config).to_dict(), "tokenizer": {}}))
    saved, path = saved_task_settings(tmp_path)
    assert path is not None
    assert saved == {"task": "reasoning_gym:chain_sum", "task_options": CHAIN, "split_seed": 4, "heldout_fraction": 0.2}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"min_term": 2},
            r"expected a setting of reasoning_gym:chain_sum \(min_terms=2, max_terms=6, .*got 'min_term'",
        ),
        ({"seed": 3}, "other than 'seed' \\(the split seeds its generators"),
        ({"min_terms": 0}, "refused the settings min_terms=0: AssertionError"),
        ({"answer_format": "xml"}, "answer_format to be one of plain, final, tag, got 'xml'"),
        ({"size": 0}, "size .* positive integer, got 0"),
    ],
)
def test_a_bad_option_names_task_option(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ParameterError, match="^task_option: .*" + message) as info:
        TrainConfig(task="reasoning_gym:chain_sum", task_options=options, model=str(tmp_path))
    assert info.value.argument == "task_option"


def test_options_on_a_task_without_them_are_refused() -> None:
    with pytest.raises(ParameterError, match="^task_option: expected none for the task 'addition'") as info:
        TrainConfig(task_options={"min_terms": 2})
    assert info.value.argument == "task_option"


@pytest.mark.parametrize("name", ["reasoning_gym:chainsum", "reasoning_gym:", "reasoning_gym"])
def test_an_unknown_name_names_task_and_lists_some(name: str) -> None:
    with pytest.raises(ParameterError, match="^task: expected .*reasoning_gym:NAME") as info:
        task_entry(name)
    assert info.value.argument == "task"
    if name.endswith("chainsum"):
        assert "chain_sum" in str(info.value)


def test_a_missing_package_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym raises ImportError
    with pytest.raises(ParameterError, match=r'^task: .*pip install "comppo-core\[reasoning-gym\]"') as info:
        task_entry("reasoning_gym:chain_sum")
    assert info.value.argument == "task"


def test_the_registry_reads_a_member_as_its_entry() -> None:
    entry = TASKS["reasoning_gym:leg_counting"]
    assert entry is TASKS.get("reasoning_gym:leg_counting") is task_entry("reasoning_gym:leg_counting")
    assert entry.name == "reasoning_gym:leg_counting" and entry.needs_model and entry.takes_options
    assert "reasoning_gym:anything" in TASKS and "reasoning_gym" in TASKS and "nope" not in TASKS
    assert [e.name for e in TASKS.values()].count("reasoning_gym") == 1  # iterating: the family once


def test_the_config_needs_a_model() -> None:
    with pytest.raises(ParameterError, match="^model: expected a local model directory") as info:
        TrainConfig(task="reasoning_gym:chain_sum")
    assert info.value.argument == "model"


# ---------------------------------------------------------------------------------------------------------
# the reward


def test_the_reward_is_score_answer_of_the_whole_response_in_the_plain_format() -> None:
    task = task_of("basic_arithmetic", options={"max_terms": 3, "max_digits": 2, "answer_format": "plain"})
    scorer = rg.create_dataset("basic_arithmetic", seed=0)
    for p in task.heldout(30):
        entry, answer = task.entry(p), p.answer
        assert p.prompt.endswith("\n\nAnswer with just the final answer.") and p.solution == answer
        assert task.reward(p, answer, True) == 1.0 == task.reward(p, f"  {answer}\n", True)
        assert task.reward(p, answer, False) == 0.0  # cut short: nothing
        assert task.reward(p, "none", True) == 0.0 == task.reward(p, "", True)  # wrong
        # the default verifier's partial credit: the right answer inside other text, len(answer)/len(text),
        # also when that text is a wrong number (-111 for -11: 0.75)
        assert task.reward(p, answer + "1", True) == scorer.score_answer(answer + "1", entry) > 0.0
        partial = f"The answer is {answer}"
        expected = scorer.score_answer(partial, entry)
        assert 0.0 < expected < 1.0 and task.reward(p, partial, True) == expected  # the verifier's partial credit
        assert task.rewards([p, p], [answer, partial], [True, True]) == [1.0, expected]


def test_the_final_format_scores_the_better_of_two_readings() -> None:
    task = task_of("basic_arithmetic", options={"max_terms": 3, "max_digits": 2})  # the default format
    assert task.answer_format == "final"
    scorer = rg.create_dataset("basic_arithmetic", seed=0)
    for p in task.heldout(30):
        entry, answer = task.entry(p), p.answer
        assert task.reward(p, answer, True) == 1.0 == task.reward(p, f"{p.prompt[10:20]} = {answer}.", True)
        assert task.reward(p, f"The answer is {answer}", False) == 0.0  # cut short: nothing
        both = f"{answer} or 100000"  # the last number is wrong; the whole response holds the answer
        best = max(scorer.score_answer(both, entry), scorer.score_answer("100000", entry))
        assert task.reward(p, both, True) == best >= scorer.score_answer(both, entry) > 0.0  # the better one
        assert task.reward(p, "100000", True) == scorer.score_answer("100000", entry) < 1.0
    sorting = ReasoningGymTask("number_sorting", options={"min_numbers": 3, "max_numbers": 3})
    for p in sorting.heldout(5):  # a list: its last number alone is wrong, the whole response right
        assert p.answer.startswith("[") and sorting.reward(p, p.answer, True) == 1.0


@pytest.mark.parametrize(
    ("response", "read"),
    [
        ("5 - 2 = 3", ["5 - 2 = 3", "3"]),  # no marker: the last number
        ("The final answer is 11.", ["The final answer is 11.", "11"]),
        ("Final answer: tfab.", ["Final answer: tfab.", "tfab"]),  # after the last "answer:", one "." dropped
        ("The answer is: tfab.", ["The answer is: tfab.", "The answer is: tfab"]),  # "answer is:" is no marker
        ("It is 1,250 apples", ["It is 1,250 apples", "1,250"]),
        (" 42 ", ["42"]),  # the two agree: one reading
        ("no digits", ["no digits"]),  # no marker, no number: the whole response
    ],
)
def test_the_final_format_reads_the_response_and_its_final_answer(response: str, read: list[str]) -> None:
    assert readings(response, "final") == read
    assert readings(response, "plain") == [response.strip()]


def test_the_final_format_scores_what_plain_scores_and_a_final_answer() -> None:
    final, plain = task_of(), task_of(options={**CHAIN, "answer_format": "plain"})
    for p in final.heldout(10):
        assert p in plain.heldout(10)  # the same prompt and problems as plain's
        assert final.reward(p, f"So {p.answer}", True) == 1.0 > plain.reward(p, f"So {p.answer}", True)
        wrong = f"{p.answer} + 1 = {int(p.answer) + 1}"  # the last number is the final answer
        assert final.reward(p, wrong, True) == plain.reward(p, wrong, True) < 1.0
        assert final.reward(p, f"So {p.answer}", False) == 0.0


def test_the_tag_format_reads_the_last_answer_tag() -> None:
    task = task_of(options={**CHAIN, "answer_format": "tag"})
    assert task.max_new_tokens > task_of().max_new_tokens
    for p in task.heldout(10):
        a = p.answer
        assert p.solution == f"<answer>{a}</answer>" and p.prompt.endswith("</answer> tags.")
        assert task.reward(p, f"3 + 4 ... <answer>x</answer> so <answer> {a} </answer>", True) == 1.0
        assert task.reward(p, a, True) == 0.0  # no tag, no answer
        assert task.reward(p, f"<answer>{a}</answer>", False) == 0.0
    assert readings("a <answer>1</answer> b <answer>2</answer>", "tag") == ["2"]
    assert readings("no tag", "tag") == [None]


def test_a_problem_no_task_of_the_settings_drew_is_refused() -> None:
    task = task_of()
    match = "^problem: expected a problem a reasoning_gym:chain_sum task of these settings drew"
    with pytest.raises(ParameterError, match=match) as info:
        task.reward(Problem("What is 1 + 1?", "2", "2"), "2", True)
    assert info.value.argument == "problem"
    other = task_of(options={"min_terms": 2, "max_terms": 2, "min_digits": 3, "max_digits": 3})  # other settings
    (p,) = other.heldout(1)
    with pytest.raises(ParameterError, match=match):
        task.reward(p, p.answer, True)
    fresh = task_of()  # the same settings: it scores what the first task drew
    assert fresh.reward(task.heldout(1)[0], task.heldout(1)[0].answer, True) == 1.0


def test_a_verifier_that_raises_scores_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    task = task_of()
    p = task.heldout(1)[0]

    def broken(answer: Any, entry: Any) -> float:
        raise ValueError("cannot parse")

    monkeypatch.setattr(task._generator("train"), "score_answer", broken)
    assert task.reward(p, p.answer, True) == 0.0


# ---------------------------------------------------------------------------------------------------------
# one step of training on a tiny model

CHARS = "".join(chr(c) for c in range(32, 127)) + "\n"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: Any) -> Path:
    """A tiny random Llama and a character tokenizer of printable ASCII, with a chat template."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from conftest import tiny_lm
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("rg_model")
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate(CHARS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character, newlines too
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.chat_template = "{% for m in messages %}user: {{ m['content'] }}\n{% endfor %}assistant: "
    fast.save_pretrained(path)
    special = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    model = tiny_lm("llama", vocab=len(vocab), init=None, special_tokens=False, max_positions=256, **special)
    model.save_pretrained(path)
    return path


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("chat_template", [False, True])
def test_one_step_of_training_on_a_tiny_model(model_dir: Path, tmp_path: Path, chat_template: bool) -> None:
    from comppo_core.commands.evaluate import saved_task_settings
    from comppo_core.rl.engine.trainer import Trainer

    options = {"min_terms": 2, "max_terms": 2, "max_digits": 1, "size": 400}
    config = TrainConfig(
        task="reasoning_gym:chain_sum",
        task_options=options,
        model=str(model_dir),
        chat_template=chat_template,
        arm="grpo",
        steps=1,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=4,
        eval_size=3,
        eval_every=1,
        save_every=0,
        progress=False,
        device="cpu",
        out=str(tmp_path / "run"),
    )
    trainer = Trainer(config)
    assert isinstance(trainer.task, ReasoningGymTask)
    prompt = trainer.eval_problems[0].prompt
    rendered = trainer.tokenizer.decode(trainer.tokenizer.encode_prompt(prompt))
    assert rendered == (f"user: {prompt}\nassistant: " if chat_template else prompt)  # lossless, templated or not
    summary = trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("reward_mean") is not None]
    assert [r["step"] for r in steps] == [0] and 0.0 <= steps[0]["reward_mean"] <= 1.0
    assert 0.0 <= summary["final_eval_accuracy"] <= 1.0
    actor = tmp_path / "run" / "checkpoint" / "actor"  # a model: no warm start
    saved, _ = saved_task_settings(actor)
    assert saved["task"] == "reasoning_gym:chain_sum" and saved["task_options"] == options
    assert saved["chat_template"] is chat_template
    # comppo-core evaluate --samples on the saved policy: its task.json's task, pass@k over the samples
    from comppo_core import cli

    report = tmp_path / "eval.json"
    assert cli.main(["evaluate", "--model", str(actor), "--samples", "4", "--json", str(report)]) == 0
    (result,) = json.loads(report.read_text())["tasks"].values()
    assert {k: result["task"][k] for k in build_task(config).to_dict()} == build_task(config).to_dict()
    assert result["problems"] == 3 and result["n"] == 4
    assert 0.0 <= result["pass@1"] <= result["pass@2"] <= result["pass@4"] <= 1.0
