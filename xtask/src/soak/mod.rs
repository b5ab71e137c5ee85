//! `cargo xtask soak --minutes N [--rate R]`: the soak test (issue 25).
//!
//! Starts the real `sluice run` on a fresh data directory (embedded broker,
//! `--sync always`) with a pipeline of three stages, a fan-out and two
//! webhook sinks:
//!
//! ```text
//! in --stamp--> mid --route--> out.b --deliver-b--> receiver /b   (router: rejects 1 %, dead-lettered)
//!                   \--copy--> out.c --deliver-c--> receiver /c   (identity: every message)
//!                   \--tally                                       (state: 16 counters)
//! ```
//!
//! `route`, `copy` and `tally` all subscribe `mid`, so every message of
//! `mid` goes to each. `tally` (the `stateful` test plugin) increments one
//! of 16 state counters per message, committed with its ack; at the end
//! they must add up to the inputs. Input `i` (id `soak-<i>`) is chosen by `i % 100`: one in a
//! hundred starts with `{"retry"`, which `stamp` (`fail_prefix`,
//! `fail_until_attempt: 2`) fails on its first attempt and passes on its
//! second; another one in a hundred has no `type` field, which `router`
//! rejects, so it is dead-lettered at once. The rest pass straight through.
//! The sinks post every output to a receiver in this process
//! ([`receiver`]), which counts it as it arrives: like a real deployment,
//! the store holds what is in transit, not everything ever sent.
//!
//! A producer thread posts batches to the ingest API at `--rate` messages
//! per second, sending a batch answered 429 or 503 again (same ids) until
//! it is taken. Every 10 s the daemon's RSS (`VmRSS`) and open file
//! descriptors (at rest: the fewest of ten counts over a second) are
//! sampled, and printed with where the memory is: RSS split into
//! anonymous and file-backed mappings, and the store's own part
//! (`sluice_store_memory_bytes` in `/metrics`). At the end ingest stops, the stages drain, what the receiver
//! got and every DLQ are compared with the exact sets the inputs call for
//! ([`ledger`]): nothing lost, nothing duplicated, nothing else; then the
//! daemon gets SIGTERM and must exit 0.
//!
//! Fails on a lost, duplicated, unexpected or altered message, on open
//! descriptors other than sockets still above the warm-up's fewest by more
//! than [`FD_SLACK`] once the stages have drained, on more sockets than the sinks' pools and the APIs account
//! for ([`SOCKET_LIMIT`]: the pools open and close connections with the
//! traffic, so sockets are bounded rather than flat), and, for runs of 30
//! minutes or more, on RSS growing 5 % or more from the end of the warm-up
//! (minute 5) to the end. RSS moves in a sawtooth of about 15 % as the
//! store's memtables fill and flush, so growth compares the median of the
//! [`RSS_WINDOW`] after the warm-up with the median of the last one: two
//! single samples would measure where each fell on a tooth.

mod ledger;
mod receiver;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::{cargo, ensure_wasm_target, run, target_dir};
use ledger::{Ledger, Tally};
use receiver::Receiver;

/// Usage of `cargo xtask soak`.
const USAGE: &str = "\
usage: cargo xtask soak --minutes N [--rate MSGS_PER_SEC]

  --minutes N   how long to ingest (may be fractional); RSS growth is only
                enforced from 30 minutes on
  --rate R      messages per second to publish (default 500)
";

/// The default ingest rate, messages per second.
const DEFAULT_RATE: u64 = 500;
/// How often RSS and open descriptors are sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// The warm-up before the RSS baseline: 5 minutes, or a fifth of a
/// shorter run.
const WARM_UP: Duration = Duration::from_secs(5 * 60);
/// From this run length on, RSS growth fails the soak.
const RSS_CHECKED_FROM_MINUTES: f64 = 30.0;
/// The span whose median RSS stands for the start and for the end of the
/// steady part of a run.
const RSS_WINDOW: Duration = Duration::from_secs(5 * 60);
/// RSS growth (percent) that fails a run of 30 minutes or more.
const RSS_GROWTH_LIMIT: f64 = 5.0;
/// How far open descriptors other than sockets may stay above the
/// warm-up's fewest once the stages have drained. During ingest they
/// follow the backlog (the store holds a table file open per segment of
/// retained data: a CI run whose sinks fell 9,000 behind held 23 against
/// 13), so only what stays open at rest is a leak; one descriptor leaked
/// per message, or per minute of a long run, is far past this.
const FD_SLACK: u64 = 8;
/// Worker slots of each sink, so pooled connections to the receiver.
const SINK_CONCURRENCY: u64 = 16;
/// The most sockets the daemon may hold at rest: both sinks' pools, the
/// admin listener, the producer's and the sampler's connections, and
/// room for connections closing (a 2-minute run held up to 44: 32 pooled
/// and 12 others). A leak of one per request would pass it in seconds.
const SOCKET_LIMIT: u64 = 2 * SINK_CONCURRENCY + 32;
/// How long the stages get to drain once ingest stops.
const DRAIN_LIMIT: Duration = Duration::from_secs(10 * 60);
/// How long the daemon gets to exit after SIGTERM (its
/// `shutdown_timeout` is 30 s).
const EXIT_LIMIT: Duration = Duration::from_secs(120);
/// How long the producer keeps resending one batch that fails for other
/// reasons than backpressure (no answer, a 5xx).
const PUBLISH_PATIENCE: Duration = Duration::from_secs(120);
/// The producer sends a batch every tick.
const TICK: Duration = Duration::from_millis(100);
/// The most messages in one batch request.
const MAX_BATCH: u64 = 1000;
/// How many lines of the daemon's log are kept for a failure report.
const LOG_TAIL: usize = 200;
/// How many unexpected daemon log lines are echoed.
const LOG_ECHO_LIMIT: u64 = 100;

/// `i % 100` of the inputs that fail their first attempt.
const RETRY_SLOT: u64 = 42;
/// `i % 100` of the inputs that are rejected (dead-lettered at once).
const REJECT_SLOT: u64 = 71;
/// What the retried payloads start with: `stamp`'s `fail_prefix`.
const RETRY_PREFIX: &str = "{\"retry\"";

