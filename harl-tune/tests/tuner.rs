//! The tuning loop is reproducible under a seed, spends its budget, and its curve only improves.

use harl_build::codegen::Variant;
use harl_build::schedule::Schedule;
use harl_te::ops::workloads;
use harl_te::Graph;
use harl_tune::cost_model::XgbModel;
use harl_tune::measure::Measure;
use harl_tune::space::cpu::Task;
use harl_tune::space::CpuSpace;
use harl_tune::strategy::strategy_by_name;
use harl_tune::task_scheduler::scheduler_by_name;
use harl_tune::tuner::{finalists, retime_finalists, tune, TuneOptions, TuneResult};

/// A deterministic stand-in for the measurer: latency from a hash of the schedule.
struct FakeMeasurer;

impl Measure for FakeMeasurer {
    fn measure(&mut self, _: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
        schedules
            .iter()
            .map(|s| {
                let text = format!("{:?}", s.steps);
                let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
                });
                Ok(1e-3 * (1.0 + (h % 1000) as f64 / 1000.0))
            })
            .collect()
    }
}

fn run(strategy: &str, seed: u64, trials: usize, tasks: Vec<Task>) -> TuneResult {
    let options = TuneOptions {
        trials,
        batch: 8,
        time_budget: None,
        reserve_rounds: 0,
        seed,
        seed_default: true,
    };
    let mut model = XgbModel::with_seed(seed);
    run_with(
        &options,
        strategy,
        "gradient",
        &mut model,
        &mut FakeMeasurer,
        tasks,
    )
}

/// One tune of `tasks` on an AVX-512 target under `options`.
fn run_with(
    options: &TuneOptions,
    strategy: &str,
    scheduler: &str,
    model: &mut dyn harl_tune::cost_model::CostModel,
    measurer: &mut dyn Measure,
    tasks: Vec<Task>,
) -> TuneResult {
    let target = Variant::Avx512.cpu_target("x86_64", 2);
    let mut strategy = strategy_by_name(strategy, options.seed).expect("strategy");
    let mut scheduler = scheduler_by_name(scheduler).expect("scheduler");
    tune(
        tasks,
        &target,
        options,
        strategy.as_mut(),
        scheduler.as_mut(),
        model,
        measurer,
    )
}

fn task(name: &str, graph: Graph, weight: f64) -> Task {
    Task {
        name: name.into(),
        graph,
        weight,
    }
}

/// One 64^3 matmul task.
fn matmul_64() -> Vec<Task> {
    vec![task(
        "mm",
        workloads::matmul(64, 64, 64).expect("matmul"),
        1.0,
    )]
}

fn chosen(r: &TuneResult) -> Vec<String> {
    r.tasks
        .iter()
        .flat_map(|s| {
            s.trials
                .iter()
                .map(|t| format!("{:?}", t.candidate.schedule.steps))
        })
        .collect()
}

#[test]
fn same_seed_same_schedules_for_every_strategy() {
    for strategy in ["random", "ansor", "autotvm", "harl", "harl-adaptive"] {
        let a = run(strategy, 7, 24, matmul_64());
        let b = run(strategy, 7, 24, matmul_64());
        let c = run(strategy, 8, 24, matmul_64());
        assert_eq!(a.trials, 24, "{strategy}");
        assert_eq!(
            chosen(&a),
            chosen(&b),
            "{strategy}: same seed, different schedules"
        );
        assert_ne!(chosen(&a), chosen(&c), "{strategy}: the seed has no effect");
    }
}

#[test]
fn harl_elite_names_set_the_elite_fraction() {
    // `harl` starts a quarter of its tracks from the best measured: `harl-elite25` is it.
    assert_eq!(
        chosen(&run("harl", 3, 24, matmul_64())),
        chosen(&run("harl-elite25", 3, 24, matmul_64()))
    );
    let all_elite = run("harl-elite100", 3, 24, matmul_64());
    assert_eq!(all_elite.trials, 24);
    for bad in ["harl-elite101", "harl-elite", "harl-elitex", "harl-elite-5"] {
        assert!(strategy_by_name::<CpuSpace>(bad, 0).is_none(), "{bad}");
    }
}

#[test]
fn harl_adaptive_starts_as_harl_and_leaves_it_once_starts_are_credited() {
    // Until eight measured schedules of each start are credited, the share is harl's quarter.
    assert_eq!(
        chosen(&run("harl", 3, 24, matmul_64())),
        chosen(&run("harl-adaptive", 3, 24, matmul_64()))
    );
    let (fixed, adaptive) = (
        run("harl", 3, 96, matmul_64()),
        run("harl-adaptive", 3, 96, matmul_64()),
    );
    assert_eq!(adaptive.trials, 96);
    assert_ne!(chosen(&fixed), chosen(&adaptive));
}

