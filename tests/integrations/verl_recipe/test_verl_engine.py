"""The CompPO engine (comppo_core.integrations.verl.engine) in verl 0.9.1's FSDP2 engine, on the CPU.

verl's own FSDP2 engine, subclassed, in one gloo process (tests/verl_cpu.py), on a tiny
random Llama: its old-log-prob pass (``infer_batch``, packed ``NO_PADDING`` rows, two
micro-batches) against :func:`comppo_core.rl.forward` on the same rows, packed
(``cu_seqlens``) and padded: log-probs, concentration, Comp-GAE's gates and the TAC's
values within 1e-5 (float32). Then the TAC's place in the actor: sharded, out of the
rollout's weight sync, its own param group (``critic_lr``), saved and restored with the
actor's checkpoint and kept out of its Hugging Face export, computed in float32 under
verl's bf16 autocast; the errors; and the verl internals all this relies on. The update
itself (the loss) is pinned in test_verl_losses.py. Skipped without verl (the main CI);
runs in the ``[verl]`` environment.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from verl_cpu import (  # noqa: E402
    TAU,
    actor_config,
    comppo_engine_with,
    cpu_process_group,
    full_state,
    old_log_prob_batch,
    padded_to_packed,
    plain_tac,
    rollout,
    tiny_llama,
    update_batch,
)

import comppo_core as cc  # noqa: E402
from comppo_core import rl  # noqa: E402
from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.hf.lm import pack_columns  # noqa: E402
from comppo_core.integrations.verl import engine as comppo_engine  # noqa: E402
from comppo_core.integrations.verl.layout import from_nested_columns, response_columns, to_nested_columns  # noqa: E402

TAC = {"taps": (0, 2), "width": 16, "temporal": "gru"}
TOL = 1e-5


@pytest.fixture(scope="module")
def verl_cpu() -> Iterator[None]:
    torch.set_num_threads(1)
    with cpu_process_group():
        yield


@pytest.fixture(scope="module")
def model(verl_cpu: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    path = str(tmp_path_factory.mktemp("verl") / "tiny-llama")
    return path, tiny_llama(path)


@pytest.fixture
def settings() -> Iterator[None]:
    """Restores the process's engine settings after a test changes them."""
    saved = comppo_engine.engine_settings()
    yield
    comppo_engine.configure_engine(saved)


def max_diff(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor) -> float:
    return float((a[where].double() - b[where].double()).abs().max())


