//! Credit diagnostics of a per-token array over its valid tokens (docs/design.md §5).
//!
//! With the n valid values x and a = |x|:
//!
//! ```text
//! mean, std (population), min, max, frac_positive = #{x > 0}/n
//! gini                  = Σ_i Σ_j |a_i − a_j| / (2 n² mean(a))
//!                       = Σ_i (2i − n + 1)·a_(i) / (n·Σa)     a sorted ascending, i from 0
//! effective_token_ratio = exp(H)/n,   p = a/Σa,  H = −Σ p ln p
//! ```
//!
//! One-hot credit over n tokens gives gini 1 − 1/n and ratio 1/n; even credit gives 0
//! and 1; all-zero credit gives gini 0 and ratio 1. Sums are per row, merged in row
//! order; the sort is a total order on values, so results are thread-count independent.

use crate::checks::check_len;
use crate::element::{Float, Mask};
use crate::error::{KernelError, Result};
use crate::layout::Layout;
use crate::pool;
use crate::whiten::batch_moments;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CreditStats {
    pub n: usize,
    pub mean: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
    pub frac_positive: f64,
    pub gini: f64,
    pub effective_token_ratio: f64,
}

pub fn credit_stats<F: Float, M: Mask>(layout: &Layout, x: &[F], mask: M) -> Result<CreditStats> {
    let n_all = layout.len();
    check_len("x", Some(x.len()), n_all)?;
    check_len("mask", mask.len(), n_all)?;
    let m = batch_moments(layout, x, &mask, "x")?;
    if m.n == 0 {
        return Err(KernelError::Parameter {
            arg: "mask",
            expected: "at least 1 valid token".into(),
            got: "0 valid tokens".into(),
        });
    }
    // |x| of the valid tokens, in row-major order
    let mut a: Vec<f64> = Vec::with_capacity(m.n);
    let (mut min, mut max, mut positive) = (f64::INFINITY, f64::NEG_INFINITY, 0usize);
    for b in 0..layout.rows() {
        for i in layout.row(b) {
            // SAFETY: i lies inside the validated layout.
            if unsafe { mask.valid(i) } {
                let v = x[i].to_f64();
                min = min.min(v);
                max = max.max(v);
                positive += (v > 0.0) as usize;
                a.push(v.abs());
            }
        }
    }
    let n = a.len() as f64;
    let total: f64 = a.iter().sum();
    let (gini, ratio) = if total == 0.0 {
        (0.0, 1.0)
    } else {
        // H = −Σ p ln p with p = a/S, in index order
        let entropy: f64 = -a.iter().filter(|&&v| v > 0.0).map(|&v| (v / total) * (v / total).ln()).sum::<f64>();
        if a.len() >= pool::PARALLEL_MIN {
            use rayon::slice::ParallelSliceMut;
            pool::install(|| a.par_sort_unstable_by(f64::total_cmp));
        } else {
            a.sort_unstable_by(f64::total_cmp);
        }
        let weighted: f64 = a.iter().enumerate().map(|(i, &v)| (2.0 * i as f64 - n + 1.0) * v).sum();
        (weighted / (n * total), entropy.exp() / n)
    };
    Ok(CreditStats {
        n: m.n,
        mean: m.mean,
        std: (m.m2 / n).sqrt(),
        min,
        max,
        frac_positive: positive as f64 / n,
        gini,
        effective_token_ratio: ratio,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AllValid;

    #[test]
    fn one_hot_and_even() {
        for n in [1usize, 2, 4, 10] {
            let mut x = vec![0.0; n];
            x[n - 1] = 3.0;
            let l = Layout::padded(1, n, n).unwrap();
            let s = credit_stats(&l, &x, AllValid).unwrap();
            assert!((s.gini - (1.0 - 1.0 / n as f64)).abs() < 1e-12);
            assert!((s.effective_token_ratio - 1.0 / n as f64).abs() < 1e-12);
            let s = credit_stats(&l, &vec![-2.0; n], AllValid).unwrap();
            assert!(s.gini.abs() < 1e-12 && (s.effective_token_ratio - 1.0).abs() < 1e-12);
        }
    }

    #[test]
    fn masked_by_hand() {
        // valid [1, −3]: mean −1, std 2, gini = |1−3|·2/(2·4·2) = 0.25
        let l = Layout::padded(1, 3, 3).unwrap();
        let s = credit_stats(&l, &[1.0, -3.0, 7.0], &[true, true, false][..]).unwrap();
        assert_eq!((s.n, s.mean, s.std, s.min, s.max, s.frac_positive), (2, -1.0, 2.0, -3.0, 1.0, 0.5));
        assert!((s.gini - 0.25).abs() < 1e-15);
        assert!(credit_stats(&l, &[1.0; 3], &[false; 3][..]).is_err());
    }
}
