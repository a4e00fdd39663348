"""comppo_core.rl.core.losses against verl 0.9.1's loss code, transcribed in ``verl_agg_loss.py`` beside this file
(``agg_loss``, ``compute_policy_loss_vanilla`` with its ``config`` fields as arguments, ``compute_value_loss``,
``kl_penalty_forward`` and ``torch_functional``'s ``masked_sum`` / ``masked_mean`` / ``clip_by_value``; that
file says where each comes from).

On finite inputs with a bool/integer mask (or a 0/1 float32 one) the package must give verl's loss, its
gradient and its statistics bit for bit, in every mode and option. Where the package departs from verl
(masked NaN/inf, a batch with no valid token, float64 and fractional masks, dual clipping turned off), the
tests pin both what the package returns and what verl returns there. The aggregation's own property tests
(Hypothesis batches, every denominator given or not) are in ``test_rl_losses_agg.py``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from verl_agg_loss import agg_loss as verl_agg_loss
from verl_agg_loss import compute_policy_loss_vanilla as verl_policy_loss_vanilla
from verl_agg_loss import compute_value_loss as verl_value_loss
from verl_agg_loss import kl_penalty_forward as verl_kl_penalty_forward

from comppo_core import rl
from comppo_core.errors import DTypeError, ParameterError, ShapeError
from comppo_core.rl import aggregate, kl_penalty, losses, policy_loss, value_loss

MODES = losses.AGG_MODES
KL_NAMES = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
B, T = 5, 7


# --------------------------------------------------------------------------- #
# inputs
# --------------------------------------------------------------------------- #


def _gen(seed: int) -> Any:
    return torch.Generator().manual_seed(seed)


def make_mask(seed: int, shape: tuple[int, int] = (B, T), dtype: Any = torch.bool, empty_rows: tuple = (1,)) -> Any:
    """A random 0/1 mask with the given rows fully masked and every other row keeping its first token."""
    m = torch.rand(shape, generator=_gen(seed)) < 0.6
    if shape[1]:
        m[:, 0] = True
    for r in empty_rows:
        if r < shape[0]:
            m[r] = False
    return m.to(dtype)


def make_policy_inputs(seed: int, dtype: Any = torch.float64, shape: tuple[int, int] = (B, T)) -> tuple:
    g = _gen(seed)
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3.0
    lp = old + torch.randn(shape, generator=g, dtype=torch.float64) * 0.8  # ratios from ~0.1 to ~10
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    return lp.to(dtype), old.to(dtype), adv.to(dtype)


def make_value_inputs(seed: int, dtype: Any = torch.float64, shape: tuple[int, int] = (B, T)) -> tuple:
    g = _gen(seed)
    old = torch.randn(shape, generator=g, dtype=torch.float64)
    v = old + torch.randn(shape, generator=g, dtype=torch.float64) * 0.6
    ret = old + torch.randn(shape, generator=g, dtype=torch.float64)
    return v.to(dtype), old.to(dtype), ret.to(dtype)


MASK_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32)


def _grad(fn: Any, x: Any) -> tuple[Any, Any]:
    """``fn(x')`` and the gradient of it w.r.t. a fresh leaf copy ``x'`` of ``x``."""
    leaf = x.detach().clone().requires_grad_(True)
    out = fn(leaf)
    (g,) = torch.autograd.grad(out, leaf)
    return out.detach(), g


def assert_same(got: Any, want: Any) -> None:
    """Same dtype, same shape, same values (NaN nowhere: these are finite comparisons)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    assert torch.equal(got, want), (got, want)


# --------------------------------------------------------------------------- #
# aggregate
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("mask_dtype", MASK_DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_aggregate_matches_verl(mode: str, mask_dtype: Any) -> None:
    loss_mat = torch.randn(B, T, generator=_gen(1), dtype=torch.float64)
    mask = make_mask(2, dtype=mask_dtype)  # row 1 fully masked
    got, got_grad = _grad(lambda x: aggregate(x, mask, mode), loss_mat)
    want, want_grad = _grad(lambda x: verl_agg_loss(x, mask, mode), loss_mat)
    assert_same(got, want)
    assert_same(got_grad, want_grad)
    assert torch.all(got_grad[1] == 0)  # the fully masked row gets no gradient


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", MODES)
def test_aggregate_dtype_as_verl(mode: str, dtype: Any) -> None:
    """The result keeps verl's dtype: the input's, but float32 where verl's float32 row mask promotes it."""
    loss_mat = torch.randn(B, T, generator=_gen(3)).to(dtype)
    mask = make_mask(4, dtype=torch.int64)
    got = aggregate(loss_mat, mask, mode)
    want = verl_agg_loss(loss_mat, mask, mode)
    assert_same(got, want)
    promoted = mode.startswith("seq-mean") and dtype != torch.float32
    assert got.dtype == (torch.float32 if promoted else dtype)


# each mode's own denominators, by verl's argument names
READS = {
    "token-mean": ("batch_num_tokens",),
    "seq-mean-token-mean": ("global_batch_size",),
    "seq-mean-token-sum": ("global_batch_size",),
    "seq-mean-token-sum-norm": ("global_batch_size", "loss_scale_factor"),
}
DENOMINATORS = ("batch_num_tokens", "global_batch_size", "loss_scale_factor")


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_denominators_are_verls_global_arguments(mode: str) -> None:
    """Every combination of the three denominators, given or not, is verl's agg_loss with the same arguments
    (dp_size=1): a mode reads its own and ignores the others, as verl does with its global_batch_info."""
    loss_mat = torch.randn(B, T, generator=_gen(5), dtype=torch.float64)
    mask = make_mask(6)
    for values in ((None, 3), (None, 64), (None, 0.75)):
        for combo in range(8):
            kw = {name: values[(combo >> i) & 1] for i, name in enumerate(DENOMINATORS)}
            got, got_grad = _grad(lambda x, kw=kw: aggregate(x, mask, mode, **kw), loss_mat)
            want, want_grad = _grad(lambda x, kw=kw: verl_agg_loss(x, mask, mode, **kw), loss_mat)
            assert_same(got, want)
            assert_same(got_grad, want_grad)
            ignored = {k: v for k, v in kw.items() if k not in READS[mode]}
            if any(v is not None for v in ignored.values()):  # the others change nothing
                read = {k: v for k, v in kw.items() if k in READS[mode]}
                assert_same(got, aggregate(loss_mat, mask, mode, **read))


@pytest.mark.parametrize("mode", MODES)
def test_normalizer_is_the_old_name_of_the_modes_own_argument(mode: str) -> None:
    loss_mat = torch.randn(B, T, generator=_gen(5), dtype=torch.float64)
    mask = make_mask(6)
    own = READS[mode][-1]  # token-mean: batch_num_tokens; seq-mean-token-mean/-sum: global_batch_size; -norm: L
    for n in (3, 64.0):
        assert_same(aggregate(loss_mat, mask, mode, normalizer=n), verl_agg_loss(loss_mat, mask, mode, **{own: n}))
    with pytest.raises(ParameterError, match=rf"^normalizer: expected None when {own} is given"):
        aggregate(loss_mat, mask, mode, normalizer=2, **{own: 2})


@pytest.mark.parametrize("mode", MODES)
def test_policy_and_value_losses_pass_the_denominators_to_the_aggregation(mode: str) -> None:
    g = _gen(11)
    lp, old, adv, v, v_old, ret = (torch.randn(B, T, generator=g, dtype=torch.float64) for _ in range(6))
    mask = make_mask(12)
    for kw in ({}, {"loss_scale_factor": 4}, {"global_batch_size": 64.0, "loss_scale_factor": 3}, {"normalizer": 5}):
        want, metrics = verl_policy_loss_vanilla(
            old, lp, adv, mask, mode, clip_ratio=0.2, global_batch_info=_verl_names(mode, kw)
        )
        got, stats = policy_loss(lp, old, adv, mask, agg=mode, **kw)
        assert_same(got, want)
        assert stats == _verl_stats(want, metrics)
        want_v, want_clipfrac = verl_value_loss(v, ret, v_old, mask, 0.5, mode, **_verl_names(mode, kw))
        got_v, v_stats = value_loss(v, v_old, ret, mask, agg=mode, **kw)
        assert_same(got_v, want_v)
        assert v_stats == {"vf_loss": want_v.item(), "clipfrac": want_clipfrac.item()}
    with pytest.raises(ParameterError, match="normalizer: expected a positive finite number"):
        policy_loss(lp, old, adv, mask, normalizer=0)
    with pytest.raises(ParameterError, match="loss_scale_factor: expected a positive finite number"):
        value_loss(v, v_old, ret, mask, loss_scale_factor=-1.0)
    with pytest.raises(ParameterError, match="global_batch_size: expected a positive finite number"):
        policy_loss(lp, old, adv, mask, global_batch_size=math.nan)
    with pytest.raises(ParameterError, match="batch_num_tokens: expected a positive finite number"):
        value_loss(v, v_old, ret, mask, batch_num_tokens=True)


def _verl_names(mode: str, kw: dict[str, Any]) -> dict[str, Any]:
    """The package's keywords as verl's: ``normalizer`` becomes the mode's own argument."""
    out = dict(kw)
    if "normalizer" in out:
        out[READS[mode][-1]] = out.pop("normalizer")
    return out


def test_aggregate_by_hand() -> None:
    """Rows: tokens 1+2+3 = 6 (3 valid), 4 (1 valid), nothing (fully masked); T = 3, |S| = 2, N = 4."""
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert aggregate(loss_mat, mask, "token-mean").item() == 10 / 4
    assert aggregate(loss_mat, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2, rel=1e-15)
    assert aggregate(loss_mat, mask, "seq-mean-token-sum").item() == 10 / 2
    assert aggregate(loss_mat, mask, "seq-mean-token-sum-norm").item() == 10 / 2 / 3  # (6 + 4) / |S| / T
    assert aggregate(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=5).item() == 10 / 2 / 5
    assert aggregate(loss_mat, mask, "seq-mean-token-sum-norm", global_batch_size=4).item() == 10 / 4 / 3
    assert aggregate(loss_mat, mask, "seq-mean-token-sum-norm", global_batch_size=4, loss_scale_factor=5).item() == (
        10 / 4 / 5
    )
    assert aggregate(loss_mat, mask, "seq-mean-token-sum", global_batch_size=4, loss_scale_factor=5).item() == 10 / 4
    assert aggregate(loss_mat, mask, "token-mean", batch_num_tokens=8, loss_scale_factor=5).item() == 10 / 8
    assert aggregate(loss_mat, mask, "token-mean", normalizer=8).item() == 10 / 8


def test_dr_grpo_is_the_row_mean_of_token_sums_over_a_constant() -> None:
    """Dr. GRPO (arXiv:2503.20783): (1/G) Σ_i Σ_t ℓ_it / L, L a constant (the generation budget), whatever the
    response lengths and the padded width; not Σ_it ℓ_it / L (verl ≤ 0.7.0's form, G times larger)."""
    g = _gen(70)
    lengths = [5, 1, 9, 3]
    width = 12
    loss_mat = torch.randn(len(lengths), width, generator=g, dtype=torch.float64)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    budget = 16
    want = sum(loss_mat[i, :n].sum().item() for i, n in enumerate(lengths)) / len(lengths) / budget
    got = aggregate(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=budget)
    assert got.item() == pytest.approx(want, rel=1e-15)
    wider = torch.cat([loss_mat, torch.randn(len(lengths), 7, generator=g, dtype=torch.float64)], dim=1)
    wider_mask = torch.cat([mask, torch.zeros(len(lengths), 7, dtype=torch.bool)], dim=1)
    assert_same(aggregate(wider, wider_mask, "seq-mean-token-sum-norm", loss_scale_factor=budget), got)
    # without a scale factor the horizon is the mask's width, so padding changes it
    assert aggregate(loss_mat, mask, "seq-mean-token-sum-norm").item() == pytest.approx(want * budget / width)
    assert aggregate(wider, wider_mask, "seq-mean-token-sum-norm").item() == pytest.approx(want * budget / (width + 7))


def test_fully_masked_rows_are_left_out_of_every_seq_mean() -> None:
    """A fully masked row neither adds to the sum nor counts as a row (verl's seq_mask), in the three seq-mean
    modes; with seq-mean-token-sum-norm's horizon fixed, dropping those rows changes nothing."""
    loss_mat = torch.randn(B, T, generator=_gen(7), dtype=torch.float64)
    mask = make_mask(8, empty_rows=(1, 3))
    keep = [0, 2, 4]
    for mode in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        full = aggregate(loss_mat, mask, mode)
        kept = aggregate(loss_mat[keep], mask[keep], mode)
        torch.testing.assert_close(full, kept, rtol=1e-15, atol=0)  # the sums add the zeros in another order
        assert_same(full, verl_agg_loss(loss_mat, mask, mode))
    sums = [(loss_mat[b] * mask[b]).sum().item() for b in keep]
    norm = aggregate(loss_mat, mask, "seq-mean-token-sum-norm").item()
    assert norm == pytest.approx(sum(sums) / len(keep) / T, rel=1e-15)


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_all_masked_is_zero_where_verl_is_nan(mode: str) -> None:
    loss_mat = torch.randn(B, T, generator=_gen(9), dtype=torch.float64)
    mask = torch.zeros(B, T, dtype=torch.int64)
    got, grad = _grad(lambda x: aggregate(x, mask, mode), loss_mat)
    assert got.item() == 0.0 and got.dtype == torch.float64
    assert torch.all(grad == 0)
    assert math.isnan(verl_agg_loss(loss_mat, mask, mode).item())  # verl divides 0 by 0
    # with the global counts given, verl gives 0 / count = 0 too
    kw = {"batch_num_tokens": 7, "global_batch_size": 3, "loss_scale_factor": 2}
    assert_same(aggregate(loss_mat, mask, mode, **kw), verl_agg_loss(loss_mat, mask, mode, **kw))
    assert aggregate(loss_mat, mask, mode, **kw).item() == 0.0


@pytest.mark.parametrize("shape", [(0, T), (B, 0), (0, 0)])
@pytest.mark.parametrize("mode", MODES)
def test_aggregate_empty_batch_is_zero(mode: str, shape: tuple[int, int]) -> None:
    loss_mat = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    out = aggregate(loss_mat, torch.ones(shape, dtype=torch.bool), mode)
    assert out.item() == 0.0
    out.backward()


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_masked_nan_and_inf_never_reach_the_result(mode: str) -> None:
    loss_mat = torch.randn(B, T, generator=_gen(10), dtype=torch.float64)
    mask = make_mask(11)
    junk = loss_mat.clone()
    junk[~mask] = torch.tensor([math.nan, math.inf, -math.inf]).repeat(T * B)[: int((~mask).sum())].double()
    got, grad = _grad(lambda x: aggregate(x, mask, mode), junk)
    assert_same(got, verl_agg_loss(loss_mat, mask, mode))
    assert torch.all(torch.isfinite(grad)) and torch.all(grad[~mask] == 0)


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_float_masks(mode: str) -> None:
    """A float mask is read as ``mask != 0``: a 0.5 weighs as 1. A 0/1 float64 mask gives what verl gives for
    the same mask as bool; verl's own float64 result differs from that by its 1e-8 in the count."""
    loss_mat = torch.randn(B, T, generator=_gen(12), dtype=torch.float64)
    mask = make_mask(13)
    fractional = mask.double() * torch.rand(B, T, generator=_gen(14), dtype=torch.float64).clamp(min=0.1)
    assert_same(aggregate(loss_mat, fractional, mode), verl_agg_loss(loss_mat, mask, mode))
    assert_same(aggregate(loss_mat, mask.double(), mode), verl_agg_loss(loss_mat, mask, mode))
    torch.testing.assert_close(
        aggregate(loss_mat, mask.double(), mode), verl_agg_loss(loss_mat, mask.double(), mode), rtol=1e-8, atol=0
    )


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_gradcheck(mode: str) -> None:
    loss_mat = torch.randn(B, T, generator=_gen(15), dtype=torch.float64, requires_grad=True)
    mask = make_mask(16)
    assert torch.autograd.gradcheck(lambda x: aggregate(x, mask, mode), (loss_mat,))
    kw = {"batch_num_tokens": 2.5, "global_batch_size": 1.5, "loss_scale_factor": 3.5}
    assert torch.autograd.gradcheck(lambda x: aggregate(x, mask, mode, **kw), (loss_mat,))


# --------------------------------------------------------------------------- #
# policy loss
# --------------------------------------------------------------------------- #

CLIPS = [(0.2, None), (0.3, None), (0.2, 0.28), (0.1, 0.3), (0.0, 0.0)]
DUALS = [3.0, 1.5, None]


def _verl_policy(lp: Any, old: Any, adv: Any, mask: Any, clip_low: float, clip_high: Any, dual: Any, mode: str) -> Any:
    # dual clipping off is verl with a dual-clip bound no loss reaches
    c = 1e30 if dual is None else dual
    return verl_policy_loss_vanilla(
        old,
        lp,
        adv,
        mask,
        mode,
        clip_ratio=clip_low,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=c,
    )


def _verl_stats(loss: Any, metrics: dict[str, float]) -> dict[str, float]:
    return {
        "pg_loss": loss.item(),
        "clipfrac": metrics["actor/pg_clipfrac"],
        "clipfrac_lower": metrics["actor/pg_clipfrac_lower"],
        "approx_kl": metrics["actor/ppo_kl"],
    }


def check_policy_against_verl(
    lp: Any, old: Any, adv: Any, mask: Any, clip_low: float, clip_high: Any, dual: Any, mode: str
) -> None:
    got_loss, stats = policy_loss(lp, old, adv, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual, agg=mode)
    want_loss, metrics = _verl_policy(lp, old, adv, mask, clip_low, clip_high, dual, mode)
    assert_same(got_loss, want_loss)
    assert all(type(v) is float for v in stats.values())
    assert stats == _verl_stats(want_loss, metrics)

    def ours(x: Any) -> Any:
        return policy_loss(x, old, adv, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual, agg=mode)[0]

    def theirs(x: Any) -> Any:
        return _verl_policy(x, old, adv, mask, clip_low, clip_high, dual, mode)[0]

    assert_same(_grad(ours, lp)[1], _grad(theirs, lp)[1])


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
@pytest.mark.parametrize("dual", DUALS)
@pytest.mark.parametrize(("clip_low", "clip_high"), CLIPS)
@pytest.mark.parametrize("mode", MODES)
def test_policy_loss_matches_verl(mode: str, clip_low: float, clip_high: Any, dual: Any, mask_dtype: Any) -> None:
    lp, old, adv = make_policy_inputs(20)
    mask = make_mask(21, dtype=mask_dtype)
    check_policy_against_verl(lp, old, adv, mask, clip_low, clip_high, dual, mode)


def test_policy_inputs_exercise_every_branch() -> None:
    """The random inputs above clip above, below and by the dual clip, so the comparison covers every branch."""
    lp, old, adv = make_policy_inputs(20)
    mask = make_mask(21)
    _, stats = policy_loss(lp, old, adv, mask)
    assert 0.1 < stats["clipfrac"] < 0.9 and stats["clipfrac_lower"] > 0.0
    ratio = (lp - old).exp()[mask]
    assert (ratio > 1.2).any() and (ratio < 0.8).any() and ((ratio > 3.0) & (adv[mask] < 0)).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_policy_loss_low_precision_as_verl(mode: str, dtype: Any) -> None:
    lp, old, adv = make_policy_inputs(22, dtype=dtype)
    check_policy_against_verl(lp, old, adv, make_mask(23, dtype=torch.int64), 0.2, 0.28, 3.0, mode)


@given(
    b=st.integers(1, 4),
    t=st.integers(1, 9),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(MODES),
    clips=st.sampled_from(CLIPS),
    dual=st.sampled_from(DUALS),
    empty=st.sets(st.integers(0, 3), max_size=2),
)
def test_policy_loss_matches_verl_on_random_shapes(
    b: int, t: int, seed: int, mode: str, clips: tuple, dual: Any, empty: set[int]
) -> None:
    lp, old, adv = make_policy_inputs(seed, shape=(b, t))
    mask = make_mask(seed + 1, shape=(b, t), empty_rows=tuple(empty))
    if not mask.any():
        mask[0, 0] = True  # verl is NaN without a valid token; that case has its own test
    check_policy_against_verl(lp, old, adv, mask, clips[0], clips[1], dual, mode)


def test_policy_loss_by_hand() -> None:
    def one(ratio: float, a: float, **kw: Any) -> tuple[float, dict[str, float]]:
        old = torch.zeros(1, 1, dtype=torch.float64)
        lp = torch.full((1, 1), math.log(ratio), dtype=torch.float64)
        loss, stats = policy_loss(lp, old, torch.full((1, 1), a, dtype=torch.float64), torch.ones(1, 1), **kw)
        return loss.item(), stats

    loss, stats = one(1.5, 1.0)  # A > 0, r above 1 + ε: the clipped term wins
    assert loss == pytest.approx(-1.2) and stats["clipfrac"] == 1.0 and stats["clipfrac_lower"] == 0.0
    loss, stats = one(0.5, 1.0)  # A > 0, r below 1 − ε: the unclipped term is the larger
    assert loss == pytest.approx(-0.5) and stats["clipfrac"] == 0.0
    loss, stats = one(1.3, 1.0, clip_high=0.28)  # clip-higher
    assert loss == pytest.approx(-1.28) and stats["clipfrac"] == 1.0
    loss, stats = one(1.25, 1.0, clip_high=0.28)
    assert loss == pytest.approx(-1.25) and stats["clipfrac"] == 0.0
    loss, stats = one(0.5, -1.0)  # A < 0, r below 1 − ε: −A·clip(r) = 0.8 > 0.5
    assert loss == pytest.approx(0.8) and stats["clipfrac"] == 1.0
    loss, stats = one(5.0, -1.0)  # A < 0, r above c: the dual clip caps the loss at −A·c
    assert loss == pytest.approx(3.0) and stats["clipfrac_lower"] == 1.0 and stats["clipfrac"] == 0.0
    loss, stats = one(5.0, -1.0, dual_clip=None)
    assert loss == pytest.approx(5.0) and stats["clipfrac_lower"] == 0.0
    loss, stats = one(5.0, -1.0, dual_clip=4.5)
    assert loss == pytest.approx(4.5)
    assert stats["approx_kl"] == pytest.approx(-math.log(5.0))
    loss, stats = one(math.exp(30.0), 1.0, clip_low=0.0, clip_high=math.inf)  # δ is clamped to 20
    assert loss == pytest.approx(-math.exp(20.0)) and stats["approx_kl"] == pytest.approx(-20.0)


def test_policy_loss_masked_junk_and_empty_batch() -> None:
    lp, old, adv = make_policy_inputs(24)
    mask = make_mask(25)
    bad_lp, bad_old, bad_adv = lp.clone(), old.clone(), adv.clone()
    bad_lp[~mask], bad_old[~mask], bad_adv[~mask] = -math.inf, -math.inf, math.nan
    loss, stats = policy_loss(bad_lp, bad_old, bad_adv, mask, agg="seq-mean-token-mean")
    want, want_stats = policy_loss(lp, old, adv, mask, agg="seq-mean-token-mean")
    assert torch.equal(loss, want) and stats == want_stats
    _, grad = _grad(lambda x: policy_loss(x, bad_old, bad_adv, mask)[0], bad_lp)
    assert torch.all(torch.isfinite(grad)) and torch.all(grad[~mask] == 0)

    empty = torch.zeros(B, T, dtype=torch.bool)
    for mode in MODES:
        loss, stats = policy_loss(lp, old, adv, empty, agg=mode)
        grad = _grad(lambda x, mode=mode: policy_loss(x, old, adv, empty, agg=mode)[0], lp)[1]
        assert loss.item() == 0.0 and torch.all(grad == 0)
        assert stats == {"pg_loss": 0.0, "clipfrac": 0.0, "clipfrac_lower": 0.0, "approx_kl": 0.0}


@pytest.mark.parametrize("dual", DUALS)
@pytest.mark.parametrize("mode", MODES)
def test_policy_loss_gradcheck(mode: str, dual: Any) -> None:
    lp, old, adv = make_policy_inputs(26)
    mask = make_mask(27)

    def f(x: Any, a: Any) -> Any:
        return policy_loss(x, old, a, mask, clip_low=0.2, clip_high=0.28, dual_clip=dual, agg=mode)[0]

    assert torch.autograd.gradcheck(f, (lp.requires_grad_(True), adv.requires_grad_(True)))


# --------------------------------------------------------------------------- #
# value loss
# --------------------------------------------------------------------------- #


def check_value_against_verl(v: Any, old: Any, ret: Any, mask: Any, clip: Any, mode: str) -> None:
    eps = math.inf if clip is None else clip  # no clipping is verl with an infinite clip range
    loss, stats = value_loss(v, old, ret, mask, clip=clip, agg=mode)
    want, want_clipfrac = verl_value_loss(v, ret, old, mask, eps, mode)
    assert_same(loss, want)
    assert all(type(x) is float for x in stats.values())
    assert stats == {"vf_loss": want.item(), "clipfrac": want_clipfrac.item()}
    got_grad = _grad(lambda x: value_loss(x, old, ret, mask, clip=clip, agg=mode)[0], v)[1]
    want_grad = _grad(lambda x: verl_value_loss(x, ret, old, mask, eps, mode)[0], v)[1]
    assert_same(got_grad, want_grad)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
@pytest.mark.parametrize("clip", [0.5, 0.2, 0.0, None])
@pytest.mark.parametrize("mode", MODES)
def test_value_loss_matches_verl(mode: str, clip: Any, mask_dtype: Any) -> None:
    v, old, ret = make_value_inputs(30)
    mask = make_mask(31, dtype=mask_dtype)
    check_value_against_verl(v, old, ret, mask, clip, mode)


def test_value_inputs_exercise_both_branches() -> None:
    v, old, ret = make_value_inputs(30)
    _, stats = value_loss(v, old, ret, make_mask(31), clip=0.5)
    assert 0.05 < stats["clipfrac"] < 0.95


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_value_inside_the_band_is_not_clipped(dtype: Any) -> None:
    """verl clips with clip_by_value, which leaves V bit for bit inside [V_old − ε, V_old + ε]; the algebraically
    equal V_old + clamp(V − V_old, −ε, ε) rounds V when V and V_old differ in sign or scale, and would count
    such tokens as clipped."""
    g = _gen(38)
    old, v = ((torch.rand(64, 64, generator=g, dtype=torch.float64) - 0.5) * 0.4 for _ in range(2))
    ret = torch.randn(64, 64, generator=g, dtype=torch.float64)
    old, v, ret = old.to(dtype), v.to(dtype), ret.to(dtype)  # |V − V_old| ≤ 0.4 < ε = 0.5
    assert ((old + torch.clamp(v - old, -0.5, 0.5)) != v).any()  # the other form does round here
    mask = torch.ones(64, 64, dtype=torch.bool)
    loss, stats = value_loss(v, old, ret, mask, clip=0.5)
    assert stats["clipfrac"] == 0.0
    assert torch.equal(loss, value_loss(v, old, ret, mask, clip=None)[0])
    check_value_against_verl(v, old, ret, mask, 0.5, "token-mean")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_value_loss_low_precision_as_verl(mode: str, dtype: Any) -> None:
    v, old, ret = make_value_inputs(32, dtype=dtype)
    check_value_against_verl(v, old, ret, make_mask(33, dtype=torch.int64), 0.5, mode)


def test_value_loss_by_hand() -> None:
    def one(v: float, old: float, r: float, **kw: Any) -> tuple[float, dict[str, float]]:
        def t(x: float) -> Any:
            return torch.full((1, 1), x, dtype=torch.float64)

        loss, stats = value_loss(t(v), t(old), t(r), torch.ones(1, 1, dtype=torch.bool), **kw)
        return loss.item(), stats

    assert one(1.0, 0.0, 0.0) == (0.5, {"vf_loss": 0.5, "clipfrac": 0.0})  # max(1, 0.25) = 1
    assert one(1.0, 0.0, 2.0) == (1.125, {"vf_loss": 1.125, "clipfrac": 1.0})  # max(1, 2.25)
    assert one(1.0, 0.0, 2.0, clip=None) == (0.5, {"vf_loss": 0.5, "clipfrac": 0.0})
    assert one(1.0, 0.0, 2.0, clip=0.0) == (2.0, {"vf_loss": 2.0, "clipfrac": 1.0})  # V_clip = V_old


def test_value_loss_masked_junk_and_empty_batch() -> None:
    v, old, ret = make_value_inputs(34)
    mask = make_mask(35)
    bad = tuple(x.clone() for x in (v, old, ret))
    for x, junk in zip(bad, (math.nan, math.inf, -math.inf)):
        x[~mask] = junk
    for mode in MODES:
        loss, stats = value_loss(bad[0], bad[1], bad[2], mask, agg=mode)
        want, want_stats = value_loss(v, old, ret, mask, agg=mode)
        assert torch.equal(loss, want) and stats == want_stats
    grad = _grad(lambda x: value_loss(x, bad[1], bad[2], mask)[0], bad[0])[1]
    assert torch.all(torch.isfinite(grad)) and torch.all(grad[~mask] == 0)
    empty = torch.zeros(B, T)
    for mode in MODES:
        loss, stats = value_loss(v, old, ret, empty, agg=mode)
        assert loss.item() == 0.0 and stats == {"vf_loss": 0.0, "clipfrac": 0.0}


@pytest.mark.parametrize("clip", [0.5, None])
@pytest.mark.parametrize("mode", MODES)
def test_value_loss_gradcheck(mode: str, clip: Any) -> None:
    v, old, ret = make_value_inputs(36)
    mask = make_mask(37)

    def f(x: Any, r: Any) -> Any:
        return value_loss(x, old, r, mask, clip=clip, agg=mode)[0]

    assert torch.autograd.gradcheck(f, (v.requires_grad_(True), ret.requires_grad_(True)))


# --------------------------------------------------------------------------- #
# KL penalty
# --------------------------------------------------------------------------- #


def _kl_inputs(seed: int, dtype: Any = torch.float64, shape: tuple = (B, T), scale: float = 1.0) -> tuple:
    g = _gen(seed)
    ref = -torch.rand(shape, generator=g, dtype=torch.float64) * 3.0
    lp = ref + torch.randn(shape, generator=g, dtype=torch.float64) * scale
    if scale > 1.0:  # two differences far beyond the clamps, where exp(ref − lp) overflows without them
        lp.view(-1)[:2] = ref.view(-1)[:2] + torch.tensor([100.0, -1000.0], dtype=torch.float64)
    return lp.to(dtype), ref.to(dtype)


@pytest.mark.parametrize("shape", [(B, T), (11,), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", KL_NAMES)
def test_kl_penalty_matches_verl(kind: str, dtype: Any, shape: tuple) -> None:
    # scale 12: some |ref − lp| beyond verl's ±20 clamp, some k3 values beyond its 10 cap
    lp, ref = _kl_inputs(40, dtype, shape, scale=12.0)
    got, got_grad = _grad(lambda x: kl_penalty(x, ref, kind).sum(), lp)
    want, want_grad = _grad(lambda x: verl_kl_penalty_forward(x, ref, kind).sum(), lp)
    assert_same(kl_penalty(lp, ref, kind), verl_kl_penalty_forward(lp, ref, kind))
    assert_same(got, want)
    assert_same(got_grad, want_grad)


def test_kl_inputs_reach_the_k3_clamps() -> None:
    lp, ref = _kl_inputs(40, scale=12.0)
    d = ref - lp
    assert (d.abs() > 20).any() and (kl_penalty(lp, ref, "k3") == 10).any()


def test_kl_aliases_and_by_hand() -> None:
    lp, ref = _kl_inputs(41)
    for a, b in (("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")):
        assert torch.equal(kl_penalty(lp, ref, a), kl_penalty(lp, ref, b))
    zero, log2 = torch.zeros(1, dtype=torch.float64), torch.full((1,), math.log(2.0), dtype=torch.float64)
    assert kl_penalty(zero, log2, "k1").item() == pytest.approx(-math.log(2.0))
    assert kl_penalty(zero, log2, "abs").item() == pytest.approx(math.log(2.0))
    assert kl_penalty(zero, log2, "k2").item() == pytest.approx(0.5 * math.log(2.0) ** 2)
    assert kl_penalty(zero, log2, "k3").item() == pytest.approx(1.0 - math.log(2.0))  # e^{ln 2} − ln 2 − 1
    assert kl_penalty(lp, ref).shape == lp.shape  # default k1
    assert torch.equal(kl_penalty(lp, ref), lp - ref)


@pytest.mark.parametrize("kind", KL_NAMES)
def test_kl_penalty_gradcheck(kind: str) -> None:
    lp, ref = _kl_inputs(42, scale=1.0)  # inside the clamps, away from |d| = 0 for abs
    assert (lp - ref).abs().min() > 1e-3
    assert torch.autograd.gradcheck(
        lambda x, y: kl_penalty(x, y, kind), (lp.requires_grad_(True), ref.requires_grad_(True))
    )


# --------------------------------------------------------------------------- #
# the contract: inputs untouched, stats are floats, errors name the argument
# --------------------------------------------------------------------------- #


def test_inputs_are_not_modified() -> None:
    lp, old, adv = make_policy_inputs(50)
    v, vold, ret = make_value_inputs(51)
    mask = make_mask(52, dtype=torch.float32)
    tensors = (lp, old, adv, v, vold, ret, mask)
    before = [(t.clone(), t._version) for t in tensors]
    for mode in MODES:
        policy_loss(lp, old, adv, mask, agg=mode)
        value_loss(v, vold, ret, mask, agg=mode)
        aggregate(lp, mask, mode)
    for kind in KL_NAMES:
        kl_penalty(lp, old, kind)
    for t, (copy, version) in zip(tensors, before):
        assert torch.equal(t, copy) and t._version == version


def test_package_exports() -> None:
    assert rl.aggregate is aggregate and rl.policy_loss is policy_loss
    assert rl.value_loss is value_loss and rl.kl_penalty is kl_penalty
    assert set(losses.KL_KINDS) == set(KL_NAMES)


def _policy(**kw: Any) -> Any:
    lp, old, adv = make_policy_inputs(60)
    args = {"logprobs": lp, "old_logprobs": old, "advantages": adv, "mask": make_mask(61)}
    options = {k: kw.pop(k) for k in list(kw) if k not in args}
    args.update(kw)
    return policy_loss(args["logprobs"], args["old_logprobs"], args["advantages"], args["mask"], **options)


def _value(**kw: Any) -> Any:
    v, old, ret = make_value_inputs(62)
    args = {"values": v, "old_values": old, "returns": ret, "mask": make_mask(63)}
    options = {k: kw.pop(k) for k in list(kw) if k not in args}
    args.update(kw)
    return value_loss(args["values"], args["old_values"], args["returns"], args["mask"], **options)


SHORT = torch.zeros(B, T - 1, dtype=torch.float64)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: _policy(old_logprobs=SHORT), "old_logprobs"),
        (lambda: _policy(advantages=SHORT), "advantages"),
        (lambda: _policy(mask=SHORT.bool()), "mask"),
        (lambda: _value(old_values=SHORT), "old_values"),
        (lambda: _value(returns=SHORT), "returns"),
        (lambda: _value(mask=SHORT), "mask"),
        (lambda: aggregate(torch.zeros(B, T), SHORT, "token-mean"), "mask"),
        (lambda: kl_penalty(torch.zeros(B, T), SHORT), "ref_logprobs"),
    ],
)
def test_shape_errors_name_the_argument_and_both_shapes(call: Any, argument: str) -> None:
    with pytest.raises(ShapeError, match=rf"^{argument}: expected shape \({B}, {T}\) .* got \({B}, {T - 1}\)"):
        call()


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: _policy(logprobs=torch.zeros(B * T, dtype=torch.float64)), "logprobs"),
        (lambda: _value(values=torch.zeros(1, B, T, dtype=torch.float64)), "values"),
        (lambda: aggregate(torch.zeros(T), torch.ones(T), "token-mean"), "loss_mat"),
    ],
)
def test_not_2d_is_a_shape_error(call: Any, argument: str) -> None:
    with pytest.raises(ShapeError, match=rf"^{argument}: expected a 2-D \[B, T\] tensor"):
        call()


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: _policy(logprobs=torch.zeros(B, T, dtype=torch.int64)), "logprobs"),
        (lambda: _policy(advantages=[[0.0] * T] * B), "advantages"),
        (lambda: _policy(mask=[[1] * T] * B), "mask"),
        (lambda: _policy(mask=torch.ones(B, T, dtype=torch.complex64)), "mask"),
        (lambda: _value(returns=torch.zeros(B, T, dtype=torch.bool)), "returns"),
        (lambda: aggregate(torch.zeros(B, T, dtype=torch.int32), torch.ones(B, T), "token-mean"), "loss_mat"),
        (lambda: kl_penalty(torch.zeros(B, T), torch.zeros(B, T, dtype=torch.int64)), "ref_logprobs"),
        (lambda: kl_penalty(1.0, torch.zeros(B, T)), "logprobs"),  # type: ignore[arg-type]
    ],
)
def test_dtype_errors_name_the_argument(call: Any, argument: str) -> None:
    with pytest.raises(DTypeError, match=rf"^{argument}: expected"):
        call()


