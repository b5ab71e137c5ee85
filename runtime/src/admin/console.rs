//! The web console at `/ui`: its page, script and style sheet, embedded
//! in the binary (no CDN: it works offline), and its sign-in.
//!
//! - `GET /ui`, `/ui/`, `/ui/app.js`, `/ui/app.css`: the assets, under a
//!   Content-Security-Policy that allows no inline script or style and
//!   no other origin, so injected markup cannot run.
//! - `POST /ui/session` `{"token": "..."}`: signs in with an API token
//!   (full or read-only). It sets an HttpOnly, SameSite=Strict session
//!   cookie and answers the role and the CSRF token (`session.rs`).
//! - `GET /ui/session`: the role and CSRF token of the cookie's session;
//!   401 when there is none (the page then shows its sign-in form).
//! - `DELETE /ui/session`: signs out (with the CSRF token).
//!
//! Everything else the page shows and does goes through the `/v1` API
//! with the cookie, under the same guard as any other client
//! (`access.rs`): a read-only session can change nothing, whatever the
//! page's buttons look like.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::access::role_of;
use super::role::Role;
use super::session::{self, SESSION_TTL};
use super::{AdminState, ApiError, ErrorBody};

/// The console's policy: its own script and style only, no inline code,
/// no framing, no form posts, no other origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");

/// The console's page and assets (not in the OpenAPI document: they serve
/// the page, not API clients). Its session routes are in the document, and
/// registered with the API's ([`super::routes`]).
pub(super) fn routes() -> Router<AdminState> {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/app.js", get(script))
        .route("/ui/app.css", get(style))
}

/// The largest sign-in body read: a token is a few dozen bytes.
pub(super) const SIGN_IN_LIMIT: usize = 4096;

/// How the console's session routes can be refused besides their own
/// cases (the guard's `Host` check).
#[derive(utoipa::IntoResponses)]
#[expect(
    dead_code,
    reason = "a description of responses; the handlers answer with ApiError"
)]
pub(super) enum SessionErrors {
    /// `Host` names neither this server, `localhost`, nor an
    /// `--admin-allowed-host` (DNS rebinding).
    #[response(status = 421)]
    MisdirectedHost(ErrorBody),
}

/// The headers every console response carries.
fn hardened(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    hardened(
        (
            [
                (header::CONTENT_TYPE, content_type),
                // Embedded in the binary: revalidate, so an upgrade shows
                // at once.
                (header::CACHE_CONTROL, "no-cache"),
            ],
            body,
        )
            .into_response(),
    )
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

/// A sign-in request.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SignIn {
    /// An admin token: `SLUICE_ADMIN_TOKEN` or `SLUICE_ADMIN_READ_TOKEN`.
    token: String,
}

/// Who the page is signed in as.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct SessionView {
    /// `full`, `read`, or `open` (no token is configured).
    role: &'static str,
    /// What state-changing calls send in `X-Sluice-CSRF` (empty when
    /// open).
    csrf: String,
}

impl SessionView {
    fn open() -> Self {
        SessionView {
            role: Role::Open.as_str(),
            csrf: String::new(),
        }
    }
}

/// `GET /ui/session`.
#[utoipa::path(get, path = "/ui/session", operation_id = "get_console_session", tag = "console",
    description = "The role and CSRF token of the console session the `sluice_session` cookie names. With no token configured, the API is open: role `open`, no CSRF token.",
    responses(
        (status = 200, description = "The session.", body = SessionView),
        (status = 401, description = "No session: no cookie, or it has ended (signed out, expired, or the daemon restarted).", body = ErrorBody),
        SessionErrors,
    ))]
pub(super) async fn current(State(state): State<AdminState>, headers: HeaderMap) -> Response {
    if !state.access.has_token() {
        return hardened(Json(SessionView::open()).into_response());
    }
    let found = session::cookie(&headers).and_then(|id| state.sessions.find(id));
    hardened(match found {
        Some(signed) => Json(SessionView {
            role: signed.role.as_str(),
            csrf: signed.csrf,
        })
        .into_response(),
        None => ApiError::Unauthorized("sign in with an admin token".into()).into_response(),
    })
}

