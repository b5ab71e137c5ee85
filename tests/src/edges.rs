//! The edge compliance suite: one scenario that every connector (source
//! and sink of the same kind) passes against its real server, as
//! Redpanda Connect runs the same delivery tests on every connector.
//!
//! A connector's test file implements [`Upstream`] for its server (a
//! real process of the test's own, driven by a third-party client) and
//! calls [`round_trip_under_faults`]:
//!
//! ```text
//! upstream --source `src`--> topic `in` --stage `upper` (uppercase)--> topic `up` --sink `out`--> upstream
//! ```
//!
//! The payloads are `msg-<i>`; the far end must hold exactly the set
//! `MSG-<i>`, whatever crashes and outages came in between. Pipelines are
//! built by [`edge_pipeline`], so the YAML shape lives here once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Daemon, plugin, write_pipeline};

/// How long the suite waits for any one step.
pub const EDGE_WAIT: Duration = Duration::from_secs(300);

/// One message as the sink wrote it to the far end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    /// Its payload (`MSG-<i>` after the uppercase stage).
    pub payload: String,
    /// The `sluice-id` the sink wrote with it, where the target carries
    /// headers or an id (every connector here does, but MQTT 3.1.1).
    pub sluice_id: Option<String>,
}

/// What the far end may hold beyond one copy of each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duplicates {
    /// None at all: the sink's target drops a repeated id itself (SQS FIFO
    /// deduplication ids, JetStream `Nats-Msg-Id`).
    None,
    /// Repeats may come (the target has no idempotent write), but every
    /// copy of one message carries the same `sluice-id`, so a consumer can
    /// drop them.
    SameId,
    /// Repeats may come with different ids: the source's upstream has no
    /// stable message id (MQTT, core NATS), so a message redelivered after
    /// a crash is a new message. They are counted and reported, not
    /// failed.
    Allowed,
}

