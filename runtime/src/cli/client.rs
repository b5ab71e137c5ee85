//! The admin API client behind `sluice publish`, `tail`, `dlq` and `status`:
//! one way to find the daemon (`--admin`, `SLUICE_ADMIN`), one way to say it
//! is not there, and one mapping of API errors to messages and exit codes.

use std::fmt;
use std::process::ExitCode;
use std::time::Duration;

use reqwest::blocking::{RequestBuilder, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::admin::{DEFAULT_ADMIN, ErrorBody};

/// How long a request may take unless the command says otherwise.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach the running daemon: one set of flags for every command that
/// talks to it.
#[derive(Debug, clap::Args)]
pub(crate) struct AdminArgs {
    /// The running daemon's admin address: HOST:PORT or http://HOST:PORT (what `sluice run
    /// --admin` listens on).
    #[arg(long, env = "SLUICE_ADMIN", value_name = "ADDR", default_value = DEFAULT_ADMIN)]
    admin: String,
}

/// Why a call to the daemon failed.
#[derive(Debug)]
pub(crate) enum ClientError {
    /// Nothing answers at the address.
    Unreachable {
        /// The base URL tried.
        url: String,
    },
    /// The invocation is wrong before any request is made.
    Usage(String),
    /// The daemon answered with an error.
    Api {
        /// The HTTP status.
        status: reqwest::StatusCode,
        /// The daemon's message.
        message: String,
    },
    /// The request failed some other way (timeout, a reply that is not the
    /// API's, local I/O).
    Failed(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Unreachable { url } => write!(
                f,
                "cannot reach the sluice daemon at {url} (is `sluice run` running? set --admin or SLUICE_ADMIN)"
            ),
            ClientError::Usage(message)
            | ClientError::Api { message, .. }
            | ClientError::Failed(message) => f.write_str(message),
        }
    }
}

impl ClientError {
    /// 2 when the invocation or its inputs are wrong (including a 4xx from
    /// the daemon: unknown topic, empty payload, ...), 1 when the operation
    /// failed (unreachable, busy, broker error).
    pub(crate) fn exit_code(&self) -> ExitCode {
        match self {
            ClientError::Usage(_) => ExitCode::from(2),
            ClientError::Api { status, .. }
                if status.is_client_error()
                    && *status != reqwest::StatusCode::TOO_MANY_REQUESTS =>
            {
                ExitCode::from(2)
            }
            _ => ExitCode::FAILURE,
        }
    }

    /// Prints `error: <message>` on stderr and returns the exit code.
    pub(crate) fn report(&self) -> ExitCode {
        eprintln!("error: {self}");
        self.exit_code()
    }
}

/// A client of one daemon's admin API.
pub(crate) struct Client {
    http: reqwest::blocking::Client,
    base: String,
}

impl Client {
    /// A client for the daemon `args` names.
    pub(crate) fn new(args: &AdminArgs) -> Result<Self, ClientError> {
        let base = base_url(&args.admin)?;
        let http = reqwest::blocking::Client::builder()
            // The admin API is local or on a private network; a proxy from
            // the environment would only get in the way.
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .timeout(None)
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Failed(format!("cannot start the HTTP client: {e}")))?;
        Ok(Client { http, base })
    }

    /// `GET path` (query included), decoded.
    pub(crate) fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<T, ClientError> {
        self.send(self.http.get(self.url(path)).timeout(timeout))
    }

    /// `POST path` with a JSON body, decoded. `timeout` None waits as long
    /// as the daemon works (a paced redrive).
    pub(crate) fn post_json<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        timeout: Option<Duration>,
    ) -> Result<T, ClientError> {
        let mut request = self.http.post(self.url(path)).json(body);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        self.send(request)
    }

    /// `POST path` with a raw body of `content_type`, decoded.
    pub(crate) fn post_bytes<T: DeserializeOwned>(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<T, ClientError> {
        self.send(
            self.http
                .post(self.url(path))
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body)
                .timeout(DEFAULT_TIMEOUT),
        )
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn send<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T, ClientError> {
        let response = request.send().map_err(|e| self.transport(e))?;
        let status = response.status();
        if status.is_success() {
            return response.json().map_err(|e| {
                ClientError::Failed(format!(
                    "the daemon at {} sent a reply this sluice cannot read: {e}",
                    self.base
                ))
            });
        }
        Err(self.api_error(status, response))
    }

    fn transport(&self, err: reqwest::Error) -> ClientError {
        if err.is_connect() {
            ClientError::Unreachable {
                url: self.base.clone(),
            }
        } else if err.is_timeout() {
            ClientError::Failed(format!(
                "the daemon at {} did not answer in time",
                self.base
            ))
        } else {
            ClientError::Failed(format!("request to {} failed: {err}", self.base))
        }
    }

    fn api_error(&self, status: reqwest::StatusCode, response: Response) -> ClientError {
        let text = response.text().unwrap_or_default();
        let message = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => body.error,
            // Not the admin API (another server on that port?).
            Err(_) => format!(
                "{} answered {status}; is that a sluice daemon's admin address?",
                self.base
            ),
        };
        ClientError::Api { status, message }
    }
}

/// `127.0.0.1:7400` or `http://127.0.0.1:7400/` -> `http://127.0.0.1:7400`.
fn base_url(admin: &str) -> Result<String, ClientError> {
    let admin = admin.trim().trim_end_matches('/');
    if admin.is_empty() {
        return Err(ClientError::Usage(
            "the admin address is empty; give HOST:PORT".into(),
        ));
    }
    if admin.starts_with("https://") {
        return Err(ClientError::Usage(
            "the admin API is plain HTTP; give http://HOST:PORT or HOST:PORT".into(),
        ));
    }
    if admin.starts_with("http://") {
        Ok(admin.to_owned())
    } else if admin.contains("://") {
        Err(ClientError::Usage(format!(
            "`{admin}` is not an admin address; give HOST:PORT or http://HOST:PORT"
        )))
    } else {
        Ok(format!("http://{admin}"))
    }
}

/// Percent-encodes one URL path segment (topic, pipeline and stage names).
pub(crate) fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addresses_users_write() {
        assert_eq!(
            base_url("127.0.0.1:7400").ok(),
            Some("http://127.0.0.1:7400".into())
        );
        assert_eq!(base_url("http://h:1/").ok(), Some("http://h:1".into()));
        assert!(base_url("https://h:1").is_err());
        assert!(base_url("nats://h:1").is_err());
        assert!(base_url(" ").is_err());
    }

    #[test]
    fn path_segments_are_escaped() {
        assert_eq!(segment("orders.eu_1-x"), "orders.eu_1-x");
        assert_eq!(segment("a/b c"), "a%2Fb%20c");
    }
}
