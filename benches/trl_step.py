"""``CompPOTrainer``'s step against ``GRPOTrainer``'s, by phase: one model, one data set.

Run:  python benches/trl_step.py                 (CPU, an 8M-parameter Llama; a few minutes on one core)
      python benches/trl_step.py --quick         (a smaller batch and 2 rounds: a quick look)
      python benches/trl_step.py --backends ddp,zero3,fsdp2 --quick
                                                 (CPU: ZeRO-3 and FSDP2 against DDP, 2 processes each)
      python benches/gpu_trl_step.py             (CUDA: a Qwen3-0.6B shape in bfloat16, and the targets)

**What runs.** Trainers, each in its own process, driven by TRL's own ``train()``:
``trl.GRPOTrainer`` with ``trl.GRPOConfig`` (the real one, not ``CompPOTrainer(arm="grpo")``,
which is the same code), ``CompPOTrainer`` with ``CompPOConfig(arm="comppo")`` (``--arm``
picks another TAC arm) and ``CompPOTrainer`` with the standard-critic arm ``comp_gae``
(``--critic-arm``; ``none`` leaves it out; a ``CompPOConfig`` that does not accept the arm
yet is reported and the arm skipped). All get every TRL setting the same (TRL's defaults
but those named in the output: one optimiser step per generation, ``num_iterations=1``, no
KL, float32 on CPU, no critic warm-up where ``CompPOConfig`` has one: the step is what is
timed), the same model (built once from a config with random weights, saved, loaded by
each process) and the same prompts in the same order (the same seed). Generation is TRL's
(Hugging Face ``generate``, or vLLM colocate on a GPU) with ``min_new_tokens`` equal to
``max_completion_length``, so every completion has the same length in every arm.

**Phases**, timed by wrapping the trainer's own methods in the bench (nothing in the
package is changed; CUDA is synchronised at each edge)::

    generate   GRPOTrainer._generate: prompt tokenisation, generation, decoding
    score      the rest of _prepare_inputs: rewards, then GRPO's group advantages (TRL skips
               the old log-probs forward when on-policy), or the arm's scoring forward
               (log-probs, concentration gates, critic values), Comp-GAE and whitening
    loss       Trainer.compute_loss: the policy forward and the loss (CompPO: + the critic's)
    backward   the rest of the step: backward, clipping, optimiser step(s) (CompPO: + the critic's)

``step`` is one optimiser step, from the trainer's ``on_step_begin`` to its ``on_step_end``
callback (the sum of the phases); ``train step`` is the step without ``generate``.

**Rounds.** The processes take turns: in each round each runs one step while the others
wait (the order rotates round by round); round 0 warms up and is not counted, then
``--rounds`` rounds. Times are medians over rounds; a ratio is the median of the
per-round ratios ``arm / grpo`` (and TAC arm / standard-critic arm). Torch runs one
thread per process on CPU.

**Backends** (``--backends ddp,zero3,fsdp2``, CPU): for the TAC arm and the standard-critic
arm in turn, one ``accelerate launch`` job per backend, each of ``--processes`` (2) gloo
processes, launched with the configs of ``tests/trl_backends.py`` (DeepSpeed ZeRO-3 over
its CPU accelerator: ``DS_BUILD_OPS=0 pip install deepspeed ninja``; FSDP2 made real on
CPU by ``trl_backends.use_fsdp_on_cpu``). The jobs take turns step by step as above, on
the same global batch (each process gets its share); each job's step is the slowest
process's. Every process reports ``trl_backends.backend_facts`` after its first step (the
warm-up round, when the policy and a value model are both prepared), and a job whose
backend did not really run gets no figure and the bench fails (accelerate's
``distributed_type``, DDP around the policy; DeepSpeed's ZeRO stage 3 and partitioned
parameters; DTensor parameters for FSDP2; the value model's too), so a silent fallback
to DDP cannot pass for a figure. Printed:
each backend's phases and the median ratio to DDP of the step and of the train step with
its spread (lowest–highest per-round ratio). ``gpu_trl_step.py --zero3`` runs the same
machinery on one GPU (a 1-process DeepSpeed ZeRO-3 job per trainer, bfloat16).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

PHASES = ("generate", "score", "loss", "backward")
COLUMNS = (*PHASES, "train", "step")

#: tests/, home of the sharded backends' launch helpers (tests/trl_backends.py).
TESTS = Path(__file__).resolve().parents[1] / "tests"

#: What ``--backends`` accepts (tests/trl_backends.py also has zero2); the first is the baseline.
BACKENDS = ("ddp", "zero2", "zero3", "fsdp2")

#: Model and batch presets: a Llama for the CPU (and ``quick``, its smaller batch), a Qwen3-0.6B
#: shape for a GPU, and the dry run.
PRESETS: dict[str, dict[str, Any]] = {
    # about 8M parameters: hidden 256, 6 layers, 4 heads / 2 KV heads of 64, vocabulary 6144 (untied)
    "cpu": dict(
        arch="llama",
        hidden=256,
        layers=6,
        heads=4,
        kv_heads=2,
        head_dim=64,
        intermediate=768,
        vocab=6144,
        tied=False,
        prompts=4,
        group=4,
        prompt_tokens=32,
        completion_tokens=64,
    ),
    # Qwen3-0.6B: 28 layers, hidden 1024, 16 heads / 8 KV heads of 128, MLP 3072, tied embeddings
    "qwen3-0.6b": dict(
        arch="qwen3",
        hidden=1024,
        layers=28,
        heads=16,
        kv_heads=8,
        head_dim=128,
        intermediate=3072,
        vocab=151936,
        tied=True,
        prompts=8,
        group=4,
        prompt_tokens=256,
        completion_tokens=256,
    ),
    # the dry run: the GPU bench's code on a model small enough for a CPU
    "tiny": dict(
        arch="qwen3",
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        intermediate=192,
        vocab=512,
        tied=True,
        prompts=2,
        group=2,
        prompt_tokens=8,
        completion_tokens=8,
    ),
}
PRESETS["quick"] = {**PRESETS["cpu"], "prompts": 2, "prompt_tokens": 16, "completion_tokens": 32}


# --------------------------------------------------------------------------- #
# the model, the tokenizer and the data (all built locally)
# --------------------------------------------------------------------------- #


def build_tokenizer(vocab: int) -> Any:
    """A word-level tokenizer whose words are the ids written in decimal (``"17"`` ↔ 17):
    ids 0, 1, 2 are ``<pad>``, ``<bos>``, ``<eos>``; text is split on spaces and decoded
    with spaces. Built offline with ``tokenizers``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>"]
    words = {name: i for i, name in enumerate(specials)}
    words.update({str(i): i for i in range(len(specials), vocab)})
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        clean_up_tokenization_spaces=False,
    )


