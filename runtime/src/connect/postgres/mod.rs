//! Postgres: a transactional-outbox source (rows read in `id` order with
//! `FOR UPDATE SKIP LOCKED`, published, then deleted in the same
//! transaction; `LISTEN/NOTIFY` wakes it) and a table sink (`INSERT ...
//! ON CONFLICT (id) DO NOTHING`, or the user's own statement).
//!
//! Both speak to the server through `tokio-postgres`, over TLS when the
//! URL's `sslmode` asks for it ([`connection`]). Identifiers come from the
//! configuration only after
//! [`check_sql_identifier`](crate::connect::names::check_sql_identifier),
//! and are double-quoted when spliced; values are always bound.

mod config;
mod connection;
mod outbox;
mod table;

pub use crate::config::connectors::postgres::{OutboxConfig, TableSinkConfig};
pub use table::{Param, RewriteError, Rewritten, rewrite_statement};

use crate::connect::SecretUrl;

/// `app.outbox` as SQL: `"app"."outbox"`. Only for names that passed
/// `check_sql_identifier` (no quotes inside).
pub(crate) fn quote_ident(name: &str) -> String {
    name.split('.')
        .map(|part| format!("\"{part}\""))
        .collect::<Vec<_>>()
        .join(".")
}

/// A client library error as text for logs, readiness and dead letters:
/// the server's SQLSTATE, message and detail when it answered, else the
/// error and its causes; the password scrubbed.
pub(crate) fn describe(url: &SecretUrl, err: &tokio_postgres::Error) -> String {
    let text = match err.as_db_error() {
        Some(db) => {
            let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                text.push_str(": ");
                text.push_str(detail);
            }
            text
        }
        None => {
            let mut text = err.to_string();
            let mut source = std::error::Error::source(err);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    };
    let text = url.scrub(&text);
    match crate::connect::tls::trust_hint(err) {
        Some(hint) => format!("{text} ({hint})"),
        // A server that wants client certificates (`clientcert=` in
        // pg_hba.conf) says so after the handshake, as an auth error.
        None if wants_client_certificate(err) => {
            format!(
                "{text} (give a client certificate the server accepts as `tls_cert`, with its key as `tls_key`)"
            )
        }
        None => text,
    }
}

/// Whether the server refused the login over its client certificate: a
/// missing one, or one that failed `clientcert=verify-ca`/`verify-full`
/// or `cert` authentication. All are SQLSTATE 28000 (also used for other
/// refusals, such as no `pg_hba.conf` entry), with messages that name the
/// certificate.
fn wants_client_certificate(err: &tokio_postgres::Error) -> bool {
    err.as_db_error().is_some_and(|db| {
        *db.code() == tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            && db.message().contains("certificate")
    })
}
