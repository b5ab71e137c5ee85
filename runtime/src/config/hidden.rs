//! Connection URLs and secrets that never reach logs, `status` or errors.
//!
//! A [`SecretUrl`] keeps the URL as written (after `${VAR}` expansion) for
//! the client library, and shows itself everywhere else with the password
//! replaced by `***`. A [`Secret`] shows only `***`.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A connection URL (`redis://`, `postgres://`, `https://`) whose secrets
/// are never shown: `Display`, `Debug` and serialisation print `***` in
/// their place. [`SecretUrl::expose`] gives the real text to the client
/// library.
///
/// What counts as a secret: the password; every query value but a few
/// harmless settings ([`SHOWN_QUERY_KEYS`]: `?token=***`, but
/// `?sslmode=require`); and in the path:
///
/// - of an `http(s)` URL, every segment that is not a plain lowercase word
///   or an API version ([`is_plain_word`]). Webhook providers put their
///   credential there (`/services/T0/B0/XXXX`, `/hooks/catch/123/abc1x/`),
///   and no length or shape tells a short token from a name, so only
///   words are shown: `/v1/incoming-webhooks/***`;
/// - of any other URL (a database name or number), a segment that looks
///   like a token (16 or more characters with a digit, or 24 or more).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl {
    raw: String,
    /// `raw` as the URL parser writes it back (what a client library's
    /// error quotes: `https://Host` becomes `https://host/`).
    normalized: String,
    shown: String,
    /// The hidden parts as written in `raw` (and percent-decoded), for
    /// [`SecretUrl::scrub`].
    hidden: Vec<String>,
}

/// Query keys whose values are settings, not secrets, and stay visible.
pub const SHOWN_QUERY_KEYS: &[&str] = &[
    "sslmode",
    "connect_timeout",
    "application_name",
    "target_session_attrs",
    "protocol",
];

/// The shortest secret part that [`SecretUrl::scrub`] replaces in text.
const MIN_SCRUBBED: usize = 3;

/// Whether a path segment looks like a token rather than a word.
fn looks_like_token(segment: &str) -> bool {
    let len = segment.chars().count();
    len >= 24 || (len >= 16 && segment.bytes().any(|b| b.is_ascii_digit()))
}

/// Whether a segment of a webhook URL's path is shown: a plain lowercase
/// word (`incoming-webhooks`, `services`, `orders.json`) of at most 32
/// characters, one of 16 or more only with a `-`, `_` or `.` in it (a run
/// of letters that long is more likely a token); an API version (`v1`); or
/// a number (an account or webhook id, `/hooks/catch/1234567/`, a database
/// number). Anything that mixes digits with letters, has a capital or
/// another character may be a credential.
fn is_plain_word(segment: &str) -> bool {
    let is_separator = |b: u8| matches!(b, b'-' | b'_' | b'.');
    let version = segment
        .strip_prefix('v')
        .is_some_and(|n| !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit()));
    let word = segment.len() <= 32
        && segment.bytes().any(|b| b.is_ascii_lowercase())
        && segment
            .bytes()
            .all(|b| b.is_ascii_lowercase() || is_separator(b))
        && (segment.len() < 16 || segment.bytes().any(is_separator));
    let number = segment.len() <= 20 && segment.bytes().all(|b| b.is_ascii_digit());
    version || word || number
}