@pytest.mark.parametrize(("normalize", "causal"), [("causal", False), ("sequence", False), ("sequence", True)], ids=str)
def test_old_log_prob_pass_equals_rl_forward(
    model: tuple[str, Any], settings: None, normalize: str, causal: bool
) -> None:
    path, hf_model = model
    params = cc.GateParams(low=0.2, normalize=normalize)
    engine = comppo_engine_with(path, comppo_engine.EngineSettings(tac=TAC, gate_params=params, causal=causal))
    batch = rollout()
    td = old_log_prob_batch(batch, comppo_probe=True)
    with engine.eval_mode():
        out = engine.infer_batch(td, loss_function=None)["model_output"]
    ids = td["input_ids"].values().unsqueeze(0)
    cu = td["input_ids"].offsets().to(torch.long)
    # the response columns, from the padded batch (independently of the engine's layout code)
    padded_resp = torch.cat([torch.zeros_like(batch["prompts"][:, 1:]), batch["response_mask"]], 1) != 0
    resp = padded_to_packed(padded_resp, batch["attention_mask"]) != 0
    assert torch.equal(resp, response_columns(cu, batch["response_mask"], batch["attention_mask"]))
    assert int(resp.sum()) == int(batch["response_mask"].sum()) == 13
    tac = plain_tac(hf_model, engine, TAC)
    common = {"temperature": TAU, "critic": tac, "gate_params": params, "causal": causal}
    packed = rl.forward(hf_model, ids, None, cu_seqlens=cu, response_mask=resp, **common)
    padded = rl.forward(hf_model, batch["input_ids"], batch["attention_mask"], response_mask=padded_resp, **common)
    got = {
        "log-probs": from_nested_columns(out["log_probs"], cu),
        "concentration": from_nested_columns(out["concentration"], cu),
        "gates": from_nested_columns(out["comp_gates"], cu),
        "values": from_nested_columns(out["values"], cu),
    }
    want = {
        "log-probs": packed.logprobs,
        "concentration": packed.concentration,
        "gates": packed.gates,
        "values": packed.values,
    }
    want_padded = {
        "log-probs": padded.logprobs,
        "concentration": padded.concentration,
        "gates": padded.gates,
        "values": padded.values,
    }
    for name in got:
        assert max_diff(got[name], want[name], resp) <= TOL, (name, "packed")
        assert max_diff(got[name], padded_to_packed(want_padded[name], batch["attention_mask"]), resp) <= TOL, (
            name,
            "padded",
        )
    # not a vacuous equality: gates below 1 and values away from 0 on the response
    assert int((got["gates"][resp] < 0.99).sum()) >= 5
    assert float(got["values"][resp].abs().min()) > 1e-3
    # outside the response: gates 1; at each sequence's boundary entry (verl's garbage): 0 / 1
    boundary = cu[1:] - 1
    inside = torch.ones_like(resp)
    inside[0, boundary[:-1]] = False  # a sequence's last entry: verl's garbage, a boundary column here
    assert bool((got["gates"][~resp & inside] == 1.0).all())
    assert bool((out["comp_gates"].values()[boundary] == 1.0).all())
    assert bool((out["values"].values()[boundary] == 0.0).all())
    assert bool((out["concentration"].values()[boundary] == 0.0).all())


def test_dynamic_batch_sizes_give_the_same_outputs(model: tuple[str, Any], settings: None) -> None:
    """``use_dynamic_bsz`` (micro-batches by token budget, reordered, then put back in order by verl):
    the old-log-prob pass's concentration, gates and TAC values equal the fixed micro-batches' on
    every sequence (6 sequences of different lengths; the gates and values are computed per
    sequence, so the grouping must not matter)."""
    from verl.workers.engine.utils import prepare_micro_batches

    path, _ = model
    engine = comppo_engine_with(path, comppo_engine.EngineSettings(tac=TAC, gate_params=cc.GateParams(low=0.2)))
    batch = rollout(prompt_lens=(6, 3, 5, 4, 2, 7), response_lens=(5, 2, 4, 3, 6, 1))
    outputs = {}
    for name, meta in {"fixed": {}, "dynamic": {"use_dynamic_bsz": True, "max_token_len_per_gpu": 14}}.items():
        td = old_log_prob_batch(batch, comppo_probe=True, **meta)
        if meta:  # the token budget really regroups and reorders the sequences
            _, order = prepare_micro_batches(td.clone(), dp_group=None, same_micro_num_in_dp=True)
            flat = [int(i) for group in order for i in group]
            assert len(order) > 3 and flat != sorted(flat)
        with engine.eval_mode():
            outputs[name] = engine.infer_batch(td, loss_function=None)["model_output"]
    cu = outputs["fixed"]["log_probs"].offsets()
    scored = torch.ones(int(cu[-1]), dtype=torch.bool)
    scored[cu[1:] - 1] = False  # each sequence's last entry scores the next sequence's first token
    for key in ("log_probs", "concentration", "comp_gates", "values"):
        fixed, dynamic = outputs["fixed"][key].values(), outputs["dynamic"][key].values()
        assert torch.equal(outputs["dynamic"][key].offsets(), cu), key
        assert float((fixed - dynamic)[scored].abs().max()) <= TOL, key


