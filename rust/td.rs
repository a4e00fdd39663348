//! One-step gated bootstrap (TD) targets.
//!
//! Over a sequence's valid positions `i = 0..n-1` (masked positions skipped):
//!
//! ```text
//! y_i = r_i + γ·g_i·V_{i+1},     V_n = last_values[b] (truncated) or 0 (terminal)
//! ```
//!
//! Operation order: `gg = γ·g; y = r + gg·V_next` in `f64`; masked positions get 0.
//! Shapes as in [`crate::gae`]. The recursion here is only the carried `V_next`, a
//! one-cycle select, so a plain row loop already streams at memory speed.

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
            let mut v_next = last_values.map_or(0.0, |lv| lv[b]);
            for i in row.rev() {
                // SAFETY: i lies inside the validated layout and the task span.
                let (valid, g) = unsafe { (mask.valid(i), gates.gate(i)) };
                let r = rewards[i].to_f64();
                let v = values[i].to_f64();
                let y = r + (gamma * g) * v_next;
                piece[i - task.span.start] = F::from_f64(if valid { y } else { 0.0 });
                if valid {
                    v_next = v;
                }
                let ok = r.is_finite() & v.is_finite() & (0.0..=1.0).contains(&g);
                bad |= valid & !ok;
            }
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
