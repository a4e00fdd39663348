//! The AVX2 task loop for `f32` arrays with a bool mask (or none) and `f32` gates (or
//! none), the layout of nearly every real call.
//!
//! Everything but the recursion, i.e. loading and widening the inputs, `gg = γ·g`,
//! `δ = r + gg·V_next − V`, `gg·λ`, `R = A^c + V`, narrowing and storing, and the input
//! checks, is done four positions at a time in AVX registers; only
//! `A = δ + (gg·λ)·A_next` stays scalar. With a quarter of the instructions around
//! the recursion, the core keeps far more of the backward stream in flight than the
//! scalar step does, so loads and the recursion overlap instead of taking turns.
//!
//! Like [`super::Kernel::task_body`], a task is one continuous backward stream: its rows
//! from last to first, each backwards. (Tracing two rows at once so that their
//! recursions overlap was tried and measured slower out of cache: two streams per
//! array defeat the prefetchers, most of all on short rows.)
//!
//! The arithmetic is the scalar step's, operation for operation and in `f64` (vector
//! lanes round exactly like scalar instructions and nothing is fused), so the results
//! are bit-identical to [`super::Streams::step`]; the tests compare the two builds.
//! Blocks whose mask is neither all valid nor all masked, and the last `len % 4`
//! positions of a row, take the scalar step.

use std::arch::x86_64::*;

use super::{Out, Streams, Trace};
use crate::element::{Gates, Mask};
use crate::layout::{Layout, Task};

/// The `f32` streams of one call, as raw pointers indexed by flat position.
#[derive(Clone, Copy)]
pub(super) struct Blocks<'a, M, G> {
    pub layout: &'a Layout<'a>,
    pub last_values: Option<&'a [f64]>,
    /// The scalar step over the same arrays, for mixed blocks and the first
    /// `len % 4` positions of each row.
    pub scalar: Streams<f32, M, G>,
    /// Mask bytes (bools), or null when every position is valid.
    pub mask: *const u8,
    /// Gates, or null when every gate is 1.
    pub gates: *const f32,
}

/// Task-wide results of the block checks, reduced once at the end of the task.
struct Flags {
    /// Smallest and largest valid gate seen in blocks (NaN gates are skipped: they
    /// make the trace NaN, which [`super::finish`] catches).
    g_lo: __m128,
    g_hi: __m128,
    /// Lanes that saw a nonzero (or NaN) reward in an all-masked block.
    masked_reward: __m128,
}