/// The pipeline's topics.
const IN: &str = "in";
const OUT_B: &str = "out.b";
const OUT_C: &str = "out.c";
/// The stages' dead-letter topics (`<pipeline>.<stage>.dlq`).
const DLQ_STAMP: &str = "soak.stamp.dlq";
const DLQ_ROUTE: &str = "soak.route.dlq";
const DLQ_COPY: &str = "soak.copy.dlq";
const DLQ_TALLY: &str = "soak.tally.dlq";
/// How many counters the `tally` stage spreads its increments over
/// (`tally/0` ..): the `stateful` plugin's `tally` mode.
const TALLY_COUNTERS: u32 = 16;

/// The pipeline, with `{stamp}`, `{router}` and `{identity}` standing for
/// the plugins' absolute paths and `{receiver}` for the receiver's URL.
const PIPELINE_YAML: &str = r#"# Written by `cargo xtask soak`.
name: soak
topics:
  - {name: in, high_water_mark: 20000}
  - mid
  - out.b
  - out.c
stages:
  # 1 % of the inputs start with {"retry": they fail their first attempt
  # and pass on the second.
  - name: stamp
    subscribe: in
    plugin: {stamp}
    publish: [mid]
    concurrency: 2
    retry: {max_attempts: 5, backoff: {initial: 200ms, max: 2s}}
    config: {fail_prefix: '{"retry"', fail_until_attempt: 2}
  # Fan-out: route and copy both read every message of mid.
  # 1 % of the inputs have no `type`: router rejects them (dead-lettered).
  - name: route
    subscribe: mid
    plugin: {router}
    publish: [out.b]
    concurrency: 2
    config: {field: type, route.ok: out.b}
  - name: copy
    subscribe: mid
    plugin: {identity}
    publish: [out.c]
    concurrency: 2
  # Handler state: every message of mid increments one of 16 counters,
  # committed with its ack.
  - name: tally
    subscribe: mid
    plugin: {stateful}
    state: true
    concurrency: 4
    config: {tally: "1"}
# The outputs leave through webhooks, as they would in production.
sinks:
  - name: deliver-b
    subscribe: out.b
    concurrency: 16
    http: {url: "{receiver}/b"}
  - name: deliver-c
    subscribe: out.c
    concurrency: 16
    http: {url: "{receiver}/c"}
"#;

/// What `cargo xtask soak` was asked for.
struct Options {
    duration: Duration,
    minutes: f64,
    rate: u64,
}

