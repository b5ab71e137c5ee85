// Example handler: content-based routing of JSON messages (JavaScript).
//
// The payload must be a JSON object. The handler reads one string field from
// it and picks the output topic from that value; the message is emitted
// unchanged (same payload, key and headers) to that topic. Every topic it can
// choose must be declared under the stage's `publish:`, or the message is
// dead-lettered as `undeclared-topic`.
//
// Config keys:
//
// * `field` (default `type`): the top-level field to route on.
// * `route.<value>`: the topic for messages whose field equals `<value>`.
// * `topic_prefix` (default empty): for a value with no `route.<value>`, the
//   topic is `topic_prefix` followed by the value.
//
// Rejects (dead-letters at once) a payload that is not a JSON object, and one
// whose field is missing or not a string.

import { Emit, Reject, config, handler, log } from "./sluice.js";

export const messageHandler = handler((msg) => {
  const doc = msg.json();
  const field = config("field", "type");
  if (doc === null || typeof doc !== "object" || !(field in doc)) {
    throw new Reject(`field \`${field}\` is missing`);
  }
  const value = doc[field];
  if (typeof value !== "string") throw new Reject(`field \`${field}\` is not a string`);
  const topic = config(`route.${value}`) ?? config("topic_prefix", "") + value;
  log.debug(`routing message ${msg.id} to \`${topic}\``);
  return new Emit(msg.payload, { topic });
});
