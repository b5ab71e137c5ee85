//! Outbound HTTP from a handler (`http:` on the stage), through the
//! standard `wasi:http/outgoing-handler`: a small blocking client.
//!
//! ```ignore
//! use sluice_sdk::{http, Emit, Message, Outcome};
//!
//! fn handle(msg: Message) -> Outcome {
//!     let answer = http::Request::post("https://payments.example.com/charge")
//!         .header("content-type", "application/json")
//!         .body(msg.payload.clone())
//!         .send()?;
//!     if !answer.is_success() {
//!         return Err(sluice_sdk::HandlerError::retry());
//!     }
//!     Ok(vec![Emit::to_default(answer.body)])
//! }
//! ```
//!
//! Only the hosts the stage's `http.allow` lists are reachable. The host
//! adds `Idempotency-Key: <message id>:<n>` to the call's n-th request
//! unless you set one, so a redelivered message repeats the same keys, and
//! it adds the stage's `http.headers` (secrets included) for the host. A
//! request counts against the stage's `timeout`.
//!
//! [`Request::send`] follows one redirect (`301`, `302`, `303`, `307`,
//! `308`) with a new request, which the host checks like the first: a
//! redirect to a host not listed fails as [`HttpError::Refused`].

use std::fmt;
use std::time::Duration;

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::streams::StreamError;

use crate::HandlerError;

/// The largest chunk written to a request body at once (`wasi:io` allows
/// 4,096 bytes per blocking write).
const WRITE_CHUNK: usize = 4096;

/// An outbound request, built with [`Request::get`], [`Request::post`], ...
/// and the `header`, `body` and `timeout` methods.
#[derive(Debug, Clone)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    timeout: Option<Duration>,
}

/// The answer to a request, its body read in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, names lowercase, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The host refused it: a host or port the stage's `http.allow` does
    /// not list, a redirect to one, or a name that resolves to a private
    /// address. Retrying does not help; fix the pipeline or the URL.
    Refused(String),
    /// No answer in time (the stage's `timeout`, `http.timeout`, or the
    /// request's own).
    Timeout(String),
    /// Any other failure: connection refused, TLS, a host held after a
    /// `Retry-After`. Retrying later may work.
    Failed(String),
    /// The URL is not `http://` or `https://` with a host.
    InvalidUrl(String),
}

impl Request {
    /// A request with `method` (`GET`, `POST`, ...) to `url`.
    pub fn new(method: &str, url: &str) -> Request {
        Request {
            method: method.to_ascii_uppercase(),
            url: url.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: None,
        }
    }

    /// A `GET` to `url`.
    pub fn get(url: &str) -> Request {
        Request::new("GET", url)
    }

    /// A `POST` to `url`.
    pub fn post(url: &str) -> Request {
        Request::new("POST", url)
    }

    /// A `PUT` to `url`.
    pub fn put(url: &str) -> Request {
        Request::new("PUT", url)
    }

    /// A `DELETE` to `url`.
    pub fn delete(url: &str) -> Request {
        Request::new("DELETE", url)
    }

    /// Adds a header (names may repeat).
    #[must_use]
    pub fn header(mut self, name: &str, value: impl AsRef<[u8]>) -> Request {
        self.headers
            .push((name.to_owned(), value.as_ref().to_vec()));
        self
    }

    /// Sets the body.
    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// Sets a JSON body and `content-type: application/json`.
    #[cfg(feature = "json")]
    pub fn json<T: serde::Serialize>(self, value: &T) -> Result<Request, HttpError> {
        let body = serde_json::to_vec(value)
            .map_err(|e| HttpError::Failed(format!("cannot encode the JSON body: {e}")))?;
        Ok(self.header("content-type", "application/json").body(body))
    }

