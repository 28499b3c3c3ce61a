//! The cache under concurrent writers and a crash: eight processes append to one file while
//! one of them is SIGKILLed at a random point. Every line must parse, every append that
//! returned must be in the file, and the killed writer's temporary file must not outlive the
//! next append.

use harl_build::cache::{Record, TuningCache};
use harl_build::schedule::{Schedule, Step};
use harl_build::target::TargetFingerprint;
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

const WRITERS: usize = 8;
const APPENDS: usize = 40;
/// Set in the child processes: `<cache dir>|<writer id>`.
const CHILD_ENV: &str = "HARL_CACHE_FAULTS_CHILD";

fn record(writer: usize, n: usize) -> Record {
    Record::new(
        format!("w{writer}-{n}"),
        "fault test",
        TargetFingerprint::host(),
        Schedule {
            steps: vec![Step::Split {
                stage: 0,
                at: 0,
                factors: vec![n + 1],
            }],
        },
        1e-3,
        1,
    )
}

/// In the parent test run, does nothing. In a child, appends its records, saying `done N`
/// on stdout after each append has returned.
#[test]
fn child_appender() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (dir, id) = spec.rsplit_once('|').expect("dir|id");
    let id: usize = id.parse().expect("writer id");
    let cache = TuningCache::new(dir);
    let mut stdout = std::io::stdout().lock();
    for n in 0..APPENDS {
        cache.append(&record(id, n)).expect("append");
        writeln!(stdout, "done {n}").expect("stdout");
        stdout.flush().expect("flush");
        // Keeps the writers interleaved, and the victim alive until the parent kills it.
        std::thread::sleep(Duration::from_millis(3));
    }
}

#[test]
fn eight_writers_and_a_kill_lose_no_completed_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = TuningCache::new(dir.path());
    let file = cache.path_for(&TargetFingerprint::host().isa_class);
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(7, |d| d.subsec_nanos() as u64);
    let victim = (seed % WRITERS as u64) as usize;
    // Kill after the victim has finished between 1 and APPENDS-1 appends.
    let kill_after = 1 + (seed / 8 % (APPENDS as u64 - 2)) as usize;
    eprintln!("seed {seed}: killing writer {victim} after {kill_after} appends");

    let exe = std::env::current_exe().expect("test binary");
    let mut children: Vec<_> = (0..WRITERS)
        .map(|id| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "child_appender",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, format!("{}|{id}", dir.path().display()))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn a writer")
        })
        .collect();
    let mut done: Vec<HashSet<usize>> = vec![HashSet::new(); WRITERS];
    let readers: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().expect("piped")))
        .collect();
    let mut threads = Vec::new();
    let (tx, rx) = std::sync::mpsc::channel();
    for (id, reader) in readers.into_iter().enumerate() {
        let tx = tx.clone();
        threads.push(std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                // The harness may print its own text before ours on a line.
                for n in line.split("done ").skip(1) {
                    if let Ok(n) = n.trim().parse() {
                        let _ = tx.send((id, n));
                    }
                }
            }
        }));
    }
    drop(tx);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut killed = false;
    while let Ok((id, n)) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        done[id].insert(n);
        if !killed && id == victim && done[id].len() >= kill_after {
            children[victim].kill().expect("SIGKILL the victim");
            killed = true;
        }
    }
    for (id, c) in children.iter_mut().enumerate() {
        let status = c.wait().expect("wait");
        if id != victim {
            assert!(status.success(), "writer {id} failed: {status}");
        }
    }
    for t in threads {
        t.join().expect("reader thread");
    }
    assert!(killed, "the victim was never killed");
    assert!(
        done[victim].len() < APPENDS,
        "the victim finished before the kill landed"
    );

    // Every line parses, as a record of this class.
    let text = std::fs::read_to_string(&file).expect("the cache file exists");
    let (records, warnings) = cache.records(&TargetFingerprint::host().isa_class);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(records.len(), text.lines().count());
    let present: HashSet<String> = records.iter().map(|r| r.workload_key.clone()).collect();
    assert_eq!(present.len(), records.len(), "a record was written twice");
    let mut completed = 0;
    for (id, ns) in done.iter().enumerate() {
        for n in ns {
            completed += 1;
            assert!(
                present.contains(&format!("w{id}-{n}")),
                "writer {id}'s append {n} returned but is not in the file"
            );
        }
    }
    for id in (0..WRITERS).filter(|&id| id != victim) {
        assert_eq!(done[id].len(), APPENDS, "writer {id} did not finish");
    }
    eprintln!(
        "{completed} completed appends, {} records in the file, victim finished {}",
        records.len(),
        done[victim].len()
    );

    // A temporary file a killed writer left (planted, since the kill may land elsewhere) is
    // removed by the next append.
    let stale = Path::new(&format!("{}.4242424.tmp", file.display())).to_path_buf();
    std::fs::write(&stale, "half a record").expect("plant a stale temp");
    cache
        .append(&record(99, 0))
        .expect("append after the crash");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "stale temporary files: {leftovers:?}");
}
