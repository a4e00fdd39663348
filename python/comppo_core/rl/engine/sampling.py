"""Sampling whose draws belong to the row: inverse-CDF sampling with counter-based uniforms.

``model.generate`` samples with ``torch.multinomial`` from one global RNG over the whole
batch, so a row's sample depends on the rows beside it, on the batch size and on the
device, and a batch split across ranks would draw different samples than one process.
Here every row ``b`` carries a 64-bit key ``k_b`` fixed by ``(seed, step, prompt index,
sample index)``, and decoding step ``t`` draws one uniform per row and inverts the CDF::

    u[b]       = uniform(k_b, t) ∈ (0, 1)           53 bits from a 32-bit integer hash (below)
    p[b, :]    = softmax(warp(logits)[b, :])        warp: temperature and top-p (filtered: p = 0)
    C[b, v]    = Σ_{w ≤ v} p[b, w]                  (float64)
    token_b,t  = min { v : C[b, v] > u[b] · C[b, V−1] }

an exact sample of ``p`` (up to the rounding of ``C``); a token of probability 0 is never
drawn. It runs as greedy decoding (``do_sample=False``) with the warpers and
:class:`InverseCDFSampler` as logits processors: the sampler leaves 0 at the drawn token and
−inf elsewhere, so the argmax is the draw. The uniform is a pure function of ``(k_b, t)``:
no RNG state to save for a resume, the same samples whatever the batch, the rank or the
padding (up to the float rounding of the logits themselves), and nothing drawn from
torch's RNG. The cost is a softmax, a cumulative sum and a search per step, as for
``torch.multinomial``.

The hash chains the murmur3 32-bit finaliser ``fmix32`` (all products mod 2³², split into
16-bit halves so that int64 never overflows; the same on every device)::

    h_i(k, t) = fmix32( fmix32( fmix32(k_lo ⊕ fmix32(2t + i + 1)) ⊕ k_hi ) ⊕ 0x9E3779B9 ),  i = 0, 1
    u         = ( (h_0 >> 5)·2²⁶ + (h_1 >> 6) + ½ ) / 2⁵³
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["InverseCDFSampler", "row_keys", "sample_tokens", "sampling_processors", "uniforms"]

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x · c mod 2³²`` for int64 ``x`` in ``[0, 2³²)`` without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def row_keys(seed: int, step: int, rows: Sequence[tuple[int, int]]) -> torch.Tensor:
    """``[B, 2]`` int64 keys (two 32-bit words) of the rows ``(prompt index, sample index)``
    of step ``step``: NumPy's ``SeedSequence([seed, step, prompt, sample])`` state."""
    out = np.empty((len(rows), 2), dtype=np.int64)
    for i, (prompt, sample) in enumerate(rows):
        out[i] = np.random.SeedSequence([seed, step, prompt, sample]).generate_state(2, np.uint32)
    return torch.from_numpy(out)


def uniforms(keys: torch.Tensor, t: int) -> torch.Tensor:
    """``[B]`` float64 uniforms in (0, 1) of decoding step ``t`` (module docstring)."""
    k_lo, k_hi = keys[:, 0], keys[:, 1]
    words = []
    for i in (0, 1):
        c = _fmix32(torch.tensor(2 * t + i + 1, dtype=torch.int64, device=keys.device))
        words.append(_fmix32(_fmix32(_fmix32(k_lo ^ c) ^ k_hi) ^ 0x9E3779B9))
    return ((words[0] >> 5).double() * 2.0**26 + (words[1] >> 6).double() + 0.5) * 2.0**-53


def sample_tokens(scores: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64: the inverse-CDF draw of each row of ``softmax(scores)`` at ``u``."""
    cdf = torch.softmax(scores.float(), dim=-1).double().cumsum(-1)
    total = cdf[:, -1:]
    # below the total, so the first C > target exists and is where C grows: p > 0 there
    target = torch.minimum(u.to(cdf.device).unsqueeze(-1) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


class InverseCDFSampler:
    """A logits processor drawing each row's token (module docstring): 0 at the draw, −inf elsewhere.

    Args:
      keys: ``[B, 2]`` int64 row keys (:func:`row_keys`).
      prompt_width: the width of the (left-padded) prompts; decoding step ``t`` is
        ``input_ids.shape[1] − prompt_width``.
    """

    def __init__(self, keys: torch.Tensor, prompt_width: int) -> None:
        self.keys = keys
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1] - self.prompt_width
        tokens = sample_tokens(scores, uniforms(self.keys.to(scores.device), t))
        out = torch.full_like(scores, -torch.inf)
        return out.scatter_(1, tokens.unsqueeze(-1), 0.0)


def sampling_processors(temperature: float, top_p: float, keys: torch.Tensor, prompt_width: int) -> Any:
    """The ``LogitsProcessorList`` that makes greedy decoding sample: temperature (unless 1),
    top-p (unless 1), then :class:`InverseCDFSampler` (transformers' order of the warpers)."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    procs: list[Any] = []
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    procs.append(InverseCDFSampler(keys, prompt_width))
    return LogitsProcessorList(procs)
