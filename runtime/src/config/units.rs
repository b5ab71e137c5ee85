//! Durations (`30s`, `250ms`, `1m 30s`) and sizes (`64MiB`, `512KiB`) as
//! they are written in pipeline files: newtypes that parse from text, print
//! back the same way, and describe themselves in the JSON Schema.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::{Serialize, Serializer};

/// A duration written with a unit: `250ms`, `30s`, `5m`, `1h`, `1m 30s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub std::time::Duration);

impl HumanDuration {
    /// `n` seconds.
    pub const fn secs(n: u64) -> Self {
        HumanDuration(std::time::Duration::from_secs(n))
    }

    /// `n` milliseconds.
    pub const fn millis(n: u64) -> Self {
        HumanDuration(std::time::Duration::from_millis(n))
    }

    /// The [`std::time::Duration`].
    pub fn get(self) -> std::time::Duration {
        self.0
    }
}

/// What a valid duration looks like, for error messages.
pub(crate) const DURATION_HINT: &str =
    "a duration with a unit, such as `250ms`, `30s`, `5m`, `1h` or `1m 30s`";

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        humantime::parse_duration(text.trim())
            .map(HumanDuration)
            .map_err(|e| {
                format!("`{text}` is not a valid duration ({e}); expected {DURATION_HINT}")
            })
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(DURATION_HINT)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanDuration, E> {
                Err(E::custom(format_args!(
                    "`{v}` has no unit; expected {DURATION_HINT} (for example `{v}s`)"
                )))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                Err(E::custom(format_args!(
                    "`{v}` is not a duration; expected {DURATION_HINT}"
                )))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<HumanDuration, E> {
                Err(E::custom(format_args!(
                    "`{v}` has no unit; expected {DURATION_HINT}"
                )))
            }
        }
        // `any`, not `str`: a duration in a connector's flattened
        // connection part (`keep_alive`, `statement_timeout`) is read from
        // serde's buffered values, which give a number to `visit_u64`
        // only when asked for any type, so `keep_alive: 5` says it has no
        // unit there too.
        d.deserialize_any(V)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl JsonSchema for HumanDuration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A duration with a unit: `250ms`, `30s`, `5m`, `1h`, `1m 30s`.",
            "pattern": r"^\s*([0-9]+\s*(ns|us|µs|ms|s|sec|secs|second|seconds|m|min|mins|minute|minutes|h|hr|hrs|hour|hours|d|day|days|w|week|weeks)\s*)+$",
            "examples": ["30s", "250ms", "1m 30s"]
        })
    }
}

/// A size in bytes: a plain number of bytes, or a number with a unit
/// (`64MiB`, `512KiB`, `1GiB`, `100MB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanSize(pub u64);

/// What a valid size looks like, for error messages.
pub(crate) const SIZE_HINT: &str = "a size such as `64MiB`, `512KiB`, `1GiB` or a number of bytes";

impl HumanSize {
    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        HumanSize(n << 20)
    }

    /// The number of bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for HumanSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        text.trim()
            .parse::<bytesize::ByteSize>()
            .map(|size| HumanSize(size.as_u64()))
            .map_err(|e| format!("`{text}` is not a valid size ({e}); expected {SIZE_HINT}"))
    }
}

impl fmt::Display for HumanSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u32); 4] = [("GiB", 30), ("MiB", 20), ("KiB", 10), ("B", 0)];
        for (unit, shift) in UNITS {
            if self.0 >= 1 << shift && self.0.is_multiple_of(1 << shift) {
                return write!(f, "{}{unit}", self.0 >> shift);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for HumanSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(SIZE_HINT)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanSize, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanSize, E> {
                Ok(HumanSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanSize, E> {
                Err(E::custom(format_args!(
                    "`{v}` is not a valid size; expected {SIZE_HINT}"
                )))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<HumanSize, E> {
                Err(E::custom(format_args!(
                    "`{v}` is not a valid size; expected {SIZE_HINT}"
                )))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for HumanSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl JsonSchema for HumanSize {
    fn schema_name() -> Cow<'static, str> {
        "Size".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A size: a number of bytes, or a number with a unit (`64MiB`, `512KiB`, `1GiB`, `100MB`).",
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": r"^\s*[0-9.]+\s*([KMGTPE]i?B?|[kKmMgGtTpPeE]i?[bB]|B|b)?\s*$"}
            ],
            "examples": ["64MiB", "512KiB"]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_print_as_written() {
        assert_eq!("250ms".parse(), Ok(HumanDuration::millis(250)));
        assert_eq!("30s".parse(), Ok(HumanDuration::secs(30)));
        assert_eq!("1m".parse(), Ok(HumanDuration::secs(60)));
        assert_eq!("1m 30s".parse(), Ok(HumanDuration::secs(90)));
        assert_eq!(HumanDuration::secs(90).to_string(), "1m 30s");
        let err = "30".parse::<HumanDuration>().expect_err("an error");
        assert!(err.contains("`30s`"), "{err}");
        assert!("fast".parse::<HumanDuration>().is_err());
        assert!("-1s".parse::<HumanDuration>().is_err());
    }

    #[test]
    fn sizes_parse_and_print_as_written() {
        assert_eq!("64MiB".parse(), Ok(HumanSize::mib(64)));
        assert_eq!("512KiB".parse(), Ok(HumanSize(512 << 10)));
        assert_eq!("1000".parse(), Ok(HumanSize(1000)));
        assert_eq!(HumanSize::mib(256).to_string(), "256MiB");
        assert_eq!(HumanSize(1000).to_string(), "1000B");
        let err = "lots".parse::<HumanSize>().expect_err("an error");
        assert!(err.contains("64MiB"), "{err}");
    }
}
