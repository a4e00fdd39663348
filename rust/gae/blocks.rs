//! The AVX2 task loop for `f32` arrays with a bool mask (or none) and `f32` gates (or
//! none), the layout of nearly every real call.
//!
//! A block of four valid positions is computed in AVX registers, lane k holding
//! position `i + k`: loading and widening the inputs, `gg = γ·g`, `δ = fma(gg, V_next,
//! r) − V`, `c = gg·λ`, the scan of [`super::unroll`] (two shuffle-multiply-add steps),
//! `A = fma(P, A_next, S)`, `R = A^c + V`, narrowing and storing, and the input checks.
//! From block to block the only dependency is one fused multiply-add.
//!
//! What limits the loop then is how many blocks the core keeps in flight: a block's own
//! path from loads to stores is about 45 cycles, and the scheduler fills with blocks
//! waiting on it. So runs of all-valid blocks are software-pipelined
//! ([`Blocks::valid_run`]): each turn does the front of one block, the scan of the one
//! before and the back of the one before that. Runs of all-masked blocks take a tight
//! loop of their own, and the loop is compiled once per case (γ = 1, mask given, gates
//! given), so no block re-tests what the task knows.
//!
//! The number of micro-ops per block decides the rest (the `incache` probe measured
//! cycles per position with the data in cache; it and the `ports` and `w2_batch` probes
//! cited below are in git history: `git show c8d0a52^:examples/incache.rs`). On the Zen 3
//! cores this was tuned on, these facts shaped the loop (the `ports` probe measured them):
//! `vcvtps2pd` from memory is one micro-op that runs on either add pipe, two per cycle,
//! while from a register it is two and takes the one pipe that also runs `vperm2f128`,
//! `vbroadcastsd` from a register and half of each `vcvtpd2ps` (one per cycle). So
//! every input is widened straight from memory: the gates through [`widen_apart`],
//! because the compiler would otherwise load them once for the range check and convert
//! from the register, and `V_next` by loading `values` again one position on (inside a
//! run the position after a block is the first of the block before it, valid and in the
//! row) instead of shuffling it out of this block's and the previous block's `V`. That
//! took the loop from about 12.8 to 11.2 cycles per block. Fusing the four
//! multiply-adds of a block (`vfmadd`, one micro-op where a multiply and an add were
//! two) then took it from 2.54 to 2.26 cycles per position packed and from 2.66 to
//! 2.39 padded (the `incache` probe, best of twelve rounds of each build; that
//! harness times each call and reads the fastest tenth, so it reads lower than the
//! totals behind the 11.2). The scan's first step stays inside the 128-bit halves;
//! its second step moves one value per vector across them
//! (`vmovddup` then `vperm2f128`, written in assembly because the compiler would merge
//! the pair into a `vpermpd`, which costs that pipe twice as much); the carry is one
//! broadcast. With γ = 1, `gg` is the gate itself (`1·g = g` exactly), and the gate
//! range is checked with one integer maximum over the bits.
//!
//! Runs of masked positions (the padding after a row, observation spans) cost a
//! store of zeros and a reward check per position, no arithmetic: the loop finds their
//! end 32 mask bytes at a time and writes and checks eight positions per step, with
//! stores in assembly, since the compiler turns plain stores of zeros into `memset`
//! calls whose `rep stosb` wrote W2's tails at about half the speed. Together the two
//! changes took W2 on one thread from 0.83 to 0.72 ms (the `w2_batch` probe: the
//! fastest tenth of the calls, best of ten runs of each build alternating).
//!
//! Tried and not kept: three of the additions as `x·1 + y` on the FMA pipes (exact,
//! but 11.8 cycles: the longer latency costs more than the freed add pipes gain); the
//! scan's cross-half moves through a store and a reload (no clear change); the back
//! stage first in each turn (slower); two turns unrolled (no change); a pipeline of
//! two stages, front and scan together (2.42 against 2.27 cycles per position); and
//! 128-bit register pairs without any cross-half moves (slower: LLVM merges the halves
//! back into 256-bit registers, and sixteen registers cannot hold the pipelined state,
//! so it spills). Three turns unrolled, which lets the stages rotate through three
//! names so that the register moves at the end of each turn (five per block) go away,
//! was kept: 2.38 → 2.31 cycles per position padded, W2 on one thread 0.725 → 0.709 ms
//! (the `w2_batch` probe, best of eight runs of each build alternating).
//!
//! Like [`super::Kernel::task_body`], a task is one continuous backward stream: its rows
//! from last to first, each backwards. (Tracing two rows at once was tried and measured
//! slower out of cache: two streams per array defeat the prefetchers, most of all on
//! short rows.)
//!
//! The arithmetic is that of [`super::Streams::block`] and [`super::Streams::step`],
//! operation for operation and in `f64` (vector lanes round exactly like scalar
//! instructions, and each `vfmadd` is a `mul_add` there), so the results are
//! bit-identical to the scalar loop; the tests compare the two builds. Blocks whose
//! mask is neither all valid nor all masked, and the last `len % 4` positions of a
//! row, take the scalar step.

