//! How the Postgres connector connects: the URL, its `sslmode`, the
//! `tls_ca` to trust, and the server-side `statement_timeout`.
//!
//! | `sslmode` in the URL | what Sluice does |
//! |---|---|
//! | absent, `disable` | no TLS |
//! | `prefer` | TLS if the server offers it (certificate verified), else none |
//! | `require`, `verify-ca`, `verify-full` | TLS or no connection; the certificate and host name always verified |
//!
//! Unlike libpq, `require` verifies the certificate too: a connection
//! that encrypts to whoever answers is not one Sluice makes. A private CA
//! is given as `tls_ca`.

use std::time::Duration;

use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::connectors::postgres;
#[cfg(test)]
use crate::config::connectors::postgres::check_tls as check;
use crate::connect::SecretUrl;
use crate::connect::tls::TlsFiles;

/// What a connection needs: the client configuration and the TLS
/// connector (used only when `sslmode` asks for TLS).
pub(crate) struct ConnectSettings {
    /// The parsed URL, with `ssl_mode` and `statement_timeout` set.
    pub config: tokio_postgres::Config,
    /// rustls, trusting `tls_ca` or the system's roots.
    pub tls: MakeRustlsConnect,
}

/// The `sslmode` of `url` as tokio-postgres's mode, or an error naming
/// the modes there are (config's [`postgres::ssl_mode`], which `validate`
/// checks).
pub(crate) fn ssl_mode(url: &SecretUrl) -> Result<SslMode, String> {
    Ok(match postgres::ssl_mode(url)? {
        postgres::SslMode::Disable => SslMode::Disable,
        postgres::SslMode::Prefer => SslMode::Prefer,
        postgres::SslMode::Require => SslMode::Require,
    })
}

/// The settings for `url`: `sslmode` taken out of the URL (tokio-postgres
/// knows only some of libpq's modes) and applied as the table above says;
/// `statement_timeout` set for the session, so the server itself stops a
/// statement the connector has given up on. The error never carries the
/// password.
pub(crate) fn settings(
    url: &SecretUrl,
    files: TlsFiles<'_>,
    statement_timeout: Duration,
) -> Result<ConnectSettings, String> {
    let mode = ssl_mode(url)?;
    let mut config: tokio_postgres::Config = without_sslmode(url.expose())
        .parse()
        .map_err(|e| url.scrub(&format!("postgres URL: {e}")))?;
    config.ssl_mode(mode);
    let timeout_ms = statement_timeout.as_millis().max(1);
    let options = match config.get_options() {
        Some(given) if given.contains("statement_timeout") => given.to_owned(),
        Some(given) => format!("{given} -c statement_timeout={timeout_ms}"),
        None => format!("-c statement_timeout={timeout_ms}"),
    };
    config.options(&options);
    let tls = MakeRustlsConnect::new(files.client_config()?);
    Ok(ConnectSettings { config, tls })
}

/// `raw` with its `sslmode` query parameter removed, the rest (encoding
/// included) as written.
fn without_sslmode(raw: &str) -> String {
    let Some((head, query)) = raw.split_once('?') else {
        return raw.to_owned();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|part| !part.is_empty() && part.split('=').next() != Some("sslmode"))
        .collect();
    let mut out = head.to_owned();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(raw: &str) -> SecretUrl {
        SecretUrl::parse(raw).expect("a URL")
    }

    #[test]
    fn libpq_modes_map_onto_verified_tls_or_none() {
        let mode = |raw: &str| ssl_mode(&url(raw));
        assert_eq!(mode("postgres://h/db"), Ok(SslMode::Disable));
        assert_eq!(
            mode("postgres://h/db?sslmode=disable"),
            Ok(SslMode::Disable)
        );
        assert_eq!(mode("postgres://h/db?sslmode=prefer"), Ok(SslMode::Prefer));
        for tls in ["require", "verify-ca", "verify-full"] {
            assert_eq!(
                mode(&format!("postgres://h/db?sslmode={tls}")),
                Ok(SslMode::Require)
            );
        }
        let err = mode("postgres://h/db?sslmode=allow").expect_err("not a mode we make");
        assert!(err.contains("verify-full"), "{err}");
    }

    #[test]
    fn sslmode_leaves_the_url_the_rest_stays_as_written() {
        assert_eq!(
            without_sslmode("postgres://u:p%40ss@h/db?sslmode=verify-full&options=-c%20x%3D1"),
            "postgres://u:p%40ss@h/db?options=-c%20x%3D1"
        );
        assert_eq!(
            without_sslmode("postgres://h/db?sslmode=require"),
            "postgres://h/db"
        );
        assert_eq!(without_sslmode("postgres://h/db"), "postgres://h/db");
    }

    #[test]
    fn settings_set_the_mode_and_the_statement_timeout() {
        let s = settings(
            &url("postgres://app:pw@h:5432/db?sslmode=verify-full"),
            TlsFiles::default(),
            Duration::from_secs(5),
        )
        .expect("settings");
        assert_eq!(s.config.get_ssl_mode(), SslMode::Require);
        assert_eq!(s.config.get_options(), Some("-c statement_timeout=5000"));
        let own = settings(
            &url("postgres://h/db?options=-c%20statement_timeout%3D100"),
            TlsFiles::default(),
            Duration::from_secs(5),
        )
        .expect("settings");
        assert_eq!(own.config.get_options(), Some("-c statement_timeout=100"));
    }

    #[test]
    fn checks_name_the_option_at_fault() {
        assert_eq!(
            check(
                &url("postgres://h/db?sslmode=verify-full"),
                TlsFiles::default()
            ),
            None
        );
        assert_eq!(
            check(
                &url("postgres://h/db"),
                TlsFiles {
                    ca: Some(std::path::Path::new("/ca.pem")),
                    ..TlsFiles::default()
                }
            )
            .map(|p| p.0),
            Some("tls_ca")
        );
        assert_eq!(
            check(
                &url("postgres://h/db"),
                TlsFiles {
                    key: Some(std::path::Path::new("/client.key")),
                    ..TlsFiles::default()
                }
            )
            .map(|p| p.0),
            Some("tls_key")
        );
        assert_eq!(
            check(
                &url("postgres://h/db?sslmode=require&sslkey=/k.pem"),
                TlsFiles::default()
            )
            .map(|p| p.0),
            Some("url")
        );
        assert_eq!(
            check(
                &url("postgres://h/db?sslrootcert=/ca.pem&sslmode=require"),
                TlsFiles::default()
            )
            .map(|p| p.0),
            Some("url")
        );
        assert_eq!(
            check(&url("postgres://h/db?sslmode=bogus"), TlsFiles::default()).map(|p| p.0),
            Some("url")
        );
    }
}
