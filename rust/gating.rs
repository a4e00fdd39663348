//! Gate mapping: per-token concentration → bounded retention gate (docs/design.md §4).
//!
//! ```text
//! z = normalize(c)     Causal:   (c_t − μ_≤t)/(S(σ_≤t) + ε)   over the row's valid tokens s ≤ t
//!                      Sequence: (c − μ_row)/(S(σ_row) + ε)   over the row's valid tokens
//!                      Batch:    (c − μ)/(S(σ) + ε)           over all valid tokens
//!                      Fixed:    (c − center)/scale
//!                      S(σ) = max(σ, min_spread) where min_spread > 0, else σ
//! z = −z if invert
//! g = low + (high − low) · sigmoid(sharpness · z)
//! ```
//!
//! σ is the population standard deviation (ddof 0), ε = [`STD_EPS`]; `min_spread` (a floor
//! in the concentration's units, 0 = none: the mapping before it existed, bit for bit) keeps
//! a row whose values barely vary near the midpoint gate; a row (or batch,
//! or for `Causal` a row's valid prefix up to t) with one valid token or zero spread
//! (max = min) gets `z = 0`. Masked positions get `g = 1`. `Causal` makes one pass over
//! each row with running Welford statistics (see [`causal_row`]), so the gate at t
//! depends on nothing after t. Statistics are summed in `f64`, row by row in row order,
//! so results do not depend on the thread count. Float32 concentration takes its
//! `Sequence`/`Batch` moments from [`crate::whiten`]'s one-pass row moments; the sigmoid
//! uses [`crate::exp`], plain arithmetic within a few ulp of libm, so the token loop
//! vectorizes.

use crate::checks::{check_len, first_offender, KernelErrorAt};
use crate::element::{Float, Mask};
use crate::error::{KernelError, Result};
use crate::layout::Layout;
use crate::pool;
use crate::whiten::{batch_moments, row_moments, Moments};

/// The ε added to the standard deviation of the z-score.
pub const STD_EPS: f64 = 1e-8;

/// The z-score of the mapping (`Causal`: at t, against the mean and spread of the row's
/// valid tokens ≤ t).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Normalize {
    Causal,
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
    /// Floor on the z-score's σ (`Causal`, `Sequence`, `Batch`), in the concentration's
    /// units; 0 is no floor.
    pub min_spread: f64,
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
        if !(self.min_spread.is_finite() && self.min_spread >= 0.0) {
            return param("min_spread", "a finite number >= 0", self.min_spread);
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

    /// The floor on σ for values scaled by `k` (see [`Range::scale`]): `min_spread · k`.
    fn floor(&self, k: f64) -> f64 {
        self.min_spread * k
    }

    /// `g = low + (high − low) · sigmoid(sharpness · ±z)`, with the sigmoid of
    /// [`crate::exp`] (plain arithmetic, so the token loop vectorizes).
    #[inline(always)]
    fn gate(&self, z: f64) -> f64 {
        let z = if self.invert { -z } else { z };
        // 0·inf (sharpness 0, an overflowing fixed z-score) is the midpoint, not NaN
        let x = self.sharpness * z;
        let x = if x.is_nan() { 0.0 } else { x };
        self.low + (self.high - self.low) * crate::exp::sigmoid(x)
    }
}

/// Count, range and finiteness of the valid values of one row (or of the batch).
#[derive(Debug, Clone, Copy)]
struct Range {
    n: usize,
    min: f64,
    max: f64,
    finite: bool,
}

impl Range {
    const EMPTY: Range = Range { n: 0, min: f64::INFINITY, max: f64::NEG_INFINITY, finite: true };

    fn merge(self, o: Range) -> Range {
        Range { n: self.n + o.n, min: self.min.min(o.min), max: self.max.max(o.max), finite: self.finite & o.finite }
    }

    /// Whether z-scores are all 0 (at most one valid token, or zero spread).
    fn flat(&self) -> bool {
        self.n <= 1 || self.min == self.max
    }

    /// A power of two that brings the values below 2^±500 so that sums of them and
    /// of their squared deviations cannot overflow; exact, so ordinary values
    /// (scale 1) are unaffected.
    fn scale(&self) -> f64 {
        let amax = self.min.abs().max(self.max.abs());
        if amax > 1e150 {
            (-(amax.log2().ceil())).exp2()
        } else {
            1.0
        }
    }
}

