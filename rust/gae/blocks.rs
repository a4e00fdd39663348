//! The AVX2 task loop for `f32` arrays with a bool mask (or none) and `f32` gates (or
//! none), the layout of nearly every real call.
//!
//! A block of four valid positions is computed in AVX registers, lane k holding
//! position `i + k`: loading and widening the inputs, `gg = γ·g`, `δ = r + gg·V_next −
//! V`, `c = gg·λ`, the scan of [`super::unroll`] (two shuffle-multiply-add steps), `A =
//! S + P·A_next`, `R = A^c + V`, narrowing and storing, and the input checks. From
//! block to block the only dependency is one multiply and one add, so the core keeps
//! many blocks in flight and the loads overlap the arithmetic.
//!
//! Like [`super::Kernel::task_body`], a task is one continuous backward stream: its rows
//! from last to first, each backwards. (Tracing two rows at once was tried and measured
//! slower out of cache: two streams per array defeat the prefetchers, most of all on
//! short rows.)
//!
//! The arithmetic is that of [`super::Streams::block`] and [`super::Streams::step`],
//! operation for operation and in `f64` (vector lanes round exactly like scalar
//! instructions and nothing is fused), so the results are bit-identical to the scalar
//! loop; the tests compare the two builds. Blocks whose mask is neither all valid nor
//! all masked, and the last `len % 4` positions of a row, take the scalar step.

use std::arch::x86_64::*;

use super::{Out, Streams, Trace};
use crate::element::{Gates, Mask};
use crate::layout::{Layout, Task};

/// The `f32` streams of one call, as raw pointers indexed by flat position.
#[derive(Clone, Copy)]
pub(super) struct Blocks<'a, M, G> {
    pub layout: &'a Layout<'a>,
    pub last_values: Option<&'a [f64]>,
    /// The scalar step over the same arrays, for mixed blocks and the last
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
            // The row's last `len % 4` positions: blocks start at multiples of four from
            // the row's first position, as in the scalar loop.
            while t.left() % 4 != 0 {
                self.scalar.step::<DUAL>(&mut t, &out);
            }
            while t.left() > 0 {
                self.block::<DUAL>(&mut t, &out, &mut flags);
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
        let a = unroll(delta, _mm256_mul_pd(gg, _mm256_set1_pd(s.lam)), t.a);
        let ac = if DUAL { unroll(delta, _mm256_mul_pd(gg, _mm256_set1_pd(s.lam_critic)), t.ac) } else { a };
        t.a = _mm256_cvtsd_f64(a);
        t.ac = _mm256_cvtsd_f64(ac);
        t.v_next = _mm256_cvtsd_f64(v);
        t.next = i;
        _mm_storeu_ps(out.adv.wrapping_add(i), _mm256_cvtpd_ps(a));
        _mm_storeu_ps(out.ret.wrapping_add(i), _mm256_cvtpd_ps(_mm256_add_pd(ac, v)));
    }
}

/// [`super::unroll`] in vector lanes (lane k = position k of the block): the same
/// operations, the padding terms included (`δ_4 = 0`, `c_4 = 1` enter lane 3 of step
/// one; `s_4 = s_5 = 0`, `p_4 = p_5 = 1` lanes 2 and 3 of step two).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn unroll(d: __m256d, c: __m256d, next: f64) -> __m256d {
    let (zero, one) = (_mm256_setzero_pd(), _mm256_set1_pd(1.0));
    // Lane k + 1 into lane k.
    let d_up = _mm256_blend_pd::<0b1000>(_mm256_permute4x64_pd::<0b11_11_10_01>(d), zero);
    let c_up = _mm256_blend_pd::<0b1000>(_mm256_permute4x64_pd::<0b11_11_10_01>(c), one);
    let s = _mm256_add_pd(d, _mm256_mul_pd(c, d_up));
    let p = _mm256_mul_pd(c, c_up);
    // Lanes k + 2 into lane k: the upper half moves down, zeros move in.
    let s_up = _mm256_permute2f128_pd::<0x81>(s, s);
    let p_up = _mm256_blend_pd::<0b1100>(_mm256_permute2f128_pd::<0x81>(p, p), one);
    let big_s = _mm256_add_pd(s, _mm256_mul_pd(p, s_up));
    let big_p = _mm256_mul_pd(p, p_up);
    _mm256_add_pd(big_s, _mm256_mul_pd(big_p, _mm256_set1_pd(next)))
}
