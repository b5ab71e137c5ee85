//! The `http:` block of a sink: the configuration reference for the
//! webhook connector.

use std::collections::BTreeMap;
use std::path::Path;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::tls::TlsOptions;
use super::{ConfigProblem, SinkBlock};
use crate::config::{HumanDuration, Secret, SecretUrl};

/// The prefix of every message header sent as a request header.
pub const HEADER_PREFIX: &str = "sluice-header-";

/// An HTTP endpoint each message is sent to.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// `https://...` (or `http://`). `${VAR}` is expanded; a password in
    /// it is never shown.
    pub url: SecretUrl,
    /// The request method: `POST`, `PUT` or `PATCH`.
    #[serde(default = "default_method")]
    pub method: String,
    /// Signs each request: `Sluice-Signature: t=<unix seconds>,v1=<hex
    /// HMAC-SHA256 of "t.body">`. Write `${VAR}`; it is never shown.
    #[serde(default)]
    pub secret: Option<Secret>,
    /// The longest one request may take; past it the attempt is retried.
    #[serde(default = "default_request_timeout")]
    pub timeout: HumanDuration,
    /// Extra headers on every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `tls_ca`, `tls_cert`, `tls_key`: see [`TlsOptions`].
    #[serde(flatten)]
    pub tls: TlsOptions,
}

/// `POST`.
pub fn default_method() -> String {
    "POST".into()
}

/// 10 s.
pub fn default_request_timeout() -> HumanDuration {
    HumanDuration::secs(10)
}

impl SinkBlock for HttpSinkConfig {
    fn resolve_paths(&mut self, dir: &Path) {
        self.tls.resolve_paths(dir);
    }

    fn kind(&self) -> &'static str {
        "http"
    }

    fn check(&self) -> Vec<ConfigProblem> {
        let mut problems = Vec::new();
        if !matches!(self.url.scheme().as_str(), "http" | "https") {
            problems.push(ConfigProblem::at(
                &["url"],
                format!("`{}` is not an HTTP URL; use `https://host/path`", self.url),
            ));
        }
        if !matches!(self.method.as_str(), "POST" | "PUT" | "PATCH") {
            problems.push(ConfigProblem::at(
                &["method"],
                format!(
                    "`{}` is not a method a webhook takes; use POST, PUT or PATCH",
                    self.method
                ),
            ));
        }
        if self.timeout.get().is_zero() {
            problems.push(ConfigProblem::at(
                &["timeout"],
                "`timeout` must be longer than 0s",
            ));
        }
        if self.secret.as_ref().is_some_and(|s| s.expose().is_empty()) {
            problems.push(ConfigProblem::at(
                &["secret"],
                "`secret` is empty (is its variable set?); give a long random value, or leave \
                 `secret` out to send unsigned requests",
            ));
        }
        if let Err(message) = self.header_map() {
            problems.push(ConfigProblem::at(&["headers"], message));
        }
        let files = self.tls.files();
        files.check(&mut problems);
        if self.url.scheme() != "https"
            && let Some(option) = files.first_given()
        {
            problems.push(ConfigProblem::at(
                &[option],
                format!(
                    "`{option}` is for TLS: the URL `{}` is not https://",
                    self.url
                ),
            ));
        }
        problems
    }

    fn describe(&self) -> String {
        format!("{} {}", self.method, self.url)
    }
}

/// Headers a sink sets itself, which `headers:` may not replace.
const RESERVED: &[&str] = &[
    "idempotency-key",
    "sluice-signature",
    "sluice-key",
    "content-length",
    "transfer-encoding",
    "host",
    "connection",
    // Each message's own trace context (`crate::trace`).
    "traceparent",
    "tracestate",
];

impl HttpSinkConfig {
    /// The extra headers, checked: valid names and values, none the sink
    /// sets itself. Values are marked sensitive (a token is never shown).
    pub(crate) fn header_map(&self) -> Result<HeaderMap, String> {
        let mut map = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            let parsed = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("`{name}` is not a valid HTTP header name"))?;
            if RESERVED.contains(&parsed.as_str()) || parsed.as_str().starts_with(HEADER_PREFIX) {
                return Err(format!(
                    "header `{name}` is set by the sink itself and cannot be configured"
                ));
            }
            let mut value = HeaderValue::from_str(value).map_err(|_| {
                format!("the value of header `{name}` is not a valid HTTP header value")
            })?;
            value.set_sensitive(true);
            map.insert(parsed, value);
        }
        Ok(map)
    }
}
