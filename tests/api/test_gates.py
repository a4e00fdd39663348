"""Gate mapping, concentration → retention gate (docs/design.md §4): kernel == reference for the
four normalizations, both layouts, the range/mask/invert/constant properties, causality of
the default ("causal"), and worked examples."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import comppo_core as cc
from comppo_core import GateParams, reference
from comppo_core.options import NORMALIZE_MODES
from comppo_core.testing.strategies import ConcentrationBatch, assert_unchanged, concentration_batches


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


@st.composite
def gate_params(draw: st.DrawFn) -> GateParams:
    a = draw(st.one_of(st.sampled_from([0.0, 1.0, 0.9]), st.floats(0.0, 1.0)))
    b = draw(st.one_of(st.sampled_from([0.0, 1.0, a]), st.floats(0.0, 1.0)))
    low, high = min(a, b), max(a, b)
    return GateParams(
        low=low,
        high=high,
        sharpness=draw(st.one_of(st.sampled_from([0.0, 1.0, -1.0]), st.floats(-5.0, 5.0))),
        normalize=draw(st.sampled_from(NORMALIZE_MODES)),
        center=draw(st.floats(-5.0, 5.0)),
        scale=draw(st.one_of(st.just(1.0), st.floats(0.1, 10.0))),
        invert=draw(st.booleans()),
        # the z-score's floor on σ: none, one below or near the grid's spreads (1e-3 … 10), or one above
        min_spread=draw(st.one_of(st.just(0.0), st.sampled_from([1e-3, 0.5, 20.0]), st.floats(0.0, 5.0))),
    )


def gate_tolerance(dtype: np.dtype) -> dict[str, float]:
    """The kernel sums sequentially in f64, the reference uses NumPy's pairwise mean/std."""
    if dtype == np.float64:
        return {"rtol": 1e-9, "atol": 1e-12}
    if dtype == np.float32:
        return {"rtol": 0.0, "atol": 1e-5}
    return {"rtol": 0.0, "atol": 2e-3}  # float16: computed in float32, one f16 ulp near 1


@given(batch=concentration_batches(), params=gate_params())
def test_gates_match_reference_both_layouts(batch: ConcentrationBatch, params: GateParams) -> None:
    before = [batch.conc.copy(), None if batch.mask is None else batch.mask.copy()]
    got = cc.gates_from_concentration(batch.conc, mask=batch.mask, params=params)
    want = reference.gates_from_concentration(batch.conc, mask=batch.mask, params=params)
    assert got.dtype == want.dtype == batch.dtype and got.shape == batch.conc.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **gate_tolerance(batch.dtype))

    # masked positions get exactly 1; valid ones lie in [low, high]
    assert (got[~batch.valid] == 1).all()
    valid = got[batch.valid].astype(np.float64)
    low, high = params.low, params.high
    slack = 0.0 if batch.dtype == np.float64 else 1e-3
    assert ((valid >= low - slack) & (valid <= high + slack)).all()
    if low == high and batch.dtype == np.float64:
        assert (valid == low).all()

    packed = cc.gates_from_concentration(
        batch.pack(batch.conc),
        mask=batch.packed_mask,
        cu_seqlens=batch.cu_seqlens,
        params=params,
    )
    assert packed.dtype == batch.dtype
    # positions beyond a row's length are padding in the padded layout: gate 1 there
    np.testing.assert_array_equal(batch.unpack(packed, fill=1.0), got)
    assert_unchanged(before, [batch.conc, batch.mask])


@given(batch=concentration_batches(dtypes="float16"), params=gate_params())
def test_gates_float16(batch: ConcentrationBatch, params: GateParams) -> None:
    got = cc.gates_from_concentration(batch.conc, mask=batch.mask, params=params)
    want = reference.gates_from_concentration(batch.conc, mask=batch.mask, params=params)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **gate_tolerance(np.dtype(np.float16)))


