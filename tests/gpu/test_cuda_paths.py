"""Every public function and both drop-ins on CUDA tensors (design §6).

The kernels run on the host whatever the input's device: a CUDA call packs its inputs
into one device buffer, copies it once to pinned host memory, and copies the results
back once. So on CUDA tensors every function must give exactly the numbers of the same
call on CPU tensors, as tensors of the first argument's dtype, on the input's device.
This checks that for float32, float64, bfloat16 and float16 data; bool, int64 and
float32 masks; a 4 × 8 batch and an odd 3 × 5 one (a bool mask of 15 bytes inside the
packed transfer buffer); and the packed layout with int32 and int64 ``cu_seqlens``.
Then the verl drop-in on CUDA against verl's own loop run on the same CUDA tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import comppo_core as cc  # noqa: E402
from comppo_core.integrations import openrlhf as cc_openrlhf  # noqa: E402
from comppo_core.integrations import verl as cc_verl  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = ((4, 8), (3, 5))
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
MASK_DTYPES = (torch.bool, torch.int64, torch.float32)

Tensors = dict[str, Any]

#: name -> (call on a dict of tensors, whether the output has the first argument's dtype)
CALLS: dict[str, tuple[Callable[[Tensors], Any], bool]] = {
    "gae": (
        lambda t: cc.gae(t["r"], t["v"], mask=t["m"], gates=t["g"], last_values=t["lv"], gamma=0.99, lam=0.9),
        True,
    ),
    "gae packed int32": (lambda t: cc.gae(t["pr"], t["pv"], cu_seqlens=t["cu32"], gamma=0.99, lam=0.9), True),
    "gae packed int64": (lambda t: cc.gae(t["pr"], t["pv"], cu_seqlens=t["cu64"], gamma=0.99, lam=0.9), True),
    "td_targets": (lambda t: cc.td_targets(t["r"], t["v"], mask=t["m"], gates=t["g"], gamma=0.99), True),
    "gates_from_concentration": (lambda t: cc.gates_from_concentration(t["x"], mask=t["m"]), True),
    "controls.shuffle": (lambda t: cc.controls.shuffle(t["g"], mask=t["m"], seed=1), True),
    "controls.by_position": (lambda t: cc.controls.by_position(t["g"], mask=t["m"]), True),
    "controls.constant": (lambda t: cc.controls.constant(t["g"], mask=t["m"]), True),
    "group_advantages": (lambda t: cc.group_advantages(t["s"], t["groups"]), False),
    "broadcast": (lambda t: cc.broadcast(t["a"], mask=t["m"]), True),
    "masked_whiten": (lambda t: cc.masked_whiten(t["x"], mask=t["m"]), True),
    "credit_stats": (lambda t: cc.credit_stats(t["x"], mask=t["m"]), False),
    "verl drop-in": (
        lambda t: cc_verl.compute_gae_advantage_return(t["r"], t["v"], t["m"], 1.0, 0.95, gates=t["g"]),
        True,
    ),
    # OpenRLHF multiplies by the mask first (a float32 mask times bf16 values is float32
    # in torch, as in OpenRLHF itself): the dtype is the CPU path's, not the first argument's
    "openrlhf drop-in": (
        lambda t: cc_openrlhf.get_advantages_and_returns(t["v"], t["r"], t["m"], 1.0, 0.95, gates=t["g"]),
        False,
    ),
}


def cpu_tensors(shape: tuple[int, int], dtype: Any, mask_dtype: Any) -> Tensors:
    rng = np.random.default_rng(shape[0] * 100 + shape[1])
    b = shape[0]
    valid = rng.random(shape) < 0.8
    valid[:, 0] = True
    base = {
        "r": rng.standard_normal(shape) * valid,
        "v": rng.standard_normal(shape),
        "g": rng.uniform(0.5, 1.0, shape),
        "x": rng.standard_normal(shape),
        "lv": rng.standard_normal(b),
        "s": rng.standard_normal(2 * b),
        "a": rng.standard_normal(b),
    }
    t = {k: torch.from_numpy(a).to(dtype) for k, a in base.items()}
    t["m"] = torch.from_numpy(valid).to(mask_dtype)
    t["groups"] = torch.arange(2 * b) // 2
    keep = torch.from_numpy(valid)
    t["pr"], t["pv"] = t["r"][keep], t["v"][keep]
    t["cu32"] = torch.from_numpy(np.concatenate([[0], np.cumsum(valid.sum(axis=1))]).astype(np.int32))
    t["cu64"] = t["cu32"].long()
    return t


def parts(x: Any) -> list[Any]:
    return list(x) if isinstance(x, tuple) else [x]


@pytest.mark.parametrize("mask_dtype", MASK_DTYPES, ids=lambda d: f"mask={str(d).removeprefix('torch.')}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", list(CALLS))
def test_device_tensors_give_the_cpu_results(
    name: str, shape: tuple[int, int], dtype: Any, mask_dtype: Any, device: Any
) -> None:
    call, first_dtype = CALLS[name]
    cpu = cpu_tensors(shape, dtype, mask_dtype)
    want = call(cpu)
    got = call({k: v.to(device) for k, v in cpu.items()})
    if isinstance(want, dict):  # credit_stats: plain floats
        assert got == want
        return
    for g, w in zip(parts(got), parts(want), strict=True):
        assert isinstance(g, torch.Tensor), f"expected a tensor, got {type(g).__name__}"
        assert g.device == device
        assert g.dtype == w.dtype
        if first_dtype:
            assert g.dtype == dtype, "the output dtype must be the first argument's"
        assert torch.equal(g.cpu(), w), (
            f"differs from the CPU path by {(g.cpu().double() - w.double()).abs().max().item():.3g}"
        )


@pytest.mark.parametrize("with_gates", [False, True], ids=["gae", "comp-gae"])
def test_verl_dropin_on_device_matches_verl_loop_on_device(with_gates: bool, device: Any) -> None:
    """verl's loop run on the device tensors in float32 (one rounding per step) against
    the drop-in (float64 accumulation), 64 rows of up to 256 tokens, right padding."""
    import test_integrations as suite  # the test suite's statement-for-statement copy of verl's loop

    rng = np.random.default_rng(0)
    b, t = 64, 256
    lengths = rng.integers(t // 2, t + 1, size=b)
    valid = np.arange(t)[None, :] < lengths[:, None]
    host = {
        "rewards": (rng.standard_normal((b, t)) * valid).astype(np.float32),
        "values": rng.standard_normal((b, t)).astype(np.float32),
        "gates": rng.uniform(0.5, 1.0, (b, t)).astype(np.float32),
        "mask": valid.astype(np.float32),  # verl's response_mask is numeric (its loop uses 1 - mask)
    }
    dev = {k: torch.from_numpy(v).to(device) for k, v in host.items()}
    gates = dev["gates"] if with_gates else None
    adv, ret = cc_verl.compute_gae_advantage_return(dev["rewards"], dev["values"], dev["mask"], 1.0, 0.95, gates=gates)
    want_adv, want_ret = suite.verl_compute_gae_advantage_return(
        dev["rewards"], dev["values"], dev["mask"], 1.0, 0.95, gates
    )
    for got, want in ((adv, want_adv), (ret, want_ret)):
        assert got.device == device and got.dtype == torch.float32
        g, w = got.cpu().numpy(), want.float().cpu().numpy()
        np.testing.assert_allclose(g[valid], w[valid], rtol=1e-4, atol=1e-4)
        assert not g[~valid].any(), "nonzero outputs at masked positions"


def test_one_round_trip_per_call(device: Any) -> None:
    """A CUDA call makes one device→host and one host→device copy (design §6)."""
    if device.type != "cuda":
        pytest.skip("counts CUDA copies")
    from torch.profiler import ProfilerActivity, profile

    cpu = cpu_tensors((4, 8), torch.float32, torch.bool)
    dev = {k: v.to(device) for k, v in cpu.items()}
    cc.gae(dev["r"], dev["v"], mask=dev["m"], gates=dev["g"], gamma=0.99, lam=0.9)  # warm-up
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        cc.gae(dev["r"], dev["v"], mask=dev["m"], gates=dev["g"], gamma=0.99, lam=0.9)
        torch.cuda.synchronize(device)
    names = [e.name for e in prof.events()]
    assert sum("DtoH" in n for n in names) == 1, names
    assert sum("HtoD" in n for n in names) == 1, names