def test_probe_off_leaves_verl_outputs_alone(model: tuple[str, Any], settings: None) -> None:
    """Without ``comppo_probe`` the CompPO engine is verl's engine: the same keys, the same log-probs
    (bit for bit, as with the probe on), and ``rl.forward``'s packed log-probs."""
    path, hf_model = model
    engine = comppo_engine_with(path, comppo_engine.EngineSettings(tac=TAC))
    batch = rollout()
    with engine.eval_mode():
        plain = engine.infer_batch(old_log_prob_batch(batch), loss_function=None)["model_output"]
        probed = engine.infer_batch(old_log_prob_batch(batch, comppo_probe=True), loss_function=None)["model_output"]
    assert "comp_gates" not in plain and "values" not in plain and "concentration" not in plain
    assert torch.equal(plain["log_probs"].values(), probed["log_probs"].values())
    td = old_log_prob_batch(batch)
    cu = td["input_ids"].offsets().to(torch.long)
    ours = rl.forward(
        hf_model, td["input_ids"].values().unsqueeze(0), None, cu_seqlens=cu, temperature=TAU, routing=False
    )
    cols = ours.response_mask
    assert max_diff(from_nested_columns(plain["log_probs"], cu), ours.logprobs, cols) <= TOL


def test_tac_lives_in_the_actor(model: tuple[str, Any], settings: None) -> None:
    """The TAC is an FSDP2-sharded submodule of the actor: in its optimiser and state dict, and
    not in the weights the rollout is sent (verl's ``get_per_tensor_param*``)."""
    path, _ = model
    engine = comppo_engine_with(path, comppo_engine.EngineSettings(tac=TAC))
    names = [n for n, _ in engine.module.named_parameters()]
    tac_names = [n for n in names if n.startswith(comppo_engine.TAC_PREFIX)]
    assert len(tac_names) == len(list(engine.module.comppo_tac.parameters())) > 0
    assert all(type(p).__name__ == "DTensor" for p in engine.module.comppo_tac.parameters())
    in_optimizer = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    assert all(id(p) in in_optimizer for p in engine.module.comppo_tac.parameters())
    assert sum(k.startswith(comppo_engine.TAC_PREFIX) for k in engine.module.state_dict()) == len(tac_names)
    synced, _ = engine.get_per_tensor_param()
    synced_names = [name for name, _ in synced]
    assert synced_names and not any(n.startswith(comppo_engine.TAC_PREFIX) for n in synced_names)
    assert len(synced_names) == len(engine.module.state_dict()) - len(tac_names)
    shards, _ = engine.get_per_tensor_param_shard()
    assert sorted(name for name, *_ in shards) == sorted(synced_names)


def test_padded_micro_batches_are_refused(model: tuple[str, Any], settings: None) -> None:
    path, _ = model
    engine = comppo_engine_with(path, comppo_engine.EngineSettings())
    td = old_log_prob_batch(rollout(), comppo_probe=True, use_remove_padding=False)
    with engine.eval_mode(), pytest.raises(ParameterError, match="use_remove_padding") as info:
        engine.infer_batch(td, loss_function=None)
    assert info.value.argument == "use_remove_padding"


def test_bad_settings_are_refused(model: tuple[str, Any], settings: None) -> None:
    """``critic_lr`` and ``tac_seed`` are checked in EngineSettings; a TAC with FSDP1 or LoRA when the
    engine is built (a ParameterError naming the setting, before verl builds anything)."""
    from verl.trainer.config.config import CheckpointConfig
    from verl.workers.config.engine import FSDPEngineConfig
    from verl.workers.config.model import HFModelConfig
    from verl.workers.config.optimizer import FSDPOptimizerConfig
    from verl.workers.engine import EngineRegistry

    for bad in (0.0, -1e-3, float("inf"), float("nan"), True, "1e-3"):
        with pytest.raises(ParameterError) as info:
            comppo_engine.EngineSettings(tac=TAC, critic_lr=bad)  # type: ignore[arg-type]
        assert info.value.argument == "critic_lr"
    with pytest.raises(ParameterError, match="needs a TAC") as info:
        comppo_engine.EngineSettings(critic_lr=1e-3)
    assert info.value.argument == "critic_lr"
    for bad_seed in (1.5, True, "0"):
        with pytest.raises(ParameterError) as info:
            comppo_engine.EngineSettings(tac=TAC, tac_seed=bad_seed)  # type: ignore[arg-type]
        assert info.value.argument == "tac_seed"

    path, _ = model
    comppo_engine.register_engine()
    comppo_engine.configure_engine(comppo_engine.EngineSettings(tac=TAC))
    for argument, model_kwargs, strategy in (("strategy", {}, "fsdp"), ("lora_rank", {"lora_rank": 4}, "fsdp2")):
        engine = EngineRegistry.new(
            model_type=comppo_engine.MODEL_TYPE,
            backend=strategy,
            model_config=HFModelConfig(
                path=path, load_tokenizer=False, override_config={"attn_implementation": "sdpa"}, **model_kwargs
            ),
            engine_config=FSDPEngineConfig(strategy=strategy, use_torch_compile=False, forward_only=False),
            optimizer_config=FSDPOptimizerConfig(lr=1e-3),
            checkpoint_config=CheckpointConfig(),
        )
        with pytest.raises(ParameterError, match=argument) as info:
            engine.initialize()
        assert info.value.argument == argument