use std::arch::x86_64::*;

use super::{Out, Streams, Trace};
use crate::element::{Gates, Mask};
use crate::layout::{Layout, Task};

/// Four bool mask bytes, all true.
const ALL_VALID_4: u32 = 0x0101_0101;

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
    /// The largest bit pattern of a valid gate seen in blocks, as an unsigned integer.
    /// Gates in [+0, 1] are exactly the patterns up to that of 1.0 (`0x3F80_0000`);
    /// negative gates, NaN and +inf lie above it. So does −0.0, a valid gate: the
    /// check only marks the task suspicious, and the exact scan that follows finds
    /// nothing wrong.
    g_bits: __m128i,
    /// Lanes that saw a nonzero (or NaN) reward in an all-masked block.
    masked_reward: __m256,
}

impl<M: Mask, G: Gates> Blocks<'_, M, G> {
    /// Computes the rows of `task` into `adv`/`ret` (which cover exactly `task.span`).
    /// Returns whether any input looked wrong (see [`super::finish`]).
    ///
    /// # Safety
    /// The CPU has AVX2; the layout was validated against every array.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn task<const DUAL: bool>(&self, task: &Task, adv: &mut [f32], ret: &mut [f32]) -> bool {
        // One instance of the loop per case, so that no block tests what the task knows.
        match (self.scalar.gamma == 1.0, self.mask.is_null(), self.gates.is_null()) {
            (true, true, true) => self.rows::<DUAL, true, false, false>(task, adv, ret),
            (true, true, false) => self.rows::<DUAL, true, false, true>(task, adv, ret),
            (true, false, true) => self.rows::<DUAL, true, true, false>(task, adv, ret),
            (true, false, false) => self.rows::<DUAL, true, true, true>(task, adv, ret),
            (false, true, true) => self.rows::<DUAL, false, false, false>(task, adv, ret),
            (false, true, false) => self.rows::<DUAL, false, false, true>(task, adv, ret),
            (false, false, true) => self.rows::<DUAL, false, true, false>(task, adv, ret),
            (false, false, false) => self.rows::<DUAL, false, true, true>(task, adv, ret),
        }
    }

    /// [`Self::task`] for known `UNIT_GAMMA` (γ = 1), `MASKED` (`mask` is not null) and
    /// `GATED` (`gates` is not null).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows<const DUAL: bool, const UNIT_GAMMA: bool, const MASKED: bool, const GATED: bool>(
        &self,
        task: &Task,
        adv: &mut [f32],
        ret: &mut [f32],
    ) -> bool {
        let base = task.span.start;
        let out = Out { adv: adv.as_mut_ptr().wrapping_sub(base), ret: ret.as_mut_ptr().wrapping_sub(base) };
        let mut flags = Flags { g_bits: _mm_setzero_si128(), masked_reward: _mm256_setzero_ps() };
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
                // The all-valid blocks from here down, as one pipelined run; else one
                // block of any kind.
                let blocks = t.left() / 4;
                if !MASKED {
                    let valid = |k: usize| k < blocks;
                    self.valid_run::<DUAL, UNIT_GAMMA, GATED>(valid, &mut t, &out, &mut flags);
                    continue;
                }
                let top = t.next;
                let word = |k: usize| (self.mask.add(top - 4 * (k + 1)) as *const u32).read_unaligned();
                match word(0) {
                    ALL_VALID_4 => {
                        let valid = |k: usize| k < blocks && word(k) == ALL_VALID_4;
                        self.valid_run::<DUAL, UNIT_GAMMA, GATED>(valid, &mut t, &out, &mut flags);
                    }
                    0 => {
                        // Eight blocks (32 mask bytes) at a time, then block by block.
                        let mut n = 1;
                        while n + 8 <= blocks && masked_32(self.mask.add(top - 4 * (n + 8))) {
                            n += 8;
                        }
                        while n < blocks && word(n) == 0 {
                            n += 1;
                        }
                        self.masked_run(n, &mut t, &out, &mut flags);
                    }
                    _ => self.mixed_block::<DUAL>(&mut t, &out),
                }
            }
        }
        let one = _mm_set1_epi32(0x3F80_0000);
        let gates_off = _mm_movemask_epi8(_mm_cmpeq_epi32(_mm_max_epu32(flags.g_bits, one), one)) != 0xFFFF;
        gates_off | bad | (_mm256_movemask_ps(flags.masked_reward) != 0)
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

    /// A block with both valid and masked positions: four single steps of the scalar
    /// loop.
    ///
    /// # Safety
    /// `t` has at least four positions left.
    #[inline(always)]
    unsafe fn mixed_block<const DUAL: bool>(&self, t: &mut Trace, out: &Out<f32>) {
        for _ in 0..4 {
            self.scalar.step::<DUAL>(t, out);
        }
    }

    /// The `n` all-masked blocks below `t.next`: zeros out, and (unless masked rewards
    /// are dropped) a check that their rewards are zero.
    #[inline(always)]
    unsafe fn masked_run(&self, n: usize, t: &mut Trace, out: &Out<f32>, flags: &mut Flags) {
        let s = &self.scalar;
        let zero = _mm256_setzero_ps();
        // Two blocks per step, as 32-byte stores and one compare of eight rewards;
        // then the odd block, its four lanes in the vector's low half.
        for _ in 0..n / 2 {
            let i = t.next - 8;
            store_zeros(out.adv.wrapping_add(i), out.ret.wrapping_add(i));
            if s.strict {
                let r = _mm256_loadu_ps(s.rewards.add(i));
                flags.masked_reward = _mm256_or_ps(flags.masked_reward, _mm256_cmp_ps::<_CMP_NEQ_UQ>(r, zero));
            }
            t.next = i;
        }
        if n % 2 == 1 {
            let i = t.next - 4;
            _mm_storeu_ps(out.adv.wrapping_add(i), _mm_setzero_ps());
            _mm_storeu_ps(out.ret.wrapping_add(i), _mm_setzero_ps());
            if s.strict {
                let r = _mm256_zextps128_ps256(_mm_loadu_ps(s.rewards.add(i)));
                flags.masked_reward = _mm256_or_ps(flags.masked_reward, _mm256_cmp_ps::<_CMP_NEQ_UQ>(r, zero));
            }
            t.next = i;
        }
    }

    /// A run of all-valid blocks below `t.next`, block k (counted down from `t.next`)
    /// taken while `valid(k)`, which holds for k = 0. The run is software-pipelined:
    /// each block goes through three stages, [`Self::front`] (loads, `δ`, `c`),
    /// [`scan`] (`S`, `P`) and [`Self::back`] (the carry, `R`, stores), and each turn
    /// of the loop runs the front of block k, the scan of block k − 1 and the back of
    /// block k − 2. Every block's own path from loads to stores is long (about 45
    /// cycles); written one block after another, the core's scheduler fills up with
    /// blocks waiting on it before it reaches the next block's loads. Interleaved, the
    /// independent work of three blocks sits side by side in program order. The loop
    /// is unrolled three times while three more blocks are valid (each value then
    /// stays in its register from stage to stage), then goes on one turn at a time. A
    /// run of one block takes the three stages in a row.
    ///
    /// # Safety
    /// Every block for which `valid` holds lies in `t`'s row and is all valid; the CPU
    /// has AVX2.
    #[inline(always)]
    unsafe fn valid_run<const DUAL: bool, const UNIT_GAMMA: bool, const GATED: bool>(
        &self,
        valid: impl Fn(usize) -> bool,
        t: &mut Trace,
        out: &Out<f32>,
        flags: &mut Flags,
    ) {
        let top = t.next;
        let at = |k: usize| top - 4 * (k + 1);
        let f0 = self.front::<DUAL, UNIT_GAMMA, GATED, true>(at(0), t.v_next, &mut flags.g_bits);
        if !valid(1) {
            self.back::<DUAL>(at(0), scan::<DUAL>(f0), t, out);
            return;
        }
        let mut front = self.front::<DUAL, UNIT_GAMMA, GATED, false>(at(1), t.v_next, &mut flags.g_bits);
        let mut scanned = scan::<DUAL>(f0);
        let mut k = 2;
        // Three turns at a time while three more blocks are valid: the stages rotate
        // through three names, so no value has to move between registers at the end of
        // a turn. Then one turn at a time.
        while valid(k) && valid(k + 1) && valid(k + 2) {
            let (f1, s1) = self.turn::<DUAL, UNIT_GAMMA, GATED>(at(k), front, scanned, t, out, flags);
            let (f2, s2) = self.turn::<DUAL, UNIT_GAMMA, GATED>(at(k + 1), f1, s1, t, out, flags);
            (front, scanned) = self.turn::<DUAL, UNIT_GAMMA, GATED>(at(k + 2), f2, s2, t, out, flags);
            k += 3;
        }
        while valid(k) {
            (front, scanned) = self.turn::<DUAL, UNIT_GAMMA, GATED>(at(k), front, scanned, t, out, flags);
            k += 1;
        }
        let last = scan::<DUAL>(front);
        self.back::<DUAL>(at(k - 2), scanned, t, out);
        self.back::<DUAL>(at(k - 1), last, t, out);
    }

    /// One turn of [`Self::valid_run`] with block k at `i`: the front of block k, the
    /// scan of block k − 1 (`front`) and the back of block k − 2 (`scanned`, at
    /// `i + 8`). Returns block k's front and block k − 1's scan.
    ///
    /// # Safety
    /// As for [`Self::valid_run`], for blocks k and k − 2.
    #[inline(always)]
    unsafe fn turn<const DUAL: bool, const UNIT_GAMMA: bool, const GATED: bool>(
        &self,
        i: usize,
        front: Front,
        scanned: Scanned,
        t: &mut Trace,
        out: &Out<f32>,
        flags: &mut Flags,
    ) -> (Front, Scanned) {
        let next_front = self.front::<DUAL, UNIT_GAMMA, GATED, false>(i, t.v_next, &mut flags.g_bits);
        let next_scanned = scan::<DUAL>(front);
        self.back::<DUAL>(i + 8, scanned, t, out);
        (next_front, next_scanned)
    }

    /// Stage one of an all-valid block at `i` (lane k of a vector holds position
    /// `i + k`): widened inputs, `δ`, `c` (and `c^c`). `V_next` of lane k is `V` of
    /// position `i + k + 1`: for the `FIRST` block of a run, lane 3 takes `v_after`
    /// (the trace's `V_next`: the position after the block may be masked or past the
    /// row); every later block of the run sits just below an all-valid block of the same
    /// row, so its `V_next` is simply the four `values` from `i + 1`.
    #[inline(always)]
    unsafe fn front<const DUAL: bool, const UNIT_GAMMA: bool, const GATED: bool, const FIRST: bool>(
        &self,
        i: usize,
        v_after: f64,
        g_bits: &mut __m128i,
    ) -> Front {
        let s = &self.scalar;
        let r = widen(s.rewards, i);
        let v = widen(s.values, i);
        let gamma = _mm256_set1_pd(s.gamma);
        let gg = if !GATED {
            // γ·1 = γ exactly.
            gamma
        } else {
            *g_bits = _mm_max_epu32(*g_bits, _mm_loadu_si128(self.gates.add(i) as *const __m128i));
            let g = widen_apart(self.gates, i);
            // With γ = 1, γ·g = g exactly.
            if UNIT_GAMMA {
                g
            } else {
                _mm256_mul_pd(gamma, g)
            }
        };
        // First block: [v2, v3, a, a] from the halves, then [v1, v2, v3, a].
        let v_next = if FIRST {
            _mm256_shuffle_pd::<0b0101>(v, _mm256_permute2f128_pd::<0x21>(v, _mm256_set1_pd(v_after)))
        } else {
            widen(s.values.add(1), i)
        };
        Front {
            delta: _mm256_sub_pd(_mm256_fmadd_pd(gg, v_next, r), v),
            c: _mm256_mul_pd(gg, _mm256_set1_pd(s.lam)),
            c_critic: if DUAL { _mm256_mul_pd(gg, _mm256_set1_pd(s.lam_critic)) } else { _mm256_setzero_pd() },
            v,
        }
    }

    /// Stage three of an all-valid block at `i`: `A = S + P·A_next` (the trace's),
    /// `R = A^c + V`, the stores, and the trace moved past the block.
    #[inline(always)]
    unsafe fn back<const DUAL: bool>(&self, i: usize, b: Scanned, t: &mut Trace, out: &Out<f32>) {
        let a = _mm256_fmadd_pd(b.p, _mm256_set1_pd(t.a), b.s);
        let ac = if DUAL { _mm256_fmadd_pd(b.p_critic, _mm256_set1_pd(t.ac), b.s_critic) } else { a };
        t.a = _mm256_cvtsd_f64(a);
        t.ac = _mm256_cvtsd_f64(ac);
        t.v_next = _mm256_cvtsd_f64(b.v);
        t.next = i;
        _mm_storeu_ps(out.adv.wrapping_add(i), _mm256_cvtpd_ps(a));
        _mm_storeu_ps(out.ret.wrapping_add(i), _mm256_cvtpd_ps(_mm256_add_pd(ac, b.v)));
    }
}

