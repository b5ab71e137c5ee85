//! Which DLQ entries a list, redrive or purge takes: `--kind`, `--since`,
//! `--until`, `--error`, `--header` and `--key`, as the CLI, the JSON
//! bodies and the list's query string spell them.
//!
//! A [`DlqFilter`] is the text a client sent; [`DlqFilter::resolve`] checks
//! it once (unknown kinds, bad times, `since` after `until`) and fixes
//! relative times against one clock reading, so every page of a scan is
//! judged by the same [`Matcher`].

use serde::{Deserialize, Deserializer, Serialize};

use crate::FailureKind;
use crate::broker::Message;
use crate::dlq;
use crate::timestamp::parse_past_point;

/// The entries to take; every field that is set must match. The default
/// takes every entry.
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    utoipa::IntoParams,
)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DlqFilter {
    /// Failure kinds (`timeout`, `unavailable`, ...): any of them.
    #[schema(schema_with = kinds_schema)]
    #[param(schema_with = kinds_schema)]
    #[serde(
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub kind: Vec<String>,
    /// Dead-lettered at or after: RFC 3339, or a duration back from now
    /// (`1h`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Dead-lettered at or before, in the same forms as `since`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// Text the error contains (case-sensitive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `name=value`: the entry has that header with that value. All of
    /// them must match.
    #[schema(schema_with = headers_schema)]
    #[param(schema_with = headers_schema)]
    #[serde(
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub header: Vec<String>,
    /// The message key, exactly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Only these entries, by their sequence in the DLQ topic (what a
    /// list shows as `seq`): a selection picked by hand, as the console's
    /// "redrive selected" sends it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub seq: Vec<u64>,
}

/// A [`DlqFilter`] checked and fixed in time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matcher {
    kinds: Vec<String>,
    since: Option<u64>,
    until: Option<u64>,
    error: Option<String>,
    headers: Vec<(String, String)>,
    key: Option<String>,
    /// Sorted, for a binary search.
    seqs: Vec<u64>,
}

impl DlqFilter {
    /// Whether it takes every entry.
    pub fn is_empty(&self) -> bool {
        *self == DlqFilter::default()
    }

