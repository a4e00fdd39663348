"""Peak memory and time of the scoring forward (``hf.score``, log-probs from the hidden
states in chunks) against a plain ``model(ids).logits`` forward, on CPU, at Qwen's
vocabulary (V = 151936) with a narrow model, so the logits dominate.

Run:  python benches/score_memory.py          (B = 4, T = 512; a few minutes)
      python benches/score_memory.py --quick  (one round, no grad cases)

Cases, each measured in a fresh subprocess (``--case``), alternating between rounds:

* ``logits``:        ``model(ids, mask).logits`` under no_grad (the full ``[B, T, V]`` logits)
* ``plain_lp``:      the same plus ``log_softmax(logits.float() / τ)`` gathered at the next token
* ``score``:         ``hf.score(model, ids, mask, temperature=τ)`` (grad=False)
* ``plain_lp_grad``: ``plain_lp`` with gradients, then ``backward()`` of the log-probs' sum
* ``score_grad``:    ``hf.score(..., grad=True)``, then the same ``backward()``

Peak memory is the process's resident-set high-water mark during the measured call minus
its resident set just before it (``/proc/self/clear_refs`` resets the mark after the
model is built and a warm-up call ran; without it ``ru_maxrss``), so it is the call's own
transient: logits, activations, gradients. Time is the median of ``--repeats`` calls in
the subprocess. The table prints medians over rounds and the ratios of ``score`` to
``logits`` and ``plain_lp``, and of ``score_grad`` to ``plain_lp_grad``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

CASES = ("logits", "plain_lp", "score", "plain_lp_grad", "score_grad")


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_kib(reset: bool) -> int:
    if reset:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_case(case: str, a: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from comppo_core import hf

    torch.set_num_threads(a.threads)
    cfg = LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=2 * a.hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max(1024, a.length),
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, a.vocab, (a.batch, a.length))
    mask = torch.ones_like(ids)
    tau = a.temperature

    def plain_lp() -> torch.Tensor:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        lp = torch.log_softmax(logits[:, :-1].float() / tau, dim=-1)
        return lp.gather(-1, ids[:, 1:, None]).squeeze(-1)

    def call() -> None:
        if case == "logits":
            with torch.no_grad():
                _ = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        elif case == "plain_lp":
            with torch.no_grad():
                plain_lp()
        elif case == "score":
            hf.score(model, ids, mask, temperature=tau)
        elif case == "plain_lp_grad":
            model.zero_grad(set_to_none=True)
            plain_lp().sum().backward()
        elif case == "score_grad":
            model.zero_grad(set_to_none=True)
            hf.score(model, ids, mask, temperature=tau, grad=True).logprobs.sum().backward()
        else:
            raise SystemExit(f"unknown case {case!r}")

    call()  # warm-up: thread pools, lazy inits (its memory goes back to the OS: large blocks are mmapped)
    model.zero_grad(set_to_none=True)  # the gradients held after a backward are not the call's transient
    times, peaks = [], []
    for _ in range(a.repeats):
        model.zero_grad(set_to_none=True)
        base = _rss_kib()
        reset = _reset_peak()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
        peaks.append(_peak_kib(reset) - base)
    return {"case": case, "time_s": statistics.median(times), "peak_mib": max(peaks) / 1024, "hwm_reset": reset}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="measured calls per subprocess")
    ap.add_argument("--quick", action="store_true", help="one round, grad=False cases only")
    ap.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.case:
        print(json.dumps(run_case(a.case, a)))
        return 0
    cases = CASES[:3] if a.quick else CASES
    rounds = 1 if a.quick else a.rounds
    fwd = [
        f"--{k}={getattr(a, k)}" for k in ("batch", "length", "hidden", "vocab", "temperature", "threads", "repeats")
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    n_tok = a.batch * a.length
    print(
        f"B={a.batch} T={a.length} V={a.vocab} hidden={a.hidden} threads={a.threads}: float32 logits "
        f"{n_tok * a.vocab * 4 / 2**20:.0f} MiB; {rounds} round(s) × {a.repeats} call(s), one subprocess per case"
    )
    for r in range(rounds):
        order = cases if r % 2 == 0 else tuple(reversed(cases))
        for c in order:
            out = subprocess.run(
                [sys.executable, __file__, f"--case={c}", *fwd], env=env, capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                return 1
            results[c].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {
        c: (statistics.median(x["time_s"] for x in v), statistics.median(x["peak_mib"] for x in v))
        for c, v in results.items()
    }
    print(f"\n{'case':<15}{'time (s)':>10}{'peak (MiB)':>12}")
    for c, (t, m) in med.items():
        print(f"{c:<15}{t:>10.3f}{m:>12.0f}")
    print("\nratios (median over rounds)       memory   time")
    pairs = [("score", "logits"), ("score", "plain_lp"), ("score_grad", "plain_lp_grad")]
    for num, den in pairs:
        if num in med and den in med:
            print(f"  {num + ' / ' + den:<30} {med[num][1] / med[den][1]:>7.2f} {med[num][0] / med[den][0]:>6.2f}")
    if not all(x["hwm_reset"] for v in results.values() for x in v):
        print("(peak RSS from ru_maxrss: /proc/self/clear_refs was not writable; peaks include the model build)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
