//! The role a request was let in with: what the access guard decides and
//! a console session remembers (its own file, so neither needs the other
//! for it).

/// The role a request was let in with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// No token is configured: everyone is let in.
    Open,
    /// The full-access token.
    Full,
    /// The read-only token.
    Read,
}

impl Role {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Role::Open => "open",
            Role::Full => "full",
            Role::Read => "read",
        }
    }
}