/// How a group's z-score is computed: `z = (c·k − center) / scale`.
#[derive(Clone, Copy)]
struct Affine {
    k: f64,
    center: f64,
    scale: f64,
    zero: bool,
}

impl Affine {
    const ZERO: Affine = Affine { k: 1.0, center: 0.0, scale: 1.0, zero: true };
}

fn row_range<F: Float, M: Mask>(conc: &[F], mask: &M, range: std::ops::Range<usize>) -> Range {
    let mut m = Range::EMPTY;
    for i in range {
        // SAFETY: i lies inside the validated layout.
        if unsafe { mask.valid(i) } {
            let x = conc[i].to_f64();
            m.n += 1;
            m.min = m.min.min(x);
            m.max = m.max.max(x);
            m.finite &= x.is_finite();
        }
    }
    m
}

/// Σ c·k over the valid values of a row.
fn row_sum<F: Float, M: Mask>(conc: &[F], mask: &M, range: std::ops::Range<usize>, k: f64) -> f64 {
    let mut s = 0.0;
    for i in range {
        // SAFETY: i lies inside the validated layout.
        if unsafe { mask.valid(i) } {
            s += conc[i].to_f64() * k;
        }
    }
    s
}

/// Σ (c·k − mean)² over the valid values of a row.
fn row_sq_dev<F: Float, M: Mask>(conc: &[F], mask: &M, range: std::ops::Range<usize>, k: f64, mean: f64) -> f64 {
    let mut s = 0.0;
    for i in range {
        // SAFETY: i lies inside the validated layout.
        if unsafe { mask.valid(i) } {
            let d = conc[i].to_f64() * k - mean;
            s += d * d;
        }
    }
    s
}

/// `S(σ)` of the module docstring: `max(σ, floor)` where `floor > 0`, else `σ` itself (so a
/// zero floor leaves every value, NaN included, as it was).
#[inline(always)]
fn floored(std: f64, floor: f64) -> f64 {
    if floor > 0.0 {
        std.max(floor)
    } else {
        std
    }
}

fn z_affine(r: &Range, k: f64, sum: f64, sq_dev: f64, floor: f64) -> Affine {
    if r.flat() {
        return Affine::ZERO;
    }
    let mean = sum / r.n as f64;
    let std = (sq_dev / r.n as f64).sqrt();
    Affine { k, center: mean, scale: floored(std, floor) + STD_EPS * k, zero: false }
}

