//! Element types the kernels read and write.
//!
//! Kernels are generic over the float type of the arrays (`f32`, `f64`) and over the
//! element type of the validity mask (bool, integers, floats: nonzero = valid).
//! Whatever the input type, arithmetic happens in `f64`.

/// A float element type of input and output arrays. Arithmetic is always done in `f64`.
pub trait Float: Copy + Send + Sync + 'static {
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
}

impl Float for f32 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

impl Float for f64 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x
    }
}

/// An element of a validity mask: nonzero means "valid token".
pub trait MaskElem: Copy + Send + Sync + 'static {
    fn is_valid(self) -> bool;
}

macro_rules! int_mask {
    ($($t:ty),*) => {$(
        impl MaskElem for $t {
            #[inline(always)]
            fn is_valid(self) -> bool { self != 0 }
        }
    )*};
}
int_mask!(u8, i8, i32, i64);

impl MaskElem for bool {
    #[inline(always)]
    fn is_valid(self) -> bool {
        self
    }
}

impl MaskElem for f32 {
    #[inline(always)]
    fn is_valid(self) -> bool {
        self != 0.0
    }
}

impl MaskElem for f64 {
    #[inline(always)]
    fn is_valid(self) -> bool {
        self != 0.0
    }
}

/// Where the validity of flat position `i` comes from.
///
/// Implementations index without bounds checks: callers guarantee `i < len` through a
/// validated [`crate::layout::Layout`].
pub trait Mask: Sync {
    /// Number of elements, `None` when the mask is implicit.
    fn len(&self) -> Option<usize>;
    /// # Safety
    /// `i` must be in bounds of the arrays the layout was validated against.
    unsafe fn valid(&self, i: usize) -> bool;
}

/// No mask given: every position is valid.
#[derive(Clone, Copy)]
pub struct AllValid;

impl Mask for AllValid {
    fn len(&self) -> Option<usize> {
        None
    }
    #[inline(always)]
    unsafe fn valid(&self, _i: usize) -> bool {
        true
    }
}

impl<M: MaskElem> Mask for &[M] {
    fn len(&self) -> Option<usize> {
        Some(<[M]>::len(self))
    }
    #[inline(always)]
    unsafe fn valid(&self, i: usize) -> bool {
        debug_assert!(Some(i) < Mask::len(self));
        self.get_unchecked(i).is_valid()
    }
}

/// Where the retention gate of flat position `i` comes from.
pub trait Gates: Sync {
    /// Number of elements, `None` when the gates are implicit.
    fn len(&self) -> Option<usize>;
    /// # Safety
    /// `i` must be in bounds of the arrays the layout was validated against.
    unsafe fn gate(&self, i: usize) -> f64;
}

/// No gates given: every gate is 1 (plain GAE).
#[derive(Clone, Copy)]
pub struct UnitGates;

impl Gates for UnitGates {
    fn len(&self) -> Option<usize> {
        None
    }
    #[inline(always)]
    unsafe fn gate(&self, _i: usize) -> f64 {
        1.0
    }
}

impl<F: Float> Gates for &[F] {
    fn len(&self) -> Option<usize> {
        Some(<[F]>::len(self))
    }
    #[inline(always)]
    unsafe fn gate(&self, i: usize) -> f64 {
        debug_assert!(Some(i) < Gates::len(self));
        self.get_unchecked(i).to_f64()
    }
}

/// Branch-free select of two `f64`s: `if cond { a } else { b }` without a jump, so a
/// mask that flips unpredictably costs nothing, and a NaN in the unselected operand
/// never leaks (no arithmetic blending).
#[inline(always)]
pub fn select(cond: bool, a: f64, b: f64) -> f64 {
    let m = (cond as u64).wrapping_neg();
    f64::from_bits((a.to_bits() & m) | (b.to_bits() & !m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_picks_and_never_blends_nan() {
        assert_eq!(select(true, 1.5, f64::NAN), 1.5);
        assert_eq!(select(false, f64::NAN, -2.0), -2.0);
        assert!(select(true, f64::NAN, 0.0).is_nan());
    }

    #[test]
    fn mask_elements_nonzero_is_valid() {
        assert!(3i64.is_valid() && !0i64.is_valid());
        assert!(0.5f32.is_valid() && !0.0f32.is_valid() && !(-0.0f64).is_valid());
        assert!(true.is_valid() && !0u8.is_valid());
    }
}
