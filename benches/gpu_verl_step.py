"""The verl recipe's PPO step against verl's own GAE + critic PPO, on one GPU, at the same batch.

Run (CUDA):  python benches/gpu_verl_step.py          (Qwen3-0.6B shape, bfloat16, random weights, vLLM rollouts)
Dry run:     python benches/gpu_verl_step.py --tiny   (CPU: everything up to the launch, tiny shapes)

Needs verl 0.9.x with its v1 trainer's dependencies (``pip install "comppo-core[verl]" "verl[vllm]"``:
``transfer_queue``, vLLM), a CUDA device and Ray's GPU resources. Nothing is downloaded.

**What runs.** In a working directory (printed; ``--workdir``) the bench writes

* a Qwen3-0.6B-shaped model with random weights in bfloat16 and a word-level tokenizer
  (``benches/trl_step.py``'s builders: 28 layers, hidden 1024, 16 heads / 8 KV heads of 128,
  MLP 3072, vocabulary 151936, tied embeddings; ids written in decimal are the words), with a
  chat template that is the user message's text, so a prompt of 256 words is 256 tokens;
* ``train.parquet`` in verl's RL dataset format (``RLHFDataset``): ``prompt`` as chat messages
  (one user message of 256 random ids), ``data_source``, ``ability``,
  ``reward_model.ground_truth``, ``extra_info.index``; 16 rows (2 steps of 8 prompts);
* ``reward.py``: verl's custom reward function (``reward.custom_reward_function.path`` /
  ``.name=compute_score``, called by verl's reward loop as ``compute_score(data_source=,
  solution_str=, ground_truth=, extra_info=)``): the share of even ids in the response;

then runs two jobs, one after the other, each a subprocess (its output in ``<job>.log``), with the
same batch and settings: 8 prompts x 4 responses (``rollout.n=4``) of 256 prompt and 256
response tokens (``ignore_eos``: every response has 256 tokens), 2 steps, one PPO epoch of one
mini-batch, vLLM rollouts (eager, ``gpu_memory_utilization=0.4``), FSDP2, no KL, no validation,
no checkpoint, ``trainer.logger=[console]``:

    comppo    python -m comppo_core.integrations.verl.main_ppo comppo.arm=comppo comppo.tac.width=256 ...
              (the recipe: the TAC in the actor's engine, gates from the old-log-prob pass, Comp-GAE)
    verl-gae  python -m verl.trainer.main_ppo algorithm.adv_estimator=gae critic.enable=true ...
              (verl's own PPO: its critic worker on a copy of the model, its GAE)

Both are verl's v1 synchronous trainer (``trainer.use_v1=true``; the recipe's mode ``comppo`` is a
subclass of verl's ``sync``). Each step, verl's console logger prints its timers (``timing_s/<name>``,
seconds): ``step`` (the whole step), ``gen`` (waiting for the rollouts), ``update_weights`` (the
actor's weights into vLLM), and the train part: ``old_log_prob``, ``ref``, ``values``, ``adv``,
``update_critic``, ``update_actor`` (those a job has). The table shows both jobs' timers at the last
step, the train part (the sum of those timers) and the ratios comppo / verl-gae of step 2 (step 1
warms up: vLLM's and the kernels' first calls); ``--steps N`` runs N steps and takes medians over
steps 2..N (2 steps: one observation per job, no interval, said so). No target is judged: the
issue names none for this pair; ``benches/gpu_train_step.py``'s target for the same comparison
outside verl (``comppo`` train step <= 0.70 x ``ppo``'s) is printed for reference.

The jobs share the time (``--timeout``, or ``benches/gpu_all.py``'s ``GPU_ALL_PART_TIMEOUT`` less
10 s): each gets an even share of what is left; a job past its share is killed with every process
it started (Ray's, vLLM's). Between the jobs the bench waits (up to 60 s, NVML) for the GPU's
memory to be released, so that the second job's vLLM finds what it asks for.

``--tiny`` (the CPU dry run, also done before a GPU launch): the files above at a tiny shape; both
jobs' Hydra configs composed exactly as they would be launched (the recipe's through its own
``main_ppo.prepare``, which validates the ``comppo`` block and applies what the arm implies;
verl's ``ppo_trainer`` as ``verl.trainer.main_ppo`` composes it), then what ``verl.trainer.main_ppo.main``
checks before Ray starts (``validate_config`` with ``need_reference_policy`` / ``need_critic``)
and the dataclasses verl's workers build (actor, model with its tokenizer, rollout, critic);
the train parquet read by verl's own ``create_rl_dataset`` with that tokenizer (every row kept, the
chat-templated prompt of the shape's length); the reward function loaded by verl's
``get_custom_reward_fn`` from the composed config and called on a sample (equal to the plain
reference below); the two command lines printed. The launch is reported ``skipped: no CUDA``.

Exit status: 0 when both jobs ran every step (the dry run: when everything up to the launch held);
1 when something failed; 3 (``SKIP``) when the bench cannot run here (no CUDA, verl, vLLM or
``transfer_queue``; the dry run needs only verl), with a line ``skipped: <reason>``.
``benches/gpu_all.py`` maps 3 to that reason, never to "passed".
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trl_step  # noqa: E402  (the model and tokenizer builders)

ROOT = Path(__file__).resolve().parents[1]

#: exit status: the bench cannot run here (the reason is printed as "skipped: ...")
SKIP = 3

#: the shapes: the GPU run's (trl_step's Qwen3-0.6B preset: 8 prompts x 4, 256 + 256 tokens) and the dry run's
SHAPES: dict[str, dict[str, Any]] = {
    "gpu": dict(trl_step.PRESETS["qwen3-0.6b"], steps=2),
    "tiny": dict(trl_step.PRESETS["tiny"], steps=2),
}

#: the jobs, in launch order
JOBS = ("comppo", "verl-gae")

#: verl's timers of the train part (``timing_s/<name>``; a job reports those it has)
TRAIN_TIMERS = ("old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")

#: for reference, not judged: benches/gpu_train_step.py's bound on comppo / ppo (standard critic), train step
REFERENCE_TRAIN_RATIO = 0.70

#: the template that makes a chat prompt the user message's text (no special tokens: 256 words are 256 tokens)
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

DATA_SOURCE = "comppo_bench/even_share"

REWARD_SOURCE = '''\
"""verl custom reward function (written by benches/gpu_verl_step.py): the share of even ids in the response."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    words = solution_str.split()
    ids = [int(w) for w in words if w.isdigit()]
    return sum(1 for i in ids if i % 2 == 0) / len(ids) if ids else 0.0
