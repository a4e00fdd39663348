"""Bit-identity of the trainer across a refactor: three steps of every arm, fingerprinted.

For a change that must not move a number (moving the step's maths between modules,
renaming, splitting files). Run it on the commit before and after, then compare::

    OMP_NUM_THREADS=1 python benches/lab/step_identity.py --save before.json      # old tree
    OMP_NUM_THREADS=1 python benches/lab/step_identity.py --check before.json     # new tree

Each arm trains the built-in policy (1-digit addition, a short SFT warm start; the oracle
arm, which needs pivotal marks, on ``filler_addition`` with short fillers) for
three steps with a KL to the reference, two epochs of two minibatches, evaluation every
step; the fingerprint is every metric of every step (timings dropped) and, after the
last step, the float64 sum and sum of squares of every actor and critic parameter.
``--check`` prints each arm's verdict and exits 1 on any difference (exact float
equality, ``repr`` of every number; a metric the saved fingerprint lacks is listed, not
compared). Deterministic on CPU with one thread.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from comppo_core.rl import ARMS, TrainConfig
from comppo_core.rl.engine.trainer import Trainer

SETTINGS: dict[str, Any] = {
    "digits": 1,
    "warmup_sft_steps": 120,
    "sft_batch_size": 32,
    "prompts_per_step": 4,
    "group_size": 4,
    "steps": 3,
    "eval_every": 1,
    "eval_size": 16,
    "save_every": 0,
    "progress": False,
    "num_threads": 1,
}


#: an arm whose gates are a task's pivotal marks runs on the smallest task that marks them
MARKED_TASK: dict[str, Any] = {"task": "filler_addition", "addition_filler_max": 4, "addition_tail_max": 0}


def fingerprint(arm: str) -> dict[str, Any]:
    task = MARKED_TASK if arm == "comppo_oracle" else {}
    trainer = Trainer(TrainConfig(arm=arm, **SETTINGS, **task))
    try:
        rows = [trainer.step(s) for s in range(SETTINGS["steps"])]
    finally:
        trainer.dist.close()
    metrics = [{k: repr(v) for k, v in row.items() if not k.startswith("time_")} for row in rows]
    sums: dict[str, list[str]] = {}
    modules = {"actor": trainer.actor, "critic": trainer.critic}
    for owner, module in modules.items():
        if module is None:
            continue
        for name, p in module.named_parameters():
            x = p.detach().double()
            sums[f"{owner}.{name}"] = [repr(float(x.sum())), repr(float((x * x).sum()))]
    return {"metrics": metrics, "parameters": sums}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--save", metavar="FILE", help="write the fingerprints to FILE")
    what.add_argument("--check", metavar="FILE", help="compare with the fingerprints in FILE")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms (default: every arm)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    arms = args.arms.split(",")
    got = {arm: fingerprint(arm) for arm in arms}
    if args.save:
        with open(args.save, "w") as fh:
            json.dump(got, fh, indent=1, sort_keys=True)
        print(f"saved {len(arms)} arms to {args.save}")
        return 0
    with open(args.check) as fh:
        want = json.load(fh)
    failed = 0
    for arm in arms:
        if arm not in want:
            print(f"{arm}: not in {args.check}")
            failed += 1
            continue
        diffs, added = [], set()
        for i, (a, b) in enumerate(zip(got[arm]["metrics"], want[arm]["metrics"])):
            added |= set(a) - set(b)  # a metric the new tree adds is reported, not a difference
            diffs += [f"step {i} {k}: {a.get(k)} != {b.get(k)}" for k in sorted(b) if a.get(k) != b.get(k)]
        pa, pb = got[arm]["parameters"], want[arm]["parameters"]
        diffs += [f"{k}: {pa.get(k)} != {pb.get(k)}" for k in sorted(set(pa) | set(pb)) if pa.get(k) != pb.get(k)]
        print(f"{arm}: " + ("bit-identical (3 steps: metrics and parameter sums)" if not diffs else "DIFFERS"))
        if added:
            print(f"    new metrics (not compared): {', '.join(sorted(added))}")
        for d in diffs[:10]:
            print("   ", d)
        failed += bool(diffs)
    print(f"{len(arms) - failed} of {len(arms)} arms bit-identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
