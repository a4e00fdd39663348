"""``CompPOTrainer``'s step against ``GRPOTrainer``'s, by phase: one model, one data set.

Run:  python benches/trl_step.py                 (CPU, an 8M-parameter Llama; a few minutes on one core)
      python benches/trl_step.py --quick         (a smaller batch and 2 rounds: a quick look)
      python benches/gpu_trl_step.py             (CUDA: a Qwen3-0.6B shape in bfloat16, and the targets)

**What runs.** Two trainers, each in its own process, driven by TRL's own ``train()``:
``trl.GRPOTrainer`` with ``trl.GRPOConfig`` (the real one, not ``CompPOTrainer(arm="grpo")``,
which is the same code) and ``CompPOTrainer`` with ``CompPOConfig(arm="comppo")`` (``--arm``
picks another TAC arm). Both get every TRL setting the same (TRL's defaults but those named
in the output: one optimiser step per generation, ``num_iterations=1``, no KL, float32 on
CPU), the same model (built once from a config with random weights, saved, loaded by
each process) and the same prompts in the same order (the same seed). Generation is
TRL's (Hugging Face ``generate``, or vLLM colocate on a GPU) with ``min_new_tokens`` equal
to ``max_completion_length``, so every completion has the same length in both arms.

**Phases**, timed by wrapping the trainer's own methods in the bench (nothing in the
package is changed; CUDA is synchronised at each edge)::

    generate   GRPOTrainer._generate: prompt tokenisation, generation, decoding
    score      the rest of _prepare_inputs: rewards, then GRPO's group advantages (TRL skips
               the old log-probs forward when on-policy), or the arm's scoring forward
               (log-probs, concentration gates, TAC values), Comp-GAE and whitening
    loss       Trainer.compute_loss: the policy forward and the loss (CompPO: + the TAC)
    backward   the rest of the step: backward, clipping, optimiser step(s) (CompPO: + the critic's)

``step`` is one optimiser step, from the trainer's ``on_step_begin`` to its ``on_step_end``
callback (the sum of the phases); ``train step`` is the step without ``generate``.

**Rounds.** The two processes take turns: in each round each runs one step while the
other waits (the order alternates round by round); round 0 warms up and is not counted,
then ``--rounds`` rounds. Times are medians over rounds; a ratio is the median of the
per-round ratios ``comppo / grpo``. Torch runs one thread per process on CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

PHASES = ("generate", "score", "loss", "backward")

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
# one arm in one process
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


def trainer_settings(a: dict[str, Any], p: dict[str, Any], out: str) -> dict[str, Any]:
    """The TRL settings both arms share."""
    gpu = a["device"].startswith("cuda")
    n = p["prompts"] * p["group"]
    settings: dict[str, Any] = dict(
        output_dir=out,
        per_device_train_batch_size=n,
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


def worker(arm: str, a: dict[str, Any], model_dir: str, go: Any, done: Any, results: Any) -> None:
    """Build ``arm``'s trainer on the saved model and train it, one step per ``go``."""
    try:
        _worker(arm, a, model_dir, go, done, results)
    except BaseException:  # report, then release the coordinator
        results.put((arm, {"error": traceback.format_exc()}))
        done.set()