/// An all-valid block after [`Blocks::front`].
#[derive(Clone, Copy)]
struct Front {
    delta: __m256d,
    c: __m256d,
    /// `c^c` (with a decoupled critic λ; unused otherwise).
    c_critic: __m256d,
    v: __m256d,
}

/// An all-valid block after [`scan`]: `A = S + P·A_next` (and the critic's), and `V`.
#[derive(Clone, Copy)]
struct Scanned {
    s: __m256d,
    p: __m256d,
    s_critic: __m256d,
    p_critic: __m256d,
    v: __m256d,
}

/// Stage two of an all-valid block: the scan of [`unroll`] for `c` (and `c^c`).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn scan<const DUAL: bool>(f: Front) -> Scanned {
    let (s, p) = unroll(f.delta, f.c);
    let (s_critic, p_critic) = if DUAL { unroll(f.delta, f.c_critic) } else { (s, p) };
    Scanned { s, p, s_critic, p_critic, v: f.v }
}

/// [`super::unroll`] in vector lanes (lane k = position k of the block), up to `(S, P)`
/// (the caller then forms `A = S + P·A_next`): the same operations, the padding terms
/// included (`δ = 0`, `c = 1` enter lanes 1 and 3 of step one; `s = 0`, `p = 1` lanes
/// 2 and 3 of step two).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn unroll(d: __m256d, c: __m256d) -> (__m256d, __m256d) {
    let (zero, one) = (_mm256_setzero_pd(), _mm256_set1_pd(1.0));
    // [x1, 0, x3, 0] and [c1, 1, c3, 1]: odd lanes moved down inside each half.
    let d_pair = _mm256_unpackhi_pd(d, zero);
    let c_pair = _mm256_unpackhi_pd(c, one);
    let s = _mm256_fmadd_pd(c, d_pair, d);
    let p = _mm256_mul_pd(c, c_pair);
    (_mm256_fmadd_pd(p, lane2_down(s, zero), s), _mm256_mul_pd(p, lane2_down(p, one)))
}

