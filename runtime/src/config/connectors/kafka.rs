//! The `kafka:` blocks of a source and of a sink: the configuration
//! reference for the Kafka connector.

use std::num::NonZeroU32;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::tls::{TlsFiles, TlsOptions};
use super::{ConfigProblem, SinkBlock, SourceBlock, describe};
use crate::config::{HumanDuration, Secret};

/// The bootstrap brokers: `host:port`, or several, as one comma-separated
/// string or a list.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Brokers {
    /// `host:port[,host:port...]`.
    One(String),
    /// `[host:port, ...]`.
    Many(Vec<String>),
}

impl Brokers {
    /// Each `host:port`.
    pub fn list(&self) -> Vec<String> {
        match self {
            Brokers::One(text) => text
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            Brokers::Many(list) => list.iter().map(|s| s.trim().to_owned()).collect(),
        }
    }

    /// `bootstrap.servers`.
    pub fn joined(&self) -> String {
        self.list().join(",")
    }
}

/// How the client talks to the brokers (`security.protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Security {
    /// Plain TCP, no authentication.
    #[default]
    Plaintext,
    /// TLS (`tls_ca`, `tls_cert`, `tls_key`).
    Ssl,
    /// SASL (`sasl`) over plain TCP.
    SaslPlaintext,
    /// SASL (`sasl`) over TLS.
    SaslSsl,
}

impl Security {
    /// librdkafka's name for it.
    pub fn protocol(self) -> &'static str {
        match self {
            Security::Plaintext => "plaintext",
            Security::Ssl => "ssl",
            Security::SaslPlaintext => "sasl_plaintext",
            Security::SaslSsl => "sasl_ssl",
        }
    }

    fn tls(self) -> bool {
        matches!(self, Security::Ssl | Security::SaslSsl)
    }

    fn sasl(self) -> bool {
        matches!(self, Security::SaslPlaintext | Security::SaslSsl)
    }
}

/// A SASL mechanism librdkafka has built in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum SaslMechanism {
    /// `PLAIN` (only over TLS in production: the password travels as is).
    #[default]
    #[serde(rename = "PLAIN", alias = "plain")]
    Plain,
    /// `SCRAM-SHA-256`.
    #[serde(rename = "SCRAM-SHA-256", alias = "scram-sha-256")]
    ScramSha256,
    /// `SCRAM-SHA-512`.
    #[serde(rename = "SCRAM-SHA-512", alias = "scram-sha-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// librdkafka's name for it.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// SASL credentials (with `security: sasl_plaintext` or `sasl_ssl`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sasl {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    #[serde(default)]
    pub mechanism: SaslMechanism,
    /// The user name.
    pub username: String,
    /// The password; write `${VAR}` to take it from the environment. Shown
    /// as `***` everywhere.
    pub password: Secret,
}

/// Where a consumer group with no committed offset for a partition starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// Messages produced from now on (`auto.offset.reset=latest`).
    #[default]
    Latest,
    /// The whole partition (`auto.offset.reset=earliest`).
    Earliest,
}

/// The consumer group protocol (`group.protocol`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GroupProtocol {
    /// The classic protocol, with the cooperative-sticky assignor: a
    /// rebalance moves only the partitions that change owner, and the
    /// others are read on throughout.
    #[default]
    Classic,
    /// Kafka 4's own protocol (KIP-848): the brokers assign, and the
    /// session timeout and heartbeat are the brokers'
    /// (`group.consumer.session.timeout.ms`), not `session_timeout`.
    Consumer,
}

impl GroupProtocol {
    /// librdkafka's name for it.
    pub fn name(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }
}