impl<M: Mask, G: Gates> Blocks<'_, M, G> {
    /// Computes the rows of `task` into `adv`/`ret` (which cover exactly `task.span`).
    /// Returns whether any input looked wrong (see [`super::finish`]).
    ///
    /// # Safety
    /// The CPU has AVX2; the layout was validated against every array.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn task<const DUAL: bool>(&self, task: &Task, adv: &mut [f32], ret: &mut [f32]) -> bool {
        let base = task.span.start;
        let out = Out { adv: adv.as_mut_ptr().wrapping_sub(base), ret: ret.as_mut_ptr().wrapping_sub(base) };
        let mut flags = Flags { g_lo: _mm_setzero_ps(), g_hi: _mm_set1_ps(1.0), masked_reward: _mm_setzero_ps() };
        let mut bad = false;
        let mut pending = task.rows.clone();
        let mut t = Trace::EMPTY;
        while self.refill(&mut t, &mut pending, &mut bad) {
            while t.left() >= 4 {
                self.block::<DUAL>(&mut t, &out, &mut flags);
            }
            // The row's first `len % 4` positions.
            while t.left() > 0 {
                self.scalar.step::<DUAL>(&mut t, &out);
            }
        }
        let off = _mm_movemask_ps(_mm_cmplt_ps(flags.g_lo, _mm_setzero_ps()))
            | _mm_movemask_ps(_mm_cmpgt_ps(flags.g_hi, _mm_set1_ps(1.0)))
            | _mm_movemask_ps(flags.masked_reward);
        bad | (off != 0)
    }

    /// When `t` has finished its row, records the row's verdict in `bad` and loads
    /// the next pending row (skipping empty ones). Returns whether `t` has positions
    /// left.
    #[inline(always)]
    fn refill(&self, t: &mut Trace, pending: &mut std::ops::Range<usize>, bad: &mut bool) -> bool {
        while t.left() == 0 {
            *bad |= super::finish(t);
            match pending.next_back() {
                Some(b) => *t = Trace::start(self.layout, self.last_values, b),
                None => {
                    *t = Trace::EMPTY;
                    return false;
                }
            }
        }
        true
    }

    /// Four backward steps of `t`: positions `t.next − 4 .. t.next`, lane k of a
    /// vector holding position `t.next − 4 + k`.
    ///
    /// # Safety
    /// `t` has at least four positions left; the CPU has AVX2.
    #[inline(always)]
    unsafe fn block<const DUAL: bool>(&self, t: &mut Trace, out: &Out<f32>, flags: &mut Flags) {
        let s = &self.scalar;
        let i = t.next - 4;
        if !self.mask.is_null() {
            let m = (self.mask.add(i) as *const u32).read_unaligned();
            if m == 0 {
                _mm_storeu_ps(out.adv.wrapping_add(i), _mm_setzero_ps());
                _mm_storeu_ps(out.ret.wrapping_add(i), _mm_setzero_ps());
                if s.strict {
                    let r = _mm_loadu_ps(s.rewards.add(i));
                    flags.masked_reward =
                        _mm_or_ps(flags.masked_reward, _mm_cmp_ps::<_CMP_NEQ_UQ>(r, _mm_setzero_ps()));
                }
                t.next = i;
                return;
            }
            if m != 0x0101_0101 {
                for _ in 0..4 {
                    s.step::<DUAL>(t, out);
                }
                return;
            }
        }
        let r = _mm256_cvtps_pd(_mm_loadu_ps(s.rewards.add(i)));
        let v = _mm256_cvtps_pd(_mm_loadu_ps(s.values.add(i)));
        let gamma = _mm256_set1_pd(s.gamma);
        let gg = if self.gates.is_null() {
            // γ·1 = γ exactly.
            gamma
        } else {
            let g = _mm_loadu_ps(self.gates.add(i));
            // min/max return their second operand when either is NaN: NaN gates never
            // enter the accumulators.
            flags.g_lo = _mm_min_ps(g, flags.g_lo);
            flags.g_hi = _mm_max_ps(g, flags.g_hi);
            _mm256_mul_pd(gamma, _mm256_cvtps_pd(g))
        };
        // V_next of lane k is V of lane k + 1; lane 3 takes the trace's.
        let v_up = _mm256_permute4x64_pd::<0b00_11_10_01>(v);
        let v_next = _mm256_blend_pd::<0b1000>(v_up, _mm256_set1_pd(t.v_next));
        let delta = _mm256_sub_pd(_mm256_add_pd(r, _mm256_mul_pd(gg, v_next)), v);
        let d = lanes(delta);
        let a = chain(d, lanes(_mm256_mul_pd(gg, _mm256_set1_pd(s.lam))), t.a);
        let ac = if DUAL { chain(d, lanes(_mm256_mul_pd(gg, _mm256_set1_pd(s.lam_critic))), t.ac) } else { a };
        t.a = a[0];
        t.ac = ac[0];
        t.v_next = _mm256_cvtsd_f64(v);
        t.next = i;
        _mm_storeu_ps(out.adv.wrapping_add(i), _mm256_cvtpd_ps(vector(a)));
        _mm_storeu_ps(out.ret.wrapping_add(i), _mm256_cvtpd_ps(_mm256_add_pd(vector(ac), v)));
    }
}

/// The recursion over one block, from lane 3 down: `A_k = δ_k + c_k·A_{k+1}`, with
/// `A_4 = next`.
#[inline(always)]
fn chain(d: [f64; 4], c: [f64; 4], next: f64) -> [f64; 4] {
    let a3 = d[3] + c[3] * next;
    let a2 = d[2] + c[2] * a3;
    let a1 = d[1] + c[1] * a2;
    let a0 = d[0] + c[0] * a1;
    [a0, a1, a2, a3]
}

/// The four lanes of a vector as an array (lane k at index k).
#[inline(always)]
fn lanes(x: __m256d) -> [f64; 4] {
    // SAFETY: both types are four f64s with the same layout.
    unsafe { std::mem::transmute::<__m256d, [f64; 4]>(x) }
}

/// An array as the lanes of a vector (index k in lane k).
#[inline(always)]
fn vector(x: [f64; 4]) -> __m256d {
    // SAFETY: both types are four f64s with the same layout.
    unsafe { std::mem::transmute::<[f64; 4], __m256d>(x) }
}
