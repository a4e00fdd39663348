"""The verl recipe: the arms' advantages, the worker, the trainer, the plugin and main_ppo (verl 0.9.1, CPU).

* :func:`~comppo_core.integrations.verl.trainer.comppo_advantages` (what the trainer runs for
  every critic arm) equals the package trainer's own computation
  (:func:`comppo_core.rl.core.step.step_gates` + :func:`~comppo_core.rl.core.step.compute_advantages`)
  on the same rollout, laid out as the package holds it (``[B, T−1]``) and as verl does
  (``[B, R]``), within 1e-6, for every arm; the controls are seeded and deterministic;
  verl's own GRPO (the grpo arm's path) equals the package's grpo arm.
* The worker: ``CompPOActorRolloutRefWorker`` built from the recipe's Hydra config, in this
  process on the CPU (tests/verl_cpu.py; verl's ``init_model``, its real actor
  ``TrainingWorker`` and the CompPO engine): the probe flag in ``compute_log_prob`` and
  ``update_actor`` as the arm needs, and the actor's loss (``comppo_actor_loss`` with a TAC,
  verl's ``ppo_loss`` otherwise).
* The trainer: ``CompPOTrainer`` (built from the recipe's config, no Ray) with an in-memory
  stand-in for the TransferQueue: the worker mapping, the response layout of the engine's
  outputs after the old-log-prob pass, and the advantages written back.
* The plugin (through verl's own entry-point discovery, in a fresh process) and main_ppo's
  preparation; then a signature test of every verl internal the recipe overrides or calls.

verl's v1 trainer imports ``transfer_queue`` (``verl[verl-core]``, which needs the compiled
``pyzmq``/``msgspec``); where it is missing, :func:`v1_trainer` installs a stand-in module
whose functions are never called (the tests give the trainer their own queue). Skipped without
verl (the main CI).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.machinery
import inspect
import logging
import os
import subprocess
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")

# verl warns at import (Ray's deprecated state API, optional engines) and the suite runs with
# filterwarnings=error: import what the recipe's worker uses once, here, quietly (as tests/verl_cpu.py)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import verl.checkpoint_engine
    import verl.single_controller.base.decorator
    import verl.trainer.ppo.core_algos
    import verl.workers.engine_workers
    import verl.workers.utils.losses  # noqa: F401

import numpy as np  # noqa: E402
import torch  # noqa: E402
from verl_cpu import TAU, CPUPlatform, as_no_padding, cpu_process_group, old_log_prob_batch, rollout, tiny_llama  # noqa: E402

import comppo_core  # noqa: E402
from comppo_core import controls  # noqa: E402
from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.integrations.verl import engine as comppo_engine  # noqa: E402
from comppo_core.integrations.verl.config import RECIPE_ARMS, CompPOConfig, parse, prepare_verl_config  # noqa: E402
from comppo_core.integrations.verl.layout import response_layout  # noqa: E402
from comppo_core.integrations.verl.main_ppo import CONFIG_DIR, CONFIG_NAME, PLUGIN_MODULE  # noqa: E402
from comppo_core.integrations.verl.trainer import arm_gates, comppo_advantages  # noqa: E402
from comppo_core.rl.core.arms import ARMS  # noqa: E402
from comppo_core.rl.core.step import (  # noqa: E402
    AdvantageSettings,
    ScoringSettings,
    compute_advantages,
    step_gates,
    terminal_rewards,  # noqa: E402
)

TOL = 1e-6

# ---------------------------------------------------------------------------------------------------------
# the arms' advantages against the package's trainer


def package_rollout(seed: int = 3) -> dict[str, Any]:
    """A rollout as the package holds it (``[B, T−1]`` columns: left-padded prompts of width P, then the
    responses) and the same numbers in verl's response layout ``[B, R]`` (columns P−1 … P−2+R)."""
    g = torch.Generator().manual_seed(seed)
    b, p, r = 6, 4, 7
    lengths = torch.tensor([7, 3, 5, 1, 6, 4])
    resp = torch.zeros(b, r, dtype=torch.bool)
    for i, n in enumerate(lengths.tolist()):
        resp[i, :n] = True
    resp[0, 2] = False  # a tool token inside a response
    resp[4, 1] = False
    cols = p + r - 1
    resp_pkg = torch.zeros(b, cols, dtype=torch.bool)
    resp_pkg[:, p - 1 : p - 1 + r] = resp
    low, high = 0.8, 1.0
    gates_pkg = torch.where(resp_pkg, low + (high - low) * torch.rand(b, cols, generator=g), 1.0)
    values_pkg = torch.randn(b, cols, generator=g)
    scores = torch.randn(b, generator=g)
    rewards_pkg = terminal_rewards(resp_pkg, scores)
    window = slice(p - 1, p - 1 + r)
    return {
        "resp_pkg": resp_pkg,
        "gates_pkg": gates_pkg,
        "values_pkg": values_pkg,
        "rewards_pkg": rewards_pkg,
        "conc_pkg": torch.rand(b, cols, generator=g),
        "groups": torch.tensor([0, 0, 0, 1, 1, 1]),
        "resp": resp,
        "gates": gates_pkg[:, window].clone(),
        "values": values_pkg[:, window].clone(),
        "rewards": rewards_pkg[:, window].clone(),
        "window": window,
        "low": low,
    }


