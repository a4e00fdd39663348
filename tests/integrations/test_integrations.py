"""The verl and OpenRLHF drop-ins (docs/design.md §6, §9) against their originals' loops.

verl and OpenRLHF are not dependencies (and are not installed on CI), so their published
loops are re-implemented here, statement for statement:

* verl ``trainer/ppo/core_algos.py::compute_gae_advantage_return`` (the multi-turn
  version that skips masked tokens) and ``utils/torch_functional.py::masked_whiten``;
* OpenRLHF ``trainer/ppo_utils/experience_maker.py::get_advantages_and_returns``.

The drop-ins must reproduce them: verl's on valid positions (the drop-in puts 0 on
masked ones), OpenRLHF's on every position (it steps through every position). With
``gates`` the per-step discount γ becomes γ·g_t in both the bootstrap and the trace.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import comppo_core as cc  # noqa: E402
from comppo_core.integrations import openrlhf, verl  # noqa: E402

B, T = 6, 48
#: bfloat16 unit roundoff (8 significant bits): one rounding moves a value by at most
#: U·|x|; neighbouring bfloat16 numbers are at most 2U·|x| apart.
U = 2.0**-8


# --------------------------------------------------------------------------- #
# the originals
# --------------------------------------------------------------------------- #


def verl_masked_mean(values: Any, mask: Any) -> Any:
    return (values * mask).sum() / mask.sum()


def verl_masked_var(values: Any, mask: Any, unbiased: bool = True) -> Any:
    mean = verl_masked_mean(values, mask)
    centered_values = values - mean
    variance = verl_masked_mean(centered_values**2, mask)
    if unbiased:
        mask_sum = mask.sum()
        bessel_correction = mask_sum / (mask_sum - 1)
        variance = variance * bessel_correction
    return variance


def verl_masked_whiten(values: Any, mask: Any, shift_mean: bool = True) -> Any:
    mean, var = verl_masked_mean(values, mask), verl_masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


def verl_gae_loop(
    token_level_rewards: Any, values: Any, response_mask: Any, gamma: float, lam: float, gates: Any = None
) -> tuple[Any, Any]:
    """verl's loop, *unwhitened* advantages and returns. ``gates`` (not in verl) replaces
    γ by γ·g_t at step t, in the bootstrap and in the trace."""
    with torch.no_grad():
        nextvalues = 0
        lastgaelam = 0
        advantages_reversed = []
        gen_len = token_level_rewards.shape[-1]
        for t in reversed(range(gen_len)):
            g = gamma if gates is None else gamma * gates[:, t]
            delta = token_level_rewards[:, t] + g * nextvalues - values[:, t]
            lastgaelam_ = delta + g * lam * lastgaelam
            nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
            lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
    return advantages, returns


def verl_compute_gae_advantage_return(
    token_level_rewards: Any, values: Any, response_mask: Any, gamma: float, lam: float, gates: Any = None
) -> tuple[Any, Any]:
    advantages, returns = verl_gae_loop(token_level_rewards, values, response_mask, gamma, lam, gates)
    with torch.no_grad():
        advantages = verl_masked_whiten(advantages, response_mask)
    return advantages, returns


def openrlhf_get_advantages_and_returns(
    values: Any, rewards: Any, action_mask: Any, gamma: float, lambd: float, gates: Any = None
) -> tuple[Any, Any]:
    """OpenRLHF's loop; ``gates`` (not in OpenRLHF) replaces γ by γ·g_t at step t."""
    lastgaelam = 0
    advantages_reversed = []
    response_length = rewards.size(1)
    if action_mask is not None:
        values = action_mask * values
        rewards = action_mask * rewards
    for t in reversed(range(response_length)):
        g = gamma if gates is None else gamma * gates[:, t]
        nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0
        delta = rewards[:, t] + g * nextvalues - values[:, t]
        lastgaelam = delta + g * lambd * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages.detach(), returns


# --------------------------------------------------------------------------- #
# data
# --------------------------------------------------------------------------- #