def test_register_engine_is_idempotent(verl_cpu: None) -> None:
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    first = comppo_engine.register_engine()
    assert comppo_engine.register_engine() is first
    assert issubclass(first, FSDPEngineWithLMHead)
    assert EngineRegistry.get_engine_cls(comppo_engine.MODEL_TYPE, "fsdp2") is first


def test_the_engine_builds_under_the_workers_model_type(model: tuple[str, Any], settings: None) -> None:
    """verl's ``TrainingWorker`` writes the registry's model_type into the model config; verl's own
    ``_build_module`` builds a language model only for "language_model": the CompPO engine builds the
    same LM (and TAC) under ``MODEL_TYPE`` and leaves the config as it found it."""
    from verl_cpu import new_engine

    path, hf_model = model
    comppo_engine.register_engine()
    comppo_engine.configure_engine(comppo_engine.EngineSettings(tac=TAC, tac_seed=5))
    engines = []
    for model_type in ("language_model", comppo_engine.MODEL_TYPE):
        engine = new_engine(path, model_type=comppo_engine.MODEL_TYPE)
        engine.model_config.model_type = model_type  # as TrainingWorker sets it; read at build time
        engine.initialize()
        assert engine.model_config.model_type == model_type
        engines.append(full_state(engine.module))
    first, second = engines
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)  # the same LM, the same seeded TAC
    lm = {k: v for k, v in first.items() if not k.startswith(comppo_engine.TAC_PREFIX)}
    assert all(torch.equal(lm[k], v) for k, v in hf_model.state_dict().items())