/// A Kafka topic (or several) read through a consumer group.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// `brokers`, `client_id`, `security` and `sasl`: see
    /// [`KafkaConnection`].
    #[serde(flatten)]
    pub connection: KafkaConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The topic to read. Give `topic` or `topics`.
    #[serde(default)]
    pub topic: Option<String>,
    /// Several topics to read. With more than one, message ids name the
    /// topic (`<topic>:<partition>:<offset>`).
    #[serde(default)]
    pub topics: Option<Vec<String>>,
    /// The consumer group (`group.id`). Daemons in one group share the
    /// partitions.
    pub group: String,
    /// Where the group starts on a partition it has no committed offset
    /// for: `latest` (from now on) or `earliest` (the whole partition).
    /// A group that committed keeps its place.
    #[serde(default)]
    pub start: StartFrom,
    /// The most messages one read takes.
    #[serde(default = "default_read_batch")]
    pub batch: NonZeroU32,
    /// The most messages fetched ahead of the reads (polled from the
    /// client, not yet read): fetching pauses at this bound.
    #[serde(default = "default_buffer")]
    pub buffer: NonZeroU32,
    /// The group protocol: `classic` (default, with the cooperative-sticky
    /// assignor) or `consumer` (Kafka 4's KIP-848 protocol; brokers 4.0 or
    /// later).
    #[serde(default)]
    pub group_protocol: GroupProtocol,
    /// The group's session timeout (`session.timeout.ms`): a daemon that
    /// stops heartbeating for this long loses its partitions to the others.
    /// With `group_protocol: consumer` the brokers set it instead.
    #[serde(default = "default_session_timeout")]
    pub session_timeout: HumanDuration,
    /// A static group member id (`group.instance.id`), one per daemon: a
    /// daemon restarted within `session_timeout` (a crash) takes its
    /// partitions back at once, without a rebalance. Leave it out where
    /// daemons share one pipeline file.
    #[serde(default)]
    pub instance_id: Option<String>,
}

/// How a Kafka block, source or sink, reaches the brokers: flattened into
/// the block, so the keys stay beside its own. The TLS files are the
/// block's [`TlsOptions`], flattened beside it (serde cannot flatten one
/// struct in another under a block that denies unknown keys). Read, with
/// them, by [`crate::connect::kafka`]'s one client configuration builder.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct KafkaConnection {
    /// The bootstrap brokers: `host:port`, comma-separated or a list.
    pub brokers: Brokers,
    /// This client's id (`client.id`), for the brokers' logs and quotas.
    #[serde(default)]
    pub client_id: Option<String>,
    /// `plaintext` (default), `ssl`, `sasl_plaintext` or `sasl_ssl`.
    #[serde(default)]
    pub security: Security,
    /// SASL credentials, with `security: sasl_plaintext` or `sasl_ssl`.
    #[serde(default)]
    pub sasl: Option<Sasl>,
}

/// A Kafka topic that messages are produced to.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = |schema: &mut schemars::Schema| {
    describe(schema, "client_id", "This client's id (`client.id`).");
})]
pub struct KafkaSinkConfig {
    /// `brokers`, `client_id`, `security` and `sasl`: see
    /// [`KafkaConnection`].
    #[serde(flatten)]
    pub connection: KafkaConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The topic written to. The message key is the partition key.
    pub topic: String,
    /// How long the producer tries to deliver one message
    /// (`message.timeout.ms`) before the write fails as an outage. Keep it
    /// under the sink's `timeout`.
    #[serde(default = "default_delivery_timeout")]
    pub delivery_timeout: HumanDuration,
    /// How long the producer waits to fill a batch (`linger.ms`).
    #[serde(default = "default_linger")]
    pub linger: HumanDuration,
    /// The largest message produced (`message.max.bytes`); a larger one
    /// is refused before it is sent and dead-lettered as `rejected`. Keep
    /// it at or under the topic's `max.message.bytes`.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: u32,
}

/// 500.
pub fn default_read_batch() -> NonZeroU32 {
    NonZeroU32::new(500).unwrap_or(NonZeroU32::MIN)
}

/// 2,000.
pub fn default_buffer() -> NonZeroU32 {
    NonZeroU32::new(2000).unwrap_or(NonZeroU32::MIN)
}

/// 10 s.
pub fn default_session_timeout() -> HumanDuration {
    HumanDuration::secs(10)
}

/// 20 s (under the sink's default `timeout` of 30 s).
pub fn default_delivery_timeout() -> HumanDuration {
    HumanDuration::secs(20)
}

/// 5 ms.
pub fn default_linger() -> HumanDuration {
    HumanDuration::millis(5)
}

/// 1,000,000 (Kafka's default).
pub fn default_max_message_bytes() -> u32 {
    1_000_000
}

impl KafkaConnection {
    /// The brokers for people: `kafka://h1:9092,h2:9092` (no password: it
    /// is never in the broker list).
    pub(crate) fn describe(&self) -> String {
        format!("kafka://{}", self.brokers.joined())
    }

