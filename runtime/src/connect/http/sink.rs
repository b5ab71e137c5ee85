//! The webhook sink: one HTTP request per message, through one pooled
//! `reqwest` client that every worker slot of the sink shares.
//!
//! The request carries the payload as its body and says what the message
//! is in headers (`Idempotency-Key`, `Sluice-Key`, `Sluice-Header-*`),
//! signed with HMAC-SHA256 when the sink has a `secret`. A valid W3C
//! `traceparent` (and its `tracestate`) is also sent under its own name,
//! so the receiver's tracing continues the message's trace. The answer maps
//! onto [`SinkError`]:
//!
//! | answer | result |
//! |---|---|
//! | 2xx | delivered |
//! | 408, 425, 429, 5xx | [`SinkError::Retry`], after `Retry-After` when given |
//! | any other status (3xx, 4xx) | [`SinkError::Rejected`] with the status and the body's first 256 bytes |
//! | cannot connect (refused, DNS, connect timeout, untrusted TLS certificate) | [`SinkError::Unavailable`]: held, no attempt spent |
//! | no answer within `timeout`, or the connection dropped after the request was sent | [`SinkError::Retry`]: the server may have taken it |
//!
//! A message whose headers cannot all be sent (more than
//! [`MAX_MESSAGE_HEADERS`], or a name too long for HTTP) is rejected, never
//! sent with some of them dropped. Only a bounded prefix of any response
//! body is read. No error text carries the URL's credentials, the secret
//! or a configured header value, even when the receiver quotes them back.

use std::error::Error as _;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use hmac::{Hmac, Mac};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use rustls_pki_types::CertificateDer;
use sha2::Sha256;

use crate::connect::{SecretUrl, Sink, SinkError};
use crate::plugin::Message;
use crate::trace;

/// How many bytes of an error answer's body a rejection quotes.
pub const EXCERPT_BYTES: usize = 256;
/// The most bytes of a successful answer's body read (and dropped) so the
/// connection can be reused; past it the connection is closed instead.
const DRAIN_BYTES: usize = 64 * 1024;
pub use crate::config::connectors::http::HEADER_PREFIX;
/// The most message headers one request carries. Receivers refuse far
/// fewer (hyper's server takes 100), and past about 24,000 the request
/// could not even be built; a message with more is rejected, not sent.
pub const MAX_MESSAGE_HEADERS: usize = 1_000;
/// The most requests one batch has in flight at once (each batch of a
/// sink with `concurrency: n` sends up to this many, n batches at a time).
pub const BATCH_REQUESTS_IN_FLIGHT: usize = 32;
/// The shortest configured secret (a header value, the signing secret,
/// the URL's credentials) removed from quoted answers: shorter ones would
/// mangle the text more than they hide.
const MIN_ECHO: usize = 6;

/// A webhook target, shared by every worker slot of one sink.
pub struct HttpSink {
    client: reqwest::Client,
    url: SecretUrl,
    target: reqwest::Url,
    method: Method,
    signer: Option<Hmac<Sha256>>,
    /// `Basic ...` from the URL's user and password, when it has them.
    auth: Option<HeaderValue>,
    headers: HeaderMap,
    timeout: Duration,
    /// The configured secrets a receiver might quote back in an error
    /// body (`invalid token Bearer abc...`), removed from the excerpt.
    echoes: Vec<String>,
}

/// What [`HttpSink::new`] needs, checked by the config block.
pub struct HttpSinkParts {
    /// The target.
    pub url: SecretUrl,
    /// `POST`, `PUT` or `PATCH`.
    pub method: Method,
    /// The HMAC key, if requests are signed.
    pub secret: Option<Vec<u8>>,
    /// The extra headers of every request.
    pub headers: HeaderMap,
    /// Per request.
    pub timeout: Duration,
    /// The only roots trusted (`tls_ca`), when given; else the system's.
    pub roots: Option<Vec<CertificateDer<'static>>>,
    /// The client certificate shown to a receiver that asks for one
    /// (`tls_cert`, `tls_key`).
    pub identity: Option<crate::connect::tls::Identity>,
}

