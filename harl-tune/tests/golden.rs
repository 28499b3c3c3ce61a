//! The search's decisions are pinned: for every strategy and task scheduler, two tasks, a fixed
//! seed and a deterministic fake measurer, the digest of every measured schedule and of the
//! allocation equals the one recorded before the tuning wing was reorganised (one concept a
//! folder, results fed back through `notify`). A change that moves a search decision, on
//! purpose or not, fails here; when it is on purpose, record the new digests (the test prints
//! them) and say why in the commit.

use harl_build::codegen::Variant;
use harl_build::schedule::Schedule;
use harl_te::ops::workloads;
use harl_te::Graph;
use harl_tune::cost_model::XgbModel;
use harl_tune::measure::Measure;
use harl_tune::space::cpu::Task;
use harl_tune::strategy::strategy_by_name;
use harl_tune::task_scheduler::scheduler_by_name;
use harl_tune::tuner::{tune, TuneOptions};

struct Fake;

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

impl Measure for Fake {
    fn measure(&mut self, _: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
        schedules
            .iter()
            .map(|s| {
                let h = fnv(&format!("{:?}", s.steps));
                if h.is_multiple_of(17) {
                    Err("fails".into())
                } else {
                    Ok(1e-3 * (1.0 + (h % 1000) as f64 / 1000.0))
                }
            })
            .collect()
    }
}

fn digest(strategy: &str, scheduler: &str) -> u64 {
    let tasks = vec![
        Task {
            name: "mm".into(),
            graph: workloads::matmul(64, 48, 32).expect("matmul"),
            weight: 2.0,
        },
        Task {
            name: "dense".into(),
            graph: workloads::dense_bias_relu(16, 64, 40).expect("dense"),
            weight: 1.0,
        },
    ];
    let target = Variant::Avx512.cpu_target("x86_64", 2);
    let mut s = strategy_by_name(strategy, 7).expect("strategy");
    let mut ts = scheduler_by_name(scheduler).expect("scheduler");
    let mut model = XgbModel::with_seed(7);
    let options = TuneOptions {
        trials: 48,
        batch: 8,
        time_budget: None,
        reserve_rounds: 0,
        seed: 7,
        seed_default: true,
    };
    let r = tune(
        tasks,
        &target,
        &options,
        s.as_mut(),
        ts.as_mut(),
        &mut model,
        &mut Fake,
    );
    let mut text = format!("{:?}\n", r.allocation);
    for t in &r.tasks {
        for trial in &t.trials {
            text.push_str(&format!(
                "{:?} {:?}\n",
                trial.candidate.schedule.steps, trial.latency_s
            ));
        }
    }
    fnv(&text)
}

#[test]
fn search_decisions_are_the_recorded_ones() {
    let mut got = Vec::new();
    for strategy in ["harl", "harl-adaptive", "ansor", "autotvm", "random"] {
        for scheduler in ["harl", "gradient", "round-robin"] {
            got.push((strategy, scheduler, digest(strategy, scheduler)));
        }
    }
    for (s, t, d) in &got {
        println!("(\"{s}\", \"{t}\", 0x{d:016x}),");
    }
    // Recorded before the reorganisation of the tuning wing, again on 2026-12-03 when the
    // space changed on purpose (the dense task's 40-wide rows now also get the layout sketch),
    // and again when `Step::CacheRead` gained its `panel` (the fake measurer hashes the steps'
    // debug text, which now holds `panel: None`) and lowering began resolving `x / P`, `x % P`
    // (the cost model's features of fused loops changed), and when the space gained the default
    // sketch (the default schedule's structure with its tiles open: one more sketch a task), and
    // when register tiles came from a throughput model (`register_tile`) and activations with
    // long rows began to be read in panels (the default sketch's seed and structure changed),
    // and when the default attached epilogues at the accumulator block (computed in the
    // write-back): the default sketch's seed changed, so ansor's and autotvm's did; and when a
    // layout without a window took its register tile from `choose_panel_tile` (the dense
    // task's layout sketch is seeded with more rows); and when a vectorised loop's accumulator
    // rows were padded to whole vectors for masked tails (`LoopKind::acc_row`): the cost
    // model's accumulator features changed, so every strategy that uses it decides anew
    // (random, which does not, kept its digests); and when AVX-512 rows with a remainder of
    // 9-15 lanes were padded to 16 (`masked_wide_tail`) and a layout had to pay for its
    // write-back (`layout::WRITE_BACK_CYCLES`): the default sketch's structure changed, so
    // every strategy, random too, measures other schedules; and when a split reduction's first
    // block began to store its sums and its last to compute the epilogue (`Lowering::wrap_acc`):
    // the lowered programs of such schedules, so the cost model's features, changed (random,
    // which does not use the model, kept its digests), and again when that took in splits of
    // a reduce axis that do not divide it, their guard inside the block.
    let want: &[(&str, &str, u64)] = &[
        ("harl", "harl", 0x3fe622f0788ce38d),
        ("harl", "gradient", 0x969d9f844880c31d),
        ("harl", "round-robin", 0x4b9a1d63f9cddfa7),
        ("harl-adaptive", "harl", 0x3fe622f0788ce38d),
        ("harl-adaptive", "gradient", 0x969d9f844880c31d),
        ("harl-adaptive", "round-robin", 0x4b9a1d63f9cddfa7),
        ("ansor", "harl", 0x82805303e8c6e5d9),
        ("ansor", "gradient", 0x9bd8c52f2a2912c5),
        ("ansor", "round-robin", 0xdb7b8d044d35f036),
        ("autotvm", "harl", 0x3f088b4c45047e33),
        ("autotvm", "gradient", 0x710172efbca5ec9d),
        ("autotvm", "round-robin", 0x40c1dab14ed986ff),
        ("random", "harl", 0x71c6954c66d11cfc),
        ("random", "gradient", 0x48abc9726d56b2d4),
        ("random", "round-robin", 0xbd75f52ecc8a2a13),
    ];
    assert_eq!(got.len(), want.len(), "digests not recorded yet");
    for ((s, t, d), (ws, wt, wd)) in got.iter().zip(want) {
        assert_eq!((s, t), (ws, wt));
        assert_eq!(d, wd, "{s} with the {t} scheduler decides differently");
    }
}
