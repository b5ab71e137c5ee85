// {{name}}: a Sluice handler. It upper-cases text, rejects what it can never
// handle and asks for a retry of what it cannot handle yet. Replace it with
// yours; `cases.yaml` says what it should do.

import { Reject, Retry, handler } from "./sluice.js";

export const messageHandler = handler((msg) => {
  // Rejects a payload that is not UTF-8: dead-lettered now, as `rejected`.
  const text = msg.text();
  if (text.trim() === "") throw new Reject("empty payload");
  // Transient: delivered again after the stage's backoff, and dead-lettered
  // as `retry` once `max_attempts` is spent.
  if (text.startsWith("later")) throw new Retry();
  // One output to the stage's default output (its first `publish:` topic),
  // with the input's key and headers.
  return text.toUpperCase();
});
