"""Will the gate help on this task? Concentration against Monte-Carlo pivotality, before any training.

CompPO's gates bet that the attention concentration marks the response tokens that decide
the outcome. :func:`diagnose` measures the bet on a policy and a task:

1. **Responses.** One response to each of ``prompts`` held-out problems
   (``task.heldout``), sampled at the policy's temperature and top-p with the trainer's
   keyed sampler (``greedy=True``: greedy decoding), rewarded by the task's verifier.
2. **Pivotality.** For the chosen tokens of each response, ``piv_t = |V_{t+1} − V_t|``
   with each ``V_s`` the mean reward of ``samples_per_prefix`` continuations sampled from
   the policy (:mod:`comppo_core.experiments.pivotality`, VinePPO-style values). A token is
   **pivotal** when ``piv_t ≥ pivotal_threshold`` (default 0.25: a quarter of the success
   probability; the standard error of ``piv_t`` is at most ``sqrt(0.5/K)``, 0.18 at K = 16).
3. **Scores per token** (an actor forward per statistic, :func:`comppo_core.hf.score`): the
   concentration of each statistic (``entropy``, ``max``, ``l2``), each layer and the layer
   average the gates map (``concentration``); and the baselines: the token's position in
   the response, the policy's entropy at it (of ``softmax(logits/τ)``, nats), its NLL
   (``−log π_τ(token)``) and its class (digit, operator, EOS, other), the class scored by the
   share of pivotal tokens in that class (in-sample: an optimistic baseline).
4. **Statistics** (:mod:`comppo_core.experiments.rank_statistics`), over the chosen tokens
   of all responses, each with a percentile interval from a bootstrap over responses
   (``bootstrap`` resamples, seeded): the AUC ``P(score_pivotal > score_other)`` and
   Spearman's ρ of the score against ``piv_t``.
5. **Recommendation** from what the gates see: the layer average of ``statistic`` mapped
   per response as a run maps it (:func:`row_gates`: the running z-score, the default
   ``GateParams()``; a pooled AUC of the raw concentration can point the other way when
   responses differ in level), reported as the key ``"gates"`` beside each statistic's
   layers (and under each policy statistic's baseline entry). Its AUC's interval above 0.5 → ``as_is`` (the default mapping, high concentration → high
   gate); below 0.5 → ``inverted`` (``--gate-direction inverted``); holding 0.5, or no
   pivotal token → ``none``: the data do not show the concentration ranking the pivotal tokens
   at this budget (not that it cannot), so no direction is recommended and the range is the
   constant gate 1 (Comp-GAE = GAE). Each recommendation says what to do ``next``
   (:data:`NEXT_STEPS`), and ``warnings`` (:func:`warnings_of`, printed before the
   continuations) say when the diagnosis cannot be informative. With a direction the range is the package default ``[GateParams().low,
   GateParams().high]``; the diagnostic does not tune it. ``directions`` gives the same rule
   for the gates of the policy statistics (:func:`policy_gate_directions`, in their own
   orientation) beside the concentration's (``directions["concentration"] == direction``);
   ``--gate-direction DIR/diagnosis.json`` (``TrainConfig.gate_direction``) applies them.

On a task that marks its pivotal tokens (:class:`~comppo_core.rl.tasks.PivotalTask`, e.g.
``chain``, ``filler_addition``) it also gives ``auc_vs_marks``: the AUC of the
Monte-Carlo pivotality for marked against unmarked tokens (over the chosen tokens), and of
each statistic's layer-average concentration and the position (over every text token of
the responses); EOS is left out (the marks are per character of the text).

**Cost.** Generated tokens: the responses plus at most ``Σ_responses |B| · K ·
(max_new_tokens − s)`` for the continuations (``B`` the boundaries to estimate); the first
and the last batch of continuations are run first and timed, and the rest extrapolated from them
(a batch's prefill plus its decoding steps), as a range: every batch as long as the rest of its
longest response, or every batch to its longest budget (:func:`seconds_range`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ParameterError
from ..gate_params import GateParams
from ..options import STATISTICS
from ..rl.tasks.base import PivotalTask, Problem, Task
from . import pivotality as mc
from .rank_statistics import Interval, auc, cluster_bootstrap, spearman

__all__ = [
    "DIRECTIONS",
    "NEXT_STEPS",
    "CostEstimate",
    "CriticUnderTest",
    "DiagnoseSettings",
    "TokenTable",
    "analyse",
    "batch_steps",
    "critic_values",
    "diagnose",
    "explained_variance_section",
    "policy_gate_directions",
    "recommend",
    "row_gates",
    "seconds_range",
    "token_class",
    "warnings_of",
]

#: The recommendation's gate directions.
DIRECTIONS = ("as_is", "inverted", "none")
#: The baselines, by their key in the report.
BASELINES = ("position", "policy_entropy", "token_nll", "token_class")
#: Operator characters of :func:`token_class`.
_OPERATORS = set("+-*/=<>^%()")


@dataclasses.dataclass(frozen=True)
class DiagnoseSettings:
    """The diagnostic's budget and choices (module docstring). A bad value is a
    :class:`~comppo_core.errors.ParameterError` naming the field."""

    prompts: int = 32
    samples_per_prefix: int = 16
    positions: int | None = None
    position_choice: str = "even"
    greedy: bool = False
    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int | None = None
    statistic: str = "entropy"
    pivotal_threshold: float = 0.25
    bootstrap: int = 1000
    level: float = 0.95
    seed: int = 0
    batch_size: int = 256

    def __post_init__(self) -> None:
        for name, low in (("prompts", 1), ("samples_per_prefix", 1), ("bootstrap", 0), ("seed", 0), ("batch_size", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ParameterError(f"{name}: expected an integer >= {low}, got {v!r}", argument=name)
        for name in ("positions", "max_new_tokens"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ParameterError(f"{name}: expected an integer >= 1 or None, got {v!r}", argument=name)
        if self.position_choice not in mc.POSITION_CHOICES:
            raise ParameterError(
                f"position_choice: expected one of {', '.join(mc.POSITION_CHOICES)}, got {self.position_choice!r}",
                argument="position_choice",
            )
        if self.statistic not in STATISTICS:
            raise ParameterError(
                f"statistic: expected one of {', '.join(STATISTICS)}, got {self.statistic!r}", argument="statistic"
            )
        for name, lo, hi, closed in (
            ("temperature", 0.0, math.inf, False),
            ("top_p", 0.0, 1.0, True),
            ("pivotal_threshold", 0.0, 1.0, True),
            ("level", 0.0, 1.0, False),
        ):
            v = getattr(self, name)
            ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and lo < v
            ok = ok and (v <= hi if closed else v < hi)
            if not ok:
                raise ParameterError(
                    f"{name}: expected a number in ({lo}, {hi}{']' if closed else ')'}, got {v!r}", argument=name
                )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- #
# Token classes
# --------------------------------------------------------------------------- #


def token_class(text: str, is_eos: bool) -> str:
    """``"eos"``, ``"digit"`` (every non-space character a digit), ``"operator"`` (every
    non-space character one of ``+-*/=<>^%()``) or ``"other"``."""
    if is_eos:
        return "eos"
    core = text.strip()
    if core and core.isdigit():
        return "digit"
    if core and all(ch in _OPERATORS for ch in core):
        return "operator"
    return "other"


def _token_spans(tokenizer: Any, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Each token's ``[start, end)`` in the decoded text (incremental decoding)."""
    spans = []
    start = 0
    for k in range(len(ids)):
        end = len(tokenizer.decode(list(ids[: k + 1])))
        spans.append((start, max(start, end)))
        start = max(start, end)
    return spans


