"""Example handler: content-based routing of JSON messages (Python).

The payload must be a JSON object. The handler reads one string field from it
and picks the output topic from that value; the message is emitted unchanged
(same payload, key and headers) to that topic. Every topic it can choose must
be declared under the stage's `publish:`, or the message is dead-lettered as
`undeclared-topic`.

Config keys:

* `field` (default `type`): the top-level field to route on.
* `route.<value>`: the topic for messages whose field equals `<value>`.
* `topic_prefix` (default empty): for a value with no `route.<value>`, the
  topic is `topic_prefix` followed by the value.

Rejects (dead-letters at once) a payload that is not a JSON object, and one
whose field is missing or not a string.
"""

import sluice


def handle(msg: sluice.Message):
    doc = msg.json()
    field = sluice.config("field", "type")
    if not isinstance(doc, dict) or field not in doc:
        raise sluice.Reject(f"field `{field}` is missing")
    value = doc[field]
    if not isinstance(value, str):
        raise sluice.Reject(f"field `{field}` is not a string")
    topic = sluice.config(f"route.{value}") or sluice.config("topic_prefix", "") + value
    sluice.log.debug(f"routing message {msg.id} to `{topic}`")
    return sluice.Emit(msg.payload, topic=topic)


MessageHandler = sluice.handler(handle)