def build_model(p: dict[str, Any], seed: int) -> Any:
    """The preset's causal LM with random weights (float32, on CPU)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    kinds = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
    config_class, model_class = kinds[p["arch"]]
    cfg = config_class(
        vocab_size=p["vocab"],
        hidden_size=p["hidden"],
        intermediate_size=p["intermediate"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        head_dim=p["head_dim"],
        max_position_embeddings=max(1024, 2 * (p["prompt_tokens"] + p["completion_tokens"])),
        tie_word_embeddings=p["tied"],
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return model_class(cfg)


def prompts(p: dict[str, Any], n: int, seed: int) -> list[str]:
    """``n`` prompts of ``prompt_tokens`` random words (ids 3 … vocab−1)."""
    import random

    rng = random.Random(seed)
    return [" ".join(str(rng.randrange(3, p["vocab"])) for _ in range(p["prompt_tokens"])) for _ in range(n)]


def even_share(completions: list[str], **kwargs: Any) -> list[float | None]:
    """The reward: the share of even ids in the completion (spread within a group)."""
    out: list[float | None] = []
    for text in completions:
        words = text.split()
        out.append(sum(1 for w in words if w.isdigit() and int(w) % 2 == 0) / max(1, len(words)))
    return out


# --------------------------------------------------------------------------- #
# the arms
# --------------------------------------------------------------------------- #


def accepted_arms() -> tuple[str, ...]:
    """What ``CompPOConfig.arm`` accepts in the installed package."""
    from comppo_core.integrations.trl.config import ARM_CHOICES

    return tuple(ARM_CHOICES)


def resolve_arms(a: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The CompPO arms to run (``--arm``, then ``--critic-arm`` when accepted) and
    ``{arm: why it is skipped}``."""
    arms = [a.arm]
    skipped: dict[str, str] = {}
    critic_arm = (a.critic_arm or "none").strip()
    if critic_arm != "none" and critic_arm not in arms:
        choices = accepted_arms()
        if critic_arm in choices:
            arms.append(critic_arm)
        else:
            skipped[critic_arm] = (
                f"CompPOConfig does not accept arm {critic_arm!r} yet (it accepts {', '.join(choices)}): "
                "the standard-critic arms come with issue 42 item 1"
            )
    return arms, skipped


# --------------------------------------------------------------------------- #
# one trainer in one process
# --------------------------------------------------------------------------- #


class Stop(Exception):
    """Raised by the baton callback to end ``train()`` after the last timed round."""


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timed_method(obj: Any, name: str, sink: dict[str, float], device: str) -> None:
    """Replace ``obj.name`` (on the instance) with a version adding its time to ``sink[name]``."""
    inner = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sync(device)
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sync(device)
            sink[name] = sink.get(name, 0.0) + time.perf_counter() - t0

    setattr(obj, name, wrapper)


def trainer_settings(a: dict[str, Any], p: dict[str, Any], out: str, world: int = 1) -> dict[str, Any]:
    """The TRL settings every trainer shares (``world`` processes share the global batch)."""
    gpu = a["device"].startswith("cuda")
    n = p["prompts"] * p["group"]
    if n % world:
        raise ValueError(f"{n} completions per step do not split over {world} processes")
    settings: dict[str, Any] = dict(
        output_dir=out,
        per_device_train_batch_size=n // world,
        num_generations=p["group"],
        max_completion_length=p["completion_tokens"],
        num_iterations=1,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        beta=0.0,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        max_steps=a["rounds"] + 3,  # the warm-up and timed rounds, and spare steps never reached
        logging_steps=10**6,  # TRL's logs: off (they would run after each timed step)
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=a["seed"],
        use_cpu=not gpu,
        bf16=gpu,
        gradient_checkpointing=a["gradient_checkpointing"],
        model_init_kwargs={"dtype": "bfloat16" if gpu else "float32"},
    )
    if world > 1 and not gpu:
        settings["ddp_backend"] = "gloo"
    if a["vllm"]:
        settings.update(
            use_vllm=True,
            vllm_mode="colocate",
            vllm_gpu_memory_utilization=a["vllm_memory"],
            vllm_importance_sampling_correction=False,  # a CompPO arm re-scores every rollout itself
            generation_kwargs={"min_tokens": p["completion_tokens"]},
        )
    else:
        settings.update(generation_kwargs={"min_new_tokens": p["completion_tokens"]})
    return settings