def package_advantages(comppo: CompPOConfig, data: dict[str, Any], *, step: int, gamma: float, lam: float) -> Any:
    """What the package's trainer computes for the arm: its step's gates (step_gates, applied as
    rl.forward applies them: 1 off the response) and compute_advantages."""
    arm = ARMS[comppo.arm]
    resp = data["resp_pkg"]
    settings = ScoringSettings(gate_params=comppo.gate_params, fixed_gate=comppo.fixed_gate)
    given = step_gates(arm, settings, step=step, seed=comppo.seed, shape=tuple(resp.shape), device=resp.device)
    own = data["gates_pkg"]
    gates: torch.Tensor | None
    if not arm.gate_source.gated:
        gates = None
    elif given is None:
        gates = own
    elif callable(given):
        gates = torch.where(resp, given(own, data["conc_pkg"], resp).float(), 1.0)
    else:
        gates = torch.where(resp, given, 1.0)
    adv, ret, _ = compute_advantages(
        arm,
        data["rewards_pkg"],
        resp,
        values=data["values_pkg"],
        gates=gates,
        groups=data["groups"],
        settings=AdvantageSettings(gamma=gamma, lam=lam, lam_critic=comppo.lam_critic, whiten=comppo.whiten),
    )
    assert ret is not None
    return adv, ret


CRITIC_ARMS = [a for a in RECIPE_ARMS if a != "grpo"]


@pytest.mark.parametrize("arm", CRITIC_ARMS)
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"fixed_gate": 0.93, "seed": 5, "lam_critic": None},
        {"whiten": False, "lam_critic": 0.9, "seed": 11},
    ],
    ids=["defaults", "fixed_gate-seed-lam_critic_none", "unwhitened-lam_critic"],
)
def test_arm_advantages_equal_the_package_trainers(arm: str, extra: dict[str, Any]) -> None:
    data = package_rollout()
    comppo = parse({"arm": arm, "gate": {"low": data["low"]}, **extra})
    gamma, lam, step = 0.99, 0.9, 4
    want_adv, want_ret = package_advantages(comppo, data, step=step, gamma=gamma, lam=lam)
    snapshot = {k: v.clone() for k, v in data.items() if isinstance(v, torch.Tensor)}
    adv, ret = comppo_advantages(
        comppo,
        data["rewards"],
        data["resp"],
        values=data["values"],
        gates=data["gates"],
        gamma=gamma,
        lam=lam,
        step=step,
    )
    w, m = data["window"], data["resp"]
    assert adv.shape == ret.shape == m.shape
    assert torch.allclose(adv, want_adv[:, w], atol=TOL, rtol=0)
    assert torch.allclose(ret, want_ret[:, w], atol=TOL, rtol=0)
    assert (adv[~m] == 0).all() and (ret[~m] == 0).all()
    assert float(adv[m].abs().max()) > 0.1  # not vacuous
    for k, v in snapshot.items():
        assert torch.equal(data[k], v), k  # inputs unchanged


def test_the_arms_gates_differ_where_the_package_says() -> None:
    """The gates the arms' advantages read: concentration = as given; a control changes them but keeps
    (shuffle: each row's multiset) or averages them; a constant is one value; ppo has none."""
    data = package_rollout()
    m, g = data["resp"], data["gates"]
    gates = {a: arm_gates(parse({"arm": a, "gate": {"low": 0.8}}), g, m, step=2) for a in CRITIC_ARMS}
    assert gates["ppo"] is None
    for a in ("comp_gae", "comppo"):
        assert torch.equal(gates[a], torch.where(m, g, 1.0))
    for a in ("ppo_fixed", "tac_fixed"):
        assert torch.allclose(gates[a][m], g[m].double().mean().float().expand(int(m.sum())), atol=1e-7)
    shuffled = gates["comppo_shuffle"]
    assert not torch.equal(shuffled, torch.where(m, g, 1.0))
    for i in range(m.shape[0]):
        assert torch.equal(shuffled[i][m[i]].sort().values, g[i][m[i]].sort().values)
    assert torch.allclose(gates["comppo_inverted"][m], (0.8 + 1.0) - g[m])
    for a, gv in gates.items():
        if gv is not None:
            assert (gv[~m] == 1).all(), a
    fixed = arm_gates(parse({"arm": "tac_fixed", "fixed_gate": 0.5}), g, m, step=0)
    assert fixed is not None and (fixed[m] == 0.5).all()


def test_the_controls_are_seeded_and_deterministic() -> None:
    data = package_rollout()
    m, g = data["resp"], data["gates"]

    def shuffle(seed: int, step: int) -> torch.Tensor:
        out = arm_gates(parse({"arm": "comppo_shuffle", "seed": seed}), g, m, step=step)
        assert out is not None
        return out

    first = shuffle(3, 7)
    assert torch.equal(first, shuffle(3, 7))  # same seed and step: the same permutation
    assert not torch.equal(first, shuffle(3, 8))  # another step
    assert not torch.equal(first, shuffle(4, 7))  # another seed
    expected = torch.as_tensor(controls.shuffle(torch.where(m, g, 1.0), mask=m, seed=3 * 1_000_003 + 7))
    assert torch.equal(first, torch.where(m, expected.float(), 1.0))
    position = arm_gates(parse({"arm": "comppo_position"}), g, m, step=0)
    assert position is not None
    assert torch.equal(position, arm_gates(parse({"arm": "comppo_position"}), g, m, step=9))  # no randomness


