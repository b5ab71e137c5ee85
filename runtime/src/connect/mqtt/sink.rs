//! The MQTT sink: each message a QoS 1 publish, the write done when the
//! broker's PUBACK for it arrives.
//!
//! rumqttc's `publish` only queues a request; the packet id comes later,
//! as an `Outgoing::Publish(pkid)` event, in the order publishes were
//! queued. So a write queues its publish and a waiter in one step, under
//! the mutex the event loop task also takes; the task gives each packet id
//! written to the next waiter in that order, and completes the waiter when
//! the PUBACK of its id comes (MQTT 5: with the reason code, which may
//! refuse the message). When the connection ends, the task drains
//! rumqttc's queue and fails every waiter as `unavailable` under the same
//! mutex, so waiters and packets never fall out of step; the engine holds
//! those messages and writes them again (the sink keeps no session, so
//! rumqttc sends nothing of the old connection again by itself).
//!
//! Headers (MQTT 5): every header becomes a user property, then
//! `sluice-id` (the message id) and the key property (the key). MQTT
//! 3.1.1 has no properties: only the payload travels.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::JoinHandle;

use super::config::{MqttSinkConfig, Version};
use super::topic::TopicTemplate;
use super::{
    Client, Ev, Link, QueueError, RETRY_MAX, RETRY_MIN, Refusal, SLUICE_ID, Settings,
    default_client_id, scrub,
};
use crate::connect::{Context, Sink, SinkError};
use crate::plugin::Message;

/// How long a write waits for the first connection before it reports the
/// broker unreachable.
const FIRST_CONNECT: Duration = Duration::from_secs(5);
/// What a publish's framing adds to its topic, payload and properties, at
/// most (fixed header, lengths, packet id, property ids).
const FRAMING: usize = 32;

type Done = oneshot::Sender<Result<(), SinkError>>;

/// One publish waiting for its PUBACK, holding one of the sink's
/// in-flight slots.
struct Waiter {
    done: Done,
    _slot: OwnedSemaphorePermit,
}

/// What the event loop task and the writers share.
#[derive(Default)]
struct State {
    connected: bool,
    /// Whether a connection was ever tried and failed, with why.
    down: Option<String>,
    /// Queued publishes not yet given a packet id, in queue order.
    queued: VecDeque<Waiter>,
    /// Written publishes by packet id (a second one only after an
    /// out-of-order ack made rumqttc wait for the id).
    written: HashMap<u16, VecDeque<Waiter>>,
    /// A packet id a collided publish waits for, and then the id whose
    /// next `Sent` is that publish being written (already given its id).
    collided: Option<u16>,
    resend: Option<u16>,
    /// The broker's Maximum Packet Size (MQTT 5).
    max_packet: Option<u32>,
}

impl State {
    /// Fails every waiter: the connection ended.
    fn fail_all(&mut self, why: &str) {
        let err = || SinkError::Unavailable(why.to_owned());
        for waiter in self.queued.drain(..) {
            let _ = waiter.done.send(Err(err()));
        }
        for (_, waiters) in self.written.drain() {
            for waiter in waiters {
                let _ = waiter.done.send(Err(err()));
            }
        }
        self.collided = None;
        self.resend = None;
    }
}

/// Publishes messages to an MQTT topic.
pub struct MqttSink {
    state: Arc<Mutex<State>>,
    client: Client,
    slots: Arc<Semaphore>,
    task: JoinHandle<()>,
    topic: TopicTemplate,
    retain: bool,
    version: Version,
    key_property: String,
    /// `mqtt topic <t> at <url>`, for errors.
    label: String,
}