def resident_bytes(trainer: Any) -> int:
    """Bytes of the trainer's standing state: parameters and gradients of the model, the
    reference and the critic, and the optimisers' states (each storage once)."""
    import torch

    seen: dict[tuple[str, int], int] = {}

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            seen[(str(t.device), s.data_ptr())] = s.nbytes()

    for module in (trainer.model, getattr(trainer, "ref_model", None), getattr(trainer, "critic", None)):
        if module is not None:
            for prm in module.parameters():
                add(prm)
                add(prm.grad)
    for opt in (trainer.optimizer, getattr(trainer, "critic_optimizer", None)):
        if opt is not None:
            for state in opt.state.values():
                for v in state.values():
                    add(v)
    return sum(seen.values())


def quiet() -> None:
    """TRL's and transformers' notices and progress bars off: not what is measured."""
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def build_trainer(arm: str, a: dict[str, Any], model_dir: str, out: str, world: int = 1) -> Any:
    """``arm``'s trainer (``grpo``: TRL's own GRPOTrainer) on the saved model and the prompts."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    p = a["preset_values"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_dict({"prompt": prompts(p, 4096, a["seed"])})
    settings = trainer_settings(a, p, out, world)
    if arm == "grpo":
        from trl.trainer.grpo_config import GRPOConfig
        from trl.trainer.grpo_trainer import GRPOTrainer

        return GRPOTrainer(
            model=model_dir,
            reward_funcs=even_share,
            args=GRPOConfig(**settings),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
    from comppo_core.integrations.trl import CompPOConfig, CompPOTrainer

    if "critic_warmup" in CompPOConfig.__dataclass_fields__:
        settings["critic_warmup"] = 0  # the step is timed, not the warm-up before the first one
    return CompPOTrainer(
        model=model_dir,
        reward_funcs=even_share,
        args=CompPOConfig(arm=arm, **settings),
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def attach_clock(trainer: Any, device: str, begin: Callable[[], None], end: Callable[[dict[str, float]], None]) -> None:
    """Time each optimiser step of ``trainer`` by phase: ``begin()`` runs before the clock
    starts (it waits for the baton, or raises :class:`Stop`), ``end(phases)`` after it stops."""
    import torch
    from transformers import TrainerCallback

    sink: dict[str, float] = {}
    for name in ("_generate", "_prepare_inputs", "compute_loss"):
        timed_method(trainer, name, sink, device)
    cuda = device.startswith("cuda")

    class Baton(TrainerCallback):  # type: ignore[misc]
        t0 = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            begin()
            sink.clear()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            sync(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync(device)
            total = time.perf_counter() - self.t0
            phases = {
                "generate": sink.get("_generate", 0.0),
                "score": sink.get("_prepare_inputs", 0.0) - sink.get("_generate", 0.0),
                "loss": sink.get("compute_loss", 0.0),
            }
            phases["backward"] = total - sum(phases.values())
            phases["step"] = total
            if cuda:
                phases["peak"] = float(torch.cuda.max_memory_allocated())
            end(phases)

    trainer.add_callback(Baton())


def trainer_info(trainer: Any) -> dict[str, Any]:
    critic = getattr(trainer, "critic", None)
    return {
        "params": sum(x.numel() for x in trainer.model.parameters()),
        "critic_params": 0 if critic is None else sum(x.numel() for x in critic.parameters()),
        "critic": "none" if critic is None else type(critic).__name__,
        "generation": "vLLM colocate" if getattr(trainer, "use_vllm", False) else "Hugging Face generate",
    }


def worker(arm: str, a: dict[str, Any], model_dir: str, go: Any, done: Any, results: Any) -> None:
    """Build ``arm``'s trainer on the saved model and train it, one step per ``go``."""
    try:
        _worker(arm, a, model_dir, go, done, results)
    except BaseException:  # report, then release the coordinator
        results.put((arm, {"error": traceback.format_exc()}))
        done.set()


def _worker(arm: str, a: dict[str, Any], model_dir: str, go: Any, done: Any, results: Any) -> None:
    quiet()
    import torch

    if a["device"] == "cpu":
        torch.set_num_threads(a["threads"])
    device = a["device"]
    trainer = build_trainer(arm, a, model_dir, os.path.join(model_dir, "out-" + arm))
    steps: list[dict[str, float]] = []
    outside = 0
    if device.startswith("cuda"):
        # what the trainer holds beyond its own state when it is built (vLLM's weights and cache)
        outside = torch.cuda.memory_allocated()

    def begin() -> None:
        done.set()  # the previous step (or the set-up) is over
        go.wait()
        go.clear()
        if a["stop"].is_set():
            raise Stop

    attach_clock(trainer, device, begin, steps.append)
    info = trainer_info(trainer)
    if device.startswith("cuda"):
        info["outside"] = max(0, outside - resident_bytes(trainer))
    with contextlib.suppress(Stop):
        trainer.train()
    info["steps"] = steps
    results.put((arm, info))
    done.set()


# --------------------------------------------------------------------------- #
# the coordinator: one process per trainer (multiprocessing)
# --------------------------------------------------------------------------- #


def vllm_importable() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def save_model(p: dict[str, Any], a: argparse.Namespace, model_dir: str) -> int:
    """Build the preset's model and tokenizer, save both to ``model_dir``; the parameter count."""
    import torch

    model = build_model(p, a.seed)
    n_params = sum(x.numel() for x in model.parameters())
    if a.device.startswith("cuda"):
        model = model.to(dtype=torch.bfloat16)  # what the processes (and vLLM) load
    model.save_pretrained(model_dir)
    build_tokenizer(p["vocab"]).save_pretrained(model_dir)
    return n_params


