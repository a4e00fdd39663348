//! Input checks shared by the kernels.
//!
//! Kernels check cheaply while they compute (a flag per task) and call
//! [`first_offender`] only when something looked wrong, so the error names the first
//! offending (row, position) in row-major order without a second pass on good input.

use crate::element::{Float, Gates, Mask};
use crate::error::{KernelError, Result};
use crate::layout::Layout;

/// `arg` must have exactly `n` elements (when it is given at all).
pub fn check_len(arg: &'static str, len: Option<usize>, n: usize) -> Result<()> {
    match len {
        Some(l) if l != n => Err(KernelError::Shape {
            arg,
            expected: format!("{n} elements (the size of rewards)"),
            got: format!("{l}"),
        }),
        _ => Ok(()),
    }
}

/// Per-row values (`last_values`): one per row, all finite.
pub fn check_row_values(arg: &'static str, x: Option<&[f64]>, rows: usize) -> Result<()> {
    let Some(x) = x else { return Ok(()) };
    if x.len() != rows {
        return Err(KernelError::Shape {
            arg,
            expected: format!("one value per sequence ({rows})"),
            got: format!("{}", x.len()),
        });
    }
    match x.iter().position(|v| !v.is_finite()) {
        Some(b) => {
            Err(KernelError::RowValue { arg, row: b, expected: "finite values".into(), got: format!("{}", x[b]) })
        }
        None => Ok(()),
    }
}

/// Scans the batch in row-major order and returns the first error `probe` reports at a
/// position, given the position's flat index and validity.
pub fn first_offender<M: Mask>(
    layout: &Layout,
    mask: &M,
    probe: impl Fn(usize, bool) -> Option<KernelErrorAt>,
) -> Option<KernelError> {
    for b in 0..layout.rows() {
        let range = layout.row(b);
        let start = range.start;
        for i in range {
            // SAFETY: i lies inside the validated layout.
            let valid = unsafe { mask.valid(i) };
            if let Some(e) = probe(i, valid) {
                return Some(e.at(layout.loc(b, i - start)));
            }
        }
    }
    None
}

/// What is wrong at a position, before the position is known.
pub enum KernelErrorAt {
    NonFinite(&'static str, f64),
    GateOutOfRange(f64),
    MaskedReward(f64),
}

impl KernelErrorAt {
    fn at(self, at: crate::error::Loc) -> KernelError {
        match self {
            KernelErrorAt::NonFinite(arg, value) => KernelError::NonFinite { arg, at, value },
            KernelErrorAt::GateOutOfRange(value) => {
                KernelError::OutOfRange { arg: "gates", at, value, expected: "[0, 1]" }
            }
            KernelErrorAt::MaskedReward(value) => KernelError::MaskedReward { at, value },
        }
    }
}

/// The token-level checks of docs/design.md §3 for rewards, values and gates: finite at valid
/// positions, gates in [0, 1] at valid positions, and (when `masked_rewards_error`)
/// zero rewards at masked positions.
pub fn first_bad_token<F: Float, M: Mask, G: Gates>(
    layout: &Layout,
    rewards: &[F],
    values: &[F],
    mask: &M,
    gates: &G,
    masked_rewards_error: bool,
) -> Option<KernelError> {
    first_offender(layout, mask, |i, valid| {
        let r = rewards[i].to_f64();
        if !valid {
            return (masked_rewards_error && r != 0.0).then_some(KernelErrorAt::MaskedReward(r));
        }
        let v = values[i].to_f64();
        // SAFETY: i lies inside the validated layout.
        let g = unsafe { gates.gate(i) };
        if !r.is_finite() {
            Some(KernelErrorAt::NonFinite("rewards", r))
        } else if !v.is_finite() {
            Some(KernelErrorAt::NonFinite("values", v))
        } else if !g.is_finite() {
            Some(KernelErrorAt::NonFinite("gates", g))
        } else if !(0.0..=1.0).contains(&g) {
            Some(KernelErrorAt::GateOutOfRange(g))
        } else {
            None
        }
    })
}