/// `POST /ui/session`.
#[utoipa::path(post, path = "/ui/session", operation_id = "sign_in_console", tag = "console",
    description = "Signs the console in with an admin token (full or read-only): sets the `sluice_session` cookie (HttpOnly, SameSite=Strict, Secure under TLS, 12 hours), which then stands for the token on `/v1` calls; changes made with it need the answered CSRF token in `X-Sluice-CSRF`. Wrong tokens count towards the address's refusal (see the security scheme).",
    request_body(content = SignIn, content_type = "application/json"),
    responses(
        (status = 200, description = "Signed in.", body = SessionView,
            headers(("Set-Cookie" = String, description = "The session cookie."))),
        (status = 400, description = "The body is not a JSON object with `token`.", body = ErrorBody),
        (status = 401, description = "The token is not valid for this admin API.", body = ErrorBody),
        (status = 403, description = "The request came from a web page of another site (`Origin`).", body = ErrorBody),
        (status = 413, description = "The body is over 4 KiB.", body = ErrorBody),
        (status = 503, description = "No session can be opened now; retry after `Retry-After` seconds.", body = ErrorBody,
            headers(("Retry-After" = u32))),
        SessionErrors,
    ))]
pub(super) async fn sign_in(
    State(state): State<AdminState>,
    extensions: axum::http::Extensions,
    body: Bytes,
) -> Response {
    let peer = extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    let client = peer.map_or_else(|| "unknown".to_owned(), |p| p.to_string());
    if !state.access.has_token() {
        return hardened(Json(SessionView::open()).into_response());
    }
    let request: SignIn = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(err) => {
            return hardened(
                ApiError::BadRequest(format!("a sign-in is JSON {{\"token\": \"...\"}}: {err}"))
                    .into_response(),
            );
        }
    };
    let Some(role) = role_of(&state.access, &request.token) else {
        tracing::warn!(client = %client, "console sign-in refused: the token is not valid");
        if let Some(peer) = peer {
            state.throttle.failed(peer.ip(), std::time::Instant::now());
        }
        return hardened(
            ApiError::Unauthorized("the token is not valid for this admin API".into())
                .into_response(),
        );
    };
    let (id, signed) = match state.sessions.open(role) {
        Ok(opened) => opened,
        Err(err) => {
            return hardened(
                ApiError::Unavailable(format!("cannot open a session: {err}")).into_response(),
            );
        }
    };
    tracing::info!(client = %client, role = role.as_str(), "console sign-in");
    let cookie = format!(
        "{}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        session::COOKIE,
        SESSION_TTL.as_secs(),
        if state.tls.is_some() { "; Secure" } else { "" }
    );
    let mut response = Json(SessionView {
        role: role.as_str(),
        csrf: signed.csrf,
    })
    .into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    hardened(response)
}

/// `DELETE /ui/session`.
#[utoipa::path(delete, path = "/ui/session", operation_id = "sign_out_console", tag = "console",
    description = "Ends the cookie's console session and expires the cookie. Without a session there is nothing to end: 204 all the same.",
    params(("X-Sluice-CSRF" = Option<String>, Header, description = "The session's CSRF token, required when the cookie names a session.")),
    responses(
        (status = 204, description = "Signed out.",
            headers(("Set-Cookie" = String, description = "The cookie, expired."))),
        (status = 403, description = "The CSRF token is missing or wrong, or the request came from a web page of another site (`Origin`).", body = ErrorBody),
        SessionErrors,
    ))]
pub(super) async fn sign_out(State(state): State<AdminState>, headers: HeaderMap) -> Response {
    let Some(id) = session::cookie(&headers) else {
        return hardened(StatusCode::NO_CONTENT.into_response());
    };
    if let Some(signed) = state.sessions.find(id) {
        let csrf = headers
            .get(session::CSRF_HEADER)
            .and_then(|v| v.to_str().ok());
        if !signed.csrf_matches(csrf) {
            return hardened(
                ApiError::Forbidden(format!(
                    "signing out needs the session's CSRF token in the {} header",
                    session::CSRF_HEADER
                ))
                .into_response(),
            );
        }
        state.sessions.close(id);
    }
    let expired = format!(
        "{}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
        session::COOKIE
    );
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Ok(value) = HeaderValue::from_str(&expired) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    hardened(response)
}