def measure(a: argparse.Namespace) -> dict[str, Any]:
    """Prints the table; returns ``{"ms": {arm: {phase: ms}}, "ratio": {phase: r}, "ratios":
    {arm: {phase: r}}, "peak": {arm: bytes}, ...}`` (``ratio``: the TAC arm's)."""
    p = dict(PRESETS[a.preset])
    cp, skipped = resolve_arms(a)
    for arm, why in skipped.items():
        print(f"{arm}: skipped: {why}")
    arms = ("grpo", *cp)
    use_vllm = a.device.startswith("cuda") and not a.no_vllm and vllm_importable()
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as model_dir:
        n_params = save_model(p, a, model_dir)
        shared = dict(
            device=a.device,
            rounds=a.rounds,
            seed=a.seed,
            threads=a.threads,
            gradient_checkpointing=a.gradient_checkpointing,
            vllm=use_vllm,
            vllm_memory=a.vllm_memory,
            preset_values=p,
            stop=stop,
        )
        go = {arm: ctx.Event() for arm in arms}
        done = {arm: ctx.Event() for arm in arms}
        results = ctx.Queue()
        procs = {}
        port = os.environ.get("MASTER_PORT")
        # vLLM colocate: each process's rendezvous on a free port of its own ("0": TRL picks one)
        os.environ["MASTER_PORT"] = "0"
        for arm in arms:
            procs[arm] = ctx.Process(target=worker, args=(arm, shared, model_dir, go[arm], done[arm], results))
            procs[arm].start()
        if port is None:
            os.environ.pop("MASTER_PORT")
        else:
            os.environ["MASTER_PORT"] = port
        got: dict[str, Any] = {}

        def wait(arm: str) -> None:
            while not done[arm].wait(5.0):
                if not procs[arm].is_alive():
                    break
            done[arm].clear()
            while not results.empty():  # an error, reported early
                name, info = results.get()
                got[name] = info
                if "error" in info:
                    for q in procs.values():
                        q.kill()
                    sys.exit(f"the {name} process failed:\n{info['error']}")

        for arm in arms:  # all built and at their first step
            wait(arm)
        for r in range(a.rounds + 1):
            for arm in rotated(arms, r):
                go[arm].set()
                wait(arm)
        stop.set()
        for arm in arms:
            go[arm].set()
        for arm in arms:
            while arm not in got:
                name, info = results.get(timeout=600)
                got[name] = info
                if "error" in info:
                    sys.exit(f"the {name} process failed:\n{info['error']}")
            procs[arm].join(timeout=120)
    if a.device.startswith("cuda") and not use_vllm:
        why = "--no-vllm" if a.no_vllm else "vllm is not importable"
        for arm in arms:
            got[arm]["generation"] += f" ({why})"
    result = report(a, p, arms, got, n_params)
    result["skipped"] = skipped
    return result


def rotated(items: Any, r: int) -> list[Any]:
    """``items`` rotated by ``r`` places: round ``r``'s order (each item leads in turn)."""
    items = list(items)
    k = r % len(items)
    return items[k:] + items[:k]


def medians(timed: dict[str, list[dict[str, float]]], rounds: int) -> dict[str, dict[str, float]]:
    """``{name: {column: median ms}}`` over the first ``rounds`` timed rounds."""
    return {
        name: {c: 1e3 * statistics.median(s[c] for s in steps[:rounds]) for c in COLUMNS}
        for name, steps in timed.items()
    }


def per_round_ratios(x: list[dict[str, float]], y: list[dict[str, float]], column: str) -> list[float]:
    return [u[column] / v[column] for u, v in zip(x, y) if v[column] > 0]


def report(
    a: argparse.Namespace, p: dict[str, Any], arms: tuple[str, ...], got: dict[str, Any], n: int
) -> dict[str, Any]:
    grpo, cp = arms[0], arms[1]
    timed = {arm: got[arm]["steps"][1:] for arm in arms}  # round 0 warms up
    rounds = min(len(s) for s in timed.values())
    for arm in arms:
        for s in timed[arm]:
            s["train"] = s["step"] - s["generate"]
    ms = medians(timed, rounds)
    pairs = [(arm, grpo) for arm in arms[1:]]
    if len(arms) > 2:  # the TAC arm against the standard-critic arm
        pairs += [(cp, arm) for arm in arms[2:]]
    ratios = {
        f"{x} / {y}": {c: statistics.median(per_round_ratios(timed[x][:rounds], timed[y][:rounds], c)) for c in COLUMNS}
        for x, y in pairs
    }
    result: dict[str, Any] = {
        "ms": ms,
        "ratio": ratios[f"{cp} / {grpo}"],
        "ratios": ratios,
        "rounds": rounds,
        "arms": list(arms),
        "generation": got[grpo]["generation"],
    }
    dtype = "bfloat16" if a.device.startswith("cuda") else "float32"
    print(
        f"model: {p['arch']} {p['layers']} layers, hidden {p['hidden']}, heads {p['heads']}/{p['kv_heads']}x{p['head_dim']}, "
        f"MLP {p['intermediate']}, vocabulary {p['vocab']}{' (tied)' if p['tied'] else ''}: {n / 1e6:.2f}M parameters, "
        f"random weights, {dtype} on {a.device}"
    )
    critics = "; ".join(
        f"{arm}'s critic: {got[arm]['critic']}, {got[arm]['critic_params']:,} parameters" for arm in arms[1:]
    )
    print(
        f"batch: {p['prompts']} prompts x {p['group']} completions, {p['prompt_tokens']} prompt + "
        f"{p['completion_tokens']} completion tokens; generation: {got[grpo]['generation']}; "
        f"gradient checkpointing {'on' if a.gradient_checkpointing else 'off'}; {critics}"
    )
    print(
        f"\n{rounds} rounds after a warm-up round; times in ms (medians over rounds); ratio = median of the per-round "
        "ratios\n"
    )
    print("| trainer | " + " | ".join(COLUMNS[:-2]) + " | train step | step |")
    print("|---|" + "---|" * len(COLUMNS))
    for arm in arms:
        name = "GRPOTrainer" if arm == grpo else f"CompPOTrainer ({arm})"
        print(f"| {name} | " + " | ".join(f"{ms[arm][c]:.1f}" for c in COLUMNS) + " |")
    for label, r in ratios.items():
        print(f"| **{label}** | " + " | ".join(f"**{r[c]:.3f}**" for c in COLUMNS) + " |")
    print("\n(train step = step without generate; step = generate + score + loss + backward)")
    if a.device.startswith("cuda"):
        peak = {arm: statistics.median(s["peak"] for s in timed[arm][:rounds]) for arm in arms}
        own = {arm: peak[arm] - got[arm].get("outside", 0) for arm in arms}
        result["peak"], result["peak_own"] = peak, own
        result["peak_ratio"] = peak[cp] / peak[grpo]
        result["peak_own_ratio"] = own[cp] / own[grpo]
        result["peak_own_ratios"] = {arm: own[arm] / own[grpo] for arm in arms[1:]}
        print(
            "\npeak memory (torch.cuda.max_memory_allocated over a step, median), absolute and without what the "
            "trainer holds outside its own state (vLLM's weights and cache):"
        )
        for arm in arms:
            print(
                f"  {arm}: {peak[arm] / 2**30:.2f} GiB ({peak[arm] / peak[grpo]:.3f}x grpo); "
                f"own {own[arm] / 2**30:.2f} GiB ({own[arm] / own[grpo]:.3f}x grpo)"
            )
    return result


