//! A stage's `dedup:` block: what makes two messages "the same" for the
//! handler, and how long that is remembered.
//!
//! ```yaml
//! dedup: { key: header:order-id, ttl: 24h, payload_hash: true }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::{Serialize, Serializer};

use super::units::HumanDuration;

/// Handler-level idempotency: a message whose dedup key was already handled
/// (within `ttl`) is not handed to the plugin again. Its recorded outputs
/// are republished (with their original ids, so nothing is doubled) and it
/// is acked.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Dedup {
    /// What identifies a message: `id` (the message id), `header:NAME` (the
    /// value of header NAME) or `json:/pointer` (an RFC 6901 pointer into
    /// a JSON payload, e.g. `json:/order/id`).
    pub key: DedupKey,
    /// How long a handled key is remembered.
    #[serde(default = "default_dedup_ttl")]
    pub ttl: HumanDuration,
    /// Also record a hash of the payload: a message whose key was handled
    /// with a different payload is dead-lettered as `dedup-conflict`
    /// instead of being dropped as a duplicate.
    #[serde(default)]
    pub payload_hash: bool,
    /// What to do with a message that has no key (the header is absent,
    /// the payload is not JSON or lacks the pointer): `reject` dead-letters
    /// it with the reason; `process` handles it without dedup.
    #[serde(default)]
    pub missing_key: MissingKey,
}

/// Added to the handler timeout to make an IN_PROGRESS lease: the time a
/// settle may take after the handler returns. A `ttl` shorter than the
/// stage's `timeout` plus this is refused (a key would expire while its
/// handler still runs); `crate::dedup` leases records by it.
pub const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// 24 h.
pub fn default_dedup_ttl() -> HumanDuration {
    HumanDuration::secs(24 * 3600)
}

/// What to do with a message that has no dedup key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MissingKey {
    /// Dead-letter it as `rejected`, saying which key is missing.
    #[default]
    Reject,
    /// Handle it without dedup.
    Process,
}

/// Where a message's dedup key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupKey {
    /// The message id.
    Id,
    /// The value of a header.
    Header(String),
    /// The value at an RFC 6901 JSON pointer in the payload.
    Json(String),
}

impl FromStr for DedupKey {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            None if text == "id" => Ok(DedupKey::Id),
            Some(("header", name)) if !name.trim().is_empty() => {
                Ok(DedupKey::Header(name.trim().to_owned()))
            }
            Some(("json", pointer)) if pointer.starts_with('/') => {
                Ok(DedupKey::Json(pointer.to_owned()))
            }
            Some(("json", pointer)) => Err(format!(
                "`json:{pointer}` is not a JSON pointer; it starts with `/`, e.g. `json:/order/id`"
            )),
            _ => Err(format!(
                "`{text}` is not a dedup key; expected `id`, `header:NAME` or `json:/pointer`"
            )),
        }
    }
}

impl fmt::Display for DedupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DedupKey::Id => f.write_str("id"),
            DedupKey::Header(name) => write!(f, "header:{name}"),
            DedupKey::Json(pointer) => write!(f, "json:{pointer}"),
        }
    }
}

impl<'de> Deserialize<'de> for DedupKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = DedupKey;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`id`, `header:NAME` or `json:/pointer`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DedupKey, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

impl Serialize for DedupKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl JsonSchema for DedupKey {
    fn schema_name() -> Cow<'static, str> {
        "DedupKey".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^(id|header:.+|json:/.*)$",
            "description": "`id` (the message id), `header:NAME` or `json:/pointer` (into a JSON payload)."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_keys_parse_and_print_back() {
        for text in ["id", "header:order-id", "json:/order/id", "json:/"] {
            let key: DedupKey = text.parse().expect(text);
            assert_eq!(key.to_string(), text);
        }
        assert_eq!("header: x ".parse(), Ok(DedupKey::Header("x".into())));
        for bad in ["", "key", "header:", "json:order", "json", "ID"] {
            assert!(bad.parse::<DedupKey>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn defaults() {
        let dedup: Dedup = crate::config::parse::from_str_for_tests("key: header:order-id\n");
        assert_eq!(dedup.key, DedupKey::Header("order-id".into()));
        assert_eq!(dedup.ttl, HumanDuration::secs(86_400));
        assert!(!dedup.payload_hash);
        assert_eq!(dedup.missing_key, MissingKey::Reject);
    }
}