/// The z-score maps of float32 concentration, from the moments [`crate::whiten`]
/// computes (one pass of `Σ c` and `Σ c²` per row, hand-vectorized for bool masks):
/// `z = (c − μ) / (S(sqrt(m2/n)) + ε)`.
///
/// Float32 values make this exact where it matters: a row of equal values has a mean
/// equal to them and `m2 = 0` exactly (see `whiten::finish_row`), so "zero spread"
/// is `m2 == 0`; and squares of float32 values cannot overflow, so no power-of-two
/// scaling is needed. Returns `None` when a row's moments are not finite (a NaN or
/// ±inf at a valid position), leaving the error to the general path.
fn f32_affines<F: Float, M: Mask>(
    layout: &Layout,
    conc: &[F],
    mask: &M,
    params: &GateParams,
) -> Result<Option<Vec<Affine>>> {
    let rows = layout.rows();
    let parallel = layout.len() >= pool::PARALLEL_MIN;
    let affine = |m: &Moments| {
        if m.n <= 1 || m.m2 == 0.0 {
            Affine::ZERO
        } else {
            let std = floored((m.m2 / m.n as f64).sqrt(), params.floor(1.0));
            Affine { k: 1.0, center: m.mean, scale: std + STD_EPS, zero: false }
        }
    };
    let finite = |m: &Moments| m.mean.is_finite() && m.m2.is_finite();
    Ok(match params.normalize {
        Normalize::Fixed { .. } | Normalize::Causal => None,
        Normalize::Sequence => {
            let moments = pool::map_rows(layout, parallel, |b| row_moments(conc, mask, layout.row(b)));
            moments.iter().all(finite).then(|| moments.iter().map(affine).collect())
        }
        Normalize::Batch => match batch_moments(layout, conc, mask, "concentration") {
            Ok(m) => Some(vec![affine(&m); rows]),
            Err(KernelError::NonFinite { .. }) => None,
            Err(e) => return Err(e),
        },
    })
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
    if params.normalize == Normalize::Causal {
        return causal_gates(layout, conc, mask, params, out);
    }
    let rows = layout.rows();

    let parallel = n >= pool::PARALLEL_MIN;
    let per_row = |f: &(dyn Fn(usize) -> f64 + Sync)| pool::map_rows(layout, parallel, f);
    let fast = if F::as_f32s(conc).is_some() { f32_affines(layout, conc, &mask, params)? } else { None };
    let affines: Vec<Affine> = if let Some(a) = fast {
        a
    } else {
        (|| -> Result<Vec<Affine>> {
            // Pass 1: per-row count, range and finiteness.
            let ranges: Vec<Range> = pool::map_rows(layout, parallel, |b| row_range(conc, &mask, layout.row(b)));
            if !ranges.iter().all(|r| r.finite) {
                let e = first_offender(layout, &mask, |i, valid| {
                    let c = conc[i].to_f64();
                    (valid && !c.is_finite()).then_some(KernelErrorAt::NonFinite("concentration", c))
                });
                // A range is marked non-finite only by a non-finite valid value, which
                // the scan finds; the fallback only keeps this path panic-free.
                return Err(e.unwrap_or(KernelError::Parameter {
                    arg: "concentration",
                    expected: "finite values at valid positions".into(),
                    got: "a non-finite value".into(),
                }));
            }
            Ok(match params.normalize {
                Normalize::Fixed { center, scale } => vec![Affine { k: 1.0, center, scale, zero: false }; rows],
                Normalize::Causal => unreachable!("causal gates take causal_gates"),
                Normalize::Sequence => pool::map_rows(layout, parallel, |b| {
                    let r = &ranges[b];
                    if r.flat() {
                        return Affine::ZERO;
                    }
                    let k = r.scale();
                    let sum = row_sum(conc, &mask, layout.row(b), k);
                    let sq = row_sq_dev(conc, &mask, layout.row(b), k, sum / r.n as f64);
                    z_affine(r, k, sum, sq, params.floor(k))
                }),
                Normalize::Batch => {
                    let total = ranges.iter().fold(Range::EMPTY, |a, &b| a.merge(b));
                    if total.flat() {
                        vec![Affine::ZERO; rows]
                    } else {
                        // per-row partial sums, added in row order: thread-count independent
                        let k = total.scale();
                        let sum: f64 = per_row(&|b| row_sum(conc, &mask, layout.row(b), k)).iter().sum();
                        let mean = sum / total.n as f64;
                        let sqs = per_row(&|b| row_sq_dev(conc, &mask, layout.row(b), k, mean));
                        vec![z_affine(&total, k, sum, sqs.iter().sum(), params.floor(k)); rows]
                    }
                }
            })
        })()?
    };

    pool::map_pieces(layout, out, |task, piece| {
        for b in task.rows.clone() {
            let span = layout.row(b);
            let o = &mut piece[span.start - task.span.start..span.end - task.span.start];
            write_row(&conc[span.clone()], &mask, span.start, &affines[b], params, o);
        }
    });
    Ok(())
}

/// The gates of one row: `out[j] = gate(z(c[j]))` at valid positions, 1 elsewhere.
fn write_row<F: Float, M: Mask>(conc: &[F], mask: &M, base: usize, af: &Affine, params: &GateParams, out: &mut [F]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { write_row_avx2(conc, mask, base, af, params, out) };
    }
    write_row_body(conc, mask, base, af, params, out)
}

/// The same loop compiled for AVX2 (four f64 lanes of the sigmoid at a time).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn write_row_avx2<F: Float, M: Mask>(
    conc: &[F],
    mask: &M,
    base: usize,
    af: &Affine,
    params: &GateParams,
    out: &mut [F],
) {
    write_row_body(conc, mask, base, af, params, out)
}

