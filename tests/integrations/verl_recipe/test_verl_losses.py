"""The CompPO actor's loss in verl (comppo_core.integrations.verl.losses) against the package's own update.

One actor update of the CompPO engine (verl's FSDP2 engine, CPU, one gloo process, float32,
tiny random Llama; tests/verl_cpu.py) with ``comppo_actor_loss`` (verl's ``ppo_loss`` + the
TAC's value loss) and the engine's ``optimizer_step`` against the package's update on the
same batch: ``rl.step.score(grad=True)`` on the packed row, ``rl.step.minibatch_loss`` on one
row per sequence, and torch's AdamW with the engine optimiser's hyper-parameters. Every
gradient and every parameter after the step, actor and TAC, within 1e-5 (parameters where
Adam's first step is well conditioned; the test says why).

verl's config ↔ the package's ``LossSettings`` (the correspondence the equality pins)::

    actor.clip_ratio_low / clip_ratio_high / clip_ratio_c   clip_low / clip_high / dual_clip
    actor.loss_agg_mode, actor.loss_scale_factor            agg, loss_scale_factor
    actor.use_kl_loss, kl_loss_coef, kl_loss_type           kl_mode="loss", kl_coef, kl_kind
    actor.entropy_coeff = 0                                 (the package has no entropy bonus)
    comppo_actor_loss(vf_coef=, cliprange_value=)           vf_coef, value_clip
    the trainer's global_batch_size = the minibatch's rows  (the seq-mean modes' denominator)
    EngineSettings.critic_lr                                the TAC's AdamW learning rate

The batch comes in the two layouts verl hands the actor: the legacy trainer's padded rows
after ``left_right_2_no_padding`` and the v1 trainer's TransferQueue rows (every field nested).
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from verl_cpu import (  # noqa: E402
    TAU,
    UPDATE_META,
    actor_config,
    as_no_padding,
    comppo_engine_with,
    cpu_process_group,
    full_state,
    per_column,
    per_response,
    rollout,
    tiny_llama,
    transfer_queue_batch,
)

import comppo_core as cc  # noqa: E402
from comppo_core import rl  # noqa: E402
from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.hf.lm import unpack_columns  # noqa: E402
from comppo_core.integrations.verl import engine as comppo_engine  # noqa: E402
from comppo_core.integrations.verl.layout import response_columns  # noqa: E402
from comppo_core.integrations.verl.losses import comppo_actor_loss, tac_value_loss  # noqa: E402

TAC = {"taps": (0, 2), "width": 16, "temporal": "gru"}
TOL = 1e-5
LR = 1e-2


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


# (verl's actor config, comppo_actor_loss's keywords, EngineSettings.critic_lr)
CASES = {
    "token-mean": ({"loss_agg_mode": "token-mean"}, {"vf_coef": 0.5, "cliprange_value": None}, None),
    "seq-mean-token-mean+kl+critic_lr": (
        {
            "loss_agg_mode": "seq-mean-token-mean",
            "use_kl_loss": True,
            "kl_loss_coef": 0.1,
            "kl_loss_type": "low_var_kl",
        },
        {"vf_coef": 1.0, "cliprange_value": 0.2},
        3e-2,
    ),
    "seq-mean-token-sum-norm": (
        {"loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_factor": 8},
        {"vf_coef": 0.25, "cliprange_value": 0.1},
        None,
    ),
}


def loss_settings(config: Any, vf_coef: float, cliprange_value: float | None) -> Any:
    """The package's LossSettings that define the same loss as verl's ``config`` (module docstring)."""
    return rl.step.LossSettings(
        clip_low=config.clip_ratio_low,
        clip_high=config.clip_ratio_high,
        dual_clip=config.clip_ratio_c,
        value_clip=cliprange_value,
        vf_coef=vf_coef,
        agg=config.loss_agg_mode,
        loss_scale_factor=config.loss_scale_factor,
        kl_coef=config.kl_loss_coef if config.use_kl_loss else 0.0,
        kl_kind=config.kl_loss_type,
        kl_mode="loss",
    )


def update_batch(hf_model: Any, tac: Any, batch: dict[str, torch.Tensor], cu: torch.Tensor) -> dict[str, torch.Tensor]:
    """``[B, R]`` per-response-token fields an update reads: old log-probs and old values near the
    current ones (so the ratio, dual and value clips bind on some tokens, not all), the reference's
    log-probs, advantages and returns."""
    g = torch.Generator().manual_seed(9)
    ids = torch.cat([batch["input_ids"][i, batch["attention_mask"][i] != 0] for i in range(len(cu) - 1)])[None]
    with torch.no_grad():
        now = rl.forward(hf_model, ids, None, cu_seqlens=cu, temperature=TAU, critic=tac)
    shape = batch["responses"].shape
    lp, values = per_response(now.logprobs, cu, batch), per_response(now.values, cu, batch)
    return {
        "old_log_probs": lp + 0.8 * torch.randn(shape, generator=g),
        "ref_log_prob": lp + 0.5 * torch.randn(shape, generator=g),
        "values": values + 0.3 * torch.randn(shape, generator=g),
        "advantages": torch.randn(shape, generator=g),
        "returns": torch.randn(shape, generator=g),
    }


def package_update(
    hf_model: Any,
    tac_state: dict[str, torch.Tensor],
    batch: dict[str, torch.Tensor],
    extra: dict[str, torch.Tensor],
    cu: torch.Tensor,
    settings: Any,
    params: cc.GateParams,
    engine_optimizer: Any,
    critic_lr: float | None,
) -> tuple[dict[str, torch.nn.Parameter], dict[str, float]]:
    """The package's update of the same weights on the same rows: the update's forward
    (``rl.step.score(grad=True)``, packed), ``rl.step.minibatch_loss`` on one row per sequence
    (the seq-mean modes' rows), torch's AdamW with the engine optimiser's hyper-parameters
    (the TAC's group at ``critic_lr`` when given). Returns the parameters by the engine's names."""
    actor = copy.deepcopy(hf_model).train()
    tac = rl.TransportAlignedCritic.for_model(actor, **TAC)
    tac.load_state_dict(tac_state)
    ids = torch.cat([batch["input_ids"][i, batch["attention_mask"][i] != 0] for i in range(len(cu) - 1)])[None]
    resp = response_columns(cu, batch["response_mask"], batch["attention_mask"])
    scored = rl.step.score(
        actor,
        tac,
        ids,
        None,
        resp,
        arm=rl.arms.get_arm("comppo"),
        settings=rl.step.ScoringSettings(temperature=TAU, gate_params=params),
        grad=True,
        cu_seqlens=cu,
    )
    assert scored.values is not None

    def rows(x: torch.Tensor, name: str) -> torch.Tensor:
        return unpack_columns(x, cu, name)

    resp_rows = rows(resp, "response_mask")
    mb = rl.step.Batch(
        input_ids=rows(ids[:, 1:], "input_ids"),
        attention_mask=resp_rows,
        response_mask=resp_rows,
        old_logprobs=rows(per_column(extra["old_log_probs"], cu, batch), "old_logprobs"),
        advantages=rows(per_column(extra["advantages"], cu, batch), "advantages"),
        old_values=rows(per_column(extra["values"], cu, batch), "old_values"),
        returns=rows(per_column(extra["returns"], cu, batch), "returns"),
        ref_logprobs=rows(per_column(extra["ref_log_prob"], cu, batch), "ref_logprobs"),
    )
    loss, stats = rl.step.minibatch_loss(
        mb, rows(scored.logprobs, "logprobs"), rows(scored.values, "values"), settings, train_actor=True
    )
    assert loss is not None
    loss.backward()
    named = dict(actor.named_parameters()) | {comppo_engine.TAC_PREFIX + k: v for k, v in tac.named_parameters()}
    adamw(named, engine_optimizer, critic_lr).step()
    return named, stats


def adamw(named: dict[str, Any], engine_optimizer: Any, critic_lr: float | None) -> torch.optim.AdamW:
    """torch's AdamW over ``named`` with the engine optimiser's hyper-parameters: one group, or the
    TAC's parameters a second group at ``critic_lr``."""
    d = engine_optimizer.defaults
    hyper = {"lr": d["lr"], "betas": d["betas"], "eps": d["eps"], "weight_decay": d["weight_decay"]}
    critic = [v for k, v in named.items() if k.startswith(comppo_engine.TAC_PREFIX)]
    actor_params = [v for k, v in named.items() if not k.startswith(comppo_engine.TAC_PREFIX)]
    groups: list[dict[str, Any]] = (
        [{"params": actor_params + critic}]
        if critic_lr is None
        else [{"params": actor_params}, {"params": critic, "lr": critic_lr}]
    )
    return torch.optim.AdamW(groups, **hyper)


@pytest.mark.parametrize("layout", ["padded", "transfer_queue"])
@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_one_update_equals_the_package_update(model: tuple[str, Any], settings: None, case: str, layout: str) -> None:
    """One ``train_batch`` (zero_grad, forward_backward_batch over 2 micro-batches, optimizer_step) of
    the CompPO engine with ``comppo_actor_loss`` = the package's update (module docstring): every
    gradient within 1e-5 (relative to max(1, |g|)); the step = torch's AdamW on those gradients
    (1e-7), and every parameter = the package's after its step within 1e-5 wherever Adam's first
    step is well conditioned (|g| >= 100·eps)."""
    path, hf_model = model
    overrides, loss_kwargs, critic_lr = CASES[case]
    config = actor_config(**overrides)
    params = cc.GateParams(low=0.2)
    engine = comppo_engine_with(
        path, comppo_engine.EngineSettings(tac=TAC, gate_params=params, critic_lr=critic_lr), optimizer={"lr": LR}
    )
    names = [n for n, _ in engine.module.named_parameters()]
    before = full_state(engine.module)
    tac_state = {k[len(comppo_engine.TAC_PREFIX) :]: v for k, v in before.items() if k.startswith("comppo_tac.")}
    batch = rollout()
    cu = torch.nn.functional.pad((batch["attention_mask"] != 0).sum(1).cumsum(0), (1, 0))
    tac_now = rl.TransportAlignedCritic.for_model(hf_model, **TAC)
    tac_now.load_state_dict(tac_state)
    extra = update_batch(hf_model, tac_now.eval(), batch, cu)
    meta = UPDATE_META | {"comppo_probe": True}
    full = {**batch, **extra}
    td = as_no_padding(full, **meta) if layout == "padded" else transfer_queue_batch(full, **meta)
    assert torch.equal(td["input_ids"].offsets(), cu)

    loss_fn = functools.partial(comppo_actor_loss, config=config, **loss_kwargs)
    with engine.train_mode():
        out = engine.train_batch(td, loss_function=loss_fn)
        grads = {n: p.grad.full_tensor() for n, p in engine.module.named_parameters() if p.grad is not None}
    assert set(grads) == set(names)  # every parameter, the TAC's included, got a gradient

    settings_ = loss_settings(config, loss_kwargs["vf_coef"], loss_kwargs["cliprange_value"])
    hand, stats = package_update(hf_model, tac_state, batch, extra, cu, settings_, params, engine.optimizer, critic_lr)
    for n in names:
        want = hand[n].grad
        assert want is not None, n
        assert float((grads[n] - want).abs().max()) <= TOL * max(1.0, float(want.abs().max())), n
    # the step: the engine's = torch's AdamW on the engine's gradients (its groups and hyper-parameters) ...
    replay = {n: torch.nn.Parameter(before[n].clone()) for n in names}
    for n in names:
        replay[n].grad = grads[n].clone()
    adamw(replay, engine.optimizer, critic_lr).step()
    # ... and = the package's update, where Adam's first step lr·g/(|g| + eps) is well conditioned: at
    # |g| ~ eps = 1e-8 it turns the float32 summation-order differences of near-zero gradient entries
    # (3.35e-8 vs 3.34e-8) into ~1e-5 parameter differences, which the two checks above already bound
    eps = engine.optimizer.defaults["eps"]
    moved = 0.0
    for n, p in engine.module.named_parameters():
        after = p.full_tensor().detach()
        assert float((after - replay[n].detach()).abs().max()) <= 1e-7, n
        conditioned = hand[n].grad.abs() >= 100 * eps
        assert float(torch.where(conditioned, after - hand[n].detach(), 0.0).abs().max()) <= TOL, n
        moved = max(moved, float((after - before[n]).abs().max()))
    assert moved > 1e-3  # the step moved the parameters
    # not vacuous: the ratio clip, the dual clip (and, when set, the value clip) bound on some tokens, not all
    metrics = out["metrics"]
    assert 0.0 < stats["clipfrac"] < 1.0
    assert metrics["actor/pg_clipfrac_lower"].aggregate() > 0.0
    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "actor/pg_loss"} <= set(metrics)
    if loss_kwargs["cliprange_value"] is not None:
        assert 0.0 < stats["value_clipfrac"] < 1.0
    # the loss verl reports is the package's (micro-batch partial sums of the global-batch loss)
    vf = metrics["critic/vf_loss"].aggregate()  # a SUM Metric over the micro-batches
    assert abs(vf - stats["value_loss"]) <= 1e-5 * max(1.0, abs(stats["value_loss"]))


def test_value_loss_needs_values_and_returns(model: tuple[str, Any], settings: None) -> None:
    """Without the TAC's values (no ``comppo_probe``) or without returns, a ParameterError naming what is
    missing; bad coefficients are refused before anything runs."""
    config = actor_config()
    batch = rollout()
    td = as_no_padding(batch, global_batch_size=4)
    with pytest.raises(ParameterError, match="comppo_probe=True") as info:
        tac_value_loss(config, {"log_probs": None}, td)
    assert info.value.argument == "model_output"
    with pytest.raises(ParameterError, match="returns") as info:
        tac_value_loss(config, {"values": None}, td)
    assert info.value.argument == "data"
    td_returns = as_no_padding({**batch, "returns": torch.zeros(batch["responses"].shape)})
    with pytest.raises(ParameterError, match="values") as info:
        tac_value_loss(config, {"values": None}, td_returns, cliprange_value=0.2)
    assert info.value.argument == "data"
    for bad in (-1.0, float("nan"), True, "0.5"):
        with pytest.raises(ParameterError) as info:
            comppo_actor_loss(config, {}, td, vf_coef=bad)
        assert info.value.argument == "vf_coef"
        with pytest.raises(ParameterError) as info:
            comppo_actor_loss(config, {}, td, cliprange_value=bad)
        assert info.value.argument == "cliprange_value"


def _run_ranks(n: int, model: str, out: str) -> dict[str, Any]:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("two_ranks.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(cc.__file__).parents[1]), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
    done = subprocess.run([*command, str(script), model, out], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = torch.load(out)
    return result


@pytest.mark.slow
def test_two_ranks_update_equals_one(tmp_path: Any) -> None:
    """The update in 2 gloo processes (each with half the rows; the TAC's FSDP2 unit sharded over both and
    reduce-scattering its gradients) = the same update in 1 process (tests/.../two_ranks.py run by
    torchrun): every gradient within 1e-5 (relative to max(1, |g|)), every parameter after the step
    within 1e-5 where Adam's first step is well conditioned (|g| >= 100·eps)."""
    model = str(tmp_path / "tiny-llama")
    tiny_llama(model)
    one = _run_ranks(1, model, str(tmp_path / "one.pt"))
    two = _run_ranks(2, model, str(tmp_path / "two.pt"))
    assert (one["world_size"], two["world_size"]) == (1, 2)  # the 2-rank run really ran on 2 ranks
    names = list(one["grads"])
    assert names == list(two["grads"]) and any(n.startswith(comppo_engine.TAC_PREFIX) for n in names)
    for n in names:
        g1, g2 = one["grads"][n], two["grads"][n]
        assert float(g1.abs().max()) > 0, n
        assert float((g1 - g2).abs().max()) <= TOL * max(1.0, float(g1.abs().max())), n
        conditioned = g1.abs() >= 100 * 1e-8  # AdamW's default eps, verl's
        assert float(torch.where(conditioned, one["params"][n] - two["params"][n], 0.0).abs().max()) <= TOL, n
