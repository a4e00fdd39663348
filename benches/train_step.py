"""The arms' PPO step side by side (every arm but the diagnostic oracle): time by phase and peak memory, one model, one batch.

Run:  python benches/train_step.py                   (CPU: the built-in task and policy; about a minute)
      python benches/train_step.py --rounds 2 --sft-steps 0    (a quicker look)
      python benches/gpu_train_step.py               (CUDA: a Qwen3-0.6B shape in bfloat16, and the targets)

**What runs.** One :class:`comppo_core.rl.Trainer` per arm, every setting the
:class:`~comppo_core.rl.TrainConfig` default but ``arm`` (``--preset cpu``: the built-in
addition task and its tiny Llama; ``--preset qwen3-0.6b`` / ``tiny``: a Qwen3-shaped model
with random weights on a synthetic task of fixed-length random prompts, see
:class:`SyntheticTask`). The phases are the trainer's own methods, each timed alone
(CUDA: synchronised before and after)::

    rollout      trainer.rollout(step)                 generate G samples per prompt and score them
    score        trainer.score(rollout, step)          the scoring pass (old log-probs, gates, values, reference)
    advantages   trainer.compute_advantages(...)       the package's kernels (cc.gae / group_advantages, whitening)
    update       trainer.update(batch, step)           ppo_epochs x num_minibatches optimiser steps

``step`` is their sum and ``train step`` the sum without the rollout (the same generate
call in every arm).

**One model, one batch.** Every arm gets a copy of the same policy (``--preset cpu``: the
built-in policy after its SFT warm start, ``--sft-steps`` of it, so responses have their
trained length). One rollout, drawn once before the rounds, is the batch every arm scores,
turns into advantages and updates on in every round; each arm's ``rollout`` phase still
draws its own (discarded) batch, so it is timed as training runs it.

**Rounds.** A warm-up round, then ``--rounds`` rounds; in each the arms run in turn, the
order rotated by one each round. Times are medians over rounds; a ratio is the median of
the per-round ratios (each arm to ``grpo`` in the same round; ``comppo`` to ``ppo``).
On CPU torch runs one thread unless ``--threads`` says otherwise: for models this small
more threads only add overhead, and on a shared machine they fight other processes.

**Peak memory** of a step, as if the arm were alone on the device: its resident state
(the parameters of actor, reference and critic, their gradients and the optimiser states,
each storage counted once) plus the step's peak above what was allocated when it began
(CPU: torch.profiler's allocation trace; CUDA: ``max_memory_allocated``), measured in one
more step per arm after the timing rounds (the profiler slows what it watches).
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

try:
    import numpy as np
    import torch

    from comppo_core import rl
    from comppo_core.hf._memory import peak_memory
    from comppo_core.rl.core import step
    from comppo_core.rl.engine import build
    from comppo_core.rl.tasks.addition import Problem
except ImportError as exc:  # pragma: no cover
    sys.exit(f"benches/train_step.py needs the [rl] extra (torch, transformers, tqdm, matplotlib): {exc}")

ARMS = tuple(name for name, arm in rl.ARMS.items() if not arm.diagnostic)
PHASES = ("rollout", "score", "advantages", "update")

#: Qwen3-shaped presets (random weights, synthetic task): model and batch.
PRESETS: dict[str, dict[str, int]] = {
    # Qwen3-0.6B: 28 layers, hidden 1024, 16 heads / 8 KV heads of 128, MLP 3072, tied embeddings
    "qwen3-0.6b": dict(
        hidden=1024,
        layers=28,
        heads=16,
        kv_heads=8,
        head_dim=128,
        intermediate=3072,
        vocab=151936,
        prompts=8,
        group=4,
        prompt_tokens=256,
        response_tokens=256,
    ),
    # the dry run: the same code on a model small enough for a CPU
    "tiny": dict(
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=192,
        vocab=512,
        prompts=2,
        group=2,
        prompt_tokens=16,
        response_tokens=16,
    ),
}


# --------------------------------------------------------------------------- #
# a synthetic task for models with a real vocabulary
# --------------------------------------------------------------------------- #


class SyntheticTokenizer:
    """Token ids written as text: ``"17 4 9"`` ↔ ``[17, 4, 9]``; the last two ids of the
    vocabulary are pad and EOS, there is no BOS (as in Qwen)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.pad_token_id = vocab_size - 2
        self.eos_token_id = vocab_size - 1
        self.bos_token_id = None

    def encode_prompt(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        return self.encode_prompt(text) + ([self.eos_token_id] if add_eos else [])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        special = (self.pad_token_id, self.eos_token_id)
        return " ".join(str(int(i)) for i in ids if not (skip_special_tokens and int(i) in special))

    def to_dict(self) -> dict[str, Any]:
        return {"type": "synthetic", "vocab_size": self.vocab_size}


class SyntheticTask:
    """Prompts of ``prompt_tokens`` uniform random ids; a response scores 1 when the
    blake2b hash of its text is odd (a fixed coin per response, so groups have spread)."""

    name = "synthetic"

    def __init__(self, vocab_size: int, prompt_tokens: int, response_tokens: int) -> None:
        self.tokenizer = SyntheticTokenizer(vocab_size)
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = response_tokens

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        ids = rng.integers(0, self.tokenizer.vocab_size - 2, size=(n, self.prompt_tokens))
        return [Problem(" ".join(map(str, row)), "", "") for row in ids.tolist()]

    def heldout(self, n: int, seed: int = 0) -> list[Problem]:
        return self.sample(np.random.default_rng([seed, 7]), n)

    def reward(self, problem: Problem, response: str, finished: bool) -> float:
        return float(hashlib.blake2b(response.encode(), digest_size=8).digest()[0] % 2)

    def rewards(self, problems: Sequence[Problem], responses: Sequence[str], finished: Sequence[bool]) -> list[float]:
        return [self.reward(p, r, f) for p, r, f in zip(problems, responses, finished)]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "prompt_tokens": self.prompt_tokens, "response_tokens": self.max_new_tokens}


