//! The SQS sink: `SendMessageBatch` of up to 10 messages.
//!
//! Each message becomes one entry: the payload is the body (it must be
//! UTF-8 text SQS takes), every header a `String` message attribute, and
//! `sluice-id` an attribute holding the message id. On a FIFO queue the
//! key is the `MessageGroupId` (`message_group`, default `sluice`, for a
//! message without one) and the message id the `MessageDeduplicationId`,
//! so a message sent again (a crash after the send, before the stage's
//! ack) within SQS's five-minute deduplication interval is not delivered
//! twice. Group and deduplication ids that are not SQS tokens (1 to 128
//! printable ASCII characters) are sent as `sha256-<hex>` of themselves.
//! On a standard queue a key travels as the `sluice-key` attribute, and a
//! delay comes from `delay_header` (or `delay`).
//!
//! Outcomes, per message:
//!
//! - a message SQS can never take (not UTF-8 text, an empty body, a
//!   header that cannot be an attribute, more than 10 attributes, over
//!   1 MiB, an unreadable delay header) is [`SinkError::Rejected`] before
//!   anything is sent;
//! - an entry SQS fails in the batch's answer is `Rejected` with its code
//!   when SQS says it is the sender's fault, else [`SinkError::Retry`]
//!   (throttling codes are always retried);
//! - a batch SQS refuses as a whole for a reason of the request (one
//!   entry too large for the queue's `MaximumMessageSize`) is sent again
//!   entry by entry, so only the guilty entry is rejected;
//! - throttling is `Retry`; no answer, a connection error, a server error,
//!   missing or refused credentials and a missing queue are
//!   [`SinkError::Unavailable`]: held, no attempt spent.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};

use super::config::SqsSinkConfig;
use super::{
    CALL_TIMEOUT, CallError, LazyClient, MAX_BATCH, attribute_name_problem, classify,
    is_throttling, is_unusable, sqs_text_ok, sqs_token, timed_out,
};
use crate::connect::{Sink, SinkError};
use crate::plugin::Message;

/// The most message attributes SQS takes on one message.
pub const MAX_ATTRIBUTES: usize = 10;
/// The largest message (body and attributes) and the largest batch SQS
/// takes: 1 MiB.
pub const MAX_SIZE: usize = 1024 * 1024;
/// The attribute that carries the Sluice message id.
pub const ID_ATTRIBUTE: &str = "sluice-id";
/// The attribute that carries the key on a standard queue.
pub const KEY_ATTRIBUTE: &str = "sluice-key";

/// Sends messages to one queue.
pub struct SqsSink {
    client: LazyClient,
    fifo: bool,
    delay: Option<Duration>,
    delay_header: Option<String>,
    message_group: String,
}

/// A message made into an entry, with its size as SQS counts it.
struct Entry {
    /// Its index in the batch written.
    index: usize,
    entry: SendMessageBatchRequestEntry,
    size: usize,
}

impl SqsSink {
    /// The sink of `config`, not connected.
    pub(crate) fn new(config: &SqsSinkConfig) -> Self {
        let target = config.target();
        SqsSink {
            fifo: target.fifo(),
            client: LazyClient::new(target),
            delay: config.delay.map(|d| d.get()),
            delay_header: config.delay_header.clone(),
            message_group: config
                .message_group
                .clone()
                .unwrap_or_else(super::config::default_message_group),
        }
    }

    fn queue_url(&self) -> &str {
        &self.client.target().queue_url
    }

    fn rejected(&self, why: impl std::fmt::Display) -> SinkError {
        SinkError::Rejected(format!("sqs queue `{}`: {why}", self.queue_url()))
    }

