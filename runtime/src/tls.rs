//! TLS for every client Sluice opens: the connectors that speak it (HTTPS
//! webhooks, `rediss://`, Postgres with `sslmode`) and a handler's
//! outbound HTTP (`plugin/outbound.rs`): one way to choose what is
//! trusted. Its own module, below both, so the plugin host does not reach
//! into `connect/` for it (issue 44); `connect::tls` re-exports it.
//!
//! A connector trusts either the CA certificates in its `tls_ca` file
//! (and nothing else), or the system's roots (`SSL_CERT_FILE` /
//! `SSL_CERT_DIR`, else the OS store). The server's certificate is always
//! verified, host name included: there is no switch that turns the check
//! off, only `tls_ca` to name a private CA.
//!
//! A server that asks clients for a certificate (mutual TLS) gets the one
//! in `tls_cert` (PEM, the chain leaf first), proven with the private key
//! in `tls_key` (PEM: PKCS#8, PKCS#1 or SEC1).

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub use crate::config::connectors::tls::{TlsFiles, TlsOptions, check_ca, resolve_all, resolve_ca};

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

/// A client certificate chain and its private key, read and checked.
pub struct Identity {
    /// The chain, leaf first.
    pub certs: Vec<CertificateDer<'static>>,
    /// The private key.
    pub key: PrivateKeyDer<'static>,
    /// The same two as PEM, for a client library that parses PEM itself.
    pub pem: (Vec<u8>, Vec<u8>),
}

impl TlsFiles<'_> {
    /// The roots of `tls_ca`, if given.
    pub fn roots(&self) -> Result<Option<Vec<CertificateDer<'static>>>, String> {
        self.ca.map(read_roots).transpose()
    }

    /// The client identity of `tls_cert` and `tls_key`, if given.
    pub fn identity(&self) -> Result<Option<Identity>, String> {
        let (Some(cert), Some(key)) = (self.cert, self.key) else {
            return Ok(None);
        };
        let cert_pem = std::fs::read(cert)
            .map_err(|e| format!("cannot read `tls_cert` {}: {e}", cert.display()))?;
        let certs = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("`tls_cert` {} is not PEM certificates: {e}", cert.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "`tls_cert` {} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
                cert.display()
            ));
        }
        let key_pem = std::fs::read(key)
            .map_err(|e| format!("cannot read `tls_key` {}: {e}", key.display()))?;
        // The key's bytes never reach a message: only the file's name.
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
            format!(
                "`tls_key` {} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
                key.display()
            )
        })?;
        Ok(Some(Identity {
            certs,
            key: private,
            pem: (cert_pem, key_pem),
        }))
    }

    /// A rustls client configuration for these files
    /// ([`client_config`]).
    pub fn client_config(&self) -> Result<rustls::ClientConfig, String> {
        client_config(self.roots()?, self.identity()?)
    }
}

/// A rustls client configuration (aws-lc-rs) trusting `roots` only, or
/// the system's roots, and showing `identity` to a server that asks for a
/// client certificate. rustls's own WebPKI verifier rather than a
/// platform verifier, which logs an error on every failed handshake: an
/// untrusted server is reported once per outage by the connector instead.
pub fn client_config(
    roots: Option<Vec<CertificateDer<'static>>>,
    identity: Option<Identity>,
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
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS set-up: {e}"))?
        .with_root_certificates(store);
    match identity {
        Some(identity) => builder
            .with_client_auth_cert(identity.certs, identity.key)
            .map_err(|e| format!("`tls_cert` and `tls_key` cannot be used together: {e}")),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// What an operator should do about a TLS handshake that failed over
/// certificates, if `error` is one: the server's certificate is not
/// trusted, or the server refused (or asked for) this client's.
pub fn trust_hint(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    if is_trust_error(error) {
        return Some(
            "the server's TLS certificate is not trusted: give its CA in `tls_ca`, or fix the \
             server's certificate",
        );
    }
    if is_client_refused(error) {
        return Some(
            "the server refused this client's TLS certificate, or wants one: give a \
             certificate it accepts as `tls_cert`, with its key as `tls_key`",
        );
    }
    None
}

/// The alerts with which a server refuses this client's certificate (or
/// the lack of one).
const CLIENT_REFUSALS: [rustls::AlertDescription; 8] = [
    rustls::AlertDescription::CertificateRequired,
    rustls::AlertDescription::BadCertificate,
    rustls::AlertDescription::UnknownCA,
    rustls::AlertDescription::CertificateUnknown,
    rustls::AlertDescription::UnsupportedCertificate,
    rustls::AlertDescription::CertificateRevoked,
    rustls::AlertDescription::CertificateExpired,
    rustls::AlertDescription::AccessDenied,
];

/// Each error of `error`'s chain, with the rustls error it is or wraps
/// (in an `io::Error`, as tokio-rustls reports one), if any.
fn causes<'e>(
    error: &'e (dyn std::error::Error + 'static),
) -> impl Iterator<
    Item = (
        &'e (dyn std::error::Error + 'static),
        Option<&'e rustls::Error>,
    ),
