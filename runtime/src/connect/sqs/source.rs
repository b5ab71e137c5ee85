//! The SQS source: receive, publish durably, then delete.
//!
//! - `read` is one `ReceiveMessage`: long polling (`wait_time`) when the
//!   runner may wait, at most `min(batch, max)` messages (`max` is the
//!   room left under the topic's high-water mark), with the block's
//!   `visibility_timeout`, every message attribute and, for a FIFO queue,
//!   the `MessageGroupId` (the key). The id is the `MessageId`.
//! - While a read waits for its durable publish, a task of its own extends
//!   its messages' visibility (`ChangeMessageVisibilityBatch`) every half
//!   `visibility_timeout`, so a publish held up by a full topic or a
//!   broker outage does not let them reappear for another consumer.
//! - `ack` (the runner calls it only after the durable publish, read by
//!   read in read order) stops that task and deletes the read's messages
//!   with `DeleteMessageBatch`. Failed entries are kept and retried on the
//!   next `read` or `ack`, never ignored; a receipt handle that is no
//!   longer valid (`ReceiptHandleIsInvalid`: its visibility ran out, the
//!   message was received again) is logged: that message comes back and
//!   collapses in the topic's duplicate window, its id being its
//!   `MessageId`.
//! - `release` (shutdown before the publish was durable) stops the
//!   extensions and makes the messages visible again at once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry, Message,
    MessageSystemAttributeName, QueueAttributeName,
};
use base64::Engine as _;
use tokio::task::JoinHandle;

use super::config::SqsSourceConfig;
use super::{CALL_TIMEOUT, CallError, LazyClient, MAX_BATCH, classify, timed_out};
use crate::connect::{Capabilities, Context, Source, SourceError, SourceMessage};

/// Reads open at once: while one read's messages are made durable in the
/// topic, the next ones are received (a receive is at most 10 messages).
const READS_IN_FLIGHT: usize = 8;
/// How long a long poll's answer may take beyond its wait.
const POLL_GRACE: Duration = Duration::from_secs(5);
/// The most deletes kept for a retry: beyond this, the oldest are given up
/// (logged): those messages come back and collapse in the duplicate
/// window.
const MAX_UNDELETED: usize = 10_000;
/// The pause before trying a failed visibility extension again.
const EXTEND_RETRY: Duration = Duration::from_millis(500);

/// A received message not yet deleted.
#[derive(Debug, Clone)]
struct Handle {
    message_id: String,
    receipt: String,
    /// When it was received: past the visibility timeout, its receipt
    /// handle no longer deletes it.
    received: Instant,
}

/// One read not yet acknowledged.
struct Read {
    handles: Vec<Handle>,
    /// The task extending its visibility.
    extender: JoinHandle<()>,
}

/// A consumer of one SQS queue.
pub struct SqsSource {
    client: Arc<LazyClient>,
    label: String,
    fifo: bool,
    batch: usize,
    wait_time: Duration,
    visibility: Duration,
    /// The reads not yet acknowledged, oldest first.
    reads: VecDeque<Read>,
    /// Deletes that failed, retried on the next read or ack.
    undeleted: Vec<Handle>,
}

impl SqsSource {
    /// The source of `config`, not connected.
    pub(crate) fn new(config: &SqsSourceConfig, ctx: &Context) -> Self {
        Self::with(config, ctx, LazyClient::new(config.target()))
    }

    fn with(config: &SqsSourceConfig, ctx: &Context, client: LazyClient) -> Self {
        SqsSource {
            fifo: client.target().fifo(),
            client: Arc::new(client),
            label: ctx.label(),
            batch: usize::try_from(config.batch.get())
                .unwrap_or(MAX_BATCH)
                .clamp(1, MAX_BATCH),
            wait_time: config.wait_time.get(),
            visibility: config.visibility_timeout.get(),
            reads: VecDeque::new(),
            undeleted: Vec::new(),
        }
    }

    fn queue_url(&self) -> &str {
        &self.client.target().queue_url
    }

    fn unavailable(err: &CallError) -> SourceError {
        SourceError::Unavailable(err.text().to_owned())
    }

    /// One `ReceiveMessage`.
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Message>, CallError> {
        let client = self.client.get().await;
        let wait_secs = i32::try_from(wait.as_secs()).unwrap_or(20);
        let mut request = client
            .receive_message()
            .queue_url(self.queue_url())
            .max_number_of_messages(i32::try_from(max).unwrap_or(10))
            .wait_time_seconds(wait_secs)
            .visibility_timeout(secs_i32(self.visibility))
            .message_attribute_names("All");
        if self.fifo {
            request =
                request.message_system_attribute_names(MessageSystemAttributeName::MessageGroupId);
        }
        let limit = wait + POLL_GRACE;
        match tokio::time::timeout(limit, request.send()).await {
            Ok(Ok(out)) => Ok(out.messages.unwrap_or_default()),
            Ok(Err(err)) => Err(classify(self.queue_url(), "ReceiveMessage", &err)),
            Err(_) => Err(timed_out(self.queue_url(), "ReceiveMessage", limit)),
        }
    }

