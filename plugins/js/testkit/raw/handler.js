// Test kit: a JavaScript handler written against the raw componentize-js
// bindings, with no SDK, to prove the contract alone is enough.
//
// Emits the payload upper-cased; rejects an empty payload; asks for a retry
// after 5 ms when the payload is `retry`.

import { log } from "sluice:plugin/host@0.1.0";

const decoder = new TextDecoder();
const encoder = new TextEncoder();

export const messageHandler = {
  handle(msg) {
    if (msg.payload.length === 0) return { tag: "err", val: { tag: "reject", val: "empty payload" } };
    const text = decoder.decode(msg.payload);
    if (text === "retry") return { tag: "err", val: { tag: "retry", val: 5n } };
    log("debug", `raw handler saw ${msg.id}`);
    return {
      tag: "ok",
      val: [{ topic: "", key: msg.key, headers: msg.headers, payload: encoder.encode(text.toUpperCase()) }],
    };
  },
};