# --------------------------------------------------------------------------- #
# launched jobs: accelerate launch per trainer and backend, taking turns over sockets
# --------------------------------------------------------------------------- #


def trl_backends() -> Any:
    """tests/trl_backends.py (the sharded backends' configs, the CPU FSDP patch, the facts)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import trl_backends as tb

    return tb


def write_gpu_config(backend: str, path: Path, processes: int) -> Path:
    """The ``accelerate launch`` config of ``backend`` on CUDA (bfloat16): ``zero3`` (a
    DeepSpeed ZeRO-3 JSON beside it, partitioning every parameter) or ``ddp``."""
    lines = [
        "compute_environment: LOCAL_MACHINE",
        "machine_rank: 0",
        "num_machines: 1",
        f"num_processes: {processes}",
        "use_cpu: false",
        "rdzv_backend: static",
        "same_network: true",
        "gpu_ids: all",
    ]
    if backend == "zero3":
        ds = path.with_suffix(".deepspeed.json")
        ds.write_text(
            json.dumps(
                {
                    "train_batch_size": "auto",
                    "train_micro_batch_size_per_gpu": "auto",
                    "gradient_accumulation_steps": "auto",
                    "gradient_clipping": "auto",
                    "zero_allow_untested_optimizer": True,
                    "bf16": {"enabled": "auto"},
                    "zero_optimization": {"stage": 3, "overlap_comm": False, "stage3_param_persistence_threshold": 0},
                    "steps_per_print": 1_000_000,
                    "wall_clock_breakdown": False,
                },
                indent=2,
            )
        )
        lines += [
            "distributed_type: DEEPSPEED",
            "deepspeed_config:",
            f"  deepspeed_config_file: {ds}",
            "  zero3_init_flag: false",
        ]
    elif backend == "ddp":
        lines += ['mixed_precision: "bf16"', "distributed_type: MULTI_GPU"]
    else:
        raise ValueError(f"backend on CUDA: expected zero3 or ddp, got {backend!r}")
    path.write_text("\n".join(lines) + "\n")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_backend(backend: str, processes: int, device: str, facts: dict[str, Any]) -> list[str]:
    """What is wrong with ``facts`` (``trl_backends.backend_facts`` of one process) for
    ``backend`` on ``processes`` processes: empty when the backend really ran."""
    problems = []
    kind = facts.get("distributed_type")
    if facts.get("num_processes") != processes:
        problems.append(f"{facts.get('num_processes')} processes, not {processes}")
    modules = {"actor": facts.get("actor") or {}}
    if facts.get("critic"):  # a standard critic is prepared by accelerate like the policy
        modules["critic"] = facts["critic"]
    if backend == "ddp":
        want = "MULTI_GPU" if device.startswith("cuda") else "MULTI_CPU"
        if processes > 1 and kind != want:
            problems.append(f"distributed_type {kind}, not {want}")
        if processes > 1 and facts.get("model_wrapped") != "DistributedDataParallel":
            problems.append(f"the policy is wrapped in {facts.get('model_wrapped')}, not DistributedDataParallel")
        if processes > 1 and "critic" in modules and modules["critic"].get("wrapper") != "DistributedDataParallel":
            problems.append(
                f"the value model is wrapped in {modules['critic'].get('wrapper')}, not DistributedDataParallel"
            )
    elif backend in ("zero2", "zero3"):
        if kind != "DEEPSPEED":
            problems.append(f"distributed_type {kind}, not DEEPSPEED")
        if facts.get("zero_stage") != int(backend[-1]):
            problems.append(f"ZeRO stage {facts.get('zero_stage')}, not {backend[-1]}")
        if backend == "zero3" and processes > 1:
            problems += [f"the {m} is not partitioned" for m, f in modules.items() if not f.get("zero3_partitioned")]
    elif backend == "fsdp2":
        if kind != "FSDP":
            problems.append(f"distributed_type {kind}, not FSDP")
        problems += [f"the {m}'s parameters are not DTensors" for m, f in modules.items() if not f.get("dtensor")]
    return problems


def describe_facts(facts: dict[str, Any]) -> str:
    """One line: what ran on a process."""
    actor = facts.get("actor") or {}
    parts = [str(facts.get("distributed_type"))]
    if facts.get("group"):
        parts.append(str(facts["group"]))
    if facts.get("zero_stage") is not None:
        parts.append(f"ZeRO-{facts['zero_stage']}")
    parts.append(str(facts.get("model_wrapped")))
    if actor:
        shard = f"actor {actor.get('local_numel'):,}/{actor.get('numel'):,} values here"
        if actor.get("dtensor"):
            shard += ", DTensor"
        parts.append(shard)
    critic = facts.get("critic")
    if critic:
        shard = f"critic ({critic.get('wrapper')}) {critic.get('local_numel'):,}/{critic.get('numel'):,} values here"
        if critic.get("dtensor"):
            shard += ", DTensor"
        parts.append(shard)
    return ", ".join(parts)


class Job:
    """One ``accelerate launch`` of this script: trainer ``arm`` under ``backend`` on ``processes``."""

    def __init__(self, name: str, arm: str, backend: str, processes: int) -> None:
        self.name, self.arm, self.backend, self.processes = name, arm, backend, processes
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None
        self.conns: dict[int, socket.socket] = {}
        self.facts: dict[int, dict[str, Any]] = {}
        self.info: dict[str, Any] = {}
        self.steps: list[dict[str, float]] = []
        self.finished = False
        self.failed = ""

    def tail(self, n: int = 60) -> str:
        if self.log is None or not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def launch_job(job: Job, a: argparse.Namespace, spec: dict[str, Any], workdir: Path) -> None:
    """Start ``job``: its config and spec in ``workdir``, ``accelerate launch`` in a session of its own."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps({**spec, "job": job.name, "arm": job.arm, "out": str(workdir / "out")}))
    config_path = workdir / f"accelerate-{job.backend}-{job.processes}.yaml"
    if a.device.startswith("cuda"):
        write_gpu_config(job.backend, config_path, job.processes)
    else:
        trl_backends().write_accelerate_config(job.backend, config_path, job.processes)
    bin_dir = str(Path(sys.executable).parent)  # ninja, for DeepSpeed's JIT-compiled op
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "PYTHONWARNINGS": "ignore",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if not a.device.startswith("cuda"):
        env["OMP_NUM_THREADS"] = str(a.threads)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(config_path),
        "--num_processes", str(job.processes),
        "--main_process_port", str(free_port()),
        str(Path(__file__).resolve()), "--launched-worker", str(spec_path),
    ]  # fmt: skip
    job.log = workdir / "log.txt"
    with open(job.log, "wb") as log:
        job.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def end_job(job: Job) -> None:
    """Kill what is left of ``job``'s launch (its own process group)."""
    if job.proc is not None and job.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.proc.wait(timeout=30)


