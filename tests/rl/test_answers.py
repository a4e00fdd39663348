"""The answer check (comppo_core.rl.tasks.answers): math-verify and the hand rule, case by case.

TABLE pins, for each (response, answer), the verdict of math-verify and of the hand rule, so
the cases where they agree and differ are both asserted; ``docs/answers.md`` shows the same
table (a test checks every row is there). Also pinned: ``"auto"`` is math-verify when it
imports and the hand rule when it does not (math-verify made unimportable), the screen that
keeps sympy off inputs it could spend unbounded time on, math-verify's signal timeouts only
where they are safe (the main thread, no pending timer) and its log notice when they are
off, the TRL-signature reward ``math_answer`` (also as a saved dataset's reward), and the
JSONL verifier delegating here. Torch-free; the math-verify cases skip without it.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from comppo_core.errors import ParameterError
from comppo_core.rl.tasks import answers
from comppo_core.rl.tasks.answers import is_correct, math_answer, math_verify_available, math_verify_safe
from comppo_core.rl.tasks.jsonl import verify

DOC = Path(__file__).resolve().parents[2] / "docs" / "answers.md"

#: (response, answer, math-verify's verdict, the hand rule's verdict, why)
TABLE: list[tuple[str, str, bool, bool, str]] = [
    # agree
    ("42", "42", True, True, "the same integer"),
    ("The answer is 42.", "42", True, True, "the last number; a trailing period"),
    ("#### 42", "42", True, True, "the `####` marker"),
    ("so 3+4 is 7 #### 7", "7", True, True, "the text after the marker"),
    ("3 + 4 = 7", "7", True, True, "the last number"),
    ("3+4=8", "7", False, False, "a wrong number"),
    ("7 #### 8", "7", False, False, "the marker wins over an earlier right number"),
    ("72.0", "72", True, True, "a decimal and an integer of one value"),
    ("$72", "72", True, True, "a dollar sign"),
    ("1,234", "1234", True, True, "a thousands separator"),
    ("144/2", "72", True, True, "a fraction a/b"),
    ("-3", "-3", True, True, "a negative number"),
    ("The result is -3", "-3", True, True, "a negative number in a sentence"),
    (r"\boxed{42}", "42", True, True, "a boxed integer"),
    ("50%", "50", True, True, "a percent sign beside the same number"),
    (r"50\%", "50", True, True, "a LaTeX percent sign"),
    ("5 cm", "5", True, True, "a unit after the number"),
    (r"5\text{ cm}", "5", True, True, "a LaTeX unit"),
    ("x = 5", "5", True, True, "an assignment"),
    ("3.14159", "3.14", False, False, "more digits are another number"),
    ("Natalia sold 72", "She sold 48/2 = 24 in May. #### 72", True, True, "a GSM8K-style reference reads after `####`"),
    ("Paris", "Paris", True, True, "a word: compared as text"),
    ("paris", "Paris", False, False, "text is case-sensitive"),
    ("answer: Paris", "Paris", True, True, "a word after the `answer:` marker"),
    ("A", "A", True, True, "a letter choice"),
    ("(A)", "A", False, False, "a letter in parentheses is other text"),
    ("yes", "Yes", False, False, "case-sensitive"),
    ("seventy-two", "72", False, False, "a number in words"),
    ("", "7", False, False, "an empty response"),
    ("9^9^9^9", "9", True, True, "a power tower is never given to sympy: the hand rule's last number"),
    # differ: math-verify reads more
    ("answer: 12 apples", "12", True, False, "the hand rule needs the whole text after the marker to be a number"),
    (r"\frac{1}{2}", "0.5", True, False, "a LaTeX fraction"),
    ("0.5", r"\frac{1}{2}", True, False, "a LaTeX reference"),
    (r"\boxed{\frac{1}{2}}", "1/2", True, False, "a boxed LaTeX fraction"),
    (r"So the answer is $\frac{3}{4}$.", "0.75", True, False, "inline LaTeX"),
    (r"The answer is \boxed{7}. Check: 3+4=7, also 10", "7", True, False, "`\\boxed{}` before later numbers"),
    (r"$\{3,2,1\}$", r"\{1,2,3\}", True, False, "sets in any order"),
    ("[0,1)", "[0,1)", True, False, "the same interval text (the hand rule reads the last number, 1)"),
    ("(0,1]", "[0,1)", False, False, "another interval"),
    (r"$\sqrt{2}$", r"\sqrt{2}", True, False, "a surd"),
    ("50%", "0.5", True, False, "a percent is a hundredth"),
    ("0.333333", "1/3", True, False, "math-verify rounds to 6 decimals"),
    # differ: the hand rule reads more, or math-verify reads otherwise
    ("1e3", "1000", False, True, "math-verify does not read exponent notation"),
    ("-$1,234.50", "-1234.5", False, True, "a minus sign before a dollar sign"),
    ("1.2", "1,2,3", True, False, "math-verify reads a comma between single digits as a decimal comma"),
]

needs_math_verify = pytest.mark.skipif(not math_verify_available(), reason="math-verify is not installed")


def no_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import math_verify`` fail, as where it is not installed."""
    monkeypatch.setitem(sys.modules, "math_verify", None)