def qwen3(p: dict[str, int], dtype: torch.dtype, device: str, seed: int = 0) -> Any:
    """A Qwen3 causal LM of preset ``p`` with random weights, built on ``device``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=p["vocab"],
        hidden_size=p["hidden"],
        intermediate_size=p["intermediate"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        head_dim=p["head_dim"],
        max_position_embeddings=max(4096, p["prompt_tokens"] + p["response_tokens"]),
        tie_word_embeddings=True,
        pad_token_id=p["vocab"] - 2,
        eos_token_id=p["vocab"] - 1,
        bos_token_id=None,
    )
    with torch.device(device):
        model: Any = Qwen3ForCausalLM(cfg)
    return model.to(dtype=dtype).eval()


# --------------------------------------------------------------------------- #
# trainers on one model
# --------------------------------------------------------------------------- #


def install(trainer: rl.Trainer, actor: Any, task: Any = None) -> None:
    """Give ``trainer`` the policy ``actor`` (and ``task``): a fresh reference, critic and
    optimisers for it, built by ``rl.build`` and the trainer's own ``_attach_actor`` in the
    order its constructor uses (the critic from the seed the constructor gives it). The
    trainer has no public way to take a model object, and the Qwen3 preset needs one in
    bfloat16."""
    if task is not None:
        trainer.task, trainer.tokenizer = task, task.tokenizer
        trainer.max_new_tokens = task.max_new_tokens
        trainer.loss_settings = step.LossSettings.from_config(trainer.config, trainer.max_new_tokens)
    trainer.reference = build.make_reference(actor) if trainer._keeps_reference_copy() else None
    torch.manual_seed(trainer.config.seed * 1000 + 1)
    trainer.critic = build.make_critic(trainer.arm, actor, trainer.config)
    trainer._attach_actor(actor, None)


def trainers_on_one_model(a: argparse.Namespace) -> tuple[dict[str, rl.Trainer], str]:
    """One trainer per arm, each with a copy of the same policy; and a description."""
    # one CPU thread unless told: for models this small more only add overhead (and on a shared
    # machine they fight other processes for the cores)
    threads = a.threads if a.threads is not None else (1 if a.device == "cpu" else None)
    base_cfg = rl.TrainConfig(  # one step each, no critic warm-up rounds (they are steps without the actor)
        device=a.device, progress=False, eval_every=0, save_every=0, seed=a.seed, num_threads=threads, critic_warmup=0
    )
    if a.preset == "cpu":
        sft = base_cfg.warmup_sft_steps if a.sft_steps is None else a.sft_steps
        warm = rl.Trainer(base_cfg.replace(arm="grpo", warmup_sft_steps=sft))
        policy, task = warm.actor, None
        what = (
            f"built-in task (addition, {base_cfg.digits} digits) and Llama policy after {sft} SFT steps, "
            f"{sum(x.numel() for x in policy.parameters())} parameters, float32 on {a.device}"
        )
        cfg = base_cfg
    else:
        p = PRESETS[a.preset]
        dtype = getattr(torch, a.dtype)
        policy = qwen3(p, dtype, a.device, a.seed)
        task = SyntheticTask(p["vocab"], p["prompt_tokens"], p["response_tokens"])
        n = sum(x.numel() for x in policy.parameters())
        what = (
            f"Qwen3 {p['layers']} layers, hidden {p['hidden']}, heads {p['heads']}/{p['kv_heads']}x{p['head_dim']}, "
            f"vocab {p['vocab']}: {n / 1e6:.1f}M parameters, random weights, {a.dtype} on {a.device}; "
            f"synthetic task: prompt {p['prompt_tokens']} tokens, response {p['response_tokens']} tokens"
        )
        cfg = base_cfg.replace(prompts_per_step=p["prompts"], group_size=p["group"])
    trainers = {}
    for arm in ARMS:
        t = rl.Trainer(cfg.replace(arm=arm, warmup_sft_steps=0))
        install(t, copy.deepcopy(policy), task)
        trainers[arm] = t
    c = trainers["comppo"].config
    what += (
        f"\nbatch: {c.prompts_per_step} prompts x {c.group_size} samples; ppo_epochs {c.ppo_epochs}, "
        f"{c.num_minibatches} minibatches; TrainConfig defaults otherwise"
    )
    return trainers, what


# --------------------------------------------------------------------------- #
# measurement
# --------------------------------------------------------------------------- #


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_step(
    trainer: rl.Trainer, fixed: Any, step: int, device: str, clock: Callable[[], float] = time.perf_counter
) -> dict[str, float]:
    """One step of ``trainer`` on the batch ``fixed``, its phases timed (seconds)."""
    out: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        sync(device)
        t0 = clock()
        result = fn()
        sync(device)
        out[name] = clock() - t0
        return result

    timed("rollout", lambda: trainer.rollout(step))
    batch = timed("score", lambda: trainer.score(fixed, step))
    timed("advantages", lambda: trainer.compute_advantages(fixed, batch))
    timed("update", lambda: trainer.update(batch, step))
    return out


def resident_bytes(trainer: rl.Trainer) -> int:
    """Bytes of the arm's standing state: parameters and gradients of actor, reference and
    critic, and both optimisers' states (each storage once: tied weights count once)."""
    seen: dict[tuple[str, int], int] = {}

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            seen[(str(t.device), s.data_ptr())] = s.nbytes()

    for module in (trainer.actor, trainer.reference, trainer.critic):
        if module is not None:
            for prm in module.parameters():
                add(prm)
                add(prm.grad)
    for opt in (trainer.actor_opt, trainer.critic_opt):
        if opt is not None:
            for state in opt.state.values():
                for v in state.values():
                    add(v)
    return sum(seen.values())


