//! MQTT: a source (a QoS 1 subscription in a persistent session, each
//! PUBACK sent only after the durable publish, in receive order) and a
//! sink (QoS 1 publishes, each write done at its PUBACK).
//!
//! Both use rumqttc, MQTT 5 ([`rumqttc::v5`]) by default and 3.1.1 (the
//! crate's top level) on request. rumqttc is driven by polling its event
//! loop; here each source and sink owns one task that polls it without
//! pause (pings, reconnects, incoming packets) and shares what it learns
//! through a small state behind a mutex. [`Link`] and [`Client`] hide the
//! two protocol versions behind one shape.
//!
//! Connections: an error ends the connection; the task notes it (the
//! connector is down, with the scrubbed reason), waits with backoff, and
//! polls again, which reconnects. Every request queued in rumqttc's
//! channel when the connection ended is drained under the same mutex
//! ([`Link::clean`]), so nothing meant for one connection is sent on the
//! next: a PUBACK for a message of an old connection would acknowledge
//! whatever the broker sent under that packet id on the new one.

mod config;
mod sink;
mod source;
pub use crate::config::connectors::mqtt_topic as topic;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5;
use rumqttc::v5::mqttbytes::v5 as p5;

pub use crate::config::connectors::mqtt::{
    MqttConnection, MqttSinkConfig, MqttSourceConfig, Version,
};
pub use sink::MqttSink;
pub use source::MqttSource;

use crate::connect::tls::{self, TlsFiles};

pub use crate::config::connectors::mqtt::SLUICE_ID;
/// The header a source gives each message: the MQTT topic it came on.
pub const TOPIC_HEADER: &str = "mqtt-topic";

/// The largest packet MQTT can frame (the Maximum Packet Size the client
/// announces, so the broker never drops a message as too large for it).
const MAX_PACKET: u32 = 268_435_455;
/// How long a connection attempt (TCP, TLS, CONNECT/CONNACK) may take.
const CONNECT_TIMEOUT_SECS: u64 = 5;
/// The first and the longest pause between connection attempts.
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(100);
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(5);

/// How to connect: the block's connection, and what a source and a sink
/// ask of it differently.
pub(crate) struct Settings {
    /// The URL, version, credentials and keep-alive.
    pub(crate) connection: MqttConnection,
    pub(crate) client_id: String,
    /// `Some(expiry)`: a persistent session (clean start off) kept this
    /// long; `None`: a clean session.
    pub(crate) session: Option<Duration>,
    /// MQTT 5's Receive Maximum, for a source.
    pub(crate) receive_maximum: Option<u16>,
    /// The most outgoing publishes unacknowledged at once.
    pub(crate) inflight: u16,
    /// The capacity of rumqttc's request channel.
    pub(crate) requests: usize,
}

/// One message as it came from the broker.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) pkid: u16,
    /// The broker sends it again (a resumed session), under the same
    /// packet id.
    pub(crate) dup: bool,
    pub(crate) topic: String,
    pub(crate) payload: Bytes,
    /// MQTT 5 user properties, in order.
    pub(crate) properties: Vec<(String, String)>,
    /// A topic that is not UTF-8 (a broker bug): the message is
    /// dead-lettered with this reason.
    pub(crate) problem: Option<String>,
}

/// How the broker answered a publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// For good (not authorized, an invalid topic or payload).
    Permanent(String),
    /// For now (quota exceeded, an unspecified error).
    Transient(String),
}

/// What the event loop saw, in the terms both versions share.
#[derive(Debug)]
pub(crate) enum Ev {
    /// Connected; whether the broker still had the session, and the
    /// largest packet it takes (MQTT 5).
    Connected {
        session_present: bool,
        max_packet: Option<u32>,
    },
    /// A message.
    Message(Received),
    /// A subscription answered: `Some(why)` when it was refused.
    Subscribed(Option<String>),
    /// An outgoing publish written under this packet id, in the order
    /// publishes were queued.
    Sent(u16),
    /// An outgoing publish that waits for this packet id to be freed (the
    /// broker acked out of order); it is written once the id's PUBACK
    /// comes.
    Collided(u16),
    /// The broker's PUBACK for this packet id.
    Acked { pkid: u16, refused: Option<Refusal> },
    /// Anything else (pings, acks sent).
    Other,
}

