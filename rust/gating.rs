//! Gate mapping: per-token concentration → bounded retention gate (DESIGN §4).
//!
//! ```text
//! z = normalize(c)     Sequence: (c − μ_row)/(σ_row + ε)   over the row's valid tokens
//!                      Batch:    (c − μ)/(σ + ε)           over all valid tokens
//!                      Fixed:    (c − center)/scale
//! z = −z if invert
//! g = low + (high − low) · sigmoid(sharpness · z)
//! ```
//!
//! σ is the population standard deviation (ddof 0), ε = [`STD_EPS`]; a row (or batch)
//! with one valid token or zero spread (max = min) gets `z = 0`. Masked positions get
//! `g = 1`. Statistics are summed in `f64`, row by row in row order, so results do not
//! depend on the thread count.

use crate::checks::{check_len, first_offender, KernelErrorAt};
use crate::element::{Float, Mask};
use crate::error::{KernelError, Result};
use crate::layout::{split_by_tasks, task_size, Layout};
use crate::pool;
use rayon::prelude::*;

/// The ε added to the standard deviation of the z-score.
pub const STD_EPS: f64 = 1e-8;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Normalize {
    Sequence,
    Batch,
    Fixed { center: f64, scale: f64 },
}

#[derive(Debug, Clone, Copy)]
pub struct GateParams {
    pub low: f64,
    pub high: f64,
    pub sharpness: f64,
    pub normalize: Normalize,
    pub invert: bool,
}

