//! Group-relative outcome advantages: one score per sequence → one advantage per
//! sequence (DESIGN §5).
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

/// Per-group running sums: count, sum, the first score and whether all scores so far
/// equal it, and (GRPO) the squared deviations from the mean.
#[derive(Clone, Copy)]
struct Group {
    n: u32,
    equal: bool,
    first: f64,
    amax: f64,
    /// Power-of-two scale of the group's sums: 1, or the power of two that brings its
    /// largest |score| into [0.5, 1] when scores are so large that sums could overflow
    /// or so small that squares underflow (exact, so ordinary groups are unaffected).
    k: f64,
    sum: f64,
    sq_dev: f64,
}

impl Group {
    const EMPTY: Group = Group { n: 0, equal: true, first: 0.0, amax: 0.0, k: 1.0, sum: 0.0, sq_dev: 0.0 };
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

/// The dense group index (0..groups) of every sequence, in order of first appearance.
fn dense_ids(groups: &[i64]) -> (Vec<u32>, usize) {
    let mut ids = Vec::with_capacity(groups.len());
    let (lo, hi) = groups.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &g| (lo.min(g), hi.max(g)));
    let span = (hi as i128 - lo as i128) as u128;
    if !groups.is_empty() && span < (4 * groups.len() as u128 + 1024) {
        // ids in a compact range: a direct table
        let mut table = vec![u32::MAX; span as usize + 1];
        let mut next = 0u32;
        for &g in groups {
            let slot = &mut table[(g - lo) as usize];
            if *slot == u32::MAX {
                *slot = next;
                next += 1;
            }
            ids.push(*slot);
        }
        (ids, next as usize)
    } else {
        let mut map: HashMap<i64, u32, BuildHasherDefault<IdHasher>> = HashMap::default();
        for &g in groups {
            let next = map.len() as u32;
            ids.push(*map.entry(g).or_insert(next));
        }
        let n = map.len();
        (ids, n)
    }
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
    if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
        return Err(KernelError::NonFiniteIndex { arg: "scores", index: i, value: scores[i] });
    }
    let (ids, n_groups) = dense_ids(groups);
    let mut g = vec![Group::EMPTY; n_groups];
    for (&s, &id) in scores.iter().zip(&ids) {
        let gr = &mut g[id as usize];
        if gr.n == 0 {
            gr.first = s;
        }
        gr.n += 1;
        gr.sum += s;
        gr.amax = gr.amax.max(s.abs());
        gr.equal &= s == gr.first;
    }
    // Groups whose scores are all beyond 2^±500 are summed again scaled by a power of
    // two, so that neither their sums overflow nor their squared deviations underflow.
    let extreme = |gr: &Group| gr.amax > 1e150 || (gr.amax > 0.0 && gr.amax < 1e-150);
    if g.iter().any(extreme) {
        for gr in g.iter_mut().filter(|gr| extreme(gr)) {
            gr.k = (-(gr.amax.log2().ceil())).exp2();
            gr.sum = 0.0;
        }
        for (&s, &id) in scores.iter().zip(&ids) {
            let gr = &mut g[id as usize];
            if gr.k != 1.0 {
                gr.sum += s * gr.k;
            }
        }
    }
    if method == Method::Grpo {
        for (&s, &id) in scores.iter().zip(&ids) {
            let gr = &mut g[id as usize];
            let d = s * gr.k - gr.sum / gr.n as f64;
            gr.sq_dev += d * d;
        }
    }
    // per group: a = (s − center) / scale, or a constant
    #[derive(Clone, Copy)]
    enum Rule {
        /// a = (s·k − center) / scale
        Affine {
            k: f64,
            center: f64,
            scale: f64,
        },
        /// a = (s·k − (total − s·k)/others) / k
        Rloo {
            k: f64,
            total: f64,
            others: f64,
        },
        Const(f64),
        Raw,
    }
    let rules: Vec<Rule> = g
        .iter()
        .map(|gr| {
            let k = gr.n as f64;
            if gr.n == 1 {
                match singleton {
                    Singleton::Zero => Rule::Const(0.0),
                    Singleton::Raw => Rule::Raw,
                }
            } else if gr.equal {
                Rule::Const(0.0)
            } else {
                let mean = gr.sum / k;
                match method {
                    Method::Grpo => {
                        Rule::Affine { k: gr.k, center: mean, scale: (gr.sq_dev / (k - 1.0)).sqrt() + eps * gr.k }
                    }
                    Method::DrGrpo | Method::ReinforceBaseline => Rule::Affine { k: gr.k, center: mean, scale: gr.k },
                    Method::Rloo => Rule::Rloo { k: gr.k, total: gr.sum, others: k - 1.0 },
                }
            }
        })
        .collect();
    for ((o, &s), &id) in out.iter_mut().zip(scores).zip(&ids) {
        *o = match rules[id as usize] {
            Rule::Affine { k, center, scale } => (s * k - center) / scale,
            Rule::Rloo { k, total, others } => (s * k - (total - s * k) / others) / k,
            Rule::Const(c) => c,
            Rule::Raw => s,
        };
    }
    if let Some(i) = out.iter().position(|a| !a.is_finite()) {
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
