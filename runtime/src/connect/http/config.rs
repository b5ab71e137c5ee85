//! The `http:` block of a sink: the configuration reference for the
//! webhook connector.

use std::collections::BTreeMap;
use std::path::PathBuf;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::HumanDuration;
use crate::connect::{BuildError, ConfigProblem, Context, Secret, SecretUrl, Sink, SinkConfig};

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
    /// A PEM file of CA certificates to trust instead of the system's
    /// roots (relative to the pipeline file).
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
}

/// `POST`.
pub fn default_method() -> String {
    "POST".into()
}

/// 10 s.
pub fn default_request_timeout() -> HumanDuration {
    HumanDuration::secs(10)
}

#[async_trait]
impl SinkConfig for HttpSinkConfig {
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
        problems
    }

    fn describe(&self) -> String {
        format!("{} {}", self.method, self.url)
    }

    async fn build(&self, ctx: &Context) -> Result<std::sync::Arc<dyn Sink>, BuildError> {
        Err(BuildError {
            connector: "sink",
            name: ctx.name.clone(),
            message: "the HTTP sink is not built yet".into(),
        })
    }
}