impl Drop for MqttSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MqttSink {
    /// The sink of `config`, its event loop started.
    pub(crate) fn new(config: &MqttSinkConfig, ctx: &Context) -> Result<Self, String> {
        let topic = TopicTemplate::parse(&config.topic)?;
        let inflight = config.inflight.max(1);
        let settings = Settings {
            connection: config.connection.clone(),
            client_id: config.client_id.clone().unwrap_or_else(|| {
                let unique = uuid::Uuid::now_v7().simple().to_string();
                format!(
                    "{}-{}",
                    default_client_id(&ctx.pipeline, &ctx.name),
                    &unique[unique.len() - 8..]
                )
            }),
            session: None,
            receive_maximum: None,
            inflight,
            // Every slot's publish fits, so queueing never waits.
            requests: usize::from(inflight) + 16,
        };
        let (client, link) = Link::new(&settings, config.tls.files())?;
        let state = Arc::new(Mutex::new(State::default()));
        let label = format!("mqtt topic `{}` at {}", config.topic, config.connection.url);
        let task = tokio::spawn(drive(link, state.clone(), settings, ctx.label()));
        Ok(MqttSink {
            state,
            client,
            slots: Arc::new(Semaphore::new(usize::from(inflight))),
            task,
            topic,
            retain: config.retain,
            version: config.connection.version,
            key_property: config.key_property.clone(),
            label,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The topic, payload and properties of `message`, or why it can
    /// never be published.
    fn prepare(&self, message: &Message) -> Result<Prepared, SinkError> {
        let topic = self
            .topic
            .render(message.key.as_deref())
            .map_err(|why| SinkError::Rejected(format!("{}: {why}", self.label)))?;
        let properties = match self.version {
            Version::V311 => Vec::new(),
            Version::V5 => {
                let mut props: Vec<(String, String)> = message
                    .headers
                    .iter()
                    .filter(|(name, _)| name != SLUICE_ID && *name != self.key_property)
                    .cloned()
                    .collect();
                props.push((SLUICE_ID.to_owned(), message.id.clone()));
                if let Some(key) = &message.key {
                    props.push((self.key_property.clone(), key.clone()));
                }
                props
            }
        };
        let size = FRAMING
            + topic.len()
            + message.payload.len()
            + properties
                .iter()
                .map(|(k, v)| k.len() + v.len() + 5)
                .sum::<usize>();
        let max = self.lock().max_packet.unwrap_or(super::MAX_PACKET);
        if size > usize::try_from(max).unwrap_or(usize::MAX) {
            return Err(SinkError::Rejected(format!(
                "{}: the message would be a packet of about {size} bytes, more than the \
                 broker's maximum of {max}",
                self.label
            )));
        }
        Ok(Prepared {
            topic,
            payload: Bytes::copy_from_slice(&message.payload),
            properties,
        })
    }

    /// Waits (a little, at start-up) for a connection; the reason it is
    /// down otherwise.
    async fn connected(&self) -> Result<(), SinkError> {
        let started = Instant::now();
        loop {
            {
                let st = self.lock();
                if st.connected {
                    return Ok(());
                }
                if let Some(why) = &st.down {
                    return Err(SinkError::Unavailable(why.clone()));
                }
            }
            if started.elapsed() > FIRST_CONNECT {
                return Err(SinkError::Unavailable(format!(
                    "{}: not connected yet",
                    self.label
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Queues one publish; its PUBACK (or failure) comes on the receiver.
    async fn queue(&self, prepared: Prepared) -> Pending {
        let slot = match self.slots.clone().acquire_owned().await {
            Ok(slot) => slot,
            Err(_) => {
                return Pending::Done(Err(SinkError::Unavailable("the sink is closing".into())));
            }
        };
        let (done, result) = oneshot::channel();
        let mut st = self.lock();
        if !st.connected {
            let why = st
                .down
                .clone()
                .unwrap_or_else(|| format!("{}: not connected", self.label));
            return Pending::Done(Err(SinkError::Unavailable(why)));
        }
        match self.client.try_publish(
            prepared.topic,
            prepared.payload,
            self.retain,
            prepared.properties,
        ) {
            Ok(()) => {
                st.queued.push_back(Waiter { done, _slot: slot });
                Pending::Waiting(result)
            }
            Err(QueueError::Full) => Pending::Done(Err(SinkError::Retry {
                reason: format!("{}: the client's queue is full", self.label),
                after: None,
            })),
            Err(QueueError::Closed) => Pending::Done(Err(SinkError::Unavailable(format!(
                "{}: the MQTT event loop stopped",
                self.label
            )))),
        }
    }
}

struct Prepared {
    topic: String,
    payload: Bytes,
    properties: Vec<(String, String)>,
}

enum Pending {
    Done(Result<(), SinkError>),
    Waiting(oneshot::Receiver<Result<(), SinkError>>),
}

impl Pending {
    async fn outcome(self, label: &str) -> Result<(), SinkError> {
        match self {
            Pending::Done(result) => result,
            Pending::Waiting(rx) => rx.await.unwrap_or_else(|_| {
                Err(SinkError::Unavailable(format!(
                    "{label}: the connection ended before the PUBACK"
                )))
            }),
        }
    }
}

/// Polls the event loop until the sink is dropped.
async fn drive(mut link: Link, state: Arc<Mutex<State>>, settings: Settings, label: String) {
    let mut pause = RETRY_MIN;
    loop {
        match link.poll().await {
            Ok(Ev::Connected { max_packet, .. }) => {
                let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
                st.connected = true;
                st.down = None;
                st.max_packet = max_packet;
                pause = RETRY_MIN;
            }
            Ok(Ev::Sent(pkid)) => {
                let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
                if st.resend == Some(pkid) {
                    // The collided publish, written now: it has its id.
                    st.resend = None;
                } else if let Some(waiter) = st.queued.pop_front() {
                    st.written.entry(pkid).or_default().push_back(waiter);
                }
            }
            Ok(Ev::Collided(pkid)) => {
                let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(waiter) = st.queued.pop_front() {
                    st.written.entry(pkid).or_default().push_back(waiter);
                }
                st.collided = Some(pkid);
            }
            Ok(Ev::Acked { pkid, refused }) => {
                let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
                let waiter = st.written.get_mut(&pkid).and_then(VecDeque::pop_front);
                if st.written.get(&pkid).is_some_and(VecDeque::is_empty) {
                    st.written.remove(&pkid);
                }
                if st.collided == Some(pkid) {
                    st.collided = None;
                    if refused.is_none() {
                        st.resend = Some(pkid);
                    }
                }
                drop(st);
                if let Some(waiter) = waiter {
                    let result = match refused {
                        None => Ok(()),
                        Some(Refusal::Permanent(why)) => Err(SinkError::Rejected(why)),
                        Some(Refusal::Transient(why)) => Err(SinkError::Retry {
                            reason: why,
                            after: None,
                        }),
                    };
                    let _ = waiter.done.send(result);
                }
            }
            Ok(_) => {}
            Err(e) => {
                let why = scrub(
                    &settings,
                    &format!("mqtt broker at {}: {e}", settings.connection.url.redacted()),
                );
                {
                    let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
                    // Under the lock publishes are queued with: what is
                    // still in rumqttc's queue is drained with the waiters
                    // failed, so the two stay in step.
                    link.clean();
                    st.connected = false;
                    st.fail_all(&why);
                    st.down = Some(why);
                }
                tracing::debug!(sink = %label, "mqtt connection ended; reconnecting");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
    }
}

#[async_trait]
impl Sink for MqttSink {
    async fn write(&self, message: &Message) -> Result<(), SinkError> {
        self.write_batch(std::slice::from_ref(message))
            .await
            .pop()
            .unwrap_or(Err(SinkError::Retry {
                reason: "no result".into(),
                after: None,
            }))
    }

    async fn write_batch(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        if let Err(e) = self.connected().await {
            // A message that can never be published is refused even now.
            return messages
                .iter()
                .map(|m| match self.prepare(m) {
                    Err(refused @ SinkError::Rejected(_)) => Err(refused),
                    _ => Err(e.clone()),
                })
                .collect();
        }
        // Queue all (pipelined), then wait for each PUBACK.
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            pending.push(match self.prepare(message) {
                Ok(prepared) => self.queue(prepared).await,
                Err(refused) => Pending::Done(Err(refused)),
            });
        }
        let mut results = Vec::with_capacity(messages.len());
        for p in pending {
            results.push(p.outcome(&self.label).await);
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_all_answers_every_waiter() {
        let slots = Arc::new(Semaphore::new(4));
        let mut st = State::default();
        let mut receivers = Vec::new();
        for pkid in [0u16, 1, 2] {
            let (done, rx) = oneshot::channel();
            let waiter = Waiter {
                done,
                _slot: slots.clone().try_acquire_owned().expect("a slot"),
            };
            if pkid == 0 {
                st.queued.push_back(waiter);
            } else {
                st.written.entry(pkid).or_default().push_back(waiter);
            }
            receivers.push(rx);
        }
        assert_eq!(slots.available_permits(), 1);
        st.fail_all("gone");
        for mut rx in receivers {
            assert!(matches!(rx.try_recv(), Ok(Err(SinkError::Unavailable(_)))));
        }
        assert_eq!(slots.available_permits(), 4, "every slot is free again");
    }
}