> {
    std::iter::successors(Some(error), |cause| cause.source()).map(|cause| {
        let tls = cause.downcast_ref::<rustls::Error>().or_else(|| {
            cause
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        (cause, tls)
    })
}

/// Whether the server's TLS alert says it did not accept this client's
/// certificate (or the lack of one): as a rustls error, or in rustls's
/// words where a client library turned the error into text.
fn is_client_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    causes(error).any(|(cause, tls)| match tls {
        Some(rustls::Error::AlertReceived(alert)) => CLIENT_REFUSALS.contains(alert),
        _ => {
            let text = cause.to_string();
            CLIENT_REFUSALS
                .iter()
                .any(|alert| text.contains(&format!("received fatal alert: {alert:?}")))
        }
    })
}

/// Makes aws-lc-rs the process's default rustls provider, for a client
/// library that builds its own rustls configuration (redis-rs). Idempotent.
pub fn install_default_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Whether `error` (or one of its causes) is a TLS certificate the
/// client refused: a server that is up but not trusted, which no retry
/// will fix until the operator does.
pub fn is_trust_error(error: &(dyn std::error::Error + 'static)) -> bool {
    causes(error).any(|(cause, tls)| {
        matches!(
            tls,
            Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)
        ) || cause.to_string().contains("invalid peer certificate")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::connectors::ConfigProblem;

    fn paths(problems: &[ConfigProblem]) -> Vec<String> {
        problems.iter().map(|p| p.path.join(".")).collect()
    }

    /// An error that wraps another, as client libraries do.
    #[derive(Debug)]
    struct Outer(std::io::Error);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("connecting failed")
        }
    }

    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn refused_certificates_are_found_anywhere_in_the_chain() {
        use rustls::{AlertDescription, CertificateError, Error};
        let untrusted = Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(is_trust_error(&untrusted) && !is_client_refused(&untrusted));
        let deep = Outer(std::io::Error::other(untrusted));
        assert!(is_trust_error(&deep));
        assert!(trust_hint(&deep).is_some_and(|h| h.contains("tls_ca")));

        let refused = Error::AlertReceived(AlertDescription::CertificateRequired);
        assert!(is_client_refused(&refused) && !is_trust_error(&refused));
        let deep = Outer(std::io::Error::other(refused));
        assert!(is_client_refused(&deep));
        assert!(trust_hint(&deep).is_some_and(|h| h.contains("tls_cert")));

        // Where a client library kept only rustls's words.
        let said = std::io::Error::other("handshake: received fatal alert: UnknownCA");
        assert!(is_client_refused(&said));
        let said = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        assert!(is_trust_error(&said));

        // Other TLS failures get no certificate hint.
        let other = Error::AlertReceived(AlertDescription::HandshakeFailure);
        assert!(trust_hint(&other).is_none());
        assert!(trust_hint(&std::io::Error::other("connection refused")).is_none());
    }

    #[test]
    fn a_certificate_needs_its_key_and_each_file_must_exist() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("client.pem");
        std::fs::write(&cert, "x").expect("write");
        let missing = dir.path().join("nope.key");
        let mut problems = Vec::new();
        TlsFiles {
            cert: Some(&cert),
            ..TlsFiles::default()
        }
        .check(&mut problems);
        assert_eq!(paths(&problems), ["tls_cert"]);
        assert!(problems[0].message.contains("needs `tls_key`"));
        let mut problems = Vec::new();
        TlsFiles {
            cert: Some(&cert),
            key: Some(&missing),
            ..TlsFiles::default()
        }
        .check(&mut problems);
        assert_eq!(paths(&problems), ["tls_key"]);
        assert!(problems[0].message.contains("not found"));
    }

    #[test]
    fn an_identity_is_read_and_a_bad_key_is_named_without_its_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let made = rcgen::generate_simple_self_signed(vec!["client".into()]).expect("cert");
        let cert = dir.path().join("client.pem");
        let key = dir.path().join("client.key");
        std::fs::write(&cert, made.cert.pem()).expect("write");
        std::fs::write(&key, made.signing_key.serialize_pem()).expect("write");
        let files = TlsFiles {
            cert: Some(&cert),
            key: Some(&key),
            ..TlsFiles::default()
        };
        let identity = files.identity().expect("read").expect("given");
        assert_eq!(identity.certs.len(), 1);
        assert!(files.client_config().is_ok());
        // A key file that holds a certificate instead: refused by name.
        let wrong = TlsFiles {
            cert: Some(&cert),
            key: Some(&cert),
            ..TlsFiles::default()
        };
        let error = wrong.identity().err().expect("refused");
        assert!(error.contains("no PEM private key"), "{error}");
        assert!(!error.contains("BEGIN"), "{error}");
    }
}
