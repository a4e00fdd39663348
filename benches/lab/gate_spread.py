"""Does the gates' z-score amplify noise? The concentration's spread within a response and the
spread of the gates it gives, on a random-init policy and on the package's trained warm starts,
with and without a floor on the z-score's spread (``GateParams.min_spread``).

Run:  OMP_NUM_THREADS=1 python benches/lab/gate_spread.py collect --cache DIR [--seeds 0,1,2] [--mc-samples 8]
      OMP_NUM_THREADS=1 python benches/lab/gate_spread.py report --cache DIR [--floors 0,1e-3,...] [--json FILE]

``collect`` builds each policy exactly as ``comppo-core diagnose`` builds it for ``--seed``
(``TrainConfig`` → ``make_task`` → ``initial_policy`` under ``torch.manual_seed(seed)``):

* ``random``:  the chain task's Llama with ``--warmup-sft-steps 0`` (the random init);
* ``chain``:   the trainer's default chain warm start (180 SFT steps);
* ``filler``:  the filler_addition warm start of docs/experiments/diagnose.md (F layout: 600 SFT
  steps, carry noise 0.5, filler ≤ 32, no tail, split seed 1);

samples one response to each of ``--prompts`` held-out problems (the diagnostic's sampler:
``experiments.diagnose.sample_responses``), scores every response token (the diagnostic's
``token_table``: each statistic's layer-average concentration, what the gates map, and the
policy's entropy and the token's NLL, what the ``comppo_policy_entropy`` and
``comppo_token_nll`` gates map), and, with
``--mc-samples K > 0`` (trained policies only), the Monte-Carlo pivotality of every token with K
continuations per prefix (the diagnostic's estimator). Everything is seeded by the seed; one
torch thread. One ``.npz`` per (policy, seed) goes to ``--cache``.

``report`` reads the cache and prints, per policy and score, over the responses (each figure
the median over responses, with the 10% and 90% quantiles in brackets):

* the score's level and spread within a response: the mean, the population std ``σ_row``,
  the coefficient of variation ``σ_row/mean`` and the range (max − min);
* the spread of the gates each normalisation gives, as a share of the gate range
  (``(max g − min g)/(high − low)`` within a response, and the std of ``(g − low)/(high − low)``),
  for ``normalize="causal"`` (the default) and ``"sequence"``, at each ``--floors`` value of
  ``min_spread`` (0: today's mapping);
* with pivotality in the cache: the AUC of the gates (``GateParams(low=0, high=1,
  min_spread=f)``, causal) for the Monte-Carlo pivotal tokens (``|ΔV| ≥ 0.25``), pooled over the
  scored tokens, with a 95% percentile interval from 1000 bootstrap resamples of responses
  (the diagnostic's ``"gates"`` AUC, at each floor).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

POLICIES: dict[str, dict[str, Any]] = {
    "random": {"task": "chain", "warmup_sft_steps": 0},
    "chain": {"task": "chain"},
    "filler": {
        "task": "filler_addition",
        "warmup_sft_steps": 600,
        "sft_carry_noise": 0.5,
        "addition_filler_max": 32,
        "addition_tail_max": 0,
        "split_seed": 1,
    },
}
STATISTICS = ("entropy", "max", "l2")
#: What a gate source maps: each statistic's layer-average concentration, the policy's entropy and the token's NLL.
SCORES = (*STATISTICS, "policy_entropy", "token_nll")
DEFAULT_FLOORS = (0.0, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2)


def collect(args: argparse.Namespace) -> None:
    """Build each policy, sample, score and (optionally) estimate the pivotality; one npz each."""
    import torch

    from comppo_core.experiments import pivotality as mc
    from comppo_core.experiments.diagnose import DiagnoseSettings, sample_responses, token_table
    from comppo_core.rl.config import TrainConfig
    from comppo_core.rl.engine.build import initial_policy, make_task

    torch.set_num_threads(1)
    device = torch.device("cpu")
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    for name in args.policies.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            path = cache / f"{name}-seed{seed}.npz"
            if path.exists():
                print(f"{path}: cached", flush=True)
                continue
            t0 = time.perf_counter()
            config = TrainConfig.from_preset("default", **POLICIES[name], seed=seed, out=None, progress=False)
            task, tokenizer = make_task(config)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                actor, warm = initial_policy(config, task, tokenizer.vocab_size, device)
            settings = DiagnoseSettings(
                prompts=args.prompts, samples_per_prefix=max(1, args.mc_samples), temperature=config.temperature,
                top_p=config.top_p, max_new_tokens=config.max_new_tokens, statistic=config.statistic, seed=seed,
            )  # fmt: skip
            responses, _ = sample_responses(actor, tokenizer, task, task.heldout(args.prompts), settings, device)
            table = token_table(actor, tokenizer, task, responses, settings, device)
            arrays: dict[str, Any] = {}
            for name in SCORES:
                rows = table.scores[f"concentration/{name}/mean" if name in STATISTICS else name]
                arrays[f"score/{name}"] = np.concatenate(rows)
            arrays["lengths"] = np.array([len(r) for r in table.scores["position"]], dtype=np.int64)
            arrays["rewards"] = np.array([r.reward for r in responses], dtype=np.float64)
            if args.mc_samples > 0 and name != "random":
                rng = np.random.default_rng([seed, 5])
                chosen = [mc.choose_positions(r.length, None, "even", rng) for r in responses]
                jobs = mc.continuation_jobs(responses, chosen, args.mc_samples)
                max_new = config.max_new_tokens or task.max_new_tokens
                sampler = mc.PolicyContinuations(
                    actor, tokenizer, task, max_new_tokens=max_new, temperature=config.temperature,
                    top_p=config.top_p, seed=seed, device=device,
                )  # fmt: skip
                rewards: list[float] = []
                for lo in range(0, len(jobs), settings.batch_size):
                    got, _ = sampler(responses, jobs[lo : lo + settings.batch_size])
                    rewards += got
                values, _ = mc.values_from_rewards(responses, jobs, rewards)
                arrays["pivotality"] = np.concatenate([mc.pivotality_of(v, c) for v, c in zip(values, chosen)])
            np.savez(path, **arrays)
            print(
                f"{path}: {len(responses)} responses, {int(arrays['lengths'].sum())} tokens, mean reward "
                f"{arrays['rewards'].mean():.3f}, SFT {warm['sft_steps']} steps, {time.perf_counter() - t0:.0f} s",
                flush=True,
            )


def _rows(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    return np.split(flat, np.cumsum(lengths)[:-1])


def _median(values: list[float]) -> str:
    q = np.quantile(values, [0.1, 0.5, 0.9])
    return f"{q[1]:.3g} [{q[0]:.3g}, {q[2]:.3g}]"


def _gate_spread(rows: list[np.ndarray], normalize: str, floor: float) -> tuple[list[float], list[float]]:
    """Per response: ``(max g − min g)`` and ``std g`` of the gates with ``low=0, high=1``."""
    import comppo_core as cc

    params = cc.GateParams(low=0.0, high=1.0, normalize=normalize, min_spread=floor)
    ranges, stds = [], []
    for row in rows:
        if row.size < 2:
            continue
        g = cc.gates_from_concentration(row[None, :], params=params)[0]
        ranges.append(float(g.max() - g.min()))
        stds.append(float(g.std()))
    return ranges, stds


def _gates_auc(rows: list[np.ndarray], pivotal: np.ndarray, floor: float, seed: int) -> tuple[float, float, float]:
    import comppo_core as cc
    from comppo_core.experiments.rank_statistics import auc, cluster_bootstrap

    params = cc.GateParams(low=0.0, high=1.0, min_spread=floor)
    gates = np.concatenate([cc.gates_from_concentration(r[None, :], params=params)[0] for r in rows])
    lengths = [len(r) for r in rows]
    starts = np.cumsum([0] + lengths[:-1])
    clusters = [np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts, lengths)]
    i = cluster_bootstrap(
        lambda idx: auc(gates[idx], pivotal[idx]), clusters, resamples=1000, rng=np.random.default_rng([seed, 11])
    )
    return float(i.estimate), float(i.low), float(i.high)


def report(args: argparse.Namespace) -> None:
    """The tables of the module docstring, from the cache."""
    floors = [float(f) for f in args.floors.split(",")]
    out: dict[str, Any] = {}
    for path in sorted(Path(args.cache).glob("*.npz")):
        data = np.load(path)
        lengths = data["lengths"]
        key = path.stem
        out[key] = {"responses": int(lengths.size), "tokens": int(lengths.sum()),
                    "mean_reward": float(data["rewards"].mean())}  # fmt: skip
        print(f"\n## {key}: {lengths.size} responses, {lengths.sum()} tokens, mean reward {data['rewards'].mean():.3f}")
        print("statistic | mean c | σ_row | σ_row/mean | range | gate range share (causal; sequence) at min_spread = "
              + ", ".join(f"{f:g}" for f in floors))  # fmt: skip
        for stat in SCORES:
            if f"score/{stat}" not in data.files:
                continue
            rows = _rows(data[f"score/{stat}"], lengths)
            rows2 = [r for r in rows if r.size >= 2]
            means = [float(r.mean()) for r in rows2]
            sds = [float(r.std()) for r in rows2]
            cvs = [s / m if m > 0 else float("nan") for s, m in zip(sds, means)]
            rngs = [float(r.max() - r.min()) for r in rows2]
            entry: dict[str, Any] = {
                "mean": _quantiles(means), "std": _quantiles(sds), "cv": _quantiles(cvs), "range": _quantiles(rngs),
                "gates": {},
            }  # fmt: skip
            cells = []
            for f in floors:
                causal, causal_sd = _gate_spread(rows, "causal", f)
                seq, seq_sd = _gate_spread(rows, "sequence", f)
                entry["gates"][f"{f:g}"] = {
                    "causal_range": _quantiles(causal), "causal_std": _quantiles(causal_sd),
                    "sequence_range": _quantiles(seq), "sequence_std": _quantiles(seq_sd),
                }  # fmt: skip
                cells.append(f"{np.median(causal):.3f}; {np.median(seq):.3f}")
            if "pivotality" in data.files:
                pivotal = data["pivotality"] >= 0.25
                entry["pivotal_tokens"] = int(pivotal.sum())
                entry["gates_auc"] = {f"{f:g}": _gates_auc(rows, pivotal, f, 0) for f in floors}
            out[key][stat] = entry
            print(
                f"{stat} | {_median(means)} | {_median(sds)} | {_median(cvs)} | {_median(rngs)} | " + " / ".join(cells)
            )
            if "gates_auc" in entry:
                print(f"  gates AUC ({entry['pivotal_tokens']} pivotal): "
                      + ", ".join(f"{k}: {a:.3f} [{lo:.3f}, {hi:.3f}]" for k, (a, lo, hi) in entry["gates_auc"].items()))  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


def _quantiles(values: list[float]) -> dict[str, float]:
    q = np.nanquantile(values, [0.1, 0.5, 0.9])
    return {"q10": float(q[0]), "median": float(q[1]), "q90": float(q[2])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="part", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--cache", required=True)
    c.add_argument("--policies", default="random,chain,filler")
    c.add_argument("--seeds", default="0,1,2")
    c.add_argument("--prompts", type=int, default=32)
    c.add_argument("--mc-samples", type=int, default=8, help="continuations per prefix (0: no pivotality)")
    r = sub.add_parser("report")
    r.add_argument("--cache", required=True)
    r.add_argument("--floors", default=",".join(f"{f:g}" for f in DEFAULT_FLOORS))
    r.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if os.environ.get("OMP_NUM_THREADS") != "1":
        print("gate_spread: set OMP_NUM_THREADS=1 (one thread, as the figures were measured)", file=sys.stderr)
    collect(args) if args.part == "collect" else report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
