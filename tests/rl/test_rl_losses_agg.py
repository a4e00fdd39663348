"""The loss aggregation (``rl.aggregate`` and the aggregation inside ``rl.policy_loss`` / ``rl.value_loss``)
against verl 0.9.1's ``agg_loss``, transcribed in ``verl_agg_loss.py``, on batches drawn by Hypothesis
(:mod:`comppo_core.testing.strategies`): every mode, masks of every dtype whose valid entries are any nonzero
number, fully masked rows, empty batches, junk at masked positions, and each of verl's denominators
(``batch_num_tokens``, ``global_batch_size``, ``loss_scale_factor``) given or not.

verl receives the bool mask of the valid positions and the loss with 0 at the masked ones (its seq-mean
modes multiply the loss by the mask, which is NaN at a masked NaN); the package receives the drawn mask and
the junk. Where verl divides 0 by a count of 0 (no valid token, its own count) the package returns 0.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from verl_agg_loss import agg_loss as verl_agg_loss
from verl_agg_loss import compute_policy_loss_vanilla, compute_value_loss

from comppo_core.rl import aggregate, losses, policy_loss, value_loss
from comppo_core.testing.strategies import ragged_batches, ragged_layouts

MODES = losses.AGG_MODES
DENOMINATORS = ("batch_num_tokens", "global_batch_size", "loss_scale_factor")

# a denominator: absent (the batch's own count), an integer count as verl's trainers pass it, or any positive float
denominator = st.one_of(st.none(), st.none(), st.integers(1, 64), st.floats(0.25, 100.0))
denominators = st.fixed_dictionaries({name: denominator for name in DENOMINATORS})


def _grad(fn: Any, x: Any) -> tuple[Any, Any]:
    leaf = x.detach().clone().requires_grad_(True)
    out = fn(leaf)
    (g,) = torch.autograd.grad(out, leaf)
    return out.detach(), g


def _mask_and_valid(layout: Any) -> tuple[Any, Any]:
    """The drawn mask as the package gets it (all-True when none was drawn) and verl's bool mask."""
    valid = torch.from_numpy(layout.valid.copy())
    mask = valid.clone() if layout.mask is None else torch.from_numpy(layout.mask.copy())
    return mask, valid


def _own_count_is_zero(valid: Any, mode: str, kw: dict[str, Any]) -> bool:
    """Whether verl divides by a count of 0: no valid token and the mode's own count not given."""
    own = "batch_num_tokens" if mode == "token-mean" else "global_batch_size"
    return not bool(valid.any()) and kw[own] is None


def assert_same(got: Any, want: Any) -> None:
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    assert torch.equal(got, want), (got, want)


@given(batch=ragged_batches(max_rows=6, max_len=10), mode=st.sampled_from(MODES), kw=denominators)
def test_aggregate_is_verls_agg_loss(batch: Any, mode: str, kw: dict[str, Any]) -> None:
    mask, valid = _mask_and_valid(batch)
    loss_mat = torch.from_numpy(batch.values.copy())  # junk (NaN, ±inf, 7) at masked positions when drawn
    clean = torch.where(valid, loss_mat, 0.0)
    got, got_grad = _grad(lambda x: aggregate(x, mask, mode, **kw), loss_mat)
    want, want_grad = _grad(lambda x: verl_agg_loss(x, valid, mode, **kw), clean)
    assert torch.all(got_grad[~valid] == 0)
    if _own_count_is_zero(valid, mode, kw):
        assert math.isnan(want.item())  # verl: 0 / 0
        assert got.item() == 0.0 and got.dtype == want.dtype
        assert torch.all(got_grad == 0)
    else:
        assert_same(got, want)
        assert_same(got_grad, want_grad)


