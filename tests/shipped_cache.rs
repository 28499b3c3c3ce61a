//! The shipped tuning cache (`tuning-cache/`): every record is a task of a shipped network
//! (`tuning-cache/networks/*.json`, the tasks `harl-bench e2e` lists), parses without a warning,
//! replays (its schedule lowers on the task's graph), is the only record of its workload,
//! machine class and CPU, and, on the tasks small enough to interpret here, computes what the reference
//! interpreter computes.

use harl_build::cache::TuningCache;
use harl_build::lower::lower;
use harl_te::Graph;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One task of a network list.
#[derive(serde::Deserialize)]
struct ListedTask {
    kernel: String,
    workload_key: String,
    graph: Graph,
}

fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning-cache")
}

/// Every listed task by workload key, with the network and kernel it comes from.
fn tasks() -> BTreeMap<String, (String, Graph)> {
    let mut tasks = BTreeMap::new();
    let dir = cache_dir().join("networks");
    for entry in std::fs::read_dir(&dir).expect("tuning-cache/networks") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("task list");
        let listed: Vec<ListedTask> = serde_json::from_str(&text).expect("a task list");
        assert!(!listed.is_empty(), "{}", path.display());
        let net = path
            .file_stem()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        for t in listed {
            t.graph.validate().expect("a valid graph");
            assert_eq!(t.graph.workload_key(), t.workload_key, "{net} {}", t.kernel);
            tasks.insert(t.workload_key, (format!("{net} {}", t.kernel), t.graph));
        }
    }
    tasks
}

/// The machine classes the cache has files for.
fn classes() -> Vec<String> {
    std::fs::read_dir(cache_dir())
        .expect("tuning-cache")
        .filter_map(|e| {
            let p = e.ok()?.path();
            if p.extension()? != "jsonl" {
                return None;
            }
            Some(p.file_stem()?.to_string_lossy().into_owned())
        })
        .collect()
}

/// `n` values in `[-0.5, 0.5)` from a linear congruential generator.
fn data(n: usize, seed: u32) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            f64::from(s >> 8) / f64::from(1u32 << 24) - 0.5
        })
        .collect()
}

#[test]
fn every_shipped_record_replays_on_its_task() {
    let tasks = tasks();
    let classes = classes();
    assert!(!classes.is_empty(), "no record file in tuning-cache/");
    let mut checked = 0;
    for class in &classes {
        let (records, warnings) = TuningCache::new(cache_dir()).records(class);
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(!records.is_empty(), "{class}: no records");
        let mut seen = BTreeSet::new();
        for r in &records {
            let (what, graph) = tasks
                .get(&r.workload_key)
                .unwrap_or_else(|| panic!("{class}: record {} is no listed task", r.workload));
            // One record a task per CPU it was measured on: a build prefers its own CPU's
            // (`cache::best_first`), so records of several CPUs of a class can ship together.
            assert!(
                seen.insert((
                    r.workload_key.clone(),
                    r.target.cpu_model.clone(),
                    r.target.cores
                )),
                "{class}: two records of {what} measured on {}",
                r.target.cpu_model
            );
            let program = lower(graph, &r.schedule)
                .unwrap_or_else(|e| panic!("{class}: {what}'s record does not replay: {e}"));
            // The loop nest the schedule gives against the interpreter, where that is quick
            // in a debug build.
            if graph.flops() <= 4e6 {
                let inputs: Vec<Vec<f64>> = graph
                    .inputs
                    .iter()
                    .enumerate()
                    .map(|(i, p)| data(p.shape.iter().product(), i as u32 + 1))
                    .collect();
                let refs: Vec<&[f64]> = inputs.iter().map(Vec::as_slice).collect();
                let want = harl_te::interp::run(graph, &refs).expect("interpreter");
                let got = harl_build::loop_ir::execute(&program, &refs).expect("loop nest");
                assert_eq!(got.len(), want.len());
                let scale = want.iter().fold(1e-30f64, |m, w| m.max(w.abs()));
                // Both round stores to f32; sums in another order differ by its rounding.
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-5 * scale, "{what}: {g} vs {w}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 0, "no record was small enough to interpret");
}
