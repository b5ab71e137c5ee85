//! The `nats:` blocks of a source and of a sink: the configuration
//! reference for the NATS connector.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::tls::{self, TlsFiles, TlsOptions};
use super::{ConfigProblem, SinkBlock, SourceBlock, describe};
use crate::config::{HumanDuration, Secret, SecretUrl};

/// A JetStream stream read through a durable pull consumer, or (without
/// `stream`) a core NATS subject, at most once.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NatsSourceConfig {
    /// `url` and the credentials: see [`NatsConnection`].
    #[serde(flatten)]
    pub connection: NatsConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The subject to read: with `stream`, the consumer's filter (wildcards
    /// allowed, and it must be a subject of the stream); without, the core
    /// subject subscribed to.
    pub subject: String,
    /// The JetStream stream to read through a durable pull consumer, with
    /// explicit acks sent only after the durable publish. Absent: a core
    /// NATS subscription, at most once (`validate` warns).
    #[serde(default)]
    pub stream: Option<String>,
    /// With `stream`: the durable consumer's name, created if missing.
    /// Default: `sluice-<pipeline>-<source>` (`.` as `_`). Daemons that
    /// share it are competing consumers.
    #[serde(default)]
    pub durable: Option<String>,
    /// With `stream`: where a consumer created now starts: `all` (the
    /// whole stream) or `new` (messages stored from now on). An existing
    /// consumer keeps its place.
    #[serde(default)]
    pub deliver: Deliver,
    /// With `stream`: how long a message read and not acknowledged stays
    /// with this reader before the server delivers it again (the
    /// consumer's `AckWait`). The topic's duplicate window covers it.
    #[serde(default = "default_ack_wait")]
    pub ack_wait: HumanDuration,
    /// Without `stream`: a queue group, so several daemons share the
    /// subject's messages instead of each getting all of them.
    #[serde(default)]
    pub queue: Option<String>,
    /// The most messages one read takes.
    #[serde(default = "default_read_batch")]
    pub batch: NonZeroU32,
    /// The header whose value becomes the message's key (the header the
    /// NATS broker and this connector's sink write it to). Every other
    /// header but NATS's own `Nats-*` controls becomes a header.
    #[serde(default = "default_key_header")]
    pub key_header: String,
}

/// Where a NATS block, source or sink, connects and how it
/// authenticates: flattened into the block, so the keys stay beside its
/// own. The TLS files are the block's [`TlsOptions`], flattened beside it
/// (serde cannot flatten one struct in another under a block that denies
/// unknown keys). Read, with them, by [`crate::connect::nats`]'s one
/// connection builder.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct NatsConnection {
    /// `nats://[user:password@]host:port` (or `tls://` for TLS). `${VAR}`
    /// is expanded; the password is never shown. A token goes in `token`,
    /// not the URL.
    pub url: SecretUrl,
    /// A token to authenticate with (instead of a user and password).
    #[serde(default)]
    pub token: Option<Secret>,
    /// A user name, with `password` (or give both in the URL).
    #[serde(default)]
    pub user: Option<String>,
    /// The password of `user`.
    #[serde(default)]
    pub password: Option<Secret>,
    /// A `.creds` file (a user JWT and its NKey seed), relative to the
    /// pipeline file.
    #[serde(default)]
    pub creds: Option<PathBuf>,
}

/// Where a new JetStream consumer starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Deliver {
    /// The whole stream.
    #[default]
    All,
    /// Messages stored after the consumer is created.
    New,
}

/// 100.
pub fn default_read_batch() -> NonZeroU32 {
    NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN)
}

/// 30 s.
pub fn default_ack_wait() -> HumanDuration {
    HumanDuration::secs(30)
}

/// `Sluice-Key`, as the NATS broker writes a message's key.
pub fn default_key_header() -> String {
    // The broker's own key header (`crate::broker::nats::KEY_HEADER`; a
    // unit test of the connector keeps the two the same).
    "Sluice-Key".to_owned()
}

/// `true`.
pub fn default_jetstream() -> bool {
    true
}

/// A NATS subject that messages are published to: through JetStream
/// (a stream must capture the subject) or, with `jetstream: false`, core
/// NATS.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = |schema: &mut schemars::Schema| describe(schema, "url", SINK_URL))]
pub struct NatsSinkConfig {
    /// `url` and the credentials: see [`NatsConnection`].
    #[serde(flatten)]
    pub connection: NatsConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The subject to publish to (no wildcards).
    pub subject: String,
    /// Publish through JetStream and wait for the stream's `PubAck`, with
    /// `Nats-Msg-Id` set to the Sluice id (a redelivered message falls in
    /// the stream's duplicate window). `false`: a core publish, which no
    /// one confirms: a subject nobody listens to drops it.
    #[serde(default = "default_jetstream")]
    pub jetstream: bool,
    /// The header the message's key is written to.
    #[serde(default = "default_key_header")]
    pub key_header: String,
}