@given(batch=concentration_batches(dtypes="float64"), params=gate_params())
def test_invert_is_negated_z(batch: ConcentrationBatch, params: GateParams) -> None:
    """invert=True maps c to the gate of the mirrored statistic: g(c; invert) == g(−c)
    for the z-score normalizations, and == g(2·center − c) for "none"."""
    params = dataclasses.replace(params, invert=False)
    inverted = dataclasses.replace(params, invert=True)
    inv = cc.gates_from_concentration(batch.conc, mask=batch.mask, params=inverted)
    if params.normalize == "none":
        mirrored = 2.0 * params.center - batch.conc
    else:
        mirrored = -batch.conc
    mirrored = np.where(batch.valid, mirrored, 0.0)
    want = cc.gates_from_concentration(mirrored, mask=batch.mask, params=params)
    np.testing.assert_allclose(inv, want, rtol=1e-9, atol=1e-12)


@given(
    batch=concentration_batches(dtypes="float64", junk=False),
    shift=st.integers(-5, 5),
    normalize=st.sampled_from(["causal", "sequence"]),
)
def test_row_normalizations_are_shift_invariant(batch: ConcentrationBatch, shift: int, normalize: str) -> None:
    """Per-row (and running per-row) z-scores do not change under c → c + shift; rows are
    independent."""
    p = GateParams(sharpness=3.0, low=0.0, high=1.0, normalize=normalize)
    g = cc.gates_from_concentration(batch.conc, mask=batch.mask, params=p)
    g2 = cc.gates_from_concentration(batch.conc + shift, mask=batch.mask, params=p)
    # c + shift rounds by ~1e-15 while every non-flat row has σ >= ~3e-4 (1/1000 grid)
    np.testing.assert_allclose(g, g2, rtol=0, atol=1e-9)
    # a row's gates do not depend on the other rows
    for b in range(batch.conc.shape[0]):
        row_mask = None if batch.mask is None else batch.mask[b : b + 1]
        alone = cc.gates_from_concentration(batch.conc[b : b + 1], mask=row_mask, params=p)
        np.testing.assert_array_equal(alone[0], g[b])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("packed", [False, True])