#[inline(always)]
fn write_row_body<F: Float, M: Mask>(
    conc: &[F],
    mask: &M,
    base: usize,
    af: &Affine,
    params: &GateParams,
    out: &mut [F],
) {
    // a flat row: every valid gate is the midpoint
    let flat = params.gate(0.0);
    let Affine { k, center, scale, zero } = *af;
    for (j, (o, c)) in out.iter_mut().zip(conc).enumerate() {
        // SAFETY: base + j lies inside the validated layout.
        let valid = unsafe { mask.valid(base + j) };
        let g = if zero { flat } else { params.gate((c.to_f64() * k - center) / scale) };
        *o = F::from_f64(if valid { g } else { 1.0 });
    }
}

/// Positions whose running statistics [`causal_row`] collects before it maps them to
/// gates: the statistics are a sequential recursion, the square roots, divisions and
/// sigmoids are not, so a block on the stack (64 × 17 bytes) lets those vectorize with no
/// per-token buffer: the kernel reads the concentration and mask once and writes the gates
/// once, its memory floor.
const CAUSAL_BLOCK: usize = 64;

/// Causal gates: every row by [`causal_row`], written into `out`.
fn causal_gates<F: Float, M: Mask>(
    layout: &Layout,
    conc: &[F],
    mask: M,
    params: &GateParams,
    out: &mut [F],
) -> Result<()> {
    let finite = pool::map_pieces(layout, out, |task, piece| {
        let mut finite = true;
        for b in task.rows.clone() {
            let span = layout.row(b);
            let o = &mut piece[span.start - task.span.start..span.end - task.span.start];
            finite &= causal_row(&conc[span.clone()], &mask, span.start, params, o);
        }
        finite
    });
    if finite.iter().all(|&f| f) {
        return Ok(());
    }
    let e = first_offender(layout, &mask, |i, valid| {
        let c = conc[i].to_f64();
        (valid && !c.is_finite()).then_some(KernelErrorAt::NonFinite("concentration", c))
    });
    // causal_row reports false only for a non-finite valid value, which the scan finds;
    // the fallback only keeps this path panic-free.
    Err(e.unwrap_or(KernelError::Parameter {
        arg: "concentration",
        expected: "finite values at valid positions".into(),
        got: "a non-finite value".into(),
    }))
}

/// The causal gates of one row; false when a valid value is not finite (`out` is then
/// left partly written and the caller raises the error).
///
/// One pass with running statistics of the valid prefix (Welford's recursion, which
/// never subtracts two large nearly equal sums, so the spread of values far from 0 keeps
/// its precision). For the n-th valid value x (scaled by `k`, below):
///
/// ```text
/// δ = x − μ;   μ += δ/n;   M2 += δ·(x − μ)          (M2 = Σ (x_s − μ)² over the prefix)
/// z = (x − μ)/(S(sqrt(M2/n)) + ε·k)                0 while the prefix's max == min
///                                                  (S: the floor min_spread·k, if any)
/// ```
///
/// (`δ/n` is taken as `δ·(1/n)`, which keeps the division off the recursion's chain of
/// dependent operations.) The running min and max give the zero-spread rule exactly, as
/// `Sequence` applies it to the whole row. The statistics are kept for `c·k` with `k = 1`;
/// a row of finite values so large that `δ` or `M2` overflow (|c| beyond ~1e150, float64
/// only) is computed again with `k` a power of two that brings every |c·k| to at most 1,
/// which changes no z-score except through `ε·k` (as `Sequence` scales huge rows).
fn causal_row<F: Float, M: Mask>(conc: &[F], mask: &M, base: usize, params: &GateParams, out: &mut [F]) -> bool {
    match causal_row_scaled(conc, mask, base, params, 1.0, out) {
        RowEnd::Done => true,
        RowEnd::NonFinite => false,
        RowEnd::Overflow(amax) => {
            // a power of two that brings every value to |c·k| <= 1 (exact)
            let k = (-(amax.log2().ceil())).exp2();
            matches!(causal_row_scaled(conc, mask, base, params, k, out), RowEnd::Done)
        }
    }
}

