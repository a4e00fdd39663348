//! One-step gated bootstrap (TD) targets.
//!
//! Over a sequence's valid positions `i = 0..n-1` (masked positions skipped):
//!
//! ```text
//! y_i = r_i + γ·g_i·V_{i+1},     V_n = last_values[b] (truncated) or 0 (terminal)
//! ```
//!
//! Operation order: `gg = γ·g; y = r + gg·V_next` in `f64`; masked positions get 0.
//! Shapes as in [`crate::gae`]. The recursion here is only the carried `V_next`, so
//! within a run of valid positions every target is independent: rows are taken four
//! positions at a time where all four are valid, which the compiler vectorizes in
//! part (0.62-0.83x the time of the one-position loop on W1-W4). It is still 1.4-2x
//! the time of `gae` on the same batch; a hand-written AVX2 block like
//! `gae/blocks.rs` would close that.

use crate::checks::{check_len, check_row_values, first_bad_token};
use crate::element::{Float, Gates, Mask};
use crate::error::{check_unit_interval, Result};
use crate::layout::Layout;
use crate::pool;

/// TD targets written into `out`. On error the contents of `out` are unspecified.
#[allow(clippy::too_many_arguments)]
pub fn td_targets<F: Float, M: Mask, G: Gates>(
    layout: &Layout,
    rewards: &[F],
    values: &[F],
    mask: M,
    gates: G,
    last_values: Option<&[f64]>,
    gamma: f64,
    out: &mut [F],
) -> Result<()> {
    check_unit_interval("gamma", gamma)?;
    let n = layout.len();
    check_len("rewards", Some(rewards.len()), n)?;
    check_len("values", Some(values.len()), n)?;
    check_len("mask", mask.len(), n)?;
    check_len("gates", gates.len(), n)?;
    check_len("out", Some(out.len()), n)?;
    check_row_values("last_values", last_values, layout.rows())?;

    let suspicious = pool::map_pieces(layout, out, |task, piece| {
        let mut bad = false;
        for b in task.rows.clone() {
            let row = layout.row(b);
            let v_after = last_values.map_or(0.0, |lv| lv[b]);
            let o = &mut piece[row.start - task.span.start..row.end - task.span.start];
            bad |= row_targets(rewards, values, mask, gates, gamma, row, v_after, o);
        }
        bad
    })
    .into_iter()
    .any(|b| b);
    if suspicious {
        if let Some(e) = first_bad_token(layout, rewards, values, &mask, &gates, false) {
            return Err(e);
        }
    }
    Ok(())
}

/// The targets of one row (flat positions `row`) into `out`; `v_after` is `V_n`.
/// Returns whether a valid position had a non-finite reward or value or a gate outside
/// [0, 1].
#[allow(clippy::too_many_arguments)]
fn row_targets<F: Float, M: Mask, G: Gates>(
    rewards: &[F],
    values: &[F],
    mask: M,
    gates: G,
    gamma: f64,
    row: std::ops::Range<usize>,
    v_after: f64,
    out: &mut [F],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { row_targets_avx2(rewards, values, mask, gates, gamma, row, v_after, out) };
    }
    row_targets_body(rewards, values, mask, gates, gamma, row, v_after, out)
}

/// The same loop compiled for AVX2 (a block's four positions in f64 lanes).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn row_targets_avx2<F: Float, M: Mask, G: Gates>(
    rewards: &[F],
    values: &[F],
    mask: M,
    gates: G,
    gamma: f64,
    row: std::ops::Range<usize>,
    v_after: f64,
    out: &mut [F],
) -> bool {
    row_targets_body(rewards, values, mask, gates, gamma, row, v_after, out)
}

/// [`row_targets`]: the row from its end, four positions at a time while all four are
/// valid (their `V_next` is then the next position's value, or the carried one for the
/// last of them, so the four are independent and vectorize), one at a time otherwise.
/// Each position's arithmetic is the same either way, so the results are too.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn row_targets_body<F: Float, M: Mask, G: Gates>(
    rewards: &[F],
    values: &[F],
    mask: M,
    gates: G,
    gamma: f64,
    row: std::ops::Range<usize>,
    mut v_next: f64,
    out: &mut [F],
) -> bool {
    let (r, v) = (&rewards[row.clone()], &values[row.clone()]);
    let base = row.start;
    let mut ok = true;
    let mut i = r.len();
    while i > 0 {
        // SAFETY (mask, gates): base + j < row.end, inside the validated layout.
        if i >= 4 && (i - 4..i).all(|j| unsafe { mask.valid(base + j) }) {
            let k = i - 4;
            let rk: [f64; 4] = std::array::from_fn(|j| r[k + j].to_f64());
            let vk: [f64; 5] = std::array::from_fn(|j| if j < 4 { v[k + j].to_f64() } else { v_next });
            // SAFETY: as above.
            let gk: [f64; 4] = std::array::from_fn(|j| unsafe { gates.gate(base + k + j) });
            let y: [f64; 4] = std::array::from_fn(|j| rk[j] + (gamma * gk[j]) * vk[j + 1]);
            for (o, y) in out[k..i].iter_mut().zip(y) {
                *o = F::from_f64(y);
            }
            // A non-finite r, V or g makes the sum non-finite (inf − inf and NaN give
            // NaN). A finite sum that overflows (float64 inputs near the largest double)
            // only marks the task suspicious: the exact scan then finds nothing wrong.
            let sums: [f64; 4] = std::array::from_fn(|j| rk[j] + vk[j] + gk[j]);
            let gates_in: [bool; 4] = std::array::from_fn(|j| (0.0..=1.0).contains(&gk[j]));
            ok &= sums.iter().all(|x| x.is_finite()) & gates_in.iter().all(|&b| b);
            v_next = vk[0];
            i = k;
        } else {
            i -= 1;
            let (valid, g) = unsafe { (mask.valid(base + i), gates.gate(base + i)) };
            let (rj, vj) = (r[i].to_f64(), v[i].to_f64());
            let y = rj + (gamma * g) * v_next;
            out[i] = F::from_f64(if valid { y } else { 0.0 });
            if valid {
                v_next = vj;
            }
            ok &= !valid | (rj.is_finite() & vj.is_finite() & (0.0..=1.0).contains(&g));
        }
    }
    !ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::UnitGates;

    #[test]
    fn skips_masked_and_bootstraps_truncation() {
        // one row, mask [1, 0, 1]: y0 = r0 + γ·g0·V2, y2 = r2 + γ·g2·last_value
        let layout = Layout::padded(1, 3, 3).unwrap();
        let (r, v, m, g) = ([1.0, 0.0, 2.0], [10.0, 99.0, 20.0], [1u8, 0, 1], [0.5, 0.3, 1.0]);
        let mut y = [7.0; 3];
        td_targets(&layout, &r, &v, &m[..], &g[..], Some(&[4.0]), 0.5, &mut y).unwrap();
        assert_eq!(y, [1.0 + 0.25 * 20.0, 0.0, 2.0 + 0.5 * 4.0]);
        // V of the first valid token is still checked
        let v = [f64::INFINITY, 0.0, 0.0];
        let e = td_targets(&layout, &r, &v, &m[..], UnitGates, None, 0.5, &mut y).unwrap_err();
        assert!(e.to_string().contains("values"), "{e}");
    }
}
