"""The concentration probe on CUDA against eager attention weights computed on CUDA
(design §7; the CPU suite, ``tests/hf/test_hf_probe.py``, pins the same on the CPU).

The models, batches, visibility masks and reference come from that file, so the two
cannot drift apart. For each architecture (Llama, Qwen2, Qwen3, Mistral with sliding
windows, GPT-2), padding (none, left, right, both) and statistic, on the device:

* float32: methods auto, online, chunked and fused (entropy, l2) within 1e-4 of the
  eager reference computed on the device, and the device's probe within 1e-4 of the
  CPU's on the same weights;
* bfloat16: auto, online, and fused with ``precision="model"`` (entropy, l2) within
  ``BF16_ATOL`` (4·2⁻⁸, justified in that file) of eager bfloat16 weights;
* padded queries are 0, the logits are unchanged bit for bit by the probe, and the
  model's attention implementation is restored.

Then ``hf.logprobs_and_concentration`` and ``hf.comp_gae_batch`` on the device against
the CPU. Most of the time goes to Triton compiling the online kernel's variants.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import test_hf_probe as suite  # noqa: E402  (tests/hf/, put on sys.path by tests/gpu/conftest.py)

from comppo_core import hf  # noqa: E402

pytestmark = pytest.mark.gpu

F32_ATOL = 1e-4
DTYPES = {"float32": (torch.float32, F32_ATOL), "bfloat16": (torch.bfloat16, suite.BF16_ATOL)}


@functools.cache
def models(arch: str, dtype_name: str, device: Any) -> tuple[Any, Any]:
    """(the CPU model, a copy of it on ``device``), same weights."""
    cpu_model = suite.build(arch, DTYPES[dtype_name][0])
    return cpu_model, copy.deepcopy(cpu_model).to(device)


def device_reference(model: Any, ids: Any, am: Any, statistic: str) -> Any:
    """Head-mean statistic ``[B, T]`` (float64, CPU) from eager weights computed on the model's device."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        out = eager(**suite.forward_kwargs(ids, am), output_attentions=True)
    am_cpu = am.cpu()
    layers = range(len(out.attentions))
    acc = sum(
        suite.reference_from_weights(out.attentions[i].cpu(), suite.visibility(model, am_cpu, i), statistic)
        for i in layers
    )
    return torch.where(am_cpu != 0, acc / len(layers), 0.0)


def variants(device: Any, dtype_name: str, statistic: str) -> dict[str, dict[str, Any]]:
    """The probe's methods to check for one dtype and statistic on ``device``."""
    out: dict[str, dict[str, Any]] = {"auto": {}}
    if device.type == "cuda":
        out["online"] = {"method": "online"}
    if dtype_name == "float32":
        out["chunked"] = {"method": "chunked"}
        if statistic != "max":  # max has no fused kernel
            out["fused"] = {"method": "fused"}
    elif statistic != "max":
        out["fused/model"] = {"method": "fused", "precision": "model"}
    return out


@pytest.mark.parametrize("statistic", suite.STATS)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("padding", suite.PADDINGS)
@pytest.mark.parametrize("arch", suite.ARCHS)
def test_probe_on_device_matches_eager_on_device(
    arch: str, padding: str, dtype_name: str, statistic: str, device: Any
) -> None:
    cpu_model, model = models(arch, dtype_name, device)
    ids_cpu, am_cpu = suite.batch(padding)
    ids, am = ids_cpu.to(device), am_cpu.to(device)
    tol = DTYPES[dtype_name][1]
    ref = device_reference(model, ids, am, statistic)
    problems = []
    for name, kw in variants(device, dtype_name, statistic).items():
        got = suite.probe_run(model, ids, am, statistic, **kw)
        if got.device.type != device.type:
            problems.append(f"{name}: result on {got.device}, expected {device}")
        err = float((got.double().cpu() - ref).abs().max())
        if not err <= tol:  # NaN fails
            problems.append(f"{name}: max |probe - eager| = {err:.3e} > {tol:.0e}")
        if not bool(torch.all(got[am == 0] == 0)):
            problems.append(f"{name}: padded queries are not 0")
    if dtype_name == "float32":
        on_cpu = suite.probe_run(cpu_model, ids_cpu, am_cpu, statistic)
        err = float((suite.probe_run(model, ids, am, statistic).cpu() - on_cpu).abs().max())
        if not err <= F32_ATOL:
            problems.append(f"device against CPU: max |Δ| = {err:.3e} > {F32_ATOL:.0e}")
    assert not problems, "; ".join(problems)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("padding", suite.PADDINGS)
@pytest.mark.parametrize("arch", suite.ARCHS)
def test_logits_unchanged_and_implementation_restored_on_device(
    arch: str, padding: str, dtype_name: str, device: Any
) -> None:
    _, model = models(arch, dtype_name, device)
    ids_cpu, am_cpu = suite.batch(padding)
    ids, am = ids_cpu.to(device), am_cpu.to(device)
    with torch.no_grad():
        plain = model(**suite.forward_kwargs(ids, am)).logits
        with hf.ConcentrationProbe(model):
            probed = model(**suite.forward_kwargs(ids, am)).logits
    assert torch.equal(plain, probed)
    assert model.config._attn_implementation == "sdpa"


def test_logprobs_and_concentration_on_device_match_cpu(device: Any) -> None:
    cpu_model, model = models("qwen3", "float32", device)
    ids_cpu, am_cpu = suite.batch("both")
    lp_cpu, conc_cpu = hf.logprobs_and_concentration(cpu_model, ids_cpu, am_cpu)
    lp, conc = hf.logprobs_and_concentration(model, ids_cpu.to(device), am_cpu.to(device))
    assert lp.device.type == conc.device.type == device.type
    assert float((lp.cpu() - lp_cpu).abs().max()) <= F32_ATOL
    assert float((conc.cpu() - conc_cpu).abs().max()) <= F32_ATOL


def test_comp_gae_batch_on_device_matches_cpu(device: Any) -> None:
    cpu_model, model = models("qwen3", "float32", device)
    ids_cpu, am_cpu = suite.batch("both")
    tokens = am_cpu.clone()
    tokens[:, :8] = 0  # the first 8 positions are the prompt
    response_mask = tokens[:, 1:]  # the response columns [B, T-1]: column j is token j+1
    scores = torch.tensor([1.0, -0.5, 0.25])

    def run(m: Any, dev: Any) -> Any:
        return hf.comp_gae_batch(
            m, ids_cpu.to(dev), am_cpu.to(dev), response_mask.to(dev), scores.to(dev), gamma=1.0, lam=0.95
        )

    on_cpu, on_dev = run(cpu_model, "cpu"), run(model, device)
    for field in ("advantages", "returns", "gae_advantages", "gae_returns", "gates"):
        a, b = getattr(on_dev, field), getattr(on_cpu, field)
        assert a.device.type == device.type, field
        assert float((a.cpu().double() - b.double()).abs().max()) <= F32_ATOL, field