def test_the_tac_seed_decides_its_initialisation(model: tuple[str, Any], settings: None) -> None:
    path, _ = model

    def tac_state(seed: int) -> dict[str, torch.Tensor]:
        engine = comppo_engine_with(path, comppo_engine.EngineSettings(tac=TAC, tac_seed=seed), head_seed=None)
        return full_state(engine.module.comppo_tac)

    a, b, c = tac_state(1), tac_state(1), tac_state(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("critic_lr", [None, 3e-2])
def test_critic_lr_is_the_tacs_param_group(model: tuple[str, Any], settings: None, critic_lr: float | None) -> None:
    """``EngineSettings.critic_lr``: the TAC's parameters are a second param group of the actor's
    optimiser at that rate; verl's warm-up schedule scales both groups alike (and reports the
    actor's rate) through training steps. Without it: one group, the actor's rate."""
    import functools

    from comppo_core.integrations.verl.losses import comppo_actor_loss

    path, _ = model
    engine = comppo_engine_with(
        path,
        comppo_engine.EngineSettings(tac=TAC, critic_lr=critic_lr),
        optimizer={"lr": 1e-2, "lr_warmup_steps": 4},
    )
    tac_ids = {id(p) for p in engine.module.comppo_tac.parameters()}
    groups = engine.optimizer.param_groups
    every = [id(p) for p in engine.module.parameters()]
    if critic_lr is None:
        assert len(groups) == 1 and [id(p) for p in groups[0]["params"]] == every
        bases = [1e-2]
    else:
        assert len(groups) == 2
        assert [id(p) for p in groups[0]["params"]] == [i for i in every if i not in tac_ids]
        assert [id(p) for p in groups[1]["params"]] == [i for i in every if i in tac_ids]
        assert groups[1]["initial_lr"] == critic_lr and groups[0]["initial_lr"] == 1e-2
        bases = [1e-2, critic_lr]
    assert [g["lr"] for g in groups] == [0.0] * len(bases)  # the warm-up starts at 0
    loss_fn = functools.partial(comppo_actor_loss, config=actor_config())
    for step in range(1, 6):  # linear warm-up over 4 steps, then constant
        with engine.train_mode():
            engine.train_batch(update_batch(rollout(), seed=step), loss_function=loss_fn)
        reported = engine.lr_scheduler_step()
        factor = min(step, 4) / 4
        assert [g["lr"] for g in groups] == pytest.approx([b * factor for b in bases], rel=1e-12)
        assert reported == pytest.approx(1e-2 * factor, rel=1e-12)


def test_the_tac_is_checkpointed_with_the_actor(
    model: tuple[str, Any], settings: None, tmp_path: pytest.TempPathFactory
) -> None:
    """verl's checkpoint (FSDPCheckpointManager: model, optimizer, extra) of a trained CompPO engine,
    loaded into a fresh one (another TAC head): the same parameters, TAC included, the same AdamW
    state in both param groups, the same learning-rate schedule."""
    import functools

    from comppo_core.integrations.verl.losses import comppo_actor_loss

    path, hf_model = model
    settings_ = comppo_engine.EngineSettings(tac=TAC, critic_lr=3e-2)
    engine = comppo_engine_with(path, settings_, optimizer={"lr": 1e-2, "lr_warmup_steps": 2})
    loss_fn = functools.partial(comppo_actor_loss, config=actor_config(), cliprange_value=0.2)
    for seed in (1, 2):  # the first step at the warm-up's lr 0, the second at half the rates
        with engine.train_mode():
            engine.train_batch(update_batch(rollout(), seed=seed), loss_function=loss_fn)
        engine.lr_scheduler_step()
    folder = str(tmp_path / "global_step_1")
    engine.save_checkpoint(folder, global_step=1)

    fresh = comppo_engine_with(path, settings_, head_seed=11, optimizer={"lr": 1e-2, "lr_warmup_steps": 2})
    assert not torch.equal(
        full_state(fresh.module.comppo_tac)["head.weight"], full_state(engine.module.comppo_tac)["head.weight"]
    )
    fresh.load_checkpoint(folder, del_local_after_load=False)
    saved, loaded = full_state(engine.module), full_state(fresh.module)
    assert saved.keys() == loaded.keys() and any(k.startswith(comppo_engine.TAC_PREFIX) for k in saved)
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    names = [n for n, _ in engine.module.named_parameters()]
    for (name, p), (_, q) in zip(engine.module.named_parameters(), fresh.module.named_parameters(), strict=True):
        a, b = engine.optimizer.state[p], fresh.optimizer.state[q]
        assert a.keys() == b.keys() == {"step", "exp_avg", "exp_avg_sq"}, name
        assert all(torch.equal(full_tensor(a[k]), full_tensor(b[k])) for k in a), name
        assert float(full_tensor(a["exp_avg_sq"]).abs().max()) > 0, name  # trained: a real state
    assert [g["lr"] for g in fresh.optimizer.param_groups] == [g["lr"] for g in engine.optimizer.param_groups]
    assert fresh.lr_scheduler.state_dict() == engine.lr_scheduler.state_dict()
    assert len(names) == sum(len(g["params"]) for g in fresh.optimizer.param_groups)


@pytest.mark.slow
def test_an_update_under_gradient_checkpointing_and_the_models_own_attention(
    model: tuple[str, Any], settings: None
) -> None:
    """verl checkpoints the actor's layers by default and runs each micro-batch's backward after
    ``forward_step`` returns; on a GPU the model's attention is flash_attention_2, not the probe's
    SDPA. Eager attention stands in for it here: one TAC update with checkpointing gives the
    gradients of the same update without it (the probe stays installed through the backward, so the
    recomputation runs the attention the forward ran; before, ``CheckpointError``)."""
    import functools

    from comppo_core.integrations.verl.losses import comppo_actor_loss

    path, _ = model
    settings_ = comppo_engine.EngineSettings(tac=TAC, critic_lr=3e-2, tac_seed=0)
    loss_fn = functools.partial(comppo_actor_loss, config=actor_config(), cliprange_value=0.2)
    grads = {}
    for checkpointing in (False, True):
        engine = comppo_engine_with(path, settings_, attention="eager", gradient_checkpointing=checkpointing)
        assert engine.module.is_gradient_checkpointing == checkpointing
        with engine.train_mode():  # (leaving it frees the gradients)
            engine.train_batch(update_batch(rollout()), loss_function=loss_fn)
            grads[checkpointing] = {
                n: p.grad.full_tensor() for n, p in engine.module.named_parameters() if p.grad is not None
            }
    assert grads[True].keys() == grads[False].keys()
    assert sum(n.startswith("comppo_tac.") for n in grads[True]) >= 2  # the TAC's head and more
    assert sum(not n.startswith("comppo_tac.") for n in grads[True]) >= 10  # the actor's layers
    for name, g in grads[False].items():
        assert torch.allclose(grads[True][name], g, rtol=0, atol=TOL), name


@pytest.mark.parametrize("what", ["ulysses_sequence_parallel_size", "pad_to_length"])
def test_what_a_probed_pass_cannot_run_under_is_refused(model: tuple[str, Any], settings: None, what: str) -> None:
    """Sequence parallelism (the probe would see a slice of each sequence) and rows padded to a fixed
    length (the outputs' columns would not be the sequences'): a ParameterError naming verl's setting,
    in the old-log-prob pass and in the update."""
    path, _ = model
    engine = comppo_engine_with(path, comppo_engine.EngineSettings(tac=TAC))
    setattr(engine, what, 2 if what == "ulysses_sequence_parallel_size" else True)
    with pytest.raises(ParameterError, match=what) as info, engine.eval_mode():
        engine.infer_batch(old_log_prob_batch(rollout(), comppo_probe=True), loss_function=None)
    assert info.value.argument == what
    with pytest.raises(ParameterError, match=what), engine.train_mode():
        engine.train_batch(update_batch(rollout()), loss_function=lambda **kw: None)


def full_tensor(x: Any) -> Any:
    return x.full_tensor() if hasattr(x, "full_tensor") else x


def test_the_hf_export_leaves_the_tac_out(model: tuple[str, Any], settings: None, tmp_path: Any) -> None:
    """``save_contents`` with ``hf_model``: the Hugging Face model holds the actor's weights and no
    ``comppo_tac.*`` key (it loads without unexpected keys); the TAC is next to it in
    ``comppo_tac.safetensors``, which :func:`load_hf_tac` rebuilds with the engine's weights."""
    import json
    import warnings

    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    path, hf_model = model
    engine = comppo_engine_with(
        path,
        comppo_engine.EngineSettings(tac=TAC),
        save_contents=("model", "optimizer", "extra", "hf_model"),
    )
    folder = tmp_path / "global_step_1"
    engine.save_checkpoint(str(folder), global_step=1)
    hf_dir = folder / "huggingface"
    keys: set[str] = set()
    for file in hf_dir.glob("*.safetensors"):
        if file.name != comppo_engine.TAC_FILE:
            with safe_open(str(file), framework="pt") as f:
                keys |= set(f.keys())
    assert keys == set(hf_model.state_dict())  # the LM's keys, no comppo_tac.*
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unexpected or missing key would warn
        exported = AutoModelForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32)
    want = full_state(engine.module)
    for k, v in exported.state_dict().items():
        assert torch.equal(v, want[k].to(v.dtype)), k
    tac = comppo_engine.load_hf_tac(str(hf_dir), exported)
    with safe_open(str(hf_dir / comppo_engine.TAC_FILE), framework="pt") as f:
        assert json.loads(f.metadata()["comppo_tac"]) == {"taps": [0, 2], "width": 16, "temporal": "gru"}
    mine = full_state(engine.module.comppo_tac)
    assert tac.state_dict().keys() == mine.keys()
    assert all(torch.equal(v, mine[k]) for k, v in tac.state_dict().items())
    assert not list(hf_dir.glob("*.tmp-*"))  # written atomically, nothing left behind
    with pytest.raises(ParameterError, match="comppo_tac.safetensors") as info:
        comppo_engine.load_hf_tac(str(tmp_path), exported)
    assert info.value.argument == "path"


