"""Addition between random fillers (``comppo_core.rl.tasks.filler_addition.FillerAdditionTask``,
``--task filler_addition``) and the filler layout it shares with the chain task
(``comppo_core.rl.tasks.fillers``).

What is pinned: the verifier rewards exactly the finished responses in format whose body's
answer is right; the splits are the addition task's, pair for pair; ``pivotal`` marks the
worked addition and nothing else; demonstrations vary their fillers and are correct; the
config builds the task and refuses bad ranges by name. What every task keeps, a tiny
training run with the oracle arm included, is tests/rl/test_task_contract.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")  # comppo_core.rl.engine.build (demonstrations) imports torch

from comppo_core.errors import ParameterError
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.engine.build import demonstrations
from comppo_core.rl.tasks import TASKS, build_task
from comppo_core.rl.tasks.addition import AdditionTask, worked_solution
from comppo_core.rl.tasks.filler_addition import FILLER_ADDITION_ALPHABET, FillerAdditionTask
from comppo_core.rl.tasks.fillers import FillerRange, pivotal_body, wrap


def test_problem_and_verifier() -> None:
    task = FillerAdditionTask(filler_min=2, filler_max=6, tail_min=0, tail_max=3)
    p = task.problem(27, 45)
    assert p.prompt == "27+45=" and p.answer == "72"
    ok = "abca|7+5=12,2+4+1=7;72|dd"
    assert task.reward(p, ok, True) == 1.0
    assert task.reward(p, "ab|7+5=12,2+4+1=7;72|", True) == 1.0  # an empty tail (tail_min 0)
    assert task.reward(p, "ab|;72|c", True) == 1.0  # worked steps are not checked, as in addition
    assert task.reward(p, ok, False) == 0.0  # unfinished
    for broken in (
        "abca|7+5=12,2+4+1=7;73|dd",  # wrong answer
        "a|7+5=12,2+4+1=7;72|dd",  # filler too short
        "abcdabc|7+5=12,2+4+1=7;72|dd",  # filler too long
        "abca|7+5=12,2+4+1=7;72|dddd",  # tail too long
        "abca|7+5=12,2+4+1=7;72dd",  # no second separator
        "abca|7+5=12;2+4+1=7;72|dd",  # two answers
        "abca|7+5=12,2+4+1=7;7a2|dd",  # a filler symbol in the body
        "7+5=12,2+4+1=7;72",  # the plain addition response
        "",
    ):
        assert task.reward(p, broken, True) == 0.0, broken
    plain = FillerAdditionTask(filler_min=0, filler_max=3, tail_max=0)  # no tail: the body ends the response
    assert plain.reward(p, "c|7+5=12,2+4+1=7;72", True) == 1.0
    assert plain.reward(p, "c|7+5=12,2+4+1=7;72|", True) == 0.0


def test_solutions_demonstrations_and_budget() -> None:
    task = FillerAdditionTask(filler_min=1, filler_max=9, tail_min=2, tail_max=5)
    p = task.problem(99, 99)
    assert p.solution == task.problem(99, 99).solution  # the problem's own fillers are fixed
    rng = np.random.default_rng(0)
    demos = demonstrations(task, [p] * 64, rng)
    assert all(task.reward(p, d, True) == 1.0 for d in demos)
    assert all(d.split("|")[1] == worked_solution(99, 99) for d in demos)
    assert len({d.split("|")[0] for d in demos}) > 20  # fresh fillers each time
    assert {len(d.split("|")[0]) for d in demos} == set(range(1, 10))
    longest = len(worked_solution(99, 99)) + 9 + 1 + 1 + 5 + 1  # body, filler, |, |, tail, EOS
    assert task.max_new_tokens == longest
    assert task.tokenizer.alphabet == FILLER_ADDITION_ALPHABET
    assert task.tokenizer.decode(task.tokenizer.encode(demos[0])) == demos[0]


def test_carry_noise_forgets_carries_between_fillers() -> None:
    task = FillerAdditionTask(filler_max=4, tail_max=4)
    p = task.problem(27, 45)
    demos = demonstrations(task, [p] * 200, np.random.default_rng(1), carry_noise=0.5)
    bodies = [d.split("|")[1] for d in demos]
    assert set(bodies) == {worked_solution(27, 45), worked_solution(27, 45, carries=False)}
    assert 70 < bodies.count(worked_solution(27, 45, carries=False)) < 130
    TrainConfig(task="filler_addition", sft_carry_noise=0.5)  # accepted, as for addition


def test_pivotal_marks_the_worked_addition() -> None:
    task = FillerAdditionTask()
    p = task.problem(3, 4)
    text = "ab|3+4=7;7|c"
    flags = task.pivotal(p, text)
    assert "".join(ch for ch, f in zip(text, flags) if f) == "3+4=7;7"
    assert task.pivotal(p, "3+4=7;7") == [False] * 7  # no separator: nothing is pivotal
    assert pivotal_body("ab|3+4") == [False, False, False, True, True, True]  # unfinished: up to the end


def test_splits_are_the_addition_tasks() -> None:
    plain = AdditionTask(validation_fraction=0.1)
    task = FillerAdditionTask(validation_fraction=0.1)
    assert [p.prompt for p in task.heldout(300)] == [p.prompt for p in plain.heldout(300)]
    assert [p.prompt for p in task.validation(100)] == [p.prompt for p in plain.validation(100)]
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    assert [p.prompt for p in task.sample(rng_a, 50)] == [p.prompt for p in plain.sample(rng_b, 50)]


def test_wrap_draws_in_a_fixed_order() -> None:
    """The chain task's draws (filler length, symbols, tail length, symbols) are unchanged by the move to rl.fillers."""
    sizes = FillerRange(0, 32, 0, 32)
    assert wrap("789", np.random.default_rng(5), sizes) == wrap("789", np.random.default_rng(5), sizes)
    rng = np.random.default_rng(5)
    n = int(rng.integers(0, 33))
    head = "".join("abcd"[int(i)] for i in rng.integers(0, 4, size=n))
    m = int(rng.integers(0, 33))
    tail = "".join("abcd"[int(i)] for i in rng.integers(0, 4, size=m))
    assert wrap("789", np.random.default_rng(5), sizes) == f"{head}|789|{tail}"


