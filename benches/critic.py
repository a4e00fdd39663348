"""The critics side by side: the cost of one scoring forward, and how well each fits.

Run:  python benches/critic.py                     (CPU, about 2 minutes on 2 cores)
      python benches/critic.py --part cost         (only the cost table)
      python benches/critic.py --device cuda --preset qwen3-0.6b --part cost   (see gpu_critic.py)

**Cost.** On one model and batch, alternating in one process (median of ``--rounds``),
time and peak memory of

* ``plain``: ``model(ids, attention_mask)`` with grad off, the forward a PPO loop runs anyway;
* ``plain+logprobs``: the same plus the per-token log-prob gather;
* ``rl.forward``: log-probs, per-layer concentration and gates (the probe), no critic;
* ``rl.forward+TAC``: the same plus TAC values from the actor's own taps;
* ``rl.forward+StandardCritic``: the same with the baselines' second transformer;

as ratios to ``plain``. Peak memory is every allocation above the start (CPU: from
torch.profiler; CUDA: max_memory_allocated).

**Fit.** Batches whose returns come from Comp-GAE with concentration gates: a tiny
random actor reads random prompts and responses; the reward at the last response token is
a fixed function of the response tokens (how many fall in the lower half of the
vocabulary), and the λ-returns are Comp-GAE's with V ≡ 0 (γ = λ = 1), so a return is the
reward times the product of the gates still ahead. Each critic is fitted with Adam on the
clipped value loss over the same batches for ``--steps`` steps, then scored on held-out
batches: value loss and explained variance ``1 − Var(R − V)/Var(R)`` over response
tokens, mean and 95% CI over ``--seeds``. Critics: TAC with each temporal mixer, TAC
without routing features, and a last-layer linear head.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

try:
    import torch
    from torch import nn
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import comppo_core as cc
    from comppo_core import rl
    from comppo_core.hf._memory import peak_memory
except ImportError as exc:  # pragma: no cover
    sys.exit(f"benches/critic.py needs the [rl] extra (torch, transformers): {exc}")

PRESETS: dict[str, dict[str, int]] = {
    # a small Qwen3 that keeps a real model's proportions (intermediate = 3 × hidden)
    "cpu": dict(hidden=256, layers=8, heads=4, vocab=8192, batch=4, length=512),
    "qwen3-0.6b": dict(hidden=1024, layers=28, heads=16, vocab=151936, batch=8, length=2048),
}


def build_actor(p: dict[str, int], dtype: Any, device: str, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=p["vocab"],
        hidden_size=p["hidden"],
        intermediate_size=3 * p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=max(1, p["heads"] // 2),
        head_dim=p["hidden"] // p["heads"],
        max_position_embeddings=max(4096, p["length"]),
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# --------------------------------------------------------------------------- #
# cost
# --------------------------------------------------------------------------- #


def cost(a: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """Prints the cost table; returns ``{call: (time ratio, peak-memory ratio)}`` to ``plain``."""
    p = PRESETS[a.preset]
    dtype = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
    actor = build_actor(p, dtype, a.device)
    tac = rl.TransportAlignedCritic.for_model(actor, temporal=a.temporal)
    std = rl.StandardCritic.from_actor(actor)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, p["vocab"], (p["batch"], p["length"]), generator=g).to(a.device)
    am = torch.ones_like(ids)
    am[0, : p["length"] // 4] = 0  # one left-padded row
    resp = torch.zeros(p["batch"], p["length"] - 1, dtype=torch.bool, device=a.device)
    resp[:, p["length"] // 2 :] = True
    n_actor = sum(x.numel() for x in actor.parameters())
    print(
        f"actor: Qwen3 hidden={p['hidden']} layers={p['layers']} vocab={p['vocab']} {a.dtype} on {a.device}, "
        f"{n_actor / 1e6:.1f}M parameters; B={p['batch']} T={p['length']}"
    )
    print(f"TAC ({a.temporal}): {rl.parameter_count(tac) / 1e6:.3f}M parameters "
          f"({100 * rl.parameter_count(tac) / n_actor:.2f}% of the actor); StandardCritic: "
          f"{rl.parameter_count(std) / 1e6:.1f}M")  # fmt: skip

    def plain() -> Any:
        with torch.no_grad():
            return actor(input_ids=ids, attention_mask=am, use_cache=False).logits

    def plain_lp() -> Any:
        with torch.no_grad():
            logits = actor(input_ids=ids, attention_mask=am, use_cache=False).logits
            return cc.hf.token_logprobs(logits[:, :-1], ids[:, 1:])

    cases: dict[str, Callable[[], Any]] = {
        "plain": plain,
        "plain+logprobs": plain_lp,
        "rl.forward": lambda: rl.forward(actor, ids, am, response_mask=resp),
        "rl.forward+TAC": lambda: rl.forward(actor, ids, am, critic=tac, response_mask=resp),
        "rl.forward+StandardCritic": lambda: rl.forward(actor, ids, am, critic=std, response_mask=resp),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():  # warm-up
        fn()
    for _ in range(a.rounds):
        for name, fn in cases.items():
            sync(a.device)
            t0 = time.perf_counter()
            fn()
            sync(a.device)
            times[name].append(time.perf_counter() - t0)
    peaks = {name: peak_memory(fn, a.device) for name, fn in cases.items()}
    print("\n| call | time (× plain) | range over rounds | peak memory (× plain) |\n|---|---|---|---|")
    result = {}
    for name in cases:
        ratios = sorted(t / b for t, b in zip(times[name], times["plain"]))
        result[name] = (statistics.median(ratios), peaks[name] / peaks["plain"])
        print(f"| {name} | {result[name][0]:.3f} | {ratios[0]:.3f}–{ratios[-1]:.3f} | {result[name][1]:.3f} |")
    base_t = statistics.median(times["plain"])
    print(f"(plain: median {base_t * 1e3:.1f} ms, peak {peaks['plain'] / 2**20:.0f} MiB; {a.rounds} rounds, "
          "time ratios are medians of per-round ratios)")  # fmt: skip
    return result


# --------------------------------------------------------------------------- #
# fit
# --------------------------------------------------------------------------- #


class LastLayerLinear(nn.Module):
    """The simplest head on the actor: ``V_j = w · h_j^{last} + b`` on the detached last tap."""

    def __init__(self, hidden: int, last: int) -> None:
        super().__init__()
        self.taps = (last,)
        self.routing_layers = None
        self.linear = nn.Linear(hidden, 1)

    def forward(self, inputs: rl.CriticInputs) -> torch.Tensor:
        v = self.linear(inputs.taps[self.taps[0]][:, :-1].detach().float()).squeeze(-1)
        return torch.where(inputs.columns, v, torch.zeros_like(v))


def make_batches(actor: Any, vocab: int, n: int, b: int, prompt: int, response: int, seed: int) -> list[dict[str, Any]]:
    """Actor forwards (cached: the actor is frozen) with Comp-GAE returns as targets."""
    g = torch.Generator().manual_seed(seed)
    out = []
    t = prompt + response
    probe_taps = tuple(range(actor.config.num_hidden_layers))
    for _ in range(n):
        ids = torch.randint(0, vocab, (b, t), generator=g)
        am = torch.ones_like(ids)
        resp = torch.zeros(b, t - 1, dtype=torch.bool)
        resp[:, prompt - 1 :] = True  # columns scoring the response tokens
        with torch.no_grad(), rl.TapRecorder(actor, probe_taps) as rec:
            fwd = rl.forward(actor, ids, am, response_mask=resp)
        rewards = torch.zeros(b, t - 1)
        low = (ids[:, prompt:] < vocab // 2).float().mean(-1)
        rewards[:, -1] = (low > 0.5).float() + low  # a function of the response tokens
        gae = cc.gae(rewards, torch.zeros(b, t - 1), mask=resp, gates=fwd.gates, gamma=1.0, lam=1.0)
        inputs = rl.CriticInputs(
            input_ids=ids, attention_mask=am.bool(), position_ids=cc.hf.default_position_ids(am.bool()),
            columns=torch.ones(b, t - 1, dtype=torch.bool), response_mask=resp,
            taps={k: v.detach() for k, v in rec.hidden.items()}, per_layer=fwd.per_layer,
            gates=rl.causal_gates(fwd.concentration, resp, rl.GateParams()),
        )  # fmt: skip
        out.append({"inputs": inputs, "returns": gae.returns, "mask": resp})
    return out


def fit_one(
    critic: nn.Module, train: list[dict[str, Any]], test: list[dict[str, Any]], steps: int, lr: float
) -> tuple[float, float]:
    opt = torch.optim.Adam(critic.parameters(), lr=lr)
    for step in range(steps):
        bt = train[step % len(train)]
        v = critic(bt["inputs"])
        loss, _ = rl.value_loss(v, v.detach(), bt["returns"], bt["mask"], clip=None)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        vs = torch.cat([critic(bt["inputs"])[bt["mask"]] for bt in test])
        rs = torch.cat([bt["returns"][bt["mask"]] for bt in test])
    vloss = 0.5 * float(((vs - rs) ** 2).mean())
    ev = 1.0 - float((rs - vs).var()) / float(rs.var())
    return vloss, ev


def ci95(xs: list[float]) -> str:
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return f"{m:.4f}"
    half = 1.96 * statistics.stdev(xs) / math.sqrt(len(xs))
    return f"{m:.4f} ± {half:.4f}"


def fit(a: argparse.Namespace) -> None:
    hidden, layers, vocab = 64, 4, 256
    results: dict[str, dict[str, list[float]]] = {}
    for seed in range(a.seeds):
        actor = build_actor(
            dict(hidden=hidden, layers=layers, heads=4, vocab=vocab, length=64), torch.float32, "cpu", seed
        )
        train = make_batches(actor, vocab, 16, 16, 16, 32, seed=100 + seed)
        test = make_batches(actor, vocab, 4, 16, 16, 32, seed=200 + seed)
        critics: dict[str, Callable[[], nn.Module]] = {
            f"TAC temporal={m}": (
                lambda m=m, actor=actor: rl.TransportAlignedCritic.for_model(actor, width=64, temporal=m)
            )
            for m in rl.TEMPORAL_MIXERS
        }
        critics["TAC without routing"] = lambda actor=actor: rl.TransportAlignedCritic.for_model(
            actor, width=64, routing=False
        )
        critics["last-layer linear"] = lambda: LastLayerLinear(hidden, layers - 1)
        for name, make in critics.items():
            torch.manual_seed(seed)
            vloss, ev = fit_one(make(), train, test, a.steps, a.lr)
            r = results.setdefault(name, {"loss": [], "ev": []})
            r["loss"].append(vloss)
            r["ev"].append(ev)
    print(f"\nfit: {a.steps} Adam steps (lr {a.lr}), 16 train / 4 held-out batches of 16 × 48 tokens, {a.seeds} seeds")
    print("| critic | held-out value loss | held-out explained variance |\n|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {ci95(r['loss'])} | {ci95(r['ev'])} |")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("cost", "fit", "all"), default="all")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    ap.add_argument("--temporal", choices=rl.TEMPORAL_MIXERS, default="none")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.part in ("cost", "all"):
        cost(a)
    if a.part in ("fit", "all"):
        fit(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
