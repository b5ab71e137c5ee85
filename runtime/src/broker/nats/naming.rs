//! How Sluice names map onto JetStream names.
//!
//! | Sluice | JetStream |
//! |---|---|
//! | topic `orders.in` | subject `orders.in`, in stream `SLUICE_orders_in` |
//! | stage `orders`/`route` (consumer `orders.route`) | durable pull consumer `orders_route` on that stream |
//!
//! A topic's subject is its name, so an outside client publishes to
//! `orders.in` and subscribes to `orders.out` with nothing Sluice-specific.
//! Stream and consumer names may not contain `.`, so dots become `_`; the
//! real name is kept in the stream's subjects and the consumer's description,
//! and two names that would collide are refused at start-up.

/// The stream that holds `topic`.
pub fn stream_name(topic: &str) -> String {
    format!("SLUICE_{}", sanitize(topic))
}

/// The durable consumer of `consumer` (`<pipeline>.<stage>`).
pub fn durable_name(consumer: &str) -> String {
    sanitize(consumer)
}

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
        assert!(valid_subject("orders.in"));
        for bad in ["", "a..b", ".a", "a.", "a.*", "a b", "a.>"] {
            assert!(!valid_subject(bad), "{bad:?}");
        }
    }
}
