//! Masked whitening over all valid tokens of a batch (as verl's `masked_whiten`).
//!
//! ```text
//! μ  = Σ x / n                         over the n valid tokens
//! σ² = Σ (x − μ)² / (n − 1)            unbiased
//! w  = (x − μ) · 1/sqrt(σ² + eps)      (+ μ when shift_mean is false)
//! ```
//!
//! Masked positions get 0. Each row's count, mean and squared deviations are computed
//! on its own (one pass of sums and sums of squares, with a second, two-pass-formula
//! pass over the cached row when the first would cancel more than three bits) and
//! merged in row order (Chan et al.), so the result does not depend on the thread count.

use crate::checks::{check_len, first_offender, KernelErrorAt};
use crate::element::{Float, Mask};
use crate::error::{KernelError, Result};
use crate::layout::Layout;
use crate::pool;

/// `Some($body)` with `$m` bound to the mask's typed slice when hand-vectorized loops
/// can read it ([`crate::element::MaskSlice`]), `None` otherwise.
#[cfg(target_arch = "x86_64")]
macro_rules! with_mask_slice {
    ($mask:expr, |$m:ident| $body:expr) => {
        match $mask.slice() {
            Some(crate::element::MaskSlice::Bool($m)) => Some($body),
            Some(crate::element::MaskSlice::F32($m)) => Some($body),
            None => None,
        }
    };
}

/// Count, mean and sum of squared deviations of a set of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moments {
    pub n: usize,
    pub mean: f64,
    pub m2: f64,
}

impl Moments {
    pub const EMPTY: Moments = Moments { n: 0, mean: 0.0, m2: 0.0 };

    /// Chan et al.'s pairwise merge.
    pub fn merge(self, o: Moments) -> Moments {
        if o.n == 0 {
            return self;
        }
        if self.n == 0 {
            return o;
        }
        let n = self.n + o.n;
        let d = o.mean - self.mean;
        let mean = self.mean + d * (o.n as f64 / n as f64);
        let m2 = self.m2 + o.m2 + d * d * (self.n as f64 * o.n as f64 / n as f64);
        Moments { n, mean, m2 }
    }
}

/// Partial sums kept side by side so the loops vectorize (one long chain of
/// dependent additions would run at the adder's latency instead).
const ACC: usize = 16;

/// Moments of the valid values of one row: one pass summing `x` and `x²` into `ACC`
/// partial sums combined in a fixed order, then [`finish_row`] (which may take a second
/// pass over the row, still in cache, when the one-pass variance would cancel).
///
/// The fast form multiplies by the validity (0 or 1), which vectorizes; a NaN or ±inf
/// at a *masked* position would poison it (0·NaN is NaN), so a non-finite result is
/// recomputed with selects, which give the exact answer whatever masked positions hold.
pub fn row_moments<F: Float, M: Mask>(x: &[F], mask: &M, range: std::ops::Range<usize>) -> Moments {
    row_moments_flagged(x, mask, range).0
}

/// [`row_moments`], and whether the row needed the select form (a non-finite value,
/// masked or not).
fn row_moments_flagged<F: Float, M: Mask>(x: &[F], mask: &M, range: std::ops::Range<usize>) -> (Moments, bool) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx2() {
        if let Some(xs) = F::as_f32s(x) {
            // float32 values and a bool or float32 mask, the common cases: the same
            // arithmetic in the same order, written with AVX2 intrinsics (the
            // auto-vectorizer scalarizes the widening of the mask to f64 lanes).
            // SAFETY: the CPU has AVX2; the caller validated range against both slices.
            let fast = unsafe { with_mask_slice!(mask, |ms| avx2::row_moments_f32(xs, ms, range.clone())) };
            match fast {
                Some((m, true)) => return (m, false),
                Some((_, false)) => {
                    return (row_moments_with(x, mask, range, |v, ok| if ok { v } else { 0.0 }).0, true)
                }
                None => {}
            }
        }
        // SAFETY: the CPU has AVX2.
        return unsafe { row_moments_flagged_avx2(x, mask, range) };
    }
    row_moments_flagged_body(x, mask, range)
}

