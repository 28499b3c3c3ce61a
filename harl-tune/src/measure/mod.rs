//! Measuring schedules: the [`Measure`] trait the tuning loop times candidates through, the
//! CPU measurer ([`cpu`]: out-of-process workers built from the shipped codegen, checked
//! against the reference interpreter) and the GPU measurer (`gpu`, feature `cuda`).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod gpu;

pub use cpu::*;

use harl_build::schedule::Schedule;
use harl_te::Graph;

/// Something that times schedules of a graph: the out-of-process measurer, or a fake in tests.
pub trait Measure {
    /// Median latency of each schedule in seconds, or why its trial failed.
    fn measure(&mut self, graph: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>>;
    /// The task's best latency so far, before each batch: a measurer may spend less time on
    /// candidates that are clearly slower (the default ignores it).
    fn set_best(&mut self, _best_s: Option<f64>) {}
}

impl Measure for cpu::Measurer {
    fn set_best(&mut self, best_s: Option<f64>) {
        cpu::Measurer::set_best(self, best_s);
    }
    fn measure(&mut self, graph: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
        let candidates: Vec<cpu::Candidate> = schedules
            .iter()
            .cloned()
            .map(cpu::Candidate::Schedule)
            .collect();
        cpu::Measurer::measure(self, graph, &candidates)
            .into_iter()
            .map(|m| match (m.latency_s, m.error) {
                (Some(l), None) => Ok(l),
                (_, Some(e)) => Err(e.to_string()),
                (None, None) => Err("no latency".into()),
            })
            .collect()
    }
}
