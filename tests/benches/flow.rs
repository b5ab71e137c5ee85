//! Issue 26's flow figures, measured on the real daemon: how exactly a
//! `rate` holds, and how adaptive concurrency follows a target whose
//! capacity drops. Figures are printed, never asserted (the tests assert
//! the semantics: never faster than the limit, two NATS daemons sharing
//! one, an adaptive sink seldom refused).
//!
//! `cargo bench -p sluice-tests --bench flow [-- rate|adaptive]`; in the
//! debug test profile (`cargo test -p sluice-tests --bench flow`) it runs
//! short phases, to check that it works. `SLUICE_BENCH_SAMPLES` sets the
//! samples of the rate section (default 3).
//!
//! - **rate**: a stage with `rate: 200/s` (burst 1, concurrency 4, the
//!   `stamp` handler, which records when each call started) over a backlog
//!   that outlasts the window: the calls started within 30 s of the first.
//!   The target is 6,000 ± 2 %: on the embedded broker, on NATS, and with
//!   two daemons on NATS sharing the stage, together.
//! - **adaptive**: a webhook sink with `concurrency: {max: 64, adaptive:
//!   true}` against a receiver that serves 40 requests at once at 20 ms
//!   each, then only 10 (it answers 503 beyond). Per phase: the calls the
//!   receiver served per second, its 503 rate, and how long after the drop
//!   the limit came down to 10; against the same receiver at fixed
//!   concurrencies around each phase's capacity (the best of them is the
//!   yardstick: the target is at least 80 % of it).

#![allow(missing_docs)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use sluice_tests::{Backend, Daemon, Msg, bench, header, plugin, write_pipeline};

fn main() {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |s: &str| filter.is_empty() || filter.iter().any(|f| s.contains(f.as_str()));
    if wants("rate") {
        rate();
    }
    if wants("adaptive") {
        adaptive();
    }
}

// ---- rate ----

/// The stage's limit, per second.
const RATE: usize = 200;

/// How a rate sample runs: the broker, and how many daemons share the stage.
#[derive(Clone, Copy)]
enum Setup {
    Embedded,
    Nats { daemons: usize },
}

impl Setup {
    fn name(self) -> String {
        match self {
            Setup::Embedded => "embedded, one daemon".into(),
            Setup::Nats { daemons: 1 } => "NATS, one daemon".into(),
            Setup::Nats { daemons } => format!("NATS, {daemons} daemons sharing the stage"),
        }
    }
}

/// One rate sample: the calls that started within the window of the
/// first, and how many each daemon made in all.
struct RateSample {
    in_window: usize,
    by_daemon: Vec<f64>,
}