'''


def even_share(solution_str: str) -> float:
    """The reward's plain reference: even ids / ids among the response's words (0 without ids)."""
    ids = [int(w) for w in solution_str.split() if w.isdigit()]
    return sum(1 for i in ids if i % 2 == 0) / len(ids) if ids else 0.0


# --------------------------------------------------------------------------- #
# what it needs
# --------------------------------------------------------------------------- #


def found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cannot_run(tiny: bool) -> str:
    """Why the bench cannot run here ("skipped: ..."), or ""."""
    if not tiny:
        import torch

        if not torch.cuda.is_available():
            return "skipped: no CUDA (torch.cuda.is_available() is False; --tiny is the CPU dry run)"
    if not found("verl"):
        return "skipped: verl not installed (pip install 'comppo-core[verl]')"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import verl  # noqa: F401
    except Exception as exc:
        return f"skipped: verl not importable ({type(exc).__name__}: {exc})"
    if tiny:
        return ""
    if not found("vllm"):
        return "skipped: vllm not importable (the rollouts; pip install 'verl[vllm]')"
    if not found("transfer_queue"):
        return "skipped: transfer_queue not importable (verl's v1 trainer; pip install 'verl[verl-core]')"
    return ""


def launch_blockers() -> list[str]:
    """What the launch would lack here (for the dry run's last line)."""
    import torch

    out = [] if torch.cuda.is_available() else ["no CUDA"]
    out += [f"{m} not importable" for m in ("vllm", "transfer_queue") if not found(m)]
    return out


# --------------------------------------------------------------------------- #
# the files: model, tokenizer, data, reward
# --------------------------------------------------------------------------- #


def write_inputs(shape: dict[str, Any], workdir: Path, bf16: bool, seed: int) -> dict[str, Path]:
    """The model (+ tokenizer), the train parquet and the reward file under ``workdir``; their paths."""
    import pandas as pd
    import torch

    model_dir = workdir / "model"
    model = trl_step.build_model(shape, seed)
    n_params = sum(p.numel() for p in model.parameters())
    if bf16:
        model = model.to(dtype=torch.bfloat16)  # what the FSDP workers and vLLM load
    model.save_pretrained(model_dir)
    tokenizer = trl_step.build_tokenizer(shape["vocab"])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)

    rows = shape["prompts"] * shape["steps"]
    texts = trl_step.prompts(shape, rows, seed)
    frame = pd.DataFrame(
        {
            "data_source": [DATA_SOURCE] * rows,
            "prompt": [[{"role": "user", "content": text}] for text in texts],
            "ability": ["bench"] * rows,
            "reward_model": [{"style": "rule", "ground_truth": "even"} for _ in range(rows)],
            "extra_info": [{"split": "train", "index": i} for i in range(rows)],
        }
    )
    data = workdir / "train.parquet"
    frame.to_parquet(data)
    reward = workdir / "reward.py"
    reward.write_text(REWARD_SOURCE)
    print(
        f"model: {shape['arch']}, {shape['layers']} layers, hidden {shape['hidden']}, vocabulary {shape['vocab']}, "
        f"{n_params:,} parameters, {'bfloat16' if bf16 else 'float32'}, random weights; data: {rows} rows",
        flush=True,
    )
    return {"model": model_dir, "data": data, "reward": reward, "workdir": workdir}


# --------------------------------------------------------------------------- #
# the two jobs' command lines
# --------------------------------------------------------------------------- #


def common_overrides(shape: dict[str, Any], paths: dict[str, Path], job: str, tiny: bool) -> list[str]:
    """The settings both jobs share (the same batch, rollout and trainer)."""
    batch = shape["prompts"]
    return [
        f"data.train_files={paths['data']}",
        f"data.val_files={paths['data']}",
        f"data.train_batch_size={batch}",
        f"data.max_prompt_length={shape['prompt_tokens']}",
        f"data.max_response_length={shape['completion_tokens']}",
        "data.shuffle=false",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={paths['model']}",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={batch}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={shape['group']}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.ignore_eos=true",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={2 * batch}",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        "algorithm.use_kl_in_reward=false",
        f"reward.custom_reward_function.path={paths['reward']}",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=2",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_epochs=1",
        f"trainer.total_training_steps={shape['steps']}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[console]",
        "trainer.project_name=comppo-bench",
        f"trainer.experiment_name=gpu-verl-step-{job}",
        f"trainer.default_local_dir={paths['workdir'] / ('checkpoints-' + job)}",
    ]


def job_overrides(shape: dict[str, Any], paths: dict[str, Path], job: str, tiny: bool) -> list[str]:
    """One job's Hydra overrides: the shared ones and the job's own."""
    own = {
        # the recipe (examples/verl/run_comppo.sh's TAC width); adv_estimator and critic.enable follow the arm
        "comppo": ["comppo.arm=comppo", "comppo.tac.width=16" if tiny else "comppo.tac.width=256"],
        # verl's own PPO: GAE and its critic worker on a copy of the model
        "verl-gae": [
            "algorithm.adv_estimator=gae",
            "critic.enable=true",
            f"critic.model.path={paths['model']}",
            "critic.model.use_remove_padding=true",
            "critic.strategy=fsdp2",
            "critic.optim.lr=1e-5",
            f"critic.ppo_micro_batch_size_per_gpu={shape['prompts']}",
        ],
    }[job]
    return [*own, *common_overrides(shape, paths, job, tiny)]


def command(job: str, overrides: list[str]) -> list[str]:
    module = {"comppo": "comppo_core.integrations.verl.main_ppo", "verl-gae": "verl.trainer.main_ppo"}[job]
    return [sys.executable, "-m", module, *overrides]


# --------------------------------------------------------------------------- #
# the dry run: compose and validate as the launch would
# --------------------------------------------------------------------------- #


def compose(job: str, overrides: list[str]) -> Any:
    """The job's config as its ``main`` receives it (the recipe's: after ``main_ppo.prepare``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir, initialize_config_module

    if job == "comppo":
        from comppo_core.integrations.verl import main_ppo

        with initialize_config_dir(config_dir=main_ppo.CONFIG_DIR, version_base=None):
            cfg = hydra_compose(config_name=main_ppo.CONFIG_NAME, overrides=overrides)
        main_ppo.prepare(cfg)  # the comppo block validated, the verl settings its arm implies applied
        return cfg
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def validate(job: str, cfg: Any, shape: dict[str, Any]) -> list[str]:
    """What ``verl.trainer.main_ppo.main`` checks before Ray starts, the dataclasses verl's workers build,
    the data through verl's dataset, and the reward through verl's loader; the facts, one line each."""
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.trainer.ppo.utils import create_rl_dataset, need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config
    from verl.utils.tokenizer import normalize_token_ids

    critic = need_critic(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=critic)
    expected = {"comppo": (False, "comppo"), "verl-gae": (True, "sync")}[job]
    got = (critic, cfg.trainer.v1.trainer_mode)
    if got != expected or cfg.algorithm.adv_estimator != "gae" or not cfg.trainer.use_v1:
        raise AssertionError(
            f"{job}: critic worker, trainer mode = {got}, expected {expected}; adv_estimator "
            f"{cfg.algorithm.adv_estimator!r} (expected 'gae'); use_v1 {cfg.trainer.use_v1}"
        )
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    model = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    if critic:
        omega_conf_to_dataclass(cfg.critic)
    facts = [
        f"verl's validate_config passed; trainer v1 mode {got[1]!r}, adv_estimator 'gae', "
        f"critic worker {'yes' if critic else 'no'}"
        + (f", comppo.arm={cfg.comppo.arm} (TAC width {cfg.comppo.tac.width})" if job == "comppo" else "")
    ]

    tokenizer = model.tokenizer
    dataset = create_rl_dataset(cfg.data.train_files, cfg.data, tokenizer, None, is_train=True)
    rows = shape["prompts"] * shape["steps"]
    lengths = set()
    for i in range(len(dataset)):
        item = dataset[i]
        ids = tokenizer.apply_chat_template(item["raw_prompt"], add_generation_prompt=True, tokenize=True)
        lengths.add(len(normalize_token_ids(ids)))
    if len(dataset) != rows or lengths != {shape["prompt_tokens"]}:
        raise AssertionError(
            f"{job}: verl's dataset has {len(dataset)} rows (expected {rows}) of prompt lengths {sorted(lengths)} "
            f"(expected {shape['prompt_tokens']})"
        )
    facts.append(
        f"verl's create_rl_dataset: {len(dataset)} rows, chat-templated prompts of {shape['prompt_tokens']} tokens"
    )

    reward_fn = get_custom_reward_fn(cfg)
    if reward_fn is None:
        raise AssertionError(f"{job}: verl's get_custom_reward_fn found no reward function in the config")
    sample = "4 7 10 12 13"
    score = reward_fn(data_source=DATA_SOURCE, solution_str=sample, ground_truth="even", extra_info={"index": 0})
    if abs(float(score) - even_share(sample)) > 1e-12:
        raise AssertionError(f"{job}: the reward on {sample!r} is {score}, its reference {even_share(sample)}")
    facts.append(
        f"verl's get_custom_reward_fn: compute_score({sample!r}) = {score:g} (reference {even_share(sample):g})"
    )
    return facts


# --------------------------------------------------------------------------- #
# the launch
# --------------------------------------------------------------------------- #

METRIC = re.compile(r"^([^:]+):(?:np\.\w+\()?(-?[0-9.]+(?:[eE][-+]?[0-9]+)?|nan|inf)\)?$")


def parse_steps(text: str) -> dict[int, dict[str, float]]:
    """verl's console logger lines (``step:N - key:value - ...``, also behind Ray's ``(Actor pid=...)``
    prefix) as ``{step: {key: value}}``."""
    steps: dict[int, dict[str, float]] = {}
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # Ray's coloured prefixes
    for m in re.finditer(r"(?:^|\) )step:(\d+) - (.*)$", text, re.M):
        values = steps.setdefault(int(m.group(1)), {})
        for item in m.group(2).split(" - "):
            kv = METRIC.match(item.strip())
            if kv:
                values[kv.group(1)] = float(kv.group(2))
    return steps


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """The job and everything it started (Ray's processes, vLLM's), children first."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - Ray brings psutil
        proc.kill()
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        parent = psutil.Process(proc.pid)
        for child in parent.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        parent.kill()


def run_job(job: str, argv: list[str], timeout: float, log: Path) -> tuple[str, dict[int, dict[str, float]], float]:
    """Runs one job (its output in ``log``); ``(status, steps, seconds)``."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "RAY_COLOR_PREFIX": "0",  # plain "(TaskRunnerV1 pid=...) step:N - ..." lines
        "RAY_DEDUP_LOGS": "0",
    }
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        fh.write(("$ " + shlex.join(argv) + "\n").encode())
        fh.flush()
        # the bench's own process group: benches/gpu_all.py's timeout kills the job with the bench
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
            status = "ran" if rc == 0 else f"FAILED (exit {rc})"
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            proc.wait()
            status = f"TIMEOUT after {timeout:.0f} s"
    seconds = time.monotonic() - t0
    return status, parse_steps(log.read_text(errors="replace")), seconds


def wait_for_gpu_memory(limit: float = 60.0) -> str:
    """After a job: wait (at most ``limit`` s) until the GPU's used memory is under 10 % of it, so
    that the next job's vLLM finds the memory it asks for (a finished job's Ray and vLLM processes
    may take a moment to exit). Reads NVML (``nvidia-ml-py``, which vLLM brings); what it saw."""
    try:
        import pynvml
    except ImportError:
        time.sleep(5.0)
        return "NVML not importable: waited 5 s"
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        t0 = time.monotonic()
        while True:
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            if info.used < 0.1 * info.total or time.monotonic() - t0 > limit:
                return f"GPU memory in use {info.used / 2**30:.1f} GiB after {time.monotonic() - t0:.1f} s"
            time.sleep(1.0)
    finally:
        pynvml.nvmlShutdown()


def train_seconds(values: dict[str, float]) -> float:
    return sum(values.get(f"timing_s/{name}", 0.0) for name in TRAIN_TIMERS)


def report(results: dict[str, tuple[str, dict[int, dict[str, float]], float]], steps: int) -> bool:
    """The table (each job's last step, its earlier steps' totals), then the ratios comppo / verl-gae of
    the medians over steps 2..``steps`` (step 1 warms up); whether both jobs logged every step."""
    timers = ("step", "gen", "update_weights", *TRAIN_TIMERS)
    print(f"\nverl timers at step {steps} (seconds; step 1 warms up):")
    print(f"{'job':<10} {'status':<22} {'wall':>7} " + " ".join(f"{t:>14}" for t in (*timers, "train")))
    complete = True
    for job in JOBS:
        status, parsed, seconds = results[job]
        last = parsed.get(steps, {})
        logged = all("timing_s/step" in parsed.get(s, {}) for s in range(1, steps + 1))
        complete = complete and status == "ran" and logged
        cells = [f"{last[f'timing_s/{t}']:14.2f}" if f"timing_s/{t}" in last else f"{'-':>14}" for t in timers]
        cells.append(f"{train_seconds(last):14.2f}" if last else f"{'-':>14}")
        print(f"{job:<10} {status:<22} {seconds:7.1f} " + " ".join(cells))
        for s in sorted(parsed):
            if s != steps and "timing_s/step" in parsed[s]:
                print(
                    f"{'':<10} step {s}: step {parsed[s]['timing_s/step']:.2f} s, train {train_seconds(parsed[s]):.2f} s"
                )
    if not complete:
        print(f"\nnot both jobs logged {steps} steps: no ratio (the jobs' logs are named above)")
        return False
    measured = range(2, steps + 1) if steps > 1 else range(1, 2)
    step_s = {job: statistics.median(results[job][1][s]["timing_s/step"] for s in measured) for job in JOBS}
    train_s = {job: statistics.median(train_seconds(results[job][1][s]) for s in measured) for job in JOBS}
    which = f"step {measured[0]}" if len(measured) == 1 else f"median of steps {measured[0]}-{measured[-1]}"
    a, b = JOBS
    print(
        f"\nverl step time ({which}): comppo {step_s[a]:.3f} s, verl-gae {step_s[b]:.3f} s, "
        f"ratio {step_s[a] / step_s[b]:.3f}"
    )
    print(
        f"verl train time ({which}, no generation): comppo {train_s[a]:.3f} s, verl-gae {train_s[b]:.3f} s, "
        f"ratio {train_s[a] / train_s[b]:.3f}"
    )
    if len(measured) == 1:
        print("(one measured step per job: a single observation, no interval; --steps N for more)")
    print(
        f"(no target for this pair; for reference, not judged: benches/gpu_train_step.py's bound on comppo / ppo "
        f"train step outside verl is <= {REFERENCE_TRAIN_RATIO})"
    )
    return True


# --------------------------------------------------------------------------- #
# main
# --------------------------------------------------------------------------- #


def default_timeout() -> float:
    """benches/gpu_all.py's time for this part (``GPU_ALL_PART_TIMEOUT``) less a margin, else 540 s."""
    given = os.environ.get("GPU_ALL_PART_TIMEOUT")
    return max(30.0, float(given) - 10.0) if given else 540.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the CPU dry run: everything up to the launch, tiny shapes")
    ap.add_argument("--timeout", type=float, default=None, help="seconds for both jobs (default: gpu_all's, or 540)")
    ap.add_argument("--workdir", default=None, help="where the files and the jobs' logs go (default: a new temp dir)")
    ap.add_argument("--keep-model", action="store_true", help="keep the saved model after the run")
    ap.add_argument("--steps", type=int, default=2, help="training steps per job (default 2; step 1 warms up)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t_start = time.monotonic()
    timeout = a.timeout if a.timeout is not None else default_timeout()

    why = cannot_run(a.tiny)
    if why:
        print(why, flush=True)
        return SKIP

    if a.steps < 1:
        ap.error(f"--steps: expected an integer >= 1, got {a.steps}")
    if a.workdir and Path(a.workdir).exists() and any(Path(a.workdir).iterdir()):
        ap.error(f"--workdir: {a.workdir} is not empty (the bench writes a model, data and logs there); name a new one")
    shape = dict(SHAPES["tiny" if a.tiny else "gpu"], steps=a.steps)
    workdir = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="gpu_verl_step-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return run(a, shape, workdir, timeout, t_start)
    finally:
        if a.tiny and not a.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not a.keep_model:
            shutil.rmtree(workdir / "model", ignore_errors=True)


def run(a: argparse.Namespace, shape: dict[str, Any], workdir: Path, timeout: float, t_start: float) -> int:
    """Everything after the checks of :func:`main`: the files, the configs, the launch (not in the dry run)."""
    mode = "dry run on CPU (--tiny)" if a.tiny else "GPU"
    print(
        f"gpu_verl_step: {mode}; {shape['prompts']} prompts x {shape['group']} of {shape['prompt_tokens']} prompt + "
        f"{shape['completion_tokens']} response tokens, {shape['steps']} steps; workdir {workdir}",
        flush=True,
    )
    paths = write_inputs(shape, workdir, bf16=not a.tiny, seed=a.seed)

    argvs: dict[str, list[str]] = {}
    for job in JOBS:
        overrides = job_overrides(shape, paths, job, a.tiny)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = compose(job, overrides)
            facts = validate(job, cfg, shape)
        print(f"\n{job}: config composed and validated as launched")
        for fact in facts:
            print(f"  {fact}")
        argvs[job] = command(job, overrides)
        print(f"  $ {shlex.join(argvs[job])}")

    if a.tiny:
        blockers = launch_blockers()
        print(f"\ndry run: {len(JOBS)} configs composed and validated; the reward and the data checked")
        also = [b for b in blockers if b != "no CUDA"]
        print(
            f"launch: skipped: no CUDA (the dry run launches nothing{'; here also ' + ', '.join(also) if also else ''})"
        )
        return 0

    results = {}
    for i, job in enumerate(JOBS):
        left = timeout - (time.monotonic() - t_start)
        share = left / (len(JOBS) - i)  # an even share of what is left; a job that ends early leaves the rest
        log = workdir / f"{job}.log"
        print(f"\n{job}: launching ({share:.0f} s at most; log {log})", flush=True)
        results[job] = run_job(job, argvs[job], share, log)
        status, parsed, seconds = results[job]
        print(f"{job}: {status} in {seconds:.1f} s; steps logged: {sorted(parsed)}", flush=True)
        if status != "ran":
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print(f"--- {job}: last lines of {log}\n" + "\n".join(tail))
        if i + 1 < len(JOBS):
            print(f"{job}: {wait_for_gpu_memory()}", flush=True)
    return 0 if report(results, shape["steps"]) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