def test_bad_inputs_are_refused() -> None:
    data = package_rollout()
    m, g, r, v = data["resp"], data["gates"], data["rewards"], data["values"]
    with pytest.raises(ParameterError, match="gates"):
        comppo_advantages(parse({"arm": "comppo"}), r, m, values=v, gates=None, gamma=1.0, lam=1.0, step=0)
    with pytest.raises(ParameterError, match="gates"):
        comppo_advantages(parse({"arm": "comppo"}), r, m, values=v, gates=g[:, :3], gamma=1.0, lam=1.0, step=0)
    with pytest.raises(ParameterError, match="values"):
        comppo_advantages(parse({"arm": "tac_fixed"}), r, m, values=None, gates=g, gamma=1.0, lam=1.0, step=0)
    with pytest.raises(ParameterError, match="comppo.arm"):
        comppo_advantages(parse({"arm": "grpo"}), r, m, values=v, gates=g, gamma=1.0, lam=1.0, step=0)


def test_verls_grpo_equals_the_packages_grpo_arm() -> None:
    """The grpo arm runs verl's own GRPO unchanged: the package's grpo arm (group_method='grpo') on groups of
    two or more. A group of one differs: verl gives its raw score (over 1 + ε), the package 0
    (``group_advantages(singleton="zero")``; ``singleton="raw"`` is verl's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from comppo_core.outcomes import broadcast, group_advantages

    data = package_rollout()
    for groups in (torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([2, 0, 2, 1, 0, 1])):
        adv_verl, _ = compute_grpo_outcome_advantage(
            data["rewards"], data["resp"].float(), index=np.array(groups.tolist(), dtype=object)
        )
        adv_pkg, ret, _ = compute_advantages(
            ARMS["grpo"],
            data["rewards_pkg"],
            data["resp_pkg"],
            values=None,
            gates=None,
            groups=groups,
            settings=AdvantageSettings(group_method="grpo"),
        )
        assert ret is None
        assert torch.allclose(adv_verl, adv_pkg[:, data["window"]].to(adv_verl.dtype), atol=TOL, rtol=0)
        assert float(adv_verl.abs().max()) > 0.1
    singleton = torch.tensor([0, 0, 0, 1, 1, 2])
    adv_verl, _ = compute_grpo_outcome_advantage(
        data["rewards"], data["resp"].float(), index=np.array(singleton.tolist(), dtype=object)
    )
    raw = group_advantages(data["rewards"].double().sum(-1), singleton, method="grpo", singleton="raw")
    raw[5] /= 1.0 + 1e-6  # verl: (score − 0)/(1 + ε) for a group of one
    want = torch.as_tensor(broadcast(torch.as_tensor(raw).float(), mask=data["resp"]))
    assert torch.allclose(adv_verl, want, atol=TOL, rtol=0)
    assert float(adv_verl[5].abs().max()) > 0.1  # the package's grpo arm gives this row 0


# ---------------------------------------------------------------------------------------------------------
# the worker, on the CPU


def save_tokenizer(path: str) -> None:
    """A tiny word-level tokenizer next to the tiny model (verl's model config loads one)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<s>", "</s>", "<pad>", *"0123456789"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>").save_pretrained(
        path
    )


class _CPUDevice:
    """``torch.cpu`` with the memory statistics verl's workers log (0) and the calls they make."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def memory_allocated(*args: Any, **kwargs: Any) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
        return (1 << 30, 1 << 30)

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def get_device_name(*args: Any) -> str:
        return "cpu"


class _WorkerPlatform(CPUPlatform):
    """tests/verl_cpu.py's CPU platform for verl's whole worker (it logs memory and FLOPs)."""

    @property
    def device_module(self) -> Any:
        return _CPUDevice()


@pytest.fixture(scope="module")
def worker_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from verl.plugin.platform import platform_manager

    torch.set_num_threads(1)
    path = str(tmp_path_factory.mktemp("verl-recipe") / "tiny")
    tiny_llama(path)
    save_tokenizer(path)
    with cpu_process_group():
        platform_manager.set_platform(_WorkerPlatform())  # cpu_process_group restores the previous one on exit
        saved = comppo_engine.engine_settings()
        try:
            yield path
        finally:
            comppo_engine.configure_engine(saved)


def recipe_config(path: str, *overrides: str) -> Any:
    """The recipe's config for one CPU process: fsdp2, float32, sdpa, 2 micro-batches of 2."""
    from hydra import compose, initialize_config_dir

    base = [
        f"actor_rollout_ref.model.path={path}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype: fp32, reduce_dtype: fp32, buffer_dtype: fp32}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=0.01",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "comppo.tac.width=16",
        "comppo.tac.taps=[0,2]",
        "comppo.tac.temporal=gru",
        "trainer.n_gpus_per_node=1",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=[*base, *overrides])
    prepare_verl_config(cfg)
    return cfg


