//! Issue 27's trace figure, on the real daemon: a three-stage pipeline
//! (the `identity` handler, embedded broker) with OTLP export on (every
//! attempt a span, sampling 100 %, to a receiver that answers and
//! discards) against the same pipeline with export off, side by side,
//! samples alternating. The target is at least 0.9x. Figures are printed,
//! never asserted.
//!
//! Two more sides split the cost: export off with every message carrying
//! a `traceparent` (the context carried through each hop, no OpenTelemetry
//! at all), and export on with the `always_off` sampler (the SDK's context
//! for every attempt, nothing recorded or exported).
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
use sluice_tests::{Daemon, Msg, TRACEPARENT, plugin};

/// What one side of the comparison runs.
#[derive(Clone, Copy)]
enum Side {
    /// Export off, messages without a trace context.
    Off,
    /// Export off, every message published with a `traceparent`.
    OffCarrying,
    /// Export on, the `always_off` sampler: contexts made, nothing sent.
    NothingSampled,
    /// Export on, every attempt a span, all sent.
    On,
}

const SIDES: [Side; 4] = [Side::Off, Side::OffCarrying, Side::NothingSampled, Side::On];

fn main() {
    let (n, samples) = bench::size(300, 30_000, 3);
    let receiver = OtlpReceiver::discarding();
    let mut results: Vec<Vec<Sample>> = vec![Vec::new(); SIDES.len()];
    for _ in 0..samples {
        for (side, results) in SIDES.iter().zip(&mut results) {
            results.push(sample(n, *side, &receiver));
        }
    }
    println!(
        "\nthree identity stages, {n} messages, {samples} samples each; \
         {} export requests received",
        receiver.requests()
    );
    let rate = |s: &[Sample]| bench::median(&s.iter().map(|s| s.rate).collect::<Vec<_>>());
    let cpu = |s: &[Sample]| bench::median(&s.iter().map(|s| s.cpu_us).collect::<Vec<_>>());
    println!("| benchmark | A | B | ratio B/A | daemon CPU µs/msg (A, B) |");
    println!("|---|---|---|---|---|");
    let off = &results[0];
    for (label, b) in [
        ("export off (A) vs OTLP on, 100 % sampled (B)", &results[3]),
        (
            "export off (A) vs export off, each message carrying a traceparent (B)",
            &results[1],
        ),
        (
            "export off (A) vs OTLP on, sampler always_off (B)",
            &results[2],
        ),
    ] {
        println!(
            "| {label} | {:.0} | {:.0} | {:.2} | {:.1}, {:.1} |",
            rate(off),
            rate(b),
            rate(b) / rate(off),
            cpu(off),
            cpu(b)
        );
    }
}

/// One sample: `n` messages through three stages, run as `side` asks
/// (exporting to `receiver` when it is on).
fn sample(n: usize, side: Side, receiver: &OtlpReceiver) -> Sample {
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
    match side {
        Side::Off | Side::OffCarrying => {}
        Side::NothingSampled => {
            builder = builder
                .envs(receiver.env())
                .envs([("OTEL_TRACES_SAMPLER", "always_off")]);
        }
        Side::On => builder = builder.envs(receiver.env()),
    }
    let daemon = builder.start();
    daemon.post("/v1/stages/bench/one/pause", json!({}));
    let messages: Vec<Msg> = (0..n)
        .map(|i| {
            let message = Msg::new(format!("m{i}"), format!("{{\"n\": {i}}}"));
            match side {
                Side::OffCarrying => message.header("traceparent", TRACEPARENT),
                _ => message,
            }
        })
        .collect();
    for chunk in messages.chunks(1000) {
        daemon.publish("in", chunk);
    }
    let window = Window::start(&daemon);
    daemon.post("/v1/stages/bench/one/resume", json!({}));
    daemon.wait_until("all out", Duration::from_secs(600), |d| d.depth("out") >= n);
    window.finish(&daemon, n)
}
