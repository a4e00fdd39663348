"""CompPOTrainer under the sharded backends, on CPU with 2 gloo processes: DDP, DeepSpeed
ZeRO-2, ZeRO-3 and FSDP2 (tests/trl_backends.py; the worker is tests/trl_sharded_worker.py).

For a TAC arm and a standard-critic arm, 2 steps on the same global batch (16 rows) under
each backend equal one plain process with gradient accumulation 2: the actor and the critic
within 1e-5 after each step, every process holding the same actor and critic, and the
gradient norms of both equal (relative 1e-4: a gradient averaged twice, which Adam's update
barely shows, halves them); each test asserts that
its backend really ran (accelerate falls back to DDP on CPU without a word, see
``trl_backends.use_fsdp_on_cpu``). Under ZeRO-3 and FSDP2 a run resumed from its step-1
checkpoint ends within 1e-6 of the uninterrupted one.

One launch per backend runs both arms; the one-process reference runs once for all.
DeepSpeed's backends are skipped where ``deepspeed`` is not installed
(the ``[deepspeed]`` extra, which the README's test command installs). DeepSpeed JIT-compiles
its shared-memory comm op (ninja, g++) at its first launch on a machine, into
``~/.cache/torch_extensions``: 35-80 s that the first ZeRO launch pays unless it was built
before (``get_accelerator().create_op_builder("ShareMemCommBuilder").load()``).
"""

from __future__ import annotations

import importlib.util
import socket
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("datasets")
pytest.importorskip("accelerate")

from trl_backends import BACKENDS, launch, run_single  # noqa: E402

from comppo_core.integrations.trl import ARM_CHOICES  # noqa: E402
from comppo_core.rl.core.arms import ARMS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "trl_sharded_worker.py"

#: a TAC arm and a standard-critic arm
TAC_ARM, STANDARD_ARM = "comppo_position", "comp_gae"
#: the arms the installed CompPOConfig accepts (one launch per backend runs them all)
RUN_ARMS = tuple(arm for arm in (TAC_ARM, STANDARD_ARM) if arm in ARM_CHOICES)
#: the backends whose test also resumes from a checkpoint
RESUMED = ("zero3", "fsdp2")
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None