    /// Deletes `handles` (with those still waiting from earlier failures),
    /// ten per call. Entries SQS fails are kept for the next try; an
    /// unreachable SQS fails the whole call (and keeps them all).
    async fn delete(&mut self, handles: Vec<Handle>) -> Result<(), CallError> {
        let mut todo = std::mem::take(&mut self.undeleted);
        todo.extend(handles);
        let mut result = Ok(());
        let mut chunks = todo.chunks(MAX_BATCH);
        for chunk in chunks.by_ref() {
            match self.delete_chunk(chunk).await {
                Ok(failed) => self.undeleted.extend(failed),
                Err(err) => {
                    self.undeleted.extend_from_slice(chunk);
                    result = Err(err);
                    break;
                }
            }
        }
        for chunk in chunks {
            self.undeleted.extend_from_slice(chunk);
        }
        // Handles past their visibility timeout no longer delete anything:
        // their messages are visible again, will be received again, and
        // collapse in the duplicate window.
        let visibility = self.visibility;
        let before = self.undeleted.len();
        self.undeleted.retain(|h| h.received.elapsed() < visibility);
        if self.undeleted.len() < before {
            tracing::warn!(source = %self.label, count = before - self.undeleted.len(), "deletes that kept failing until the messages' visibility ran out: they come back and collapse in the topic's duplicate window");
        }
        if self.undeleted.len() > MAX_UNDELETED {
            let excess = self.undeleted.len() - MAX_UNDELETED;
            self.undeleted.drain(..excess);
            tracing::warn!(source = %self.label, count = excess, "too many deletes waiting for a retry; the oldest are given up (their messages come back and collapse in the duplicate window)");
        }
        result
    }

    /// One `DeleteMessageBatch`; returns the entries that failed for a
    /// reason a retry may fix.
    async fn delete_chunk(&self, chunk: &[Handle]) -> Result<Vec<Handle>, CallError> {
        let entries = chunk
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(&h.receipt)
                    .build()
                    .ok()
            })
            .collect::<Vec<_>>();
        let client = self.client.get().await;
        let call = client
            .delete_message_batch()
            .queue_url(self.queue_url())
            .set_entries(Some(entries))
            .send();
        let out = match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(out)) => out,
            Ok(Err(err)) => return Err(classify(self.queue_url(), "DeleteMessageBatch", &err)),
            Err(_) => {
                return Err(timed_out(
                    self.queue_url(),
                    "DeleteMessageBatch",
                    CALL_TIMEOUT,
                ));
            }
        };
        let mut retry = Vec::new();
        for failed in out.failed() {
            let Some(handle) = failed.id().parse::<usize>().ok().and_then(|i| chunk.get(i)) else {
                continue;
            };
            if failed.code() == "ReceiptHandleIsInvalid" {
                tracing::warn!(source = %self.label, message_id = %handle.message_id, "its receipt handle is no longer valid (its visibility ran out); the message comes back and collapses in the topic's duplicate window");
            } else {
                tracing::warn!(source = %self.label, message_id = %handle.message_id, code = failed.code(), error = failed.message().unwrap_or(""), "deleting a published message failed; retried");
                retry.push(handle.clone());
            }
        }
        Ok(retry)
    }

    /// Turns a received message into a source message.
    fn to_message(&self, m: &Message) -> SourceMessage {
        let id = m.message_id().unwrap_or_default().to_owned();
        let mut message = SourceMessage::new(id, m.body().unwrap_or_default().as_bytes().to_vec());
        if self.fifo {
            message.key = m
                .attributes()
                .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                .cloned();
        }
        let mut attributes: Vec<(String, String)> = m
            .message_attributes()
            .map(|attrs| {
                attrs
                    .iter()
                    .map(|(name, value)| {
                        let text = match (value.string_value(), value.binary_value()) {
                            (Some(s), _) => s.to_owned(),
                            (None, Some(b)) => {
                                base64::engine::general_purpose::STANDARD.encode(b.as_ref())
                            }
                            (None, None) => String::new(),
                        };
                        (name.clone(), text)
                    })
                    .collect()
            })
            .unwrap_or_default();
        // Attributes come as a map: a stable order for the headers.
        attributes.sort();
        message.headers = attributes;
        if m.message_id().is_none() || m.receipt_handle().is_none() {
            message.problem =
                Some("SQS returned a message without a MessageId or receipt handle".into());
        }
        message
    }
}

