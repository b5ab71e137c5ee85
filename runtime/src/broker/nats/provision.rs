//! Creates a topic's stream and a stage's consumer, idempotently, and puts
//! drifted settings back: several daemons start with the same pipelines,
//! and an operator who changes `ack_wait` in YAML expects it to take.
//! What the server cannot change in place (a stream's retention, a
//! consumer's ack policy) is refused with what to do about it.

use std::time::Duration;

use async_nats::jetstream::{
    self,
    consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull},
    stream::{self, RetentionPolicy, StorageType, Stream},
};

use super::{DEAD_LETTER_HEADROOM, NatsOptions, naming};
use crate::broker::{BrokerError, ConsumerSpec, TopicSpec};

/// Whether a server of `version` (`2.15.1`) has message schedules
/// (nats-server 2.12 and later), which delayed messages need.
pub(super) fn schedules_supported(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (2, 12),
        _ => false,
    }
}

/// The stream config `spec` asks for, on a server whose max_payload is
/// `max_payload` (0: unknown). With `schedules` (the server has them), the
/// stream also holds the topic's delayed messages, as schedules under
/// [`naming::delay_subjects`] that the server publishes to the topic when
/// they are due.
fn wanted_stream(
    options: &NatsOptions,
    spec: &TopicSpec,
    max_payload: usize,
    schedules: bool,
) -> stream::Config {
    let max_age = spec.retention.unwrap_or(Duration::ZERO);
    let mut duplicate_window = spec
        .duplicate_window
        .unwrap_or(options.duplicate_window)
        .max(options.duplicate_window);
    if !max_age.is_zero() {
        // JetStream refuses a window longer than the stream keeps messages.
        duplicate_window = duplicate_window.min(max_age);
    }
    stream::Config {
        name: naming::stream_name(&spec.name),
        description: Some(format!("Sluice topic `{}`", spec.name)),
        subjects: if schedules {
            vec![spec.name.clone(), naming::delay_subjects(&spec.name)]
        } else {
            vec![spec.name.clone()]
        },
        allow_message_schedules: schedules,
        retention: if spec.subscribed {
            RetentionPolicy::Interest
        } else {
            RetentionPolicy::Limits
        },
        max_age,
        duplicate_window,
        num_replicas: options.replicas,
        storage: StorageType::File,
        allow_direct: true,
        max_message_size: max_message_size(spec, max_payload),
        ..Default::default()
    }
}

/// The largest message a topic's stream takes (headers and body, as the
/// server counts them), -1 for no limit of its own.
///
/// A stage's source must leave [`DEAD_LETTER_HEADROOM`] free under the
/// server's max_payload, so that the message's dead letter, which adds
/// provenance headers, can always be published. Sluice's own publishes
/// are checked against that before they are sent; the stream's limit
/// makes the server hold an outside producer to it too, with an error on
/// its publish, rather than take a message that could never be
/// dead-lettered. Topics no stage reads (outputs) and DLQs, read by a
/// stage or not, take up to the server's max_payload.
fn max_message_size(spec: &TopicSpec, max_payload: usize) -> i32 {
    match max_payload.checked_sub(DEAD_LETTER_HEADROOM) {
        Some(limit) if spec.subscribed && !spec.dead_letters && limit > 0 => {
            i32::try_from(limit).unwrap_or(-1)
        }
        _ => -1,
    }
}

