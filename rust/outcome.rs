//! Group-relative outcome advantages: one score per sequence → one advantage per
//! sequence (docs/design.md §5).
//!
//! For each group G (the sequences sharing a group id; ids in any order), n = |G|,
//! μ the group mean and σ the unbiased (ddof 1) group standard deviation, in `f64`:
//!
//! ```text
//! Grpo:              a_i = (s_i − μ) / (σ + eps)
//! DrGrpo:            a_i = s_i − μ
//! Rloo:              a_i = s_i − (Σ_G s − s_i) / (n − 1)       (mean of the others)
//! ReinforceBaseline: a_i = s_i − μ
//! ```
//!
//! A group of one has no baseline: `a = 0` (`Singleton::Zero`) or `a = s`
//! (`Singleton::Raw`, as verl does). A group whose scores are all equal gets 0 exactly.
//! Sums run in index order, so results do not depend on anything but the inputs.

use crate::error::{KernelError, Result};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Grpo,
    DrGrpo,
    Rloo,
    ReinforceBaseline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Singleton {
    Zero,
    Raw,
}

/// Per-group running sums of the first pass: count, sum, and the smallest and largest
/// score (all equal ⇔ `min == max`; the largest magnitude is `max(|min|, |max|)`).
/// 32 bytes, so a group's state sits in one cache line.
#[derive(Clone, Copy)]
struct Group {
    n: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Group {
    const EMPTY: Group = Group { n: 0, sum: 0.0, min: f64::INFINITY, max: f64::NEG_INFINITY };

    #[inline(always)]
    fn add(&mut self, s: f64) {
        self.n += 1;
        self.sum += s;
        // scores are finite here, so plain comparisons (one minsd/maxsd) suffice
        self.min = if s < self.min { s } else { self.min };
        self.max = if s > self.max { s } else { self.max };
    }

    fn amax(&self) -> f64 {
        self.min.abs().max(self.max.abs())
    }
}

/// A multiplicative hash for integer keys (group ids are not adversarial; SipHash
/// would cost more than the rest of the computation).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_i64(&mut self, x: i64) {
        self.0 = (x as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    }
}

/// Writes the dense group index of every sequence (0..groups, in order of first
/// appearance) into `ids` and returns the number of groups.
///
/// `ids` is the caller's output buffer, used as scratch: each index is stored as the
/// bit pattern of an `f64` (read back with [`id_at`]) and overwritten with the
/// advantage in the last pass, which saves allocating (and page-faulting) an index
/// array per call. `lo` and `hi` are the smallest and largest id.
fn dense_ids(groups: &[i64], (lo, hi): (i64, i64), ids: &mut [f64]) -> usize {
    let span = (hi as i128 - lo as i128) as u128;
    if !groups.is_empty() && span < (4 * groups.len() as u128 + 1024) {
        // ids in a compact range: a direct table
        let mut table = vec![u32::MAX; span as usize + 1];
        let mut next = 0u32;
        for (&g, id) in groups.iter().zip(ids.iter_mut()) {
            // branch-free: first appearances are too irregular to predict
            let slot = &mut table[(g - lo) as usize];
            let fresh = *slot == u32::MAX;
            *slot = if fresh { next } else { *slot };
            next += fresh as u32;
            *id = f64::from_bits(*slot as u64);
        }
        next as usize
    } else {
        let mut map: HashMap<i64, u32, BuildHasherDefault<IdHasher>> = HashMap::default();
        for (&g, id) in groups.iter().zip(ids.iter_mut()) {
            let next = map.len() as u32;
            *id = f64::from_bits(*map.entry(g).or_insert(next) as u64);
        }
        map.len()
    }
}

/// The group index [`dense_ids`] stored at one position.
#[inline(always)]
fn id_at(slot: &f64) -> usize {
    slot.to_bits() as usize
}

/// `table[id]` for a per-group table and an index from [`dense_ids`], without a bounds
/// test in the per-sequence loops: every index `dense_ids` stores is below the number
/// of groups it returns, which is the length of every per-group table.
#[inline(always)]
fn group<T>(table: &[T], id: usize) -> &T {
    debug_assert!(id < table.len());
    // SAFETY: see above; `id < table.len()`.
    unsafe { table.get_unchecked(id) }
}

/// [`group`], mutable.
#[inline(always)]
fn group_mut<T>(table: &mut [T], id: usize) -> &mut T {
    debug_assert!(id < table.len());
    // SAFETY: as for [`group`].
    unsafe { table.get_unchecked_mut(id) }
}