@pytest.mark.parametrize(("response", "answer", "mv", "hand", "why"), TABLE)
def test_hand_rule_verdicts(response: str, answer: str, mv: bool, hand: bool, why: str) -> None:
    assert is_correct(response, answer, method="hand") is hand, why


@needs_math_verify
@pytest.mark.parametrize(("response", "answer", "mv", "hand", "why"), TABLE)
def test_math_verify_verdicts(response: str, answer: str, mv: bool, hand: bool, why: str) -> None:
    assert is_correct(response, answer, method="math-verify") is mv, why
    assert is_correct(response, answer) is mv  # "auto" is math-verify where it imports


def test_the_table_pins_both_agreement_and_difference() -> None:
    differ = [row for row in TABLE if row[2] != row[3]]
    assert 30 <= len(TABLE) <= 50 and len(differ) >= 10
    assert any(mv and not hand for _, _, mv, hand, _ in differ) and any(hand and not mv for _, _, mv, hand, _ in differ)


def doc_row(response: str, answer: str, mv: bool, hand: bool, why: str) -> str:
    def cell(text: str) -> str:
        return f"`{text}`" if text else "(empty)"

    return f"| {cell(response)} | {cell(answer)} | {'yes' if mv else 'no'} | {'yes' if hand else 'no'} | {why} |"


def test_the_docs_show_the_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [row[:2] for row in TABLE if doc_row(*row) not in text]
    assert not missing, f"docs/answers.md lacks the rows {missing}: regenerate its table from TABLE"


def test_without_math_verify_auto_is_the_hand_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    no_math_verify(monkeypatch)
    assert not math_verify_available()
    for response, answer, _, hand, why in TABLE:
        assert is_correct(response, answer) is hand, why
    assert verify(r"\boxed{\frac{1}{2}}", "0.5", True) == 0.0 and verify("so 7 #### 7", "7", True) == 1.0
    with pytest.raises(ParameterError, match="math-verify package") as err:
        is_correct("1", "1", method="math-verify")
    assert err.value.argument == "method"


@needs_math_verify
def test_jsonl_verify_delegates_to_the_check() -> None:
    assert verify(r"\boxed{\frac{1}{2}}", "0.5", True) == 1.0  # math-verify: the hand rule says 0
    assert verify(r"\boxed{\frac{1}{2}}", "0.5", False) == 0.0  # no EOS: truncated
    assert verify("1e3", "1000", True) == 0.0


def test_unknown_method_is_refused() -> None:
    with pytest.raises(ParameterError, match="expected one of") as err:
        is_correct("1", "1", method="sympy")
    assert err.value.argument == "method"


# ---------------------------------------------------------------------------------------------------------
# sympy's unbounded inputs, signals, the log


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        ("9^9^9^9", False),
        (r"$9^{9^{9}}$", False),
        (r"$9^{-9^{9}}$", False),
        ("2**(3**4)", False),
        (r"$9^{99999999}$", False),
        (r"$\binom{100000000}{50000000}$", False),
        ("10000000!", False),
        (r"$x^{2}-3^{2}$", True),
        (r"$(9^{9})^{9}$", True),
        (r"$2^{10}$", True),
        ("x^2 + y^2", True),
        ("1234567", True),  # a big number with no operator that grows it
        ("The answer is 42.", True),
    ],
)
def test_the_screen(text: str, safe: bool) -> None:
    assert math_verify_safe(text) is safe


