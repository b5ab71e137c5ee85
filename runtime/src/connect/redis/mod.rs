//! Redis Streams: a source (a consumer group, `XREADGROUP`, `XACK` after
//! the durable publish, `XAUTOCLAIM` of a dead reader's entries) and a
//! sink (`XADD`, made effectively-once by a dedup key set in the same
//! script).
//!
//! Both hold a redis-rs [`ConnectionManager`], created lazily (a server
//! that is down at start-up is an outage, not a failed start) and
//! reconnecting by itself. [`Conn`] adds what the manager does not do: a
//! connection that failed for a reason other than I/O (a refused `AUTH`)
//! is dropped and built anew on the next call, and every error is turned
//! into text with the password scrubbed.

mod config;
mod sink;
mod source;

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ClientTlsConfig, ErrorKind, RedisError, TlsCertificates};

pub use crate::config::connectors::redis::{
    RedisConnection, RedisSinkConfig, RedisSourceConfig, StartFrom,
};
pub use sink::RedisSink;
pub use source::RedisSource;

use crate::connect::SecretUrl;
use crate::connect::tls::{self, TlsFiles};

/// A lazily connected, self-reconnecting connection to one server.
pub(crate) struct Conn {
    client: redis::Client,
    /// The URL, shown redacted in errors (which server is down).
    pub(crate) url: SecretUrl,
    response_timeout: Duration,
    manager: Mutex<Option<ConnectionManager>>,
}

impl Conn {
    /// A connection to the block's `url`, not yet made. `rediss://` speaks TLS,
    /// trusting the CA certificates in `tls_ca` or else the system's
    /// roots, always checking the server's certificate and name, and
    /// showing `tls_cert` to a server that asks for a client certificate.
    /// Fails only on a URL or TLS file the client library cannot use (the
    /// message is scrubbed).
    pub(crate) fn new(
        connection: &RedisConnection,
        files: TlsFiles<'_>,
        response_timeout: Duration,
    ) -> Result<Conn, String> {
        let url = &connection.url;
        let client = if url.scheme() == "rediss" {
            if url.url().fragment() == Some("insecure") {
                return Err(format!(
                    "`{url}`: `#insecure` (no certificate check) is not supported; give the \
                     server's CA certificate as `tls_ca`"
                ));
            }
            // redis-rs builds its own rustls configuration, with the
            // process's default provider, from PEM (checked here first,
            // so a bad file is refused with its name).
            tls::install_default_provider();
            let root_cert = match files.ca {
                Some(path) => {
                    tls::read_roots(path)?;
                    Some(tls::read_pem(path)?)
                }
                None => None,
            };
            let client_tls = files.identity()?.map(|identity| ClientTlsConfig {
                client_cert: identity.pem.0,
                client_key: identity.pem.1,
            });
            redis::Client::build_with_tls(
                url.expose(),
                TlsCertificates {
                    client_tls,
                    root_cert,
                },
            )
        } else {
            redis::Client::open(url.expose())
        }
        .map_err(|e| url.scrub(&e.to_string()))?;
        Ok(Conn {
            client,
            url: url.clone(),
            response_timeout,
            manager: Mutex::new(None),
        })
    }

    /// The manager, created (not connected) if there is none.
    pub(crate) fn get(&self) -> Result<ConnectionManager, String> {
        let mut slot = self.manager.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(manager) = slot.as_ref() {
            return Ok(manager.clone());
        }
        // One quick attempt per call: the caller's backoff (the source
        // runner's, the sink's `unavailable` hold) does the waiting, so
        // an outage is reported at once.
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(self.response_timeout));
        let manager = ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            .map_err(|e| self.scrub(&e))?;
        *slot = Some(manager.clone());
        Ok(manager)
    }

    /// Notes a failed call: a connection that failed for a reason the
    /// manager does not reconnect on (authentication, a timeout) is
    /// dropped, so the next call builds a fresh one.
    pub(crate) fn failed(&self, err: &RedisError) {
        if is_outage(err) {
            *self.manager.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    /// The error as text, with the password scrubbed.
    pub(crate) fn scrub(&self, err: &RedisError) -> String {
        let text = self.url.scrub(&err.to_string());
        match tls::trust_hint(err) {
            Some(hint) => format!("{text} ({hint})"),
            None => text,
        }
    }
}

/// Whether `err` means the server could not be reached or talked to (as
/// opposed to an error reply to a command).
pub(crate) fn is_outage(err: &RedisError) -> bool {
    match err.kind() {
        ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::UnexpectedReturnType => {
            // NOAUTH / WRONGPASS come as replies, yet mean "cannot use
            // this server": a fresh connection with the right password
            // is the only way out. READONLY (a replica: a failover moved
            // the primary behind the same address), LOADING and
            // MASTERDOWN (not serving yet) likewise: the connection is
            // dropped, so the next one finds the server as it is now.
            matches!(
                err.code(),
                Some("NOAUTH" | "WRONGPASS" | "NOPERM" | "READONLY" | "LOADING" | "MASTERDOWN")
            )
        }
        _ => true,
    }
}
