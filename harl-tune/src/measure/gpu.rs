//! The GPU measurer: candidates emitted as CUDA C by the shipped codegen, compiled by NVRTC for
//! the device's compute capability, loaded with cudarc and timed with CUDA events, each checked
//! against the reference interpreter first.
//!
//! It runs in the tuning process (unlike the CPU measurer's worker processes): a candidate
//! that fails to compile or launch, or computes a wrong answer, is one failed trial. harl's
//! kernels index only within bounds they prove or guard, so a faulting kernel is not expected;
//! should one corrupt the context, every later trial of the batch fails with the driver's
//! error (sticky CUDA errors need a new process), which the tuner records, not a crash.

use crate::measure::Measure;
use crate::measure::{reference_data, ReferenceData};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use harl_build::cuda;
use harl_build::lower::lower;
use harl_build::schedule::Schedule;
use harl_te::{DType, Graph};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How candidates are timed.
#[derive(Clone, Debug)]
pub struct GpuMeasureConfig {
    /// Device ordinal.
    pub device: usize,
    /// Untimed runs after the check.
    pub warmup: usize,
    /// Timed repeats (each a CUDA-event-timed group of launches); the median is the latency.
    pub repeats: usize,
    /// Each timed group runs at least this long (launches are grouped to get there).
    pub min_group_time: Duration,
    /// Output elements checked against the interpreter.
    pub check_points: usize,
    /// Seed of the reference inputs.
    pub seed: u64,
}

impl Default for GpuMeasureConfig {
    fn default() -> Self {
        GpuMeasureConfig {
            device: 0,
            warmup: 3,
            repeats: 5,
            min_group_time: Duration::from_millis(20),
            check_points: 256,
            seed: 0,
        }
    }
}

/// Why the GPU measurer could not start.
#[derive(Debug, thiserror::Error)]
pub enum GpuMeasureError {
    /// No CUDA driver library.
    #[error("no CUDA driver on this machine")]
    NoDriver,
    /// No NVRTC library.
    #[error("no NVRTC on this machine")]
    NoNvrtc,
    /// A driver call failed.
    #[error("CUDA: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

/// Times GPU schedules of a graph on one device.
pub struct GpuMeasurer {
    config: GpuMeasureConfig,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    cc: (i32, i32),
    /// Reference and device inputs of the graph measured last (by workload key).
    data: Option<(String, ReferenceData, Vec<CudaSlice<f32>>)>,
}

impl GpuMeasurer {
    /// Opens the device; errors when the driver, NVRTC or the device is missing.
    pub fn new(config: GpuMeasureConfig) -> Result<Self, GpuMeasureError> {
        // SAFETY: a dlopen probe by the library's usual names, with no other precondition.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuMeasureError::NoDriver);
        }
        if !harl_build::nvrtc::nvrtc_available() {
            return Err(GpuMeasureError::NoNvrtc);
        }
        let ctx = CudaContext::new(config.device)?;
        let stream = ctx.default_stream();
        let cc = ctx.compute_capability()?;
        Ok(GpuMeasurer {
            config,
            ctx,
            stream,
            cc,
            data: None,
        })
    }

    /// The device's name and compute capability.
    pub fn device(&self) -> (String, (i32, i32)) {
        (self.ctx.name().unwrap_or_default(), self.cc)
    }

    /// The device's tuning-cache fingerprint (name, compute capability, driver version,
    /// multiprocessors).
    pub fn fingerprint(&self) -> harl_build::target::TargetFingerprint {
        let mut version = 0;
        // SAFETY: the driver is loaded (checked in `new`); the call writes one int.
        let _ = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
        let sms = self
            .ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .unwrap_or(1);
        let cc = (self.cc.0.max(0) as u32, self.cc.1.max(0) as u32);
        harl_build::target::TargetFingerprint::cuda(
            &self.ctx.name().unwrap_or_default(),
            cc,
            version,
            usize::try_from(sms).unwrap_or(1),
        )
    }