@needs_math_verify
def test_an_unsafe_text_never_reaches_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    import math_verify

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("math_verify.parse was called on an unsafe text")

    monkeypatch.setattr(math_verify, "parse", refuse)
    assert is_correct("9^9^9^9", "9") and not is_correct(r"#### $9^{99999999}$", "9")
    assert is_correct("7", r"$10^{10^{10}}$") is False  # an unsafe reference: the hand rule too


def in_a_thread(fn: Callable[[], Any]) -> Any:
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    return out[0]


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX timers")
def test_timeouts_only_where_signals_are_safe() -> None:
    assert answers._timeouts() == (answers.PARSE_TIMEOUT_S, answers.VERIFY_TIMEOUT_S)
    assert in_a_thread(answers._timeouts) == (None, None)  # signal.alarm works in the main thread only
    before = signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 60.0)
    try:
        assert answers._timeouts() == (None, None)  # a pending timer is not cancelled
        if math_verify_available():
            assert is_correct(r"#### \frac{14}{2}", "7")  # math-verify ran with its timeouts off
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, before)


@needs_math_verify
def test_math_verify_in_a_worker_thread(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import math_verify.grader
    import math_verify.parser

    # math-verify logs its notice once a process: make this test's call the first
    monkeypatch.setattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN", False)
    monkeypatch.setattr(math_verify.grader, "TIMEOUT_WARNING_SHOWN", False)
    caplog.set_level(logging.WARNING)
    # with signal timeouts math-verify raises ValueError off the main thread
    assert in_a_thread(lambda: is_correct(r"\boxed{\frac{1}{2}}", "0.5")) is True
    assert in_a_thread(lambda: is_correct(r"\boxed{\frac{1}{3}}", "0.5")) is False
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]


# ---------------------------------------------------------------------------------------------------------
# the reward


def test_math_answer_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    completions: list[Any] = ["#### 7", [{"role": "assistant", "content": "it is 8"}], "no"]
    assert math_answer(completions, answer=["7", "8", "9"], prompts=["a", "b", "c"], other=[1, 2, 3]) == [
        1.0,
        1.0,
        0.0,
    ]
    with pytest.raises(ParameterError, match="one per completion") as err:
        math_answer(["1"], answer=["1", "2"])
    assert err.value.argument == "answer"
    with pytest.raises(ParameterError, match="expected strings or lists of messages") as err:
        math_answer([3], answer=["3"])
    assert err.value.argument == "completions"
    no_math_verify(monkeypatch)
    assert math_answer([r"\frac{1}{2}", "0.5"], answer=["0.5", "0.5"]) == [0.0, 1.0]  # the hand rule


def test_math_answer_as_a_saved_datasets_reward(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    from comppo_core.rl.tasks.base import Problem
    from comppo_core.rl.tasks.hf_dataset import HFDatasetTask

    rows = [{"question": f"what is {i}+{i}?", "answer": f"{i}+{i} = {2 * i} #### {2 * i}"} for i in range(10)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "sums"))
    spec = {"dataset": "sums", "reward": "comppo_core.rl.tasks.answers:math_answer", "prompt_column": "question"}
    (tmp_path / "sums.hf.json").write_text(json.dumps(spec))
    task = HFDatasetTask(tmp_path / "sums.hf.json")
    problems = [Problem(r["question"], r["answer"], "") for r in rows[:3]]
    got = task.rewards(problems, ["the sum is 0", "#### 2", "#### 5"], [True, True, True])
    assert got == [1.0, 1.0, 0.0]
    assert task.rewards(problems[:1], ["the sum is 0"], [False]) == [0.0]  # no EOS


def test_a_jsonl_tasks_record_names_what_checks_its_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from comppo_core.rl.tasks.jsonl import JsonlTask

    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": i + 1}) + "\n" for i in range(40)))
    if math_verify_available():
        assert JsonlTask(path).to_dict()["answer_check"].startswith("math-verify ")
    no_math_verify(monkeypatch)
    assert JsonlTask(path).to_dict()["answer_check"] == "hand"  # a run's rewards depend on it: task.json says
