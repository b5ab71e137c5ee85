//! Helpers on [`Message`] and [`Emit`], so handlers read and build messages
//! without touching the raw record fields more than they want to.

use std::time::Duration;

use crate::{Emit, HandlerError, Header, Message};

/// The header that asks the broker to hold an output for a while before it
/// delivers it: a duration (`90000ms`, `90s`, `1h 30m`) or a bare number of
/// seconds. A header rather than a field, so the WIT contract stays as it is;
/// the broker removes it on publish, so it never reaches a handler.
pub const DELAY_HEADER: &str = "sluice-delay";

/// The header that asks the broker to hold an output until an RFC 3339 time
/// (`2026-11-27T09:00:00Z`); removed on publish, as [`DELAY_HEADER`] is.
pub const DELIVER_AT_HEADER: &str = "sluice-deliver-at";

/// Whether `name` is one of the delay headers; the runtime matches them in
/// any case, so the SDK does too.
fn is_delay_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(DELAY_HEADER) || name.eq_ignore_ascii_case(DELIVER_AT_HEADER)
}

impl Message {
    /// Returns the value of the first header named `name` (case-sensitive),
    /// because most handlers only care about one value per header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Returns the payload as text, or a `reject` if it is not UTF-8: a
    /// payload that cannot be decoded will not decode on a retry either.
    pub fn text(&self) -> Result<&str, HandlerError> {
        std::str::from_utf8(&self.payload)
            .map_err(|e| HandlerError::reject(format_args!("payload is not UTF-8 text: {e}")))
    }

    /// Parses the payload as JSON into `T`, or returns a `reject` whose reason
    /// names the parse error (bad JSON never becomes good on a retry).
    ///
    /// ```ignore
    /// let order: serde_json::Value = msg.json()?;
    /// ```
    #[cfg(feature = "json")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, HandlerError> {
        serde_json::from_slice(&self.payload).map_err(|e| {
            if e.is_data() {
                HandlerError::reject(format_args!(
                    "payload JSON does not have the expected shape: {e}"
                ))
            } else {
                HandlerError::reject(format_args!("payload is not JSON: {e}"))
            }
        })
    }
}