/// Hand-vectorized forms of [`row_moments_with`]'s fast path. Lane `k` of the four
/// 4-lane accumulators is partial sum `k` of the portable code, and the partial sums
/// are combined in the same order, so results are bit-identical to it.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{finish_row, Moments, ACC};
    use std::arch::x86_64::*;

    const _: () = assert!(ACC == 16, "four vectors of four f64 lanes");

    /// What 16 consecutive mask positions hold.
    #[derive(Clone, Copy)]
    pub(super) enum Run {
        Valid,
        Masked,
        Mixed,
    }

    /// A mask element type the hand-vectorized loops read 16 positions at a time.
    pub(super) trait Lanes: Copy {
        /// Whether positions `i..i + 16` are all valid, all masked, or mixed (real masks
        /// come in long runs, so most blocks skip the widening in [`Lanes::validity`]).
        unsafe fn run(m: *const Self, i: usize) -> Run;
        /// Validity of positions `i..i + 16` as four vectors of 0.0/1.0 (the portable
        /// loop's `valid as u8 as f64`), and how many are valid.
        unsafe fn validity(m: *const Self, i: usize) -> ([__m256d; 4], usize);
        /// Validity of position `i` (for the tails).
        unsafe fn valid(m: *const Self, i: usize) -> bool;
    }

    impl Lanes for bool {
        #[inline(always)]
        unsafe fn run(m: *const bool, i: usize) -> Run {
            let bytes = _mm_loadu_si128(m.add(i) as *const __m128i);
            match _mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_setzero_si128())) {
                0 => Run::Valid,
                0xFFFF => Run::Masked,
                _ => Run::Mixed,
            }
        }
        #[inline(always)]
        unsafe fn validity(m: *const bool, i: usize) -> ([__m256d; 4], usize) {
            let bytes = _mm_loadu_si128(m.add(i) as *const __m128i);
            let sums = _mm_sad_epu8(bytes, _mm_setzero_si128());
            let n = (_mm_cvtsi128_si64(sums) + _mm_extract_epi64::<1>(sums)) as usize;
            let ok = [
                _mm256_cvtepi32_pd(_mm_cvtepu8_epi32(bytes)),
                _mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_srli_si128::<4>(bytes))),
                _mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_srli_si128::<8>(bytes))),
                _mm256_cvtepi32_pd(_mm_cvtepu8_epi32(_mm_srli_si128::<12>(bytes))),
            ];
            (ok, n)
        }
        #[inline(always)]
        unsafe fn valid(m: *const bool, i: usize) -> bool {
            *m.add(i)
        }
    }

    impl Lanes for f32 {
        #[inline(always)]
        unsafe fn run(m: *const f32, i: usize) -> Run {
            let zero = _mm_setzero_ps();
            let mut valid = 0;
            for q in 0..4 {
                valid |= _mm_movemask_ps(_mm_cmpneq_ps(_mm_loadu_ps(m.add(i + 4 * q)), zero)) << (4 * q);
            }
            match valid {
                0xFFFF => Run::Valid,
                0 => Run::Masked,
                _ => Run::Mixed,
            }
        }
        #[inline(always)]
        unsafe fn validity(m: *const f32, i: usize) -> ([__m256d; 4], usize) {
            let (zero, one) = (_mm_setzero_ps(), _mm_set1_ps(1.0));
            let mut ok = [_mm256_setzero_pd(); 4];
            let mut n = 0;
            for (q, lanes) in ok.iter_mut().enumerate() {
                // nonzero (NaN included, as `!= 0.0`) is valid
                let valid = _mm_cmpneq_ps(_mm_loadu_ps(m.add(i + 4 * q)), zero);
                n += (_mm_movemask_ps(valid) as u32).count_ones() as usize;
                *lanes = _mm256_cvtps_pd(_mm_and_ps(valid, one));
            }
            (ok, n)
        }
        #[inline(always)]
        unsafe fn valid(m: *const f32, i: usize) -> bool {
            *m.add(i) != 0.0
        }
    }

    /// `x[i..i + 16]` widened to four vectors of f64.
    #[inline(always)]
    unsafe fn values(x: *const f32, i: usize) -> [__m256d; 4] {
        [
            _mm256_cvtps_pd(_mm_loadu_ps(x.add(i))),
            _mm256_cvtps_pd(_mm_loadu_ps(x.add(i + 4))),
            _mm256_cvtps_pd(_mm_loadu_ps(x.add(i + 8))),
            _mm256_cvtps_pd(_mm_loadu_ps(x.add(i + 12))),
        ]
    }

    #[inline(always)]
    unsafe fn lanes(acc: [__m256d; 4]) -> [f64; ACC] {
        let mut out = [0.0f64; ACC];
        for (q, v) in acc.iter().enumerate() {
            _mm256_storeu_pd(out.as_mut_ptr().add(4 * q), *v);
        }
        out
    }

    /// The write pass with every value finite: `out[j] = ((x[j] − mean)·inv + add)·valid
    /// + 0.0`, the portable loop's arithmetic.
    ///
    /// # Safety
    /// The CPU has AVX2; `m` and `out` are at least as long as `x`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn write_f32<L: Lanes>(x: &[f32], m: &[L], mean: f64, inv: f64, add: f64, out: &mut [f32]) {
        debug_assert!(m.len() >= x.len() && out.len() >= x.len());
        write_f32_ptr(x.as_ptr(), m, x.len(), mean, inv, add, out.as_mut_ptr())
    }

    /// [`write_f32`] over raw pointers: `xp` may equal `op` (whitening in place;
    /// each block is loaded before it is stored).
    ///
    /// # Safety
    /// The CPU has AVX2; `xp` and `op` point to `len` floats and `m` has at least
    /// `len` elements; `xp` and `op` are equal or the ranges do not overlap.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn write_f32_ptr<L: Lanes>(
        xp: *const f32,
        m: &[L],
        len: usize,
        mean: f64,
        inv: f64,
        add: f64,
        op: *mut f32,
    ) {
        debug_assert!(m.len() >= len);
        let mp = m.as_ptr();
        let body = len - len % ACC;
        let (mean_v, inv_v, add_v, zero) =
            (_mm256_set1_pd(mean), _mm256_set1_pd(inv), _mm256_set1_pd(add), _mm256_setzero_pd());
        for b in (0..body).step_by(ACC) {
            // All valid: `w·1 + 0` is `w + 0`. All masked: `w·0 + 0` is +0 (w is finite).
            let ok = match L::run(mp, b) {
                Run::Masked => {
                    for q in 0..4 {
                        _mm_storeu_ps(op.add(b + 4 * q), _mm_setzero_ps());
                    }
                    continue;
                }
                Run::Valid => None,
                Run::Mixed => Some(L::validity(mp, b).0),
            };
            let v = values(xp, b);
            for q in 0..4 {
                let w = _mm256_add_pd(_mm256_mul_pd(_mm256_sub_pd(v[q], mean_v), inv_v), add_v);
                let w = match ok {
                    Some(ok) => _mm256_mul_pd(w, ok[q]),
                    None => w,
                };
                _mm_storeu_ps(op.add(b + 4 * q), _mm256_cvtpd_ps(_mm256_add_pd(w, zero)));
            }
        }
        for j in body..len {
            let ok = L::valid(mp, j) as u8 as f64;
            *op.add(j) = ((((*xp.add(j) as f64) - mean) * inv + add) * ok + 0.0) as f32;
        }
    }

    /// Row moments of `x[range]` over `m[range]`, and whether they are finite.
    ///
    /// # Safety
    /// The CPU has AVX2; `range` lies inside both `x` and `m`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn row_moments_f32<L: Lanes>(
        x: &[f32],
        m: &[L],
        range: std::ops::Range<usize>,
    ) -> (Moments, bool) {
        debug_assert!(range.end <= x.len() && range.end <= m.len());
        let (xp, mp) = (x.as_ptr().add(range.start), m.as_ptr().add(range.start));
        let len = range.len();
        let body = len - len % ACC;
        let (mut sum, mut sq) = ([_mm256_setzero_pd(); 4], [_mm256_setzero_pd(); 4]);
        let mut n = 0usize;
        // `x·0` of the all-masked blocks, summed in f32: NaN when one held NaN or ±inf.
        // (Their `d = x·0` would add ±0 to `sum` and +0 to `sq`, which changes neither:
        // the lanes start at +0 and never become −0.)
        let mut masked = _mm_setzero_ps();
        for b in (0..body).step_by(ACC) {
            match L::run(mp, b) {
                // `d = x·1` is `x`.
                Run::Valid => {
                    let v = values(xp, b);
                    n += ACC;
                    for q in 0..4 {
                        sum[q] = _mm256_add_pd(sum[q], v[q]);
                        sq[q] = _mm256_add_pd(sq[q], _mm256_mul_pd(v[q], v[q]));
                    }
                }
                Run::Masked => {
                    for q in 0..4 {
                        masked = _mm_add_ps(masked, _mm_mul_ps(_mm_loadu_ps(xp.add(b + 4 * q)), _mm_setzero_ps()));
                    }
                }
                Run::Mixed => {
                    let ((ok, valid), v) = (L::validity(mp, b), values(xp, b));
                    n += valid;
                    for q in 0..4 {
                        let d = _mm256_mul_pd(v[q], ok[q]);
                        sum[q] = _mm256_add_pd(sum[q], d);
                        sq[q] = _mm256_add_pd(sq[q], _mm256_mul_pd(d, d));
                    }
                }
            }
        }
        let masked_finite = _mm_movemask_ps(_mm_cmpunord_ps(masked, masked)) == 0;
        let (mut sum, mut sq) = (lanes(sum), lanes(sq));
        for j in body..len {
            let ok = L::valid(mp, j);
            n += ok as usize;
            let d = (*xp.add(j) as f64) * (ok as u8 as f64);
            sum[0] += d;
            sq[0] += d * d;
        }
        let (moments, finite) = finish_row(n, sum.iter().sum(), sq.iter().sum(), |mean| {
            let mean_v = _mm256_set1_pd(mean);
            let mut sq = [_mm256_setzero_pd(); 4];
            for b in (0..body).step_by(ACC) {
                let ((ok, _), v) = (L::validity(mp, b), values(xp, b));
                for q in 0..4 {
                    let d = _mm256_mul_pd(_mm256_sub_pd(v[q], mean_v), ok[q]);
                    sq[q] = _mm256_add_pd(sq[q], _mm256_mul_pd(d, d));
                }
            }
            let mut m2 = lanes(sq);
            for j in body..len {
                let ok = L::valid(mp, j) as u8 as f64;
                let d = (*xp.add(j) as f64 - mean) * ok;
                m2[0] += d * d;
            }
            m2.iter().sum()
        });
        (moments, finite & masked_finite)
    }
}

