"""The CompPO engine (comppo_core.integrations.verl.engine) in verl 0.9.1's FSDP2 engine, on the CPU.

verl's own FSDP2 engine, subclassed, in one gloo process (tests/verl_cpu.py), on a tiny
random Llama: its old-log-prob pass (``infer_batch``, packed ``NO_PADDING`` rows, two
micro-batches) against :func:`comppo_core.rl.forward` on the same rows, packed
(``cu_seqlens``) and padded: log-probs, concentration, Comp-GAE's gates and the TAC's
values within 1e-5 (float32). Then the TAC's place in the actor (sharded, optimised, in
the state dict, out of the rollout's weight sync) and the errors. Skipped without verl
(the main CI); runs in the ``[verl]`` environment.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from verl_cpu import (  # noqa: E402
    TAU,
    cpu_process_group,
    new_engine,
    old_log_prob_batch,
    padded_to_packed,
    rollout,
    tiny_llama,
)

import comppo_core as cc  # noqa: E402
from comppo_core import rl  # noqa: E402
from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.integrations.verl import engine as comppo_engine  # noqa: E402
from comppo_core.integrations.verl.layout import from_nested_columns, response_columns  # noqa: E402

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


def comppo_engine_with(path: str, settings: comppo_engine.EngineSettings) -> Any:
    """A CompPO engine with ``settings``, its TAC's head randomised (a fresh TAC's values are all 0)."""
    comppo_engine.register_engine()
    comppo_engine.configure_engine(settings)
    engine = new_engine(path, model_type=comppo_engine.MODEL_TYPE)
    tac = getattr(engine.module, "comppo_tac", None)
    if tac is not None:
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in tac.head.parameters():
                full = torch.randn(tuple(p.shape), generator=g)
                p.copy_(torch.distributed.tensor.distribute_tensor(full, p.device_mesh, p.placements))
    return engine


def plain_tac(hf_model: Any, engine: Any) -> Any:
    """A TransportAlignedCritic with the engine's TAC's weights, outside FSDP."""
    tac = rl.TransportAlignedCritic.for_model(hf_model, **TAC)
    state = {
        k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in engine.module.comppo_tac.state_dict().items()
    }
    tac.load_state_dict(state)
    return tac.eval()


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
    tac = plain_tac(hf_model, engine)
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


def test_register_engine_is_idempotent(verl_cpu: None) -> None:
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    first = comppo_engine.register_engine()
    assert comppo_engine.register_engine() is first
    assert issubclass(first, FSDPEngineWithLMHead)
    assert EngineRegistry.get_engine_cls(comppo_engine.MODEL_TYPE, "fsdp2") is first


def per_column(x: torch.Tensor, cu: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A ``[B, R]`` per-response-token tensor in the packed ``[1, N−1]`` columns (0 elsewhere): response
    token k of sequence i is scored by column ``cu[i+1] − r_i − 1 + k``."""
    r = batch["response_mask"].shape[1]
    lengths = batch["attention_mask"][:, -r:].sum(1)
    out = torch.zeros(1, int(cu[-1]) - 1)
    for i in range(x.shape[0]):
        k = torch.nonzero(batch["response_mask"][i]).flatten()
        out[0, int(cu[i + 1]) - int(lengths[i]) - 1 + k] = x[i, k].float()
    return out


