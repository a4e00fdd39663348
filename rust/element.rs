//! Element types the kernels read and write.
//!
//! Kernels are generic over the float type of the arrays (`f32`, `f64`) and over the
//! element type of the validity mask (bool, integers, floats: nonzero = valid).
//! Whatever the input type, arithmetic happens in `f64`.

/// A float element type of input and output arrays. Arithmetic is always done in `f64`.
pub trait Float: Copy + Send + Sync + 'static {
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
    /// The slice as `f32`s when `Self` is `f32` (lets a kernel take a hand-vectorized path).
    #[inline(always)]
    fn as_f32s(_x: &[Self]) -> Option<&[f32]> {
        None
    }
    /// The mutable slice as `f32`s when `Self` is `f32`.
    #[inline(always)]
    fn as_f32s_mut(_x: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
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
    #[inline(always)]
    fn as_f32s(x: &[Self]) -> Option<&[f32]> {
        Some(x)
    }
    #[inline(always)]
    fn as_f32s_mut(x: &mut [Self]) -> Option<&mut [f32]> {
        Some(x)
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
    /// The slice as a [`MaskSlice`] when `Self` has a hand-vectorized path.
    #[inline(always)]
    fn slice(_m: &[Self]) -> Option<MaskSlice<'_>> {
        None
    }
}

/// A mask of an element type that hand-vectorized loops read directly.
#[derive(Clone, Copy)]
pub enum MaskSlice<'a> {
    /// One byte, 0 or 1, per position.
    Bool(&'a [bool]),
    /// Nonzero (NaN included) = valid.
    F32(&'a [f32]),
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
    #[inline(always)]
    fn slice(m: &[Self]) -> Option<MaskSlice<'_>> {
        Some(MaskSlice::Bool(m))
    }
}

impl MaskElem for f32 {
    #[inline(always)]
    fn is_valid(self) -> bool {
        self != 0.0
    }
    #[inline(always)]
    fn slice(m: &[Self]) -> Option<MaskSlice<'_>> {
        Some(MaskSlice::F32(m))
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
#[allow(clippy::len_without_is_empty)]
pub trait Mask: Sync + Send + Copy {
    /// Number of elements, `None` when the mask is implicit.
    fn len(&self) -> Option<usize>;
    /// # Safety
    /// `i` must be in bounds of the arrays the layout was validated against.
    unsafe fn valid(&self, i: usize) -> bool;
    /// Prefetch hint for `len` positions starting `bytes` bytes before position `i`.
    #[inline(always)]
    fn prefetch_before(&self, _i: usize, _len: usize, _bytes: usize) {}
    /// Bytes per element (1 when the mask is implicit).
    fn elem_size(&self) -> usize {
        1
    }
    /// The mask as a [`MaskSlice`] when hand-vectorized loops can read it directly.
    #[inline(always)]
    fn slice(&self) -> Option<MaskSlice<'_>> {
        None
    }
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
    fn elem_size(&self) -> usize {
        std::mem::size_of::<M>()
    }
    fn len(&self) -> Option<usize> {
        Some(<[M]>::len(self))
    }
    #[inline(always)]
    unsafe fn valid(&self, i: usize) -> bool {
        debug_assert!(Some(i) < Mask::len(self));
        self.get_unchecked(i).is_valid()
    }
    #[inline(always)]
    fn prefetch_before(&self, i: usize, len: usize, bytes: usize) {
        prefetch_before(self, i, len, bytes);
    }
    #[inline(always)]
    fn slice(&self) -> Option<MaskSlice<'_>> {
        M::slice(self)
    }
}

/// Where the retention gate of flat position `i` comes from.
#[allow(clippy::len_without_is_empty)]
pub trait Gates: Sync + Send + Copy {
    /// Whether gates are given (false for [`UnitGates`]: nothing to check).
    const GIVEN: bool = true;
    /// Number of elements, `None` when the gates are implicit.
    fn len(&self) -> Option<usize>;
    /// # Safety
    /// `i` must be in bounds of the arrays the layout was validated against.
    unsafe fn gate(&self, i: usize) -> f64;
    /// The gates as `f32`s when they are an `f32` slice (lets a kernel take a
    /// hand-vectorized path).
    #[inline(always)]
    fn f32s(&self) -> Option<&[f32]> {
        None
    }
    /// Prefetch hint for `len` positions starting `bytes` bytes before position `i`.
    #[inline(always)]
    fn prefetch_before(&self, _i: usize, _len: usize, _bytes: usize) {}
}

/// No gates given: every gate is 1 (plain GAE).
#[derive(Clone, Copy)]
pub struct UnitGates;

impl Gates for UnitGates {
    const GIVEN: bool = false;
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
    #[inline(always)]
    fn f32s(&self) -> Option<&[f32]> {
        F::as_f32s(self)
    }
    #[inline(always)]
    fn prefetch_before(&self, i: usize, len: usize, bytes: usize) {
        prefetch_before(self, i, len, bytes);
    }
}

/// Hints the CPU to fetch the cache line holding `ptr` (a no-op off x86-64).
///
/// The kernels walk several arrays backwards in short blocks, a pattern the hardware
/// prefetchers follow poorly; an explicit hint a few blocks ahead keeps the streams
/// full. `ptr` may point anywhere: the prefetch instruction never faults.
#[inline(always)]
pub fn prefetch<T>(ptr: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint; it never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(ptr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ptr;
}

/// The size of a cache line on the machines we tune for.
pub const CACHE_LINE: usize = 64;

/// `prefetch` of the lines covering `len` elements, starting `bytes` bytes before
/// element `i` of `s`.
#[inline(always)]
pub fn prefetch_before<T>(s: &[T], i: usize, len: usize, bytes: usize) {
    prefetch_span(s.as_ptr().wrapping_add(i), len, bytes);
}

/// `prefetch` of the lines covering `len` elements, starting `bytes` bytes before `p`.
#[inline(always)]
pub fn prefetch_span<T>(p: *const T, len: usize, bytes: usize) {
    let first = (p as *const u8).wrapping_sub(bytes);
    let mut off = 0;
    while off < len * std::mem::size_of::<T>() {
        prefetch(first.wrapping_add(off));
        off += CACHE_LINE;
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