def test_gates_worked_example(dtype: type, packed: bool) -> None:
    c = np.array([[1.0, 2.0, 3.0], [4.0, 4.0, 4.0], [5.0, 0.0, 0.0]], dtype=dtype)
    m = np.array([[1, 1, 1], [1, 1, 1], [1, 0, 0]], dtype=np.int8)
    kw: dict[str, object] = {"mask": m}
    if packed:
        kw = {"mask": m.reshape(-1), "cu_seqlens": np.array([0, 3, 6, 9])}
        c = c.reshape(-1)

    def run(**p: object) -> np.ndarray:
        out = cc.gates_from_concentration(c, **kw, params=GateParams(**p))  # type: ignore[arg-type]
        assert out.dtype == dtype
        return out.reshape(3, 3).astype(np.float64)

    tol = {"rtol": 1e-12, "atol": 0} if dtype == np.float64 else {"rtol": 1e-6, "atol": 0}
    # Default bounds: low=0.9, high=1, sharpness=1; the whole-row z-score, normalize="sequence".
    # row 0: μ = 2, σ = sqrt(((−1)² + 0² + 1²)/3) = sqrt(2/3) = 0.81649658...
    #        z = ±1/(σ + 1e-8) = ±1.2247448...;  g = 0.9 + 0.1·sigmoid(z)
    #        = [0.9 + 0.1·0.2271025, 0.95, 0.9 + 0.1·0.7728975]
    # row 1: zero spread → z = 0 → g = 0.9 + 0.1·0.5 = 0.95
    # row 2: one valid token → z = 0 → 0.95; masked positions → 1
    g = run(normalize="sequence")
    np.testing.assert_allclose(g[0], [0.9227102522068589, 0.95, 0.9772897477931412], **tol)
    sigma = math.sqrt(2.0 / 3.0)
    np.testing.assert_allclose(g[0, 0], 0.9 + 0.1 * sigmoid(-1.0 / (sigma + 1e-8)), **tol)
    np.testing.assert_allclose(g[1], [0.95, 0.95, 0.95], **tol)
    np.testing.assert_allclose(g[2, 0], 0.95, **tol)
    np.testing.assert_array_equal(g[2, 1:], [1.0, 1.0])

    # the default, normalize="causal": z_t over the row's valid tokens up to t
    # row 0: t=0 one token → 0; t=1: [1, 2], μ = 1.5, σ = 0.5 → z = 0.5/(0.5 + 1e-8);
    #        t=2: [1, 2, 3], μ = 2, σ = sqrt(2/3) → z = 1/(σ + 1e-8)
    # row 1: every prefix has zero spread → 0.95; row 2: one valid token → 0.95
    gd = run()
    want_causal = [0.95, 0.9 + 0.1 * sigmoid(0.5 / (0.5 + 1e-8)), 0.9 + 0.1 * sigmoid(1.0 / (sigma + 1e-8))]
    np.testing.assert_allclose(gd[0], want_causal, **tol)
    np.testing.assert_allclose(gd[0], [0.95, 0.9731058574697766, 0.9772897477931412], **tol)
    np.testing.assert_allclose(gd[1], [0.95, 0.95, 0.95], **tol)
    np.testing.assert_allclose(gd[2, 0], 0.95, **tol)
    np.testing.assert_array_equal(gd[2, 1:], [1.0, 1.0])
    np.testing.assert_array_equal(gd, run(normalize="causal"))

    # normalize="none", center=2, scale=0.5, sharpness=2, low=0, high=1:
    # z = (c − 2)/0.5;  g = sigmoid(2·z)
    # row 0: z = [−2, 0, 2] → [σ(−4), 0.5, σ(4)];  row 1: z = 4 → σ(8);  row 2: z = 6 → σ(12), masked 1
    p = {"normalize": "none", "center": 2.0, "scale": 0.5, "sharpness": 2.0, "low": 0.0, "high": 1.0}
    g = run(**p)
    np.testing.assert_allclose(g[0], [sigmoid(-4.0), 0.5, sigmoid(4.0)], **tol)
    np.testing.assert_allclose(g[1], [sigmoid(8.0)] * 3, **tol)
    np.testing.assert_allclose(g[2, 0], sigmoid(12.0), **tol)
    np.testing.assert_array_equal(g[2, 1:], [1.0, 1.0])
    # invert flips the sign of z: row 0 → [σ(4), 0.5, σ(−4)]
    gi = run(**p, invert=True)
    np.testing.assert_allclose(gi[0], [sigmoid(4.0), 0.5, sigmoid(-4.0)], **tol)
    np.testing.assert_allclose(gi[1], [sigmoid(-8.0)] * 3, **tol)
    np.testing.assert_array_equal(gi[2, 1:], [1.0, 1.0])

    # normalize="batch": μ, σ over the 7 valid tokens [1, 2, 3, 4, 4, 4, 5]
    vals = np.array([1.0, 2, 3, 4, 4, 4, 5])
    mu, sd = vals.mean(), vals.std()
    gb = run(normalize="batch", low=0.0, high=1.0)
    want_b = [sigmoid((x - mu) / (sd + 1e-8)) for x in [1.0, 2.0, 3.0, 4.0, 4.0, 4.0, 5.0]]
    np.testing.assert_allclose(gb[m.reshape(3, 3) != 0], want_b, **tol)

    # low == high: a constant gate at every valid token
    gc = run(low=0.7, high=0.7)
    np.testing.assert_array_equal(gc[m.reshape(3, 3) != 0], np.full(7, dtype(0.7)))


def test_gates_defaults_are_documented_values() -> None:
    c = np.array([[0.0, 10.0]])
    g = cc.gates_from_concentration(c)
    documented = GateParams(
        low=0.9, high=1.0, sharpness=1.0, normalize="causal", center=0.0, scale=1.0, invert=False, min_spread=0.0
    )
    assert GateParams() == documented
    np.testing.assert_array_equal(g, cc.gates_from_concentration(c, params=documented))
    np.testing.assert_array_equal(g, cc.gates_from_concentration(c, params=None))
    assert 0.9 <= g.min() and g.max() <= 1.0