/// The sink's own words for `url` in the JSON Schema.
const SINK_URL: &str = "`nats://[user:password@]host:port` (or `tls://`).";

/// How a block authenticates, besides `user:password@` in the URL.
pub(crate) struct Auth<'a> {
    pub(crate) token: Option<&'a Secret>,
    pub(crate) user: Option<&'a str>,
    pub(crate) password: Option<&'a Secret>,
    pub(crate) creds: Option<&'a Path>,
}

impl NatsConnection {
    pub(crate) fn auth(&self) -> Auth<'_> {
        Auth {
            token: self.token.as_ref(),
            user: self.user.as_deref(),
            password: self.password.as_ref(),
            creds: self.creds.as_deref(),
        }
    }
}

/// The problems with the URL, the credentials and the TLS files.
fn check_connection(
    connection: &NatsConnection,
    tls: TlsFiles<'_>,
    problems: &mut Vec<ConfigProblem>,
) {
    let (url, auth) = (&connection.url, connection.auth());
    let parsed = url.url();
    if !matches!(parsed.scheme(), "nats" | "tls") {
        problems.push(ConfigProblem::at(
            &["url"],
            format!("`{url}` is not a NATS URL; use `nats://host:4222` (or `tls://` for TLS)"),
        ));
        return;
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        problems.push(ConfigProblem::at(
            &["url"],
            format!("`{url}` names no server; use `nats://host:4222`"),
        ));
    }
    if parsed.path().len() > 1 || parsed.query().is_some() || parsed.fragment().is_some() {
        problems.push(ConfigProblem::at(
            &["url"],
            format!(
                "`{url}`: a NATS URL is `nats://[user:password@]host:port` and nothing after; \
                 give credentials and TLS files as options (`token`, `creds`, `tls_ca`)"
            ),
        ));
    }
    let url_user = !parsed.username().is_empty();
    if url_user && parsed.password().is_none() {
        // `nats://TOKEN@host` is NATS's token form, and the URL would
        // show it: only passwords are hidden.
        problems.push(ConfigProblem::at(
            &["url"],
            "a name before `@` with no password is a token, which the URL would show; give \
             it as `token: ${NATS_TOKEN}`, or write `user:password@`",
        ));
    }
    if url_user && (auth.user.is_some() || auth.password.is_some() || auth.token.is_some()) {
        problems.push(ConfigProblem::at(
            &["url"],
            "the URL has credentials and so do `user`/`password`/`token`; give them once",
        ));
    }
    match (auth.user, auth.password) {
        (Some(_), None) => problems.push(ConfigProblem::at(&["user"], "`user` needs `password`")),
        (None, Some(_)) => {
            problems.push(ConfigProblem::at(&["password"], "`password` needs `user`"))
        }
        _ => {}
    }
    if auth.token.is_some() && auth.user.is_some() {
        problems.push(ConfigProblem::at(
            &["token"],
            "give either `token` or `user` and `password`, not both",
        ));
    }
    if let Some(creds) = auth.creds
        && !creds.is_file()
    {
        problems.push(ConfigProblem::at(
            &["creds"],
            format!(
                "file not found: {} (a relative `creds` path is relative to the pipeline file)",
                creds.display()
            ),
        ));
    }
    tls.check(problems);
}

/// Why `subject` is not a NATS subject one may publish to (or, with
/// `wildcards`, subscribe to), if it is not.
pub fn subject_problem(subject: &str, wildcards: bool) -> Option<String> {
    if subject.is_empty() {
        return Some("the subject is empty".into());
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some(format!(
            "`{subject}` is not a NATS subject: it has a space or control character"
        ));
    }
    let tokens: Vec<&str> = subject.split('.').collect();
    if tokens.iter().any(|t| t.is_empty()) {
        return Some(format!(
            "`{subject}` is not a NATS subject: a `.` at either end or `..` leaves an empty token"
        ));
    }
    for (i, token) in tokens.iter().enumerate() {
        let wild = *token == "*" || *token == ">";
        if token.contains(['*', '>']) && !wild {
            return Some(format!(
                "`{subject}`: `*` and `>` are wildcards only as a whole token (`orders.*`)"
            ));
        }
        if wild && !wildcards {
            return Some(format!(
                "`{subject}` has a wildcard; a sink publishes to one subject"
            ));
        }
        if *token == ">" && i + 1 != tokens.len() {
            return Some(format!("`{subject}`: `>` may only be the last token"));
        }
    }
    None
}

