//! Comp-GAE: generalized advantage estimation with per-token retention gates.
//!
//! For one sequence, over its valid positions `i = 0..n-1` only (masked positions are
//! skipped: the recursion passes straight through them):
//!
//! ```text
//! V_n = last_values[b] (truncated) or 0 (terminal)
//! δ_i = r_i + γ·g_i·V_{i+1} − V_i
//! A_i = δ_i + γ·λ·g_i·A_{i+1},         A_n = 0        (advantages)
//! R_i = A^c_i + V_i                                   (returns; A^c uses λ_critic)
//! ```
//!
//! Operation order, all in `f64`, where `fma(x, y, z) = x·y + z` rounded once (a fused
//! multiply-add): `gg = γ·g; δ = fma(gg, V_next, r) − V; c = gg·λ; c^c = gg·λ_c;
//! A = fma(c, A_next, δ); R = A^c + V`. Masked positions get `A = R = 0`.
//!
//! The recursion is evaluated in blocks. A row is cut into blocks of four consecutive
//! positions counted from its first position; a block whose four positions are all
//! valid is unrolled by [`unroll`] into `A_k = S_k + P_k·A_4` (`A_4` being the advantage
//! just after the block) with `(S, P)` from a two-step suffix scan of `(δ, c)` inside the
//! block (pairs of positions first, then the two pairs), so that from one block to the
//! next the dependency chain is one multiply and one add instead of four of each. Every other position (a block with a masked
//! position, the row's last `len % 4` positions) takes the plain step
//! `A = δ + c·A_next`, and so does a block whose sums overflow where the plain steps may
//! not (float64 inputs near the largest double).
//!
//! Because the cut is counted from the row's start, a row is cut the same way whatever
//! the thread count, the mask's dtype or the code path, and in both layouts as long as
//! the row starts at the same position in both (right padding, which is how packed rows
//! unpack): all of these give bit-identical results. Every code path fuses the same
//! multiply-adds: vector `vfmadd` in the AVX2 builds, `f64::mul_add` (a hardware FMA
//! where the target has one, else the C library's correctly rounded `fma`) in the
//! baseline build, so the two agree bit for bit. Against the sequential, unfused
//! recursion of `comppo_core.reference.gae` the results differ by float64 rounding of
//! the reassociated and fused sums: relative to the largest term summed, about 1e-16.
//! On ordinary data float32 outputs, rounded once from float64, nearly always agree bit
//! for bit; where the sums cancel (terms of 1e10 leaving a result of order 1) they need
//! not.
//!
//! Shapes: `rewards`, `values`, `gates`, `mask`, `advantages`, `returns` are flat `[N]`
//! arrays laid out by a [`Layout`]; `last_values` is `[B]`.
//!
//! Speed: rows are independent, so tasks of consecutive rows run in parallel. Inside a
//! task the loop reads its span as one backward stream, keeps every value it needs in
//! registers, and defers the input checks (gate range, masked rewards, finiteness) to
//! one test per row; only when a row looks wrong is the batch scanned again to name
//! the first offending position. On AVX2 machines, `f32` batches with a bool mask (or
//! none) take the [`blocks`] loop, which computes a block in vector registers with the
//! same operations as [`Streams::block`]. See `benches/compare.py` for where this stands
//! against the memory floor.

use crate::checks::{check_len, check_row_values, first_bad_token};
#[cfg(target_arch = "x86_64")]
use crate::element::MaskSlice;
use crate::element::{Float, Gates, Mask};
use crate::error::{check_unit_interval, Result};
use crate::layout::{split_by_tasks, Layout, Task};
use crate::pool;

#[cfg(target_arch = "x86_64")]
mod blocks;

/// Scalar parameters of [`gae`].
#[derive(Debug, Clone, Copy)]
pub struct GaeParams {
    pub gamma: f64,
    pub lam: f64,
    pub lam_critic: f64,
    /// `false`: a nonzero reward on a masked position is an error (the default policy).
    pub drop_masked_rewards: bool,
}

impl GaeParams {
    pub fn new(gamma: f64, lam: f64) -> Self {
        GaeParams { gamma, lam, lam_critic: lam, drop_masked_rewards: false }
    }
}