def test_bf16_autocast_leaves_the_tac_in_float32(model: tuple[str, Any], settings: None) -> None:
    """Under verl's default mixed precision (bf16 parameters and autocast), the TAC runs with autocast
    off on float32 parameters and taps cast to float32: its values come back float32 and equal the
    float32 TAC on those float32-cast taps; under the autocast they would not."""
    path, hf_model = model
    params = cc.GateParams(low=0.2)
    engine = comppo_engine_with(path, comppo_engine.EngineSettings(tac=TAC, gate_params=params), mixed_precision="bf16")
    seen: list[tuple[Any, bool]] = []

    def record(module: Any, args: tuple[Any, ...]) -> None:
        seen.append((args[0], torch.is_autocast_enabled("cpu")))

    hook = engine.module.comppo_tac.register_forward_pre_hook(record)
    try:
        with engine.eval_mode():
            out = engine.infer_batch(old_log_prob_batch(rollout(), comppo_probe=True), loss_function=None)[
                "model_output"
            ]
    finally:
        hook.remove()
    assert len(seen) == 2  # one call per micro-batch
    assert out["values"].values().dtype == torch.float32
    assert out["comp_gates"].values().dtype == torch.float32
    tac = plain_tac(hf_model, engine, TAC)
    values = []
    for inputs, autocast_on in seen:
        assert not autocast_on
        for h in inputs.taps.values():
            assert h.dtype == torch.float32
            assert torch.equal(h.to(torch.bfloat16).float(), h)  # the actor's bf16 taps, cast
        with torch.no_grad():
            values.append(tac(inputs))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                under_autocast = tac(inputs).float()
        assert float((under_autocast - values[-1]).abs().max()) > 1e-4  # what autocast would change
    # the engine's values are the plain TAC's, per micro-batch, in verl's per-token layout
    got = out["values"].values()
    offset = 0
    td = old_log_prob_batch(rollout())
    cu_all = td["input_ids"].offsets().to(torch.long)
    for (inputs, _), v in zip(seen, values, strict=True):
        s = inputs.columns.shape[0]
        first = int(cu_all[offset])
        cu = cu_all[offset : offset + s + 1] - first
        nested = to_nested_columns(pack_columns(v, cu, "values"), cu).values()
        assert float((got[first : first + int(cu[-1])] - nested).abs().max()) <= 1e-6
        offset += s
    assert float(got.abs().max()) > 1e-3