/// `d` in whole seconds, as SQS takes it.
fn secs_i32(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

/// Extends the visibility of `handles` to `visibility` every half of it,
/// until aborted (the read is acknowledged or released) or none is left.
async fn extend(
    client: Arc<LazyClient>,
    label: String,
    mut handles: Vec<Handle>,
    visibility: Duration,
) {
    // Half the timeout (at least 500 ms: it is whole seconds), so an
    // extension lands well before the messages would reappear.
    let every = visibility / 2;
    let mut pause = every;
    let mut warned = false;
    loop {
        tokio::time::sleep(pause).await;
        let queue_url = client.target().queue_url.clone();
        let entries = handles
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                ChangeMessageVisibilityBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(&h.receipt)
                    .visibility_timeout(secs_i32(visibility))
                    .build()
                    .ok()
            })
            .collect::<Vec<_>>();
        let call = client
            .get()
            .await
            .change_message_visibility_batch()
            .queue_url(&queue_url)
            .set_entries(Some(entries))
            .send();
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(out)) => {
                pause = every;
                let mut gone = Vec::new();
                for failed in out.failed() {
                    if let Ok(i) = failed.id().parse::<usize>()
                        && let Some(h) = handles.get(i)
                    {
                        tracing::warn!(source = %label, message_id = %h.message_id, code = failed.code(), error = failed.message().unwrap_or(""), "cannot extend the visibility of a message whose publish is held up; it may come back and would collapse in the topic's duplicate window");
                        gone.push(i);
                    }
                }
                gone.sort_unstable();
                for i in gone.into_iter().rev() {
                    handles.remove(i);
                }
                if handles.is_empty() {
                    return;
                }
                if warned {
                    tracing::info!(source = %label, "extending visibility works again");
                    warned = false;
                }
            }
            result => {
                if !warned {
                    let why = match result {
                        Ok(Err(err)) => classify(&queue_url, "ChangeMessageVisibilityBatch", &err),
                        _ => timed_out(&queue_url, "ChangeMessageVisibilityBatch", CALL_TIMEOUT),
                    };
                    tracing::warn!(source = %label, error = %why.text(), "cannot extend the visibility of messages whose publish is held up; retrying (should they come back meanwhile, they collapse in the topic's duplicate window)");
                    warned = true;
                }
                pause = EXTEND_RETRY;
            }
        }
    }
}

#[async_trait]
impl Source for SqsSource {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            per_message_ack: true,
            // A FIFO queue keeps each message group in order.
            ordered_by_key: self.fifo,
            lag: true,
        }
    }

    /// Messages are deleted by receipt handle, so reads need not wait for
    /// each other.
    fn reads_in_flight(&self) -> usize {
        READS_IN_FLIGHT
    }

    async fn read(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<SourceMessage>, SourceError> {
        if !self.undeleted.is_empty() {
            self.delete(Vec::new())
                .await
                .map_err(|e| Self::unavailable(&e))?;
        }
        let max = max.clamp(1, self.batch);
        let wait = if wait.is_zero() {
            Duration::ZERO
        } else {
            self.wait_time
        };
        let received = self
            .receive(max, wait)
            .await
            .map_err(|e| Self::unavailable(&e))?;
        if received.is_empty() {
            return Ok(Vec::new());
        }
        let now = Instant::now();
        let messages: Vec<SourceMessage> = received.iter().map(|m| self.to_message(m)).collect();
        let handles: Vec<Handle> = received
            .iter()
            .filter_map(|m| {
                Some(Handle {
                    message_id: m.message_id()?.to_owned(),
                    receipt: m.receipt_handle()?.to_owned(),
                    received: now,
                })
            })
            .collect();
        let extender = tokio::spawn(extend(
            self.client.clone(),
            self.label.clone(),
            handles.clone(),
            self.visibility,
        ));
        self.reads.push_back(Read { handles, extender });
        Ok(messages)
    }

    async fn ack(&mut self) -> Result<(), SourceError> {
        let Some(read) = self.reads.pop_front() else {
            return Ok(());
        };
        read.extender.abort();
        // On an error the handles wait in `undeleted` and are retried.
        self.delete(read.handles)
            .await
            .map_err(|e| Self::unavailable(&e))
    }

    async fn release(&mut self) {
        let mut handles = Vec::new();
        for read in self.reads.drain(..) {
            read.extender.abort();
            handles.extend(read.handles);
        }
        // Visible again at once rather than after the visibility timeout
        // (best effort: otherwise they come back when it runs out).
        let client = self.client.get().await;
        for chunk in handles.chunks(MAX_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .filter_map(|(i, h)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(&h.receipt)
                        .visibility_timeout(0)
                        .build()
                        .ok()
                })
                .collect::<Vec<_>>();
            let call = client
                .change_message_visibility_batch()
                .queue_url(self.queue_url())
                .set_entries(Some(entries))
                .send();
            if tokio::time::timeout(Duration::from_secs(2), call)
                .await
                .is_err()
            {
                break;
            }
        }
    }

    async fn lag(&mut self) -> Option<u64> {
        let client = self.client.get().await;
        let call = client
            .get_queue_attributes()
            .queue_url(self.queue_url())
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send();
        let out = tokio::time::timeout(CALL_TIMEOUT, call).await.ok()?.ok()?;
        out.attributes()?
            .get(&QueueAttributeName::ApproximateNumberOfMessages)?
            .parse()
            .ok()
    }
}

