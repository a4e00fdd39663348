"""Are a task's marked (pivotal) tokens written deterministically by its warm start?

Tests the reading in docs/experiments/diagnose.md that the Monte-Carlo pivotality ranks the
marked tokens *below* the unmarked ones "because a warm-started policy writes most of a
marked span deterministically". On the built-in warm start of ``--task`` / ``--seed`` /
``--warmup-sft-steps`` (made as ``comppo-core diagnose`` makes it), over the text tokens of
one sampled response per held-out prompt (EOS left out; the marks are the task's):

* the policy's entropy (of softmax(logits/τ)) and the probability of the sampled token, marked
  against unmarked: means, their difference, and the AUC of the entropy for marked tokens;
* the Monte-Carlo pivotality (``comppo-core diagnose``'s estimator, every token, K
  continuations) against the marks: AUC over all tokens, and within the tokens where the
  policy is uncertain (entropy above the sample's median) and where it is nearly certain;
* ``post_hoc`` (a cut chosen after seeing the first results): the pivotality's AUC for the
  marked tokens sampled with p <= 0.9 against every unmarked token, and the share of tokens
  labelled pivotal (|dV| >= 0.25) among marked p > 0.9, marked p <= 0.9 and unmarked tokens.

Intervals: 95% percentile bootstrap over responses (1000 resamples, seeded).

    python benches/lab/marks_vs_uncertainty.py --task chain --seed 0 --warmup-sft-steps 180 --prompts 32 --samples-per-prefix 8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np


def post_hoc(H: np.ndarray, NLL: np.ndarray, PIV: np.ndarray, M: np.ndarray, lengths: np.ndarray, seed: int) -> dict:
    """The post hoc cut (module docstring) of the per-token arrays (responses of ``lengths``)."""
    from comppo_core.experiments.rank_statistics import auc, cluster_bootstrap

    del H
    P = np.exp(-NLL)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    clusters = [np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts, lengths)]
    certain = P > 0.9
    keep = ~(M & certain)

    def f(idx: np.ndarray) -> float | None:
        s = idx[keep[idx]]
        return auc(PIV[s], M[s])

    i = cluster_bootstrap(f, clusters, resamples=1000, rng=np.random.default_rng([seed, 101, 15]))
    out: dict = {"auc_marked_uncertain_vs_unmarked": {"estimate": i.estimate, "ci": [i.low, i.high]}}
    for name, sel in (("marked_p_above_0.9", M & certain), ("marked_p_at_most_0.9", M & ~certain), ("unmarked", ~M)):
        out[name] = {
            "tokens": int(sel.sum()),
            "share_pivotal": float((PIV[sel] >= 0.25).mean()) if sel.any() else None,
            "mean_pivotality": float(PIV[sel].mean()) if sel.any() else None,
        }
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--task", default="chain")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-sft-steps", type=int, default=180)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples-per-prefix", type=int, default=8)
    p.add_argument("--extra", default="{}", help="other TrainConfig fields, JSON")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    import torch

    from comppo_core.experiments import pivotality as mc
    from comppo_core.experiments.diagnose import DiagnoseSettings, _marks_section, sample_responses, token_table
    from comppo_core.experiments.rank_statistics import auc, cluster_bootstrap
    from comppo_core.rl.config import TrainConfig
    from comppo_core.rl.engine.build import initial_policy, make_task

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    config = TrainConfig(
        task=a.task, seed=a.seed, warmup_sft_steps=a.warmup_sft_steps, device="cpu", out=None, critic_warmup=0,
        **json.loads(a.extra),
    )  # fmt: skip
    task, tokenizer = make_task(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        actor, warm = initial_policy(config, task, tokenizer.vocab_size, torch.device("cpu"))
    settings = DiagnoseSettings(
        prompts=a.prompts, samples_per_prefix=a.samples_per_prefix, temperature=config.temperature,
        top_p=config.top_p, max_new_tokens=config.max_new_tokens, seed=config.seed,
    )  # fmt: skip
    max_new = settings.max_new_tokens or task.max_new_tokens
    problems = task.heldout(settings.prompts)
    responses, _ = sample_responses(actor, tokenizer, task, problems, settings, torch.device("cpu"))
    rng = np.random.default_rng([settings.seed, 5])
    chosen = [mc.choose_positions(r.length, None, "even", rng) for r in responses]
    jobs = mc.continuation_jobs(responses, chosen, settings.samples_per_prefix)
    sampler = mc.PolicyContinuations(
        actor, tokenizer, task, max_new_tokens=max_new, temperature=settings.temperature, top_p=settings.top_p,
        seed=settings.seed, device=torch.device("cpu"),
    )  # fmt: skip
    rewards: list[float] = []
    for lo in range(0, len(jobs), settings.batch_size):
        got, _ = sampler(responses, jobs[lo : lo + settings.batch_size])
        rewards += got
    values, _ = mc.values_from_rewards(responses, jobs, rewards)
    piv_rows = [mc.pivotality_of(v, c) for v, c in zip(values, chosen)]
    table = token_table(actor, tokenizer, task, responses, settings, torch.device("cpu"))
    assert table.marks is not None

    # text tokens (marks not None) of every response; positions = all, so chosen[i] = arange(L)
    ent, nll, piv, mark, clusters = [], [], [], [], []
    start = 0
    for i in range(len(responses)):
        keep = np.array([m is not None for m in table.marks[i]], dtype=bool)
        n = int(keep.sum())
        ent.append(table.scores["policy_entropy"][i][keep])
        nll.append(table.scores["token_nll"][i][keep])
        piv.append(piv_rows[i][keep])
        mark.append(np.array([bool(m) for m in table.marks[i] if m is not None], dtype=bool))
        clusters.append(np.arange(start, start + n, dtype=np.int64))
        start += n
    H, NLL, PIV, M = (np.concatenate(x) for x in (ent, nll, piv, mark))
    P = np.exp(-NLL)
    boot = {"resamples": 1000, "level": 0.95}

    def interval(stat: Any, stream: int) -> dict[str, Any]:
        i = cluster_bootstrap(stat, clusters, rng=np.random.default_rng([a.seed, 101, stream]), **boot)
        return {"estimate": i.estimate, "ci": [i.low, i.high]}

    def mean_of(x: np.ndarray, sel: np.ndarray) -> Any:
        def f(idx: np.ndarray) -> float | None:
            s = idx[sel[idx]]
            return float(x[s].mean()) if s.size else None

        return f

    def diff(x: np.ndarray) -> Any:
        def f(idx: np.ndarray) -> float | None:
            m, u = idx[M[idx]], idx[~M[idx]]
            return float(x[m].mean() - x[u].mean()) if m.size and u.size else None

        return f

    def auc_within(score: np.ndarray, sel: np.ndarray) -> Any:
        def f(idx: np.ndarray) -> float | None:
            s = idx[sel[idx]]
            return auc(score[s], M[s]) if s.size else None

        return f

    median_h = float(np.median(H))
    uncertain = H > median_h
    out: dict[str, Any] = {
        "command": " ".join(["marks_vs_uncertainty.py", *argv]),
        "task": task.to_dict(),
        "warm_start": {"sft_steps": warm["sft_steps"], "sft_final_loss": warm["sft_final_loss"]},
        "responses": len(responses),
        "mean_reward": float(np.mean([r.reward for r in responses])),
        "text_tokens": int(M.size),
        "marked_tokens": int(M.sum()),
        "policy_entropy": {
            "marked": interval(mean_of(H, M), 1),
            "unmarked": interval(mean_of(H, ~M), 2),
            "marked_minus_unmarked": interval(diff(H), 3),
            "auc_marked": interval(auc_within(H, np.ones_like(M)), 4),
        },
        "p_sampled_token": {
            "marked": interval(mean_of(P, M), 5),
            "unmarked": interval(mean_of(P, ~M), 6),
            "marked_minus_unmarked": interval(diff(P), 7),
            "share_above_0.9_marked": interval(mean_of((P > 0.9).astype(float), M), 8),
            "share_above_0.9_unmarked": interval(mean_of((P > 0.9).astype(float), ~M), 9),
        },
        "mc_pivotality_vs_marks": {
            "all": interval(auc_within(PIV, np.ones_like(M)), 10),
            "uncertain_tokens": interval(auc_within(PIV, uncertain), 11),
            "certain_tokens": interval(auc_within(PIV, ~uncertain), 12),
            "entropy_median": median_h,
            "mean_pivotality_marked": interval(mean_of(PIV, M), 13),
            "mean_pivotality_unmarked": interval(mean_of(PIV, ~M), 14),
        },
        # the diagnosis's own figure (chosen tokens, its bootstrap stream), for comparison
        "diagnose_auc_vs_marks_pivotality": _marks_section(table, chosen, np.concatenate(piv_rows), settings)[
            "pivotality"
        ],
        "seconds": time.perf_counter() - t0,
        "sft_seconds": warm["sft_seconds"],
    }
    out["mc_pivotality_vs_marks"]["tokens"] = {
        "uncertain_marked": int((uncertain & M).sum()),
        "uncertain_unmarked": int((uncertain & ~M).sum()),
        "certain_marked": int((~uncertain & M).sum()),
        "certain_unmarked": int((~uncertain & ~M).sum()),
    }
    lengths = np.array([c.size for c in clusters])
    out["post_hoc"] = post_hoc(H, NLL, PIV, M, lengths, a.seed)
    np.savez(a.out.removesuffix(".json") + ".npz", entropy=H, nll=NLL, pivotality=PIV, marked=M, lengths=lengths)
    text = json.dumps(out, indent=1)
    with open(a.out, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