    fn check(&self, tls: TlsFiles<'_>, problems: &mut Vec<ConfigProblem>) {
        let brokers = self.brokers.list();
        if brokers.is_empty() {
            problems.push(ConfigProblem::at(
                &["brokers"],
                "`brokers` is empty; give at least one `host:port`",
            ));
        }
        for broker in &brokers {
            let port_ok = broker
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !port_ok || broker.contains("://") || broker.contains('@') {
                problems.push(ConfigProblem::at(
                    &["brokers"],
                    format!("`{broker}` is not a broker address; write `host:port` (e.g. `localhost:9092`)"),
                ));
                break;
            }
        }
        if let Some(id) = &self.client_id
            && let Err(e) = check_kafka_name(id)
        {
            problems.push(ConfigProblem::at(&["client_id"], e));
        }
        if self.security.tls() {
            tls.check(problems);
        } else if let Some(option) = tls.first_given() {
            problems.push(ConfigProblem::at(
                &[option],
                format!(
                    "`{option}` is for TLS: set `security: ssl` (or `sasl_ssl` for SASL over \
                     TLS), or remove `{option}`; it is `{}`",
                    self.security.protocol()
                ),
            ));
        }
        match (self.security.sasl(), &self.sasl) {
            (true, None) => problems.push(ConfigProblem::at(
                &["security"],
                format!(
                    "`security: {}` needs a `sasl` block (`mechanism`, `username`, `password`)",
                    self.security.protocol()
                ),
            )),
            (false, Some(_)) => problems.push(ConfigProblem::at(
                &["sasl"],
                match self.security {
                    // The usual slip: TLS and SASL wanted, `ssl` written.
                    Security::Ssl => "`sasl` needs `security: sasl_plaintext` or `sasl_ssl`; it \
                                      is `ssl`: write `security: sasl_ssl` for SASL over TLS"
                        .to_owned(),
                    _ => format!(
                        "`sasl` needs `security: sasl_plaintext` or `sasl_ssl`; it is `{}`",
                        self.security.protocol()
                    ),
                },
            )),
            (true, Some(sasl)) => sasl.check(problems),
            (false, None) => {}
        }
    }

    /// What is valid but worth saying: SASL `PLAIN` without TLS sends the
    /// password as it is (legitimate on a private network).
    fn warnings(&self) -> Vec<ConfigProblem> {
        match &self.sasl {
            Some(sasl)
                if self.security == Security::SaslPlaintext
                    && sasl.mechanism == SaslMechanism::Plain =>
            {
                vec![ConfigProblem::at(
                    &["sasl", "mechanism"],
                    "SASL `PLAIN` over `security: sasl_plaintext` sends the password unencrypted \
                     to the brokers: anyone on the network path can read it; use `security: \
                     sasl_ssl`, or `mechanism: SCRAM-SHA-512`, unless the network is private",
                )]
            }
            _ => Vec::new(),
        }
    }
}

impl Sasl {
    /// Empty credentials, which the brokers would refuse only once the
    /// daemon runs. The password is never quoted.
    fn check(&self, problems: &mut Vec<ConfigProblem>) {
        if self.username.trim().is_empty() {
            problems.push(ConfigProblem::at(
                &["sasl", "username"],
                "`username` is empty; write the SASL user name the brokers know (or `${VAR}` to \
                 take it from the environment)",
            ));
        }
        if self.password.expose().is_empty() {
            problems.push(ConfigProblem::at(
                &["sasl", "password"],
                "`password` is empty; write the SASL password, or better `${VAR}` to take it \
                 from the environment",
            ));
        }
    }
}

/// A topic or group name as Kafka takes it: `[A-Za-z0-9._-]`, 1 to 249
/// characters.
pub fn check_kafka_name(text: &str) -> Result<(), String> {
    if !text.is_empty()
        && text.len() <= 249
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        Ok(())
    } else {
        Err(format!(
            "`{text}` is not a Kafka name: use letters, digits, `.`, `_` and `-` (at most 249 \
             characters)"
        ))
    }
}

impl KafkaSourceConfig {
    /// The topics read, `topic` or `topics`.
    pub fn topic_list(&self) -> Vec<String> {
        let mut out: Vec<String> = self.topic.iter().cloned().collect();
        out.extend(self.topics.iter().flatten().cloned());
        out
    }
}