impl SecretUrl {
    /// Parses `raw`; the error never repeats a password.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let parsed = url::Url::parse(raw)
            .map_err(|e| format!("`{}` is not a URL: {e}", redact_unparsed(raw)))?;
        let mut shown = parsed.clone();
        let mut hidden = Vec::new();
        if let Some(password) = parsed.password() {
            hidden.push(password.to_owned());
            let _ = shown.set_password(Some("***"));
        }
        let webhook = matches!(parsed.scheme(), "http" | "https");
        // A webhook's user name is as often the credential itself (an API
        // key before the `@`, with no password) as a name: never shown.
        if webhook && !parsed.username().is_empty() {
            if !is_plain_word(parsed.username()) {
                hidden.push(parsed.username().to_owned());
            }
            let _ = shown.set_username("***");
        }
        let secret_segment = |s: &str| {
            !s.is_empty()
                && if webhook {
                    !is_plain_word(s)
                } else {
                    looks_like_token(s)
                }
        };
        if !parsed.cannot_be_a_base()
            && let Some(segments) = parsed.path_segments()
        {
            let segments: Vec<&str> = segments.collect();
            if segments.iter().any(|s| secret_segment(s)) {
                let path: Vec<&str> = segments
                    .iter()
                    .map(|s| {
                        if secret_segment(s) {
                            hidden.push((*s).to_owned());
                            "***"
                        } else {
                            s
                        }
                    })
                    .collect();
                shown.set_path(&path.join("/"));
            }
        }
        if parsed.query().is_some() {
            let pairs: Vec<(String, String)> = parsed
                .query_pairs()
                .map(|(k, v)| {
                    if SHOWN_QUERY_KEYS.contains(&k.as_ref()) || v.is_empty() {
                        (k.into_owned(), v.into_owned())
                    } else {
                        hidden.push(v.clone().into_owned());
                        (k.into_owned(), "***".to_owned())
                    }
                })
                .collect();
            // The raw (percent-encoded) values too, for `scrub`.
            for part in parsed.query().unwrap_or_default().split('&') {
                if let Some((k, v)) = part.split_once('=')
                    && !SHOWN_QUERY_KEYS.contains(&k)
                    && !v.is_empty()
                {
                    hidden.push(v.to_owned());
                }
            }
            shown
                .query_pairs_mut()
                .clear()
                .extend_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        }
        let shown = shown.to_string().replace("%2A%2A%2A", "***");
        // A part too short to hide without mangling the text around it
        // (`?v=1`) is still hidden in the shown URL, not scrubbed from text.
        hidden.retain(|h| h.len() >= MIN_SCRUBBED);
        let decoded: Vec<String> = hidden
            .iter()
            .filter_map(|h| percent_decode(h).ok())
            .filter(|d| d.len() >= MIN_SCRUBBED && !hidden.contains(d))
            .collect();
        hidden.extend(decoded);
        // Longest first, so a part that contains another is replaced whole.
        hidden.sort_by_key(|h| std::cmp::Reverse(h.len()));
        hidden.dedup();
        Ok(SecretUrl {
            raw: raw.to_owned(),
            normalized: parsed.to_string(),
            shown,
            hidden,
        })
    }

    /// This URL with `secrets` (values put in from the `secrets:` block)
    /// hidden too, wherever in the URL they are.
    #[must_use]
    pub fn hiding(mut self, secrets: &[String]) -> Self {
        let mut secrets: Vec<&String> = secrets.iter().filter(|s| !s.is_empty()).collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        for secret in secrets {
            self.shown = self.shown.replace(secret.as_str(), "***");
            if !self.hidden.contains(secret) {
                self.hidden.push(secret.clone());
            }
        }
        self.hidden.sort_by_key(|h| std::cmp::Reverse(h.len()));
        self
    }

    /// The URL with its secrets, for the client library only.
    pub fn expose(&self) -> &str {
        &self.raw
    }

    /// The URL parsed (with its secrets: do not print it).
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

    /// The value of query parameter `key`, if given.
    pub fn query_value(&self, key: &str) -> Option<String> {
        self.url()
            .query_pairs()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.into_owned())
    }

    /// The URL as shown to people: its secrets replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.shown
    }

    /// Replaces every occurrence of this URL's secrets in `text` (a
    /// client library's error message may quote the URL, or a part of
    /// it) by `***`.
    pub fn scrub(&self, text: &str) -> String {
        // The whole URL first: its parts that are too short to scrub one
        // by one (a path segment of two characters) go with it.
        let mut out = text
            .replace(&self.raw, &self.shown)
            .replace(&self.normalized, &self.shown);
        for part in &self.hidden {
            out = out.replace(part.as_str(), "***");
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
    /// `{secret:name}` anywhere in the URL takes the value of a secret of
    /// the pipeline's `secrets:` block, and is hidden wherever the URL is
    /// shown, whatever part it is.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let (raw, secrets) =
            crate::config::secrets::resolve_url(&text).map_err(serde::de::Error::custom)?;
        let url = SecretUrl::parse(&raw).map_err(|e| {
            let mut e = e;
            for secret in &secrets {
                e = e.replace(secret.as_str(), "***");
            }
            serde::de::Error::custom(e)
        })?;
        Ok(url.hiding(&secrets))
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
    /// `{secret:name}` takes the value of a secret of the pipeline's
    /// `secrets:` block (see `config::secrets`).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        crate::config::secrets::resolve(&text)
            .map(|(value, _)| Secret(value))
            .map_err(serde::de::Error::custom)
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

/// Text that may carry `{secret:name}` references (a header a stage's
/// `http:` grant adds): shown as written, references and all, and used
/// with the secrets' values put in. A `${VAR}` in it is shown as written
/// too (the loader notes the text before interpolation).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretText {
    /// What is shown: the text as the file writes it.
    pub(crate) written: String,
    value: String,
}

impl SecretText {
    /// The text with the secrets' values in, for the code that uses it.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// The text as written, references and all: what may be shown.
    pub fn written(&self) -> &str {
        &self.written
    }
}

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretText({:?})", self.written)
    }
}