/// The same code compiled for AVX2: widening bools and f32s to f64 lanes is one
/// instruction there, a shuffle cascade on the SSE2 baseline.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_moments_flagged_avx2<F: Float, M: Mask>(
    x: &[F],
    mask: &M,
    range: std::ops::Range<usize>,
) -> (Moments, bool) {
    row_moments_flagged_body(x, mask, range)
}

#[inline(always)]
fn row_moments_flagged_body<F: Float, M: Mask>(x: &[F], mask: &M, range: std::ops::Range<usize>) -> (Moments, bool) {
    let (fast, finite) = row_moments_with(x, mask, range.clone(), |v, ok| v * (ok as u8 as f64));
    if finite {
        (fast, false)
    } else {
        (row_moments_with(x, mask, range, |v, ok| if ok { v } else { 0.0 }).0, true)
    }
}

#[inline(always)]
fn row_moments_with<F: Float, M: Mask>(
    x: &[F],
    mask: &M,
    range: std::ops::Range<usize>,
    keep: impl Fn(f64, bool) -> f64,
) -> (Moments, bool) {
    debug_assert!(range.end <= x.len());
    let xs = &x[range.clone()];
    // SAFETY: k < xs.len(), so range.start + k lies inside the validated layout.
    let at = |k: usize| unsafe { (mask.valid(range.start + k), xs.get_unchecked(k).to_f64()) };
    let len = xs.len();
    let body = len - len % ACC;
    // counts as f64 (exact below 2^53) so that the loop stays in vector registers
    let (mut n, mut sum, mut sq) = ([0.0f64; ACC], [0.0f64; ACC], [0.0f64; ACC]);
    for c in (0..body).step_by(ACC) {
        for k in 0..ACC {
            let (ok, v) = at(c + k);
            let d = keep(v, ok);
            n[k] += ok as u8 as f64;
            sum[k] += d;
            sq[k] += d * d;
        }
    }
    for j in body..len {
        let (ok, v) = at(j);
        let d = keep(v, ok);
        n[0] += ok as u8 as f64;
        sum[0] += d;
        sq[0] += d * d;
    }
    let n = n.iter().sum::<f64>() as usize;
    finish_row(n, sum.iter().sum(), sq.iter().sum(), |mean| {
        let mut m2 = [0.0f64; ACC];
        for c in (0..body).step_by(ACC) {
            for (k, acc) in m2.iter_mut().enumerate() {
                let (ok, v) = at(c + k);
                let d = keep(v - mean, ok);
                *acc += d * d;
            }
        }
        for j in body..len {
            let (ok, v) = at(j);
            let d = keep(v - mean, ok);
            m2[0] += d * d;
        }
        m2.iter().sum()
    })
}