    /// The device's stream (for peers timed on the same device).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn prepare(&mut self, graph: &Graph) -> Result<(), String> {
        let key = graph.workload_key();
        if self.data.as_ref().is_some_and(|(k, _, _)| *k == key) {
            return Ok(());
        }
        let r = reference_data(graph, self.config.seed, self.config.check_points)
            .map_err(|e| e.to_string())?;
        let inputs = r
            .inputs
            .iter()
            .map(|v| {
                let host: Vec<f32> = v.iter().map(|&x| x as f32).collect();
                self.stream.clone_htod(&host)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        self.data = Some((key, r, inputs));
        Ok(())
    }

    /// Median latency of one schedule, or why its trial failed.
    pub fn measure_one(&mut self, graph: &Graph, schedule: &Schedule) -> Result<f64, String> {
        let f32_only = graph
            .inputs
            .iter()
            .map(|t| t.dtype)
            .chain(graph.stages.iter().map(|s| s.dtype))
            .all(|d| d == DType::F32);
        if !f32_only {
            return Err("invalid candidate: GPU kernels are f32-only".into());
        }
        let program = lower(graph, schedule).map_err(|e| format!("invalid candidate: {e}"))?;
        let module = cuda::emit(&program).map_err(|e| format!("invalid candidate: {e}"))?;
        let cc = (self.cc.0 * 10 + self.cc.1).max(0) as u32;
        let ptx = harl_build::nvrtc::compile_ptx(&module.source, cc)
            .map_err(|e| format!("compile error: {e}"))?;
        self.prepare(graph)?;
        let Some((_, reference, inputs)) = &self.data else {
            return Err("no reference data".into());
        };
        let driver = |e: cudarc::driver::DriverError| format!("crashed: {e}");
        let loaded = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(driver)?;
        let functions = module
            .launches
            .iter()
            .map(|l| loaded.load_function(&l.name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(driver)?;
        let mut buffers = module
            .buffers
            .iter()
            .map(|&s| {
                self.stream
                    .alloc_zeros::<f32>(program.graph.stages[s].size())
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(driver)?;
        let run = |buffers: &mut Vec<CudaSlice<f32>>| -> Result<(), String> {
            for (f, l) in functions.iter().zip(&module.launches) {
                let mut b = self.stream.launch_builder(f);
                for i in inputs {
                    b.arg(i);
                }
                for buf in buffers.iter_mut() {
                    b.arg(buf);
                }
                let cfg = LaunchConfig {
                    grid_dim: (u32::try_from(l.grid).map_err(|e| e.to_string())?, 1, 1),
                    block_dim: (u32::try_from(l.block).map_err(|e| e.to_string())?, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: the kernels were generated for exactly these parameters (every input,
                // then every stage buffer, f32, sized from the program's shapes) and index
                // within those shapes.
                unsafe { b.launch(cfg) }.map_err(driver)?;
            }
            Ok(())
        };
        run(&mut buffers)?;
        let out = buffers.last().ok_or("no output buffer")?;
        let host = self.stream.clone_dtoh(out).map_err(driver)?;
        for (&i, &want) in reference.points.iter().zip(&reference.expected) {
            let got = host.get(i).copied().map_or(f64::NAN, f64::from);
            // Equal values pass outright (infinities included), as in the CPU worker.
            let close =
                got == want || (got - want).abs() <= reference.tolerance * (1.0 + want.abs());
            // A NaN compares false: it is wrong.
            if !close {
                return Err(format!("wrong result: element {i}: got {got}, want {want}"));
            }
        }
        for _ in 0..self.config.warmup {
            run(&mut buffers)?;
        }
        // Group launches so each timed group lasts at least min_group_time.
        let t = Instant::now();
        run(&mut buffers)?;
        self.stream.synchronize().map_err(driver)?;
        let one = t.elapsed().as_secs_f64().max(1e-7);
        let group =
            ((self.config.min_group_time.as_secs_f64() / one).ceil() as usize).clamp(1, 10_000);
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut times = Vec::with_capacity(self.config.repeats);
        for _ in 0..self.config.repeats.max(1) {
            let start = self.stream.record_event(timing).map_err(driver)?;
            for _ in 0..group {
                run(&mut buffers)?;
            }
            let end = self.stream.record_event(timing).map_err(driver)?;
            end.synchronize().map_err(driver)?;
            let ms = start.elapsed_ms(&end).map_err(driver)?;
            times.push(f64::from(ms) * 1e-3 / group as f64);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }
}

impl Measure for GpuMeasurer {
    fn measure(&mut self, graph: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
        schedules
            .iter()
            .map(|s| self.measure_one(graph, s))
            .collect()
    }
}