def make_batch(seed: int, *, multi_turn: bool = True, b: int = B, t: int = T) -> dict[str, np.ndarray]:
    """Responses of lengths uniform in [T/2, T] (right padding); with ``multi_turn``,
    runs of masked tool/observation tokens inside them. Rewards are dense and nonzero on
    masked positions too (both originals ignore those)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(t // 2, t + 1, size=b)
    lengths[0] = t  # one full row
    mask = np.arange(t)[None, :] < lengths[:, None]
    if multi_turn:
        for row in range(1, b):
            for _ in range(2):
                start = int(rng.integers(0, max(1, lengths[row] - 4)))
                mask[row, start : start + int(rng.integers(1, 5))] = False
        assert (mask[:, :-1] < mask[:, 1:]).any(), "no internal gaps drawn"
    return {
        "rewards": rng.standard_normal((b, t)) + 3.0 * (rng.random((b, t)) < 0.05),
        "values": rng.standard_normal((b, t)),
        "gates": rng.uniform(0.5, 1.0, (b, t)),
        "mask": mask,
    }


def tensors(batch: dict[str, np.ndarray], dtype: Any, mask_dtype: Any = None) -> dict[str, Any]:
    out = {k: torch.from_numpy(v).to(dtype) for k, v in batch.items() if k != "mask"}
    out["mask"] = torch.from_numpy(batch["mask"]).to(dtype if mask_dtype is None else mask_dtype)
    return out


def valid(x: Any, mask: np.ndarray) -> np.ndarray:
    return x.detach().double().numpy()[mask]


PARAMS = [(1.0, 0.95), (0.99, 1.0), (0.9, 0.0), (1.0, 1.0), (0.0, 0.5)]


# --------------------------------------------------------------------------- #
# verl
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("with_gates", [False, True], ids=["gae", "comp_gae"])
@pytest.mark.parametrize("gamma, lam", PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_verl_dropin_matches_verl(dtype: Any, gamma: float, lam: float, with_gates: bool) -> None:
    batch = make_batch(seed=int(gamma * 100 + lam * 10))
    x = tensors(batch, dtype)
    g = x["gates"] if with_gates else None
    adv, ret = verl.compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], gamma, lam, gates=g)
    for out in (adv, ret):
        assert isinstance(out, torch.Tensor)
        assert out.dtype == dtype and out.shape == (B, T) and not out.requires_grad
        assert not out.numpy()[~batch["mask"]].any()  # masked positions: 0
    m = batch["mask"]
    # the loop in float64 on the same inputs: exact up to the output's own rounding
    x64 = {k: v.double() for k, v in x.items()}
    want_adv, want_ret = verl_compute_gae_advantage_return(
        x64["rewards"], x64["values"], x64["mask"], gamma, lam, gates=x64["gates"] if with_gates else None
    )
    tight: dict[str, Any] = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-6, "atol": 1e-6}
    np.testing.assert_allclose(valid(adv, m), valid(want_adv, m), **tight)
    np.testing.assert_allclose(valid(ret, m), valid(want_ret, m), **tight)
    # verl's loop as users run it, in the input dtype (float32: ~T roundings per value)
    loop_adv, loop_ret = verl_compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], gamma, lam, gates=g)
    loose: dict[str, Any] = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 2e-5}
    np.testing.assert_allclose(valid(adv, m), valid(loop_adv, m), **loose)
    np.testing.assert_allclose(valid(ret, m), valid(loop_ret, m), **loose)


@pytest.mark.parametrize("with_gates", [False, True], ids=["gae", "comp_gae"])
def test_verl_dropin_bfloat16(with_gates: bool) -> None:
    batch = make_batch(seed=7)
    m = batch["mask"]
    x = tensors(batch, torch.bfloat16)
    g = x["gates"] if with_gates else None
    adv, ret = verl.compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], 1.0, 0.95, gates=g)
    assert adv.dtype == ret.dtype == torch.bfloat16
    # verl's loop runs in bf16 arithmetic (~T roundings per value); the drop-in
    # accumulates in float64. So the reference is verl's loop in float64 on the
    # bf16-rounded inputs, cast to bf16 at the end.
    x64 = {k: v.double() for k, v in x.items()}
    raw64, ret64 = verl_gae_loop(
        x64["rewards"], x64["values"], x64["mask"], 1.0, 0.95, gates=x64["gates"] if with_gates else None
    )
    adv64 = verl_masked_whiten(raw64, x64["mask"])
    # returns: float64 → float32 → bf16 (drop-in) vs float64 → bf16: at most one bf16
    # step apart (double rounding), i.e. 2U relative.
    np.testing.assert_allclose(valid(ret, m), valid(ret64.to(torch.bfloat16), m), rtol=2 * U, atol=0)
    # advantages: the drop-in rounds twice: the raw advantages A to bf16 before
    # whitening (moves each A by ≤ U|A|, and the mean and std by as much, i.e. the
    # whitened value by ≲ 2U·max|A|/σ) and the whitened result w (≤ 2U|w| with the
    # float32 step). Bound: 4U·max|A|/σ + 2U|w|, a factor 2 of slack over that.
    a = valid(raw64, m)
    sigma = a.std(ddof=1)
    want = valid(adv64.to(torch.bfloat16), m)
    np.testing.assert_allclose(valid(adv, m), want, rtol=2 * U, atol=4 * U * np.abs(a).max() / sigma)
    # and on average it is more accurate than verl's own bf16 loop (mean abs error
    # below the loop's; over 60 seeds the ratio stayed under 0.5)
    loop_adv, loop_ret = verl_compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], 1.0, 0.95, gates=g)
    exact_adv, exact_ret = valid(adv64, m), valid(ret64, m)
    assert np.abs(valid(adv, m) - exact_adv).mean() < np.abs(valid(loop_adv, m) - exact_adv).mean()
    assert np.abs(valid(ret, m) - exact_ret).mean() < np.abs(valid(loop_ret, m) - exact_ret).mean()


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.int32, torch.float32, torch.float64])
def test_verl_dropin_mask_dtypes(mask_dtype: Any) -> None:
    batch = make_batch(seed=3)
    x = tensors(batch, torch.float64)
    want = verl.compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], 0.99, 0.95)
    mask = torch.from_numpy(batch["mask"]).to(mask_dtype)
    got = verl.compute_gae_advantage_return(x["rewards"], x["values"], mask, 0.99, 0.95)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_verl_dropin_tensor_gamma_lam_and_no_grad() -> None:
    """verl passes γ and λ from its config (floats, sometimes 0-d tensors); values carry
    no grad there, but a stray requires_grad must not leak into the outputs."""
    batch = make_batch(seed=11)
    x = tensors(batch, torch.float32)
    v = x["values"].clone().requires_grad_(True)
    # (float64 0-d tensors: a float32 tensor(0.99) is a different γ)
    gamma, lam = torch.tensor(0.99, dtype=torch.float64), torch.tensor(0.9, dtype=torch.float64)
    got = verl.compute_gae_advantage_return(x["rewards"], v, x["mask"], gamma, lam)
    want = verl.compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], 0.99, 0.9)
    for g_, w in zip(got, want):
        assert not g_.requires_grad
        assert torch.equal(g_, w)
    assert v.grad is None


def test_verl_dropin_inputs_unchanged() -> None:
    batch = make_batch(seed=5)
    x = tensors(batch, torch.float32)
    before = {k: v.clone() for k, v in x.items()}
    verl.compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], 1.0, 0.95, gates=x["gates"])
    for k, v in x.items():
        assert torch.equal(v, before[k]), k


def test_verl_dropin_numpy() -> None:
    """NumPy in, NumPy out, same numbers as the tensor path."""
    batch = make_batch(seed=9)
    x = tensors(batch, torch.float64)
    want = verl.compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], 0.97, 0.9, gates=x["gates"])
    got = verl.compute_gae_advantage_return(
        batch["rewards"], batch["values"], batch["mask"], 0.97, 0.9, gates=batch["gates"]
    )
    for g, w in zip(got, want):
        assert type(g) is np.ndarray
        np.testing.assert_array_equal(g, w.numpy())


# --------------------------------------------------------------------------- #
# OpenRLHF
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
@pytest.mark.parametrize("with_gates", [False, True], ids=["gae", "comp_gae"])
@pytest.mark.parametrize("gamma, lam", PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_openrlhf_dropin_matches_openrlhf(
    dtype: Any, gamma: float, lam: float, with_gates: bool, mask_kind: str
) -> None:
    batch = make_batch(seed=int(gamma * 100 + lam * 10) + 1)
    x = tensors(batch, dtype, mask_dtype=torch.bool)
    mask = {"bool": x["mask"], "float": x["mask"].to(dtype), "none": None}[mask_kind]
    g = x["gates"] if with_gates else None
    adv, ret = openrlhf.get_advantages_and_returns(x["values"], x["rewards"], mask, gamma, lam, gates=g)
    for out in (adv, ret):
        assert isinstance(out, torch.Tensor)
        assert out.dtype == dtype and out.shape == (B, T) and not out.requires_grad
    x64 = {k: v.double() if v.is_floating_point() else v for k, v in x.items()}
    mask64 = None if mask is None else x64["mask"]
    want_adv, want_ret = openrlhf_get_advantages_and_returns(
        x64["values"], x64["rewards"], mask64, gamma, lam, gates=x64["gates"] if with_gates else None
    )
    # every position (OpenRLHF returns values everywhere, masked positions included)
    tight: dict[str, Any] = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-6, "atol": 1e-6}
    np.testing.assert_allclose(adv.double().numpy(), want_adv.numpy(), **tight)
    np.testing.assert_allclose(ret.double().numpy(), want_ret.numpy(), **tight)
    loop_adv, loop_ret = openrlhf_get_advantages_and_returns(x["values"], x["rewards"], mask, gamma, lam, gates=g)
    loose: dict[str, Any] = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 2e-5}
    np.testing.assert_allclose(adv.double().numpy(), loop_adv.double().numpy(), **loose)
    np.testing.assert_allclose(ret.double().numpy(), loop_ret.double().numpy(), **loose)


@pytest.mark.parametrize("with_gates", [False, True], ids=["gae", "comp_gae"])
def test_openrlhf_dropin_bfloat16(with_gates: bool) -> None:
    batch = make_batch(seed=8)
    x = tensors(batch, torch.bfloat16, mask_dtype=torch.bool)
    g = x["gates"] if with_gates else None
    adv, ret = openrlhf.get_advantages_and_returns(x["values"], x["rewards"], x["mask"], 1.0, 0.95, gates=g)
    assert adv.dtype == ret.dtype == torch.bfloat16
    # Reference: OpenRLHF's loop in float64 on the bf16-rounded inputs (masking by 0/1
    # is exact), cast to bf16 once. The drop-in goes float64 → float32 → bf16: double
    # rounding puts it at most one bf16 step (2U relative) from the reference.
    x64 = {k: v.double() if v.is_floating_point() else v for k, v in x.items()}
    want_adv, want_ret = openrlhf_get_advantages_and_returns(
        x64["values"], x64["rewards"], x64["mask"], 1.0, 0.95, gates=x64["gates"] if with_gates else None
    )
    np.testing.assert_allclose(adv.double().numpy(), want_adv.to(torch.bfloat16).double().numpy(), rtol=2 * U, atol=0)
    np.testing.assert_allclose(ret.double().numpy(), want_ret.to(torch.bfloat16).double().numpy(), rtol=2 * U, atol=0)
    # on average more accurate than OpenRLHF's own bf16 loop
    loop_adv, _ = openrlhf_get_advantages_and_returns(x["values"], x["rewards"], x["mask"], 1.0, 0.95, gates=g)
    assert (adv.double() - want_adv).abs().mean() < (loop_adv.double() - want_adv).abs().mean()


def test_openrlhf_dropin_values_with_grad() -> None:
    """OpenRLHF returns ``advantages.detach()``: the drop-in never carries grad."""
    batch = make_batch(seed=12)
    x = tensors(batch, torch.float32, mask_dtype=torch.bool)
    v = x["values"].clone().requires_grad_(True)
    adv, ret = openrlhf.get_advantages_and_returns(v, x["rewards"], x["mask"], 1.0, 0.95)
    want_adv, want_ret = openrlhf.get_advantages_and_returns(x["values"], x["rewards"], x["mask"], 1.0, 0.95)
    assert not adv.requires_grad and not ret.requires_grad
    assert torch.equal(adv, want_adv) and torch.equal(ret, want_ret)


def test_openrlhf_dropin_inputs_unchanged() -> None:
    batch = make_batch(seed=13)
    x = tensors(batch, torch.float32, mask_dtype=torch.bool)
    before = {k: v.clone() for k, v in x.items()}
    openrlhf.get_advantages_and_returns(x["values"], x["rewards"], x["mask"], 1.0, 0.95, gates=x["gates"])
    for k, v in x.items():
        assert torch.equal(v, before[k]), k


# --------------------------------------------------------------------------- #
# where the two frameworks differ
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.99, 1.0), (0.9, 0.8)])
def test_openrlhf_equals_gae_with_right_padding_only(gamma: float, lam: float) -> None:
    """With right padding only, OpenRLHF's tail steps see value 0 and reward 0 after
    masking, so the bootstrap after the last valid token is 0 as in verl, and the tail
    adds δ = 0: on valid positions its advantages and returns are plain (unwhitened) GAE."""
    batch = make_batch(seed=21, multi_turn=False)
    m = batch["mask"]
    x = tensors(batch, torch.float64, mask_dtype=torch.bool)
    o_adv, o_ret = openrlhf.get_advantages_and_returns(x["values"], x["rewards"], x["mask"], gamma, lam)
    g_adv, g_ret = cc.gae(x["rewards"], x["values"], mask=x["mask"], gamma=gamma, lam=lam, masked_rewards="drop")
    np.testing.assert_allclose(valid(o_adv, m), valid(g_adv, m), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(valid(o_ret, m), valid(g_ret, m), rtol=1e-12, atol=1e-12)
    # the same holds for verl's (unwhitened) loop, and for the original OpenRLHF loop
    v_adv, v_ret = verl_gae_loop(x["rewards"], x["values"], x["mask"].double(), gamma, lam)
    np.testing.assert_allclose(valid(v_adv, m), valid(g_adv, m), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(valid(v_ret, m), valid(g_ret, m), rtol=1e-12, atol=1e-12)
    oo_adv, _ = openrlhf_get_advantages_and_returns(x["values"], x["rewards"], x["mask"], gamma, lam)
    np.testing.assert_allclose(valid(oo_adv, m), valid(g_adv, m), rtol=1e-12, atol=1e-12)


def test_openrlhf_and_verl_differ_on_internal_mask_zeros() -> None:
    """Inside a multi-turn response OpenRLHF steps through masked tokens (value 0
    bootstrapped, trace decayed by γλ), verl skips them."""
    # one row: valid, masked, valid, valid; γ = λ = 1 so only the bootstrap differs
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, 7.0, 0.25, 0.125]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True]])
    o_adv, _ = openrlhf.get_advantages_and_returns(v, r, mask, 1.0, 1.0)
    g_adv, _ = cc.gae(r, v, mask=mask, gamma=1.0, lam=1.0)
    # γ = λ = 1: GAE telescopes to (sum of later valid rewards) − V_0 = 1 − 0.5 ...
    assert g_adv[0, 0].item() == o_adv[0, 0].item() == 0.5
    # ... and so does OpenRLHF's, because the masked token's value is zeroed: the
    # difference shows with γλ < 1, where the masked step decays the trace
    o_adv, _ = openrlhf.get_advantages_and_returns(v, r, mask, 1.0, 0.5)
    g_adv, _ = cc.gae(r, v, mask=mask, gamma=1.0, lam=0.5)
    # verl/GAE, valid positions 0, 2, 3 (V = .5, .25, .125):
    #   A3 = 1 − .125 = .875;  A2 = (.125 − .25) + .5·.875 = .3125
    #   A0 = (.25 − .5) + .5·.3125 = −.09375
    # OpenRLHF steps position 1 with V = 0:
    #   A1 = (0 + .25 − 0) + .5·.3125 = .40625;  A0 = (0 + 0 − .5) + .5·.40625 = −.296875
    assert g_adv[0].tolist() == [-0.09375, 0.0, 0.3125, 0.875]
    assert o_adv[0].tolist() == [-0.296875, 0.40625, 0.3125, 0.875]
    loop_adv, _ = openrlhf_get_advantages_and_returns(v, r, mask, 1.0, 0.5)
    assert loop_adv[0].tolist() == o_adv[0].tolist()
    verl_adv, _ = verl_gae_loop(r, v, mask.double(), 1.0, 0.5)
    assert verl_adv[0, [0, 2, 3]].tolist() == [-0.09375, 0.3125, 0.875]


def test_openrlhf_and_verl_differ_on_random_multi_turn() -> None:
    batch = make_batch(seed=22, multi_turn=True)
    m = batch["mask"]
    x = tensors(batch, torch.float64, mask_dtype=torch.bool)
    o_adv, _ = openrlhf.get_advantages_and_returns(x["values"], x["rewards"], x["mask"], 1.0, 0.95)
    g_adv, _ = cc.gae(x["rewards"], x["values"], mask=x["mask"], gamma=1.0, lam=0.95, masked_rewards="drop")
    diff = np.abs(valid(o_adv, m) - valid(g_adv, m))
    assert diff.max() > 1e-3
    # the rows without gaps (row 0 is a full row) still agree
    np.testing.assert_allclose(o_adv[0].numpy(), g_adv[0].numpy(), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- #
# verl registry: register / set_inputs / compute_comp_gae_advantage
# --------------------------------------------------------------------------- #


@pytest.fixture
def clean_pending() -> Any:
    """``set_inputs`` keeps per-thread state; start and end each test without any."""
    verl.set_inputs(values=None)
    yield
    verl.set_inputs(values=None)


def test_register_without_verl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "verl", None)  # import verl → ImportError
    # (the verl_recipe tests, run first in the same process, have imported it already)
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo.core_algos", None)
    assert verl.register() is False
    assert verl.register("other_name") is False


def test_register_with_a_verl_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's ``register_adv_est(name)`` is a decorator that stores the function."""
    registry: dict[str, Any] = {}

    def register_adv_est(name: str) -> Any:
        def deco(fn: Any) -> Any:
            registry[name] = fn
            return fn

        return deco

    names = ["verl", "verl.trainer", "verl.trainer.ppo", "verl.trainer.ppo.core_algos"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["verl.trainer.ppo.core_algos"].register_adv_est = register_adv_est  # type: ignore[attr-defined]
    assert verl.register() is True
    assert registry == {"comp_gae": verl.compute_comp_gae_advantage}
    assert verl.register("cgae") is True
    assert registry["cgae"] is verl.compute_comp_gae_advantage


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_comp_gae_estimator_equals_dropin(clean_pending: None, dtype: Any) -> None:
    batch = make_batch(seed=31)
    x = tensors(batch, dtype)
    config = types.SimpleNamespace(gamma=0.98, lam=0.9)
    want = verl.compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], 0.98, 0.9, gates=x["gates"])
    # as verl calls a registered estimator: rewards, mask, config (+ extra keywords)
    verl.set_inputs(values=x["values"], gates=x["gates"])
    got = verl.compute_comp_gae_advantage(
        token_level_rewards=x["rewards"], response_mask=x["mask"], config=config, index=np.arange(B)
    )
    for g, w in zip(got, want):
        assert isinstance(g, torch.Tensor) and g.dtype == dtype
        assert torch.equal(g, w)
    # values and gates passed directly win over set_inputs
    got = verl.compute_comp_gae_advantage(x["rewards"], x["mask"], config, values=x["values"], gates=x["gates"])
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    # no gates: plain GAE
    verl.set_inputs(values=x["values"])
    got = verl.compute_comp_gae_advantage(x["rewards"], x["mask"], config)
    want = verl.compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], 0.98, 0.9)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_comp_gae_estimator_defaults_to_gamma_lam_one(clean_pending: None) -> None:
    batch = make_batch(seed=32)
    x = tensors(batch, torch.float64)
    want = verl.compute_gae_advantage_return(x["rewards"], x["values"], x["mask"], 1.0, 1.0, gates=x["gates"])
    for config in (None, types.SimpleNamespace()):
        verl.set_inputs(values=x["values"], gates=x["gates"])  # set_inputs feeds one call
        got = verl.compute_comp_gae_advantage(x["rewards"], x["mask"], config)
        for g, w in zip(got, want):
            assert torch.equal(g, w)


def test_comp_gae_estimator_without_values(clean_pending: None) -> None:
    batch = make_batch(seed=33)
    x = tensors(batch, torch.float32)
    config = types.SimpleNamespace(gamma=1.0, lam=0.95)
    with pytest.raises(ValueError, match=r"^values: .*set_inputs"):
        verl.compute_comp_gae_advantage(x["rewards"], x["mask"], config)
    # set_inputs is per thread: values set here are not seen by another thread
    verl.set_inputs(values=x["values"])
    errors: list[BaseException] = []

    def other_thread() -> None:
        try:
            verl.compute_comp_gae_advantage(x["rewards"], x["mask"], config)
        except BaseException as e:  # noqa: BLE001 - collected and checked below
            errors.append(e)

    th = threading.Thread(target=other_thread)
    th.start()
    th.join()
    assert len(errors) == 1 and isinstance(errors[0], ValueError) and "values" in str(errors[0])
