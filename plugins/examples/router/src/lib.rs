//! Example handler: content-based routing of JSON messages.
//!
//! The payload must be a JSON object. The handler reads one string field from
//! it and picks the output topic from that value; the message is emitted
//! unchanged (same payload, key and headers) to that topic. Every topic it can
//! choose must be declared under the stage's `publish:`, or the message is
//! dead-lettered as `undeclared-topic`.
//!
//! Config keys:
//!
//! * `field` (default `type`): the name of the top-level field to route on.
//! * `route.<value>`: the topic for messages whose field equals `<value>`,
//!   e.g. `route.order: orders`.
//! * `topic_prefix` (default empty): for a value with no `route.<value>`,
//!   the topic is `topic_prefix` followed by the value.
//!
//! Rejects (dead-letters at once) a payload that is not JSON, and one whose
//! field is missing or not a string.

use sluice_sdk::{Emit, HandlerError, Message, Outcome};

fn handle(msg: Message) -> Outcome {
    let doc: serde_json::Value = msg.json()?;
    let field = sluice_sdk::config_or("field", "type");
    let value = match doc.get(&field) {
        Some(serde_json::Value::String(value)) => value,
        Some(_) => {
            return Err(HandlerError::reject(format_args!(
                "field `{field}` is not a string"
            )));
        }
        None => {
            return Err(HandlerError::reject(format_args!(
                "field `{field}` is missing"
            )));
        }
    };
    let topic = sluice_sdk::config(&format!("route.{value}"))
        .unwrap_or_else(|| sluice_sdk::config_or("topic_prefix", "") + value);
    sluice_sdk::log::debug(&format!("routing message {} to `{topic}`", msg.id));
    Ok(vec![
        Emit::new(topic, msg.payload)
            .with_key(msg.key)
            .with_headers(msg.headers),
    ])
}

sluice_sdk::export_handler!(handle);
