//! Running harl's GPU kernels: PTX embedded at build time, loaded and launched with cudarc.
//!
//! A kernel declared with GPU code generation on (`harl_build::Builder::cuda(true)`) gets a
//! `GPU: harl::gpu::GpuKernel` item beside its CPU `run` function. At run time:
//!
//! ```no_run
//! # fn demo(kernel: &harl::gpu::GpuKernel, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), harl::gpu::GpuError> {
//! let gpu = harl::gpu::Gpu::new(0)?;            // a clear error on a machine without a GPU
//! let loaded = kernel.load(&gpu)?;              // picks the PTX for this device
//! loaded.run_host(&[a, b], out)?;               // copies in, launches, copies out
//! # Ok(()) }
//! ```
//!
//! or, with data already on the device, [`LoadedKernel::launch`] on `CudaSlice`s. Everything is
//! f32 for now. The driver library is loaded at run time: a binary built with this feature
//! starts on machines without CUDA and gets [`GpuError::NoDriver`] from [`Gpu::new`].

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use std::sync::Arc;

pub use cudarc;

/// One launch of a kernel's program: function name, blocks, threads per block.
pub type Launch = (&'static str, u32, u32);

/// The PTX of one schedule and how to launch it.
#[derive(Debug)]
pub struct GpuProgram {
    /// PTX text (a virtual architecture, JIT-compiled by the driver for the device).
    pub ptx: &'static str,
    /// The compute capability it was tuned for (`(9, 0)`), or `None` for the portable default
    /// schedule.
    pub tuned_for: Option<(u32, u32)>,
    /// Launches in order; each takes every buffer.
    pub launches: &'static [Launch],
    /// Elements of each intermediate buffer (between the inputs and the output).
    pub temps: &'static [usize],
}

/// A kernel's GPU code as the build embedded it.
#[derive(Debug)]
pub struct GpuKernel {
    /// The kernel's name.
    pub name: &'static str,
    /// Elements of each input, in order.
    pub inputs: &'static [usize],
    /// Elements of the output.
    pub output: usize,
    /// Tuned programs (by compute capability), then the default one; empty if the build host
    /// had no NVRTC to make PTX.
    pub programs: &'static [GpuProgram],
}

/// What can go wrong on the GPU path.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The CUDA driver library is not installed (no NVIDIA driver on this machine).
    #[error("no CUDA driver on this machine (libcuda not found)")]
    NoDriver,
    /// The driver is there but there is no such device.
    #[error("no CUDA device {0}")]
    NoDevice(usize),
    /// The build had no NVRTC, so no PTX was embedded.
    #[error("kernel `{0}` was built without PTX (no NVRTC on the build host)")]
    NoPtx(&'static str),
    /// A buffer has the wrong length.
    #[error("kernel `{kernel}`: buffer {index} has {got} elements, it needs {want}")]
    Length {
        /// The kernel.
        kernel: &'static str,
        /// Position among the inputs (the output is last).
        index: usize,
        /// Elements given.
        got: usize,
        /// Elements needed.
        want: usize,
    },
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

/// Whether this machine has a CUDA driver and at least one device.
pub fn gpu_available() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by its usual names.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    present && CudaContext::device_count().is_ok_and(|n| n > 0)
}

/// A device and the stream kernels run on.
#[derive(Debug, Clone)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl Gpu {
    /// Opens device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        // SAFETY: as in `gpu_available`: a dlopen probe, before any driver call can panic on a
        // missing library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::NoDriver);
        }
        let count = CudaContext::device_count()?;
        if ordinal >= usize::try_from(count).unwrap_or(0) {
            return Err(GpuError::NoDevice(ordinal));
        }
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.default_stream();
        Ok(Gpu { ctx, stream })
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream kernels are launched on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's compute capability.
    pub fn compute_capability(&self) -> Result<(u32, u32), GpuError> {
        let (major, minor) = self.ctx.compute_capability()?;
        Ok((major.max(0) as u32, minor.max(0) as u32))
    }
}

/// A kernel loaded on a device.
#[derive(Debug)]
pub struct LoadedKernel {
    kernel: &'static GpuKernel,
    program: &'static GpuProgram,
    functions: Vec<CudaFunction>,
    gpu: Gpu,
}

impl GpuKernel {
    /// The program for a device of compute capability `cc`: the one tuned for it, else the
    /// default (the last).
    pub fn program_for(&self, cc: (u32, u32)) -> Option<&GpuProgram> {
        self.programs
            .iter()
            .find(|p| p.tuned_for == Some(cc))
            .or_else(|| self.programs.iter().find(|p| p.tuned_for.is_none()))
    }

    /// Loads the PTX for `gpu`'s device.
    pub fn load(&'static self, gpu: &Gpu) -> Result<LoadedKernel, GpuError> {
        let cc = gpu.compute_capability()?;
        let program = self.program_for(cc).ok_or(GpuError::NoPtx(self.name))?;
        let module = gpu
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(program.ptx))?;
        let functions = program
            .launches
            .iter()
            .map(|(name, _, _)| module.load_function(name))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LoadedKernel {
            kernel: self,
            program,
            functions,
            gpu: gpu.clone(),
        })
    }
}

impl LoadedKernel {
    /// Whether the loaded program was tuned for this device (else it is the default schedule).
    pub fn is_tuned(&self) -> bool {
        self.program.tuned_for.is_some()
    }

    /// Runs on device buffers: the inputs in declaration order, then the output.
    pub fn launch(
        &self,
        inputs: &[&CudaSlice<f32>],
        out: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let k = self.kernel;
        let lens = inputs.iter().map(|s| s.len()).chain([out.len()]);
        let wants = k.inputs.iter().copied().chain([k.output]);
        if inputs.len() != k.inputs.len() {
            return Err(GpuError::Length {
                kernel: k.name,
                index: inputs.len(),
                got: 0,
                want: k.inputs.len(),
            });
        }
        for (index, (got, want)) in lens.zip(wants).enumerate() {
            if got != want {
                return Err(GpuError::Length {
                    kernel: k.name,
                    index,
                    got,
                    want,
                });
            }
        }
        let stream = &self.gpu.stream;
        let temps = self
            .program
            .temps
            .iter()
            .map(|&n| stream.alloc_zeros::<f32>(n))
            .collect::<Result<Vec<_>, _>>()?;
        for (f, &(_, grid, block)) in self.functions.iter().zip(self.program.launches) {
            let mut b = stream.launch_builder(f);
            for i in inputs {
                b.arg(*i);
            }
            for t in &temps {
                b.arg(t);
            }
            b.arg(&mut *out);
            let cfg = LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: (block, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the PTX was generated by harl for exactly this parameter list (every
            // input, every intermediate buffer, the output, all f32), whose lengths were checked
            // above; the kernels index only within the shapes those lengths come from.
            unsafe { b.launch(cfg) }?;
        }
        Ok(())
    }

    /// Runs on host slices: copies the inputs in, launches, copies the output back.
    pub fn run_host(&self, inputs: &[&[f32]], out: &mut [f32]) -> Result<(), GpuError> {
        let stream = &self.gpu.stream;
        let dev: Vec<CudaSlice<f32>> = inputs
            .iter()
            .map(|h| stream.clone_htod(*h))
            .collect::<Result<_, _>>()?;
        let refs: Vec<&CudaSlice<f32>> = dev.iter().collect();
        let mut d_out = stream.alloc_zeros::<f32>(out.len())?;
        self.launch(&refs, &mut d_out)?;
        stream.memcpy_dtoh(&d_out, out)?;
        stream.synchronize()?;
        Ok(())
    }
}