impl HttpSink {
    /// A sink with its client (not yet connected: the first request
    /// connects). The error never carries the URL's password.
    pub fn new(parts: HttpSinkParts) -> Result<HttpSink, String> {
        let HttpSinkParts {
            url,
            method,
            secret,
            headers,
            timeout,
            roots,
            identity,
        } = parts;
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            // Shorter than the request's timeout, so a target that does
            // not accept connections is seen as unreachable (held, no
            // attempt spent) rather than as a slow answer.
            .connect_timeout((timeout / 2).max(Duration::from_millis(1)))
            // A webhook answers, it does not send us elsewhere: a redirect
            // is a refusal, reported with its status.
            .redirect(reqwest::redirect::Policy::none())
            // The target is the URL configured, never a proxy named by the
            // environment (`HTTP_PROXY`): a proxy would see the signed body
            // and the credentials, and answer 502 for a target that is down.
            .no_proxy()
            .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")));
        if url.scheme() == "https" {
            let mut tls = crate::connect::tls::client_config(roots, identity)?;
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
            builder = builder.tls_backend_preconfigured(tls);
        }
        let client = builder.build().map_err(|e| url.scrub(&error_chain(&e)))?;
        let mut target =
            reqwest::Url::parse(url.expose()).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
        let echoes = echoes(&target, &headers, secret.as_deref());
        let auth = basic_auth(&mut target);
        let signer = match secret {
            Some(key) => Some(
                Hmac::<Sha256>::new_from_slice(&key)
                    .map_err(|e| format!("the secret cannot key HMAC-SHA256: {e}"))?,
            ),
            None => None,
        };
        Ok(HttpSink {
            client,
            url,
            target,
            method,
            signer,
            auth,
            headers,
            timeout,
            echoes,
        })
    }

