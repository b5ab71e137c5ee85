//! What a dead-letter entry says about where it came from.
//!
//! A DLQ entry is the original message (payload or claim reference, key and
//! headers) with provenance headers added. The engine writes them; the admin
//! API and `sluice dlq` read them; redrive uses them to find the way back.
//! Keeping the names in one place keeps those three from drifting apart.

use crate::broker::Message;

/// Header naming the pipeline of the stage that dead-lettered the message.
pub const PIPELINE: &str = "sluice-dlq-pipeline";
/// Header naming that stage.
pub const STAGE: &str = "sluice-dlq-stage";
/// Header naming the topic the message was consumed from.
pub const SOURCE_TOPIC: &str = "sluice-dlq-source-topic";
/// Header with its sequence in that topic.
pub const SOURCE_SEQ: &str = "sluice-dlq-source-seq";
/// Header with the message's id before dead-lettering.
pub const ORIGINAL_ID: &str = "sluice-dlq-original-id";
/// Header with how many attempts were made.
pub const ATTEMPTS: &str = "sluice-dlq-attempts";
/// Header with the failure kind of the last attempt (`crate::FailureKind` names).
pub const KIND: &str = "sluice-dlq-kind";
/// Header with the last error's message, on one line (see [`Provenance::stamp`]).
pub const ERROR: &str = "sluice-dlq-error";
/// Header with the first failure time, in ms since the Unix epoch.
pub const FIRST_FAILURE: &str = "sluice-dlq-first-failure";
/// Header with the last failure time, in ms since the Unix epoch.
pub const LAST_FAILURE: &str = "sluice-dlq-last-failure";
/// Header with the keys of its stage's state store the last attempt read,
/// as a JSON array (see [`stamp_state_read`]); only on a stage with
/// `state:` whose handler read some. Values stay in the store: `sluice dlq
/// show --as-case` fetches them with the full token.
pub const STATE_READ: &str = "sluice-dlq-state-read";

/// Set on a redriven message: how many times it has been redriven.
pub const REDRIVES: &str = "sluice-redrives";
/// Set on a redriven message: the only `<pipeline>/<stage>` that should
/// handle it. The other stages subscribed to the source topic ack it
/// unhandled, so a redrive never re-runs branches that already succeeded.
pub const REDRIVE_TO: &str = "sluice-redrive-to";

/// Every provenance header, so a redrive can strip them.
pub const PROVENANCE: [&str; 11] = [
    PIPELINE,
    STAGE,
    SOURCE_TOPIC,
    SOURCE_SEQ,
    ORIGINAL_ID,
    ATTEMPTS,
    KIND,
    ERROR,
    FIRST_FAILURE,
    LAST_FAILURE,
    STATE_READ,
];

/// The most bytes of keys [`STATE_READ`] carries: the keys past it are left
/// out (the header says how many).
pub const STATE_READ_MAX: usize = 2048;

/// Appends [`STATE_READ`] to a dead letter: the state keys its last
/// attempt read, as many as fit in [`STATE_READ_MAX`] bytes, then `"…N
/// more"` if some did not.
pub fn stamp_state_read(message: &mut Message, keys: &[String]) {
    if keys.is_empty() {
        return;
    }
    let mut kept: Vec<String> = Vec::new();
    let mut bytes = 0;
    for key in keys {
        bytes += key.len() + 3;
        if bytes > STATE_READ_MAX {
            break;
        }
        kept.push(key.clone());
    }
    let left = keys.len() - kept.len();
    if left > 0 {
        kept.push(format!("…{left} more"));
    }
    // JSON escapes line breaks, so the value stays one NATS header line.
    let value = serde_json::to_string(&kept).unwrap_or_default();
    message.headers.push((STATE_READ.into(), value));
}

/// The state keys a dead letter's last attempt read ([`STATE_READ`]), and
/// how many more it read than the header kept.
pub fn state_read(headers: &[(String, String)]) -> (Vec<String>, usize) {
    let Some((_, value)) = headers.iter().find(|(k, _)| k == STATE_READ) else {
        return (Vec::new(), 0);
    };
    let mut keys: Vec<String> = serde_json::from_str(value).unwrap_or_default();
    let more = keys
        .last()
        .and_then(|k| k.strip_prefix('…')?.strip_suffix(" more")?.parse().ok())
        .unwrap_or(0);
    if more > 0 {
        keys.pop();
    }
    (keys, more)
}