/// A connector's real server and the test's own client of it.
pub trait Upstream {
    /// The source's connector block, unindented YAML starting with the
    /// block's key (`kafka:` ...), reading what [`produce`](Self::produce)
    /// writes.
    fn source_block(&self) -> String;
    /// The sink's connector block and any stage knobs, unindented YAML
    /// (`batch: ...` lines may come before the block), writing where
    /// [`delivered`](Self::delivered) reads.
    fn sink_block(&self) -> String;
    /// Writes the payloads `msg-<i>` for `i` in `from..from + n` where
    /// the source reads.
    fn produce(&mut self, from: usize, n: usize);
    /// Everything the sink has written so far (a client that consumes,
    /// such as an SQS receiver, keeps what it took and returns it all).
    fn delivered(&mut self) -> Vec<Delivered>;
    /// Takes the server away and brings it back (a restart that keeps
    /// its data, or SIGSTOP then SIGCONT for a server that keeps
    /// nothing).
    fn restart(&mut self);
    /// Extra lines for the daemon's log on failure (the server's log).
    fn log(&self) -> String {
        String::new()
    }
    /// Environment variables the daemon needs to reach the server (AWS
    /// credentials from the standard chain, for SQS).
    fn env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// Writes the suite's pipeline to `dir`: source `src` (the given block)
/// into `in`, the uppercase stage `upper` (concurrency 4) into `up`, and
/// the sink `out` (the given block and knobs, concurrency 2). Blocks are
/// unindented YAML; this indents them.
pub fn edge_pipeline(dir: &Path, source_block: &str, sink_block: &str) -> PathBuf {
    let yaml = format!(
        "name: edge\n\
         topics: [in, up]\n\
         sources:\n  - name: src\n    to: in\n{source}\
         stages:\n  - name: upper\n    subscribe: in\n    plugin: {plugin}\n    publish: [up]\n    concurrency: 4\n\
         sinks:\n  - name: out\n    subscribe: up\n    concurrency: 2\n{sink}",
        source = indent(source_block, 4),
        sink = indent(sink_block, 4),
        plugin = plugin("uppercase"),
    );
    write_pipeline(dir, "edge", &yaml)
}

/// `text` with every line indented by `by` spaces, ending in a newline.
pub fn indent(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    let mut out = String::new();
    for line in text.lines() {
        if !line.trim().is_empty() {
            out.push_str(&pad);
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// The suite's TLS scenario. `up`'s blocks connect over TLS and trust
/// the test's CA (`tls_ca`). `n` messages go round and all arrive (exact
/// set, duplicates as `dupes` allows). Then a second sink, `held`, with
/// the block `untrusted` (the same server, no `tls_ca`), is given three
/// messages on topic `copy`: it is held, not dead-lettered, and readiness
/// and the log say `not trusted` and what to do (`tls_ca`).
///
/// # Panics
///
/// As [`round_trip_under_faults`]; also when the untrusted sink is not
/// held and said.
pub fn round_trip_over_tls(up: &mut dyn Upstream, n: usize, dupes: Duplicates, untrusted: &str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = edge_pipeline(dir.path(), &up.source_block(), &up.sink_block());
    // The held sink joins the suite's pipeline, on a topic of its own.
    let mut yaml = std::fs::read_to_string(&file)
        .expect("the pipeline")
        .replace("topics: [in, up]", "topics: [in, up, copy]");
    yaml.push_str(&format!(
        "  - name: held\n    subscribe: copy\n    retry: {{max_attempts: 2, backoff: {{initial: 100ms, max: 500ms}}}}\n{}",
        indent(untrusted, 4)
    ));
    std::fs::write(&file, yaml).expect("writing the pipeline");
    up.produce(0, n);
    let daemon = Daemon::builder(&[&file], &dir.path().join("data"))
        .envs(up.env())
        .start();
    daemon.wait_until(&format!("all {n} delivered over TLS"), EDGE_WAIT, |_| {
        distinct(&up.delivered()) >= n
    });
    let got = up.delivered();
    check_exact_set(&got, n, dupes, &|| {
        format!("{}\n{}", daemon.log(), up.log())
    });
    let copies: Vec<crate::Msg> = (0..3)
        .map(|i| crate::Msg::new(format!("c{i}"), "x"))
        .collect();
    daemon.publish("copy", &copies);
    daemon.wait_until(
        "readiness says the held sink's server is not trusted",
        EDGE_WAIT,
        |d| {
            let (status, reasons) = d.readiness();
            status == "degraded" && reasons.contains("edge/held") && reasons.contains("not trusted")
        },
    );
    // The quiet window is the check: a held message leaves no event, and
    // one whose attempts were spent would be in the DLQ by now.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(daemon.depth("edge.held.dlq"), 0, "held, not dead-lettered");
    let log = daemon.log();
    assert!(
        log.contains("not trusted") && log.contains("tls_ca"),
        "the log says why and what to do:\n{log}"
    );
}

/// What [`round_trip_under_faults`] saw, for the test to report.
#[derive(Debug)]
pub struct Report {
    /// Distinct payloads delivered.
    pub distinct: usize,
    /// Copies beyond the first.
    pub duplicates: usize,
}

/// The suite's fault scenario. `n` messages go upstream (half before the
/// daemon starts, half after the upstream restart). Meanwhile the daemon
/// is killed with SIGKILL twice and restarted, and the upstream server is
/// restarted once, each while output is flowing. Then every payload must
/// have arrived (exact set: 0 lost), with the duplicates `dupes` allows.
///
/// # Panics
///
/// When a message is lost, a forbidden duplicate arrives, or a step does
/// not finish within [`EDGE_WAIT`].
pub fn round_trip_under_faults(up: &mut dyn Upstream, n: usize, dupes: Duplicates) -> Report {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = edge_pipeline(dir.path(), &up.source_block(), &up.sink_block());
    let half = n / 2;
    up.produce(0, half);
    let mut daemon = Daemon::builder(&[&file], &dir.path().join("data"))
        .envs(up.env())
        .start();
    let at = |daemon: &Daemon, up: &mut dyn Upstream, share: usize, what: &str| {
        let want = n * share / 10;
        wait_for_deliveries(daemon, up, want, what);
    };
    at(&daemon, &mut *up, 1, "before the first kill");
    daemon.kill9();
    daemon.restart();
    at(&daemon, &mut *up, 2, "after the first kill");
    up.restart();
    up.produce(half, n - half);
    at(&daemon, &mut *up, 6, "after the upstream restart");
    daemon.kill9();
    daemon.restart();
    wait_for_deliveries(&daemon, up, n, "at the end");
    // Anything redelivered late would land now: the quiet window is the
    // check, as a redelivery that does not happen leaves no event.
    std::thread::sleep(Duration::from_secs(3));
    let got = up.delivered();
    let report = check_exact_set(&got, n, dupes, &|| {
        format!("{}\n{}", daemon.log(), up.log())
    });
    daemon.term();
    report
}

/// Waits until `want` distinct payloads were delivered. A loaded machine
/// may take long, so the limit is on a stall: it fails when no new payload
/// arrived for [`EDGE_WAIT`], not when the whole wait passes a fixed time.
///
/// # Panics
///
/// On a stall, quoting the daemon's log.
pub fn wait_for_deliveries(daemon: &Daemon, up: &mut dyn Upstream, want: usize, what: &str) {
    let mut best = 0;
    let mut progressed = Instant::now();
    loop {
        let now = distinct(&up.delivered());
        if now >= want {
            return;
        }
        if now > best {
            best = now;
            progressed = Instant::now();
        }
        assert!(
            progressed.elapsed() < EDGE_WAIT,
            "{want} delivered ({what}): stuck at {best} for {EDGE_WAIT:?}; daemon log:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The distinct payloads in `got`.
pub fn distinct(got: &[Delivered]) -> usize {
    got.iter()
        .map(|d| d.payload.as_str())
        .collect::<BTreeSet<_>>()
        .len()
}

/// Asserts that `got` holds each of `MSG-0` .. `MSG-<n-1>` and nothing
/// else, with only the duplicates `dupes` allows.
///
/// # Panics
///
/// On a lost, foreign or forbidden duplicate message; the message quotes
/// `log()`.
pub fn check_exact_set(
    got: &[Delivered],
    n: usize,
    dupes: Duplicates,
    log: &dyn Fn() -> String,
) -> Report {
    let mut by_payload: BTreeMap<&str, Vec<Option<&str>>> = BTreeMap::new();
    for d in got {
        by_payload
            .entry(d.payload.as_str())
            .or_default()
            .push(d.sluice_id.as_deref());
    }
    let want: BTreeSet<String> = (0..n).map(|i| format!("MSG-{i}")).collect();
    let lost: Vec<&String> = want
        .iter()
        .filter(|p| !by_payload.contains_key(p.as_str()))
        .take(10)
        .collect();
    let foreign: Vec<&&str> = by_payload
        .keys()
        .filter(|p| !want.contains(**p))
        .take(10)
        .collect();
    assert!(
        lost.is_empty() && foreign.is_empty(),
        "lost (first 10): {lost:?}; not sent (first 10): {foreign:?}; {} distinct of {n}\n{}",
        by_payload.len(),
        log()
    );
    let repeated: Vec<(&&str, &Vec<Option<&str>>)> =
        by_payload.iter().filter(|(_, ids)| ids.len() > 1).collect();
    let duplicates = got.len() - by_payload.len();
    match dupes {
        Duplicates::None => assert!(
            repeated.is_empty(),
            "{duplicates} duplicates where the target deduplicates, e.g. {:?}",
            repeated.iter().take(5).collect::<Vec<_>>()
        ),
        Duplicates::SameId => {
            let differing: Vec<_> = repeated
                .iter()
                .filter(|(_, ids)| ids.iter().any(|id| id.is_none() || *id != ids[0]))
                .take(5)
                .collect();
            assert!(
                differing.is_empty(),
                "duplicates must carry one sluice-id each: {differing:?}"
            );
        }
        Duplicates::Allowed => {}
    }
    if dupes != Duplicates::Allowed {
        for d in got {
            assert!(
                d.sluice_id.as_deref().is_some_and(|id| !id.is_empty()),
                "a delivered message without its sluice-id: {d:?}"
            );
        }
    }
    eprintln!(
        "edge round trip: {n} sent, {} distinct, {duplicates} duplicates",
        by_payload.len()
    );
    Report {
        distinct: by_payload.len(),
        duplicates,
    }
}
