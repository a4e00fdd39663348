"""``comppo-core demo``: the CompPO pipeline end to end on a tiny Llama-style model.

1. builds a tiny Llama-style causal LM from a config (random weights, no download) and a
   character-level tokenizer over digits and ``+ - * =`` (:class:`CharTokenizer`);
2. samples one response per arithmetic prompt (``"12+7="``) with ``generate``
   (``do_sample``, seeded), prompts left-padded, responses ended by ``<eos>``;
3. scores each response with a verifier (:func:`verify`): +1 if it is exactly the
   sum, −1 otherwise. The model is untrained, so almost every reward is −1: the point
   is the pipeline, not the model;
4. runs :func:`comppo_core.hf.comp_gae_batch`: one forward pass with the attention
   concentration probe, response log-probs and concentration, gates, Comp-GAE and plain
   GAE advantages. There is no critic: the values are 0, so each advantage is the
   outcome transported back through the (gated) trace;
5. prints the per-token table (token, log-prob, concentration, gate, GAE and Comp-GAE
   advantage) and writes a self-contained HTML heatmap of the responses, tokens
   coloured by gate and by Comp-GAE advantage, to the path it prints.

Needs the ``[hf]`` extra (torch, transformers); ``comppo-core synthetic`` runs with
NumPy only.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import ParameterError
from ..gate_params import GateParams
from ._argtypes import gate_params, positive_float, positive_int, unit_float

__all__ = ["CharTokenizer", "DemoBatch", "add_parser", "prepare", "render_html", "run", "verify"]

MISSING_EXTRA = (
    "comppo-core demo needs the [hf] extra: pip install 'comppo-core[hf]'; "
    "`comppo-core synthetic` runs with NumPy only"
)

#: Table columns: (header, width, number format); position and token come first.
TABLE_COLUMNS: tuple[tuple[str, int, str], ...] = (
    ("log-prob", 9, "+.4f"),
    ("concentration", 13, ".4f"),
    ("gate", 7, ".4f"),
    ("GAE adv", 9, "+.4f"),
    ("Comp-GAE adv", 12, "+.4f"),
)


class CharTokenizer:
    """A character-level tokenizer: ``<pad>``, ``<bos>``, ``<eos>``, then one id per character."""

    SPECIALS = ("<pad>", "<bos>", "<eos>")
    CHARS = "0123456789+-*= "

    def __init__(self) -> None:
        self.vocab: tuple[str, ...] = self.SPECIALS + tuple(self.CHARS)
        self.index = {tok: i for i, tok in enumerate(self.vocab)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[c] for c in text]
        except KeyError as exc:
            raise ParameterError(
                f"text: character {exc.args[0]!r} is not in the demo vocabulary {self.CHARS!r}", argument="text"
            ) from None

    def decode(self, ids: Sequence[int], *, stop_at_eos: bool = True) -> str:
        out = []
        for i in ids:
            if i == self.eos_id and stop_at_eos:
                break
            if i >= len(self.SPECIALS):
                out.append(self.vocab[i])
        return "".join(out)

    def show(self, i: int) -> str:
        """One token as a single space-free word, for tables (space → ``␠``)."""
        tok = self.vocab[i]
        return "␠" if tok == " " else tok


def verify(response: str, answer: int) -> float:
    """+1 if the response (up to ``<eos>``, surrounding spaces ignored) is exactly ``answer``, else −1."""
    text = response.strip()
    if text.isdigit() and int(text) == answer:
        return 1.0
    return -1.0


@dataclass
class DemoBatch:
    """The sampled batch: ``[B, T]`` tensors and per-row prompt text, response text, reward."""

    model: Any
    tokenizer: CharTokenizer
    input_ids: Any
    attention_mask: Any
    response_mask: Any
    rewards: Any
    prompts: list[str]
    answers: list[int]
    responses: list[str]
    prompt_len: int


def add_parser(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    """Register the ``demo`` command on the ``comppo-core`` parser."""
    cmd = subparsers.add_parser(
        "demo",
        help="CompPO end to end on a tiny Llama: sample, verify, probe attention, gates, Comp-GAE, HTML heatmap (needs [hf])",
        description=(
            "Build a tiny Llama-style model (random weights), sample responses to arithmetic "
            "prompts with generate, score them with a verifier, run comppo_core.hf.comp_gae_batch "
            "(attention concentration -> gates -> Comp-GAE), print the per-token table and write "
            "an HTML credit heatmap. The model is untrained: rewards are mostly -1."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    cmd.add_argument("--seed", type=int, default=0, help="seed of the weights, prompts and sampling")
    cmd.add_argument("--prompts", type=positive_int, default=6, help="number of arithmetic prompts (one response each)")
    cmd.add_argument("--max-new-tokens", type=positive_int, default=8, help="longest response")
    cmd.add_argument("--temperature", type=positive_float, default=1.0, help="sampling temperature")
    cmd.add_argument("--hidden", type=positive_int, default=64, help="hidden size of the tiny model")
    cmd.add_argument("--layers", type=positive_int, default=2, help="decoder layers")
    cmd.add_argument("--heads", type=positive_int, default=4, help="attention heads")
    cmd.add_argument("--kv-heads", type=positive_int, default=2, help="key/value heads (grouped-query attention)")
    cmd.add_argument("--statistic", choices=("entropy", "max", "l2"), default="entropy", help="attention concentration statistic")
    cmd.add_argument(
        "--control", choices=("none", "shuffle", "by_position", "constant"), default="none", help="gate control (the paper's ablations)"
    )
    cmd.add_argument("--low", type=unit_float, default=0.5, help="lowest gate")
    cmd.add_argument("--high", type=unit_float, default=1.0, help="highest gate")
    cmd.add_argument("--gamma", type=unit_float, default=1.0, help="discount γ")
    cmd.add_argument("--lam", type=unit_float, default=0.95, help="GAE λ")
    cmd.add_argument(
        "--html",
        default=os.path.join(tempfile.gettempdir(), "comppo-core-demo.html"),
        help="where to write the HTML credit heatmap",
    )
    cmd.set_defaults(run=run)
    return cmd


# --------------------------------------------------------------------------- #
# Model, prompts, sampling, verification
# --------------------------------------------------------------------------- #


def _build_model(args: argparse.Namespace, tok: CharTokenizer) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.hidden % args.heads != 0 or args.heads % args.kv_heads != 0:
        raise ParameterError(
            f"--hidden {args.hidden} must be a multiple of --heads {args.heads}, "
            f"itself a multiple of --kv-heads {args.kv_heads}",
            argument="hidden",
        )
    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=64,
        initializer_range=0.2,  # larger than usual so the random heads are not all uniform
        bos_token_id=tok.bos_id,
        eos_token_id=tok.eos_id,
        pad_token_id=tok.pad_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


def prepare(args: argparse.Namespace) -> DemoBatch:
    """Model, prompts, sampled responses, verifier rewards: deterministic in ``args.seed``."""
    import random

    import torch

    tok = CharTokenizer()
    model = _build_model(args, tok)
    rng = random.Random(args.seed)
    pairs = [(rng.randrange(0, 50), rng.randrange(0, 50)) for _ in range(args.prompts)]
    prompts = [f"{a}+{b}=" for a, b in pairs]
    answers = [a + b for a, b in pairs]
    encoded = [[tok.bos_id] + tok.encode(p) for p in prompts]
    p_len = max(len(e) for e in encoded)
    prompt_ids = torch.full((len(encoded), p_len), tok.pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(len(encoded), p_len, dtype=torch.long)
    for i, e in enumerate(encoded):  # left padding, as decoder-only generation wants
        prompt_ids[i, p_len - len(e) :] = torch.tensor(e)
        prompt_mask[i, p_len - len(e) :] = 1

    torch.manual_seed(args.seed)
    with torch.no_grad():
        seqs = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=args.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=args.max_new_tokens,
            min_new_tokens=1,
            eos_token_id=tok.eos_id,
            pad_token_id=tok.pad_id,
        )
    b, t = seqs.shape
    resp = seqs[:, p_len:]
    # response tokens: up to and including the first <eos>; padding after it
    is_eos = resp == tok.eos_id
    after_eos = (torch.cumsum(is_eos.long(), dim=1) - is_eos.long()) > 0
    resp_valid = ~after_eos
    response_mask = torch.zeros(b, t, dtype=torch.long)
    response_mask[:, p_len:] = resp_valid.long()
    attention_mask = torch.cat([prompt_mask, resp_valid.long()], dim=1)
    input_ids = torch.where(attention_mask.bool(), seqs, torch.full_like(seqs, tok.pad_id))

    responses = [tok.decode(resp[i].tolist()) for i in range(b)]
    rewards = torch.tensor([verify(r, a) for r, a in zip(responses, answers)], dtype=torch.float32)
    return DemoBatch(model, tok, input_ids, attention_mask, response_mask, rewards, prompts, answers, responses, p_len)


def pipeline_options(args: argparse.Namespace) -> dict[str, Any]:
    """The :func:`comppo_core.hf.comp_gae_batch` keywords the demo uses."""
    return dict(
        gamma=args.gamma,
        lam=args.lam,
        statistic=args.statistic,
        gate_params=GateParams(low=args.low, high=args.high),
        control=args.control,
        seed=args.seed,
    )


# --------------------------------------------------------------------------- #
# Output: table and HTML
# --------------------------------------------------------------------------- #


def _table(batch: DemoBatch, out: Any, row: int) -> list[str]:
    cols = out.mask[row].nonzero().flatten().tolist()
    header = "  ".join(["position".rjust(8), "token".rjust(6)] + [name.rjust(w) for name, w, _ in TABLE_COLUMNS])
    lines = [header, "-" * len(header)]
    for j in cols:
        token_id = int(batch.input_ids[row, j + 1])
        values = [out.logprobs, out.concentration, out.gates, out.gae_advantages, out.advantages]
        cells = [str(j + 1).rjust(8), batch.tokenizer.show(token_id).rjust(6)]
        cells += [format(float(v[row, j]), fmt).rjust(w) for (_, w, fmt), v in zip(TABLE_COLUMNS, values)]
        lines.append("  ".join(cells))
    return lines


def _gate_colour(g: float, low: float, high: float) -> str:
    """White at ``high`` (credit fully retained) to deep orange at ``low``."""
    span = high - low
    x = 0.0 if span <= 0 else min(1.0, max(0.0, (high - g) / span))
    r, gg, b = 255, int(round(255 - 120 * x)), int(round(255 - 230 * x))
    return f"rgb({r},{gg},{b})"


def _adv_colour(a: float, amax: float) -> str:
    """Diverging: blue for negative, white at 0, green for positive (scaled by the batch max |A|)."""
    x = 0.0 if amax <= 0 else max(-1.0, min(1.0, a / amax))
    if x >= 0:
        return f"rgb({int(round(255 - 200 * x))},{int(round(255 - 60 * x))},{int(round(255 - 200 * x))})"
    x = -x
    return f"rgb({int(round(255 - 200 * x))},{int(round(255 - 150 * x))},255)"


def render_html(batch: DemoBatch, out: Any, args: argparse.Namespace) -> str:
    """A self-contained HTML page: per response, its tokens coloured by gate, by Comp-GAE
    advantage and by plain GAE advantage (for contrast).

    Every response token appears once in each view as
    ``<span class="tok" data-view="gate|advantage|gae" data-pos=... data-value=...>``,
    ``data-pos`` its position in ``input_ids`` and ``data-value`` the gate or advantage."""
    m = out.mask
    amax = max(float(out.advantages[m].abs().max()), float(out.gae_advantages[m].abs().max())) if bool(m.any()) else 0.0
    rows = []
    for b in range(batch.input_ids.shape[0]):
        cols = out.mask[b].nonzero().flatten().tolist()
        views = []
        for view in ("gate", "advantage", "gae"):
            spans = []
            for j in cols:
                tid = int(batch.input_ids[b, j + 1])
                text = batch.tokenizer.vocab[tid]
                g, a = float(out.gates[b, j]), float(out.advantages[b, j])
                a0 = float(out.gae_advantages[b, j])
                if view == "gate":
                    colour, value = _gate_colour(g, args.low, args.high), g
                else:
                    value = a if view == "advantage" else a0
                    colour = _adv_colour(value, amax)
                tip = (
                    f"position {j + 1} token {text!r}: log-prob {float(out.logprobs[b, j]):+.4f}, "
                    f"concentration {float(out.concentration[b, j]):.4f}, gate {g:.4f}, "
                    f"GAE adv {a0:+.4f}, Comp-GAE adv {a:+.4f}"
                )
                spans.append(
                    f'<span class="tok" data-view="{view}" data-pos="{j + 1}" data-value="{value:.6f}" '
                    f'style="background:{colour}" title="{html.escape(tip)}">{html.escape(text)}</span>'
                )
            label = {"gate": "gate", "advantage": "Comp-GAE adv", "gae": "GAE adv"}[view]
            views.append(f'<div class="view"><span class="label">{label}</span>{"".join(spans)}</div>')
        reward = float(batch.rewards[b])
        rows.append(
            f'<div class="resp"><div class="head">#{b}: <code>{html.escape(batch.prompts[b])}</code> '
            f"&rarr; <code>{html.escape(batch.responses[b]) or '&empty;'}</code> "
            f"(answer {batch.answers[b]}, reward <b>{reward:+g}</b>)</div>{''.join(views)}</div>"
        )
    title = "comppo-core demo: credit heatmap"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
.resp {{ margin: 1.2em 0; }}
.head {{ margin-bottom: .3em; }}
.view {{ font-family: ui-monospace, monospace; font-size: 1.25em; margin: .15em 0; }}
.label {{ display: inline-block; width: 6.5em; font-size: .7em; color: #666; font-family: system-ui, sans-serif; }}
.tok {{ display: inline-block; min-width: 1.1em; padding: .1em .15em; margin: 0 1px; border: 1px solid #ccc; text-align: center; white-space: pre; }}
.legend span {{ display: inline-block; padding: .1em .5em; border: 1px solid #ccc; }}
</style></head><body>
<h1>{title}</h1>
<p>Tiny untrained Llama-style model; statistic <b>{args.statistic}</b>, control <b>{args.control}</b>,
gates in [{args.low:g}, {args.high:g}], &gamma;={args.gamma:g}, &lambda;={args.lam:g}, values 0 (no critic).
Row <i>gate</i>: white = gate {args.high:g} (credit retained), orange = gate {args.low:g}.
Rows <i>Comp-GAE adv</i> and <i>GAE adv</i>: advantages, green &gt; 0, blue &lt; 0 (scale: max |A| = {amax:.4f});
with a gate below 1, Comp-GAE carries less of the outcome back past that token than GAE.
Hover a token for its numbers.</p>
<p class="legend"><span style="background:{_gate_colour(args.high, args.low, args.high)}">gate {args.high:g}</span>
<span style="background:{_gate_colour(args.low, args.low, args.high)}">gate {args.low:g}</span>
<span style="background:{_adv_colour(amax, amax)}">A = +{amax:.3f}</span>
<span style="background:{_adv_colour(-amax, amax)}">A = &minus;{amax:.3f}</span></p>
{''.join(rows)}
</body></html>
"""


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core demo``; returns the exit status."""
    gate_params(args, parser)  # --low above --high is a usage error
    if args.hidden % args.heads != 0 or args.heads % args.kv_heads != 0:
        parser.error(
            f"--hidden {args.hidden} must be a multiple of --heads {args.heads}, itself a multiple of --kv-heads {args.kv_heads}"
        )
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401

        from .. import hf
    except ImportError:
        print(f"comppo-core: error: {MISSING_EXTRA}", file=sys.stderr)
        return 1

    from .. import __version__

    t0 = time.perf_counter()
    batch = prepare(args)
    t_sample = time.perf_counter() - t0
    t1 = time.perf_counter()
    out = hf.comp_gae_batch(
        batch.model,
        batch.input_ids,
        batch.attention_mask,
        batch.response_mask,
        batch.rewards,
        **pipeline_options(args),
    )
    t_pipeline = time.perf_counter() - t1
    n_params = sum(p.numel() for p in batch.model.parameters())
    correct = int((batch.rewards > 0).sum())
    print(
        f"comppo-core {__version__} demo: tiny Llama ({args.layers} layers, hidden {args.hidden}, "
        f"{args.heads} heads / {args.kv_heads} KV heads, {n_params} parameters, random weights), "
        f"{len(batch.prompts)} prompts, seed {args.seed}"
    )
    print(
        f"model built and responses sampled with generate (do_sample, temperature {args.temperature:g}) "
        f"in {t_sample:.2f} s; "
        f"verifier: {correct} correct (+1) / {len(batch.prompts) - correct} wrong (-1) "
        "(the model is untrained: the point is the pipeline)"
    )
    print(
        f"pipeline: comppo_core.hf.comp_gae_batch(statistic={args.statistic!r}, low={args.low:g}, "
        f"high={args.high:g}, control={args.control!r}, gamma={args.gamma:g}, lam={args.lam:g}) "
        f"in {t_pipeline:.2f} s; values 0 (no critic)"
    )
    for b in range(len(batch.prompts)):
        print()
        print(
            f"response {b}: {batch.prompts[b]!r} -> {batch.responses[b]!r} (answer {batch.answers[b]}), "
            f"reward {float(batch.rewards[b]):+g}"
        )
        for line in _table(batch, out, b):
            print(line)
    m = out.mask
    print()
    print(
        f"gates over the {int(m.sum())} response tokens: min {float(out.gates[m].min()):.4f}, "
        f"mean {float(out.gates[m].mean()):.4f}, max {float(out.gates[m].max()):.4f}"
    )
    path = os.path.abspath(args.html)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(batch, out, args))
    print(f"HTML credit heatmap: {path}")
    print(f"total: {time.perf_counter() - t0:.2f} s")
    return 0