/// Comp-GAE advantages and λ-returns, written into `advantages` and `returns`.
///
/// On error the contents of the output buffers are unspecified.
#[allow(clippy::too_many_arguments)]
pub fn gae<F: Float, M: Mask, G: Gates>(
    layout: &Layout,
    rewards: &[F],
    values: &[F],
    mask: M,
    gates: G,
    last_values: Option<&[f64]>,
    params: &GaeParams,
    advantages: &mut [F],
    returns: &mut [F],
) -> Result<()> {
    check_unit_interval("gamma", params.gamma)?;
    check_unit_interval("lam", params.lam)?;
    check_unit_interval("lam_critic", params.lam_critic)?;
    let n = layout.len();
    check_len("rewards", Some(rewards.len()), n)?;
    check_len("values", Some(values.len()), n)?;
    check_len("mask", mask.len(), n)?;
    check_len("gates", gates.len(), n)?;
    check_len("advantages (out)", Some(advantages.len()), n)?;
    check_len("returns (out)", Some(returns.len()), n)?;
    check_row_values("last_values", last_values, layout.rows())?;

    let kernel = Kernel { layout, rewards, values, mask, gates, last_values, p: *params };
    let suspicious = if params.lam_critic == params.lam {
        kernel.run::<false>(advantages, returns)
    } else {
        kernel.run::<true>(advantages, returns)
    };
    if suspicious {
        if let Some(e) =
            first_bad_token(layout, rewards, values, &kernel.mask, &kernel.gates, !params.drop_masked_rewards)
        {
            return Err(e);
        }
    }
    Ok(())
}

struct Kernel<'a, F, M, G> {
    layout: &'a Layout<'a>,
    rewards: &'a [F],
    values: &'a [F],
    mask: M,
    gates: G,
    last_values: Option<&'a [f64]>,
    p: GaeParams,
}

/// The state of one row's backward trace. `next` is one past the next flat index to
/// visit; the row is done when `next == start`.
#[derive(Clone, Copy)]
struct Trace {
    next: usize,
    start: usize,
    v_next: f64,
    a: f64,
    ac: f64,
    /// Range of the row's valid gates, and whether a masked position had a reward:
    /// checked once per row in `finish`.
    g_min: f64,
    g_max: f64,
    masked_reward: bool,
}

impl Trace {
    /// A trace with no row; finishing it is harmless (finite, gate range [0, 1], no
    /// masked reward).
    #[cfg(target_arch = "x86_64")]
    const EMPTY: Trace = Trace::new(0..0, 0.0);

    /// Positions of the row still to visit.
    #[inline(always)]
    fn left(&self) -> usize {
        self.next - self.start
    }

    /// The trace of row `b`, before its last position: `V_n = last_values[b]` (0 when
    /// there are none).
    #[inline(always)]
    fn start(layout: &Layout, last_values: Option<&[f64]>, b: usize) -> Trace {
        Trace::new(layout.row(b), last_values.map_or(0.0, |lv| lv[b]))
    }

    const fn new(row: std::ops::Range<usize>, v_next: f64) -> Trace {
        Trace { next: row.end, start: row.start, v_next, a: 0.0, ac: 0.0, g_min: 0.0, g_max: 1.0, masked_reward: false }
    }
}

