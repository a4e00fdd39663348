"""The trainer under torch.distributed: 2 gloo processes on CPU equal 1 process on the same global batch.

What is pinned: after k steps the actor's and the critic's parameters of a ``torchrun
--nproc-per-node 2`` run equal those of a one-process run within float tolerance, and so
does every metric (they are over the global batch), for an arm with TAC and concentration
gates and for a control arm with batch-normalised gates, a seq-mean loss and the KL as a
loss (the batch-wide paths: controls, whitening, the minibatch shares), and under FSDP2
(``fsdp``: every parameter of the policy, its reference and a standard critic asserted a
DTensor) for a TAC arm and a standard-critic arm; a resume on 2 ranks continues bit for bit,
also under FSDP2; a row's samples are
a function of (seed, step, prompt, sample) alone; the inverse-CDF sampler draws from the right
distribution; the collectives are the identity on one process. When rank 1 fails at step 2
(its verifier raises, its rewards or its loss are non-finite), every rank stops at once,
naming the failing rank and its error, also while the failing process stays alive, and the
checkpoint after step 2 is kept and resumes.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
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

from comppo_core.errors import NonFiniteError, ParameterError
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.engine.distributed import Dist, describe_error, shard_bounds
from comppo_core.rl.engine.sampling import row_keys, sample_tokens, uniforms
from comppo_core.rl.engine.trainer import METRIC_KEYS, Trainer
from comppo_core.rl.runs.interrupts import RankFailed
from comppo_core.rl.tasks.addition import AdditionTask

WORKER = """
import json, sys
import torch
import torch.distributed as td
from comppo_core.errors import NonFiniteError, ParameterError
from comppo_core.rl.config import TrainConfig
from comppo_core.rl.tasks.addition import AdditionTask
from comppo_core.rl.engine.trainer import Trainer, train

torch.set_num_threads(1)
AdditionTask.reward = lambda self, problem, response, finished: float(len(response) % 2 == 0)  # the tests' signal
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
    # FSDP2 (fsdp: policy, reference and standard critic sharded) against one unsharded process
    "comppo_fsdp": {"arm": "comppo", "fsdp": True},
    "comp_gae_fsdp": {"arm": "comp_gae", "fsdp": True, "kl_mode": "loss", "kl_coef": 0.1},
}


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process(tmp_path: Path, monkeypatch: Any) -> None:
    configs = {name: tiny(**case, out=str(tmp_path / f"{name}-2")) for name, case in CASES.items()}
    # resume on 2 ranks: 4 steps straight, and 2 steps then a resume to 4 (unsharded, and under FSDP2)
    resumes = []
    for name, case in (("", {"arm": "comppo"}), ("-fsdp", {"arm": "comp_gae", "fsdp": True})):
        straight = tiny(**case, steps=4, save_every=2, eval_every=2, out=str(tmp_path / f"straight{name}-2"))
        half = straight.replace(steps=2, out=str(tmp_path / f"resumed{name}-2"))
        resumes += [straight, half, straight.replace(out=str(tmp_path / f"resumed{name}-2"), resume=True)]
    runs = [*configs.values(), *resumes]
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
    drop = {k for k in METRIC_KEYS if k.startswith("time_")}
    for name in ("", "-fsdp"):
        a, b = checkpoint_params(tmp_path / f"straight{name}-2"), checkpoint_params(tmp_path / f"resumed{name}-2")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name  # bit for bit
        assert [{k: v for k, v in r.items() if k not in drop} for r in rows(tmp_path / f"straight{name}-2")] == [
            {k: v for k, v in r.items() if k not in drop} for r in rows(tmp_path / f"resumed{name}-2")
        ], name

    monkeypatch.setattr(AdditionTask, "reward", parity_reward)
    torch.set_num_threads(1)
    for name, cfg in configs.items():
        one = tmp_path / f"{name}-1"
        Trainer(cfg.replace(out=str(one))).train()
        two = Path(cfg.out or "")
        summary_two = json.loads((two / "summary.json").read_text())
        assert summary_two["world_size"] == 2
        assert json.loads((one / "summary.json").read_text())["world_size"] == 1
        if cfg.fsdp:  # FSDP2 really ran: every parameter of the actor, its reference (and a standard critic) a DTensor
            sharded = summary_two["fsdp"]
            assert sharded["actor"][0] == sharded["actor"][1] > 0, sharded
            assert sharded["reference"][0] == sharded["reference"][1] > 0, sharded
            standard = cfg.arm == "comp_gae"
            assert (sharded["critic"][0] == sharded["critic"][1]) is standard and (
                sharded["critic"][0] == 0
            ) is not standard
        else:
            assert summary_two["fsdp"] is None
        p1, p2 = checkpoint_params(one), checkpoint_params(two)
        start = warmstart_params(one)
        assert p1.keys() == p2.keys() and any(k.startswith("critic.") for k in p1)
        moved = max(float((p1[k] - start[k]).abs().max()) for k in start)
        assert moved > 1e-3, name  # the run did something the comparison can see
        for k in p1:
            torch.testing.assert_close(p2[k], p1[k], rtol=0, atol=2e-5, msg=f"{name}: {k}")
        print(f"{name}: 2 processes vs 1, max |difference| {max(float((p2[k] - p1[k]).abs().max()) for k in p1):.1e}")
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
# one rank fails: every rank stops at once

