"""GPU benchmark: the verl drop-in on CUDA tensors against verl's GAE loop on the same tensors.

Run on a CUDA machine with the built wheel (and torch with CUDA) installed:

    python benches/gpu_gae.py                        # W1 512×4096 and L 8×32768
    python benches/gpu_gae.py --device cpu --small   # dry run anywhere (tiny sizes)

Workloads (float32, each row's response length uniform in [T/2, T] (right padding),
dense rewards on valid tokens, values ~ N(0, 1), gates uniform in [0.5, 1], γ = 1,
λ = 0.95, as in benches/compare.py):

    W1  512 × 4096          L  8 × 32768         (--small: 64 × 256 and 4 × 2048)

For each workload two variants are timed, both with the inputs and outputs on the
device:

    GAE        verl's compute_gae_advantage_return (its Python loop over tokens on the
               GPU tensors + verl's masked_whiten) vs
               comppo_core.integrations.verl.compute_gae_advantage_return
    Comp-GAE   the same with gates (verl's loop with γ replaced by γ·g_t at step t) vs
               the drop-in with gates=

comppo-core's times include every copy (device → pinned host → kernel → device);
torch.cuda.synchronize() brackets each timed call. The "host" column is the same
drop-in on NumPy copies of the inputs (the kernels alone, no transfers), for scale.
Results are compared on valid positions (max abs difference of the whitened
advantages and of the returns; float32 allclose with rtol = atol = 1e-4: the GPU loop
rounds once per step in float32, comppo-core accumulates in float64).

That every public function gives exactly the CPU path's results on CUDA tensors is a
test: tests/gpu/test_cuda_paths.py.

Exit status: 0 when the results agree, 1 when they do not, 2 when CUDA was
asked for and is not available. The ≥ 20× target at W1 is reported; with --strict a
miss exits 3. Runs in well under 5 minutes on one GPU (the 32768-step loop is timed
with 1 warm-up + 2 calls; see --reps / --long-reps).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

GAMMA, LAM = 1.0, 0.95
TARGET = 20.0
RTOL = ATOL = 1e-4


@dataclass
class Workload:
    name: str
    b: int
    t: int
    reps: int  # timed calls (after one warm-up call)


def make_inputs(b: int, t: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(t // 2, t + 1, size=b)
    mask = np.arange(t)[None, :] < lengths[:, None]
    return {
        "rewards": (rng.standard_normal((b, t)) * mask).astype(np.float32),
        "values": rng.standard_normal((b, t)).astype(np.float32),
        "gates": rng.uniform(0.5, 1.0, (b, t)).astype(np.float32),
        "mask": mask.astype(np.float32),  # verl's response_mask is numeric (its loop uses 1 - mask)
    }


# --------------------------------------------------------------------------- verl
# --------------------------------------------------------------------------- timing
def timed(fn: Callable[[], Any], reps: int, sync: Callable[[], None]) -> tuple[float, Any]:
    """Median seconds of ``reps`` calls after one warm-up call, and the last result."""
    out = fn()
    sync()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def count_copies(fn: Callable[[], Any], sync: Callable[[], None]) -> str:
    """Device↔host memcpy operations of one call, from the torch profiler (informational)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
        names = [e.name for e in prof.events()]
        d2h = sum("DtoH" in n for n in names)
        h2d = sum("HtoD" in n for n in names)
        return f"{d2h} DtoH + {h2d} HtoD"
    except Exception as e:  # noqa: BLE001 - the profiler is optional here
        return f"n/a ({type(e).__name__})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cuda (default; exits 2 without CUDA) or cpu for a dry run of the script",
    )
    p.add_argument("--small", action="store_true", help="tiny sizes (64×256 and 4×2048) for a quick dry run")
    p.add_argument("--reps", type=int, default=5, help="timed calls at W1 after one warm-up (default 5)")
    p.add_argument("--long-reps", type=int, default=2, help="timed calls at 8×32768 after one warm-up (default 2)")
    p.add_argument("--strict", action="store_true", help=f"exit 3 if the W1 speedup is below {TARGET:g}×")
    args = p.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # keep the table and the progress lines in order

    try:
        import torch
    except ImportError:
        print("gpu_gae: torch is not installed", file=sys.stderr)
        return 2
    import verl_original  # verl's published loop and masked_whiten (benches/verl_original.py)

    import comppo_core
    from comppo_core.integrations import verl as cc_verl

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_gae: CUDA is not available (torch.cuda.is_available() is False); use --device cpu for a dry run",
            file=sys.stderr,
        )
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:  # tensors report their index: "cuda" → "cuda:0"
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda":

        def sync() -> None:
            torch.cuda.synchronize(device)

        where = f"{torch.cuda.get_device_name(device)}, torch {torch.__version__} (CUDA {torch.version.cuda})"
    else:

        def sync() -> None:
            pass

        where = f"CPU dry run, torch {torch.__version__}"
    print(
        f"gpu_gae: comppo-core {comppo_core.__version__}, {where}, "
        f"{comppo_core.get_num_threads()} kernel threads; γ={GAMMA}, λ={LAM}, float32"
    )

    if args.small:
        workloads = [Workload("W1 (small)", 64, 256, args.reps), Workload("L (small)", 4, 2048, args.long_reps)]
    else:
        workloads = [Workload("W1", 512, 4096, args.reps), Workload("L", 8, 32768, args.long_reps)]

    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    start = time.perf_counter()
    for w in workloads:
        host = make_inputs(w.b, w.t, seed=w.b * 7919 + w.t)
        dev = {k: torch.from_numpy(v).to(device) for k, v in host.items()}
        valid = host["mask"] != 0
        for variant, with_gates in (("GAE", False), ("Comp-GAE", True)):
            g_dev = dev["gates"] if with_gates else None
            g_host = host["gates"] if with_gates else None

            def run_verl(dev: dict[str, Any] = dev, g_dev: Any = g_dev) -> Any:
                return verl_original.compute_gae_advantage_return(
                    dev["rewards"], dev["values"], dev["mask"], GAMMA, LAM, g_dev
                )

            def run_comppo(dev: dict[str, Any] = dev, g_dev: Any = g_dev) -> Any:
                return cc_verl.compute_gae_advantage_return(
                    dev["rewards"], dev["values"], dev["mask"], GAMMA, LAM, gates=g_dev
                )

            def run_host(host: dict[str, Any] = host, g_host: Any = g_host) -> Any:
                return cc_verl.compute_gae_advantage_return(
                    host["rewards"], host["values"], host["mask"], GAMMA, LAM, gates=g_host
                )

            t_verl, (v_adv, v_ret) = timed(run_verl, w.reps, sync)
            t_cc, (c_adv, c_ret) = timed(run_comppo, max(w.reps, 3), sync)
            t_host, _ = timed(run_host, max(w.reps, 3), lambda: None)

            problems = []
            for name, out in (("advantages", c_adv), ("returns", c_ret)):
                if (
                    not isinstance(out, torch.Tensor)
                    or out.device != dev["rewards"].device
                    or out.dtype != torch.float32
                ):
                    problems.append(
                        f"{name}: expected a float32 tensor on {device}, got {type(out).__name__} "
                        f"{getattr(out, 'dtype', '')} on {getattr(out, 'device', '')}"
                    )
            ca, cr = c_adv.float().cpu().numpy(), c_ret.float().cpu().numpy()
            va, vr = v_adv.float().cpu().numpy(), v_ret.float().cpu().numpy()
            d_adv = float(np.abs(ca[valid] - va[valid]).max())
            d_ret = float(np.abs(cr[valid] - vr[valid]).max())
            for name, got, want in (("advantages", ca, va), ("returns", cr, vr)):
                if not np.allclose(got[valid], want[valid], rtol=RTOL, atol=ATOL):
                    problems.append(f"{name} disagree with verl's loop beyond rtol=atol={RTOL:g}")
            if ca[~valid].any() or cr[~valid].any():
                problems.append("nonzero outputs at masked positions")
            copies = count_copies(run_comppo, sync) if device.type == "cuda" and w is workloads[0] else ""
            ok = not problems
            if not ok:
                failures.extend(f"{w.name} {variant}: {msg}" for msg in problems)
            rows.append(
                {
                    "workload": f"{w.name} {w.b}×{w.t}",
                    "variant": variant,
                    "verl": t_verl,
                    "comppo": t_cc,
                    "host": t_host,
                    "speedup": t_verl / t_cc,
                    "d_adv": d_adv,
                    "d_ret": d_ret,
                    "ok": ok,
                    "copies": copies,
                    "w1": w is workloads[0],
                }
            )
            print(f"  done {w.name} {variant} ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)

    head = (
        f"{'workload':<20}{'variant':<10}{'verl loop ms':>14}{'comppo ms':>11}{'host ms':>9}"
        f"{'speedup':>9}{'max|Δadv|':>11}{'max|Δret|':>11}{'agree':>7}"
    )
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['workload']:<20}{r['variant']:<10}{r['verl'] * 1e3:>14.2f}{r['comppo'] * 1e3:>11.2f}"
            f"{r['host'] * 1e3:>9.2f}{r['speedup']:>8.1f}×{r['d_adv']:>11.2e}{r['d_ret']:>11.2e}"
            f"{'yes' if r['ok'] else 'NO':>7}"
        )
    print()
    print(
        "comppo ms: the drop-in on the device tensors, copies included; host ms: the same on NumPy "
        "arrays (kernels only)"
    )
    for r in rows:
        if r["copies"]:
            print(
                f"copies per drop-in call ({r['workload']} {r['variant']}): {r['copies']} "
                "(the drop-in calls gae and masked_whiten: one round trip each)"
            )
    w1 = [r for r in rows if r["w1"]]
    worst = min(r["speedup"] for r in w1)
    met = worst >= TARGET
    label = "W1" if not args.small else "W1 (small sizes: not the target workload)"
    print(f"target ≥ {TARGET:g}× at {label}: {'met' if met else 'NOT met'} (lowest {worst:.1f}×)")
    print(f"total {time.perf_counter() - start:.1f} s")
    if failures:
        print(f"\nFAILED ({len(failures)}):", file=sys.stderr)
        for f in failures[:40]:
            print(f"  {f}", file=sys.stderr)
        if len(failures) > 40:
            print(f"  ... and {len(failures) - 40} more", file=sys.stderr)
        reasons = collections.Counter(f.split(": ", 2)[-1] for f in failures)
        print("by reason: " + "; ".join(f"{n}× {why}" for why, n in reasons.most_common(10)), file=sys.stderr)
        return 1
    if args.strict and not met:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