/// rumqttc's event loop, of either version.
pub(crate) enum Link {
    V5(Box<v5::EventLoop>),
    V4(Box<rumqttc::EventLoop>),
}

/// rumqttc's client handle, of either version.
#[derive(Clone)]
pub(crate) enum Client {
    V5(v5::AsyncClient),
    V4(rumqttc::AsyncClient),
}

/// Why a request could not be queued.
pub(crate) enum QueueError {
    /// rumqttc's channel is full for now.
    Full,
    /// The event loop is gone.
    Closed,
}

impl Link {
    /// The client and event loop for `settings`, not connected: the first
    /// poll connects. Fails only on TLS files that cannot be used.
    pub(crate) fn new(settings: &Settings, files: TlsFiles<'_>) -> Result<(Client, Link), String> {
        let url = settings.connection.url.url();
        let tls = url.scheme() == "mqtts";
        let host = url
            .host_str()
            .ok_or_else(|| format!("`{}` names no host", settings.connection.url))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url.port().unwrap_or(if tls { 8883 } else { 1883 });
        let transport = if tls {
            let config = files.client_config()?;
            rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(Arc::new(config)))
        } else {
            rumqttc::Transport::tcp()
        };
        let (username, password) = credentials(settings);
        // rumqttc's MQTT 5 client refuses (panics on) less than 5 s.
        let keep_alive = settings
            .connection
            .keep_alive
            .get()
            .max(Duration::from_secs(5));
        match settings.connection.version {
            Version::V5 => {
                let mut options = v5::MqttOptions::new(&settings.client_id, host, port);
                options
                    .set_transport(transport)
                    .set_keep_alive(keep_alive)
                    .set_connection_timeout(CONNECT_TIMEOUT_SECS)
                    .set_manual_acks(true)
                    .set_clean_start(settings.session.is_none())
                    .set_max_packet_size(Some(MAX_PACKET))
                    .set_outgoing_inflight_upper_limit(settings.inflight.max(1))
                    .set_request_channel_capacity(settings.requests);
                if let Some(expiry) = settings.session {
                    let secs = u32::try_from(expiry.as_secs())
                        .unwrap_or(u32::MAX - 1)
                        .max(1);
                    options.set_session_expiry_interval(Some(secs));
                }
                if let Some(max) = settings.receive_maximum {
                    options.set_receive_maximum(Some(max.max(1)));
                }
                if let Some(user) = username {
                    options.set_credentials(user, password.unwrap_or_default());
                }
                let (client, link) = v5::AsyncClient::new(options, settings.requests);
                Ok((Client::V5(client), Link::V5(Box::new(link))))
            }
            Version::V311 => {
                let mut options = rumqttc::MqttOptions::new(&settings.client_id, host, port);
                options
                    .set_transport(transport)
                    .set_keep_alive(keep_alive)
                    .set_manual_acks(true)
                    .set_clean_session(settings.session.is_none())
                    .set_max_packet_size(MAX_PACKET as usize, MAX_PACKET as usize)
                    .set_inflight(settings.inflight.max(1))
                    .set_request_channel_capacity(settings.requests);
                if let Some(user) = username {
                    options.set_credentials(user, password.unwrap_or_default());
                }
                let (client, mut link) = rumqttc::AsyncClient::new(options, settings.requests);
                link.network_options
                    .set_connection_timeout(CONNECT_TIMEOUT_SECS);
                Ok((Client::V4(client), Link::V4(Box::new(link))))
            }
        }
    }

    /// The next event; an error ends the connection (the next poll
    /// reconnects). The error's text is not yet scrubbed.
    pub(crate) async fn poll(&mut self) -> Result<Ev, String> {
        match self {
            Link::V5(link) => match link.poll().await {
                Ok(v5::Event::Incoming(packet)) => Ok(from_v5(packet)),
                Ok(v5::Event::Outgoing(out)) => Ok(from_outgoing(out)),
                Err(e) => Err(error_text(&e)),
            },
            Link::V4(link) => match link.poll().await {
                Ok(rumqttc::Event::Incoming(packet)) => Ok(from_v4(packet)),
                Ok(rumqttc::Event::Outgoing(out)) => Ok(from_outgoing(out)),
                Err(e) => Err(error_text(&e)),
            },
        }
    }

    /// Forgets the connection and drains every request still queued in
    /// rumqttc's channel (its PUBACKs are dropped; anything else waits
    /// for a session that is resumed, and is dropped with one that is
    /// not).
    pub(crate) fn clean(&mut self) {
        match self {
            Link::V5(link) => link.clean(),
            Link::V4(link) => link.clean(),
        }
    }
}