#[test]
fn budget_is_split_over_tasks_and_the_curve_never_gets_worse() {
    let tasks = vec![
        task("mm", workloads::matmul(32, 48, 64).expect("matmul"), 2.0),
        task(
            "conv",
            workloads::conv2d(1, 8, 10, 10, 8, 3, 3, 1, 1, 1, 1).expect("conv2d"),
            1.0,
        ),
    ];
    let r = run("ansor", 1, 40, tasks);
    assert_eq!(r.trials, 40);
    assert_eq!(r.allocation.iter().sum::<usize>(), 40);
    assert!(r.allocation.iter().all(|&n| n > 0), "{:?}", r.allocation);
    assert!(r
        .curve
        .windows(2)
        .all(|w| w[1].best_latency_s <= w[0].best_latency_s));
}

/// A measurer that times whatever runs first in a batch 50% slow (a cold start), and fails
/// the naive schedule every time.
struct FirstIsSlow {
    base: Vec<(Schedule, f64)>,
}

impl Measure for FirstIsSlow {
    fn measure(&mut self, _: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
        schedules
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let (_, l) = self
                    .base
                    .iter()
                    .find(|(b, _)| b == s)
                    .ok_or("unknown schedule")?;
                Ok(if k == 0 { l * 1.5 } else { *l })
            })
            .collect()
    }
}

#[test]
fn finalists_are_retimed_in_rotated_batches_and_the_median_kept() {
    let graph = workloads::matmul(64, 64, 64).expect("matmul");
    let target = Variant::Avx512.cpu_target("x86_64", 2);
    let a = harl_build::default_schedule::default_schedule(&graph, &target);
    let b = Schedule::naive();
    let c = random_schedule(&graph);
    let mut m = FirstIsSlow {
        base: vec![(a.clone(), 2e-3), (c.clone(), 1e-3)],
    };
    let medians = retime_finalists(&mut m, &graph, &[a, b, c], 3);
    // Each schedule runs first in one round of three: the median drops that round.
    assert_eq!(medians, vec![Some(2e-3), None, Some(1e-3)]);
    assert!(retime_finalists(&mut m, &graph, &[], 3).is_empty());
}

#[test]
fn finalists_are_the_fastest_distinct_schedules() {
    let r = run("ansor", 5, 24, matmul_64());
    let state = &r.tasks[0];
    let f = finalists(state, 3);
    assert_eq!(f.len(), 3);
    let best = state
        .trials
        .iter()
        .filter_map(|t| t.latency_s.map(|l| (l, &t.candidate.schedule)))
        .min_by(|x, y| x.0.total_cmp(&y.0))
        .expect("a best");
    assert_eq!(&f[0], best.1);
    assert!(f[0] != f[1] && f[1] != f[2] && f[0] != f[2]);
}

/// A schedule of `graph` other than the default and the naive one: the first sample of its
/// first sketch.
fn random_schedule(graph: &Graph) -> Schedule {
    let target = Variant::Avx512.cpu_target("x86_64", 2);
    let space = CpuSpace::new(graph, &target);
    let mut rng = harl_build::rng::Rng::new(1);
    let p = harl_tune::space::SearchSpace::sample(&space, 0, &mut rng);
    harl_tune::space::SearchSpace::to_schedule(&space, &p).expect("a schedule")
}

/// A measurer whose every batch takes `pause` of wall time.
struct Slow(std::time::Duration);

impl Measure for Slow {
    fn measure(&mut self, g: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
        std::thread::sleep(self.0);
        FakeMeasurer.measure(g, schedules)
    }
}

fn run_timed(budget: std::time::Duration, reserve_rounds: usize) -> TuneResult {
    let options = TuneOptions {
        trials: 100_000,
        batch: 2,
        time_budget: Some(budget),
        reserve_rounds,
        seed: 0,
        seed_default: false,
    };
    let tasks = vec![task(
        "mm",
        workloads::matmul(16, 16, 16).expect("matmul"),
        1.0,
    )];
    let mut slow = Slow(std::time::Duration::from_millis(20));
    let mut model = harl_tune::cost_model::RandomModel::new(0);
    run_with(
        &options,
        "random",
        "round-robin",
        &mut model,
        &mut slow,
        tasks,
    )
}

#[test]
fn the_search_leaves_its_reserve_inside_the_time_budget() {
    let budget = std::time::Duration::from_millis(600);
    // Without a reserve the search runs until the budget has passed.
    let full = run_timed(budget, 0);
    assert!(full.wall_s >= 0.6, "{}", full.wall_s);
    // With ten rounds reserved it stops while ten of its mean rounds still fit.
    let r = run_timed(budget, 10);
    let rounds = r.trials.div_ceil(2) as f64;
    let mean = r.wall_s / rounds;
    assert!(r.wall_s < 0.6, "{}", r.wall_s);
    assert!(
        r.wall_s + 9.0 * mean <= 0.6 + 1e-3,
        "{} s in {rounds} rounds",
        r.wall_s
    );
}
