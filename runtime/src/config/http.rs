//! A stage's `http:` grant: the outbound HTTP its handler may make
//! (`wasi:http/outgoing-handler`, contract 0.2.0). Not a sink's `http:`
//! block (the webhook), which lives under `sinks:`.
//!
//! ```yaml
//! http:
//!   allow: [payments.example.com, "127.0.0.1:8080"]
//!   timeout: 5s
//!   allow_private: false
//!   headers:
//!     payments.example.com: { Authorization: "Bearer {secret:api_token}" }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::HumanDuration;
use super::SecretText;

/// What `http:` grants.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpGrant {
    /// The hosts the handler may call, each `name` (then only its scheme's
    /// default port: 443 for https, 80 for http), `name:port`, or an IP
    /// address (`"127.0.0.1:8080"`, `"[::1]:8080"`). Nothing else is
    /// reachable, redirects included.
    pub allow: Vec<String>,
    /// The longest one request may take, from sending it to the last byte
    /// of its answer; never longer than what is left of the stage's
    /// `timeout`, which every call counts against. Default: the stage's
    /// `timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    /// Lets a listed name reach loopback, private and link-local
    /// addresses. Off: a name that resolves to one is refused, so a
    /// handler cannot be pointed at the machine's or the network's
    /// internal services. An IP address listed under `allow` is reachable
    /// in any case.
    #[serde(default)]
    pub allow_private: bool,
    /// Headers the host adds to each request to a listed host (keyed as in
    /// `allow`), replacing the handler's own: `{secret:name}` puts in a
    /// secret of the pipeline's `secrets:` block, so the handler never
    /// holds it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, BTreeMap<String, SecretText>>,
}

/// One entry of `allow`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    /// The host, lowercase; an IPv6 address without its brackets.
    pub host: String,
    /// The port; `None` for the scheme's default port only.
    pub port: Option<u16>,
    /// The host as an IP address, if it is one.
    pub ip: Option<IpAddr>,
}

impl AllowedHost {
    /// Parses an `allow` entry: a host name or IP address, with an
    /// optional port, and nothing else.
    ///
    /// # Errors
    ///
    /// What is wrong with it and what to write instead.
    pub fn parse(entry: &str) -> Result<AllowedHost, String> {
        let trimmed = entry.trim();
        if trimmed.contains("://") || trimmed.contains('/') {
            return Err(format!(
                "`{entry}` is not a host: list a host name or address with an optional port \
                 (`api.example.com`, `api.example.com:8443`, `10.0.0.5:8080`), no scheme or path"
            ));
        }
        let authority: http::uri::Authority = trimmed.parse().map_err(|_| {
            format!("`{entry}` is not a host name or address with an optional port")
        })?;
        // The authority parser drops a port past 65535 rather than
        // refusing it: read the port here.
        let port_text = match trimmed.strip_prefix('[') {
            Some(rest) => rest.split_once(']').and_then(|(_, p)| p.strip_prefix(':')),
            None => trimmed.rsplit_once(':').map(|(_, p)| p),
        };
        let port = match port_text {
            None => None,
            Some(text) => {
                Some(text.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                    format!("`{entry}`: the port is not a number from 1 to 65535")
                })?)
            }
        };
        if trimmed.contains('@') {
            return Err(format!(
                "`{entry}` carries credentials; list the host only, and put credentials in \
                 `headers:` with `{{secret:name}}`"
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let ip = host.parse::<IpAddr>().ok();
        if ip.is_none() && !valid_name(&host) {
            return Err(format!(
                "`{entry}`: `{host}` is not a host name (letters, digits, `-` and `.`)"
            ));
        }
        Ok(AllowedHost { host, port, ip })
    }

    /// Whether a request to `host:port` (`host` lowercase, an IPv6
    /// address without brackets) with `default_port` for its scheme is
    /// one this entry allows.
    pub fn matches(&self, host: &str, port: u16, default_port: u16) -> bool {
        self.host == host && self.port.unwrap_or(default_port) == port
    }
}

impl fmt::Display for AllowedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.ip, self.port) {
            (Some(IpAddr::V6(_)), Some(port)) => write!(f, "[{}]:{port}", self.host),
            (_, Some(port)) => write!(f, "{}:{port}", self.host),
            (_, None) => f.write_str(&self.host),
        }
    }
}

/// A DNS name: labels of letters, digits and `-`, joined by `.`.
fn valid_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Headers a grant may not set: the connection's own, which the sender
/// writes (as `wasi:http` forbids them to a guest).
pub fn is_reserved_header(name: &str) -> bool {
    [
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "te",
        "trailer",
        "http2-settings",
    ]
    .iter()
    .any(|reserved| name.eq_ignore_ascii_case(reserved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_entries_are_hosts_with_optional_ports_and_nothing_else() {
        let named = AllowedHost::parse("Payments.Example.com").expect("a name");
        assert_eq!(named.host, "payments.example.com");
        assert_eq!(named.port, None);
        assert!(named.matches("payments.example.com", 443, 443));
        assert!(!named.matches("payments.example.com", 8443, 443));
        let local = AllowedHost::parse("127.0.0.1:8080").expect("an address");
        assert_eq!(local.ip, Some(IpAddr::from([127, 0, 0, 1])));
        assert!(local.matches("127.0.0.1", 8080, 80));
        assert!(!local.matches("127.0.0.1", 80, 80));
        let v6 = AllowedHost::parse("[::1]:9000").expect("IPv6");
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.to_string(), "[::1]:9000");
        for bad in [
            "https://api.example.com",
            "api.example.com/v1",
            "user:pw@api.example.com",
            "",
            "api..example.com",
            "api_example.com",
            "api.example.com:99999",
        ] {
            assert!(AllowedHost::parse(bad).is_err(), "{bad} was accepted");
        }
    }
}
