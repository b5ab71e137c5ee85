//! The MQTT source: a QoS 1 subscription in a persistent session.
//!
//! - **Session.** Clean start off, a stable client id, and (MQTT 5) a
//!   Session Expiry Interval above 0, so the broker keeps the
//!   subscription and queues the messages published while the daemon is
//!   down. The filter is subscribed to on the first connection of the
//!   process and whenever the broker says the session is gone.
//! - **The event loop** runs in its own task, polled without pause. Each
//!   message is tagged with its connection's number and passed on through
//!   a bounded channel; the broker sends at most Receive Maximum messages
//!   before their PUBACK, so the channel never holds more.
//! - **Acks.** PUBACKs are manual: [`Source::ack`] queues those of the
//!   oldest read, in receive order, only after the runner made the read
//!   durable (never waiting for room in rumqttc's queue: what does not fit
//!   is queued at the next call, in order), and only when the read came on
//!   the connection that is open now (under the mutex the event loop takes when a connection ends, so
//!   no PUBACK ever crosses to the next connection). Messages of an
//!   earlier connection are not acked: the broker sends them again on the
//!   resumed session. Those not yet read are dropped here, waiting for that
//!   resend.
//! - **Ids.** MQTT messages have no id: each gets a new UUID v7, unless it
//!   carries a `sluice-id` user property (it came from a Sluice sink),
//!   which is kept. A message the broker sends again on a resumed session
//!   comes under its old packet id with the DUP flag: when this process
//!   read it on an earlier connection (the same packet id, topic and
//!   payload) it gets the id it had then, so it collapses in the topic's
//!   duplicate window. After a crash that memory is gone: the message gets
//!   a new id, and can be a duplicate downstream.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::config::{MqttSourceConfig, Version};
use super::{
    Client, Ev, Link, QueueError, RETRY_MAX, RETRY_MIN, Received, SLUICE_ID, Settings,
    TOPIC_HEADER, default_client_id, scrub,
};
use crate::connect::{Capabilities, Context, Source, SourceError, SourceMessage};

/// The channel's room for MQTT 3.1.1, where the broker decides how many
/// messages it sends before their PUBACK (mosquitto: 20 by default).
const V311_CHANNEL: usize = 1000;

/// What the event loop task and the source share.
#[derive(Debug, Default)]
struct State {
    /// The number of the current connection (counted at each CONNACK).
    connection: u64,
    /// Whether that connection is open.
    connected: bool,
    /// Why the source cannot read now (the connection failed, the
    /// subscription was refused), scrubbed.
    down: Option<String>,
    /// Messages of earlier connections dropped unread (sent again by the
    /// broker).
    stale: u64,
}

/// An MQTT subscription, read through a persistent session.
pub struct MqttSource {
    state: Arc<Mutex<State>>,
    client: Client,
    messages: mpsc::Receiver<(u64, Received)>,
    task: JoinHandle<()>,
    /// Per read not yet acked, oldest first: its messages' connection and
    /// packet ids, in receive order.
    unacked: VecDeque<Vec<(u64, u16)>>,
    /// Messages read and not acknowledged, by packet id: the id each got,
    /// for the broker's resend of it on a later connection.
    given: HashMap<u16, Given>,
    key_property: String,
    /// A message taken from the channel by a read that was full.
    held: Option<(u64, Received)>,
    /// PUBACKs due (their reads are durable) and not yet queued, in
    /// receive order: rumqttc's queue was full. Queued at the next read
    /// or ack; never waited for, since the event loop may itself be
    /// waiting for a read to take what it received.
    owed: VecDeque<(u64, u16)>,
}

impl Drop for MqttSource {
    fn drop(&mut self) {
        // The connection ends; the broker keeps the session, and sends
        // what was not acked again on the next one.
        self.task.abort();
    }
}

