//! The `mqtt:` blocks of a source and of a sink: the configuration
//! reference for the MQTT connector.

use std::num::NonZeroU32;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::mqtt_topic::{TopicTemplate, check_filter};
use super::tls::{TlsFiles, TlsOptions};
use super::{ConfigProblem, SinkBlock, SourceBlock, describe};
use crate::config::{HumanDuration, Secret, SecretUrl};

/// The user property (and header) that carries a message's Sluice id.
pub const SLUICE_ID: &str = "sluice-id";

/// Which MQTT protocol version to speak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Version {
    /// MQTT 5: user properties carry the headers, the key and `sluice-id`;
    /// the session expiry is asked for explicitly.
    #[default]
    V5,
    /// MQTT 3.1.1, for older brokers: no properties, so no headers, key or
    /// `sluice-id` travel with a message.
    V311,
}

impl Version {
    /// `5` or `3.1.1`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V5 => "5",
            Version::V311 => "3.1.1",
        }
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Version;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the MQTT version: `5` or `3.1.1`")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Version, E> {
                match v {
                    5 => Ok(Version::V5),
                    _ => Err(E::custom(format!(
                        "unknown MQTT version `{v}`; use `5` or `3.1.1`"
                    ))),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Version, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!(
                        "unknown MQTT version `{v}`; use `5` or `3.1.1`"
                    ))),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Version, E> {
                if (v - 5.0).abs() < f64::EPSILON {
                    Ok(Version::V5)
                } else {
                    Err(E::custom(format!(
                        "unknown MQTT version `{v}`; use `5` or `3.1.1`"
                    )))
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Version, E> {
                match v {
                    "5" | "5.0" => Ok(Version::V5),
                    "3.1.1" => Ok(Version::V311),
                    _ => Err(E::custom(format!(
                        "unknown MQTT version `{v}`; use `5` or `3.1.1`"
                    ))),
                }
            }
        }
        d.deserialize_any(Visit)
    }
}

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl JsonSchema for Version {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MqttVersion".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "The MQTT protocol version: `5` (default) or `3.1.1`.",
            "oneOf": [{"const": 5}, {"const": "5"}, {"const": "3.1.1"}]
        })
    }
}

/// An MQTT topic filter read through a persistent session.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MqttSourceConfig {
    /// `url`, `version`, the credentials and `keep_alive`: see
    /// [`MqttConnection`].
    #[serde(flatten)]
    pub connection: MqttConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The topic filter subscribed to (at QoS 1); wildcards allowed
    /// (`sensors/+/temp`, `orders/#`), and `$share/<group>/<filter>` for a
    /// shared subscription.
    pub topic: String,
    /// The client identifier, which names the persistent session on the
    /// broker (where messages wait while the daemon is down). Default:
    /// `sluice-<pipeline>-<source>`: stable across restarts, the same on
    /// every daemon running the pipeline. Two connections with one
    /// identifier take the session from each other: give each daemon its
    /// own, with a `$share/...` topic, to run several.
    #[serde(default)]
    pub client_id: Option<String>,
    /// The QoS of the subscription. Only 1 is supported (at least once,
    /// acknowledged after the durable publish).
    #[serde(default = "default_qos")]
    pub qos: u8,
    /// MQTT 5: how long the broker keeps the session (the subscription
    /// and the messages for it) after the connection ends. Must be longer
    /// than any planned downtime.
    #[serde(default = "default_session_expiry")]
    pub session_expiry: HumanDuration,
    /// MQTT 5: the most messages the broker sends before their PUBACK
    /// (the client's Receive Maximum), which bounds the memory they take.
    /// With 3.1.1 the broker decides (mosquitto: `max_inflight_messages`).
    #[serde(default = "default_receive_maximum")]
    pub receive_maximum: u16,
    /// The most messages one read takes.
    #[serde(default = "default_read_batch")]
    pub batch: NonZeroU32,
    /// The MQTT 5 user property whose value becomes the message key.
    #[serde(default = "default_key_property")]
    pub key_property: String,
}

/// Where an MQTT block, source or sink, connects, with which protocol
/// version and credentials: flattened into the block, so the keys stay
/// beside its own. The TLS files are the block's [`TlsOptions`],
/// flattened beside it (serde cannot flatten one struct in another under
/// a block that denies unknown keys). Read, with them, by
/// [`crate::connect::mqtt`]'s one connection builder. The client id is
/// the block's own: a source's names a persistent session, a sink's is
/// new on each connection.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct MqttConnection {
    /// `mqtt://[user:password@]host:port` (or `mqtts://` for TLS; the port
    /// defaults to 1883, or 8883 with TLS). `${VAR}` is expanded; the
    /// password is never shown.
    pub url: SecretUrl,
    /// The protocol version: `5` (default) or `3.1.1`.
    #[serde(default)]
    pub version: Version,
    /// The user name, if the URL does not carry one.
    #[serde(default)]
    pub username: Option<String>,
    /// The password, if the URL does not carry one (`${VAR}` is expanded;
    /// never shown).
    #[serde(default)]
    pub password: Option<Secret>,
    /// How often the connection is checked with a ping when idle.
    #[serde(default = "default_keep_alive")]
    pub keep_alive: HumanDuration,
}