def _worker(arm: str, a: dict[str, Any], model_dir: str, go: Any, done: Any, results: Any) -> None:
    warnings.filterwarnings("ignore")  # TRL's and transformers' notices: not what is measured
    import torch

    if a["device"] == "cpu":
        torch.set_num_threads(a["threads"])
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    p = a["preset_values"]
    device = a["device"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = Dataset.from_dict({"prompt": prompts(p, 4096, a["seed"])})
    settings = trainer_settings(a, p, os.path.join(model_dir, "out-" + arm))
    if arm == "grpo":
        from trl.trainer.grpo_config import GRPOConfig
        from trl.trainer.grpo_trainer import GRPOTrainer

        trainer: Any = GRPOTrainer(
            model=model_dir,
            reward_funcs=even_share,
            args=GRPOConfig(**settings),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
    else:
        from comppo_core.integrations.trl import CompPOConfig, CompPOTrainer

        trainer = CompPOTrainer(
            model=model_dir,
            reward_funcs=even_share,
            args=CompPOConfig(arm=arm, **settings),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
    sink: dict[str, float] = {}
    for name in ("_generate", "_prepare_inputs", "compute_loss"):
        timed_method(trainer, name, sink, device)
    steps: list[dict[str, float]] = []
    cuda = device.startswith("cuda")
    outside = 0
    if cuda:
        # what the trainer holds beyond its own state when it is built (vLLM's weights and cache)
        outside = torch.cuda.memory_allocated()

    class Baton(TrainerCallback):  # type: ignore[misc]
        t0 = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            done.set()  # the previous step (or the set-up) is over
            go.wait()
            go.clear()
            if a["stop"].is_set():
                raise Stop
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
            steps.append(phases)

    trainer.add_callback(Baton())
    info: dict[str, Any] = {}
    if cuda:
        info["outside"] = max(0, outside - resident_bytes(trainer))
    info["params"] = sum(x.numel() for x in trainer.model.parameters())
    critic = getattr(trainer, "critic", None)
    info["critic_params"] = 0 if critic is None else sum(x.numel() for x in critic.parameters())
    info["generation"] = "vLLM colocate" if getattr(trainer, "use_vllm", False) else "Hugging Face generate"
    with contextlib.suppress(Stop):
        trainer.train()
    info["steps"] = steps
    results.put((arm, info))
    done.set()


# --------------------------------------------------------------------------- #
# the coordinator
# --------------------------------------------------------------------------- #


def vllm_importable() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def measure(a: argparse.Namespace) -> dict[str, Any]:
    """Prints the table; returns ``{"ms": {arm: {phase: ms}}, "ratio": {phase: r}, "peak": {arm: bytes}, ...}``."""
    import torch

    p = dict(PRESETS[a.preset])
    arms = ("grpo", a.arm)
    use_vllm = a.device.startswith("cuda") and not a.no_vllm and vllm_importable()
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as model_dir:
        model = build_model(p, a.seed)
        n_params = sum(x.numel() for x in model.parameters())
        if a.device.startswith("cuda"):
            model = model.to(dtype=torch.bfloat16)  # what the processes (and vLLM) load
        model.save_pretrained(model_dir)
        build_tokenizer(p["vocab"]).save_pretrained(model_dir)
        del model
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

        for arm in arms:  # both built and at their first step
            wait(arm)
        order = list(arms)
        for _ in range(a.rounds + 1):
            for arm in order:
                go[arm].set()
                wait(arm)
            order.reverse()
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
    return report(a, p, arms, got, n_params)


def report(
    a: argparse.Namespace, p: dict[str, Any], arms: tuple[str, str], got: dict[str, Any], n: int
) -> dict[str, Any]:
    grpo, cp = arms
    timed = {arm: got[arm]["steps"][1:] for arm in arms}  # round 0 warms up
    rounds = min(len(timed[grpo]), len(timed[cp]))
    cols = (*PHASES, "train", "step")
    for arm in arms:
        for s in timed[arm]:
            s["train"] = s["step"] - s["generate"]
    ms = {arm: {c: 1e3 * statistics.median(s[c] for s in timed[arm][:rounds]) for c in cols} for arm in arms}
    ratio = {
        c: statistics.median(x[c] / y[c] for x, y in zip(timed[cp][:rounds], timed[grpo][:rounds]) if y[c] > 0)
        for c in cols
    }
    result: dict[str, Any] = {"ms": ms, "ratio": ratio, "rounds": rounds}
    dtype = "bfloat16" if a.device.startswith("cuda") else "float32"
    print(
        f"model: {p['arch']} {p['layers']} layers, hidden {p['hidden']}, heads {p['heads']}/{p['kv_heads']}x{p['head_dim']}, "
        f"MLP {p['intermediate']}, vocabulary {p['vocab']}{' (tied)' if p['tied'] else ''}: {n / 1e6:.2f}M parameters, "
        f"random weights, {dtype} on {a.device}"
    )
    print(
        f"batch: {p['prompts']} prompts x {p['group']} completions, {p['prompt_tokens']} prompt + "
        f"{p['completion_tokens']} completion tokens; generation: {got[grpo]['generation']}; "
        f"gradient checkpointing {'on' if a.gradient_checkpointing else 'off'}; "
        f"{cp}'s critic: {got[cp]['critic_params']:,} parameters"
    )
    print(
        f"\n{rounds} rounds after a warm-up round; times in ms (medians over rounds); ratio = median of the per-round "
        f"{cp} / grpo\n"
    )
    print("| trainer | " + " | ".join(cols[:-2]) + " | train step | step |")
    print("|---|" + "---|" * len(cols))
    names = {grpo: "GRPOTrainer", cp: f"CompPOTrainer ({cp})"}
    for arm in arms:
        print(f"| {names[arm]} | " + " | ".join(f"{ms[arm][c]:.1f}" for c in cols) + " |")
    print(f"| **{cp} / grpo** | " + " | ".join(f"**{ratio[c]:.3f}**" for c in cols) + " |")
    print("\n(train step = step without generate; step = generate + score + loss + backward)")
    if a.device.startswith("cuda"):
        peak = {arm: statistics.median(s["peak"] for s in timed[arm][:rounds]) for arm in arms}
        own = {arm: peak[arm] - got[arm].get("outside", 0) for arm in arms}
        result["peak"], result["peak_own"] = peak, own
        result["peak_ratio"] = peak[cp] / peak[grpo]
        result["peak_own_ratio"] = own[cp] / own[grpo]
        print(
            f"\npeak memory (torch.cuda.max_memory_allocated over a step, median): grpo {peak[grpo] / 2**30:.2f} GiB, "
            f"{cp} {peak[cp] / 2**30:.2f} GiB: {result['peak_ratio']:.3f}x; without what the trainer holds outside its "
            f"own state (vLLM's weights and cache): grpo {own[grpo] / 2**30:.2f} GiB, {cp} {own[cp] / 2**30:.2f} GiB: "
            f"{result['peak_own_ratio']:.3f}x"
        )
    return result


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--preset", choices=tuple(PRESETS), default="cpu", help="model and batch")
    ap.add_argument("--quick", action="store_true", help="the quick preset and 2 rounds")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds after the warm-up round")
    ap.add_argument("--arm", default="comppo", help="CompPOTrainer's arm (a TAC arm)")
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
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if a.quick:
        a.preset, a.rounds = "quick", 2
    if a.rounds < 1:
        sys.exit("--rounds: expected an integer >= 1")
    measure(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
