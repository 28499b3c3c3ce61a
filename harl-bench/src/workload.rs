//! The benchmarked workloads: their shapes, FLOP counts, inputs and the harl kernel for each.

use crate::kernels::{conv2d_56, matmul_1024, matmul_512};

/// A generated harl kernel with two inputs, as `include_kernels!` emits it.
pub type KernelFn = fn(&[f32], &[f32], &mut [f32]) -> Result<(), harl::KernelError>;

/// A row-major `[m, k] x [k, n]` matrix product.
#[derive(Clone, Copy, Debug)]
pub struct Matmul {
    /// Rows of the left operand and of the output.
    pub m: usize,
    /// The reduction length.
    pub k: usize,
    /// Columns of the right operand and of the output.
    pub n: usize,
}

/// An NCHW 2-D convolution of one image (batch 1, groups 1, dilation 1, square kernel).
#[derive(Clone, Copy, Debug)]
pub struct Conv2d {
    /// Input channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Filters (output channels).
    pub f: usize,
    /// Kernel height and width.
    pub k: usize,
    /// Stride on both spatial axes.
    pub stride: usize,
    /// Zero padding on both spatial axes.
    pub pad: usize,
}

impl Conv2d {
    /// Output height.
    pub fn oh(&self) -> usize {
        (self.h + 2 * self.pad - self.k) / self.stride + 1
    }

    /// Output width.
    pub fn ow(&self) -> usize {
        (self.w + 2 * self.pad - self.k) / self.stride + 1
    }

    /// The matrix product the convolution becomes after im2col:
    /// weights `[f, c*k*k]` times columns `[c*k*k, oh*ow]`.
    pub fn as_matmul(&self) -> Matmul {
        Matmul {
            m: self.f,
            k: self.c * self.k * self.k,
            n: self.oh() * self.ow(),
        }
    }
}

/// The shape of a workload.
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    /// A matrix product: inputs `a [m, k]`, `b [k, n]`.
    Matmul(Matmul),
    /// A convolution: inputs `data [1, c, h, w]`, `weight [f, c, k, k]`.
    Conv2d(Conv2d),
}

/// One benchmarked workload: a registered harl kernel and its shape.
#[derive(Clone, Copy)]
pub struct Workload {
    /// Name, as registered in `build.rs`.
    pub name: &'static str,
    /// The shape.
    pub shape: Shape,
    /// The harl kernel.
    pub kernel: KernelFn,
    /// Where the kernel's schedule came from (`schedule_source()` of its module).
    pub schedule_source: &'static str,
}

impl Workload {
    /// The matrix product the peers compute (directly, or after im2col).
    pub fn gemm_shape(&self) -> Matmul {
        match self.shape {
            Shape::Matmul(mm) => mm,
            Shape::Conv2d(conv) => conv.as_matmul(),
        }
    }

    /// Floating-point operations of one call: `2*M*N*K` (conv: `2*F*OH*OW*C*KH*KW`).
    pub fn flops(&self) -> f64 {
        let mm = self.gemm_shape();
        2.0 * (mm.m * mm.n * mm.k) as f64
    }

    /// Elements of the two inputs and of the output.
    pub fn lens(&self) -> (usize, usize, usize) {
        match self.shape {
            Shape::Matmul(mm) => (mm.m * mm.k, mm.k * mm.n, mm.m * mm.n),
            Shape::Conv2d(cv) => (
                cv.c * cv.h * cv.w,
                cv.f * cv.c * cv.k * cv.k,
                cv.f * cv.oh() * cv.ow(),
            ),
        }
    }

    /// Deterministic inputs in `[-0.5, 0.5)`.
    pub fn inputs(&self) -> (Vec<f32>, Vec<f32>) {
        let (a, b, _) = self.lens();
        (data(a, 1), data(b, 2))
    }

    /// Human-readable shape: `MxKxN`, or `data * weight, stride, pad` for a convolution.
    pub fn describe(&self) -> String {
        match self.shape {
            Shape::Matmul(mm) => format!("{}x{}x{}", mm.m, mm.k, mm.n),
            Shape::Conv2d(cv) => format!(
                "1x{c}x{}x{} * {}x{c}x{k}x{k}, stride {}, pad {}",
                cv.h,
                cv.w,
                cv.f,
                cv.stride,
                cv.pad,
                c = cv.c,
                k = cv.k
            ),
        }
    }
}

/// The workloads of the `spine` benchmark, as registered in `build.rs`.
pub fn spine() -> Vec<Workload> {
    vec![
        Workload {
            name: "matmul_512",
            shape: Shape::Matmul(Matmul {
                m: 512,
                k: 512,
                n: 512,
            }),
            kernel: matmul_512::run,
            schedule_source: matmul_512::schedule_source(),
        },
        Workload {
            name: "matmul_1024",
            shape: Shape::Matmul(Matmul {
                m: 1024,
                k: 1024,
                n: 1024,
            }),
            kernel: matmul_1024::run,
            schedule_source: matmul_1024::schedule_source(),
        },
        Workload {
            name: "conv2d_56",
            shape: Shape::Conv2d(Conv2d {
                c: 64,
                h: 56,
                w: 56,
                f: 64,
                k: 3,
                stride: 1,
                pad: 1,
            }),
            kernel: conv2d_56::run,
            schedule_source: conv2d_56::schedule_source(),
        },
    ]
}

/// `n` pseudo-random values in `[-0.5, 0.5)` from a linear congruential generator.
pub(crate) fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}