fn parse_args(args: &[&str]) -> anyhow::Result<Options> {
    let mut minutes = None;
    let mut rate = DEFAULT_RATE;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value)),
            None => (*arg, None),
        };
        let mut value = || {
            inline
                .or_else(|| it.next().copied())
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag {
            "--minutes" => {
                let v = value()?;
                let m: f64 = v
                    .parse()
                    .ok()
                    .filter(|m: &f64| m.is_finite() && *m > 0.0)
                    .with_context(|| format!("--minutes {v}: expected a positive number"))?;
                minutes = Some(m);
            }
            "--rate" => {
                let v = value()?;
                rate = v
                    .parse()
                    .ok()
                    .filter(|r| *r > 0)
                    .with_context(|| format!("--rate {v}: expected a positive whole number"))?;
            }
            "-h" | "--help" => bail!("{USAGE}"),
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let minutes = minutes.with_context(|| format!("--minutes is required\n{USAGE}"))?;
    Ok(Options {
        duration: Duration::from_secs_f64(minutes * 60.0),
        minutes,
        rate,
    })
}

/// `cargo xtask soak`.
pub(crate) fn soak(args: &[&str]) -> anyhow::Result<()> {
    let opts = parse_args(args)?;
    ensure_wasm_target()?;
    // Its three handlers are Rust plugins: no Python or JS toolchain.
    println!("== building the Rust plugins");
    sluice_harness::build_plugins()?;
    let release = !cfg!(debug_assertions);
    let profile = if release { "release" } else { "debug" };
    println!("== building sluice ({profile})");
    let mut build = cargo();
    build.args(["build", "--quiet", "--package", "sluice", "--bin", "sluice"]);
    if release {
        build.arg("--release");
    }
    run(&mut build)?;
    let sluice = target_dir().join(profile).join("sluice");

    let dir = std::env::temp_dir().join(format!("sluice-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let delivered = Delivered::new();
    let receiver = Receiver::start(&[("b", delivered.b.clone()), ("c", delivered.c.clone())])?;
    let pipeline = write_pipeline(&dir, &receiver.url)?;
    let outcome = soak_in(&opts, &sluice, &pipeline, &dir.join("data"), &delivered);
    drop(receiver);
    match &outcome {
        Ok(()) => {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Err(_) => eprintln!("(the pipeline and data are kept in {})", dir.display()),
    }
    outcome
}

/// Writes the pipeline into `dir`; its path.
fn write_pipeline(dir: &Path, receiver: &str) -> anyhow::Result<PathBuf> {
    let plugin = |name: &str| -> anyhow::Result<String> {
        let path = sluice_harness::repo_root()
            .join("target")
            .join("plugins")
            .join(format!("{name}.wasm"));
        if !path.is_file() {
            bail!("plugin {} was not built", path.display());
        }
        path.to_str()
            .map(str::to_owned)
            .context("non-UTF-8 repository path")
    };
    let yaml = PIPELINE_YAML
        .replace("{stamp}", &plugin("stamp")?)
        .replace("{router}", &plugin("router")?)
        .replace("{identity}", &plugin("identity")?)
        .replace("{stateful}", &plugin("stateful")?)
        .replace("{receiver}", receiver);
    let path = dir.join("soak.yaml");
    std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// What input `i` is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Passes every stage at once.
    Plain,
    /// Fails its first attempt at `stamp`, then passes.
    Retry,
    /// Rejected by `route`: one DLQ entry, no `out.b` output.
    Reject,
}

fn class(i: u64) -> Class {
    match i % 100 {
        RETRY_SLOT => Class::Retry,
        REJECT_SLOT => Class::Reject,
        _ => Class::Plain,
    }
}

fn message_id(i: u64) -> String {
    format!("soak-{i:09}")
}

/// Input `i`'s payload: JSON that `router` routes by `type` (or rejects
/// without it), starting with [`RETRY_PREFIX`] when it is to be retried.
fn payload(i: u64) -> String {
    const PAD: &str = "................................................................";
    let id = message_id(i);
    match class(i) {
        Class::Plain => format!(r#"{{"type":"ok","id":"{id}","pad":"{PAD}"}}"#),
        Class::Retry => format!(r#"{RETRY_PREFIX}:true,"type":"ok","id":"{id}","pad":"{PAD}"}}"#),
        Class::Reject => format!(r#"{{"id":"{id}","pad":"{PAD}"}}"#),
    }
}

/// The input index a payload names, when it is one of ours.
fn index_of(payload: &str) -> Option<u64> {
    let doc: Value = serde_json::from_str(payload).ok()?;
    doc["id"].as_str()?.strip_prefix("soak-")?.parse().ok()
}

/// One RSS and descriptor reading.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    rss_kib: u64,
    /// Where the RSS is, by mapping ([`rss_by_mapping`]).
    split: RssSplit,
    /// Open descriptors that are not sockets (files, pipes, event and
    /// timer descriptors) at rest: the fewest of [`FD_READS`] counts.
    fds: u64,
    /// The most of those counts.
    fds_peak: u64,
    /// Open sockets at rest (the fewest of the counts): listeners, ingest
    /// and admin connections, and the sinks' pooled connections, which
    /// come and go with the traffic.
    sockets: u64,
}

/// The daemon's RSS by kind of mapping, from `/proc/PID/smaps`. A debug
/// binary's code is tens of MiB and is paged in as code paths first run,
/// so RSS can step up without the heap growing; this tells the two apart.
#[derive(Debug, Clone, Copy, Default)]
struct RssSplit {
    /// Anonymous mappings: the allocator's heap (most of it), thread
    /// stacks, the handlers' Wasm memories, compiled code.
    anon_kib: u64,
    /// File-backed mappings: the binary and its libraries.
    file_kib: u64,
}

/// Reads [`RssSplit`] from `/proc/PID/smaps`; zeros when it cannot.
fn rss_by_mapping(pid: u32) -> RssSplit {
    let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return RssSplit::default();
    };
    let mut split = RssSplit::default();
    let mut file_backed = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if first == "Rss:" {
            let kib: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            if file_backed {
                split.file_kib += kib;
            } else {
                split.anon_kib += kib;
            }
        } else if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // A mapping's header: start-end perms offset dev inode [path].
            file_backed = fields.nth(4).is_some_and(|path| path.starts_with('/'));
        }
    }
    split
}

/// How many times a sample counts the open descriptors, [`FD_READ_GAP`]
/// apart. The embedded store opens table files for a moment while it
/// flushes and compacts (a sample that lands there counts up to ten more),
/// so a sample takes the fewest it saw: a leaked descriptor is in every
/// count, a compaction's are not.
const FD_READS: u32 = 10;
const FD_READ_GAP: Duration = Duration::from_millis(100);

/// The daemon's `VmRSS` in KiB and its open descriptors.
fn sample(pid: u32, at: Duration) -> anyhow::Result<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS in /proc/PID/status")?;
    let (mut fds, mut fds_peak, mut sockets) = (u64::MAX, 0, u64::MAX);
    for read in 0..FD_READS {
        if read > 0 {
            std::thread::sleep(FD_READ_GAP);
        }
        let (mut files, mut socks) = (0, 0);
        for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .with_context(|| format!("reading /proc/{pid}/fd"))?
        {
            // One closed between the listing and the link: not counted.
            let Ok(target) = entry.and_then(|e| std::fs::read_link(e.path())) else {
                continue;
            };
            if target.to_string_lossy().starts_with("socket:") {
                socks += 1;
            } else {
                files += 1;
            }
        }
        fds = fds.min(files);
        fds_peak = fds_peak.max(files);
        sockets = sockets.min(socks);
    }
    Ok(Sample {
        at,
        rss_kib,
        split: rss_by_mapping(pid),
        fds,
        fds_peak,
        sockets,
    })
}

/// A running `sluice run`, killed if dropped while it runs.
struct Daemon {
    child: Child,
    base: String,
    http: reqwest::blocking::Client,
    log: Arc<Mutex<VecDeque<String>>>,
    retries_logged: Arc<AtomicU64>,
    dead_letters_logged: Arc<AtomicU64>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Daemon {
    fn start(sluice: &Path, pipeline: &Path, data: &Path) -> anyhow::Result<Daemon> {
        println!(
            "== starting: sluice run {} --data-dir {} --admin 127.0.0.1:0",
            pipeline.display(),
            data.display()
        );
        let mut child = Command::new(sluice)
            .arg("run")
            .arg(pipeline)
            .arg("--data-dir")
            .arg(data)
            .args(["--admin", "127.0.0.1:0"])
            // Not the audit line of each ingest POST (10 a second).
            .env("SLUICE_LOG", "warn,sluice=info,sluice::admin::access=warn")
            // The broker and the admin API's access are the soak's alone.
            .env_remove("SLUICE_BROKER")
            .env_remove("SLUICE_ADMIN_TOKEN")
            .env_remove("SLUICE_ADMIN_READ_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", sluice.display()))?;
        let stderr = child.stderr.take().context("daemon stderr")?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let retries_logged = Arc::new(AtomicU64::new(0));
        let dead_letters_logged = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<String>();
        {
            let log = log.clone();
            let retries = retries_logged.clone();
            let dead_letters = dead_letters_logged.clone();
            std::thread::spawn(move || {
                let mut echoed = 0u64;
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("admin on ").nth(1) {
                        let _ = ready_tx.send(rest.split(';').next().unwrap_or_default().into());
                    }
                    // The retries and dead letters the soak asks for are
                    // counted, not echoed; anything else is shown.
                    if line.contains("attempt failed; will retry") {
                        retries.fetch_add(1, Ordering::Relaxed);
                    } else if line.contains("dead-lettering") {
                        dead_letters.fetch_add(1, Ordering::Relaxed);
                    } else if echoed < LOG_ECHO_LIMIT {
                        echoed += 1;
                        println!("   daemon| {line}");
                        if echoed == LOG_ECHO_LIMIT {
                            println!("   daemon| (further log lines are not shown)");
                        }
                    }
                    let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                    if log.len() == LOG_TAIL {
                        log.pop_front();
                    }
                    log.push_back(line);
                }
            });
        }
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .context("http client")?;
        let mut daemon = Daemon {
            child,
            base: String::new(),
            http,
            log,
            retries_logged,
            dead_letters_logged,
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Ok(url) = ready_rx.recv_timeout(Duration::from_millis(200)) {
                daemon.base = url;
                return Ok(daemon);
            }
            if let Some(status) = daemon.child.try_wait()? {
                std::thread::sleep(Duration::from_millis(300));
                bail!(
                    "the daemon exited ({status}) instead of starting; log:\n{}",
                    daemon.log_tail()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the daemon was not ready in 3 minutes; log:\n{}",
                    daemon.log_tail()
                );
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines the daemon logged.
    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().map(|l| format!("   daemon| {l}\n")).collect()
    }

    /// Fails when the daemon has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            std::thread::sleep(Duration::from_millis(300));
            bail!(
                "the daemon exited ({status}) during the soak; log:\n{}",
                self.log_tail()
            );
        }
        Ok(())
    }

    fn get(&self, path: &str) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let response = self
            .http
            .get(&url)
            .send()
            .with_context(|| format!("GET {url}"))?;
        let status = response.status();
        let text = response.text().with_context(|| format!("GET {url}"))?;
        if !status.is_success() {
            bail!("GET {url}: {status}: {text}");
        }
        serde_json::from_str(&text).with_context(|| format!("GET {url}: not JSON"))
    }

    /// The store's memory from `/metrics` (`sluice_store_memory_bytes`),
    /// summed: memtables, pinned filters and indexes, the block cache, and
    /// the three keyspaces holding the most memtable bytes; and how many
    /// tables and levels `messages` has.
    fn store_memory(&self) -> anyhow::Result<String> {
        let url = format!("{}/metrics", self.base);
        let text = self
            .http
            .get(&url)
            .send()
            .and_then(|r| r.text())
            .with_context(|| format!("GET {url}"))?;
        // Tables and levels in use of the `messages` keyspace, the biggest.
        let gauge = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}{{keyspace=\"messages\"}} ")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let (tables, levels) = (gauge("sluice_store_tables"), gauge("sluice_store_levels"));
        let (mut memtables, mut pinned, mut cache) = (0u64, 0u64, 0u64);
        let mut by_keyspace: Vec<(String, u64)> = Vec::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("sluice_store_memory_bytes{") else {
                continue;
            };
            let Some((labels, value)) = rest.split_once("} ") else {
                continue;
            };
            let bytes: u64 = value.trim().parse().unwrap_or(0);
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                    .map(|v| v.trim_end_matches('"').to_owned())
                    .unwrap_or_default()
            };
            match label("part").as_str() {
                "memtables" => {
                    memtables += bytes;
                    by_keyspace.push((label("keyspace"), bytes));
                }
                "filters" | "indexes" => pinned += bytes,
                "cache" => cache += bytes,
                _ => {}
            }
        }
        by_keyspace.sort_by_key(|k| std::cmp::Reverse(k.1));
        let top: Vec<String> = by_keyspace
            .iter()
            .take(3)
            .map(|(k, b)| format!("{k} {}", mib(b / 1024)))
            .collect();
        Ok(format!(
            "memtables {} ({}), pinned {}, cache {}; messages: {tables} tables on {levels} levels",
            mib(memtables / 1024),
            top.join(", "),
            mib(pinned / 1024),
            mib(cache / 1024)
        ))
    }

    /// Per stage: (name, messages waiting, deliveries in flight).
    fn stages(&self) -> anyhow::Result<Vec<(String, u64, u64)>> {
        let status = self.get("/v1/status")?;
        let stages = status.as_array().context("/v1/status is not a list")?;
        Ok(stages
            .iter()
            .map(|s| {
                (
                    s["stage"].as_str().unwrap_or_default().to_owned(),
                    s["depth"].as_u64().unwrap_or(0),
                    s["in_flight"].as_u64().unwrap_or(0),
                )
            })
            .collect())
    }

    /// Calls `each` with every message stored in `topic`, oldest first;
    /// how many there were.
    fn read_all(&self, topic: &str, mut each: impl FnMut(&Value)) -> anyhow::Result<u64> {
        let mut from = 0u64;
        let mut total = 0u64;
        loop {
            let page = self.get(&format!(
                "/v1/topics/{topic}/messages?from={from}&max=1000&wait_ms=0"
            ))?;
            let messages = page["messages"].as_array().cloned().unwrap_or_default();
            if messages.is_empty() {
                return Ok(total);
            }
            for m in &messages {
                each(m);
            }
            total += messages.len() as u64;
            from = page["next"]
                .as_u64()
                .or_else(|| Some(messages.last()?["seq"].as_u64()? + 1))
                .context("a page without `next`")?;
        }
    }

    /// SIGTERM, then waits for the exit.
    fn terminate(&mut self) -> anyhow::Result<(ExitStatus, Duration)> {
        let started = Instant::now();
        run(Command::new("kill").args(["-TERM", &self.pid().to_string()]))?;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok((status, started.elapsed()));
            }
            if started.elapsed() > EXIT_LIMIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!(
                    "the daemon did not exit within {EXIT_LIMIT:?} of SIGTERM; log:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The producer thread and what it shares.
struct Producer {
    handle: JoinHandle<anyhow::Result<u64>>,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    pushback: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
}

impl Producer {
    fn start(base: &str, rate: u64) -> anyhow::Result<Producer> {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .context("http client")?;
        let url = format!("{base}/v1/topics/{IN}/batch");
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let pushback = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let counters = (
            stop.clone(),
            accepted.clone(),
            pushback.clone(),
            errors.clone(),
        );
        let handle = std::thread::spawn(move || {
            let (stop, accepted, pushback, errors) = counters;
            produce(&http, &url, rate, &stop, &accepted, &pushback, &errors)
        });
        Ok(Producer {
            handle,
            stop,
            accepted,
            pushback,
            errors,
        })
    }

    /// Stops it after the batch it is sending; how many inputs were
    /// accepted (ids 0..n).
    fn finish(self) -> anyhow::Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        match self.handle.join() {
            Ok(result) => result,
            Err(_) => bail!("the producer thread panicked"),
        }
    }
}

