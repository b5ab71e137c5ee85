//! What a message's key and headers may hold so that every broker carries
//! them: the rules of NATS headers, the stricter of the two brokers.
//!
//! NATS puts the key and headers in message headers, whose names are
//! printable ASCII without `:` and whose values cannot hold a line break.
//! async-nats does not refuse such a header, it panics while building it,
//! so nothing that breaks the rules may ever reach the NATS broker. The
//! embedded broker could store them, but then a pipeline that works on one
//! machine would break when moved to NATS. So the rules are checked once,
//! here, wherever keys and headers enter a pipeline: the ingest API (a
//! 400) and handler emits (the message is dead-lettered), on both brokers.

/// Why a key or a header cannot travel on every broker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unportable {
    /// The key holds `\r` or `\n`.
    #[error("the key contains a line break")]
    KeyLineBreak,
    /// A header name is the empty string.
    #[error("a header has an empty name")]
    EmptyName,
    /// A header name holds a space, a control character, non-ASCII text or
    /// `:` (the name, escaped for display).
    #[error("header name `{0}` must be printable ASCII without spaces or `:`")]
    BadName(String),
    /// A header value holds `\r` or `\n` (the header's name).
    #[error("the value of header `{0}` contains a line break")]
    ValueLineBreak(String),
}

/// Checks that `key` and `headers` can travel on every broker.
///
/// # Errors
///
/// The first key or header that cannot, and why.
pub fn check_portable(key: Option<&str>, headers: &[(String, String)]) -> Result<(), Unportable> {
    let breaks = |text: &str| text.contains(['\r', '\n']);
    if key.is_some_and(breaks) {
        return Err(Unportable::KeyLineBreak);
    }
    for (name, value) in headers {
        if name.is_empty() {
            return Err(Unportable::EmptyName);
        }
        if !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
            return Err(Unportable::BadName(name.escape_debug().to_string()));
        }
        if breaks(value) {
            return Err(Unportable::ValueLineBreak(name.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(name: &str, value: &str) -> Vec<(String, String)> {
        vec![(name.to_owned(), value.to_owned())]
    }

    #[test]
    fn spaces_and_tabs_travel() {
        assert_eq!(
            check_portable(Some("k 1\t"), &h("Trace-Id", "a b\tc")),
            Ok(())
        );
        assert_eq!(check_portable(None, &[]), Ok(()));
    }

    #[test]
    fn line_breaks_in_keys_and_values_do_not() {
        assert_eq!(
            check_portable(Some("a\nb"), &[]),
            Err(Unportable::KeyLineBreak)
        );
        assert_eq!(
            check_portable(None, &h("trace", "a\r\nb")),
            Err(Unportable::ValueLineBreak("trace".into()))
        );
        assert_eq!(
            check_portable(None, &h("trace", "a\rb")),
            Err(Unportable::ValueLineBreak("trace".into()))
        );
    }

    #[test]
    fn names_are_printable_ascii_without_colons() {
        for name in ["a b", "a:b", "caf\u{e9}", "a\nb", "a\u{7f}"] {
            assert!(
                matches!(
                    check_portable(None, &h(name, "v")),
                    Err(Unportable::BadName(_))
                ),
                "{name:?}"
            );
        }
        assert_eq!(
            check_portable(None, &h("", "v")),
            Err(Unportable::EmptyName)
        );
        // The name is escaped, so the message itself stays on one line.
        let err = check_portable(None, &h("a\nb", "v")).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "header name `a\\nb` must be printable ASCII without spaces or `:`"
        );
    }
}
