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
