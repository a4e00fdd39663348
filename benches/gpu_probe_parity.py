"""GPU check: the concentration probe on CUDA against eager attention weights on CUDA.

The test suite (``tests/test_hf_probe.py``) pins the probe against eager
``output_attentions=True`` weights on the CPU only; CI has no GPU. This script runs the
same comparison with the model and the batch on a CUDA device, reusing that test file's
models, batches and reference (``build``, ``batch``, ``visibility``,
``reference_from_weights``), so the two cannot drift apart:

    python benches/gpu_probe_parity.py                  # on CUDA
    python benches/gpu_probe_parity.py --device cpu     # dry run anywhere

For each architecture (Llama, Qwen2, Qwen3, Mistral with sliding windows, GPT-2) and
padding (none, left, right, both), on the device:

    float32    every statistic, methods auto / online / chunked / fused (entropy, l2), against the eager
               reference computed on the device: ≤ 1e-4 (the test's tolerance); and
               against the CPU probe on the same weights: ≤ 1e-4
    bfloat16   every statistic (auto, online, and fused with precision="model" except max)
               against eager bfloat16 weights on the device: ≤ 4·2⁻⁸ (the test's
               BF16_ATOL and its justification)
    logits     bit-identical with and without the probe (both dtypes), and the model's
               attention implementation restored afterwards

Then ``hf.logprobs_and_concentration`` and ``hf.comp_gae_batch`` on the device against
the CPU (float32 log-probs ≤ 1e-4, advantages and returns ≤ 1e-4; the outputs must be on
the device). Exit status: 0 when everything agrees, 1 when something does not, 2 when
CUDA was asked for and is missing. On an H200 it takes 40–55 s, most of it Triton
compiling the online kernel's variants (give it a timeout of 150 s or more).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
try:
    import torch

    import test_hf_probe as suite  # the test suite's models, batches and reference
    from comppo_core import hf
except ImportError as exc:  # pragma: no cover
    sys.exit(f"benches/gpu_probe_parity.py needs the [hf] and [test] extras (torch, transformers, pytest): {exc}")

F32_ATOL = 1e-4
BF16_ATOL = suite.BF16_ATOL


def device_reference(model: Any, ids: Any, am: Any, statistic: str) -> Any:
    """Head-mean statistic ``[B, T]`` (float64, CPU) from eager weights computed on the model's device."""
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        out = eager(**suite.forward_kwargs(ids, am), output_attentions=True)
    am_cpu = am.cpu()
    layers = range(len(out.attentions))
    acc = sum(
        suite.reference_from_weights(out.attentions[i].cpu(), suite.visibility(model, am_cpu, i), statistic) for i in layers
    )
    return torch.where(am_cpu != 0, acc / len(layers), 0.0)