fn rate() {
    let (window_s, samples) = if cfg!(debug_assertions) {
        (3, 1)
    } else {
        (30, 3)
    };
    let samples = std::env::var("SLUICE_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(samples);
    let want = RATE * window_s;
    println!(
        "\n### `rate: {RATE}/s` (burst 1) over {window_s} s: calls started within {window_s} s \
         of the first (target {want} ± 2 %)\n"
    );
    println!("| setup | samples | median | off by | calls per daemon (each sample) |");
    println!("|---|---|---:|---:|---|");
    for setup in [
        Setup::Embedded,
        Setup::Nats { daemons: 1 },
        Setup::Nats { daemons: 2 },
    ] {
        let runs: Vec<RateSample> = (0..samples).map(|_| rate_sample(setup, window_s)).collect();
        let counts: Vec<f64> = runs.iter().map(|r| r.in_window as f64).collect();
        let median = bench::median(&counts);
        let split: Vec<String> = runs
            .iter()
            .map(|r| {
                r.by_daemon
                    .iter()
                    .map(|n| format!("{n:.0}"))
                    .collect::<Vec<_>>()
                    .join(" + ")
            })
            .collect();
        println!(
            "| {} | {} | {median:.0} | {:+.2} % | {} |",
            setup.name(),
            counts
                .iter()
                .map(|c| format!("{c:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            (median - want as f64) * 100.0 / want as f64,
            split.join("; ")
        );
    }
}

fn rate_sample(setup: Setup, window_s: usize) -> RateSample {
    let dir = tempfile::tempdir().expect("dir");
    let backend = match setup {
        Setup::Embedded => Backend::embedded(),
        Setup::Nats { .. } => Backend::nats(),
    };
    let daemons = match setup {
        Setup::Embedded => 1,
        Setup::Nats { daemons } => daemons,
    };
    let yaml = format!(
        "name: paced\ntopics: [in, out]\nstages:\n  - name: work\n    subscribe: in\n    \
         plugin: {}\n    publish: [out]\n    concurrency: 4\n    rate: {RATE}/s\n",
        plugin("stamp")
    );
    let file = write_pipeline(dir.path(), "paced", &yaml);
    let running: Vec<Daemon> = (0..daemons)
        .map(|i| Daemon::start_on(&backend, &[&file], &dir.path().join(format!("d{i}"))))
        .collect();
    let first = &running[0];
    // A tenth more than the window holds, so the stage is never idle in it.
    let n = RATE * window_s * 11 / 10;
    let messages: Vec<Msg> = (0..n).map(|i| Msg::new(format!("r{i}"), "x")).collect();
    first.publish("in", &messages);
    first.wait_until(
        "every call",
        Duration::from_secs(window_s as u64 * 3 + 60),
        |d| d.depth("out") >= n,
    );
    let mut starts: Vec<u64> = first
        .read_all("out")
        .iter()
        .filter_map(|m| header(m, "x-start-us")?.parse().ok())
        .collect();
    starts.sort_unstable();
    let end = starts[0] + window_s as u64 * 1_000_000;
    RateSample {
        in_window: starts.iter().filter(|&&s| s < end).count(),
        by_daemon: running
            .iter()
            .map(|d| d.metric_sum("sluice_messages_processed_total"))
            .collect(),
    }
}

// ---- adaptive ----

/// How long each request takes the receiver.
const SERVICE: Duration = Duration::from_millis(20);

/// What the receiver saw: each answer's time and whether it was served.
type Answers = Arc<Mutex<Vec<(Instant, bool)>>>;

/// A real HTTP server on loopback that serves `capacity` requests at once,
/// each taking [`SERVICE`], and answers 503 to any beyond; the capacity
/// can change while it runs.
struct Target {
    addr: SocketAddr,
    capacity: Arc<AtomicUsize>,
    answers: Answers,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Target {
    fn start(capacity: usize) -> Target {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("target runtime");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
            .expect("bind the target");
        let addr = listener.local_addr().expect("addr");
        let capacity = Arc::new(AtomicUsize::new(capacity));
        let answers = Answers::default();
        let serving: Arc<Mutex<VecDeque<Instant>>> = Arc::default();
        let (cap, seen) = (capacity.clone(), answers.clone());
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (cap, seen, serving) = (cap.clone(), seen.clone(), serving.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        answer(req, cap.clone(), seen.clone(), serving.clone())
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Target {
            addr,
            capacity,
            answers,
            runtime: Some(runtime),
        }
    }

    fn url(&self) -> String {
        format!("http://{}/in", self.addr)
    }

    fn answers(&self) -> Vec<(Instant, bool)> {
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// When the first request was answered, waiting for it.
    fn first_answer(&self) -> Instant {
        let started = Instant::now();
        loop {
            if let Some(&(at, _)) = self.answers().first() {
                return at;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the sink never called"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn answer(
    req: Request<Incoming>,
    capacity: Arc<AtomicUsize>,
    answers: Answers,
    serving: Arc<Mutex<VecDeque<Instant>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let _ = req.into_body().collect().await;
    let admitted = {
        let mut serving = serving.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        while serving
            .front()
            .is_some_and(|started| now.duration_since(*started) >= SERVICE)
        {
            serving.pop_front();
        }
        let admitted = serving.len() < capacity.load(Ordering::Relaxed);
        if admitted {
            serving.push_back(now);
        }
        admitted
    };
    if admitted {
        tokio::time::sleep(SERVICE).await;
    }
    answers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((Instant::now(), admitted));
    let status = if admitted { 200 } else { 503 };
    Ok(Response::builder()
        .status(status)
        .body(Full::new(Bytes::from_static(b"")))
        .expect("response"))
}

/// A webhook sink at `concurrency` (YAML) onto `target`, with retries
/// that never give up within a run.
fn sink_daemon(dir: &Path, target: &Target, concurrency: &str) -> Daemon {
    let file = write_pipeline(
        dir,
        "adapt",
        &format!(
            "name: adapt\ntopics: [in]\nsinks:\n  - name: out\n    subscribe: in\n    \
             concurrency: {concurrency}\n    \
             retry: {{max_attempts: 1000, backoff: {{initial: 10ms, max: 50ms}}}}\n    \
             http: {{url: '{}'}}\n",
            target.url()
        ),
    );
    Daemon::start(&[&file], &dir.join("data"))
}

/// Publishes `n` messages from another thread (the sink starts on the
/// first), so timing can start at once.
fn feed(daemon: &Daemon, n: usize) {
    let messages: Vec<Msg> = (0..n).map(|i| Msg::new(format!("m{i}"), "x")).collect();
    daemon.publish("in", &messages);
}

/// Served per second, and the share refused, among answers in `[from, to)`.
fn phase_figures(answers: &[(Instant, bool)], from: Instant, to: Instant) -> (f64, f64) {
    let within: Vec<bool> = answers
        .iter()
        .filter(|(at, _)| *at >= from && *at < to)
        .map(|&(_, ok)| ok)
        .collect();
    let served = within.iter().filter(|&&ok| ok).count();
    let refused = within.len() - served;
    let secs = to.duration_since(from).as_secs_f64();
    (
        served as f64 / secs,
        refused as f64 * 100.0 / within.len().max(1) as f64,
    )
}

/// Served per second by a sink at a fixed `concurrency` against a target
/// serving `capacity` at once, over `phase`.
fn fixed(capacity: usize, concurrency: usize, phase: Duration) -> (f64, f64) {
    let dir = tempfile::tempdir().expect("dir");
    let target = Target::start(capacity);
    let daemon = sink_daemon(dir.path(), &target, &concurrency.to_string());
    let n = (capacity as f64 / SERVICE.as_secs_f64() * phase.as_secs_f64() * 1.3) as usize;
    std::thread::scope(|s| {
        s.spawn(|| feed(&daemon, n));
        let from = target.first_answer();
        std::thread::sleep((from + phase).saturating_duration_since(Instant::now()));
        phase_figures(&target.answers(), from, from + phase)
    })
}

fn adaptive() {
    let (high, low) = (40, 10);
    let phase = if cfg!(debug_assertions) {
        Duration::from_secs(4)
    } else {
        Duration::from_secs(20)
    };
    println!(
        "\n### Adaptive concurrency: a target serving {high} at once ({} ms each), then {low}; \
         {} s per phase\n",
        SERVICE.as_millis(),
        phase.as_secs()
    );
    // The adaptive run.
    let dir = tempfile::tempdir().expect("dir");
    let target = Target::start(high);
    let daemon = sink_daemon(dir.path(), &target, "{max: 64, adaptive: true}");
    let n = ((high + low) as f64 / SERVICE.as_secs_f64() * phase.as_secs_f64() * 1.3) as usize;
    let (limits, t0) = std::thread::scope(|s| {
        s.spawn(|| feed(&daemon, n));
        let t0 = target.first_answer();
        let mut limits = Vec::new();
        let mut dropped = false;
        while t0.elapsed() < phase * 2 {
            if !dropped && t0.elapsed() >= phase {
                target.capacity.store(low, Ordering::Relaxed);
                dropped = true;
            }
            let status = daemon.get("/v1/status");
            let limit = status[0]["concurrency_limit"].as_u64().unwrap_or(0);
            limits.push((t0.elapsed(), limit));
            std::thread::sleep(Duration::from_millis(50));
        }
        (limits, t0)
    });
    let answers = target.answers();
    let drop_at = t0 + phase;
    let (served_high, refused_high) = phase_figures(&answers, t0, drop_at);
    let (served_low, refused_low) = phase_figures(&answers, drop_at, drop_at + phase);
    // Converged: from the first sample at or under the new capacity on.
    let converged = limits
        .iter()
        .find(|(at, limit)| *at >= phase && (*limit as usize) <= low)
        .map(|(at, _)| at.saturating_sub(phase));
    let converged_from = converged.map_or(drop_at + phase, |d| drop_at + d);
    let (_, refused_converged) = phase_figures(&answers, converged_from, drop_at + phase);
    let range = |from: Duration, to: Duration| {
        let within: Vec<u64> = limits
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .map(|&(_, l)| l)
            .collect();
        let mut sorted = within.clone();
        sorted.sort_unstable();
        (
            sorted.first().copied().unwrap_or(0),
            sorted.get(sorted.len() / 2).copied().unwrap_or(0),
            sorted.last().copied().unwrap_or(0),
        )
    };
    // The first phase's second half (past slow start), and the second
    // phase's after it converged.
    let (h_min, h_med, h_max) = range(phase / 2, phase);
    let (l_min, l_med, l_max) = range(converged.map_or(phase * 2, |d| phase + d), phase * 2);
    let reached_high = limits
        .iter()
        .find(|(_, l)| *l as usize >= high * 9 / 10)
        .map(|(at, _)| format!("{:.1} s", at.as_secs_f64()))
        .unwrap_or_else(|| "never".into());
    drop(daemon);
    // The yardsticks.
    let best = |capacity: usize| {
        [capacity * 3 / 4, capacity, capacity * 5 / 4]
            .into_iter()
            .map(|c| (c, fixed(capacity, c, phase)))
            .collect::<Vec<_>>()
    };
    let fixed_high = best(high);
    let fixed_low = best(low);
    let top = |runs: &[(usize, (f64, f64))]| runs.iter().map(|(_, (s, _))| *s).fold(0.0, f64::max);
    let (best_high, best_low) = (top(&fixed_high), top(&fixed_low));
    println!(
        "| phase | served/s | of the best fixed | refused (503) | limit (min / median / max) |"
    );
    println!("|---|---:|---:|---:|---|");
    println!(
        "| {high} at once, adaptive | {served_high:.0} | {:.2} | {refused_high:.2} % | {h_min} / {h_med} / {h_max} in its second half; {reached_high} to reach {} |",
        served_high / best_high,
        high * 9 / 10
    );
    println!(
        "| {low} at once, adaptive | {served_low:.0} | {:.2} | {refused_low:.2} % ({refused_converged:.2} % once settled) | {l_min} / {l_med} / {l_max} once settled |",
        served_low / best_low
    );
    for (capacity, runs) in [(high, &fixed_high), (low, &fixed_low)] {
        for (c, (served, refused)) in runs.iter() {
            println!(
                "| {capacity} at once, fixed {c} | {served:.0} | {:.2} | {refused:.2} % | |",
                served / top(runs)
            );
        }
    }
    println!(
        "\nThe limit came down to {low} {} after the drop.",
        converged.map_or_else(|| "never".into(), |d| format!("{:.2} s", d.as_secs_f64()))
    );
}
