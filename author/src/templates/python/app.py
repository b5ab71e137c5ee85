"""{{name}}: a Sluice handler. It upper-cases text, rejects what it can never
handle and asks for a retry of what it cannot handle yet. Replace it with
yours; `cases.yaml` says what it should do.
"""

import sluice


def handle(msg: sluice.Message):
    # Rejects a payload that is not UTF-8: dead-lettered now, as `rejected`.
    text = msg.text()
    if not text.strip():
        raise sluice.Reject("empty payload")
    if text.startswith("later"):
        # Transient: delivered again after the stage's backoff, and
        # dead-lettered as `retry` once `max_attempts` is spent.
        raise sluice.Retry()
    # One output to the stage's default output (its first `publish:` topic),
    # with the input's key and headers.
    return text.upper()


MessageHandler = sluice.handler(handle)

# What a stage can grant a handler (contract 0.2.0, `wit/v0.2/plugin.wit`),
# each only when its YAML says so; `sluice plugin build` imports only those
# this code names, and a stage refuses a handler that imports one it does
# not grant. `sluice.py` documents each.
#
# - `state: true`: a key-value store whose writes commit with the message's
#   outputs and ack, so a counter counts each message exactly once:
#       n = sluice.state.increment(f"seen/{msg.key}")          # 1, 2, ...
#       sluice.state.set(f"last/{msg.key}", text, ttl=3600)     # expires in an hour
#       last = sluice.state.get_text(f"last/{msg.key}")         # or None
#       locked = sluice.state.compare_and_set("lock/x", 0, msg.id, ttl=30)
# - `http: {allow: [api.example.com]}`: outbound requests to listed hosts,
#   each with an `Idempotency-Key` that a redelivery repeats:
#       answer = sluice.http.post("https://api.example.com/v1/items", json={"text": text})
#       if not answer.ok:
#           raise sluice.Retry()
# - `secrets: [api_key]`: a secret of the pipeline's `secrets:` block:
#       key = sluice.secrets.get("api_key")
#
# An error of these the handler does not catch retries the message (a store
# unavailable or full, a request that timed out or failed) or rejects it (a
# missing grant, a refused host). A handler that uses none of them needs
# none of them granted.
