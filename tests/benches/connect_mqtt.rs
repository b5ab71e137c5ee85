//! The MQTT source and sink against a raw MQTT loop, side by side in one
//! run (samples alternate A, B, A, B, ...; figures are medians), on one
//! private mosquitto.
//!
//! `cargo bench -p sluice-tests --bench connect_mqtt`; in the debug test
//! profile (`cargo test -p sluice-tests --bench connect_mqtt`) it runs a
//! small N, to check that it works. `SLUICE_BENCH_N` sets N.
//!
//! - **A, raw loop**: one rumqttc (MQTT 5) client with manual acks in a
//!   persistent session, pipelined: publishes each message received from
//!   `raw-in` to `raw-out` at QoS 1 as it comes (at most b awaiting their
//!   PUBACK), and acks each input when its forward's PUBACK comes; until
//!   N are done.
//! - **B, sluice**: the real `sluice run` binary (embedded broker, durable,
//!   default sync): an MQTT source (`batch: b`) -> `identity` stage
//!   (concurrency 2) -> MQTT sink (concurrency 2, `batch: {max: b}`).
//!
//! Each for a batch size b of 100 and of 1,000. Both start timing when a
//! producer (a rumqttc client, QoS 1, up to 1,000 in flight) starts
//! publishing N messages of 64 B, with the reader's session already
//! there; both stop when a counting subscriber of the output topic has N.
//! Target: B >= 0.7 x A (messages/s).

#![allow(missing_docs)]

use sluice_tests::bench;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use sluice_harness::mosquitto::Mosquitto;
use sluice_tests::Daemon;

const SAMPLES: usize = 5;
const CASES: [usize; 2] = [100, 1000];
const LIMIT: Duration = Duration::from_secs(600);

fn main() {
    let (n, samples) = bench::size(2_000, 20_000, SAMPLES);
    let rt = bench::runtime();
    sluice_harness::plugin("identity");
    let broker = Mosquitto::start().expect("mosquitto");
    let port = broker.port();
    bench::side_by_side(
        &CASES,
        samples,
        |batch, run| rt.block_on(raw_loop(port, n, batch, run)),
        |batch, run| through_sluice(&rt, &broker, n, batch, run),
        |batch| {
            format!(
                "mqtt -> mqtt (mosquitto, MQTT 5, QoS 1), {n} x 64 B, batch {batch}, messages/s: raw receive+publish+PUBACK loop | sluice source -> identity -> sink (embedded, durable)"
            )
        },
    );
}

fn options(id: &str, port: u16, persistent: bool) -> MqttOptions {
    let mut o = MqttOptions::new(id, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(Some(1 << 20))
        .set_request_channel_capacity(4096)
        .set_outgoing_inflight_upper_limit(1000);
    if persistent {
        o.set_clean_start(false)
            .set_session_expiry_interval(Some(3600))
            .set_manual_acks(true)
            .set_receive_maximum(Some(1000));
    }
    o
}

/// Polls until the first SUBACK.
async fn wait_suback(el: &mut EventLoop) {
    loop {
        if let Event::Incoming(Packet::SubAck(_)) = el.poll().await.expect("connect") {
            return;
        }
    }
}

/// A persistent session for `id`, subscribed to `topic`, as if that
/// client had run before.
async fn prime(port: u16, id: &str, topic: &str) {
    let (client, mut el) = AsyncClient::new(options(id, port, true), 16);
    client
        .subscribe(topic, QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    wait_suback(&mut el).await;
    let _ = client.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while el.poll().await.is_ok() {}
    })
    .await;
}

