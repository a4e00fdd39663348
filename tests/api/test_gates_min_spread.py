"""``GateParams.min_spread``: the z-score's floor on the spread,
``z = (c − μ)/(max(σ, min_spread) + 1e-8)`` in ``"causal"``, ``"sequence"`` and ``"batch"``.

The kernel equals the plain reference with a floor (tests/api/test_gates.py draws
``min_spread`` in its ``gate_params`` strategy; here the floors that bind); a floor of 0
is the mapping without one, bit for bit; a row that varies by less than the floor stays
near the midpoint gate, within the bound the sigmoid's slope (≤ 1/4) gives."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import comppo_core as cc
from comppo_core import GateParams, _core, reference
from comppo_core.testing.strategies import ConcentrationBatch, concentration_batches

Z_MODES = ("causal", "sequence", "batch")


def _tolerance(dtype: np.dtype) -> dict[str, float]:
    return {"rtol": 1e-9, "atol": 1e-12} if dtype == np.float64 else {"rtol": 0.0, "atol": 1e-5}


@given(
    batch=concentration_batches(dtypes=["float32", "float64"]),
    normalize=st.sampled_from(Z_MODES),
    floor=st.floats(1e-3, 10.0),
    sharpness=st.floats(-5.0, 5.0),
)
def test_floored_kernel_equals_reference(
    batch: ConcentrationBatch, normalize: str, floor: float, sharpness: float
) -> None:
    """Padded and packed layouts, float32 (the moments of whiten) and float64, against the
    reference, with floors from below the grid's smallest spread to above its largest."""
    p = GateParams(low=0.0, high=1.0, sharpness=sharpness, normalize=normalize, min_spread=floor)
    got = cc.gates_from_concentration(batch.conc, mask=batch.mask, params=p)
    want = reference.gates_from_concentration(batch.conc, mask=batch.mask, params=p)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **_tolerance(batch.dtype))
    packed = cc.gates_from_concentration(
        batch.pack(batch.conc), mask=batch.packed_mask, cu_seqlens=batch.cu_seqlens, params=p
    )
    np.testing.assert_array_equal(batch.unpack(packed, fill=1.0), got)


@given(batch=concentration_batches(dtypes=["float32", "float64"], junk=False), normalize=st.sampled_from(Z_MODES))
def test_a_floor_below_every_spread_changes_no_bit(batch: ConcentrationBatch, normalize: str) -> None:
    """``max(σ, f) = σ`` exactly when f ≤ σ: a floor under every spread the mapping divides
    by (the grid's are 0 or ≥ ~3e-4) gives the gates of no floor, and of a zero floor, bit for
    bit; the binding without ``min_spread`` is the zero floor."""
    base = GateParams(low=0.2, high=0.9, sharpness=2.0, normalize=normalize)
    none = cc.gates_from_concentration(batch.conc, mask=batch.mask, params=base)
    for floor in (0.0, 1e-7):
        p = dataclasses.replace(base, min_spread=floor)
        assert cc.gates_from_concentration(batch.conc, mask=batch.mask, params=p).tobytes() == none.tobytes()
    c, m = np.ascontiguousarray(batch.conc), np.ascontiguousarray(batch.valid)
    old = _core.gates_from_concentration(c, m, None, 0.2, 0.9, 2.0, normalize, 0.0, 1.0, False)
    zero = _core.gates_from_concentration(c, m, None, 0.2, 0.9, 2.0, normalize, 0.0, 1.0, False, 0.0)
    assert old is not None and zero is not None and old.tobytes() == zero.tobytes()
    assert old.tobytes() == cc.gates_from_concentration(batch.conc, mask=batch.valid, params=base).tobytes()