/// Publishes inputs 0, 1, 2, ... at `rate` per second in batches every
/// [`TICK`] until `stop`; a batch is sent again until it is accepted, so
/// the inputs are exactly `0..n` for the `n` returned. More than two ticks
/// behind (after backpressure), it does not burst to catch up.
fn produce(
    http: &reqwest::blocking::Client,
    url: &str,
    rate: u64,
    stop: &AtomicBool,
    accepted: &AtomicU64,
    pushback: &AtomicU64,
    errors: &AtomicU64,
) -> anyhow::Result<u64> {
    let per_tick = (rate / 10).max(1);
    let mut origin = Instant::now();
    let mut next = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due_at = |origin: Instant| (origin.elapsed().as_secs_f64() * rate as f64) as u64;
        let mut due = due_at(origin);
        if due > next + 2 * per_tick {
            // Behind after backpressure: carry on at the rate from here.
            origin = Instant::now() - Duration::from_secs_f64(next as f64 / rate as f64);
            due = due_at(origin);
        }
        let count = due.saturating_sub(next).min(MAX_BATCH);
        if count < per_tick.min(MAX_BATCH) {
            let until = origin + Duration::from_secs_f64((next + per_tick) as f64 / rate as f64);
            let wait = until.saturating_duration_since(Instant::now());
            std::thread::sleep(wait.clamp(Duration::from_millis(1), TICK));
            continue;
        }
        let body: String = (next..next + count)
            .map(|i| json!({"id": message_id(i), "payload": payload(i)}).to_string() + "\n")
            .collect();
        post_batch(http, url, body, pushback, errors)?;
        next += count;
        accepted.store(next, Ordering::Relaxed);
    }
    Ok(next)
}

