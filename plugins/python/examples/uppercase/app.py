"""Example handler: upper-cases a text payload (Python).

Each payload must be UTF-8 text; it is upper-cased and emitted to the stage's
default output with the input's key and headers. A payload that is not UTF-8
is rejected: it goes to the dead-letter stream at once, with the reason.

Config keys: none.
"""

import sluice


def handle(msg: sluice.Message):
    return msg.text().upper()


MessageHandler = sluice.handler(handle)
