//! `rate:` on a stage: how many messages it may hand its handler per unit
//! of time, as a token bucket. `rate: 50/s`, or
//! `rate: {limit: 50/s, burst: 10}`, or `rate: {limit: 5/s, per: key}`.

use std::borrow::Cow;
use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::{Serialize, Serializer};

use super::model::OrderingKey;

/// The most key buckets a `per:` limit keeps, unless `max_keys` says.
pub const DEFAULT_MAX_KEYS: u32 = 10_000;

/// A stage's rate limit.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// Messages per unit of time: `50/s`, `3000/min`, `2/h`, `0.5/s`.
    pub limit: RateLimit,
    /// How many may go at once after a quiet spell (the bucket's size).
    #[serde(default = "default_burst")]
    pub burst: NonZeroU32,
    /// Limit each key separately: `key` (the message key) or
    /// `header:NAME`. Messages without one share one bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<OrderingKey>,
    /// With `per`: the most key buckets kept; the least recently used go
    /// first (a key that comes back starts with a full bucket).
    #[serde(default = "default_max_keys")]
    pub max_keys: NonZeroU32,
}

/// 1: one message at a time, evenly spaced.
pub fn default_burst() -> NonZeroU32 {
    NonZeroU32::MIN
}

/// [`DEFAULT_MAX_KEYS`].
pub fn default_max_keys() -> NonZeroU32 {
    NonZeroU32::new(DEFAULT_MAX_KEYS).unwrap_or(NonZeroU32::MIN)
}

impl Rate {
    /// [`DEFAULT_MAX_KEYS`], as the field's default.
    pub fn default_max_keys() -> NonZeroU32 {
        default_max_keys()
    }

    /// The time between two messages at the limit.
    pub fn interval(&self) -> Duration {
        self.limit.interval()
    }
}

/// Reads `rate:`: a limit (`50/s`) or the full mapping.
pub fn rate_short<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Rate>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<Rate>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a rate such as `50/s`, or {limit, burst, per}")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<Rate>, E> {
            Ok(Some(Rate {
                limit: v.parse().map_err(E::custom)?,
                burst: default_burst(),
                per: None,
                max_keys: default_max_keys(),
            }))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<Rate>, A::Error> {
            Rate::deserialize(de::value::MapAccessDeserializer::new(map)).map(Some)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<Rate>, E> {
            Ok(None)
        }
        fn visit_none<E: de::Error>(self) -> Result<Option<Rate>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<Rate>, D::Error> {
            d.deserialize_any(V)
        }
    }
    d.deserialize_any(V)
}

/// Schema of `rate:`: a limit or the mapping.
#[doc(hidden)]
pub struct RateForm;

impl JsonSchema for RateForm {
    fn schema_name() -> Cow<'static, str> {
        "RateOrLimit".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let full = generator.subschema_for::<Rate>();
        json_schema!({
            "anyOf": [
                {"type": "string", "description": "A limit: `50/s`, `3000/min`, `2/h`."},
                full,
                {"type": "null"}
            ]
        })
    }
}

/// A number of messages per unit of time, as written (`50/s`).
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    per_second: f64,
    text: String,
}

/// The slowest limit taken: one a day... a year would be a delay, not a
/// rate.
const SLOWEST_PER_SECOND: f64 = 1.0 / 86_400.0;
/// The fastest: beyond a million a second a limit limits nothing.
const FASTEST_PER_SECOND: f64 = 1_000_000.0;

impl RateLimit {
    /// Messages per second.
    pub fn per_second(&self) -> f64 {
        self.per_second
    }

    /// The time between two messages at this rate.
    pub fn interval(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.per_second)
    }
}

impl FromStr for RateLimit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "`{text}` is not a rate; write a number per unit of time: `50/s`, `3000/min`, `2/h`, `100/day`"
            )
        };
        let (count, unit) = text.trim().split_once('/').ok_or_else(bad)?;
        let count: f64 = count.trim().parse().map_err(|_| bad())?;
        let seconds = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            "d" | "day" => 86_400.0,
            _ => return Err(bad()),
        };
        let per_second = count / seconds;
        if !per_second.is_finite() || per_second <= 0.0 {
            return Err(format!("`{text}`: a rate must be more than zero"));
        }
        if !(SLOWEST_PER_SECOND..=FASTEST_PER_SECOND).contains(&per_second) {
            return Err(format!(
                "`{text}` is outside what a rate limit can be: from 1/day to 1000000/s"
            ));
        }
        Ok(RateLimit {
            per_second,
            text: text.trim().to_owned(),
        })
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for RateLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(de::Error::custom)
    }
}

impl Serialize for RateLimit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl JsonSchema for RateLimit {
    fn schema_name() -> Cow<'static, str> {
        "RateLimit".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": r"^\s*[0-9.]+\s*/\s*(s|sec|second|m|min|minute|h|hour|d|day)\s*$",
            "description": "Messages per unit of time: `50/s`, `3000/min`, `2/h`."
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_in_any_unit() {
        let at = |text: &str| text.parse::<RateLimit>().map(|r| r.per_second());
        assert_eq!(at("50/s"), Ok(50.0));
        assert_eq!(at(" 3000 / min "), Ok(50.0));
        assert_eq!(at("0.5/s"), Ok(0.5));
        assert_eq!(at("7200/h"), Ok(2.0));
        assert_eq!(at("86400/day"), Ok(1.0));
        for bad in [
            "50",
            "50/fortnight",
            "-1/s",
            "0/s",
            "x/s",
            "2000000/s",
            "1/week",
        ] {
            assert!(bad.parse::<RateLimit>().is_err(), "{bad}");
        }
        let r: RateLimit = "200/s".parse().expect("rate");
        assert_eq!(r.interval(), Duration::from_millis(5));
        assert_eq!(r.to_string(), "200/s");
    }
}