/// Ensures the stream of `spec` exists with the settings Sluice needs.
pub(super) async fn stream(
    js: &jetstream::Context,
    options: &NatsOptions,
    spec: &TopicSpec,
    max_payload: usize,
    schedules: bool,
) -> Result<Stream, BrokerError> {
    if !naming::valid_subject(&spec.name) {
        return Err(BrokerError::Provision(format!(
            "topic `{}` is not a valid NATS subject (dot-separated tokens, none empty)",
            spec.name
        )));
    }
    let want = wanted_stream(options, spec, max_payload, schedules);
    let name = want.name.clone();
    let refused = |what: &str, err: &dyn std::fmt::Display| {
        BrokerError::Provision(format!(
            "{what} stream `{name}` for topic `{}`: {err}",
            spec.name
        ))
    };
    let existing = match js.get_stream(&name).await {
        Ok(stream) => stream,
        Err(err) if is_not_found(&err) => match js.create_stream(want.clone()).await {
            Ok(stream) => {
                tracing::info!(stream = %name, topic = %spec.name, retention = ?want.retention, replicas = want.num_replicas, "created stream");
                return Ok(stream);
            }
            // Another daemon created it first; check what it made.
            Err(_) => js
                .get_stream(&name)
                .await
                .map_err(|e| refused("cannot create", &e))?,
        },
        Err(err) => return Err(refused("cannot look up", &err)),
    };
    let have = existing.cached_info().config.clone();
    // The topic, and its delay subjects unless the stream was made before
    // delays (it gains them below); anything else is not Sluice's stream
    // for this topic.
    let ours = [spec.name.clone(), naming::delay_subjects(&spec.name)];
    let known =
        have.subjects.first() == Some(&spec.name) && have.subjects.iter().all(|s| ours.contains(s));
    if !known {
        return Err(BrokerError::Provision(format!(
            "stream `{name}` already exists for subjects {:?}, not topic `{}`: two topics whose names differ only in `.` and `_` cannot share a NATS server, and a stream Sluice did not create is never taken over",
            have.subjects, spec.name
        )));
    }
    if have.retention != want.retention {
        return Err(BrokerError::Provision(format!(
            "stream `{name}` has {:?} retention but topic `{}` needs {:?} ({}); JetStream cannot change retention in place: drain the topic, then delete the stream (`nats stream rm {name}`) and restart so Sluice recreates it",
            have.retention,
            spec.name,
            want.retention,
            if spec.subscribed {
                "a stage subscribes to it, so a message must go once every stage has acked it"
            } else {
                "no stage subscribes to it, so messages are kept by age for readers"
            }
        )));
    }
    let mut changes = Vec::new();
    let mut update = have.clone();
    if have.subjects.len() < want.subjects.len() {
        put_back(
            &mut changes,
            "subjects",
            &mut update.subjects,
            &want.subjects,
        );
    }
    // Schedules cannot be turned off once on; a stream that has them keeps
    // them (on a server downgraded below 2.12 it would not open anyway).
    if want.allow_message_schedules {
        put_back(
            &mut changes,
            "allow_msg_schedules",
            &mut update.allow_message_schedules,
            &true,
        );
    }
    put_back(&mut changes, "max_age", &mut update.max_age, &want.max_age);
    put_back(
        &mut changes,
        "duplicate_window",
        &mut update.duplicate_window,
        &want.duplicate_window,
    );
    put_back(
        &mut changes,
        "replicas",
        &mut update.num_replicas,
        &want.num_replicas,
    );
    put_back(
        &mut changes,
        "allow_direct",
        &mut update.allow_direct,
        &want.allow_direct,
    );
    put_back(
        &mut changes,
        "max_msg_size",
        &mut update.max_message_size,
        &want.max_message_size,
    );
    if changes.is_empty() {
        return Ok(existing);
    }
    js.update_stream(update)
        .await
        .map_err(|e| refused(&format!("cannot update ({})", changes.join(", ")), &e))?;
    tracing::info!(stream = %name, changes = %changes.join(", "), "updated drifted stream settings");
    js.get_stream(&name)
        .await
        .map_err(|e| refused("cannot look up", &e))
}

/// Ensures the consumer that keeps a subscribed topic's schedules stored
/// ([`naming::DELAY_KEEPER`]): on an interest stream JetStream drops at
/// once a message no consumer is interested in, and every stage reads the
/// topic's own subject only. It is never read; the server deletes each
/// schedule itself once it has published the message.
pub(super) async fn delay_keeper(stream: &Stream, spec: &TopicSpec) -> Result<(), BrokerError> {
    let want = pull::Config {
        durable_name: Some(naming::DELAY_KEEPER.to_owned()),
        description: Some(format!(
            "Sluice: keeps the delayed messages of topic `{}` until they are due (never read)",
            spec.name
        )),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        filter_subject: naming::delay_subjects(&spec.name),
        ..Default::default()
    };
    match stream
        .get_consumer::<pull::Config>(naming::DELAY_KEEPER)
        .await
    {
        Ok(_) => Ok(()),
        Err(_) => stream.create_consumer(want).await.map(|_| ()).map_err(|e| {
            BrokerError::Provision(format!(
                "cannot create consumer `{}` that keeps the delayed messages of topic `{}`: {e}",
                naming::DELAY_KEEPER,
                spec.name
            ))
        }),
    }
}

/// The consumer config `spec` asks for.
fn wanted_consumer(spec: &ConsumerSpec) -> pull::Config {
    pull::Config {
        durable_name: Some(naming::durable_name(&spec.name)),
        description: Some(consumer_description(&spec.name)),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: spec.ack_wait,
        max_deliver: spec.max_deliver.map_or(-1, i64::from),
        filter_subject: spec.topic.clone(),
        max_ack_pending: spec.max_ack_pending.map_or(-1, i64::from),
        ..Default::default()
    }
}

fn consumer_description(name: &str) -> String {
    format!("Sluice stage `{name}`")
}