    /// The entry for `message`, or why SQS could never take it.
    fn entry(&self, index: usize, message: &Message) -> Result<Entry, SinkError> {
        let body = std::str::from_utf8(&message.payload).map_err(|_| {
            self.rejected("the payload is not UTF-8 text, which an SQS message body must be")
        })?;
        if body.is_empty() {
            return Err(self
                .rejected("the payload is empty; an SQS message body has at least one character"));
        }
        if !sqs_text_ok(body) {
            return Err(self.rejected(
                "the payload holds characters SQS refuses in a message body (control characters \
                 other than tab and line breaks, U+FFFE, U+FFFF)",
            ));
        }
        let mut attributes: Vec<(&str, &str)> = Vec::with_capacity(message.headers.len() + 2);
        attributes.push((ID_ATTRIBUTE, &message.id));
        if !self.fifo
            && let Some(key) = &message.key
        {
            attributes.push((KEY_ATTRIBUTE, key));
        }
        for (name, value) in &message.headers {
            if name == ID_ATTRIBUTE || name == KEY_ATTRIBUTE {
                // The sink writes its own; a copy from upstream is replaced.
                continue;
            }
            if let Some(problem) = attribute_name_problem(name) {
                return Err(self.rejected(format!("header {problem}")));
            }
            if value.is_empty() {
                return Err(self.rejected(format!(
                    "header `{name}` is empty; an SQS message attribute has a value"
                )));
            }
            if !sqs_text_ok(value) {
                return Err(self.rejected(format!(
                    "header `{name}` holds characters SQS refuses in an attribute value"
                )));
            }
            attributes.push((name, value));
        }
        if attributes.len() > MAX_ATTRIBUTES {
            return Err(self.rejected(format!(
                "{} message attributes (the headers, `{ID_ATTRIBUTE}`{}), over SQS's limit of \
                 {MAX_ATTRIBUTES}; drop or merge headers in a stage before the sink",
                attributes.len(),
                if self.fifo {
                    ""
                } else {
                    " and a key's `sluice-key`"
                }
            )));
        }
        let size = body.len()
            + attributes
                .iter()
                .map(|(n, v)| n.len() + "String".len() + v.len())
                .sum::<usize>();
        if size > MAX_SIZE {
            return Err(self.rejected(format!(
                "the message is {size} bytes with its attributes, over SQS's limit of {MAX_SIZE}"
            )));
        }
        let mut builder = SendMessageBatchRequestEntry::builder()
            .id(index.to_string())
            .message_body(body);
        for (name, value) in attributes {
            let value = MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value)
                .build()
                .map_err(|e| self.rejected(e))?;
            builder = builder.message_attributes(name, value);
        }
        if self.fifo {
            let group = message
                .key
                .as_deref()
                .map_or_else(|| self.message_group.clone(), sqs_token);
            builder = builder
                .message_group_id(group)
                .message_deduplication_id(sqs_token(&message.id));
        } else if let Some(delay) = self.delay_of(message)? {
            builder = builder.delay_seconds(i32::try_from(delay.as_secs()).unwrap_or(i32::MAX));
        }
        let entry = builder.build().map_err(|e| self.rejected(e))?;
        Ok(Entry { index, entry, size })
    }

    /// The message's delay: its `delay_header` (seconds, or a duration
    /// with a unit), else the block's `delay`. SQS itself refuses one over
    /// 15 minutes (the entry is then rejected with SQS's code).
    fn delay_of(&self, message: &Message) -> Result<Option<Duration>, SinkError> {
        let header = self
            .delay_header
            .as_deref()
            .and_then(|name| message.headers.iter().find(|(n, _)| n == name));
        let Some((name, value)) = header else {
            return Ok(self.delay);
        };
        let text = value.trim();
        let delay = text
            .parse::<u64>()
            .map(Duration::from_secs)
            .or_else(|_| humantime::parse_duration(text))
            .map_err(|_| {
                self.rejected(format!(
                    "header `{name}` = `{value}` is not a delay (seconds, or a duration such as `30s`)"
                ))
            })?;
        if delay.subsec_nanos() != 0 {
            return Err(self.rejected(format!(
                "header `{name}` = `{value}`: SQS delays are whole seconds"
            )));
        }
        Ok(Some(delay))
    }

    /// Sends one batch (at most 10 entries, at most 1 MiB); the outcome
    /// of each entry, in order.
    async fn send(&self, entries: &[Entry]) -> Vec<Result<(), SinkError>> {
        match self.send_batch(entries).await {
            Ok(results) => results,
            // Refused as a whole: one entry may be to blame (too large for
            // this queue). Sent again one by one, so only it is rejected.
            Err(CallError::Refused(_)) if entries.len() > 1 => {
                let mut results = Vec::with_capacity(entries.len());
                for entry in entries {
                    let one = std::slice::from_ref(entry);
                    results.push(match self.send_batch(one).await {
                        Ok(mut r) => r.pop().unwrap_or_else(|| Err(no_result())),
                        Err(err) => Err(call_outcome(err)),
                    });
                }
                results
            }
            Err(err) => {
                let outcome = call_outcome(err);
                entries.iter().map(|_| Err(outcome.clone())).collect()
            }
        }
    }

    /// One `SendMessageBatch`: per entry, its outcome; a failed call as a
    /// whole is an error.
    async fn send_batch(&self, entries: &[Entry]) -> Result<Vec<Result<(), SinkError>>, CallError> {
        let client = self.client.get().await;
        let call = client
            .send_message_batch()
            .queue_url(self.queue_url())
            .set_entries(Some(entries.iter().map(|e| e.entry.clone()).collect()))
            .send();
        let out = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(out)) => out,
            Ok(Err(err)) => return Err(classify(self.queue_url(), "SendMessageBatch", &err)),
            Err(_) => {
                return Err(timed_out(
                    self.queue_url(),
                    "SendMessageBatch",
                    CALL_TIMEOUT,
                ));
            }
        };
        let mut results: Vec<Result<(), SinkError>> =
            entries.iter().map(|_| Err(no_result())).collect();
        let position = |id: &str| entries.iter().position(|e| e.entry.id() == id);
        for ok in out.successful() {
            if let Some(i) = position(ok.id()) {
                results[i] = Ok(());
            }
        }
        for failed in out.failed() {
            let Some(i) = position(failed.id()) else {
                continue;
            };
            let code = failed.code();
            let text = format!(
                "sqs queue `{}` refused the message: {code}{}{}",
                self.queue_url(),
                if failed.message().is_some() { ": " } else { "" },
                failed.message().unwrap_or("")
            );
            results[i] = Err(if is_throttling(code) {
                SinkError::Retry {
                    reason: text,
                    after: None,
                }
            } else if is_unusable(code) {
                SinkError::Unavailable(text)
            } else if failed.sender_fault() {
                SinkError::Rejected(text)
            } else {
                SinkError::Retry {
                    reason: text,
                    after: None,
                }
            });
        }
        Ok(results)
    }
}

