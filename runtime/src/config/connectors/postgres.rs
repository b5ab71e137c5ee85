//! The `postgres:` blocks of a source (an outbox table) and of a sink (a
//! table, or the user's own statement): the configuration reference for
//! the Postgres connector.

use std::num::NonZeroU32;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::names::check_sql_identifier;
use super::postgres_statement::rewrite_statement;
use super::tls::{TlsFiles, TlsOptions};
use super::{ConfigProblem, SinkBlock, SourceBlock, describe};
use crate::config::{HumanDuration, SecretUrl};

/// A transactional-outbox table that producers insert into, in the same
/// transaction as their business rows.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// `url` and `statement_timeout`: see [`PostgresConnection`].
    #[serde(flatten)]
    pub connection: PostgresConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The outbox table, optionally schema-qualified: `id bigserial
    /// primary key, payload bytea not null, key text, headers jsonb,
    /// created_at timestamptz not null default now()`.
    pub outbox: String,
    /// Create the table (and its notify trigger) if it is missing.
    #[serde(default = "default_create")]
    pub create: bool,
    /// The most rows one read takes.
    #[serde(default = "default_outbox_batch")]
    pub batch: NonZeroU32,
    /// How often the table is read when no notification comes (the
    /// fallback to `LISTEN/NOTIFY`).
    #[serde(default = "default_poll")]
    pub poll: HumanDuration,
}

/// Where a Postgres block, source or sink, connects: flattened into the
/// block, so the keys stay beside its own. The TLS files are the block's
/// [`TlsOptions`], flattened beside it (serde cannot flatten one struct
/// in another under a block that denies unknown keys). Read, with them,
/// by [`crate::connect::postgres`]'s one connection builder.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct PostgresConnection {
    /// `postgres://user[:password]@host:port/db`. `${VAR}` is expanded;
    /// the password is never shown.
    pub url: SecretUrl,
    /// How long one statement may run on the server before the server
    /// cancels it (the session's `statement_timeout`), so a statement the
    /// connector gave up on does not hold its locks.
    #[serde(default = "default_statement_timeout")]
    pub statement_timeout: HumanDuration,
}

/// true.
pub fn default_create() -> bool {
    true
}

/// 100.
pub fn default_outbox_batch() -> NonZeroU32 {
    NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN)
}

/// 1 s.
pub fn default_poll() -> HumanDuration {
    HumanDuration::secs(1)
}

/// 30 s, the stage's default `timeout`.
pub fn default_statement_timeout() -> HumanDuration {
    HumanDuration::secs(30)
}

/// A Postgres table each message becomes a row of.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = |schema: &mut schemars::Schema| describe(schema, "url", SINK_URL))]
pub struct TableSinkConfig {
    /// `url` and `statement_timeout`: see [`PostgresConnection`].
    #[serde(flatten)]
    pub connection: PostgresConnection,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
    /// The table, optionally schema-qualified: `id text primary key,
    /// topic text, key text, headers jsonb, payload bytea, published_at
    /// timestamptz`. Rows are inserted with `ON CONFLICT (id) DO
    /// NOTHING`, so a redelivered message is a no-op.
    #[serde(default)]
    pub table: Option<String>,
    /// Your own SQL instead of `table`, with named parameters: `$id`,
    /// `$topic`, `$key`, `$payload` (bytea), `$payload_text`,
    /// `$payload_json`, `$published_at` and `$header_<name>`.
    #[serde(default)]
    pub statement: Option<String>,
    /// Create `table` if it is missing.
    #[serde(default = "default_create")]
    pub create: bool,
}

/// The sink's own words for `url` in the JSON Schema.
const SINK_URL: &str = "`postgres://user[:password]@host:port/db`.";

/// The problems of the connection options every Postgres block has.
fn check_connection(
    connection: &PostgresConnection,
    files: TlsFiles<'_>,
    problems: &mut Vec<ConfigProblem>,
) {
    let PostgresConnection {
        url,
        statement_timeout,
    } = connection;
    if !matches!(url.scheme().as_str(), "postgres" | "postgresql") {
        problems.push(ConfigProblem::at(
            &["url"],
            format!("`{url}` is not a Postgres URL; use `postgres://user@host:5432/db`"),
        ));
    }
    if let Some((key, message)) = check_tls(url, files) {
        problems.push(ConfigProblem::at(&[key], message));
    }
    files.check(problems);
    if statement_timeout.get().is_zero() {
        problems.push(ConfigProblem::at(
            &["statement_timeout"],
            "`statement_timeout` must be longer than 0s",
        ));
    }
}