impl GateParams {
    fn validate(&self) -> Result<()> {
        let param = |arg, expected: &str, got: f64| {
            Err(KernelError::Parameter { arg, expected: expected.into(), got: format!("{got}") })
        };
        for (arg, x) in [("low", self.low), ("high", self.high)] {
            if !(0.0..=1.0).contains(&x) {
                return param(arg, "a number in [0, 1]", x);
            }
        }
        if self.low > self.high {
            return Err(KernelError::Parameter {
                arg: "low",
                expected: format!("low <= high (high = {})", self.high),
                got: format!("{}", self.low),
            });
        }
        if !self.sharpness.is_finite() {
            return param("sharpness", "a finite number", self.sharpness);
        }
        if let Normalize::Fixed { center, scale } = self.normalize {
            if !center.is_finite() {
                return param("center", "a finite number", center);
            }
            if !(scale.is_finite() && scale > 0.0) {
                return param("scale", "a finite number > 0", scale);
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn gate(&self, z: f64) -> f64 {
        let z = if self.invert { -z } else { z };
        self.low + (self.high - self.low) * (1.0 / (1.0 + (-(self.sharpness * z)).exp()))
    }
}

/// Running statistics of the valid values of one row.
#[derive(Debug, Clone, Copy)]
struct Moments {
    n: usize,
    sum: f64,
    min: f64,
    max: f64,
}

impl Moments {
    const EMPTY: Moments = Moments { n: 0, sum: 0.0, min: f64::INFINITY, max: f64::NEG_INFINITY };

    fn add(&mut self, x: f64) {
        self.n += 1;
        self.sum += x;
        self.min = self.min.min(x);
        self.max = self.max.max(x);
    }

    fn merge(self, o: Moments) -> Moments {
        Moments { n: self.n + o.n, sum: self.sum + o.sum, min: self.min.min(o.min), max: self.max.max(o.max) }
    }

    fn finite(&self) -> bool {
        self.sum.is_finite() && self.min.is_finite() | (self.n == 0) && self.max.is_finite() | (self.n == 0)
    }

    fn mean(&self) -> f64 {
        self.sum / self.n as f64
    }

    /// Whether z-scores are all 0 (one valid token or zero spread).
    fn flat(&self) -> bool {
        self.n <= 1 || self.min == self.max
    }
}

/// The (center, scale) a row's z-score uses: z = (c − center) / scale.
#[derive(Clone, Copy)]
struct Affine {
    center: f64,
    scale: f64,
    zero: bool,
}

fn row_moments<F: Float, M: Mask>(conc: &[F], mask: &M, range: std::ops::Range<usize>) -> Moments {
    let mut m = Moments::EMPTY;
    for i in range {
        // SAFETY: i lies inside the validated layout.
        if unsafe { mask.valid(i) } {
            m.add(conc[i].to_f64());
        }
    }
    m
}

fn row_sq_dev<F: Float, M: Mask>(conc: &[F], mask: &M, range: std::ops::Range<usize>, mean: f64) -> f64 {
    let mut s = 0.0;
    for i in range {
        // SAFETY: i lies inside the validated layout.
        if unsafe { mask.valid(i) } {
            let d = conc[i].to_f64() - mean;
            s += d * d;
        }
    }
    s
}

fn z_affine(m: &Moments, sq_dev: f64) -> Affine {
    if m.flat() {
        return Affine { center: 0.0, scale: 1.0, zero: true };
    }
    let std = (sq_dev / m.n as f64).sqrt();
    Affine { center: m.mean(), scale: std + STD_EPS, zero: false }
}

/// Retention gates from concentration, written into `out`.
pub fn gates_from_concentration<F: Float, M: Mask>(
    layout: &Layout,
    conc: &[F],
    mask: M,
    params: &GateParams,
    out: &mut [F],
) -> Result<()> {
    params.validate()?;
    let n = layout.len();
    check_len("concentration", Some(conc.len()), n)?;
    check_len("mask", mask.len(), n)?;
    check_len("out", Some(out.len()), n)?;
    let rows = layout.rows();

    let affines: Vec<Affine> = pool::install(|| -> Result<Vec<Affine>> {
        // Pass 1: per-row moments (also the finiteness check).
        let moments: Vec<Moments> = (0..rows).into_par_iter().map(|b| row_moments(conc, &mask, layout.row(b))).collect();
        if !moments.iter().all(Moments::finite) {
            let e = first_offender(layout, &mask, |i, valid| {
                let c = conc[i].to_f64();
                (valid && !c.is_finite()).then_some(KernelErrorAt::NonFinite("concentration", c))
            });
            return Err(e.expect("a non-finite moment comes from a non-finite valid value"));
        }
        Ok(match params.normalize {
            Normalize::Fixed { center, scale } => vec![Affine { center, scale, zero: false }; rows],
            Normalize::Sequence => (0..rows)
                .into_par_iter()
                .map(|b| {
                    let m = &moments[b];
                    let sq = if m.flat() { 0.0 } else { row_sq_dev(conc, &mask, layout.row(b), m.mean()) };
                    z_affine(m, sq)
                })
                .collect(),
            Normalize::Batch => {
                let total = moments.iter().fold(Moments::EMPTY, |a, &b| a.merge(b));
                let mean = total.mean();
                let sq = if total.flat() {
                    0.0
                } else {
                    let per_row: Vec<f64> =
                        (0..rows).into_par_iter().map(|b| row_sq_dev(conc, &mask, layout.row(b), mean)).collect();
                    per_row.iter().sum()
                };
                vec![z_affine(&total, sq); rows]
            }
        })
    })?;

    let tasks = layout.tasks(task_size(n, pool::num_threads()));
    let pieces = split_by_tasks(out, &tasks);
    pool::install(|| {
        tasks.par_iter().zip(pieces).for_each(|(task, piece)| {
            for b in task.rows.clone() {
                let af = affines[b];
                for i in layout.row(b) {
                    // SAFETY: i lies inside the validated layout.
                    let valid = unsafe { mask.valid(i) };
                    let g = if !valid {
                        1.0
                    } else if af.zero {
                        params.gate(0.0)
                    } else {
                        params.gate((conc[i].to_f64() - af.center) / af.scale)
                    };
                    piece[i - task.span.start] = F::from_f64(g);
                }
            }
        })
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::AllValid;

    fn params(normalize: Normalize) -> GateParams {
        GateParams { low: 0.5, high: 1.0, sharpness: 1.0, normalize, invert: false }
    }

    #[test]
    fn sequence_zscore_and_masked_one() {
        // valid [1, 3] → μ = 2, σ = 1 → z = ∓1 (up to ε); masked position → 1
        let layout = Layout::padded(1, 3, 3).unwrap();
        let mut g = [0.0; 3];
        gates_from_concentration(&layout, &[1.0, 3.0, 100.0], &[1u8, 1, 0][..], &params(Normalize::Sequence), &mut g)
            .unwrap();
        let s = |z: f64| 0.5 + 0.5 / (1.0 + (-z).exp());
        assert!((g[0] - s(-1.0)).abs() < 1e-7 && (g[1] - s(1.0)).abs() < 1e-7);
        assert_eq!(g[2], 1.0);
    }

    #[test]
    fn flat_rows_get_midpoint_and_errors() {
        let layout = Layout::padded(2, 2, 4).unwrap();
        let mut g = [0.0; 4];
        gates_from_concentration(&layout, &[0.1, 0.1, 5.0, 5.0], AllValid, &params(Normalize::Sequence), &mut g)
            .unwrap();
        assert_eq!(g, [0.75; 4]);
        let bad = GateParams { low: 0.9, high: 0.5, ..params(Normalize::Batch) };
        assert!(gates_from_concentration(&layout, &[0.0; 4], AllValid, &bad, &mut g).is_err());
        let e = gates_from_concentration(&layout, &[0.0, 0.0, 0.0, f64::NAN], AllValid, &params(Normalize::Batch), &mut g)
            .unwrap_err();
        assert!(matches!(e, KernelError::NonFinite { at, .. } if at.row == 1 && at.pos == 1));
    }
}
