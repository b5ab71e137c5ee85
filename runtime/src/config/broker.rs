//! A pipeline's `broker:`: `embedded`, or where a NATS broker is and how
//! to log in, parsed from a `nats://` URL. The broker itself connects with
//! these (`crate::broker::nats`).
//!
//! ```text
//! nats://[user:password@ | token@]host:port[,host:port...][?replicas=3&creds=PATH&tls_ca=PATH]
//! tls://host:port...                       (the same, with TLS required)
//! ```
//!
//! Secrets can stay out of the URL: `SLUICE_NATS_CREDS` (a `.creds` file),
//! `SLUICE_NATS_TOKEN`, `SLUICE_NATS_USER` + `SLUICE_NATS_PASSWORD` and
//! `SLUICE_NATS_TLS_CA` fill in whatever the URL leaves out. Everything goes
//! through async-nats's own connect options.

use std::path::PathBuf;
use std::time::Duration;

/// How to reach a NATS server or cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsOptions {
    /// `nats://host:port` (or `tls://`) of each seed server.
    pub servers: Vec<String>,
    /// Replicas of every stream this daemon creates (1 on a single server,
    /// 3 on a 3-node cluster).
    pub replicas: usize,
    /// User and password.
    pub user_password: Option<(String, String)>,
    /// A token.
    pub token: Option<String>,
    /// A `.creds` file (JWT + nkey seed).
    pub creds: Option<PathBuf>,
    /// A CA certificate to trust for TLS; setting it requires TLS.
    pub tls_ca: Option<PathBuf>,
    /// Whether TLS is required (`tls://`, or a CA given).
    pub require_tls: bool,
    /// The duplicate window of the streams this daemon creates, unless a
    /// topic needs a longer one; see [`crate::broker::nats::NatsBroker`].
    pub duplicate_window: Duration,
}

/// Secrets never reach logs or error messages.
impl std::fmt::Debug for NatsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsOptions")
            .field("servers", &self.servers)
            .field("replicas", &self.replicas)
            .field("user", &self.user_password.as_ref().map(|(u, _)| u))
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("creds", &self.creds)
            .field("tls_ca", &self.tls_ca)
            .field("require_tls", &self.require_tls)
            .finish()
    }
}

/// The duplicate window when nothing asks for longer: JetStream's own default.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// A `nats://` URL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad NATS broker URL `{url}`: {why}")]
pub struct BadNatsUrl {
    url: String,
    why: String,
}

impl NatsOptions {
    /// Whether `url` names a NATS broker (as opposed to `embedded`).
    pub fn is_nats_url(url: &str) -> bool {
        url.starts_with("nats://") || url.starts_with("tls://")
    }

    /// Parses a broker URL, then fills gaps from the environment.
    pub fn parse(url: &str) -> Result<NatsOptions, BadNatsUrl> {
        let mut options = Self::parse_url(url)?;
        options.fill_from(|name| std::env::var(name).ok().filter(|v| !v.is_empty()));
        Ok(options)
    }

