//! Who may call the admin API, and from where: the guard in front of every
//! route.
//!
//! - **Tokens.** With a token configured, every `/v1` call needs
//!   `Authorization: Bearer <token>` (else 401 with `WWW-Authenticate`),
//!   or the web console's session cookie (`session.rs`), with which every
//!   state-changing call must also carry the session's CSRF token.
//!   The full token may do anything; the read token only `GET`s (status,
//!   topics, tail, DLQ list/show), so a write with it is 403. Tokens are
//!   compared in constant time, as SHA-256 digests, and never logged.
//! - **Host.** A `/v1` or `/ui` request's `Host` must name the bound address,
//!   `localhost`, or a host given with `--admin-allowed-host`: a web page
//!   that rebinds its own name to 127.0.0.1 (DNS rebinding) sends its own
//!   name, and is refused with 421.
//! - **Origin.** A mutating request whose `Origin` is not the site it was
//!   sent to is refused with 403: browsers send `Origin` on every
//!   cross-site POST, so no web page can publish, purge or redrive, even
//!   with a body type (text/plain) that needs no CORS preflight.
//! - **Audit.** Every mutating call is logged (info) with the client
//!   address and the role used.
//!
//! `/metrics` and the health endpoints stay open: they change nothing and
//! probes and scrapers rarely carry tokens.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::ApiError;
use super::role::Role;
use super::session::{self, Sessions};
use super::throttle::Throttle;

/// A bearer token, kept only as its SHA-256 digest so the secret itself is
/// not held (or printed) anywhere past start-up.
#[derive(Clone)]
pub struct Token([u8; 32]);

impl Token {
    /// A token from its text (surrounding whitespace, such as a file's
    /// trailing newline, is not part of it). None when it is empty.
    pub fn new(text: &str) -> Option<Token> {
        let text = text.trim();
        (!text.is_empty()).then(|| Token(Sha256::digest(text.as_bytes()).into()))
    }

