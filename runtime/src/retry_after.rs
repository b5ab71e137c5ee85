//! `Retry-After`: how long an HTTP server asks a client to wait, read the
//! same way by the webhook sink and by a handler's outbound calls (a leaf,
//! so neither needs the other for it).

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

/// The wait a `Retry-After` asks for: delta seconds, or an HTTP date
/// (a date in the past is no wait). `None` when absent or unreadable.
pub fn wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut headers = HeaderMap::new();
        assert_eq!(wait(&headers, now), None);
        headers.insert("retry-after", HeaderValue::from_static(" 2 "));
        assert_eq!(wait(&headers, now), Some(Duration::from_secs(2)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        headers.insert("retry-after", HeaderValue::from_str(&later).expect("date"));
        assert_eq!(wait(&headers, now), Some(Duration::from_secs(90)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        headers.insert(
            "retry-after",
            HeaderValue::from_str(&earlier).expect("date"),
        );
        assert_eq!(wait(&headers, now), Some(Duration::ZERO));
        headers.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(wait(&headers, now), None);
    }
}