impl SourceBlock for KafkaSourceConfig {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        self.connection.check(self.tls.files(), &mut problems);
        match (&self.topic, &self.topics) {
            (None, None) => problems.push(ConfigProblem::at(
                &["topic"],
                "give the topic to read: `topic: <name>` (or `topics: [a, b]`)",
            )),
            (Some(_), Some(_)) => problems.push(ConfigProblem::at(
                &["topics"],
                "give `topic` or `topics`, not both",
            )),
            (None, Some(list)) if list.is_empty() => problems.push(ConfigProblem::at(
                &["topics"],
                "`topics` is empty; list at least one topic",
            )),
            _ => {}
        }
        if let Some(topic) = &self.topic
            && let Err(e) = check_kafka_name(topic)
        {
            problems.push(ConfigProblem::at(&["topic"], e));
        }
        for topic in self.topics.iter().flatten() {
            if let Err(e) = check_kafka_name(topic) {
                problems.push(ConfigProblem::at(&["topics"], e));
                break;
            }
        }
        if let Some(list) = &self.topics {
            let mut seen = std::collections::BTreeSet::new();
            if let Some(twice) = list.iter().find(|t| !seen.insert(t.as_str())) {
                problems.push(ConfigProblem::at(
                    &["topics"],
                    format!("topic `{twice}` is listed twice"),
                ));
            }
        }
        if let Err(e) = check_kafka_name(&self.group) {
            problems.push(ConfigProblem::at(&["group"], e));
        }
        if let Some(id) = &self.instance_id
            && let Err(e) = check_kafka_name(id)
        {
            problems.push(ConfigProblem::at(&["instance_id"], e));
        }
        let session = self.session_timeout.get();
        if session < std::time::Duration::from_secs(1)
            || session > std::time::Duration::from_secs(3600)
        {
            problems.push(ConfigProblem::at(
                &["session_timeout"],
                "`session_timeout` must be between 1s and 1h (brokers allow 6s to 5m by default)",
            ));
        }
        if self.buffer.get() < self.batch.get() {
            problems.push(ConfigProblem::at(
                &["buffer"],
                format!(
                    "`buffer` ({}) must be at least `batch` ({}): a read takes from it",
                    self.buffer, self.batch
                ),
            ));
        }
        problems
    }

    fn describe(&self) -> String {
        format!(
            "kafka topic {} (group `{}`) at {}",
            self.topic_list()
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", "),
            self.group,
            self.connection.describe()
        )
    }

    fn warnings(&self) -> Vec<ConfigProblem> {
        self.connection.warnings()
    }

    fn redelivery_horizon(&self) -> std::time::Duration {
        // A message read and not committed is read again when its
        // partition moves (after `session_timeout` at most, for a dead
        // daemon) or the daemon restarts: soon, whatever the volume.
        self.session_timeout.get() * 3
    }

    fn read_max(&self) -> usize {
        usize::try_from(self.batch.get()).unwrap_or(usize::MAX)
    }

    fn resolve_paths(&mut self, dir: &std::path::Path) {
        self.tls.resolve_paths(dir);
    }
}

impl SinkBlock for KafkaSinkConfig {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    fn warnings(&self) -> Vec<ConfigProblem> {
        self.connection.warnings()
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        self.connection.check(self.tls.files(), &mut problems);
        if let Err(e) = check_kafka_name(&self.topic) {
            problems.push(ConfigProblem::at(&["topic"], e));
        }
        let delivery = self.delivery_timeout.get();
        if delivery < std::time::Duration::from_secs(1) {
            problems.push(ConfigProblem::at(
                &["delivery_timeout"],
                "`delivery_timeout` must be at least 1s",
            ));
        }
        if !(1000..=1_000_000_000).contains(&self.max_message_bytes) {
            problems.push(ConfigProblem::at(
                &["max_message_bytes"],
                "`max_message_bytes` must be between 1000 and 1000000000",
            ));
        }
        if self.linger.get() > std::time::Duration::from_secs(5) {
            problems.push(ConfigProblem::at(
                &["linger"],
                "`linger` must be at most 5s (every write waits for it)",
            ));
        }
        problems
    }

    fn describe(&self) -> String {
        format!(
            "kafka topic `{}` at {}",
            self.topic,
            self.connection.describe()
        )
    }

    fn resolve_paths(&mut self, dir: &std::path::Path) {
        self.tls.resolve_paths(dir);
    }
}