    /// Waits at most `timeout` to connect and for the answer to start (the
    /// stage's `timeout` bounds it in any case).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Request {
        self.timeout = Some(timeout);
        self
    }

    /// Sends it and reads the whole answer, following one redirect.
    pub fn send(self) -> Result<Response, HttpError> {
        let first = self.send_once()?;
        let Some(location) = redirect(&first) else {
            return Ok(first);
        };
        let mut next = self.clone();
        next.url = resolve_location(&self.url, location)?;
        if first.status == 303 {
            next.method = "GET".into();
            next.body.clear();
        }
        next.send_once()
    }

    fn send_once(&self) -> Result<Response, HttpError> {
        let target = split_url(&self.url)?;
        let headers = Fields::new();
        for (name, value) in &self.headers {
            headers
                .append(name, value)
                .map_err(|e| HttpError::Failed(format!("header `{name}`: {e:?}")))?;
        }
        let request = OutgoingRequest::new(headers);
        let refused = |what: &str| HttpError::InvalidUrl(format!("{what} of {}", self.url));
        request
            .set_method(&method(&self.method))
            .map_err(|()| refused("the method"))?;
        request
            .set_scheme(Some(&if target.https {
                Scheme::Https
            } else {
                Scheme::Http
            }))
            .map_err(|()| refused("the scheme"))?;
        request
            .set_authority(Some(&target.authority))
            .map_err(|()| refused("the host"))?;
        request
            .set_path_with_query(Some(&target.path))
            .map_err(|()| refused("the path"))?;
        let options = self.timeout.map(|timeout| {
            let options = RequestOptions::new();
            let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
            let _ = options.set_connect_timeout(Some(ns));
            let _ = options.set_first_byte_timeout(Some(ns));
            options
        });
        let outgoing = request
            .body()
            .map_err(|()| HttpError::Failed("the request has no body stream".into()))?;
        {
            let stream = outgoing
                .write()
                .map_err(|()| HttpError::Failed("the request has no body stream".into()))?;
            for chunk in self.body.chunks(WRITE_CHUNK) {
                stream
                    .blocking_write_and_flush(chunk)
                    .map_err(|e| HttpError::Failed(format!("writing the body: {e:?}")))?;
            }
        }
        let pending = outgoing_handler::handle(request, options).map_err(from_code)?;
        OutgoingBody::finish(outgoing, None).map_err(from_code)?;
        let response = loop {
            match pending.get() {
                Some(result) => break result,
                None => pending.subscribe().block(),
            }
        };
        let response = response
            .map_err(|()| HttpError::Failed("the answer was taken twice".into()))?
            .map_err(from_code)?;
        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(n, v)| {
                (
                    n.to_ascii_lowercase(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect();
        let incoming = response
            .consume()
            .map_err(|()| HttpError::Failed("the answer has no body".into()))?;
        let stream = incoming
            .stream()
            .map_err(|()| HttpError::Failed("the answer has no body stream".into()))?;
        let mut body = Vec::new();
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => body.extend(chunk),
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => {
                    return Err(HttpError::Failed(format!(
                        "reading the answer: {}",
                        e.to_debug_string()
                    )));
                }
            }
        }
        Ok(Response {
            status,
            headers,
            body,
        })
    }
}

impl Response {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON; a `reject` when it is not what `T` expects.
    #[cfg(feature = "json")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, HandlerError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            HandlerError::reject(format_args!("the answer is not the JSON expected: {e}"))
        })
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Refused(why) => write!(f, "request refused: {why}"),
            HttpError::Timeout(why) => write!(f, "request timed out: {why}"),
            HttpError::Failed(why) => write!(f, "request failed: {why}"),
            HttpError::InvalidUrl(why) => write!(f, "invalid URL: {why}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// With `?` in a handler: a refused request or a bad URL will not work on
/// a retry, so the message is rejected with the reason; a timeout or
/// another failure is retried.
impl From<HttpError> for HandlerError {
    fn from(e: HttpError) -> Self {
        match e {
            HttpError::Refused(_) | HttpError::InvalidUrl(_) => HandlerError::reject(e),
            HttpError::Timeout(_) | HttpError::Failed(_) => HandlerError::Retry(None),
        }
    }
}

fn from_code(code: ErrorCode) -> HttpError {
    match code {
        ErrorCode::HttpRequestDenied => {
            HttpError::Refused("the host is not in the stage's `http.allow`".into())
        }
        ErrorCode::DestinationIpProhibited => HttpError::Refused(
            "the host resolves to a private address the stage does not allow".into(),
        ),
        ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::HttpResponseTimeout => HttpError::Timeout(format!("{code:?}")),
        ErrorCode::InternalError(Some(why)) => HttpError::Failed(why),
        other => HttpError::Failed(format!("{other:?}")),
    }
}

fn method(name: &str) -> Method {
    match name {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "OPTIONS" => Method::Options,
        other => Method::Other(other.to_owned()),
    }
}

/// A URL taken apart.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    https: bool,
    authority: String,
    /// The path and query, at least `/`.
    path: String,
}

