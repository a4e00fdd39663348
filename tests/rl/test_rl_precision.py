"""``TrainConfig.dtype="bfloat16"``: the RL forwards under bfloat16 autocast, the weights the
optimisers step kept float32, the frozen ones stored in bfloat16; float32 stays exact."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rl_tiny import TINY_SETTINGS  # noqa: E402

from comppo_core.errors import ParameterError  # noqa: E402
from comppo_core.rl import Trainer  # noqa: E402
from comppo_core.rl.config import TrainConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config(**changes: Any) -> TrainConfig:
    settings = {**TINY_SETTINGS, "eval_size": 8, "eval_every": 0, "device": "cpu", "critic_warmup": 1}
    return TrainConfig(**{**settings, **changes})


def test_bfloat16_computes_in_bfloat16_and_steps_float32_weights() -> None:
    tr = Trainer(config(arm="comppo", dtype="bfloat16"))
    seen: list[torch.dtype] = []
    layer = tr.actor.model.layers[0].mlp
    hook = layer.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    r = tr.rollout(0)
    batch = tr.score(r, 0)
    tr.compute_advantages(r, batch)
    tr.update(batch, 0)
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}  # generation, scoring and the update ran under autocast
    for name in ("old_logprobs", "old_values", "ref_logprobs", "advantages", "returns"):
        assert getattr(batch, name).dtype == torch.float32, name
    assert {p.dtype for p in tr.actor.parameters()} == {torch.float32}  # the optimiser's master weights
    assert {p.dtype for p in tr.critic.parameters()} == {torch.float32}
    assert {p.dtype for p in tr.reference.parameters()} == {torch.bfloat16}  # frozen: stored in bfloat16
    states = [s for s in tr.actor_opt.state.values() if "exp_avg" in s]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)


def test_bfloat16_runs_are_deterministic_and_finite() -> None:
    weights = []
    for _ in range(2):
        tr = Trainer(config(arm="comp_gae", dtype="bfloat16", steps=2))
        tr.train()
        weights.append([p.detach().clone() for p in [*tr.actor.parameters(), *tr.critic.parameters()]])
    assert all(torch.isfinite(p).all() for p in weights[0])
    assert all(torch.equal(a, b) for a, b in zip(*weights))  # a fixed seed gives the same run on CPU


def test_bfloat16_with_lora_stores_the_frozen_base_in_bfloat16() -> None:
    tr = Trainer(config(arm="comppo", dtype="bfloat16", lora_rank=4, steps=1))
    trained = {p.dtype for p in tr.lora_model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in tr.lora_model.parameters() if not p.requires_grad}
    assert trained == {torch.float32} and frozen == {torch.bfloat16}
    before = [p.detach().clone() for p in tr.lora_model.parameters() if p.requires_grad]
    r = tr.rollout(0)
    r.rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])  # a learning signal the warm start lacks
    batch = tr.score(r, 0)
    tr.compute_advantages(r, batch)
    tr.update(batch, 0)
    after = [p.detach() for p in tr.lora_model.parameters() if p.requires_grad]
    assert max(float((a - b).abs().max()) for a, b in zip(after, before)) > 0.0


def test_a_dtype_that_is_not_offered_is_refused_by_name() -> None:
    with pytest.raises(ParameterError, match="dtype") as e:
        config(dtype="float16")
    assert e.value.argument == "dtype"