    /// The request for `message`, headers and signature included; refused
    /// when the message's headers cannot all be sent.
    fn request(&self, message: &Message) -> Result<reqwest::Request, SinkError> {
        if message.headers.len() > MAX_MESSAGE_HEADERS {
            return Err(SinkError::Rejected(format!(
                "the message has {} headers; a webhook request carries at most {MAX_MESSAGE_HEADERS}",
                message.headers.len()
            )));
        }
        let mut headers = HeaderMap::with_capacity(8 + message.headers.len());
        let content_type = message
            .headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
            .and_then(|(_, value)| HeaderValue::from_str(value).ok())
            .unwrap_or(HeaderValue::from_static("application/octet-stream"));
        headers.insert(CONTENT_TYPE, content_type);
        headers.insert("idempotency-key", header_value(&message.id));
        if let Some(key) = &message.key {
            headers.insert("sluice-key", header_value(key));
        }
        for (name, value) in &message.headers {
            let Some(name) = message_header_name(name) else {
                return Err(SinkError::Rejected(format!(
                    "message header name `{}` cannot be sent as an HTTP header (empty, or too long)",
                    name.chars().take(64).collect::<String>()
                )));
            };
            headers.append(name, header_value(value));
        }
        if let Some(parent) = message
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(trace::TRACEPARENT))
            .map(|(_, v)| v)
            .filter(|v| trace::TraceParent::parse(v).is_some())
        {
            headers.insert(trace::TRACEPARENT, header_value(parent));
            if let Some((_, state)) = message
                .headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(trace::TRACESTATE))
            {
                headers.insert(trace::TRACESTATE, header_value(state));
            }
        }
        if let Some(auth) = &self.auth {
            headers.insert(reqwest::header::AUTHORIZATION, auth.clone());
        }
        for (name, value) in &self.headers {
            headers.insert(name.clone(), value.clone());
        }
        if let Some(signer) = &self.signer {
            let t = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            headers.insert(
                "sluice-signature",
                sign(signer.clone(), t, &message.payload),
            );
        }
        let mut request = reqwest::Request::new(self.method.clone(), self.target.clone());
        *request.headers_mut() = headers;
        *request.timeout_mut() = Some(self.timeout);
        *request.body_mut() = Some(reqwest::Body::from(message.payload.clone()));
        Ok(request)
    }

    /// What an answer means.
    async fn judge(&self, mut response: reqwest::Response) -> Result<(), SinkError> {
        let status = response.status();
        if status.is_success() {
            // Read (a bounded part of) the body so the connection goes back
            // to the pool; a failure here does not undo the delivery.
            let mut read = 0;
            while read < DRAIN_BYTES {
                match response.chunk().await {
                    Ok(Some(chunk)) => read += chunk.len(),
                    Ok(None) | Err(_) => break,
                }
            }
            return Ok(());
        }
        let after = crate::retry_after::wait(response.headers(), SystemTime::now());
        let mut body = Vec::new();
        while body.len() < EXCERPT_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) | Err(_) => break,
            }
        }
        let mut reason = self.url.scrub(&status_reason(status, &body));
        for echo in &self.echoes {
            reason = reason.replace(echo.as_str(), "***");
        }
        if is_transient(status) {
            Err(SinkError::Retry { reason, after })
        } else {
            Err(SinkError::Rejected(reason))
        }
    }

    /// What a failed exchange means: no connection is an outage, anything
    /// after the request was sent is worth another attempt.
    fn transport(&self, error: &reqwest::Error) -> SinkError {
        let chain = self.url.scrub(&error_chain(error));
        // Before `is_connect`: with TLS 1.3 a server that refuses this
        // client's certificate says so after the client's side of the
        // handshake is done, so the refusal arrives with the answer.
        if let Some(hint) = crate::connect::tls::trust_hint(error) {
            return SinkError::Unavailable(format!("{hint} ({chain})"));
        }
        if error.is_connect() {
            return SinkError::Unavailable(format!("cannot connect to {}: {chain}", self.url));
        }
        if error.is_timeout() {
            return SinkError::Retry {
                reason: format!(
                    "no answer from {} within the request timeout ({})",
                    self.url,
                    humantime::format_duration(self.timeout)
                ),
                after: None,
            };
        }
        SinkError::Retry {
            reason: format!("the request to {} failed: {chain}", self.url),
            after: None,
        }
    }
}

#[async_trait]
impl Sink for HttpSink {
    async fn write(&self, message: &Message) -> Result<(), SinkError> {
        match self.client.execute(self.request(message)?).await {
            Ok(response) => self.judge(response).await,
            Err(error) => Err(self.transport(&error)),
        }
    }

    /// A batch is sent as concurrent requests, one per message, at most
    /// [`BATCH_REQUESTS_IN_FLIGHT`] at once.
    async fn write_batch(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        use futures_util::StreamExt as _;
        let writes: Vec<_> = messages.iter().map(|m| self.write(m)).collect();
        futures_util::stream::iter(writes)
            .buffered(BATCH_REQUESTS_IN_FLIGHT)
            .collect()
            .await
    }
}

/// `Sluice-Signature: t=<t>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
pub fn sign(mut mac: Hmac<Sha256>, t: u64, body: &[u8]) -> HeaderValue {
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let v1 = hex::encode(mac.finalize().into_bytes());
    // Digits, `t=`, `,v1=` and hex: always a valid header value.
    HeaderValue::from_str(&format!("t={t},v1={v1}"))
        .unwrap_or(HeaderValue::from_static("t=0,v1=invalid"))
}

/// 408, 425, 429 and 5xx: the target may take it later.
pub fn is_transient(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 425 | 429) || status.is_server_error()
}

