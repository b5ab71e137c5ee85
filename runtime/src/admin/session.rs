//! The web console's sign-in sessions: a token typed once becomes an
//! HttpOnly cookie, so the page's script never holds the token itself.
//!
//! A session is 32 random bytes, kept here only as their SHA-256 digest,
//! with the role of the token that opened it and a CSRF token that every
//! state-changing call made with the cookie must echo in
//! [`CSRF_HEADER`]. Sessions live in memory (a restart signs everyone out),
//! last [`SESSION_TTL`], and are capped at [`MAX_SESSIONS`]: past the cap
//! the oldest is dropped, so sign-ins cannot grow memory without bound.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::role::Role;

/// The cookie that carries the session id.
pub const COOKIE: &str = "sluice_session";

/// The header a state-changing call made with the cookie carries the
/// session's CSRF token in.
pub const CSRF_HEADER: &str = "x-sluice-csrf";

/// How long a session lasts from sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// The most sessions held at once.
pub const MAX_SESSIONS: usize = 1024;

/// One signed-in browser.
struct Session {
    role: Role,
    csrf: String,
    opened: Instant,
}

/// What a session cookie stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Signed {
    /// The role of the token that opened it.
    pub(super) role: Role,
    /// The token state-changing calls must echo.
    pub(super) csrf: String,
}

impl Signed {
    /// Whether `presented` (the [`CSRF_HEADER`] value) is this session's
    /// CSRF token, in time independent of where they differ.
    pub(super) fn csrf_matches(&self, presented: Option<&str>) -> bool {
        presented.is_some_and(|p| bool::from(p.as_bytes().ct_eq(self.csrf.as_bytes())))
    }
}

/// The sessions of one admin server.
#[derive(Default)]
pub(super) struct Sessions {
    by_digest: Mutex<HashMap<[u8; 32], Session>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sessions(<redacted>)")
    }
}

/// 32 random bytes from the operating system, as hex.
fn random_hex() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
    Ok(hex::encode(bytes))
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    /// Opens a session for `role`: its id (for the cookie) and what it
    /// stands for.
    ///
    /// # Errors
    ///
    /// The operating system gave no random bytes.
    pub(super) fn open(&self, role: Role) -> std::io::Result<(String, Signed)> {
        let id = random_hex()?;
        let csrf = random_hex()?;
        let now = Instant::now();
        let mut map = self.lock();
        map.retain(|_, s| now.duration_since(s.opened) < SESSION_TTL);
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map.iter().min_by_key(|(_, s)| s.opened).map(|(k, _)| *k)
        {
            map.remove(&oldest);
        }
        map.insert(
            digest(&id),
            Session {
                role,
                csrf: csrf.clone(),
                opened: now,
            },
        );
        Ok((id, Signed { role, csrf }))
    }

    /// The live session a cookie value names.
    pub(super) fn find(&self, id: &str) -> Option<Signed> {
        let map = self.lock();
        let session = map.get(&digest(id))?;
        (session.opened.elapsed() < SESSION_TTL).then(|| Signed {
            role: session.role,
            csrf: session.csrf.clone(),
        })
    }

    /// Ends the session a cookie value names.
    pub(super) fn close(&self, id: &str) {
        self.lock().remove(&digest(id));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.by_digest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The session id in a request's `Cookie` headers, if any.
pub(super) fn cookie(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_id_only_and_ends() {
        let sessions = Sessions::default();
        let (id, signed) = sessions.open(Role::Read).expect("random");
        assert_eq!(id.len(), 64);
        assert_eq!(sessions.find(&id), Some(signed.clone()));
        assert_eq!(sessions.find(&id[1..]), None);
        assert!(signed.csrf_matches(Some(&signed.csrf)));
        assert!(!signed.csrf_matches(Some("nope")) && !signed.csrf_matches(None));
        sessions.close(&id);
        assert_eq!(sessions.find(&id), None);
    }

    #[test]
    fn sessions_are_capped() {
        let sessions = Sessions::default();
        let (first, _) = sessions.open(Role::Full).expect("random");
        for _ in 0..MAX_SESSIONS {
            sessions.open(Role::Full).expect("random");
        }
        assert_eq!(sessions.lock().len(), MAX_SESSIONS);
        assert_eq!(sessions.find(&first), None, "the oldest went first");
    }

    #[test]
    fn the_cookie_is_read_among_others() {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            "a=1; sluice_session=abc ; b=2".parse().expect("header"),
        );
        assert_eq!(cookie(&headers), Some("abc"));
        assert_eq!(cookie(&axum::http::HeaderMap::new()), None);
    }
}