def update_batch(batch: dict[str, torch.Tensor], old: Any, seed: int = 0) -> Any:
    """What the v1 trainer hands ``update_actor`` (the TransferQueue's layout: prompts, responses and the
    response mask nested to their real lengths), with the old-log-prob pass's outputs and made-up
    advantages and returns."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import response_from_nested, response_to_nested

    td = as_no_padding(batch)
    tu.pop(td, "max_response_len")
    am, p = batch["attention_mask"], batch["prompts"].shape[1]
    lengths = am[:, p:].sum(1)
    b = lengths.numel()

    def nested(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    rm = nested([batch["response_mask"][i, : lengths[i]] for i in range(b)])
    td["response_mask"] = rm
    td["prompts"] = nested([batch["prompts"][i][am[i, :p].bool()] for i in range(b)])
    td["responses"] = nested([batch["responses"][i, : lengths[i]] for i in range(b)])
    td["old_log_probs"] = response_from_nested(old["log_probs"], rm)
    g = torch.Generator().manual_seed(seed)
    width = int(lengths.max())
    td["advantages"] = response_to_nested(torch.randn(b, width, generator=g), rm)
    td["returns"] = response_to_nested(torch.randn(b, width, generator=g), rm)
    if "values" in old.keys():
        td["values"] = response_from_nested(old["values"], rm)
    tu.assign_non_tensor(
        td,
        temperature=TAU,
        mini_batch_size=b,
        epochs=1,
        seed=1,
        dataloader_kwargs={"shuffle": False},
        calculate_entropy=False,
        global_batch_size=b,
    )
    return td


def get_non_tensor(td: Any, key: str) -> bool:
    from verl.utils import tensordict_utils as tu

    return bool(tu.get_non_tensor_data(data=td, key=key, default=False))


def probe_flags(worker: Any) -> list[bool]:
    """Records the ``comppo_probe`` flag of every micro-batch the actor's engine runs."""
    from verl.utils import tensordict_utils as tu

    seen: list[bool] = []
    engine = worker.actor.engine
    forward_step = engine.forward_step

    def spy(micro_batch: Any, loss_function: Any, forward_only: bool) -> Any:
        seen.append(bool(tu.get_non_tensor_data(data=micro_batch, key="comppo_probe", default=False)))
        return forward_step(micro_batch, loss_function, forward_only)

    engine.forward_step = spy
    return seen


def build_worker(path: str, arm: str) -> Any:
    from comppo_core.integrations.verl.worker import worker_classes

    training_cls, worker_cls = worker_classes()
    cfg = recipe_config(path, f"comppo.arm={arm}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what init_model imports on the way (verl's own warnings)
        worker = worker_cls(cfg.actor_rollout_ref, role="actor")
        worker.init_model()
    assert type(worker.actor) is training_cls
    assert type(worker.actor.engine).__name__ == "CompPOEngine"
    return worker


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["comp_gae", "grpo"])
def test_worker_without_a_tac_keeps_verls_loss(worker_env: str, arm: str) -> None:
    from verl.workers.utils.losses import ppo_loss

    worker = build_worker(worker_env, arm)
    assert isinstance(worker.loss_fn, functools.partial) and worker.loss_fn.func is ppo_loss
    assert worker.actor.loss_fn is worker.loss_fn
    assert comppo_engine.engine_settings().tac is None
    seen = probe_flags(worker)
    batch = rollout()
    out = worker.compute_log_prob(old_log_prob_batch(batch))
    probed = arm == "comp_gae"  # concentration gates for Comp-GAE with verl's critic; none for grpo
    assert seen == [probed, probed]
    assert ("comp_gates" in out.keys()) == probed and "values" not in out.keys()
    if probed:
        td = as_no_padding(batch)
        gates = response_layout(out["comp_gates"], batch["response_mask"], batch["attention_mask"])
        m = batch["response_mask"].bool()
        assert ((gates[m] >= 0.9) & (gates[m] <= 1.0)).all() and float(gates[m].min()) < 0.99
        assert td["input_ids"].offsets()[-1] == out["comp_gates"].values().numel()
    seen.clear()
    result = worker.update_actor(update_batch(batch, out))
    assert seen == [False, False]  # verl's critic (or none): the actor's update runs no probe
    assert np.isfinite(np.mean(result["metrics"]["actor/pg_loss"]))


@pytest.mark.slow
def test_worker_with_a_tac_probes_both_passes_and_trains_the_tac(worker_env: str) -> None:
    losses = pytest.importorskip("comppo_core.integrations.verl.losses")
    worker = build_worker(worker_env, "comppo")
    loss = worker.loss_fn
    assert isinstance(loss, functools.partial) and loss.func is losses.comppo_actor_loss
    assert loss.keywords["vf_coef"] == 0.5 and loss.keywords["cliprange_value"] == 0.5
    assert type(loss.keywords["config"]).__name__ == "FSDPActorConfig"
    assert worker.actor.loss_fn is loss
    settings = comppo_engine.engine_settings()
    assert settings.tac is not None and settings.tac["width"] == 16 and settings.tac_seed == 0
    tac = worker.actor.engine.module.comppo_tac
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the TAC's head starts at 0 (values 0, gradients only into the head): randomise it
        for p in tac.head.parameters():
            p.to_local().copy_(0.5 * torch.randn(p.to_local().shape, generator=g))
    seen = probe_flags(worker)
    batch = rollout()
    out = worker.compute_log_prob(old_log_prob_batch(batch))
    assert seen == [True, True]
    assert {"log_probs", "comp_gates", "values", "concentration"} <= set(out.keys())
    assert float(out["values"].values().abs().max()) > 1e-3
    grads: dict[str, float] = {}
    engine = worker.actor.engine
    optimizer_step = engine.optimizer_step

    def record() -> Any:
        for name, p in tac.named_parameters():
            grads[name] = 0.0 if p.grad is None else float(p.grad.full_tensor().abs().max())
        return optimizer_step()

    engine.optimizer_step = record
    seen.clear()
    result = worker.update_actor(update_batch(batch, out))
    assert seen == [True, True]
    assert np.isfinite(np.mean(result["metrics"]["loss"]))
    # the TAC's value loss reached every TAC parameter through the actor's loss
    assert grads and all(v > 0 for v in grads.values()), grads
    # the reference's pass of a LoRA actor (verl sends it to compute_log_prob with no_lora_adapter) runs no probe
    handed: list[Any] = []
    worker.actor.infer_batch = handed.append
    worker.compute_log_prob(old_log_prob_batch(batch, no_lora_adapter=True))
    worker.compute_log_prob(old_log_prob_batch(batch))
    flags = [get_non_tensor(td, "comppo_probe") for td in handed]
    assert flags == [False, True]


