//! Buffers whose first element sits on a 64-byte boundary.
//!
//! A `Vec<f32>` of a few hundred KiB or more comes from `mmap` through malloc, 16 bytes past a
//! page boundary, so every 64-byte vector load from it straddles two cache lines. Emitted
//! kernels read their packed weights and intermediates with such loads in their innermost
//! loops: on an Intel Xeon (AVX-512) a GEMM loop with its buffers 16 bytes off a cache line ran
//! 4-10% slower than with them aligned (`bench-results/2026-12-06/tile-loop/`). Every buffer harl allocates for a kernel
//! (packed weights, kept weights, per-thread scratch, a network's intermediates) is one of
//! these.

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// The alignment of every [`AlignedBuf`], in bytes: one cache line, one AVX-512 vector.
pub const ALIGN: usize = 64;

/// One cache line of storage; zeroed when made.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; ALIGN]);

const ZERO_LINE: Line = Line([0; ALIGN]);

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for i32 {}
    impl Sealed for bool {}
}

/// The element types of generated kernels' buffers: plain scalars for which all-zero bytes are
/// a valid value, whose size divides [`ALIGN`] (sealed: f32, f64, i32, bool).
pub trait Scalar:
    Copy + Default + Send + Sync + std::fmt::Debug + sealed::Sealed + 'static
{
    /// Whether every bit pattern of the type's size is a valid value (not so for `bool`): a
    /// buffer recast to a type without this is zeroed first.
    #[doc(hidden)]
    const ANY_BITS: bool;
}
impl Scalar for f32 {
    const ANY_BITS: bool = true;
}
impl Scalar for f64 {
    const ANY_BITS: bool = true;
}
impl Scalar for i32 {
    const ANY_BITS: bool = true;
}
impl Scalar for bool {
    const ANY_BITS: bool = false;
}

/// A growable-in-place buffer of `T` whose data starts on a 64-byte boundary; derefs to `[T]`.
pub struct AlignedBuf<T: Scalar> {
    lines: Vec<Line>,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: Scalar> AlignedBuf<T> {
    /// An empty buffer (no allocation); usable in a `const` thread-local initialiser.
    pub const fn new() -> Self {
        AlignedBuf {
            lines: Vec::new(),
            len: 0,
            _elem: PhantomData,
        }
    }

    /// `len` copies of `value`.
    pub fn filled(len: usize, value: T) -> Self {
        let mut buf = Self::new();
        buf.reset(len, Some(value));
        buf
    }

    /// A copy of `values`.
    pub fn from_slice(values: &[T]) -> Self {
        let mut buf = Self::new();
        buf.reset(values.len(), None);
        buf.copy_from_slice(values);
        buf
    }

    /// Makes the buffer `len` elements long, keeping its allocation where it is big enough,
    /// then fills it with `fill`; without a fill the elements hold whatever values they held
    /// (zero where the buffer grew).
    pub fn reset(&mut self, len: usize, fill: Option<T>) {
        let lines = len.saturating_mul(std::mem::size_of::<T>()).div_ceil(ALIGN);
        if lines > self.lines.len() {
            self.lines.resize(lines, ZERO_LINE);
        }
        self.len = len;
        if let Some(v) = fill {
            self.fill(v);
        }
    }

    /// The same allocation as an empty buffer of `U` (for pooling buffers of several element
    /// types); its bytes are zeroed where not every bit pattern is a valid `U`.
    pub(crate) fn recast<U: Scalar>(mut self) -> AlignedBuf<U> {
        if !U::ANY_BITS {
            self.lines.fill(ZERO_LINE);
        }
        AlignedBuf {
            lines: self.lines,
            len: 0,
            _elem: PhantomData,
        }
    }

    /// The bytes the buffer owns (its capacity), for deciding whether to keep it.
    pub fn capacity_bytes(&self) -> usize {
        self.lines.len().saturating_mul(ALIGN)
    }
}

impl<T: Scalar> Default for AlignedBuf<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Scalar> Clone for AlignedBuf<T> {
    fn clone(&self) -> Self {
        AlignedBuf {
            lines: self.lines.clone(),
            len: self.len,
            _elem: PhantomData,
        }
    }
}

impl<T: Scalar> std::fmt::Debug for AlignedBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Scalar> Deref for AlignedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `lines` owns at least `len * size_of::<T>()` bytes (`reset`), aligned to 64,
        // which is a multiple of `T`'s alignment; every byte is initialised (lines start zeroed
        // and are only written through a `[T]`, here or before a `recast`), and all-zero bytes
        // and every written value are valid `T`s (`Scalar` is sealed to such types; `recast`
        // zeroes a buffer for a type with invalid bit patterns).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Scalar> DerefMut for AlignedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; the `&mut self` borrow makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aligned<T: Scalar>(b: &AlignedBuf<T>) -> bool {
        (b.as_ptr() as usize).is_multiple_of(ALIGN)
    }

    #[test]
    fn data_starts_on_a_cache_line() {
        // Sizes on both sides of malloc's mmap threshold, where a Vec lands 16 bytes off.
        for len in [1, 15, 16, 17, 1000, 1 << 18, (1 << 20) + 3] {
            let f = AlignedBuf::filled(len, 1.5f32);
            assert!(aligned(&f), "{len}");
            assert_eq!(f.len(), len);
            assert!(f.iter().all(|&x| x == 1.5));
            let d = AlignedBuf::<f64>::filled(len, -2.0);
            assert!(aligned(&d) && d.len() == len && d[len - 1] == -2.0);
        }
    }

    #[test]
    fn reset_keeps_the_allocation_and_fills() {
        let mut b = AlignedBuf::<i32>::from_slice(&[1, 2, 3, 4, 5]);
        assert_eq!(&b[..], &[1, 2, 3, 4, 5]);
        let ptr = b.as_ptr();
        b.reset(3, None);
        assert_eq!(&b[..], &[1, 2, 3]);
        b.reset(4, Some(7));
        assert_eq!(&b[..], &[7, 7, 7, 7]);
        assert_eq!(b.as_ptr(), ptr);
        b.reset(100, None);
        assert!(aligned(&b));
        assert_eq!(b[..4], [7, 7, 7, 7]);
        assert!(b[16..].iter().all(|&x| x == 0), "grown lines start zeroed");
        let e = AlignedBuf::<bool>::new();
        assert!(e.is_empty() && e.capacity_bytes() == 0);
        let c = b.clone();
        assert_eq!(&c[..], &b[..]);
        assert!(aligned(&c));
    }
}