/// Where a dead-lettered message came from and why it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    /// The pipeline.
    pub pipeline: String,
    /// The stage.
    pub stage: String,
    /// The topic it was consumed from.
    pub source_topic: String,
    /// Its sequence there.
    pub source_seq: u64,
    /// Its id there.
    pub original_id: String,
    /// Attempts made.
    pub attempts: u32,
    /// The last failure's kind name.
    pub kind: String,
    /// The last failure's message.
    pub error: String,
    /// First failure, ms since the epoch.
    pub first_failure: u64,
    /// Last failure, ms since the epoch.
    pub last_failure: u64,
}

impl Provenance {
    /// Appends the provenance headers to `message`. The error goes on one
    /// line, its lines joined with ` / `: it can be a handler's reject
    /// reason, text of any shape, and a header value with a line break is
    /// one NATS cannot carry (async-nats panics on it), so a multi-line
    /// reason would otherwise never reach the DLQ on NATS.
    pub fn stamp(&self, message: &mut Message) {
        let h = &mut message.headers;
        h.push((PIPELINE.into(), self.pipeline.clone()));
        h.push((STAGE.into(), self.stage.clone()));
        h.push((SOURCE_TOPIC.into(), self.source_topic.clone()));
        h.push((SOURCE_SEQ.into(), self.source_seq.to_string()));
        h.push((ORIGINAL_ID.into(), self.original_id.clone()));
        h.push((ATTEMPTS.into(), self.attempts.to_string()));
        h.push((KIND.into(), self.kind.clone()));
        h.push((ERROR.into(), capped(one_line(&self.error))));
        h.push((FIRST_FAILURE.into(), self.first_failure.to_string()));
        h.push((LAST_FAILURE.into(), self.last_failure.to_string()));
    }

    /// Reads the provenance of a DLQ entry; None if a header is missing.
    pub fn read(message: &Message) -> Option<Provenance> {
        let num = |name| message.header(name)?.parse().ok();
        Some(Provenance {
            pipeline: message.header(PIPELINE)?.to_owned(),
            stage: message.header(STAGE)?.to_owned(),
            source_topic: message.header(SOURCE_TOPIC)?.to_owned(),
            source_seq: num(SOURCE_SEQ)?,
            original_id: message.header(ORIGINAL_ID)?.to_owned(),
            attempts: message.header(ATTEMPTS)?.parse().ok()?,
            kind: message.header(KIND)?.to_owned(),
            error: message.header(ERROR)?.to_owned(),
            first_failure: num(FIRST_FAILURE)?,
            last_failure: num(LAST_FAILURE)?,
        })
    }
}

/// The most bytes of error text a dead letter carries; a longer message
/// (a handler's reject reason can be anything) is cut, marked with `…`.
/// It bounds the provenance headers, which must fit beside the message
/// under a broker's size limit.
pub const ERROR_MAX: usize = 1024;