/// How a pass of [`causal_row_scaled`] ended.
enum RowEnd {
    Done,
    /// A valid value is NaN or ±inf.
    NonFinite,
    /// Every valid value is finite but the running statistics overflowed; the row's
    /// largest |c|.
    Overflow(f64),
}

/// The running statistics of a row's valid prefix (see [`causal_row`]).
struct Running {
    n: f64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
}

impl Running {
    /// Takes in the next valid value `x` (already scaled) and returns `(x − μ, M2/n)` of
    /// the prefix that ends with it: `z = (x − μ)/(sqrt(M2/n) + ε·k)`. `x − μ` is 0 while
    /// the prefix's max == min, so that z is then 0 exactly.
    #[inline(always)]
    fn push(&mut self, x: f64) -> (f64, f64) {
        self.n += 1.0;
        let delta = x - self.mean;
        self.mean += delta * (1.0 / self.n);
        let dev = x - self.mean;
        self.m2 += delta * dev;
        self.min = self.min.min(x);
        self.max = self.max.max(x);
        (if self.min == self.max { 0.0 } else { dev }, self.m2 / self.n)
    }
}

fn causal_row_scaled<F: Float, M: Mask>(
    conc: &[F],
    mask: &M,
    base: usize,
    params: &GateParams,
    k: f64,
    out: &mut [F],
) -> RowEnd {
    let mut run = Running { n: 0.0, mean: 0.0, m2: 0.0, min: f64::INFINITY, max: f64::NEG_INFINITY };
    let mut finite = true;
    // per position of the block: x − μ and M2/n of its prefix (0 and 0 when masked)
    let mut dev = [0.0f64; CAUSAL_BLOCK];
    let mut var = [0.0f64; CAUSAL_BLOCK];
    let mut valid = [false; CAUSAL_BLOCK];
    for (block, (cs, os)) in conc.chunks(CAUSAL_BLOCK).zip(out.chunks_mut(CAUSAL_BLOCK)).enumerate() {
        let at = base + block * CAUSAL_BLOCK;
        for (j, c) in cs.iter().enumerate() {
            // SAFETY: at + j lies inside the validated layout.
            let v = unsafe { mask.valid(at + j) };
            valid[j] = v;
            (dev[j], var[j]) = (0.0, 0.0);
            if v {
                let x = c.to_f64();
                finite &= x.is_finite();
                (dev[j], var[j]) = run.push(x * k);
            }
        }
        let n = cs.len();
        write_block(&dev[..n], &var[..n], &valid[..n], STD_EPS * k, params.floor(k), params, os);
    }
    if !finite {
        RowEnd::NonFinite
    } else if !(run.mean.is_finite() && run.m2.is_finite()) {
        RowEnd::Overflow(run.min.abs().max(run.max.abs()))
    } else {
        RowEnd::Done
    }
}