/// `HTTP <status>: <first 256 bytes of the body, lossy UTF-8, one line>`.
pub fn status_reason(status: StatusCode, body: &[u8]) -> String {
    let excerpt = String::from_utf8_lossy(&body[..body.len().min(EXCERPT_BYTES)]);
    let line: String = excerpt
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if line.is_empty() {
        format!("HTTP {}", status.as_u16())
    } else {
        format!("HTTP {}: {line}", status.as_u16())
    }
}

/// `Sluice-Header-<name>` for a message header: the name's bytes that an
/// HTTP header name cannot carry, and `%`, are percent-encoded with
/// lowercase hex (`trace id` -> `sluice-header-trace%20id`); HTTP header
/// names are case-insensitive, so the name is sent lowercase. `None` for
/// an empty name, or one whose encoding is past HTTP's 64 KiB name limit.
pub fn message_header_name(name: &str) -> Option<HeaderName> {
    if name.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(HEADER_PREFIX.len() + name.len());
    out.push_str(HEADER_PREFIX);
    for b in name.bytes() {
        if is_tchar(b) && b != b'%' {
            out.push(char::from(b.to_ascii_lowercase()));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    HeaderName::from_bytes(out.as_bytes()).ok()
}

/// A header value: control characters other than tab (which HTTP cannot
/// carry) are percent-encoded; every other byte is sent as it is.
pub fn header_value(value: &str) -> HeaderValue {
    if let Ok(v) = HeaderValue::from_str(value) {
        return v;
    }
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        if (c.is_ascii_control() && c != '\t') || c == '\u{7f}' {
            out.push_str(&format!("%{:02X}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    HeaderValue::from_bytes(out.as_bytes()).unwrap_or(HeaderValue::from_static(""))
}

/// Takes the user and password out of `url` (sent in the request line
/// they would be lost) and makes them a sensitive `Basic` credential, as
/// reqwest's request builder does.
fn basic_auth(url: &mut reqwest::Url) -> Option<HeaderValue> {
    use base64::Engine as _;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let user = decode(url.username());
    let password = url.password().map(decode);
    if user.is_empty() && password.is_none() {
        return None;
    }
    let _ = url.set_username("");
    let _ = url.set_password(None);
    let pair = format!("{user}:{}", password.unwrap_or_default());
    let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
    let mut value = HeaderValue::from_str(&format!("Basic {encoded}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// The secrets of a sink a receiver might echo: each configured header
/// value (and its last word, the token of `Bearer <token>`), the signing
/// secret, and the URL's user and password (plain, and as the `Basic`
/// credential), longest first.
fn echoes(url: &reqwest::Url, headers: &HeaderMap, secret: Option<&[u8]>) -> Vec<String> {
    use base64::Engine as _;
    let mut out: Vec<String> = Vec::new();
    for value in headers.values() {
        if let Ok(text) = value.to_str() {
            out.push(text.to_owned());
            if let Some((_, last)) = text.rsplit_once(' ') {
                out.push(last.to_owned());
            }
        }
    }
    if let Some(secret) = secret.and_then(|s| std::str::from_utf8(s).ok()) {
        out.push(secret.to_owned());
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let (user, password) = (decode(url.username()), url.password().map(decode));
    if !user.is_empty() || password.is_some() {
        let pair = format!("{user}:{}", password.clone().unwrap_or_default());
        out.push(base64::engine::general_purpose::STANDARD.encode(&pair));
        out.push(pair);
        out.push(user);
        out.extend(password);
    }
    out.retain(|echo| echo.len() >= MIN_ECHO);
    out.sort_by_key(|echo| std::cmp::Reverse(echo.len()));
    out.dedup();
    out
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// An error with its causes, `a: b: c`, without the URL reqwest adds.
fn error_chain(error: &reqwest::Error) -> String {
    let mut text = match error.url() {
        Some(_) => {
            let mut bare = String::new();
            // reqwest's own text minus " for url (...)".
            let full = error.to_string();
            bare.push_str(full.split(" for url (").next().unwrap_or(&full));
            bare
        }
        None => error.to_string(),
    };
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_statuses_are_retried_and_others_rejected() {
        for code in [408, 425, 429, 500, 502, 503, 504, 599] {
            assert!(
                is_transient(StatusCode::from_u16(code).expect("code")),
                "{code}"
            );
        }
        for code in [300, 301, 400, 401, 403, 404, 409, 410, 413, 422] {
            assert!(
                !is_transient(StatusCode::from_u16(code).expect("code")),
                "{code}"
            );
        }
    }

    #[test]
    fn a_rejection_quotes_256_bytes_of_the_body_on_one_line() {
        let body = format!("bad\r\n  payload\t{}", "x".repeat(1000));
        let reason = status_reason(StatusCode::BAD_REQUEST, body.as_bytes());
        assert!(reason.starts_with("HTTP 400: bad payload xxx"), "{reason}");
        assert!(!reason.contains('\n'));
        assert!(
            reason.len() <= "HTTP 400: ".len() + EXCERPT_BYTES,
            "{reason}"
        );
        assert_eq!(status_reason(StatusCode::NOT_FOUND, b""), "HTTP 404");
        // A multi-byte character cut at byte 256 is replaced, not a panic.
        let body = format!("a{}", "é".repeat(200));
        assert!(status_reason(StatusCode::BAD_REQUEST, body.as_bytes()).ends_with('\u{fffd}'));
    }

    #[test]
    fn header_names_and_values_are_encoded_never_dropped() {
        let name = |n: &str| message_header_name(n).map(|h| h.as_str().to_owned());
        assert_eq!(name("Trace").as_deref(), Some("sluice-header-trace"));
        assert_eq!(
            name("trace id").as_deref(),
            Some("sluice-header-trace%20id")
        );
        assert_eq!(name("a%b").as_deref(), Some("sluice-header-a%25b"));
        assert_eq!(name("ü:\n").as_deref(), Some("sluice-header-%c3%bc%3a%0a"));
        assert_eq!(name(""), None);
        assert_eq!(header_value("plain").as_bytes(), b"plain");
        assert_eq!(header_value("a\r\nb\tc").as_bytes(), b"a%0D%0Ab\tc");
        assert_eq!(header_value("ünï").as_bytes(), "ünï".as_bytes());
    }

    #[test]
    fn a_valid_traceparent_is_sent_under_its_own_name_too() {
        let sink = HttpSink::new(HttpSinkParts {
            url: SecretUrl::parse("http://127.0.0.1:9/in").expect("url"),
            method: Method::POST,
            secret: None,
            headers: HeaderMap::new(),
            timeout: Duration::from_secs(1),
            roots: None,
            identity: None,
        })
        .expect("sink");
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut message = Message::new("m", "t", b"x".to_vec());
        message.headers = vec![
            ("traceparent".into(), parent.into()),
            ("tracestate".into(), "congo=t61rcWkgMzE".into()),
        ];
        let request = sink.request(&message).expect("request");
        let sent = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
        assert_eq!(sent("traceparent"), Some(parent));
        assert_eq!(sent("tracestate"), Some("congo=t61rcWkgMzE"));
        assert_eq!(sent("sluice-header-traceparent"), Some(parent));
        message.headers = vec![("traceparent".into(), "00-broken".into())];
        let request = sink.request(&message).expect("request");
        assert!(request.headers().get("traceparent").is_none());
    }

    #[test]
    fn the_signature_is_hmac_sha256_of_t_dot_body() {
        let mac = Hmac::<Sha256>::new_from_slice(b"key").expect("key");
        let value = sign(mac, 1_700_000_000, b"hello");
        // python3: hmac.new(b"key", b"1700000000.hello", hashlib.sha256).hexdigest()
        assert_eq!(
            value.to_str().expect("ascii"),
            "t=1700000000,v1=4d583a269f4f276a3fa80ff31b5a01879a848096983222a17893d198418939aa"
        );
    }

    fn sink(url: &str, timeout: Duration) -> HttpSink {
        HttpSink::new(HttpSinkParts {
            url: SecretUrl::parse(url).expect("url"),
            method: Method::POST,
            secret: None,
            headers: HeaderMap::new(),
            timeout,
            roots: None,
            identity: None,
        })
        .expect("sink")
    }

    fn message() -> Message {
        Message::new("m1", "out", &b"hello"[..])
    }

    #[tokio::test]
    async fn a_refused_connection_is_unavailable_and_says_no_password() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let sink = sink(
            &format!("http://hook:pw-Secret9@127.0.0.1:{port}/x"),
            Duration::from_secs(5),
        );
        match sink.write(&message()).await {
            Err(SinkError::Unavailable(why)) => {
                assert!(why.contains("cannot connect"), "{why}");
                assert!(!why.contains("pw-Secret9"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn no_answer_in_time_or_a_drop_after_sending_is_a_retry() {
        use tokio::io::AsyncReadExt;
        // Accepts, reads the request, never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = silent.local_addr().expect("addr");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut stream, _)) = silent.accept().await {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                held.push(stream);
            }
        });
        let slow = sink(&format!("http://{addr}/x"), Duration::from_millis(300));
        match slow.write(&message()).await {
            Err(SinkError::Retry { reason, after }) => {
                assert!(reason.contains("no answer"), "{reason}");
                assert_eq!(after, None);
            }
            other => panic!("{other:?}"),
        }
        // Accepts, reads the request, hangs up.
        let rude = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = rude.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = rude.accept().await {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                drop(stream);
            }
        });
        let dropped = sink(&format!("http://{addr}/x"), Duration::from_secs(5));
        match dropped.write(&message()).await {
            Err(SinkError::Retry { reason, .. }) => {
                assert!(reason.contains("failed"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn too_many_headers_are_a_rejection_not_a_panic() {
        let sink = sink("http://127.0.0.1:9/x", Duration::from_secs(5));
        for count in [MAX_MESSAGE_HEADERS + 1, 25_000] {
            let mut message = message();
            message.headers = (0..count).map(|i| (format!("h{i}"), "v".into())).collect();
            match sink.write(&message).await {
                Err(SinkError::Rejected(why)) => {
                    assert!(why.contains(&format!("{count} headers")), "{why}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_receiver_quoting_the_credentials_back_has_them_hidden() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Answers 401 with every request header in its body, as a
        // careless receiver's error page might.
        let echo = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = echo.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = echo.accept().await {
                let mut buf = vec![0u8; 16 * 1024];
                let n = stream.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).replace("\r\n", " ");
                let body = format!("denied: {head}");
                let answer = format!(
                    "HTTP/1.1 401 Unauthorized\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            HeaderValue::from_static("Bearer tok-AbCdEf123"),
        );
        headers.insert("x-api-key", HeaderValue::from_static("key-ZyXw987"));
        let sink = HttpSink::new(HttpSinkParts {
            url: SecretUrl::parse(&format!("http://apikey-Q1w2E3:@{addr}/x")).expect("url"),
            method: Method::POST,
            secret: Some(b"whsec-Secret".to_vec()),
            headers,
            timeout: Duration::from_secs(5),
            roots: None,
            identity: None,
        })
        .expect("sink");
        match sink.write(&message()).await {
            Err(SinkError::Rejected(why)) => {
                assert!(why.starts_with("HTTP 401: denied"), "{why}");
                for secret in ["tok-AbCdEf123", "key-ZyXw987", "apikey-Q1w2E3"] {
                    assert!(!why.contains(secret), "{secret} in {why}");
                }
            }
            other => panic!("{other:?}"),
        }
    }
}