impl<F: Float, M: Mask, G: Gates> Kernel<'_, F, M, G> {
    /// Runs every task on the pool; returns whether any task saw a suspicious input.
    fn run<const DUAL: bool>(&self, advantages: &mut [F], returns: &mut [F]) -> bool {
        let tasks = pool::tasks(self.layout);
        let adv = split_by_tasks(advantages, &tasks);
        let ret = split_by_tasks(returns, &tasks);
        let work: Vec<_> = tasks.iter().zip(adv).zip(ret).collect();
        let parallel = self.layout.len() >= pool::PARALLEL_MIN;
        pool::map(work, parallel, |((task, adv), ret)| self.task::<DUAL>(task, adv, ret)).into_iter().any(|b| b)
    }

    fn streams(&self) -> Streams<F, M, G> {
        Streams {
            rewards: self.rewards.as_ptr(),
            values: self.values.as_ptr(),
            mask: self.mask,
            gates: self.gates,
            gamma: self.p.gamma,
            lam: self.p.lam,
            lam_critic: self.p.lam_critic,
            strict: !self.p.drop_masked_rewards,
        }
    }

    fn start_row(&self, b: usize) -> Trace {
        Trace::start(self.layout, self.last_values, b)
    }

    /// Computes the rows of `task`; `adv` and `ret` cover exactly `task.span`.
    ///
    /// Rows are visited from the task's last to its first, each backwards, so the task
    /// reads its span as one continuous backward stream (starting a new stream at the
    /// end of every row costs a prefetcher restart per row).
    fn task<const DUAL: bool>(&self, task: &Task, adv: &mut [F], ret: &mut [F]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::avx2() {
            if let Some(bad) = self.task_blocks::<DUAL>(task, adv, ret) {
                return bad;
            }
            // SAFETY: cpu::avx2() checked that the CPU has AVX2.
            return unsafe { self.task_avx2::<DUAL>(task, adv, ret) };
        }
        self.task_body::<DUAL>(task, adv, ret)
    }

    /// [`Self::task`] by the [`blocks`] loop when the arrays are `f32`, the mask is bool
    /// or absent and the gates are `f32` or absent (returns `None` otherwise). Only
    /// called once the CPU is known to have AVX2.
    #[cfg(target_arch = "x86_64")]
    fn task_blocks<const DUAL: bool>(&self, task: &Task, adv: &mut [F], ret: &mut [F]) -> Option<bool> {
        let rewards = F::as_f32s(self.rewards)?;
        let values = F::as_f32s(self.values)?;
        let mask = match (self.mask.len(), self.mask.slice()) {
            (None, _) => std::ptr::null(),
            (Some(_), Some(MaskSlice::Bool(m))) => m.as_ptr() as *const u8,
            _ => return None,
        };
        let gates = if G::GIVEN { self.gates.f32s()?.as_ptr() } else { std::ptr::null() };
        let (adv, ret) = (F::as_f32s_mut(adv)?, F::as_f32s_mut(ret)?);
        let s = self.streams();
        let b = blocks::Blocks {
            layout: self.layout,
            last_values: self.last_values,
            scalar: Streams {
                rewards: rewards.as_ptr(),
                values: values.as_ptr(),
                mask: s.mask,
                gates: s.gates,
                gamma: s.gamma,
                lam: s.lam,
                lam_critic: s.lam_critic,
                strict: s.strict,
            },
            mask,
            gates,
        };
        // SAFETY: the caller checked AVX2; `gae` validated the layout against every
        // array, and the pointers above come from those arrays.
        Some(unsafe { b.task::<DUAL>(task, adv, ret) })
    }

    /// [`Self::task`] compiled for AVX2 and FMA (the same operations, `mul_add` becoming
    /// one instruction: the results are bit-identical to the baseline build).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn task_avx2<const DUAL: bool>(&self, task: &Task, adv: &mut [F], ret: &mut [F]) -> bool {
        self.task_body::<DUAL>(task, adv, ret)
    }

    #[inline(always)]
    fn task_body<const DUAL: bool>(&self, task: &Task, adv: &mut [F], ret: &mut [F]) -> bool {
        debug_assert_eq!(adv.len(), task.span.len());
        // Shifted so that flat index `i` addresses its element directly.
        let base = task.span.start;
        let out = Out { adv: adv.as_mut_ptr().wrapping_sub(base), ret: ret.as_mut_ptr().wrapping_sub(base) };
        let s = self.streams();
        let mut bad = false;
        for b in task.rows.clone().rev() {
            let mut t = self.start_row(b);
            // SAFETY (steps and blocks): they visit positions t.next - 4 .. t.next of
            // row b only while they lie in it, inside the validated layout and the task
            // span that `out` covers.
            unsafe {
                // The row's last `len % 4` positions: blocks start at multiples of four
                // from the row's first position.
                while t.left() % 4 != 0 {
                    s.step::<DUAL>(&mut t, &out);
                }
                while t.left() > 0 {
                    let i = t.next - 4;
                    if s.mask.valid(i) & s.mask.valid(i + 1) & s.mask.valid(i + 2) & s.mask.valid(i + 3) {
                        s.block::<DUAL>(&mut t, &out);
                    } else {
                        for _ in 0..4 {
                            s.step::<DUAL>(&mut t, &out);
                        }
                    }
                }
            }
            bad |= finish(&t);
        }
        bad
    }
}

/// A finished row is suspicious when its trace is not finite (a NaN/±inf at any valid
/// position reaches `A_0` through the recursion, `0·inf` being NaN too), when a valid
/// gate left [0, 1], or when a masked position had a reward.
#[inline(always)]
fn finish(t: &Trace) -> bool {
    !(t.a.is_finite() & t.ac.is_finite()) | (t.g_min < 0.0) | (t.g_max > 1.0) | t.masked_reward
}

/// What the hot loop reads, copied out of the kernel into locals: the compiler must
/// assume the output stores may alias anything reached through a reference, so fields
/// read through `&self` would be reloaded from memory after every store.
#[derive(Clone, Copy)]
struct Streams<F, M, G> {
    rewards: *const F,
    values: *const F,
    mask: M,
    gates: G,
    gamma: f64,
    lam: f64,
    lam_critic: f64,
    strict: bool,
}

impl<F: Float, M: Mask, G: Gates> Streams<F, M, G> {
    /// One backward step: visits flat index `t.next - 1`.
    ///
    /// # Safety
    /// `t.next - 1` must lie inside the layout and inside the task span behind `out`.
    #[inline(always)]
    unsafe fn step<const DUAL: bool>(&self, t: &mut Trace, out: &Out<F>) {
        t.next -= 1;
        let i = t.next;
        let r = (*self.rewards.add(i)).to_f64();
        // Branching on the mask is cheap: real masks come in long runs (padding,
        // observation spans), so the branch is predicted.
        if self.mask.valid(i) {
            let v = (*self.values.add(i)).to_f64();
            let g = self.gates.gate(i);
            let gg = self.gamma * g;
            let delta = gg.mul_add(t.v_next, r) - v;
            let a = (gg * self.lam).mul_add(t.a, delta);
            let ac = if DUAL { (gg * self.lam_critic).mul_add(t.ac, delta) } else { a };
            *out.adv.wrapping_add(i) = F::from_f64(a);
            *out.ret.wrapping_add(i) = F::from_f64(ac + v);
            t.a = a;
            t.ac = ac;
            t.v_next = v;
            if G::GIVEN {
                // min/max compile to single instructions; NaN gates are caught by the
                // finiteness check of the trace instead.
                t.g_min = if g < t.g_min { g } else { t.g_min };
                t.g_max = if g > t.g_max { g } else { t.g_max };
            }
        } else {
            *out.adv.wrapping_add(i) = F::from_f64(0.0);
            *out.ret.wrapping_add(i) = F::from_f64(0.0);
            t.masked_reward |= self.strict & (r != 0.0);
        }
    }
}

