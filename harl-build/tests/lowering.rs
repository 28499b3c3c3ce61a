//! Every legal schedule computes what the reference interpreter computes.

mod common;

use common::*;
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::loop_ir::execute;
use harl_build::lower::lower;
use harl_build::schedule::{Schedule, Step};
use harl_te::interp;
use proptest::prelude::*;

fn check(graph: &harl_te::Graph, sched: &Schedule, seed: u64) {
    let inputs = data(graph, seed);
    let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
    let want = interp::run(graph, &refs).expect("interpreter");
    let program = lower(graph, sched).expect("legal schedule");
    let got = execute(&program, &refs).expect("execute");
    assert_close(&got, &want, 1e-4, &format!("{:?}", sched.steps));
}

#[test]
fn naive_schedule_matches_interpreter() {
    check(&matmul(5, 7, 3, true), &Schedule::naive(), 1);
}

#[test]
fn default_schedule_matches_interpreter() {
    for (m, k, n) in [(12, 20, 32), (7, 5, 9), (64, 300, 48), (1, 16, 64)] {
        for epi in [false, true] {
            let g = matmul(m, k, n, epi);
            for target in [CpuTarget::host(), CpuTarget::portable()] {
                let s = default_schedule(&g, &target);
                check(&g, &s, 3);
            }
        }
    }
}

#[test]
fn non_dividing_split_is_guarded() {
    let g = matmul(7, 5, 9, false);
    let s = Schedule {
        steps: vec![
            Step::Split {
                stage: 0,
                at: 1,
                factors: vec![2, 2],
            },
            Step::Split {
                stage: 0,
                at: 1,
                factors: vec![2],
            },
            Step::Split {
                stage: 0,
                at: 0,
                factors: vec![4],
            },
            Step::CacheWrite { stage: 0, at: 1 },
        ],
    };
    check(&g, &s, 5);
}

#[test]
fn invalid_steps_are_rejected() {
    let g = matmul(8, 8, 8, true);
    let bad = [
        Step::Split {
            stage: 0,
            at: 9,
            factors: vec![2],
        },
        Step::Split {
            stage: 0,
            at: 0,
            factors: vec![16],
        },
        Step::Parallel { stage: 0, at: 2 },
        Step::Reorder {
            stage: 0,
            order: vec![0, 0, 1],
        },
        Step::ComputeInline { stage: 1 },
        Step::ComputeInline { stage: 0 },
        Step::Fuse { stage: 0, at: 1 },
        Step::ComputeAt {
            stage: 1,
            target: 0,
            at: 2,
        },
        Step::CacheWrite { stage: 1, at: 0 },
        Step::Vectorize { stage: 0, at: 0 },
    ];
    for step in bad {
        let s = Schedule {
            steps: vec![step.clone()],
        };
        assert!(lower(&g, &s).is_err(), "{step:?} should be rejected");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]
    #[test]
    fn random_legal_matmul_schedules_match(seed in any::<u64>(), m in 1usize..10, k in 1usize..12, n in 1usize..12, epi in any::<bool>()) {
        let g = matmul(m, k, n, epi);
        let s = random_schedule(&g, seed, 24);
        check(&g, &s, seed);
    }
}
