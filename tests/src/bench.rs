//! What every connector bench shares: how many messages and samples a
//! run takes, the timed window of the daemon's side (its rate and its CPU
//! per message), and how a row of the side-by-side table is printed
//! (medians, and the ratio B/A).

use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};

use crate::{Daemon, write_pipeline};

/// N (`SLUICE_BENCH_N`, else `release` in a bench build and `debug` in
/// the debug test profile, which only checks that the bench works), and
/// the samples of each side (`SLUICE_BENCH_SAMPLES`, else
/// `release_samples`, or 1 in debug).
pub fn size(debug: usize, release: usize, release_samples: usize) -> (usize, usize) {
    let n = std::env::var("SLUICE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            debug
        } else {
            release
        });
    let samples = std::env::var("SLUICE_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            1
        } else {
            release_samples
        });
    (n, samples)
}

/// One sample of the daemon's side.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Messages per second.
    pub rate: f64,
    /// The daemon's CPU time (all threads, user and system) per message,
    /// in microseconds.
    pub cpu_us: f64,
}

/// The timed window of one sample of the daemon's side: from the first
/// message written upstream to the last one seen downstream.
pub struct Window {
    started: Instant,
    cpu: Duration,
}

impl Window {
    /// Starts timing `daemon` now.
    pub fn start(daemon: &Daemon) -> Window {
        Window {
            started: Instant::now(),
            cpu: daemon.cpu_time(),
        }
    }

    /// The time since the start.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The sample, over `n` messages.
    pub fn finish(self, daemon: &Daemon, n: usize) -> Sample {
        let wall = self.started.elapsed().as_secs_f64();
        let cpu = daemon.cpu_time().saturating_sub(self.cpu);
        Sample {
            rate: n as f64 / wall,
            cpu_us: cpu.as_secs_f64() * 1e6 / n as f64,
        }
    }
}

/// The median of `samples` (the upper one of an even count).
///
/// # Panics
///
/// When `samples` is empty.
pub fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// A multi-threaded tokio runtime for a bench's clients.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// The run every connector bench makes: for each of `cases`, `samples`
/// runs of A (`raw`, in messages/s) and B (`sluice`) alternating, each
/// given a label unique in the run (`<case>-<sample>`, for its topic,
/// queue and group names); then the table, a row per case named by
/// `name`.
pub fn side_by_side<C: Copy>(
    cases: &[C],
    samples: usize,
    mut raw: impl FnMut(C, &str) -> f64,
    mut sluice: impl FnMut(C, &str) -> Sample,
    name: impl Fn(C) -> String,
) {
    let mut rows = Vec::new();
    for (i, &case) in cases.iter().enumerate() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for sample in 0..samples {
            let run = format!("{i}-{sample}");
            a.push(raw(case, &run));
            b.push(sluice(case, &run));
        }
        rows.push((case, a, b));
    }
    header();
    for (case, a, b) in rows {
        report(&name(case), &a, &b);
    }
}

/// Writes the round trip every connector bench runs to `dir`: the
/// connector's `source` block (one line, `kafka: {...}`) into topic `in`
/// (with `high_water_mark` if given), the `identity` stage into `mid`
/// (concurrency `SLUICE_BENCH_CONCURRENCY`, else 2), and the `sink` block
/// with batches of `batch` (5 ms wait), at the same concurrency.
pub fn round_trip_pipeline(
    dir: &Path,
    mark: Option<u64>,
    batch: usize,
    source: &str,
    sink: &str,
) -> PathBuf {
    let input = mark.map_or_else(
        || "in".to_owned(),
        |m| format!("{{name: in, high_water_mark: {m}}}"),
    );
    let yaml = format!(
        r#"
name: bench
topics: [{input}, mid]
sources:
  - name: src
    to: in
    {source}
stages:
  - name: id
    subscribe: in
    plugin: {plugin}
    publish: [mid]
    concurrency: {conc}
sinks:
  - name: out
    subscribe: mid
    concurrency: {conc}
    batch: {{max: {batch}, wait: 5ms}}
    {sink}
"#,
        plugin = sluice_harness::plugin("identity").display(),
        conc = std::env::var("SLUICE_BENCH_CONCURRENCY").unwrap_or_else(|_| "2".into()),
    );
    write_pipeline(dir, "bench", &yaml)
}

/// Prints the table's header.
pub fn header() {
    println!("| benchmark | A | B | ratio B/A | daemon CPU µs/msg |");
    println!("|---|---|---|---|---|");
}

/// Prints one table row: `name`, the medians of A's rates and B's, B/A,
/// and the median of B's CPU per message.
pub fn report(name: &str, a: &[f64], b: &[Sample]) {
    let rates: Vec<f64> = b.iter().map(|s| s.rate).collect();
    let cpu: Vec<f64> = b.iter().map(|s| s.cpu_us).collect();
    let (ma, mb) = (median(a), median(&rates));
    println!(
        "| {name} | {ma:.0} | {mb:.0} | {:.2} | {:.1} |",
        mb / ma,
        median(&cpu)
    );
}
