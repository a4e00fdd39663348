//! The one error type of the kernels. The bindings map each variant to a Python
//! exception class (see `bindings.rs`); nothing here panics on bad input.

use std::fmt;

/// A position in the batch: sequence `row`, position `pos` inside it, and for the
/// packed layout the flat index into the `[N]` arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loc {
    pub row: usize,
    pub pos: usize,
    pub flat: Option<usize>,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "(row {}, position {})", self.row, self.pos)?;
        if let Some(k) = self.flat {
            write!(f, " [flat index {k}]")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum KernelError {
    /// Arrays whose lengths or shapes do not agree.
    Shape { arg: &'static str, expected: String, got: String },
    /// A malformed `cu_seqlens`; `index` is the first offending entry.
    CuSeqlens { problem: String, index: usize },
    /// NaN or ±inf at a valid position.
    NonFinite { arg: &'static str, at: Loc, value: f64 },
    /// NaN or ±inf in a per-sequence array (scores, per-sequence values).
    NonFiniteIndex { arg: &'static str, index: usize, value: f64 },
    /// A per-token value outside its allowed range (gates outside [0, 1]).
    OutOfRange { arg: &'static str, at: Loc, value: f64, expected: &'static str },
    /// A nonzero reward on a masked position while `masked_rewards="error"`.
    MaskedReward { at: Loc, value: f64 },
    /// A scalar parameter (γ, λ, bounds, ...) that is not allowed.
    Parameter { arg: &'static str, expected: String, got: String },
    /// A per-sequence value that is not allowed (a NaN in `last_values`); `row` is the
    /// first offending sequence.
    RowValue { arg: &'static str, row: usize, expected: String, got: String },
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::Shape { arg, expected, got } => {
                write!(f, "{arg}: expected {expected}, got {got}")
            }
            KernelError::CuSeqlens { problem, index } => {
                write!(f, "cu_seqlens: {problem} (first offending index {index})")
            }
            KernelError::NonFinite { arg, at, value } => {
                write!(f, "{arg}: expected finite values at valid positions, got {value} at {at}")
            }
            KernelError::NonFiniteIndex { arg, index, value } => {
                write!(f, "{arg}: expected finite values, got {value} at index {index}")
            }
            KernelError::OutOfRange { arg, at, value, expected } => {
                write!(f, "{arg}: expected values in {expected}, got {value} at {at}")
            }
            KernelError::MaskedReward { at, value } => write!(
                f,
                "rewards: expected 0 at masked positions, got {value} at {at}; a reward on a \
                 masked token would be silently dropped (pass masked_rewards=\"drop\" to allow it)"
            ),
            KernelError::Parameter { arg, expected, got } => {
                write!(f, "{arg}: expected {expected}, got {got}")
            }
            KernelError::RowValue { arg, row, expected, got } => {
                write!(f, "{arg}: expected {expected}, got {got} at row {row}")
            }
        }
    }
}

impl std::error::Error for KernelError {}

pub type Result<T> = std::result::Result<T, KernelError>;

/// `γ`, `λ` and friends must lie in `[0, 1]`.
pub fn check_unit_interval(arg: &'static str, x: f64) -> Result<()> {
    if (0.0..=1.0).contains(&x) {
        Ok(())
    } else {
        Err(KernelError::Parameter { arg, expected: "a number in [0, 1]".into(), got: format!("{x}") })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_the_location() {
        let e =
            KernelError::RowValue { arg: "last_values", row: 5, expected: "finite values".into(), got: "NaN".into() };
        assert_eq!(e.to_string(), "last_values: expected finite values, got NaN at row 5");
        let at = Loc { row: 1, pos: 0, flat: Some(2) };
        let e = KernelError::NonFinite { arg: "rewards", at, value: f64::NAN };
        assert_eq!(
            e.to_string(),
            "rewards: expected finite values at valid positions, got NaN at (row 1, position 0) [flat index 2]"
        );
    }

    #[test]
    fn a_non_finite_per_row_value_carries_its_row() {
        let e = crate::checks::check_row_values("last_values", Some(&[0.0, 1.0, f64::NAN]), 3).unwrap_err();
        assert!(matches!(e, KernelError::RowValue { arg: "last_values", row: 2, .. }), "{e:?}");
        assert_eq!(e.to_string(), "last_values: expected finite values, got NaN at row 2");
    }
}