impl MqttSource {
    /// The source of `config`, its event loop started (it connects at
    /// once, and keeps reconnecting).
    pub(crate) fn new(config: &MqttSourceConfig, ctx: &Context) -> Result<Self, String> {
        let receive_maximum = match config.connection.version {
            Version::V5 => Some(config.receive_maximum),
            Version::V311 => None,
        };
        let channel = receive_maximum.map_or(V311_CHANNEL, usize::from) + 16;
        let settings = Settings {
            connection: config.connection.clone(),
            client_id: config
                .client_id
                .clone()
                .unwrap_or_else(|| default_client_id(&ctx.pipeline, &ctx.name)),
            session: Some(config.session_expiry.get()),
            receive_maximum,
            inflight: 10,
            // Room for every PUBACK the broker may be owed at once, so
            // queueing one never waits.
            requests: channel + 64,
        };
        let (client, link) = Link::new(&settings, config.tls.files())?;
        let state = Arc::new(Mutex::new(State::default()));
        let (tx, rx) = mpsc::channel(channel);
        tracing::debug!(source = %ctx.label(), client_id = %settings.client_id, "mqtt session");
        let task = tokio::spawn(drive(
            link,
            client.clone(),
            state.clone(),
            tx,
            settings,
            config.topic.clone(),
            ctx.label(),
        ));
        Ok(MqttSource {
            state,
            client,
            messages: rx,
            task,
            unacked: VecDeque::new(),
            key_property: config.key_property.clone(),
            held: None,
            owed: VecDeque::new(),
            given: HashMap::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues the PUBACKs owed, oldest first, as far as rumqttc's queue
    /// takes them; those of a connection that ended are dropped (the
    /// broker sends their messages again).
    fn flush_acks(&mut self) -> Result<(), SourceError> {
        let mut skipped = 0;
        while let Some(&(connection, pkid)) = self.owed.front() {
            let result = {
                let st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                if !st.connected || st.connection != connection {
                    None
                } else {
                    Some(self.client.try_ack(pkid))
                }
            };
            match result {
                None => skipped += 1,
                Some(Ok(())) => {
                    if self
                        .given
                        .get(&pkid)
                        .is_some_and(|g| g.connection == connection)
                    {
                        self.given.remove(&pkid);
                    }
                }
                Some(Err(QueueError::Full)) => break,
                Some(Err(QueueError::Closed)) => {
                    return Err(SourceError::Unavailable(
                        "the MQTT event loop stopped".into(),
                    ));
                }
            }
            self.owed.pop_front();
        }
        if skipped > 0 {
            tracing::debug!(
                count = skipped,
                "not acknowledged: read on a connection that ended (the broker sends them again)"
            );
        }
        Ok(())
    }

    /// Takes what waits in the channel (up to `max`), dropping messages of
    /// connections that ended.
    fn take(&mut self, max: usize, out: &mut Vec<(u64, Received)>) {
        let current = self.lock().connection;
        let mut stale = 0;
        while out.len() < max {
            let next = match self.held.take() {
                Some(next) => next,
                None => match self.messages.try_recv() {
                    Ok(next) => next,
                    Err(_) => break,
                },
            };
            if next.0 == current {
                out.push(next);
            } else {
                stale += 1;
            }
        }
        if stale > 0 {
            self.lock().stale += stale;
            tracing::debug!(
                count = stale,
                "dropped messages of an ended connection; the broker sends them again"
            );
        }
    }
}

/// Polls the event loop until the source is dropped.
async fn drive(
    mut link: Link,
    client: Client,
    state: Arc<Mutex<State>>,
    tx: mpsc::Sender<(u64, Received)>,
    settings: Settings,
    filter: String,
    label: String,
) {
    let mut first = true;
    let mut pause = RETRY_MIN;
    loop {
        match link.poll().await {
            Ok(Ev::Connected {
                session_present, ..
            }) => {
                {
                    let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
                    st.connection += 1;
                    st.connected = true;
                    st.down = None;
                }
                pause = RETRY_MIN;
                if !session_present && !first {
                    tracing::warn!(source = %label, "the broker no longer had this client's session (it expired, or the broker lost it): subscribing again; messages published meanwhile were not kept for it");
                }
                if first || !session_present {
                    // Room is certain: the channel was drained with the
                    // connection, and only acks of this one use it.
                    if let Err(QueueError::Closed) = client.try_subscribe(&filter) {
                        return;
                    }
                }
                first = false;
            }
            Ok(Ev::Message(message)) => {
                let connection = state
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .connection;
                // Full only when the runner stops reading (the topic at
                // its high-water mark) and the broker sends past Receive
                // Maximum (mosquitto keeps the one of the session's first
                // connection): waiting holds the broker back (TCP
                // backpressure), so memory stays bounded. Acks never wait
                // for this task, so the wait always ends.
                if tx.send((connection, message)).await.is_err() {
                    return;
                }
            }
            Ok(Ev::Subscribed(Some(why))) => {
                let why = scrub(&settings, &format!("mqtt topic `{filter}`: {why}"));
                tracing::warn!(source = %label, error = %why, "subscription refused; trying again in 5s");
                state.lock().unwrap_or_else(PoisonError::into_inner).down = Some(why);
                let client = client.clone();
                let filter = filter.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(RETRY_MAX).await;
                    let _ = client.try_subscribe(&filter);
                });
            }
            Ok(Ev::Subscribed(None)) => {
                let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
                if st.connected {
                    st.down = None;
                }
            }
            Ok(_) => {}
            Err(e) => {
                let why = scrub(
                    &settings,
                    &format!("mqtt broker at {}: {e}", settings.connection.url.redacted()),
                );
                {
                    // Under the lock acks are queued with: none queued for
                    // this connection stays behind for the next.
                    let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
                    link.clean();
                    st.connected = false;
                    st.down = Some(why);
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
    }
}

#[async_trait]
impl Source for MqttSource {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            per_message_ack: true,
            // QoS 1 messages of a topic arrive in the order they were
            // published, and PUBACKs must go back in that order.
            ordered_by_key: true,
            ..Capabilities::default()
        }
    }

    async fn read(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        let max = max.max(1);
        self.flush_acks()?;
        let mut got = Vec::new();
        self.take(max, &mut got);
        if got.is_empty() {
            let down = self.lock().down.clone();
            if let Some(why) = down {
                return Err(SourceError::Unavailable(why));
            }
            // With PUBACKs still owed, come back soon to queue them.
            let wait = if self.owed.is_empty() {
                wait
            } else {
                wait.min(Duration::from_millis(5))
            };
            if !wait.is_zero()
                && let Ok(Some(next)) = tokio::time::timeout(wait, self.messages.recv()).await
            {
                self.held = Some(next);
                self.take(max, &mut got);
            }
        }
        if got.is_empty() {
            return Ok(Vec::new());
        }
        self.unacked
            .push_back(got.iter().map(|(c, m)| (*c, m.pkid)).collect());
        let mut out = Vec::with_capacity(got.len());
        for (connection, m) in got {
            let pkid = m.pkid;
            let fingerprint = fingerprint(&m);
            let again = m.dup
                && self
                    .given
                    .get(&pkid)
                    .is_some_and(|g| g.connection < connection && g.fingerprint == fingerprint);
            let mut message = to_message(m, &self.key_property);
            if again && let Some(g) = self.given.get(&pkid) {
                message.upstream_id.clone_from(&g.id);
            }
            self.given.insert(
                pkid,
                Given {
                    connection,
                    fingerprint,
                    id: message.upstream_id.clone(),
                },
            );
            out.push(message);
        }
        Ok(out)
    }

    async fn ack(&mut self) -> Result<(), SourceError> {
        if let Some(read) = self.unacked.pop_front() {
            self.owed.extend(read);
        }
        self.flush_acks()
    }

    async fn release(&mut self) {
        // Unacked messages are sent again by the broker on the next
        // connection of the session.
        self.unacked.clear();
        let _ = self.flush_acks();
    }
}

/// The id a message read and not acknowledged was given.
#[derive(Debug)]
struct Given {
    connection: u64,
    fingerprint: u64,
    id: String,
}

/// The topic and payload of `m`, hashed: what a resend must match.
fn fingerprint(m: &Received) -> u64 {
    let mut bytes = Vec::with_capacity(m.topic.len() + 1 + m.payload.len());
    bytes.extend_from_slice(m.topic.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&m.payload);
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// A message as a Sluice message: the topic as the `mqtt-topic` header,
/// each user property as a header, but `sluice-id` (the upstream id) and
/// the key property (the key).
pub(crate) fn to_message(m: Received, key_property: &str) -> SourceMessage {
    let mut id = None;
    let mut key = None;
    let mut headers = Vec::with_capacity(m.properties.len() + 1);
    headers.push((TOPIC_HEADER.to_owned(), m.topic));
    for (name, value) in m.properties {
        if name == SLUICE_ID && id.is_none() && !value.is_empty() {
            id = Some(value);
        } else if name == key_property && key.is_none() {
            key = Some(value);
        } else {
            headers.push((name, value));
        }
    }
    SourceMessage {
        upstream_id: id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string()),
        key,
        headers,
        payload: m.payload,
        problem: m.problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(properties: &[(&str, &str)]) -> Received {
        Received {
            pkid: 7,
            dup: false,
            topic: "in/a".into(),
            payload: bytes::Bytes::from_static(b"hello"),
            properties: properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            problem: None,
        }
    }

    #[test]
    fn properties_become_headers_key_and_id() {
        let m = to_message(
            received(&[("trace", "t1"), ("sluice-key", "k1"), ("sluice-id", "up:1")]),
            "sluice-key",
        );
        assert_eq!(m.upstream_id, "up:1");
        assert_eq!(m.key.as_deref(), Some("k1"));
        assert_eq!(
            m.headers,
            vec![
                ("mqtt-topic".to_owned(), "in/a".to_owned()),
                ("trace".to_owned(), "t1".to_owned())
            ]
        );
        assert_eq!(&m.payload[..], b"hello");
    }

    #[test]
    fn a_message_without_id_gets_a_fresh_one() {
        let a = to_message(received(&[]), "sluice-key");
        let b = to_message(received(&[]), "sluice-key");
        assert_ne!(a.upstream_id, b.upstream_id);
        assert!(uuid::Uuid::parse_str(&a.upstream_id).is_ok());
        assert_eq!(a.key, None);
    }
}