@pytest.mark.parametrize(
    ("settings", "argument"),
    [
        ({"digits": 0}, "digits"),
        ({"filler_min": 5, "filler_max": 4}, "filler_max"),
        ({"tail_min": 3, "tail_max": 2}, "tail_max"),
        ({"filler_max": 257}, "filler_max"),
        ({"tail_min": -1}, "tail_min"),
        ({"heldout_fraction": 1.0}, "heldout_fraction"),
    ],
)
def test_bad_settings_name_the_argument(settings: dict[str, Any], argument: str) -> None:
    with pytest.raises(ParameterError, match=f"^{argument}: ") as info:
        FillerAdditionTask(**settings)
    assert info.value.argument == argument


def test_registered_in_the_config() -> None:
    assert "filler_addition" in TASKS
    config = TrainConfig(task="filler_addition", digits=3, addition_filler_max=9, addition_tail_min=1)
    task = build_task(config)
    assert isinstance(task, FillerAdditionTask)
    assert task.to_dict() == {
        "name": "filler_addition",
        "digits": 3,
        "split_seed": 0,
        "heldout_fraction": 0.2,
        "filler_min": 0,
        "filler_max": 9,
        "tail_min": 1,
        "tail_max": 16,
    }
    assert task.describe() == "3-digit addition between fillers (0-9, tail 1-16)"
    for changes, argument in (
        ({"addition_filler_min": 9, "addition_filler_max": 8}, "addition_filler_max"),
        ({"addition_tail_min": 2, "addition_tail_max": 1}, "addition_tail_max"),
        ({"addition_filler_max": 300}, "addition_filler_max"),
    ):
        with pytest.raises(ParameterError, match=f"^{argument}: "):
            TrainConfig(task="filler_addition", **changes)