def test_one_update_with_the_tac_equals_the_same_update_by_hand(model: tuple[str, Any], settings: None) -> None:
    """``forward_backward_batch`` + ``optimizer_step`` of the CompPO engine (actor and TAC, one FSDP2 module,
    two micro-batches) with ``Σ_resp [−A·logπ + ½(V − R)²] / n_resp`` against ``rl.forward(grad=True)`` on
    the packed row and torch's AdamW with the engine optimiser's settings: gradients and the parameters
    after the step within 1e-5 (relative to max(1, |grad|) for gradients)."""
    import copy

    from verl.utils import tensordict_utils as tu

    path, hf_model = model
    params = cc.GateParams(low=0.2)
    engine = comppo_engine_with(path, comppo_engine.EngineSettings(tac=TAC, gate_params=params))
    names = [n for n, _ in engine.module.named_parameters()]
    tac_names = [n for n in names if n.startswith(comppo_engine.TAC_PREFIX)]
    state = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
        for k, v in engine.module.state_dict().items()
    }
    batch = rollout()
    g = torch.Generator().manual_seed(9)
    b, r = batch["responses"].shape
    extra = {"advantages": torch.randn(b, r, generator=g), "returns": torch.randn(b, r, generator=g)}
    td = old_log_prob_batch({**batch, **extra}, comppo_probe=True, compute_loss=True)

    def loss_function(model_output: Any, data: Any, dp_group: Any = None) -> tuple[torch.Tensor, dict[str, Any]]:
        cu = data["input_ids"].offsets().to(torch.long)
        rows = {k: data[k] for k in ("response_mask", "attention_mask")}
        resp = response_columns(cu, rows["response_mask"], rows["attention_mask"])
        lp = model_output["log_probs"].values()[:-1].unsqueeze(0)
        v = model_output["values"].values()[:-1].unsqueeze(0)
        adv, ret = per_column(data["advantages"], cu, rows), per_column(data["returns"], cu, rows)
        n = tu.get_non_tensor_data(data=data, key="batch_num_tokens", default=None)
        return ((-adv * lp + 0.5 * (v - ret) ** 2) * resp).sum() / n, {}

    # by hand: the same weights, rl.forward on the packed row with gradients, the same loss, torch's AdamW
    actor = copy.deepcopy(hf_model).train()
    tac = rl.TransportAlignedCritic.for_model(actor, **TAC)
    tac.load_state_dict({k[len(comppo_engine.TAC_PREFIX) :]: v for k, v in state.items() if k in tac_names})
    ids, cu = td["input_ids"].values().unsqueeze(0), td["input_ids"].offsets().to(torch.long)
    resp = response_columns(cu, batch["response_mask"], batch["attention_mask"])
    out = rl.forward(
        actor, ids, None, cu_seqlens=cu, response_mask=resp, temperature=TAU, critic=tac, grad=True, gate_params=params
    )
    adv, ret = per_column(extra["advantages"], cu, batch), per_column(extra["returns"], cu, batch)
    (((-adv * out.logprobs + 0.5 * (out.values - ret) ** 2) * resp).sum() / resp.sum()).backward()
    hand_params = dict(actor.named_parameters()) | {comppo_engine.TAC_PREFIX + k: v for k, v in tac.named_parameters()}
    defaults = engine.optimizer.defaults
    hand = torch.optim.AdamW(
        [hand_params[n] for n in names],
        lr=defaults["lr"],
        betas=defaults["betas"],
        eps=defaults["eps"],
        weight_decay=defaults["weight_decay"],
    )
    hand.step()

    with engine.train_mode():
        engine.optimizer_zero_grad()
        engine.forward_backward_batch(td, loss_function, forward_only=False)
        grads = {n: p.grad.full_tensor() for n, p in engine.module.named_parameters() if p.grad is not None}
        engine.optimizer_step()
    assert set(grads) == set(names)  # every parameter, the TAC's included, got a gradient
    for n in names:
        want = hand_params[n].grad
        assert float((grads[n] - want).abs().max()) <= TOL * max(1.0, float(want.abs().max())), n
    moved = 0.0
    for n, p in engine.module.named_parameters():
        after = p.full_tensor().detach()
        assert float((after - hand_params[n].detach()).abs().max()) <= TOL, n
        moved = max(moved, float((after - state[n]).abs().max()))
    assert moved > 1e-3  # the step moved the parameters


def _parameters(fn: Any) -> list[str]:
    import inspect

    return [
        p.name if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) else "*" * (1 + (p.kind == p.VAR_KEYWORD)) + p.name
        for p in inspect.signature(fn).parameters.values()
    ]


def test_the_verl_internals_the_engine_overrides_and_calls() -> None:
    """The verl 0.9.x methods CompPOEngine overrides or calls, by signature: a verl release that changes one
    fails here, not silently in a training run."""
    import verl
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine, FSDPEngineWithLMHead
    from verl.workers.utils.padding import left_right_2_no_padding, response_from_nested

    assert verl.__version__.startswith("0.9.")
    assert _parameters(FSDPEngineWithLMHead.forward_step) == ["self", "micro_batch", "loss_function", "forward_only"]
    assert _parameters(FSDPEngineWithLMHead.prepare_model_outputs) == [
        "self",
        "output",
        "output_args",
        "micro_batch",
        "logits_processor_func",
    ]
    assert _parameters(FSDPEngine._build_module) == ["self"]
    assert _parameters(FSDPEngine.get_per_tensor_param) == ["self", "layered_summon", "base_sync_done", "**kwargs"]
    assert _parameters(FSDPEngine.get_per_tensor_param_shard) == ["self", "**kwargs"]
    assert _parameters(FSDPEngine.forward_backward_batch) == ["self", "data", "loss_function", "forward_only"]
    assert _parameters(EngineRegistry.register) == ["model_type", "backend", "device", "vendor"]
    assert isinstance(EngineRegistry._engines, dict)  # register_engine reads it (registered once per process)
    assert _parameters(tu.get_non_tensor_data) == ["data", "key", "default"]
    assert _parameters(left_right_2_no_padding) == ["data"]
    assert _parameters(response_from_nested) == ["tensor", "response_mask"]