#: Rank 1 fails at step 2 of a 4-step run with save_every=1, in one of three ways (FAIL_MODE):
#: its verifier raises, its verifier returns NaN (caught by cc.gae on its rows alone), or its
#: loss is NaN (the check the gradient all-reduce already makes collective).
FAILURE = """
import os, time
import torch
from comppo_core.rl import step as steps
from comppo_core.rl.tasks.addition import AdditionTask
from comppo_core.rl.engine.trainer import Trainer

torch.set_num_threads(1)
RANK = int(os.environ["RANK"])
state = {"mode": os.environ.get("FAIL_MODE", ""), "step": -1, "failed_at": None}
real_rollout, real_loss = Trainer.rollout, steps.minibatch_loss


def rollout(self, step=0):
    state["step"] = step
    return real_rollout(self, step)


def failing(mode):
    if state["mode"] == mode and RANK == 1 and state["step"] == 2:
        state["failed_at"] = state["failed_at"] or time.time()
        return True
    return False


def score(self, problem, response, finished):
    if failing("verifier"):
        raise ValueError("the verifier broke on purpose")
    return float("nan") if failing("nan_reward") else float(len(response) % 2 == 0)


def minibatch_loss(*args, **kwargs):
    loss, stats = real_loss(*args, **kwargs)
    return (loss * float("nan") if loss is not None and failing("nan_loss") else loss), stats


Trainer.rollout, AdditionTask.reward, steps.minibatch_loss = rollout, score, minibatch_loss
"""

#: ``comppo-core train`` under torchrun.
CLI_WORKER = (
    FAILURE
    + """
import sys
from comppo_core import cli
try:
    status = cli.main(sys.argv[1:])
finally:
    print(f"rank {RANK} returned at {time.time()!r}; failed at {state['failed_at']!r}", flush=True)
sys.exit(status)
"""
)

#: ``Trainer(config).train()`` in processes that survive their error: a run per mode, one after
#: the other, each in a process group the worker creates (on torchrun's store under a prefix of
#: its own, so no run reads another's rendezvous keys) and the failure destroys. Each rank
#: writes what it raised and when, then stays alive until every rank has written (at most 60 s),
#: so a rank that waited for the failing process to exit would show it.
API_RUNS = """
import json, sys
from datetime import timedelta
from pathlib import Path
import torch.distributed as td
from comppo_core.rl.config import TrainConfig

runs, results = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
agent = td.TCPStore(
    os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=120)
)
for mode, text in runs.items():
    state.update(mode=mode, step=-1, failed_at=None)
    store = td.PrefixStore(f"comppo-test/{mode}/", agent)
    td.init_process_group("gloo", store=store, rank=RANK, world_size=2, timeout=timedelta(seconds=120))
    outcome = {"mode": mode, "type": None}
    try:
        Trainer(TrainConfig.from_json(text)).train()
    except Exception as exc:
        outcome.update(type=type(exc).__name__, message=str(exc), failed_rank=getattr(exc, "rank", None))
    outcome.update(failed_at=state["failed_at"], ended=time.time(), group_left=td.is_initialized())
    (results / f"{mode}-{RANK}.json").write_text(json.dumps(outcome))
    deadline = time.time() + 60
    while not all((results / f"{mode}-{r}.json").exists() for r in range(2)):
        if time.time() > deadline:
            (results / f"{mode}-{RANK}.waited").write_text("60 s")
            break
        time.sleep(0.05)
"""