/// Ensures the durable consumer of `spec` exists with the stage's settings.
pub(super) async fn consumer(
    stream: &Stream,
    spec: &ConsumerSpec,
) -> Result<PullConsumer, BrokerError> {
    let want = wanted_consumer(spec);
    let durable = naming::durable_name(&spec.name);
    let refused = |what: &str, err: &dyn std::fmt::Display| {
        BrokerError::Provision(format!(
            "{what} consumer `{durable}` for stage `{}`: {err}",
            spec.name
        ))
    };
    let existing: PullConsumer = match stream.get_consumer(&durable).await {
        Ok(consumer) => consumer,
        Err(err) if err.to_string().to_ascii_lowercase().contains("not found") => {
            match stream.create_consumer(want.clone()).await {
                Ok(consumer) => {
                    tracing::info!(consumer = %durable, stage = %spec.name, "created consumer");
                    return Ok(consumer);
                }
                Err(_) => stream
                    .get_consumer(&durable)
                    .await
                    .map_err(|e| refused("cannot create", &e))?,
            }
        }
        Err(err) => return Err(refused("cannot look up", &err)),
    };
    let have = existing.cached_info().config.clone();
    if have.description != want.description {
        return Err(refused(
            "cannot use",
            &format!(
                "it belongs to {:?}; stage names that differ only in `.` and `_` cannot share a topic",
                have.description.unwrap_or_default()
            ),
        ));
    }
    if have.ack_policy != AckPolicy::Explicit || have.deliver_policy != DeliverPolicy::All {
        return Err(refused(
            "cannot use",
            &"its ack or deliver policy was changed by hand; delete it and restart",
        ));
    }
    let mut update = pull::Config {
        durable_name: have.durable_name.clone(),
        name: have.name.clone(),
        description: have.description.clone(),
        deliver_policy: have.deliver_policy,
        ack_policy: have.ack_policy,
        ack_wait: have.ack_wait,
        max_deliver: have.max_deliver,
        filter_subject: have.filter_subject.clone(),
        filter_subjects: have.filter_subjects.clone(),
        max_ack_pending: have.max_ack_pending,
        max_waiting: have.max_waiting,
        // An operator's pause outlives a restart with new settings.
        pause_until: have.pause_until,
        ..Default::default()
    };
    let mut changes = Vec::new();
    put_back(
        &mut changes,
        "ack_wait",
        &mut update.ack_wait,
        &want.ack_wait,
    );
    put_back(
        &mut changes,
        "max_deliver",
        &mut update.max_deliver,
        &want.max_deliver,
    );
    put_back(
        &mut changes,
        "max_ack_pending",
        &mut update.max_ack_pending,
        &want.max_ack_pending,
    );
    if have.filter_subject != want.filter_subject || !have.filter_subjects.is_empty() {
        changes.push(format!(
            "filter_subject {:?} -> {:?}",
            have.filter_subject, want.filter_subject
        ));
        update.filter_subject = want.filter_subject.clone();
        update.filter_subjects = Vec::new();
    }
    if changes.is_empty() {
        return Ok(existing);
    }
    stream
        .update_consumer(update)
        .await
        .map_err(|e| refused(&format!("cannot update ({})", changes.join(", ")), &e))?;
    tracing::info!(consumer = %durable, changes = %changes.join(", "), "updated drifted consumer settings");
    stream
        .get_consumer(&durable)
        .await
        .map_err(|e| refused("cannot look up", &e))
}

/// Puts a drifted setting back: `field` (the server's value, in the
/// update being built) becomes `want`, and the change is noted for the log.
fn put_back<T: PartialEq + Clone + std::fmt::Debug>(
    changes: &mut Vec<String>,
    name: &str,
    field: &mut T,
    want: &T,
) {
    if field != want {
        changes.push(format!("{name} {field:?} -> {want:?}"));
        field.clone_from(want);
    }
}

fn is_not_found(err: &jetstream::context::GetStreamError) -> bool {
    matches!(
        err.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(e)
            if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_need_nats_server_2_12() {
        assert!(schedules_supported("2.15.1"));
        assert!(schedules_supported("v2.12.0-RC.1"));
        assert!(schedules_supported("3.0.0"));
        assert!(!schedules_supported("2.11.9"));
        assert!(!schedules_supported("2.9.25"));
        assert!(!schedules_supported("garbage"));
    }

    #[test]
    fn only_a_stage_source_that_is_not_a_dlq_keeps_the_headroom_free() {
        let max = 1 << 20;
        let limit = i32::try_from(max - DEAD_LETTER_HEADROOM).expect("fits");
        let spec = |subscribed, dead_letters| TopicSpec {
            subscribed,
            dead_letters,
            ..TopicSpec::new("t")
        };
        assert_eq!(max_message_size(&spec(true, false), max), limit);
        assert_eq!(max_message_size(&spec(false, false), max), -1);
        assert_eq!(max_message_size(&spec(true, true), max), -1);
        assert_eq!(max_message_size(&spec(false, true), max), -1);
        // A server that did not say (0), or one too small to keep any.
        assert_eq!(max_message_size(&spec(true, false), 0), -1);
        assert_eq!(
            max_message_size(&spec(true, false), DEAD_LETTER_HEADROOM),
            -1
        );
    }
}