impl<F: Float, M: Mask, G: Gates> Streams<F, M, G> {
    /// Four backward steps over positions `t.next − 4 .. t.next`, all of them valid,
    /// with the recursion [`unroll`]ed.
    ///
    /// # Safety
    /// As for [`Self::step`], for all four positions.
    #[inline(always)]
    unsafe fn block<const DUAL: bool>(&self, t: &mut Trace, out: &Out<F>) {
        let i = t.next - 4;
        let before = *t;
        let (mut delta, mut c, mut c_critic, mut v) = ([0.0; 4], [0.0; 4], [0.0; 4], [0.0; 4]);
        let mut v_next = t.v_next;
        for k in (0..4).rev() {
            let r = (*self.rewards.add(i + k)).to_f64();
            v[k] = (*self.values.add(i + k)).to_f64();
            let g = self.gates.gate(i + k);
            let gg = self.gamma * g;
            delta[k] = gg.mul_add(v_next, r) - v[k];
            c[k] = gg * self.lam;
            c_critic[k] = gg * self.lam_critic;
            v_next = v[k];
            if G::GIVEN {
                t.g_min = if g < t.g_min { g } else { t.g_min };
                t.g_max = if g > t.g_max { g } else { t.g_max };
            }
        }
        let a = unroll(delta, c, t.a);
        let ac = if DUAL { unroll(delta, c_critic, t.ac) } else { a };
        if overflowed(delta, c, t.a, a) | (DUAL && overflowed(delta, c_critic, t.ac, ac)) {
            // A partial sum of the block overflowed where the one-position recursion may
            // not (float64 inputs near the largest double): take the four steps instead.
            *t = before;
            for _ in 0..4 {
                self.step::<DUAL>(t, out);
            }
            return;
        }
        for k in 0..4 {
            *out.adv.wrapping_add(i + k) = F::from_f64(a[k]);
            *out.ret.wrapping_add(i + k) = F::from_f64(ac[k] + v[k]);
        }
        t.a = a[0];
        t.ac = ac[0];
        t.v_next = v[0];
        t.next = i;
    }
}

/// Whether [`unroll`] turned finite inputs into a non-finite result. Only float64
/// inputs within a few powers of two of the largest double can do this; float32 inputs
/// (the only ones the [`blocks`] loop takes) keep every partial sum of a block below
/// about 1e50, even with out-of-range gates, so that loop needs no such check.
#[inline(always)]
fn overflowed(d: [f64; 4], c: [f64; 4], next: f64, a: [f64; 4]) -> bool {
    let finite = |x: [f64; 4]| x.iter().fold(true, |ok, v| ok & v.is_finite());
    finite(d) & finite(c) & next.is_finite() & !finite(a)
}

/// The recursion `A_k = δ_k + c_k·A_{k+1}` over one block, `k = 3, 2, 1, 0`, given
/// `A_4 = next`, evaluated as `A_k = S_k + P_k·next`. First each pair of positions
/// `(0, 1)`, `(2, 3)` is combined, then the pair `(2, 3)` is folded into `0` and `1`:
///
/// ```text
/// s = [δ0 + c0·δ1, δ1 + c1·0, δ2 + c2·δ3, δ3 + c3·0]     p = [c0·c1, c1·1, c2·c3, c3·1]
/// S = [s0 + p0·s2, s1 + p1·s2, s2 + p2·0, s3 + p3·0]     P = [p0·p2, p1·p2, p2·1, p3·1]
/// A = [S0 + P0·next, S1 + P1·next, S2 + P2·next, S3 + P3·next]
/// ```
///
/// Every `x + y·z` here is one fused multiply-add (`y.mul_add(z, x)`), every product
/// alone a plain multiply.
///
/// `S` and `P` do not depend on `next`, so they are computed while the previous block's
/// chain is still in flight. This is the definition of the kernel's arithmetic:
/// [`blocks`] performs exactly these operations (the padding terms `·0`, `·1` included)
/// in vector lanes. The pairing is what makes the vector version cheap: the first step
/// only moves values inside each 128-bit half of a register, and the second moves one
/// value per vector across halves.
#[inline(always)]
fn unroll(d: [f64; 4], c: [f64; 4], next: f64) -> [f64; 4] {
    let s = [c[0].mul_add(d[1], d[0]), c[1].mul_add(0.0, d[1]), c[2].mul_add(d[3], d[2]), c[3].mul_add(0.0, d[3])];
    let p = [c[0] * c[1], c[1] * 1.0, c[2] * c[3], c[3] * 1.0];
    let big_s = [p[0].mul_add(s[2], s[0]), p[1].mul_add(s[2], s[1]), p[2].mul_add(0.0, s[2]), p[3].mul_add(0.0, s[3])];
    let big_p = [p[0] * p[2], p[1] * p[2], p[2] * 1.0, p[3] * 1.0];
    [0, 1, 2, 3].map(|k| big_p[k].mul_add(next, big_s[k]))
}