@pytest.mark.slow
def test_worker_refuses_a_config_without_the_block(worker_env: str) -> None:
    from omegaconf import open_dict

    from comppo_core.integrations.verl.worker import worker_classes

    cfg = recipe_config(worker_env)
    with open_dict(cfg.actor_rollout_ref):
        del cfg.actor_rollout_ref["comppo"]
    with pytest.raises(ParameterError, match="actor_rollout_ref.comppo"):
        worker_classes()[1](cfg.actor_rollout_ref, role="actor")


# ---------------------------------------------------------------------------------------------------------
# the trainer, with an in-memory TransferQueue


def v1_trainer() -> types.ModuleType:
    """verl's v1 trainer_base (``transfer_queue`` stood in for where it is missing: module docstring)."""
    try:
        import transfer_queue  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("transfer_queue")
        stand_in.__doc__ = "a stand-in for verl's TransferQueue in the recipe's tests: nothing in it is called"

        class KVBatchMeta:  # the one name verl imports from it at module level
            pass

        stand_in.KVBatchMeta = KVBatchMeta  # type: ignore[attr-defined]
        sys.modules["transfer_queue"] = stand_in
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from verl.trainer.ppo.v1 import trainer_base, trainer_sync  # noqa: F401
    except ImportError as exc:  # fastapi / uvicorn: verl[verl-core]
        pytest.skip(f"verl's v1 trainer does not import here ({exc}); pip install 'verl[verl-core]'")
    return trainer_base


@dataclasses.dataclass
class Meta:
    """The KVBatchMeta the trainer passes around: keys, partition, extra info."""

    keys: list[str]
    partition_id: str = "train"
    extra_info: dict[str, Any] = dataclasses.field(default_factory=dict)
    tags: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)


class Queue:
    """An in-memory TransferQueue of one batch: field name → the batch's tensor."""

    def __init__(self, fields: dict[str, torch.Tensor]) -> None:
        self.fields = dict(fields)
        self.puts: list[list[str]] = []

    def kv_batch_get(self, keys: list[str], partition_id: str, select_fields: list[str]) -> Any:
        from verl.utils import tensordict_utils as tu

        return tu.get_tensordict({f: self.fields[f] for f in select_fields if f in self.fields})

    def kv_batch_put(self, keys: list[str], partition_id: str, fields: Any) -> Meta:
        self.puts.append(sorted(fields.keys()))
        for name in fields.keys():
            self.fields[name] = fields[name]
        return Meta(list(keys), partition_id)


def nested(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


@pytest.fixture(scope="module")
def trainer_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    trainer_base = v1_trainer()
    from comppo_core.integrations.verl.trainer import register_trainer

    cls = register_trainer()
    saved = trainer_base.tq
    yield trainer_base, cls
    trainer_base.tq = saved


def make_trainer(cls: Any, arm: str, *overrides: str) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=[f"comppo.arm={arm}", "trainer.n_gpus_per_node=1", *overrides])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = cls(cfg)
    trainer.global_steps = 3
    return trainer


@pytest.mark.slow
def test_the_trainer_maps_the_actor_to_the_compppo_worker(trainer_env: Any) -> None:
    from verl.trainer.ppo.utils import Role

    from comppo_core.integrations.verl.worker import worker_classes

    _, cls = trainer_env
    for arm, critic in (("comppo", False), ("comp_gae", True), ("grpo", False)):
        trainer = make_trainer(cls, arm)
        assert trainer.comppo.arm == arm and trainer.use_critic is critic
        assert trainer.config.actor_rollout_ref.comppo.arm == arm  # __init__ prepared the config
        trainer._init_resource_pool_mgr()
        mapping = trainer.role_worker_mapping
        actor_roles = [r for r in (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor) if r in mapping]
        assert len(actor_roles) == 1
        assert mapping[actor_roles[0]].__ray_metadata__.class_name == worker_classes()[1].__name__
        if critic:
            assert mapping[Role.Critic].__ray_metadata__.class_name == "TrainingWorker"  # verl's own critic
        else:
            assert Role.Critic not in mapping


def old_log_prob_queue(lengths: list[tuple[int, int]], seed: int = 0) -> tuple[Queue, dict[str, torch.Tensor]]:
    """What the actor's old-log-prob pass leaves in the queue: per-token nested outputs (prompt + response
    tokens per sequence) and the nested response mask."""
    g = torch.Generator().manual_seed(seed)
    per_token = {
        name: nested([torch.rand(p + r, generator=g) for p, r in lengths])
        for name in ("log_probs", "entropy", "comp_gates", "values", "concentration")
    }
    rm = nested([torch.ones(r, dtype=torch.long) for _, r in lengths])
    rollout_side = {  # what the rollout put there (verl compares its log-probs with the actor's)
        "responses": nested([torch.randint(3, 60, (r,), generator=g) for _, r in lengths]),
        "rollout_log_probs": nested([-torch.rand(r, generator=g) for _, r in lengths]),
    }
    return Queue({**per_token, **rollout_side, "response_mask": rm}), per_token


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arm", "moved"), [("comppo", {"comp_gates", "values"}), ("comp_gae", {"comp_gates"}), ("grpo", set())]
)
def test_old_log_prob_moves_the_engines_outputs_to_the_response_layout(
    trainer_env: Any, arm: str, moved: set[str]
) -> None:
    trainer_base, cls = trainer_env
    trainer = make_trainer(cls, arm)
    lengths = [(4, 3), (2, 5), (6, 1)]
    queue, per_token = old_log_prob_queue(lengths)
    trainer_base.tq = queue

    class WorkerGroup:
        def compute_log_prob(self, batch: Meta) -> Meta:
            self.extra = dict(batch.extra_info)
            return batch

    trainer.actor_rollout_wg = WorkerGroup()
    metrics: dict[str, Any] = {}
    trainer._compute_old_log_prob(Meta([f"u{i}_0_0" for i in range(3)]), metrics)
    assert "actor/entropy" in metrics  # verl's own step ran
    rm = queue.fields["response_mask"]
    widths = [r for _, r in lengths]
    padded_mask = torch.zeros(3, max(widths), dtype=torch.long)
    for i, r in enumerate(widths):
        padded_mask[i, :r] = 1
    for name in ("comp_gates", "values"):
        got = queue.fields[name]
        if name in moved:
            # verl's response_from_nested, as the package's layout.response_layout reads it
            want = response_layout(per_token[name], rm)
            assert torch.equal(got.to_padded_tensor(0.0), want)
            assert got.offsets().diff().tolist() == widths
        else:
            assert got is per_token[name]  # untouched
    assert queue.fields["concentration"] is per_token["concentration"]
    assert torch.equal(queue.fields["old_log_probs"].to_padded_tensor(0.0), response_layout(per_token["log_probs"], rm))


