//! A Sluice [`Message`] as a plain NATS message: the payload is the body and
//! the metadata travels in headers, so any NATS client can produce and read.
//!
//! | field | header |
//! |---|---|
//! | `id` | `Nats-Msg-Id` (the stream's duplicate-window key) |
//! | `key` | `Sluice-Key` |
//! | `published_at` | `Sluice-Published-At` (ms since the epoch), only when it carries an earlier time on (a redrive); otherwise the stream's timestamp |
//! | `headers` | themselves |
//!
//! A message published without `Nats-Msg-Id` gets a stable id from its place
//! in the stream, `<stream>:<seq>`, so its emits still have deterministic ids.
//!
//! A delayed message is published as a JetStream schedule ([`schedule`]),
//! which the server turns into the message when it is due. The server
//! drops `Nats-Msg-Id` from what it produces, so the id travels in
//! `Sluice-Msg-Id` too and is read back from there.

use async_nats::HeaderMap;
use bytes::Bytes;

use crate::broker::Message;

/// The header carrying a message's id; JetStream deduplicates on it.
pub const MSG_ID: &str = "Nats-Msg-Id";
/// The header carrying a message's ordering key.
pub const KEY: &str = "Sluice-Key";
/// The header carrying an original publish time.
pub const PUBLISHED_AT: &str = "Sluice-Published-At";
/// The header carrying a delayed message's id through its schedule.
pub const SCHEDULED_ID: &str = "Sluice-Msg-Id";
/// A one-shot JetStream schedule: `@at <RFC 3339>`.
const SCHEDULE: &str = "Nats-Schedule";
/// The subject a schedule publishes to.
const SCHEDULE_TARGET: &str = "Nats-Schedule-Target";

/// The headers of the schedule that publishes `message` (its delay
/// headers already removed) to its topic at `due_ms`.
pub fn schedule(message: &Message, due_ms: u64) -> HeaderMap {
    let mut map = headers(message);
    map.insert(SCHEDULED_ID, message.id.as_str());
    map.insert(
        SCHEDULE,
        format!("@at {}", crate::timestamp::format_rfc3339_millis(due_ms)).as_str(),
    );
    map.insert(SCHEDULE_TARGET, message.topic.as_str());
    map
}

/// The headers to publish `message` with.
pub fn headers(message: &Message) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert(MSG_ID, message.id.as_str());
    if let Some(key) = &message.key {
        map.insert(KEY, key.as_str());
    }
    if message.published_at != 0 {
        map.insert(PUBLISHED_AT, message.published_at.to_string().as_str());
    }
    // `Nats-*` headers are controls of one publish (`Nats-Msg-Id`,
    // `Nats-Expected-*`, `Nats-Rollup`, ...): the id is set above, and one
    // a handler copied or made up must not steer the server (a rollup
    // would purge the topic). `message` drops them on the way in too.
    for (name, value) in &message.headers {
        if !is_control(name) {
            map.append(name.as_str(), value.as_str());
        }
    }
    map
}

/// Whether `name` is a NATS control header (`Nats-` in any case).
fn is_control(name: &str) -> bool {
    name.get(..5)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case("nats-"))
}

/// The bytes `message` takes on the wire with the headers [`headers`]
/// gives it (`NATS/1.0\r\n`, each `name: value\r\n`, a blank line, the
/// body): what counts against the server's max_payload. Computed without
/// building the header map.
pub fn wire_size(message: &Message) -> usize {
    let line = |name: &str, value: usize| name.len() + b": \r\n".len() + value;
    let mut len = b"NATS/1.0\r\n\r\n".len() + line(MSG_ID, message.id.len());
    if let Some(key) = &message.key {
        len += line(KEY, key.len());
    }
    if message.published_at != 0 {
        len += line(PUBLISHED_AT, message.published_at.to_string().len());
    }
    for (name, value) in &message.headers {
        if !is_control(name) {
            len += line(name, value.len());
        }
    }
    len + message.payload.len()
}

/// The bytes `headers` take on the wire (`NATS/1.0\r\n`, each
/// `name: value\r\n`, a blank line).
#[cfg(test)]
fn wire_len(headers: &HeaderMap) -> usize {
    let mut len = b"NATS/1.0\r\n\r\n".len();
    for (name, values) in headers.iter() {
        let name: &str = name.as_ref();
        for value in values {
            len += name.len() + b": \r\n".len() + value.as_str().len();
        }
    }
    len
}

