//! Issue 27's trace figure, on the real daemon: a three-stage pipeline
//! (the `identity` handler, embedded broker) with OTLP export on (every
//! attempt a span, sampling 100 %, to a receiver that answers and
//! discards) against the same pipeline with export off, side by side,
//! samples alternating. The target is at least 0.9x. Figures are printed,
//! never asserted.
//!
//! `cargo bench -p sluice-tests --bench otlp`; in the debug test profile
//! (`cargo test -p sluice-tests --bench otlp`) a short run checks that it
//! works. `SLUICE_BENCH_N` and `SLUICE_BENCH_SAMPLES` set the size.
//!
//! Each sample starts a daemon, holds the first stage paused while the
//! backlog is written, then times from its resume until the last message
//! is in `out`; CPU is the daemon's (all threads) over that window.

#![allow(missing_docs)]

use std::time::Duration;

use serde_json::json;
use sluice_tests::bench::{self, Sample, Window};
use sluice_tests::otlp::OtlpReceiver;
use sluice_tests::{Daemon, Msg, plugin};

fn main() {
    let (n, samples) = bench::size(300, 30_000, 3);
    let receiver = OtlpReceiver::discarding();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        off.push(sample(n, None));
        on.push(sample(n, Some(&receiver)));
    }
    println!(
        "\nthree identity stages, {n} messages, {samples} samples each; \
         {} export requests received",
        receiver.requests()
    );
    println!("| benchmark | A | B | ratio B/A | daemon CPU µs/msg (A, B) |");
    println!("|---|---|---|---|---|");
    let rate = |s: &[Sample]| bench::median(&s.iter().map(|s| s.rate).collect::<Vec<_>>());
    let cpu = |s: &[Sample]| bench::median(&s.iter().map(|s| s.cpu_us).collect::<Vec<_>>());
    println!(
        "| export off (A) vs OTLP on, 100 % sampled (B) | {:.0} | {:.0} | {:.2} | {:.1}, {:.1} |",
        rate(&off),
        rate(&on),
        rate(&on) / rate(&off),
        cpu(&off),
        cpu(&on)
    );
}

/// One sample: `n` messages through three stages, exporting to
/// `receiver` when given.
fn sample(n: usize, receiver: Option<&OtlpReceiver>) -> Sample {
    let identity = plugin("identity");
    let yaml = format!(
        r#"
name: bench
topics: [in, a, b, out]
stages:
  - {{name: one, subscribe: in, plugin: {identity}, publish: [a], concurrency: 2}}
  - {{name: two, subscribe: a, plugin: {identity}, publish: [b], concurrency: 2}}
  - {{name: three, subscribe: b, plugin: {identity}, publish: [out], concurrency: 2}}
"#
    );
    let mut builder = Daemon::with_yaml(&yaml);
    if let Some(receiver) = receiver {
        builder = builder.envs(receiver.env());
    }
    let daemon = builder.start();
    daemon.post("/v1/stages/bench/one/pause", json!({}));
    let messages: Vec<Msg> = (0..n)
        .map(|i| Msg::new(format!("m{i}"), format!("{{\"n\": {i}}}")))
        .collect();
    for chunk in messages.chunks(1000) {
        daemon.publish("in", chunk);
    }
    let window = Window::start(&daemon);
    daemon.post("/v1/stages/bench/one/resume", json!({}));
    daemon.wait_until("all out", Duration::from_secs(600), |d| d.depth("out") >= n);
    window.finish(&daemon, n)
}