def torchrun(script: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), *args]
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    # a session of its own: on a timeout the workers go too, not just the launcher
    proc = subprocess.Popen(
        cmd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def kept_checkpoint(out: Path, next_step: int) -> None:
    """``out``'s checkpoint continues at ``next_step``, whole, with the rows of the steps before it."""
    assert torch.load(out / "checkpoint" / "state.pt", weights_only=True)["next_step"] == next_step
    assert not (out / "checkpoint.tmp").exists()
    assert [r["step"] for r in rows(out)] == list(range(next_step))


@pytest.mark.slow
def test_a_failing_rank_stops_the_command_on_every_rank(tmp_path: Path, monkeypatch: Any) -> None:
    """``comppo-core train`` on 2 ranks, rank 1's verifier raising at step 2: both ranks leave
    within seconds (not at the 30-minute gloo timeout), the run exits non-zero, rank 0's
    error names rank 1 and its error, and the checkpoint after step 2 resumes."""
    from rl_tiny import as_flags

    (tmp_path / "worker.py").write_text(CLI_WORKER)
    out = tmp_path / "run"
    settings = {**TINY_SETTINGS, "steps": 4, "save_every": 1, "eval_every": 0, "device": "cpu"}
    start = time.monotonic()
    done = torchrun(
        tmp_path / "worker.py", "train", "--out", str(out), *as_flags(settings), env={"FAIL_MODE": "verifier"}
    )
    elapsed = time.monotonic() - start
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    kept = f"the last good checkpoint (after 2 steps) is kept at {str(out / 'checkpoint')!r}"
    assert (
        "comppo-core: error: rank 1 of 2 failed at step 2: ValueError: the verifier broke on purpose; "
        f"every rank stopped, {kept}"
    ) in output, output[-4000:]
    if sys.version_info >= (3, 11):  # the failing rank's own traceback, with the trainer's note
        assert f"comppo-core: raised at step 2 on rank 1 of 2; every rank stopped, {kept}" in output
    returned = {}
    for line in output.splitlines():
        if " returned at " in line:
            rank, _, rest = line.partition(" returned at ")
            ended, _, failed = rest.partition("; failed at ")
            returned[rank.split()[-1]] = (float(ended), failed)
    failed_at = float(returned["1"][1])
    # both ranks are done with the run within seconds of the failure (a hang: 30 minutes)
    assert max(ended for ended, _ in returned.values()) - failed_at < 60, (returned, elapsed)
    kept_checkpoint(out, 2)
    monkeypatch.setattr(AdditionTask, "reward", parity_reward)
    torch.set_num_threads(1)
    cfg = TrainConfig(**{**settings, "out": str(out), "resume": True})
    Trainer(cfg).train()
    assert [r["step"] for r in rows(out)] == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_failing_rank_stops_every_rank_while_its_process_lives(tmp_path: Path) -> None:
    """``Trainer.train`` on 2 ranks in processes that outlive the error, rank 1 failing at step 2:
    rank 0 stops while rank 1's process still runs, with the failing rank and its error; a
    non-finite reward on rank 1 alone (cc.gae on its rows) stops both, a non-finite loss on
    rank 1 alone is already a collective check (both raise NonFiniteError, rank 0's naming
    rank 1). Each run keeps the checkpoint after step 2."""
    modes = ("verifier", "nan_reward", "nan_loss")
    settings = {**TINY_SETTINGS, "steps": 4, "save_every": 1, "eval_every": 0, "device": "cpu"}
    runs = {mode: TrainConfig(**settings, out=str(tmp_path / mode)).to_json() for mode in modes}
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    (tmp_path / "worker.py").write_text(FAILURE + API_RUNS)
    results = tmp_path / "results"
    results.mkdir()
    done = torchrun(tmp_path / "worker.py", str(tmp_path / "runs.json"), str(results))
    assert done.returncode == 0, done.stderr[-4000:]
    assert not list(results.glob("*.waited")), "a rank waited for the other's process"
    got = {(m, r): json.loads((results / f"{m}-{r}.json").read_text()) for m in modes for r in (0, 1)}
    for mode in modes:
        failed_at = got[mode, 1]["failed_at"]
        assert failed_at is not None and got[mode, 0]["failed_at"] is None, mode
        assert got[mode, 0]["ended"] - failed_at < 60, mode  # a hang: until rank 1's process ends
        assert not got[mode, 0]["group_left"] and not got[mode, 1]["group_left"], mode  # destroyed on failure
        kept_checkpoint(tmp_path / mode, 2)
    kept = f"the last good checkpoint (after 2 steps) is kept at {str(tmp_path / 'verifier' / 'checkpoint')!r}"
    assert (got["verifier", 1]["type"], got["verifier", 1]["message"]) == (
        "ValueError",
        "the verifier broke on purpose",
    )
    assert (got["verifier", 0]["type"], got["verifier", 0]["failed_rank"]) == ("RankFailed", 1)
    assert got["verifier", 0]["message"] == (
        f"rank 1 of 2 failed at step 2: ValueError: the verifier broke on purpose; every rank stopped, {kept}"
    )
    kept = kept.replace("verifier", "nan_reward")
    assert got["nan_reward", 1]["type"] == "NonFiniteError"
    assert got["nan_reward", 1]["message"].startswith("rewards: expected finite values at valid positions, got NaN")
    assert got["nan_reward", 1]["message"].endswith(f" at step 2 on rank 1 of 2; every rank stopped, {kept}")
    assert (got["nan_reward", 0]["type"], got["nan_reward", 0]["failed_rank"]) == ("RankFailed", 1)
    assert got["nan_reward", 0]["message"].startswith(
        "rank 1 of 2 failed at step 2: NonFiniteError: rewards: expected finite values at valid positions, got NaN"
    )
    kept = kept.replace("nan_reward", "nan_loss")
    assert [got["nan_loss", r]["type"] for r in (0, 1)] == ["NonFiniteError", "NonFiniteError"]
    assert got["nan_loss", 0]["message"] == (
        "loss: expected a finite value, got a non-finite value on rank 1 (epoch 0, minibatch 0) at step 2 on rank 0 "
        f"of 2; every rank stopped, {kept}"
    )
    assert got["nan_loss", 1]["message"] == (
        f"loss: expected a finite value, got nan (epoch 0, minibatch 0) at step 2 on rank 1 of 2; every rank stopped, {kept}"
    )


def test_one_process_failures_are_restated_with_the_step() -> None:
    dist = Dist.setup("cpu")
    exc = NonFiniteError("loss: expected a finite value, got nan", argument="loss", row=3)
    got = dist.stop_all(exc, step=5, kept="kept")
    assert (
        isinstance(got, NonFiniteError)
        and str(got) == "loss: expected a finite value, got nan at step 5; training stopped, kept"
    )
    assert (got.argument, got.row) == ("loss", 3)
    other = ValueError("boom")
    assert dist.stop_all(other, step=5, kept="kept") is other and not getattr(other, "__notes__", None)
    assert dist.peer_failure() is None
    assert (
        describe_error(ValueError("boom")) == "ValueError: boom"
        and describe_error(KeyboardInterrupt()) == "KeyboardInterrupt"
    )
    assert describe_error(ValueError("x" * 50), limit=20) == "ValueError: xxxxx..."
    failed = RankFailed("rank 1 of 2 failed at step 2: ValueError: boom", rank=1, step=2, error="ValueError: boom")
    again = pickle.loads(pickle.dumps(failed))
    assert (str(again), again.rank, again.step, again.error) == (str(failed), 1, 2, "ValueError: boom")


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
    assert dist.all_reduce_gradients([p], nonfinite=True) == 0 and p.grad is None
    assert dist.all_reduce_gradients([p]) is None
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
