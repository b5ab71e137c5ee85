//! Delayed delivery: a message that carries `sluice-delay` or
//! `sluice-deliver-at` is stored by the broker and published to its topic
//! when it is due.
//!
//! Every producer speaks the same two headers (names match in any case):
//!
//! - `sluice-delay`: how long from the publish, a duration (`90s`, `2h`,
//!   `1h 30m`, `1500ms`, `3d`) or a bare number of seconds;
//! - `sluice-deliver-at`: when, in RFC 3339 (`2026-11-27T09:00:00Z`).
//!
//! The ingest API takes them as HTTP headers, `sluice publish` as
//! `--delay`/`--at`, the SDKs set them on an emit, and a source can map
//! an upstream field onto them. The broker resolves them to a due time
//! once, on publish ([`take_due`]), and stores the message without them,
//! so a handler that copies its input's headers does not delay its
//! outputs again.
//!
//! It reads and writes header lists only, never a broker's message: the
//! brokers call it, so it names no broker (issue 44).

use std::time::Duration;

use crate::timestamp::{format_rfc3339_millis, parse_rfc3339_millis};

/// The relative delay header.
pub const DELAY_HEADER: &str = "sluice-delay";
/// The absolute due-time header.
pub const DELIVER_AT_HEADER: &str = "sluice-deliver-at";

/// The longest delay accepted: a year (with the other limits on time, so
/// a pipeline file's retry waits are held to it too).
pub use crate::config::{DelayFormat, DelayFrom};
pub use crate::timestamp::MAX_DELAY;

/// Whether `name` is one of the delay headers.
pub fn is_delay_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(DELAY_HEADER) || name.eq_ignore_ascii_case(DELIVER_AT_HEADER)
}

/// Parses a `sluice-delay` value: a duration, or a bare number of seconds.
///
/// # Errors
///
/// What is wrong with it, naming the accepted forms.
pub fn parse_delay(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let delay = if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
        trimmed
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| format!("delay `{text}` is too large"))?
    } else {
        humantime::parse_duration(trimmed).map_err(|e| {
            format!("delay `{text}` is not a duration like 90s, 2h or 1h 30m, nor a number of seconds ({e})")
        })?
    };
    if delay > MAX_DELAY {
        return Err(format!(
            "delay `{text}` is longer than the limit of 365 days"
        ));
    }
    Ok(delay)
}

/// The due time (ms since the epoch) a message's delay headers ask for,
/// without changing them: `None` when it has none, or when the time is
/// not after `now_ms` (due at once). With both headers, the later time
/// wins.
///
/// # Errors
///
/// A header that does not parse, or a time more than [`MAX_DELAY`] away.
pub fn due_in(headers: &[(String, String)], now_ms: u64) -> Result<Option<u64>, String> {
    let mut due: Option<u64> = None;
    for (name, value) in headers {
        let at = if name.eq_ignore_ascii_case(DELAY_HEADER) {
            let delay = parse_delay(value)?;
            now_ms.saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
        } else if name.eq_ignore_ascii_case(DELIVER_AT_HEADER) {
            let at =
                parse_rfc3339_millis(value).map_err(|e| format!("{DELIVER_AT_HEADER}: {e}"))?;
            let limit =
                now_ms.saturating_add(u64::try_from(MAX_DELAY.as_millis()).unwrap_or(u64::MAX));
            if at > limit {
                return Err(format!(
                    "{DELIVER_AT_HEADER} `{value}` is more than 365 days away"
                ));
            }
            at
        } else {
            continue;
        };
        due = Some(due.map_or(at, |d| d.max(at)));
    }
    Ok(due.filter(|&at| at > now_ms))
}

/// Resolves and removes a message's delay headers: its due time, or
/// `None` when it is due now. The headers are left without them either
/// way.
///
/// # Errors
///
/// As [`due_in`]; the headers are unchanged then.
pub fn take_due(headers: &mut Vec<(String, String)>, now_ms: u64) -> Result<Option<u64>, String> {
    let due = due_in(headers, now_ms)?;
    headers.retain(|(name, _)| !is_delay_header(name));
    Ok(due)
}

/// Pins a message's delay to an absolute time: its delay headers are
/// replaced by one `sluice-deliver-at` (or removed when it is due now).
/// Ingest does this so the receipt it answers names the exact due time.
///
/// # Errors
///
/// As [`due_in`]; the headers are unchanged then.
pub fn pin(headers: &mut Vec<(String, String)>, now_ms: u64) -> Result<Option<u64>, String> {
    let due = take_due(headers, now_ms)?;
    if let Some(due) = due {
        headers.push((DELIVER_AT_HEADER.to_owned(), format_rfc3339_millis(due)));
    }
    Ok(due)
}

impl DelayFrom {
    /// Adds the delay header the mapped header asks for (the upstream
    /// header itself stays).
    ///
    /// # Errors
    ///
    /// The value does not read as the format says; the caller
    /// dead-letters the message with this reason.
    pub fn apply(&self, headers: &mut Vec<(String, String)>) -> Result<(), String> {
        let Some(value) = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(&self.header))
            .map(|(_, value)| value.trim().to_owned())
        else {
            return Ok(());
        };
        let unix = |scale: u64| {
            value
                .parse::<u64>()
                .map(|n| n.saturating_mul(scale))
                .map_err(|_| {
                    format!(
                        "header `{}` is `{value}`, not a Unix time in {}",
                        self.header,
                        if scale == 1 {
                            "milliseconds"
                        } else {
                            "seconds"
                        }
                    )
                })
        };
        let (name, value) = match self.format {
            DelayFormat::Delay => (DELAY_HEADER, value),
            DelayFormat::DeliverAt => (DELIVER_AT_HEADER, value),
            DelayFormat::UnixSeconds => (DELIVER_AT_HEADER, format_rfc3339_millis(unix(1000)?)),
            DelayFormat::UnixMillis => (DELIVER_AT_HEADER, format_rfc3339_millis(unix(1)?)),
        };
        headers.push((name.to_owned(), value));
        Ok(())
    }
}