/// The TLS a URL's `sslmode` asks for (every TLS mode verifies the
/// certificate and host name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Absent, or `disable`: no TLS.
    Disable,
    /// `prefer`: TLS if the server offers it, else none.
    Prefer,
    /// `require`, `verify-ca`, `verify-full`: TLS or no connection.
    Require,
}

/// The `sslmode` of `url`, or an error naming the modes there are.
pub fn ssl_mode(url: &SecretUrl) -> Result<SslMode, String> {
    match url.query_value("sslmode").as_deref() {
        None | Some("disable") => Ok(SslMode::Disable),
        Some("prefer") => Ok(SslMode::Prefer),
        Some("require" | "verify-ca" | "verify-full") => Ok(SslMode::Require),
        Some(other) => Err(format!(
            "`sslmode={other}` is not supported; use `disable`, `prefer`, `require`, \
             `verify-ca` or `verify-full` (every TLS mode verifies the certificate)"
        )),
    }
}

/// What is wrong with the URL's TLS options, if anything (for
/// `validate`): an unknown `sslmode`, `sslrootcert` or `sslcert` (give
/// `tls_ca`, `tls_cert`), or a TLS file without a TLS `sslmode`.
pub fn check_tls(url: &SecretUrl, files: TlsFiles<'_>) -> Option<(&'static str, String)> {
    for (param, option) in [("sslcert", "tls_cert"), ("sslkey", "tls_key")] {
        if url.query_value(param).is_some() {
            return Some((
                "url",
                format!("`{param}` in the URL is not read; give the file as `{option}`"),
            ));
        }
    }
    if url.query_value("sslrootcert").is_some() {
        return Some((
            "url",
            "`sslrootcert` in the URL is not read; give the CA file as `tls_ca`".into(),
        ));
    }
    match ssl_mode(url) {
        Err(e) => Some(("url", e)),
        Ok(SslMode::Disable) => files.first_given().map(|option| {
            (
                option,
                format!(
                    "`{option}` is for TLS: add `?sslmode=verify-full` (or `require`) to the URL"
                ),
            )
        }),
        Ok(_) => None,
    }
}

impl SourceBlock for OutboxConfig {
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_connection(&self.connection, self.tls.files(), &mut problems);
        if let Err(e) = check_sql_identifier(&self.outbox, true) {
            problems.push(ConfigProblem::at(&["outbox"], e));
        }
        if self.poll.get().is_zero() {
            problems.push(ConfigProblem::at(
                &["poll"],
                "`poll` must be longer than 0s",
            ));
        }
        problems
    }

    fn describe(&self) -> String {
        format!(
            "postgres outbox `{}` at {}",
            self.outbox, self.connection.url
        )
    }

    fn redelivery_horizon(&self) -> std::time::Duration {
        // A rolled-back read is read again at once.
        std::time::Duration::from_secs(60)
    }

    fn read_max(&self) -> usize {
        usize::try_from(self.batch.get()).unwrap_or(usize::MAX)
    }
}

impl SinkBlock for TableSinkConfig {
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        check_connection(&self.connection, self.tls.files(), &mut problems);
        match (&self.table, &self.statement) {
            (Some(table), None) => {
                if let Err(e) = check_sql_identifier(table, true) {
                    problems.push(ConfigProblem::at(&["table"], e));
                }
            }
            (None, Some(statement)) => {
                if let Err(e) = rewrite_statement(statement) {
                    problems.push(ConfigProblem::at(&["statement"], e.to_string()));
                }
            }
            (Some(_), Some(_)) => problems.push(ConfigProblem::at(
                &["statement"],
                "give `table` or `statement`, not both",
            )),
            (None, None) => problems.push(ConfigProblem::at(
                &[],
                "a postgres sink needs `table` (rows in Sluice's layout) or `statement` (your own SQL)",
            )),
        }
        problems
    }

    fn describe(&self) -> String {
        match &self.table {
            Some(table) => format!("postgres table `{table}` at {}", self.connection.url),
            None => format!("postgres statement at {}", self.connection.url),
        }
    }
}