/// Output pointers of one task, shifted so that flat index `i` of the batch (inside
/// the task's span) is `adv.wrapping_add(i)`.
#[derive(Clone, Copy)]
struct Out<F> {
    adv: *mut F,
    ret: *mut F,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::{AllValid, UnitGates};
    use crate::error::KernelError;

    /// The textbook loop over valid positions, for comparison.
    fn naive(r: &[f64], v: &[f64], m: &[bool], g: &[f64], gamma: f64, lam: f64, lv: f64) -> Vec<f64> {
        let mut out = vec![0.0; r.len()];
        let (mut a, mut vn) = (0.0, lv);
        for i in (0..r.len()).rev() {
            if !m[i] {
                continue;
            }
            let gg = gamma * g[i];
            let d = r[i] + gg * vn - v[i];
            a = d + (gg * lam) * a;
            out[i] = a;
            vn = v[i];
        }
        out
    }

    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 11) as f64 / (1u64 << 53) as f64
    }

    fn close(x: f64, y: f64) -> bool {
        (x - y).abs() <= 1e-14 * (1.0 + y.abs())
    }

    #[test]
    fn unroll_is_the_recursion() {
        // Dyadic inputs: every operation is exact, so both orders give the same numbers.
        // A3 = 4 + 0.5·8 = 8, A2 = 3 + 0.5·8 = 7, A1 = 2 + 0.5·7 = 5.5, A0 = 1 + 0.5·5.5 = 3.75
        assert_eq!(unroll([1.0, 2.0, 3.0, 4.0], [0.5; 4], 8.0), [3.75, 5.5, 7.0, 8.0]);
        // Random inputs: equal up to float64 rounding.
        let mut s = 5u64;
        for _ in 0..1000 {
            let d: [f64; 4] = std::array::from_fn(|_| lcg(&mut s) * 20.0 - 10.0);
            let c: [f64; 4] = std::array::from_fn(|_| lcg(&mut s));
            let next = lcg(&mut s) * 20.0 - 10.0;
            let mut want = [0.0; 4];
            let mut a = next;
            for k in (0..4).rev() {
                a = d[k] + c[k] * a;
                want[k] = a;
            }
            let got = unroll(d, c, next);
            let scale = d.iter().chain([&next]).map(|x| x.abs()).sum::<f64>();
            for k in 0..4 {
                assert!((got[k] - want[k]).abs() <= 8.0 * f64::EPSILON * scale, "{d:?} {c:?} {next}");
            }
        }
    }

    #[test]
    fn blocks_fall_back_to_steps_on_overflow() {
        // Summed in the block, 1e308 + 1e308 overflows at position 1; the one-position
        // recursion gives A = [1e308, 1e308, 0, -1e308].
        let layout = Layout::padded(1, 4, 4).unwrap();
        let (r, v) = ([0.0, 1e308, 1e308, -1e308], [0.0; 4]);
        let (mut a, mut ret) = ([0.0; 4], [0.0; 4]);
        gae(&layout, &r, &v, AllValid, UnitGates, None, &GaeParams::new(1.0, 1.0), &mut a, &mut ret).unwrap();
        assert_eq!(a, naive(&r, &v, &[true; 4], &[1.0; 4], 1.0, 1.0, 0.0)[..]);
        assert!(a.iter().all(|x| x.is_finite()), "{a:?}");
    }

    #[test]
    fn three_tokens_by_hand() {
        // γ = 0.5, λ = 0.5, g = [1, 0.5, 1], r = [0, 0, 1], V = [0.5, 0.25, 0.5], terminal.
        // δ2 = 1 + 0 − 0.5 = 0.5;            A2 = 0.5
        // δ1 = 0 + 0.25·0.5 − 0.25 = −0.125; A1 = −0.125 + 0.125·0.5 = −0.0625
        // δ0 = 0 + 0.5·0.25 − 0.5 = −0.375;  A0 = −0.375 + 0.25·(−0.0625) = −0.390625
        let layout = Layout::padded(1, 3, 3).unwrap();
        let (r, v, g) = ([0.0, 0.0, 1.0], [0.5, 0.25, 0.5], [1.0, 0.5, 1.0]);
        let (mut a, mut ret) = ([0.0; 3], [0.0; 3]);
        let p = GaeParams::new(0.5, 0.5);
        gae(&layout, &r, &v, AllValid, &g[..], None, &p, &mut a, &mut ret).unwrap();
        assert_eq!(a, [-0.390625, -0.0625, 0.5]);
        assert_eq!(ret, [0.109375, 0.1875, 1.0]);
    }

    #[test]
    fn lanes_match_naive_on_ragged_packed_batch() {
        let mut s = 7u64;
        let lens = [0usize, 5, 1, 17, 3, 0, 9, 30, 2, 11, 4, 6, 8];
        let mut cu = vec![0i64];
        for l in lens {
            cu.push(cu.last().unwrap() + l as i64);
        }
        let n = *cu.last().unwrap() as usize;
        let r: Vec<f64> = (0..n).map(|_| lcg(&mut s) - 0.5).collect();
        let v: Vec<f64> = (0..n).map(|_| lcg(&mut s)).collect();
        let g: Vec<f64> = (0..n).map(|_| lcg(&mut s)).collect();
        let m: Vec<bool> = (0..n).map(|_| lcg(&mut s) < 0.8).collect();
        let r: Vec<f64> = r.iter().zip(&m).map(|(&x, &ok)| if ok { x } else { 0.0 }).collect();
        let lv: Vec<f64> = (0..lens.len()).map(|_| lcg(&mut s)).collect();
        let layout = Layout::packed(&cu, n).unwrap();
        let _serial = pool::tests::serial();
        for threads in [1, 2, 3] {
            pool::set_num_threads(threads);
            let (mut a, mut ret) = (vec![9.0; n], vec![9.0; n]);
            let p = GaeParams { gamma: 0.9, lam: 0.8, lam_critic: 0.8, drop_masked_rewards: false };
            gae(&layout, &r, &v, &m[..], &g[..], Some(&lv), &p, &mut a, &mut ret).unwrap();
            for (b, &last) in lv.iter().enumerate() {
                let rg = layout.row(b);
                let want = naive(&r[rg.clone()], &v[rg.clone()], &m[rg.clone()], &g[rg.clone()], 0.9, 0.8, last);
                // The blocks reassociate the recursion: float64 rounding apart, equal.
                for (k, i) in rg.enumerate() {
                    let want_ret = if m[i] { want[k] + v[i] } else { 0.0 };
                    assert!(close(a[i], want[k]) && close(ret[i], want_ret), "row {b} position {k}");
                    if !m[i] {
                        assert_eq!((a[i], ret[i]), (0.0, 0.0));
                    }
                }
            }
        }
    }

    /// The AVX2 block loop against the scalar task loop, bit for bit, flag for flag:
    /// rows of every length modulo 4, masks in runs (all-valid, all-masked and mixed
    /// blocks), gates given or not, one or two λ, padded and packed, and inputs with a
    /// NaN, an out-of-range gate or a masked reward planted.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn blocks_match_scalar_loop() {
        if !crate::cpu::avx2() {
            return;
        }
        let mut s = 11u64;
        let lens: Vec<usize> = (0..40).map(|k| (k * 7) % 23 + if k % 5 == 0 { 70 } else { 0 }).collect();
        let mut cu = vec![0i64];
        for &l in &lens {
            cu.push(cu.last().unwrap() + l as i64);
        }
        let n = *cu.last().unwrap() as usize;
        // Runs of valid and masked positions of random lengths 1..12, and one run in
        // seven of 20..100 (the masked-run loop scans the mask 32 bytes at a time and
        // writes two blocks per step).
        let mut m = Vec::with_capacity(n);
        while m.len() < n {
            let valid = lcg(&mut s) < 0.7;
            let run = if lcg(&mut s) < 1.0 / 7.0 {
                20 + (lcg(&mut s) * 80.0) as usize
            } else {
                1 + (lcg(&mut s) * 12.0) as usize
            };
            m.extend(std::iter::repeat_n(valid, run.min(n - m.len())));
        }
        let r: Vec<f32> = (0..n).map(|i| if m[i] { lcg(&mut s) as f32 - 0.5 } else { 0.0 }).collect();
        let v: Vec<f32> = (0..n).map(|_| lcg(&mut s) as f32).collect();
        let g: Vec<f32> = (0..n).map(|_| 0.5 + 0.5 * lcg(&mut s) as f32).collect();
        let lv: Vec<f64> = (0..lens.len()).map(|_| lcg(&mut s)).collect();
        let packed = Layout::packed(&cu, n).unwrap();
        let padded = Layout::padded(n / 96, 96, n - n % 96).unwrap();

        let run = |layout: &Layout, r: &[f32], g: &[f32], p: GaeParams, gated: bool, masked: bool| {
            let lv = match layout {
                Layout::Packed { .. } => Some(&lv[..]),
                Layout::Padded { .. } => None,
            };
            let mut results = vec![];
            for blocks in [false, true] {
                let (mut a, mut ret) = (vec![7.0f32; r.len()], vec![7.0f32; r.len()]);
                let mut bad = false;
                let tasks = layout.tasks(50);
                let adv = split_by_tasks(&mut a, &tasks);
                let rets = split_by_tasks(&mut ret, &tasks);
                for ((task, adv), ret) in tasks.iter().zip(adv).zip(rets) {
                    macro_rules! go {
                        ($mask:expr, $gates:expr) => {{
                            let kern = Kernel {
                                layout,
                                rewards: r,
                                values: &v[..r.len()],
                                mask: $mask,
                                gates: $gates,
                                last_values: lv,
                                p,
                            };
                            bad |= match (blocks, p.lam == p.lam_critic) {
                                (false, true) => kern.task_body::<false>(task, adv, ret),
                                (false, false) => kern.task_body::<true>(task, adv, ret),
                                (true, true) => kern.task_blocks::<false>(task, adv, ret).unwrap(),
                                (true, false) => kern.task_blocks::<true>(task, adv, ret).unwrap(),
                            }
                        }};
                    }
                    match (masked, gated) {
                        (true, true) => go!(&m[..r.len()], &g[..r.len()]),
                        (true, false) => go!(&m[..r.len()], UnitGates),
                        (false, true) => go!(AllValid, &g[..r.len()]),
                        (false, false) => go!(AllValid, UnitGates),
                    }
                }
                results.push((
                    a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    ret.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    bad,
                ));
            }
            assert!(results[0] == results[1], "blocks differ: gated={gated} masked={masked} {p:?}");
            results[0].2
        };
        let one = GaeParams { gamma: 0.99, lam: 0.95, lam_critic: 0.95, drop_masked_rewards: false };
        let two = GaeParams { lam_critic: 1.0, ..one };
        // γ = 1 takes the blocks' `gg = g` path.
        let undiscounted = GaeParams { gamma: 1.0, ..one };
        for layout in [&packed, &padded] {
            let len = layout.len();
            for p in [one, two, undiscounted] {
                for (gated, masked) in [(true, true), (true, false), (false, true), (false, false)] {
                    assert!(!run(layout, &r[..len], &g[..len], p, gated, masked));
                }
            }
            // γ = λ = g = 1 and rewards of ±2^33 in turn: the partial sums swing between
            // 2^33 and order 1, so float32 outputs show float64 rounding and any
            // difference in how the two loops cut a row into blocks.
            let swing: Vec<f32> = (0..len)
                .map(|i| if m[i] { r[i] + if i % 2 == 0 { 8.589_935e9 } else { -8.589_935e9 } } else { 0.0 })
                .collect();
            let unit = GaeParams { gamma: 1.0, lam: 1.0, lam_critic: 1.0, drop_masked_rewards: false };
            let ones = vec![1.0f32; len];
            for (p, masked) in [(unit, true), (unit, false), (GaeParams { lam_critic: 0.5, ..unit }, true)] {
                assert!(!run(layout, &swing, &ones, p, true, masked));
                assert!(!run(layout, &swing, &ones, p, false, masked));
            }
            // Planted problems: each must be flagged the same way by both loops.
            let at = len / 2 + 1;
            let mut bad_r = r[..len].to_vec();
            bad_r[at] = f32::NAN;
            assert!(run(layout, &bad_r, &g[..len], one, true, true));
            let mut bad_g = g[..len].to_vec();
            let valid = (at..len).find(|&i| m[i]).unwrap();
            bad_g[valid] = 1.5;
            assert!(run(layout, &r[..len], &bad_g, one, true, true));
            bad_g[valid] = -0.25;
            assert!(run(layout, &r[..len], &bad_g, two, true, false));
            bad_g[valid] = f32::NAN;
            assert!(run(layout, &r[..len], &bad_g, undiscounted, true, true));
            bad_g[valid] = f32::INFINITY;
            assert!(run(layout, &r[..len], &bad_g, one, true, false));
            let masked_at = (at..len).find(|&i| !m[i]).unwrap();
            let mut masked_r = r[..len].to_vec();
            masked_r[masked_at] = 0.5;
            assert!(run(layout, &masked_r, &g[..len], one, false, true));
            let drop = GaeParams { drop_masked_rewards: true, ..one };
            assert!(!run(layout, &masked_r, &g[..len], drop, false, true));
            // A masked reward at each position of a long masked run, whichever lane of
            // the two-block step or the odd block it falls in.
            let long = (0..len - 40).find(|&i| m[i..i + 40].iter().all(|&x| !x)).expect("a masked run of 40");
            for k in long..long + 40 {
                let mut masked_r = r[..len].to_vec();
                masked_r[k] = if k % 2 == 0 { -1e-30 } else { f32::NAN };
                assert!(run(layout, &masked_r, &g[..len], one, true, true), "masked reward at {k} missed");
            }
        }
    }

    #[test]
    fn negative_zero_gates_are_valid() {
        // The blocks' gate check compares bit patterns, under which −0.0 looks out of
        // range: the batch is then scanned exactly, which must accept it.
        let (b, t) = (4, 64);
        let layout = Layout::padded(b, t, b * t).unwrap();
        let mut s = 3u64;
        let r: Vec<f32> = (0..b * t).map(|_| lcg(&mut s) as f32 - 0.5).collect();
        let v: Vec<f32> = (0..b * t).map(|_| lcg(&mut s) as f32).collect();
        let mut g: Vec<f32> = (0..b * t).map(|_| lcg(&mut s) as f32).collect();
        for i in (0..b * t).step_by(5) {
            g[i] = 0.0;
        }
        let p = GaeParams::new(1.0, 0.95);
        let (mut a, mut ret) = (vec![0f32; b * t], vec![0f32; b * t]);
        gae(&layout, &r, &v, AllValid, &g[..], None, &p, &mut a, &mut ret).unwrap();
        for i in (0..b * t).step_by(5) {
            g[i] = -0.0;
        }
        let (mut a2, mut ret2) = (vec![0f32; b * t], vec![0f32; b * t]);
        gae(&layout, &r, &v, AllValid, &g[..], None, &p, &mut a2, &mut ret2).unwrap();
        assert_eq!((a, ret), (a2, ret2));
    }

    #[test]
    fn decoupled_critic_lambda() {
        let layout = Layout::padded(1, 2, 2).unwrap();
        let (r, v) = ([0.0f32, 1.0], [0.0f32, 0.0]);
        let (mut a, mut ret) = ([0.0f32; 2], [0.0f32; 2]);
        let p = GaeParams { gamma: 1.0, lam: 0.5, lam_critic: 1.0, drop_masked_rewards: false };
        gae(&layout, &r, &v, AllValid, UnitGates, None, &p, &mut a, &mut ret).unwrap();
        assert_eq!(a, [0.5, 1.0]);
        assert_eq!(ret, [1.0, 1.0]);
    }

    #[test]
    fn errors_name_first_offender() {
        let layout = Layout::padded(2, 3, 6).unwrap();
        let r = [0.0, 0.0, 0.0, 0.0, f64::NAN, 1.0];
        let v = [0.0; 6];
        let m = [true, true, false, true, true, true];
        let (mut a, mut ret) = ([0.0; 6], [0.0; 6]);
        let p = GaeParams::new(1.0, 1.0);
        let e = gae(&layout, &r, &v, &m[..], UnitGates, None, &p, &mut a, &mut ret).unwrap_err();
        assert!(matches!(e, KernelError::NonFinite { arg: "rewards", at, .. } if at.row == 1 && at.pos == 1), "{e}");

        let r = [0.0, 0.0, 2.0, 0.0, 0.0, 0.0];
        let e = gae(&layout, &r, &v, &m[..], UnitGates, None, &p, &mut a, &mut ret).unwrap_err();
        assert!(matches!(e, KernelError::MaskedReward { at, .. } if at.row == 0 && at.pos == 2));
        let drop = GaeParams { drop_masked_rewards: true, ..p };
        gae(&layout, &r, &v, &m[..], UnitGates, None, &drop, &mut a, &mut ret).unwrap();
        assert_eq!(a, [0.0; 6]);

        let g = [1.0, 1.0, 7.0, 1.0, 1.5, 1.0]; // 7.0 is masked, allowed
        let e = gae(&layout, &[0.0; 6], &v, &m[..], &g[..], None, &p, &mut a, &mut ret).unwrap_err();
        assert!(matches!(e, KernelError::OutOfRange { arg: "gates", at, .. } if at.row == 1 && at.pos == 1));

        let bad_gamma = GaeParams::new(1.5, 1.0);
        let e = gae(&layout, &[0.0; 6], &v, AllValid, UnitGates, None, &bad_gamma, &mut a, &mut ret).unwrap_err();
        assert!(matches!(e, KernelError::Parameter { arg: "gamma", .. }));
        let e = gae(&layout, &[0.0; 6], &v, AllValid, UnitGates, Some(&[0.0]), &p, &mut a, &mut ret).unwrap_err();
        assert!(matches!(e, KernelError::Shape { arg: "last_values", .. }));
        let e = gae(&layout, &[0.0; 5], &v, AllValid, UnitGates, None, &p, &mut a, &mut ret).unwrap_err();
        assert!(matches!(e, KernelError::Shape { arg: "rewards", .. }));
    }
}