def advantage_queue(arm_has_gates: bool, seed: int = 1) -> tuple[Queue, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    widths = [5, 3, 6, 2, 4, 4]
    rm = nested([torch.ones(w, dtype=torch.long) for w in widths])
    scores = torch.randn(len(widths), generator=g)
    rm_scores = nested([torch.cat([torch.zeros(w - 1), scores[i : i + 1]]) for i, w in enumerate(widths)])
    fields = {
        "uid": torch.tensor([0, 0, 0, 1, 1, 1]),
        "response_mask": rm,
        "rm_scores": rm_scores,
        "old_log_probs": nested([torch.randn(w, generator=g) for w in widths]),
        "values": nested([torch.randn(w, generator=g) for w in widths]),
    }
    if arm_has_gates:
        fields["comp_gates"] = nested([0.9 + 0.1 * torch.rand(w, generator=g) for w in widths])
    return Queue(fields), fields


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["comppo", "comppo_shuffle", "tac_fixed", "comp_gae", "ppo"])
def test_compute_advantage_runs_the_arm(trainer_env: Any, arm: str) -> None:
    trainer_base, cls = trainer_env
    trainer = make_trainer(cls, arm, "algorithm.gamma=0.99", "algorithm.lam=0.9")
    queue, fields = advantage_queue(ARMS[arm].gate_source.gated)
    trainer_base.tq = queue
    keys = [f"u{u}_{i}_0" for i, u in enumerate(fields["uid"].tolist())]  # uid_session_turn: one session a sample
    metrics: dict[str, Any] = {}
    trainer._compute_advantage(Meta(keys), metrics)
    assert queue.puts == [["advantages", "returns"]]
    m = fields["response_mask"].to_padded_tensor(0).bool()
    gates = fields["comp_gates"].to_padded_tensor(0.0) if "comp_gates" in fields else None
    want_adv, want_ret = comppo_advantages(
        trainer.comppo,
        fields["rm_scores"].to_padded_tensor(0.0),
        m,
        values=fields["values"].to_padded_tensor(0.0),
        gates=gates,
        gamma=0.99,
        lam=0.9,
        step=3,
    )
    adv, ret = queue.fields["advantages"], queue.fields["returns"]
    assert adv.is_nested and adv.offsets().diff().tolist() == m.sum(1).tolist()
    assert torch.allclose(adv.to_padded_tensor(0.0), want_adv, atol=TOL, rtol=0)
    assert torch.allclose(ret.to_padded_tensor(0.0), want_ret, atol=TOL, rtol=0)
    assert ("comppo/gate_mean" in metrics) == ARMS[arm].gate_source.gated