@given(
    layout=ragged_layouts(max_rows=6, max_len=10),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]),
    mode=st.sampled_from(MODES),
    kw=denominators,
)
def test_policy_and_value_losses_aggregate_as_verl(
    layout: Any, seed: int, dtype: Any, mode: str, kw: dict[str, Any]
) -> None:
    """``policy_loss`` and ``value_loss`` pass the denominators to the aggregation as verl passes its
    ``global_batch_info``: same loss, same gradient, same statistics."""
    mask, valid = _mask_and_valid(layout)
    g = torch.Generator().manual_seed(seed)
    shape = layout.shape
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3.0
    lp = (old + torch.randn(shape, generator=g, dtype=torch.float64) * 0.8).to(dtype)
    adv = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    old = old.to(dtype)
    v_old = torch.randn(shape, generator=g, dtype=torch.float64)
    v = (v_old + torch.randn(shape, generator=g, dtype=torch.float64) * 0.6).to(dtype)
    ret = (v_old + torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)
    v_old = v_old.to(dtype)
    zero = _own_count_is_zero(valid, mode, kw)

    got, got_grad = _grad(lambda x: policy_loss(x, old, adv, mask, clip_high=0.28, agg=mode, **kw)[0], lp)
    want, want_grad = _grad(
        lambda x: compute_policy_loss_vanilla(
            old, x, adv, valid, mode, clip_ratio=0.2, clip_ratio_high=0.28, global_batch_info=kw
        )[0],
        lp,
    )
    _, stats = policy_loss(lp, old, adv, mask, clip_high=0.28, agg=mode, **kw)
    _, metrics = compute_policy_loss_vanilla(
        old, lp, adv, valid, mode, clip_ratio=0.2, clip_ratio_high=0.28, global_batch_info=kw
    )
    assert stats["clipfrac"] == metrics["actor/pg_clipfrac"]
    assert stats["clipfrac_lower"] == metrics["actor/pg_clipfrac_lower"]
    assert stats["approx_kl"] == metrics["actor/ppo_kl"]
    assert stats["pg_loss"] == got.item()
    if zero:
        assert got.item() == 0.0 and torch.all(got_grad == 0)
    else:
        assert_same(got, want)
        assert_same(got_grad, want_grad)

    got_v, got_v_grad = _grad(lambda x: value_loss(x, v_old, ret, mask, clip=0.5, agg=mode, **kw)[0], v)
    want_v, want_v_grad = _grad(lambda x: compute_value_loss(x, ret, v_old, valid, 0.5, mode, **kw)[0], v)
    _, v_stats = value_loss(v, v_old, ret, mask, clip=0.5, agg=mode, **kw)
    assert v_stats["clipfrac"] == compute_value_loss(v, ret, v_old, valid, 0.5, mode, **kw)[1].item()
    if zero:
        assert got_v.item() == 0.0 and torch.all(got_v_grad == 0)
    else:
        assert_same(got_v, want_v)
        assert_same(got_v_grad, want_v_grad)


@given(
    layout=ragged_layouts(max_rows=8, max_len=10, unmasked=False),
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(MODES),
    parts=st.integers(1, 4),
    scale=st.integers(1, 32),
)
def test_a_split_minibatch_adds_up_to_the_whole(layout: Any, seed: int, mode: str, parts: int, scale: int) -> None:
    """Splitting a minibatch's rows over processes or micro-batches: each part aggregated with the whole's
    count (verl's ``global_batch_size`` / ``batch_num_tokens``, dp_size=1), or with its own count and then
    scaled by its share of the whole's count (non-empty rows for the three seq-mean modes, tokens for
    token-mean), adds up to the whole minibatch's aggregate; ``loss_scale_factor`` is the same fixed
    horizon in every part."""
    mask, valid = _mask_and_valid(layout)
    loss_mat = torch.randn(layout.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    fixed = {"loss_scale_factor": scale}
    whole = aggregate(loss_mat, mask, mode, **fixed)
    tokens, rows = int(valid.sum()), int(valid.any(dim=-1).sum())
    count, per_part = (tokens, "batch_num_tokens") if mode == "token-mean" else (rows, "global_batch_size")
    by_count, by_share = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    for index in torch.arange(layout.shape[0]).chunk(parts) if layout.shape[0] else []:
        part_valid = valid[index]
        if count:
            by_count = by_count + aggregate(loss_mat[index], mask[index], mode, **fixed, **{per_part: count})
        own = int(part_valid.sum()) if mode == "token-mean" else int(part_valid.any(dim=-1).sum())
        share = own / count if count else 0.0
        by_share = by_share + share * aggregate(loss_mat[index], mask[index], mode, **fixed)
    torch.testing.assert_close(by_count, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(by_share, whole, rtol=1e-12, atol=1e-12)


def test_the_old_seq_mean_token_sum_norm_does_not_add_up_with_share_one() -> None:
    """The share 1.0 that the fixed-denominator form Σ m·ℓ / L allowed is G times too large now."""
    loss_mat = torch.arange(12, dtype=torch.float64).reshape(4, 3)
    mask = torch.ones(4, 3, dtype=torch.bool)
    whole = aggregate(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=3)
    halves = [
        aggregate(loss_mat[i : i + 2], mask[i : i + 2], "seq-mean-token-sum-norm", loss_scale_factor=3) for i in (0, 2)
    ]
    assert whole.item() == loss_mat.sum().item() / 4 / 3
    assert (halves[0] + halves[1]).item() == pytest.approx(2 * whole.item())
    assert (0.5 * halves[0] + 0.5 * halves[1]).item() == pytest.approx(whole.item())
