//! Points in time as people write them: RFC 3339 (`2026-11-26T09:30:00Z`,
//! `2026-11-26T10:30:00+01:00`) or, where a point in the past is meant, a
//! duration back from now (`90s`, `1h`, `2days`). Times inside Sluice are
//! milliseconds since the Unix epoch; this module is where text meets them,
//! and says how far ahead one may be ([`MAX_DELAY`]).

use std::time::Duration;

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The furthest ahead a time may be: a year. A delay (`sluice-delay`,
/// `sluice-deliver-at`, a retry's backoff or schedule) longer than this is
/// almost always a unit mistake (a timestamp in ms read as seconds), and is
/// refused rather than parked for decades.
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses an RFC 3339 time into milliseconds since the Unix epoch.
///
/// # Errors
///
/// The text is not RFC 3339, or the time is before 1970.
pub fn parse_rfc3339_millis(text: &str) -> Result<u64, String> {
    let at = OffsetDateTime::parse(text.trim(), &Rfc3339)
        .map_err(|e| format!("`{text}` is not an RFC 3339 time like 2026-11-26T09:30:00Z ({e})"))?;
    let millis = at.unix_timestamp_nanos() / 1_000_000;
    u64::try_from(millis).map_err(|_| format!("`{text}` is before 1970"))
}

/// Formats milliseconds since the Unix epoch as RFC 3339 in UTC, to the
/// millisecond.
pub fn format_rfc3339_millis(millis: u64) -> String {
    let nanos = i128::from(millis) * 1_000_000;
    OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|at| at.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("{millis} ms after the epoch"))
}

/// A point in the past: RFC 3339, or a duration back from `now_millis`
/// (`1h` means an hour ago).
///
/// # Errors
///
/// The text is neither, saying what was expected.
pub fn parse_past_point(text: &str, now_millis: u64) -> Result<u64, String> {
    let trimmed = text.trim();
    if trimmed.starts_with(|c: char| c.is_ascii_digit()) && !trimmed.contains(['-', ':']) {
        let ago = humantime::parse_duration(trimmed).map_err(|e| {
            format!("`{text}` is neither an RFC 3339 time nor a duration like 90s or 1h ({e})")
        })?;
        let ago = u64::try_from(ago.as_millis()).unwrap_or(u64::MAX);
        return Ok(now_millis.saturating_sub(ago));
    }
    parse_rfc3339_millis(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_takes_offsets() {
        let utc = parse_rfc3339_millis("2026-11-26T09:30:00.250Z").expect("valid");
        assert_eq!(utc, 1_795_685_400_250);
        assert_eq!(format_rfc3339_millis(utc), "2026-11-26T09:30:00.25Z");
        let offset = parse_rfc3339_millis("2026-11-26T10:30:00.250+01:00").expect("valid");
        assert_eq!(offset, utc);
        assert!(parse_rfc3339_millis("1969-12-31T23:59:59Z").is_err());
        let err = parse_rfc3339_millis("yesterday").expect_err("not a time");
        assert!(err.contains("RFC 3339"), "{err}");
    }

    #[test]
    fn past_points_take_durations_back_from_now() {
        let now = 1_795_685_400_000;
        assert_eq!(parse_past_point("90s", now), Ok(now - 90_000));
        assert_eq!(parse_past_point("1h", now), Ok(now - 3_600_000));
        assert_eq!(
            parse_past_point("2026-11-26T09:00:00Z", now),
            Ok(now - 1_800_000)
        );
        assert_eq!(parse_past_point("100000000000d", now), Ok(0));
        for bad in ["", "soon", "5 parsecs", "2026-13-01T00:00:00Z"] {
            assert!(parse_past_point(bad, now).is_err(), "{bad}");
        }
    }
}