def test_gates_no_valid_tokens_and_empty() -> None:
    c = np.array([[3.0, np.nan], [np.inf, 1.0]])
    m = np.zeros((2, 2), dtype=bool)
    for normalize in NORMALIZE_MODES:
        np.testing.assert_array_equal(
            cc.gates_from_concentration(c, mask=m, params=GateParams(normalize=normalize)), np.ones((2, 2))
        )
    assert cc.gates_from_concentration(np.zeros((0, 3))).shape == (0, 3)
    assert cc.gates_from_concentration(np.zeros(0), cu_seqlens=[0, 0]).shape == (0,)


def test_gates_nan_at_masked_position_is_fine() -> None:
    c = np.array([[1.0, np.nan, 3.0, -np.inf]])
    m = np.array([[1, 0, 1, 0]])
    p = GateParams(low=0.0, high=1.0)
    g = cc.gates_from_concentration(c, mask=m, params=p)
    want = reference.gates_from_concentration(c, mask=m, params=p)
    np.testing.assert_allclose(g, want, rtol=1e-12)
    assert g[0, 1] == 1.0 and g[0, 3] == 1.0


@pytest.mark.parametrize(
    "conc",
    [
        [[1e308, 1e308]],  # zero spread: midpoint gate; the f64 row sum overflows
        [[1.7e308, 1.7e308, 1.0]],
        [[-1e308, -1e308, -1e308]],
    ],
)
@pytest.mark.parametrize("normalize", NORMALIZE_MODES)
def test_huge_finite_concentration_never_panics(conc: list[list[float]], normalize: str) -> None:
    """Finite inputs whose running sum overflows must not crash the kernel (docs/design.md §8:
    no Rust panic ever reaches Python); the zero-spread row gets the midpoint gate."""
    c = np.array(conc)
    try:
        g = cc.gates_from_concentration(c, params=GateParams(normalize=normalize))
    except cc.ComppoError:
        return  # a clear package error would also honour the contract
    except BaseException as e:  # pyo3's PanicException derives from BaseException
        pytest.fail(f"gates_from_concentration({conc}) raised {type(e).__name__}: {e}")
    assert np.isfinite(g).all() and ((g >= 0.9) & (g <= 1.0)).all()
    if len(set(conc[0])) == 1 and normalize != "none":
        np.testing.assert_allclose(
            g, reference.gates_from_concentration(c, params=GateParams(normalize=normalize)), rtol=1e-12
        )


@pytest.mark.parametrize("fn", [cc.gates_from_concentration, reference.gates_from_concentration])
@pytest.mark.parametrize("keyword", ["low", "high", "sharpness", "normalize", "center", "scale", "invert"])
def test_the_mapping_is_one_value(fn: object, keyword: str) -> None:
    """The seven loose keywords are gone (0.2): the mapping is ``params=GateParams(...)``."""
    c = np.array([[1.0, 2.0]])
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
        fn(c, **{keyword: GateParams().as_kwargs()[keyword]})  # type: ignore[operator]
    with pytest.raises(cc.ParameterError, match="^params: expected a comppo_core.GateParams, got dict") as info:
        fn(c, params={"low": 0.5})  # type: ignore[operator]
    assert info.value.argument == "params"


