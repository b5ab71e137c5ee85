//! The RabbitMQ source and sink against a raw lapin loop, side by side in
//! one run (samples alternate A, B, A, B, ...; figures are medians).
//!
//! `cargo bench -p sluice-tests --bench connect_amqp`; in the debug test
//! profile (`cargo test -p sluice-tests --bench connect_amqp`) it runs a
//! small N, to check that it works. `SLUICE_BENCH_N` sets N.
//!
//! - **A, raw loop**: one Rust task, one connection, two channels: consume
//!   `b` deliveries from queue `in` (manual acks, prefetch `2b`), publish
//!   them to `out` (persistent, `mandatory`, publisher confirms), await
//!   the `b` confirms, then one `basic.ack` (multiple) for the batch;
//!   until N messages are in `out`.
//! - **B, sluice**: the real `sluice run` binary (embedded broker, durable,
//!   default sync): an AMQP source (`batch: b`, `prefetch: 2b`) ->
//!   `identity` stage (concurrency 2) -> AMQP sink (concurrency 2,
//!   `batch: {max: b}`, confirms); until N messages are in `out`.
//!
//! Each for b = 100 and b = 1,000. Both start timing when the producer
//! starts publishing N persistent messages of 64 B to `in`, with the reader
//! already consuming: the daemon's start-up is not timed. Target: B >= 0.7
//! x A (messages/s).

#![allow(missing_docs)]

use sluice_tests::bench;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use sluice_harness::rabbitmq::RabbitNode;
use sluice_tests::Daemon;

const SAMPLES: usize = 5;
const BATCHES: [usize; 2] = [100, 1000];

fn main() {
    let (n, samples) = bench::size(2_000, 20_000, SAMPLES);
    let rt = bench::runtime();
    sluice_harness::plugin("identity");
    let node = RabbitNode::start().expect("rabbitmq");
    let url = node.url();
    bench::side_by_side(
        &BATCHES,
        samples,
        |batch, run| rt.block_on(raw_loop(&url, n, batch, run)),
        |batch, run| through_sluice(&rt, &url, n, batch, run),
        |batch| {
            format!(
                "amqp queue -> amqp exchange, {n} x 64 B persistent, batch {batch}, messages/s: raw lapin consume+publish(confirms)+ack loop | sluice source -> identity -> sink (embedded, durable)"
            )
        },
    );
}

async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect")
}

/// Durable queues `in-<run>` and `out-<run>`, the latter bound to
/// `amq.direct` with its own name.
async fn declare(channel: &Channel, input: &str, output: &str) {
    for queue in [input, output] {
        channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("queue.declare");
    }
    channel
        .queue_bind(
            output.into(),
            "amq.direct".into(),
            output.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("queue.bind");
}

fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

/// Publishes N persistent messages to `queue`, confirmed per 1,000.
async fn produce(url: &str, queue: &str, n: usize) {
    let conn = connect(url).await;
    let channel = conn.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut confirms = Vec::with_capacity(chunk.len());
        for i in chunk {
            confirms.push(
                channel
                    .basic_publish(
                        "".into(),
                        queue.into(),
                        BasicPublishOptions::default(),
                        format!("{i:0>64}").as_bytes(),
                        persistent().with_message_id(format!("m-{i}").into()),
                    )
                    .await
                    .expect("publish"),
            );
        }
        for confirm in confirms {
            confirm.await.expect("confirm");
        }
    }
    let _ = conn.close(200, "".into()).await;
}

async fn depth(channel: &Channel, queue: &str) -> usize {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map(|q| q.message_count() as usize)
        .expect("passive declare")
}

/// A: the raw loop, in messages/s.
async fn raw_loop(url: &str, n: usize, batch: usize, run: &str) -> f64 {
    let (input, output) = (format!("raw-in-{run}"), format!("raw-out-{run}"));
    let conn = connect(url).await;
    let consume = conn.create_channel().await.expect("channel");
    declare(&consume, &input, &output).await;
    let publish = conn.create_channel().await.expect("channel");
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    consume
        .basic_qos(
            u16::try_from(batch * 2).unwrap_or(u16::MAX),
            BasicQosOptions::default(),
        )
        .await
        .expect("qos");
    let mut consumer = consume
        .basic_consume(
            input.as_str().into(),
            "raw".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let started = Instant::now();
    let producer = {
        let (url, input) = (url.to_owned(), input.clone());
        tokio::spawn(async move { produce(&url, &input, n).await })
    };
    let mut done = 0;
    while done < n {
        let mut deliveries = Vec::with_capacity(batch);
        let first = consumer.next().await.expect("a delivery").expect("ok");
        deliveries.push(first);
        while deliveries.len() < batch.min(n - done) {
            match tokio::time::timeout(Duration::from_millis(5), consumer.next()).await {
                Ok(Some(Ok(d))) => deliveries.push(d),
                _ => break,
            }
        }
        let mut confirms = Vec::with_capacity(deliveries.len());
        for d in &deliveries {
            confirms.push(
                publish
                    .basic_publish(
                        "amq.direct".into(),
                        output.as_str().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        &d.data,
                        persistent(),
                    )
                    .await
                    .expect("publish"),
            );
        }
        for confirm in confirms {
            confirm.await.expect("confirm");
        }
        let last = deliveries.last().map_or(0, |d| d.delivery_tag);
        consume
            .basic_ack(last, BasicAckOptions { multiple: true })
            .await
            .expect("ack");
        done += deliveries.len();
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    producer.await.expect("producer");
    let _ = conn.close(200, "".into()).await;
    rate
}

/// B: through the real daemon, in messages/s.
fn through_sluice(
    rt: &tokio::runtime::Runtime,
    url: &str,
    n: usize,
    batch: usize,
    run: &str,
) -> bench::Sample {
    let (input, output) = (format!("in-{run}"), format!("out-{run}"));
    let conn = rt.block_on(connect(url));
    let channel = rt.block_on(conn.create_channel()).expect("channel");
    rt.block_on(declare(&channel, &input, &output));
    let dir = tempfile::tempdir().expect("dir");
    let prefetch = (batch * 2).min(65_535);
    let file = bench::round_trip_pipeline(
        dir.path(),
        None,
        batch,
        &format!(r#"amqp: {{url: "{url}", queue: {input}, batch: {batch}, prefetch: {prefetch}}}"#),
        &format!(r#"amqp: {{url: "{url}", exchange: amq.direct, routing_key: {output}}}"#),
    );
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("ready", Duration::from_secs(60), |d| {
        d.readiness().0 == "ready"
    });
    let window = bench::Window::start(&daemon);
    rt.block_on(async {
        produce(url, &input, n).await;
        loop {
            let len = depth(&channel, &output).await;
            if len >= n {
                break;
            }
            assert!(
                window.elapsed() < Duration::from_secs(600),
                "only {len} of {n} arrived; log:\n{}",
                daemon.log()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let sample = window.finish(&daemon, n);
    let _ = rt.block_on(conn.close(200, "".into()));
    sample
}