/// `text`, cut to at most [`ERROR_MAX`] bytes at a character boundary.
fn capped(mut text: String) -> String {
    if text.len() > ERROR_MAX {
        let mut end = ERROR_MAX - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// `text` with its line breaks replaced: non-blank lines joined by ` / `.
fn one_line(text: &str) -> String {
    if !text.contains(['\r', '\n']) {
        return text.to_owned();
    }
    text.split(['\r', '\n'])
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The message a redrive publishes back to the source topic for `entry`:
/// the original payload, key and headers (provenance stripped), targeted at
/// the stage that failed, with a fresh id `<original>~r<count>@<pipeline>/<stage>`.
/// The id differs from the original and from a redrive of the same message
/// by another stage (fan-out), so the broker's duplicate window drops
/// neither; it is the same when one entry is redriven twice (a crash between
/// publish and removal), so that repeat is dropped.
pub fn redrive_message(entry: &Message, provenance: &Provenance) -> Message {
    let redrives: u32 = entry
        .header(REDRIVES)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
        + 1;
    let base_id = provenance
        .original_id
        .split_once("~r")
        .map_or(provenance.original_id.as_str(), |(base, _)| base);
    let mut headers: Vec<(String, String)> = entry
        .headers
        .iter()
        .filter(|(n, _)| !PROVENANCE.contains(&n.as_str()) && n != REDRIVES && n != REDRIVE_TO)
        .cloned()
        .collect();
    headers.push((REDRIVES.into(), redrives.to_string()));
    headers.push((
        REDRIVE_TO.into(),
        format!("{}/{}", provenance.pipeline, provenance.stage),
    ));
    Message {
        id: format!(
            "{base_id}~r{redrives}@{}/{}",
            provenance.pipeline, provenance.stage
        ),
        topic: provenance.source_topic.clone(),
        key: entry.key.clone(),
        headers,
        payload: entry.payload.clone(),
        published_at: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provenance() -> Provenance {
        Provenance {
            pipeline: "orders".into(),
            stage: "route".into(),
            source_topic: "orders.in".into(),
            source_seq: 7,
            original_id: "m1".into(),
            attempts: 3,
            kind: "retry".into(),
            error: "boom".into(),
            first_failure: 1,
            last_failure: 2,
        }
    }

    #[test]
    fn provenance_round_trips_through_headers() {
        let mut m = Message::new("m1", "orders.route.dlq", "x");
        provenance().stamp(&mut m);
        assert_eq!(Provenance::read(&m), Some(provenance()));
    }

    #[test]
    fn the_error_header_is_capped() {
        let mut m = Message::new("m1", "orders.route.dlq", "x");
        let long = Provenance {
            error: "é".repeat(2000),
            ..provenance()
        };
        long.stamp(&mut m);
        let error = m.header(ERROR).expect("error header");
        assert!(error.len() <= ERROR_MAX, "{}", error.len());
        assert!(error.ends_with('…'));
        assert_eq!(capped("short".into()), "short");
    }

    #[test]
    fn the_error_header_is_one_line() {
        let mut m = Message::new("m1", "orders.route.dlq", "x");
        let multi = Provenance {
            error: "first\nsecond\r\n\n  third \r".into(),
            ..provenance()
        };
        multi.stamp(&mut m);
        assert_eq!(m.header(ERROR), Some("first / second / third"));
        assert_eq!(crate::broker::check_portable(None, &m.headers), Ok(()));
        assert_eq!(one_line(" kept as is "), " kept as is ");
    }

    #[test]
    fn redrive_targets_the_stage_and_counts() {
        let mut entry = Message::new("m1", "orders.route.dlq", "x");
        entry.headers.push(("user".into(), "kept".into()));
        provenance().stamp(&mut entry);
        let first = redrive_message(&entry, &provenance());
        assert_eq!(first.id, "m1~r1@orders/route");
        assert_eq!(first.topic, "orders.in");
        assert_eq!(first.header("user"), Some("kept"));
        assert_eq!(first.header(REDRIVE_TO), Some("orders/route"));
        assert_eq!(first.header(KIND), None);

        // It fails again and comes back to the DLQ; the next redrive is #2.
        let mut again = first.clone();
        let mut p2 = provenance();
        p2.original_id = first.id.clone();
        p2.stamp(&mut again);
        let second = redrive_message(&again, &p2);
        assert_eq!(second.id, "m1~r2@orders/route");
        assert_eq!(second.header(REDRIVES), Some("2"));
    }

    #[test]
    fn the_state_keys_read_round_trip_and_are_capped() {
        let mut m = Message::new("m1", "t", "x");
        stamp_state_read(&mut m, &[]);
        assert!(m.headers.is_empty(), "no keys, no header");
        let keys = vec!["a/1".to_owned(), "line\nbreak".to_owned()];
        stamp_state_read(&mut m, &keys);
        assert!(!m.header(STATE_READ).unwrap_or_default().contains('\n'));
        assert_eq!(state_read(&m.headers), (keys, 0));

        let many: Vec<String> = (0..500).map(|i| format!("key-{i:04}")).collect();
        let mut m = Message::new("m2", "t", "x");
        stamp_state_read(&mut m, &many);
        assert!(m.header(STATE_READ).unwrap_or_default().len() <= STATE_READ_MAX + 32);
        let (kept, more) = state_read(&m.headers);
        assert!(!kept.is_empty() && more > 0);
        assert_eq!(kept.len() + more, 500);
        assert_eq!(kept[..], many[..kept.len()]);
    }
}