# --------------------------------------------------------------------------- #
# Per-token table
# --------------------------------------------------------------------------- #


@dataclasses.dataclass
class TokenTable:
    """Every response token's scores: ``scores[name]`` one float64 array per response
    (``[L]``), the classes, the marks (None without marks; per token True, False, or None
    for EOS) and the responses' texts."""

    scores: dict[str, list[np.ndarray]]
    classes: list[list[str]]
    marks: list[list[bool | None]] | None
    layers: int


def _layout(chunk: Sequence[mc.Response], pad_id: int) -> tuple[Any, Any, int]:
    """``(ids [B, P + L_max], mask, P)``: the prompts left-padded to ``P``, each response
    after its prompt, right-padded (the rollout's layout)."""
    import torch

    from ..rl.engine.rollout import left_pad

    prompt_ids, prompt_mask = left_pad([list(r.prompt_ids) for r in chunk], pad_id)
    width = prompt_ids.shape[1]
    longest = max(r.length for r in chunk)
    ids = torch.full((len(chunk), width + longest), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    ids[:, :width], mask[:, :width] = prompt_ids, prompt_mask
    for b, r in enumerate(chunk):
        ids[b, width : width + r.length] = torch.tensor(r.response_ids, dtype=torch.long)
        mask[b, width : width + r.length] = True
    return ids, mask, width


def _score_features(
    actor: Any, tokenizer: Any, responses: Sequence[mc.Response], settings: DiagnoseSettings, device: Any
) -> tuple[dict[str, list[np.ndarray]], int]:
    """The concentration of every statistic, layer and the layer average, the policy's
    entropy and NLL, per response token (module docstring, step 3)."""
    import torch

    from ..hf.lm import default_position_ids
    from ..hf.scoring import score

    scores: dict[str, list[np.ndarray]] = {}
    layers = 0
    n = len(responses)
    for lo in range(0, n, settings.batch_size):
        chunk = responses[lo : lo + settings.batch_size]
        ids, mask, width = _layout(chunk, tokenizer.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        per_chunk: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for stat in STATISTICS:
                out = score(actor, ids, mask, temperature=settings.temperature, per_layer=True, statistic=stat)
                assert out.concentration is not None and out.per_layer is not None
                per_chunk[f"concentration/{stat}/mean"] = out.concentration
                layers = out.per_layer.shape[-1]
                for layer in range(layers):
                    per_chunk[f"concentration/{stat}/layer{layer}"] = out.per_layer[..., layer]
                per_chunk["token_nll"] = -out.logprobs
            logits = actor(
                input_ids=ids, attention_mask=mask.long(), position_ids=default_position_ids(mask), use_cache=False
            ).logits[:, :-1]
            logp = torch.log_softmax(logits.float() / settings.temperature, dim=-1)
            per_chunk["policy_entropy"] = -(logp.exp() * logp).sum(-1)
        for name, values in per_chunk.items():
            rows = values.float().cpu().numpy().astype(np.float64)
            for b, r in enumerate(chunk):
                scores.setdefault(name, []).append(rows[b, width - 1 : width - 1 + r.length].copy())
    scores["position"] = [np.arange(r.length, dtype=np.float64) for r in responses]
    return scores, layers


def token_table(
    actor: Any, tokenizer: Any, task: Task, responses: Sequence[mc.Response], settings: DiagnoseSettings, device: Any
) -> TokenTable:
    """The :class:`TokenTable` of ``responses``."""
    scores, layers = _score_features(actor, tokenizer, responses, settings, device)
    eos = tokenizer.eos_token_id
    classes = [
        [token_class(tokenizer.decode([t]), t == eos and k == r.length - 1) for k, t in enumerate(r.response_ids)]
        for r in responses
    ]
    marks: list[list[bool | None]] | None = None
    if isinstance(task, PivotalTask):
        marks = []
        for r in responses:
            text_ids = list(r.response_ids[:-1] if r.finished else r.response_ids)
            text = tokenizer.decode(text_ids)
            flags = task.pivotal(r.problem, text)
            row: list[bool | None] = [any(flags[s:e]) for s, e in _token_spans(tokenizer, text_ids)]
            marks.append(row + [None] * (r.length - len(row)))
    return TokenTable(scores, classes, marks, layers)


# --------------------------------------------------------------------------- #
# Analysis
# --------------------------------------------------------------------------- #


def _interval_dict(i: Interval) -> dict[str, Any]:
    return {"estimate": i.estimate, "ci": [i.low, i.high], "undefined_resamples": i.undefined}


def _clusters(lengths: Sequence[int]) -> list[np.ndarray]:
    out, start = [], 0
    for n in lengths:
        out.append(np.arange(start, start + n, dtype=np.int64))
        start += n
    return out


def _auc_and_rho(
    score: np.ndarray,
    piv: np.ndarray,
    pivotal: np.ndarray,
    clusters: list[np.ndarray],
    settings: DiagnoseSettings,
    stream: int,
) -> dict[str, Any]:
    a = cluster_bootstrap(
        lambda idx: auc(score[idx], pivotal[idx]),
        clusters,
        resamples=settings.bootstrap,
        rng=np.random.default_rng([settings.seed, 11, stream]),
        level=settings.level,
    )
    r = cluster_bootstrap(
        lambda idx: spearman(score[idx], piv[idx]),
        clusters,
        resamples=settings.bootstrap,
        rng=np.random.default_rng([settings.seed, 13, stream]),
        level=settings.level,
    )
    return {"auc": _interval_dict(a), "spearman": _interval_dict(r)}


def row_gates(rows: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each response's scores as a run's gates order them: ``cc.gates_from_concentration`` of
    the row with ``GateParams(low=0, high=1)`` and the default normalisation (the running
    z-score of the tokens up to each one), a monotone map of what Comp-GAE's gates read."""
    from ..gating import gates_from_concentration

    params = GateParams(low=0.0, high=1.0)
    out = []
    for row in rows:
        x = np.asarray(row, dtype=np.float64)
        out.append(gates_from_concentration(x[None, :], params=params)[0] if x.size else x.copy())
    return out


def analyse(
    table: TokenTable,
    chosen: Sequence[np.ndarray],
    pivotality: Sequence[np.ndarray],
    settings: DiagnoseSettings,
) -> dict[str, Any]:
    """The report's ``auc``, ``baselines``, ``auc_vs_marks`` and ``pivotal`` sections from
    the per-token table, the chosen tokens and their pivotality (module docstring, step 4)."""
    clusters = _clusters([len(c) for c in chosen])
    piv = np.concatenate([np.asarray(p, dtype=np.float64) for p in pivotality]) if chosen else np.zeros(0)
    pivotal = piv >= settings.pivotal_threshold

    def column(name: str, rows: Sequence[np.ndarray] | None = None) -> np.ndarray:
        rows = table.scores[name] if rows is None else rows
        return np.concatenate([rows[i][c] for i, c in enumerate(chosen)])

    stream = 0
    concentration: dict[str, dict[str, Any]] = {}
    for stat in STATISTICS:
        concentration[stat] = {}
        for key in ["mean"] + [f"layer{layer}" for layer in range(table.layers)]:
            concentration[stat][key] = _auc_and_rho(
                column(f"concentration/{stat}/{key}"), piv, pivotal, clusters, settings, stream
            )
            stream += 1
        gates = row_gates(table.scores[f"concentration/{stat}/mean"])  # what the recommendation reads
        concentration[stat]["gates"] = _auc_and_rho(column("", gates), piv, pivotal, clusters, settings, stream)
        stream += 1
    classes = np.array([table.classes[i][int(t)] for i, c in enumerate(chosen) for t in c], dtype=object)
    rates = {str(k): float(pivotal[classes == k].mean()) for k in sorted(set(classes.tolist()))}
    baselines: dict[str, Any] = {}
    for name in BASELINES:
        if name == "token_class":
            score = np.array([rates[str(k)] for k in classes], dtype=np.float64)
        else:
            score = column(name)
        baselines[name] = _auc_and_rho(score, piv, pivotal, clusters, settings, stream)
        stream += 1
        if name in ("policy_entropy", "token_nll"):  # a gate source: its gates, as a run maps them
            gates = row_gates(table.scores[name])
            baselines[name]["gates"] = _auc_and_rho(column("", gates), piv, pivotal, clusters, settings, stream)
            stream += 1
    baselines["token_class"]["pivotal_share_by_class"] = rates
    report: dict[str, Any] = {
        "auc": concentration,
        "baselines": baselines,
        "pivotal": {
            "threshold": settings.pivotal_threshold,
            "tokens": int(piv.size),
            "pivotal_tokens": int(pivotal.sum()),
            "pivotality_mean": float(piv.mean()) if piv.size else None,
            "pivotality_quantiles": (
                {q: float(np.quantile(piv, float(q))) for q in ("0.5", "0.9", "0.99")} if piv.size else None
            ),
        },
    }
    if table.marks is not None:
        report["auc_vs_marks"] = _marks_section(table, chosen, piv, settings)
    return report


def _auc_of(score: np.ndarray, labels: np.ndarray) -> Callable[[np.ndarray], float | None]:
    """The AUC of ``score`` for ``labels`` over the tokens at the given indices."""
    return lambda idx: auc(score[idx], labels[idx])


def _marks_section(
    table: TokenTable, chosen: Sequence[np.ndarray], piv: np.ndarray, settings: DiagnoseSettings
) -> dict[str, Any]:
    """AUC of marked against unmarked tokens: the MC pivotality (chosen tokens), each
    statistic's layer average and the position (every text token); EOS left out."""
    assert table.marks is not None
    marks = table.marks
    chosen_marks = [np.array([marks[i][int(t)] for t in c], dtype=object) for i, c in enumerate(chosen)]
    keep = [np.flatnonzero(m != None) for m in chosen_marks]  # noqa: E711 (object arrays)
    offsets = np.cumsum([0] + [len(c) for c in chosen])
    idx = [offsets[i] + k for i, k in enumerate(keep)]
    flat = np.concatenate(idx) if idx else np.zeros(0, dtype=np.int64)
    labels = np.concatenate([m[k].astype(bool) for m, k in zip(chosen_marks, keep)]) if keep else np.zeros(0, bool)
    sub_piv = piv[flat]
    out: dict[str, Any] = {
        "pivotality": _interval_dict(
            cluster_bootstrap(
                lambda i: auc(sub_piv[i], labels[i]),
                _clusters([len(k) for k in keep]),
                resamples=settings.bootstrap,
                rng=np.random.default_rng([settings.seed, 17]),
                level=settings.level,
            )
        )
    }
    text = [np.flatnonzero(np.array([m is not None for m in row], dtype=bool)) for row in marks]
    all_labels = np.concatenate([np.array([marks[i][int(k)] for k in t], dtype=bool) for i, t in enumerate(text)])
    clusters = _clusters([len(t) for t in text])
    names = [f"concentration/{stat}/mean" for stat in STATISTICS] + ["position"]
    for s, name in enumerate(names):
        score = np.concatenate([table.scores[name][i][t] for i, t in enumerate(text)])
        key = name.split("/")[1] if name.startswith("concentration/") else name
        out[key] = _interval_dict(
            cluster_bootstrap(
                _auc_of(score, all_labels),
                clusters,
                resamples=settings.bootstrap,
                rng=np.random.default_rng([settings.seed, 19, s]),
                level=settings.level,
            )
        )
    out["marked_tokens"] = int(all_labels.sum())
    out["text_tokens"] = int(all_labels.size)
    return out


def recommend(layer_average_auc: dict[str, Any], statistic: str) -> dict[str, Any]:
    """The gate direction and range from the layer average's AUC and interval (module docstring)."""
    estimate = layer_average_auc["estimate"]
    low, high = layer_average_auc["ci"]
    default = GateParams()
    if estimate is None or low is None or high is None:
        why = "no interval: no token reached the pivotal threshold, or every token did"
        next_step = NEXT_STEPS["none"].format(statistic=statistic)
        return {"direction": "none", "gate_range": [1.0, 1.0], "statistic": statistic, "why": why, "next": next_step}
    if low > 0.5:
        direction, why = "as_is", f"the AUC's interval [{low:.3f}, {high:.3f}] lies above 0.5"
    elif high < 0.5:
        direction, why = "inverted", f"the AUC's interval [{low:.3f}, {high:.3f}] lies below 0.5"
    else:
        direction, why = "none", f"the AUC's interval [{low:.3f}, {high:.3f}] holds 0.5"
    gate_range = [1.0, 1.0] if direction == "none" else [default.low, default.high]
    return {
        "direction": direction,
        "gate_range": gate_range,
        "statistic": statistic,
        "why": why,
        "next": NEXT_STEPS[direction].format(statistic=statistic),
    }


#: What to do after each recommended direction (the recommendation's ``next``).
NEXT_STEPS = {
    "as_is": "train with the default mapping (--gate-direction as_is, or this diagnosis.json as --gate-direction)",
    "inverted": "train with --gate-direction inverted (or this diagnosis.json as --gate-direction)",
    "none": (
        "the data do not support a direction for the {statistic} layer average: a constant-gate arm (tac_fixed, "
        "ppo) is the choice they leave; to look closer, diagnose more prompts (--prompts) or more continuations "
        "(--samples-per-prefix), or read the single layers' and other statistics' AUCs in diagnosis.png (a layer "
        "or statistic picked there must be confirmed on other prompts before training with it)"
    ),
}


def warnings_of(responses: Sequence[mc.Response], settings: DiagnoseSettings) -> list[str]:
    """What makes a diagnosis uninformative, known before the continuations are sampled: every
    response scored the same (no prefix can then move the value but by chance), or ``K`` so
    small that the standard error of ``|V_{t+1} − V_t|``, at most ``sqrt(0.5/K)``, reaches the
    pivotal threshold (pivotal tokens would be mostly noise)."""
    out: list[str] = []
    rewards = {r.reward for r in responses}
    if len(rewards) == 1 and len(responses) > 1:
        out.append(
            f"every sampled response scored {rewards.pop():g}: the values of its prefixes will be near it, and "
            "tokens will be pivotal only by chance; use a task (or settings, --temperature) on which the policy "
            "sometimes succeeds and sometimes fails"
        )
    bound = math.sqrt(0.5 / settings.samples_per_prefix)
    if bound >= settings.pivotal_threshold:
        k = math.ceil(0.5 / settings.pivotal_threshold**2) + 1
        out.append(
            f"with --samples-per-prefix {settings.samples_per_prefix} the noise of |ΔV| (standard error up to "
            f"{bound:.2f}) is as large as the pivotal threshold {settings.pivotal_threshold}: raise "
            f"--samples-per-prefix to {k} or more"
        )
    return out


@dataclasses.dataclass(frozen=True)
class CriticUnderTest:
    """A trained critic to compare with the Monte-Carlo values: the critic, the arm it was
    trained in and the run's scoring settings (``comppo_core.rl.core.step.ScoringSettings``),
    so its values come from the trainer's own scoring pass (``step.score``)."""

    critic: Any
    arm: Any
    scoring: Any


def critic_values(
    actor: Any, judge: CriticUnderTest, responses: Sequence[mc.Response], pad_id: int, batch_size: int, device: Any
) -> list[np.ndarray]:
    """The critic's value of each prefix ``s = 0 … L−1`` of each response: ``values[b, P−1+s]``
    of the trainer's scoring pass (column ``j`` is the value of the prefix ``ids[:, :j+1]``)."""
    import torch

    from ..rl.core import step

    out: list[np.ndarray] = []
    for lo in range(0, len(responses), batch_size):
        chunk = responses[lo : lo + batch_size]
        ids, mask, width = _layout(chunk, pad_id)
        resp = torch.zeros((ids.shape[0], ids.shape[1] - 1), dtype=torch.bool)
        for b, r in enumerate(chunk):
            resp[b, width - 1 : width - 1 + r.length] = True
        with torch.no_grad():
            scored = step.score(
                actor, judge.critic, ids.to(device), mask.to(device), resp.to(device), arm=judge.arm,
                settings=judge.scoring,
            )  # fmt: skip
        assert scored.values is not None
        values = scored.values.float().cpu().numpy().astype(np.float64)
        out += [values[b, width - 1 : width - 1 + r.length].copy() for b, r in enumerate(chunk)]
    return out


def explained_variance_section(
    mc_values: Sequence[np.ndarray], predicted: Sequence[np.ndarray], settings: DiagnoseSettings
) -> dict[str, Any]:
    """``1 − Var(V_MC − V_critic) / Var(V_MC)`` over every estimated prefix (``s < L``) of
    every response (population variances), with its bootstrap interval over responses; and
    the mean squared error. ``mc_values[i]`` is ``[L + 1]`` (NaN where not estimated),
    ``predicted[i]`` ``[L]``."""
    targets, preds, lengths = [], [], []
    for v, p in zip(mc_values, predicted):
        keep = np.flatnonzero(np.isfinite(v[:-1]))
        targets.append(v[keep])
        preds.append(p[keep])
        lengths.append(keep.size)
    t = np.concatenate(targets) if targets else np.zeros(0)
    q = np.concatenate(preds) if preds else np.zeros(0)

    def ev(idx: np.ndarray) -> float | None:
        var = float(np.var(t[idx])) if idx.size else 0.0
        return None if var == 0.0 else 1.0 - float(np.var(t[idx] - q[idx])) / var

    interval = cluster_bootstrap(
        ev, _clusters(lengths), resamples=settings.bootstrap, rng=np.random.default_rng([settings.seed, 23]),
        level=settings.level,
    )  # fmt: skip
    return {
        "explained_variance": _interval_dict(interval),
        "mse": float(np.mean((t - q) ** 2)) if t.size else None,
        "prefixes": int(t.size),
    }


#: A gate source's direction in its own orientation, from the direction of its score's AUC:
#: the policy-statistic gates map an uncertain token (high entropy, high NLL) to a low gate as is.
_POLICY_ORIENTATION = {"as_is": "inverted", "inverted": "as_is", "none": "none"}


def policy_gate_directions(baselines: dict[str, Any]) -> dict[str, str]:
    """``{"policy_entropy": …, "token_nll": …}``: the direction of the gates that map these policy
    statistics (``comppo_policy_entropy``, ``comppo_token_nll``; ``--gate-direction
    diagnosis.json`` reads them), in their own orientation, where ``as_is`` gives an uncertain
    token a low gate: an AUC interval above 0.5 (the uncertain tokens are the pivotal ones)
    gives ``inverted``, below 0.5 ``as_is``, holding 0.5 ``none``."""
    return {
        name: _POLICY_ORIENTATION[recommend(baselines[name]["gates"]["auc"], name)["direction"]]
        for name in ("policy_entropy", "token_nll")
    }


# --------------------------------------------------------------------------- #
# Cost
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class CostEstimate:
    """What the continuations will cost: rows, the most tokens they can generate, the tokens
    expected (each continuation as long as the rest of its response), and, once the first
    batch is timed, the seconds expected as a range (:func:`seconds_range`)."""

    rows: int
    tokens_upper_bound: int
    tokens_expected: int
    seconds_expected: tuple[float, float] | None = None

    def line(self) -> str:
        if self.seconds_expected is None:
            t = ""
        else:
            low, high = self.seconds_expected
            t = f", about {low:.0f} s" if round(high) <= round(low) else f", about {low:.0f}-{high:.0f} s"
        return (
            f"{self.rows} continuations, at most {self.tokens_upper_bound} generated tokens (about "
            f"{self.tokens_expected} expected){t}"
        )


def _expected_tokens(responses: Sequence[mc.Response], jobs: Sequence[mc.Continuation]) -> int:
    return sum(responses[j.response].length - j.boundary for j in jobs)


def batch_steps(
    responses: Sequence[mc.Response], batch: Sequence[mc.Continuation], max_new_tokens: int
) -> tuple[int, int]:
    """The decoding steps a batch of continuations takes: ``(expected, most)``. A batch is
    generated until every row has stopped, so it takes as many steps as its longest row:
    ``expected`` if each row is as long as the rest of its response (and its EOS),
    ``most`` if a row runs to its budget ``max_new_tokens − boundary`` (sampled continuations
    of a pretrained model often do)."""
    expected = max(responses[j.response].length - j.boundary + 1 for j in batch)
    most = max(max_new_tokens - j.boundary for j in batch)
    return min(expected, most), most


def seconds_range(timed: Sequence[tuple[int, float]], steps: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """The seconds every batch of continuations takes, from two timed batches ``timed`` =
    ``[(decoding steps, seconds), ...]`` (the first batch, the longest, and the last, the
    shortest): a batch costs ``a + b · steps``, ``a`` its prefill and fixed costs, ``b`` a
    decoding step, the line through the two points (``a, b ≥ 0``; one point, or two of the same
    steps: ``a = 0``). The range is that summed over the batches at their expected and most
    steps (:func:`batch_steps`). Per generated token, or per step alone, underestimates: a batch
    runs as long as its longest row, and its prompt's prefill costs the same however few steps
    follow (on SmolLM2 with 8-token responses, most of a batch's time)."""
    (s1, t1), (s2, t2) = timed[0], timed[-1]
    if s1 != s2:
        b = max(0.0, (t1 - t2) / (s1 - s2))
        a = max(0.0, t1 - b * s1)
    else:
        a, b = 0.0, t1 / max(1, s1)
    return sum(a + b * e for e, _ in steps), sum(a + b * m for _, m in steps)


# --------------------------------------------------------------------------- #
# The whole diagnostic
# --------------------------------------------------------------------------- #


def sample_responses(
    actor: Any, tokenizer: Any, task: Task, problems: Sequence[Problem], settings: DiagnoseSettings, device: Any
) -> tuple[list[mc.Response], int]:
    """One response per problem (sampled with keys ``(seed, 0x9C, problem index, 0)``, or
    greedy), and the tokens generated."""
    from ..rl.engine import rollout
    from ..rl.engine.sampling import row_keys

    max_new = settings.max_new_tokens or task.max_new_tokens
    out: list[mc.Response] = []
    generated = 0
    for lo in range(0, len(problems), settings.batch_size):
        batch = list(problems[lo : lo + settings.batch_size])
        keys = None if settings.greedy else row_keys(settings.seed, 0x9C, [(lo + i, 0) for i in range(len(batch))])
        ids, _, width, in_response = rollout.generate(
            actor, tokenizer, batch, max_new_tokens=max_new, device=device, sample=not settings.greedy,
            temperature=settings.temperature, top_p=settings.top_p, keys=keys,
            width=rollout.prompt_width(tokenizer, problems),
        )  # fmt: skip
        texts, finished = rollout.decode(tokenizer, ids, width, in_response)
        rewards = task.rewards(batch, texts, finished.tolist())
        for b, p in enumerate(batch):
            resp = ids[b, width:][in_response[b]].tolist()
            generated += len(resp)
            out.append(
                mc.Response(
                    p, tuple(tokenizer.encode_prompt(p.prompt)), tuple(resp), bool(finished[b]), float(rewards[b])
                )
            )
    return out, generated


def diagnose(
    actor: Any,
    tokenizer: Any,
    task: Task,
    settings: DiagnoseSettings,
    *,
    device: Any,
    say: Callable[[str], None] = print,
    progress: bool = True,
    continuations: mc.ContinuationRewards | None = None,
    critic: CriticUnderTest | None = None,
) -> dict[str, Any]:
    """Run the diagnostic (module docstring) and return the report as a JSON-able dict:
    ``direction``, ``recommendation``, ``auc``, ``baselines``, ``auc_vs_marks`` (a task with
    marks), ``pivotal``, ``responses``, ``cost`` and ``settings``. ``continuations``: the
    sampler of the Monte-Carlo rows (default :class:`~comppo_core.experiments.pivotality.PolicyContinuations`
    of ``actor``); ``say`` prints the cost estimate and the stages; ``critic``: a trained
    critic of ``actor`` whose values are compared with the Monte-Carlo values (the report's
    ``critic``: explained variance with its interval, MSE; None without one)."""
    t0 = time.perf_counter()
    max_new = settings.max_new_tokens or task.max_new_tokens
    problems = task.heldout(settings.prompts)
    if not problems:
        raise ParameterError(f"task: expected held-out problems, got none from {task.describe()!r}", argument="task")
    seconds: dict[str, float] = {}
    responses, response_tokens = sample_responses(actor, tokenizer, task, problems, settings, device)
    seconds["responses"] = time.perf_counter() - t0
    rng = np.random.default_rng([settings.seed, 5])
    chosen = [mc.choose_positions(r.length, settings.positions, settings.position_choice, rng) for r in responses]
    jobs = mc.continuation_jobs(responses, chosen, settings.samples_per_prefix)
    upper = sum(max_new - j.boundary for j in jobs)
    expected = _expected_tokens(responses, jobs)
    warnings = warnings_of(responses, settings)
    say(
        f"diagnose: {len(responses)} responses ({'greedy' if settings.greedy else 'sampled'}, {response_tokens} tokens, "
        f"mean reward {np.mean([r.reward for r in responses]):.3f}); {sum(len(c) for c in chosen)} tokens to score, "
        + CostEstimate(len(jobs), upper, expected).line()
    )
    for line in warnings:
        say(f"diagnose: warning: {line}")
    sampler = continuations or mc.PolicyContinuations(
        actor, tokenizer, task, max_new_tokens=max_new, temperature=settings.temperature, top_p=settings.top_p,
        seed=settings.seed, device=device,
    )  # fmt: skip
    generated = 0
    t1 = time.perf_counter()
    estimate = CostEstimate(len(jobs), upper, expected)
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    starts = list(range(0, len(jobs), settings.batch_size))
    # the first and the last batch first (the longest continuations and the shortest: the jobs are
    # sorted so), timed for the estimate; the rows are keyed, so the order changes no reward
    order = [*starts[:1], *starts[-1:][: len(starts) - 1], *starts[1:-1]]
    got_by_start: dict[int, list[float]] = {}
    timed: list[tuple[int, float]] = []
    with tqdm(total=len(jobs), desc="continuations", unit="row", disable=not progress, leave=False) as bar:
        for k, lo in enumerate(order):
            batch = jobs[lo : lo + settings.batch_size]
            t_batch = time.perf_counter()
            got, n_tokens = sampler(responses, batch)
            got_by_start[lo] = got
            generated += n_tokens
            bar.update(len(batch))
            if k < 2 and len(starts) > 2:
                # the steps the batch took, where the sampler says (PolicyContinuations does)
                took = getattr(sampler, "last_steps", None) or batch_steps(responses, batch, max_new)[0]
                timed.append((took, time.perf_counter() - t_batch))
                if k == 1:
                    steps = [batch_steps(responses, jobs[i : i + settings.batch_size], max_new) for i in starts]
                    estimate = dataclasses.replace(estimate, seconds_expected=seconds_range(timed, steps))
                    say(
                        f"diagnose: the first and last batches took {timed[0][1]:.1f} s and {timed[1][1]:.1f} s: "
                        f"{estimate.line()}"
                    )
    rewards = [r for lo in starts for r in got_by_start[lo]]
    seconds["continuations"] = time.perf_counter() - t1
    values, errors = mc.values_from_rewards(responses, jobs, rewards)
    piv = [mc.pivotality_of(v, c) for v, c in zip(values, chosen)]
    t2 = time.perf_counter()
    table = token_table(actor, tokenizer, task, responses, settings, device)
    seconds["scores"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    report = analyse(table, chosen, piv, settings)
    seconds["statistics"] = time.perf_counter() - t3
    rec = recommend(report["auc"][settings.statistic]["gates"]["auc"], settings.statistic)
    directions = {"concentration": rec["direction"], **policy_gate_directions(report["baselines"])}
    if critic is not None:
        predicted = critic_values(actor, critic, responses, tokenizer.pad_token_id, settings.batch_size, device)
        report["critic"] = explained_variance_section(values, predicted, settings)
    else:
        report["critic"] = None
    seconds["total"] = time.perf_counter() - t0
    say(f"diagnose: {rec['direction']}: {rec['why']}; next: {rec['next']}")
    return {
        "direction": rec["direction"],
        "recommendation": rec,
        "directions": directions,
        "warnings": warnings,
        **report,
        "responses": {
            "count": len(responses),
            "decoding": "greedy" if settings.greedy else "sampled",
            "mean_reward": float(np.mean([r.reward for r in responses])),
            "finished": float(np.mean([r.finished for r in responses])),
            "mean_tokens": float(np.mean([r.length for r in responses])),
            "value_standard_error_mean": float(
                np.nanmean(np.concatenate([e[:-1] for e in errors])) if any(e.size > 1 for e in errors) else 0.0
            ),
        },
        "cost": {
            "response_tokens": response_tokens,
            "continuation_rows": len(jobs),
            "continuation_tokens": generated,
            "generated_tokens": response_tokens + generated,
            "continuation_tokens_upper_bound": upper,
            "estimated_seconds": None if estimate.seconds_expected is None else list(estimate.seconds_expected),
            "seconds": seconds,
        },
        "settings": {**settings.to_dict(), "max_new_tokens": max_new, "task": task.to_dict()},
    }