impl Client {
    /// Queues the PUBACK of the QoS 1 message `pkid`, without waiting.
    pub(crate) fn try_ack(&self, pkid: u16) -> Result<(), QueueError> {
        let result = match self {
            Client::V5(client) => {
                let mut publish =
                    p5::Publish::new("", rumqttc::v5::mqttbytes::QoS::AtLeastOnce, "", None);
                publish.pkid = pkid;
                client.try_ack(&publish)
            }
            Client::V4(client) => {
                let mut publish = rumqttc::Publish::new("", rumqttc::QoS::AtLeastOnce, "");
                publish.pkid = pkid;
                return client.try_ack(&publish).map_err(queue_error_v4);
            }
        };
        result.map_err(queue_error_v5)
    }

    /// Queues a QoS 1 publish, without waiting.
    pub(crate) fn try_publish(
        &self,
        topic: String,
        payload: Bytes,
        retain: bool,
        properties: Vec<(String, String)>,
    ) -> Result<(), QueueError> {
        match self {
            Client::V5(client) => {
                let props = p5::PublishProperties {
                    user_properties: properties,
                    ..p5::PublishProperties::default()
                };
                client
                    .try_publish_with_properties(
                        topic,
                        rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
                        retain,
                        payload,
                        props,
                    )
                    .map_err(queue_error_v5)
            }
            Client::V4(client) => client
                .try_publish(topic, rumqttc::QoS::AtLeastOnce, retain, payload)
                .map_err(queue_error_v4),
        }
    }

    /// Queues a QoS 1 subscription to `filter`. With MQTT 5, retained
    /// messages are sent only for a subscription the session did not
    /// have yet.
    pub(crate) fn try_subscribe(&self, filter: &str) -> Result<(), QueueError> {
        match self {
            Client::V5(client) => {
                let mut f = p5::Filter::new(filter, rumqttc::v5::mqttbytes::QoS::AtLeastOnce);
                f.retain_forward_rule = p5::RetainForwardRule::OnNewSubscribe;
                client.try_subscribe_many([f]).map_err(queue_error_v5)
            }
            Client::V4(client) => client
                .try_subscribe(filter, rumqttc::QoS::AtLeastOnce)
                .map_err(queue_error_v4),
        }
    }
}

fn queue_error_v5(e: v5::ClientError) -> QueueError {
    match e {
        v5::ClientError::TryRequest(_) => QueueError::Full,
        v5::ClientError::Request(_) => QueueError::Closed,
    }
}

fn queue_error_v4(e: rumqttc::ClientError) -> QueueError {
    match e {
        rumqttc::ClientError::TryRequest(_) => QueueError::Full,
        rumqttc::ClientError::Request(_) => QueueError::Closed,
    }
}

/// The user name and password: the block's own, else the URL's
/// (percent-decoded).
fn credentials(settings: &Settings) -> (Option<String>, Option<String>) {
    let url = settings.connection.url.url();
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let username = settings
        .connection
        .username
        .clone()
        .or_else(|| (!url.username().is_empty()).then(|| decode(url.username())));
    let password = settings
        .connection
        .password
        .as_ref()
        .map(|p| p.expose().to_owned())
        .or_else(|| url.password().map(decode));
    (username, password)
}

/// An error with what an operator should do about a TLS certificate.
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    if let Some(source) = e.source() {
        let more = source.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
    }
    match tls::trust_hint(e) {
        Some(hint) => format!("{text} ({hint})"),
        None => text,
    }
}

