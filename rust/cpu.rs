//! Which instruction-set extensions the kernels may use, decided once per process.
//!
//! The wheel targets baseline x86-64; hot loops also have AVX2 builds, which may use
//! FMA too (every CPU with AVX2 in use has it). They do the same arithmetic as the
//! baseline code: where a kernel fuses a multiply-add, the baseline calls
//! `f64::mul_add` at the same place, so results are bit-identical.
//! `COMPPO_DISABLE_AVX2=1` forces the baseline code, which is how the tests check that
//! identity.

use std::sync::OnceLock;

pub const DISABLE_AVX2_ENV: &str = "COMPPO_DISABLE_AVX2";

/// Whether the AVX2 builds may run: the CPU has AVX2 and FMA, and they were not
/// disabled.
#[inline]
pub fn avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        let disabled = std::env::var(DISABLE_AVX2_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
        #[cfg(target_arch = "x86_64")]
        let detected = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let detected = false;
        detected && !disabled
    })
}