    /// Whether `presented` is this token, in time independent of where
    /// they differ.
    fn matches(&self, presented: &[u8; 32]) -> bool {
        self.0.ct_eq(presented).into()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// What the admin API lets in: tokens and the extra names `Host` may carry.
#[derive(Debug, Clone, Default)]
pub struct AccessConfig {
    /// Full access (`SLUICE_ADMIN_TOKEN` / `--admin-token-file`).
    pub full: Option<Token>,
    /// Reads only (`SLUICE_ADMIN_READ_TOKEN` / `--admin-read-token-file`).
    pub read: Option<Token>,
    /// Extra `Host` values accepted (`--admin-allowed-host`): `name` (any
    /// port) or `name:port`, compared without case.
    pub allowed_hosts: Vec<String>,
}

impl AccessConfig {
    /// Whether any token is configured (the API is closed to callers
    /// without one).
    pub fn has_token(&self) -> bool {
        self.full.is_some() || self.read.is_some()
    }
}

/// The guard's state: the access rules and the address the server is bound
/// to (for `Host`).
#[derive(Debug, Clone)]
pub(super) struct Guard {
    access: Arc<AccessConfig>,
    bound: SocketAddr,
    /// The console's sign-in sessions.
    sessions: Arc<Sessions>,
    /// Failed authentications by address.
    throttle: Arc<Throttle>,
}

impl Guard {
    pub(super) fn new(
        access: Arc<AccessConfig>,
        bound: SocketAddr,
        sessions: Arc<Sessions>,
        throttle: Arc<Throttle>,
    ) -> Self {
        Guard {
            access,
            bound,
            sessions,
            throttle,
        }
    }
}

/// Whether a method changes something (and so needs the full role, an
/// own-site `Origin`, and an audit line).
fn mutating(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The middleware: an address refused for guessing tokens, Host, Origin,
/// token, audit; then the route.
pub(super) async fn guard(
    State(guard): State<Guard>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let authenticates = guard.access.has_token()
        && (path == "/v1" || path.starts_with("/v1/") || path == "/ui/session");
    let ip = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    if authenticates
        && let Some(ip) = ip
        && let Some(left) = guard.throttle.blocked(ip, Instant::now())
    {
        return ApiError::Throttled(left).into_response();
    }
    let result = check(&guard, &request);
    // A wrong bearer token is a guess (no token, or an ended session, is not).
    if let (Err(ApiError::Unauthorized(_)), Some(ip)) = (&result, ip)
        && request.headers().contains_key(header::AUTHORIZATION)
    {
        guard.throttle.failed(ip, Instant::now());
    }
    match result {
        Ok(role) => {
            if mutating(request.method()) {
                let client = request
                    .extensions()
                    .get::<ConnectInfo<SocketAddr>>()
                    .map_or_else(|| "unknown".to_owned(), |c| c.0.to_string());
                tracing::info!(
                    client = %client,
                    role = role.as_str(),
                    method = %request.method(),
                    path = %request.uri().path(),
                    "admin call"
                );
            }
            // For a route that shows the read token less (state values).
            request.extensions_mut().insert(role);
            next.run(request).await
        }
        Err(err) => err.into_response(),
    }
}

fn check(guard: &Guard, request: &Request) -> Result<Role, ApiError> {
    let path = request.uri().path();
    let api = path == "/v1" || path.starts_with("/v1/");
    let console = path == "/ui" || path.starts_with("/ui/");
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if api || console {
        check_host(guard, host)?;
    }
    if mutating(request.method()) {
        check_origin(request, host)?;
    }
    if !api {
        // The console's pages are public; its session calls check for
        // themselves (`console.rs`).
        return Ok(Role::Open);
    }
    check_token(&guard.access, &guard.sessions, request)
}

/// `Host` names this server: the bound address, localhost, an IP address
/// of this machine when bound to all of them, or an allowed host.
fn check_host(guard: &Guard, host: Option<&str>) -> Result<(), ApiError> {
    let Some(host) = host else {
        return Err(ApiError::MisdirectedHost(
            "the request has no Host header; send the address of the admin API".into(),
        ));
    };
    let refused = || {
        ApiError::MisdirectedHost(format!(
            "Host `{host}` is not this admin API's address ({}); to reach it under another name, start the daemon with --admin-allowed-host NAME",
            guard.bound
        ))
    };
    let lower = host.to_ascii_lowercase();
    for allowed in &guard.access.allowed_hosts {
        let allowed = allowed.to_ascii_lowercase();
        if lower == allowed || split_host(&lower).is_some_and(|(name, _)| name == allowed) {
            return Ok(());
        }
    }
    let (name, port) = split_host(&lower).ok_or_else(refused)?;
    if port.is_some_and(|p| p != guard.bound.port()) {
        return Err(refused());
    }
    if name == "localhost" {
        return Ok(());
    }
    let ip: IpAddr = name
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| refused())?;
    // An address literal cannot be rebound: a page at http://<ip>/ is that
    // machine's own origin.
    let bound = guard.bound.ip();
    if ip == bound || bound.is_unspecified() || (ip.is_loopback() && bound.is_loopback()) {
        Ok(())
    } else {
        Err(refused())
    }
}

/// `name[:port]` or `[v6][:port]`, into the name and the port. None when
/// the port is not a number.
fn split_host(host: &str) -> Option<(&str, Option<u16>)> {
    let (name, port) = if host.starts_with('[') {
        match host.find(']') {
            Some(end) => {
                let rest = &host[end + 1..];
                (&host[..=end], rest.strip_prefix(':'))
            }
            None => return None,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if !name.contains(':') => (name, Some(port)),
            _ => (host, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse().ok()?),
        None => None,
    };
    Some((name, port))
}

/// A mutating request with an `Origin` comes from a browser page; it must
/// be a page of this very server (same scheme-less host and port as the
/// `Host` it was sent to).
fn check_origin(request: &Request, host: Option<&str>) -> Result<(), ApiError> {
    let Some(origin) = request.headers().get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("(not text)");
    let refused = || {
        ApiError::CrossOrigin(format!(
            "requests from web pages of another site are refused (Origin `{origin}`); the admin API is for the sluice CLI and scripts"
        ))
    };
    let (scheme, authority) = origin.split_once("://").ok_or_else(refused)?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return Err(refused()),
    };
    let host = host.ok_or_else(refused)?.to_ascii_lowercase();
    let authority = authority.trim_end_matches('/').to_ascii_lowercase();
    let (origin_name, origin_port) = split_host(&authority).ok_or_else(refused)?;
    let (host_name, host_port) = split_host(&host).ok_or_else(refused)?;
    if origin_name == host_name
        && origin_port.unwrap_or(default_port) == host_port.unwrap_or(default_port)
    {
        Ok(())
    } else {
        Err(refused())
    }
}

/// The role a token's text gives: None when it is neither token (or no
/// token is configured). Both are compared, whichever matches, so timing
/// says nothing about which one a guess was close to.
pub(super) fn role_of(access: &AccessConfig, token: &str) -> Option<Role> {
    let presented: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
    let full = access.full.as_ref().is_some_and(|t| t.matches(&presented));
    let read = access.read.as_ref().is_some_and(|t| t.matches(&presented));
    if full {
        Some(Role::Full)
    } else if read {
        Some(Role::Read)
    } else {
        None
    }
}

/// The role the request's bearer token (or console session) gives, when
/// tokens are configured.
fn check_token(
    access: &AccessConfig,
    sessions: &Sessions,
    request: &Request,
) -> Result<Role, ApiError> {
    if !access.has_token() {
        return Ok(Role::Open);
    }
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        });
    let role = match (bearer, session::cookie(request.headers())) {
        (Some(token), _) => role_of(access, token).ok_or_else(|| {
            ApiError::Unauthorized("the token is not valid for this admin API".into())
        })?,
        (None, Some(id)) => {
            let signed = sessions.find(id).ok_or_else(|| {
                ApiError::Unauthorized(
                    "the console session has ended (signed out, expired, or the daemon restarted); sign in again".into(),
                )
            })?;
            let csrf = request
                .headers()
                .get(session::CSRF_HEADER)
                .and_then(|v| v.to_str().ok());
            if mutating(request.method()) && !signed.csrf_matches(csrf) {
                return Err(ApiError::Forbidden(format!(
                    "a change made with the console's session needs its CSRF token in the {} header",
                    session::CSRF_HEADER
                )));
            }
            signed.role
        }
        (None, None) => {
            return Err(ApiError::Unauthorized(
                "this admin API requires a token: send `Authorization: Bearer <token>` (the sluice CLI reads SLUICE_ADMIN_TOKEN or --admin-token-file)".into(),
            ));
        }
    };
    if role == Role::Read && mutating(request.method()) {
        return Err(ApiError::Forbidden(
            "the read-only token cannot change anything; this call needs the full-access token (SLUICE_ADMIN_TOKEN or --admin-token-file)".into(),
        ));
    }
    Ok(role)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(bound: &str, allowed: &[&str]) -> Guard {
        Guard::new(
            Arc::new(AccessConfig {
                allowed_hosts: allowed.iter().map(|s| (*s).to_owned()).collect(),
                ..AccessConfig::default()
            }),
            bound.parse().expect("addr"),
            Arc::default(),
            Arc::default(),
        )
    }