def run_jobs(a: argparse.Namespace, jobs: list[Job], model_dir: str, workdir: Path, strict: bool = True) -> None:
    """Launch ``jobs`` and step them in turns: a warm-up round and ``a.rounds`` timed rounds,
    the order rotating; fills ``job.steps`` (per round: the first process's phases, the
    slowest process's step), ``job.facts`` (each process's ``backend_facts`` after its first
    step, when everything is prepared) and ``job.info``. After the warm-up round, a job whose
    backend did not really run (:func:`check_backend`) stops the run when ``strict``;
    otherwise it is ended, ``job.failed`` says why, and the others go on."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    inbox: queue.Queue[tuple[socket.socket, dict[str, Any] | None]] = queue.Queue()

    def read(conn: socket.socket) -> None:
        with conn.makefile("r", encoding="utf-8") as lines:
            for line in lines:
                inbox.put((conn, json.loads(line)))
        inbox.put((conn, None))

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=read, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    spec = dict(
        port=server.getsockname()[1],
        device=a.device,
        rounds=a.rounds,
        seed=a.seed,
        threads=a.threads,
        gradient_checkpointing=a.gradient_checkpointing,
        vllm=bool(getattr(a, "launched_vllm", False)),
        vllm_memory=a.vllm_memory,
        preset_values=dict(PRESETS[a.preset]),
        model_dir=model_dir,
    )
    by_conn: dict[socket.socket, tuple[Job, int]] = {}
    by_name = {job.name: job for job in jobs}

    def fail(why: str) -> None:
        for job in jobs:
            end_job(job)
        server.close()
        logs = "\n\n".join(f"--- {job.name} ({job.backend}), last lines of {job.log}:\n{job.tail()}" for job in jobs)
        sys.exit(f"{why}\n{logs}")

    def receive(deadline: float) -> tuple[Job, int, dict[str, Any]]:
        while True:
            try:
                conn, msg = inbox.get(timeout=1.0)
            except queue.Empty:
                for job in jobs:
                    if not job.finished and job.proc is not None and job.proc.poll() is not None:
                        fail(f"{job.name}: accelerate launch ended (exit status {job.proc.returncode}) mid-run")
                if time.monotonic() > deadline:
                    fail(f"no word from the jobs in {a.job_timeout} s")
                continue
            if msg is None:
                if conn in by_conn and not by_conn[conn][0].finished:
                    job, rank = by_conn[conn]
                    fail(f"{job.name} rank {rank}: the connection closed mid-run")
                continue
            if msg.get("kind") == "hello":
                job = by_name[msg["job"]]
                by_conn[conn] = (job, int(msg["rank"]))
                job.conns[int(msg["rank"])] = conn
                continue
            job, rank = by_conn[conn]
            if msg.get("kind") == "error":
                fail(f"{job.name} rank {rank} failed:\n{msg.get('trace')}")
            return job, rank, msg

    for job in jobs:
        launch_job(job, a, spec, workdir / job.name.replace("@", "-").replace("/", "-"))
    # every process of every job built and at its first step
    deadline = time.monotonic() + a.job_timeout
    ready: dict[str, set[int]] = {job.name: set() for job in jobs}
    while any(len(ready[job.name]) < job.processes for job in jobs):
        job, rank, msg = receive(deadline)
        if msg.get("kind") != "ready":
            fail(f"{job.name} rank {rank}: expected 'ready', got {msg}")
        ready[job.name].add(rank)
        job.info = msg["info"] if rank == 0 else job.info
    live = list(jobs)
    for r in range(a.rounds + 1):
        for job in rotated(live, r):
            deadline = time.monotonic() + a.job_timeout
            for conn in job.conns.values():
                conn.sendall(b"go\n")
            steps: dict[int, dict[str, float]] = {}
            while len(steps) < job.processes:
                who, rank, msg = receive(deadline)
                if who is not job or msg.get("kind") != "step":
                    fail(f"{who.name} rank {rank}: unexpected {msg} while {job.name} steps")
                steps[rank] = msg["phases"]
                if "facts" in msg:
                    job.facts[rank] = msg["facts"]
            phases = dict(steps[0])
            phases["step"] = max(s["step"] for s in steps.values())
            if "peak" in phases:
                phases["peak"] = max(s["peak"] for s in steps.values())
            job.steps.append(phases)
        if r == 0:  # after the first step everything is prepared (the value model when it first runs)
            for job in live:
                problems = sorted(
                    {why for f in job.facts.values() for why in check_backend(job.backend, job.processes, a.device, f)}
                )
                if problems or len(job.facts) < job.processes:  # a silent fallback: no figure for it
                    job.failed = f"the {job.backend} backend did not run: {'; '.join(problems) or 'no facts'}"
                    job.finished = True
                    end_job(job)
            live = [job for job in live if not job.failed]
            if not live or (strict and len(live) < len(jobs)):
                fail("; ".join(f"{job.name}: {job.failed}" for job in jobs if job.failed) or "no job ran")
    for job in live:
        job.finished = True
        for conn in job.conns.values():
            with contextlib.suppress(OSError):
                conn.sendall(b"stop\n")
    for job in live:
        if job.proc is not None:
            try:
                job.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                end_job(job)
    server.close()


def launched_worker(spec_path: str) -> None:
    """One process of a launched job: build the trainer, report its backend, step on the baton."""
    spec = json.loads(Path(spec_path).read_text())
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    sock = socket.create_connection(("127.0.0.1", spec["port"]))
    rf = sock.makefile("r", encoding="utf-8")

    def send(msg: dict[str, Any]) -> None:
        sock.sendall((json.dumps(msg) + "\n").encode())

    send({"kind": "hello", "job": spec["job"], "rank": rank})
    code = 0
    try:
        tb = trl_backends()
        tb.use_fsdp_on_cpu()  # before anything builds an Accelerator (only under ACCELERATE_USE_FSDP=true)
        quiet()
        import torch

        if spec["device"] == "cpu":
            torch.set_num_threads(spec["threads"])
        trainer = build_trainer(spec["arm"], spec, spec["model_dir"], spec["out"], world=world)
        steps = [0]

        def begin() -> None:
            if not steps[0]:  # the policy is prepared (wrapped, sharded) by now
                info = trainer_info(trainer)
                info["params"] = (tb.backend_facts(trainer)["actor"] or {}).get("numel", info["params"])
                send({"kind": "ready", "info": info})
            word = rf.readline().strip()
            if word != "go":
                raise Stop

        def end(phases: dict[str, float]) -> None:
            msg: dict[str, Any] = {"kind": "step", "phases": phases}
            if not steps[0]:  # what ran, once everything is prepared (a value model: at its first use)
                msg["facts"] = tb.backend_facts(trainer)
            steps[0] += 1
            send(msg)

        attach_clock(trainer, spec["device"], begin, end)
        with contextlib.suppress(Stop):
            trainer.train()
        send({"kind": "bye"})
    except BaseException:
        code = 1
        with contextlib.suppress(OSError):
            send({"kind": "error", "trace": traceback.format_exc()})
    sys.stdout.flush()
    sys.stderr.flush()
    # sharded processes sometimes abort in their teardown after the work is done
    # (fully_shard: "terminate called without an active exception"): the results are sent, so leave
    os._exit(code)


def measure_launched(a: argparse.Namespace, jobs: list[Job], strict: bool = True) -> tuple[int, str]:
    """Save the model, run ``jobs`` (:func:`run_jobs`); the parameter count and the first job's generation."""
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        n_params = save_model(dict(PRESETS[a.preset]), a, model_dir)
        run_jobs(a, jobs, model_dir, Path(tmp), strict)
    return n_params, jobs[0].info.get("generation", "?")