@pytest.mark.parametrize("normalize", Z_MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("packed", [False, True])
def test_a_row_that_barely_varies_stays_near_the_midpoint(normalize: str, dtype: type, packed: bool) -> None:
    """Concentration like a random-init model's (values ~1e-4 that vary by ~6e-5): with no
    floor the z-score spreads the gates over most of the range; with a floor ``f`` above the
    row's range ``r`` every ``|c − μ| ≤ r``, so ``|z| ≤ r/f`` and, the sigmoid's slope being at
    most 1/4, ``|g − mid| ≤ (high − low)·|sharpness|·r/(4f)``."""
    rng = np.random.default_rng(0)
    conc = (8e-5 + 6e-5 * rng.random((4, 40))).astype(dtype)
    mask = np.ones(conc.shape, dtype=bool)
    mask[1, 30:] = False
    low, high, sharpness, floor = 0.5, 1.0, 3.0, 0.01
    mid = low + (high - low) / 2

    def gates(p: GateParams) -> np.ndarray:
        if packed:
            lengths = mask.sum(1)
            cu = np.concatenate([[0], np.cumsum(lengths)])
            flat = np.concatenate([conc[b, :n] for b, n in enumerate(lengths)])
            return cc.gates_from_concentration(flat, cu_seqlens=cu, params=p).astype(np.float64)
        return cc.gates_from_concentration(conc, mask=mask, params=p)[mask].astype(np.float64)

    p = GateParams(low=low, high=high, sharpness=sharpness, normalize=normalize)
    spread = gates(p)
    assert spread.max() - spread.min() > 0.5 * (high - low)  # the z-score alone: most of the range
    floored = gates(dataclasses.replace(p, min_spread=floor))
    r = float(conc[mask].max() - conc[mask].min())  # ≥ every row's range (and the batch's)
    bound = (high - low) * sharpness * r / (4 * floor)
    assert bound < 0.005
    slack = 1e-12 if dtype == np.float64 else 1e-6
    assert np.abs(floored - mid).max() <= bound + slack
    # the reference agrees
    want = reference.gates_from_concentration(conc, mask=mask, params=dataclasses.replace(p, min_spread=floor))
    np.testing.assert_allclose(floored, want[mask] if not packed else want[mask], **_tolerance(np.dtype(dtype)))


def test_a_floor_keeps_a_strong_signal_and_scales_with_the_units() -> None:
    """A floor below a row's spread leaves it alone; the floor is in the concentration's
    units: scaling ``c`` and ``min_spread`` by the same power of two changes no gate."""
    c = np.array([[0.1, 0.4, 0.2, 0.9, 0.3]])
    for normalize in Z_MODES:
        p = GateParams(low=0.0, high=1.0, normalize=normalize)
        sequence_sigma = float(c.std())
        if normalize != "causal":  # causal: the first prefixes' σ are smaller than the row's
            np.testing.assert_array_equal(
                cc.gates_from_concentration(c, params=dataclasses.replace(p, min_spread=0.5 * sequence_sigma)),
                cc.gates_from_concentration(c, params=p),
            )
        for floor in (0.05, 0.3, 2.0):
            a = cc.gates_from_concentration(c, params=dataclasses.replace(p, min_spread=floor))
            b = cc.gates_from_concentration(c * 8.0, params=dataclasses.replace(p, min_spread=floor * 8.0))
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)  # ε = 1e-8 does not scale


def test_none_ignores_the_floor_and_flat_rows_stay_at_the_midpoint() -> None:
    c = np.array([[0.1, 0.4, 0.2], [0.5, 0.5, 0.5]])
    fixed = GateParams(normalize="none", center=0.2, scale=0.1)
    np.testing.assert_array_equal(
        cc.gates_from_concentration(c, params=dataclasses.replace(fixed, min_spread=3.0)),
        cc.gates_from_concentration(c, params=fixed),
    )
    for normalize in Z_MODES:
        g = cc.gates_from_concentration(c, params=GateParams(low=0.2, high=0.6, normalize=normalize, min_spread=1.0))
        if normalize != "batch":
            np.testing.assert_array_equal(g[1], np.full(3, 0.4))


def test_avx2_and_baseline_builds_agree_with_a_floor() -> None:
    """The floored loops of the causal blocks and of the row z-scores give the same bits on
    the AVX2 path and the baseline (COMPPO_DISABLE_AVX2=1), as tests/api/test_threads.py
    checks for the mapping without a floor."""
    script = (
        "import numpy as np, comppo_core as cc, sys\n"
        "rng = np.random.default_rng(5)\n"
        "m = rng.random((16, 300)) < 0.8\n"
        "c = (1e-4 * rng.random((16, 300)) + np.linspace(0, 0.3, 300) * (rng.random((16, 1)) < 0.5))\n"
        "out = b''\n"
        "for dt in (np.float32, np.float64):\n"
        "    for n in ('causal', 'sequence', 'batch'):\n"
        "        for f in (0.0, 0.01):\n"
        "            p = cc.GateParams(low=0.3, sharpness=2.0, normalize=n, min_spread=f)\n"
        "            out += cc.gates_from_concentration(c.astype(dt), mask=m, params=p).tobytes()\n"
        "sys.stdout.buffer.write(out)\n"
    )
    outs = []
    for disable in ("0", "1"):
        env = {**__import__("os").environ, "COMPPO_DISABLE_AVX2": disable}
        outs.append(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, check=True).stdout)
    assert len(outs[0]) == 16 * 300 * (4 + 8) * 6
    assert outs[0] == outs[1]