fn split_url(url: &str) -> Result<Target, HttpError> {
    let (https, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else {
        return Err(HttpError::InvalidUrl(format!(
            "`{url}` is not an http:// or https:// URL"
        )));
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() || authority.contains('@') {
        return Err(HttpError::InvalidUrl(format!(
            "`{url}` has no host, or carries credentials (put those in headers)"
        )));
    }
    let path = path.split('#').next().unwrap_or_default();
    let path = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    Ok(Target {
        https,
        authority: authority.to_owned(),
        path,
    })
}

/// The `Location` of a redirect the client follows.
fn redirect(response: &Response) -> Option<&str> {
    matches!(response.status, 301 | 302 | 303 | 307 | 308)
        .then(|| response.header("location"))
        .flatten()
}

/// `location` against the URL that answered it: absolute, or a path on the
/// same origin.
fn resolve_location(base: &str, location: &str) -> Result<String, HttpError> {
    if location.starts_with("http://") || location.starts_with("https://") {
        return Ok(location.to_owned());
    }
    let target = split_url(base)?;
    let origin = format!(
        "{}://{}",
        if target.https { "https" } else { "http" },
        target.authority
    );
    if let Some(rest) = location.strip_prefix("//") {
        return Ok(format!(
            "{}://{rest}",
            if target.https { "https" } else { "http" }
        ));
    }
    if location.starts_with('/') {
        return Ok(format!("{origin}{location}"));
    }
    let dir = target.path.rsplit_once('/').map_or("", |(dir, _)| dir);
    Ok(format!("{origin}{dir}/{location}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_scheme_host_and_path() {
        assert_eq!(
            split_url("https://api.example.com:8443/v1/charge?x=1#frag").expect("url"),
            Target {
                https: true,
                authority: "api.example.com:8443".into(),
                path: "/v1/charge?x=1".into(),
            }
        );
        assert_eq!(
            split_url("http://10.0.0.5").expect("url").path,
            "/",
            "no path is /"
        );
        assert_eq!(
            split_url("http://h?q=1").expect("url").path,
            "/?q=1",
            "a query without a path"
        );
        for bad in [
            "ftp://h/",
            "api.example.com/x",
            "http:///x",
            "https://u:p@h/",
        ] {
            assert!(
                matches!(split_url(bad), Err(HttpError::InvalidUrl(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn redirects_resolve_against_the_url_that_answered() {
        let base = "https://a.example.com/v1/old?x=1";
        for (location, want) in [
            ("https://b.example.com/new", "https://b.example.com/new"),
            ("/new", "https://a.example.com/new"),
            ("new", "https://a.example.com/v1/new"),
            ("//c.example.com/p", "https://c.example.com/p"),
        ] {
            assert_eq!(resolve_location(base, location).expect(location), want);
        }
        let moved = Response {
            status: 302,
            headers: vec![("location".into(), "/x".into())],
            body: Vec::new(),
        };
        assert_eq!(redirect(&moved), Some("/x"));
        let ok = Response {
            status: 200,
            ..moved.clone()
        };
        assert_eq!(redirect(&ok), None);
    }

    #[test]
    fn refusals_reject_and_timeouts_retry() {
        let refused = from_code(ErrorCode::HttpRequestDenied);
        assert!(matches!(refused, HttpError::Refused(_)));
        assert!(matches!(
            HandlerError::from(refused),
            HandlerError::Reject(_)
        ));
        let slow = from_code(ErrorCode::HttpResponseTimeout);
        assert_eq!(HandlerError::from(slow), HandlerError::Retry(None));
        let held = from_code(ErrorCode::InternalError(Some("held for 900 ms".into())));
        assert_eq!(held, HttpError::Failed("held for 900 ms".into()));
    }

    #[test]
    fn answers_read_their_headers_in_any_case() {
        let answer = Response {
            status: 201,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: b"made".to_vec(),
        };
        assert!(answer.is_success());
        assert_eq!(answer.header("Content-Type"), Some("text/plain"));
        assert_eq!(answer.text(), "made");
    }
}
