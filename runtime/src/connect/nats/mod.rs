//! NATS: a source (a durable JetStream pull consumer acked after the
//! durable publish, or a core subscription, at most once) and a sink (a
//! JetStream publish with `Nats-Msg-Id` set to the Sluice id, awaiting the
//! `PubAck`, or a core publish).
//!
//! Both hold one async-nats [`Client`](async_nats::Client), made at build
//! without waiting for the server (`retry_on_initial_connect`): a server
//! that is down at start-up is an outage, not a failed start. The client
//! reconnects by itself, forever, and restores subscriptions; [`Conn`]
//! turns "not connected" into an outage at once (so readiness shows it)
//! and keeps the last connection error, scrubbed of every secret, to say
//! why.
//!
//! Metadata travels in headers, as on the NATS broker: the key in
//! `Sluice-Key` (`key_header`), the id in `Nats-Msg-Id` and `sluice-id`;
//! NATS's own `Nats-*` headers are controls of one publish and are never
//! copied onward.

mod config;
mod sink;
mod source;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::connection::State;

pub(crate) use crate::config::connectors::nats::NatsConnection;
pub use crate::config::connectors::nats::{
    Deliver, NatsSinkConfig, NatsSourceConfig, default_durable,
};
pub use sink::NatsSink;
pub use source::NatsSource;

use crate::connect::SecretUrl;
use crate::connect::tls::{self, TlsFiles};

/// One client's connection: the client, what to call it in messages, and
/// the last connection error.
pub(crate) struct Conn {
    pub(crate) client: async_nats::Client,
    /// The URL, shown redacted.
    pub(crate) url: SecretUrl,
    /// Every secret the client was given, for scrubbing error text.
    secrets: Vec<String>,
    last_error: Arc<Mutex<Option<String>>>,
    /// Whether the client was ever seen connected.
    was_up: AtomicBool,
}

/// How long a first contact waits for the connection being made at
/// start-up before it counts as an outage.
const FIRST_CONNECT: Duration = Duration::from_secs(3);

