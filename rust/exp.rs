//! A vectorizable `exp` for the gate sigmoid.
//!
//! `f64::exp` is a libm call, which no loop vectorizer can widen; the gate mapping
//! spends most of its time there. This one is plain arithmetic (no calls, no
//! branches, no FMA), so the same code vectorizes in the AVX2 build and gives the same
//! bits in every build:
//!
//! ```text
//! x  = clamp(x, −708, 708)                      (2^k stays a normal number)
//! k  = round(x / ln 2)                          (round-to-nearest via 1.5·2^52)
//! r  = (x − k·C1) − k·C2,   C1 + C2 = ln 2      (Cody–Waite: k·C1 is exact)
//! e^r = Σ_{j=0}^{13} r^j / j!                   (Horner; |r| ≤ ln 2 / 2)
//! exp(x) = e^r · 2^k                            (2^k built from its exponent bits)
//! ```
//!
//! The truncated series is below 5e-18 relative on |r| ≤ ln 2 / 2; with rounding the
//! result is within a few ulp of the true value (the test bounds it by 4 ulp against
//! libm). Outside [−708, 708] the result is that of the clamped argument, which for a
//! sigmoid `1/(1 + e^−x)` changes nothing representable beyond 1e-307.

const LOG2E: f64 = std::f64::consts::LOG2_E;
/// ln 2 split so that `k·C1` is exact for |k| < 2^11 (Cephes' constants).
const C1: f64 = 6.931_457_519_531_25e-1;
const C2: f64 = 1.428_606_820_309_417_2e-6;
/// Adding then subtracting 1.5·2^52 rounds a float of magnitude < 2^51 to an integer.
const ROUNDER: f64 = 6_755_399_441_055_744.0;
const LIMIT: f64 = 708.0;

/// 1/j! for j = 13 down to 0, for Horner's scheme.
const INV_FACT: [f64; 14] = [
    1.0 / 6_227_020_800.0,
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    1.0 / 2.0,
    1.0,
    1.0,
];

/// `e^x` within a few ulp for |x| ≤ 708 (clamped outside; NaN gives NaN).
#[inline(always)]
pub fn exp(x: f64) -> f64 {
    // clamp without min/max calls (which would not vectorize the NaN rules); NaN
    // fails both comparisons and stays NaN
    let x = if x > LIMIT { LIMIT } else { x };
    let x = if x < -LIMIT { -LIMIT } else { x };
    let t = x * LOG2E + ROUNDER;
    let k = t - ROUNDER;
    let r = (x - k * C1) - k * C2;
    let mut p = INV_FACT[0];
    for c in &INV_FACT[1..] {
        p = p * r + c;
    }
    // the low bits of t hold k (two's complement): 2^k = bits((k + 1023) << 52)
    let k_int = t.to_bits().wrapping_sub(ROUNDER.to_bits());
    let two_k = f64::from_bits(k_int.wrapping_add(1023) << 52);
    p * two_k
}

/// The logistic function `1/(1 + e^−x)` through [`exp`].
#[inline(always)]
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs()
    }

    #[test]
    fn within_four_ulp_of_libm() {
        let mut worst = 0;
        let mut x: f64 = -708.0;
        while x <= 708.0 {
            for dx in [0.0, 1e-9, 0.123_456_789, 0.5, std::f64::consts::LN_2] {
                let y = x + dx;
                if y.abs() <= LIMIT {
                    let u = ulps(exp(y), y.exp());
                    assert!(u <= 4, "exp({y}) = {} vs {} ({u} ulp)", exp(y), y.exp());
                    worst = worst.max(u);
                }
            }
            x += 0.37;
        }
        assert!(worst <= 4);
        for y in [0.0, -0.0, 1e-300, -1e-300, 1.0, -1.0, 0.346, -0.347] {
            assert!(ulps(exp(y), y.exp()) <= 2, "{y}");
        }
    }

    #[test]
    fn clamps_and_nan() {
        assert_eq!(exp(1e6), exp(708.0));
        assert_eq!(exp(-1e6), exp(-708.0));
        assert!(exp(f64::NAN).is_nan());
        assert_eq!(sigmoid(1e6), 1.0);
        assert!(sigmoid(-1e6) < 1e-307 && sigmoid(-1e6) > 0.0);
        assert_eq!(sigmoid(0.0), 0.5);
    }
}