    /// Parses a broker URL alone.
    fn parse_url(url: &str) -> Result<NatsOptions, BadNatsUrl> {
        let bad = |why: &str| BadNatsUrl {
            url: redact(url),
            why: why.to_owned(),
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("expected nats://host:port"))?;
        if scheme != "nats" && scheme != "tls" {
            return Err(bad("the scheme must be nats:// or tls://"));
        }
        let (hosts, query) = match rest.split_once('?') {
            Some((hosts, query)) => (hosts, Some(query)),
            None => (rest, None),
        };
        let (credentials, hosts) = match hosts.rsplit_once('@') {
            Some((credentials, hosts)) => (Some(credentials), hosts),
            None => (None, hosts),
        };
        let mut options = NatsOptions {
            servers: Vec::new(),
            replicas: 1,
            user_password: None,
            token: None,
            creds: None,
            tls_ca: None,
            require_tls: scheme == "tls",
            duplicate_window: DEFAULT_DUPLICATE_WINDOW,
        };
        match credentials {
            Some("") => return Err(bad("empty credentials before `@`")),
            Some(c) => match c.split_once(':') {
                Some((user, password)) => {
                    options.user_password = Some((user.to_owned(), password.to_owned()));
                }
                None => options.token = Some(c.to_owned()),
            },
            None => {}
        }
        for host in hosts.split(',') {
            let host = host.trim().trim_end_matches('/');
            let host = host
                .strip_prefix("nats://")
                .or_else(|| host.strip_prefix("tls://"))
                .unwrap_or(host);
            if host.is_empty() {
                return Err(bad("a server address is empty"));
            }
            let port_ok = host
                .rsplit_once(':')
                .is_none_or(|(_, port)| port.parse::<u16>().is_ok());
            if !port_ok {
                return Err(bad(&format!("`{host}` has a bad port")));
            }
            options.servers.push(format!("{scheme}://{host}"));
        }
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "replicas" => {
                    options.replicas = value
                        .parse()
                        .ok()
                        .filter(|r| (1..=5).contains(r))
                        .ok_or_else(|| bad("replicas must be a number from 1 to 5"))?;
                }
                "creds" => options.creds = Some(PathBuf::from(value)),
                "tls_ca" => {
                    options.tls_ca = Some(PathBuf::from(value));
                    options.require_tls = true;
                }
                "duplicate_window" => {
                    options.duplicate_window = humantime::parse_duration(value)
                        .map_err(|e| bad(&format!("duplicate_window: {e}")))?;
                }
                other => {
                    return Err(bad(&format!(
                        "unknown option `{other}` (known: replicas, creds, tls_ca, duplicate_window)"
                    )));
                }
            }
        }
        Ok(options)
    }

    /// Takes from `env` whatever the URL did not say.
    fn fill_from(&mut self, env: impl Fn(&str) -> Option<String>) {
        if self.creds.is_none() {
            self.creds = env("SLUICE_NATS_CREDS").map(PathBuf::from);
        }
        if self.token.is_none() && self.user_password.is_none() {
            self.token = env("SLUICE_NATS_TOKEN");
            if let (Some(user), Some(password)) =
                (env("SLUICE_NATS_USER"), env("SLUICE_NATS_PASSWORD"))
            {
                self.user_password = Some((user, password));
            }
        }
        if self.tls_ca.is_none()
            && let Some(ca) = env("SLUICE_NATS_TLS_CA")
        {
            self.tls_ca = Some(PathBuf::from(ca));
            self.require_tls = true;
        }
    }

    /// The servers, for messages.
    pub fn describe(&self) -> String {
        self.servers.join(",")
    }
}

/// `url` with any credentials replaced, for error messages.
fn redact(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, hosts))) => format!("{scheme}://<redacted>@{hosts}"),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_servers_credentials_and_options() {
        let o = NatsOptions::parse_url(
            "nats://alice:s3cret@127.0.0.1:4222,127.0.0.1:4223?replicas=3&creds=/x.creds",
        )
        .expect("valid");
        assert_eq!(
            o.servers,
            ["nats://127.0.0.1:4222", "nats://127.0.0.1:4223"]
        );
        assert_eq!(o.user_password, Some(("alice".into(), "s3cret".into())));
        assert_eq!(o.replicas, 3);
        assert_eq!(o.creds, Some(PathBuf::from("/x.creds")));
        assert!(!o.require_tls);

        let o = NatsOptions::parse_url("tls://tok@h:1").expect("valid");
        assert_eq!(o.token.as_deref(), Some("tok"));
        assert!(o.require_tls);
    }

    #[test]
    fn refuses_bad_urls_without_leaking_secrets() {
        for url in [
            "http://h:1",
            "nats://h:notaport",
            "nats://h:1?replicas=0",
            "nats://h:1?colour=blue",
            "nats://",
        ] {
            assert!(NatsOptions::parse_url(url).is_err(), "{url}");
        }
        let err = NatsOptions::parse_url("nats://bob:pw@h:x").expect_err("bad port");
        assert!(!err.to_string().contains("pw"), "{err}");
    }

    #[test]
    fn environment_fills_gaps_only() {
        let mut o = NatsOptions::parse_url("nats://u:p@h:1").expect("valid");
        o.fill_from(|name| match name {
            "SLUICE_NATS_TOKEN" => Some("t".into()),
            "SLUICE_NATS_TLS_CA" => Some("/ca.pem".into()),
            _ => None,
        });
        assert_eq!(o.token, None, "URL credentials win");
        assert_eq!(o.tls_ca, Some(PathBuf::from("/ca.pem")));
        assert!(o.require_tls);
    }
}