def measure_zero3_pair(a: argparse.Namespace) -> dict[str, Any]:
    """GRPOTrainer and the TAC arm, each a 1-process ZeRO-3 job, in turns: :func:`report`'s result
    (with ``facts``: what each ran)."""
    p = dict(PRESETS[a.preset])
    jobs = [Job("grpo", "grpo", "zero3", 1), Job(a.arm, a.arm, "zero3", 1)]
    n_params, _ = measure_launched(a, jobs)
    for job in jobs:
        print(f"{job.name}: {describe_facts(job.facts[0])}")
    got = {job.name: {**job.info, "steps": job.steps, "outside": 0} for job in jobs}
    result = report(a, p, tuple(job.name for job in jobs), got, n_params)
    result["facts"] = {job.name: job.facts[0] for job in jobs}
    return result


def measure_backends(a: argparse.Namespace) -> dict[str, Any]:
    """Each CompPO arm under each of ``a.backends`` (the first the baseline), in turns;
    prints a table per arm; returns ``{arm: {backend: {...}}, "failed": [...], "skipped": {...}}``."""
    p = dict(PRESETS[a.preset])
    arms, skipped = resolve_arms(a)
    for arm, why in skipped.items():
        print(f"{arm}: skipped: {why}")
    base = a.backends[0]
    out: dict[str, Any] = {"skipped": skipped, "failed": []}
    for arm in arms:
        jobs = [Job(f"{arm}@{b}", arm, b, a.processes) for b in a.backends]
        n_params, generation = measure_launched(a, jobs, strict=False)
        live = [job for job in jobs if not job.failed]
        timed = {job.backend: job.steps[1:] for job in live}
        rounds = min(len(s) for s in timed.values())
        for steps in timed.values():
            for s in steps:
                s["train"] = s["step"] - s["generate"]
        ms = medians(timed, rounds)
        print(
            f"\nCompPOTrainer ({arm}) under {', '.join(a.backends)}: {a.processes} processes each, one torch thread "
            f"per process, {p['prompts'] * p['group']} completions per step in all ({p['prompt_tokens']} prompt + "
            f"{p['completion_tokens']} completion tokens), model {n_params / 1e6:.2f}M parameters ({a.preset}), "
            f"{generation}; {rounds} rounds after a warm-up round, jobs in turns (order rotating)"
        )
        for job in jobs:
            for rank, facts in sorted(job.facts.items()):
                print(f"  {job.backend} rank {rank}: {describe_facts(facts)}")
        header = " | ".join(COLUMNS[:-2]) + f" | train step | step | step / {base} | train step / {base} |"
        print("\n| backend | " + header)
        print("|---|" + "---|" * (len(COLUMNS) + 2))
        arm_out: dict[str, Any] = {}
        for job in jobs:
            b = job.backend
            if job.failed:
                out["failed"].append(f"{job.name}: {job.failed}")
                print(f"| {b} | **did not run**: {job.failed} | " + " | ".join(["—"] * (len(COLUMNS) + 1)) + " |")
                continue
            row: dict[str, Any] = {"ms": ms[b], "facts": job.facts}
            cells = [f"{ms[b][c]:.1f}" for c in COLUMNS]
            for c in ("step", "train"):
                if b == base or base not in timed:
                    cells.append("1" if b == base else "—")
                    continue
                rs = sorted(per_round_ratios(timed[b][:rounds], timed[base][:rounds], c))
                row[f"{c}_ratio"] = (statistics.median(rs), rs[0], rs[-1])
                cells.append(f"**{statistics.median(rs):.3f}** ({rs[0]:.3f}–{rs[-1]:.3f})")
            arm_out[b] = row
            print(f"| {b} | " + " | ".join(cells) + " |")
        print(
            f"\n(ms: medians over rounds; ratio: median of the per-round ratios to {base}, lowest–highest in brackets)"
        )
        out[arm] = arm_out
    for why in out["failed"]:
        print(f"FAILED: {why}")
    return out