/// Rebuilds a message read from `stream` at `seq`. `stamped_at` is the
/// stream's timestamp, in ms.
pub fn message(
    topic: &str,
    stream: &str,
    seq: u64,
    headers: Option<&HeaderMap>,
    payload: Bytes,
    stamped_at: u64,
) -> Message {
    let mut id = None;
    let mut scheduled_id = None;
    let mut key = None;
    let mut published_at = None;
    let mut rest = Vec::new();
    if let Some(map) = headers {
        for (name, values) in map.iter() {
            let name: &str = name.as_ref();
            for value in values {
                let value = value.as_str();
                match name {
                    MSG_ID => id = Some(value.to_owned()),
                    SCHEDULED_ID => scheduled_id = Some(value.to_owned()),
                    KEY => key = Some(value.to_owned()),
                    PUBLISHED_AT => published_at = value.parse().ok(),
                    // Server and client controls (`Nats-Expected-*`,
                    // `Nats-Rollup`, ...) belong to one publish, not to the
                    // message; copying them onward would break a re-publish.
                    _ if is_control(name) => {}
                    _ => rest.push((name.to_owned(), value.to_owned())),
                }
            }
        }
    }
    // HeaderMap is a hash map; sort for a stable order.
    rest.sort();
    Message {
        id: id
            .or(scheduled_id)
            .unwrap_or_else(|| format!("{stream}:{seq}")),
        topic: topic.to_owned(),
        key,
        headers: rest,
        payload,
        published_at: published_at.unwrap_or(stamped_at),
    }
}

/// Milliseconds since the epoch of a JetStream timestamp.
pub fn millis(time: time::OffsetDateTime) -> u64 {
    u64::try_from(time.unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_headers() {
        let mut m = Message::new("id-1", "orders.in", "body");
        m.key = Some("k".into());
        m.headers = vec![("a".into(), "1".into()), ("a".into(), "2".into())];
        let h = headers(&m);
        let back = message("orders.in", "S", 7, Some(&h), m.payload.clone(), 99);
        assert_eq!(back.id, "id-1");
        assert_eq!(back.key.as_deref(), Some("k"));
        assert_eq!(back.headers, m.headers);
        assert_eq!(back.published_at, 99);
    }

    #[test]
    fn a_scheduled_message_keeps_its_id_when_the_server_drops_nats_msg_id() {
        let mut m = Message::new("id-1", "orders.in", "body");
        m.headers = vec![("a".into(), "1".into())];
        let h = schedule(&m, 1_795_685_400_250);
        assert_eq!(
            h.get("Nats-Schedule").map(|v| v.as_str()),
            Some("@at 2026-11-26T09:30:00.25Z")
        );
        assert_eq!(
            h.get("Nats-Schedule-Target").map(|v| v.as_str()),
            Some("orders.in")
        );
        // What the server produces: the schedule's headers without its
        // `Nats-*` ones, plus its own.
        let mut fired = HeaderMap::new();
        for (name, values) in h.iter() {
            let name: &str = name.as_ref();
            if !is_control(name) {
                for v in values {
                    fired.append(name, v.as_str());
                }
            }
        }
        fired.insert("Nats-Scheduler", "_sluice.delay.SLUICE_orders_in.x");
        let back = message("orders.in", "S", 9, Some(&fired), m.payload.clone(), 5);
        assert_eq!(back.id, "id-1");
        assert_eq!(back.headers, m.headers);
    }

    #[test]
    fn wire_len_counts_the_header_block_as_sent() {
        let mut m = Message::new("a", "t", "body");
        m.headers = vec![("x".into(), "1".into()), ("x".into(), "22".into())];
        // "NATS/1.0\r\n" + "Nats-Msg-Id: a\r\n" + "x: 1\r\n" + "x: 22\r\n" + "\r\n"
        assert_eq!(wire_len(&headers(&m)), 10 + 16 + 6 + 7 + 2);
    }

    #[test]
    fn wire_size_is_what_the_headers_and_body_take() {
        let mut m = Message::new("id-1", "t", "body");
        m.key = Some("k".into());
        m.published_at = 1_700_000_000_000;
        m.headers = vec![("a".into(), "1".into()), ("Nats-Rollup".into(), "x".into())];
        assert_eq!(wire_size(&m), wire_len(&headers(&m)) + 4);
    }

    #[test]
    fn control_headers_never_travel_onward() {
        let mut m = Message::new("id-1", "t", "body");
        m.headers = vec![
            ("Nats-Rollup".into(), "sub".into()),
            ("nats-msg-id".into(), "other".into()),
            ("Natsy".into(), "kept".into()),
        ];
        let h = headers(&m);
        assert_eq!(h.get("Nats-Msg-Id").map(|v| v.as_str()), Some("id-1"));
        assert!(h.get("Nats-Rollup").is_none());
        assert!(h.get("nats-msg-id").is_none());
        assert_eq!(h.get("Natsy").map(|v| v.as_str()), Some("kept"));
    }

    #[test]
    fn a_plain_nats_message_gets_a_stable_id() {
        let back = message("t", "SLUICE_t", 42, None, Bytes::from_static(b"x"), 5);
        assert_eq!(back.id, "SLUICE_t:42");
        assert!(back.headers.is_empty());
    }
}
