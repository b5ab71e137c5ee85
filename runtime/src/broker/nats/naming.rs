//! How Sluice names map onto JetStream names.
//!
//! | Sluice | JetStream |
//! |---|---|
//! | topic `orders.in` | subject `orders.in`, in stream `SLUICE_orders_in` |
//! | stage `orders`/`route` (consumer `orders.route`) | durable pull consumer `orders_route` on that stream |
//! | a message of `orders.in` delayed until it is due | a JetStream message schedule on `_sluice.delay.SLUICE_orders_in.<hash of its id>`, in the same stream |
//! | what keeps a subscribed topic's schedules stored | durable consumer `sluice-delayed` on `_sluice.delay.SLUICE_orders_in.>`, never read |
//!
//! A topic's subject is its name, so an outside client publishes to
//! `orders.in` and subscribes to `orders.out` with nothing Sluice-specific.
//! Stream and consumer names may not contain `.`, so dots become `_`; the
//! real name is kept in the stream's subjects and the consumer's description,
//! and two names that would collide are refused at start-up.

/// What every Sluice stream's name starts with.
pub const STREAM_PREFIX: &str = "SLUICE_";

/// The stream that holds `topic`.
pub fn stream_name(topic: &str) -> String {
    format!("{STREAM_PREFIX}{}", sanitize(topic))
}

/// The durable consumer of `consumer` (`<pipeline>.<stage>`).
pub fn durable_name(consumer: &str) -> String {
    sanitize(consumer)
}

/// The subjects under which `topic`'s delayed messages wait: one token
/// per stream, so the subjects of two topics never overlap (a topic's own
/// name may be a prefix of another's, its stream name may not).
pub fn delay_subjects(topic: &str) -> String {
    format!("{DELAY_PREFIX}.{}.>", stream_name(topic))
}

/// The subject of the schedule of message `id` on `topic`: a hash of the
/// id, because an id may hold any text and a schedule subject holds one
/// message (a second schedule on it replaces the first).
pub fn delay_subject(topic: &str, id: &str) -> String {
    let hash = blake3::hash(id.as_bytes());
    let hex = hash.to_hex();
    format!("{DELAY_PREFIX}.{}.{}", stream_name(topic), &hex[..32])
}

/// The first token of every delay subject.
const DELAY_PREFIX: &str = "_sluice.delay";

/// The durable consumer that keeps a subscribed (interest-retention)
/// topic's schedules stored: JetStream drops a message no consumer is
/// interested in, and the stages' consumers read only the topic's own
/// subject. It has no `_`, so no stage's durable (`<pipeline>_<stage>`)
/// can take its name.
pub const DELAY_KEEPER: &str = "sluice-delayed";

/// Whether `topic` can be a NATS subject as it is: dot-separated tokens,
/// none empty, no wildcards or whitespace.
pub fn valid_subject(topic: &str) -> bool {
    !topic.is_empty()
        && topic.split('.').all(|token| {
            !token.is_empty()
                && token
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'*' && b != b'>')
        })
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_legal_jetstream_names() {
        assert_eq!(stream_name("orders.in"), "SLUICE_orders_in");
        assert_eq!(durable_name("orders.route"), "orders_route");
        assert_eq!(
            delay_subjects("orders.in"),
            "_sluice.delay.SLUICE_orders_in.>"
        );
        let one = delay_subject("orders.in", "id with spaces.and.dots");
        assert!(one.starts_with("_sluice.delay.SLUICE_orders_in."));
        assert!(valid_subject(&one));
        assert_eq!(one.split('.').count(), 4);
        assert_ne!(one, delay_subject("orders.in", "another"));
        assert!(valid_subject("orders.in"));
        for bad in ["", "a..b", ".a", "a.", "a.*", "a b", "a.>"] {
            assert!(!valid_subject(bad), "{bad:?}");
        }
    }
}