@pytest.mark.parametrize(
    ("call", "argument", "detail"),
    [
        (lambda: _policy(agg="mean"), "agg", "'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum', "),
        (lambda: _value(agg="seq-mean"), "agg", "'seq-mean-token-sum-norm', got 'seq-mean'"),
        (lambda: aggregate(torch.zeros(B, T), torch.ones(B, T), "sum"), "mode", "got 'sum'"),
        (lambda: kl_penalty(torch.zeros(2), torch.zeros(2), "k4"), "kind", "'low_var_kl', got 'k4'"),
        (lambda: kl_penalty(torch.zeros(2), torch.zeros(2), "k3+"), "kind", "got 'k3\\+'"),
        (lambda: kl_penalty(torch.zeros(2), torch.zeros(2), "full"), "kind", "got 'full'"),
        (lambda: _policy(clip_low=-0.1), "clip_low", "≥ 0, got -0.1"),
        (lambda: _policy(clip_low=math.nan), "clip_low", "≥ 0, got nan"),
        (lambda: _policy(clip_low=True), "clip_low", "got True"),
        (lambda: _policy(clip_high=-0.2), "clip_high", "≥ 0, got -0.2"),
        (lambda: _policy(clip_high="0.2"), "clip_high", "got '0.2'"),
        (lambda: _policy(dual_clip=1.0), "dual_clip", "> 1 .*got 1.0"),
        (lambda: _policy(dual_clip=0.5), "dual_clip", "> 1 .*got 0.5"),
        (lambda: _policy(dual_clip=math.inf), "dual_clip", "finite number > 1 .*got inf"),
        (lambda: _value(clip=-0.5), "clip", "≥ 0, got -0.5"),
        (lambda: aggregate(torch.zeros(B, T), torch.ones(B, T), normalizer=0), "normalizer", "positive"),
        (lambda: aggregate(torch.zeros(B, T), torch.ones(B, T), normalizer=math.inf), "normalizer", "got inf"),
        (lambda: aggregate(torch.zeros(B, T), torch.ones(B, T), normalizer=torch.tensor(2.0)), "normalizer", "got"),
        (lambda: aggregate(torch.zeros(B, T), torch.ones(B, T), loss_scale_factor=0), "loss_scale_factor", "got 0"),
        (lambda: aggregate(torch.zeros(B, T), torch.ones(B, T), global_batch_size=-2), "global_batch_size", "got -2"),
        (lambda: aggregate(torch.zeros(B, T), torch.ones(B, T), batch_num_tokens="8"), "batch_num_tokens", "'8'"),
        (lambda: _policy(loss_scale_factor=math.inf), "loss_scale_factor", "got inf"),
        (lambda: _value(global_batch_size=0.0), "global_batch_size", "got 0.0"),
    ],
)
def test_parameter_errors_name_the_argument(call: Any, argument: str, detail: str) -> None:
    with pytest.raises(ParameterError, match=rf"^{argument}: expected .*{detail}"):
        call()


def test_verl_refuses_what_the_package_refuses() -> None:
    """dual_clip ≤ 1 is refused by verl's own assertion; "k3+" and "full" raise NotImplementedError in verl."""
    lp, old, adv = make_policy_inputs(64)
    with pytest.raises(AssertionError, match="clip_ratio_c"):
        verl_policy_loss_vanilla(old, lp, adv, make_mask(65), clip_ratio_c=1.0)
    for kind in ("k3+", "full"):
        with pytest.raises(NotImplementedError):
            verl_kl_penalty_forward(lp, old, kind)