/// An MQTT topic that messages are published to.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = sink_descriptions)]
pub struct MqttSinkConfig {
    /// `url`, `version`, the credentials and `keep_alive`: see
    /// [`MqttConnection`].
    #[serde(flatten)]
    pub connection: MqttConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The topic each message is published to: a topic name (no
    /// wildcards) that may hold `{key}`, the message's key (`out/{key}`).
    /// A message whose key is missing, empty, or holds `/`, `+`, `#` or a
    /// NUL is rejected (dead-lettered), never published elsewhere.
    pub topic: String,
    /// Publish with the retain flag: the broker keeps the last message of
    /// each topic for subscribers that come later.
    #[serde(default)]
    pub retain: bool,
    /// The client identifier. Default: `sluice-<pipeline>-<sink>-<random>`
    /// (the sink keeps no session, so each connection may be new).
    #[serde(default)]
    pub client_id: Option<String>,
    /// The QoS of each publish. Only 1 is supported (a write is done when
    /// the broker's PUBACK arrives).
    #[serde(default = "default_qos")]
    pub qos: u8,
    /// The most publishes awaiting their PUBACK at once, across the
    /// sink's worker slots (the broker's Receive Maximum may lower it).
    #[serde(default = "default_inflight")]
    pub inflight: u16,
    /// The MQTT 5 user property the message key is written to.
    #[serde(default = "default_key_property")]
    pub key_property: String,
}

/// The sink's own words, in the JSON Schema, for the fields of
/// [`MqttConnection`] whose doc comment is the source's.
fn sink_descriptions(schema: &mut schemars::Schema) {
    for (field, text) in [
        (
            "url",
            "`mqtt://[user:password@]host:port` (or `mqtts://` for TLS).",
        ),
        (
            "version",
            "The protocol version: `5` (default) or `3.1.1` (no headers, key or\n`sluice-id` \
             travel: 3.1.1 has no properties).",
        ),
        (
            "password",
            "The password, if the URL does not carry one (never shown).",
        ),
    ] {
        describe(schema, field, text);
    }
}

/// 1.
pub fn default_qos() -> u8 {
    1
}

/// 30 s.
pub fn default_keep_alive() -> HumanDuration {
    HumanDuration::secs(30)
}

/// 7 days.
pub fn default_session_expiry() -> HumanDuration {
    HumanDuration::secs(7 * 24 * 3600)
}

/// 1,000.
pub fn default_receive_maximum() -> u16 {
    1000
}

/// 100.
pub fn default_inflight() -> u16 {
    100
}

/// 100.
pub fn default_read_batch() -> NonZeroU32 {
    NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN)
}

/// `sluice-key`.
pub fn default_key_property() -> String {
    "sluice-key".into()
}

/// The most a session may be kept: MQTT 5's Session Expiry Interval is
/// seconds in 32 bits, and `u32::MAX` means "never expires".
const MAX_SESSION_EXPIRY_SECS: u64 = u32::MAX as u64 - 1;

/// The checks both blocks share: the URL, the TLS files, the QoS, the
/// credentials, the client id, the key property.
struct Common<'a> {
    connection: &'a MqttConnection,
    tls: TlsFiles<'a>,
    qos: u8,
    client_id: Option<&'a String>,
    key_property: &'a str,
}

