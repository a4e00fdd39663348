"""One actor forward for PPO: log-probs, concentration, gates and the critic's values.

::

    logprobs[b, j]       = log π_τ(ids[b, j+1] | ids[b, :j+1])        (carries grad iff grad=True)
    concentration[b, j]  = probe statistic at query position j          (detached)
    per_layer[b, j, l]   = the same, layer l alone                      (detached)
    gates[b, j]          = gates_from_concentration(concentration, mask=response_mask, **gate_params)
    values[b, j]         = critic(prefix ids[b, :j+1])                  (grad into the critic iff critic_grad)
    entropy[b, j]        = −Σ_v π_τ(v | ids[b, :j+1])·log π_τ(v | ids[b, :j+1])   (policy_statistic="policy_entropy")

``π_τ = softmax(logits / τ)`` is the policy at the sampling temperature ``τ``, the
distribution the rollout drew from (verl and TRL score with the same division).
All ``[B, T−1]`` (``per_layer`` ``[B, T−1, L]``), in the column convention of
:func:`comppo_core.hf.logprobs_and_concentration` (docs/design.md §7, §10). The actor
runs once: the probe reads every layer's attention, forward hooks record the residual
stream at the critic's taps (no ``output_hidden_states=True``), and a
:class:`~comppo_core.rl.TransportAlignedCritic` turns them into values with no second
transformer. A :class:`~comppo_core.rl.StandardCritic` runs its own forward.

Gates for Comp-GAE are the caller's ``gates`` when given (constant gates, controls, an
oracle), else the gate mapping of the concentration over the response columns: with the
row's z-score (``GateParams.normalize``), or with ``causal=True`` its running z-score
(:func:`~comppo_core.rl.critics.tac.causal_gates`, so g_t reads tokens ≤ t only). ``gates`` may
also be a function of this forward's own concentration gates (a control:
``gates(concentration_gates, concentration, response_mask) -> [B, T−1]``), called after
the actor's forward, so a control costs no second actor forward.

With ``policy_statistic`` (a gate source of the policy's uncertainty,
:data:`~comppo_core.rl.core.gate_sources.POLICY_STATISTICS`) Comp-GAE's own gates are the same
mapping applied to ``−u`` instead of the concentration, ``u`` the next-token entropy
``H_t`` or the token's NLL ``−logprobs`` (detached): an uncertain token gets a low gate.
``H_t`` is computed from the final hidden states (the LM head's input, kept by a forward
pre-hook on the head) by :func:`policy_entropy`, ``chunk`` response tokens at a time:
one more LM-head matmul over the response columns, never the ``[B, T, V]`` logits.

The critic is a baseline and reads only the prefix, whatever the gates of Comp-GAE: a
TAC's gate features are always :func:`~comppo_core.rl.critics.tac.causal_gates` of this forward's
concentration (the mapping with running statistics: a whole-row z-score, a control or a
constant would let V_j see later tokens), never the caller's ``gates``.

**Packed rows.** With ``cu_seqlens`` (``[S+1]`` offsets; ``input_ids`` ``[1, N]``, several
sequences end to end, verl's ``NO_PADDING`` layout, no attention mask) the actor still runs
once, on the packed row (attention kept per sequence: :func:`comppo_core.hf.score` with
``cu_seqlens``), and every output is the packed ``[1, N−1]`` layout of what the separate
sequences give, padded into a batch::

    out[0, cu[i] + j] = the separate sequence i's column j,   0 <= j < L_i − 1

Column ``cu[i+1] − 1`` scores the next sequence's first token: it is outside the response
(log-probs, concentration and values 0, gates 1). Everything that runs along a row runs
along each sequence: Comp-GAE's gates (the running or whole-sequence z-score, a
``"batch"`` z-score over all sequences' response columns, a ``gates`` function) on one row
per sequence (:func:`~comppo_core.hf.lm.unpack_columns`), and the critic on one row per
sequence (:func:`~comppo_core.rl.critics.inputs.packed_critic_inputs`), its values put back
with :func:`~comppo_core.hf.lm.pack_columns`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch
from torch import nn

from ... import gating
from ...errors import OutOfRangeError, ParameterError, ShapeError
from ...gate_params import GateParams, as_gate_params
from ...hf.lm import (
    check_cu_seqlens,
    check_ids,
    default_position_ids,
    logprob_chunk_tokens,
    pack_columns,
    packed_position_ids,
    scored_columns,
    unpack_columns,
)
from ...hf.probe import UnsupportedModelError, unwrap_model
from ...hf.scoring import _post_head, score
from ...hf.statistics import DEFAULT_QUERY_CHUNK
from ...options import check_choice
from ..critics.inputs import CriticInputs, packed_critic_inputs
from ..critics.tac import causal_gates
from ..critics.taps import TapRecorder
from .gate_sources import POLICY_STATISTICS

__all__ = [
    "ForwardOutput",
    "GatesFromConcentration",
    "RecordedOutput",
    "forward",
    "forward_from_recorded",
    "policy_entropy",
]

#: ``gates(concentration_gates, concentration, response_mask) -> gates``, all ``[B, T−1]``.
GatesFromConcentration = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class ForwardOutput(NamedTuple):
    """What :func:`forward` returns; every per-token field ``[B, T−1]``, float32."""

    logprobs: torch.Tensor
    #: None with ``routing=False`` (no probe ran), as ``per_layer`` and ``gates``
    concentration: torch.Tensor | None
    per_layer: torch.Tensor | None
    gates: torch.Tensor | None
    values: torch.Tensor | None
    #: the causal gate features the critic read (1 without a probe); None without a critic
    critic_gates: torch.Tensor | None
    #: ``[B, T−1]`` bool: the response columns used (``response_mask``, or every scored column)
    response_mask: torch.Tensor
    #: what Comp-GAE's own gates map (0 outside the response): the concentration, or ``−u`` of
    #: the ``policy_statistic`` (``−H_t`` or ``logprobs``); None where there are no gates
    gate_statistic: torch.Tensor | None = None


def policy_entropy(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    *,
    temperature: float = 1.0,
    chunk_tokens: int,
    post: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``[N]`` float32 next-token entropies of ``π_τ = softmax(post(head(hidden)) / τ)``, no grad.

    ::

        z[n, v] = float32(post(head(hidden[n]))[v]) / τ
        H[n]    = −Σ_v p[n, v]·log p[n, v],   log p = log_softmax(z)   (0·log 0 = 0)

    ``chunk_tokens`` rows at a time, so the ``[N, V]`` logits never exist at once (about
    three ``[chunk_tokens, V]`` float32 blocks at a time), as
    :func:`comppo_core.hf.lm.head_logprobs` computes the log-probs from the same inputs.

    Args:
      hidden: ``[N, H]`` final hidden states (the LM head's input).
      head: the LM head, ``[n, H] → [n, V]``.
      temperature: ``τ`` (> 0).
      chunk_tokens: rows per chunk (integer ≥ 1).
      post: optional map the model applies to the head's output (a soft-capping or scale).
    """
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2 or not hidden.is_floating_point():
        got = f"{hidden.dtype} {tuple(hidden.shape)}" if isinstance(hidden, torch.Tensor) else type(hidden).__name__
        raise ShapeError(f"hidden: expected a 2-D float tensor [N, H], got {got}", argument="hidden")
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ParameterError(f"chunk_tokens: expected an integer >= 1, got {chunk_tokens!r}", argument="chunk_tokens")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ParameterError(f"temperature: expected a finite float > 0, got {temperature!r}", argument="temperature")
    parts = []
    with torch.no_grad():
        for i in range(0, hidden.shape[0], chunk_tokens):
            z = head(hidden[i : i + chunk_tokens].detach())
            if post is not None:
                z = post(z)
            logp = torch.log_softmax(z.float() / float(temperature), dim=-1)
            # a −inf logit (a masked vocabulary entry) has p = 0: its term is 0, not 0·(−inf)
            parts.append(-(logp.exp() * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(-1))
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


class _HeadHidden:
    """Forward pre-hook on the LM head that keeps its first ``[B, T, H]`` input (the final
    hidden states) and then removes itself, so the scoring forward's own head calls (its
    chunked log-probs) run exactly as without it. Registered before the scoring forward,
    it runs before the scoring forward's own hook on the head."""

    def __init__(self, head: torch.nn.Module, shape: tuple[int, int]) -> None:
        self.shape = shape
        self.hidden: torch.Tensor | None = None
        self._handle = head.register_forward_pre_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.dim() == 3 and tuple(x.shape[:2]) == self.shape:
            self.hidden = x.detach()
        self.remove()

    def remove(self) -> None:
        self._handle.remove()


def _entropy_columns(model: Any, capture: _HeadHidden | None, resp: torch.Tensor, temperature: float) -> torch.Tensor:
    """``[B, T−1]`` float32: the policy's next-token entropy at each response column (0 elsewhere)."""
    inner = unwrap_model(model)
    head = inner.get_output_embeddings() if callable(getattr(inner, "get_output_embeddings", None)) else None
    if capture is None or capture.hidden is None or not isinstance(head, torch.nn.Module):
        raise UnsupportedModelError(
            f"model: {type(inner).__name__}'s LM head (get_output_embeddings) was not called on the final hidden "
            "states [B, T, H], so the policy's entropy cannot be computed (the policy_entropy gates need it)",
            argument="model",
        )
    weight = getattr(head, "weight", None)
    vocab = int(weight.shape[0]) if isinstance(weight, torch.Tensor) else 1
    h = capture.hidden[:, :-1][resp.to(capture.hidden.device)]
    entropy = policy_entropy(
        h, head, temperature=temperature, chunk_tokens=logprob_chunk_tokens(None, vocab), post=_post_head(inner)
    )
    return torch.zeros(resp.shape, dtype=torch.float32, device=entropy.device).masked_scatter(
        resp.to(entropy.device), entropy
    )


def _column_mask(
    name: str, x: Any, shape: tuple[int, int], columns: torch.Tensor, *, packed: bool = False
) -> torch.Tensor:
    """``x`` as a ``[B, T−1]`` bool tensor inside the scored columns, or a clear error."""
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ShapeError(
            f"{name}: expected a tensor [B, T−1] = {list(shape)} (column j scores token j+1), got {got}", argument=name
        )
    m = x.to(device=columns.device) != 0
    outside = m & ~columns
    if bool(outside.any()):
        row, pos = (int(i) for i in torch.nonzero(outside)[0])
        what = (
            "tokens are of one packed sequence, got a column whose target token starts the next sequence"
            if packed
            else "tokens are real, got a padded column"
        )
        raise ShapeError(
            f"{name}: expected only columns whose query and target {what} at (row {row}, position {pos})",
            argument=name,
            row=row,
            position=pos,
        )
    return m


def _given_gates(gates: Any, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
    if not isinstance(gates, torch.Tensor) or tuple(gates.shape) != shape:
        got = tuple(gates.shape) if isinstance(gates, torch.Tensor) else type(gates).__name__
        raise ShapeError(f"gates: expected a tensor [B, T−1] = {list(shape)}, got {got}", argument="gates")
    g = gates.detach().to(device=device, dtype=torch.float32)
    bad = ~((g >= 0) & (g <= 1))
    if bool(bad.any()):
        row, pos = (int(i) for i in torch.nonzero(bad)[0])
        raise OutOfRangeError(
            f"gates: expected values in [0, 1], got {float(g[row, pos])} at (row {row}, position {pos})",
            argument="gates",
            row=row,
            position=pos,
        )
    return g


def forward(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    critic: nn.Module | None = None,
    response_mask: torch.Tensor | None = None,
    statistic: str = "entropy",
    layers: None | int | slice | Iterable[int] = None,
    gates: torch.Tensor | GatesFromConcentration | None = None,
    gate_params: GateParams | None = None,
    grad: bool = False,
    temperature: float = 1.0,
    position_ids: torch.Tensor | None = None,
    method: str = "auto",
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    routing: bool = True,
    causal: bool = False,
    critic_grad: bool | None = None,
    policy_statistic: str | None = None,
    cu_seqlens: Any = None,
    response_logprobs: bool = False,
) -> ForwardOutput:
    """Run the actor once; return log-probs, concentration, gates and values (module docstring).

    Args:
      model: a causal LM supported by :class:`~comppo_core.hf.ConcentrationProbe`.
      input_ids: ``[B, T]`` token ids (prompt + response), ``T >= 2``.
      attention_mask: ``[B, T]`` (nonzero = real token) or None; any padding side.
      critic: a :class:`~comppo_core.rl.TransportAlignedCritic`, a
        :class:`~comppo_core.rl.StandardCritic`, or None (no values).
      response_mask: ``[B, T−1]`` response columns (column j = token j+1); default every
        scored column. Gates are computed over these columns and are 1 elsewhere.
      statistic, layers, method, query_chunk: the probe's (the per-layer features are the
        selected layers; a TAC expects as many as it was built for).
      gates: ``[B, T−1]`` gates in ``[0, 1]`` that replace Comp-GAE's concentration gates
        (constant gates, controls, an oracle); or a function
        ``gates(concentration_gates, concentration, response_mask)`` returning them, given
        this forward's ``[B, T−1]`` concentration gates (1 outside the response), its
        concentration and the response columns. The critic never reads them.
      gate_params: the concentration → gate mapping (default :class:`GateParams`).
      grad: run with gradients: log-probs carry them (the PPO update), values carry them
        into the critic (and into the trunk only under the TAC's ``trunk_grad``); the probe
        statistics and gates never do.
      critic_grad: whether the values carry gradients into the critic (None: ``grad``);
        ``grad=False, critic_grad=True`` trains the critic alone (a critic warm-up) without
        building the actor's graph: the actor's hidden states then carry no gradient.
      temperature: ``τ`` of the log-probs (the rollout's sampling temperature; the
        concentration reads attention, which ``τ`` does not touch).
      position_ids: optional ``[B, T]``; default ``cumsum(attention_mask) − 1`` clamped at 0.
      routing: run the probe (concentration, per-layer statistics, gates). ``False``
        scores without it, for a step that needs none (no gates and a critic that reads
        no routing: a :class:`~comppo_core.rl.StandardCritic` or none); ``gates`` is then
        ignored, and a critic reads gates of 1 and no per-layer features.
      causal: Comp-GAE's own gates with the row's running z-score instead of the whole
        row's (:func:`~comppo_core.rl.critics.tac.causal_gates`; a ``"batch"`` normalisation is then
        per row too).
      policy_statistic: None (Comp-GAE's own gates map the concentration), or one of
        :data:`~comppo_core.rl.core.gate_sources.POLICY_STATISTICS`: they map ``−u``, ``u`` the
        policy's next-token entropy (``"policy_entropy"``) or the token's NLL ``−logprobs``
        (``"token_nll"``), with the same mapping and normalisation (module docstring);
        detached, with or without ``routing``. The critic's inputs do not change.
      cu_seqlens: ``[S+1]`` int offsets of a packed row (several sequences end to end,
        verl's ``NO_PADDING`` layout): ``input_ids`` is ``[1, N]`` and ``attention_mask``
        None (``position_ids``, if given, must be the ones the offsets give). Every output
        is then the packed ``[1, N−1]`` layout of the separate sequences' (module docstring,
        "Packed rows"); a column whose target token starts the next sequence is scored by
        nothing: outside the response, log-probs and values 0, gates 1. ``gates``, when a
        tensor, is ``[1, N−1]``; when a function, it is called on one row per sequence
        (``[S, T'−1]``, :func:`~comppo_core.hf.lm.unpack_columns`) and returns that shape.
      response_logprobs: log-probs at the response columns alone, 0 at the other scored
        columns (:func:`comppo_core.hf.score`'s ``logprob_columns``): the LM head skips the
        prompt (each log-prob computed is the one without it up to the float32 rounding
        of the head's matmul on other row blocks). A PPO step reads no other
        (:func:`comppo_core.rl.core.step.score` asks for it).

    Returns:
      :class:`ForwardOutput`; values outside the scored columns are 0.

    Raises:
      ParameterError: ``cu_seqlens`` with an ``attention_mask`` (``argument="attention_mask"``).
      LayoutError: malformed ``cu_seqlens``.
    """
    cu: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    pos: torch.Tensor | None = position_ids
    if cu_seqlens is None:
        ids, mask = check_ids(input_ids, attention_mask)
        if mask is None:
            mask = torch.ones_like(ids, dtype=torch.bool)
        pos = default_position_ids(mask) if position_ids is None else position_ids
        columns = scored_columns(mask)
    else:
        ids, _ = check_ids(input_ids, None)
        if attention_mask is not None:
            raise ParameterError(
                "attention_mask: expected None with cu_seqlens (a packed row has no padding; transformers keeps its "
                "sequences apart only without a mask), got a mask",
                argument="attention_mask",
            )
        if ids.shape[0] != 1:
            raise ShapeError(
                f"input_ids: with cu_seqlens expected one packed row [1, N], got {tuple(ids.shape)}",
                argument="input_ids",
            )
        cu = check_cu_seqlens(cu_seqlens, ids.shape[1], ids.device)
        # pos stays position_ids: hf.score derives them from cu_seqlens (and checks given ones)
        columns = packed_position_ids(cu)[:, 1:] != 0  # column j scores token j+1 unless it starts a sequence
    shape = (ids.shape[0], ids.shape[1] - 1)
    resp = (
        columns
        if response_mask is None
        else _column_mask("response_mask", response_mask, shape, columns, packed=cu is not None)
    )
    given = None if gates is None or callable(gates) else _given_gates(gates, shape, ids.device)
    params = as_gate_params(gate_params, "gate_params")
    taps: tuple[int, ...] = tuple(getattr(critic, "taps", ())) if critic is not None else ()
    if taps and not routing:
        raise ParameterError(
            f"routing: expected True for a critic that reads the actor's routing ({type(critic).__name__}), got False",
            argument="routing",
        )

    if policy_statistic is not None:
        check_choice("policy_statistic", policy_statistic, POLICY_STATISTICS)
    capture: _HeadHidden | None = None
    if policy_statistic == "policy_entropy":
        inner = unwrap_model(model)
        head = inner.get_output_embeddings() if callable(getattr(inner, "get_output_embeddings", None)) else None
        if isinstance(head, torch.nn.Module):
            capture = _HeadHidden(head, (ids.shape[0], ids.shape[1]))

    recorder = TapRecorder(model, taps)
    try:
        with recorder if taps else contextlib.nullcontext():
            scored = score(
                model,
                ids,
                mask,
                temperature=temperature,
                per_layer=routing,
                statistic=statistic,
                layers=layers,
                method=method,
                query_chunk=query_chunk,
                grad=grad,
                position_ids=pos,
                cu_seqlens=cu,
                logprob_columns=resp if response_logprobs else None,
            )
    finally:
        if capture is not None:
            capture.remove()
    lp, conc, per = scored.logprobs, scored.concentration, scored.per_layer

    # what Comp-GAE's own gates map: the concentration, or −u of the policy's statistic u
    signal: torch.Tensor | None = conc
    if policy_statistic == "token_nll":
        signal = torch.where(resp, lp.detach().float(), 0.0)
    elif policy_statistic == "policy_entropy":
        signal = -_entropy_columns(model, capture, resp, temperature).to(lp.device)
        if capture is not None:
            capture.hidden = None

    recorded = forward_from_recorded(
        ids,
        conc,
        per,
        resp,
        cu_seqlens=cu,
        attention_mask=mask if cu is None else None,
        position_ids=pos if cu is None else None,
        taps=dict(recorder.hidden) if taps else {},
        critic=critic,
        gates=gates if callable(gates) else given,
        gate_params=params,
        causal=causal,
        gate_statistic=signal,
        critic_grad=grad if critic_grad is None else critic_grad,
    )
    return ForwardOutput(lp, conc, per, recorded.gates, recorded.values, recorded.critic_gates, resp, signal)


class RecordedOutput(NamedTuple):
    """What :func:`forward_from_recorded` returns (``[B, T−1]`` float32 each, as in :class:`ForwardOutput`)."""

    #: Comp-GAE's gates (1 outside the response); None without a gate statistic
    gates: torch.Tensor | None
    #: the critic's values (0 outside the scored columns); None without a critic
    values: torch.Tensor | None
    #: the causal gate features the critic read (1 without a probe); None without a critic
    critic_gates: torch.Tensor | None


def forward_from_recorded(
    input_ids: torch.Tensor,
    concentration: torch.Tensor | None,
    per_layer: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    taps: dict[int, torch.Tensor] | None = None,
    critic: nn.Module | None = None,
    gates: torch.Tensor | GatesFromConcentration | None = None,
    gate_params: GateParams | None = None,
    causal: bool = False,
    gate_statistic: torch.Tensor | None = None,
    critic_grad: bool = False,
) -> RecordedOutput:
    """:func:`forward` after the actor's forward: Comp-GAE's gates and the critic's values from what
    the forward recorded (the probe's statistics, the critic's taps). :func:`forward` calls it;
    so does an engine that runs the actor itself (verl's, :mod:`comppo_core.integrations.verl.engine`),
    so both compute the same gates and values from the same recorded tensors.

    Everything per token is ``[B, T−1]`` (or, with ``cu_seqlens``, a packed ``[1, N−1]`` row:
    every per-sequence computation runs on one row per sequence, :func:`~comppo_core.hf.lm.unpack_columns`),
    as :func:`forward` returns it (module docstring)::

        own gates   = gate mapping of gate_statistic over the response (its running z-score: causal)
        gates       = own gates, or the given ``gates`` (a tensor, or a function of the own gates),
                      1 outside the response (always with cu_seqlens or given gates)
        values      = critic(inputs): taps, per_layer, causal gates of the concentration, in float32

    Args:
      input_ids: ``[B, T]`` token ids, or the packed ``[1, N]`` row with ``cu_seqlens``.
      concentration, per_layer: the probe's statistics at the scored columns (0 elsewhere), or None
        (no probe: the critic reads gates of 1 and no per-layer features).
      response_mask: ``[B, T−1]`` bool, the response columns (inside the scored ones).
      cu_seqlens: the packed row's ``[S+1]`` offsets (then ``attention_mask`` is None).
      attention_mask, position_ids: the padded batch's (default all ones; ``cumsum − 1``).
      taps: the critic's recorded residual streams (layer → ``[B, T, d]``).
      critic: a critic (a TransportAlignedCritic, a StandardCritic) or None.
      gates: ``[B, T−1]`` gates in ``[0, 1]`` replacing Comp-GAE's, or a function of its own
        (:data:`GatesFromConcentration`; called per sequence on a packed row), or None.
      gate_params, causal: the gate mapping, and whether it uses the running z-score.
      gate_statistic: what the own gates map (the concentration, or ``−u`` of a policy
        statistic, 0 outside the response); None: no gates.
      critic_grad: whether the values carry gradients into the critic.

    Raises:
      ParameterError: both ``cu_seqlens`` and ``attention_mask``.
      ShapeError, OutOfRangeError: ``gates`` not ``[B, T−1]`` or outside ``[0, 1]``.
    """
    ids = input_ids
    cu = cu_seqlens
    if cu is not None and attention_mask is not None:
        raise ParameterError(
            "attention_mask: expected None with cu_seqlens (a packed row has no padding), got a mask",
            argument="attention_mask",
        )
    mask: torch.Tensor | None = None
    if cu is None:
        mask = attention_mask if attention_mask is not None else torch.ones_like(ids, dtype=torch.bool)
        columns = scored_columns(mask)
    else:
        columns = (packed_position_ids(cu)[:, 1:] != 0).to(ids.device)
    resp = response_mask.to(torch.bool)
    shape = (ids.shape[0], ids.shape[1] - 1)
    given = None if gates is None or callable(gates) else _given_gates(gates, shape, ids.device)
    params = as_gate_params(gate_params, "gate_params")

    def rows(x: torch.Tensor, name: str) -> torch.Tensor:
        return x if cu is None else unpack_columns(x, cu, name)

    resp_rows = rows(resp, "response_mask")
    causal_features: torch.Tensor | None = None  # causal gates of the concentration, per row (the TAC's features)
    if concentration is not None and critic is not None and cu is None:
        causal_features = causal_gates(rows(concentration, "concentration"), resp_rows, params)
    comp_gates: torch.Tensor | None = None
    if gate_statistic is not None:
        if causal and causal_features is not None and gate_statistic is concentration:
            own = causal_features
        elif causal:
            own = causal_gates(rows(gate_statistic, "gate_statistic"), resp_rows, params)
        else:
            own = torch.as_tensor(
                gating.gates_from_concentration(rows(gate_statistic, "gate_statistic"), mask=resp_rows, params=params),
                dtype=torch.float32,
            )
        if callable(gates):
            replaced = _given_gates(
                gates(own, rows(gate_statistic, "gate_statistic"), resp_rows),
                (own.shape[0], own.shape[1]),
                ids.device,
            )
            given = replaced if cu is None else pack_columns(replaced, cu, "gates")
        own = own if cu is None else pack_columns(own, cu, "gates")
        comp_gates = own if given is None else given
        comp_gates = torch.where(resp, comp_gates, 1.0) if given is not None or cu is not None else comp_gates

    values = None
    critic_gates: torch.Tensor | None = None
    if critic is not None:
        if cu is None:
            # no probe: no routing features; a critic reads gates of 1
            critic_gates = (
                torch.ones(shape, dtype=torch.float32, device=ids.device)
                if causal_features is None
                else causal_features
            )
            assert mask is not None
            inputs = CriticInputs(
                input_ids=ids,
                attention_mask=mask,
                position_ids=default_position_ids(mask) if position_ids is None else position_ids,
                columns=columns,
                response_mask=resp,
                taps=dict(taps or {}),
                per_layer=per_layer,
                gates=critic_gates,
            )
        else:  # the critic reads one row per sequence (its causal features must not cross sequences)
            inputs = packed_critic_inputs(
                ids,
                cu,
                taps=dict(taps or {}),
                per_layer=per_layer,
                concentration=concentration,
                response_mask=resp,
                gate_params=params,
            )
            critic_gates = torch.where(columns, pack_columns(inputs.gates, cu, "critic gates"), 1.0)
        with torch.enable_grad() if critic_grad else torch.no_grad():
            values = critic(inputs)
        if cu is not None:
            values = pack_columns(values, cu, "values")
    return RecordedOutput(comp_gates, values, critic_gates)
