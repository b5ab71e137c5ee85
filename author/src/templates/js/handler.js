// {{name}}: a Sluice handler. It upper-cases text, rejects what it can never
// handle and asks for a retry of what it cannot handle yet. Replace it with
// yours; `cases.yaml` says what it should do.

import { Reject, Retry, handler } from "./sluice.js";

// Capabilities (contract 0.2.0), each granted by the stage in YAML. On
// QuickJS (this project's engine) a capability the stage does not grant
// fails each call, naming the stage and the grant; on SpiderMonkey the
// component imports only those this code uses, and a stage that does not
// grant one refuses it at load (see README.md).
//
// The stage's key-value store (`state: true`), committed with the call's
// outcome, so a counter counts each message once across retries:
//
//   import * as state from "./sluice-state.js";
//   const seen = state.increment(`seen/${msg.key}`);          // 1, 2, ...
//   state.set(`last/${msg.key}`, text, { ttl: 3_600_000 });   // expires in an hour
//   const last = state.getText(`last/${msg.key}`);           // or undefined
//   const lock = state.compareAndSet("lock/x", 0, msg.id, { ttl: 30_000 });
//
// A secret the stage lists (`secrets: [api_token]`):
//
//   import * as secrets from "./sluice-secrets.js";
//   const token = secrets.get("api_token");
//
// Outbound HTTP to a host the stage allows (`http: { allow: [api.example.com] }`),
// with the standard fetch, in an async handler:
//
//   export const messageHandler = handler(async (msg) => {
//     const answer = await fetch("https://api.example.com/v1/items", { method: "POST", body: msg.payload });
//     if (!answer.ok) throw new Retry();
//     return await answer.text();
//   });
//
// A state or secret error the handler does not catch retries the message
// (a store unavailable or full) or rejects it (a missing grant).

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