/// First pass: the dense group index of every sequence (into `ids`) and each group's
/// running sums. `id_range` as for [`dense_ids`].
fn index_and_sum(scores: &[f64], groups: &[i64], id_range: (i64, i64), ids: &mut [f64]) -> Vec<Group> {
    let n_groups = dense_ids(groups, id_range, ids);
    let mut sums = vec![Group::EMPTY; n_groups];
    for (&s, id) in scores.iter().zip(ids.iter()) {
        group_mut(&mut sums, id_at(id)).add(s);
    }
    sums
}

/// A group's advantages as one affine map of its scores, `a = (s·k − center) / scale`,
/// bit-equal to the formulas of the module docs:
///
/// * `k` is 1, or the power of two that rescales an extreme group (exact);
/// * a constant 0 (singleton or all-equal group) is `k = 0, center = −0.0, scale = 1`,
///   which gives `+0.0` for every finite score;
/// * a singleton passed through raw is `k = 1, center = 0, scale = 1`.
#[derive(Clone, Copy)]
struct Affine {
    k: f64,
    center: f64,
    scale: f64,
}

impl Affine {
    const ZERO: Affine = Affine { k: 0.0, center: -0.0, scale: 1.0 };
    const RAW: Affine = Affine { k: 1.0, center: 0.0, scale: 1.0 };
}

