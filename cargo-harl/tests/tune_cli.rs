//! `cargo harl tune` on a build's manifest, as a CI matrix runs it: two shards, each into its own
//! cache directory, merged with `cargo harl cache merge`, cover exactly what one run covers; a
//! run resumed from its trial log measures nothing twice; `cargo harl report` reads the logs.

use harl_build::cache::TuningCache;
use harl_build::target::TargetFingerprint;
use harl_build::Builder;
use harl_te::ops::workloads;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cargo-harl"))
        .arg("harl")
        .args(args)
        .env_remove("HARL_TRIALS")
        .env_remove("HARL_SEED")
        .env_remove("HARL_STRATEGY")
        .env_remove("HARL_COST_MODEL")
        .output()
        .expect("run cargo-harl")
}

fn ok(o: &Output) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stdout}\n{stderr}");
    format!("{stdout}\n{stderr}")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The manifest of a build with three kernels (written by the real build step); the measurer's
/// build directory under it is kept between runs.
fn manifest(out: &Path, cache: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::env::set_var("DEP_HARL_ROOT", &root);
    std::env::remove_var("HARL_TUNE");
    let report = Builder::new()
        .quiet()
        .cache_dir(cache)
        .out_dir(out)
        .kernel("mm_a", workloads::matmul(32, 32, 32).expect("matmul"))
        .kernel("mm_b", workloads::matmul(16, 48, 24).expect("matmul"))
        .kernel(
            "dense",
            workloads::dense_bias_relu(8, 32, 16).expect("dense"),
        )
        // A second kernel of mm_a's workload: it shares mm_a's record, so it is no extra work.
        .kernel("mm_a_again", workloads::matmul(32, 32, 32).expect("matmul"))
        .try_compile()
        .expect("build step");
    assert_eq!(report.kernels.len(), 4);
    out.join("harl/manifest.json")
}

/// (workload key, target) of every record in a cache directory.
fn coverage(dir: &Path) -> BTreeSet<(String, String)> {
    let class = TargetFingerprint::host().isa_class;
    let (records, warnings) = TuningCache::new(dir).records(&class);
    assert!(warnings.is_empty(), "{warnings:?}");
    let set: BTreeSet<_> = records
        .iter()
        .map(|r| (r.workload_key.clone(), format!("{:?}", r.target)))
        .collect();
    assert_eq!(set.len(), records.len(), "a duplicate record in {dir:?}");
    set
}