impl Drop for SqsSource {
    fn drop(&mut self) {
        for read in &self.reads {
            read.extender.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    //! The source against moto's SQS (a real server of the test's own):
    //! visibility extended while a read waits for its ack, deleted on ack,
    //! visible again at once on release.

    use std::sync::Arc;

    use aws_sdk_sqs::Client;
    use aws_sdk_sqs::types::QueueAttributeName;
    use sluice_harness::moto::{self, MotoServer};

    use super::*;
    use crate::connect::Health;
    use crate::metrics::Metrics;

    async fn client(server: &MotoServer) -> Client {
        let creds = aws_sdk_sqs::config::Credentials::new(
            moto::ACCESS_KEY_ID,
            moto::SECRET_ACCESS_KEY,
            None,
            None,
            "test",
        );
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_sdk_sqs::config::Region::new(moto::REGION))
            .credentials_provider(creds)
            .endpoint_url(server.endpoint())
            .load()
            .await;
        Client::new(&config)
    }

    async fn counts(client: &Client, url: &str) -> (u64, u64) {
        let out = client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .expect("GetQueueAttributes");
        let get = |name: QueueAttributeName| -> u64 {
            out.attributes()
                .and_then(|a| a.get(&name))
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX)
        };
        (
            get(QueueAttributeName::ApproximateNumberOfMessages),
            get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        )
    }

    #[tokio::test]
    async fn a_held_read_stays_invisible_until_acked_and_a_released_one_comes_back() {
        let server = MotoServer::start().expect("moto");
        let client = client(&server).await;
        let url = client
            .create_queue()
            .queue_name("held")
            .send()
            .await
            .expect("CreateQueue")
            .queue_url()
            .expect("url")
            .to_owned();
        for i in 0..3 {
            client
                .send_message()
                .queue_url(&url)
                .message_body(format!("m{i}"))
                .message_attributes(
                    "n",
                    aws_sdk_sqs::types::MessageAttributeValue::builder()
                        .data_type("Number")
                        .string_value(i.to_string())
                        .build()
                        .expect("attribute"),
                )
                .send()
                .await
                .expect("SendMessage");
        }
        let config: SqsSourceConfig = serde_saphyr::from_str(&format!(
            "queue_url: {url}\nwait_time: 1s\nvisibility_timeout: 2s\n"
        ))
        .expect("a source block");
        let ctx = Context {
            pipeline: "p".into(),
            name: "src".into(),
            metrics: Arc::new(Metrics::new()),
            health: Arc::new(Health::new()),
            data_dir: None,
        };
        let mut source = SqsSource::with(
            &config,
            &ctx,
            LazyClient::with_client(config.target(), client.clone()),
        );
        let read = source.read(10, Duration::from_secs(1)).await.expect("read");
        assert_eq!(read.len(), 3, "{read:?}");
        assert!(
            read.iter().all(|m| m.headers.iter().any(|(n, _)| n == "n")),
            "{read:?}"
        );
        // Held (its publish not durable yet) for well over the visibility
        // timeout: extended, so no other consumer gets it.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let other = client
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .send()
            .await
            .expect("ReceiveMessage");
        assert!(other.messages().is_empty(), "{:?}", other.messages());
        assert_eq!(counts(&client, &url).await, (0, 3));
        source.ack().await.expect("ack");
        assert_eq!(counts(&client, &url).await, (0, 0));
        assert_eq!(source.lag().await, Some(0));

        // Released (shutdown before the publish): visible again at once.
        client
            .send_message()
            .queue_url(&url)
            .message_body("again")
            .send()
            .await
            .expect("SendMessage");
        let read = source.read(10, Duration::from_secs(1)).await.expect("read");
        assert_eq!(read.len(), 1);
        source.release().await;
        let back = client
            .receive_message()
            .queue_url(&url)
            .send()
            .await
            .expect("ReceiveMessage");
        assert_eq!(back.messages().len(), 1);
        assert_eq!(
            back.messages()[0].message_id(),
            Some(read[0].upstream_id.as_str())
        );
    }
}