@pytest.mark.slow
def test_compute_advantage_of_grpo_is_verls(trainer_env: Any) -> None:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    trainer_base, cls = trainer_env
    trainer = make_trainer(cls, "grpo", "actor_rollout_ref.rollout.n=3")
    queue, fields = advantage_queue(False)
    del queue.fields["values"]
    trainer_base.tq = queue
    keys = [f"u{u}_{i}_0" for i, u in enumerate(fields["uid"].tolist())]  # uid_session_turn: one session a sample
    trainer._compute_advantage(Meta(keys), {})
    m = fields["response_mask"].to_padded_tensor(0).float()
    want, _ = compute_grpo_outcome_advantage(
        fields["rm_scores"].to_padded_tensor(0.0), m, index=np.array(fields["uid"].tolist(), dtype=object)
    )
    assert torch.allclose(queue.fields["advantages"].to_padded_tensor(0.0), want, atol=TOL, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# the plugin and main_ppo


@pytest.mark.slow
def test_the_plugin_registers_both_and_is_idempotent(trainer_env: Any) -> None:
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, get_trainer_cls
    from verl.workers.engine import EngineRegistry

    from comppo_core.integrations.verl import plugin

    assert plugin.PLUGIN_MODULE == plugin.__name__ == PLUGIN_MODULE  # main_ppo's name for it
    first = plugin.register()
    assert plugin.register() == first
    engine_cls, trainer_cls = first
    assert get_trainer_cls("comppo") is trainer_cls and TRAINER_REGISTRY["comppo"] is trainer_cls
    assert EngineRegistry._engines[comppo_engine.MODEL_TYPE]["fsdp2"]["cuda"] is engine_cls
    assert trainer_cls.__mro__[1].__name__ == "PPOTrainerSync"


def test_a_failing_plugin_logs_loudly(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import importlib

    import comppo_core.integrations.verl.trainer as trainer_module

    def missing() -> None:
        raise ImportError("No module named 'transfer_queue'")

    monkeypatch.setattr(trainer_module, "register_trainer", missing)
    monkeypatch.delitem(sys.modules, "comppo_core.integrations.verl.plugin", raising=False)
    with caplog.at_level(logging.ERROR), pytest.raises(ImportError, match="transfer_queue"):
        importlib.import_module("comppo_core.integrations.verl.plugin")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "verl[verl-core]" in errors[0].getMessage()
    assert "transfer_queue" in errors[0].getMessage()


def _verl_process(tmp_path: Path, code: str, *, entry_point: bool, fail: bool) -> subprocess.CompletedProcess[str]:
    """A fresh Python importing verl, with comppo_core's plugin found by verl's own discovery: an installed
    ``verl.plugins`` entry point (a dist-info on the path) or ``VERL_USE_EXTERNAL_MODULES``. ``fail``: a
    ``transfer_queue`` that fails to import shadows any real one."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("VERL_USE_EXTERNAL_MODULES", None)
    if entry_point:
        dist = site / "comppo_recipe_test-0.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: comppo-recipe-test\nVersion: 0\n")
        (dist / "entry_points.txt").write_text(f"[verl.plugins]\ncomppo = {PLUGIN_MODULE}\n")
    else:
        env["VERL_USE_EXTERNAL_MODULES"] = PLUGIN_MODULE
    if fail:
        (site / "transfer_queue.py").write_text("raise ImportError('transfer_queue is broken here')\n")
    elif importlib.machinery.PathFinder.find_spec("transfer_queue") is None:  # not installed: a stand-in
        (site / "transfer_queue.py").write_text("class KVBatchMeta:\n    pass\n")
    # the comppo_core this process imports (the checkout's python/, or site-packages where it is installed)
    package_root = Path(comppo_core.__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(package_root), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )


REGISTERED = (
    "import verl\n"
    "from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY\n"
    "from verl.workers.engine import EngineRegistry\n"
    "print(TRAINER_REGISTRY['comppo'].__name__, sorted(EngineRegistry._engines['comppo_language_model']))\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("entry_point", [True, False], ids=["entry-point", "VERL_USE_EXTERNAL_MODULES"])
def test_verl_loads_the_plugin_in_a_fresh_process(tmp_path: Path, entry_point: bool) -> None:
    v1_trainer()  # skips where verl's v1 trainer cannot import
    done = _verl_process(tmp_path, REGISTERED, entry_point=entry_point, fail=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CompPOTrainer ['fsdp', 'fsdp2']" in done.stdout


@pytest.mark.slow
def test_verl_skips_a_failing_plugin_but_it_says_so(tmp_path: Path) -> None:
    code = "import verl\nprint('imported')\n"
    done = _verl_process(tmp_path, code, entry_point=True, fail=True)
    assert done.returncode == 0 and "imported" in done.stdout  # verl swallows it (debug level) ...
    assert "could not register the CompPO engine and the 'comppo' trainer" in done.stderr  # ... we do not
    assert "transfer_queue is broken here" in done.stderr


def test_main_ppo_prepares_the_config_and_the_ray_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir

    from comppo_core.integrations.verl import main_ppo

    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "some.other.plugin")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name=CONFIG_NAME, overrides=["comppo.arm=comp_gae"])
    comppo = main_ppo.prepare(cfg)
    assert comppo.arm == "comp_gae" and cfg.critic.enable is True
    assert os.environ["VERL_USE_EXTERNAL_MODULES"] == f"some.other.plugin,{PLUGIN_MODULE}"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == PLUGIN_MODULE
    main_ppo.prepare(cfg)  # idempotent: the plugin is named once
    assert os.environ["VERL_USE_EXTERNAL_MODULES"] == f"some.other.plugin,{PLUGIN_MODULE}"
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES == PLUGIN_MODULE
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        bad = compose(config_name=CONFIG_NAME, overrides=["comppo.arm=comppo", "critic.enable=true"])
    with pytest.raises(ParameterError, match="critic.enable"):
        main_ppo.prepare(bad)


@pytest.mark.slow
def test_main_ppo_hands_the_prepared_config_to_verls_main(
    trainer_env: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``python -m comppo_core.integrations.verl.main_ppo`` with verl's main replaced by a recorder: the
    Hydra command line composes the recipe's config, prepares it and passes it on (no Ray)."""
    from verl.trainer import main_ppo as verl_main_ppo

    from comppo_core.integrations.verl import main_ppo

    received: list[Any] = []
    monkeypatch.setattr(verl_main_ppo, "main", received.append)
    monkeypatch.setattr(sys, "argv", ["main_ppo", "comppo.arm=comppo_position", "hydra.run.dir=."])
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    monkeypatch.chdir(tmp_path)  # Hydra writes .hydra/ and main_ppo.log into its run dir
    main_ppo.main()
    assert len(received) == 1
    cfg = received[0]
    assert (cfg.comppo.arm, cfg.actor_rollout_ref.comppo.arm) == ("comppo_position", "comppo_position")
    assert (cfg.algorithm.adv_estimator, cfg.critic.enable, cfg.trainer.v1.trainer_mode) == ("gae", False, "comppo")


# ---------------------------------------------------------------------------------------------------------
# the verl internals the recipe overrides or calls (verl 0.9.x: a change fails here, not in a run)


def _params(fn: Any) -> list[str]:
    """The parameter names (without the ``_ray_trace_ctx`` Ray adds to a class it has made remote)."""
    return [p for p in inspect.signature(inspect.unwrap(fn)).parameters if p != "_ray_trace_ctx"]


@pytest.mark.slow
def test_the_verl_internals_the_recipe_overrides_and_calls(trainer_env: Any) -> None:
    import verl
    from verl.single_controller.base.decorator import (
        MAGIC_ATTR,
        Dispatch,
        make_nd_compute_dataproto_dispatch_fn,
        register,
    )
    from verl.trainer import main_ppo as verl_main_ppo
    from verl.trainer.ppo import ray_trainer, rollout_corr_helper
    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1 import trainer_base, trainer_sync
    from verl.utils import tensordict_utils as tu
    from verl.workers import engine_workers
    from verl.workers.config.engine import TrainingWorkerConfig
    from verl.workers.utils import losses, padding

    from comppo_core.integrations.verl.worker import worker_classes

    assert verl.__version__.startswith("0.9."), verl.__version__
    # the trainer
    sync = trainer_sync.PPOTrainerSync
    assert issubclass(sync, trainer_base.PPOTrainer) and trainer_base.TRAINER_REGISTRY["sync"] is sync
    assert _params(trainer_base.PPOTrainer.__init__) == ["self", "config"]
    assert _params(sync._init_resource_pool_mgr) == ["self"]
    assert _params(sync._compute_old_log_prob) == ["self", "batch", "metrics"]
    assert _params(sync._compute_advantage) == ["self", "batch", "metrics"]
    assert _params(trainer_base.register_trainer) == ["name"] and _params(trainer_base.get_trainer_cls) == ["name"]
    for name in ("tq", "apply_kl_penalty", "compute_rollout_correction_and_add_to_batch", "response_from_nested"):
        assert hasattr(trainer_base, name), name
    assert trainer_base.apply_kl_penalty is ray_trainer.apply_kl_penalty
    assert _params(ray_trainer.apply_kl_penalty) == ["data", "kl_ctrl", "kl_penalty"]
    fn = rollout_corr_helper.compute_rollout_correction_and_add_to_batch
    assert trainer_base.compute_rollout_correction_and_add_to_batch is fn
    assert _params(fn)[:2] == ["batch", "rollout_corr_config"]
    source = inspect.getsource(trainer_base.PPOTrainer._compute_advantage)
    for needle in ('"rm_scores"', "token_level_scores", "use_kl_in_reward", "rollout_correction", "response_to_nested"):
        assert needle in source, needle  # the steps CompPOTrainer._compute_advantage repeats
    assert {Role.ActorRollout, Role.ActorRolloutRef, Role.Actor, Role.Critic} <= set(Role)
    # the workers
    worker = engine_workers.ActorRolloutRefWorker
    assert (
        worker.actor_worker_cls is engine_workers.TrainingWorker
        and worker.ref_worker_cls is engine_workers.TrainingWorker
    )
    assert _params(worker.__init__) == ["self", "config", "role", "distillation_config", "kwargs"]
    assert _params(worker.init_model) == ["self"]
    assert _params(worker.compute_log_prob) == ["self", "data"] == _params(worker.update_actor)
    assert "self.loss_fn = partial(ppo_loss, config=actor_config)" in inspect.getsource(worker.init_model)
    assert "self.actor_worker_cls(config=actor_training_config)" in inspect.getsource(worker.init_model)
    assert _params(engine_workers.TrainingWorker.__init__) == ["self", "config"]
    assert _params(engine_workers.TrainingWorker.set_loss_fn) == ["self", "loss_fn"]
    assert "model_type" in {f.name for f in dataclasses.fields(TrainingWorkerConfig)}
    assert _params(losses.ppo_loss) == ["config", "model_output", "data", "dp_group"]
    ours = worker_classes()[1]
    for name in ("init_model", "compute_log_prob", "update_actor"):
        mine, theirs = getattr(getattr(ours, name), MAGIC_ATTR), getattr(getattr(worker, name), MAGIC_ATTR)
        assert (mine["execute_mode"], mine["blocking"]) == (theirs["execute_mode"], theirs["blocking"]), name
        if isinstance(theirs["dispatch_mode"], dict):
            for key in ("dispatch_fn", "collect_fn"):
                a, b = mine["dispatch_mode"][key], theirs["dispatch_mode"][key]
                assert (a.func, a.args) == (b.func, b.args), name
        else:
            assert mine["dispatch_mode"] == theirs["dispatch_mode"], name
    assert callable(register) and Dispatch.ONE_TO_ALL and callable(make_nd_compute_dataproto_dispatch_fn)
    assert _params(tu.assign_non_tensor) == ["tensor_dict", "kwargs"]
    assert _params(tu.get_non_tensor_data) == ["data", "key", "default"]
    # the layouts
    assert _params(padding.response_from_nested) == ["tensor", "response_mask"]
    assert _params(padding.response_to_nested) == ["tensor", "response_mask"]
    # main_ppo: a Hydra main (cfg pass-through), the v1 TaskRunner that picks the trainer by mode
    assert verl_main_ppo.main.__code__.co_varnames[:1] == ("cfg_passthrough",)  # hydra.main's wrapper
    assert "get_trainer_cls(config.trainer.v1.trainer_mode)" in inspect.getsource(verl_main_ppo)
    # the plugin discovery (verl/__init__.py)
    init = (Path(verl.__file__).parent / "__init__.py").read_text()
    assert 'entry_points(group="verl.plugins")' in init and "VERL_USE_EXTERNAL_MODULES" in init