/// Sends one batch until it is accepted: after a 429 or 503 it waits as
/// long as `Retry-After` says; after no answer or another 5xx, half a
/// second, for up to [`PUBLISH_PATIENCE`]. Resending is safe: the ids
/// collapse in the topic's duplicate window.
fn post_batch(
    http: &reqwest::blocking::Client,
    url: &str,
    body: String,
    pushback: &AtomicU64,
    errors: &AtomicU64,
) -> anyhow::Result<()> {
    let mut failing_since: Option<Instant> = None;
    loop {
        let sent = http
            .post(url)
            .header("content-type", "application/x-ndjson")
            .body(body.clone())
            .send();
        let why = match sent {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) if matches!(response.status().as_u16(), 429 | 503) => {
                pushback.fetch_add(1, Ordering::Relaxed);
                let wait = response
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.trim().parse::<f64>().ok())
                    .map_or(Duration::from_millis(200), |s| {
                        Duration::from_secs_f64(s.clamp(0.1, 5.0))
                    });
                std::thread::sleep(wait);
                continue;
            }
            Ok(response) if response.status().is_server_error() => {
                format!(
                    "{}: {}",
                    response.status(),
                    response.text().unwrap_or_default()
                )
            }
            Ok(response) => bail!(
                "POST {url}: {}: {}",
                response.status(),
                response.text().unwrap_or_default()
            ),
            Err(err) => err.to_string(),
        };
        errors.fetch_add(1, Ordering::Relaxed);
        let since = *failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() > PUBLISH_PATIENCE {
            bail!("POST {url}: still failing after {PUBLISH_PATIENCE:?}: {why}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `m:ss`.
fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// `12345678` as `12,345,678`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One sample, printed as a line, with the producer's and the stages'
/// progress.
fn print_sample(daemon: &Daemon, s: &Sample, phase: &str, accepted: u64) {
    let backlog = match daemon.stages() {
        Ok(stages) => stages
            .iter()
            .map(|(name, depth, in_flight)| format!("{name} {depth}/{in_flight}"))
            .collect::<Vec<_>>()
            .join(" "),
        Err(err) => format!("(status: {err:#})"),
    };
    println!(
        "[{:>6}] {phase:<6} rss {:>10}  files {:>3} (peak {:>3})  sockets {:>3}  in {:>10}  waiting/in-flight: {backlog}",
        clock(s.at),
        mib(s.rss_kib),
        s.fds,
        s.fds_peak,
        s.sockets,
        thousands(accepted),
    );
    let store = daemon
        .store_memory()
        .unwrap_or_else(|err| format!("({err:#})"));
    println!(
        "           rss: anonymous (heap, stacks, wasm) {}, file-backed (code) {}; store: {store}",
        mib(s.split.anon_kib),
        mib(s.split.file_kib),
    );
}

/// The soak proper, once everything is built.
fn soak_in(
    opts: &Options,
    sluice: &Path,
    pipeline: &Path,
    data: &Path,
    delivered: &Delivered,
) -> anyhow::Result<()> {
    let mut daemon = Daemon::start(sluice, pipeline, data)?;
    let pid = daemon.pid();
    println!(
        "== soak: {} min at {} msgs/s into `{IN}`; 1 % retried once, 1 % rejected; \
         RSS, open files and sockets every {}s",
        opts.minutes,
        opts.rate,
        SAMPLE_EVERY.as_secs()
    );
    let started = Instant::now();
    let producer = Producer::start(&daemon.base, opts.rate)?;
    let mut samples = Vec::new();
    let mut k = 0u32;
    let producer_result = loop {
        let at = (SAMPLE_EVERY * k).min(opts.duration);
        std::thread::sleep((started + at).saturating_duration_since(Instant::now()));
        if let Err(err) = daemon.check_alive() {
            // Not joined: it may be resending into the dead daemon.
            producer.stop.store(true, Ordering::Relaxed);
            return Err(err);
        }
        if producer.handle.is_finished() {
            // It only stops early on an error.
            let err = producer
                .finish()
                .err()
                .unwrap_or_else(|| anyhow::anyhow!("it stopped early"));
            return Err(err.context("the producer failed"));
        }
        let s = sample(pid, started.elapsed())?;
        print_sample(
            &daemon,
            &s,
            "ingest",
            producer.accepted.load(Ordering::Relaxed),
        );
        samples.push(s);
        if at >= opts.duration {
            let (pushback, errors) = (producer.pushback.clone(), producer.errors.clone());
            break producer.finish().map(|n| {
                (
                    n,
                    pushback.load(Ordering::Relaxed),
                    errors.load(Ordering::Relaxed),
                )
            });
        }
        k += 1;
    };
    let (inputs, pushback, post_errors) = producer_result.context("the producer failed")?;
    let ingest_time = started.elapsed();
    println!(
        "== ingest stopped: {} inputs in {:.0}s ({:.0} msgs/s); waiting for the stages to drain",
        thousands(inputs),
        ingest_time.as_secs_f64(),
        inputs as f64 / ingest_time.as_secs_f64()
    );

    // Drain: every stage with nothing waiting and nothing in flight, twice
    // in a row; keep sampling meanwhile.
    let drain_started = Instant::now();
    let mut next_sample = started + SAMPLE_EVERY * (k + 1);
    let mut quiet = 0;
    while quiet < 2 {
        daemon.check_alive()?;
        if drain_started.elapsed() > DRAIN_LIMIT {
            bail!(
                "the stages did not drain within {DRAIN_LIMIT:?}: {:?}; log:\n{}",
                daemon.stages()?,
                daemon.log_tail()
            );
        }
        let stages = daemon.stages()?;
        if stages
            .iter()
            .all(|(_, depth, in_flight)| *depth == 0 && *in_flight == 0)
        {
            quiet += 1;
        } else {
            quiet = 0;
        }
        if Instant::now() >= next_sample {
            let s = sample(pid, started.elapsed())?;
            print_sample(&daemon, &s, "drain", inputs);
            next_sample += SAMPLE_EVERY;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let drained = sample(pid, started.elapsed())?;
    print_sample(&daemon, &drained, "done", inputs);
    println!(
        "== drained in {:.1}s; checking what the sinks delivered, and every DLQ",
        drain_started.elapsed().as_secs_f64()
    );

    let check = Check::run(&daemon, inputs, delivered)?;

    // The retries and dead letters the daemon logged, for the record.
    let retries_logged = daemon.retries_logged.load(Ordering::Relaxed);
    let dead_letters_logged = daemon.dead_letters_logged.load(Ordering::Relaxed);

    println!("== SIGTERM");
    let (exit, exit_time) = daemon.terminate()?;

    let report = Report {
        opts,
        inputs,
        ingest_time,
        pushback,
        post_errors,
        samples: &samples,
        drained,
        check: &check,
        retries_logged,
        dead_letters_logged,
        exit,
        exit_time,
    };
    let failures = report.print();
    if !failures.is_empty() {
        if !exit.success() {
            eprintln!("daemon log (last lines):\n{}", daemon.log_tail());
        }
        bail!("soak failed:\n  - {}", failures.join("\n  - "));
    }
    println!("== soak passed");
    Ok(())
}

/// Whether input `i` must arrive in a place exactly once (else never).
type Expect = fn(u64) -> bool;

/// What the receiver counts: `out.b` as delivered to `/b`, `out.c` to
/// `/c`.
struct Delivered {
    b: Arc<Mutex<Ledger>>,
    c: Arc<Mutex<Ledger>>,
}

impl Delivered {
    fn new() -> Delivered {
        let ledger = |place, expect| Arc::new(Mutex::new(Ledger::new(place, expect, false)));
        Delivered {
            b: ledger(OUT_B, |i| class(i) != Class::Reject),
            c: ledger(OUT_C, |_| true),
        }
    }
}

/// The exact-set checks of every output and DLQ.
struct Check {
    tallies: Vec<Tally>,
    /// Inputs to be retried, and those whose `out.c` output shows a second
    /// attempt or later at `stamp`.
    retry_inputs: u64,
    retried: u64,
    /// Other inputs whose output shows more than one attempt (a lease that
    /// ran out): not a failure, but worth seeing.
    redelivered: u64,
    /// Messages left in the topics once drained (0 when every stage and
    /// sink is done).
    left_in_topics: u64,
    /// The `tally` stage's counters summed at the end: every input passed
    /// `mid` once, so it must equal the inputs.
    tallied: u64,
}

/// The value of header `name` of a message as the read API shows it.
fn header<'a>(message: &'a Value, name: &str) -> Option<&'a str> {
    message["headers"].as_array()?.iter().find_map(|pair| {
        let pair = pair.as_array()?;
        (pair.first()?.as_str()? == name)
            .then(|| pair.get(1)?.as_str())
            .flatten()
    })
}

impl Check {
    fn run(daemon: &Daemon, inputs: u64, delivered: &Delivered) -> anyhow::Result<Check> {
        let lock = |l: &Arc<Mutex<Ledger>>| {
            let mut ledger = l.lock().unwrap_or_else(|e| e.into_inner());
            let counts = (ledger.retried, ledger.redelivered);
            (ledger.finish(inputs), counts)
        };
        let (b, _) = lock(&delivered.b);
        let (c, (retried, redelivered)) = lock(&delivered.c);
        let mut tallies = vec![b, c];
        let dlqs: [(&'static str, Expect); 4] = [
            (DLQ_ROUTE, |i| class(i) == Class::Reject),
            (DLQ_STAMP, |_| false),
            (DLQ_COPY, |_| false),
            (DLQ_TALLY, |_| false),
        ];
        for (topic, expect) in dlqs {
            let mut ledger = Ledger::new(topic, expect, true);
            daemon.read_all(topic, |m| {
                let text = m["payload"].as_str().unwrap_or_default();
                ledger.record(text, |name| header(m, name));
            })?;
            tallies.push(ledger.finish(inputs));
        }
        let mut left_in_topics = 0;
        for topic in [IN, "mid", OUT_B, OUT_C] {
            left_in_topics += daemon.get(&format!("/v1/topics/{topic}"))?["depth"]
                .as_u64()
                .unwrap_or(0);
        }
        let mut tallied = 0;
        for slot in 0..TALLY_COUNTERS {
            let path = format!("/v1/state/soak/tally/keys/tally%2F{slot}");
            let counter = match daemon.get(&path) {
                Ok(counter) => counter,
                // A counter no message's id chose.
                Err(e) if e.to_string().contains("404") => continue,
                Err(e) => return Err(e),
            };
            tallied += counter["value"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .with_context(|| format!("tally/{slot} is not a number: {counter}"))?;
        }
        Ok(Check {
            tallied,
            tallies,
            retry_inputs: (0..inputs).filter(|&i| class(i) == Class::Retry).count() as u64,
            retried,
            redelivered,
            left_in_topics,
        })
    }
}

/// Everything the summary shows.
struct Report<'a> {
    opts: &'a Options,
    inputs: u64,
    ingest_time: Duration,
    pushback: u64,
    post_errors: u64,
    samples: &'a [Sample],
    drained: Sample,
    check: &'a Check,
    retries_logged: u64,
    dead_letters_logged: u64,
    exit: ExitStatus,
    exit_time: Duration,
}

impl Report<'_> {
    /// Prints the summary table; the failed checks.
    fn print(&self) -> Vec<String> {
        let mut failures = Vec::new();
        let c = self.check;
        println!("\n== soak summary");
        let row = |what: &str, value: String, note: String| {
            println!("  {what:<28} {value:>14}  {note}");
        };
        let per_class = |k: Class| (0..self.inputs).filter(|&i| class(i) == k).count() as u64;
        row(
            "messages in (accepted)",
            thousands(self.inputs),
            format!(
                "{:.1} min at {:.0} msgs/s (asked {}); {} to retry once, {} to reject",
                self.ingest_time.as_secs_f64() / 60.0,
                self.inputs as f64 / self.ingest_time.as_secs_f64(),
                self.opts.rate,
                thousands(per_class(Class::Retry)),
                thousands(per_class(Class::Reject)),
            ),
        );
        row(
            "ingest pushback (429/503)",
            thousands(self.pushback),
            format!("other failed posts: {}", self.post_errors),
        );
        for t in &c.tallies {
            let kind = if t.is_dlq() { "DLQ" } else { "delivered" };
            let mut note = format!(
                "expected {}, lost {}, duplicated {}, unexpected {}, altered {}",
                thousands(t.expected),
                t.lost,
                t.duplicated,
                t.unexpected,
                t.altered
            );
            if t.is_dlq() {
                note += &format!(", not rejected-at-once {}", t.wrong_kind);
            }
            row(&format!("{kind} {}", t.place), thousands(t.stored), note);
            if !t.ok() {
                failures.push(format!(
                    "{}: {} lost, {} duplicated, {} unexpected, {} altered, {} of the wrong kind (e.g. {})",
                    t.place,
                    t.lost,
                    t.duplicated,
                    t.unexpected,
                    t.altered,
                    t.wrong_kind,
                    t.examples.join("; ")
                ));
            }
        }
        row(
            "retried, then passed",
            thousands(c.retried),
            format!(
                "of {} (attempt >= 2 at stamp); other inputs redelivered: {}",
                thousands(c.retry_inputs),
                c.redelivered
            ),
        );
        if c.retried != c.retry_inputs {
            failures.push(format!(
                "only {} of {} retried inputs show a second attempt",
                c.retried, c.retry_inputs
            ));
        }
        row(
            "daemon log",
            String::new(),
            format!(
                "{} retry lines, {} dead-letter lines",
                thousands(self.retries_logged),
                thousands(self.dead_letters_logged)
            ),
        );
        row(
            "state counters (tally)",
            thousands(c.tallied),
            format!("of {} inputs, one increment each", thousands(self.inputs)),
        );
        if c.tallied != self.inputs {
            failures.push(format!(
                "the tally stage's counter is {}, not the {} inputs: an increment lost or applied twice",
                c.tallied, self.inputs
            ));
        }
        if c.left_in_topics != 0 {
            failures.push(format!(
                "{} messages are still stored in `{IN}`, `mid`, `{OUT_B}` and `{OUT_C}` after the drain",
                c.left_in_topics
            ));
        }

        // Memory and descriptors over the steady part of the run.
        let duration = self.opts.duration;
        let warm_up = WARM_UP.min(duration / 5);
        let steady: Vec<&Sample> = self.samples.iter().filter(|s| s.at >= warm_up).collect();
        let rss_checked = self.opts.minutes >= RSS_CHECKED_FROM_MINUTES;
        match (steady.first(), self.samples.last()) {
            (Some(base), Some(end)) => {
                let window = RSS_WINDOW.min(duration / 5);
                let (start_median, end_median) = rss_medians(&steady, window);
                let growth =
                    (end_median as f64 - start_median as f64) / start_median.max(1) as f64 * 100.0;
                row(
                    &format!("RSS at {} (after warm-up)", clock(base.at)),
                    mib(base.rss_kib),
                    format!(
                        "warm-up {}; median of the next {}: {}",
                        clock(warm_up),
                        clock(window),
                        mib(start_median)
                    ),
                );
                row(
                    &format!("RSS at {} (end of ingest)", clock(end.at)),
                    mib(end.rss_kib),
                    format!(
                        "median of the last {}: {}; after the drain: {}",
                        clock(window),
                        mib(end_median),
                        mib(self.drained.rss_kib)
                    ),
                );
                let verdict = if rss_checked {
                    format!("limit < {RSS_GROWTH_LIMIT} %")
                } else {
                    format!(
                        "not checked: a run under {RSS_CHECKED_FROM_MINUTES} min is too short to mean anything"
                    )
                };
                row("RSS growth (medians)", format!("{growth:+.1} %"), verdict);
                if rss_checked && growth >= RSS_GROWTH_LIMIT {
                    failures.push(format!(
                        "RSS grew {growth:.1} % from the median of the {} after {} to that of the \
                         last {} ({} -> {}), limit {RSS_GROWTH_LIMIT} %",
                        clock(window),
                        clock(base.at),
                        clock(window),
                        mib(start_median),
                        mib(end_median)
                    ));
                }
                let min = steady.iter().map(|s| s.fds).min().unwrap_or(0);
                let max = steady.iter().map(|s| s.fds).max().unwrap_or(0);
                let all_min = self.samples.iter().map(|s| s.fds).min().unwrap_or(0);
                let all_max = self.samples.iter().map(|s| s.fds).max().unwrap_or(0);
                let peak = self.samples.iter().map(|s| s.fds_peak).max().unwrap_or(0);
                row(
                    "open files after warm-up",
                    format!("{min}..{max}"),
                    format!(
                        "after the drain {} (limit {}: they follow the backlog while it runs); \
                         whole run {all_min}..{all_max}, momentary peak {peak} \
                         (descriptors but sockets)",
                        self.drained.fds,
                        min + FD_SLACK
                    ),
                );
                if self.drained.fds > min + FD_SLACK {
                    failures.push(format!(
                        "open files stayed at {} after the drain, against {min} after the warm-up \
                         (slack {FD_SLACK})",
                        self.drained.fds
                    ));
                }
                let sockets = self.samples.iter().map(|s| s.sockets).max().unwrap_or(0);
                row(
                    "open sockets, most",
                    sockets.to_string(),
                    format!(
                        "limit {SOCKET_LIMIT}: the sinks' {} pooled connections and the rest; \
                         after the drain {}",
                        2 * SINK_CONCURRENCY,
                        self.drained.sockets
                    ),
                );
                if sockets > SOCKET_LIMIT {
                    failures.push(format!(
                        "{sockets} sockets open at rest, more than the {SOCKET_LIMIT} the sinks \
                         and the APIs account for"
                    ));
                }
            }
            _ => failures.push("no samples after the warm-up".into()),
        }
        row(
            "samples",
            self.samples.len().to_string(),
            format!("every {}s", SAMPLE_EVERY.as_secs()),
        );
        row(
            "daemon exit on SIGTERM",
            self.exit
                .code()
                .map_or_else(|| self.exit.to_string(), |c| c.to_string()),
            format!("in {:.1}s", self.exit_time.as_secs_f64()),
        );
        if !self.exit.success() {
            failures.push(format!("the daemon exited {} on SIGTERM, not 0", self.exit));
        }
        failures
    }
}

/// The median RSS (KiB) of the samples in the first `window` of `steady`
/// and in its last `window`.
fn rss_medians(steady: &[&Sample], window: Duration) -> (u64, u64) {
    let median = |mut values: Vec<u64>| {
        values.sort_unstable();
        values.get(values.len() / 2).copied().unwrap_or(0)
    };
    let (Some(first), Some(last)) = (steady.first(), steady.last()) else {
        return (0, 0);
    };
    let start = steady
        .iter()
        .filter(|s| s.at <= first.at + window)
        .map(|s| s.rss_kib)
        .collect();
    let end = steady
        .iter()
        .filter(|s| s.at + window >= last.at)
        .map(|s| s.rss_kib)
        .collect();
    (median(start), median(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_split_finds_this_process_heap_and_binary() {
        let heap: Vec<u8> = vec![1; 32 << 20];
        let split = rss_by_mapping(std::process::id());
        assert!(split.anon_kib >= 32 * 1024, "{split:?}");
        assert!(split.file_kib > 0, "{split:?}");
        drop(heap);
    }

    #[test]
    fn rss_growth_compares_medians_not_teeth() {
        let sample = |secs: u64, mib: u64| Sample {
            at: Duration::from_secs(secs),
            rss_kib: mib * 1024,
            split: RssSplit::default(),
            fds: 0,
            fds_peak: 0,
            sockets: 0,
        };
        // A sawtooth between 100 and 130 MiB, flat on average, starting at
        // a trough: single samples would say +30 %.
        let teeth: Vec<Sample> = (0..60)
            .map(|i| sample(300 + i * 10, 100 + (i % 7) * 5))
            .chain([sample(900, 130)])
            .collect();
        let steady: Vec<&Sample> = teeth.iter().collect();
        let (start, end) = rss_medians(&steady, Duration::from_secs(120));
        assert_eq!((start / 1024, end / 1024), (115, 115));
        // Real growth shows.
        let growing: Vec<Sample> = (0..60).map(|i| sample(300 + i * 10, 100 + i)).collect();
        let steady: Vec<&Sample> = growing.iter().collect();
        let (start, end) = rss_medians(&steady, Duration::from_secs(100));
        assert!(end > start + 40 * 1024, "{start} {end}");
    }

    #[test]
    fn one_in_a_hundred_is_retried_and_one_rejected() {
        let count = |k| (0..10_000).filter(|&i| class(i) == k).count();
        assert_eq!(count(Class::Retry), 100);
        assert_eq!(count(Class::Reject), 100);
    }

    #[test]
    fn payloads_name_their_input_and_carry_the_markers() {
        for i in [0, 41, RETRY_SLOT, REJECT_SLOT, 1_234_567] {
            let p = payload(i);
            assert_eq!(index_of(&p), Some(i));
            let doc: Value = serde_json::from_str(&p).expect("json");
            assert_eq!(p.starts_with(RETRY_PREFIX), class(i) == Class::Retry);
            assert_eq!(doc.get("type").is_none(), class(i) == Class::Reject);
        }
    }

    #[test]
    fn the_pipeline_marks_retries_with_the_same_prefix() {
        assert!(PIPELINE_YAML.contains(&format!("fail_prefix: '{RETRY_PREFIX}'")));
        for dlq in [DLQ_STAMP, DLQ_ROUTE, DLQ_COPY, DLQ_TALLY] {
            let stage = dlq.split('.').nth(1).expect("stage");
            assert!(PIPELINE_YAML.contains(&format!("- name: {stage}\n")));
        }
        assert!(PIPELINE_YAML.starts_with("# Written by `cargo xtask soak`.\nname: soak\n"));
        // Both outputs leave through a sink to the receiver's two ledgers.
        for (topic, path) in [(OUT_B, "b"), (OUT_C, "c")] {
            assert!(PIPELINE_YAML.contains(&format!(
                "    subscribe: {topic}\n    concurrency: {SINK_CONCURRENCY}\n    http: {{url: \"{{receiver}}/{path}\"}}\n"
            )));
        }
    }

    #[test]
    fn arguments() {
        let o = parse_args(&["--minutes", "2"]).expect("ok");
        assert_eq!(o.duration, Duration::from_secs(120));
        assert_eq!(o.rate, DEFAULT_RATE);
        let o = parse_args(&["--minutes=0.5", "--rate", "100"]).expect("ok");
        assert_eq!(o.duration, Duration::from_secs(30));
        assert_eq!(o.rate, 100);
        assert!(parse_args(&[]).is_err());
        assert!(parse_args(&["--minutes", "0"]).is_err());
        assert!(parse_args(&["--minutes", "2", "--what"]).is_err());
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