/// A row's moments from its count `n`, sum `S = Σ x` and sum of squares `Q = Σ x²`
/// (valid values only): `mean = S/n` and `m2 = Q − S·mean`.
///
/// The subtraction cancels `log2(Q/m2)` bits, few when the mean is small next to the
/// spread (advantages, the usual input). When more than three bits would go, or `Q`
/// overflowed, `two_pass(mean)` sums the squared deviations from the mean instead
/// (the textbook two-pass formula). Returns the moments and whether they are finite.
#[inline(always)]
fn finish_row(n: usize, total: f64, squares: f64, two_pass: impl FnOnce(f64) -> f64) -> (Moments, bool) {
    if n == 0 {
        return (Moments::EMPTY, total.is_finite() && squares.is_finite());
    }
    let mean = total / n as f64;
    let m2 = squares - total * mean;
    let m2 = if squares.is_finite() && m2 * 8.0 >= squares { m2 } else { two_pass(mean) };
    (Moments { n, mean, m2 }, mean.is_finite() && m2.is_finite())
}

/// The batch moments of the valid values of `x`, merged in row order; a non-finite
/// valid value is an error naming its position.
pub fn batch_moments<F: Float, M: Mask>(layout: &Layout, x: &[F], mask: &M, arg: &'static str) -> Result<Moments> {
    Ok(batch_moments_flagged(layout, x, mask, arg)?.0)
}