def measure(a: argparse.Namespace) -> dict[str, Any]:
    """Prints the table; returns ``{"ms": {arm: {phase: ms}}, "ratio": {...}, "peak": {arm: bytes}}``."""
    trainers, what = trainers_on_one_model(a)
    print(what)
    n_critic = {
        arm: 0 if t.critic is None else sum(x.numel() for x in t.critic.parameters()) for arm, t in trainers.items()
    }
    fixed = trainers["grpo"].rollout(0)
    m = fixed.response_mask
    print(
        f"the batch: {m.shape[0]} sequences of {fixed.input_ids.shape[1]} tokens, "
        f"{float(m.sum(-1).double().mean()):.1f} response tokens on average, reward mean {float(fixed.rewards.mean()):.3f}"
    )
    times: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    order = list(ARMS)
    for rnd in range(a.rounds + 1):  # round 0 warms up (allocator, kernels, optimiser states)
        for arm in order:
            phases = run_step(trainers[arm], fixed, rnd, a.device)
            if rnd:
                times[arm].append(phases)
        order = order[1:] + order[:1]
    peaks: dict[str, int] = {}
    for arm in ARMS:
        one_step = functools.partial(run_step, trainers[arm], fixed, a.rounds + 1, a.device)
        peaks[arm] = resident_bytes(trainers[arm]) + peak_memory(one_step, a.device)

    def total(ph: dict[str, float], with_rollout: bool = True) -> float:
        return sum(v for k, v in ph.items() if with_rollout or k != "rollout")

    def ratio(x: str, y: str, with_rollout: bool) -> float:
        return statistics.median(total(p, with_rollout) / total(q, with_rollout) for p, q in zip(times[x], times[y]))

    ms = {arm: {ph: 1e3 * statistics.median(r[ph] for r in times[arm]) for ph in PHASES} for arm in ARMS}
    result: dict[str, Any] = {"ms": ms, "peak": peaks, "ratio": {}}
    for arm in ARMS:
        result["ratio"][arm] = {
            "step": ratio(arm, "grpo", True),
            "train": ratio(arm, "grpo", False),
            "peak": peaks[arm] / peaks["grpo"],
        }
    print(
        f"\n{a.rounds} rounds after a warm-up; times in ms (medians over rounds), ratios to grpo (medians of per-round ratios)\n"
    )
    print(
        "| arm | critic params | rollout | score | advantages | update | step | × grpo | train step | × grpo "
        "| advantages % of train step | peak MiB | × grpo |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for arm in ARMS:
        t_ms, r = ms[arm], result["ratio"][arm]
        step, train = sum(t_ms.values()), sum(v for k, v in t_ms.items() if k != "rollout")
        print(
            f"| {arm} | {n_critic[arm]:,} | {t_ms['rollout']:.1f} | {t_ms['score']:.1f} | {t_ms['advantages']:.2f} "
            f"| {t_ms['update']:.1f} | {step:.1f} | {r['step']:.3f} | {train:.1f} | {r['train']:.3f} "
            f"| {100 * t_ms['advantages'] / train:.2f} "
            f"| {peaks[arm] / 2**20:.1f} | {r['peak']:.3f} |"
        )
    cp = {
        "step": ratio("comppo", "ppo", True),
        "train": ratio("comppo", "ppo", False),
        "peak": peaks["comppo"] / peaks["ppo"],
    }
    result["comppo_vs_ppo"] = cp
    print(f"\ncomppo / ppo: step {cp['step']:.3f}, train step {cp['train']:.3f}, peak memory {cp['peak']:.3f}")
    print(
        "(step = rollout + score + advantages + update; train step = without the rollout, the same generate in "
        "every arm; peak = resident state + the step's transient peak)"
    )
    return result


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument(
        "--preset",
        choices=("cpu", *PRESETS),
        default="cpu",
        help="cpu: the built-in task and policy; qwen3-0.6b / tiny: a Qwen3 shape on a synthetic task",
    )
    ap.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="Qwen3 presets: the model's dtype"
    )
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds after the warm-up round")
    ap.add_argument(
        "--sft-steps",
        type=int,
        default=None,
        help="--preset cpu: SFT steps of the shared policy (default: TrainConfig's)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: 1 on CPU, torch's otherwise)"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.rounds < 1:
        sys.exit("--rounds: expected an integer >= 1")
    measure(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
