//! The SQS source and sink against a raw SQS loop, side by side in one run
//! (samples alternate A, B, A, B, ...; figures are medians), on moto's
//! server.
//!
//! `cargo bench -p sluice-tests --bench connect_sqs`; in the debug test
//! profile (`cargo test -p sluice-tests --bench connect_sqs`) it runs a
//! small N, to check that it works. `SLUICE_BENCH_N` sets N.
//!
//! - **A, raw loop**: one Rust task with the AWS SDK: `ReceiveMessage` of
//!   10 (long polling) from queue `in`, one `SendMessageBatch` of them to
//!   `out`, one `DeleteMessageBatch` from `in`; until N are sent.
//! - **B, sluice**: the real `sluice run` binary (embedded broker,
//!   durable): an SQS source -> `identity` stage (concurrency 2) -> SQS
//!   sink (concurrency 2, `batch: {max: 10}`); until N are in `out`.
//!
//! Both start timing when the producer starts sending N messages of 64 B
//! (batches of 10) to `in`, with the reader already waiting.
//!
//! moto bounds both sides: its SQS is a Python server that scans a
//! queue's messages on every call, so the figures say how much of moto's
//! pace Sluice keeps, not what SQS would do. The ratio is reported, not
//! targeted (issue 24).

#![allow(missing_docs)]

use sluice_tests::bench;
use std::time::{Duration, Instant};

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, QueueAttributeName, SendMessageBatchRequestEntry,
};
use sluice_harness::moto::MotoServer;
use sluice_tests::Daemon;

const SAMPLES: usize = 3;
const BATCH: usize = 10;

fn main() {
    let (n, samples) = bench::size(200, 2_000, SAMPLES);
    let rt = bench::runtime();
    sluice_harness::plugin("identity");
    let moto = MotoServer::start().expect("moto");
    let client = rt.block_on(client(&moto));
    bench::side_by_side(
        &[BATCH],
        samples,
        |_, run| rt.block_on(raw_loop(&client, n, run)),
        |_, run| through_sluice(&rt, &moto, &client, n, run),
        |batch| {
            format!(
                "sqs queue -> sqs queue on moto, {n} x 64 B, batch {batch}, messages/s: raw \
                 Receive+SendBatch+DeleteBatch loop | sluice source -> identity -> sink (embedded, \
                 durable)"
            )
        },
    );
}

async fn client(moto: &MotoServer) -> Client {
    let creds = aws_sdk_sqs::config::Credentials::new(
        sluice_harness::moto::ACCESS_KEY_ID,
        sluice_harness::moto::SECRET_ACCESS_KEY,
        None,
        None,
        "bench",
    );
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_sdk_sqs::config::Region::new(
            sluice_harness::moto::REGION,
        ))
        .credentials_provider(creds)
        .endpoint_url(moto.endpoint())
        .load()
        .await;
    Client::new(&config)
}

async fn create(client: &Client, name: &str) -> String {
    client
        .create_queue()
        .queue_name(name)
        .send()
        .await
        .expect("CreateQueue")
        .queue_url()
        .expect("a queue URL")
        .to_owned()
}

fn payload(i: usize) -> String {
    format!("{i:0>64}")
}

async fn produce(client: Client, url: String, n: usize) {
    for start in (0..n).step_by(BATCH) {
        let entries = (start..(start + BATCH).min(n))
            .map(|i| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(payload(i))
                    .build()
                    .expect("entry")
            })
            .collect();
        client
            .send_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries))
            .send()
            .await
            .expect("SendMessageBatch");
    }
}

/// A: the raw loop, in messages/s.
async fn raw_loop(client: &Client, n: usize, run: &str) -> f64 {
    let input = create(client, &format!("raw-in-{run}")).await;
    let output = create(client, &format!("raw-out-{run}")).await;
    let started = Instant::now();
    let producer = tokio::spawn(produce(client.clone(), input.clone(), n));
    let mut done = 0;
    while done < n {
        let got = client
            .receive_message()
            .queue_url(&input)
            .max_number_of_messages(BATCH as i32)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .send()
            .await
            .expect("ReceiveMessage");
        let messages = got.messages();
        if messages.is_empty() {
            continue;
        }
        let entries = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(m.body().unwrap_or("-"))
                    .build()
                    .expect("entry")
            })
            .collect();
        client
            .send_message_batch()
            .queue_url(&output)
            .set_entries(Some(entries))
            .send()
            .await
            .expect("SendMessageBatch");
        let deletes = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                    .build()
                    .expect("entry")
            })
            .collect();
        client
            .delete_message_batch()
            .queue_url(&input)
            .set_entries(Some(deletes))
            .send()
            .await
            .expect("DeleteMessageBatch");
        done += messages.len();
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    producer.await.expect("producer");
    rate
}

async fn depth(client: &Client, url: &str) -> usize {
    client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .ok()
        .and_then(|o| {
            o.attributes()?
                .get(&QueueAttributeName::ApproximateNumberOfMessages)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// B: through the real daemon, in messages/s.
fn through_sluice(
    rt: &tokio::runtime::Runtime,
    moto: &MotoServer,
    client: &Client,
    n: usize,
    run: &str,
) -> bench::Sample {
    let input = rt.block_on(create(client, &format!("in-{run}")));
    let output = rt.block_on(create(client, &format!("out-{run}")));
    let dir = tempfile::tempdir().expect("dir");
    let endpoint = moto.endpoint();
    let region = sluice_harness::moto::REGION;
    let file = bench::round_trip_pipeline(
        dir.path(),
        None,
        BATCH,
        &format!(
            r#"sqs: {{queue_url: "{input}", endpoint: "{endpoint}", region: {region}, wait_time: 1s}}"#
        ),
        &format!(r#"sqs: {{queue_url: "{output}", endpoint: "{endpoint}", region: {region}}}"#),
    );
    let daemon = Daemon::builder(&[&file], &dir.path().join("data"))
        .envs(moto.env())
        .start();
    let window = bench::Window::start(&daemon);
    rt.block_on(async {
        let producer = tokio::spawn(produce(client.clone(), input.clone(), n));
        loop {
            let len = depth(client, &output).await;
            if len >= n {
                break;
            }
            assert!(
                window.elapsed() < Duration::from_secs(900),
                "only {len} of {n} arrived; log:\n{}",
                daemon.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        producer.await.expect("producer");
    });
    window.finish(&daemon, n)
}