impl Conn {
    /// A client of the block's `url`, connecting in the background (and
    /// reconnecting forever). Fails only on settings the client library
    /// refuses (a TLS or creds file it cannot use); the message is
    /// scrubbed.
    pub(crate) async fn new(
        connection: &NatsConnection,
        files: TlsFiles<'_>,
        name: &str,
    ) -> Result<Conn, String> {
        let (url, auth) = (&connection.url, connection.auth());
        let parsed = url.url();
        let mut secrets: Vec<String> = Vec::new();
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .max_reconnects(None)
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .request_timeout(Some(Duration::from_secs(10)))
            // The client's own backoff, capped low: the source runner's
            // and the sink's holds do the waiting, and a server that is
            // back must be found soon.
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis(
                    100 * 2u64.saturating_pow(u32::try_from(attempts.min(6)).unwrap_or(6)),
                )
                .min(Duration::from_secs(2))
            });
        if let Some(password) = parsed.password() {
            let user = percent_decode(parsed.username());
            let password = percent_decode(password);
            secrets.push(password.clone());
            options = options.user_and_password(user, password);
        }
        if let (Some(user), Some(password)) = (auth.user, auth.password) {
            secrets.push(password.expose().to_owned());
            options = options.user_and_password(user.to_owned(), password.expose().to_owned());
        }
        if let Some(token) = auth.token {
            secrets.push(token.expose().to_owned());
            options = options.token(token.expose().to_owned());
        }
        if let Some(creds) = auth.creds {
            options = options.credentials_file(creds).await.map_err(|e| {
                // The error may quote the file's content: never shown.
                format!("cannot use `creds` {}: {}", creds.display(), e.kind())
            })?;
        }
        let host = parsed.host_str().unwrap_or_default().to_owned();
        let port = parsed.port().unwrap_or(4222);
        let mut probe = None;
        if parsed.scheme() == "tls" || files.first_given().is_some() {
            let config = files.client_config()?;
            probe = Some(TlsProbe::new(&host, port, Arc::new(config.clone())));
            options = options.require_tls(true).tls_client_config(config);
        }
        let last_error: Arc<Mutex<Option<String>>> = Arc::default();
        let seen = last_error.clone();
        let shown = url.clone();
        let scrub_with = secrets.clone();
        options = options.event_callback(move |event| {
            let seen = seen.clone();
            let shown = shown.clone();
            let scrub_with = scrub_with.clone();
            let probe = probe.clone();
            async move {
                let probe = probe.clone();
                let text = match event {
                    // async-nats says only `IO error` or `TLS error` for a
                    // handshake it could not make: a probe finds out
                    // whether the certificates are why.
                    async_nats::Event::ClientError(err) => match probe {
                        Some(probe) => match probe.hint().await {
                            Some(hint) => format!("{err}: {hint}"),
                            None => err.to_string(),
                        },
                        None => err.to_string(),
                    },
                    async_nats::Event::ServerError(err) => err.to_string(),
                    async_nats::Event::Connected => {
                        *seen.lock().unwrap_or_else(PoisonError::into_inner) = None;
                        return;
                    }
                    other => {
                        tracing::debug!(event = %other, "nats connector event");
                        return;
                    }
                };
                let text = scrub(&shown, &scrub_with, &text);
                tracing::debug!(error = %text, "nats connector: connection error");
                *seen.lock().unwrap_or_else(PoisonError::into_inner) = Some(text);
            }
        });
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        let addr: async_nats::ServerAddr = format!("{}://{host}:{port}", parsed.scheme())
            .parse()
            .map_err(|e| url.scrub(&format!("`{url}`: {e}")))?;
        let client = options
            .connect(addr)
            .await
            .map_err(|e| scrub(url, &secrets, &format!("NATS at {url}: {e}")))?;
        Ok(Conn {
            client,
            url: url.clone(),
            secrets,
            last_error,
            was_up: AtomicBool::new(false),
        })
    }

    /// Whether the client is connected, waiting up to `grace` for it (up
    /// to [`FIRST_CONNECT`] before it was ever up: the connection made at
    /// start-up is not an outage).
    pub(crate) async fn ready(&self, grace: Duration) -> bool {
        let grace = if self.was_up.load(Ordering::Relaxed) {
            grace
        } else {
            grace.max(FIRST_CONNECT)
        };
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            if self.connected() {
                self.was_up.store(true, Ordering::Relaxed);
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the client is connected now (kept by its connection task:
    /// no network wait).
    pub(crate) fn connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    /// Why the server cannot be used now, for an outage.
    pub(crate) fn down(&self, what: &str) -> String {
        let state = match self.client.connection_state() {
            State::Connected => "connected",
            State::Pending => "connecting",
            State::Disconnected => "disconnected",
        };
        let last = self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .map_or_else(String::new, |e| format!("; last error: {e}"));
        format!("NATS at {} ({what}): {state}{last}", self.url)
    }

    /// `text` with every secret of this connection replaced by `***`.
    pub(crate) fn scrub(&self, text: &str) -> String {
        scrub(&self.url, &self.secrets, text)
    }
}

/// A TLS handshake made on its own, as NATS makes it (the server's
/// `INFO` line in clear, then TLS), to tell an operator why the client's
/// fails: async-nats reports a refused certificate as a bare `IO error`.
/// At most one probe per [`TlsProbe::EVERY`]; the answer is kept between.
#[derive(Clone)]
struct TlsProbe {
    host: String,
    port: u16,
    config: Arc<rustls::ClientConfig>,
    /// When the last probe ran, and its hint.
    last: Arc<tokio::sync::Mutex<Option<Probed>>>,
}

/// When a probe ran, and what it found.
type Probed = (tokio::time::Instant, Option<&'static str>);

impl TlsProbe {
    /// How often a failing connection is probed again.
    const EVERY: Duration = Duration::from_secs(30);
    /// How long one probe may take.
    const TIMEOUT: Duration = Duration::from_secs(5);

    fn new(host: &str, port: u16, config: Arc<rustls::ClientConfig>) -> TlsProbe {
        TlsProbe {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
            config,
            last: Arc::default(),
        }
    }

    /// What the operator should do, when the server's handshake fails
    /// over certificates ([`tls::trust_hint`]); `None` otherwise, or when
    /// the server cannot be reached at all.
    async fn hint(&self) -> Option<&'static str> {
        let mut last = self.last.lock().await;
        if let Some((at, hint)) = *last
            && at.elapsed() < Self::EVERY
        {
            return hint;
        }
        let hint = tokio::time::timeout(Self::TIMEOUT, self.handshake())
            .await
            .ok()
            .flatten();
        *last = Some((tokio::time::Instant::now(), hint));
        hint
    }

    async fn handshake(&self) -> Option<&'static str> {
        use tokio::io::AsyncBufReadExt;
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .ok()?;
        // The server speaks first, in clear: one `INFO {...}` line, then it
        // waits for the client, so nothing more is buffered.
        let mut reader = tokio::io::BufReader::new(tcp);
        let mut info = String::new();
        reader.read_line(&mut info).await.ok()?;
        let name = rustls_pki_types::ServerName::try_from(self.host.clone()).ok()?;
        match tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(name, reader.into_inner())
            .await
        {
            Ok(_) => None,
            Err(e) => tls::trust_hint(&e),
        }
    }
}

fn scrub(url: &SecretUrl, secrets: &[String], text: &str) -> String {
    let mut out = url.scrub(text);
    for secret in secrets {
        if secret.len() >= 3 {
            out = out.replace(secret.as_str(), "***");
        }
    }
    out
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `name` is a NATS control header (`Nats-` in any case), which
/// belongs to one publish and is never copied onward.
pub(crate) fn is_control(name: &str) -> bool {
    name.get(..5)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case("nats-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_scrubbed_from_errors() {
        let url = SecretUrl::parse("nats://app:s3cr%40t@h:4222").expect("url");
        let said = scrub(
            &url,
            &["s3cr@t".into(), "t0k3n".into()],
            "authorization violation for app:s3cr@t (t0k3n) at nats://app:s3cr%40t@h:4222",
        );
        assert!(!said.contains("s3cr") && !said.contains("t0k3n"), "{said}");
        assert_eq!(percent_decode("s3cr%40t"), "s3cr@t");
    }

    #[test]
    fn control_headers_are_known() {
        assert!(is_control("Nats-Msg-Id"));
        assert!(is_control("nats-expected-stream"));
        assert!(!is_control("Natsy"));
        assert!(!is_control("x"));
    }
}