/// Turns `text` into what may be shown: the URL's secrets and the
/// block's password replaced by `***`.
pub(crate) fn scrub(settings: &Settings, text: &str) -> String {
    let mut out = settings.connection.url.scrub(text);
    if let Some(password) = &settings.connection.password
        && password.expose().len() >= 3
    {
        out = out.replace(password.expose(), "***");
    }
    out
}

fn from_outgoing(out: rumqttc::Outgoing) -> Ev {
    match out {
        rumqttc::Outgoing::Publish(pkid) => Ev::Sent(pkid),
        rumqttc::Outgoing::AwaitAck(pkid) => Ev::Collided(pkid),
        _ => Ev::Other,
    }
}

fn from_v5(packet: p5::Packet) -> Ev {
    match packet {
        p5::Packet::ConnAck(ack) => Ev::Connected {
            session_present: ack.session_present,
            max_packet: ack.properties.and_then(|p| p.max_packet_size),
        },
        p5::Packet::Publish(publish) => {
            let (topic, problem) = match String::from_utf8(publish.topic.to_vec()) {
                Ok(topic) => (topic, None),
                Err(e) => (
                    String::from_utf8_lossy(e.as_bytes()).into_owned(),
                    Some("the message's MQTT topic is not UTF-8".to_owned()),
                ),
            };
            Ev::Message(Received {
                pkid: publish.pkid,
                dup: publish.dup,
                topic,
                payload: publish.payload,
                properties: publish
                    .properties
                    .map(|p| p.user_properties)
                    .unwrap_or_default(),
                problem,
            })
        }
        p5::Packet::SubAck(ack) => {
            let refused: Vec<String> = ack
                .return_codes
                .iter()
                .filter(|c| !matches!(c, p5::SubscribeReasonCode::Success(_)))
                .map(|c| format!("{c:?}"))
                .collect();
            let reason = ack.properties.and_then(|p| p.reason_string);
            Ev::Subscribed((!refused.is_empty()).then(|| {
                let mut why = format!(
                    "the broker refused the subscription: {}",
                    refused.join(", ")
                );
                if let Some(reason) = reason {
                    why.push_str(&format!(" ({reason})"));
                }
                why
            }))
        }
        p5::Packet::PubAck(ack) => Ev::Acked {
            pkid: ack.pkid,
            refused: refusal(ack.reason, ack.properties.and_then(|p| p.reason_string)),
        },
        _ => Ev::Other,
    }
}

/// What a PUBACK's reason code means for the write.
fn refusal(reason: p5::PubAckReason, text: Option<String>) -> Option<Refusal> {
    use p5::PubAckReason as R;
    let said = match text {
        Some(text) => format!("{reason:?} ({text})"),
        None => format!("{reason:?}"),
    };
    match reason {
        R::Success | R::NoMatchingSubscribers => None,
        R::NotAuthorized | R::TopicNameInvalid | R::PayloadFormatInvalid => Some(
            Refusal::Permanent(format!("the broker refused the publish: {said}")),
        ),
        R::UnspecifiedError
        | R::ImplementationSpecificError
        | R::PacketIdentifierInUse
        | R::QuotaExceeded => Some(Refusal::Transient(format!(
            "the broker refused the publish for now: {said}"
        ))),
    }
}

fn from_v4(packet: rumqttc::Packet) -> Ev {
    match packet {
        rumqttc::Packet::ConnAck(ack) => Ev::Connected {
            session_present: ack.session_present,
            max_packet: None,
        },
        rumqttc::Packet::Publish(publish) => Ev::Message(Received {
            pkid: publish.pkid,
            dup: publish.dup,
            topic: publish.topic,
            payload: publish.payload,
            properties: Vec::new(),
            problem: None,
        }),
        rumqttc::Packet::SubAck(ack) => Ev::Subscribed(
            ack.return_codes
                .iter()
                .any(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure))
                .then(|| "the broker refused the subscription (SUBACK failure)".to_owned()),
        ),
        rumqttc::Packet::PubAck(ack) => Ev::Acked {
            pkid: ack.pkid,
            refused: None,
        },
        _ => Ev::Other,
    }
}

/// `sluice-<pipeline>-<name>`.
pub(crate) fn default_client_id(pipeline: &str, name: &str) -> String {
    format!("sluice-{pipeline}-{name}")
}