/// `[x2, x2, fill0, fill1]`: lane 2 of `x` copied to lanes 0 and 1, the low half of
/// `fill` above it. One in-half `vmovddup` and one `vperm2f128`, in assembly: left to
/// itself the compiler merges the two into a `vpermpd` plus a blend, which costs the
/// loop's busiest port twice as much.
///
/// # Safety
/// The CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn lane2_down(x: __m256d, fill: __m256d) -> __m256d {
    let y: __m256d;
    std::arch::asm!(
        "vmovddup {y}, {x}",
        "vperm2f128 {y}, {y}, {fill}, 0x21",
        x = in(ymm_reg) x,
        fill = in(ymm_reg) fill,
        y = out(ymm_reg) y,
        options(pure, nomem, nostack, preserves_flags),
    );
    y
}

/// Eight zeros at `a` and at `b`, in assembly so that the compiler cannot turn the
/// masked run's stores into calls of `memset` (whose `rep stosb` streamed the masked
/// tails of W2 at about half the speed of plain stores).
///
/// # Safety
/// `a` and `b` point to eight writable `f32` each; the CPU has AVX.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store_zeros(a: *mut f32, b: *mut f32) {
    std::arch::asm!(
        "vxorps {z:x}, {z:x}, {z:x}",
        "vmovups ymmword ptr [{a}], {z}",
        "vmovups ymmword ptr [{b}], {z}",
        a = in(reg) a,
        b = in(reg) b,
        z = out(ymm_reg) _,
        options(nostack, preserves_flags),
    );
}