impl<'de> Deserialize<'de> for SecretText {
    /// `{secret:name}` takes the value of a secret of the pipeline's
    /// `secrets:` block (see `config::secrets`).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        crate::config::secrets::resolve(&text)
            .map(|(value, _)| SecretText {
                written: text,
                value,
            })
            .map_err(serde::de::Error::custom)
    }
}

impl Serialize for SecretText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.written)
    }
}

impl JsonSchema for SecretText {
    fn schema_name() -> Cow<'static, str> {
        "SecretText".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "Text; `{secret:name}` puts in a secret of the pipeline's `secrets:` block, which is never shown."
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
    fn query_values_and_token_like_path_segments_are_hidden() {
        let hook = SecretUrl::parse(
            "https://hooks.example/services/T0123/B0123/XXXXXXXXXXXXXXXXXXXXXXXX?token=abc123&sslmode=require",
        )
        .expect("parses");
        assert_eq!(
            hook.redacted(),
            "https://hooks.example/services/***/***/***?token=***&sslmode=require"
        );
        let said = hook.scrub(
            "error sending request for url (https://hooks.example/services/T0123/B0123/XXXXXXXXXXXXXXXXXXXXXXXX?token=abc123)",
        );
        assert!(!said.contains("XXXX") && !said.contains("abc123"), "{said}");

        let uuid = SecretUrl::parse("https://webhook.example/6f1c2a7e-4d1b-4c39-9a57-0d8c1e2f3a4b")
            .expect("parses");
        assert_eq!(uuid.redacted(), "https://webhook.example/***");

        // Ordinary words stay, so an operator can tell targets apart.
        let plain = SecretUrl::parse("https://api.example/v1/incoming-webhooks/orders.json/")
            .expect("parses");
        assert_eq!(
            plain.redacted(),
            "https://api.example/v1/incoming-webhooks/orders.json/"
        );

        // A short token in a webhook's path is hidden whatever its shape,
        // and scrubbed where an error quotes the whole URL.
        for (url, shown) in [
            (
                "https://hooks.example/hooks/catch/1234567/ab12x/",
                "https://hooks.example/hooks/catch/1234567/***/",
            ),
            (
                "https://hooks.example/in/Zq",
                "https://hooks.example/in/***",
            ),
            (
                "https://hooks.example/in/qwkzjfhtrmxlpvnb",
                "https://hooks.example/in/***",
            ),
            (
                "https://hooks.example/in/k%2Fy",
                "https://hooks.example/in/***",
            ),
            ("HTTPS://Hooks.Example/t/x9", "https://hooks.example/t/***"),
            ("http://127.0.0.1:6379/0", "http://127.0.0.1:6379/0"),
        ] {
            let hook = SecretUrl::parse(url).expect("parses");
            assert_eq!(hook.redacted(), shown, "{url}");
            let quoted = format!("error sending request for url ({})", hook.url());
            let said = hook.scrub(&quoted);
            assert_eq!(said, format!("error sending request for url ({shown})"));
        }
        // A database URL's path is its name or number: shown.
        let redis = SecretUrl::parse("redis://127.0.0.1:6379/0").expect("parses");
        assert_eq!(redis.redacted(), "redis://127.0.0.1:6379/0");
        let pg = SecretUrl::parse("postgres://app@db/orders_2024").expect("parses");
        assert_eq!(pg.redacted(), "postgres://app@db/orders_2024");

        let pg = SecretUrl::parse("postgres://app@db/app?password=p%40ss&sslmode=verify-full")
            .expect("parses");
        assert_eq!(
            pg.redacted(),
            "postgres://app@db/app?password=***&sslmode=verify-full"
        );
        assert!(!pg.scrub("bad password p@ss").contains("p@ss"));
        assert_eq!(pg.query_value("sslmode").as_deref(), Some("verify-full"));
    }

