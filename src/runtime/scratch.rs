//! Intermediate buffers that generated kernels keep per thread between calls.
//!
//! Allocated afresh on every call, an 800 KB buffer paid for its pages each time (page faults,
//! the kernel zeroing them). Kept, it costs nothing after the first call. The buffers are
//! pooled across kernels: the `i`-th buffer of every kernel a thread runs is one allocation,
//! as large as the largest of them. A network's calls run one after another, so with one
//! buffer per kernel its scratch would be the sum of all of them (12 MB for MobileNet-V2,
//! beside 14 MB of weights, in a 32 MB last-level cache); pooled, it is the largest few, and
//! the next call finds them in cache.

use super::aligned::{AlignedBuf, Scalar};
use std::cell::RefCell;

/// Buffers larger than this many bytes are not kept between calls.
const SCRATCH_KEEP_BYTES: usize = 256 << 20;

/// Which of a thread's two pools a buffer comes from: those a kernel call holds for its whole
/// run, and those one iteration of a parallel loop holds (taken on whichever thread runs the
/// iteration, while the calling thread may hold buffers of the first pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScratchUse {
    /// Held from a kernel call's start to its end.
    Call,
    /// Held by one iteration of a parallel loop.
    Iteration,
}

thread_local! {
    // Element type erased (`recast`): a kernel's f32 buffer and another's i32 one share.
    static POOLS: [RefCell<Vec<AlignedBuf<i32>>>; 2] =
        const { [RefCell::new(Vec::new()), RefCell::new(Vec::new())] };
}

/// Buffer `index` of this thread's `pool`, ready for a call: `len` elements, each `fill` where
/// there is one; without a fill the kernel writes every element before reading it (the
/// elements hold whatever an earlier kernel left). Aligned to a cache line. A buffer that is
/// already out (a kernel run inside another's parallel loop on this thread) is replaced by a
/// fresh one: correct, only slower.
pub fn scratch_take<T: Scalar>(
    pool: ScratchUse,
    index: usize,
    len: usize,
    fill: Option<T>,
) -> AlignedBuf<T> {
    let kept = POOLS.with(|p| {
        p[pool as usize]
            .borrow_mut()
            .get_mut(index)
            .map(std::mem::take)
            .unwrap_or_default()
    });
    let mut v = kept.recast::<T>();
    v.reset(len, fill);
    v
}

/// Puts a buffer back as `index` of this thread's `pool` for the next call (unless it is huge).
pub fn scratch_keep<T: Scalar>(pool: ScratchUse, index: usize, v: AlignedBuf<T>) {
    if v.capacity_bytes() > SCRATCH_KEEP_BYTES {
        return;
    }
    POOLS.with(|p| {
        let mut p = p[pool as usize].borrow_mut();
        if p.len() <= index {
            p.resize_with(index + 1, AlignedBuf::new);
        }
        p[index] = v.recast();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_share_a_kept_buffer_by_index() {
        let a = scratch_take(ScratchUse::Call, 0, 1000, Some(1.5f32));
        let ptr = a.as_ptr() as usize;
        scratch_keep(ScratchUse::Call, 0, a);
        // Another kernel's first buffer, of another type and a smaller size: the same memory.
        let b = scratch_take::<i32>(ScratchUse::Call, 0, 10, None);
        assert_eq!(b.as_ptr() as usize, ptr);
        assert_eq!(b.len(), 10);
        // While it is out, the same index gives a fresh buffer; the other pool is separate.
        let c = scratch_take(ScratchUse::Call, 0, 4, Some(2.0f64));
        let d = scratch_take(ScratchUse::Iteration, 0, 4, Some(3i32));
        assert!(c.as_ptr() as usize != ptr && d.as_ptr() as usize != ptr);
        assert_eq!((&c[..], &d[..]), (&[2.0; 4][..], &[3; 4][..]));
        scratch_keep(ScratchUse::Call, 0, b);
    }

    #[test]
    fn a_recast_to_bool_reads_only_valid_values() {
        let a = scratch_take(ScratchUse::Call, 3, 64, Some(f32::from_bits(0x0303_0303)));
        scratch_keep(ScratchUse::Call, 3, a);
        let b = scratch_take::<bool>(ScratchUse::Call, 3, 64, None);
        assert!(b.iter().all(|&x| !x));
    }
}