/// Whether the 32 mask bytes from `p` are all false (zero).
///
/// # Safety
/// `p` points to 32 readable bytes; the CPU has AVX2.
#[inline(always)]
unsafe fn masked_32(p: *const u8) -> bool {
    let m = _mm256_loadu_si256(p as *const __m256i);
    _mm256_testz_si256(m, m) != 0
}

/// The four `f32` at `base + i`, widened to `f64`.
///
/// # Safety
/// `base + i` points to four readable `f32`; the CPU has AVX2.
#[inline(always)]
unsafe fn widen(base: *const f32, i: usize) -> __m256d {
    _mm256_cvtps_pd(_mm_loadu_ps(base.add(i)))
}

/// [`widen`] in assembly, so that the compiler cannot merge its load with another load
/// of the same bytes and convert from a register: `vcvtps2pd` with a memory operand is
/// one micro-op that Zen 3 runs on either add pipe, the register form two, one of them
/// on the busy shuffle pipe.
///
/// # Safety
/// `base + i` points to four readable `f32`; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn widen_apart(base: *const f32, i: usize) -> __m256d {
    let y: __m256d;
    std::arch::asm!(
        "vcvtps2pd {y}, xmmword ptr [{base} + 4*{i}]",
        base = in(reg) base,
        i = in(reg) i,
        y = out(ymm_reg) y,
        options(pure, readonly, nostack, preserves_flags),
    );
    y
}
