//! What the default schedule and the sketches plan for: vector width, registers, threads.

/// The vector and register budget the default schedule plans for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTarget {
    /// Vector register width in bytes (64 for AVX-512, 32 for AVX2, 16 for NEON/SSE).
    pub vector_bytes: usize,
    /// Vector registers the accumulator may use.
    pub acc_registers: usize,
    /// Vector registers the ISA has (32 zmm with AVX-512, 16 ymm with AVX2): the budget of a
    /// tile with few other live values ([`crate::register_tile::choose_panel_tile`]).
    pub vector_registers: usize,
    /// Threads the parallel loop should feed.
    pub threads: usize,
}

impl CpuTarget {
    /// Plans for the CPU this code runs on (the build host): its best variant's plan.
    pub fn host() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        super::Variant::host().cpu_target(std::env::consts::ARCH, threads)
    }

    /// A conservative plan for a target that cannot be probed (cross-compiling).
    pub fn portable() -> Self {
        CpuTarget {
            vector_bytes: 32,
            acc_registers: 12,
            vector_registers: 16,
            threads: 4,
        }
    }
}
