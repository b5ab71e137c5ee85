//! Connection URLs and secrets that never reach logs, `status` or errors.
//!
//! A [`SecretUrl`] keeps the URL as written (after `${VAR}` expansion) for
//! the client library, and shows itself everywhere else with the password
//! replaced by `***`. A [`Secret`] shows only `***`.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A connection URL (`redis://`, `postgres://`, `https://`) whose password
/// is never shown: `Display`, `Debug` and serialisation print `***` in its
/// place. [`SecretUrl::expose`] gives the real text to the client library.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl {
    raw: String,
    shown: String,
}

impl SecretUrl {
    /// Parses `raw`; the error never repeats a password.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let parsed = url::Url::parse(raw)
            .map_err(|e| format!("`{}` is not a URL: {e}", redact_unparsed(raw)))?;
        let mut shown = parsed.clone();
        if shown.password().is_some() {
            let _ = shown.set_password(Some("***"));
        }
        Ok(SecretUrl {
            raw: raw.to_owned(),
            shown: shown.to_string(),
        })
    }

    /// The URL with its password, for the client library only.
    pub fn expose(&self) -> &str {
        &self.raw
    }

    /// The URL parsed (with its password: do not print it).
    pub fn url(&self) -> url::Url {
        // Parsed once already in `parse`.
        url::Url::parse(&self.raw).unwrap_or_else(|_| {
            url::Url::parse("invalid:/").unwrap_or_else(|_| unreachable!("a constant URL parses"))
        })
    }

    /// The scheme, lowercase.
    pub fn scheme(&self) -> String {
        self.url().scheme().to_owned()
    }

    /// The URL as shown to people: the password replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.shown
    }

    /// Replaces every occurrence of this URL's password in `text` (a
    /// client library's error message may quote the URL) by `***`.
    pub fn scrub(&self, text: &str) -> String {
        let url = self.url();
        let mut out = text.replace(&self.raw, &self.shown);
        if let Some(password) = url.password()
            && !password.is_empty()
        {
            out = out.replace(password, "***");
            if let Ok(decoded) = percent_decode(password)
                && !decoded.is_empty()
            {
                out = out.replace(&decoded, "***");
            }
        }
        out
    }
}

fn percent_decode(text: &str) -> Result<String, ()> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).map_err(|_| ())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| ())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ())
}

/// A URL that did not parse, shown without anything between `://` and `@`.
fn redact_unparsed(raw: &str) -> String {
    match (raw.find("://"), raw.rfind('@')) {
        (Some(start), Some(at)) if at > start => {
            format!("{}://***@{}", &raw[..start], &raw[at + 1..])
        }
        _ => raw.to_owned(),
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({})", self.shown)
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        SecretUrl::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.shown)
    }
}

impl JsonSchema for SecretUrl {
    fn schema_name() -> Cow<'static, str> {
        "ConnectionUrl".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "format": "uri",
            "description": "A connection URL. `${VAR}` is expanded, so a password can come from the environment; it is never logged or shown."
        })
    }
}

/// A secret value (an HMAC key): shown as `***` everywhere but
/// [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the code that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Secret(value.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("***")
    }
}

impl JsonSchema for Secret {
    fn schema_name() -> Cow<'static, str> {
        "Secret".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A secret; write `${VAR}` to take it from the environment. Never logged or shown."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_never_shown() {
        let url = SecretUrl::parse("postgres://app:s3cr%40t@db.example:5432/app").expect("parses");
        assert_eq!(url.redacted(), "postgres://app:***@db.example:5432/app");
        assert_eq!(url.to_string(), url.redacted());
        assert!(!format!("{url:?}").contains("s3cr"));
        assert_eq!(url.expose(), "postgres://app:s3cr%40t@db.example:5432/app");
        let said = url.scrub("password authentication failed for s3cr@t (s3cr%40t)");
        assert!(!said.contains("s3cr"), "{said}");
        let json = serde_json::to_string(&url).expect("serialises");
        assert!(!json.contains("s3cr"), "{json}");
    }

    #[test]
    fn a_url_that_does_not_parse_is_reported_without_its_password() {
        let err = SecretUrl::parse("redis://user:hunter2@[bad").expect_err("bad URL");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn a_secret_shows_only_stars() {
        let secret = Secret::from("k3y");
        assert_eq!(format!("{secret} {secret:?}"), "*** Secret(***)");
        assert_eq!(serde_json::to_string(&secret).expect("json"), "\"***\"");
    }
}