#[test]
fn two_shards_merged_cover_what_one_run_covers() {
    let work = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tune-cli-test");
    let _ = std::fs::remove_dir_all(work.join("harl/tune-log"));
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = |name: &str| dir.path().join(name);
    let m = manifest(&work, &cache("unused"));
    let tune = |extra: &[&str], into: &Path| {
        let mut args = vec!["tune", "--manifest", s(&m), "--trials", "6", "--seed", "3"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--cache-dir", s(into)]);
        ok(&tool(&args))
    };
    let single = cache("single");
    let said = tune(&[], &single);
    assert!(said.contains("3 to tune"), "{said}");
    assert!(said.contains("speed-up"), "the closing table: {said}");
    let whole = coverage(&single);
    assert_eq!(whole.len(), 3, "one record per workload: {whole:?}");
    // Each kernel's finalists and default were timed again after its search, in the log.
    for log in std::fs::read_dir(work.join("harl/tune-log")).expect("logs") {
        let text = std::fs::read_to_string(log.expect("log").path()).expect("read");
        let finals = text
            .lines()
            .filter(|l| l.contains("\"final_round\":true"))
            .count();
        assert!(
            finals >= 2 * 3,
            "three rounds of at least two schedules: {text}"
        );
    }

    // Forced again with the same seed into a fresh cache: the trial logs of the first run are
    // replayed, so the search takes the same path and finds the same winners. (Before the
    // shards: their jobs hold other kernels, take other paths, and rewrite those logs.)
    let class = TargetFingerprint::host().isa_class;
    let replayed = cache("replayed");
    tune(&["--force"], &replayed);
    let best = |dir: &Path| {
        let (records, _) = TuningCache::new(dir).records(&class);
        records
            .into_iter()
            .map(|r| {
                (
                    r.workload_key,
                    serde_json::to_string(&r.schedule).expect("json"),
                )
            })
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(best(&replayed), best(&single));

    let (a, b) = (cache("shard0"), cache("shard1"));
    tune(&["--shard", "0/2"], &a);
    tune(&["--shard", "1/2"], &b);
    let (ca, cb) = (coverage(&a), coverage(&b));
    assert!(!ca.is_empty() && !cb.is_empty(), "{ca:?} / {cb:?}");
    assert!(ca.is_disjoint(&cb), "shards overlap: {ca:?} / {cb:?}");

    let merged = cache("merged");
    std::fs::create_dir(&merged).expect("mkdir");
    ok(&tool(&[
        "cache",
        "merge",
        s(&TuningCache::new(&a).path_for(&class)),
        s(&TuningCache::new(&b).path_for(&class)),
        "-o",
        s(&merged),
    ]));
    assert_eq!(coverage(&merged), whole);

    // Run again into the single cache: every kernel has its record, nothing is tuned.
    let again = tune(&[], &single);
    assert!(again.contains("0 to tune"), "{again}");
    assert_eq!(coverage(&single), whole);

    let report = ok(&tool(&[
        "report",
        "--manifest",
        s(&m),
        "--out",
        s(&dir.path().join("report")),
    ]));
    assert!(
        report.contains("tuned GFLOP/s") && report.contains("mm_b"),
        "{report}"
    );
    let plots: Vec<PathBuf> = std::fs::read_dir(dir.path().join("report"))
        .expect("plots")
        .map(|e| e.expect("entry").path())
        .collect();
    // An SVG and a PNG for each of the three kernels.
    assert_eq!(plots.len(), 6, "{report}");
    for p in &plots {
        let bytes = std::fs::read(p).expect("plot");
        match p.extension().and_then(|e| e.to_str()) {
            Some("png") => assert!(bytes.starts_with(b"\x89PNG"), "{}", p.display()),
            Some("svg") => assert!(
                String::from_utf8_lossy(&bytes).contains("best-so-far"),
                "{}",
                p.display()
            ),
            _ => panic!("unexpected {}", p.display()),
        }
    }
}

#[test]
fn bad_arguments_and_manifests_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("manifest.json");
    std::fs::write(&bad, "{\"version\": 99}").expect("write");
    let out = tool(&["tune", "--manifest", s(&bad)]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a manifest"), "{stderr}");
    let out = tool(&["tune", "--manifest", s(&bad), "--shard", "2/2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("need 0 <= I < N"));
}

/// `cache retime` times each record a build could pick beside the default, and `--drop`
/// removes exactly the records its table calls slower (or failed); records of workloads the
/// crate does not have stay, lines that do not parse go and are reported. Which verdict a
/// record gets is timing, so the test checks that the file follows the table, not the table.
#[test]
fn retime_times_records_beside_the_default_and_drop_removes_what_loses() {
    let work = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/retime-cli-test");
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).expect("mkdir");
    let m = manifest(&work, &cache);
    let target = TargetFingerprint::host();
    let record = |graph: &harl_te::Graph, schedule: harl_build::schedule::Schedule| {
        harl_build::cache::Record::new(graph.workload_key(), "w", target.clone(), schedule, 1e-9, 1)
    };
    let mm = workloads::matmul(32, 32, 32).expect("matmul");
    let dense = workloads::dense_bias_relu(8, 32, 16).expect("dense");
    let other = workloads::matmul(8, 8, 8).expect("matmul");
    // The loops as declared: scalar, slow; and the same workload's naive schedule once more
    // with a parallel outer loop.
    let naive = harl_build::schedule::Schedule::default();
    let mut parallel = naive.clone();
    parallel
        .steps
        .push(harl_build::schedule::Step::Parallel { stage: 0, at: 0 });
    let records = [
        record(&mm, naive.clone()),
        record(&mm, parallel),
        record(&dense, naive.clone()),
        record(&other, naive),
    ];
    let file = TuningCache::new(&cache).path_for(&target.isa_class);
    let mut text: String = records
        .iter()
        .map(|r| serde_json::to_string(r).expect("json") + "\n")
        .collect();
    text.push_str("not a record\n");
    std::fs::write(&file, &text).expect("write");

    let rows = |out: &str| -> Vec<(String, String)> {
        out.lines()
            .filter(|l| l.starts_with("| mm_a") || l.starts_with("| dense"))
            .map(|l| {
                let c: Vec<&str> = l.split('|').map(str::trim).collect();
                (c[1].to_string(), c[8].to_string())
            })
            .collect()
    };
    let retime = |extra: &[&str]| {
        let mut args = vec!["cache", "retime", "--manifest", s(&m), "--rounds", "1"];
        args.extend_from_slice(extra);
        ok(&tool(&args))
    };
    let looked = retime(&["--passes", "1"]);
    let table = rows(&looked);
    // mm_a's two records (mm_a_again shares them) and dense's one; mm_b has none.
    assert_eq!(table.len(), 3, "{looked}");
    assert_eq!(table.iter().filter(|(k, _)| k == "mm_a").count(), 2);
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        text,
        "no --drop: untouched"
    );

    // Two passes: a record goes when both tables call it slower (or failed).
    let dropped = retime(&["--drop", "--passes", "2"]);
    let table = rows(&dropped);
    assert_eq!(table.len(), 6, "{dropped}");
    let lost = |(_, v): &(String, String)| v.starts_with("slower") || v.starts_with("failed");
    let losers = (0..3)
        .filter(|&i| lost(&table[i]) && lost(&table[i + 3]))
        .count();
    assert!(
        dropped.contains(".jsonl:5: dropped: invalid JSON"),
        "the bad line is reported: {dropped}"
    );
    let (left, warnings) = TuningCache::new(&cache).records(&target.isa_class);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(left.len(), 4 - losers, "{dropped}");
    assert!(
        left.iter().any(|r| r.workload_key == other.workload_key()),
        "another workload's record stays"
    );
}
