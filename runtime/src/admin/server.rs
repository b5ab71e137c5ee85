//! The admin API's own accept loop, over hyper: what `axum::serve` does,
//! plus the limits a server facing slow or hostile clients needs.
//!
//! - a **connection cap** ([`ServerLimits::max_connections`]): past it a new
//!   connection is closed at once, so idle sockets cannot pile up;
//! - a **header-read timeout** ([`ServerLimits::header_timeout`]): a client
//!   gets that long to send a request's headers, on a new connection and
//!   between requests of a kept-alive one (hyper starts the clock whenever
//!   it waits for a request head), so an idle or dribbling socket is closed;
//!   the TLS handshake gets the same time;
//! - optional **TLS** (rustls), from `--admin-tls-cert`/`--admin-tls-key`;
//! - **graceful shutdown**: stop accepting, let requests in flight finish.
//!
//! Each request carries the peer address as [`ConnectInfo`], for the audit
//! log.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The default header-read (and keep-alive idle) timeout.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The default cap on open admin connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// The default longest pause within a request body.
pub const DEFAULT_BODY_IDLE: Duration = Duration::from_secs(30);

/// The default budget of request-body bytes in flight across all requests.
pub const DEFAULT_BODY_BUDGET: usize = 256 << 20;

/// How the admin server protects itself from slow and greedy clients.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    /// How long a client may take to send a request's headers (or stay idle
    /// between requests).
    pub header_timeout: Duration,
    /// How many connections may be open at once.
    pub max_connections: usize,
    /// How many request-body bytes may be held at once across all requests;
    /// past it ingest answers 503 with `Retry-After`.
    pub body_budget: usize,
    /// How long a request body may pause between two parts before the
    /// request is dropped (408) and its share of the budget freed.
    pub body_idle: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            body_budget: DEFAULT_BODY_BUDGET,
            body_idle: DEFAULT_BODY_IDLE,
        }
    }
}

/// Why the TLS certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no PEM item of the kind needed.
    #[error("cannot read the admin TLS {what} from {path}: {reason}")]
    Read {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// rustls refused the pair (say, the key does not match).
    #[error("the admin TLS certificate and key cannot be used together: {0}")]
    Config(String),
}

/// The rustls server configuration of a PEM certificate chain and key.
///
/// # Errors
///
/// A file is missing or unreadable, or the key does not fit the
/// certificate.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let read_err = |what, path: &Path, reason: String| TlsError::Read {
        what,
        path: path.display().to_string(),
        reason,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| read_err("certificate", cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| read_err("certificate", cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(read_err(
            "certificate",
            cert,
            "no PEM CERTIFICATE in it".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| read_err("key", key, e.to_string()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops
/// accepting and waits for the connections' requests in flight.
pub(super) async fn run(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut refused_logged = false;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // EMFILE and friends: wait a little rather than spin.
                    tracing::warn!("admin API cannot accept a connection: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if !refused_logged {
                tracing::warn!(
                    max = limits.max_connections,
                    "admin API at its connection cap; closing new connections until some end"
                );
                refused_logged = true;
            }
            drop(stream);
            continue;
        };
        refused_logged = false;
        let _ = stream.set_nodelay(true);
        let watcher = graceful.watcher();
        let http = http.clone();
        let app = app.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service =
                hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                    request.extensions_mut().insert(ConnectInfo(peer));
                    let mut app = app.clone();
                    async move { tower_service::Service::call(&mut app, request).await }
                });
            let result = match tls {
                None => {
                    watcher
                        .watch(http.serve_connection(TokioIo::new(stream), service))
                        .await
                }
                Some(acceptor) => {
                    let handshake =
                        tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await;
                    match handshake {
                        Ok(Ok(stream)) => {
                            watcher
                                .watch(http.serve_connection(TokioIo::new(stream), service))
                                .await
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, "admin TLS handshake failed: {err}");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "admin TLS handshake timed out");
                            return;
                        }
                    }
                }
            };
            if let Err(err) = result {
                tracing::debug!(%peer, "admin connection ended: {err}");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// The URL scheme the server speaks.
pub(super) fn scheme(tls: bool) -> &'static str {
    if tls { "https" } else { "http" }
}