/// Group-relative advantages of `scores` grouped by `groups`, written into `out`.
pub fn group_advantages(
    scores: &[f64],
    groups: &[i64],
    method: Method,
    eps: f64,
    singleton: Singleton,
    out: &mut [f64],
) -> Result<()> {
    let n = scores.len();
    for (arg, len) in [("groups", groups.len()), ("out", out.len())] {
        if len != n {
            return Err(KernelError::Shape {
                arg,
                expected: format!("{n} elements (one per score)"),
                got: format!("{len}"),
            });
        }
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(KernelError::Parameter {
            arg: "eps",
            expected: "a finite number >= 0".into(),
            got: format!("{eps}"),
        });
    }
    // One pass over both inputs: the scores are finite, and the range of the ids.
    let (lo, hi, scores_finite) = scores
        .iter()
        .zip(groups)
        .fold((i64::MAX, i64::MIN, true), |(lo, hi, ok), (s, &g)| (lo.min(g), hi.max(g), ok & s.is_finite()));
    if !scores_finite {
        let i = scores.iter().position(|s| !s.is_finite()).unwrap_or(0);
        return Err(KernelError::NonFiniteIndex { arg: "scores", index: i, value: scores[i] });
    }
    let mut sums = index_and_sum(scores, groups, (lo, hi), out);
    // Groups whose scores are all beyond 2^±500 are summed again scaled by a power of
    // two, so that neither their sums overflow nor their squared deviations underflow.
    let extreme = |gr: &Group| {
        let amax = gr.amax();
        amax > 1e150 || (amax > 0.0 && amax < 1e-150)
    };
    let mut k = vec![1.0f64; sums.len()];
    let any_extreme = sums.iter().any(extreme);
    if any_extreme {
        for (gr, k) in sums.iter_mut().zip(k.iter_mut()) {
            if extreme(gr) {
                *k = (-(gr.amax().log2().ceil())).exp2();
                gr.sum = 0.0;
            }
        }
        for (&s, id) in scores.iter().zip(out.iter()) {
            let id = id_at(id);
            if k[id] != 1.0 {
                sums[id].sum += s * k[id];
            }
        }
    }
    let means: Vec<f64> = sums.iter().map(|gr| gr.sum / gr.n as f64).collect();
    // Second pass (GRPO): squared deviations from the (scaled) group mean.
    let mut sq_dev = vec![0.0f64; if method == Method::Grpo { sums.len() } else { 0 }];
    if method == Method::Grpo {
        if any_extreme {
            for (&s, id) in scores.iter().zip(out.iter()) {
                let id = id_at(id);
                let d = s * k[id] - means[id];
                sq_dev[id] += d * d;
            }
        } else {
            // k ≡ 1: the same sums without the multiplications by one
            for (&s, id) in scores.iter().zip(out.iter()) {
                let id = id_at(id);
                let d = s - group(&means, id);
                *group_mut(&mut sq_dev, id) += d * d;
            }
        }
    }
    let constant = |gr: &Group| gr.n == 1 || gr.min == gr.max;
    let singleton_rule = match singleton {
        Singleton::Zero => Affine::ZERO,
        Singleton::Raw => Affine::RAW,
    };
    // From here `finite` tracks the advantages.
    let mut finite = true;
    if method == Method::Rloo {
        // a = (s·k − (total − s·k)/(n − 1)) / k: not affine in one division, so its own loop.
        let rules: Vec<Option<(f64, f64, f64)>> = sums
            .iter()
            .zip(&k)
            .map(|(gr, &k)| if constant(gr) { None } else { Some((k, gr.sum, gr.n as f64 - 1.0)) })
            .collect();
        for (o, &s) in out.iter_mut().zip(scores) {
            let id = id_at(o);
            let gr = &sums[id];
            *o = match rules[id] {
                Some((k, total, others)) => (s * k - (total - s * k) / others) / k,
                None if gr.n == 1 => (s * singleton_rule.k - singleton_rule.center) / singleton_rule.scale,
                None => 0.0,
            };
            finite &= o.is_finite();
        }
    } else {
        let rules: Vec<Affine> = sums
            .iter()
            .enumerate()
            .map(|(g, gr)| {
                if gr.n == 1 {
                    singleton_rule
                } else if gr.min == gr.max {
                    Affine::ZERO
                } else {
                    let (k, mean) = (k[g], means[g]);
                    let scale = match method {
                        Method::Grpo => (sq_dev[g] / (gr.n as f64 - 1.0)).sqrt() + eps * k,
                        _ => k,
                    };
                    Affine { k, center: mean, scale }
                }
            })
            .collect();
        for (o, &s) in out.iter_mut().zip(scores) {
            let r = group(&rules, id_at(o));
            *o = (s * r.k - r.center) / r.scale;
            finite &= o.is_finite();
        }
    }
    if !finite {
        let i = out.iter().position(|a| !a.is_finite()).unwrap_or(0);
        return Err(KernelError::Parameter {
            arg: "scores",
            expected: "advantages representable in float64".into(),
            got: format!(
                "an overflow at index {i} (scores up to {:e})",
                scores.iter().fold(0.0f64, |m, s| m.max(s.abs()))
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &[f64], g: &[i64], m: Method, single: Singleton) -> Vec<f64> {
        let mut out = vec![9.0; s.len()];
        group_advantages(s, g, m, 1e-6, single, &mut out).unwrap();
        out
    }

    #[test]
    fn methods_by_hand() {
        // groups 7: [3, 1, 2] (μ 2, σ 1), 3: [5, 5] (equal), -1: [4] (singleton)
        let (s, g) = ([3.0, 5.0, 1.0, 4.0, 2.0, 5.0], [7, 3, 7, -1, 7, 3]);
        let k = 1.0 / (1.0 + 1e-6);
        assert_eq!(run(&s, &g, Method::Grpo, Singleton::Zero), [k, 0.0, -k, 0.0, 0.0, 0.0]);
        assert_eq!(run(&s, &g, Method::DrGrpo, Singleton::Zero), [1.0, 0.0, -1.0, 0.0, 0.0, 0.0]);
        assert_eq!(run(&s, &g, Method::ReinforceBaseline, Singleton::Raw), [1.0, 0.0, -1.0, 4.0, 0.0, 0.0]);
        assert_eq!(run(&s, &g, Method::Rloo, Singleton::Zero), [1.5, 0.0, -1.5, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn huge_scores_do_not_overflow() {
        let (s, g) = ([1e308, 1e308, -1e308], [0, 0, 0]);
        let a = run(&s, &g, Method::DrGrpo, Singleton::Zero);
        assert!(a.iter().all(|x| x.is_finite()), "{a:?}");
        assert!((a[2] - (-1e308 - 1e308 / 3.0)).abs() / 1e308 < 1e-12);
        let a = run(&[1e308, -1e308], &[0, 0], Method::Grpo, Singleton::Zero);
        assert!((a[0] - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-12, "{a:?}");
        let mut out = [0.0; 2];
        group_advantages(&[1e-300, 2e-300], &[0, 0], Method::Grpo, 0.0, Singleton::Zero, &mut out).unwrap();
        assert!((out[1] - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-12, "{out:?}");
    }

    #[test]
    fn sparse_ids_use_the_hash_path() {
        let (s, g) = ([1.0, 3.0, 10.0, 20.0], [i64::MIN, i64::MIN, i64::MAX, i64::MAX]);
        assert_eq!(run(&s, &g, Method::DrGrpo, Singleton::Zero), [-1.0, 1.0, -5.0, 5.0]);
    }

    #[test]
    fn errors() {
        let mut out = [0.0; 2];
        let e = group_advantages(&[1.0, f64::NAN], &[0, 0], Method::Grpo, 1e-6, Singleton::Zero, &mut out).unwrap_err();
        assert!(matches!(e, KernelError::NonFiniteIndex { index: 1, .. }));
        assert!(group_advantages(&[1.0, 2.0], &[0], Method::Grpo, 1e-6, Singleton::Zero, &mut out).is_err());
    }
}
