#!/usr/bin/env python3
"""An outside NATS client, in Python with nats-py only, producing into a
Sluice pipeline and reading its outputs: nothing Sluice-specific but the
subject names.

    nats_interop.py NATS_URL IN_SUBJECT OUT_SUBJECT N

Run by runtime/tests/nats_interop.rs against a daemon whose pipeline reads
IN_SUBJECT and writes OUT_SUBJECT. It publishes N messages with JetStream
(payload `hello <i>`, header `x-py: <i>`):

* even i carry `Nats-Msg-Id: py-<i>` (the id Sluice gives the message);
  odd i carry none (Sluice then names it by its stream position);
* every third one carries `Sluice-Key: k<i % 5>` (its ordering key);
* then `py-0` is published again, which the stream must drop as a
  duplicate;
* then one plain core-NATS message without any header (`plain core`).

Then it reads OUT_SUBJECT with an ordered JetStream consumer from the
first message until N + 1 outputs came (or 120 s passed), and keeps
listening 2 s more so that an extra output would be seen too.

It prints one JSON object per line on stdout: {"published": ...} per
publish with the PubAck's seq and duplicate flag, then {"output": ...} per
output with its subject, headers and payload. Judging is the Rust test's
job; this script exits non-zero only when it cannot do its part.
"""

import asyncio
import json
import sys
import time

import nats
from nats.js.api import DeliverPolicy


def emit(obj):
    print(json.dumps(obj), flush=True)


async def main(url, in_subject, out_subject, n):
    nc = await nats.connect(url, name="sluice-interop-py")
    js = nc.jetstream()

    for i in range(n):
        headers = {"x-py": str(i)}
        msg_id = None
        if i % 2 == 0:
            msg_id = f"py-{i}"
            headers["Nats-Msg-Id"] = msg_id
        if i % 3 == 0:
            headers["Sluice-Key"] = f"k{i % 5}"
        ack = await js.publish(in_subject, f"hello {i}".encode(), headers=headers)
        emit({"published": i, "id": msg_id, "seq": ack.seq, "duplicate": bool(ack.duplicate)})

    again = await js.publish(in_subject, b"hello 0", headers={"Nats-Msg-Id": "py-0", "x-py": "0"})
    emit({"published": "again", "id": "py-0", "seq": again.seq, "duplicate": bool(again.duplicate)})

    await nc.publish(in_subject, b"plain core")
    await nc.flush()
    emit({"published": "core", "id": None, "seq": None, "duplicate": False})

    sub = await js.subscribe(out_subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
    expected = n + 1
    got = 0
    deadline = time.monotonic() + 120
    grace = None
    while True:
        now = time.monotonic()
        if got >= expected and grace is None:
            grace = now + 2
        end = grace if grace is not None else deadline
        if now >= end:
            break
        try:
            msg = await sub.next_msg(timeout=min(1.0, end - now))
        except nats.errors.TimeoutError:
            continue
        got += 1
        emit(
            {
                "output": {
                    "subject": msg.subject,
                    "headers": dict(msg.headers or {}),
                    "payload": msg.data.decode("utf-8", "replace"),
                }
            }
        )
    await sub.unsubscribe()
    await nc.close()


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
