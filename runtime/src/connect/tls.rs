//! TLS for every connector that speaks it (HTTPS webhooks, `rediss://`,
//! Postgres with `sslmode`): one way to choose what is trusted.
//!
//! A connector trusts either the CA certificates in its `tls_ca` file
//! (and nothing else), or the system's roots (`SSL_CERT_FILE` /
//! `SSL_CERT_DIR`, else the OS store). The server's certificate is always
//! verified, host name included: there is no switch that turns the check
//! off, only `tls_ca` to name a private CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::ConfigProblem;

/// The PEM certificates in `path`, to trust as roots.
pub fn read_roots(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            format!(
                "the CA file {} is not PEM certificates: {e}",
                path.display()
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "the CA file {} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
            path.display()
        ));
    }
    Ok(certs)
}

/// The bytes of the CA file `path` (checked to hold certificates), for a
/// client library that parses PEM itself.
pub fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read the CA file {}: {e}", path.display()))
}

/// A rustls client configuration (aws-lc-rs) trusting `roots` only, or
/// the system's roots. rustls's own WebPKI verifier rather than a
/// platform verifier, which logs an error on every failed handshake: an
/// untrusted server is reported once per outage by the connector instead.
pub fn client_config(
    roots: Option<Vec<CertificateDer<'static>>>,
) -> Result<rustls::ClientConfig, String> {
    let mut store = rustls::RootCertStore::empty();
    match roots {
        Some(roots) => {
            for cert in roots {
                store
                    .add(cert)
                    .map_err(|e| format!("a certificate of `tls_ca` cannot be a root: {e}"))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(
                    problems = ?found.errors,
                    "no system CA certificates found: TLS servers will not be trusted unless \
                     `tls_ca` names their CA"
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?
        .with_root_certificates(store)
        .with_no_client_auth())
}

/// Makes aws-lc-rs the process's default rustls provider, for a client
/// library that builds its own rustls configuration (redis-rs). Idempotent.
pub fn install_default_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Makes a relative `tls_ca` absolute against the pipeline file's
/// directory.
pub fn resolve_ca(tls_ca: &mut Option<PathBuf>, dir: &Path) {
    if let Some(path) = tls_ca
        && path.is_relative()
    {
        *path = dir.join(&*path);
    }
}

/// The problem with `tls_ca`, if any: the file is missing.
pub fn check_ca(tls_ca: Option<&Path>, problems: &mut Vec<ConfigProblem>) {
    if let Some(path) = tls_ca
        && !path.is_file()
    {
        problems.push(ConfigProblem::at(
            &["tls_ca"],
            format!(
                "CA file not found: {} (a relative `tls_ca` path is relative to the \
                 pipeline file)",
                path.display()
            ),
        ));
    }
}

/// Whether `error` (or one of its causes) is a TLS certificate the
/// client refused: a server that is up but not trusted, which no retry
/// will fix until the operator does.
pub fn is_trust_error(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if let Some(tls) = cause.downcast_ref::<rustls::Error>()
            && matches!(
                tls,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            )
        {
            return true;
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(tls) = inner.downcast_ref::<rustls::Error>()
            && matches!(tls, rustls::Error::InvalidCertificate(_))
        {
            return true;
        }
        // rustls's words for a certificate it refused, wherever a client
        // library turned the error into text.
        if cause.to_string().contains("invalid peer certificate") {
            return true;
        }
        source = cause.source();
    }
    false
}
