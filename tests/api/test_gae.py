"""Comp-GAE advantages and λ-returns (docs/design.md §3): kernel == NumPy reference, the two
layouts agree, worked examples by hand, and the equivalences the design pins down
(g ≡ 1 is verl's GAE, g ≡ c is GAE(γ·c), per-step discount γ·g is rlax's truncated GAE).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tolerance
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import comppo_core as cc
from comppo_core import reference
from comppo_core.testing.strategies import RaggedBatch, assert_unchanged, discounts, ragged_batches


def assert_matches(got: np.ndarray, want: np.ndarray, dtype: np.dtype) -> None:
    assert got.dtype == want.dtype == dtype
    assert got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **tolerance(dtype))


def check_against_reference(batch: RaggedBatch, got: cc.GAEResult, **params: object) -> None:
    r, v, kw = batch.padded()
    want_adv, want_ret = reference.gae(r, v, **kw, **params)  # type: ignore[arg-type]
    assert_matches(got.advantages, want_adv, batch.dtype)
    assert_matches(got.returns, want_ret, batch.dtype)
    # outputs at masked positions are exactly 0
    assert not got.advantages[~batch.valid].any()
    assert not got.returns[~batch.valid].any()


# --------------------------------------------------------------------------- #
# kernel == reference, both layouts
# --------------------------------------------------------------------------- #


@given(
    batch=ragged_batches(),
    gamma=discounts(),
    lam=discounts(),
    lam_critic=st.one_of(st.none(), discounts()),
)
def test_gae_matches_reference_padded(batch: RaggedBatch, gamma: float, lam: float, lam_critic: float | None) -> None:
    before = batch.copies()
    r, v, kw = batch.padded()
    got = cc.gae(r, v, gamma=gamma, lam=lam, lam_critic=lam_critic, **kw)
    assert isinstance(got, cc.GAEResult)
    assert isinstance(got, tuple) and len(got) == 2
    check_against_reference(batch, got, gamma=gamma, lam=lam, lam_critic=lam_critic)
    assert_unchanged(before, batch.arrays())


@given(
    batch=ragged_batches(),
    gamma=discounts(),
    lam=discounts(),
    lam_critic=st.one_of(st.none(), discounts()),
)
def test_gae_packed_matches_padded_and_reference(
    batch: RaggedBatch, gamma: float, lam: float, lam_critic: float | None
) -> None:
    params = {"gamma": gamma, "lam": lam, "lam_critic": lam_critic}
    before = batch.copies()
    r, v, kw = batch.padded()
    padded = cc.gae(r, v, **kw, **params)  # type: ignore[arg-type]
    rp, vp, kwp = batch.packed()
    packed = cc.gae(rp, vp, **kwp, **params)  # type: ignore[arg-type]
    assert packed.advantages.shape == packed.returns.shape == rp.shape
    assert packed.advantages.dtype == batch.dtype
    # same per-row computation in both layouts: bitwise equal
    np.testing.assert_array_equal(batch.unpack(packed.advantages), padded.advantages)
    np.testing.assert_array_equal(batch.unpack(packed.returns), padded.returns)
    want_adv, want_ret = reference.gae(rp, vp, **kwp, **params)  # type: ignore[arg-type]
    assert_matches(packed.advantages, want_adv, batch.dtype)
    assert_matches(packed.returns, want_ret, batch.dtype)
    assert_unchanged(before, batch.arrays())


@given(
    batch=ragged_batches(dtypes="float16"),
    gamma=discounts(),
    lam=discounts(),
    lam_critic=st.one_of(st.none(), discounts()),
)
def test_gae_float16_in_float16_out(batch: RaggedBatch, gamma: float, lam: float, lam_critic: float | None) -> None:
    r, v, kw = batch.padded()
    got = cc.gae(r, v, gamma=gamma, lam=lam, lam_critic=lam_critic, **kw)
    assert got.advantages.dtype == got.returns.dtype == np.float16
    check_against_reference(batch, got, gamma=gamma, lam=lam, lam_critic=lam_critic)
    rp, vp, kwp = batch.packed()
    packed = cc.gae(rp, vp, gamma=gamma, lam=lam, lam_critic=lam_critic, **kwp)
    assert packed.advantages.dtype == np.float16
    np.testing.assert_array_equal(batch.unpack(packed.advantages), got.advantages)
    np.testing.assert_array_equal(batch.unpack(packed.returns), got.returns)


@given(batch=ragged_batches(), gamma=discounts(), lam=discounts(), data=st.data())
def test_masked_rewards_drop_ignores_them(batch: RaggedBatch, gamma: float, lam: float, data: st.DataObject) -> None:
    """With masked_rewards="drop" junk rewards (NaN included) on masked tokens change nothing."""
    junk = data.draw(hnp.arrays(batch.dtype, batch.shape, elements=st.sampled_from([1.0, -3.0, np.nan, np.inf])))
    dirty = batch.rewards.copy()
    dirty[~batch.valid] = junk[~batch.valid]
    _, v, kw = batch.padded()
    got = cc.gae(dirty, v, gamma=gamma, lam=lam, masked_rewards="drop", **kw)
    clean = cc.gae(batch.rewards, v, gamma=gamma, lam=lam, **kw)
    np.testing.assert_array_equal(got.advantages, clean.advantages)
    np.testing.assert_array_equal(got.returns, clean.returns)
    want = reference.gae(dirty, v, gamma=gamma, lam=lam, masked_rewards="drop", **kw)
    assert_matches(got.advantages, want[0], batch.dtype)
    assert_matches(got.returns, want[1], batch.dtype)


@given(batch=ragged_batches(gates=False, junk=False), gamma=discounts(), lam=discounts())
def test_decoupled_lam_critic(batch: RaggedBatch, gamma: float, lam: float) -> None:
    """lam_critic only changes the returns; advantages are those of lam, returns those of
    lam_critic; lam_critic=None means lam_critic=lam."""
    r, v, kw = batch.padded()
    for lam_c in (0.0, 1.0, 0.25):
        both = cc.gae(r, v, gamma=gamma, lam=lam, lam_critic=lam_c, **kw)
        actor = cc.gae(r, v, gamma=gamma, lam=lam, **kw)
        critic = cc.gae(r, v, gamma=gamma, lam=lam_c, **kw)
        np.testing.assert_array_equal(both.advantages, actor.advantages)
        np.testing.assert_array_equal(both.returns, critic.returns)
    same = cc.gae(r, v, gamma=gamma, lam=lam, lam_critic=lam, **kw)
    default = cc.gae(r, v, gamma=gamma, lam=lam, **kw)
    np.testing.assert_array_equal(same.advantages, default.advantages)
    np.testing.assert_array_equal(same.returns, default.returns)


@given(
    lengths=st.lists(st.integers(0, 70), min_size=1, max_size=5),
    runs=st.lists(st.tuples(st.booleans(), st.integers(1, 9)), min_size=1, max_size=30),
    gated=st.booleans(),
    lam_critic=st.sampled_from([None, 0.5]),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_code_path_cuts_rows_the_same_way(
    lengths: list[int], runs: list[tuple[bool, int]], gated: bool, lam_critic: float | None, seed: int
) -> None:
    """The recursion is evaluated over blocks of four positions counted from each row's
    start (rust/gae.rs), so rows long enough to hold blocks give the same bits in every
    layout, for every mask dtype (bool takes the AVX2 block loop, the others the scalar
    loop) and for float64 inputs (whose float64 results, rounded once, are the float32
    results)."""
    B, T = len(lengths), max(lengths) + 3
    rng = np.random.default_rng(seed)
    pattern = np.concatenate([np.full(n, ok) for ok, n in runs])
    valid = np.zeros((B, T), bool)
    for b, n in enumerate(lengths):
        valid[b, :n] = np.resize(pattern, n) if n else []
    # With γ = λ = g = 1 and rewards of ±2^33 in turn (in some rows), the partial sums
    # of the recursion swing between 2^33 and order 1 and round in float64 at a scale
    # that float32 outputs of order 1 show: a path that cut a row differently would
    # give different float32 bits.
    sign = np.where(np.arange(T) % 2 == 0, 1.0, -1.0)[None, :]
    big = 2.0**33 * sign * rng.integers(0, 2, size=(B, 1))
    r = np.where(valid, big + rng.normal(size=(B, T)), 0).astype(np.float32)
    v = rng.uniform(0, 1, size=(B, T)).astype(np.float32)
    g = np.ones((B, T), np.float32) if gated else None
    params = {"gamma": 1.0, "lam": 1.0, "lam_critic": lam_critic}
    base = cc.gae(r, v, mask=valid, gates=g, **params)  # type: ignore[arg-type]
    for dtype in (np.uint8, np.int32, np.float32):
        other = cc.gae(r, v, mask=valid.astype(dtype), gates=g, **params)  # type: ignore[arg-type]
        np.testing.assert_array_equal(other.advantages, base.advantages)
        np.testing.assert_array_equal(other.returns, base.returns)
    wide = cc.gae(
        r.astype(np.float64),
        v.astype(np.float64),
        mask=valid,
        gates=None if g is None else g.astype(np.float64),
        **params,
    )  # type: ignore[arg-type]
    np.testing.assert_array_equal(wide.advantages.astype(np.float32), base.advantages)
    np.testing.assert_array_equal(wide.returns.astype(np.float32), base.returns)
    inside = np.arange(T)[None, :] < np.asarray(lengths)[:, None]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    packed = cc.gae(
        r[inside], v[inside], mask=valid[inside], cu_seqlens=cu, gates=None if g is None else g[inside], **params
    )  # type: ignore[arg-type]
    np.testing.assert_array_equal(packed.advantages, base.advantages[inside])
    np.testing.assert_array_equal(packed.returns, base.returns[inside])


def test_empty_shapes() -> None:
    for shape in [(0, 5), (3, 0), (0, 0)]:
        z = np.zeros(shape)
        adv, ret = cc.gae(z, z, gamma=0.9, lam=0.9)
        assert adv.shape == ret.shape == shape and adv.dtype == np.float64
    z32 = np.zeros(0, dtype=np.float32)
    for cu in ([0], [0, 0, 0]):
        adv, ret = cc.gae(z32, z32, cu_seqlens=np.asarray(cu), last_values=np.zeros(len(cu) - 1))
        assert adv.shape == (0,) and adv.dtype == np.float32


def test_single_token_rows() -> None:
    # T = 1: A = r + γ·g·V_n − V, R = A + V (λ plays no role)
    r = np.array([[1.0], [0.0], [0.5]])
    v = np.array([[0.25], [0.5], [1.0]])
    g = np.array([[1.0], [0.5], [0.0]])
    lv = np.array([1.0, 2.0, 4.0])
    adv, ret = cc.gae(r, v, gates=g, gamma=0.5, lam=0.3, last_values=lv)
    # row 0: 1 + 0.5·1·1 − 0.25 = 1.25;  row 1: 0 + 0.25·2 − 0.5 = 0;  row 2: 0.5 + 0 − 1 = −0.5
    np.testing.assert_array_equal(adv, [[1.25], [0.0], [-0.5]])
    np.testing.assert_array_equal(ret, [[1.5], [0.5], [0.5]])


# --------------------------------------------------------------------------- #
# worked examples, by hand (dyadic numbers: exact in float32 and float64)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("packed", [False, True])
def test_worked_example_three_tokens_with_gates(dtype: type, packed: bool) -> None:
    r = np.array([[0.0, 0.0, 1.0]], dtype=dtype)
    v = np.array([[0.5, 0.25, 0.5]], dtype=dtype)
    g = np.array([[1.0, 0.5, 1.0]], dtype=dtype)
    kw: dict[str, object] = {}
    if packed:
        r, v, g = r[0], v[0], g[0]
        kw["cu_seqlens"] = np.array([0, 3])

    # γ = 0.5, λ = 0.5, terminal (V_3 = 0):
    # i=2: gg = γ·g2 = 0.5   δ2 = 1 + 0.5·0 − 0.5      =  0.5      A2 = 0.5
    #                                                                  R2 = 0.5 + 0.5 = 1.0
    # i=1: gg = γ·g1 = 0.25  δ1 = 0 + 0.25·0.5 − 0.25  = −0.125
    #      A1 = δ1 + gg·λ·A2 = −0.125 + 0.125·0.5      = −0.0625   R1 = −0.0625 + 0.25 = 0.1875
    # i=0: gg = γ·g0 = 0.5   δ0 = 0 + 0.5·0.25 − 0.5   = −0.375
    #      A0 = δ0 + gg·λ·A1 = −0.375 + 0.25·(−0.0625) = −0.390625 R0 = −0.390625 + 0.5 = 0.109375
    adv, ret = cc.gae(r, v, gates=g, gamma=0.5, lam=0.5, **kw)  # type: ignore[arg-type]
    assert adv.dtype == ret.dtype == dtype
    np.testing.assert_array_equal(adv.reshape(-1), [-0.390625, -0.0625, 0.5])
    np.testing.assert_array_equal(ret.reshape(-1), [0.109375, 0.1875, 1.0])

    # γ = 1, λ = 0.5, λ_critic = 1:
    # i=2: gg = 1     δ2 = 1 + 0 − 0.5 = 0.5              A2 = 0.5        A^c2 = 0.5    R2 = 1.0
    # i=1: gg = 0.5   δ1 = 0 + 0.5·0.5 − 0.25 = 0
    #      A1 = 0 + (0.5·0.5)·0.5 = 0.125;   A^c1 = 0 + (0.5·1)·0.5 = 0.25;   R1 = 0.25 + 0.25 = 0.5
    # i=0: gg = 1     δ0 = 0 + 1·0.25 − 0.5 = −0.25
    #      A0 = −0.25 + (1·0.5)·0.125 = −0.1875;  A^c0 = −0.25 + 1·0.25 = 0;  R0 = 0 + 0.5 = 0.5
    adv, ret = cc.gae(r, v, gates=g, gamma=1.0, lam=0.5, lam_critic=1.0, **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(adv.reshape(-1), [-0.1875, 0.125, 0.5])
    np.testing.assert_array_equal(ret.reshape(-1), [0.5, 0.5, 1.0])

    # the kernel and the oracle agree exactly on this example
    want = reference.gae(r, v, gates=g, gamma=1.0, lam=0.5, lam_critic=1.0, **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(adv, want[0])
    np.testing.assert_array_equal(ret, want[1])


@pytest.mark.parametrize("mask_dtype", [np.bool_, np.int64, np.float32, np.int16])
@pytest.mark.parametrize("packed", [False, True])
def test_worked_example_multi_turn_observation_span(mask_dtype: type, packed: bool) -> None:
    # positions 2, 3 are an observation (tool output) inside the response: skipped.
    r = np.array([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    v = np.array([[0.5, 0.5, 9.0, 9.0, 0.25, 0.75]])
    m = np.array([[1, 1, 0, 0, 1, 1]], dtype=mask_dtype)
    kw: dict[str, object] = {"mask": m}
    if packed:
        r, v = r[0], v[0]
        kw = {"mask": m[0], "cu_seqlens": np.array([0, 6], dtype=np.int32)}
    # γ = 1, λ = 0.5; valid positions 0, 1, 4, 5 (V = 0.5, 0.5, 0.25, 0.75), V_n = 0:
    # i=5: δ = 1 + 0 − 0.75 = 0.25          A5 = 0.25                    R5 = 0.25 + 0.75 = 1.0
    # i=4: δ = 0 + 0.75 − 0.25 = 0.5        A4 = 0.5 + 0.5·0.25 = 0.625  R4 = 0.625 + 0.25 = 0.875
    # i=1: δ = 0 + 0.25 − 0.5 = −0.25       (V_{i+1} is V4: the recursion jumps over 2, 3)
    #                                       A1 = −0.25 + 0.5·0.625 = 0.0625   R1 = 0.5625
    # i=0: δ = 0 + 0.5 − 0.5 = 0            A0 = 0 + 0.5·0.0625 = 0.03125     R0 = 0.53125
    # masked positions 2, 3: A = R = 0 (their V = 9 is never read).
    adv, ret = cc.gae(r, v, gamma=1.0, lam=0.5, **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(adv.reshape(-1), [0.03125, 0.0625, 0, 0, 0.625, 0.25])
    np.testing.assert_array_equal(ret.reshape(-1), [0.53125, 0.5625, 0, 0, 0.875, 1.0])
    # one-step targets y = r + γ·V_next:  y0 = 0 + 0.5 = 0.5,  y1 = 0 + V4 = 0.25,
    # y4 = 0 + V5 = 0.75,  y5 = 1 + 0 = 1.0
    y = cc.td_targets(r, v, gamma=1.0, **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(y.reshape(-1), [0.5, 0.25, 0, 0, 0.75, 1.0])


@pytest.mark.parametrize("packed", [False, True])
def test_worked_example_truncated_with_last_values(packed: bool) -> None:
    r = np.array([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    v = np.array([[0.5, 0.5, 7.0], [0.5, 0.5, 7.0]])
    m = np.array([[1, 1, 0], [1, 1, 0]], dtype=bool)
    lv = np.array([2.0, 0.0])
    kw: dict[str, object] = {"mask": m, "last_values": lv}
    if packed:
        r, v = r.reshape(-1), v.reshape(-1)
        kw = {"mask": m.reshape(-1), "last_values": lv, "cu_seqlens": np.array([0, 3, 6])}
    # γ = 0.5, λ = 0.5. Position 2 is padding; the row's last valid token is position 1.
    # row 0 (truncated, V_n = 2):
    #   i=1: δ = 1 + 0.5·2 − 0.5 = 1.5        A1 = 1.5                      R1 = 2.0
    #   i=0: δ = 0 + 0.5·0.5 − 0.5 = −0.25    A0 = −0.25 + 0.25·1.5 = 0.125 R0 = 0.625
    # row 1 (V_n = 0, i.e. terminal):
    #   i=1: δ = 1 + 0 − 0.5 = 0.5            A1 = 0.5                      R1 = 1.0
    #   i=0: δ = −0.25                        A0 = −0.25 + 0.25·0.5 = −0.125 R0 = 0.375
    adv, ret = cc.gae(r, v, gamma=0.5, lam=0.5, **kw)  # type: ignore[arg-type]
    np.testing.assert_array_equal(adv.reshape(2, 3), [[0.125, 1.5, 0], [-0.125, 0.5, 0]])
    np.testing.assert_array_equal(ret.reshape(2, 3), [[0.625, 2.0, 0], [0.375, 1.0, 0]])
    # last_values=None is the same as zeros
    kw0 = dict(kw, last_values=None)
    kwz = dict(kw, last_values=np.zeros(2))
    a0, r0 = cc.gae(r, v, gamma=0.5, lam=0.5, **kw0)  # type: ignore[arg-type]
    az, rz = cc.gae(r, v, gamma=0.5, lam=0.5, **kwz)  # type: ignore[arg-type]
    np.testing.assert_array_equal(a0, az)
    np.testing.assert_array_equal(r0, rz)
    np.testing.assert_array_equal(a0.reshape(2, 3)[1], [-0.125, 0.5, 0])


def test_worked_example_gate_zero_cuts_the_trace() -> None:
    # g1 = 0: position 1 neither bootstraps from V2 nor receives credit from A2.
    r = np.array([[0.0, 0.0, 1.0]])
    v = np.array([[0.5, 0.25, 0.5]])
    g = np.array([[1.0, 0.0, 1.0]])
    # γ = λ = 1:  i=2: δ = 1 − 0.5 = 0.5, A2 = 0.5
    #             i=1: gg = 0: δ = 0 + 0 − 0.25 = −0.25, A1 = −0.25 + 0·A2 = −0.25
    #             i=0: gg = 1: δ = 0 + 0.25 − 0.5 = −0.25, A0 = −0.25 + 1·(−0.25) = −0.5
    adv, ret = cc.gae(r, v, gates=g)
    np.testing.assert_array_equal(adv, [[-0.5, -0.25, 0.5]])
    np.testing.assert_array_equal(ret, [[0.0, 0.0, 1.0]])


# --------------------------------------------------------------------------- #
# equivalences of docs/design.md §3
# --------------------------------------------------------------------------- #


def verl_multi_turn_gae(
    rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """verl's ``compute_gae_advantage_return`` (multi-turn version), without whitening,
    transcribed to NumPy: a backward loop over the columns; masked positions pass the
    running ``nextvalues``/``lastgaelam`` straight through (they are skipped)."""
    B, T = rewards.shape
    m = (mask != 0).astype(np.float64)
    nextvalues = np.zeros(B)
    lastgaelam = np.zeros(B)
    advantages_reversed = []
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * m[:, t] + (1 - m[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * m[:, t] + (1 - m[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = np.stack(advantages_reversed[::-1], axis=1) if T else np.zeros((B, 0))
    returns = advantages + values
    return advantages, returns


def textbook_valid_only_gae(
    rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """The textbook per-row loop over valid positions only (0 elsewhere)."""
    adv = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        next_value, last = 0.0, 0.0
        for t in reversed(range(rewards.shape[1])):
            if not mask[b, t]:
                continue
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            last = delta + gamma * lam * last
            adv[b, t] = last
            next_value = values[b, t]
    return adv, np.where(mask != 0, adv + values, 0.0)


@given(
    batch=ragged_batches(dtypes="float64", gates=False, last_values=False, junk=False),
    gamma=discounts(),
    lam=discounts(),
)
def test_unit_gates_is_standard_gae(batch: RaggedBatch, gamma: float, lam: float) -> None:
    r, v, kw = batch.padded()
    mask = batch.valid
    plain = cc.gae(r, v, gamma=gamma, lam=lam, mask=kw["mask"])
    ones = cc.gae(r, v, gamma=gamma, lam=lam, mask=kw["mask"], gates=np.ones_like(r))
    np.testing.assert_array_equal(ones.advantages, plain.advantages)
    np.testing.assert_array_equal(ones.returns, plain.returns)

    want_adv, want_ret = verl_multi_turn_gae(r, v, mask, gamma, lam)
    np.testing.assert_allclose(plain.advantages[mask], want_adv[mask], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plain.returns[mask], want_ret[mask], rtol=1e-12, atol=1e-12)
    assert not plain.advantages[~mask].any() and not plain.returns[~mask].any()

    tb_adv, tb_ret = textbook_valid_only_gae(r, v, mask, gamma, lam)
    np.testing.assert_allclose(plain.advantages, tb_adv, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(plain.returns, tb_ret, rtol=1e-12, atol=1e-12)


@given(
    batch=ragged_batches(dtypes="float64", gates=False),
    gamma=discounts(),
    lam=discounts(),
    c=st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0)),
)
def test_constant_gates_is_gae_with_discount_gamma_c(batch: RaggedBatch, gamma: float, lam: float, c: float) -> None:
    r, v, kw = batch.padded()
    gated = cc.gae(r, v, gamma=gamma, lam=lam, **dict(kw, gates=np.full_like(r, c)))
    plain = cc.gae(r, v, gamma=gamma * c, lam=lam, **kw)
    np.testing.assert_allclose(gated.advantages, plain.advantages, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gated.returns, plain.returns, rtol=1e-12, atol=1e-12)


def rlax_truncated_generalized_advantage_estimation(
    r_t: np.ndarray, discount_t: np.ndarray, lambda_: float, values: np.ndarray
) -> np.ndarray:
    """rlax.truncated_generalized_advantage_estimation in NumPy: ``values`` holds
    ``len(r_t) + 1`` entries, the last one the bootstrap value."""
    lambda_t = np.ones_like(discount_t) * lambda_
    delta_t = r_t + discount_t * values[1:] - values[:-1]
    advantage_t = np.zeros_like(delta_t)
    acc = 0.0
    for t in reversed(range(len(delta_t))):
        acc = delta_t[t] + discount_t[t] * lambda_t[t] * acc
        advantage_t[t] = acc
    return advantage_t


@given(
    data=st.data(),
    B=st.integers(1, 5),
    T=st.integers(1, 12),
    gamma=discounts(),
    lam=discounts(),
)
def test_per_step_discount_is_rlax_truncated_gae(data: st.DataObject, B: int, T: int, gamma: float, lam: float) -> None:
    f = st.floats(-10.0, 10.0, allow_subnormal=False)
    r = data.draw(hnp.arrays(np.float64, (B, T), elements=f))
    v = data.draw(hnp.arrays(np.float64, (B, T), elements=f))
    g = data.draw(hnp.arrays(np.float64, (B, T), elements=st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0, 1))))
    lv = data.draw(hnp.arrays(np.float64, (B,), elements=f))
    adv, ret = cc.gae(r, v, gates=g, gamma=gamma, lam=lam, last_values=lv)
    for b in range(B):
        want = rlax_truncated_generalized_advantage_estimation(r[b], gamma * g[b], lam, np.append(v[b], lv[b]))
        np.testing.assert_allclose(adv[b], want, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ret[b], want + v[b], rtol=1e-12, atol=1e-12)


@given(batch=ragged_batches(dtypes="float64", junk=False), gamma=discounts(), lam=discounts())
def test_closed_form_path_product(batch: RaggedBatch, gamma: float, lam: float) -> None:
    """A_i = Σ_k (Π_{j=i}^{i+k−1} γλg_j) δ_{i+k} over each row's valid positions."""
    r, v, kw = batch.padded()
    adv, _ = cc.gae(r, v, gamma=gamma, lam=lam, **kw)
    g_all = np.ones(batch.shape) if batch.gates is None else batch.gates
    for b in range(batch.shape[0]):
        pos = np.flatnonzero(batch.valid[b])
        if pos.size == 0:
            continue
        rr, vv, gg = r[b, pos], v[b, pos], g_all[b, pos]
        v_end = 0.0 if batch.last_values is None else batch.last_values[b]
        v_next = np.append(vv[1:], v_end)
        delta = rr + gamma * gg * v_next - vv
        n = pos.size
        for i in range(n):
            weights = np.concatenate([[1.0], np.cumprod(gamma * lam * gg[i : n - 1])])
            want = float(np.dot(weights, delta[i:]))
            np.testing.assert_allclose(adv[b, pos[i]], want, rtol=1e-9, atol=1e-9)