# --------------------------------------------------------------------------- #
# command line
# --------------------------------------------------------------------------- #


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--preset", choices=tuple(PRESETS), default="cpu", help="model and batch")
    ap.add_argument("--quick", action="store_true", help="the quick preset and 2 rounds")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds after the warm-up round")
    ap.add_argument("--arm", default="comppo", help="CompPOTrainer's TAC arm")
    ap.add_argument(
        "--critic-arm", default="comp_gae", help="CompPOTrainer's standard-critic arm, run beside it ('none': not run)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process on CPU")
    ap.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="TRL's gradient_checkpointing (GRPOConfig's default: on)",
    )
    ap.add_argument("--no-vllm", action="store_true", help="on CUDA: Hugging Face generate even if vllm is importable")
    ap.add_argument("--vllm-memory", type=float, default=0.25, help="vllm_gpu_memory_utilization of each process")
    ap.add_argument(
        "--backends",
        default=None,
        help=f"comma-separated, of {', '.join(BACKENDS)}: each CompPO arm under each backend (the first is the "
        "baseline) instead of the trainers against GRPOTrainer",
    )
    ap.add_argument("--processes", type=int, default=2, help="--backends: processes per job")
    ap.add_argument("--job-timeout", type=float, default=900, help="--backends: seconds to wait for a job's word")
    return ap


def parse_backends(text: str) -> list[str]:
    backends = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in backends if b not in BACKENDS]
    if bad or len(set(backends)) != len(backends) or len(backends) < 2:
        sys.exit(f"--backends: expected two or more distinct of {', '.join(BACKENDS)}, got {text!r}")
    return backends


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if argv[:1] == ["--launched-worker"]:
        launched_worker(argv[1])
        return 0
    a = parser().parse_args(argv)
    if a.quick:
        a.preset, a.rounds = "quick", 2
    if a.rounds < 1:
        sys.exit("--rounds: expected an integer >= 1")
    if a.backends:
        if a.device != "cpu":
            sys.exit("--backends runs on CPU (benches/gpu_trl_step.py --zero3: ZeRO-3 on one GPU)")
        a.backends = parse_backends(a.backends)
        return 1 if measure_backends(a)["failed"] else 0
    measure(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