    #[test]
    fn a_webhook_user_name_is_never_shown() {
        // An API key as the user, with no password, or an empty one.
        for raw in [
            "https://sk_live_4eC39HqLyjWDarjtT1@api.example/v1/events",
            "https://sk_live_4eC39HqLyjWDarjtT1:@api.example/v1/events",
        ] {
            let url = SecretUrl::parse(raw).expect("parses");
            assert_eq!(url.redacted(), "https://***@api.example/v1/events");
            assert!(!url.scrub(&format!("error for {raw}")).contains("sk_live"));
        }
        // A plain user name is hidden in the URL, not scrubbed from text.
        let url = SecretUrl::parse("https://hook:pw-123456@hooks.example/in").expect("parses");
        assert_eq!(url.redacted(), "https://***:***@hooks.example/in");
        assert_eq!(url.scrub("a hook failed"), "a hook failed");
        // Other schemes keep their user names: a Redis ACL user, a role.
        let url = SecretUrl::parse("redis://app:pw-123456@cache:6379/0").expect("parses");
        assert_eq!(url.redacted(), "redis://app:***@cache:6379/0");
    }

    #[test]
    fn a_url_that_does_not_parse_is_reported_without_its_password() {
        let err = SecretUrl::parse("redis://user:hunter2@[bad").expect_err("bad URL");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn a_secret_from_the_secrets_block_is_hidden_wherever_it_lands() {
        // A plain word in a database name or a path would be shown; put
        // there from `secrets:`, it is not.
        let url = SecretUrl::parse("postgres://app@db:5432/orderswordsecret")
            .expect("parses")
            .hiding(&["orderswordsecret".to_owned()]);
        assert_eq!(url.redacted(), "postgres://app@db:5432/***");
        assert_eq!(
            url.scrub("cannot open db orderswordsecret"),
            "cannot open db ***"
        );
        assert!(!format!("{url} {url:?}").contains("orderswordsecret"));
    }

    #[test]
    fn a_secret_shows_only_stars() {
        let secret = Secret::from("k3y");
        assert_eq!(format!("{secret} {secret:?}"), "*** Secret(***)");
        assert_eq!(serde_json::to_string(&secret).expect("json"), "\"***\"");
    }
}