/// Counts the messages on `topic`, from now on.
async fn counter(port: u16, id: &str, topic: &str) -> Arc<AtomicUsize> {
    let count = Arc::new(AtomicUsize::new(0));
    let (client, mut el) = AsyncClient::new(options(id, port, false), 16);
    client
        .subscribe(topic, QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    wait_suback(&mut el).await;
    let seen = count.clone();
    tokio::spawn(async move {
        let _client = client;
        while let Ok(event) = el.poll().await {
            if let Event::Incoming(Packet::Publish(_)) = event {
                seen.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    count
}

/// Publishes `n` messages of 64 B to `topic` at QoS 1; returns when every
/// PUBACK came.
async fn produce(port: u16, id: String, topic: String, n: usize) {
    let (client, mut el) = AsyncClient::new(options(&id, port, false), 4096);
    let sender = tokio::spawn(async move {
        for i in 0..n {
            client
                .publish(&topic, QoS::AtLeastOnce, false, format!("{i:0>64}"))
                .await
                .expect("publish");
        }
        client
    });
    let mut acked = 0;
    while acked < n {
        if let Event::Incoming(Packet::PubAck(_)) = el.poll().await.expect("producer") {
            acked += 1;
        }
    }
    drop(sender.await);
}

/// Waits for `count` to reach `n`, `elapsed` being the time so far.
async fn wait_count(count: &AtomicUsize, n: usize, elapsed: impl Fn() -> Duration) {
    while count.load(Ordering::Relaxed) < n {
        assert!(elapsed() < LIMIT, "only {count:?} of {n} arrived");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A: the raw loop, in messages/s.
async fn raw_loop(port: u16, n: usize, batch: usize, run: &str) -> f64 {
    let (input, output) = (format!("raw-in/{run}"), format!("raw-out/{run}"));
    let id = format!("raw-{run}");
    prime(port, &id, &input).await;
    let count = counter(port, &format!("raw-count-{run}"), &output).await;
    let (client, mut el) = AsyncClient::new(options(&id, port, true), 4096);
    let started = Instant::now();
    let producer = tokio::spawn(produce(port, format!("raw-prod-{run}"), input, n));
    // Forwarded but not yet acknowledged downstream, in publish order:
    // mosquitto answers QoS 1 publishes of one connection in order, so
    // each PUBACK acks the oldest, whose input is then acked.
    let mut received: VecDeque<Publish> = VecDeque::new();
    let mut in_flight: VecDeque<Publish> = VecDeque::new();
    let mut done = 0usize;
    while done < n {
        match el.poll().await.expect("raw loop") {
            Event::Incoming(Packet::Publish(p)) => received.push_back(p),
            Event::Incoming(Packet::PubAck(_)) => {
                let p = in_flight.pop_front().expect("a PUBACK for a forward");
                client.try_ack(&p).expect("ack");
                done += 1;
            }
            _ => {}
        }
        while in_flight.len() < batch
            && let Some(p) = received.pop_front()
        {
            client
                .try_publish(&output, QoS::AtLeastOnce, false, p.payload.clone())
                .expect("publish");
            in_flight.push_back(p);
        }
    }
    wait_count(&count, n, || started.elapsed()).await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    producer.await.expect("producer");
    rate
}

/// B: through the real daemon, in messages/s.
fn through_sluice(
    rt: &tokio::runtime::Runtime,
    broker: &Mosquitto,
    n: usize,
    batch: usize,
    run: &str,
) -> bench::Sample {
    let (input, output) = (format!("in/{run}"), format!("out/{run}"));
    let client_id = format!("bench-src-{run}");
    let dir = tempfile::tempdir().expect("dir");
    let url = broker.url();
    let file = bench::round_trip_pipeline(
        dir.path(),
        None,
        batch,
        &format!(
            r#"mqtt: {{url: "{url}", topic: "{input}", client_id: {client_id}, batch: {batch}}}"#
        ),
        &format!(r#"mqtt: {{url: "{url}", topic: "{output}", inflight: 1000}}"#),
    );
    let port = broker.port();
    rt.block_on(prime(port, &client_id, &input));
    let count = rt.block_on(counter(port, &format!("count-{run}"), &output));
    let daemon = Daemon::start(&[&file], &dir.path().join("data"));
    daemon.wait_until("the source connected", LIMIT, |d| {
        d.readiness().0 == "ready"
    });
    let window = bench::Window::start(&daemon);
    rt.block_on(async {
        produce(port, format!("prod-{run}"), input, n).await;
        wait_count(&count, n, || window.elapsed()).await;
    });
    window.finish(&daemon, n)
}