def _parameters(fn: Any) -> list[str]:
    import inspect

    return [
        p.name if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) else "*" * (1 + (p.kind == p.VAR_KEYWORD)) + p.name
        for p in inspect.signature(fn).parameters.values()
    ]


def test_the_verl_internals_the_engine_overrides_and_calls() -> None:
    """The verl 0.9.x methods CompPOEngine and comppo_actor_loss override or call, by signature (and, where
    the engine swaps a module attribute for one call, that verl's method calls it by that name): a verl
    release that changes one fails here, not silently in a training run."""
    import dataclasses

    import verl
    from verl.trainer.ppo.core_algos import agg_loss, compute_value_loss
    from verl.utils import tensordict_utils as tu
    from verl.utils.checkpoint import fsdp_checkpoint_manager
    from verl.utils.metric import AggregationType, Metric
    from verl.utils.torch_functional import masked_mean
    from verl.workers.config.model import HFModelConfig
    from verl.workers.config.optimizer import build_optimizer
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.base import BaseEngine
    from verl.workers.engine.fsdp import transformer_impl
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine, FSDPEngineWithLMHead
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding, response_from_nested

    assert verl.__version__.startswith("0.9.")
    # the engine
    assert _parameters(FSDPEngineWithLMHead.forward_step) == ["self", "micro_batch", "loss_function", "forward_only"]
    assert _parameters(FSDPEngineWithLMHead.prepare_model_outputs) == [
        "self",
        "output",
        "output_args",
        "micro_batch",
        "logits_processor_func",
    ]
    assert _parameters(FSDPEngine._build_module) == ["self"]
    assert "language_model" in FSDPEngine._build_module.__code__.co_consts  # the model_type it builds an LM for
    assert {"model_type", "lora_rank"} <= {f.name for f in dataclasses.fields(HFModelConfig)}
    assert _parameters(FSDPEngine._build_fsdp_module) == ["self", "module"]
    assert "apply_fsdp2" in FSDPEngine._build_fsdp_module.__code__.co_names  # _tac_sharded_first swaps it
    assert _parameters(transformer_impl.apply_fsdp2) == ["model", "fsdp_kwargs", "config"]
    assert _parameters(FSDPEngine._build_optimizer) == ["self", "module"]
    assert _parameters(build_optimizer) == ["parameters", "config"]
    assert _parameters(FSDPEngine.lr_scheduler_step) == ["self"]
    assert _parameters(FSDPEngine.get_per_tensor_param) == ["self", "layered_summon", "base_sync_done", "**kwargs"]
    assert _parameters(FSDPEngine.get_per_tensor_param_shard) == ["self", "**kwargs"]
    assert _parameters(FSDPEngine.forward_backward_batch) == ["self", "data", "loss_function", "forward_only"]
    assert _parameters(BaseEngine.train_batch) == ["self", "data", "loss_function"]
    assert _parameters(FSDPEngine.save_checkpoint) == [
        "self",
        "local_path",
        "hdfs_path",
        "global_step",
        "max_ckpt_to_keep",
        "**kwargs",
    ]
    assert _parameters(FSDPEngine.load_checkpoint) == [
        "self",
        "local_path",
        "hdfs_path",
        "del_local_after_load",
        "**kwargs",
    ]
    manager = fsdp_checkpoint_manager.FSDPCheckpointManager
    assert "get_fsdp_full_state_dict" in manager.save_checkpoint.__code__.co_names  # _hf_state_without_tac swaps it
    assert _parameters(fsdp_checkpoint_manager.get_fsdp_full_state_dict) == ["model", "offload_to_cpu", "rank0_only"]
    assert isinstance(manager.should_save_hf_model, property)
    assert _parameters(EngineRegistry.register) == ["model_type", "backend", "device", "vendor"]
    assert isinstance(EngineRegistry._engines, dict)  # register_engine reads it (registered once per process)
    assert _parameters(tu.get_non_tensor_data) == ["data", "key", "default"]
    assert _parameters(left_right_2_no_padding) == ["data"]
    assert _parameters(response_from_nested) == ["tensor", "response_mask"]
    # the actor's loss (comppo_core.integrations.verl.losses)
    assert _parameters(ppo_loss) == ["config", "model_output", "data", "dp_group"]
    assert _parameters(no_padding_2_padding) == ["tensor", "data"]
    assert _parameters(agg_loss) == [
        "loss_mat",
        "loss_mask",
        "loss_agg_mode",
        "dp_size",
        "batch_num_tokens",
        "global_batch_size",
        "loss_scale_factor",
    ]
    assert _parameters(compute_value_loss) == [
        "vpreds",
        "returns",
        "values",
        "response_mask",
        "cliprange_value",
        "loss_agg_mode",
        "dp_size",
        "batch_num_tokens",
        "global_batch_size",
        "loss_scale_factor",
    ]
    assert _parameters(masked_mean) == ["values", "mask", "axis"]
    assert _parameters(Metric.__init__) == ["self", "aggregation", "value"]
    assert {AggregationType.SUM, AggregationType.MEAN} <= set(AggregationType)