#: what each backend must report on every process (trl_backends.backend_facts)
EXPECTED_TYPE = {"ddp": "MULTI_CPU", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED", "fsdp2": "FSDP"}


def max_diff(a: list[Any], b: list[Any]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    assert all(x.shape == y.shape for x, y in zip(a, b))
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_ranks(folder: Path, arm: str, ranks: int, done: Any) -> list[dict[str, Any]]:
    """The worker's result files of ``arm`` (written only once its runs are done): judged by
    the files, not the exit status (FSDP2's processes may abort in their teardown)."""
    out = []
    for rank in range(ranks):
        path = folder / arm / f"rank{rank}.pt"
        assert path.exists(), f"{path} missing (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-5000:]}"
        out.append(torch.load(path, weights_only=False))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One plain process, gradient accumulation 2, every arm of :data:`RUN_ARMS`."""
    out = tmp_path_factory.mktemp("trl-one-process")
    start = time.perf_counter()
    done = run_single(WORKER, [str(out), ",".join(RUN_ARMS)], timeout=300)
    print(f"\none process ({', '.join(RUN_ARMS)}): {time.perf_counter() - start:.1f} s")
    return {arm: load_ranks(out, arm, 1, done)[0] for arm in RUN_ARMS}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``get(backend)``: the per-rank results of the backend's one launch (both arms, with
    the resume check under :data:`RESUMED`), launched at the first call."""
    cache: dict[str, Any] = {}

    def get(backend: str) -> Any:
        if backend not in cache:
            out = tmp_path_factory.mktemp(f"trl-{backend}")
            args = [str(out), ",".join(RUN_ARMS), *(["--resume"] if backend in RESUMED else [])]
            start = time.perf_counter()
            cache[backend] = (out, launch(backend, WORKER, args, processes=2, port=free_port(), timeout=420))
            print(f"\n{backend} launch ({', '.join(RUN_ARMS)}): {time.perf_counter() - start:.1f} s")
        return cache[backend]

    return get


def grad_norms(result: dict[str, Any]) -> list[tuple[float, float]]:
    """Per optimiser step, the actor's gradient norm (before clipping, as TRL logs it) and
    the critic's (``comppo/grad_norm_critic``)."""
    return [(e["grad_norm"], e["comppo/grad_norm_critic"]) for e in result["log"] if "grad_norm" in e]


def check_backend(backend: str, facts: dict[str, Any], standard: bool) -> None:
    """``facts`` (one process's) say that ``backend`` really ran, for the actor and, for a
    standard-critic arm, for the value model accelerate prepared."""
    assert (facts["distributed_type"], facts["num_processes"], facts["group"]) == (
        EXPECTED_TYPE[backend],
        2,
        "gloo",
    ), facts
    held = [facts["actor"], *([facts["critic"]] if standard else [])]
    if standard:
        assert facts["critic"] is not None, "the value model is not a model accelerate prepared"
    for which in held:
        if backend == "ddp":
            assert which["wrapper"] == "DistributedDataParallel", (which, facts)
        elif backend in ("zero2", "zero3"):
            stage = int(backend[-1])
            assert facts["zero_stage"] == stage, facts
            assert which["wrapper"] == "DeepSpeedEngine", (which, facts)
            # ZeRO-3 partitions every parameter; ZeRO-2 keeps them whole (it partitions the
            # gradients and the optimiser state)
            assert which["zero3_partitioned"] is (stage == 3), (which, facts)
            assert (which["local_numel"] < which["numel"]) is (stage == 3), (which, facts)
        else:  # fsdp2: every parameter a DTensor, this process holding about half
            assert which["dtensor"] and not which["zero3_partitioned"], (which, facts)
            assert which["local_numel"] < which["numel"], (which, facts)
    if backend in ("zero2", "zero3"):
        expected = "DeepSpeedZeroOptimizer_Stage3" if backend == "zero3" else "DeepSpeedZeroOptimizer"
        assert facts["zero_optimizer"] == expected, facts


@pytest.mark.parametrize("arm", [TAC_ARM, STANDARD_ARM])
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_sharded_processes_equal_one(backend: str, arm: str, reference: Any, sharded: Any) -> None:
    if arm not in ARM_CHOICES:
        pytest.skip(f"CompPOConfig does not accept arm={arm!r} yet (ARM_CHOICES: {', '.join(ARM_CHOICES)})")
    if backend.startswith("zero") and not HAS_DEEPSPEED:
        pytest.skip('deepspeed is not installed (pip install ".[deepspeed]")')
    one = reference[arm]
    out, done = sharded(backend)
    r0, r1 = load_ranks(out, arm, 2, done)
    standard = ARMS[arm].critic != "tac"
    for ran in (r0, r1):
        check_backend(backend, ran["facts"], standard)
    assert len(one["critic"]) == len(r0["critic"]) == len(r1["critic"]) == 2
    # every process holds the same actor and critic (the gathered parameters, for the sharded)
    assert max_diff(r0["actor"], r1["actor"]) == 0.0
    for a, b in zip(r0["critic"], r1["critic"]):
        assert max_diff(a, b) == 0.0
    # the gradients are reduced exactly once: Adam's update barely sees a constant factor on
    # them, the norms do (a mean taken twice would halve them)
    norms = [
        max(abs(x - y) / y for x, y in zip(mine, ref))
        for mine, ref in zip(grad_norms(r0), grad_norms(one), strict=True)
    ]
    assert len(norms) == 2 and max(norms) < 1e-4, (norms, grad_norms(r0), grad_norms(one))
    critic = [max_diff(a, b) for a, b in zip(one["critic"], r0["critic"])]
    actor = max_diff(one["actor"], r0["actor"])
    line = (
        f"{backend} {arm}: 2 processes vs 1: actor {actor:.2e}, critic per step "
        + ", ".join(f"{d:.2e}" for d in critic)
        + f", gradient norms (relative) {max(norms):.1e}"
    )
    if backend in RESUMED:
        resumed = r0["resumed"]
        assert len(resumed["critic"]) == 1  # it ran step 2 only, from checkpoint-1
        for ran in (r0, r1):
            check_backend(backend, ran["resumed"]["facts"], standard)
        again = (max_diff(r0["actor"], resumed["actor"]), max_diff(r0["critic"][-1], resumed["critic"][-1]))
        line += f"; resumed from step 1 vs uninterrupted: actor {again[0]:.2e}, critic {again[1]:.2e}"
    print(line)
    assert actor < 1e-5, line
    assert max(critic) < 1e-5, line
    if backend in RESUMED:
        assert max(again) < 1e-6, line
        assert max_diff(r1["resumed"]["actor"], resumed["actor"]) == 0.0
