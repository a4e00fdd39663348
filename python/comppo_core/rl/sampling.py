"""Sampling whose draws belong to the row: Gumbel-max with counter-based noise.

``model.generate`` samples with ``torch.multinomial`` from one global RNG over the whole
batch, so a row's sample depends on the rows beside it, on the batch size and on the
device, and a batch split across ranks would draw different samples than one process.
Here every row ``b`` carries a 64-bit key ``k_b`` fixed by ``(seed, step, prompt index,
sample index)``, and decoding step ``t`` samples token ``v`` as::

    u[b, v]   = (h(k_b, t, v) + ½) / 2³²             h: a 32-bit integer hash (below)
    g[b, v]   = −log(−log u[b, v])                   standard Gumbel noise (float64)
    token_b,t = argmax_v  warp(logits)[b, v] + g[b, v]

which is an exact sample of ``softmax(warp(logits))`` (the Gumbel-max trick), with
``warp`` the usual temperature and top-p warpers (filtered tokens are −inf). It runs as
greedy decoding (``do_sample=False``) with the warpers and :class:`GumbelNoise` as logits
processors. The noise is a pure function of ``(k_b, t, v)``: no RNG state to save for a
resume, the same samples whatever the batch, the rank or the padding, and nothing drawn
from torch's RNG.

``h`` chains the murmur3 32-bit finaliser ``fmix32``::

    h(k, t, v) = fmix32( fmix32( fmix32(k_lo ⊕ fmix32(t + 1)) ⊕ (v + 1)·0x9E3779B1 ) ⊕ k_hi )

with all products taken mod 2³² (split into 16-bit halves so that int64 never overflows;
the result is the same on every device).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["GumbelNoise", "gumbel", "row_keys", "sampling_processors"]

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


def gumbel(keys: torch.Tensor, t: int, vocab: int) -> torch.Tensor:
    """``[B, vocab]`` float64 Gumbel noise of decoding step ``t`` (module docstring)."""
    k_lo, k_hi = keys[:, :1], keys[:, 1:]
    v = torch.arange(1, vocab + 1, dtype=torch.int64, device=keys.device).unsqueeze(0)
    step = _fmix32(torch.tensor(t + 1, dtype=torch.int64, device=keys.device))
    h = _fmix32(k_lo ^ step)
    h = _fmix32(h ^ _mul32(v, 0x9E3779B1))
    h = _fmix32(h ^ k_hi)
    u = (h.to(torch.float64) + 0.5) * 2.0**-32
    return -torch.log(-torch.log(u))


class GumbelNoise:
    """A logits processor adding each row's Gumbel noise (module docstring).

    Args:
      keys: ``[B, 2]`` int64 row keys (:func:`row_keys`), on the logits' device.
      prompt_width: the width of the (left-padded) prompts; decoding step ``t`` is
        ``input_ids.shape[1] − prompt_width``.
    """

    def __init__(self, keys: torch.Tensor, prompt_width: int) -> None:
        self.keys = keys
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1] - self.prompt_width
        # float64: the argmax compares the exact sums (no ties made by rounding)
        return scores.double() + gumbel(self.keys.to(scores.device), t, scores.shape[-1])


def sampling_processors(temperature: float, top_p: float, keys: torch.Tensor, prompt_width: int) -> Any:
    """The ``LogitsProcessorList`` that makes greedy decoding sample: temperature (unless 1),
    top-p (unless 1), then :class:`GumbelNoise` (transformers' order of the warpers)."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

    procs: list[Any] = []
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    procs.append(GumbelNoise(keys, prompt_width))
    return LogitsProcessorList(procs)
