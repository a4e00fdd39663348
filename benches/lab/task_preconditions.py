"""Preconditions of a task with pivotal tokens (``--task chain``, the default here, or
``--task filler_addition``) before any RL comparison on it.

Run:  python benches/lab/task_preconditions.py probe [--seeds 5] [--json FILE] [--warm-starts DIR] [TrainConfig flags]
      python benches/lab/task_preconditions.py critic --out DIR [--seeds 5] [flags]   # (b)
      python benches/lab/task_preconditions.py oracle --out DIR [--seeds 5] [flags]   # (c)

(a) ``probe``: for each seed, the trainer's own warm start (``Trainer(config)``: the SFT
    warm start of ``rl/build.py``), its greedy held-out accuracy on ``eval_size`` held-out
    problems, and one rollout batch sampled as step 0 samples it (``prompts_per_step`` ×
    ``group_size`` at the config's temperature). The concentration probe (``rl.forward``,
    ``statistic`` as the config's) gives each response column its concentration; the
    columns whose token is pivotal (the task's ``pivotal``: the chain task's recalled digit
    and chain, filler_addition's worked addition) and those whose token is filler (the
    separators and EOS excluded) are compared
    by the Mann–Whitney AUC ``P(c_pivotal > c_filler)`` (ties ½) over the whole batch, and
    within rows (the mean over rows of each row's AUC, the ranking a per-row z-score of
    the gates keeps). For reference, the AUC of the column's position in the response
    alone, and the share of the concentration gates' variance that the response position
    explains (``R²`` of the per-position means: what ``comppo_position`` keeps). One line
    per seed and the mean with a 95% t-interval over seeds.
(b) ``critic``: does a warmed critic beat ``grpo``? ``comppo-core compare --arms ppo,grpo``
    (``ppo``'s critic warms up for ``critic_warmup`` rounds, 10 by default, before the same
    ``steps`` actor updates as ``grpo``'s); its results.md has the paired difference with
    its 95% t-interval over seeds.
(c) ``oracle``: ``comppo-core compare --arms comppo_oracle,tac_fixed --seeds N``: do the
    oracle gates (high on pivotal tokens) beat a constant gate? Needs the ``comppo_oracle``
    arm.

The task's sizes are the TrainConfig defaults unless given (``--chain-digits``,
``--chain-steps``, ``--chain-filler-min``, ``--chain-filler-max``, ``--addition-filler-max``,
...); this script's own
defaults for the run (``--warmup-sft-steps`` etc., in ``RUN_DEFAULTS``) are the sizes
docs/training.md reports. CPU: one process, one thread (``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

#: The settings every part runs with unless a flag overrides them (docs/training.md, "The chain task").
RUN_DEFAULTS: dict[str, Any] = {
    "task": "chain",
    "steps": 40,
    "eval_size": 512,
    "eval_every": 10,
    "prompts_per_step": 8,
    "group_size": 8,
}


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mann–Whitney AUC ``P(X > Y) + ½ P(X = Y)`` of ``pos`` over ``neg`` (average ranks)."""
    x = np.concatenate([pos, neg]).astype(np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    xs = x[order]
    i = 0
    while i < len(xs):  # average ranks over ties
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    n1, n0 = len(pos), len(neg)
    return float((ranks[:n1].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def mean_ci(values: list[float]) -> str:
    from comppo_core.experiments.statistics import mean_ci as _mean_ci

    m, half = _mean_ci(values)
    return f"{m:.3f}" + ("" if half is None else f" ± {half:.3f}")


def probe_seed(config: Any) -> dict[str, Any]:
    """Warm start, held-out accuracy and the concentration probe's AUC for one seed."""
    import torch

    from comppo_core import gating
    from comppo_core.rl import Trainer, forward

    t0 = time.perf_counter()
    trainer = Trainer(config)
    warm_s = time.perf_counter() - t0
    accuracy = trainer.evaluate()
    task = trainer.task
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(trainer.torch_rng)
        r = trainer.rollout(0)
    with torch.no_grad():
        out = forward(
            trainer.actor,
            r.input_ids,
            r.attention_mask,
            response_mask=r.response_mask,
            statistic=config.statistic,
            temperature=config.temperature,
        )
    assert out.concentration is not None
    conc = out.concentration.float().numpy()
    gates = np.asarray(gating.gates_from_concentration(conc, mask=r.response_mask.numpy(), params=config.gate_params))
    mask = r.response_mask.numpy()
    piv_c: list[float] = []
    fill_c: list[float] = []
    piv_g: list[float] = []
    fill_g: list[float] = []
    piv_pos: list[int] = []
    fill_pos: list[int] = []
    row_aucs: list[float] = []
    g_by_pos: dict[int, list[float]] = {}
    filler_lengths = []
    for b, (problem, text) in enumerate(zip(r.problems, r.responses)):
        cols = np.nonzero(mask[b])[0]  # column cols[k] scores response token k (the last: EOS if finished)
        flags = task.pivotal(problem, text)
        sep = text.find("|")
        if sep >= 0:
            filler_lengths.append(sep)
        kinds = ["pivotal" if f else ("filler" if text[k] != "|" else "sep") for k, f in enumerate(flags)]
        kinds += ["eos"] * (len(cols) - len(kinds))
        rp, rf = [], []
        for k, (col, kind) in enumerate(zip(cols, kinds)):
            g_by_pos.setdefault(k, []).append(float(gates[b, col]))
            if kind == "pivotal":
                rp.append(float(conc[b, col]))
                piv_g.append(float(gates[b, col]))
                piv_pos.append(k)
            elif kind == "filler":
                rf.append(float(conc[b, col]))
                fill_g.append(float(gates[b, col]))
                fill_pos.append(k)
        piv_c += rp
        fill_c += rf
        if rp and rf:
            row_aucs.append(auc(np.array(rp), np.array(rf)))
    all_g = np.concatenate([np.array(v) for v in g_by_pos.values()])
    between = sum(len(v) * (np.mean(v) - all_g.mean()) ** 2 for v in g_by_pos.values())
    total = float(((all_g - all_g.mean()) ** 2).sum())
    return {
        "seed": config.seed,
        "warm_start_s": warm_s,
        "heldout_accuracy": accuracy,
        "sample_reward": float(r.rewards.float().mean()),
        "finished": float(r.finished.float().mean()),
        "response_tokens": float(mask.sum(-1).mean()),
        "filler_length_mean": float(np.mean(filler_lengths)) if filler_lengths else None,
        "filler_length_sd": float(np.std(filler_lengths)) if filler_lengths else None,
        "pivotal_tokens": len(piv_c),
        "filler_tokens": len(fill_c),
        "auc_concentration": auc(np.array(piv_c), np.array(fill_c)),
        "auc_gates": auc(np.array(piv_g), np.array(fill_g)),
        "auc_within_rows": float(np.mean(row_aucs)) if row_aucs else None,
        "auc_position": auc(np.array(piv_pos, float), np.array(fill_pos, float)),
        "gate_variance_explained_by_position": between / total if total > 0 else None,
    }


def run_probe(args: argparse.Namespace, extra: list[str]) -> int:
    import torch

    from comppo_core.rl import TrainConfig

    torch.set_num_threads(1)
    rows = []
    for seed in range(args.seeds):
        config = _config(extra, seed=seed, out=None, progress=False, critic_warmup=0)  # the policy alone
        if args.warm_starts:  # a compare's own warm starts: the policies its runs started from
            config = config.replace(init_from=f"{args.warm_starts}/warmstart/seed{seed}/warmstart")
        row = probe_seed(config)
        rows.append(row)
        print(
            f"seed {seed}: warm start {row['warm_start_s']:.0f} s, held-out accuracy {100 * row['heldout_accuracy']:.1f}%"
            f" (sampled reward {100 * row['sample_reward']:.1f}%, {row['response_tokens']:.1f} tokens, filler "
            f"{row['filler_length_mean']:.1f} ± {row['filler_length_sd']:.1f}); AUC pivotal vs filler: concentration "
            f"{row['auc_concentration']:.3f}, gates {row['auc_gates']:.3f}, within rows {row['auc_within_rows']:.3f}, "
            f"position alone {row['auc_position']:.3f}; gate variance explained by position "
            f"{row['gate_variance_explained_by_position']:.3f}",
            flush=True,
        )
    keys = ("heldout_accuracy", "auc_concentration", "auc_gates", "auc_within_rows", "auc_position")
    for key in keys + ("gate_variance_explained_by_position",):
        print(f"{key}: {mean_ci([r[key] for r in rows])} (mean ± 95% t-CI half-width over {len(rows)} seeds)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            settings = TrainConfig.to_dict(_config(extra, seed=0, out=None, progress=False))
            json.dump({"settings": settings, "seeds": rows}, fh, indent=2)
    return 0


def _config(extra: list[str], **changes: Any) -> Any:
    from comppo_core.rl import TrainConfig

    parser = TrainConfig.add_arguments(argparse.ArgumentParser())
    parser.set_defaults(**RUN_DEFAULTS)
    ns = parser.parse_args(extra)
    return TrainConfig.from_args(ns).replace(**changes)


def run_compare(args: argparse.Namespace, extra: list[str], arms: str, out: str, more: list[str]) -> int:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in RUN_DEFAULTS.items()]
    cmd = ["comppo-core", "compare", "--arms", arms, "--seeds", str(args.seeds), "--out", out, "--no-progress"]
    cmd += flags + extra + more  # a flag given later wins (argparse keeps the last)
    print(" ".join(cmd), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.call(cmd, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("probe", "critic", "oracle"))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", default=None, help="critic, oracle: the compare's output directory")
    parser.add_argument("--json", default=None, help="probe: also write the per-seed figures here")
    parser.add_argument(
        "--warm-starts",
        default=None,
        metavar="DIR",
        help="probe: start seed s from a compare's warm start DIR/warmstart/seed<s>/warmstart instead of making one",
    )
    args, extra = parser.parse_known_args()
    if args.part == "probe":
        return run_probe(args, extra)
    if not args.out:
        sys.exit("--out: expected the output directory of the compares")
    if args.part == "critic":
        return run_compare(args, extra, "ppo,grpo", args.out, [])
    return run_compare(args, extra, "comppo_oracle,tac_fixed", args.out, [])


if __name__ == "__main__":
    sys.exit(main())