    /// Checks the filter and fixes durations back from `now_millis`.
    ///
    /// # Errors
    ///
    /// A kind that no failure has, a time in neither form, `since` after
    /// `until`, or a header without `=`; the message says which.
    pub fn resolve(&self, now_millis: u64) -> Result<Matcher, String> {
        let mut kinds = Vec::new();
        for kind in &self.kind {
            for kind in kind.split(',').map(str::trim).filter(|k| !k.is_empty()) {
                if !FailureKind::ALL.iter().any(|k| k.as_str() == kind) {
                    let known: Vec<&str> = FailureKind::ALL.iter().map(|k| k.as_str()).collect();
                    return Err(format!(
                        "unknown failure kind `{kind}`; the kinds are {}",
                        known.join(", ")
                    ));
                }
                kinds.push(kind.to_owned());
            }
        }
        let point = |name: &str, text: &Option<String>| {
            text.as_deref()
                .map(|t| parse_past_point(t, now_millis).map_err(|e| format!("{name}: {e}")))
                .transpose()
        };
        let since = point("since", &self.since)?;
        let until = point("until", &self.until)?;
        if let (Some(since), Some(until)) = (since, until)
            && since > until
        {
            return Err("since is later than until: no entry can match".into());
        }
        let headers = self
            .header
            .iter()
            .map(|pair| match pair.split_once('=') {
                Some((name, value)) if !name.trim().is_empty() => {
                    Ok((name.trim().to_owned(), value.to_owned()))
                }
                _ => Err(format!(
                    "header filter `{pair}` is not name=value (for example tenant=acme)"
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Matcher {
            kinds,
            since,
            until,
            error: self.error.clone().filter(|e| !e.is_empty()),
            headers,
            key: self.key.clone(),
            seqs: {
                let mut seqs = self.seq.clone();
                seqs.sort_unstable();
                seqs.dedup();
                seqs
            },
        })
    }
}

impl Matcher {
    /// Whether the DLQ entry at `seq` passes. The time is the last
    /// failure's (when the entry was dead-lettered), or for an entry
    /// without provenance the time it was published; an entry without a
    /// kind or an error fails a filter on them.
    pub fn matches(&self, seq: u64, entry: &Message) -> bool {
        if !self.seqs.is_empty() && self.seqs.binary_search(&seq).is_err() {
            return false;
        }
        if !self.kinds.is_empty()
            && !entry
                .header(dlq::KIND)
                .is_some_and(|kind| self.kinds.iter().any(|k| k == kind))
        {
            return false;
        }
        if self.since.is_some() || self.until.is_some() {
            let at = entry
                .header(dlq::LAST_FAILURE)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(entry.published_at);
            if self.since.is_some_and(|since| at < since)
                || self.until.is_some_and(|until| at > until)
            {
                return false;
            }
        }
        if let Some(error) = &self.error
            && !entry
                .header(dlq::ERROR)
                .is_some_and(|text| text.contains(error.as_str()))
        {
            return false;
        }
        if let Some(key) = &self.key
            && entry.key.as_deref() != Some(key.as_str())
        {
            return false;
        }
        self.headers
            .iter()
            .all(|(name, value)| entry.headers.iter().any(|(n, v)| n == name && v == value))
    }
}

/// A `kind` filter's text: failure kinds, comma-separated (blank pieces
/// are skipped, as [`DlqFilter::resolve`] does).
fn kind_pattern() -> String {
    let names: Vec<&str> = FailureKind::ALL.iter().map(|k| k.as_str()).collect();
    let one = format!("\\s*({})?\\s*", names.join("|"));
    format!("^{one}(,{one})*$")
}

/// A `header` filter's text: `name=value`, the name not blank.
const HEADER_PATTERN: &str = "^[^=]*[^=\\s][^=]*=";

/// The schema of a field [`one_or_many`] reads: one string matching
/// `pattern`, or a list of them.
fn one_or_many_schema(pattern: String) -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    let one = ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
        .build();
    Schema::OneOf(
        OneOfBuilder::new()
            .item(one.clone())
            .item(ArrayBuilder::new().items(one).build())
            .build(),
    )
}

fn kinds_schema() -> utoipa::openapi::schema::Schema {
    one_or_many_schema(kind_pattern())
}

fn headers_schema() -> utoipa::openapi::schema::Schema {
    one_or_many_schema(HEADER_PATTERN.to_owned())
}

/// A list, or one string for a list of one (`"kind": "timeout"`).
fn one_or_many<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dlq::Provenance;

    const NOW: u64 = 1_795_685_400_000;

    fn entry(kind: &str, error: &str, last_failure: u64) -> Message {
        let mut m = Message::new("m1", "shop.route.dlq", "body");
        m.key = Some("k1".into());
        m.headers.push(("tenant".into(), "acme".into()));
        Provenance {
            pipeline: "shop".into(),
            stage: "route".into(),
            source_topic: "orders".into(),
            source_seq: 1,
            original_id: "m1".into(),
            attempts: 3,
            kind: kind.into(),
            error: error.into(),
            first_failure: last_failure - 1000,
            last_failure,
        }
        .stamp(&mut m);
        m
    }

    fn filter(json: &str) -> Matcher {
        serde_json::from_str::<DlqFilter>(json)
            .expect("valid JSON")
            .resolve(NOW)
            .expect("valid filter")
    }

    #[test]
    fn an_empty_filter_takes_everything() {
        assert!(DlqFilter::default().is_empty());
        let all = filter("{}");
        assert!(all.matches(1, &entry("timeout", "slow", NOW)));
        assert!(all.matches(1, &Message::new("orphan", "t", "no provenance")));
    }

    #[test]
    fn each_field_narrows() {
        let timeout_now = entry("timeout", "deadline of 5s passed", NOW - 1000);
        let rejected_old = entry("rejected", "bad order", NOW - 7_200_000);
        let kinds = filter(r#"{"kind": "timeout"}"#);
        assert!(kinds.matches(1, &timeout_now) && !kinds.matches(1, &rejected_old));
        let either = filter(r#"{"kind": ["timeout", "rejected"]}"#);
        assert!(either.matches(1, &timeout_now) && either.matches(1, &rejected_old));
        let comma = filter(r#"{"kind": "timeout,rejected"}"#);
        assert!(comma.matches(1, &rejected_old));
        let recent = filter(r#"{"since": "1h"}"#);
        assert!(recent.matches(1, &timeout_now) && !recent.matches(1, &rejected_old));
        let older = filter(r#"{"until": "1h"}"#);
        assert!(!older.matches(1, &timeout_now) && older.matches(1, &rejected_old));
        let at = filter(r#"{"since": "2026-11-26T07:30:00Z", "until": "2026-11-26T07:30:00Z"}"#);
        assert!(at.matches(1, &rejected_old), "both bounds are inclusive");
        let error = filter(r#"{"error": "deadline"}"#);
        assert!(error.matches(1, &timeout_now) && !error.matches(1, &rejected_old));
        assert!(filter(r#"{"key": "k1"}"#).matches(1, &timeout_now));
        assert!(!filter(r#"{"key": "k2"}"#).matches(1, &timeout_now));
        assert!(filter(r#"{"header": "tenant=acme"}"#).matches(1, &timeout_now));
        assert!(!filter(r#"{"header": ["tenant=acme", "tier=paid"]}"#).matches(1, &timeout_now));
        let picked = filter(r#"{"seq": [4, 2]}"#);
        assert!(picked.matches(2, &timeout_now) && picked.matches(4, &timeout_now));
        assert!(!picked.matches(3, &timeout_now));
        let orphan = Message::new("orphan", "t", "no provenance");
        assert!(!kinds.matches(1, &orphan), "no kind never matches a kind");
    }

    #[test]
    fn bad_filters_say_what_is_wrong() {
        let err = |json: &str| {
            serde_json::from_str::<DlqFilter>(json)
                .map_err(|e| e.to_string())
                .and_then(|f| f.resolve(NOW))
                .expect_err(json)
        };
        assert!(err(r#"{"kind": "timout"}"#).contains("unknown failure kind `timout`"));
        assert!(err(r#"{"since": "yesterday"}"#).starts_with("since: "));
        assert!(err(r#"{"since": "1h", "until": "2h"}"#).contains("later than until"));
        assert!(err(r#"{"header": "tenant"}"#).contains("name=value"));
        assert!(err(r#"{"kinds": ["timeout"]}"#).contains("unknown field"));
    }
}
