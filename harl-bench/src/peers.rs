//! The peers harl is measured against: the `gemm` crate and `matrixmultiply`.
//!
//! Both compute matrix products; a convolution becomes one with im2col (unfold the padded input
//! into a `[C*KH*KW, OH*OW]` column matrix, then `weight [F, C*KH*KW] x columns`). The im2col
//! time is part of the peer's time.

use crate::workload::{Conv2d, Matmul, Shape, Workload};
use rayon::prelude::*;

/// A peer implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// `gemm::gemm` (gemm 0.19): `Parallelism::None` for one thread, else
    /// `Parallelism::Rayon(threads)` on the current rayon pool.
    Gemm,
    /// `matrixmultiply::sgemm`: its thread count comes from `MATMUL_NUM_THREADS`, read once per
    /// process (at most 4 threads), so the caller picks it by running a separate process.
    MatrixMultiply,
}

impl Peer {
    /// `dst [m, n] = lhs [m, k] x rhs [k, n]`, all row-major.
    pub fn matmul(self, mm: Matmul, lhs: &[f32], rhs: &[f32], dst: &mut [f32], threads: usize) {
        assert_eq!(lhs.len(), mm.m * mm.k, "lhs length");
        assert_eq!(rhs.len(), mm.k * mm.n, "rhs length");
        assert_eq!(dst.len(), mm.m * mm.n, "dst length");
        let (m, k, n) = (mm.m, mm.k, mm.n);
        match self {
            Peer::Gemm => {
                let parallelism = if threads <= 1 {
                    gemm::Parallelism::None
                } else {
                    gemm::Parallelism::Rayon(threads)
                };
                // SAFETY: the lengths were checked above against the row-major strides given;
                // `dst` does not alias the operands (it is a distinct `&mut`).
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        dst.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        lhs.as_ptr(),
                        1,
                        k as isize,
                        rhs.as_ptr(),
                        1,
                        n as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        parallelism,
                    );
                }
            }
            Peer::MatrixMultiply => {
                // SAFETY: as above; beta = 0 means `dst` is only written.
                unsafe {
                    matrixmultiply::sgemm(
                        m,
                        k,
                        n,
                        1.0,
                        lhs.as_ptr(),
                        k as isize,
                        1,
                        rhs.as_ptr(),
                        n as isize,
                        1,
                        0.0,
                        dst.as_mut_ptr(),
                        n as isize,
                        1,
                    );
                }
            }
        }
    }
}

/// Runs one workload on a peer; owns the im2col buffer so that timed calls do not allocate.
pub struct PeerRunner {
    shape: Shape,
    columns: Vec<f32>,
}

impl PeerRunner {
    /// A runner for `workload`.
    pub fn new(workload: &Workload) -> Self {
        let columns = match workload.shape {
            Shape::Matmul(_) => Vec::new(),
            Shape::Conv2d(cv) => {
                let mm = cv.as_matmul();
                vec![0.0; mm.k * mm.n]
            }
        };
        PeerRunner {
            shape: workload.shape,
            columns,
        }
    }

    /// Computes the workload's output from its two inputs (as the harl kernel takes them).
    pub fn run(&mut self, peer: Peer, threads: usize, x: &[f32], y: &[f32], out: &mut [f32]) {
        match self.shape {
            Shape::Matmul(mm) => peer.matmul(mm, x, y, out, threads),
            Shape::Conv2d(cv) => {
                im2col(&cv, x, &mut self.columns);
                peer.matmul(cv.as_matmul(), y, &self.columns, out, threads);
            }
        }
    }
}

/// Unfolds `data [1, c, h, w]` into `columns [c*k*k, oh*ow]`: row `(ci, r, s)` holds, for every
/// output pixel, the input value its filter tap `(r, s)` reads (zero in the padding).
///
/// Channels are split over the current rayon pool.
fn im2col(cv: &Conv2d, data: &[f32], columns: &mut [f32]) {
    let (oh, ow) = (cv.oh(), cv.ow());
    let plane = oh * ow;
    assert_eq!(data.len(), cv.c * cv.h * cv.w, "data length");
    assert_eq!(columns.len(), cv.c * cv.k * cv.k * plane, "columns length");
    columns
        .par_chunks_mut(cv.k * cv.k * plane)
        .zip(data.par_chunks(cv.h * cv.w))
        .for_each(|(rows, image)| {
            for r in 0..cv.k {
                for s in 0..cv.k {
                    let row = &mut rows[(r * cv.k + s) * plane..][..plane];
                    unfold_tap(cv, image, r, s, row);
                }
            }
        });
}

/// Writes one im2col row: tap `(r, s)` of every output pixel of one channel's `image`.
fn unfold_tap(cv: &Conv2d, image: &[f32], r: usize, s: usize, row: &mut [f32]) {
    let ow = cv.ow();
    for (oy, line) in row.chunks_exact_mut(ow).enumerate() {
        let Some(iy) = (oy * cv.stride + r)
            .checked_sub(cv.pad)
            .filter(|&y| y < cv.h)
        else {
            line.fill(0.0);
            continue;
        };
        let src = &image[iy * cv.w..][..cv.w];
        for (ox, v) in line.iter_mut().enumerate() {
            *v = (ox * cv.stride + s)
                .checked_sub(cv.pad)
                .and_then(|ix| src.get(ix))
                .copied()
                .unwrap_or(0.0);
        }
    }
}