/// [`batch_moments`], and whether some masked position holds a non-finite value.
fn batch_moments_flagged<F: Float, M: Mask>(
    layout: &Layout,
    x: &[F],
    mask: &M,
    arg: &'static str,
) -> Result<(Moments, bool)> {
    let rows =
        pool::map_rows(layout, layout.len() >= pool::PARALLEL_MIN, |b| row_moments_flagged(x, mask, layout.row(b)));
    let masked_nonfinite = rows.iter().any(|r| r.1);
    let total = rows.into_iter().map(|r| r.0).fold(Moments::EMPTY, Moments::merge);
    if !(total.mean.is_finite() && total.m2.is_finite()) {
        let e = first_offender(layout, mask, |i, valid| {
            let v = x[i].to_f64();
            (valid && !v.is_finite()).then_some(KernelErrorAt::NonFinite(arg, v))
        });
        return Err(e.unwrap_or(KernelError::Parameter {
            arg,
            expected: "values whose mean and variance are finite".into(),
            got: "values too large to square".into(),
        }));
    }
    Ok((total, masked_nonfinite))
}

/// `(x − mean)·inv + add` at valid positions of `x`, 0 elsewhere, into `out`: verl's
/// `masked_whiten` (module docs).
pub fn masked_whiten<F: Float, M: Mask>(
    layout: &Layout,
    x: &[F],
    mask: M,
    shift_mean: bool,
    eps: f64,
    out: &mut [F],
) -> Result<()> {
    check_len("out", Some(out.len()), layout.len())?;
    let map = WhitenMap::new(layout, x, &mask, shift_mean, eps)?;
    pool::map_pieces(layout, out, |task, piece| map.write(&x[task.span.clone()], task.span.start, piece));
    Ok(())
}

/// [`masked_whiten`] overwriting `x` with its whitened values (for callers that own
/// `x`, such as the verl drop-in: saves allocating, and page-faulting, an output).
pub fn masked_whiten_in_place<F: Float, M: Mask>(
    layout: &Layout,
    x: &mut [F],
    mask: M,
    shift_mean: bool,
    eps: f64,
) -> Result<()> {
    let map = WhitenMap::new(layout, x, &mask, shift_mean, eps)?;
    pool::map_pieces(layout, x, |task, piece| map.write_in_place(task.span.start, piece));
    Ok(())
}

