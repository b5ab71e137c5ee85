//! Puts completions (outputs published, then the delivery acked) on the
//! wire in groups.
//!
//! Every stage task completes its own deliveries, one at a time, so left to
//! themselves their publishes and acks reach the connection one by one: a
//! write (and a server wake-up) per message. The batcher takes every
//! completion queued while it worked on the last group, sends all their
//! publishes back to back, and, in a task of its own so the next group goes
//! out meanwhile, awaits the group's PubAcks and then sends each ack. The
//! order per delivery is unchanged: its outputs are durable before its ack.

use async_nats::jetstream::{self, AckKind, context::PublishAckFuture};
use bytes::Bytes;
use futures_util::future::join_all;
use tokio::sync::{mpsc, oneshot};

use super::{codec, publish_error, unavailable};
use crate::broker::{BrokerError, Message};

/// The most completions sent as one group.
const MAX_GROUP: usize = 256;

/// One delivery's completion: publish `outputs`, then send `then` to `handle`.
struct Queued {
    outputs: Vec<Message>,
    handle: String,
    then: AckKind,
    done: oneshot::Sender<Result<(), BrokerError>>,
}

/// The sending side; cheap to share.
pub(super) struct Batcher {
    queue: mpsc::UnboundedSender<Queued>,
}

impl Batcher {
    /// Starts the group loop on the current runtime.
    pub(super) fn start(js: jetstream::Context, client: async_nats::Client) -> Batcher {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(js, client, rx));
        Batcher { queue }
    }

    /// Publishes `outputs`, waits until each is stored, then sends `then`
    /// to the delivery's reply subject `handle`.
    pub(super) async fn publish_then_ack(
        &self,
        outputs: Vec<Message>,
        handle: String,
        then: AckKind,
    ) -> Result<(), BrokerError> {
        let (done, result) = oneshot::channel();
        let gone = || BrokerError::Unavailable("the NATS broker is shutting down".into());
        self.queue
            .send(Queued {
                outputs,
                handle,
                then,
                done,
            })
            .map_err(|_| gone())?;
        result.await.map_err(|_| gone())?
    }
}

/// A completion whose publishes are on their way.
struct Sent {
    handle: String,
    then: AckKind,
    done: oneshot::Sender<Result<(), BrokerError>>,
    acks: Vec<(String, PublishAckFuture)>,
    failed: Option<BrokerError>,
}

async fn run(
    js: jetstream::Context,
    client: async_nats::Client,
    mut rx: mpsc::UnboundedReceiver<Queued>,
) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while rx.recv_many(&mut group, MAX_GROUP).await > 0 {
        linger(&mut rx, &mut group).await;
        let mut sent = Vec::with_capacity(group.len());
        for completion in group.drain(..) {
            let mut acks = Vec::with_capacity(completion.outputs.len());
            let mut failed = None;
            for message in completion.outputs {
                let headers = codec::headers(&message);
                match js
                    .publish_with_headers(message.topic.clone(), headers, message.payload)
                    .await
                {
                    Ok(ack) => acks.push((message.topic, ack)),
                    Err(err) => {
                        failed = Some(publish_error(&message.topic, &err));
                        break;
                    }
                }
            }
            sent.push(Sent {
                handle: completion.handle,
                then: completion.then,
                done: completion.done,
                acks,
                failed,
            });
        }
        tokio::spawn(finish(client.clone(), sent));
    }
}

/// Scheduler turns a group waits for company before it is sent.
const LINGER_TURNS: usize = 2;

/// Lets completions finishing at about the same time join `group`: it yields
/// the thread [`LINGER_TURNS`] times, taking whatever was queued meanwhile.
///
/// Without it the group loop, woken on one thread by the first completion,
/// sends it alone while the stage's other workers finish on the other: in
/// the benchmark 20,000 completions went out in ~18,500 groups, each a
/// socket write and a server wake-up of its own. A yield costs
/// microseconds and no timer, and when nothing else is runnable it returns
/// at once, so a quiet stage pays nothing in latency.
async fn linger(rx: &mut mpsc::UnboundedReceiver<Queued>, group: &mut Vec<Queued>) {
    for _ in 0..LINGER_TURNS {
        if group.len() >= MAX_GROUP {
            return;
        }
        tokio::task::yield_now().await;
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(completion) => group.push(completion),
                Err(_) => break,
            }
        }
    }
}

/// Awaits the group's PubAcks, then sends each completion's ack (or reports
/// why not).
///
/// All of the group's PubAcks are awaited at once: each await starts its
/// own timeout (the JetStream context's), so awaiting them one by one
/// after a lost connection took a timeout per message: a group of 200
/// whose PubAcks died with a server took 200 x 5 s to report.
async fn finish(client: async_nats::Client, mut sent: Vec<Sent>) {
    let outcomes = join_all(sent.iter_mut().map(|one| {
        let acks = std::mem::take(&mut one.acks);
        async move {
            join_all(acks.into_iter().map(|(topic, ack)| async move {
                ack.await.map_err(|err| publish_error(&topic, &err))
            }))
            .await
            .into_iter()
            .find_map(Result::err)
        }
    }))
    .await;
    for (one, failed) in sent.into_iter().zip(outcomes) {
        let mut result = match one.failed.or(failed) {
            Some(err) => Err(err),
            None => Ok(()),
        };
        if result.is_ok() {
            result = client
                .publish(one.handle, Bytes::from(one.then))
                .await
                .map_err(|e| unavailable(&e));
        }
        let _ = one.done.send(result);
    }
}