impl Emit {
    /// An output message to `topic` with `payload`, no key and no headers.
    /// The topic must be declared under the stage's `publish:`; "" means the
    /// stage's default output.
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            topic: topic.into(),
            key: None,
            headers: Vec::new(),
            payload: payload.into(),
        }
    }

    /// An output message to the stage's default output (its first `publish:`
    /// topic), the common case for one-in one-out handlers.
    pub fn to_default(payload: impl Into<Vec<u8>>) -> Self {
        Self::new(String::new(), payload)
    }

    /// An output message to `topic` whose payload is `value` serialised as
    /// JSON; a value that cannot be serialised is a `reject`.
    #[cfg(feature = "json")]
    pub fn json<T: serde::Serialize + ?Sized>(
        topic: impl Into<String>,
        value: &T,
    ) -> Result<Self, HandlerError> {
        let payload = serde_json::to_vec(value).map_err(|e| {
            HandlerError::reject(format_args!("cannot serialise output as JSON: {e}"))
        })?;
        Ok(Self::new(topic, payload))
    }

    /// Sets (or, with `None`, clears) the output key, which orders messages
    /// downstream. Pass `msg.key.clone()` to keep the input's key.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<Option<String>>) -> Self {
        self.key = key.into();
        self
    }

    /// Appends one header; names may repeat.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Appends several headers in order; pass `msg.headers.clone()` to keep
    /// the input's headers.
    #[must_use]
    pub fn with_headers<K, V>(mut self, headers: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        self.headers.extend(
            headers
                .into_iter()
                .map(|(k, v)| -> Header { (k.into(), v.into()) }),
        );
        self
    }

    /// Asks the broker to deliver this output `delay` after it is published
    /// (in whole milliseconds), for reminders and timeouts that should not
    /// hold the handler. Replaces any delay header the emit already has, in
    /// any case, since headers copied from the input may carry one. The
    /// runtime refuses a delay over 365 days; zero means now.
    ///
    /// ```ignore
    /// Emit::to_default("reminder").with_delay(Duration::from_secs(90))
    /// ```
    #[must_use]
    pub fn with_delay(self, delay: Duration) -> Self {
        self.with_delay_header(DELAY_HEADER, format!("{}ms", delay.as_millis()))
    }

    /// Asks the broker to deliver this output at `at`, an RFC 3339 time
    /// (`2026-11-27T09:00:00Z`; fractional seconds and offsets allowed). It
    /// is a string so the SDK needs no date library: the runtime checks it
    /// and refuses one that does not parse or is over 365 days away; a time
    /// already past means now. Replaces any delay header, as
    /// [`Emit::with_delay`] does.
    ///
    /// ```ignore
    /// Emit::to_default("open").with_deliver_at("2026-11-27T09:00:00Z")
    /// ```
    #[must_use]
    pub fn with_deliver_at(self, at: impl Into<String>) -> Self {
        self.with_delay_header(DELIVER_AT_HEADER, at.into())
    }

    /// Sets the one delay header, so the last `with_delay`/`with_deliver_at`
    /// wins instead of the runtime choosing the later of two.
    fn with_delay_header(mut self, name: &str, value: String) -> Self {
        self.headers.retain(|(k, _)| !is_delay_header(k));
        self.headers.push((name.to_owned(), value));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &[u8]) -> Message {
        Message {
            id: "m1".into(),
            topic: "in".into(),
            key: Some("k".into()),
            headers: vec![
                ("tenant".into(), "a".into()),
                ("tenant".into(), "b".into()),
                ("Trace".into(), "t".into()),
            ],
            payload: payload.to_vec(),
            attempt: 1,
            published_at: 0,
        }
    }

    #[test]
    fn header_is_the_first_value_by_exact_name() {
        let m = message(b"");
        assert_eq!(m.header("tenant"), Some("a"));
        assert_eq!(m.header("Trace"), Some("t"));
        assert_eq!(m.header("trace"), None, "names are case-sensitive");
        assert_eq!(m.header("absent"), None);
    }

    #[test]
    fn text_rejects_a_payload_that_is_not_utf8() {
        assert_eq!(message(b"caf\xc3\xa9").text(), Ok("café"));
        let err = message(b"\xff\xfe").text().expect_err("not UTF-8");
        match err {
            HandlerError::Reject(reason) => {
                assert!(reason.starts_with("payload is not UTF-8 text"), "{reason}");
            }
            other => panic!("expected a reject, got {other:?}"),
        }
    }

    #[cfg(feature = "json")]
    #[test]
    fn json_rejects_bad_json_and_the_wrong_shape_differently() {
        type Order = std::collections::BTreeMap<String, u32>;
        assert_eq!(
            message(br#"{"qty": 3}"#).json::<Order>(),
            Ok(Order::from([("qty".to_owned(), 3)]))
        );
        let reason = |payload: &[u8]| match message(payload).json::<Order>() {
            Err(HandlerError::Reject(reason)) => reason,
            other => panic!("expected a reject, got {other:?}"),
        };
        assert!(reason(b"{not json").starts_with("payload is not JSON"));
        assert!(
            reason(br#"{"qty": "three"}"#)
                .starts_with("payload JSON does not have the expected shape")
        );
    }

    #[test]
    fn emit_builders_set_what_they_say_and_keep_header_order() {
        let m = message(b"x");
        let emit = Emit::to_default("out")
            .with_key(m.key.clone())
            .with_headers(m.headers.clone())
            .with_header("tenant", "c");
        assert_eq!(emit.topic, "", "the default output is the empty topic");
        assert_eq!(emit.payload, b"out");
        assert_eq!(emit.key.as_deref(), Some("k"));
        let names: Vec<(&str, &str)> = emit
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("tenant", "a"),
                ("tenant", "b"),
                ("Trace", "t"),
                ("tenant", "c")
            ]
        );
        assert_eq!(Emit::new("t", "p").with_key(None).key, None);
    }

    #[test]
    fn a_delay_replaces_copied_delay_headers_in_any_case() {
        fn pairs(emit: &Emit) -> Vec<(&str, &str)> {
            emit.headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect()
        }
        let emit = Emit::to_default("x")
            .with_headers([
                ("Sluice-Delay", "5s"),
                ("tenant", "a"),
                ("SLUICE-DELIVER-AT", "2020-01-01T00:00:00Z"),
            ])
            .with_delay(Duration::from_millis(90_500));
        assert_eq!(pairs(&emit), [("tenant", "a"), ("sluice-delay", "90500ms")]);
        let emit = emit.with_deliver_at("2026-11-27T09:00:00Z");
        assert_eq!(
            pairs(&emit),
            [
                ("tenant", "a"),
                ("sluice-deliver-at", "2026-11-27T09:00:00Z")
            ],
            "the last delay asked for wins"
        );
        let emit = Emit::to_default("x").with_delay(Duration::from_micros(1_999));
        assert_eq!(
            pairs(&emit),
            [("sluice-delay", "1ms")],
            "whole milliseconds"
        );
    }

    #[cfg(feature = "json")]
    #[test]
    fn emit_json_serialises_the_value() {
        let emit = Emit::json("t", &serde_json::json!({"a": [1, 2]})).expect("serialises");
        assert_eq!(emit.topic, "t");
        assert_eq!(emit.payload, br#"{"a":[1,2]}"#);
    }
}
