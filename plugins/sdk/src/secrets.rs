//! The secrets the stage lists under `secrets:`, whose values the
//! pipeline's `secrets:` block references (an environment variable or a
//! file). The host removes every value from the handler's log lines,
//! stdout, stderr and reject reasons.
//!
//! ```ignore
//! let key = sluice_sdk::secrets::get("signing_key")?;
//! ```
//!
//! A secret that only goes into a request header need not be read at all:
//! the stage's `http.headers` can put it in (`Bearer {secret:api_token}`),
//! so the handler never holds it.

use crate::HandlerError;
use crate::bindings::handler::sluice::plugin::secrets as raw;

/// Why a secret could not be read: the stage does not list it.
pub use raw::SecretError;

/// The value of the secret `name`.
pub fn get(name: &str) -> Result<String, SecretError> {
    raw::get(name)
}

/// What went wrong, in words (the bindings' `Display` shows the variant).
pub fn describe(e: &SecretError) -> String {
    match e {
        SecretError::NotGranted(why) => format!("secret not granted: {why}"),
    }
}

/// With `?` in a handler: a secret the stage does not list is a pipeline
/// mistake, so the message is rejected with the reason (which names the
/// secret, never a value).
impl From<SecretError> for HandlerError {
    fn from(e: SecretError) -> Self {
        HandlerError::reject(describe(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ungranted_secret_rejects_with_the_reason() {
        let e = SecretError::NotGranted("stage `s` does not list `k`".into());
        assert_eq!(
            HandlerError::from(e),
            HandlerError::Reject("secret not granted: stage `s` does not list `k`".into())
        );
    }
}