    #[test]
    fn host_must_name_this_server() {
        let g = guard("127.0.0.1:7400", &["admin.internal"]);
        for ok in [
            "127.0.0.1:7400",
            "localhost:7400",
            "LOCALHOST",
            "[::1]:7400",
            "admin.internal:9000",
        ] {
            assert!(check_host(&g, Some(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:7400",
            "127.0.0.1:7401",
            "10.0.0.1:7400",
            "",
        ] {
            assert!(check_host(&g, Some(bad)).is_err(), "{bad}");
        }
        assert!(check_host(&g, None).is_err());
        let any = guard("0.0.0.0:7400", &[]);
        assert!(check_host(&any, Some("10.1.2.3:7400")).is_ok());
        assert!(check_host(&any, Some("evil.example:7400")).is_err());
    }

    #[test]
    fn tokens_compare_by_digest_and_hide_themselves() {
        let t = Token::new(" s3cret\n").expect("token");
        assert!(t.matches(&Sha256::digest(b"s3cret").into()));
        assert!(!t.matches(&Sha256::digest(b"s3cre").into()));
        assert!(!format!("{t:?}").contains("s3cret"));
        assert!(Token::new(" \n").is_none());
    }

    #[test]
    fn host_splitting() {
        assert_eq!(split_host("a:1"), Some(("a", Some(1))));
        assert_eq!(split_host("[::1]:2"), Some(("[::1]", Some(2))));
        assert_eq!(split_host("[::1]"), Some(("[::1]", None)));
        assert_eq!(split_host("a:x"), None);
    }
}