/// The map of the write pass, `w = (x − mean)·inv + add` at valid positions and 0
/// elsewhere, from the batch moments of `x`.
struct WhitenMap<'a, M> {
    mask: &'a M,
    mean: f64,
    inv: f64,
    add: f64,
    /// Some masked position holds NaN/±inf: multiplying by the validity would spread
    /// it, so the write pass selects instead.
    masked_nonfinite: bool,
}

impl<'a, M: Mask> WhitenMap<'a, M> {
    fn new<F: Float>(layout: &Layout, x: &[F], mask: &'a M, shift_mean: bool, eps: f64) -> Result<Self> {
        let n = layout.len();
        check_len("x", Some(x.len()), n)?;
        check_len("mask", mask.len(), n)?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(KernelError::Parameter {
                arg: "eps",
                expected: "a finite number >= 0".into(),
                got: format!("{eps}"),
            });
        }
        let (m, masked_nonfinite) = batch_moments_flagged(layout, x, mask, "x")?;
        if m.n < 2 {
            return Err(KernelError::Parameter {
                arg: "mask",
                expected: "at least 2 valid tokens (the variance is unbiased)".into(),
                got: format!("{} valid token{}", m.n, if m.n == 1 { "" } else { "s" }),
            });
        }
        // zero spread with eps = 0: every valid token whitens to 0 (not 0·inf = NaN)
        let var = m.m2 / (m.n - 1) as f64 + eps;
        let inv = if var > 0.0 { 1.0 / var.sqrt() } else { 0.0 };
        let add = if shift_mean { 0.0 } else { m.mean };
        Ok(WhitenMap { mask, mean: m.mean, inv, add, masked_nonfinite })
    }

    /// One task: `out[j] = w(x[j])`, `x` starting at flat position `base`.
    fn write<F: Float>(&self, x: &[F], base: usize, out: &mut [F]) {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::avx2() {
            if !self.masked_nonfinite {
                if let (Some(xs), Some(o)) = (F::as_f32s(x), F::as_f32s_mut(out)) {
                    let (mean, inv, add) = (self.mean, self.inv, self.add);
                    // SAFETY: the CPU has AVX2; `base + x.len()` lies inside the mask.
                    if unsafe { with_mask_slice!(self.mask, |m| avx2::write_f32(xs, &m[base..], mean, inv, add, o)) }
                        .is_some()
                    {
                        return;
                    }
                }
            }
            // SAFETY: the CPU has AVX2.
            return unsafe { self.write_avx2(x, base, out) };
        }
        self.write_body(x, base, out)
    }

    /// One task in place: `x[j] = w(x[j])`.
    fn write_in_place<F: Float>(&self, base: usize, x: &mut [F]) {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::avx2() {
            if !self.masked_nonfinite {
                if let Some(xs) = F::as_f32s_mut(x) {
                    let (len, p) = (xs.len(), xs.as_mut_ptr());
                    let (mean, inv, add) = (self.mean, self.inv, self.add);
                    // SAFETY: the CPU has AVX2; source and destination are the same
                    // `len` floats; `base + len` lies inside the mask.
                    if unsafe {
                        with_mask_slice!(self.mask, |m| avx2::write_f32_ptr(p, &m[base..], len, mean, inv, add, p))
                    }
                    .is_some()
                    {
                        return;
                    }
                }
            }
            // SAFETY: the CPU has AVX2.
            return unsafe { self.write_in_place_avx2(base, x) };
        }
        self.write_in_place_body(base, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn write_avx2<F: Float>(&self, x: &[F], base: usize, out: &mut [F]) {
        self.write_body(x, base, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn write_in_place_avx2<F: Float>(&self, base: usize, x: &mut [F]) {
        self.write_in_place_body(base, x)
    }

    /// `w` of one value at flat position `i`, every value of the batch finite:
    /// multiplying by the validity is exact and vectorizes (`+ 0.0` turns the −0.0 of
    /// a negative value times 0 into +0.0).
    #[inline(always)]
    fn map<F: Float>(&self, i: usize, x: F) -> F {
        // SAFETY: i lies inside the validated layout.
        let valid = unsafe { self.mask.valid(i) } as u8 as f64;
        F::from_f64(((x.to_f64() - self.mean) * self.inv + self.add) * valid + 0.0)
    }

    /// `w` of one value at flat position `i`, selecting 0 at masked positions
    /// (whatever they hold).
    #[inline(always)]
    fn map_select<F: Float>(&self, i: usize, x: F) -> F {
        let w = (x.to_f64() - self.mean) * self.inv + self.add;
        // SAFETY: i lies inside the validated layout.
        F::from_f64(if unsafe { self.mask.valid(i) } { w } else { 0.0 })
    }

    #[inline(always)]
    fn write_body<F: Float>(&self, x: &[F], base: usize, out: &mut [F]) {
        if self.masked_nonfinite {
            for (j, (o, &xi)) in out.iter_mut().zip(x).enumerate() {
                *o = self.map_select(base + j, xi);
            }
        } else {
            for (j, (o, &xi)) in out.iter_mut().zip(x).enumerate() {
                *o = self.map(base + j, xi);
            }
        }
    }

    #[inline(always)]
    fn write_in_place_body<F: Float>(&self, base: usize, x: &mut [F]) {
        if self.masked_nonfinite {
            for (j, v) in x.iter_mut().enumerate() {
                *v = self.map_select(base + j, *v);
            }
        } else {
            for (j, v) in x.iter_mut().enumerate() {
                *v = self.map(base + j, *v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_loops_match_the_portable_loops() {
        if !crate::cpu::avx2() {
            return;
        }
        let mut s = 7u64;
        let mut next = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 40) as f64 / (1u64 << 24) as f64
        };
        // lengths around the 16-wide blocks; offsets that make the one-pass form cancel
        // (two-pass fallback), all-equal rows, empty and all-masked rows
        for len in [0usize, 1, 2, 15, 16, 17, 31, 33, 100, 257] {
            for offset in [0.0f32, 0.25, 300.0, -1e6] {
                for p_valid in [0.0, 0.5, 1.0] {
                    let x: Vec<f32> = (0..len).map(|_| offset + (next() as f32 - 0.5)).collect();
                    let m: Vec<bool> = (0..len).map(|_| next() < p_valid).collect();
                    let flat: Vec<f32> = vec![offset; len];
                    for xs in [&x, &flat] {
                        let portable = row_moments_with(&xs[..], &&m[..], 0..len, |v, ok| v * (ok as u8 as f64));
                        // SAFETY: AVX2 checked above; the range is the whole slices.
                        let fast = unsafe { avx2::row_moments_f32(xs, &m, 0..len) };
                        let bits = |(r, ok): (Moments, bool)| (r.n, r.mean.to_bits(), r.m2.to_bits(), ok);
                        assert_eq!(bits(portable), bits(fast), "len {len} offset {offset} p {p_valid}");
                        // the write pass, against the portable loop
                        let mask_ref = &m[..];
                        let w = WhitenMap { mask: &mask_ref, mean: 0.3, inv: 1.7, add: -0.5, masked_nonfinite: false };
                        let (mut a, mut b) = (vec![9.0f32; len], vec![9.0f32; len]);
                        w.write_body(&xs[..], 0, &mut a);
                        // SAFETY: AVX2 checked above; all slices have length len.
                        unsafe { avx2::write_f32(xs, &m, 0.3, 1.7, -0.5, &mut b) };
                        let bits32 = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits32(&a), bits32(&b));
                        // in place: the dispatched (AVX2) and the portable forms
                        let (mut c, mut d) = (xs.clone(), xs.clone());
                        w.write_in_place(0, &mut c);
                        w.write_in_place_body(0, &mut d);
                        assert_eq!(bits32(&c), bits32(&a));
                        assert_eq!(bits32(&d), bits32(&a));
                        // a float32 mask (any nonzero, NaN included, is valid)
                        let mf: Vec<f32> = m
                            .iter()
                            .enumerate()
                            .map(|(k, &v)| if !v { 0.0 } else { [1.0, 0.5, -2.0, f32::NAN][k % 4] })
                            .collect();
                        let portable = row_moments_with(&xs[..], &&mf[..], 0..len, |v, ok| v * (ok as u8 as f64));
                        // SAFETY: AVX2 checked above; the range is the whole slices.
                        let fast = unsafe { avx2::row_moments_f32(xs, &mf, 0..len) };
                        assert_eq!(bits(portable), bits(fast), "f32 mask: len {len} offset {offset} p {p_valid}");
                        let mask_f = &mf[..];
                        let wf = WhitenMap { mask: &mask_f, mean: 0.3, inv: 1.7, add: -0.5, masked_nonfinite: false };
                        let (mut e, mut f) = (xs.clone(), vec![9.0f32; len]);
                        wf.write_in_place(0, &mut e);
                        // SAFETY: AVX2 checked above; all slices have length len.
                        unsafe { avx2::write_f32(xs, &mf, 0.3, 1.7, -0.5, &mut f) };
                        assert_eq!(bits32(&e), bits32(&a));
                        assert_eq!(bits32(&f), bits32(&a));
                    }
                }
            }
        }
        // Masks in runs (all-valid, all-masked and mixed 16-blocks in one row), with a
        // NaN or ±inf planted at a masked position: the fast form must flag it as the
        // portable one does.
        let len = 300;
        let m: Vec<bool> = (0..len).map(|i| (i / 37) % 2 == 0).collect();
        for junk in [None, Some(f32::NAN), Some(f32::INFINITY), Some(f32::NEG_INFINITY)] {
            for at in [40usize, 50, 60, 112, 140] {
                assert!(!m[at]);
                let mut x: Vec<f32> = (0..len).map(|_| next() as f32 - 0.5).collect();
                if let Some(j) = junk {
                    x[at] = j;
                }
                let bits = |(r, ok): (Moments, bool)| (r.n, r.mean.to_bits(), r.m2.to_bits(), ok);
                let portable = row_moments_with(&x[..], &&m[..], 0..len, |v, ok| v * (ok as u8 as f64));
                // SAFETY: AVX2 checked above; the range is the whole slices.
                let fast = unsafe { avx2::row_moments_f32(&x, &m, 0..len) };
                assert_eq!(portable.1, junk.is_none());
                if junk.is_none() {
                    assert_eq!(bits(portable), bits(fast));
                } else {
                    assert!(!fast.1, "junk {junk:?} at {at} not flagged");
                }
            }
        }
    }

    #[test]
    fn by_hand() {
        // valid [1, 2, 3, 4]: μ 2.5, σ² = 5/3
        let l = Layout::padded(2, 3, 6).unwrap();
        let mut out = [9.0; 6];
        let m = [1u8, 1, 0, 1, 1, 0];
        masked_whiten(&l, &[1.0, 2.0, 99.0, 3.0, 4.0, f64::NAN], &m[..], true, 0.0, &mut out).unwrap();
        let d = (5.0f64 / 3.0).sqrt();
        let want = [-1.5 / d, -0.5 / d, 0.0, 0.5 / d, 1.5 / d, 0.0];
        for (a, b) in out.iter().zip(want) {
            assert!((a - b).abs() < 1e-15);
        }
        let e = masked_whiten(&l, &[1.0; 6], &[0u8, 0, 0, 1, 0, 0][..], true, 1e-8, &mut out).unwrap_err();
        assert!(e.to_string().contains("at least 2"), "{e}");
        // in place: the same numbers, masked NaN included
        let mut x = [1.0, 2.0, 99.0, 3.0, 4.0, f64::NAN];
        masked_whiten_in_place(&l, &mut x, &m[..], true, 0.0).unwrap();
        for (a, b) in x.iter().zip(want) {
            assert!((a - b).abs() < 1e-15);
        }
        let mut x = [1.0f32, 2.0, 99.0, 3.0, 4.0, -7.0];
        let (mut o, m) = ([0.0f32; 6], [true, true, false, true, true, false]);
        masked_whiten(&l, &x, &m[..], false, 1e-8, &mut o).unwrap();
        masked_whiten_in_place(&l, &mut x, &m[..], false, 1e-8).unwrap();
        assert_eq!(x, o);
    }

    #[test]
    fn merge_matches_one_pass() {
        let xs = [1.0, 5.0, -2.0, 7.5, 3.25, 0.0, 11.0];
        let all = row_moments(&xs, &crate::AllValid, 0..7);
        let merged = row_moments(&xs, &crate::AllValid, 0..3).merge(row_moments(&xs, &crate::AllValid, 3..7));
        assert!((all.mean - merged.mean).abs() < 1e-14 && (all.m2 - merged.m2).abs() < 1e-12);
    }
}