/// What a failed call means for each of its messages.
fn call_outcome(err: CallError) -> SinkError {
    match err {
        CallError::Unavailable(text) => SinkError::Unavailable(text),
        CallError::Throttled(text) => SinkError::Retry {
            reason: text,
            after: None,
        },
        CallError::Refused(text) => SinkError::Rejected(text),
    }
}

fn no_result() -> SinkError {
    SinkError::Retry {
        reason: "SQS's answer had no result for this message".into(),
        after: None,
    }
}

/// Groups entries into batches of at most 10 entries and 1 MiB, in order.
fn batches(entries: Vec<Entry>) -> Vec<Vec<Entry>> {
    let mut out: Vec<Vec<Entry>> = Vec::new();
    let mut size = 0;
    for entry in entries {
        match out.last_mut() {
            Some(last) if last.len() < MAX_BATCH && size + entry.size <= MAX_SIZE => {
                size += entry.size;
                last.push(entry);
            }
            _ => {
                size = entry.size;
                out.push(vec![entry]);
            }
        }
    }
    out
}

#[async_trait]
impl Sink for SqsSink {
    async fn write(&self, message: &Message) -> Result<(), SinkError> {
        self.write_batch(std::slice::from_ref(message))
            .await
            .pop()
            .unwrap_or_else(|| Err(no_result()))
    }