/// Why `name` cannot name a JetStream stream or consumer, if it cannot.
pub fn stream_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the name is empty".into());
    }
    if name.len() > 255
        || name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || ".*>/\\".contains(c))
    {
        return Some(format!(
            "`{name}` cannot name a JetStream stream or consumer: no spaces, `.`, `*`, `>`, `/` \
             or `\\`, at most 255 characters"
        ));
    }
    None
}

fn check_key_header(header: &str, problems: &mut Vec<ConfigProblem>) {
    if header.is_empty() || header.chars().any(|c| !c.is_ascii_graphic() || c == ':') {
        problems.push(ConfigProblem::at(
            &["key_header"],
            format!("`{header}` cannot be a NATS header name: printable ASCII, no `:` or space"),
        ));
    } else if header.len() >= 5 && header[..5].eq_ignore_ascii_case("nats-") {
        problems.push(ConfigProblem::at(
            &["key_header"],
            format!("`{header}`: `Nats-` headers are the server's controls; choose another name"),
        ));
    }
}

/// `sluice-<pipeline>-<source>`, a valid consumer name.
pub fn default_durable(pipeline: &str, source: &str) -> String {
    format!("sluice-{pipeline}-{source}").replace('.', "_")
}

impl SourceBlock for NatsSourceConfig {
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        tls::resolve_ca(&mut self.connection.creds, dir);
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "nats"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_connection(&self.connection, self.tls.files(), &mut problems);
        if let Some(why) = subject_problem(&self.subject, true) {
            problems.push(ConfigProblem::at(&["subject"], why));
        }
        check_key_header(&self.key_header, &mut problems);
        match &self.stream {
            Some(stream) => {
                if let Some(why) = stream_name_problem(stream) {
                    problems.push(ConfigProblem::at(&["stream"], why));
                }
                if let Some(durable) = &self.durable
                    && let Some(why) = stream_name_problem(durable)
                {
                    problems.push(ConfigProblem::at(&["durable"], why));
                }
                if self.queue.is_some() {
                    problems.push(ConfigProblem::at(
                        &["queue"],
                        "`queue` is for a core subject; with `stream`, daemons sharing the \
                         `durable` consumer share its messages",
                    ));
                }
                if self.ack_wait.get() < std::time::Duration::from_secs(1) {
                    problems.push(ConfigProblem::at(
                        &["ack_wait"],
                        "`ack_wait` must be at least 1s",
                    ));
                }
            }
            None => {
                for (key, given) in [
                    ("durable", self.durable.is_some()),
                    ("deliver", self.deliver != Deliver::default()),
                    ("ack_wait", self.ack_wait != default_ack_wait()),
                ] {
                    if given {
                        problems.push(ConfigProblem::at(
                            &[key],
                            format!(
                                "`{key}` is for a JetStream consumer: give `stream` (a core \
                                 subject has no consumer)"
                            ),
                        ));
                    }
                }
                if let Some(queue) = &self.queue
                    && let Some(why) = subject_problem(queue, false)
                {
                    problems.push(ConfigProblem::at(&["queue"], why));
                }
            }
        }
        problems
    }

    fn warnings(&self) -> Vec<ConfigProblem> {
        if self.stream.is_some() {
            return Vec::new();
        }
        vec![ConfigProblem::at(
            &["subject"],
            format!(
                "core NATS subject `{}` is read at most once: what is published while the \
                 daemon is down, reconnecting or at the topic's high-water mark is lost, and \
                 nothing is acknowledged; give `stream` to read a JetStream stream instead",
                self.subject
            ),
        )]
    }

    fn describe(&self) -> String {
        match &self.stream {
            Some(stream) => format!(
                "nats stream `{stream}` subject `{}` at {}",
                self.subject, self.connection.url
            ),
            None => format!(
                "nats core subject `{}` at {} (at most once)",
                self.subject, self.connection.url
            ),
        }
    }

    fn redelivery_horizon(&self) -> std::time::Duration {
        self.ack_wait.get()
    }

    fn read_max(&self) -> usize {
        usize::try_from(self.batch.get()).unwrap_or(usize::MAX)
    }
}

impl SinkBlock for NatsSinkConfig {
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        tls::resolve_ca(&mut self.connection.creds, dir);
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "nats"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_connection(&self.connection, self.tls.files(), &mut problems);
        if let Some(why) = subject_problem(&self.subject, false) {
            problems.push(ConfigProblem::at(&["subject"], why));
        }
        check_key_header(&self.key_header, &mut problems);
        problems
    }

    fn describe(&self) -> String {
        format!(
            "nats {} subject `{}` at {}",
            if self.jetstream { "jetstream" } else { "core" },
            self.subject,
            self.connection.url
        )
    }
}