/// `due_ms` for people: RFC 3339, to the millisecond.
pub fn describe(due_ms: u64) -> String {
    format_rfc3339_millis(due_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(headers: &[(&str, &str)]) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    const NOW: u64 = 1_795_685_400_000;

    #[test]
    fn delays_read_durations_and_bare_seconds() {
        assert_eq!(parse_delay("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_delay(" 90s "), Ok(Duration::from_secs(90)));
        assert_eq!(parse_delay("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_delay("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_delay("3d"), Ok(Duration::from_secs(3 * 86_400)));
        assert!(parse_delay("soon").is_err());
        assert!(parse_delay("-5s").is_err());
        assert!(parse_delay("").is_err());
        assert!(
            parse_delay("366d")
                .expect_err("over the limit")
                .contains("365 days")
        );
        assert!(parse_delay("99999999999999999999999").is_err());
    }

    #[test]
    fn the_due_time_comes_from_either_header_in_any_case_and_the_later_wins() {
        assert_eq!(due_in(&with(&[]), NOW), Ok(None));
        assert_eq!(
            due_in(&with(&[("Sluice-Delay", "2s")]), NOW),
            Ok(Some(NOW + 2000))
        );
        assert_eq!(
            due_in(&with(&[("SLUICE-DELIVER-AT", "2026-11-26T09:31:00Z")]), NOW),
            Ok(Some(NOW + 60_000))
        );
        assert_eq!(
            due_in(
                &with(&[
                    ("sluice-delay", "2s"),
                    ("sluice-deliver-at", "2026-11-26T09:31:00Z")
                ]),
                NOW
            ),
            Ok(Some(NOW + 60_000))
        );
        // A time already past, or no delay at all, is due now.
        assert_eq!(
            due_in(&with(&[("sluice-deliver-at", "2020-01-01T00:00:00Z")]), NOW),
            Ok(None)
        );
        assert_eq!(due_in(&with(&[("sluice-delay", "0s")]), NOW), Ok(None));
        assert!(due_in(&with(&[("sluice-deliver-at", "tomorrow")]), NOW).is_err());
        assert!(due_in(&with(&[("sluice-deliver-at", "2099-01-01T00:00:00Z")]), NOW).is_err());
    }

    #[test]
    fn taking_the_due_time_strips_the_headers_and_keeps_the_rest_in_order() {
        let mut m = with(&[
            ("a", "1"),
            ("Sluice-Delay", "5s"),
            ("b", "2"),
            ("sluice-deliver-at", "2020-01-01T00:00:00Z"),
        ]);
        assert_eq!(take_due(&mut m, NOW), Ok(Some(NOW + 5000)));
        assert_eq!(m, vec![("a".into(), "1".into()), ("b".into(), "2".into())]);
        let mut bad = with(&[("sluice-delay", "later")]);
        assert!(take_due(&mut bad, NOW).is_err());
        assert_eq!(bad.len(), 1, "a refused message is unchanged");
    }

    #[test]
    fn a_source_mapping_reads_each_format_and_leaves_unmapped_messages_alone() {
        let map = |format, value: &str| {
            let from = DelayFrom {
                header: "Run-At".into(),
                format,
            };
            let mut headers = vec![("run-at".to_owned(), value.to_owned())];
            from.apply(&mut headers).map(|()| due_in(&headers, NOW))
        };
        assert_eq!(map(DelayFormat::Delay, "90"), Ok(Ok(Some(NOW + 90_000))));
        assert_eq!(
            map(DelayFormat::DeliverAt, "2026-11-26T09:31:00Z"),
            Ok(Ok(Some(NOW + 60_000)))
        );
        assert_eq!(
            map(
                DelayFormat::UnixSeconds,
                &((NOW + 5_000) / 1000).to_string()
            ),
            Ok(Ok(Some(NOW + 5_000)))
        );
        assert_eq!(
            map(DelayFormat::UnixMillis, &(NOW + 1_234).to_string()),
            Ok(Ok(Some(NOW + 1_234)))
        );
        assert!(map(DelayFormat::UnixSeconds, "soon").is_err());
        assert!(map(DelayFormat::Delay, "soon").expect("mapped").is_err());
        let mut none = vec![("other".to_owned(), "1".to_owned())];
        let from = DelayFrom {
            header: "run-at".into(),
            format: DelayFormat::Delay,
        };
        assert_eq!(from.apply(&mut none), Ok(()));
        assert_eq!(none.len(), 1);
    }

    #[test]
    fn pinning_turns_a_relative_delay_into_the_same_absolute_time() {
        let mut m = with(&[("a", "1"), ("Sluice-Delay", "1500ms")]);
        assert_eq!(pin(&mut m, NOW), Ok(Some(NOW + 1500)));
        assert_eq!(m.len(), 2);
        assert_eq!(due_in(&m, NOW), Ok(Some(NOW + 1500)));
        let mut now = with(&[("sluice-delay", "0s")]);
        assert_eq!(pin(&mut now, NOW), Ok(None));
        assert!(now.is_empty());
    }
}