/// `out[j] = gate(dev[j]/(S(sqrt(var[j])) + eps))` where `valid[j]`, 1 elsewhere: the
/// square roots, divisions and sigmoids of a block, which the AVX2 build vectorizes.
fn write_block<F: Float>(
    dev: &[f64],
    var: &[f64],
    valid: &[bool],
    eps: f64,
    floor: f64,
    params: &GateParams,
    out: &mut [F],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2() {
        // SAFETY: the CPU has AVX2.
        return unsafe { write_block_avx2(dev, var, valid, eps, floor, params, out) };
    }
    write_block_body(dev, var, valid, eps, floor, params, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn write_block_avx2<F: Float>(
    dev: &[f64],
    var: &[f64],
    valid: &[bool],
    eps: f64,
    floor: f64,
    params: &GateParams,
    out: &mut [F],
) {
    write_block_body(dev, var, valid, eps, floor, params, out)
}

#[inline(always)]
fn write_block_body<F: Float>(
    dev: &[f64],
    var: &[f64],
    valid: &[bool],
    eps: f64,
    floor: f64,
    params: &GateParams,
    out: &mut [F],
) {
    let blocks = out.iter_mut().zip(dev).zip(var).zip(valid);
    if floor > 0.0 {
        for (((o, &d), &v2), &ok) in blocks {
            let g = params.gate(d / (v2.sqrt().max(floor) + eps));
            *o = F::from_f64(if ok { g } else { 1.0 });
        }
    } else {
        // no floor: the loop as it was before `min_spread` (bit for bit)
        for (((o, &d), &v2), &ok) in blocks {
            let g = params.gate(d / (v2.sqrt() + eps));
            *o = F::from_f64(if ok { g } else { 1.0 });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::AllValid;

    fn params(normalize: Normalize) -> GateParams {
        GateParams { low: 0.5, high: 1.0, sharpness: 1.0, normalize, invert: false, min_spread: 0.0 }
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
        let e =
            gates_from_concentration(&layout, &[0.0, 0.0, 0.0, f64::NAN], AllValid, &params(Normalize::Batch), &mut g)
                .unwrap_err();
        assert!(matches!(e, KernelError::NonFinite { at, .. } if at.row == 1 && at.pos == 1));
    }

    /// The causal z-score of a row's valid values, straight from the definition.
    fn prefix_z(vals: &[f64]) -> Vec<f64> {
        (1..=vals.len())
            .map(|t| {
                let p = &vals[..t];
                let (lo, hi) = p.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
                if lo == hi {
                    return 0.0;
                }
                let mean = p.iter().sum::<f64>() / t as f64;
                let var = p.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / t as f64;
                (vals[t - 1] - mean) / (var.sqrt() + STD_EPS)
            })
            .collect()
    }

    #[test]
    fn causal_is_the_running_zscore_and_ignores_the_future() {
        // row 0 valid [2, 2, 5, 1, 7] with a masked 100 inside; row 1: one valid token
        let conc = [2.0, 2.0, 100.0, 5.0, 1.0, 7.0, 3.0, 9.0, 9.0, 9.0, 9.0, 9.0];
        let mask = [1u8, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0];
        let layout = Layout::padded(2, 6, 12).unwrap();
        let p = GateParams { low: 0.0, high: 1.0, ..params(Normalize::Causal) };
        let mut g = [0.0; 12];
        gates_from_concentration(&layout, &conc, &mask[..], &p, &mut g).unwrap();
        let z = prefix_z(&[2.0, 2.0, 5.0, 1.0, 7.0]);
        assert_eq!(&z[..2], &[0.0, 0.0]); // one token, then zero spread
        let want = [z[0], z[1], f64::NAN, z[2], z[3], z[4]].map(|z| 1.0 / (1.0 + (-z).exp()));
        for j in [0, 1, 3, 4, 5] {
            assert!((g[j] - want[j]).abs() < 1e-12, "{j}: {} vs {}", g[j], want[j]);
        }
        assert_eq!(g[2], 1.0);
        assert_eq!(g[6], 0.5);
        assert!(g[7..].iter().all(|&x| x == 1.0));
        // changing the last value moves no earlier gate
        let mut later = conc;
        later[5] = -40.0;
        let mut g2 = [0.0; 12];
        gates_from_concentration(&layout, &later, &mask[..], &p, &mut g2).unwrap();
        assert_eq!(g[..5], g2[..5]);
        assert_ne!(g[5], g2[5]);
        // a NaN at a valid position is the error of the other modes
        later[4] = f64::NAN;
        let e = gates_from_concentration(&layout, &later, &mask[..], &p, &mut g2).unwrap_err();
        assert!(matches!(e, KernelError::NonFinite { at, .. } if at.row == 0 && at.pos == 4));
    }

    #[test]
    fn min_spread_floors_the_zscore_spread() {
        // valid [1, 3] (σ = 1) and a masked 100; row 1 [0, 0.002] (σ = 0.001)
        let conc = [1.0, 3.0, 100.0, 0.0, 0.002, 0.0];
        let mask = [1u8, 1, 0, 1, 1, 0];
        let layout = Layout::padded(2, 3, 6).unwrap();
        let s = |z: f64| 0.5 + 0.5 / (1.0 + (-z).exp());
        for normalize in [Normalize::Sequence, Normalize::Causal] {
            // a floor of 2 halves row 0's z-scores; row 1's 0.001 becomes 0.001/2
            let p = GateParams { min_spread: 2.0, ..params(normalize) };
            let mut g = [0.0; 6];
            gates_from_concentration(&layout, &conc, &mask[..], &p, &mut g).unwrap();
            let z1 = if normalize == Normalize::Causal { 0.0 } else { -0.5 };
            assert!((g[0] - s(z1)).abs() < 1e-9 && (g[1] - s(0.5)).abs() < 1e-9, "{normalize:?} {g:?}");
            assert!((g[4] - s(0.0005)).abs() < 1e-9, "{normalize:?} {g:?}");
            assert_eq!((g[2], g[5]), (1.0, 1.0));
            // a floor below every σ changes nothing; a zero floor is the mapping without one
            let (mut low, mut none) = ([0.0; 6], [0.0; 6]);
            let below = GateParams { min_spread: 1e-4, ..params(normalize) };
            gates_from_concentration(&layout, &conc, &mask[..], &below, &mut low).unwrap();
            gates_from_concentration(&layout, &conc, &mask[..], &params(normalize), &mut none).unwrap();
            assert_eq!(low, none);
            // f32 (Sequence: the moments of crate::whiten) floors the same way
            let c32 = conc.map(|x| x as f32);
            let mut g32 = [0.0f32; 6];
            gates_from_concentration(&layout, &c32, &mask[..], &p, &mut g32).unwrap();
            assert!(g32.iter().zip(&g).all(|(a, b)| (*a as f64 - b).abs() < 1e-6), "{g32:?} vs {g:?}");
        }
        for bad in [-1e-3, f64::NAN, f64::INFINITY] {
            let p = GateParams { min_spread: bad, ..params(Normalize::Batch) };
            let e = gates_from_concentration(&layout, &conc, &mask[..], &p, &mut [0.0; 6]).unwrap_err();
            assert!(matches!(e, KernelError::Parameter { arg: "min_spread", .. }), "{e:?}");
        }
    }

    #[test]
    fn causal_welford_keeps_precision_far_from_zero() {
        // values 1e9 + steps of 0.25: Σx² − (Σx)²/n would be off by ~1e2 in n·σ² ≈ 1e2
        // (one ulp of Σx² ≈ 3e20); Welford's error is the roundoff of μ (~1e-7 of σ ≈ 1)
        let vals: Vec<f64> = (0..300).map(|i| 1e9 + ((i * 37) % 11) as f64 * 0.25).collect();
        let centered: Vec<f64> = vals.iter().map(|v| v - 1e9).collect();
        let layout = Layout::padded(1, 300, 300).unwrap();
        let p = params(Normalize::Causal);
        let (mut g, mut g0) = (vec![0.0; 300], vec![0.0; 300]);
        gates_from_concentration(&layout, &vals, AllValid, &p, &mut g).unwrap();
        gates_from_concentration(&layout, &centered, AllValid, &p, &mut g0).unwrap();
        for (a, b) in g.iter().zip(&g0) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn causal_huge_values_are_rescaled() {
        let layout = Layout::padded(1, 4, 4).unwrap();
        let p = params(Normalize::Causal);
        let (mut g, mut small) = ([0.0f64; 4], [0.0f64; 4]);
        gates_from_concentration(&layout, &[1.7e308, -1.7e308, 1.7e308, 0.0], AllValid, &p, &mut g).unwrap();
        gates_from_concentration(&layout, &[1.7, -1.7, 1.7, 0.0], AllValid, &p, &mut small).unwrap();
        for (a, b) in g.iter().zip(small) {
            assert!((a - b).abs() < 1e-8, "{g:?} vs {small:?}");
        }
    }

    #[test]
    fn huge_finite_values_do_not_overflow() {
        // sums of 1e308s overflow f64; the power-of-two scaling keeps the z-scores right
        let layout = Layout::padded(1, 3, 3).unwrap();
        let mut g = [0.0f64; 3];
        let p = params(Normalize::Sequence);
        gates_from_concentration(&layout, &[1.7e308, 1.7e308, 1.0], AllValid, &p, &mut g).unwrap();
        let mut small = [0.0; 3];
        gates_from_concentration(&layout, &[1.7, 1.7, 1e-308], AllValid, &p, &mut small).unwrap();
        for (a, b) in g.iter().zip(small) {
            assert!((a - b).abs() < 1e-8, "{g:?} vs {small:?}"); // ε differs in scale
        }
    }
}
