"""The chain task (``comppo_core.rl.tasks.chain.ChainTask``, ``--task chain``): verifier, splits,
pivotal tokens, demonstrations, registration.

What is pinned: the verifier rewards exactly the responses in format whose last chain digit
is right; training, validation and held-out problems never meet, and the shares are the
fractions; every list is a function of its seed; ``pivotal`` marks the recalled digit and
the chain and nothing else; the SFT demonstrations vary their fillers. What every task
keeps, a tiny training run included, is tests/rl/test_task_contract.py.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")  # comppo_core.rl.engine.build (demonstrations) imports torch

from comppo_core.errors import ParameterError
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.engine.build import demonstrations
from comppo_core.rl.tasks import TASKS, build_task
from comppo_core.rl.tasks.addition import Problem
from comppo_core.rl.tasks.chain import CHAIN_ALPHABET, ChainTask


def test_problem_and_verifier() -> None:
    task = ChainTask(8, 8, filler_min=2, filler_max=6, tail_min=0, tail_max=3)
    p = task.problem("38472915", 3)
    assert p.prompt == "38472915?3=" and p.answer == "789012345"
    ok = "abca|789012345|dd"
    assert task.reward(p, ok, True) == 1.0
    assert task.reward(p, "ab|789012345|", True) == 1.0  # empty tail allowed (tail_min 0)
    assert task.reward(p, "ab|799999995|", True) == 1.0  # middle digits are not checked
    assert task.reward(p, "abca|789012344|dd", True) == 0.0  # wrong last digit
    assert task.reward(p, "abca|689012345|dd", True) == 1.0  # a wrong recall that ends right still scores
    assert task.reward(p, ok, False) == 0.0  # unfinished
    for broken in (
        "a|789012345|dd",  # filler too short
        "abcdabc|789012345|dd",  # filler too long
        "abca|78901234|dd",  # chain one digit short
        "abca|7890123456|dd",  # one digit long
        "abca|789012345dd",  # no second separator
        "abca|789012345|dddd",  # tail too long
        "ab?a|789012345|dd",  # a prompt character in the filler
        "abca789012345",
        "",
    ):
        assert task.reward(p, broken, True) == 0.0, broken
    assert task.rewards([p, p], [ok, "x"], [True, True]) == [1.0, 0.0]
    # without a tail the response ends with the chain
    plain = ChainTask(4, 2, filler_min=1, filler_max=3, tail_max=0)
    q = plain.problem("0919", 2)
    assert q.answer == "123"
    assert plain.reward(q, "cc|123", True) == 1.0 and plain.reward(q, "cc|123|", True) == 0.0
    assert plain.reward(q, "cc|124", True) == 0.0
    assert plain.max_new_tokens == 3 + 1 + 3 + 1 and task.max_new_tokens == 6 + 1 + 9 + 1 + 3 + 1
    assert task.max_prompt_tokens == len(task.tokenizer.encode_prompt(p.prompt)) == 12


def test_solutions_and_demonstrations_are_correct_and_varied() -> None:
    task = ChainTask()
    rng = np.random.default_rng(0)
    problems = task.sample(rng, 200)
    demos = demonstrations(task, problems, rng)
    for p, demo in zip(problems, demos):
        for response in (p.solution, demo):
            assert task.reward(p, response, True) == 1.0
            assert len(task.tokenizer.encode(response)) + 1 <= task.max_new_tokens
    heads = [d.split("|")[0] for d in demos]
    tails = [d.split("|")[2] for d in demos]
    assert len({len(h) for h in heads}) > 20 and len({len(t) for t in tails}) > 20  # 33 lengths each
    assert min(map(len, heads)) == 0 or min(map(len, heads)) < 3
    assert set("".join(heads + tails)) == set("abcd")
    # a fresh filler each use: the same problems give other demonstrations
    assert demonstrations(task, problems, np.random.default_rng(1)) != demos
    # the fixed lists' solutions are fixed
    assert [p.solution for p in task.heldout(5)] == [p.solution for p in ChainTask().heldout(5)]
    assert task.parse(problems[0]) == (problems[0].prompt[:8], int(problems[0].prompt[9]))
    with pytest.raises(ParameterError, match="carry_noise"):
        demonstrations(ChainTask(steps=1, filler_max=2, tail_max=0), problems[:1], rng, carry_noise=0.5)


def test_pivotal_marks_the_recalled_digit_and_the_chain() -> None:
    task = ChainTask(8, 3, filler_min=0, filler_max=8, tail_max=8)
    p = task.problem("12345678", 0)

    def marks(text: str) -> str:
        flags = task.pivotal(p, text)
        assert len(flags) == len(text)
        return "".join("P" if f else "." for f in flags)

    assert marks("abc|1234|dd") == "....PPPP..."
    assert marks("|1234|") == ".PPPP."
    assert marks("abc|1234") == "....PPPP"  # unfinished: everything after the separator
    assert marks("abc|9") == "....P"  # whatever the digits are
    assert marks("abcd") == "...."  # no separator: nothing pivotal
    assert marks("") == ""
    rng = np.random.default_rng(3)
    for q in task.sample(rng, 50):
        flags = task.pivotal(q, q.solution)
        assert sum(flags) == task.steps + 1
        start = q.solution.index("|") + 1
        assert flags == [start <= k < start + task.steps + 1 for k in range(len(q.solution))]


def test_splits_are_disjoint_and_fixed() -> None:
    task = ChainTask(4, 2, filler_min=0, filler_max=2, tail_max=0, split_seed=5, validation_fraction=0.15)
    key = re.compile(r"(\d+)\?(\d)=")

    def keys(problems: list[Problem]) -> set[tuple[str, int]]:
        return {(m[1], int(m[2])) for m in (key.fullmatch(p.prompt) for p in problems) if m}

    train = keys(task.sample(np.random.default_rng(0), 3000))
    held = keys(task.heldout(800))
    valid = keys(task.validation(800))
    assert len(held) == 800 and len(valid) == 800 and len(train) > 2000
    assert not train & held and not train & valid and not held & valid
    assert all(task.is_heldout(*k) for k in held) and all(task.is_validation(*k) for k in valid)
    assert not any(task.is_heldout(*k) or task.is_validation(*k) for k in train)
    # the shares: of all 4·10⁴ problems, about 20% held out and 15% validation
    every = [(f"{i:04d}", q) for i in range(10_000) for q in range(4)]
    held_share = np.mean([task.is_heldout(*k) for k in every])
    valid_share = np.mean([task.is_validation(*k) for k in every])
    assert abs(held_share - 0.2) < 0.01 and abs(valid_share - 0.15) < 0.01
    # determinism: by seed, and the split by split_seed
    again = ChainTask(4, 2, filler_min=0, filler_max=2, tail_max=0, split_seed=5, validation_fraction=0.15)
    assert again.heldout(50) == task.heldout(50) and again.validation(50) == task.validation(50)
    assert task.heldout(50, seed=1) != task.heldout(50)
    assert task.sample(np.random.default_rng(4), 20) == again.sample(np.random.default_rng(4), 20)
    other = ChainTask(4, 2, filler_min=0, filler_max=2, tail_max=0, split_seed=6, validation_fraction=0.15)
    assert keys(other.heldout(200)) != keys(task.heldout(200))


def test_a_small_split_is_listed_whole_instead_of_drawn_forever() -> None:
    """2 digits: 200 problems, about 40 held out; asking for 512 used to loop forever."""
    task = ChainTask(2, 3, validation_fraction=0.1)
    every = [(f"{i:02d}", q) for i in range(100) for q in range(2)]
    for split, listed, member in (
        ("heldout", task.heldout, task.is_heldout),
        ("validation", task.validation, task.is_validation),
    ):
        whole = {k for k in every if member(*k)}
        problems = listed(512)
        keys = [task.parse(p) for p in problems]
        assert len(keys) == len(set(keys)) == len(whole) > 0, split
        assert set(keys) == whole, split
        assert [p.prompt for p in listed(5)] == [p.prompt for p in listed(5)]  # fixed by the seed
        assert listed(len(whole) + 1, seed=1) != problems  # and shuffled by it
    # a split too large to list: more than half of it is refused, naming eval_size
    with pytest.raises(ParameterError, match=r"eval_size: expected at most half") as err:
        ChainTask(6).heldout(700_000)
    assert err.value.argument == "eval_size"


def test_the_draws_that_worked_are_unchanged() -> None:
    """Up to half a split, the problems are the distinct draws they always were."""
    assert [p.prompt for p in ChainTask().heldout(4)] == ["74565032?6=", "46540783?6=", "09936038?1=", "92739802?1="]
    t4 = ChainTask(4, validation_fraction=0.1)
    text = "".join(p.prompt + p.solution for p in t4.heldout(512) + t4.validation(512))
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == "0adfa8a82aed4fc8"


@pytest.mark.parametrize(
    ("settings", "argument"),
    [
        ({"digits": 1}, "digits"),
        ({"digits": 11}, "digits"),
        ({"steps": 0}, "steps"),
        ({"filler_min": 5, "filler_max": 4}, "filler_max"),
        ({"tail_min": 3, "tail_max": 2}, "tail_max"),
        ({"heldout_fraction": 0.0}, "heldout_fraction"),
        ({"validation_fraction": 1.0}, "validation_fraction"),
        ({"heldout_fraction": 0.6, "validation_fraction": 0.4}, "validation_fraction"),
    ],
)
def test_bad_settings_name_the_argument(settings: dict[str, Any], argument: str) -> None:
    with pytest.raises(ParameterError, match=f"^{argument}: ") as info:
        ChainTask(**settings)
    assert info.value.argument == argument


def test_bad_problems_name_the_argument() -> None:
    task = ChainTask()
    for x, q, argument in (("1234567", 0, "x"), ("1234567a", 0, "x"), ("12345678", 8, "q"), ("12345678", -1, "q")):
        with pytest.raises(ParameterError, match=f"^{argument}: "):
            task.problem(x, q)


def test_registered_in_the_config() -> None:
    assert "chain" in TASKS
    config = TrainConfig(
        task="chain", chain_digits=6, chain_steps=4, chain_filler_min=1, chain_filler_max=9, validation_fraction=0.1
    )
    task = build_task(config)
    assert isinstance(task, ChainTask)
    assert task.to_dict() == {
        "name": "chain",
        "digits": 6,
        "steps": 4,
        "filler_min": 1,
        "filler_max": 9,
        "tail_min": 0,
        "tail_max": 32,
        "split_seed": 0,
        "heldout_fraction": 0.2,
        "validation_fraction": 0.1,
    }
    assert task.describe() == "chain recall (6 digits, filler 1-9, 4 steps)"
    assert task.tokenizer.alphabet == CHAIN_ALPHABET
    for changes, argument in (
        ({"chain_digits": 11}, "chain_digits"),
        ({"chain_filler_min": 9, "chain_filler_max": 8}, "chain_filler_max"),
        ({"chain_tail_min": 2, "chain_tail_max": 1}, "chain_tail_max"),
        ({"sft_carry_noise": 0.5}, "sft_carry_noise"),
    ):
        with pytest.raises(ParameterError, match=f"^{argument}: "):
            TrainConfig(task="chain", **changes)
