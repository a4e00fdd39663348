//! Per-sequence values → per-token: `x_{b,i} = a_b` at valid positions, 0 elsewhere.
//! Shapes: `per_row` `[B]`, `out` `[N]` laid out by a [`Layout`].

use crate::checks::check_len;
use crate::element::{Float, Mask};
use crate::error::{KernelError, Result};
use crate::layout::Layout;
use crate::pool;

pub fn broadcast<F: Float, M: Mask>(layout: &Layout, per_row: &[F], mask: M, out: &mut [F]) -> Result<()> {
    let n = layout.len();
    if per_row.len() != layout.rows() {
        return Err(KernelError::Shape {
            arg: "per_sequence",
            expected: format!("one value per sequence ({})", layout.rows()),
            got: format!("{}", per_row.len()),
        });
    }
    check_len("mask", mask.len(), n)?;
    check_len("out", Some(out.len()), n)?;
    if let Some(b) = per_row.iter().position(|x| !x.to_f64().is_finite()) {
        return Err(KernelError::NonFiniteIndex { arg: "per_sequence", index: b, value: per_row[b].to_f64() });
    }
    pool::map_pieces(layout, out, |task, piece| {
        for b in task.rows.clone() {
            let value = per_row[b];
            for i in layout.row(b) {
                // SAFETY: i lies inside the validated layout.
                let valid = unsafe { mask.valid(i) };
                piece[i - task.span.start] = if valid { value } else { F::from_f64(0.0) };
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_and_packed() {
        let l = Layout::padded(2, 3, 6).unwrap();
        let mut out = [9.0; 6];
        broadcast(&l, &[2.0, -1.0], &[1u8, 1, 0, 0, 1, 1][..], &mut out).unwrap();
        assert_eq!(out, [2.0, 2.0, 0.0, 0.0, -1.0, -1.0]);
        let cu = [0i64, 1, 3];
        let l = Layout::packed(&cu, 3).unwrap();
        let mut out = [9.0; 3];
        broadcast(&l, &[2.0, -1.0], crate::AllValid, &mut out).unwrap();
        assert_eq!(out, [2.0, -1.0, -1.0]);
    }
}