def probe(model: Any, ids: Any, am: Any, statistic: str, **kw: Any) -> Any:
    with torch.no_grad(), hf.ConcentrationProbe(model, statistic, **kw) as p:
        model(**suite.forward_kwargs(ids, am))
    return p.concentration


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("CUDA is not available (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    import transformers

    print(f"gpu_probe_parity on {name}; torch {torch.__version__}, transformers {transformers.__version__}")
    t0 = time.perf_counter()
    failures: list[str] = []
    checks = 0

    def fail(text: str) -> None:
        failures.append(text)
        print("FAILED", text, flush=True)  # at once: a run cut short still shows what failed

    def check(label: str, err: float, tol: float) -> None:
        nonlocal checks
        checks += 1
        if not err <= tol:  # NaN fails
            fail(f"{label}: max |Δ| = {err:.3e} > {tol:.0e}")

    def same(label: str, ok: bool) -> None:
        nonlocal checks
        checks += 1
        if not ok:
            fail(label)

    worst: dict[str, float] = {}
    for arch in suite.ARCHS:
        for padding in suite.PADDINGS:
            ids_cpu, am_cpu = suite.batch(padding)
            ids, am = ids_cpu.to(device), am_cpu.to(device)
            for dtype, tol in ((torch.float32, F32_ATOL), (torch.bfloat16, BF16_ATOL)):
                cpu_model = suite.build(arch, dtype)
                model = copy.deepcopy(cpu_model).to(device)
                tag = f"{arch}/{padding}/{str(dtype).removeprefix('torch.')}"
                for statistic in suite.STATS:
                    ref = device_reference(model, ids, am, statistic)
                    variants: dict[str, dict[str, Any]] = {"auto": {}}
                    if device.type == "cuda":
                        variants["online"] = {"method": "online"}
                    if dtype == torch.float32:
                        variants["chunked"] = {"method": "chunked"}
                        if statistic != "max":  # max has no fused kernel
                            variants["fused"] = {"method": "fused"}
                    elif statistic != "max":
                        variants["fused/model"] = {"method": "fused", "precision": "model"}
                    for vname, kw in variants.items():
                        got = probe(model, ids, am, statistic, **kw)
                        same(f"{tag}/{statistic}/{vname}: on {device}", got.device.type == device.type)
                        err = float((got.double().cpu() - ref).abs().max())
                        worst[str(dtype)] = max(worst.get(str(dtype), 0.0), err)
                        check(f"{tag}/{statistic}/{vname} vs eager on {device}", err, tol)
                        same(f"{tag}/{statistic}/{vname}: padded queries 0", bool(torch.all(got[am == 0] == 0)))
                    if dtype == torch.float32:
                        on_cpu = probe(cpu_model, ids_cpu, am_cpu, statistic)
                        got = probe(model, ids, am, statistic)
                        check(f"{tag}/{statistic} {device} vs cpu", float((got.cpu() - on_cpu).abs().max()), F32_ATOL)
                with torch.no_grad():
                    plain = model(**suite.forward_kwargs(ids, am)).logits
                    with hf.ConcentrationProbe(model):
                        probed = model(**suite.forward_kwargs(ids, am)).logits
                same(f"{tag}: logits changed by the probe", torch.equal(plain, probed))
                same(f"{tag}: implementation not restored", model.config._attn_implementation == "sdpa")
        print(f"  done {arch}: {checks} checks so far, {len(failures)} failed ({time.perf_counter() - t0:.1f} s)", flush=True)

    # one call each: the pipeline on the device against the CPU
    cpu_model = suite.build("qwen3")
    model = copy.deepcopy(cpu_model).to(device)
    ids_cpu, am_cpu = suite.batch("both")
    lp_cpu, conc_cpu = hf.logprobs_and_concentration(cpu_model, ids_cpu, am_cpu)
    lp, conc = hf.logprobs_and_concentration(model, ids_cpu.to(device), am_cpu.to(device))
    same("logprobs_and_concentration: outputs on the device", lp.device.type == conc.device.type == device.type)
    check("logprobs_and_concentration: log-probs", float((lp.cpu() - lp_cpu).abs().max()), F32_ATOL)
    check("logprobs_and_concentration: concentration", float((conc.cpu() - conc_cpu).abs().max()), F32_ATOL)
    rm_cpu = am_cpu.clone()
    rm_cpu[:, :8] = 0  # the first 8 positions are the prompt
    scores = torch.tensor([1.0, -0.5, 0.25])
    run: Callable[[Any, Any], Any] = lambda m, dev: hf.comp_gae_batch(  # noqa: E731
        m, ids_cpu.to(dev), am_cpu.to(dev), rm_cpu.to(dev), scores.to(dev), gamma=1.0, lam=0.95
    )
    on_cpu, on_dev = run(cpu_model, "cpu"), run(model, device)
    for field in ("advantages", "returns", "gae_advantages", "gae_returns", "gates"):
        a, b = getattr(on_dev, field), getattr(on_cpu, field)
        same(f"comp_gae_batch.{field}: on the device", a.device.type == device.type)
        check(f"comp_gae_batch.{field}", float((a.cpu().double() - b.double()).abs().max()), F32_ATOL)

    print(
        f"{checks} checks, {len(failures)} failed; worst |probe − eager| float32 {worst.get('torch.float32', 0):.2e} "
        f"(tolerance {F32_ATOL:.0e}), bfloat16 {worst.get('torch.bfloat16', 0):.2e} (tolerance {BF16_ATOL:.1e}); "
        f"{time.perf_counter() - t0:.1f} s"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