@given(
    batch=concentration_batches(dtypes=["float32", "float64"]),
    params=gate_params(),
    data=st.data(),
)
def test_causal_gates_ignore_the_future(batch: ConcentrationBatch, params: GateParams, data: st.DataObject) -> None:
    """normalize="causal": changing the concentration (and the mask) from column k on moves no
    gate before column k, bit for bit, in both layouts."""
    params = dataclasses.replace(params, normalize="causal")
    b, t = batch.shape
    k = data.draw(st.integers(0, t), label="k")
    later = batch.conc.copy()
    later[:, k:] = data.draw(
        hnp.arrays(batch.dtype, (b, t - k), elements=st.floats(-1e6, 1e6, width=8 * batch.dtype.itemsize)),
        label="new values",
    )
    mask = batch.mask
    later_mask = None
    if mask is not None:
        later_mask = mask.copy()
        later_mask[:, k:] = data.draw(hnp.arrays(np.bool_, (b, t - k)), label="new mask")
    g = cc.gates_from_concentration(batch.conc, mask=mask, params=params)
    g2 = cc.gates_from_concentration(later, mask=later_mask, params=params)
    np.testing.assert_array_equal(g2[:, :k], g[:, :k])
    want = reference.gates_from_concentration(later, mask=later_mask, params=params)
    np.testing.assert_allclose(g2.astype(np.float64), want.astype(np.float64), **gate_tolerance(batch.dtype))

    # packed: the same rows, cut at each row's length; offsets < k inside a sequence stay put
    pm = None if mask is None else batch.packed_mask
    pm2 = None if later_mask is None else batch.pack(later_mask)
    gp = cc.gates_from_concentration(batch.pack(batch.conc), mask=pm, cu_seqlens=batch.cu_seqlens, params=params)
    gp2 = cc.gates_from_concentration(batch.pack(later), mask=pm2, cu_seqlens=batch.cu_seqlens, params=params)
    np.testing.assert_array_equal(batch.unpack(gp2, fill=1.0)[:, :k], batch.unpack(gp, fill=1.0)[:, :k])
    np.testing.assert_array_equal(batch.unpack(gp, fill=1.0), g)


def test_causal_differs_from_sequence_and_reads_the_prefix() -> None:
    """The whole-row z-score of token 0 reads the tokens after it; the causal one does not."""
    c = np.array([[1.0, 2.0, 3.0, 10.0]])
    causal = cc.gates_from_concentration(c, params=GateParams(low=0.0, normalize="causal"))
    whole = cc.gates_from_concentration(c, params=GateParams(low=0.0, normalize="sequence"))
    # causal: [0, 1, 1.2247, ...]; the last token is the whole-row one, the earlier are not
    assert causal[0, 0] == 0.5 and not np.isclose(whole[0, 0], 0.5)
    np.testing.assert_allclose(causal[0, -1], whole[0, -1], rtol=1e-15)
    c2 = c.copy()
    c2[0, 3] = -50.0
    assert (
        cc.gates_from_concentration(c2, params=GateParams(low=0.0, normalize="sequence"))[0, :3] != whole[0, :3]
    ).all()
    np.testing.assert_array_equal(
        cc.gates_from_concentration(c2, params=GateParams(low=0.0, normalize="causal"))[0, :3], causal[0, :3]
    )


def test_causal_running_statistics_keep_their_precision() -> None:
    """Values far from 0 (1e9 + steps of 1/4): the running statistics are Welford's, so the
    z-scores match those of the centered values (a running Σc² − (Σc)²/n would be off by
    ~1e2 in n·σ²)."""
    rng = np.random.default_rng(5)
    steps = rng.integers(0, 12, size=(3, 500)) * 0.25
    far = cc.gates_from_concentration(1e9 + steps, params=GateParams(low=0.0))
    near = cc.gates_from_concentration(steps, params=GateParams(low=0.0))
    np.testing.assert_allclose(far, near, rtol=0, atol=1e-6)
    np.testing.assert_allclose(near, reference.gates_from_concentration(steps, params=GateParams(low=0.0)), atol=1e-12)


@given(batch=concentration_batches(dtypes=["float32", "float64"], junk=False), params=gate_params())
def test_causal_equals_the_trainers_causal_gates(batch: ConcentrationBatch, params: GateParams) -> None:
    """normalize="causal" is the mapping the trainers use (rl/critics/tac.py ``causal_gates``:
    the row's running z-score, then the sigmoid), on the same inputs; tac.causal_gates
    computes in float64 on differences to the row's first value and returns float32."""
    torch = pytest.importorskip("torch")
    from comppo_core.rl.critics.tac import causal_gates

    params = dataclasses.replace(params, normalize="causal")
    got = cc.gates_from_concentration(batch.conc, mask=batch.mask, params=params).astype(np.float64)
    valid = torch.as_tensor(batch.valid)
    conc = torch.as_tensor(batch.conc)
    for trainers in (params, dataclasses.replace(params, normalize="sequence")):  # tac reads any z-score as running
        want = causal_gates(conc, valid, trainers).numpy().astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