    async fn write_batch(&self, messages: &[Message]) -> Vec<Result<(), SinkError>> {
        let mut results: Vec<Result<(), SinkError>> = messages.iter().map(|_| Ok(())).collect();
        let mut entries = Vec::with_capacity(messages.len());
        for (i, message) in messages.iter().enumerate() {
            match self.entry(i, message) {
                Ok(entry) => entries.push(entry),
                Err(err) => results[i] = Err(err),
            }
        }
        let batches = batches(entries);
        let sent = futures_util::future::join_all(batches.iter().map(|b| self.send(b))).await;
        for (batch, outcomes) in batches.iter().zip(sent) {
            for (entry, outcome) in batch.iter().zip(outcomes) {
                results[entry.index] = outcome;
            }
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(url: &str, extra: &str) -> SqsSink {
        let config: SqsSinkConfig =
            serde_saphyr::from_str(&format!("queue_url: {url}\n{extra}")).expect("a sink block");
        SqsSink::new(&config)
    }

    fn message(id: &str, payload: &[u8], headers: &[(&str, &str)]) -> Message {
        let mut m = Message::new(id, "up", payload.to_vec());
        m.headers = headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect();
        m
    }

    const STD: &str = "http://127.0.0.1:1/123/in";
    const FIFO: &str = "http://127.0.0.1:1/123/out.fifo";

    #[test]
    fn a_fifo_entry_has_group_and_dedup_ids() {
        let s = sink(FIFO, "");
        let mut m = message("src:abc/upper", b"hi", &[("trace", "t1")]);
        let e = s.entry(0, &m).expect("an entry").entry;
        assert_eq!(e.message_group_id(), Some("sluice"));
        assert_eq!(e.message_deduplication_id(), Some("src:abc/upper"));
        let attrs = e.message_attributes().expect("attributes");
        assert_eq!(attrs["sluice-id"].string_value(), Some("src:abc/upper"));
        assert_eq!(attrs["trace"].string_value(), Some("t1"));
        m.key = Some("customer 7".into());
        m.id = "x".repeat(200);
        let e = s.entry(0, &m).expect("an entry").entry;
        assert_eq!(e.message_group_id(), Some(sqs_token("customer 7").as_str()));
        assert!(e.message_deduplication_id().is_some_and(|d| d.len() == 71));
    }

    #[test]
    fn a_standard_entry_takes_its_delay_from_the_header() {
        let s = sink(STD, "delay_header: wait\ndelay: 3s\n");
        let e = s
            .entry(0, &message("a", b"x", &[("wait", "30")]))
            .expect("entry")
            .entry;
        assert_eq!(e.delay_seconds(), Some(30));
        let e = s
            .entry(0, &message("a", b"x", &[("wait", "2m")]))
            .expect("entry")
            .entry;
        assert_eq!(e.delay_seconds(), Some(120));
        let e = s.entry(0, &message("a", b"x", &[])).expect("entry").entry;
        assert_eq!(e.delay_seconds(), Some(3));
        assert!(matches!(
            s.entry(0, &message("a", b"x", &[("wait", "soon")])),
            Err(SinkError::Rejected(_))
        ));
    }

    #[test]
    fn what_sqs_cannot_take_is_rejected_before_sending() {
        let s = sink(STD, "");
        let reject = |m: Message| match s.entry(0, &m) {
            Err(SinkError::Rejected(why)) => why,
            Ok(_) => panic!("taken: {m:?}"),
            Err(other) => panic!("{other:?}"),
        };
        assert!(reject(message("a", &[0xff, 0xfe], &[])).contains("UTF-8"));
        assert!(reject(message("a", b"", &[])).contains("empty"));
        assert!(reject(message("a", b"x", &[("bad name", "v")])).contains("bad name"));
        let many: Vec<(String, String)> = (0..10).map(|i| (format!("h{i}"), "v".into())).collect();
        let mut m = message("a", b"x", &[]);
        m.headers = many;
        assert!(reject(m).contains("limit of 10"));
        let big = vec![b'x'; MAX_SIZE];
        assert!(reject(message("a", &big, &[])).contains("over SQS's limit"));
    }

    #[test]
    fn batches_hold_ten_entries_and_one_mebibyte() {
        let s = sink(STD, "");
        let over_half = vec![b'x'; MAX_SIZE / 2 + 100];
        let mut entries = Vec::new();
        for i in 0..12 {
            entries.push(s.entry(i, &message("a", b"x", &[])).expect("entry"));
        }
        for i in 12..15 {
            entries.push(s.entry(i, &message("a", &over_half, &[])).expect("entry"));
        }
        let sizes: Vec<usize> = batches(entries).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![10, 3, 1, 1]);
    }
}
