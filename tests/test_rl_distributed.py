"""The trainer under torch.distributed: 2 gloo processes on CPU equal 1 process on the same global batch.

What is pinned: after k steps the actor's and the critic's parameters of a ``torchrun
--nproc-per-node 2`` run equal those of a one-process run within float tolerance, and so
does every metric (they are over the global batch), for an arm with TAC and concentration
gates and for a control arm with batch-normalised gates, a seq-mean loss and the KL as a
loss (the batch-wide paths: controls, whitening, the minibatch shares); a resume on 2 ranks
continues bit for bit; a row's samples are
a function of (seed, step, prompt, sample) alone; the inverse-CDF sampler draws from the right
distribution; the collectives are the identity on one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rl_tiny import TINY_SETTINGS

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tqdm")
pytest.importorskip("safetensors")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from comppo_core.errors import ParameterError
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.distributed import Dist, shard_bounds
from comppo_core.rl.sampling import row_keys, sample_tokens, uniforms
from comppo_core.rl.tasks import AdditionTask
from comppo_core.rl.trainer import METRIC_KEYS, Trainer

WORKER = """
import json, sys
import torch
import torch.distributed as td
from comppo_core.errors import ParameterError
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.tasks import AdditionTask
from comppo_core.rl.trainer import Trainer, train

torch.set_num_threads(1)
AdditionTask.score = lambda self, problem, response, finished: float(len(response) % 2 == 0)  # the tests' signal
td.init_process_group("gloo")  # train() joins the group it finds
for text in json.loads(open(sys.argv[1]).read()):
    train(TrainConfig.from_json(text))
try:
    Trainer(TrainConfig.from_json(text).replace(prompts_per_step=3, out=None, resume=False))
except ParameterError as exc:
    if td.get_rank() == 0:
        open(sys.argv[2], "w").write(str(exc))
td.destroy_process_group()
"""


def parity_reward(self: AdditionTask, problem: Any, response: str, finished: bool) -> float:
    return float(len(response) % 2 == 0)


def tiny(**changes: Any) -> TrainConfig:
    """The shared tiny run (:mod:`rl_tiny`) with 7 held-out problems (split 4 + 3 over the
    ranks), a large learning rate (the parameters move far more than the tolerance) and 3
    uneven minibatches (a rank may hold 1, 2 or 3 rows of one)."""
    base = {"eval_size": 7, "eval_every": 1, "device": "cpu", "actor_lr": 1e-3, "num_minibatches": 3}
    return TrainConfig(**{**TINY_SETTINGS, **base, **changes})


def checkpoint_params(out: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    params = {f"actor.{k}": v for k, v in load_file(str(out / "checkpoint" / "actor" / "model.safetensors")).items()}
    state = torch.load(out / "checkpoint" / "state.pt", weights_only=True)
    params.update({f"critic.{k}": v for k, v in state.get("critic", {}).items()})
    return params


def warmstart_params(out: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return {f"actor.{k}": v for k, v in load_file(str(out / "warmstart" / "model.safetensors")).items()}


def rows(out: Path) -> list[dict[str, Any]]:
    """The step rows of ``metrics.jsonl`` (without the final evaluation's row)."""
    rs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rs if r["reward_mean"] is not None]


CASES = {
    "comppo": {"arm": "comppo"},
    "comppo_shuffle": {
        "arm": "comppo_shuffle",
        "gate_normalize": "batch",
        "loss_agg": "seq-mean-token-mean",
        "kl_mode": "loss",
        "kl_coef": 0.1,
    },
}


def test_two_gloo_processes_equal_one_process(tmp_path: Path, monkeypatch: Any) -> None:
    configs = {name: tiny(**case, out=str(tmp_path / f"{name}-2")) for name, case in CASES.items()}
    # resume on 2 ranks: 4 steps straight, and 2 steps then a resume to 4
    straight = tiny(arm="comppo", steps=4, save_every=2, eval_every=2, out=str(tmp_path / "straight-2"))
    half = straight.replace(steps=2, out=str(tmp_path / "resumed-2"))
    resumed = straight.replace(out=str(tmp_path / "resumed-2"), resume=True)
    runs = [*configs.values(), straight, half, resumed]
    (tmp_path / "configs.json").write_text(json.dumps([c.to_json() for c in runs]))
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(tmp_path / "worker.py"),
        str(tmp_path / "configs.json"),
        str(tmp_path / "error.txt"),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "error.txt").read_text().startswith("prompts_per_step: expected a multiple of the 2 processes")
    a, b = checkpoint_params(tmp_path / "straight-2"), checkpoint_params(tmp_path / "resumed-2")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    drop = {k for k in METRIC_KEYS if k.startswith("time_")}
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows(tmp_path / "straight-2")] == [
        {k: v for k, v in r.items() if k not in drop} for r in rows(tmp_path / "resumed-2")
    ]

    monkeypatch.setattr(AdditionTask, "score", parity_reward)
    torch.set_num_threads(1)
    for name, cfg in configs.items():
        one = tmp_path / f"{name}-1"
        Trainer(cfg.replace(out=str(one))).train()
        two = Path(cfg.out or "")
        assert json.loads((two / "summary.json").read_text())["world_size"] == 2
        assert json.loads((one / "summary.json").read_text())["world_size"] == 1
        p1, p2 = checkpoint_params(one), checkpoint_params(two)
        start = warmstart_params(one)
        assert p1.keys() == p2.keys() and any(k.startswith("critic.") for k in p1)
        moved = max(float((p1[k] - start[k]).abs().max()) for k in start)
        assert moved > 1e-3, name  # the run did something the comparison can see
        for k in p1:
            torch.testing.assert_close(p2[k], p1[k], rtol=0, atol=2e-5, msg=f"{name}: {k}")
        r1, r2 = rows(one), rows(two)
        assert [r["step"] for r in r2] == [0, 1]
        for a, b in zip(r1, r2):
            for key in METRIC_KEYS:
                if key.startswith("time_"):
                    continue
                if isinstance(a[key], float):
                    assert b[key] == pytest.approx(a[key], rel=1e-4, abs=2e-5), (name, a["step"], key)
                else:
                    assert a[key] == b[key], (name, a["step"], key)


