"""The memory of large outputs (``rust/buffers.rs``): leased from a bounded cache, given
back when the caller frees the output, reused by the next call of the same size; the
outputs stay ordinary, writeable NumPy arrays (and tensors) the caller owns.

The speed this buys (no page faults per call) is measured by ``benches/compare.py``, not
here; these tests pin what the cache must never do: hand out memory still in use, hold
more than its cap, or hold anything when disabled."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import comppo_core as cc
from comppo_core import _core

#: Outputs from this size on go through the cache (``buffers::MIN_BYTES``).
MIN_BYTES = 256 << 10


def _batch(b: int = 64, t: int = 2048) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    mask = np.arange(t)[None, :] < rng.integers(t // 2, t + 1, size=b)[:, None]
    rewards = (rng.standard_normal((b, t)) * mask).astype(np.float32)
    return rewards, rng.standard_normal((b, t)).astype(np.float32), mask


def _held() -> int:
    return _core.buffer_cache()[0]


def test_large_outputs_are_ordinary_writeable_arrays() -> None:
    r, v, m = _batch()
    assert r.nbytes >= MIN_BYTES
    adv, ret = cc.gae(r, v, mask=m, lam=0.9)
    for a in (adv, ret):
        assert type(a) is np.ndarray and a.dtype == np.float32 and a.shape == r.shape
        assert a.flags.c_contiguous and a.flags.aligned and a.flags.writeable
        assert a.ctypes.data % 64 == 0
    adv[0, 0] = 7.0
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(adv)), adv)
    np.testing.assert_array_equal(ret, cc.reference.gae(r, v, mask=m, lam=0.9)[1].astype(np.float32))


def test_a_freed_output_is_given_back_and_reused() -> None:
    r, v, m = _batch()
    adv = cc.td_targets(r, v, mask=m)
    address, before = adv.ctypes.data, _held()
    del adv
    gc.collect()
    assert _held() >= before + r.nbytes
    again = cc.td_targets(r, v, mask=m)
    assert again.ctypes.data == address  # the most recently given back block of its size
    np.testing.assert_array_equal(again, cc.reference.td_targets(r, v, mask=m).astype(np.float32))


def test_memory_in_use_is_never_handed_out_again() -> None:
    """An output, a view of it, or a tensor made from it keeps its memory: later calls
    get other memory, and the values stay as they were."""
    r, v, m = _batch()
    first = cc.gae(r, v, mask=m, lam=0.9)
    view = first.advantages[3:]
    kept = {"view": view.copy(), "returns": first.returns.copy()}
    del first  # the advantages array itself goes; its view keeps the memory
    gc.collect()
    holders = [view]
    try:
        import torch

        tensor = torch.from_numpy(cc.gae(r, v, mask=m, lam=0.5).returns)
        kept["tensor"] = tensor.numpy().copy()
        holders.append(tensor.numpy())
    except ImportError:  # pragma: no cover - torch is optional
        tensor = None
    addresses = {h.ctypes.data for h in holders}
    for _ in range(4):
        out = cc.gae(r, v, mask=m, gamma=0.5, lam=0.1)
        assert not {out.advantages[3:].ctypes.data, out.returns.ctypes.data} & addresses
        out.advantages[...] = -1.0
        out.returns[...] = -1.0
        del out
    np.testing.assert_array_equal(view, kept["view"])
    if tensor is not None:
        np.testing.assert_array_equal(tensor.numpy(), kept["tensor"])


def test_small_outputs_are_left_to_numpy() -> None:
    r, v, m = _batch(4, 64)
    before = _held()
    out = cc.td_targets(r, v, mask=m)
    del out
    gc.collect()
    assert _held() == before


def _child(env: str | None, code: str) -> str:
    environ = dict(os.environ)
    environ.pop(_core.BUFFER_CACHE_ENV, None)
    if env is not None:
        environ[_core.BUFFER_CACHE_ENV] = env
    done = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


CHILD = """
import gc, numpy as np, comppo_core as cc
from comppo_core import _core
r = np.ones((64, 8192), np.float32)
for _ in range(3):
    a, b = cc.gae(r, r)
    owns = a.flags.owndata
    del a, b
    gc.collect()
held, cap = _core.buffer_cache()
print(held, cap, owns)
"""


@pytest.mark.parametrize(
    "env, check",
    [
        (None, lambda held, cap, owns: cap == 256 << 20 and held == 2 * 64 * 8192 * 4 and not owns),
        ("0", lambda held, cap, owns: cap == 0 and held == 0 and owns),  # disabled: NumPy allocates
        ("3000000", lambda held, cap, owns: cap == 3_000_000 and held == 64 * 8192 * 4),  # room for one block
    ],
)
def test_the_cap_comes_from_the_environment(env: str | None, check: object) -> None:
    held, cap, owns = _child(env, CHILD).split()
    assert check(int(held), int(cap), owns == "True")  # type: ignore[operator]
