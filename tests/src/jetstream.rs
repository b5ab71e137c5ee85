//! An outside observer of a pipeline on NATS JetStream: a plain async-nats
//! client, as any NATS user would have, that reads a topic's stream, counts
//! what a core subscription sees and reads a stage's consumer state, without
//! going through the daemon. Blocking, for `#[test]`s; it reconnects on its
//! own when a server restarts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull};
use futures_util::StreamExt;
use sluice::broker::nats::{durable_name, stream_name};

/// One output (or any message) as stored in a topic's stream.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Its stream sequence.
    pub seq: u64,
    /// `Nats-Msg-Id`.
    pub id: Option<String>,
    /// Every other header, first value of each.
    pub headers: BTreeMap<String, String>,
    /// The body.
    pub payload: Vec<u8>,
}

impl Stored {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// A stage's consumer, as the server counts it.
#[derive(Debug, Clone, Copy)]
pub struct ConsumerState {
    /// Every delivery so far, redeliveries included (`delivered.consumer_seq`).
    pub delivered: u64,
    /// Delivered, not yet acked.
    pub ack_pending: u64,
    /// Not yet delivered.
    pub pending: u64,
    /// Pull requests waiting at the server.
    pub waiting: u64,
}

/// What a core subscription saw: each `Nats-Msg-Id` and how often it was
/// published (the stream's duplicate window drops repeats, core
/// subscribers see every publish).
pub type Published = Arc<Mutex<BTreeMap<String, usize>>>;

/// The observer: its own runtime and client.
pub struct Watcher {
    rt: tokio::runtime::Runtime,
    client: async_nats::Client,
    js: jetstream::Context,
}

impl Watcher {
    /// Connects to `urls` (comma-separated `nats://host:port`), reconnecting
    /// forever after losses.
    pub fn connect(urls: &str) -> Watcher {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let addrs: Vec<async_nats::ServerAddr> = urls
            .split(',')
            .map(|u| u.parse().expect("a NATS URL"))
            .collect();
        let client = rt
            .block_on(
                async_nats::ConnectOptions::new()
                    .name("sluice-test-watcher")
                    .max_reconnects(None)
                    .request_timeout(Some(Duration::from_secs(5)))
                    .connect(addrs),
            )
            .expect("the watcher connects");
        let js = {
            // The context spawns its acker task: inside the runtime.
            let _guard = rt.enter();
            jetstream::new(client.clone())
        };
        Watcher { rt, client, js }
    }

    /// Counts every core message published on `subject` from now on, by
    /// `Nats-Msg-Id`. Flushed before it returns, so a publish made after
    /// this is seen.
    pub fn count_publishes(&self, subject: &str) -> Published {
        let seen: Published = Arc::default();
        let counter = seen.clone();
        let mut sub = self
            .rt
            .block_on(self.client.subscribe(subject.to_owned()))
            .expect("subscribe");
        self.rt
            .block_on(self.client.flush())
            .expect("flush the subscription");
        self.rt.spawn(async move {
            while let Some(message) = sub.next().await {
                let id = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Msg-Id"))
                    .map_or_else(|| "<no id>".to_owned(), |v| v.as_str().to_owned());
                let mut seen = counter.lock().unwrap_or_else(|e| e.into_inner());
                *seen.entry(id).or_insert(0) += 1;
            }
        });
        seen
    }

    /// How many messages `topic`'s stream stores, or `None` while the
    /// server cannot answer.
    pub fn depth(&self, topic: &str) -> Option<u64> {
        self.rt.block_on(async {
            let stream = self.js.get_stream(stream_name(topic)).await.ok()?;
            Some(stream.get_info().await.ok()?.state.messages)
        })
    }