# ---------------------------------------------------------------------------------------------------------
# the pieces, on one process


def test_shard_bounds_cover_the_items_in_order() -> None:
    for n in (0, 1, 7, 8):
        for world in (1, 2, 3):
            bounds = [shard_bounds(n, r, world) for r in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1


def test_one_process_collectives_are_the_identity() -> None:
    dist = Dist.setup("cpu")
    assert (dist.rank, dist.world_size, dist.distributed, dist.is_main) == (0, 1, False, True)
    x = torch.arange(6.0).reshape(2, 3)
    assert dist.gather_rows(x) is x and dist.sum(x) is x and dist.max_int(3) == 3
    p = torch.nn.Parameter(torch.ones(2))
    assert dist.all_reduce_gradients([p], nonfinite=True) is True and p.grad is None
    with pytest.raises(ParameterError, match="^device: expected auto, cpu, cuda or cuda:N, got 'tpu'"):
        Dist.setup("tpu")


def test_uniforms_are_a_function_of_the_row_key() -> None:
    keys = row_keys(3, 5, [(0, 0), (0, 1), (7, 0)])
    assert keys.shape == (3, 2) and keys.dtype == torch.int64
    assert torch.equal(row_keys(3, 5, [(7, 0)])[0], keys[2])
    assert len({tuple(k.tolist()) for k in keys}) == 3
    u = uniforms(keys, 4)
    assert u.dtype == torch.float64 and bool(((u > 0) & (u < 1)).all())
    assert torch.equal(uniforms(keys[2:], 4)[0], u[2])  # the batch around a row does not matter
    assert not torch.equal(uniforms(keys, 5), u)  # a new draw each decoding step
    many = uniforms(row_keys(0, 0, [(i, 0) for i in range(20000)]), 0).numpy()
    assert abs(many.mean() - 0.5) < 0.01 and abs(many.var() - 1 / 12) < 0.005
    assert len(np.unique(many)) == len(many)


def test_inverse_cdf_samples_the_softmax() -> None:
    """20000 rows of one distribution: frequencies within 4 standard errors of softmax; a token of
    probability 0 (filtered, −inf) is never drawn, even at u → 1."""
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0, -torch.inf])
    p = torch.softmax(logits.double(), 0).numpy()
    keys = row_keys(0, 0, [(i, 0) for i in range(20000)])
    for t in (0, 9):
        picks = sample_tokens(logits.expand(len(keys), -1), uniforms(keys, t)).numpy()
        freq = np.bincount(picks, minlength=6) / len(picks)
        se = np.sqrt(p * (1 - p) / len(picks))
        assert np.all(np.abs(freq - p) < 4 * se + 1e-4), (freq, p)
        assert freq[5] == 0
    edge = sample_tokens(logits.expand(2, -1), torch.tensor([1.0 - 2.0**-53, 2.0**-54], dtype=torch.float64))
    assert edge.tolist() == [4, 0]


def test_a_rows_samples_do_not_depend_on_the_batch() -> None:
    """Row (prompt i, sample g) of step s draws the same response whether the batch has 2 or 4
    prompts: what lets the ranks' shards reproduce the one-process rollout."""
    torch.set_num_threads(1)
    trainer = Trainer(tiny(arm="grpo", prompts_per_step=4, eval_every=0))
    problems = trainer.task.sample(np.random.default_rng(0), 4)
    keys = row_keys(0, 3, [(i, 0) for i in range(4)])
    width = trainer._prompt_width(problems)
    full, _, _, in_full = trainer.generate(problems, sample=True, keys=keys, prompt_width=width)
    part, _, _, in_part = trainer.generate(problems[2:], sample=True, keys=keys[2:], prompt_width=width)
    for i in range(2):
        a = full[2 + i, width:][in_full[2 + i]]
        b = part[i, width:][in_part[i]]
        assert torch.equal(a, b)
    other = row_keys(1, 3, [(i, 0) for i in range(4)])
    again, _, _, _ = trainer.generate(problems, sample=True, keys=other, prompt_width=width)
    assert not torch.equal(again, full)
