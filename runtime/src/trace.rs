//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` and `tracestate` headers a message carries, so a trace
//! started by a producer goes on through every stage, the DLQ and the sinks.
//!
//! Sluice does not start or end spans here; it only keeps the context
//! intact. Every way in (ingest, the batch endpoint, sources) passes the
//! message's headers through [`sanitize`], so a message header named
//! `traceparent` is always well formed, lowercase, and at most one; an
//! invalid one is dropped with its `tracestate`, as the W3C rule says (the
//! receiver restarts the trace rather than continue a broken one). The
//! engine then [`carry`]s the input's context onto each output a handler
//! did not give a context of its own.

/// The header (HTTP and message) that carries the trace and parent ids.
pub const TRACEPARENT: &str = "traceparent";
/// The header that carries vendor-specific trace state beside it.
pub const TRACESTATE: &str = "tracestate";
/// The longest `tracestate` kept, in bytes. W3C asks that at least 512
/// characters be propagated and allows 32 members of up to 256 + 256
/// characters; a longer value is dropped, not cut (a cut member would be
/// garbage to its vendor).
pub const MAX_TRACESTATE: usize = 4096;

/// The length of a version `00` `traceparent`: `00-` + 32 + `-` + 16 + `-` + 2.
const LEN_00: usize = 55;