    /// How many messages `topic`'s stream stores, asked until the server
    /// answers: right after a node loss or a restart a stream's info can
    /// fail for a while (a leader election), which is not a count of zero.
    pub fn answered_depth(&self, topic: &str) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(depth) = self.depth(topic) {
                return depth;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not report `{topic}`'s depth within 60s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The replicas `topic`'s stream is configured with.
    pub fn replicas(&self, topic: &str) -> Option<usize> {
        self.rt.block_on(async {
            let stream = self.js.get_stream(stream_name(topic)).await.ok()?;
            Some(stream.get_info().await.ok()?.config.num_replicas)
        })
    }

    /// The server's counts for the consumer of stage `<pipeline>.<stage>`
    /// on `topic`, or `None` while the server cannot answer.
    pub fn consumer(&self, topic: &str, consumer: &str) -> Option<ConsumerState> {
        self.consumer_info(topic, consumer)
            .map(|info| ConsumerState {
                delivered: info.delivered.consumer_sequence,
                ack_pending: info.num_ack_pending as u64,
                pending: info.num_pending,
                waiting: info.num_waiting as u64,
            })
    }

    /// The `server_name` of the node leading that consumer (on a cluster).
    pub fn consumer_leader(&self, topic: &str, consumer: &str) -> Option<String> {
        self.consumer_info(topic, consumer)?.cluster?.leader
    }

    fn consumer_info(&self, topic: &str, consumer: &str) -> Option<jetstream::consumer::Info> {
        self.rt.block_on(async {
            let stream = self.js.get_stream(stream_name(topic)).await.ok()?;
            let consumer: jetstream::consumer::Consumer<pull::Config> =
                stream.get_consumer(&durable_name(consumer)).await.ok()?;
            consumer.get_info().await.ok()
        })
    }

    /// Waits until `done` holds of the observed depth of `topic`; panics
    /// with `what` after `limit`.
    pub fn wait_depth(&self, topic: &str, what: &str, limit: Duration, done: impl Fn(u64) -> bool) {
        let started = Instant::now();
        loop {
            let depth = self.depth(topic);
            if depth.is_some_and(&done) {
                return;
            }
            assert!(
                started.elapsed() < limit,
                "timed out waiting for {what}: `{topic}` holds {depth:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every message `topic`'s stream stores now, oldest first, read with an
    /// ephemeral ordered consumer from the first message.
    pub fn read_all(&self, topic: &str) -> Vec<Stored> {
        self.rt.block_on(async {
            let stream = self
                .js
                .get_stream(stream_name(topic))
                .await
                .expect("the topic's stream");
            let state = stream.get_info().await.expect("stream info").state;
            let mut out = Vec::new();
            if state.messages == 0 {
                return out;
            }
            // Right after a node loss the consumer's creation can time out
            // while the stream elects a leader: ask again, within a bound.
            let deadline = Instant::now() + Duration::from_secs(60);
            let consumer = loop {
                match stream
                    .create_consumer(pull::OrderedConfig {
                        deliver_policy: DeliverPolicy::All,
                        filter_subject: topic.to_owned(),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(consumer) => break consumer,
                    Err(err) => {
                        assert!(
                            Instant::now() < deadline,
                            "no ordered consumer on `{topic}` within 60s: {err}"
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            };
            let mut messages = consumer.messages().await.expect("messages");
            while out.len() < usize::try_from(state.messages).expect("fits") {
                let next = tokio::time::timeout(Duration::from_secs(30), messages.next())
                    .await
                    .expect("the next stored message within 30 s")
                    .expect("the stream continues")
                    .expect("a message");
                let seq = next.info().expect("metadata").stream_sequence;
                let mut id = None;
                let mut headers = BTreeMap::new();
                for (name, values) in next.headers.iter().flat_map(|h| h.iter()) {
                    let name: &str = name.as_ref();
                    let value = values.first().map(|v| v.as_str().to_owned());
                    if name == "Nats-Msg-Id" {
                        id = value;
                    } else if let Some(value) = value {
                        headers.insert(name.to_owned(), value);
                    }
                }
                out.push(Stored {
                    seq,
                    id,
                    headers,
                    payload: next.payload.to_vec(),
                });
                if seq >= state.last_sequence {
                    break;
                }
            }
            out
        })
    }

    /// Publishes `(id, payload)` pairs to `subject` through JetStream with
    /// `Nats-Msg-Id`, pipelined, and waits for every ack.
    pub fn publish(&self, subject: &str, messages: &[(String, String)]) {
        self.rt.block_on(async {
            for chunk in messages.chunks(1000) {
                let mut acks = Vec::with_capacity(chunk.len());
                for (id, payload) in chunk {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert("Nats-Msg-Id", id.as_str());
                    acks.push(
                        self.js
                            .publish_with_headers(
                                subject.to_owned(),
                                headers,
                                payload.clone().into(),
                            )
                            .await
                            .expect("publish"),
                    );
                }
                for ack in acks {
                    ack.await.expect("a PubAck");
                }
            }
        });
    }
}