impl Common<'_> {
    fn check(&self, problems: &mut Vec<ConfigProblem>) {
        let MqttConnection {
            url: shown,
            username,
            password,
            keep_alive,
            ..
        } = self.connection;
        let tls = self.tls;
        let url = shown.url();
        match url.scheme() {
            "mqtt" => {
                if let Some(option) = tls.first_given() {
                    problems.push(ConfigProblem::at(
                        &[option],
                        format!(
                            "`{option}` is for TLS: write the URL as `mqtts://` (it is `{}`)",
                            shown
                        ),
                    ));
                }
            }
            "mqtts" => tls.check(problems),
            _ => problems.push(ConfigProblem::at(
                &["url"],
                format!(
                    "`{}` is not an MQTT URL; use `mqtt://host:1883` (or `mqtts://host:8883` \
                     for TLS)",
                    shown
                ),
            )),
        }
        if matches!(url.scheme(), "mqtt" | "mqtts") {
            if url.host_str().is_none_or(str::is_empty) {
                problems.push(ConfigProblem::at(
                    &["url"],
                    format!("`{}` names no host; use `mqtt://host:1883`", shown),
                ));
            } else if !matches!(url.path(), "" | "/") || url.query().is_some() {
                problems.push(ConfigProblem::at(
                    &["url"],
                    format!(
                        "`{}`: an MQTT URL is `mqtt://[user:password@]host:port`, with no path \
                         or query (the topic goes in `topic`)",
                        shown
                    ),
                ));
            }
        }
        if self.qos != 1 {
            problems.push(ConfigProblem::at(
                &["qos"],
                format!(
                    "`qos: {}` is not supported; the connector uses QoS 1 (at least once, \
                     acknowledged after the durable write)",
                    self.qos
                ),
            ));
        }
        if username.is_some() && !url.username().is_empty() {
            problems.push(ConfigProblem::at(
                &["username"],
                "the URL carries a user name already; give it in one place",
            ));
        }
        if password.is_some() && url.password().is_some() {
            problems.push(ConfigProblem::at(
                &["password"],
                "the URL carries a password already; give it in one place",
            ));
        }
        if let Some(id) = self.client_id
            && let Err(e) = check_client_id(id)
        {
            problems.push(ConfigProblem::at(&["client_id"], e));
        }
        let keep_alive = keep_alive.get();
        if keep_alive.as_secs() < 5 || keep_alive.as_secs() > u64::from(u16::MAX) {
            problems.push(ConfigProblem::at(
                &["keep_alive"],
                format!(
                    "`keep_alive` must be between 5s and {}s (MQTT counts it in seconds in 16 \
                     bits)",
                    u16::MAX
                ),
            ));
        }
        if self.key_property.is_empty() {
            problems.push(ConfigProblem::at(
                &["key_property"],
                "`key_property` must name a user property",
            ));
        } else if self.key_property == SLUICE_ID {
            problems.push(ConfigProblem::at(
                &["key_property"],
                format!("`{}` carries the message id, not its key", SLUICE_ID),
            ));
        }
    }
}

/// A client identifier MQTT brokers take: 1 to 65535 bytes of UTF-8 with
/// no control character (3.1.1 only promises 23 of `[0-9a-zA-Z]`, which
/// most brokers widen; the error of a broker that does not is shown).
pub fn check_client_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("`client_id` must not be empty (leave it out for the default)".into());
    }
    if id.len() > usize::from(u16::MAX) {
        return Err("`client_id` is longer than MQTT allows (65535 bytes)".into());
    }
    if id.chars().any(char::is_control) {
        return Err(format!("`client_id` {id:?} holds a control character"));
    }
    Ok(())
}

impl SourceBlock for MqttSourceConfig {
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "mqtt"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        Common {
            connection: &self.connection,
            tls: self.tls.files(),
            qos: self.qos,
            client_id: self.client_id.as_ref(),
            key_property: &self.key_property,
        }
        .check(&mut problems);
        if let Err(e) = check_filter(&self.topic) {
            problems.push(ConfigProblem::at(&["topic"], e));
        }
        let expiry = self.session_expiry.get().as_secs();
        if expiry == 0 {
            problems.push(ConfigProblem::at(
                &["session_expiry"],
                "`session_expiry` must be longer than 0s: with 0 the broker drops the session, \
                 and every message published while the daemon is down, when the connection \
                 ends",
            ));
        } else if expiry > MAX_SESSION_EXPIRY_SECS {
            problems.push(ConfigProblem::at(
                &["session_expiry"],
                format!("`session_expiry` must be at most {MAX_SESSION_EXPIRY_SECS}s"),
            ));
        }
        if self.receive_maximum == 0 {
            problems.push(ConfigProblem::at(
                &["receive_maximum"],
                "`receive_maximum` must be at least 1",
            ));
        }
        problems
    }

    fn describe(&self) -> String {
        format!(
            "mqtt {} topic `{}` at {} (client `{}`)",
            self.connection.version.as_str(),
            self.topic,
            self.connection.url,
            self.client_id
                .as_deref()
                .unwrap_or("sluice-<pipeline>-<source>")
        )
    }

    fn redelivery_horizon(&self) -> std::time::Duration {
        // A message is sent again on the next connection of the session
        // (MQTT has no redelivery timer): after a reconnect, which the
        // source attempts within seconds.
        std::time::Duration::from_secs(60)
    }

    fn read_max(&self) -> usize {
        usize::try_from(self.batch.get()).unwrap_or(usize::MAX)
    }
}

impl SinkBlock for MqttSinkConfig {
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "mqtt"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        Common {
            connection: &self.connection,
            tls: self.tls.files(),
            qos: self.qos,
            client_id: self.client_id.as_ref(),
            key_property: &self.key_property,
        }
        .check(&mut problems);
        if let Err(e) = TopicTemplate::parse(&self.topic) {
            problems.push(ConfigProblem::at(&["topic"], e));
        }
        if self.inflight == 0 {
            problems.push(ConfigProblem::at(
                &["inflight"],
                "`inflight` must be at least 1",
            ));
        }
        problems
    }

    fn describe(&self) -> String {
        format!(
            "mqtt {} topic `{}` at {}",
            self.connection.version.as_str(),
            self.topic,
            self.connection.url
        )
    }
}