/// A parsed `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    version: u8,
    trace_id: u128,
    parent_id: u64,
    flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value by the W3C rules: version `00` is exactly
    /// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, lowercase,
    /// neither id all zeros; a later version (not `ff`) starts with the same
    /// and may go on after a `-`. None if it is not valid.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let value = value.trim_matches([' ', '\t']);
        let bytes = value.as_bytes();
        // ASCII only, which also makes every slice below a char boundary.
        if bytes.len() < LEN_00 || !value.is_ascii() {
            return None;
        }
        let version = hex_u8(&value[..2])?;
        if version == 0xff || (version == 0 && bytes.len() != LEN_00) {
            return None;
        }
        // A later version may add fields, each after a `-`.
        if bytes.len() > LEN_00 && bytes[LEN_00] != b'-' {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = u128::from_str_radix(lower_hex(&value[3..35])?, 16).ok()?;
        let parent_id = u64::from_str_radix(lower_hex(&value[36..52])?, 16).ok()?;
        let flags = hex_u8(&value[53..55])?;
        if trace_id == 0 || parent_id == 0 {
            return None;
        }
        Some(TraceParent {
            version,
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The trace id, 32 lowercase hex digits: what every span of the trace shares.
    pub fn trace_id(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    /// The parent (span) id, 16 lowercase hex digits.
    pub fn parent_id(&self) -> String {
        format!("{:016x}", self.parent_id)
    }

    /// The trace id as a number.
    pub fn trace_id_bits(&self) -> u128 {
        self.trace_id
    }

    /// The parent (span) id as a number.
    pub fn parent_id_bits(&self) -> u64 {
        self.parent_id
    }

    /// The version.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The trace flags.
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the caller may have recorded the trace (flag `01`).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

impl std::fmt::Display for TraceParent {
    /// The version `00` form (what a later version is read as).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.parent_id, self.flags
        )
    }
}

/// Exactly two lowercase hex digits as a byte.
fn hex_u8(text: &str) -> Option<u8> {
    u8::from_str_radix(lower_hex(text)?, 16).ok()
}

/// `text` if it is only lowercase hex digits (W3C refuses uppercase, and
/// `from_str_radix` alone would take a sign).
fn lower_hex(text: &str) -> Option<&str> {
    text.bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        .then_some(text)
}

/// The value of header `name` in `headers`, whatever its case.
pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The trace id of a message's valid `traceparent`, if it has one.
pub fn trace_id(headers: &[(String, String)]) -> Option<String> {
    header(headers, TRACEPARENT)
        .and_then(TraceParent::parse)
        .map(|t| t.trace_id())
}

/// Whether `value` can be kept as a `tracestate`: not empty, within
/// [`MAX_TRACESTATE`], printable ASCII (W3C's list syntax allows nothing
/// else, and it keeps line breaks out of broker headers).
fn valid_tracestate(value: &str) -> bool {
    !value.trim().is_empty()
        && value.len() <= MAX_TRACESTATE
        && value
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// Puts a message's trace context in order, in place: one valid
/// `traceparent` (named in lowercase) and with it at most one `tracestate`
/// (several are joined with `,`, as HTTP joins repeated fields), or
/// neither. An invalid or repeated `traceparent` is dropped with every
/// `tracestate` and logged at debug: the W3C rule is to restart the trace,
/// not to refuse the request.
pub fn sanitize(headers: &mut Vec<(String, String)>) {
    let is = |name: &str, wanted: &str| name.eq_ignore_ascii_case(wanted);
    if !headers
        .iter()
        .any(|(n, _)| is(n, TRACEPARENT) || is(n, TRACESTATE))
    {
        return;
    }
    let parents: Vec<&str> = headers
        .iter()
        .filter(|(n, _)| is(n, TRACEPARENT))
        .map(|(_, v)| v.as_str())
        .collect();
    let parent = match parents.as_slice() {
        [one] => match TraceParent::parse(one) {
            Some(_) => Some(one.trim_matches([' ', '\t']).to_owned()),
            None => {
                let shown: String = one.chars().take(64).collect();
                tracing::debug!(traceparent = %shown.escape_debug(), "ignoring an invalid traceparent; the trace restarts");
                None
            }
        },
        [] => None,
        _ => {
            tracing::debug!(
                count = parents.len(),
                "ignoring repeated traceparent headers; the trace restarts"
            );
            None
        }
    };
    let state = parent.as_ref().and_then(|_| {
        let joined = headers
            .iter()
            .filter(|(n, _)| is(n, TRACESTATE))
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
            .collect::<Vec<_>>()
            .join(",");
        if joined.is_empty() {
            None
        } else if valid_tracestate(&joined) {
            Some(joined)
        } else {
            tracing::debug!(
                bytes = joined.len(),
                "ignoring a tracestate that is too long or not printable ASCII"
            );
            None
        }
    });
    headers.retain(|(n, _)| !is(n, TRACEPARENT) && !is(n, TRACESTATE));
    if let Some(parent) = parent {
        headers.push((TRACEPARENT.to_owned(), parent));
        if let Some(state) = state {
            headers.push((TRACESTATE.to_owned(), state));
        }
    }
}

/// Carries the trace context of an input (`from`, its headers) onto one of
/// its outputs (`to`): its `traceparent` and `tracestate`, unless the
/// output has a `traceparent` of its own (the handler continued the trace
/// itself, or started another: its choice stands, and the input's state
/// belongs to the input's trace). Nothing is carried from an input without
/// a valid `traceparent`.
pub fn carry(from: &[(String, String)], to: &mut Vec<(String, String)>) {
    if header(to, TRACEPARENT).is_some() {
        return;
    }
    let Some(parent) = header(from, TRACEPARENT).filter(|v| TraceParent::parse(v).is_some()) else {
        return;
    };
    to.push((TRACEPARENT.to_owned(), parent.to_owned()));
    if header(to, TRACESTATE).is_none()
        && let Some(state) = header(from, TRACESTATE)
    {
        to.push((TRACESTATE.to_owned(), state.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the W3C recommendation.
    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_w3c_examples_parse() {
        let t = TraceParent::parse(EXAMPLE).expect("valid");
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert_eq!((t.version(), t.flags(), t.sampled()), (0, 1, true));
        assert_eq!(t.to_string(), EXAMPLE);
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!TraceParent::parse(unsampled).expect("valid").sampled());
        // Surrounding optional whitespace is not part of the value.
        assert!(TraceParent::parse(&format!(" {EXAMPLE}\t")).is_some());
    }

    #[test]
    fn malformed_values_are_refused() {
        let bad = [
            "",
            "00",
            // Uppercase hex.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            // All-zero trace id, all-zero parent id.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Version ff is forbidden; a version must be hex.
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // Version 00 has nothing after the flags.
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            // Wrong separators, short fields, signs.
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            // Not ASCII (and not to be sliced mid-character).
            "0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for value in bad {
            assert_eq!(TraceParent::parse(value), None, "{value:?}");
        }
    }

    #[test]
    fn later_versions_are_read_by_their_version_00_prefix() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds";
        let t = TraceParent::parse(later).expect("valid");
        assert_eq!(
            (t.version(), t.trace_id().as_str()),
            (0xcc, "4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert!(TraceParent::parse(&later[..55]).is_some());
        // After the flags, a later version's next field starts with `-`.
        let glued = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x";
        assert_eq!(TraceParent::parse(glued), None);
    }

    #[test]
    fn sanitize_keeps_one_valid_context_and_drops_a_broken_one() {
        let mut headers = h(&[
            ("a", "1"),
            ("TraceParent", EXAMPLE),
            ("tracestate", "congo=t61rcWkgMzE"),
            ("Tracestate", "rojo=00f067aa0ba902b7"),
        ]);
        sanitize(&mut headers);
        assert_eq!(
            headers,
            h(&[
                ("a", "1"),
                (TRACEPARENT, EXAMPLE),
                (TRACESTATE, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
            ])
        );

        // Invalid: the trace restarts, its state goes with it.
        let mut headers = h(&[("traceparent", "00-xyz"), ("tracestate", "a=b"), ("b", "2")]);
        sanitize(&mut headers);
        assert_eq!(headers, h(&[("b", "2")]));

        // Two parents cannot both be the parent.
        let mut headers = h(&[(TRACEPARENT, EXAMPLE), (TRACEPARENT, EXAMPLE)]);
        sanitize(&mut headers);
        assert!(headers.is_empty());

        // A state without a parent means nothing; an oversized one is dropped alone.
        let mut headers = h(&[("tracestate", "a=b")]);
        sanitize(&mut headers);
        assert!(headers.is_empty());
        let long = "a=".to_owned() + &"b".repeat(MAX_TRACESTATE);
        let mut headers = h(&[(TRACEPARENT, EXAMPLE), (TRACESTATE, &long)]);
        sanitize(&mut headers);
        assert_eq!(headers, h(&[(TRACEPARENT, EXAMPLE)]));
    }

    #[test]
    fn carry_fills_in_only_what_the_handler_left_out() {
        let input = h(&[(TRACEPARENT, EXAMPLE), (TRACESTATE, "a=b"), ("x", "1")]);
        let mut bare = Vec::new();
        carry(&input, &mut bare);
        assert_eq!(bare, h(&[(TRACEPARENT, EXAMPLE), (TRACESTATE, "a=b")]));

        // Copied by the handler already: nothing is repeated.
        let mut copied = input.clone();
        carry(&input, &mut copied);
        assert_eq!(copied, input);

        // The handler's own context stands, without the input's state.
        let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut mine = h(&[("TraceParent", own)]);
        carry(&input, &mut mine);
        assert_eq!(mine, h(&[("TraceParent", own)]));

        // No valid context in, none out.
        let mut out = Vec::new();
        carry(
            &h(&[(TRACEPARENT, "garbage"), (TRACESTATE, "a=b")]),
            &mut out,
        );
        assert!(out.is_empty());
        assert_eq!(
            trace_id(&input).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(trace_id(&h(&[(TRACEPARENT, "garbage")])), None);
    }
}
